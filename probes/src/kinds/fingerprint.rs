//! fingerprint: the endpoint's own echo logprobs on fixed texts, for changed? without the
//! weights. Every round sends the same texts (the model's first `items_per_round` logprob
//! texts, never a rotating window, so that any two rounds are comparable) as
//! prompt_logprobs sends its texts ([`super::prompt_logprobs::echo`]: `echo`, `logprobs: k`,
//! `max_tokens` 0, or 1 where 0 is refused), and reduces what comes back to statistics that
//! the changed? charts follow from the endpoint's own first runs:
//! - `own_logprob_mean`: the mean logprob of the texts' tokens (the positions that have one);
//! - `own_top1_logprob_mean`: the mean logprob of each position's most likely alternative
//!   (its confidence; the positions with alternatives);
//! - `own_top1_agreement`: the share of those positions whose echoed token is the most
//!   likely alternative (order-sensitive: logprobs shifted against their tokens keep every
//!   mean above and collapse this);
//! - `own_tokens`: how many prompt tokens the endpoint echoed for the texts (a different
//!   tokenizer or a cut prompt moves it by whole tokens).
//!
//! Nothing is compared with a reference, so the kind runs where `[probes.reference]` is not
//! configured, faithful? never judges it, and it keeps no per-position data (no noise-floor
//! pairs: an endpoint's spread between rounds is measured by its baseline runs, and the
//! charts' floor is `fingerprint_min_sd`).

use serde_json::{Map, json};

use super::prompt_logprobs::{echo, parse_echo};
use super::{Outcome, ProbeCtx, Target, usage_tokens};

/// Runs one fingerprint probe.
pub async fn run(ctx: &ProbeCtx<'_>, target: &Target) -> Outcome {
    let texts = super::window(&ctx.sets.logprob_texts, 0, ctx.cfg.items_per_round);
    let k = ctx.cfg.top_k as usize;
    let mut tokens = 0i64;
    let (mut lp_sum, mut lp_n) = (0.0f64, 0usize);
    let (mut top1_sum, mut top1_n, mut agree) = (0.0f64, 0usize, 0usize);
    let mut echoed = 0usize;
    let mut per_text = Vec::with_capacity(texts.len());
    for t in &texts {
        let answer = match echo(ctx, target, &t.text, k).await {
            Ok(v) => v,
            Err(reason) => return Outcome::failed(reason, tokens),
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
        echoed += ep.len();
        let (mut text_sum, mut text_n) = (0.0f64, 0usize);
        for (p, has) in &ep {
            if *has {
                text_sum += p.logprob;
                text_n += 1;
            }
            // the first of equally likely alternatives, as the endpoint listed them
            if let Some((best, lp)) = p.top.iter().reduce(|a, b| if b.1 > a.1 { b } else { a }) {
                top1_sum += lp;
                top1_n += 1;
                agree += usize::from(best.text == p.token.text);
            }
        }
        lp_sum += text_sum;
        lp_n += text_n;
        per_text.push(json!({
            "id": t.id,
            "tokens": ep.len(),
            "logprob_mean": (text_n > 0).then(|| text_sum / text_n as f64),
        }));
    }
    if lp_n == 0 {
        return Outcome::failed(
            "the endpoint echoed no token with a logprob (refused or unsupported)",
            tokens,
        );
    }
    let mut stats = Map::new();
    stats.insert("texts".into(), json!(per_text));
    stats.insert("top_k".into(), json!(k));
    stats.insert("own_tokens".into(), json!(echoed));
    stats.insert("positions".into(), json!(lp_n));
    stats.insert("own_logprob_mean".into(), json!(lp_sum / lp_n as f64));
    if top1_n > 0 {
        stats.insert(
            "own_top1_logprob_mean".into(),
            json!(top1_sum / top1_n as f64),
        );
        stats.insert(
            "own_top1_agreement".into(),
            json!(agree as f64 / top1_n as f64),
        );
    }
    Outcome::done(tokens, stats)
}
