//! End to end through the real gateway: two mock providers serve one model; one corrupts 10%
//! of its tool calls (arguments that are not JSON). The gateway's request records reach the
//! store, the passive detector's sweep flags that endpoint (and only it), and with
//! `on_drift = "exclude"` the alert poller stops traffic to it; resolving the alert brings
//! the traffic back. And without a reference backend: a real `samewise serve` whose `[probes]`
//! names none runs the passive sweep alone, flags the corrupting endpoint from its own traffic,
//! and resolves alerts after the `[probes.alerts]` quiet period it sets.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_probes::AlertsConfig;
use samewise_probes::detect::{DetectorConfig, Detectors};
use samewise_proxy::QualityWatcher;
use samewise_proxy::{AppState, Config};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, RecordQuery, RecordWriter, RecordWriterConfig};
use samewise_testkit::{Behavior, MockUpstream, ToolCall};

use crate::common::probes::alerts;
use crate::common::{create_key, run_ok, spawn_listening};

fn tool_body() -> serde_json::Value {
    serde_json::json!({
        "model": "smol",
        "messages": [{"role": "user", "content": "weather in Oslo?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    })
}

fn good() -> Behavior {
    Behavior::tool_calls(
        vec![ToolCall::new("get_weather", r#"{"city": "Oslo"}"#)],
        "tool_calls",
    )
}

fn corrupt() -> Behavior {
    Behavior::tool_calls(
        vec![ToolCall::new("get_weather", r#"{"city": "Os"#)],
        "tool_calls",
    )
}

/// Sends `n` tool-call requests to `url` (the chat completions route), one at a time; each
/// must answer 200.
async fn send_tool_calls(http: &reqwest::Client, url: &str, key: &str, n: usize) -> Result<()> {
    for _ in 0..n {
        let resp = http
            .post(url)
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&tool_body())?)
            .send()
            .await?;
        ensure!(resp.status() == 200, "status {}", resp.status());
        resp.bytes().await?;
    }
    Ok(())
}

/// Two mock providers of one model: `a` always answers a good tool call, `b` a corrupt one
/// every `corrupt_every`-th answer (of its first 2,000).
async fn providers(corrupt_every: usize) -> Result<(MockUpstream, MockUpstream)> {
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(good())
        .start()
        .await?;
    let b = MockUpstream::builder()
        .name("b")
        .behaviors((0..2000).map(|i| {
            if i % corrupt_every == 0 {
                corrupt()
            } else {
                good()
            }
        }))
        .default_behavior(good())
        .start()
        .await?;
    Ok((a, b))
}

#[tokio::test]
async fn tool_call_corruption_is_flagged_from_traffic_and_excluded() -> Result<()> {
    // b: every tenth answer corrupt
    let (a, b) = providers(10).await?;
    let provider = |name: &str, url: &str| {
        format!(
            "[providers.{name}]\nbase_url = \"{url}\"\nconnect_timeout_ms = 500\nfirst_byte_timeout_ms = 2000\nidle_timeout_ms = 2000\n"
        )
    };
    let toml = format!(
        "[server]\nalert_poll_ms = 50\n[limits]\nmax_attempts = 1\n{}{}\
         [models.smol]\npolicy = \"weighted\"\non_drift = \"exclude\"\n\
         [[models.smol.endpoints]]\nprovider = \"a\"\nmodel = \"m\"\n\
         [[models.smol.endpoints]]\nprovider = \"b\"\nmodel = \"m\"\n",
        provider("a", &a.base_url()),
        provider("b", &b.base_url())
    );
    let config = Config::from_toml_str(&toml).map_err(|e| anyhow::anyhow!("{e}"))?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let (_, key) = db.store.create_api_key("e2e", None).await?;
    let (records, writer) = RecordWriter::spawn(
        db.store.clone(),
        RecordWriterConfig {
            flush_interval: Duration::from_millis(5),
            ..RecordWriterConfig::default()
        },
    );
    let state = AppState::new(&config, db.store.clone(), records)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/chat/completions", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(samewise_proxy::serve(listener, state.clone(), async move {
        let _ = stop_rx.await;
    }));
    let watcher = QualityWatcher::spawn(&config, state.clone(), db.store.clone());
    let http = reqwest::Client::new();
    let send = |n: usize| send_tool_calls(&http, &url, &key, n);

    send(600).await?;
    let (to_a, to_b) = (a.request_count(), b.request_count());
    ensure!(to_a >= 200 && to_b >= 200, "split a {to_a}, b {to_b}");
    // every request's record is written
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = db
            .store
            .request_records(&RecordQuery {
                limit: 10_000,
                ..RecordQuery::default()
            })
            .await?
            .len();
        if n >= 600 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "only {n} records written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let detectors = Detectors::new(DetectorConfig::default(), None, &AlertsConfig::default())?;
    let alerts = detectors.sweep(&db.store, samewise_store::now_ms()).await?;
    ensure!(alerts.len() == 1, "expected one alert, got {alerts:?}");
    let alert = &alerts[0];
    ensure!(
        alert.endpoint == "b/m" && alert.kind == "passive",
        "{alert:?}"
    );
    ensure!(
        alert.summary.contains("tool-call error rate"),
        "{}",
        alert.summary
    );
    let test = alert.evidence["tests"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["signal"] == "tool_error_rate"))
        .context("tool_error_rate test")?;
    let rate = test["detail"]["rate"].as_f64().context("rate")?;
    ensure!(
        (0.07..=0.13).contains(&rate),
        "b's measured tool error rate {rate}"
    );

    // exclude: within seconds, b gets nothing more
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let route = state.model("smol").context("model")?;
        let ep = route
            .endpoints
            .iter()
            .find(|e| e.id == "b/m")
            .context("b/m")?;
        if ep.health.quality() == samewise_proxy::Quality::Excluded {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "b was never excluded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let b_before = b.request_count();
    send(50).await?;
    ensure!(
        b.request_count() == b_before,
        "excluded endpoint b still got traffic"
    );

    // resolved: traffic returns
    detectors.alerting().resolve(&db.store, alert.id).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while b.request_count() == b_before {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "traffic never returned to b"
        );
        send(5).await?;
    }

    detectors.shutdown().await;
    watcher.shutdown().await;
    let _ = stop_tx.send(());
    server.await??;
    writer.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}

/// Without `[probes.reference]` the gateway probes nothing but still watches its traffic: the
/// passive sweep flags `b` (a fifth of its tool calls cut short) and not `a`, and the quiet
/// sweep resolves, per `[probes.alerts] quiet_period_ms` (10 minutes here, not the default
/// hour), an alert last seen 20 minutes ago and keeps one seen 5 minutes ago. With no reference
/// for evals either, the passive alert's `tool_calls` eval runs against the healthy peer.
#[tokio::test]
async fn without_a_reference_the_passive_sweep_still_flags_from_traffic() -> Result<()> {
    let (a, b) = providers(5).await?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\
             [providers.a]\nbase_url = \"{}\"\n[providers.b]\nbase_url = \"{}\"\n\
             [models.smol]\npolicy = \"weighted\"\n\
             [[models.smol.endpoints]]\nprovider = \"a\"\nmodel = \"m\"\n\
             [[models.smol.endpoints]]\nprovider = \"b\"\nmodel = \"m\"\n\
             [probes]\nsweep_interval_ms = 200\nlock_retry_ms = 500\n\
             [probes.alerts]\nquiet_period_ms = 600000\n\
             [evals]\nworkers = 1\npoll_ms = 200\nmax_items = 4\nlooks = 1\n",
            data.display(),
            a.base_url(),
            b.base_url()
        ),
    )?;
    let check = run_ok(
        &["config".as_ref(), "check".as_ref(), cfg.as_os_str()],
        dir.path(),
    )?;
    ensure!(
        check.contains("probes: 0 model(s), reference none (passive detectors and alerts only)"),
        "{check}"
    );
    let key = create_key(&cfg, dir.path(), "e2e", false)?;
    // two alerts of another model's endpoint, last seen 20 and 5 minutes ago
    let now = samewise_store::now_ms();
    let (stale, fresh) = {
        let store = samewise_store::Store::connect(None, &data).await?;
        let mut ids = Vec::new();
        for (kind, minutes) in [("unfaithful", 20), ("changed", 5)] {
            let alert = samewise_store::NewAlert {
                model: "old".to_owned(),
                endpoint: "x/old".to_owned(),
                kind: kind.to_owned(),
                summary: format!("seen {minutes} minutes ago"),
                evidence: serde_json::json!({}),
                now_ms: now - minutes * 60_000,
            };
            ids.push(store.upsert_alert(&alert).await?.0.id);
        }
        store.close().await;
        (ids[0], ids[1])
    };
    let cfg_s = cfg.to_str().context("path")?;
    let (gw, url) = spawn_listening(&["serve", "--config", cfg_s], dir.path())?;
    let http = reqwest::Client::new();
    send_tool_calls(&http, &format!("{url}/v1/chat/completions"), &key, 400).await?;
    let (to_a, to_b) = (a.request_count(), b.request_count());
    ensure!(to_a >= 100 && to_b >= 100, "split a {to_a}, b {to_b}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let all = loop {
        let all = alerts(&data).await?;
        if all.iter().any(|x| x.kind == "passive") {
            break all;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no passive alert within 60 s: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let passive: Vec<&str> = all
        .iter()
        .filter(|x| x.kind == "passive")
        .map(|x| x.endpoint.as_str())
        .collect();
    ensure!(passive == ["b/m"], "passive alerts on {passive:?}");
    let state = |id: i64| {
        all.iter()
            .find(|x| x.id == id)
            .map(|x| (x.resolved_ms.is_some(), x.resolved_by))
    };
    ensure!(
        state(stale) == Some((true, Some(samewise_store::Resolver::Quiet))),
        "the alert seen 20 minutes ago: {:?}",
        state(stale)
    );
    ensure!(
        state(fresh) == Some((false, None)),
        "the alert seen 5 minutes ago: {:?}",
        state(fresh)
    );
    // the passive alert opens its tool_calls eval against the peer without an alert, a/m
    let store = samewise_store::Store::connect(None, &data).await?;
    let job = loop {
        let jobs = store.eval_jobs(None, Some("b/m"), 10).await?;
        if let Some(j) = jobs
            .into_iter()
            .find(|j| j.state == samewise_store::JobState::Succeeded)
        {
            break j;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no finished eval job on b/m within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    store.close().await;
    ensure!(
        job.suite == "tool_calls" && job.baseline == "a/m" && job.alert_id.is_some(),
        "{job:?}"
    );
    let verdict = job.verdict.as_ref().and_then(|v| v["verdict"].as_str());
    ensure!(
        matches!(verdict, Some("degraded" | "equivalent" | "inconclusive")),
        "{job:?}"
    );
    ensure!(gw.stop()?.success(), "the gateway did not exit cleanly");
    // `probes run --once` without a reference: no run, one sweep, the open alerts of every
    // configured endpoint (b's passive alert among them)
    let once = run_ok(&["probes", "run", "--once", "--config", cfg_s], dir.path())?;
    ensure!(
        once.contains("1 round(s): 0 run(s) stored")
            && once.lines().any(|l| l.contains(" b/m passive: ")),
        "{once}"
    );
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}
