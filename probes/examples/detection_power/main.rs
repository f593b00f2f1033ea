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
//!    floor is 0, the chart rebuilt over the newest `history_runs` runs, an alarm on any chart
//!    = "changed").
//! C. samples (MMD, Model Equality Testing): pools of samples per completion prompt from the
//!    endpoints (`/v1/chat/completions`, as `kinds/samples.rs` asks) and from the reference;
//!    a seeded round draws 10 + 10 per prompt without replacement and runs `mmd::mmd_test`.

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
use samewise_probes::mmd::{PermutationConfig, PromptSamples, mmd_test};
use samewise_probes::noise;
use samewise_probes::reference::{InProcess, Reference, SampleRequest};
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
    /// C: samples per prompt and side in a round [SAMPLES_PER_PROMPT].
    per_prompt: usize,
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
        Ok(Self {
            out: PathBuf::from(env_or("OUT", "bench/out/probes".to_owned())?),
            seed: env_or("SEED", 20_261_130)?,
            only_b,
            profiles: env_list(
                "PROFILES",
                if only_b {
                    "reference,a8,w6,w5,w4"
                } else {
                    "reference,a8,kv-f16,kv-q8,w8,w6,w5,w4,w3,shifted-echo"
                },
            ),
            budgets,
            rounds: env_or("ROUNDS", 2000)?,
            verify: env_or("VERIFY", if only_b { 0 } else { 3 })?,
            worlds: env_or("WORLDS", 200)?,
            switch_budget: env_or("SWITCH_BUDGET", 2000)?,
            switch_at: env_or("SWITCH_AT", 60)?,
            max_after: env_or("MAX_AFTER", 300)?,
            ic_rounds: env_or("IC_ROUNDS", 2000)?,
            pool: env_or("POOL", if only_b { 0 } else { 50 })?,
            sample_profiles: env_list("SAMPLE_PROFILES", "reference,w4"),
            sample_rounds: env_or("SAMPLE_ROUNDS", 500)?,
            per_prompt: env_or("SAMPLES_PER_PROMPT", 10)?,
            hi_permutations: env_or("HI_PERMUTATIONS", 0)?,
            hi_rounds: env_or("HI_ROUNDS", 200)?,
        })
    }
}

mod cache;
mod report;
mod samples;

use cache::{
    Env, ProfileData, draw_round, fast_stats, part_a_profile, round_summary, start_endpoint,
};

use report::render_tables;
use samples::{Pool, endpoint_pool, reference_pool, samples_rounds};

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
        _ => "unfaithful (flag = detection)",
    }
}

/// Which rounds of `series` each watched statistic's chart alarms on, as
/// `Detectors::changed` sees them: the product's own `detect::changed_chart` over the newest
/// `window` runs (history_runs) ending at every round, with the configured `min_sd` (the
/// deterministic endpoints' noise floor is 0), alarm on the newest. Up to `window` rounds the
/// window starts at run 0, so one pass over the series gives the rebuilt charts' answers.
fn alarms_with_window(
    det: &DetectorConfig,
    series: &[[f64; 3]],
    window: usize,
) -> Result<Vec<[bool; 3]>> {
    let mut out = vec![[false; 3]; series.len()];
    for c in 0..3 {
        let values: Vec<f64> = series.iter().map(|x| x[c]).collect();
        let head = values.len().min(window);
        let (_, obs) = detect::changed_chart(det, det.cusum.min_sd, &values[..head])?;
        for (t, o) in obs.iter().enumerate() {
            out[t][c] = o.alarm.is_some();
        }
        for t in head..values.len() {
            let (_, obs) =
                detect::changed_chart(det, det.cusum.min_sd, &values[t + 1 - window..=t])?;
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
    // part B's chart: DetectorConfig::default(), or another k [CUSUM_K] / the
    // estimated-baseline correction off [CUSUM_CORRECTION=0] to compare remedies
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
    let (tok, template) = samewise_engine::chat::load_tokenizer_and_template(&model)?;
    let m = model.clone();
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
    let reference = InProcess::from_parts(Arc::new(ref_engine), Arc::new(tok), template);
    let http = kinds::endpoint_client(std::time::Duration::from_secs(300));
    let env = Env {
        reference: &reference,
        cfg: &cfg,
        sets: &sets,
        http: &http,
    };
    let mut log = Vec::new();

    // ---- collection: part A caches and part C pools, one endpoint at a time
    let mut profiles: Vec<ProfileData> = Vec::new();
    let mut pools: Vec<Pool> = Vec::new();
    let mut all_names = s.profiles.clone();
    for p in &s.sample_profiles {
        if !all_names.contains(p) {
            all_names.push(p.clone());
        }
    }
    // the reference pool is drawn while the endpoints are probed (the engine is
    // batch-invariant: the re-run check below would show any interference)
    let collect = async {
        for name in &all_names {
            let stop = CancellationToken::new();
            let (target, task) = start_endpoint(&model, name, &stop).await?;
            if s.profiles.contains(name) {
                profiles.push(part_a_profile(&env, &target, &s, &mut log).await?);
            }
            if s.pool > 0 && s.sample_profiles.contains(name) {
                pools.push(
                    endpoint_pool(&http, &target, &sets.completion_prompts, &cfg, s.pool).await?,
                );
            }
            stop.cancel();
            task.await?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let ref_pool_fut = async {
        if s.pool > 0 {
            Ok::<_, anyhow::Error>(Some(
                reference_pool(
                    &reference,
                    &sets.completion_prompts,
                    &cfg,
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
    let ref_pool = ref_pool?;
    let collect_s = started.elapsed().as_secs_f64();
    eprintln!("collection done in {collect_s:.1} s");

    // ---- A: faithful? per profile and budget
    let t_a = Instant::now();
    let tokens: Vec<i64> = profiles
        .first()
        .context("no profiles")?
        .texts
        .iter()
        .map(|t| t.tokens)
        .collect();
    for p in &profiles {
        let t: Vec<i64> = p.texts.iter().map(|t| t.tokens).collect();
        ensure!(
            t == tokens,
            "{}: text token counts differ from {}",
            p.name,
            profiles[0].name
        );
    }
    // the shipped texts, and those on which the exact (reference-profile) endpoint compares
    // exactly (KL 0, same top-1 everywhere): texts it does not are a probe artefact
    let all_texts: Vec<usize> = (0..tokens.len()).collect();
    let exact_texts: Vec<usize> = match profiles.iter().find(|p| p.name == "reference") {
        Some(rp) => (0..tokens.len())
            .filter(|&i| {
                round_summary(rp, &[i]).is_ok_and(|x| x.kl_mean == 0.0 && x.top1_same == 1.0)
            })
            .collect(),
        None => Vec::new(),
    };
    let inexact_ids: Vec<String> = all_texts
        .iter()
        .filter(|i| !exact_texts.contains(i))
        .map(|&i| sets.logprob_texts[i].id.clone())
        .collect();
    let mut variants = vec![("shipped", all_texts.clone())];
    if !exact_texts.is_empty() && exact_texts.len() < all_texts.len() {
        variants.push(("exact", exact_texts.clone()));
    }
    let mut a_rows = Vec::new();
    let a_variants: &[(&str, Vec<usize>)] = if s.only_b { &[] } else { &variants };
    for (variant, subset) in a_variants {
        let sub_tokens: Vec<i64> = subset.iter().map(|&i| tokens[i]).collect();
        for p in &profiles {
            for &b in &s.budgets {
                let (mut flags, mut tok_sum, mut texts_sum) = (0usize, 0i64, 0usize);
                let (mut since_r, mut since_t) = (0usize, 0i64);
                let (mut ep_r, mut ep_t) = (Vec::new(), Vec::new());
                let mut kl = Vec::with_capacity(s.rounds);
                for r in 0..s.rounds {
                    let idx: Vec<usize> = draw_round(
                        &mut rng_for(s.seed, &[0xA, b as u64, r as u64]),
                        &sub_tokens,
                        b,
                    )
                    .into_iter()
                    .map(|i| subset[i])
                    .collect();
                    let rt: i64 = idx.iter().map(|&i| tokens[i]).sum();
                    let sum = round_summary(p, &idx)?;
                    let j = noise::judge(&ladder, det.metric, sum.kl_mean, None, &det.rule)?;
                    tok_sum += rt;
                    texts_sum += idx.len();
                    since_r += 1;
                    since_t += rt;
                    kl.push(sum.kl_mean);
                    if j.unfaithful {
                        flags += 1;
                        ep_r.push(since_r as f64);
                        ep_t.push(since_t as f64);
                        since_r = 0;
                        since_t = 0;
                    }
                }
                let mean = |v: &[f64]| {
                    if v.is_empty() {
                        f64::NAN
                    } else {
                        v.iter().sum::<f64>() / v.len() as f64
                    }
                };
                a_rows.push(json!({
                "texts": variant, "text_count": subset.len(),
                "profile": p.name, "role": role(&p.name), "budget": b, "rounds": s.rounds,
                "flags": flags, "flag_rate": flags as f64 / s.rounds as f64,
                "wilson95": wilson(flags, s.rounds),
                "mean_tokens_per_round": tok_sum as f64 / s.rounds as f64,
                "mean_texts_per_round": texts_sum as f64 / s.rounds as f64,
                "kl_mean_of_rounds": {"mean": mean(&kl), "min": kl.iter().copied().fold(f64::INFINITY, f64::min),
                                      "max": kl.iter().copied().fold(f64::NEG_INFINITY, f64::max)},
                "detection_episodes": ep_r.len(),
                "mean_rounds_to_flag": mean(&ep_r),
                "mean_tokens_to_flag": mean(&ep_t),
            }));
            }
        }
    }
    eprintln!("A analysed in {:.1} s", t_a.elapsed().as_secs_f64());

    // ---- B: changed? after a switch, and in control
    let t_b = Instant::now();
    let keys: Vec<String> = det
        .cusum_statistics
        .iter()
        .filter(|k| ["kl_mean", "top1_same", "dlogprob_mean"].contains(&k.as_str()))
        .cloned()
        .collect();
    ensure!(keys.len() == 3, "unexpected CUSUM statistics {keys:?}");
    let key_pos: Vec<usize> = keys
        .iter()
        .map(|k| match k.as_str() {
            "kl_mean" => 0,
            "top1_same" => 1,
            _ => 2,
        })
        .collect();
    let by_name = |n: &str| profiles.iter().find(|p| p.name == n);
    let stats_of = |p: &ProfileData, idx: &[usize]| -> [f64; 3] {
        let f = fast_stats(p, idx);
        [f[key_pos[0]], f[key_pos[1]], f[key_pos[2]]]
    };
    // the fast sums are the summarize sums: check on some rounds of every profile
    let mut fast_checked = 0;
    for p in &profiles {
        for r in 0..50u64 {
            let idx = draw_round(&mut rng_for(s.seed, &[0xB0, r]), &tokens, s.switch_budget);
            let f = fast_stats(p, &idx);
            let sm = round_summary(p, &idx)?;
            ensure!(
                f[0].to_bits() == sm.kl_mean.to_bits()
                    && f[1].to_bits() == sm.top1_same.to_bits()
                    && f[2].to_bits() == sm.abs_dlogprob_mean.to_bits(),
                "fast stats differ from summarize for {}",
                p.name
            );
            fast_checked += 1;
        }
    }
    let window_rounds = |r: usize, offset: usize| -> Vec<usize> {
        // the scheduler's rotating window: items_per_round texts starting at round · count
        let n = tokens.len();
        let c = cfg.items_per_round.min(n);
        (0..c).map(|i| ((r + offset) * c + i) % n).collect()
    };
    // distinct start offsets of the rotating window
    let window_worlds = tokens
        .len()
        .div_ceil(cfg.items_per_round.clamp(1, tokens.len()));
    let mut b_rows = Vec::new();
    for (mode, worlds) in [("random", s.worlds), ("window", window_worlds)] {
        for p0n in ["reference", "a8"] {
            for p1n in ["w6", "w5", "w4"] {
                let (Some(p0), Some(p1)) = (by_name(p0n), by_name(p1n)) else {
                    continue;
                };
                let mut pre_alarms = 0usize;
                let mut pre_rounds = 0usize;
                let (mut delays, mut delay_tokens) = (Vec::new(), Vec::new());
                let mut undetected = 0;
                let mut round_tokens = 0i64;
                let mut round_count = 0usize;
                for w in 0..worlds {
                    let mut rng = rng_for(s.seed, &[0xB, w as u64]);
                    let (mut series, mut round_tok) = (Vec::new(), Vec::new());
                    for r in 0..s.switch_at + s.max_after {
                        let idx = if mode == "random" {
                            draw_round(&mut rng, &tokens, s.switch_budget)
                        } else {
                            window_rounds(r, w)
                        };
                        round_tok.push(idx.iter().map(|&i| tokens[i]).sum::<i64>());
                        let p = if r < s.switch_at { p0 } else { p1 };
                        series.push(stats_of(p, &idx));
                    }
                    let alarms = alarms_with_window(&det, &series, det.history_runs as usize)?;
                    let mut after_tokens = 0i64;
                    let mut found = false;
                    for (r, a) in alarms.iter().enumerate() {
                        let rt = round_tok[r];
                        round_tokens += rt;
                        round_count += 1;
                        let alarm = a.iter().any(|&x| x);
                        if r < s.switch_at {
                            if r >= det.cusum.baseline_rounds {
                                pre_rounds += 1;
                                pre_alarms += usize::from(alarm);
                            }
                            continue;
                        }
                        after_tokens += rt;
                        if alarm {
                            delays.push((r - s.switch_at + 1) as f64);
                            delay_tokens.push(after_tokens as f64);
                            found = true;
                            break;
                        }
                    }
                    if !found {
                        undetected += 1;
                    }
                }
                let within3 = delays.iter().filter(|&&d| d <= 3.0).count();
                b_rows.push(json!({
                    "rounds": mode, "p0": p0n, "p1": p1n, "worlds": worlds,
                    "mean_tokens_per_round": round_tokens as f64 / round_count.max(1) as f64,
                    "pre_switch_monitored_rounds": pre_rounds, "pre_switch_alarms": pre_alarms,
                    "pre_switch_alarm_rate": pre_alarms as f64 / pre_rounds.max(1) as f64,
                    "detected": delays.len(), "undetected_within": [undetected, s.max_after],
                    "delay_rounds_median": quantile(&delays, 0.5), "delay_rounds_p95": quantile(&delays, 0.95),
                    "delay_tokens_median": quantile(&delay_tokens, 0.5), "delay_tokens_p95": quantile(&delay_tokens, 0.95),
                    "detected_within_3_rounds": within3, "detected_within_3_share": within3 as f64 / worlds as f64,
                }));
            }
        }
    }
    // in control: a8 for ic_rounds rounds per world, charts as the detector rebuilds them
    let mut ic_rows = Vec::new();
    if let Some(a8) = by_name("a8") {
        for (mode, worlds) in [("random", s.worlds), ("window", window_worlds)] {
            let mut any = 0usize;
            let mut per_chart = [0usize; 3];
            let mut monitored = 0usize;
            let mut first_alarm = Vec::new();
            let mut no_alarm = 0usize;
            for w in 0..worlds {
                let mut rng = rng_for(s.seed, &[0x1C, w as u64]);
                let series: Vec<[f64; 3]> = (0..s.ic_rounds)
                    .map(|r| {
                        let idx = if mode == "random" {
                            draw_round(&mut rng, &tokens, s.switch_budget)
                        } else {
                            window_rounds(r, w)
                        };
                        stats_of(a8, &idx)
                    })
                    .collect();
                let alarms = alarms_with_window(&det, &series, det.history_runs as usize)?;
                let mut first = None;
                for (t, a) in alarms.iter().enumerate() {
                    if t < det.cusum.baseline_rounds {
                        continue;
                    }
                    monitored += 1;
                    for (c, &x) in a.iter().enumerate() {
                        per_chart[c] += usize::from(x);
                    }
                    if a.iter().any(|&x| x) {
                        any += 1;
                        first.get_or_insert(t + 1 - det.cusum.baseline_rounds);
                    }
                }
                match first {
                    Some(f) => first_alarm.push(f as f64),
                    None => no_alarm += 1,
                }
            }
            ic_rows.push(json!({
                "rounds": mode, "p0": "a8", "worlds": worlds, "rounds_per_world": s.ic_rounds,
                "history_runs": det.history_runs, "monitored_rounds": monitored,
                "alarm_rounds_any_chart": any, "alarm_rate_any_chart": any as f64 / monitored.max(1) as f64,
                "wilson95": wilson(any, monitored),
                "alarms_per_chart": keys.iter().zip(per_chart).map(|(k, n)| json!({"statistic": k, "alarms": n})).collect::<Vec<_>>(),
                "documented_arl0_per_chart": det.cusum.arl0(),
                "first_alarm_monitored_round_median": quantile(&first_alarm, 0.5),
                "worlds_without_alarm": no_alarm,
            }));
        }
    }
    eprintln!(
        "B analysed in {:.1} s ({fast_checked} fast rounds checked)",
        t_b.elapsed().as_secs_f64()
    );

    // ---- C: samples
    let t_c = Instant::now();
    let mut c_rows = Vec::new();
    if let Some(rf) = &ref_pool {
        let n_prompts = sets.completion_prompts.len();
        for (ti, ep) in pools.iter().enumerate() {
            let all = |_r: usize| (0..n_prompts).collect::<Vec<_>>();
            let two = |r: usize| {
                let c = cfg.items_per_round.min(n_prompts);
                (0..c).map(|i| (r * c + i) % n_prompts).collect::<Vec<_>>()
            };
            let tokens_round = |prompts: &[usize]| -> f64 {
                prompts
                    .iter()
                    .map(|&i| {
                        ep.prompt_tokens[i] + s.per_prompt as f64 * ep.completion_per_sample[i]
                    })
                    .sum()
            };
            let mut runs: Vec<(&str, usize, usize, Vec<f64>, f64)> = Vec::new();
            let t_all = tokens_round(&all(0));
            let p_all = samples_rounds(
                ep,
                rf,
                &s,
                s.sample_rounds,
                cfg.permutations,
                all,
                ti as u64,
            )?;
            runs.push(("all prompts", n_prompts, cfg.permutations, p_all, t_all));
            let t_two =
                (0..n_prompts).map(|r| tokens_round(&two(r))).sum::<f64>() / n_prompts as f64;
            let p_two = samples_rounds(
                ep,
                rf,
                &s,
                s.sample_rounds,
                cfg.permutations,
                two,
                100 + ti as u64,
            )?;
            runs.push((
                "default round",
                cfg.items_per_round,
                cfg.permutations,
                p_two,
                t_two,
            ));
            if s.hi_permutations > 0 {
                let p_hi = samples_rounds(
                    ep,
                    rf,
                    &s,
                    s.hi_rounds,
                    s.hi_permutations,
                    all,
                    200 + ti as u64,
                )?;
                runs.push(("all prompts", n_prompts, s.hi_permutations, p_hi, t_all));
            }
            for (label, np, perms, ps, t) in runs {
                let n = ps.len();
                let f05 = ps.iter().filter(|&&p| p < 0.05).count();
                let f001 = ps.iter().filter(|&&p| p < det.samples_alpha).count();
                c_rows.push(json!({
                    "endpoint": ep.name, "role": if ep.name == "reference" { "null (flag = false alarm)" } else { "power" },
                    "round": label, "prompts": np, "samples_per_prompt": s.per_prompt, "pool": s.pool,
                    "permutations": perms, "min_p": 1.0 / (perms + 1) as f64, "rounds": n,
                    "flag_rate_alpha_0.05": f05 as f64 / n as f64, "wilson95_0.05": wilson(f05, n), "flags_0.05": f05,
                    "samples_alpha": det.samples_alpha,
                    "flag_rate_samples_alpha": f001 as f64 / n as f64, "wilson95_samples_alpha": wilson(f001, n), "flags_samples_alpha": f001,
                    "median_p": quantile(&ps, 0.5), "mean_tokens_per_round": t,
                }));
            }
        }
    }
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
        "settings": {
            "seed": s.seed, "only_b": s.only_b, "profiles": s.profiles, "budgets": s.budgets, "rounds": s.rounds,
            "verify": s.verify, "worlds": s.worlds, "switch_budget": s.switch_budget, "switch_at": s.switch_at,
            "max_after": s.max_after, "ic_rounds": s.ic_rounds, "pool": s.pool, "sample_profiles": s.sample_profiles,
            "sample_rounds": s.sample_rounds, "samples_per_prompt": s.per_prompt,
            "hi_permutations": s.hi_permutations, "hi_rounds": s.hi_rounds,
            "items_per_round_default": cfg.items_per_round, "permutations_default": cfg.permutations,
            "top_k": cfg.top_k, "level": det.rule.level, "metric": det.metric, "threshold": threshold,
            "cusum": det.cusum, "cusum_arl0": det.cusum.arl0(), "cusum_statistics": keys,
            "cusum_baseline_correction": det.cusum_baseline_correction,
            "cusum_chart_h": detect::changed_chart_config(&det, det.cusum.min_sd)?.h,
            "history_runs": det.history_runs,
        },
        "texts": {"count": tokens.len(), "tokens": tokens, "total_tokens": tokens.iter().sum::<i64>(),
                  "ids": sets.logprob_texts.iter().map(|t| t.id.clone()).collect::<Vec<_>>(),
                  "not_exact_on_the_exact_endpoint": inexact_ids},
        "profiles": profiles.iter().map(|p| json!({
            "profile": p.name, "positions": p.all.count, "kl_mean_all_texts": p.all.kl_mean,
            "top1_same_all_texts": p.all.top1_same, "dlogprob_mean_all_texts": p.all.abs_dlogprob_mean,
            "verified_rounds": p.verified.0, "verify_rounds": p.verified.1,
            "per_text_decode_exact": p.decode_exact,
        })).collect::<Vec<_>>(),
        "faithful": a_rows, "changed": b_rows, "in_control": ic_rows, "samples": c_rows,
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
