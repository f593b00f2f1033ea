//! Quality-aware routing over HTTP: a drift alert inserted in the store reaches routing
//! within seconds through the alert poller (`samewise_proxy::quality`) — `exclude`: traffic
//! stops reaching that mock upstream; `demote`: it gets traffic only when the others fail;
//! `ignore`: nothing changes — and resolving the alert brings the traffic back.

use crate::common;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::*;
use samewise_proxy::Config;
use samewise_proxy::Quality;
use samewise_proxy::QualityWatcher;
use samewise_store::{Backend, NewAlert};
use samewise_testkit::{Behavior, MockUpstream};

struct Rig {
    a: MockUpstream,
    b: MockUpstream,
    gw: Gateway,
    watcher: QualityWatcher,
}

/// Mocks a and b behind model "smol" (weighted, equal weights) with this `on_drift` line,
/// and the alert poller every 50 ms.
async fn rig(on_drift: &str, backend: Backend) -> Result<Rig> {
    let a = MockUpstream::builder().name("a").start().await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let cfg = format!(
        "[server]\nalert_poll_ms = 50\n{FAST_LIMITS}{}{}{}",
        provider("a", &a.base_url(), ""),
        provider("b", &b.base_url(), ""),
        model("smol", "weighted", &[("a", "m"), ("b", "m")]).replacen(
            "policy = \"weighted\"\n",
            &format!("policy = \"weighted\"\n{on_drift}\n"),
            1
        )
    );
    let config = Config::from_toml_str(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    let gw = Gateway::start_with(
        &cfg,
        Options {
            backend,
            ..Options::default()
        },
    )
    .await?;
    let watcher = QualityWatcher::spawn(&config, gw.state.clone(), gw.db.store.clone());
    Ok(Rig { a, b, gw, watcher })
}

fn drift_on_a() -> NewAlert {
    NewAlert {
        model: "smol".to_owned(),
        endpoint: "a/m".to_owned(),
        kind: "unfaithful".to_owned(),
        summary: "endpoint a/m behaves like ≈3-bit weights".to_owned(),
        evidence: serde_json::json!({"statistic": "kl_mean", "value": 0.4}),
        now_ms: samewise_store::now_ms(),
    }
}

fn quality_of_a(gw: &Gateway) -> Result<Quality> {
    let route = gw.state.model("smol").context("model smol")?;
    let ep = route
        .endpoints
        .iter()
        .find(|e| e.id == "a/m")
        .context("endpoint a/m")?;
    Ok(ep.health.quality())
}

/// Polls until endpoint a's flag is `want` (the poller runs every 50 ms; allow 5 s).
async fn until_quality(gw: &Gateway, want: Quality) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while quality_of_a(gw)? != want {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "endpoint a never became {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Sends `n` chat requests, each answered 200; returns how many reached a and b.
async fn send(r: &Rig, n: usize) -> Result<(usize, usize)> {
    let (a0, b0) = (r.a.request_count(), r.b.request_count());
    for _ in 0..n {
        let resp = r.gw.chat(&chat_body("smol")).await?;
        ensure!(resp.status() == 200, "status {}", resp.status());
        resp.bytes().await?;
    }
    Ok((r.a.request_count() - a0, r.b.request_count() - b0))
}

async fn finish(r: Rig) -> Result<()> {
    r.watcher.shutdown().await;
    r.gw.stop().await?;
    r.a.shutdown().await;
    r.b.shutdown().await;
    Ok(())
}

/// Waits until the watcher has completed two more polls, so at least one whole poll read the
/// store after the caller's write: "nothing changed" is then a finding, not a race.
async fn two_more_polls(w: &QualityWatcher) -> Result<()> {
    let start = w.polls();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while w.polls() < start + 2 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the alert poller did not advance in 10 s (at {} polls)",
            w.polls()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn exclude_then_resolve(backend: Backend) -> Result<()> {
    let r = rig("on_drift = \"exclude\"", backend).await?;
    // both endpoints serve before any alert
    let (to_a, to_b) = send(&r, 30).await?;
    ensure!(to_a > 0 && to_b > 0, "no alert yet: a {to_a}, b {to_b}");
    let (alert, _) = r.gw.db.store.upsert_alert(&drift_on_a()).await?;
    until_quality(&r.gw, Quality::Excluded).await?;
    let (to_a, to_b) = send(&r, 30).await?;
    ensure!(
        to_a == 0 && to_b == 30,
        "excluded endpoint still got traffic: a {to_a}, b {to_b}"
    );
    // acknowledged is still active
    r.gw.db.store.ack_alert(alert.id).await?;
    two_more_polls(&r.watcher).await?;
    ensure!(quality_of_a(&r.gw)? == Quality::Excluded);
    // resolved: traffic returns
    r.gw.db.store.resolve_alert(alert.id).await?;
    until_quality(&r.gw, Quality::Ok).await?;
    let (to_a, _) = send(&r, 30).await?;
    ensure!(to_a > 0, "resolved endpoint got no traffic back");
    finish(r).await
}

#[tokio::test]
async fn exclude_stops_traffic_and_resolve_restores_it_sqlite() -> Result<()> {
    exclude_then_resolve(Backend::Sqlite).await
}

#[tokio::test]
async fn exclude_stops_traffic_and_resolve_restores_it_postgres() -> Result<()> {
    exclude_then_resolve(Backend::Postgres).await
}

#[tokio::test]
async fn exclude_of_every_endpoint_demotes_them_instead() -> Result<()> {
    let r = rig("on_drift = \"exclude\"", Backend::Sqlite).await?;
    r.gw.db.store.upsert_alert(&drift_on_a()).await?;
    until_quality(&r.gw, Quality::Excluded).await?;
    let mut on_b = drift_on_a();
    on_b.endpoint = "b/m".to_owned();
    r.gw.db.store.upsert_alert(&on_b).await?;
    // both alerted: excluding both would leave smol unservable, so both are demoted
    until_quality(&r.gw, Quality::Demoted).await?;
    let route = r.gw.state.model("smol").context("smol")?;
    ensure!(
        route
            .endpoints
            .iter()
            .all(|e| e.health.quality() == Quality::Demoted)
    );
    let (to_a, to_b) = send(&r, 30).await?;
    ensure!(
        to_a + to_b == 30 && to_a > 0 && to_b > 0,
        "a {to_a}, b {to_b}"
    );
    finish(r).await
}

#[tokio::test]
async fn demote_keeps_the_endpoint_as_a_fallback() -> Result<()> {
    // on_drift omitted: demote is the default
    let r = rig("", Backend::Sqlite).await?;
    let (alert, _) = r.gw.db.store.upsert_alert(&drift_on_a()).await?;
    until_quality(&r.gw, Quality::Demoted).await?;
    let (to_a, to_b) = send(&r, 30).await?;
    ensure!(
        to_a == 0 && to_b == 30,
        "demoted endpoint chosen while b is fine: a {to_a}, b {to_b}"
    );
    // b fails: the demoted endpoint answers as the fallback
    for _ in 0..5 {
        r.b.push(Behavior::Status(
            503,
            "{\"error\":{\"message\":\"down\"}}".to_owned(),
        ));
    }
    let (to_a, _) = send(&r, 5).await?;
    ensure!(
        to_a == 5,
        "demoted endpoint was not used as the fallback: {to_a}"
    );
    r.gw.db.store.resolve_alert(alert.id).await?;
    until_quality(&r.gw, Quality::Ok).await?;
    finish(r).await
}

#[tokio::test]
async fn ignore_routes_as_if_there_were_no_alert() -> Result<()> {
    let r = rig("on_drift = \"ignore\"", Backend::Sqlite).await?;
    r.gw.db.store.upsert_alert(&drift_on_a()).await?;
    // another model's alert on a same-named endpoint does not count either
    let mut other = drift_on_a();
    other.model = "other".to_owned();
    r.gw.db.store.upsert_alert(&other).await?;
    two_more_polls(&r.watcher).await?;
    ensure!(quality_of_a(&r.gw)? == Quality::Ok);
    let (to_a, to_b) = send(&r, 30).await?;
    ensure!(to_a > 0 && to_b > 0, "a {to_a}, b {to_b}");
    finish(r).await
}

#[test]
fn on_drift_is_validated() {
    let base = "[providers.p]\nbase_url = \"http://127.0.0.1:1/v1\"\n[models.m]\n";
    let ok = format!(
        "{base}on_drift = \"exclude\"\n[[models.m.endpoints]]\nprovider = \"p\"\nmodel = \"x\"\n"
    );
    let cfg = Config::from_toml_str(&ok).map_err(|e| e.to_string());
    assert!(cfg.is_ok_and(|c| c.models["m"].on_drift == samewise_proxy::OnDrift::Exclude));
    let bad = format!(
        "{base}on_drift = \"panic\"\n[[models.m.endpoints]]\nprovider = \"p\"\nmodel = \"x\"\n"
    );
    let err = Config::from_toml_str(&bad)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("panic"), "{err}");
    let zero = format!("[server]\nalert_poll_ms = 0\n{ok}");
    let err = Config::from_toml_str(&zero)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("alert_poll_ms"), "{err}");
}
