//! changed? over a real store (SQLite file and PostgreSQL): the CUSUM raises "changed"
//! after a switch, keeps it while the endpoint stays changed, starts over after an operator's
//! resolution (not after an auto-resolution), and keeps the endpoint's first runs as its
//! baseline for good.

use anyhow::{Context, Result, ensure};
use samewise_probes::detect::DetectorConfig;
use samewise_store::Backend;
use samewise_store::testing::TestDb;

use crate::detectors::{detectors, logprob_run, store_run};

/// The default detectors with an 8-round CUSUM baseline.
fn eight_round_baseline() -> DetectorConfig {
    DetectorConfig {
        cusum: samewise_probes::sequential::CusumConfig {
            baseline_rounds: 8,
            ..DetectorConfig::default().cusum
        },
        ..DetectorConfig::default()
    }
}

/// A wobbling but stable statistic: 8 rounds that never alarm.
const WOBBLE: [f64; 8] = [0.010, 0.012, 0.009, 0.011, 0.013, 0.010, 0.008, 0.012];

#[tokio::test]
async fn cusum_raises_changed_after_a_switch_on_postgres_and_sqlite() -> Result<()> {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await?;
        let cfg = eight_round_baseline();
        // no ladder: only changed? runs
        let d = detectors(cfg, None)?;
        // in control: a wobbling but stable statistic, 40 rounds, never alarms
        for i in 0..40 {
            let r = store_run(
                &db.store,
                &logprob_run("p/a", i * 1000, WOBBLE[i as usize % 8], 0.98),
            )
            .await?;
            let alerts = d.after_run(&db.store, &r).await?;
            ensure!(
                alerts.is_empty(),
                "{backend}: false alarm in control at round {i}: {alerts:?}"
            );
        }
        // the endpoint switches to a degraded model: alarm within 3 rounds
        let mut raised = None;
        for i in 40..43 {
            let r = store_run(&db.store, &logprob_run("p/a", i * 1000, 0.1, 0.9)).await?;
            if let Some(a) = d
                .after_run(&db.store, &r)
                .await?
                .into_iter()
                .find(|a| a.kind == "changed")
            {
                raised = Some((i, a));
                break;
            }
        }
        let (round, alert) = raised.context("no changed alert within 3 rounds of the switch")?;
        ensure!(
            alert.summary.contains("kl_mean rose to 0.100"),
            "{}",
            alert.summary
        );
        let alarms = alert.evidence["alarms"].as_array().context("alarms")?;
        ensure!(
            alarms
                .iter()
                .any(|a| a["statistic"] == "top1_same" && a["shift"] == "down")
                || round == 40
        );
        ensure!(alarms[0]["baseline_runs"].as_array().map(Vec::len) == Some(8));
        // still changed: the alert stays (refreshed)
        let r = store_run(&db.store, &logprob_run("p/a", 50_000, 0.1, 0.9)).await?;
        let later = d.after_run(&db.store, &r).await?;
        ensure!(later.iter().all(|a| a.id == alert.id), "{later:?}");
        // the operator resolves it: the new behaviour becomes the baseline, no re-alert
        db.store.resolve_alert(alert.id).await?;
        // runs after the resolution carry real clock times, as the scheduler's do
        let t0 = samewise_store::now_ms() + 1;
        for i in 0..20 {
            let x = [0.10, 0.104, 0.097, 0.101][i % 4];
            let r = store_run(&db.store, &logprob_run("p/a", t0 + i as i64 * 1000, x, 0.9)).await?;
            let alerts = d.after_run(&db.store, &r).await?;
            ensure!(
                alerts.is_empty(),
                "{backend}: re-alerted after the change was accepted (round {i}): {alerts:?}"
            );
        }
        // and a change away from the new baseline is caught again
        let r = store_run(&db.store, &logprob_run("p/a", t0 + 30_000, 0.5, 0.6)).await?;
        let again = d.after_run(&db.store, &r).await?;
        ensure!(
            again
                .iter()
                .any(|a| a.kind == "changed" && a.id != alert.id),
            "{again:?}"
        );
    }
    Ok(())
}

/// The changed? chart's baseline is the endpoint's first runs for good: a shift that lasts
/// longer than the `history_runs` window keeps alarming against it (a sliding baseline would
/// have absorbed it), the baseline outlives the deletion of its runs, and an endpoint whose
/// runs were stored before any baseline was gets its first runs as the baseline, not the
/// oldest of the window.
#[tokio::test]
async fn changed_keeps_the_first_runs_as_its_baseline_on_postgres_and_sqlite() -> Result<()> {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await?;
        let cfg = DetectorConfig {
            history_runs: 20,
            ..eight_round_baseline()
        };
        let d = detectors(cfg, None)?;
        let mut first = Vec::new();
        for (i, &x) in WOBBLE.iter().enumerate() {
            let r = store_run(&db.store, &logprob_run("p/a", i as i64 * 1000, x, 0.98)).await?;
            ensure!(d.after_run(&db.store, &r).await?.is_empty());
            first.push(r.id);
        }
        let stored = db
            .store
            .probe_baselines("smol", "p/a", "prompt_logprobs")
            .await?;
        let kl = stored
            .iter()
            .find(|b| b.statistic == "kl_mean")
            .context("no kl_mean baseline stored")?;
        ensure!(kl.after_ms.is_none() && kl.runs.iter().map(|r| r.id).eq(first.iter().copied()));
        ensure!(kl.runs.iter().map(|r| r.value).eq(WOBBLE.iter().copied()));
        // 40 shifted rounds, twice the window: every one still alarms against the first runs
        let check = |alerts: Vec<samewise_store::Alert>, round: i64| -> Result<()> {
            let alert = alerts
                .iter()
                .find(|a| a.kind == "changed")
                .with_context(|| format!("{backend}: round {round} did not alarm"))?;
            let kl = alert.evidence["alarms"]
                .as_array()
                .context("alarms")?
                .iter()
                .find(|a| a["statistic"] == "kl_mean")
                .context("no kl_mean alarm")?;
            let base: Vec<i64> = kl["baseline_runs"]
                .as_array()
                .context("baseline_runs")?
                .iter()
                .filter_map(serde_json::Value::as_i64)
                .collect();
            ensure!(base == first, "{backend}: round {round}: baseline {base:?}");
            let mean = kl["baseline_mean"].as_f64().context("baseline_mean")?;
            ensure!((mean - 0.010_625).abs() < 1e-9, "{mean}");
            Ok(())
        };
        for i in 8..48 {
            let r = store_run(&db.store, &logprob_run("p/a", i * 1000, 0.1, 0.9)).await?;
            check(d.after_run(&db.store, &r).await?, i)?;
        }
        // retention takes the baseline's runs; the baseline stays
        let gone = db.store.delete_probe_runs_step(8 * 1000, 100).await?;
        ensure!(gone == 8, "{gone}");
        let r = store_run(&db.store, &logprob_run("p/a", 48_000, 0.1, 0.9)).await?;
        check(d.after_run(&db.store, &r).await?, 48)?;

        // runs stored before any baseline was (an upgraded store): 8 calm, 30 shifted; the
        // detector's first look reads the endpoint's first runs, beyond its 20-run window
        let mut calm = Vec::new();
        for i in 0..38 {
            let x = if i < 8 { WOBBLE[i as usize] } else { 0.1 };
            let r = store_run(&db.store, &logprob_run("p/b", 100_000 + i * 1000, x, 0.9)).await?;
            if i < 8 {
                calm.push(r.id);
            }
        }
        let r = store_run(&db.store, &logprob_run("p/b", 140_000, 0.1, 0.9)).await?;
        let alerts = d.after_run(&db.store, &r).await?;
        let alert = alerts
            .iter()
            .find(|a| a.kind == "changed" && a.endpoint == "p/b")
            .with_context(|| format!("{backend}: p/b not changed: {alerts:?}"))?;
        ensure!(
            alert.evidence["alarms"][0]["baseline_runs"] == serde_json::json!(calm),
            "{}",
            alert.evidence
        );
    }
    Ok(())
}

/// Only an operator's resolution accepts a change: a "changed" alert auto-resolved after its
/// quiet period leaves the baseline where it was, so the endpoint, still shifted, is raised
/// again (a new alert, against the same first runs) instead of its shifted runs becoming the
/// new baseline. Then the operator resolves it, and the shifted runs are the baseline.
#[tokio::test]
async fn an_auto_resolved_change_is_not_accepted_on_postgres_and_sqlite() -> Result<()> {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await?;
        let d = detectors(eight_round_baseline(), None)?;
        let mut first = Vec::new();
        for (i, &x) in WOBBLE.iter().enumerate() {
            let r = store_run(&db.store, &logprob_run("p/a", i as i64 * 1000, x, 0.98)).await?;
            ensure!(d.after_run(&db.store, &r).await?.is_empty());
            first.push(r.id);
        }
        let changed =
            |alerts: Vec<samewise_store::Alert>| alerts.into_iter().find(|a| a.kind == "changed");
        let r = store_run(&db.store, &logprob_run("p/a", 8_000, 0.1, 0.9)).await?;
        let alert = changed(d.after_run(&db.store, &r).await?)
            .with_context(|| format!("{backend}: the shift did not alarm"))?;
        // nothing confirms it for longer than the quiet period: auto-resolved
        let quiet = d
            .alerting()
            .auto_resolve(&db.store, samewise_store::now_ms())
            .await?;
        ensure!(quiet.iter().any(|a| a.id == alert.id), "{quiet:?}");
        // still shifted: the next round alarms again, against the first runs
        let t0 = samewise_store::now_ms() + 1;
        let r = store_run(&db.store, &logprob_run("p/a", t0, 0.1, 0.9)).await?;
        let again = changed(d.after_run(&db.store, &r).await?).with_context(|| {
            format!("{backend}: the auto-resolution accepted the shift as the baseline")
        })?;
        ensure!(again.id != alert.id);
        let base = &again.evidence["alarms"][0]["baseline_runs"];
        ensure!(
            *base == serde_json::json!(first),
            "{backend}: baseline {base}"
        );
        // the operator resolves it: the shifted runs after that are the new baseline
        d.alerting().resolve(&db.store, again.id).await?;
        let t1 = samewise_store::now_ms() + 1;
        for i in 0..12 {
            let x = [0.10, 0.104, 0.097, 0.101][i % 4];
            let r = store_run(&db.store, &logprob_run("p/a", t1 + i as i64 * 1000, x, 0.9)).await?;
            let alerts = d.after_run(&db.store, &r).await?;
            ensure!(
                alerts.is_empty(),
                "{backend}: re-alerted after the operator accepted (round {i}): {alerts:?}"
            );
        }
    }
    Ok(())
}

/// A lasting shift keeps one "changed" alert open: between the chart's alarms every run on
/// which it is still out of control confirms the alert, so its quiet period (an hour, six
/// 10-minute rounds here) never resolves it and no second alert opens; once the endpoint
/// comes back, the alert goes quiet and is auto-resolved, soon even after a large shift.
#[tokio::test]
async fn a_lasting_shift_keeps_one_changed_alert_open_on_postgres_and_sqlite() -> Result<()> {
    const ROUND_MS: i64 = 600_000;
    let cfg = eight_round_baseline();
    let h = samewise_probes::detect::changed_chart_config(&cfg, cfg.cusum.min_sd)?.h;
    // every shifted round is z = 1.5 over the baseline: the restarted sums gain 0.5 a round,
    // so the chart alarms every `gap` rounds, longer than the quiet period
    let gap = (h / 0.5).ceil() as i64;
    ensure!(gap > 7, "h {h}: alarms every {gap} rounds");
    let mean = WOBBLE.iter().sum::<f64>() / 8.0;
    let sd = (WOBBLE.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 7.0).sqrt();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend).await?;
        let d = detectors(cfg.clone(), None)?;
        let mut t = 0;
        let mut round = |kl: f64| {
            t += ROUND_MS;
            logprob_run("p/a", t, kl, 0.98)
        };
        for &x in &WOBBLE {
            let r = store_run(&db.store, &round(x)).await?;
            ensure!(d.after_run(&db.store, &r).await?.is_empty());
        }
        let (mut opened, mut held, mut alarmed, mut first) = (Vec::new(), 0, 0, None);
        let mut last_alarm = None;
        for i in 0..3 * gap {
            let r = store_run(&db.store, &round(mean + 1.5 * sd)).await?;
            for a in d.after_run(&db.store, &r).await? {
                if a.kind != "changed" {
                    continue;
                }
                if !opened.contains(&a.id) {
                    opened.push(a.id);
                }
                first.get_or_insert(i);
                if a.evidence["held"] == true {
                    ensure!(a.summary.contains("still changed"), "{}", a.summary);
                    ensure!(a.evidence["alarms"][0]["cusum"].is_null(), "{}", a.evidence);
                    // the alarm that last raised it stays beside the held chart
                    let kept = &a.evidence["last_alarm"];
                    ensure!(
                        kept["held"] == false
                            && kept["alarms"][0]["cusum"].as_f64().is_some_and(|c| c > h)
                            && kept["probe_runs"][0].as_i64() == last_alarm
                            && kept["at_ms"].as_i64().is_some_and(|t| t < r.finished_ms),
                        "{backend}: round {i}: last alarm run {last_alarm:?}, held evidence {}",
                        a.evidence
                    );
                    held += 1;
                } else {
                    ensure!(a.evidence.get("last_alarm").is_none(), "{}", a.evidence);
                    last_alarm = Some(r.id);
                    alarmed += 1;
                }
            }
            let quiet = d.alerting().auto_resolve(&db.store, r.finished_ms).await?;
            ensure!(
                quiet.is_empty(),
                "{backend}: round {i}: auto-resolved while still shifted: {quiet:?}"
            );
        }
        // one alert, confirmed on every round from its opening: by the alarms, and by the
        // held chart on the rounds between them
        let first = first.with_context(|| format!("{backend}: the shift never alarmed"))?;
        ensure!(
            opened.len() == 1 && alarmed >= 2 && alarmed + held == 3 * gap - first,
            "{backend}: alerts {opened:?}, {alarmed} alarms and {held} held rounds from round \
             {first} (gap {gap})"
        );
        // back to the baseline's behaviour: the held sums fall, the alert goes quiet
        let mut resolved = None;
        for i in 0..40 {
            let r = store_run(&db.store, &round(WOBBLE[i % 8])).await?;
            d.after_run(&db.store, &r).await?;
            let quiet = d.alerting().auto_resolve(&db.store, r.finished_ms).await?;
            if let Some(a) = quiet.into_iter().find(|a| a.id == opened[0]) {
                resolved = Some(a);
                break;
            }
        }
        let a = resolved.with_context(|| format!("{backend}: never auto-resolved"))?;
        ensure!(a.resolved_by == Some(samewise_store::Resolver::Quiet));

        // a large shift (z ≈ 53 a round for 30 rounds) that is then rolled back: the sums kept
        // without restarts are capped at 2h, so the alert goes quiet about h/k rounds after
        // the return, not after the thousands of rounds the uncapped sum would need
        let mut t = 0;
        let mut round = |kl: f64| {
            t += ROUND_MS;
            logprob_run("p/b", t, kl, 0.98)
        };
        for &x in &WOBBLE {
            let r = store_run(&db.store, &round(x)).await?;
            ensure!(d.after_run(&db.store, &r).await?.is_empty());
        }
        for _ in 0..30 {
            let r = store_run(&db.store, &round(0.1)).await?;
            d.after_run(&db.store, &r).await?;
        }
        let mut back = None;
        for i in 0..3 * gap {
            let r = store_run(&db.store, &round(WOBBLE[i as usize % 8])).await?;
            d.after_run(&db.store, &r).await?;
            let quiet = d.alerting().auto_resolve(&db.store, r.finished_ms).await?;
            if quiet
                .iter()
                .any(|a| a.endpoint == "p/b" && a.kind == "changed")
            {
                back = Some(i);
                break;
            }
        }
        let back = back.with_context(|| format!("{backend}: the rolled-back shift stayed open"))?;
        ensure!(
            back <= 2 * gap,
            "{backend}: resolved {back} rounds after the return"
        );
    }
    Ok(())
}

/// A fingerprint chart's σ is raised by the endpoint's own repeat noise: an endpoint whose
/// baseline rounds echoed the same numbers (σ 0, so the 1e-3 floor) and that later sits 0.004
/// off them (within its noise) alarms without noise-floor pairs, and not once its pairs
/// measured that it varies by 0.01 between identical requests; a real shift (0.1) still
/// alarms, within 3 rounds.
#[tokio::test]
async fn fingerprint_repeat_noise_raises_the_charts_floor() -> Result<()> {
    let fingerprint = |endpoint: &str, t: i64, mean: f64| samewise_store::ProbeRun {
        kind: "fingerprint".to_owned(),
        stats: serde_json::json!({"mode": "echo", "inputs": "00112233aabbccdd", "own_logprob_mean": mean, "own_tokens": 300}),
        ..logprob_run(endpoint, t, 0.0, 1.0)
    };
    let mut raised = Vec::new();
    for with_pairs in [false, true] {
        let db = TestDb::new(Backend::Sqlite).await?;
        let d = detectors(eight_round_baseline(), None)?;
        let mut t = 0;
        let mut round = |mean: f64| {
            t += 1_000;
            fingerprint("p/f", t, mean)
        };
        for _ in 0..8 {
            let r = store_run(&db.store, &round(-2.0)).await?;
            ensure!(d.after_run(&db.store, &r).await?.is_empty());
        }
        let mut alarms = 0;
        for i in 0..12 {
            let r = store_run(&db.store, &round(-1.996)).await?;
            if i % 4 == 0 && with_pairs {
                // the repeat of a noise-floor pair, 0.01 off the run it repeats
                let mut repeat = round(-2.0);
                repeat.repeat_of = Some(r.id);
                repeat.stats["noise_pair"] =
                    serde_json::json!({"own_logprob_mean": 0.01, "own_tokens": 0.0});
                store_run(&db.store, &repeat).await?;
            }
            alarms += d
                .after_run(&db.store, &r)
                .await?
                .iter()
                .filter(|a| a.kind == "changed")
                .count();
        }
        let mut shift = false;
        for _ in 0..3 {
            let shifted = store_run(&db.store, &round(-2.1)).await?;
            let found = d.after_run(&db.store, &shifted).await?;
            shift |= found
                .iter()
                .any(|a| a.kind == "changed" && a.evidence["alarms"][0]["shift"] == "down");
        }
        ensure!(shift, "with_pairs {with_pairs}: a 0.1 shift did not alarm");
        raised.push(alarms);
    }
    ensure!(
        raised[0] > 0 && raised[1] == 0,
        "alarms while wobbling, without and with pairs: {raised:?}"
    );
    Ok(())
}
