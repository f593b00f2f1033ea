//! long_context: a needle sentence (a passphrase) hidden at a depth inside filler text, then
//! a question about it, at doubling lengths from the template's start up to the context
//! window (the configured one, capped by the reference's). The endpoint answers greedily
//! through `/v1/chat/completions`; a length passes when the answer contains the value. The
//! rounds stop at the first failure; the longest passing length is the endpoint's effective
//! context. Lengths are reached by sizing the filler with the reference tokenizer.

use serde_json::{Map, Value, json};

use super::{Outcome, ProbeCtx, Target, call, usage_tokens};

/// Room left for the chat template and the answer.
const ANSWER_ROOM: u32 = 64;

/// Runs one long_context probe.
pub async fn run(ctx: &ProbeCtx<'_>, target: &Target) -> Outcome {
    let t = &ctx.sets.needle;
    let window = match ctx.reference.context_window() {
        Some(w) => ctx
            .cfg
            .context_window
            .min(u32::try_from(w).unwrap_or(u32::MAX)),
        None => ctx.cfg.context_window,
    };
    let window = window.saturating_sub(ANSWER_ROOM + ctx.cfg.max_tokens.min(32));
    let value = &t.values[(ctx.round as usize) % t.values.len()];
    let depth = t.depths[(ctx.round as usize) % t.depths.len()];
    // tokens per filler sentence, measured once per run with the reference tokenizer
    let cycle = t.filler.join(" ");
    let per_sentence = match ctx.reference.tokenize(&cycle, false).await {
        Ok(ids) => (ids.len() as f64 / t.filler.len() as f64).max(1.0),
        Err(e) => return Outcome::failed(format!("reference failed: {e}"), 0),
    };
    let mut tokens = 0i64;
    let mut passed = Vec::new();
    let mut effective = 0u32;
    let mut failed_at = None;
    for len in t.lengths(window) {
        let fixed = 40.0; // needle + question
        let sentences = (((f64::from(len) - fixed) / per_sentence).floor() as usize).max(1);
        let prompt = match t.build(sentences, depth, value) {
            Ok(p) => p,
            Err(e) => return Outcome::failed(e.to_string(), tokens),
        };
        let body = json!({"model": target.provider_model, "messages": [{"role": "user", "content": prompt.prompt}],
                          "temperature": 0.0, "max_tokens": ctx.cfg.max_tokens.min(32), "seed": ctx.seed});
        let answer = match call(ctx, target, "/chat/completions", &body).await {
            Ok(v) => v,
            Err(e) if e.status.is_some_and(|s| (400..500).contains(&s)) => {
                // a context-length refusal ends the ladder; it is the endpoint's limit
                failed_at = Some(json!({"length": len, "refused": e.message}));
                break;
            }
            Err(e) => return Outcome::failed(e.message, tokens),
        };
        tokens += usage_tokens(&answer);
        let content = answer
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let ok = content.contains(&prompt.expected);
        passed.push(json!({"length": len, "passed": ok}));
        if !ok {
            failed_at = Some(json!({"length": len}));
            break;
        }
        effective = len;
    }
    let mut stats = Map::new();
    stats.insert("effective_context".into(), json!(effective));
    stats.insert("window".into(), json!(window));
    stats.insert("depth".into(), json!(depth));
    stats.insert("lengths".into(), Value::Array(passed));
    stats.insert("failed_at".into(), failed_at.unwrap_or(Value::Null));
    Outcome::done(tokens, stats)
}
