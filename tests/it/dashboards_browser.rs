//! The dashboards in a real headless Chromium (Debian's `chromium` + `chromium-driver`,
//! through `samewise_testkit::webdriver`) against a real `samewise serve` holding a short real
//! run: engines under the `reference`, `w4` and `tool-corrupt` profiles on the test model,
//! two probe rounds with the test model's calibration ladder, and traffic through the
//! gateway. The pages must show what the API and the store hold, an alert is acknowledged
//! through the UI, an XSS payload stored in an alert renders as text (the global it would set
//! stays unset, the CSP header is present), and the console stays free of errors (a planted
//! script error proves the check can fail). Screenshots go to
//! `$CARGO_TARGET_TMPDIR/dashboards-browser/`. `/metrics` must serve the gateway's and the
//! dashboards' families from the one registry, and a real Prometheus (Debian's `prometheus`)
//! scraping it must answer every query of every panel of `dashboards/grafana/*.json`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_store::{AlertQuery, NewAlert, ProbeRunQuery, Store};
use samewise_testkit::webdriver::{Browser, ChromeDriver};
use serde_json::Value;

use crate::common::probes::{config, engine, probes_run};
use crate::common::{create_key, scrape, spawn_listening};

const XSS: &str = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">";

async fn api(url: &str, key: &str, path: &str) -> Result<Value> {
    let text = reqwest::Client::new()
        .get(format!("{url}{path}"))
        .bearer_auth(key)
        .send()
        .await?
        .text()
        .await?;
    serde_json::from_str(&text).with_context(|| format!("{path}: {text}"))
}

/// Console entries at level SEVERE.
async fn errors(b: &Browser) -> Result<Vec<Value>> {
    Ok(b.console()
        .await?
        .into_iter()
        .filter(|e| e["level"] == "SEVERE")
        .collect())
}

async fn shot(b: &Browser, name: &str) -> Result<()> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboards-browser");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("{name}.png")), b.screenshot().await?)?;
    Ok(())
}

/// Polls `cond` every 100 ms until it holds (10 s).
async fn eventually<F, Fut>(what: &str, mut cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        // a stale element (the page changed under us) is just "not yet"
        if cond().await.unwrap_or(false) {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn ok_runs(data: &Path, endpoint: &str) -> Result<usize> {
    let store = Store::connect(None, data).await?;
    let runs = store
        .probe_run_stats(&ProbeRunQuery {
            endpoint: Some(endpoint.to_owned()),
            kind: Some("prompt_logprobs".to_owned()),
            limit: 10_000,
            ..ProbeRunQuery::default()
        })
        .await;
    store.close().await;
    Ok(runs?.iter().filter(|r| r.ok).count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_in_a_real_browser() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (e_ref, u_ref) = engine("reference", dir.path())?;
    let (e_w4, u_w4) = engine("w4", dir.path())?;
    let (e_tool, u_tool) = engine("tool-corrupt", dir.path())?;
    let data = dir.path().join("data");
    let cfg = dir.path().join("samewise.toml");
    let ladder = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/probes/data/ladders/smollm2-135m-instruct-q4_1.json"
    );
    let text = config(
        &data,
        &[("exact", &u_ref), ("w4", &u_w4), ("tool", &u_tool)],
        "interval_ms = 3600000\njitter = 0.0",
    )?
    .replace("kl_threshold = 0.01\n", "")
    .replace("[probes]\n", &format!("[probes]\nladder = \"{ladder}\"\n"))
        + "\n[models.smol.slo]\nttft_ms = 2000\ntpot_ms = 200\n";
    std::fs::write(&cfg, text)?;
    probes_run(&["--rounds", "2"], &cfg, dir.path())?;
    let admin = create_key(&cfg, dir.path(), "ops", true)?;
    let client = create_key(&cfg, dir.path(), "app", false)?;
    let cfg_s = cfg.to_str().context("path")?.to_owned();
    let (gw, url) = spawn_listening(
        &["serve", "--config", &cfg_s, "--listen", "127.0.0.1:0"],
        dir.path(),
    )?;

    // traffic through the gateway, with a tool declared
    let http = reqwest::Client::new();
    for i in 0..9 {
        let body = serde_json::json!({
            "model": "smol", "max_tokens": 8,
            "messages": [{ "role": "user", "content": format!("What is the weather in city {i}?") }],
            "tools": [{ "type": "function", "function": { "name": "get_weather",
                "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } } }]
        });
        let res = http
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(&client)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        ensure!(
            res.status().is_success() || res.status().is_server_error(),
            "{}",
            res.status()
        );
        let _ = res.text().await?;
    }
    // an alert whose strings carry an XSS payload (a model answer and a tool name)
    let store = Store::connect(None, &data).await?;
    let (xss, _) = store
        .upsert_alert(&NewAlert {
            model: "smol".to_owned(),
            endpoint: "tool/smol".to_owned(),
            kind: "passive".to_owned(),
            summary: XSS.to_owned(),
            evidence: serde_json::json!({ "answer": XSS, "tool_name": XSS }),
            now_ms: samewise_store::now_ms(),
        })
        .await?;
    let w4_alert = store
        .alerts(&AlertQuery {
            endpoint: Some("w4/smol".to_owned()),
            limit: 10,
            ..AlertQuery::default()
        })
        .await?
        .into_iter()
        .find(|a| a.kind == "unfaithful")
        .context("the w4 endpoint has no unfaithful alert")?;
    store.close().await;
    // wait until the records are written (the writer flushes within 200 ms)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let o = api(&url, &admin, "/api/v1/overview?range=1h").await?;
        let n: i64 = o["models"][0]["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["requests"].as_i64())
            .sum();
        if n >= 9 {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "only {n} attempts rolled up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `/metrics` serves the one registry: the gateway's families and the dashboards' (these
    // are refreshed every 15 s, so the routing state may take one refresh to show)
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let metrics = loop {
        let m = scrape(&http, &url).await?;
        if m.contains("state=\"demoted\"} 1") || std::time::Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for family in [
        "samewise_requests_total{",
        "samewise_probe_statistic{model=\"smol\",endpoint=\"w4/smol\",kind=\"prompt_logprobs\",stat=\"kl_mean\"}",
        "samewise_probe_runs_total{model=\"smol\",endpoint=\"w4/smol\",kind=\"prompt_logprobs\",outcome=\"ok\"}",
        "samewise_alerts_active{model=\"smol\",kind=\"unfaithful\",state=\"open\"} 1",
        "samewise_endpoint_routing_state{model=\"smol\",endpoint=\"w4/smol\",state=\"demoted\"} 1",
    ] {
        ensure!(
            metrics.contains(family),
            "/metrics lacks {family}:\n{metrics}"
        );
    }

    grafana_panels_have_data(&url, dir.path()).await?;

    let driver = ChromeDriver::start().await?;
    let profile = tempfile::tempdir()?;
    let b = driver.browser(profile.path()).await?;
    let outcome = drive(&b, &url, &admin, &data, xss.id, w4_alert.id).await;
    let _ = b.quit().await;
    drop(driver);
    let status = gw.stop()?;
    for p in [e_ref, e_w4, e_tool] {
        p.stop()?;
    }
    outcome?;
    ensure!(status.success(), "serve exited with {status}");
    Ok(())
}

async fn drive(
    b: &Browser,
    url: &str,
    admin: &str,
    data: &Path,
    xss: i64,
    w4_alert: i64,
) -> Result<()> {
    // log in through the form
    b.goto(&format!("{url}/")).await?;
    ensure!(
        b.url().await?.ends_with("/login"),
        "not sent to the login form"
    );
    let key = b.find("input[name=key]").await?;
    b.type_into(&key, admin).await?;
    b.click(&b.find("form.login button").await?).await?;
    let home = format!("{url}/");
    eventually("the overview after login", || async {
        Ok(b.url().await? == home)
    })
    .await?;

    // the overview shows the API's answers
    let o = api(url, admin, "/api/v1/overview?range=24h").await?;
    let row = |e: &str| -> Value {
        o["models"][0]["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["endpoint"] == e)
            .cloned()
            .unwrap_or_default()
    };
    let bits = b
        .text(&b.find("tr[data-endpoint='w4/smol'] td.bits").await?)
        .await?;
    let api_bits = row("w4/smol")["bits"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    ensure!(
        bits == api_bits && bits.ends_with("-bit"),
        "w4 row: {bits:?}, API {api_bits:?}"
    );
    ensure!(
        bits.starts_with('≈') || bits.starts_with('<'),
        "w4 must read as about 4-bit or worse: {bits}"
    );
    for e in ["exact/smol", "w4/smol", "tool/smol"] {
        let r = row(e);
        let faithful = b
            .text(
                &b.find(&format!("tr[data-endpoint='{e}'] td.faithful summary"))
                    .await?,
            )
            .await?;
        ensure!(
            faithful == r["faithful"]["answer"].as_str().unwrap_or_default(),
            "{e}: {faithful} vs {}",
            r["faithful"]
        );
        let errors = b
            .text(
                &b.find(&format!("tr[data-endpoint='{e}'] td.errors"))
                    .await?,
            )
            .await?;
        if let Some(n) = r["errors"]["n"].as_i64() {
            ensure!(
                errors.ends_with(&format!("of {n}")),
                "{e} errors cell {errors:?} vs n = {n}"
            );
        }
    }
    ensure!(
        row("exact/smol")["faithful"]["answer"] == "yes",
        "{}",
        row("exact/smol")
    );
    let e = errors(b).await?;
    ensure!(e.is_empty(), "console errors on the overview: {e:?}");
    shot(b, "overview").await?;
    b.resize(390, 844).await?;
    shot(b, "overview-phone").await?;
    b.resize(1280, 900).await?;

    // the endpoint page: one point per run in the range, the ladder's levels as bands
    for _ in 0..3 {
        let before = ok_runs(data, "w4/smol").await?;
        b.goto(&format!("{url}/endpoint?e=w4%2Fsmol&range=24h"))
            .await?;
        let chart: Value = b
            .execute(
                "for (const f of document.querySelectorAll('figure.chart')) {\
                   if (f.querySelector('figcaption').textContent.startsWith('prompt_logprobs · kl_mean')) {\
                     const s = f.querySelector('svg');\
                     return [Number(s.getAttribute('data-points')), s.querySelectorAll('circle.pt').length,\
                             s.querySelectorAll('g.band').length]; } }\
                 return null;",
                vec![],
            )
            .await?;
        if ok_runs(data, "w4/smol").await? != before {
            continue; // a round landed meanwhile: look again
        }
        ensure!(
            chart[0] == before && chart[1] == before,
            "chart {chart} vs {before} runs"
        );
        ensure!(before >= 2, "{before} runs");
        ensure!(
            chart[2].as_u64().is_some_and(|n| n >= 3),
            "ladder bands: {chart}"
        );
        break;
    }
    let e = errors(b).await?;
    ensure!(e.is_empty(), "console errors on the endpoint page: {e:?}");
    shot(b, "endpoint").await?;

    // acknowledge the w4 alert through the UI
    b.goto(&format!("{url}/alerts/{w4_alert}")).await?;
    b.click(&b.find("button.ack").await?).await?;
    eventually("the acknowledged state on the page", || async {
        Ok(b.text(&b.find("dd.state").await?).await? == "acknowledged"
            && b.find_all("button.ack").await?.is_empty())
    })
    .await?;
    let store = Store::connect(None, data).await?;
    let stored = store.alert(w4_alert).await?;
    store.close().await;
    ensure!(stored.is_some_and(|a| a.state.as_str() == "acknowledged"));

    // the XSS payload renders as text and runs nothing
    b.goto(&format!("{url}/alerts/{xss}")).await?;
    let summary = b.text(&b.find("dd.summary").await?).await?;
    ensure!(summary == XSS, "summary shown as {summary:?}");
    let pwned = b.execute("return typeof window.__pwned;", vec![]).await?;
    ensure!(pwned == "undefined", "the payload ran: {pwned}");
    let res = reqwest::Client::new()
        .get(format!("{url}/alerts/{xss}"))
        .bearer_auth(admin)
        .send()
        .await?;
    let csp = res
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    ensure!(csp.starts_with("default-src 'self'"), "CSP {csp:?}");
    b.goto(&format!("{url}/compare?a=exact%2Fsmol&b=w4%2Fsmol"))
        .await?;
    b.goto(&format!("{url}/alerts")).await?;
    let e = errors(b).await?;
    ensure!(e.is_empty(), "console errors: {e:?}");
    shot(b, "alerts").await?;

    // the console check can fail: a planted script error is seen
    b.execute(
        "setTimeout(function () { throw new Error('planted-error'); }, 0); return 1;",
        vec![],
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = errors(b).await?;
    ensure!(
        e.iter().any(|x| x["message"]
            .as_str()
            .is_some_and(|m| m.contains("planted-error"))),
        "the planted error was not seen: {e:?}"
    );
    Ok(())
}

/// A child process killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real Prometheus scrapes `url`'s `/metrics` every second; every panel of the Grafana
/// dashboards must have a query, and every query (with `$model` = smol, `$endpoint` =
/// exact/smol) must return data.
async fn grafana_panels_have_data(url: &str, dir: &Path) -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: samewise\n    static_configs:\n      - targets: [\"{}\"]\n",
            url.trim_start_matches("http://")
        ),
    )?;
    let _prom = Killed(
        std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("cannot start prometheus (apt-get install prometheus)")?,
    );
    let http = reqwest::Client::new();
    let query = |q: String| {
        let http = http.clone();
        async move {
            let text = http
                .get(format!("http://127.0.0.1:{port}/api/v1/query"))
                .query(&[("query", q.as_str())])
                .send()
                .await?
                .text()
                .await?;
            let v: Value = serde_json::from_str(&text).with_context(|| text.clone())?;
            anyhow::Ok(v)
        }
    };
    let mut panels = Vec::new();
    for name in ["overview", "endpoint"] {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("dashboards/grafana/{name}.json"));
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let list = d["panels"].as_array().cloned().unwrap_or_default();
        ensure!(!list.is_empty(), "{name}: no panels");
        for p in list {
            let exprs: Vec<String> = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str().map(str::to_owned))
                .filter(|e| !e.trim().is_empty())
                .collect();
            ensure!(
                !exprs.is_empty(),
                "{name}: panel {} has no query",
                p["title"]
            );
            for e in exprs {
                panels.push((format!("{name}: {}", p["title"]), e));
            }
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for (title, expr) in panels {
        let q = expr
            .replace("$model", "smol")
            .replace("$endpoint", "exact/smol");
        loop {
            let v = query(q.clone()).await.unwrap_or_default();
            if v["status"] == "success"
                && v["data"]["result"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty())
            {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "{title}: no data for {q}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}
