//! Fault signatures, end to end: the probe kinds against the real engine under profiles that
//! reproduce each fault (a shifted echo, another chat template, ignored sampling, capped
//! `top_logprobs`, another model behind the name) name the signature, and the faithful
//! detector over a real store names it in the alert instead of a bit width — for
//! `different_model` also over the runs pooled since the endpoint went over the threshold.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use samewise_engine::{Engine, LoadOptions};
use samewise_probes::ProbeKind;
use samewise_probes::compare::{PositionInput, Side, TopEntry, encode_positions};
use samewise_probes::detect::DetectorConfig;
use samewise_store::testing::TestDb;
use samewise_store::{Backend, ProbeRun, Store};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::detectors::{detectors, logprob_run, store_run, test_only_ladder};

/// An engine whose echo reports each logprob one position off (the `shifted-echo` profile,
/// llama-cpp-python's behaviour) is diagnosed as such, with the KL it has and the KL it has
/// realigned (exactly 0: the weights are the reference's); one that renders chats with
/// another system prompt (a `default_system` template profile) is diagnosed by its prompt
/// token counts; one that samples at temperature 1 whatever the request asks
/// (`api.fixed_temperature`) by its own logprobs; one that caps `top_logprobs` at 2 by the
/// alternatives it returns. The same loaded engine serves all, under each profile's API faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shifted_echo_a_different_template_ignored_sampling_and_capped_top_logprobs_are_diagnosed()
-> Result<()> {
    use samewise_engine::profile::Profile;
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let profiled =
        async |profile: Profile| profiled_server(engine()?, profile, &stop, &tasks).await;
    let shifted = profiled(Profile::builtin("shifted-echo").context("shifted-echo")?).await?;
    let pirate = Profile::from_toml(
        "[chat_template]\nvariant = \"default_system\"\nsystem_prompt = \"You are a pirate.\"",
        "pirate",
    )?;
    let pirate = profiled(pirate).await?;
    let hot = Profile::from_toml("[api]\nfixed_temperature = 1.0", "hot")?;
    let hot = profiled(hot).await?;
    let capped = Profile::from_toml("[api]\nmax_top_logprobs = 2", "capped")?;
    let capped = profiled(capped).await?;
    let reference = cached_reference()?;
    let h = Harness::new("")?;

    let o = h
        .probe(
            &reference,
            ProbeKind::PromptLogprobs,
            &target(&shifted, "shifted/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    let d = o.stats.get("diagnosis").context("no diagnosis")?;
    eprintln!("shifted-echo diagnosis: {d}");
    ensure!(
        d["signature"] == "shifted_logprobs"
            && d["shift"] == 1
            && d["kl_mean_realigned"] == 0.0
            && d["kl_mean"] == o.stats["kl_mean"]
            && stat(&o, "kl_mean")? > 0.5,
        "{}",
        o.stats
    );
    ensure!(
        d["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("prompt logprobs are reported 1 position off")),
        "{d}"
    );

    let o = h
        .probe(
            &reference,
            ProbeKind::CompletionLogprobs,
            &target(&pirate, "pirate/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    let d = o.stats.get("diagnosis").context("no diagnosis")?;
    eprintln!("default_system diagnosis: {d}");
    let ep = d["endpoint_prompt_tokens"].as_array().context("counts")?;
    let rf = d["reference_prompt_tokens"].as_array().context("counts")?;
    ensure!(
        d["signature"] == "prompt_tokens_differ"
            && !ep.is_empty()
            && ep.len() == rf.len()
            && ep.iter().zip(rf).all(|(e, r)| e.as_i64() < r.as_i64()),
        "{}",
        o.stats
    );
    // the same server's echo is not shifted
    let o = h
        .probe(
            &reference,
            ProbeKind::PromptLogprobs,
            &target(&pirate, "pirate/smol"),
        )
        .await;
    ensure!(o.ok && o.stats.get("diagnosis").is_none(), "{}", o.stats);

    // temperature 0 asked, 1 served: tokens that are not the endpoint's own argmax
    let o = h
        .probe(
            &reference,
            ProbeKind::CompletionLogprobs,
            &target(&hot, "hot/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    let d = o.stats.get("diagnosis").context("no diagnosis")?;
    eprintln!("fixed_temperature diagnosis: {d}");
    ensure!(
        d["signature"] == "sampling_ignored"
            && d["not_greedy"].as_u64().is_some_and(|n| n >= 3)
            && d["largest_gap"].as_f64().is_some_and(|g| g > 1e-3),
        "{}",
        o.stats
    );
    // top_logprobs capped at 2 where the probe asks 5 (both probes see it)
    for kind in [ProbeKind::PromptLogprobs, ProbeKind::CompletionLogprobs] {
        let o = h
            .probe(&reference, kind, &target(&capped, "capped/smol"))
            .await;
        ensure!(o.ok, "{:?}", o.error);
        let d = o.stats.get("diagnosis").context("no diagnosis")?;
        ensure!(
            d["signature"] == "top_logprobs_capped" && d["asked"] == 5 && d["most_returned"] == 2,
            "{kind:?}: {}",
            o.stats
        );
    }
    // the faithful engine, under no fault, is diagnosed with nothing by either probe
    let exact = profiled(Profile::default()).await?;
    for kind in [ProbeKind::PromptLogprobs, ProbeKind::CompletionLogprobs] {
        let o = h
            .probe(&reference, kind, &target(&exact, "exact/smol"))
            .await;
        ensure!(
            o.ok && o.stats.get("diagnosis").is_none(),
            "{kind:?}: {}",
            o.stats
        );
    }

    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A different model behind the name — the same weights conditioned on a hidden context (the
/// built-in `substitute` profile: the context shows in no echo, logprob or usage) — is
/// diagnosed as `different_model` over the 16 prompt-logprob texts: its distribution moved,
/// but the texts' actual tokens did not get less likely. Weights re-quantized to 5 bits (the
/// ladder level closest to the line: KL of the same size, but noise the text knows nothing
/// of) move it as far and are not. (The faithful engine over the same 16 texts is diagnosed
/// with nothing: `probes_engine::every_shipped_text_of_the_unmodified_engine_is_exact`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_model_behind_the_name_is_diagnosed_and_weight_drift_is_not() -> Result<()> {
    use samewise_engine::profile::Profile;
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let substitute = Profile::builtin("substitute").context("substitute")?;
    let substitute = profiled_server(engine()?, substitute, &stop, &tasks).await?;
    let w5 = Profile::builtin("w5").context("w5")?;
    let w5_engine = Arc::new(Engine::load(
        &model_path()?,
        LoadOptions {
            threads: 2,
            profile: w5.clone(),
            ..LoadOptions::default()
        },
    )?);
    let w5 = profiled_server(w5_engine, w5, &stop, &tasks).await?;
    let reference = cached_reference()?;
    let mut h = Harness::new("")?;
    let texts = h.sets.logprob_texts.len();
    h.cfg
        .models
        .get_mut("smol")
        .context("model smol")?
        .items_per_round = texts;

    let o = h
        .probe(
            &reference,
            ProbeKind::PromptLogprobs,
            &target(&substitute, "substitute/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    let d = o.stats.get("diagnosis").context("no diagnosis")?;
    eprintln!("substitute diagnosis: {d}");
    let kl = stat(&o, "kl_mean")?;
    ensure!(
        d["signature"] == "different_model"
            && d["kl_mean"].as_f64() == Some(kl)
            && kl > 0.02
            && d["dlogprob_mean"].as_f64().is_some_and(|v| v > -0.5 * kl)
            && d["z"].as_f64().is_some_and(|z| z > 2.326),
        "{}",
        o.stats
    );
    ensure!(
        d["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("a different model behind the name")),
        "{d}"
    );

    let o = h
        .probe(
            &reference,
            ProbeKind::PromptLogprobs,
            &target(&w5, "w5/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    let w5_kl = stat(&o, "kl_mean")?;
    eprintln!("w5: kl_mean {w5_kl}, stats {}", o.stats);
    // as far from the reference as the substitute, and not read as another model
    ensure!(
        w5_kl > kl / 2.0 && o.stats.get("diagnosis").is_none(),
        "{}",
        o.stats
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A run carrying a fault signature (`stats.diagnosis`) is flagged naming the signature, not
/// a bit width: the ladder's reading is kept aside as `ladder_reading`, out of `equivalent`.
#[tokio::test]
async fn a_diagnosed_run_names_its_signature_instead_of_a_bit_width() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), Some(test_only_ladder()?))?;
    let mut run = logprob_run("p/shifted", 1_000, 3.1, 0.2);
    run.stats["diagnosis"] = serde_json::json!({
        "signature": "shifted_logprobs",
        "text": "prompt logprobs are reported 1 position off",
        "shift": 1,
        "kl_mean": 3.1,
        "kl_mean_realigned": 0.0,
    });
    let run = store_run(&db.store, &run).await?;
    let alerts = d.after_run(&db.store, &run).await?;
    ensure!(alerts.len() == 1, "{alerts:?}");
    let a = &alerts[0];
    ensure!(
        a.kind == "unfaithful"
            && a.summary
                .starts_with("endpoint p/shifted: prompt logprobs are reported 1 position off")
            && a.summary.contains("mean KL 3.100 over 0.012")
            && !a.summary.contains("-bit"),
        "summary: {}",
        a.summary
    );
    let e = &a.evidence;
    ensure!(
        e["diagnosis"]["signature"] == "shifted_logprobs"
            && e.get("equivalent").is_none()
            && e["ladder_reading"]
                .as_str()
                .is_some_and(|t| t.contains("2-bit")),
        "{e}"
    );
    // under the threshold a signature alone raises nothing
    let mut calm = logprob_run("p/calm", 1_000, 0.005, 0.99);
    calm.stats["diagnosis"] = run.stats["diagnosis"].clone();
    let calm = store_run(&db.store, &calm).await?;
    ensure!(d.after_run(&db.store, &calm).await?.is_empty());
    // ... except a signature that is a fault by itself: sampling ignored at temperature 0
    let mut hot = logprob_run("p/hot", 1_000, 0.005, 0.99);
    hot.kind = "completion_logprobs".into();
    hot.stats["diagnosis"] = serde_json::json!({
        "signature": "sampling_ignored",
        "text": "temperature 0 is not honoured: 9 of 40 generated tokens were not the endpoint's own most likely token",
        "not_greedy": 9,
        "positions": 40,
    });
    let hot = store_run(&db.store, &hot).await?;
    let alerts = d.after_run(&db.store, &hot).await?;
    ensure!(alerts.len() == 1, "{alerts:?}");
    ensure!(
        alerts[0].summary
            == "endpoint p/hot: temperature 0 is not honoured: 9 of 40 generated tokens were not the endpoint's own most likely token"
            && alerts[0].evidence["statistic"] == "sampling_ignored"
            && alerts[0].evidence["diagnosis"]["not_greedy"] == 9
            && alerts[0].evidence.get("equivalent").is_none(),
        "{alerts:?}"
    );
    Ok(())
}

/// `tens` × 10 two-token positions where the reference puts 0.7 on token 1: an endpoint at
/// 0.9 on a text with token 1 nine times in ten (it moved the way the text did: a competent
/// other model), or with `drift` one at 0.5 on a text with token 1 seven times in ten (the
/// reference's own rate: noise the text knows nothing of, which costs the actual tokens the
/// KL). Returns the positions and their mean KL.
fn moved(tens: usize, drift: bool) -> Result<(Vec<PositionInput>, f64)> {
    let (p_ep, ones) = if drift { (0.5f64, 7) } else { (0.9, 9) };
    let side = |p1: f64, actual: u32| Side {
        actual_logprob: if actual == 1 {
            p1.ln()
        } else {
            (1.0 - p1).ln()
        },
        top: vec![
            TopEntry {
                id: 1,
                logprob: p1.ln(),
            },
            TopEntry {
                id: 2,
                logprob: (1.0 - p1).ln(),
            },
        ],
    };
    let pos: Vec<PositionInput> = (0..tens * 10)
        .map(|i| {
            let actual = if i % 10 < ones { 1 } else { 2 };
            PositionInput {
                actual_id: actual,
                reference: side(0.7, actual),
                endpoint: side(p_ep, actual),
            }
        })
        .collect();
    let metrics = samewise_probes::compare::compare_run(&pos)?;
    let kl = metrics.iter().map(|m| m.kl).sum::<f64>() / metrics.len() as f64;
    Ok((pos, kl))
}

async fn moved_run(
    store: &Store,
    endpoint: &str,
    t: i64,
    drift: bool,
    kl: Option<f64>,
) -> Result<ProbeRun> {
    let (pos, real_kl) = moved(1, drift)?;
    let mut run = logprob_run(endpoint, t, kl.unwrap_or(real_kl), 0.7);
    run.raw = Some(encode_positions(&pos)?);
    store_run(store, &run).await
}

/// An unfaithful prompt_logprobs run too small to tell a different model from drift on its
/// own (10 positions) is diagnosed `different_model` over the endpoint's runs since it went
/// over the threshold, pooled: not after one run or two, named from the third on (30
/// positions, z 2.57), never past a run under the threshold, never over runs of the same
/// text, and never for drift of the same kind, however many runs.
#[tokio::test]
async fn a_different_model_is_named_over_the_runs_since_the_endpoint_went_over() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors(DetectorConfig::default(), Some(test_only_ladder()?))?;
    let mut ids = Vec::new();
    for i in 0..4i64 {
        let run = moved_run(&db.store, "p/other", 1_000 * (i + 1), false, None).await?;
        ids.insert(0, run.id);
        let alerts = d.after_run(&db.store, &run).await?;
        ensure!(alerts.len() == 1, "{alerts:?}");
        let a = &alerts[0];
        if i < 2 {
            ensure!(
                a.summary.contains("-bit weights") && a.evidence.get("diagnosis").is_none(),
                "run {i}: {}",
                a.summary
            );
        } else {
            ensure!(
                a.summary
                    .starts_with("endpoint p/other: a different model behind the name")
                    && a.summary
                        .contains(&format!("over this run and the {i} before it"))
                    && a.evidence["diagnosis"]["probe_runs"] == serde_json::json!(ids)
                    && a.evidence["diagnosis"]["positions"] == (i + 1) * 10
                    && !a.summary.contains("-bit"),
                "run {i}: {}",
                a.summary
            );
        }
    }
    // a run under the threshold ends the pool: the runs after it are pooled alone
    let calm = moved_run(&db.store, "p/regime", 1_000, false, Some(0.005)).await?;
    ensure!(d.after_run(&db.store, &calm).await?.is_empty());
    let mut ids = Vec::new();
    let mut last = Vec::new();
    for i in 0..3i64 {
        let run = moved_run(&db.store, "p/regime", 2_000 + i, false, None).await?;
        ids.insert(0, run.id);
        last = d.after_run(&db.store, &run).await?;
    }
    ensure!(
        last.len() == 1 && last[0].evidence["diagnosis"]["probe_runs"] == serde_json::json!(ids),
        "{last:?}"
    );
    // runs that score the same text again are not pooled: each text counts once
    for i in 0..4i64 {
        let (pos, kl) = moved(1, false)?;
        let mut run = logprob_run("p/same-text", 1_000 + i, kl, 0.7);
        run.raw = Some(encode_positions(&pos)?);
        run.stats["texts"] = serde_json::json!(["poem"]);
        let run = store_run(&db.store, &run).await?;
        let alerts = d.after_run(&db.store, &run).await?;
        ensure!(
            alerts.len() == 1 && alerts[0].evidence.get("diagnosis").is_none(),
            "run {i}: {alerts:?}"
        );
    }
    // drift: the actual tokens pay the KL, however many runs are pooled
    let (_, drift_kl) = moved(1, true)?;
    ensure!(drift_kl > 0.05, "drift KL {drift_kl}");
    for i in 0..8i64 {
        let run = moved_run(&db.store, "p/drift", 1_000 + i, true, None).await?;
        let alerts = d.after_run(&db.store, &run).await?;
        ensure!(
            alerts.len() == 1
                && alerts[0].summary.contains("-bit weights")
                && alerts[0].evidence.get("diagnosis").is_none(),
            "{alerts:?}"
        );
    }
    Ok(())
}
