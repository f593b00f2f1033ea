//! Part C of the benchmark, the samples probe: pools of samples per completion prompt from an
//! endpoint and from the reference, and seeded rounds drawn from them.

use super::*;

/// A pool of samples per prompt, with the probe tokens spent.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub(crate) name: String,
    pub(crate) samples: Vec<Vec<String>>,
    /// Per prompt: prompt tokens of one request, mean completion tokens per sample.
    pub(crate) prompt_tokens: Vec<f64>,
    pub(crate) completion_per_sample: Vec<f64>,
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
    })
}

/// Part C rounds of one scenario: p-values of `rounds` seeded rounds over `prompts` (indices
/// of the prompts each round uses, by round).
pub(crate) fn samples_rounds(
    ep: &Pool,
    rf: &Pool,
    s: &Settings,
    rounds: usize,
    permutations: usize,
    prompts_of: impl Fn(usize) -> Vec<usize>,
    tag: u64,
) -> Result<Vec<f64>> {
    let mut ps = Vec::with_capacity(rounds);
    for r in 0..rounds {
        let mut rng = rng_for(s.seed, &[0xC, tag, r as u64]);
        let mut round = Vec::new();
        for pi in prompts_of(r) {
            let pick = |pool: &[String], rng: &mut StdRng| -> Vec<String> {
                rand::seq::index::sample(rng, pool.len(), s.per_prompt.min(pool.len()))
                    .into_iter()
                    .map(|i| pool[i].clone())
                    .collect()
            };
            let endpoint = pick(&ep.samples[pi], &mut rng);
            let reference = pick(&rf.samples[pi], &mut rng);
            round.push(PromptSamples {
                endpoint,
                reference,
            });
        }
        let cfg = PermutationConfig {
            permutations,
            seed: rng.random(),
        };
        ps.push(mmd_test(&round, &cfg)?.p_value);
    }
    Ok(ps)
}
