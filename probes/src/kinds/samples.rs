//! samples, for endpoints without logprobs: per prompt of the round, n samples at
//! temperature 1 from the endpoint (`/v1/chat/completions`) and from the reference, then
//! MMD with a Hamming kernel over the first 1,000 characters with a within-prompt
//! permutation p-value (Model Equality Testing), and the permutation test on the
//! reference's mean per-token log-likelihood of each side's samples.

use serde_json::{Map, Value, json};

use super::{Outcome, ProbeCtx, Target, call, usage_tokens, window};
use crate::mmd::{PermutationConfig, PromptLoglik, PromptSamples, loglik_test, mmd_test};
use crate::reference::{Reference, SampleRequest, mean_loglik};

/// Runs one samples probe.
pub async fn run(ctx: &ProbeCtx<'_>, backend: &dyn Reference, target: &Target) -> Outcome {
    let prompts = window(
        &ctx.sets.completion_prompts,
        ctx.round,
        ctx.cfg.samples_prompts_per_round,
    );
    let n = ctx.cfg.samples_per_prompt;
    let mut tokens = 0i64;
    let mut texts = Vec::new();
    let mut logliks = Vec::new();
    for (pi, p) in prompts.iter().enumerate() {
        let messages = vec![json!({"role": "user", "content": p.prompt})];
        let max_tokens = p.max_tokens.min(ctx.cfg.max_tokens);
        let mut endpoint = Vec::with_capacity(n);
        // some providers cap or ignore `n` (ask again for what is missing), some refuse a
        // large one (halve it and ask again)
        let mut ask = n;
        while endpoint.len() < n {
            let want = (n - endpoint.len()).min(ask);
            let body = json!({"model": target.provider_model, "messages": messages, "temperature": 1.0, "top_p": 1.0,
                              "n": want, "max_tokens": max_tokens});
            let answer = match call(ctx, target, "/chat/completions", &body).await {
                Ok(v) => v,
                Err(e) if want > 1 && matches!(e.status, Some(400 | 422)) => {
                    ask = want / 2;
                    continue;
                }
                Err(e) => return Outcome::failed(e.message, tokens),
            };
            tokens += usage_tokens(&answer);
            let got: Vec<String> = answer
                .get("choices")
                .and_then(Value::as_array)
                .map(|cs| {
                    cs.iter()
                        .filter_map(|c| {
                            c.pointer("/message/content")
                                .and_then(Value::as_str)
                                .map(str::to_owned)
                        })
                        .collect()
                })
                .unwrap_or_default();
            if got.is_empty() {
                return Outcome::failed("the endpoint returned no samples", tokens);
            }
            endpoint.extend(got);
        }
        endpoint.truncate(n);
        let prompt_ids = match backend.render_chat(&messages, None).await {
            Ok(ids) => ids,
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let req = SampleRequest {
            prompt: prompt_ids.clone(),
            n,
            max_tokens: max_tokens as usize,
            temperature: 1.0,
            seed: ctx.seed.wrapping_add((pi as u64) << 32),
        };
        let reference: Vec<String> = match backend.sample(&req).await {
            Ok(s) => s.into_iter().map(|s| s.text).collect(),
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let mut ll = PromptLoglik {
            endpoint: Vec::new(),
            reference: Vec::new(),
        };
        for (side, list) in [
            (&mut ll.endpoint, &endpoint),
            (&mut ll.reference, &reference),
        ] {
            for s in list {
                match mean_loglik(backend, &prompt_ids, s).await {
                    Ok(Some(v)) => side.push(v),
                    Ok(None) => {}
                    Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
                }
            }
        }
        if !ll.endpoint.is_empty() && !ll.reference.is_empty() {
            logliks.push(ll);
        }
        texts.push(PromptSamples {
            endpoint,
            reference,
        });
    }
    let cfg = PermutationConfig {
        permutations: ctx.cfg.permutations,
        seed: ctx.seed,
    };
    let mmd = match mmd_test(&texts, &cfg) {
        Ok(r) => r,
        Err(e) => return Outcome::failed(format!("MMD test: {e}"), tokens),
    };
    let mut stats = Map::new();
    stats.insert(
        "prompts".into(),
        json!(prompts.iter().map(|p| p.id.clone()).collect::<Vec<_>>()),
    );
    stats.insert("samples_per_prompt".into(), json!(n));
    stats.insert("mmd".into(), json!(mmd.statistic));
    stats.insert("p_value".into(), json!(mmd.p_value));
    if !logliks.is_empty() {
        match loglik_test(&logliks, &cfg) {
            Ok(r) => {
                stats.insert("loglik_diff".into(), json!(r.statistic));
                stats.insert("loglik_p_value".into(), json!(r.p_value));
            }
            Err(e) => return Outcome::failed(format!("log-likelihood test: {e}"), tokens),
        }
    }
    let lens: Vec<usize> = texts
        .iter()
        .flat_map(|t| t.endpoint.iter().map(|s| s.chars().count()))
        .collect();
    stats.insert(
        "output_chars_mean".into(),
        json!(if lens.is_empty() {
            0.0
        } else {
            lens.iter().sum::<usize>() as f64 / lens.len() as f64
        }),
    );
    Outcome::done(tokens, stats)
}
