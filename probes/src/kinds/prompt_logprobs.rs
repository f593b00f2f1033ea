//! prompt_logprobs: each text of the round is sent to the endpoint's `/v1/completions` with
//! `echo: true`, `logprobs: k` and `max_tokens: 0` (retried with 1 where a server refuses
//! 0; generated positions are then dropped by their text offset). The endpoint's tokens are
//! aligned to reference ids ([`crate::align`]), the reference scores the aligned sequence,
//! and every position both sides scored is compared ([`crate::compare`]).

use serde_json::{Map, Value, json};

use super::diagnose::{self, ShiftSearch};
use super::{
    EpPosition, Outcome, ProbeCtx, Target, call, insert_alignment_stats, logprob_outcome,
    positions, usage_tokens, window,
};
use crate::align::{AlignMethod, EndpointToken, align_to_text};
use crate::reference::http::HttpFailure;
use crate::reference::{Reference, norm};

/// Runs one prompt_logprobs probe.
pub async fn run(ctx: &ProbeCtx<'_>, backend: &dyn Reference, target: &Target) -> Outcome {
    let texts = window(&ctx.sets.logprob_texts, ctx.round, ctx.cfg.items_per_round);
    let vocab = backend.vocab();
    let k = ctx.cfg.top_k as usize;
    let mut tokens = 0i64;
    let mut inputs = Vec::new();
    let mut unmappable = 0usize;
    let mut endpoint_tokens = 0usize;
    let mut dropped_alternatives = 0usize;
    let mut method = AlignMethod::Direct;
    let mut ids = Vec::new();
    let mut shifts = ShiftSearch::default();
    // the most alternatives any position carried, and how many positions carried any
    let (mut most_top, mut with_top) = (0usize, 0usize);
    for t in &texts {
        let answer = match echo(ctx, target, &t.text, k).await {
            Ok(v) => v,
            Err(f) => return Outcome::failed(f.message, tokens),
        };
        tokens += usage_tokens(&answer);
        let Some(ep) = parse_echo(&answer, &t.text, k) else {
            return Outcome::failed(
                "the endpoint returned no prompt logprobs for echo + logprobs (refused or unsupported)",
                tokens,
            );
        };
        if ep.is_empty() {
            return Outcome::failed("the endpoint echoed no prompt tokens", tokens);
        }
        // position 0 has no logprob and is not compared, but its token is part of the sequence
        let mut all_tokens: Vec<EndpointToken> = Vec::with_capacity(ep.len());
        all_tokens.extend(ep.iter().map(|(tok, _)| tok.token.clone()));
        let alignment = align_to_text(&all_tokens, &t.text, vocab.as_ref());
        endpoint_tokens += all_tokens.len();
        unmappable += alignment.unmappable;
        if alignment.method == AlignMethod::Retokenized {
            method = AlignMethod::Retokenized;
        }
        let scored = match backend.score(&alignment.reference_ids, k).await {
            Ok(s) => s,
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let eps: Vec<EpPosition> = ep
            .into_iter()
            .map(|(p, has)| {
                if has {
                    p
                } else {
                    EpPosition {
                        top: Vec::new(),
                        ..p
                    }
                }
            })
            .collect();
        for p in eps.iter().filter(|p| !p.top.is_empty()) {
            most_top = most_top.max(diagnose::top_returned(p));
            with_top += 1;
        }
        let map = |i: usize| alignment.ref_index.get(i).copied().flatten();
        let (mut pos, d) = positions(&eps, &scored, 0, map, vocab.as_ref());
        shifts.add(&eps, &scored, map, vocab.as_ref());
        dropped_alternatives += d;
        inputs.append(&mut pos);
        ids.push(t.id.clone());
    }
    let mut extra = Map::new();
    extra.insert("texts".into(), json!(ids));
    insert_alignment_stats(&mut extra, endpoint_tokens, unmappable);
    extra.insert("unmapped_alternatives".into(), json!(dropped_alternatives));
    extra.insert("align".into(), json!(method));
    extra.insert("top_k".into(), json!(k));
    if let Some(d) = shifts
        .diagnose(&inputs)
        .or_else(|| diagnose::different_model(&inputs))
        .or_else(|| diagnose::top_logprobs_capped(most_top, k, with_top))
    {
        extra.insert("diagnosis".into(), d);
    }
    logprob_outcome(&inputs, tokens, extra)
}

/// The endpoint's answer to `text` sent to `/v1/completions` with `echo`, `logprobs: k`,
/// `max_tokens: 0` and temperature 0; where the endpoint refuses 0 (400 or 422), once more
/// with `max_tokens: 1` (`parse_echo` drops the generated token).
pub(super) async fn echo(
    ctx: &ProbeCtx<'_>,
    target: &Target,
    text: &str,
    k: usize,
) -> Result<Value, EchoFailure> {
    let mut body = json!({"model": target.provider_model, "prompt": text, "echo": true, "logprobs": k, "max_tokens": 0, "temperature": 0.0});
    match call(ctx, target, "/completions", &body).await {
        Ok(v) => Ok(v),
        Err(e) if refusal(&e) => {
            body["max_tokens"] = json!(1);
            call(ctx, target, "/completions", &body)
                .await
                .map_err(|e| EchoFailure {
                    refused: refusal(&e),
                    message: format!("echo logprobs refused: {e}"),
                })
        }
        Err(e) => Err(EchoFailure {
            refused: false,
            message: e.message,
        }),
    }
}

/// Why an echo request got no answer to read.
pub(super) struct EchoFailure {
    /// The endpoint refused the request as asked (400, 404 or 422): another way of asking
    /// may work, asking again will not.
    pub refused: bool,
    /// Why, for the run's error.
    pub message: String,
}

/// Whether a failed request was refused as asked (an endpoint without `/v1/completions`
/// answers 404).
fn refusal(e: &HttpFailure) -> bool {
    matches!(e.status, Some(400 | 404 | 422))
}

/// The echoed prompt positions of a legacy completions answer: (position, whether it has a
/// logprob). None when the answer carries no logprobs at all. Generated tokens (the
/// `max_tokens: 1` fallback) are dropped: the answer's first `usage.prompt_tokens` tokens are
/// the prompt; without usage, tokens whose `text_offset` is at or past the prompt's length
/// (servers count offsets differently around partial characters, so usage comes first).
pub(super) fn parse_echo(
    answer: &Value,
    prompt: &str,
    k: usize,
) -> Option<Vec<(EpPosition, bool)>> {
    let lp = answer
        .pointer("/choices/0/logprobs")
        .filter(|v| !v.is_null())?;
    let tokens = lp.get("tokens")?.as_array()?;
    let token_logprobs = lp.get("token_logprobs")?.as_array()?;
    let tops = lp.get("top_logprobs").and_then(Value::as_array);
    let offsets = lp.get("text_offset").and_then(Value::as_array);
    if token_logprobs.len() != tokens.len() || token_logprobs.iter().all(Value::is_null) {
        return None;
    }
    let prompt_chars = prompt.chars().count() as u64;
    let prompt_tokens = answer
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n >= 1 && n <= tokens.len());
    let mut out = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        // generated tokens (max_tokens 1 fallback) come after the prompt's
        let generated = match prompt_tokens {
            Some(n) => i >= n,
            None => {
                i > 0
                    && offsets
                        .and_then(|o| o.get(i))
                        .and_then(Value::as_u64)
                        .is_some_and(|off| off >= prompt_chars)
            }
        };
        if generated {
            break;
        }
        let text = t.as_str()?.to_owned();
        // read at f32 precision, as in `chat_positions`
        let lp = token_logprobs[i].as_f64().map(norm);
        let mut top: Vec<(EndpointToken, f64)> = tops
            .and_then(|ts| ts.get(i))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((EndpointToken::text(k.clone()), norm(v.as_f64()?))))
                    .collect()
            })
            .unwrap_or_default();
        // OpenAI and vLLM add the actual token to the k alternatives when it is not among
        // them; that extra entry is not part of the top-k (with a tie at the k-th place it
        // could otherwise displace a true top-k entry)
        if top.len() > k {
            top.retain(|(t, _)| t.text != text);
        }
        out.push((
            EpPosition {
                token: EndpointToken::text(text),
                logprob: lp.unwrap_or(0.0),
                top,
            },
            lp.is_some(),
        ));
    }
    Some(out)
}
