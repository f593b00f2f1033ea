//! Alert lifecycle and webhooks against a real local HTTP receiver (the double of a
//! third-party webhook endpoint, on 127.0.0.1 port 0) that can refuse its first N
//! deliveries: opened once per alert, resolved once, re-opened as a new alert; retries with
//! backoff; delivery failures counted after the last attempt; generic and Slack bodies.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use axum::extract::State;
use axum::http::StatusCode;
use samewise_probes::{Alerting, AlertsConfig};
use samewise_probes::{WebhookConfig, WebhookFormat};
use samewise_store::testing::TestDb;
use samewise_store::{AlertState, Backend, NewAlert};
use tokio::sync::Mutex;

#[derive(Default)]
struct Receiver {
    /// Deliveries to refuse (503) before accepting.
    fail_first: usize,
    hits: AtomicUsize,
    bodies: Mutex<Vec<serde_json::Value>>,
}

async fn hook(State(r): State<Arc<Receiver>>, body: axum::body::Bytes) -> StatusCode {
    let n = r.hits.fetch_add(1, Ordering::SeqCst);
    if n < r.fail_first {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    match serde_json::from_slice(&body) {
        Ok(v) => {
            r.bodies.lock().await.push(v);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

/// Serves the receiver; the returned task is aborted when the test ends.
async fn receiver(
    fail_first: usize,
) -> Result<(String, Arc<Receiver>, tokio::task::JoinHandle<()>)> {
    let state = Arc::new(Receiver {
        fail_first,
        ..Receiver::default()
    });
    let app = axum::Router::new()
        .route("/hook/secret-token", axum::routing::post(hook))
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}/hook/secret-token"), state, task))
}

fn hook_config(url: &str, format: WebhookFormat, max_attempts: u32) -> WebhookConfig {
    WebhookConfig {
        url: url.to_owned(),
        format,
        max_attempts,
        backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        timeout: Duration::from_secs(5),
    }
}

fn finding(now_ms: i64) -> NewAlert {
    NewAlert {
        model: "smol".to_owned(),
        endpoint: "p/b".to_owned(),
        kind: "unfaithful".to_owned(),
        summary: "endpoint p/b behaves like ≈3.2-bit weights".to_owned(),
        evidence: serde_json::json!({"statistic": "kl_mean", "value": 0.3}),
        now_ms,
    }
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test]
async fn lifecycle_notifies_open_and_resolve_once_with_retries() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    // the receiver refuses the first two deliveries: the first event needs three attempts
    let (url, rx, server) = receiver(2).await?;
    let (slack_url, slack_rx, slack_server) = receiver(0).await?;
    let cfg = AlertsConfig {
        quiet_period: Duration::from_secs(60),
        webhooks: vec![
            hook_config(&url, WebhookFormat::Generic, 5),
            hook_config(&slack_url, WebhookFormat::Slack, 5),
        ],
    };
    let alerting = Alerting::start(&cfg)?;
    let (a, opened) = alerting.raise(&db.store, &finding(1_000)).await?;
    ensure!(opened);
    // seen again: refreshed, no second notification
    let (again, opened) = alerting.raise(&db.store, &finding(2_000)).await?;
    ensure!(!opened && again.id == a.id);
    ensure!(
        alerting
            .acknowledge(&db.store, a.id)
            .await?
            .map(|x| x.state)
            == Some(AlertState::Acknowledged)
    );
    let resolved = alerting
        .resolve(&db.store, a.id)
        .await?
        .context("resolve")?;
    ensure!(resolved.state == AlertState::Resolved);
    // resolving again notifies nothing
    alerting.resolve(&db.store, a.id).await?;
    // after resolution the same finding opens a new alert, notified again
    let (b, opened) = alerting.raise(&db.store, &finding(3_000)).await?;
    ensure!(opened && b.id != a.id);
    // quiet for longer than the quiet period: auto-resolved, notified as such
    let quiet = alerting.auto_resolve(&db.store, 100_000).await?;
    ensure!(quiet.len() == 1 && quiet[0].id == b.id);
    // shutdown waits for the queue to drain
    alerting.shutdown().await;
    let bodies = rx.bodies.lock().await.clone();
    let events: Vec<(String, i64)> = bodies
        .iter()
        .map(|v| {
            (
                v["event"].as_str().unwrap_or("?").to_owned(),
                v["alert"]["id"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    ensure!(
        events
            == [
                ("opened".to_owned(), a.id),
                ("resolved".to_owned(), a.id),
                ("opened".to_owned(), b.id),
                ("resolved".to_owned(), b.id)
            ],
        "{events:?}"
    );
    ensure!(
        bodies[0]["alert"]["evidence"]["value"] == 0.3 && bodies[0]["alert"]["state"] == "open"
    );
    ensure!(
        bodies[1]["alert"]["state"] == "resolved"
            && bodies[1]["alert"]["resolved_ms"].is_i64()
            && bodies[1]["alert"]["resolved_by"] == "operator"
    );
    ensure!(bodies[3]["alert"]["resolved_by"] == "quiet");
    ensure!(
        rx.hits.load(Ordering::SeqCst) == 6,
        "hits {}",
        rx.hits.load(Ordering::SeqCst)
    );
    let slack = slack_rx.bodies.lock().await.clone();
    ensure!(slack.len() == 4);
    for v in &slack {
        let obj = v.as_object().context("slack body")?;
        ensure!(obj.len() == 1, "slack body has only text: {v}");
        let text = obj.get("text").and_then(|t| t.as_str()).context("text")?;
        ensure!(
            text.contains("p/b") && text.contains("unfaithful"),
            "{text}"
        );
    }
    ensure!(
        slack[1]["text"]
            .as_str()
            .is_some_and(|t| t.contains(" resolved by an operator: ")),
        "{}",
        slack[1]
    );
    ensure!(
        slack[3]["text"]
            .as_str()
            .is_some_and(|t| t.contains(" auto-resolved after its quiet period: ")),
        "{}",
        slack[3]
    );
    let stats = alerting.webhook_stats();
    ensure!(
        stats.delivered == 8 && stats.retries == 2 && stats.failed == 0 && stats.dropped == 0,
        "{stats:?}"
    );
    server.abort();
    slack_server.abort();
    Ok(())
}

#[tokio::test]
async fn failing_hook_is_bounded_and_counted() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let (url, rx, server) = receiver(usize::MAX).await?;
    // an unreachable hook as well: a port nothing listens on
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let dead_url = format!("http://{}/x", dead.local_addr()?);
    drop(dead);
    let cfg = AlertsConfig {
        quiet_period: Duration::from_secs(1),
        webhooks: vec![
            hook_config(&url, WebhookFormat::Generic, 3),
            hook_config(&dead_url, WebhookFormat::Generic, 2),
        ],
    };
    let alerting = Alerting::start(&cfg)?;
    alerting.raise(&db.store, &finding(1_000)).await?;
    // quiet for longer than the quiet period: auto-resolved, notified (and failing too)
    let resolved = alerting.auto_resolve(&db.store, 10_000).await?;
    ensure!(resolved.len() == 1 && resolved[0].state == AlertState::Resolved);
    wait_for("both events to fail on both hooks", || {
        alerting.webhook_stats().failed == 4
    })
    .await?;
    alerting.shutdown().await;
    let stats = alerting.webhook_stats();
    // 2 events × (3 attempts + 2 attempts) = 10 attempts, 6 of them retries
    ensure!(
        stats.failed == 4 && stats.delivered == 0 && stats.retries == 6,
        "{stats:?}"
    );
    ensure!(
        rx.hits.load(Ordering::SeqCst) == 6,
        "bounded: {} hits",
        rx.hits.load(Ordering::SeqCst)
    );
    server.abort();
    Ok(())
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let h = WebhookConfig {
        url: "http://127.0.0.1/".to_owned(),
        format: WebhookFormat::Generic,
        max_attempts: 10,
        backoff: Duration::from_millis(500),
        max_backoff: Duration::from_secs(3),
        timeout: Duration::from_secs(1),
    };
    let delays: Vec<u128> = (2..=7).map(|a| h.delay_before(a).as_millis()).collect();
    assert_eq!(delays, [500, 1000, 2000, 3000, 3000, 3000]);
}

#[test]
fn webhook_list_parses_url_env_and_refuses_bad_entries() -> Result<()> {
    let v: toml::Value = toml::Value::Array(vec![toml::Value::Table(
        "url = \"https://hooks.example/abc\"\nformat = \"slack\"\nmax_attempts = 3\nbackoff_ms = 100".parse()?,
    )]);
    let hooks = WebhookConfig::parse_list(&v, "probes.webhooks")?;
    ensure!(
        hooks.len() == 1 && hooks[0].format == WebhookFormat::Slack && hooks[0].max_attempts == 3
    );
    for (bad, key) in [
        ("url = \"https://x\"\nurl_env = \"X\"", "exactly one"),
        ("format = \"teams\"\nurl = \"https://x\"", "teams"),
        ("url = \"https://x\"\nmax_attempts = 0", "max_attempts"),
        (
            "url_env = \"SAMEWISE_TEST_SURELY_UNSET_HOOK\"",
            "SAMEWISE_TEST_SURELY_UNSET_HOOK",
        ),
        ("url = \"https://x\"\nextra = 1", "extra"),
    ] {
        let v = toml::Value::Array(vec![toml::Value::Table(bad.parse()?)]);
        let err = WebhookConfig::parse_list(&v, "probes.webhooks")
            .err()
            .context(format!("accepted {bad}"))?;
        ensure!(err.to_string().contains(key), "{bad}: {err}");
    }
    Ok(())
}
