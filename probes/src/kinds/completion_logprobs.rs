//! completion_logprobs: each prompt of the round goes to the endpoint's
//! `/v1/chat/completions` at temperature 0 with `logprobs` + `top_logprobs` (frequency and
//! presence penalties set to 0, so nothing reshapes the distribution). The reference renders
//! the same chat with its own template and re-scores the endpoint's tokens under teacher
//! forcing; positions are compared as in prompt_logprobs. Output lengths are recorded.

use serde_json::{Map, json};

use super::diagnose;
use super::{
    Outcome, ProbeCtx, Target, call, chat_positions, insert_alignment_stats, logprob_outcome,
    positions, usage_tokens, window,
};
use crate::align::{AlignMethod, EndpointToken, align};
use crate::reference::Reference;

/// Runs one completion_logprobs probe.
pub async fn run(ctx: &ProbeCtx<'_>, backend: &dyn Reference, target: &Target) -> Outcome {
    let prompts = window(
        &ctx.sets.completion_prompts,
        ctx.round,
        ctx.cfg.items_per_round,
    );
    let vocab = backend.vocab();
    let k = ctx.cfg.top_k as usize;
    let mut tokens = 0i64;
    let mut inputs = Vec::new();
    let mut unmappable = 0usize;
    let mut generated = 0usize;
    let mut dropped = 0usize;
    let mut lengths = Vec::new();
    let mut method = AlignMethod::Direct;
    // (endpoint usage.prompt_tokens, reference rendered count) per prompt
    let mut prompt_counts = Vec::new();
    // every generated position, for the signatures read from the endpoint's own logprobs
    let mut all_generated = Vec::new();
    for p in &prompts {
        let messages = vec![json!({"role": "user", "content": p.prompt})];
        let max_tokens = p.max_tokens.min(ctx.cfg.max_tokens);
        let body = json!({"model": target.provider_model, "messages": messages, "temperature": 0.0, "max_tokens": max_tokens,
                          "logprobs": true, "top_logprobs": k, "frequency_penalty": 0.0, "presence_penalty": 0.0, "seed": ctx.seed});
        let answer = match call(ctx, target, "/chat/completions", &body).await {
            Ok(v) => v,
            Err(e) => return Outcome::failed(e.message, tokens),
        };
        tokens += usage_tokens(&answer);
        let content = answer
            .pointer("/choices/0/logprobs/content")
            .and_then(|c| c.as_array());
        let Some(ep) = content.and_then(|c| chat_positions(c)) else {
            return Outcome::failed(
                "the endpoint returned no completion logprobs (logprobs refused or unsupported)",
                tokens,
            );
        };
        lengths.push(ep.len());
        if ep.is_empty() {
            continue;
        }
        let prompt_ids = match backend.render_chat(&messages, None).await {
            Ok(ids) => ids,
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        if let Some(n) = answer
            .pointer("/usage/prompt_tokens")
            .and_then(|v| v.as_i64())
        {
            prompt_counts.push((n, prompt_ids.len() as i64));
        }
        let toks: Vec<EndpointToken> = ep.iter().map(|p| p.token.clone()).collect();
        all_generated.extend(ep.iter().cloned());
        let alignment = align(&toks, vocab.as_ref());
        generated += toks.len();
        unmappable += alignment.unmappable;
        if alignment.method == AlignMethod::Retokenized {
            method = AlignMethod::Retokenized;
        }
        let mut seq = prompt_ids.clone();
        seq.extend_from_slice(&alignment.reference_ids);
        let scored = match backend.score(&seq, k).await {
            Ok(s) => s,
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let (mut pos, d) = positions(
            &ep,
            &scored,
            prompt_ids.len(),
            |i| alignment.ref_index.get(i).copied().flatten(),
            vocab.as_ref(),
        );
        dropped += d;
        inputs.append(&mut pos);
    }
    let mut extra = Map::new();
    extra.insert(
        "prompts".into(),
        json!(prompts.iter().map(|p| p.id.clone()).collect::<Vec<_>>()),
    );
    insert_alignment_stats(&mut extra, generated, unmappable);
    extra.insert("unmapped_alternatives".into(), json!(dropped));
    extra.insert("align".into(), json!(method));
    extra.insert("output_lengths".into(), json!(lengths));
    extra.insert(
        "output_length_mean".into(),
        json!(if lengths.is_empty() {
            0.0
        } else {
            lengths.iter().sum::<usize>() as f64 / lengths.len() as f64
        }),
    );
    extra.insert("top_k".into(), json!(k));
    let with_top = all_generated.iter().filter(|p| !p.top.is_empty());
    let most_top = with_top
        .clone()
        .map(diagnose::top_returned)
        .max()
        .unwrap_or(0);
    if let Some(d) = diagnose::sampling_ignored(&all_generated)
        .or_else(|| diagnose::prompt_tokens_differ(&prompt_counts))
        .or_else(|| diagnose::top_logprobs_capped(most_top, k, with_top.count()))
    {
        extra.insert("diagnosis".into(), d);
    }
    logprob_outcome(&inputs, tokens, extra)
}
