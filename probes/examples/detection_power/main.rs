//! The probe detection-power benchmark (not a test): how often the probes flag real engine
//! endpoints under serving profiles, at what probe-token cost. Run it with
//! `bench/probes/run.sh` (release build); settings come from the environment (see
//! [`Settings`]), results go to `$OUT/results.json` and `$OUT/table.md`.
//!
//! Endpoints are the real engine server (`samewise_engine::server::router`) under built-in
//! serving profiles on 127.0.0.1:0, called by the real probe kinds; the reference is the
//! in-process unmodified engine.
//!
//! A. faithful? on prompt_logprobs. The engine is deterministic and batch-invariant, so a
//!    text's per-position comparison is the same in every round: the real kind runs once per
//!    shipped text and profile, and a seeded round (shuffled texts, whole texts while the
//!    round's probe tokens stay within the budget) is the summary of the concatenated cached
//!    positions — the same `compare::summarize` the kind uses — judged by `noise::judge`
//!    against the committed ladder as `detect.rs` does. The shortcut is checked: for some
//!    rounds per profile the real kind runs on the round's texts in one probe run and its
//!    statistics must equal the resampled ones bit for bit.
//! B. changed? (CUSUM) after a switch of the endpoint from P0 to P1 mid-run: the detector's
//!    own `detect::changed_chart` with `DetectorConfig::default()` (one chart per watched
//!    statistic the run has, `min_sd` from the config since the deterministic endpoints' noise
//!    floor is 0, the chart rebuilt from the fixed baseline over the newest `history_runs`
//!    runs, an alarm on any chart = "changed").
//! C. samples (MMD, Model Equality Testing, and the reference log-likelihood test): pools of
//!    samples per completion prompt from the endpoints (`/v1/chat/completions`, as
//!    `kinds/samples.rs` asks) and from the reference, every sample scored once by the
//!    reference; a seeded round of shape P × N takes the scheduler's rotating window of P
//!    prompts and draws N + N samples per prompt without replacement, runs `mmd::mmd_test`
//!    and `mmd::loglik_test` and judges them as the detector does (`mmd::samples_p_value`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use futures_util::StreamExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use samewise_engine::Profile;
use samewise_engine::server::{self, ServerState};
use samewise_engine::{Engine, LoadOptions};
use samewise_probes::compare::{self, PositionMetrics, RunSummary};
use samewise_probes::detect::{self, DetectorConfig};
use samewise_probes::kinds::{self, ProbeCtx, PromptSets, Target};
use samewise_probes::ladder::Ladder;
use samewise_probes::mmd::{
    PermutationConfig, PromptLoglik, PromptSamples, loglik_test, mmd_test, samples_p_value,
};
use samewise_probes::noise;
use samewise_probes::reference::{InProcess, Reference, SampleRequest, mean_loglik};
use samewise_probes::sequential::CusumConfig;
use samewise_probes::{CompletionPrompt, LogprobText};
use samewise_probes::{ModelProbes, ProbeKind, ProbesConfig};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Benchmark settings (environment variable in brackets).
#[derive(Debug, Clone)]
struct Settings {
    /// Output directory [OUT].
    out: PathBuf,
    /// Base seed [SEED].
    seed: u64,
    /// Only what part B needs [ONLY_B=1]: the per-text prompt_logprobs scoring of the
    /// profiles B uses (PROFILES defaults to reference,a8,w6,w5,w4), no re-run check
    /// (VERIFY defaults to 0), no part A rounds and no part C (POOL defaults to 0).
    only_b: bool,
    /// A: profiles [PROFILES].
    profiles: Vec<String>,
    /// A: round budgets in probe tokens [BUDGETS].
    budgets: Vec<i64>,
    /// A: seeded rounds per profile and budget [ROUNDS].
    rounds: usize,
    /// A: rounds per profile re-run with the real kind, spread over the budgets [VERIFY].
    verify: usize,
    /// B: worlds per switch scenario [WORLDS].
    worlds: usize,
    /// B: round budget [SWITCH_BUDGET].
    switch_budget: i64,
    /// B: first round served by P1 [SWITCH_AT].
    switch_at: usize,
    /// B: rounds after the switch before a world counts as undetected [MAX_AFTER].
    max_after: usize,
    /// B: rounds of the in-control run [IC_ROUNDS].
    ic_rounds: usize,
    /// C: samples per prompt in each pool [POOL]; 0 skips part C.
    pool: usize,
    /// C: endpoint profiles whose samples are pooled [SAMPLE_PROFILES].
    sample_profiles: Vec<String>,
    /// C: seeded rounds per scenario [SAMPLE_ROUNDS].
    sample_rounds: usize,
    /// C: round shapes, prompts × samples per prompt and side [ROUND_SHAPES, e.g. "2x10,8x10"].
    shapes: Vec<(usize, usize)>,
    /// C: a `pools.json` of an earlier run to analyse instead of generating pools [POOLS_FROM].
    pools_from: Option<PathBuf>,
    /// Only part C [ONLY_C=1]: no profiles for parts A and B (PROFILES defaults to none).
    only_c: bool,
    /// C: rounds of the real samples kind per sample profile, with the product's defaults and
    /// fresh samples (no pool), judged as the detector judges [VERIFY_C]; 0 skips.
    verify_c: usize,
    /// C: permutations of an extra run that can reach p < 0.001 [HI_PERMUTATIONS]; 0 skips.
    hi_permutations: usize,
    /// C: rounds of that extra run [HI_ROUNDS].
    hi_rounds: usize,
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(key) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("{key}={v}: {e}")),
        _ => Ok(default),
    }
}

fn env_list(key: &str, default: &str) -> Vec<String> {
    std::env::var(key)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_owned())
        .split([',', ' '])
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Settings {
    fn from_env() -> Result<Self> {
        let budgets = env_list("BUDGETS", "500,1000,2000")
            .iter()
            .map(|b| b.parse::<i64>().with_context(|| format!("BUDGETS: {b}")))
            .collect::<Result<Vec<_>>>()?;
        let only_b = env_or("ONLY_B", 0u8)? != 0;
        let only_c = env_or("ONLY_C", 0u8)? != 0;
        let shapes = env_list("ROUND_SHAPES", "2x10,5x10,10x10,25x10")
            .iter()
            .map(|x| {
                let (p, n) = x.split_once('x').context("ROUND_SHAPES: PxN")?;
                let shape: (usize, usize) = (p.parse()?, n.parse()?);
                ensure!(
                    shape.0 > 0 && shape.1 >= 2,
                    "ROUND_SHAPES: {x}: P ≥ 1, N ≥ 2"
                );
                Ok(shape)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            out: PathBuf::from(env_or("OUT", "bench/out/probes".to_owned())?),
            seed: env_or("SEED", 20_261_130)?,
            only_b,
            profiles: env_list(
                "PROFILES",
                if only_c {
                    ""
                } else if only_b {
                    "reference,a8,w6,w5,w4"
                } else {
                    "reference,a8,kv-f16,kv-q8,w8,w6,w5,w4,w3,shifted-echo,substitute"
                },
            ),
            budgets,
            rounds: env_or("ROUNDS", 2000)?,
            verify: env_or("VERIFY", if only_b || only_c { 0 } else { 3 })?,
            worlds: env_or("WORLDS", 200)?,
            switch_budget: env_or("SWITCH_BUDGET", 2000)?,
            switch_at: env_or("SWITCH_AT", 60)?,
            max_after: env_or("MAX_AFTER", 300)?,
            ic_rounds: env_or("IC_ROUNDS", 2000)?,
            pool: env_or("POOL", if only_b { 0 } else { 50 })?,
            sample_profiles: env_list("SAMPLE_PROFILES", "reference,w4"),
            sample_rounds: env_or("SAMPLE_ROUNDS", 500)?,
            shapes,
            pools_from: std::env::var_os("POOLS_FROM").map(PathBuf::from),
            only_c,
            verify_c: env_or("VERIFY_C", 0)?,
            hi_permutations: env_or("HI_PERMUTATIONS", 0)?,
            hi_rounds: env_or("HI_ROUNDS", 200)?,
        })
    }
}

mod analysis;
mod cache;
mod report;
mod samples;

use analysis::{
    Bench, changed_rows, check_fast_stats, cusum_keys, faithful_rows, in_control_rows,
    samples_rows, text_tokens, text_variants,
};
use cache::{
    Env, ProfileData, draw_round, fast_stats, part_a_profile, round_metrics, round_summary,
    start_endpoint,
};

use report::render_tables;
use samples::{
    Pool, RoundP, endpoint_pool, reference_pool, samples_real_rounds, samples_rounds, score_pool,
};

/// A SplitMix64 step: seeds for rounds, worlds and permutations.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn rng_for(seed: u64, parts: &[u64]) -> StdRng {
    StdRng::seed_from_u64(parts.iter().fold(seed, |s, &p| mix(s, p)))
}

/// Wilson 95% interval of x successes in n.
fn wilson(x: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let z = 1.959_963_984_540_054_f64;
    let nf = n as f64;
    let p = x as f64 / nf;
    let d = 1.0 + z * z / nf;
    let c = (p + z * z / (2.0 * nf)) / d;
    let h = z * (p * (1.0 - p) / nf + z * z / (4.0 * nf * nf)).sqrt() / d;
    ((c - h).max(0.0), (c + h).min(1.0))
}

fn pct(x: usize, n: usize) -> String {
    let (lo, hi) = wilson(x, n);
    let p = 100.0 * x as f64 / n.max(1) as f64;
    format!("{p:.1}% [{:.1}, {:.1}]", 100.0 * lo, 100.0 * hi)
}

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    compare::quantile_nearest_rank(v, q).unwrap_or(f64::NAN)
}

fn role(profile: &str) -> &'static str {
    match profile {
        "reference" | "a8" | "kv-f16" | "kv-q8" | "w8" => "faithful (flag = false alarm)",
        "w6" => "boundary (the level itself)",
        "substitute" => "unfaithful (another model: flag = detection)",
        _ => "unfaithful (flag = detection)",
    }
}

/// Which rounds of `series` each watched statistic's chart alarms on, as
/// `Detectors::changed` sees them: the product's own `detect::changed_chart` over the fixed
/// baseline (the first `cusum_baseline_rounds` rounds, stored once complete) and the newest
/// `window` runs (history_runs) after it, ending at every round, with the configured `min_sd`
/// (the deterministic endpoints' noise floor is 0), alarm on the newest. Up to `window` rounds
/// the window starts at run 0, so one pass over the series gives the rebuilt charts' answers.
fn alarms_with_window(
    det: &DetectorConfig,
    series: &[[f64; 3]],
    window: usize,
) -> Result<Vec<[bool; 3]>> {
    let base = det.cusum.baseline_rounds;
    let mut out = vec![[false; 3]; series.len()];
    for c in 0..3 {
        let values: Vec<f64> = series.iter().map(|x| x[c]).collect();
        let head = values.len().min(window);
        let (_, obs) = detect::changed_chart(det, det.cusum.min_sd, &values[..head])?;
        for (t, o) in obs.iter().enumerate() {
            out[t][c] = o.alarm.is_some();
        }
        for t in head..values.len() {
            let from = (t + 1 - window).max(base);
            let chart: Vec<f64> = values[..base]
                .iter()
                .chain(&values[from..=t])
                .copied()
                .collect();
            let (_, obs) = detect::changed_chart(det, det.cusum.min_sd, &chart)?;
            out[t][c] = obs.last().is_some_and(|o| o.alarm.is_some());
        }
    }
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let started = Instant::now();
    let s = Settings::from_env()?;
    std::fs::create_dir_all(&s.out)?;
    let model = samewise_testkit::fixtures::test_model()?;
    let probes_cfg = ProbesConfig::from_gateway_toml(
        "[probes]\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"unused\"\n[models.smol.probes]\n",
    )?;
    let cfg = probes_cfg.models.get("smol").context("config")?.clone();
    let sets = PromptSets::load(&cfg.prompt_sets)?;
    let ladder_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/ladders/smollm2-135m-instruct-q4_1.json");
    let ladder = Ladder::from_json(&std::fs::read_to_string(&ladder_path)?)?;
    let det = detector_from_env()?;
    let threshold = ladder.threshold(det.metric, &det.rule.level)?;
    eprintln!(
        "settings: {s:?}\nfaithful? threshold: {:?} > {threshold} (level {}); CUSUM h {:.3} (charts {:.3}) k {} two-sided {} ARL0 {:.0}",
        det.metric,
        det.rule.level,
        det.cusum.h,
        detect::changed_chart_config(&det, det.cusum.min_sd)?.h,
        det.cusum.k,
        det.cusum.two_sided,
        det.cusum.arl0()
    );
    let reference = load_reference(&model).await?;
    let http = kinds::endpoint_client(std::time::Duration::from_secs(300));
    let env = Env {
        reference: &reference,
        cfg: &cfg,
        sets: &sets,
        http: &http,
    };
    let mut log = Vec::new();

    // ---- collection: part A caches and part C pools, one endpoint at a time
    let (profiles, pools, ref_pool, samples_real) = collect(&s, &model, &env, &mut log).await?;
    let collect_s = started.elapsed().as_secs_f64();
    eprintln!("collection done in {collect_s:.1} s");

    // ---- A: faithful? per profile and budget; B: changed? after a switch, and in control
    let tokens = if s.only_c {
        Vec::new()
    } else {
        text_tokens(&profiles)?
    };
    let bench = Bench {
        s: &s,
        cfg: &cfg,
        det: &det,
        tokens: &tokens,
    };
    let (inexact_ids, a_rows, b_rows, ic_rows, keys) = if s.only_c {
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new())
    } else {
        let t_a = Instant::now();
        let (variants, inexact_ids) = text_variants(&profiles, &sets, tokens.len());
        let a_variants: &[(&str, Vec<usize>)] = if s.only_b { &[] } else { &variants };
        let a_rows = faithful_rows(&bench, &profiles, a_variants, &ladder)?;
        eprintln!("A analysed in {:.1} s", t_a.elapsed().as_secs_f64());
        let t_b = Instant::now();
        let (keys, key_pos) = cusum_keys(&det)?;
        let fast_checked = check_fast_stats(&bench, &profiles)?;
        let b_rows = changed_rows(&bench, &profiles, &key_pos)?;
        let ic_rows = in_control_rows(&bench, &profiles, &keys, &key_pos)?;
        eprintln!(
            "B analysed in {:.1} s ({fast_checked} fast rounds checked)",
            t_b.elapsed().as_secs_f64()
        );
        (inexact_ids, a_rows, b_rows, ic_rows, keys)
    };

    // ---- C: samples
    let t_c = Instant::now();
    let c_rows = match &ref_pool {
        Some(rf) => samples_rows(&bench, &pools, rf, sets.completion_prompts.len())?,
        None => Vec::new(),
    };
    eprintln!("C analysed in {:.1} s", t_c.elapsed().as_secs_f64());

    // ---- write
    let total_s = started.elapsed().as_secs_f64();
    let verified: usize = profiles.iter().map(|p| p.verified.0).sum();
    let verify_total: usize = profiles.iter().map(|p| p.verified.1).sum();
    let line = format!(
        "verified {verified} of {verify_total} rounds (real kind vs resampled, bit for bit)"
    );
    eprintln!("{line}");
    log.push(line);
    let results = json!({
        "settings": settings_json(&s, &cfg, &det, threshold, &keys)?,
        "texts": {"count": tokens.len(), "tokens": tokens, "total_tokens": tokens.iter().sum::<i64>(),
                  "ids": sets.logprob_texts.iter().map(|t| t.id.clone()).collect::<Vec<_>>(),
                  "not_exact_on_the_exact_endpoint": inexact_ids},
        "profiles": profiles.iter().map(|p| json!({
            "profile": p.name, "positions": p.all.count, "kl_mean_all_texts": p.all.kl_mean,
            "top1_same_all_texts": p.all.top1_same, "dlogprob_mean_all_texts": p.all.abs_dlogprob_mean,
            "verified_rounds": p.verified.0, "verify_rounds": p.verified.1,
            "per_text_decode_exact": p.decode_exact,
        })).collect::<Vec<_>>(),
        "faithful": a_rows, "changed": b_rows, "in_control": ic_rows, "samples": c_rows, "samples_real": samples_real,
        "log": log,
        "collect_seconds": collect_s, "total_seconds": total_s,
    });
    std::fs::write(
        s.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    let table = render_tables(&results)?;
    std::fs::write(s.out.join("table.md"), &table)?;
    println!("{table}");
    Ok(())
}

/// Part B's chart: `DetectorConfig::default()`, or another k [CUSUM_K] / the
/// estimated-baseline correction off [CUSUM_CORRECTION=0] to compare remedies.
fn detector_from_env() -> Result<DetectorConfig> {
    let mut det = DetectorConfig::default();
    if let Ok(k) = std::env::var("CUSUM_K") {
        let k: f64 = k.trim().parse().context("CUSUM_K")?;
        det.cusum = CusumConfig {
            baseline_rounds: det.cusum.baseline_rounds,
            min_sd: det.cusum.min_sd,
            ..CusumConfig::for_arl0(k, det.cusum.arl0(), true)?
        };
    }
    det.cusum_baseline_correction = env_or("CUSUM_CORRECTION", 1u8)? != 0;
    Ok(det)
}

/// The in-process unmodified engine, the probes' reference.
async fn load_reference(model: &Path) -> Result<InProcess> {
    let (tok, template) = samewise_engine::chat::load_tokenizer_and_template(model)?;
    let m = model.to_owned();
    let ref_engine = tokio::task::spawn_blocking(move || {
        Engine::load(
            &m,
            LoadOptions {
                threads: 2,
                ..LoadOptions::default()
            },
        )
    })
    .await??;
    Ok(InProcess::from_parts(
        Arc::new(ref_engine),
        Arc::new(tok),
        template,
    ))
}

/// Collection, one endpoint at a time: part A's per-text caches of the profiles and part C's
/// sample pools, with the reference pool (when part C runs), every pool scored by the
/// reference and written to `$OUT/pools.json`; or part C's pools read from `POOLS_FROM`.
async fn collect(
    s: &Settings,
    model: &Path,
    env: &Env<'_>,
    log: &mut Vec<String>,
) -> Result<(Vec<ProfileData>, Vec<Pool>, Option<Pool>, Vec<Value>)> {
    let mut profiles: Vec<ProfileData> = Vec::new();
    let mut pools: Vec<Pool> = Vec::new();
    let mut real_rounds: Vec<Value> = Vec::new();
    let loaded: Option<(Vec<Pool>, Pool)> = match &s.pools_from {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("POOLS_FROM={}", path.display()))?;
            Some(serde_json::from_str(&text).context("POOLS_FROM: not a pools.json")?)
        }
        None => None,
    };
    let generate = s.pool > 0 && loaded.is_none();
    let mut all_names = s.profiles.clone();
    if generate || s.verify_c > 0 {
        for p in &s.sample_profiles {
            if !all_names.contains(p) {
                all_names.push(p.clone());
            }
        }
    }
    // the reference pool is drawn while the endpoints are probed (the engine is
    // batch-invariant: the re-run check below would show any interference)
    let collect = async {
        for name in &all_names {
            let stop = CancellationToken::new();
            let (target, task) = start_endpoint(model, name, &stop).await?;
            if s.profiles.contains(name) {
                profiles.push(part_a_profile(env, &target, s, log).await?);
            }
            if generate && s.sample_profiles.contains(name) {
                pools.push(
                    endpoint_pool(
                        env.http,
                        &target,
                        &env.sets.completion_prompts,
                        env.cfg,
                        s.pool,
                    )
                    .await?,
                );
            }
            if s.verify_c > 0 && s.sample_profiles.contains(name) {
                real_rounds.push(samples_real_rounds(env, &target, s).await?);
            }
            stop.cancel();
            task.await?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let ref_pool_fut = async {
        if generate {
            Ok::<_, anyhow::Error>(Some(
                reference_pool(
                    env.reference,
                    &env.sets.completion_prompts,
                    env.cfg,
                    s.pool,
                    mix(s.seed, 0x5EED),
                )
                .await?,
            ))
        } else {
            Ok(None)
        }
    };
    let (collected, ref_pool) = tokio::join!(collect, ref_pool_fut);
    collected?;
    let mut ref_pool = ref_pool?;
    if let Some((p, r)) = loaded {
        pools = p;
        ref_pool = Some(r);
    }
    if let Some(rf) = &mut ref_pool {
        for pool in pools.iter_mut().chain(std::iter::once(&mut *rf)) {
            if pool.loglik.len() != pool.samples.len() {
                score_pool(env.reference, &env.sets.completion_prompts, pool).await?;
            }
        }
        std::fs::write(
            s.out.join("pools.json"),
            serde_json::to_string(&(&pools, &*rf))?,
        )?;
    }
    Ok((profiles, pools, ref_pool, real_rounds))
}

/// The settings as `results.json` records them.
fn settings_json(
    s: &Settings,
    cfg: &ModelProbes,
    det: &DetectorConfig,
    threshold: f64,
    keys: &[String],
) -> Result<Value> {
    Ok(json!({
        "seed": s.seed, "only_b": s.only_b, "profiles": s.profiles, "budgets": s.budgets, "rounds": s.rounds,
        "verify": s.verify, "worlds": s.worlds, "switch_budget": s.switch_budget, "switch_at": s.switch_at,
        "max_after": s.max_after, "ic_rounds": s.ic_rounds, "pool": s.pool, "sample_profiles": s.sample_profiles,
        "sample_rounds": s.sample_rounds, "round_shapes": s.shapes, "pools_from": s.pools_from,
        "only_c": s.only_c, "samples_alpha": det.samples_alpha,
        "hi_permutations": s.hi_permutations, "hi_rounds": s.hi_rounds,
        "items_per_round_default": cfg.items_per_round, "permutations_default": cfg.permutations,
        "top_k": cfg.top_k, "level": det.rule.level, "metric": det.metric, "threshold": threshold,
        "cusum": det.cusum, "cusum_arl0": det.cusum.arl0(), "cusum_statistics": keys,
        "cusum_baseline_correction": det.cusum_baseline_correction,
        "cusum_chart_h": detect::changed_chart_config(det, det.cusum.min_sd)?.h,
        "history_runs": det.history_runs,
    }))
}
