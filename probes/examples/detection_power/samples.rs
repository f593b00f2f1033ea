//! Part C of the benchmark, the samples probe: pools of samples per completion prompt from an
//! endpoint and from the reference, each sample scored once by the reference (its mean
//! per-token log-likelihood, `reference::mean_loglik`, as the kind scores it), and seeded
//! rounds drawn from them, judged by both of the kind's tests and the detector's Bonferroni
//! p-value over them (`mmd::samples_p_value`). Pools are written to `$OUT/pools.json`;
//! `POOLS_FROM=that file` re-analyses them without generating again.

use super::*;

/// A pool of samples per prompt, with the probe tokens spent.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Pool {
    pub(crate) name: String,
    pub(crate) samples: Vec<Vec<String>>,
    /// Per prompt: prompt tokens of one request, mean completion tokens per sample.
    pub(crate) prompt_tokens: Vec<f64>,
    pub(crate) completion_per_sample: Vec<f64>,
    /// Per prompt and sample: the reference's mean per-token log-likelihood of the sample
    /// (None for one of no tokens); empty until [`score_pool`].
    #[serde(default)]
    pub(crate) loglik: Vec<Vec<Option<f64>>>,
}

/// Scores every sample of `pool` with the reference, as the kind scores a round's samples.
pub(crate) async fn score_pool(
    reference: &dyn Reference,
    prompts: &[CompletionPrompt],
    pool: &mut Pool,
) -> Result<()> {
    let t0 = Instant::now();
    let jobs = prompts
        .iter()
        .zip(&pool.samples)
        .map(|(p, texts)| async move {
            let messages = vec![json!({"role": "user", "content": p.prompt})];
            let prompt = reference.render_chat(&messages, None).await?;
            let mut out = Vec::with_capacity(texts.len());
            for t in texts {
                out.push(mean_loglik(reference, &prompt, t).await?);
            }
            Ok::<_, anyhow::Error>(out)
        });
    let results: Vec<Result<Vec<Option<f64>>>> =
        futures_util::stream::iter(jobs).buffered(4).collect().await;
    pool.loglik = results.into_iter().collect::<Result<Vec<_>>>()?;
    eprintln!(
        "C pool {} scored by the reference in {:.1} s",
        pool.name,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `POOL` samples per prompt from an endpoint, asked as `kinds/samples.rs` asks (`n` = the
/// probe's `samples_per_prompt` per request: the engine server takes `n` ≤ 16).
pub(crate) async fn endpoint_pool(
    http: &reqwest::Client,
    target: &Target,
    prompts: &[CompletionPrompt],
    cfg: &ModelProbes,
    pool: usize,
) -> Result<Pool> {
    let t0 = Instant::now();
    let url = format!("{}/chat/completions", target.base_url);
    let jobs = prompts.iter().map(|p| {
        let url = url.clone();
        async move {
            let messages = vec![json!({"role": "user", "content": p.prompt})];
            let max_tokens = p.max_tokens.min(cfg.max_tokens);
            let mut got: Vec<String> = Vec::with_capacity(pool);
            let (mut pt, mut ct, mut requests) = (0i64, 0i64, 0);
            while got.len() < pool {
                let body = json!({"model": target.provider_model, "messages": messages, "temperature": 1.0, "top_p": 1.0,
                                  "n": (pool - got.len()).min(cfg.samples_per_prompt), "max_tokens": max_tokens});
                let bytes = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&body)?)
                    .send()
                    .await?
                    .error_for_status()?
                    .bytes()
                    .await?;
                let v: Value = serde_json::from_slice(&bytes)?;
                requests += 1;
                pt += v.pointer("/usage/prompt_tokens").and_then(Value::as_i64).unwrap_or(0);
                ct += v.pointer("/usage/completion_tokens").and_then(Value::as_i64).unwrap_or(0);
                let texts: Vec<String> = v
                    .get("choices")
                    .and_then(Value::as_array)
                    .map(|cs| {
                        cs.iter()
                            .filter_map(|c| c.pointer("/message/content").and_then(Value::as_str))
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                ensure!(!texts.is_empty(), "{}: no samples for {}", target.endpoint, p.id);
                got.extend(texts);
            }
            got.truncate(pool);
            Ok::<_, anyhow::Error>((got, pt as f64 / requests as f64, ct as f64 / pool as f64))
        }
    });
    let results: Vec<Result<(Vec<String>, f64, f64)>> =
        futures_util::stream::iter(jobs).buffered(4).collect().await;
    let mut out = Pool {
        name: target.endpoint.clone(),
        samples: Vec::new(),
        prompt_tokens: Vec::new(),
        completion_per_sample: Vec::new(),
        loglik: Vec::new(),
    };
    for r in results {
        let (s, pt, cps) = r?;
        out.samples.push(s);
        out.prompt_tokens.push(pt);
        out.completion_per_sample.push(cps);
    }
    eprintln!(
        "C pool {}: {} × {pool} samples in {:.1} s",
        out.name,
        prompts.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(out)
}

/// `POOL` reference samples per prompt, as `kinds/samples.rs` draws them.
pub(crate) async fn reference_pool(
    reference: &dyn Reference,
    prompts: &[CompletionPrompt],
    cfg: &ModelProbes,
    pool: usize,
    seed: u64,
) -> Result<Pool> {
    let t0 = Instant::now();
    let jobs = prompts.iter().enumerate().map(|(pi, p)| async move {
        let messages = vec![json!({"role": "user", "content": p.prompt})];
        let prompt = reference.render_chat(&messages, None).await?;
        let req = SampleRequest {
            prompt,
            n: pool,
            max_tokens: p.max_tokens.min(cfg.max_tokens) as usize,
            temperature: 1.0,
            seed: seed.wrapping_add((pi as u64) << 32),
        };
        let s = reference.sample(&req).await?;
        Ok::<_, anyhow::Error>(s.into_iter().map(|s| s.text).collect::<Vec<_>>())
    });
    let results: Vec<Result<Vec<String>>> =
        futures_util::stream::iter(jobs).buffered(4).collect().await;
    let samples = results.into_iter().collect::<Result<Vec<_>>>()?;
    eprintln!(
        "C pool reference (in-process): {} × {pool} samples in {:.1} s",
        prompts.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(Pool {
        name: "reference sampler".into(),
        samples,
        prompt_tokens: Vec::new(),
        completion_per_sample: Vec::new(),
        loglik: Vec::new(),
    })
}

/// One round's p-values: the MMD's and the log-likelihood test's (None when no prompt had
/// a scored sample on both sides).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoundP {
    pub(crate) mmd: f64,
    pub(crate) loglik: Option<f64>,
}

impl RoundP {
    /// The detector's p-value over both tests.
    pub(crate) fn combined(&self) -> f64 {
        samples_p_value(self.mmd, self.loglik).0
    }
}

/// Part C rounds of one scenario: `rounds` seeded rounds of `per_prompt` samples per side and
/// prompt over `prompts_of(round)` (indices of the prompts each round uses), both tests run as
/// `kinds/samples.rs` runs them (one permutation seed for both).
pub(crate) fn samples_rounds(
    ep: &Pool,
    rf: &Pool,
    s: &Settings,
    (rounds, per_prompt, permutations): (usize, usize, usize),
    prompts_of: impl Fn(usize) -> Vec<usize>,
    tag: u64,
) -> Result<Vec<RoundP>> {
    let mut ps = Vec::with_capacity(rounds);
    for r in 0..rounds {
        let mut rng = rng_for(s.seed, &[0xC, tag, r as u64]);
        let mut texts = Vec::new();
        let mut logliks = Vec::new();
        for pi in prompts_of(r) {
            let pick = |pool: &Pool, rng: &mut StdRng| -> Vec<usize> {
                let n = pool.samples[pi].len();
                rand::seq::index::sample(rng, n, per_prompt.min(n)).into_vec()
            };
            let (ei, ri) = (pick(ep, &mut rng), pick(rf, &mut rng));
            let strings = |pool: &Pool, idx: &[usize]| -> Vec<String> {
                idx.iter().map(|&i| pool.samples[pi][i].clone()).collect()
            };
            let scored = |pool: &Pool, idx: &[usize]| -> Vec<f64> {
                idx.iter().filter_map(|&i| pool.loglik[pi][i]).collect()
            };
            let ll = PromptLoglik {
                endpoint: scored(ep, &ei),
                reference: scored(rf, &ri),
            };
            if !ll.endpoint.is_empty() && !ll.reference.is_empty() {
                logliks.push(ll);
            }
            texts.push(PromptSamples {
                endpoint: strings(ep, &ei),
                reference: strings(rf, &ri),
            });
        }
        let cfg = PermutationConfig {
            permutations,
            seed: rng.random(),
        };
        ps.push(RoundP {
            mmd: mmd_test(&texts, &cfg)?.p_value,
            loglik: if logliks.is_empty() {
                None
            } else {
                Some(loglik_test(&logliks, &cfg)?.p_value)
            },
        });
    }
    Ok(ps)
}

/// `VERIFY_C` rounds of the real samples kind on `target` with the product's defaults (the
/// scheduler's rotating window, fresh samples on both sides, a seed per round), each judged
/// by the detector's p-value over both tests: the check on the pools' resampling.
pub(crate) async fn samples_real_rounds(
    env: &Env<'_>,
    target: &Target,
    s: &Settings,
) -> Result<Value> {
    let t0 = Instant::now();
    let alpha = DetectorConfig::default().samples_alpha;
    let mut rounds = Vec::with_capacity(s.verify_c);
    for round in 0..s.verify_c {
        let ctx = ProbeCtx {
            reference: Some(env.reference),
            cfg: env.cfg,
            sets: env.sets,
            http: env.http,
            round: round as u64,
            seed: mix(s.seed, 0x5A11_0000 + round as u64),
            echo_refusals: None,
        };
        let o = kinds::run(ProbeKind::Samples, &ctx, target).await;
        ensure!(o.ok, "{}: samples failed: {:?}", target.endpoint, o.error);
        let p_mmd = o.stats["p_value"].as_f64().context("p_value")?;
        let p_ll = o.stats["loglik_p_value"].as_f64();
        let p = samples_p_value(p_mmd, p_ll).0;
        eprintln!(
            "C real round {round} on {}: p {p:.4} (MMD {p_mmd:.4}, loglik {p_ll:?}), {} tokens",
            target.endpoint, o.tokens
        );
        rounds.push(
            json!({"round": round, "p": p, "p_mmd": p_mmd, "p_loglik": p_ll, "tokens": o.tokens}),
        );
    }
    let flags = rounds
        .iter()
        .filter(|r| r["p"].as_f64().is_some_and(|p| p < alpha))
        .count();
    let tokens = rounds
        .iter()
        .filter_map(|r| r["tokens"].as_f64())
        .sum::<f64>()
        / s.verify_c as f64;
    Ok(json!({
        "endpoint": target.endpoint, "rounds": s.verify_c, "flags": flags, "samples_alpha": alpha,
        "prompts": env.cfg.samples_prompts_per_round, "samples_per_prompt": env.cfg.samples_per_prompt,
        "mean_tokens_per_round": tokens, "seconds": t0.elapsed().as_secs_f64(), "per_round": rounds,
    }))
}
