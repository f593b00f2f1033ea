//! Pages: they show what the API answers (the w4 row's "≈ 4-bit", a chart with one point per
//! run in its range, the ladder's bands), every XSS payload from the store renders as text,
//! and every response carries the CSP and hardening headers.

use anyhow::{Result, ensure};

use crate::common::{RUNS, Server, XSS};

async fn page(s: &Server, path: &str) -> Result<String> {
    let res = s.get(path, Some(&s.admin)).await?;
    ensure!(res.status() == 200, "GET {path}: {}", res.status());
    let csp = res
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    ensure!(csp.starts_with("default-src 'self'"), "{path}: CSP {csp:?}");
    ensure!(
        res.headers()
            .get("x-content-type-options")
            .is_some_and(|v| v == "nosniff")
    );
    ensure!(
        res.headers()
            .get("x-frame-options")
            .is_some_and(|v| v == "DENY")
    );
    let html = res.text().await?;
    ensure!(
        !html.contains(XSS) && !html.contains("<script>window"),
        "{path}: the payload is raw"
    );
    ensure!(!html.contains("<img"), "{path}: an injected element");
    Ok(html)
}

/// The `<tr>` of `endpoint` in `html`.
fn tr<'a>(html: &'a str, endpoint: &str) -> &'a str {
    let start = html
        .find(&format!("<tr data-endpoint=\"{endpoint}\""))
        .unwrap_or(0);
    let rest = &html[start..];
    &rest[..rest.find("</tr>").unwrap_or(rest.len())]
}

#[tokio::test]
async fn overview_rows_show_the_api_values() -> Result<()> {
    let s = Server::start().await?;
    let html = page(&s, "/").await?;
    let w4 = tr(&html, "w4/m");
    ensure!(w4.contains("<td class=\"bits\">≈ 4-bit</td>"), "{w4}");
    ensure!(w4.contains("demoted"), "{w4}");
    ensure!(
        w4.contains(&format!("data-points=\"{RUNS}\"")),
        "the KL sparkline has one point per run"
    );
    ensure!(w4.contains("tool_calls: queued"), "{w4}");
    ensure!(tr(&html, "ref/m").contains("no evals yet"));
    let tool = tr(&html, "tool/m");
    ensure!(
        tool.contains("<a class=\"bad\" href=\"/evals/") && tool.contains("tool_calls: degraded"),
        "{tool}"
    );
    ensure!(tool.contains("25.0%"), "tool-call error rate: {tool}");
    ensure!(html.contains("SLO: TTFT ≤ 100 ms, TPOT ≤ 15 ms"));
    ensure!(html.contains("/assets/refresh.js") && html.contains("/assets/style.css"));
    ensure!(
        !html.contains("http://") && !html.contains("https://"),
        "a reference to another host"
    );
    s.stop().await
}

#[tokio::test]
async fn endpoint_page_charts_runs_with_ladder_bands() -> Result<()> {
    let s = Server::start().await?;
    let html = page(&s, "/endpoint?e=w4/m&range=24h").await?;
    let kl = html
        .split("<figure")
        .find(|f| f.contains("prompt_logprobs · kl_mean"))
        .unwrap_or_default();
    ensure!(kl.contains(&format!("data-points=\"{RUNS}\"")), "{kl}");
    ensure!(kl.matches("<circle").count() == RUNS);
    ensure!(
        kl.matches("class=\"band\"").count() == 2 && kl.contains(">w4 "),
        "ladder bands: {kl}"
    );
    ensure!(html.contains("5-step task") && html.contains("50-step task"));
    ensure!(html.contains("Acknowledge"));
    // a range without runs draws none
    let empty = page(&s, "/endpoint?e=w4/m&range=1h").await?;
    ensure!(empty.contains("No probe runs in the range."));
    // the tool endpoint's breakdowns hold the payload as a finish reason: escaped
    let tool = page(&s, "/endpoint?e=tool/m").await?;
    ensure!(
        tool.contains("&lt;script&gt;window.__pwned=1&lt;/script&gt;"),
        "escaped payload shown"
    );
    ensure!(tool.contains("<th>unknown_name</th><td>10</td>"));
    let res = s.get("/endpoint?e=nope/x", Some(&s.admin)).await?;
    ensure!(res.status() == 404);
    s.stop().await
}

#[tokio::test]
async fn alerts_and_compare_pages_escape_and_compare() -> Result<()> {
    let s = Server::start().await?;
    let list = page(&s, "/alerts").await?;
    ensure!(list.contains("&lt;script&gt;window.__pwned=1&lt;/script&gt;"));
    let one = page(&s, &format!("/alerts/{}", s.xss_alert)).await?;
    ensure!(one.contains("tool_name") && one.contains("&lt;img src=x onerror="));
    ensure!(
        one.contains("<h2>Eval jobs that answer it</h2>")
            && one.contains("tool_calls: degraded</a>"),
        "{one}"
    );
    // w4's alert opened none, but the job opened by hand on w4 since answers it
    let w4 = page(&s, &format!("/alerts/{}", s.unfaithful_alert)).await?;
    ensure!(
        w4.contains("tool_calls: queued</a> (opened by hand)"),
        "{w4}"
    );
    let cmp = page(&s, "/compare?a=ref/m&b=w4/m").await?;
    ensure!(
        cmp.contains("<tr data-endpoint=\"ref/m\"") && cmp.contains("<tr data-endpoint=\"w4/m\"")
    );
    ensure!(cmp.matches("prompt_logprobs · kl_mean").count() == 2);
    let across = s.get("/compare?a=ref/m&b=x/o", Some(&s.admin)).await?;
    ensure!(across.status() == 400, "two models: {}", across.status());
    // assets are served from our own routes
    let js = s.get("/assets/refresh.js", None).await?;
    ensure!(js.status() == 200 && js.text().await?.contains("location.reload"));
    s.stop().await
}

/// A verdict's `eval_degraded` alert names the active alert that holds it (tool/m's passive
/// alert opened the degraded job), and says when none does.
#[tokio::test]
async fn a_verdict_alert_page_names_the_alert_that_holds_it() -> Result<()> {
    let s = Server::start().await?;
    let (d, _) =
        s.db.store
            .upsert_alert(&samewise_store::NewAlert {
                model: "m".to_owned(),
                endpoint: "tool/m".to_owned(),
                kind: "eval_degraded".to_owned(),
                summary: "tool_calls degraded".to_owned(),
                evidence: serde_json::json!({ "signal": "eval", "suite": "tool_calls" }),
                now_ms: samewise_store::now_ms(),
            })
            .await?;
    let held = page(&s, &format!("/alerts/{}", d.id)).await?;
    let by = format!(
        "<dt>Held by</dt><dd class=\"held\"><a href=\"/alerts/{x}\">alert {x}</a> (passive)</dd>",
        x = s.xss_alert
    );
    ensure!(held.contains(&by), "{held}");
    // the API says the same
    let api = s.json(&format!("/api/v1/alerts/{}", d.id)).await?;
    let want = serde_json::json!([{"id": s.xss_alert, "kind": "passive"}]);
    ensure!(api["held_by"] == want, "{api}");
    // other alerts have no such row
    let other = page(&s, &format!("/alerts/{}", s.xss_alert)).await?;
    ensure!(!other.contains("Held by"), "{other}");
    s.db.store.resolve_alert(s.xss_alert).await?;
    let free = page(&s, &format!("/alerts/{}", d.id)).await?;
    ensure!(
        free.contains("<dd class=\"held\">no active alert: resolved after its quiet period"),
        "{free}"
    );
    let api = s.json(&format!("/api/v1/alerts/{}", d.id)).await?;
    ensure!(api["held_by"] == serde_json::json!([]), "{api}");
    s.stop().await
}

#[tokio::test]
async fn eval_job_page_shows_the_verdict_and_the_failing_item_first() -> Result<()> {
    let s = Server::start().await?;
    let overview = page(&s, "/").await?;
    let row = tr(&overview, "tool/m");
    let href = row
        .split("href=\"/evals/")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .ok_or_else(|| anyhow::anyhow!("no job link in {row}"))?;
    let html = page(&s, &format!("/evals/{href}")).await?;
    ensure!(
        html.contains("Verdict: <span class=\"verdict-word\">degraded</span>"),
        "{html}"
    );
    ensure!(
        html.contains("the suspect failed and the baseline passed on 1)"),
        "{html}"
    );
    // the regressed item comes first, its bucket shown; the model's text is escaped
    let first = html.find("weather-1").unwrap_or(usize::MAX);
    let second = html.find("book-2").unwrap_or(0);
    ensure!(first < second, "the regressed item is not first");
    ensure!(html.contains("<summary>wrong_name</summary>"), "{html}");
    ensure!(html.contains("&lt;script&gt;window.__pwned=1&lt;/script&gt;"));
    // the same over the API
    let api = s
        .get(&format!("/api/v1/evals/{href}"), Some(&s.admin))
        .await?;
    ensure!(api.status() == 200);
    let v: serde_json::Value = serde_json::from_str(&api.text().await?)?;
    ensure!(v["items"][0]["item"] == "weather-1" && v["items"][0]["suspect"]["passed"] == false);
    ensure!(
        v["job"]["verdict"] == "degraded" && v["endpoint"] == "tool/m",
        "{v}"
    );
    // an unknown job is a 404 with an OpenAI-shaped error, not a panic
    let missing = s.get("/api/v1/evals/999999", Some(&s.admin)).await?;
    ensure!(missing.status() == 404);
    ensure!(missing.text().await?.contains("no eval job 999999"));
    Ok(())
}
