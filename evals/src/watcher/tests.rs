//! The alert watcher over a real SQLite store: which alerts open which suites, the jobs an
//! incident's alerts share, the verdict alerts it holds and confirms, and the peer a job runs
//! against without a reference.

use super::*;
use anyhow::{Context, Result, ensure};
use samewise_store::testing::TestDb;
use samewise_store::{NewAlert, NewEvalJob, now_ms};

const HOUR_MS: i64 = 3_600_000;

/// A watcher with the default rules, `cooldown_ms`, and two endpoints, `a/m` and `b/m`.
fn watcher(store: &Store, cooldown_ms: i64) -> Result<AlertWatcher> {
    let t: toml::Table =
        format!("reference_url = \"http://127.0.0.1:9\"\ncooldown_ms = {cooldown_ms}").parse()?;
    let cfg = crate::EvalsConfig::parse(Some(&t), None)?;
    let endpoints = ["a/m", "b/m"].map(|e| (e.to_owned(), "m".to_owned()));
    Ok(AlertWatcher::new(
        store.clone(),
        Opener::new(cfg, endpoints),
    ))
}

async fn raise(
    store: &Store,
    (endpoint, kind): (&str, &str),
    evidence: serde_json::Value,
    at: i64,
) -> Result<Alert> {
    let a = NewAlert {
        model: "m".to_owned(),
        endpoint: endpoint.to_owned(),
        kind: kind.to_owned(),
        summary: format!("{kind} on {endpoint}"),
        evidence,
        now_ms: at,
    };
    Ok(store.upsert_alert(&a).await?.0)
}

/// Opens a `tool_calls` job against the reference on `endpoint` by hand.
async fn open_by_hand(store: &Store, endpoint: &str) -> Result<()> {
    let job = NewEvalJob {
        model: "m".to_owned(),
        endpoint: endpoint.to_owned(),
        suite: "tool_calls".to_owned(),
        baseline: "reference".to_owned(),
        alert_id: None,
        params: json!({}),
        max_attempts: 1,
        now_ms: now_ms(),
    };
    store
        .enqueue_eval_job(&job, 0)
        .await?
        .context("not opened")?;
    Ok(())
}

/// The `eval_degraded` alert of `job`'s verdict on `endpoint`, last seen `at`.
async fn verdict_alert(store: &Store, endpoint: &str, job: &EvalJob, at: i64) -> Result<Alert> {
    let evidence = json!({"signal": "eval", "job_id": job.id, "suite": "tool_calls"});
    raise(store, (endpoint, KIND_EVAL_DEGRADED), evidence, at).await
}

/// Claims the oldest queued job and finishes it with `verdict` (None: failed).
async fn finish(store: &Store, verdict: Option<&str>) -> Result<EvalJob> {
    let (job, lease) = store
        .claim_eval_job("w", now_ms(), 60_000)
        .await?
        .context("no job to claim")?;
    let (state, doc) = match verdict {
        Some(v) => (JobState::Succeeded, Some(json!({"verdict": v}))),
        None => (JobState::Failed, None),
    };
    let error = verdict.is_none().then_some("the endpoint did not answer");
    ensure!(
        store
            .finish_eval_job(&lease, state, doc.as_ref(), error, now_ms())
            .await?
    );
    Ok(job)
}

async fn opened(w: &AlertWatcher) -> Result<Vec<(String, Option<i64>)>> {
    Ok(w.poll_once()
        .await?
        .into_iter()
        .map(|j| (j.suite, j.alert_id))
        .collect())
}

/// The holders of verdict alert `d` (an error for any other).
async fn held_by(store: &Store, d: &Alert, cooldown: Duration) -> Result<Vec<Alert>> {
    holders(store, d, cooldown)
        .await?
        .context("not an active verdict alert")
}

fn ids(alerts: &[Alert]) -> Vec<i64> {
    alerts.iter().map(|a| a.id).collect()
}

async fn last_seen(store: &Store, id: i64) -> Result<i64> {
    Ok(store.alert(id).await?.context("alert gone")?.last_seen_ms)
}

fn tool_calls(a: &Alert) -> Vec<(String, Option<i64>)> {
    vec![("tool_calls".to_owned(), Some(a.id))]
}

/// With no cooldown, only the once-per-alert rule keeps an alert from opening a suite
/// again.
#[tokio::test]
async fn an_alert_opens_each_suite_once_and_holds_its_degraded_verdict() -> Result<()> {
    let db = TestDb::sqlite().await?;
    let store = &db.store;
    let w = watcher(store, 0)?;
    let now = now_ms();
    let a = raise(store, ("a/m", "unfaithful"), json!({"bits": 4}), now).await?;
    ensure!(opened(&w).await? == tool_calls(&a));
    // still active, no cooldown: not again while its job is queued, running or done
    ensure!(opened(&w).await?.is_empty(), "reopened while queued");
    finish(store, None).await?;
    // a failed job gave no verdict: opened again, then not
    ensure!(
        opened(&w).await? == tool_calls(&a),
        "not reopened after a failure"
    );
    ensure!(opened(&w).await?.is_empty());
    let degraded = finish(store, Some("degraded")).await?;
    ensure!(opened(&w).await?.is_empty(), "reopened after a verdict");
    // both jobs answer it, newest first, the failed one too
    let answering = jobs_answering(store, &a, Duration::ZERO).await?;
    let states: Vec<JobState> = answering.iter().map(|j| j.state).collect();
    ensure!(
        states == [JobState::Succeeded, JobState::Failed],
        "{answering:?}"
    );

    // the verdict's eval_degraded alert, last seen ten hours ago, is held by the active
    // alert: the quiet sweep of an hour leaves it
    let d = verdict_alert(store, "a/m", &degraded, now - 10 * HOUR_MS).await?;
    ensure!(d.last_seen_ms == now - 10 * HOUR_MS);
    let before = now_ms();
    ensure!(opened(&w).await?.is_empty());
    ensure!(last_seen(store, d.id).await? >= before, "not held");
    ensure!(ids(&held_by(store, &d, Duration::ZERO).await?) == [a.id]);
    ensure!(
        holders(store, &a, Duration::ZERO).await?.is_none(),
        "not a verdict's alert"
    );
    let swept = store.resolve_quiet_alerts(now_ms() - HOUR_MS).await?;
    ensure!(swept.is_empty(), "swept: {swept:?}");

    // a later job of the suite on the endpoint (opened by hand) passes: no longer held
    open_by_hand(store, "a/m").await?;
    finish(store, Some("equivalent")).await?;
    let seen = last_seen(store, d.id).await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    ensure!(opened(&w).await?.is_empty());
    ensure!(last_seen(store, d.id).await? == seen, "held after a pass");
    let held = held_by(store, &d, Duration::ZERO).await?;
    ensure!(held.is_empty(), "held after a pass by {:?}", ids(&held));

    // another alert on the endpoint, raised after every job there: its own job; once
    // cancelled, not reopened
    let b = raise(
        store,
        ("a/m", "passive"),
        json!({"signal": "tool_call_errors"}),
        now_ms(),
    )
    .await?;
    ensure!(opened(&w).await? == tool_calls(&b));
    let queued = store.eval_jobs(Some(b.id), None, 10).await?;
    let first = queued.first().context("no job of b")?;
    store.cancel_eval_job(first.id).await?;
    ensure!(opened(&w).await?.is_empty(), "a cancelled job was reopened");

    // an alert on an endpoint this config does not know: refused, logged once while it
    // stays active, forgotten once resolved
    let lost = raise(store, ("gone/m", "unfaithful"), json!({}), now).await?;
    ensure!(opened(&w).await?.is_empty());
    ensure!(
        w.refused_before(lost.id, "tool_calls"),
        "the refusal was not recorded"
    );
    store.resolve_alert(lost.id).await?;
    ensure!(opened(&w).await?.is_empty());
    ensure!(
        !w.refused_before(lost.id, "tool_calls"),
        "kept after the resolution"
    );

    // a confirmation never reopens: an operator's resolution stands
    store.resolve_alert(d.id).await?;
    ensure!(
        store
            .confirm_alert(d.id)
            .await?
            .is_some_and(|x| x.resolved_ms.is_some())
    );
    ensure!(store.confirm_alert(i64::MAX).await?.is_none());
    Ok(())
}

/// Two alerts of one incident on an endpoint: the second, raised within the cooldown of
/// the first one's job, shares it — after the cooldown too — and holds its verdict once
/// the first is resolved.
#[tokio::test]
async fn alerts_of_one_incident_share_a_suites_run_and_its_verdict() -> Result<()> {
    const COOLDOWN_MS: i64 = 300;
    let db = TestDb::sqlite().await?;
    let store = &db.store;
    let w = watcher(store, COOLDOWN_MS)?;
    let first = raise(store, ("b/m", "unfaithful"), json!({"bits": 4}), now_ms()).await?;
    ensure!(opened(&w).await? == tool_calls(&first));
    let second = raise(
        store,
        ("b/m", "passive"),
        json!({"signal": "tool"}),
        now_ms(),
    )
    .await?;
    // past the cooldown the store would open another job; the second alert shares the
    // first one's instead
    tokio::time::sleep(Duration::from_millis(COOLDOWN_MS as u64 + 50)).await;
    ensure!(
        opened(&w).await?.is_empty(),
        "the second alert ran the suite again"
    );
    // the first one's job answers both; the alert pages and `alerts show` list it
    let cooldown = Duration::from_millis(COOLDOWN_MS as u64);
    for a in [&first, &second] {
        let jobs = jobs_answering(store, a, cooldown).await?;
        let by: Vec<Option<i64>> = jobs.iter().map(|j| j.alert_id).collect();
        ensure!(by == [Some(first.id)], "alert {}: {jobs:?}", a.id);
    }
    let degraded = finish(store, Some("degraded")).await?;
    ensure!(degraded.alert_id == Some(first.id));
    let d = verdict_alert(store, "b/m", &degraded, now_ms() - HOUR_MS).await?;
    store.resolve_alert(first.id).await?;
    let before = now_ms();
    ensure!(opened(&w).await?.is_empty());
    ensure!(
        last_seen(store, d.id).await? >= before,
        "the second alert does not hold it"
    );
    ensure!(ids(&held_by(store, &d, cooldown).await?) == [second.id]);

    // a third alert raised well after that job (more than the cooldown) runs its own
    store.resolve_alert(second.id).await?;
    tokio::time::sleep(Duration::from_millis(COOLDOWN_MS as u64 + 50)).await;
    let third = raise(store, ("b/m", "unfaithful"), json!({"bits": 3}), now_ms()).await?;
    ensure!(opened(&w).await? == tool_calls(&third));
    Ok(())
}

/// Without a reference (and without traffic to tell peers apart) an alert's suite runs
/// against the first peer of its model with no active alert; with none left, nothing is opened (and the refusal is logged once). A
/// second alert of an incident shares the first one's job against its peer.
#[tokio::test]
async fn without_a_reference_an_alert_is_answered_against_a_peer_without_alerts() -> Result<()> {
    let db = TestDb::sqlite().await?;
    let store = &db.store;
    let cfg = crate::EvalsConfig::parse(Some(&"cooldown_ms = 60000".parse()?), None)?;
    let endpoints = ["a/m", "b/m", "c/m", "x/other"].map(|e| {
        let model = e.split('/').nth(1).unwrap_or_default();
        (e.to_owned(), model.to_owned())
    });
    let w = AlertWatcher::new(store.clone(), Opener::new(cfg, endpoints));
    let mut first = None;
    for (endpoint, peer) in [("b/m", Some("a/m")), ("a/m", Some("c/m")), ("c/m", None)] {
        let a = raise(
            store,
            (endpoint, "unfaithful"),
            json!({"bits": 4}),
            now_ms(),
        )
        .await?;
        let jobs = w.poll_once().await?;
        let got: Vec<(&str, &str)> = jobs
            .iter()
            .map(|j| (j.endpoint.as_str(), j.baseline.as_str()))
            .collect();
        let expect: Vec<(&str, &str)> = peer.map(|p| (endpoint, p)).into_iter().collect();
        ensure!(got == expect, "alert on {endpoint}: {got:?}");
        if peer.is_none() {
            ensure!(
                w.refused_before(a.id, "tool_calls"),
                "the refusal was not recorded"
            );
        }
        first = first.or(Some(a));
    }
    // a second alert of b/m's incident shares the first one's job against a/m
    let first = first.context("no alert")?;
    let passive = json!({"signal": "tool_call_errors"});
    let second = raise(store, ("b/m", "passive"), passive, now_ms()).await?;
    ensure!(
        w.poll_once().await?.is_empty(),
        "the second alert opened its own"
    );
    let shared = jobs_answering(store, &second, Duration::from_secs(60)).await?;
    let by: Vec<(Option<i64>, &str)> = shared
        .iter()
        .map(|j| (j.alert_id, j.baseline.as_str()))
        .collect();
    ensure!(by == [(Some(first.id), "a/m")], "{by:?}");
    Ok(())
}

/// Without a reference, the peer is the healthiest by the last hour of traffic: of b/m's
/// peers a/m (a fifth of its attempts failed), c/m (clean, 10 attempts) and d/m (clean,
/// 30 attempts) and e/m (no traffic), d/m; with d/m alerted, c/m; the pure ranking puts a
/// peer without traffic last.
#[tokio::test]
async fn without_a_reference_the_peer_is_the_healthiest_by_traffic() -> Result<()> {
    let db = TestDb::sqlite().await?;
    let store = &db.store;
    let now = now_ms();
    let mut records = Vec::new();
    for (endpoint, n, failed) in [("a/m", 50, 10), ("c/m", 10, 0), ("d/m", 30, 0)] {
        for i in 0..n {
            records.push(samewise_store::RequestRecord {
                request_id: format!("{endpoint}-{i}"),
                attempt: 1,
                final_attempt: true,
                ts_ms: now - 600_000 + i,
                model: "m".to_owned(),
                endpoint: Some(endpoint.to_owned()),
                route: "chat".to_owned(),
                status: Some(if i < failed { 502 } else { 200 }),
                error_kind: (i < failed).then(|| "upstream_5xx".to_owned()),
                attempts: 1,
                latency_ms: 100.0,
                ..samewise_store::RequestRecord::default()
            });
        }
    }
    store.insert_request_records(&records).await?;
    let cfg = crate::EvalsConfig::parse(Some(&"cooldown_ms = 60000".parse()?), None)?;
    let endpoints = ["a/m", "b/m", "c/m", "d/m", "e/m"].map(|e| (e.to_owned(), "m".to_owned()));
    let w = AlertWatcher::new(store.clone(), Opener::new(cfg, endpoints));
    raise(store, ("b/m", "unfaithful"), json!({"bits": 4}), now_ms()).await?;
    let got: Vec<String> = w
        .poll_once()
        .await?
        .into_iter()
        .map(|j| j.baseline)
        .collect();
    ensure!(got == ["d/m"], "{got:?}");
    // d/m alerted: the clean c/m before a/m, whose fifth failed, and e/m, which served none
    raise(
        store,
        ("d/m", "passive"),
        json!({"signal": "error_rate"}),
        now_ms(),
    )
    .await?;
    raise(store, ("e/m", "unfaithful"), json!({"bits": 4}), now_ms()).await?;
    let got: Vec<(String, String)> = w
        .poll_once()
        .await?
        .into_iter()
        .map(|j| (j.endpoint, j.baseline))
        .collect();
    ensure!(got.iter().any(|(e, b)| e == "e/m" && b == "c/m"), "{got:?}");
    let traffic = store
        .endpoint_rollups(&RollupQuery {
            model: Some("m".to_owned()),
            endpoint: None,
            since_ms: now - PEER_WINDOW_MS,
            until_ms: now_ms(),
        })
        .await?;
    ensure!(healthiest(&["a/m", "e/m"], &traffic) == Some("a/m"));
    ensure!(healthiest(&["e/m", "f/m"], &traffic) == Some("e/m"));
    ensure!(healthiest(&[], &traffic).is_none());
    Ok(())
}

/// With `hold_every`, a held verdict's alert is written once per period, not every poll.
#[tokio::test]
async fn a_held_verdict_is_confirmed_once_per_hold_every() -> Result<()> {
    const EVERY_MS: u64 = 600;
    let db = TestDb::sqlite().await?;
    let store = &db.store;
    let w = watcher(store, 0)?.hold_every(Duration::from_millis(EVERY_MS));
    let a = raise(store, ("a/m", "unfaithful"), json!({"bits": 4}), now_ms()).await?;
    ensure!(opened(&w).await? == tool_calls(&a));
    let degraded = finish(store, Some("degraded")).await?;
    let d = verdict_alert(store, "a/m", &degraded, now_ms() - HOUR_MS).await?;
    // last seen an hour ago: confirmed at once
    let before = now_ms();
    ensure!(opened(&w).await?.is_empty());
    let first = last_seen(store, d.id).await?;
    ensure!(first >= before, "a stale held alert was not confirmed");
    // seen just now: the next polls leave it
    for _ in 0..3 {
        ensure!(opened(&w).await?.is_empty());
    }
    let polled = now_ms();
    ensure!(
        polled - first >= i64::try_from(EVERY_MS)? || last_seen(store, d.id).await? == first,
        "confirmed again within hold_every"
    );
    // once the period has passed, confirmed again
    tokio::time::sleep(Duration::from_millis(EVERY_MS + 50)).await;
    ensure!(opened(&w).await?.is_empty());
    ensure!(
        last_seen(store, d.id).await? > first,
        "not confirmed after hold_every"
    );
    Ok(())
}
