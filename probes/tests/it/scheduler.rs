//! The probe scheduler against the real engine on the test model: it stores runs and noise
//! pairs within the hourly token budget, one scheduler per database holds the PostgreSQL
//! advisory lock (a standby takes over when it is freed or its session dies), and a provider
//! switched mid-run raises a changed alert, with the reference's probes or, without one, with
//! fingerprints of the endpoint's own logprobs.
//!
//! The test model is `$SAMEWISE_MODEL` if set, else
//! `~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf`; a missing model fails.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use axum::body::Bytes;
use axum::routing::post;
use samewise_probes::ProbeKind;
use samewise_probes::runner::{RoundResult, Scheduler};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, ProbeRunQuery};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_stores_runs_with_noise_pairs_and_respects_the_budget() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let cfg = probes_config("kinds = [\"prompt_logprobs\"]\ntoken_budget_per_hour = 400\n")?;
    let s = scheduler(
        cfg,
        &db,
        Some(reference()?),
        None,
        vec![target(&url, "engine/smol")],
    )?;

    // round 0 is a noise-floor pair
    let runs = stored(&s, 0, ProbeKind::PromptLogprobs, 0).await?;
    ensure!(runs.len() == 2, "noise pair expected, got {}", runs.len());
    ensure!(runs[1].repeat_of == Some(runs[0].id) && runs[0].repeat_of.is_none());
    let stored = db
        .store
        .probe_runs(&ProbeRunQuery {
            model: Some("smol".into()),
            endpoint: None,
            kind: None,
            since_ms: None,
            limit: 10,
        })
        .await?;
    ensure!(stored.len() == 2, "{stored:?}");
    for r in &stored {
        ensure!(
            r.ok && r.kind == "prompt_logprobs" && r.endpoint == "engine/smol" && r.tokens > 0,
            "{r:?}"
        );
        ensure!(
            r.finished_ms >= r.started_ms && r.raw.is_some() && r.stats.get("kl_mean").is_some(),
            "{r:?}"
        );
    }
    // the repeat (stored first of the two, newest first) carries the pair's statistics,
    // from both runs' raw data: the detectors' noise floor needs no raw data
    let (first, repeat) = (&stored[1], &stored[0]);
    ensure!(repeat.repeat_of == Some(first.id) && first.stats.get("noise_pair").is_none());
    let pair = samewise_probes::detect::noise_pair_stats(
        first.raw.as_deref().context("raw")?,
        repeat.raw.as_deref().context("raw")?,
    )?;
    ensure!(
        repeat.stats["noise_pair"] == pair && pair["kl_mean"].as_f64().is_some(),
        "{}",
        repeat.stats
    );
    // the two runs spent more than the 400-token budget: the next round is skipped
    let spent: i64 = stored.iter().map(|r| r.tokens).sum();
    ensure!(spent >= 400, "spent {spent}");
    match s
        .run_round(&s.targets()[0], ProbeKind::PromptLogprobs, 1)
        .await?
    {
        RoundResult::OverBudget { spent: reported } => ensure!(reported == spent),
        RoundResult::Stored(r) => anyhow::bail!("ran over budget: {r:?}"),
    }
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// On PostgreSQL the scheduler stands by while another session holds the lock, takes over
/// once it is released, survives the loss of its own lock session, and drains on shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_scheduler_takes_over_when_the_lock_is_freed() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let db = TestDb::new(Backend::Postgres).await?;
    let cfg = probes_config("kinds = [\"prompt_logprobs\"]\ninterval_ms = 300\njitter = 0.0\n")?;
    let s = Arc::new(scheduler(
        cfg,
        &db,
        Some(reference()?),
        None,
        vec![target(&url, "engine/smol")],
    )?);
    let holder = db
        .store
        .try_scheduler_lock()
        .await?
        .context("lock free at start")?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(Arc::clone(&s).run(shutdown.clone()));
    let q = ProbeRunQuery {
        model: None,
        endpoint: None,
        kind: None,
        since_ms: None,
        limit: 100,
    };
    // at least two lock attempts found the lock taken (so the standby did look, and more
    // than once) before "it probed nothing" is asserted
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while s.standby_checks() < 2 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the standby did not retry the lock in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ensure!(
        db.store.probe_runs(&q).await?.is_empty(),
        "a standby scheduler probed"
    );
    holder.release().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let n = db.store.probe_runs(&q).await?.len();
        if n >= 3 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "scheduler did not take over ({n} runs)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the lock's session dies (as when a holder crashes or its connection drops): the
    // scheduler notices, stands down, takes the free lock again on a new session, and goes on
    let lock_pid = samewise_store::testing::pg_advisory_lock_holder(db.url())
        .await?
        .context("no session holds the lock")?;
    samewise_store::testing::pg_terminate_backend(db.url(), lock_pid).await?;
    let before = db.store.probe_runs(&q).await?.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let holder = samewise_store::testing::pg_advisory_lock_holder(db.url()).await?;
        let n = db.store.probe_runs(&q).await?.len();
        if holder.is_some_and(|p| p != lock_pid) && n >= before + 2 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no takeover after the lock's session died (holder {holder:?}, {n} runs)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .context("scheduler did not drain")??;
    // after shutdown the lock is free again
    ensure!(
        db.store.try_scheduler_lock().await?.is_some(),
        "lock not released on shutdown"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Every alert, active or not (at most 10).
const ALL_ALERTS: samewise_store::AlertQuery = samewise_store::AlertQuery {
    state: None,
    active_only: false,
    model: None,
    endpoint: None,
    limit: 10,
};

async fn all_alerts(store: &samewise_store::Store) -> Result<Vec<samewise_store::Alert>> {
    Ok(store.alerts(&ALL_ALERTS).await?)
}

/// A provider that changes what it serves mid-run: the first `after` completions requests
/// pass through to the engine unchanged, later ones get logprobs scaled by 1.3.
fn switching_double(upstream: String, after: usize) -> axum::Router {
    scaling_double(upstream, move |n| if n >= after { 1.3 } else { 1.0 })
}

/// A provider whose `n`-th completions request (from 0) gets the engine's logprobs scaled by
/// `factor(n)`.
fn scaling_double(
    upstream: String,
    factor: impl Fn(usize) -> f64 + Clone + Send + Sync + 'static,
) -> axum::Router {
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    axum::Router::new().route(
        "/v1/completions",
        post(move |body: Bytes| {
            let upstream = upstream.clone();
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let f = factor(n);
            async move {
                let Some(mut v) = forward(&upstream, "/v1/completions", body).await else {
                    return axum::Json(json!({}));
                };
                if f != 1.0 {
                    scale(&mut v, f);
                }
                axum::Json(v)
            }
        }),
    )
}

/// An endpoint switched mid-run raises a "changed" alert through the scheduler's rounds and
/// the detectors it calls after each stored run; before the switch, nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mid_run_switch_raises_a_changed_alert() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    // rounds 0 and 3 are noise pairs (noise_pair_every = 3): rounds 0..=4 make 7 requests,
    // all answered exactly; from round 5 on the provider has switched
    let switching = serve(switching_double(url.clone(), 7), &stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let cfg = probes_config("kinds = [\"prompt_logprobs\"]\n")?;
    let detectors =
        detectors("cusum_baseline_rounds = 3\nhistory_runs = 30\nkl_threshold = 100.0\n")?;
    let s = scheduler(
        cfg,
        &db,
        Some(reference()?),
        Some(detectors.clone()),
        vec![target(&switching, "switching/smol")],
    )?;
    for round in 0..5 {
        s.run_round(&s.targets()[0], ProbeKind::PromptLogprobs, round)
            .await?;
    }
    ensure!(
        all_alerts(&db.store).await?.is_empty(),
        "alert before the switch: {:?}",
        all_alerts(&db.store).await?
    );
    let mut raised = false;
    for round in 5..8 {
        s.run_round(&s.targets()[0], ProbeKind::PromptLogprobs, round)
            .await?;
        if db
            .store
            .alerts(&ALL_ALERTS)
            .await?
            .iter()
            .any(|a| a.kind == "changed" && a.endpoint == "switching/smol")
        {
            raised = true;
            break;
        }
    }
    ensure!(
        raised,
        "no changed alert within 3 rounds of the switch: {:?}",
        all_alerts(&db.store).await?
    );
    detectors.shutdown().await;
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Without a reference, fingerprint probes alone answer changed?: the scheduler (built with
/// no reference backend) charts the endpoint's own echo logprobs against its own first
/// rounds — a new set of inputs (a second text) starts new charts instead of alarming —,
/// raises "changed" on the first round after the provider switches, and never "unfaithful"
/// (nothing is compared with the weights).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_reference_fingerprints_raise_changed_after_a_switch() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    // rounds 0 and 3 are noise pairs (noise_pair_every = 3): 5 rounds of one text (7
    // requests) and 4 of two (12) exact, then switched
    let switching = serve(switching_double(url.clone(), 19), &stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let detectors = detectors("cusum_baseline_rounds = 3\nhistory_runs = 30\n")?;
    let without_reference = |probes: &str| -> Result<Scheduler> {
        scheduler(
            probes_config(probes)?,
            &db,
            None,
            Some(detectors.clone()),
            vec![target(&switching, "switching/smol")],
        )
    };
    let s = without_reference("kinds = [\"fingerprint\"]\n")?;
    let mut inputs = Vec::new();
    for round in 0..5 {
        let runs = stored(&s, 0, ProbeKind::Fingerprint, round).await?;
        let pair = round % 3 == 0;
        ensure!(
            runs.len() == 1 + usize::from(pair) && runs[0].ok && runs[0].kind == "fingerprint",
            "{runs:?}"
        );
        // a noise-floor pair: the same inputs asked twice, the distance of each statistic
        if pair {
            let p = &runs[1].stats["noise_pair"];
            ensure!(
                runs[1].repeat_of == Some(runs[0].id)
                    && p["own_logprob_mean"] == 0.0
                    && p["own_tokens"] == 0.0,
                "{}",
                runs[1].stats
            );
        }
        inputs.push(runs[0].stats["inputs"].clone());
    }
    // the operator sends a second text: new inputs, new charts, no alarm
    let s = without_reference("kinds = [\"fingerprint\"]\nitems_per_round = 2\n")?;
    for round in 0..4 {
        let runs = stored(&s, 0, ProbeKind::Fingerprint, round).await?;
        inputs.push(runs[0].stats["inputs"].clone());
    }
    ensure!(
        inputs[..5].iter().all(|i| *i == inputs[0])
            && inputs[5..].iter().all(|i| *i == inputs[5])
            && inputs[0] != inputs[5]
            && inputs[0].as_str().is_some_and(|i| i.len() == 16),
        "{inputs:?}"
    );
    ensure!(
        all_alerts(&db.store).await?.is_empty(),
        "alert before the switch: {:?}",
        all_alerts(&db.store).await?
    );
    let runs = stored(&s, 0, ProbeKind::Fingerprint, 4).await?;
    // the alarm was first checked against a pair of that round: the same numbers again
    ensure!(
        runs.len() == 2 && runs[1].stats["noise_pair"]["own_logprob_mean"] == 0.0,
        "{runs:?}"
    );
    let alerts = all_alerts(&db.store).await?;
    let changed = alerts
        .iter()
        .find(|a| a.kind == "changed" && a.endpoint == "switching/smol")
        .with_context(|| format!("no changed alert on the first switched round: {alerts:?}"))?;
    ensure!(alerts.len() == 1, "{alerts:?}");
    let alarm = changed.evidence["alarms"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["statistic"] == "own_logprob_mean"))
        .with_context(|| format!("no own_logprob_mean alarm: {}", changed.evidence))?;
    // the double sharpens the distribution: the mean logprob of the text falls by 30%
    let (value, base) = (
        alarm["value"].as_f64().context("value")?,
        alarm["baseline_mean"].as_f64().context("baseline_mean")?,
    );
    ensure!(
        alarm["shift"] == "down" && (value - 1.3 * base).abs() < 1e-4 * base.abs(),
        "{alarm}"
    );
    // the baseline of an endpoint that echoes the same logprobs every round has no spread:
    // its chart assumes fingerprint_min_sd; it is the first 3 runs with the two texts
    ensure!(alarm["baseline_sd"].as_f64() == Some(1e-3), "{alarm}");
    ensure!(alarm["inputs"] == inputs[5], "{alarm}");
    let two_texts: Vec<i64> = db
        .store
        .probe_runs(&ProbeRunQuery {
            model: None,
            endpoint: None,
            kind: None,
            since_ms: None,
            limit: 100,
        })
        .await?
        .iter()
        .filter(|r| r.stats["inputs"] == inputs[5] && r.repeat_of.is_none())
        .map(|r| r.id)
        .rev()
        .take(3)
        .collect();
    ensure!(
        alarm["baseline_runs"] == serde_json::json!(two_texts),
        "{alarm}"
    );
    ensure!(
        changed.summary.contains("(fingerprint)"),
        "{}",
        changed.summary
    );
    // other kinds are refused by a scheduler without a reference, before any request
    let e = s
        .run_round(&s.targets()[0], ProbeKind::PromptLogprobs, 6)
        .await
        .err()
        .context("a prompt_logprobs round ran without a reference")?;
    ensure!(
        e.to_string()
            .contains("the prompt_logprobs probes of models.smol"),
        "{e}"
    );
    detectors.shutdown().await;
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A provider that accepts connections and never answers: every request to it waits out
/// the probes' request timeout.
async fn hung_endpoint(stop: &CancellationToken) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = stop.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                a = listener.accept() => match a {
                    Ok((sock, _)) => held.push(sock),
                    Err(_) => return,
                },
            }
        }
    });
    Ok(format!("http://{addr}"))
}

/// `run_once` over a hung endpoint and a healthy one. With two slots the healthy endpoint's
/// probe runs while the hung one waits (and is stored ok); with one slot (the twin, so the
/// check can fail) the two runs do not overlap. Either way
/// the hung probe ends at the request timeout as a failed run that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_endpoint_stalls_no_other_and_times_out() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let healthy = engine_server(&stop, &tasks).await?;
    let hung = hung_endpoint(&stop).await?;
    let reference = reference()?;
    for slots in [2, 1] {
        let db = TestDb::new(Backend::Sqlite).await?;
        let mut cfg = probes_config("kinds = [\"prompt_logprobs\"]\n")?;
        cfg.concurrency = slots;
        cfg.request_timeout = Duration::from_secs(8);
        let s = scheduler(
            cfg,
            &db,
            Some(Arc::clone(&reference)),
            None,
            vec![target(&hung, "hung/smol"), target(&healthy, "engine/smol")],
        )?;
        // round 1: no noise pair, one run per endpoint
        let results = s.run_once(1).await?;
        let runs: Vec<_> = results
            .into_iter()
            .map(|r| match r {
                RoundResult::Stored(mut runs) if runs.len() == 1 => Ok(runs.remove(0)),
                other => Err(anyhow::anyhow!("expected one stored run, got {other:?}")),
            })
            .collect::<Result<_>>()?;
        let (h, e) = (&runs[0], &runs[1]);
        ensure!(h.endpoint == "hung/smol" && e.endpoint == "engine/smol");
        let err = h.error.as_deref().unwrap_or_default();
        ensure!(
            !h.ok && err.contains("timed out"),
            "hung run: ok {} error {err:?}",
            h.ok
        );
        ensure!(
            h.finished_ms - h.started_ms >= 7_900,
            "the hung probe ended before its timeout: {} ms",
            h.finished_ms - h.started_ms
        );
        ensure!(e.ok, "healthy run failed: {:?}", e.error);
        // which of the two takes the one slot first is up to the store's answers
        let overlapped = e.started_ms < h.finished_ms && h.started_ms < e.finished_ms;
        ensure!(
            overlapped == (slots > 1),
            "{slots} slot(s): healthy ran {}..{}, hung {}..{}",
            e.started_ms,
            e.finished_ms,
            h.started_ms,
            h.finished_ms
        );
    }
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// An endpoint that became noisier since its last noise-floor pair: its next fingerprint run
/// off the baseline is asked again before it can alarm, the pair's distance raises the charts'
/// σ, and nothing is raised; a real shift after that still raises "changed" on its round, and
/// its next rounds, which only refresh the open alert, are not paired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_alarm_is_confirmed_by_a_pair_of_its_round() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    // noise_pair_every = 3: 14 exact requests (rounds 0–9; 0, 3, 6 and 9 are pairs), then ±1%
    // alternating request by request (rounds 10–15), then ×1.5 (round 16)
    let factor = |n: usize| match n {
        0..14 => 1.0,
        14..23 if n.is_multiple_of(2) => 1.01,
        14..23 => 0.99,
        _ => 1.5,
    };
    let noisy = serve(scaling_double(url, factor), &stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let cfg = probes_config("kinds = [\"fingerprint\"]\n")?;
    // an 8-round baseline: h = 14.1 (corrected for the estimated baseline; 294 for 3 rounds)
    let detectors = detectors("cusum_baseline_rounds = 8\nhistory_runs = 40\n")?;
    let s = scheduler(
        cfg,
        &db,
        None,
        Some(detectors.clone()),
        vec![target(&noisy, "noisy/smol")],
    )?;
    let mut sizes = Vec::new();
    let mut first_noisy = None;
    for round in 0..16 {
        let runs = stored(&s, 0, ProbeKind::Fingerprint, round).await?;
        ensure!(runs.iter().all(|r| r.ok), "{runs:?}");
        sizes.push(runs.len());
        if round == 10 {
            first_noisy = Some(runs);
        }
    }
    // the scheduled pairs (every third round) and one confirming pair: the first noisy run,
    // 1% off an exact baseline (35.7 times fingerprint_min_sd), asked again at −1%
    ensure!(
        sizes == [2, 1, 1, 2, 1, 1, 2, 1, 1, 2, 2, 1, 2, 1, 1, 2],
        "runs a round: {sizes:?}; alerts: {:?}",
        all_alerts(&db.store).await?
    );
    let pair = first_noisy.context("round 10")?;
    let (a, b) = (
        stat_of(&pair[0], "own_logprob_mean")?,
        stat_of(&pair[1], "own_logprob_mean")?,
    );
    let distance = pair[1].stats["noise_pair"]["own_logprob_mean"]
        .as_f64()
        .context("no pair distance")?;
    ensure!(
        pair[1].repeat_of == Some(pair[0].id) && (distance - (a - b).abs()).abs() < 1e-12,
        "{:?}",
        pair[1].stats
    );
    ensure!(distance > 0.01, "distance {distance}");
    let alerts = all_alerts(&db.store).await?;
    ensure!(alerts.is_empty(), "a noisier endpoint flagged: {alerts:?}");

    // a lasting ×1.5 (25 times the pairs' distance): confirmed by its pair (distance 0),
    // raised on its round
    let runs = stored(&s, 0, ProbeKind::Fingerprint, 16).await?;
    ensure!(runs.len() == 2, "{runs:?}");
    let alerts = all_alerts(&db.store).await?;
    ensure!(
        alerts.len() == 1 && alerts[0].kind == "changed",
        "{alerts:?}"
    );
    // the shift lasts: the next round's alarm only refreshes the open alert, unpaired
    let runs = stored(&s, 0, ProbeKind::Fingerprint, 17).await?;
    ensure!(runs.len() == 1, "{runs:?}");
    let alerts = all_alerts(&db.store).await?;
    ensure!(
        alerts.len() == 1 && alerts[0].last_seen_ms > alerts[0].opened_ms,
        "{alerts:?}"
    );
    detectors.shutdown().await;
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

fn stat_of(run: &samewise_store::ProbeRun, key: &str) -> Result<f64> {
    run.stats[key]
        .as_f64()
        .with_context(|| format!("no {key}: {}", run.stats))
}

/// A nondeterministic but faithful endpoint (logit noise of 0.3 nats on its echo, KL to the
/// reference about 0.015 a run, over the 0.005 threshold) is judged on its first round after
/// that round's noise-floor pair, which measures about twice its KL, and is not flagged; its
/// next rounds, under the floor, are not paired again. A `w4` endpoint, exact between two
/// requests, is flagged on its first round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_faithful_endpoint_is_judged_after_its_pair() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let noisy_profile = samewise_engine::Profile::from_toml("[api]\necho_jitter = 0.3\n", "t")?;
    let noisy = profiled_server(engine()?, noisy_profile, &stop, &tasks).await?;
    let w4_profile = samewise_engine::Profile::builtin("w4").context("w4")?;
    let w4_engine = Arc::new(samewise_engine::Engine::load(
        &model_path()?,
        samewise_engine::LoadOptions {
            threads: 2,
            profile: w4_profile.clone(),
            ..samewise_engine::LoadOptions::default()
        },
    )?);
    let w4 = profiled_server(w4_engine, w4_profile, &stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let cfg = probes_config("kinds = [\"prompt_logprobs\"]\n")?;
    let detectors = detectors("kl_threshold = 0.005\n")?;
    let s = scheduler(
        cfg,
        &db,
        Some(reference()?),
        Some(detectors.clone()),
        vec![target(&noisy, "noisy/smol"), target(&w4, "w4/smol")],
    )?;
    let mut sizes = Vec::new();
    for round in 0..3 {
        let runs = stored(&s, 0, ProbeKind::PromptLogprobs, round).await?;
        ensure!(runs.iter().all(|r| r.ok), "{runs:?}");
        let kl = runs[0].stats["kl_mean"].as_f64().context("kl_mean")?;
        ensure!(kl > 0.005, "round {round}: KL {kl} is under the threshold");
        sizes.push(runs.len());
    }
    ensure!(sizes == [2, 1, 1], "runs a round: {sizes:?}");
    let alerts = all_alerts(&db.store).await?;
    ensure!(
        alerts.is_empty(),
        "a faithful noisy endpoint flagged: {alerts:?}"
    );
    s.run_round(&s.targets()[1], ProbeKind::PromptLogprobs, 0)
        .await?;
    let alerts = all_alerts(&db.store).await?;
    ensure!(
        alerts.len() == 1 && alerts[0].kind == "unfaithful" && alerts[0].endpoint == "w4/smol",
        "{alerts:?}"
    );
    detectors.shutdown().await;
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// The runs `s` stored in `round` of `kind` on its `i`-th target (an error when it was over
/// budget).
pub(crate) async fn stored(
    s: &Scheduler,
    i: usize,
    kind: ProbeKind,
    round: u64,
) -> Result<Vec<samewise_store::ProbeRun>> {
    match s.run_round(&s.targets()[i], kind, round).await? {
        RoundResult::Stored(runs) => Ok(runs),
        other => anyhow::bail!("round {round} of {kind:?} stored nothing: {other:?}"),
    }
}
