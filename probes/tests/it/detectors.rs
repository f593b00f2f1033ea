//! The detectors over a real store (SQLite file, and PostgreSQL where noted): faithful?
//! against a TEST-ONLY hand-written ladder with the noise floor (changed? is `changed.rs`),
//! the passive cross-endpoint tests over request records, auto-resolve, and
//! the detectors' configuration.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_probes::AlertsConfig;
use samewise_probes::compare::{PositionInput, Side, TopEntry, encode_positions};
use samewise_probes::detect::{DetectorConfig, Detectors};
use samewise_probes::ladder::Ladder;
use samewise_store::testing::TestDb;
use samewise_store::{AlertState, Backend, ProbeRun, RequestRecord, Store};

/// TEST ONLY: a hand-written ladder (not measured), until `samewise calibrate` commits the
/// test model's. w6 is at kl_topk_mean 0.012, w4 at 0.1, w3 at 0.4.
pub(crate) fn test_only_ladder() -> Result<Ladder> {
    let text = include_str!("../fixtures/TEST_ONLY_handwritten_ladder.json");
    Ok(Ladder::from_json(text)?)
}

pub(crate) fn detectors(cfg: DetectorConfig, ladder: Option<Ladder>) -> Result<Detectors> {
    Ok(Detectors::new(cfg, ladder, &AlertsConfig::default())?)
}

pub(crate) fn logprob_run(endpoint: &str, t: i64, kl: f64, top1: f64) -> ProbeRun {
    ProbeRun {
        id: 0,
        model: "smol".to_owned(),
        endpoint: endpoint.to_owned(),
        kind: "prompt_logprobs".to_owned(),
        started_ms: t,
        finished_ms: t + 100,
        ok: true,
        error: None,
        tokens: 600,
        stats: serde_json::json!({"kl_mean": kl, "kl_p99": kl * 5.0, "dlogprob_mean": kl, "top1_same": top1, "topk_overlap": top1, "positions": 512}),
        raw: None,
        repeat_of: None,
    }
}

pub(crate) async fn store_run(store: &Store, run: &ProbeRun) -> Result<ProbeRun> {
    let id = store.insert_probe_run(run).await?;
    Ok(ProbeRun { id, ..run.clone() })
}

#[tokio::test]
async fn faithful_flags_past_six_bit_in_bits() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), Some(test_only_ladder()?))?;
    // within 6-bit: no alert
    let good = store_run(&db.store, &logprob_run("p/good", 1_000, 0.008, 0.99)).await?;
    ensure!(d.after_run(&db.store, &good).await?.is_empty());
    // between 4 and 3 bits
    let bad = store_run(&db.store, &logprob_run("p/bad", 1_000, 0.25, 0.8)).await?;
    let alerts = d.after_run(&db.store, &bad).await?;
    ensure!(alerts.len() == 1, "{alerts:?}");
    let a = &alerts[0];
    ensure!(a.kind == "unfaithful" && a.endpoint == "p/bad" && a.state == AlertState::Open);
    ensure!(
        a.summary.starts_with("endpoint p/bad behaves like ≈3.")
            && a.summary
                .contains("-bit weights: mean KL 0.250 > 0.012 (6-bit)"),
        "summary: {}",
        a.summary
    );
    let e = &a.evidence;
    ensure!(e["statistic"] == "kl_mean" && e["value"] == 0.25 && e["threshold"] == 0.012);
    ensure!(e["probe_runs"] == serde_json::json!([bad.id]) && e["level"] == "w6");
    let bits = e["equivalent"]["bits"].as_f64().context("bits")?;
    ensure!(bits > 3.0 && bits < 4.0, "bits {bits}");
    // worse than the worst level
    let awful = store_run(&db.store, &logprob_run("p/awful", 1_000, 3.0, 0.2)).await?;
    let alerts = d.after_run(&db.store, &awful).await?;
    ensure!(
        alerts[0].summary.contains("worse than 2-bit weights"),
        "{}",
        alerts[0].summary
    );
    // the same finding again refreshes, not duplicates
    let bad2 = store_run(&db.store, &logprob_run("p/bad", 2_000, 0.3, 0.8)).await?;
    let again = d.after_run(&db.store, &bad2).await?;
    ensure!(
        again.len() == 1
            && again[0].id == a.id
            && again[0].evidence["probe_runs"] == serde_json::json!([bad2.id])
    );
    // a run that could not run is no evidence
    let mut failed = logprob_run("p/down", 1_000, 9.0, 0.0);
    failed.ok = false;
    let failed = store_run(&db.store, &failed).await?;
    ensure!(d.after_run(&db.store, &failed).await?.is_empty());
    ensure!(db.store.active_alerts().await?.len() == 2);
    Ok(())
}

/// Positions where the endpoint's logprobs are the reference's plus `noise` (alternating
/// sign by position and `phase`), for noise-floor pairs.
fn positions(n: usize, noise: f64, phase: usize) -> Vec<PositionInput> {
    (0..n)
        .map(|i| {
            let sign = if (i + phase).is_multiple_of(2) {
                1.0
            } else {
                -1.0
            };
            let reference = [-0.5f64, -1.5, -2.5, -3.5];
            let ep: Vec<f64> = reference
                .iter()
                .enumerate()
                .map(|(j, lp)| lp + sign * noise * (j as f64 - 1.5))
                .collect();
            let norm = ep.iter().map(|v| v.exp()).sum::<f64>().ln().max(0.0);
            let side = |lps: &[f64]| Side {
                actual_logprob: lps[0],
                top: lps
                    .iter()
                    .enumerate()
                    .map(|(j, lp)| TopEntry {
                        id: j as u32,
                        logprob: *lp,
                    })
                    .collect(),
            };
            let ep: Vec<f64> = ep.iter().map(|v| v - norm).collect();
            PositionInput {
                actual_id: 0,
                reference: side(&reference),
                endpoint: side(&ep),
            }
        })
        .collect()
}

#[tokio::test]
async fn noise_floor_keeps_a_noisy_faithful_endpoint_unflagged() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), Some(test_only_ladder()?))?;
    // the pair as an older store holds it (both runs' raw data), and as the scheduler stores
    // it now, with the pair's statistics on the repeat (`stats.noise_pair`) and, once
    // retention has cleared it, no raw data: the same floor either way
    let mut floors = Vec::new();
    for (i, pair_stats) in [false, true].into_iter().enumerate() {
        let endpoint = if pair_stats {
            "p/noisy-stats"
        } else {
            "p/noisy-raw"
        };
        let t = i as i64 * 10_000;
        // a noisy endpoint: its two repeats differ from each other a lot
        let (raw_a, raw_b) = (
            encode_positions(&positions(64, 0.1, 0))?,
            encode_positions(&positions(64, 0.1, 1))?,
        );
        let mut first = logprob_run(endpoint, t + 1_000, 0.02, 0.97);
        first.raw = Some(raw_a.clone());
        let first = store_run(&db.store, &first).await?;
        // before the floor is known, 0.02 (> 6-bit's 0.012) is flagged
        let alerts = d.after_run(&db.store, &first).await?;
        ensure!(alerts.len() == 1, "no alert without a floor");
        db.store.resolve_alert(alerts[0].id).await?;
        let mut second = logprob_run(endpoint, t + 2_000, 0.02, 0.97);
        second.raw = Some(raw_b.clone());
        second.repeat_of = Some(first.id);
        if pair_stats {
            second.stats["noise_pair"] = samewise_probes::detect::noise_pair_stats(&raw_a, &raw_b)?;
        }
        let second = store_run(&db.store, &second).await?;
        let alerts = d.after_run(&db.store, &second).await?;
        ensure!(
            alerts.is_empty(),
            "{endpoint}: flagged despite its noise floor: {alerts:?}"
        );
        if pair_stats {
            let cleared = db.store.clear_probe_raw_step(i64::MAX, 100).await?;
            ensure!(cleared >= 2, "{cleared}");
        }
        // the floor raises the bar, but a systematic drift far above it is still flagged
        let drifted = store_run(&db.store, &logprob_run(endpoint, t + 3_000, 5.0, 0.3)).await?;
        let alerts = d.after_run(&db.store, &drifted).await?;
        let e = &alerts
            .iter()
            .find(|a| a.kind == "unfaithful")
            .with_context(|| format!("{endpoint}: {alerts:?}"))?
            .evidence;
        let floor = e["noise_floor"].as_f64().context("floor recorded")?;
        ensure!(
            floor > 0.0 && e["threshold"].as_f64() == Some(3.0 * floor).map(|t| t.max(0.012)),
            "{e}"
        );
        floors.push(floor);
    }
    ensure!(floors[0] == floors[1], "{floors:?}");
    // a pair the scheduler found not to line up (`noise_pair: null`) measures no floor, even
    // with both runs' raw data at hand: the first run of a 0.02 KL is flagged again
    let mut first = logprob_run("p/unaligned", 30_000, 0.02, 0.97);
    first.raw = Some(encode_positions(&positions(64, 0.1, 0))?);
    let first = store_run(&db.store, &first).await?;
    let mut second = logprob_run("p/unaligned", 31_000, 0.02, 0.97);
    second.raw = Some(encode_positions(&positions(64, 0.1, 1))?);
    second.repeat_of = Some(first.id);
    second.stats["noise_pair"] = serde_json::Value::Null;
    let second = store_run(&db.store, &second).await?;
    let alerts = d.after_run(&db.store, &second).await?;
    let e = &alerts
        .iter()
        .find(|a| a.kind == "unfaithful")
        .with_context(|| format!("p/unaligned not flagged: {alerts:?}"))?
        .evidence;
    ensure!(e["noise_floor"].is_null(), "{e}");
    Ok(())
}

fn record(
    model: &str,
    endpoint: &str,
    i: usize,
    tool_errored: bool,
    chars: i64,
    finish: &str,
) -> RequestRecord {
    RequestRecord {
        request_id: format!("{endpoint}-{i}"),
        attempt: 1,
        final_attempt: true,
        ts_ms: 1_000_000 + i as i64,
        model: model.to_owned(),
        endpoint: Some(endpoint.to_owned()),
        route: "chat".to_owned(),
        status: Some(200),
        attempts: 1,
        latency_ms: 10.0,
        finish_reason: Some(finish.to_owned()),
        output_chars: chars,
        tool_calls: 1,
        tool_errored,
        ..RequestRecord::default()
    }
}

#[tokio::test]
async fn passive_flags_tool_call_corruption_and_length_shift() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), None)?;
    let mut rows = Vec::new();
    for i in 0..300 {
        // three endpoints of "smol": b corrupts 10% of its tool calls; c answers 3x longer
        rows.push(record(
            "smol",
            "p/a",
            i,
            false,
            100 + (i % 17) as i64,
            "tool_calls",
        ));
        rows.push(record(
            "smol",
            "p/b",
            i,
            i % 10 == 3,
            100 + ((i + 5) % 17) as i64,
            "tool_calls",
        ));
        rows.push(record(
            "smol",
            "p/c",
            i,
            false,
            300 + (i % 11) as i64,
            "tool_calls",
        ));
        // another model with one endpoint: nothing to compare with
        rows.push(record("other", "q/x", i, true, 5, "stop"));
    }
    db.store.insert_request_records(&rows).await?;
    let alerts = d.sweep(&db.store, 1_000_500).await?;
    let on = |ep: &str| alerts.iter().find(|a| a.endpoint == ep);
    let b = on("p/b").context("tool-call corruption not flagged")?;
    ensure!(
        b.kind == "passive" && b.summary.contains("tool-call error rate 10.0% vs 0.0%"),
        "{}",
        b.summary
    );
    let c = on("p/c").context("length shift not flagged")?;
    ensure!(c.summary.contains("median output"), "{}", c.summary);
    ensure!(on("p/a").is_none() && on("q/x").is_none(), "{alerts:?}");
    let tests = b.evidence["tests"].as_array().context("tests")?;
    ensure!(
        tests.iter().any(|t| t["signal"] == "tool_error_rate"
            && t["p_adjusted"].as_f64().is_some_and(|p| p <= 0.01))
    );
    // records outside the window are not looked at
    let later = d.sweep(&db.store, 1_000_500 + 2 * 3_600_000).await?;
    ensure!(
        later.iter().all(|a| a.state == AlertState::Resolved),
        "{later:?}"
    );
    Ok(())
}

#[tokio::test]
async fn two_endpoints_only_the_worse_one_is_flagged() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), None)?;
    let mut rows = Vec::new();
    for i in 0..400 {
        rows.push(record("smol", "p/a", i, false, 100, "tool_calls"));
        rows.push(record("smol", "p/b", i, i % 10 == 0, 100, "tool_calls"));
    }
    db.store.insert_request_records(&rows).await?;
    let alerts = d.sweep(&db.store, 1_000_500).await?;
    ensure!(
        alerts.len() == 1 && alerts[0].endpoint == "p/b",
        "{alerts:?}"
    );
    Ok(())
}

/// A failed record of `endpoint`: `status` and `kind` as the gateway stores them.
fn failed(model: &str, endpoint: &str, i: usize, status: Option<u16>, kind: &str) -> RequestRecord {
    RequestRecord {
        status,
        error_kind: Some(kind.to_owned()),
        finish_reason: None,
        tool_calls: 0,
        ..record(model, endpoint, i, false, 0, "stop")
    }
}

#[tokio::test]
async fn passive_does_not_blame_endpoints_for_their_clients() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), None)?;
    let mut rows = Vec::new();
    for i in 0..400 {
        rows.push(record("smol", "p/a", i, false, 100, "stop"));
        // b serves a bad client (cache affinity): 40% of its records are the client's doing —
        // the client went away, sent requests the endpoint refused, or was rate limited (and
        // one in ten lost a hedge)
        rows.push(match i % 10 {
            0 => failed("smol", "p/b", i, Some(200), "client_disconnect"),
            1 => failed(
                "smol",
                "p/b",
                i,
                Some([400, 404, 413, 422][i % 4]),
                "upstream_4xx",
            ),
            2 => failed("smol", "p/b", i, Some(429), "rate_limited"),
            // the gateway cancelled b's attempt because a hedge elsewhere answered first
            3 => failed("smol", "p/b", i, None, "hedge_lost"),
            _ => record("smol", "p/b", i, false, 100, "stop"),
        });
        // control: failures that are the endpoint's (5xx, its key refused) are still counted
        rows.push(record("other", "q/x", i, false, 100, "stop"));
        rows.push(match i % 10 {
            0 => failed("other", "q/y", i, Some(503), "upstream_5xx"),
            1 => failed("other", "q/y", i, Some(401), "upstream_4xx"),
            _ => record("other", "q/y", i, false, 100, "stop"),
        });
    }
    db.store.insert_request_records(&rows).await?;
    let alerts = d.sweep(&db.store, 1_000_500).await?;
    ensure!(
        alerts.iter().all(|a| a.endpoint != "p/b"),
        "an endpoint was flagged for its client: {alerts:?}"
    );
    let y = alerts
        .iter()
        .find(|a| a.endpoint == "q/y")
        .context("the endpoint's own errors were not flagged")?;
    ensure!(
        y.summary.contains("error rate 20.0% vs 0.0%"),
        "{}",
        y.summary
    );
    ensure!(alerts.len() == 1, "{alerts:?}");
    Ok(())
}

#[tokio::test]
async fn sweep_auto_resolves_quiet_alerts() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let alerts_cfg = AlertsConfig {
        quiet_period: Duration::from_secs(60),
        ..AlertsConfig::default()
    };
    let d = Detectors::new(
        DetectorConfig::default(),
        Some(test_only_ladder()?),
        &alerts_cfg,
    )?;
    let bad = store_run(&db.store, &logprob_run("p/bad", 10_000, 0.5, 0.7)).await?;
    let a = d.after_run(&db.store, &bad).await?.remove(0);
    // 30 s later: not quiet yet
    ensure!(d.sweep(&db.store, 10_100 + 30_000).await?.is_empty());
    ensure!(db.store.active_alerts().await?.len() == 1);
    // 61 s after it was last seen: resolved
    let resolved = d.sweep(&db.store, 10_100 + 61_000).await?;
    ensure!(
        resolved.len() == 1 && resolved[0].id == a.id && resolved[0].state == AlertState::Resolved
    );
    ensure!(db.store.active_alerts().await?.is_empty());
    Ok(())
}

#[test]
fn detector_config_parses_and_names_bad_keys() -> Result<()> {
    let t: toml::Table = r#"
        level = "w4"
        floor_factor = 2.5
        metric = "top1_same"
        cusum_baseline_rounds = 10
        cusum_arl0 = 500.0
        passive_q = 0.05
        passive_window_ms = 600000
        fingerprint_min_sd = 0.005
        [alerts]
        quiet_period_ms = 120000
        [[webhooks]]
        url = "http://127.0.0.1:9/hook"
        format = "slack"
    "#
    .parse()?;
    let c = DetectorConfig::parse(&t)?;
    ensure!(c.rule.level == "w4" && c.rule.floor_factor == 2.5 && c.cusum.baseline_rounds == 10);
    ensure!(
        (c.cusum.arl0() - 500.0).abs() < 1.0,
        "arl0 {}",
        c.cusum.arl0()
    );
    ensure!(c.passive_q == 0.05 && c.passive_window == Duration::from_secs(600));
    ensure!(c.fingerprint_min_sd == 0.005);
    ensure!(DetectorConfig::default().fingerprint_min_sd == 1e-3);
    let a = AlertsConfig::parse(&t)?;
    ensure!(a.quiet_period == Duration::from_secs(120) && a.webhooks.len() == 1);
    for (bad, key) in [
        ("levle = \"w4\"", "levle"),
        ("floor_factor = 0.5", "floor_factor"),
        ("metric = \"kl_mean\"", "metric"),
        ("passive_q = 2.0", "passive_q"),
        ("cusum_baseline_rounds = 1", "cusum_baseline_rounds"),
        (
            "fingerprint_min_sd = 0.0",
            "fingerprint_min_sd: must be positive",
        ),
        (
            "fingerprint_min_sd = nan",
            "fingerprint_min_sd: must be positive",
        ),
    ] {
        let t: toml::Table = bad.parse()?;
        let err = DetectorConfig::parse(&t)
            .err()
            .context(format!("{bad} accepted"))?;
        ensure!(err.to_string().contains(key), "{bad}: {err}");
    }
    let t: toml::Table = "[alerts]\nquiet_period_ms = 0".parse()?;
    ensure!(AlertsConfig::parse(&t).is_err());
    let t: toml::Table = "[[webhooks]]\nurl = \"ftp://x\"".parse()?;
    ensure!(AlertsConfig::parse(&t).is_err());
    // a ladder without the configured level is refused at start-up
    let cfg = DetectorConfig {
        rule: samewise_probes::noise::FaithfulRule {
            level: "w5".to_owned(),
            floor_factor: 3.0,
        },
        ..DetectorConfig::default()
    };
    ensure!(detectors(cfg, Some(test_only_ladder()?)).is_err());
    Ok(())
}

#[tokio::test]
async fn samples_p_value_and_unmappable_tokens_are_unfaithful() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), Some(test_only_ladder()?))?;
    let samples = |ep: &str, p: f64| ProbeRun {
        kind: "samples".to_owned(),
        stats: serde_json::json!({"mmd": 0.02, "p_value": p}),
        ..logprob_run(ep, 1_000, 0.0, 1.0)
    };
    let same = store_run(&db.store, &samples("p/same", 0.4)).await?;
    ensure!(d.after_run(&db.store, &same).await?.is_empty());
    let diff = store_run(&db.store, &samples("p/diff", 0.0002)).await?;
    let alerts = d.after_run(&db.store, &diff).await?;
    ensure!(
        alerts.len() == 1 && alerts[0].evidence["p_value"] == 0.0002,
        "{alerts:?}"
    );
    ensure!(
        alerts[0].summary.contains("p = 2.00e-4 < 0.010"),
        "{}",
        alerts[0].summary
    );
    // with the log-likelihood test beside the MMD, the two are one Bonferroni p-value: 2 · min
    let both = |ep: &str, p_mmd: f64, p_ll: f64| ProbeRun {
        stats: serde_json::json!({"mmd": 0.001, "p_value": p_mmd, "loglik_diff": -0.21, "loglik_p_value": p_ll}),
        ..samples(ep, p_mmd)
    };
    // 0.008 alone is below 0.01, but not once two tests are looked at
    let near = store_run(&db.store, &both("p/near", 0.3, 0.008)).await?;
    ensure!(d.after_run(&db.store, &near).await?.is_empty());
    let ll = store_run(&db.store, &both("p/ll", 0.3, 0.002)).await?;
    let alerts = d.after_run(&db.store, &ll).await?;
    ensure!(
        alerts.len() == 1
            && alerts[0].evidence["statistic"] == "loglik_diff"
            && alerts[0].evidence["value"] == -0.21
            && alerts[0].evidence["p_value"] == 0.004
            && alerts[0].evidence["p_loglik"] == 0.002
            && alerts[0].evidence["p_mmd"] == 0.3,
        "{alerts:?}"
    );
    ensure!(
        alerts[0]
            .summary
            .contains("the reference finds them less likely")
            && alerts[0].summary.contains("p = 0.004 < 0.010"),
        "{}",
        alerts[0].summary
    );
    let mmd = store_run(&db.store, &both("p/mmd", 0.001, 0.5)).await?;
    let alerts = d.after_run(&db.store, &mmd).await?;
    ensure!(
        alerts.len() == 1
            && alerts[0].evidence["statistic"] == "mmd"
            && alerts[0].evidence["p_value"] == 0.002,
        "{alerts:?}"
    );
    // a faithful-looking KL, but 10% of the endpoint's tokens do not map
    let mut run = logprob_run("p/tok", 1_000, 0.001, 0.99);
    run.stats["mismatch_rate"] = serde_json::json!(0.1);
    run.stats["unmappable"] = serde_json::json!(51);
    let run = store_run(&db.store, &run).await?;
    let alerts = d.after_run(&db.store, &run).await?;
    ensure!(
        alerts.len() == 1 && alerts[0].evidence["statistic"] == "mismatch_rate",
        "{alerts:?}"
    );
    ensure!(
        alerts[0]
            .summary
            .contains("10.0% of its tokens (51) do not map"),
        "{}",
        alerts[0].summary
    );
    Ok(())
}

#[test]
fn check_config_reads_the_ladder_and_the_detector_tables() -> Result<()> {
    let ladder = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/TEST_ONLY_handwritten_ladder.json"
    );
    let doc = |extra: &str, ladder: &str| {
        format!(
            "[probes]\nladder = \"{ladder}\"\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"/nonexistent.gguf\"\n\
             [probes.detectors]\n{extra}\n[probes.alerts]\nquiet_period_ms = 60000\n"
        )
    };
    let ok = samewise_probes::ProbesConfig::from_gateway_toml(&doc("level = \"w4\"", ladder))?;
    Detectors::check_config(&ok)?;
    let no_level =
        samewise_probes::ProbesConfig::from_gateway_toml(&doc("level = \"w5\"", ladder))?;
    let err = Detectors::check_config(&no_level)
        .err()
        .context("a level the ladder lacks was accepted")?;
    ensure!(err.to_string().contains("w5"), "{err}");
    let missing =
        samewise_probes::ProbesConfig::from_gateway_toml(&doc("", "/nonexistent/ladder.json"))?;
    let err = Detectors::check_config(&missing)
        .err()
        .context("a missing ladder was accepted")?;
    ensure!(
        err.to_string().contains("/nonexistent/ladder.json"),
        "{err}"
    );
    let typo = samewise_probes::ProbesConfig::from_gateway_toml(&doc("pasive_q = 0.1", ladder))?;
    let err = Detectors::check_config(&typo)
        .err()
        .context("an unknown key was accepted")?;
    ensure!(err.to_string().contains("pasive_q"), "{err}");
    Ok(())
}

/// A samples probe whose permutations cannot produce a p-value below `samples_alpha` could
/// never be flagged (its p is Bonferroni over two permutation tests, at least 2/(B+1)): the
/// configuration is refused, naming both keys; the defaults can.
#[test]
fn samples_alpha_out_of_reach_of_the_permutations_is_a_config_error() -> Result<()> {
    use samewise_probes::ProbesConfig;
    let cfg = |perms: &str, alpha: &str| {
        ProbesConfig::from_gateway_toml(&format!(
            "[probes]\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"unused\"\n[probes.detectors]\n{alpha}\n[models.smol.probes]\nkinds = [\"samples\"]\n{perms}\n"
        ))
    };
    Detectors::check_config(&cfg("", "")?)?;
    Detectors::check_config(&cfg("permutations = 200", "samples_alpha = 0.01")?)?;
    let e = Detectors::check_config(&cfg("permutations = 1000", "samples_alpha = 0.001")?)
        .err()
        .context("1,000 permutations cannot reach p < 0.001 over two tests")?
        .to_string();
    ensure!(
        e.contains("probes.detectors.samples_alpha")
            && e.contains("models.smol.probes.permutations = 1000")
            && e.contains("at least 2000 permutations"),
        "{e}"
    );
    ensure!(Detectors::check_config(&cfg("permutations = 199", "samples_alpha = 0.01")?).is_err());
    // a model without the samples kind is not concerned
    let no_samples = ProbesConfig::from_gateway_toml(
        "[probes]\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"unused\"\n[probes.detectors]\nsamples_alpha = 0.001\n[models.smol.probes]\nkinds = [\"prompt_logprobs\"]\npermutations = 10\n",
    )?;
    Detectors::check_config(&no_samples)?;
    Ok(())
}

fn long_context_run(endpoint: &str, effective: u32, reference: u32) -> ProbeRun {
    let lengths: Vec<serde_json::Value> = [256u32, 512, 1024]
        .iter()
        .map(|&l| {
            let lost = l > effective;
            serde_json::json!({"length": l, "queries": 16, "passed": if lost { 7 } else { 16 },
                               "reference_passed": 16, "below": lost, "truncated": lost})
        })
        .collect();
    ProbeRun {
        kind: "long_context".to_owned(),
        stats: serde_json::json!({"effective_context": effective, "reference_effective_context": reference,
                                  "window": 1024, "scoring": "likelihood", "lengths": lengths}),
        ..logprob_run(endpoint, 1_000, 0.0, 1.0)
    }
}

#[tokio::test]
async fn long_context_flags_an_effective_context_a_doubling_below_the_reference() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), None)?;
    for (ep, eff) in [("p/full", 1024), ("p/most", 768)] {
        let r = store_run(&db.store, &long_context_run(ep, eff, 1024)).await?;
        ensure!(d.after_run(&db.store, &r).await?.is_empty(), "{ep} flagged");
    }
    let cut = store_run(&db.store, &long_context_run("p/cut", 512, 1024)).await?;
    let alerts = d.after_run(&db.store, &cut).await?;
    ensure!(alerts.len() == 1, "{alerts:?}");
    let a = &alerts[0];
    ensure!(a.kind == "unfaithful", "{a:?}");
    ensure!(
        a.summary
            .starts_with("endpoint p/cut: effective context 512 tokens, reference 1024")
            && a.summary.contains("1024: 7/16 vs 16/16"),
        "{}",
        a.summary
    );
    let e = &a.evidence;
    ensure!(
        e["statistic"] == "effective_context"
            && e["value"] == 512
            && e["reference_value"] == 1024
            && e["lengths"].as_array().map(Vec::len) == Some(3)
            && e["probe_runs"] == serde_json::json!([cut.id]),
        "{e}"
    );
    Ok(())
}
