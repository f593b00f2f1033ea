//! The JSON API against what the store holds: models, the overview's answers (counts, rates,
//! verdicts, "≈ 4-bit", routing, evals), series with a step, probe series with one point per
//! run, alerts (list, one, acknowledge, resolve), and parameter errors. Also on PostgreSQL.
//! The start-up warm-up runs on both stores and writes nothing.

use anyhow::{Context, Result, ensure};
use samewise_store::Backend;
use serde_json::Value;

use crate::common::{RUNS, Server, body};

fn row<'a>(overview: &'a Value, endpoint: &str) -> Result<&'a Value> {
    overview["models"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["endpoints"].as_array().into_iter().flatten())
        .find(|r| r["endpoint"] == endpoint)
        .ok_or_else(|| anyhow::anyhow!("no row for {endpoint}: {overview}"))
}

async fn overview_matches_the_store(backend: Backend) -> Result<()> {
    let s = Server::start_on(backend).await?;
    // the start-up warm-up reads every page's queries and writes nothing
    let before = samewise_store::testing::dump_tables(&s.db.store).await?;
    s.dash.warm_up().await?;
    ensure!(
        samewise_store::testing::dump_tables(&s.db.store).await? == before,
        "the warm-up changed the store"
    );
    let models = s.json("/api/v1/models").await?;
    ensure!(
        models["models"].as_array().map(Vec::len) == Some(2),
        "{models}"
    );
    ensure!(models["models"][0]["slo"]["ttft_ms"] == 100.0);

    let o = s.json("/api/v1/overview?range=24h").await?;
    let w4 = row(&o, "w4/m")?;
    ensure!(w4["requests"] == s.attempts, "{w4}");
    ensure!(w4["bits"] == "≈ 4-bit", "{}", w4["bits"]);
    ensure!(w4["faithful"]["answer"] == "no" && w4["changed"]["answer"] == "no");
    ensure!(w4["works"]["answer"] == "yes");
    ensure!(w4["routing"]["state"] == "demoted");
    ensure!(
        w4["kl_24h"].as_array().map(Vec::len) == Some(RUNS),
        "{}",
        w4["kl_24h"]
    );
    ensure!(w4["alerts"].as_array().map(Vec::len) == Some(1));
    // the latest job per suite: w4's is still queued, with no verdict
    let w4_jobs = w4["evals"]["jobs"].as_array().context("no jobs")?;
    ensure!(w4_jobs.len() == 1, "{}", w4["evals"]);
    ensure!(w4_jobs[0]["state"] == "queued" && w4_jobs[0]["verdict"].is_null());
    let share = w4["traffic_share"].as_f64().unwrap_or_default();
    ensure!((share - 1.0 / 3.0).abs() < 1e-9, "{share}");
    let reference = row(&o, "ref/m")?;
    ensure!(reference["faithful"]["answer"] == "yes" && reference["bits"].is_null());
    // TTFT 80..119 ms: the median lies in the (50, 100] or (100, 200] bucket
    let p50 = reference["ttft_p50_ms"].as_f64().unwrap_or_default();
    ensure!((50.0..=200.0).contains(&p50), "{p50}");
    ensure!(
        reference["goodput"]["tpot_within"] == 1.0,
        "{}",
        reference["goodput"]
    );
    let tool = row(&o, "tool/m")?;
    ensure!(
        tool["tool_errors"]["k"] == 10 && tool["tool_errors"]["n"] == 40,
        "{}",
        tool["tool_errors"]
    );
    // its eval verdict answers "still works?" first, then its passive alert would
    let job = &tool["evals"]["jobs"][0];
    ensure!(
        job["suite"] == "tool_calls" && job["verdict"] == "degraded",
        "{}",
        tool["evals"]
    );
    ensure!(
        job["summary"] == "0% vs baseline 50% on 24 items, p = 4.0e-4",
        "{}",
        job["summary"]
    );
    ensure!(tool["works"]["answer"] == "no", "{}", tool["works"]);
    ensure!(
        tool["works"]["why"] == "the tool_calls eval judged it degraded",
        "{}",
        tool["works"]
    );
    let reference_evals = &row(&o, "ref/m")?["evals"];
    ensure!(
        reference_evals["note"] == "no evals yet"
            && reference_evals["jobs"] == serde_json::json!([])
    );
    let (lo, hi) = (
        tool["tool_errors"]["lo"].as_f64().unwrap_or(1.0),
        tool["tool_errors"]["hi"].as_f64().unwrap_or(0.0),
    );
    ensure!(
        lo < 0.25 && hi > 0.25,
        "Wilson interval around 0.25: {lo} {hi}"
    );
    let other = row(&o, "x/o")?;
    ensure!(
        other["requests"] == 0
            && other["works"]["answer"] == "unknown"
            && other["routing"].is_null()
    );

    // one model only; an unknown one
    let only = s.json("/api/v1/overview?model=other").await?;
    ensure!(only["models"].as_array().map(Vec::len) == Some(1));
    ensure!(
        s.get("/api/v1/overview?model=nope", Some(&s.admin))
            .await?
            .status()
            == 404
    );
    ensure!(
        s.get("/api/v1/overview?range=2y", Some(&s.admin))
            .await?
            .status()
            == 400
    );
    s.stop().await
}

#[tokio::test]
async fn overview_matches_the_store_sqlite() -> Result<()> {
    overview_matches_the_store(Backend::Sqlite).await
}

#[tokio::test]
async fn overview_matches_the_store_postgres() -> Result<()> {
    overview_matches_the_store(Backend::Postgres).await
}

/// An endpoint watched only by fingerprint probes (no reference): changed? is answered from
/// them, faithful? stays unknown and says why, and the endpoint's own mean logprob is charted.
#[tokio::test]
async fn fingerprint_runs_answer_changed_but_not_faithful() -> Result<()> {
    let s = Server::start().await?;
    let now = samewise_store::now_ms();
    for i in 0..3 {
        s.db.store
            .insert_probe_run(&samewise_store::ProbeRun {
                model: "other".to_owned(),
                endpoint: "x/o".to_owned(),
                kind: "fingerprint".to_owned(),
                started_ms: now - 1_800_000 + i * 600_000,
                finished_ms: now - 1_800_000 + i * 600_000 + 500,
                ok: true,
                tokens: 80,
                stats: serde_json::json!({ "own_logprob_mean": -2.5, "own_top1_logprob_mean": -1.25, "own_tokens": 40 }),
                ..samewise_store::ProbeRun::default()
            })
            .await?;
    }
    let o = s.json("/api/v1/overview?range=24h").await?;
    let x = row(&o, "x/o")?;
    ensure!(
        x["changed"]["answer"] == "no"
            && x["changed"]["why"]
                .as_str()
                .is_some_and(|w| w.starts_with("fingerprint probes")),
        "{}",
        x["changed"]
    );
    ensure!(
        x["faithful"]["answer"] == "unknown"
            && x["faithful"]["why"]
                .as_str()
                .is_some_and(|w| w.contains("not with the weights")),
        "{}",
        x["faithful"]
    );
    let ps = s
        .json("/api/v1/probe-series?endpoint=x/o&range=24h")
        .await?;
    let own = ps["series"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["kind"] == "fingerprint" && x["stat"] == "own_logprob_mean")
        .with_context(|| format!("no own_logprob_mean series: {ps}"))?;
    ensure!(own["points"].as_array().map(Vec::len) == Some(3), "{own}");
    s.stop().await
}

#[tokio::test]
async fn series_and_probe_series() -> Result<()> {
    let s = Server::start().await?;
    let per_minute = s
        .json("/api/v1/series?endpoint=ref/m&range=6h&step=60")
        .await?;
    let pts = per_minute["points"].as_array().cloned().unwrap_or_default();
    ensure!(
        pts.len() as i64 == s.attempts,
        "one attempt per minute: {}",
        pts.len()
    );
    ensure!(pts.iter().all(|p| p["requests"] == 1));
    let ten = s
        .json("/api/v1/series?endpoint=ref/m&range=6h&step=600")
        .await?;
    let total: i64 = ten["points"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["requests"].as_i64())
        .sum();
    ensure!(total == s.attempts && ten["step_ms"] == 600_000, "{ten}");
    ensure!(
        s.get("/api/v1/series?endpoint=ref/m&step=7", Some(&s.admin))
            .await?
            .status()
            == 400
    );
    ensure!(
        s.get("/api/v1/series?endpoint=nope/x", Some(&s.admin))
            .await?
            .status()
            == 404
    );

    let ps = s
        .json("/api/v1/probe-series?endpoint=w4/m&range=24h")
        .await?;
    let kl = ps["series"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["stat"] == "kl_mean")
        .cloned()
        .unwrap_or_default();
    ensure!(kl["points"].as_array().map(Vec::len) == Some(RUNS), "{ps}");
    // a range holding none of the runs (they are 1-2 h old)
    let none = s
        .json("/api/v1/probe-series?endpoint=w4/m&range=1h")
        .await?;
    ensure!(
        none["series"].as_array().is_some_and(Vec::is_empty),
        "{none}"
    );

    // the tool_calls probe's schema accuracy, the endpoint's beside the reference's
    let tools = s
        .json("/api/v1/probe-series?endpoint=tool/m&kind=tool_calls&range=24h")
        .await?;
    let value = |stat: &str| {
        tools["series"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["stat"] == stat)
            .and_then(|x| x["points"][0]["v"].as_f64())
    };
    ensure!(
        value("schema_accuracy") == Some(0.72)
            && value("reference_schema_accuracy") == Some(1.0)
            && value("trigger_f1") == Some(0.9),
        "{tools}"
    );

    let e = s.json("/api/v1/endpoint?endpoint=tool/m&range=24h").await?;
    ensure!(
        e["tool_errors_by_kind"]["unknown_name"] == 10,
        "{}",
        e["tool_errors_by_kind"]
    );
    ensure!(e["finish_reasons"]["stop"] == 30);
    ensure!(e["agent"][0]["basis"] == "tool-call error");
    let n50 = e["agent"][0]["task_failure"][2][1]
        .as_f64()
        .unwrap_or_default();
    ensure!((n50 - (1.0 - 0.75f64.powi(50))).abs() < 1e-9, "{n50}");
    ensure!(e["ladder"].as_array().map(Vec::len) == Some(2));
    s.stop().await
}

#[tokio::test]
async fn alerts_list_ack_resolve() -> Result<()> {
    let s = Server::start().await?;
    let http = Server::http()?;
    let all = s.json("/api/v1/alerts").await?;
    ensure!(all["alerts"].as_array().map(Vec::len) == Some(2), "{all}");
    let one = s
        .json(&format!("/api/v1/alerts/{}", s.unfaithful_alert))
        .await?;
    ensure!(one["kind"] == "unfaithful" && one["evidence"]["equivalent"]["bits"] == 4.2);
    // the jobs that answer it (w4's job opened by hand); held_by only on a verdict's alert
    let jobs = one["eval_jobs"].as_array().context("no eval_jobs")?;
    ensure!(
        jobs.len() == 1 && jobs[0]["suite"] == "tool_calls" && jobs[0]["state"] == "queued",
        "{one}"
    );
    ensure!(one.get("held_by").is_none(), "{one}");
    ensure!(
        s.get("/api/v1/alerts/999999", Some(&s.admin))
            .await?
            .status()
            == 404
    );
    ensure!(
        s.get("/api/v1/alerts?state=bogus", Some(&s.admin))
            .await?
            .status()
            == 400
    );
    // an action asked with GET, a list with DELETE: a JSON 405, with the security headers
    let id = s.unfaithful_alert;
    for wrong in [
        http.get(format!("{}/api/v1/alerts/{id}/ack", s.url)),
        http.delete(format!("{}/api/v1/evals", s.url)),
    ] {
        let res = wrong.bearer_auth(&s.admin).send().await?;
        ensure!(res.status() == 405, "{}", res.status());
        ensure!(res.headers().contains_key("x-content-type-options"));
        let e = body(res).await?;
        ensure!(e["error"]["code"] == "method_not_allowed", "{e}");
    }
    // a malformed path or query parameter: the API's OpenAI-shaped JSON 400 naming it, the
    // pages' error page (axum's own rejections were plain text)
    for path in [
        "/api/v1/alerts/abc",
        "/api/v1/alerts/99999999999999999999",
        "/api/v1/evals/x1",
        "/api/v1/series?model=m",
        "/api/v1/probe-series?endpoint=w4/m&step=soon",
        "/api/v1/alerts?limit=-",
    ] {
        let res = s.get(path, Some(&s.admin)).await?;
        ensure!(res.status() == 400, "{path}: {}", res.status());
        ensure!(
            res.headers().contains_key("x-content-type-options"),
            "{path}"
        );
        let e = body(res).await?;
        ensure!(
            e["error"]["code"] == "invalid_parameter"
                && e["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
            "{path}: {e}"
        );
    }
    for path in ["/alerts/abc", "/endpoint?step=x"] {
        let res = s.get(path, Some(&s.admin)).await?;
        ensure!(res.status() == 400, "{path}: {}", res.status());
        let ct = res.headers()["content-type"].to_str()?.to_owned();
        ensure!(ct.starts_with("text/html"), "{path}: {ct}");
    }
    // a login form sent as JSON keeps axum's 415, on the error page
    let res = http
        .post(format!("{}/login", s.url))
        .header("content-type", "application/json")
        .body(r#"{"key": "x"}"#)
        .send()
        .await?;
    ensure!(res.status() == 415, "{}", res.status());
    ensure!(
        res.headers()["content-type"]
            .to_str()?
            .starts_with("text/html")
    );
    // Bearer POSTs need no CSRF token (no ambient credential)
    let acked = body(
        http.post(format!("{}/api/v1/alerts/{id}/ack", s.url))
            .bearer_auth(&s.admin)
            .send()
            .await?,
    )
    .await?;
    ensure!(acked["state"] == "acknowledged", "{acked}");
    let open = s.json("/api/v1/alerts?state=open").await?;
    ensure!(open["alerts"].as_array().map(Vec::len) == Some(1));
    let resolved = body(
        http.post(format!("{}/api/v1/alerts/{id}/resolve", s.url))
            .bearer_auth(&s.admin)
            .send()
            .await?,
    )
    .await?;
    ensure!(resolved["state"] == "resolved" && resolved["resolved_by"] == "operator");
    // the alert's page says when and by whom
    let res = s.get(&format!("/alerts/{id}"), Some(&s.admin)).await?;
    ensure!(res.status() == 200);
    let html = res.text().await?;
    ensure!(
        html.contains("<dt>Resolved</dt><dd class=\"resolved\">")
            && html.contains(" by an operator</dd>"),
        "{html}"
    );
    // once resolved, the overview no longer counts it
    let o = s.json("/api/v1/overview").await?;
    ensure!(row(&o, "w4/m")?["faithful"]["answer"] == "yes");
    s.stop().await
}
