//! long_context: the multi-query needle task of `samewise-longctx` (the evals'
//! `long_context` suite uses the same items and scoring) at doubling lengths from
//! [`START_TOKENS`] up to the context window (the configured one, capped by the
//! reference's), one haystack per length sized with the reference tokenizer, ⌊L/64⌋ keys
//! (2..=16) hidden at stratified seeded depths, each asked in turn.
//!
//! Scoring is by likelihood on both sides: per length, the true answers and
//! [`DISTRACTORS`] same-form distractor answers go to the endpoint in one
//! `/v1/completions` request (`echo`, `logprobs`, `max_tokens: 0`) and to the reference as
//! in-process scores of the same texts; a query passes when its true number beats every
//! distractor by the margin (ln 20). An endpoint that refuses logprobs (a 4xx) is judged by
//! greedy generation instead, and so is the reference, so both sides are always judged
//! alike. A length is *below* the reference when the endpoint passed
//! max(2, ⌈n/4⌉) fewer of its n queries ([`context::below_reference`]); the endpoint's
//! `effective_context` is the longest length with no length up to it below, the
//! reference's (`reference_effective_context`) the longest with the reference passing
//! RULER's 85.6% at every length up to it. The detector flags an endpoint one doubling or
//! more below the reference (`crate::detect`).
//!
//! Cost per round (window 1024: lengths 256, 512, 1024): 3 prompts × ≈ 1,800 tokens ≈ 5,400
//! endpoint prompt tokens, and the same scored by the reference (memoized across the
//! round's endpoints, whose items are the same).

use samewise_longctx::task::{Draft, Group, Settings, lengths};
use samewise_longctx::{TaskKind, context, score};
use serde_json::{Map, Value, json};

use super::{Outcome, ProbeCtx, Target, call, diagnose, usage_tokens};
use crate::reference::{Reference, SampleRequest};

/// The shortest length tried (tokens).
pub const START_TOKENS: u32 = 256;
/// Distractor answers per query.
pub const DISTRACTORS: usize = 2;

/// How one side's answers were judged at one length.
struct Side {
    passed: usize,
    kept_tokens: Option<usize>,
    truncated: bool,
    /// Where the dropped part began (characters of the prompt), when one part was dropped.
    dropped_at: Option<usize>,
}

/// Runs one long_context probe.
pub async fn run(ctx: &ProbeCtx<'_>, backend: &dyn Reference, target: &Target) -> Outcome {
    let window = match backend.context_window() {
        Some(w) => ctx
            .cfg
            .context_window
            .min(u32::try_from(w).unwrap_or(u32::MAX)),
        None => ctx.cfg.context_window,
    };
    let settings = Settings {
        tasks: vec![TaskKind::MultiQuery],
        start_tokens: START_TOKENS.min(window),
        window,
        distractors: DISTRACTORS,
        digits: 5,
        seed: ctx.seed,
    };
    let groups = match build(ctx, backend, &settings).await {
        Ok(g) => g,
        Err(e) => return Outcome::failed(e, 0),
    };
    let margin = score::DEFAULT_MARGIN;
    let mut tokens = 0i64;
    let mut generation = false;
    let mut per_length = Vec::new();
    let mut cuts = Vec::new();
    let (mut good, mut ref_good) = (Vec::new(), Vec::new());
    for g in &groups {
        let n = g.queries.len();
        let endpoint = loop {
            match endpoint_side(ctx, target, g, generation, margin).await {
                Ok((side, t)) => {
                    tokens += t;
                    break side;
                }
                Err(Failure::Refused(m)) if !generation => {
                    tracing::info!(endpoint = %target.endpoint, refusal = %m, "long_context: logprobs refused; scoring by generation");
                    generation = true;
                }
                Err(Failure::Refused(m) | Failure::Other(m)) => {
                    return Outcome::failed(m, tokens);
                }
            }
        };
        let reference = match reference_side(backend, ctx.seed, g, generation, margin).await {
            Ok(s) => s,
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let below = context::below_reference(endpoint.passed, reference.passed, n);
        good.push(!below);
        ref_good.push(n > 0 && reference.passed as f64 / n as f64 >= context::RULER_THRESHOLD);
        if let (true, Some(kept)) = (endpoint.truncated, endpoint.kept_tokens) {
            cuts.push(diagnose::Cut {
                length: g.length,
                prompt_tokens: g.tokens,
                kept_tokens: kept,
                dropped_at: endpoint.dropped_at,
            });
        }
        per_length.push(json!({
            "length": g.length,
            "prompt_tokens": g.tokens,
            "queries": n,
            "passed": endpoint.passed,
            "reference_passed": reference.passed,
            "below": below,
            "kept_tokens": endpoint.kept_tokens,
            "truncated": endpoint.truncated,
            "dropped_at": endpoint.dropped_at,
        }));
    }
    let lens = lengths(settings.start_tokens, window);
    let effective = context::effective_context(&lens, &good);
    let mut stats = Map::new();
    stats.insert("effective_context".into(), json!(effective));
    stats.insert(
        "reference_effective_context".into(),
        json!(context::effective_context(&lens, &ref_good)),
    );
    stats.insert("window".into(), json!(window));
    stats.insert(
        "scoring".into(),
        json!(if generation {
            "generation"
        } else {
            "likelihood"
        }),
    );
    stats.insert("distractors".into(), json!(DISTRACTORS));
    stats.insert("margin".into(), json!(margin));
    stats.insert(
        "failed_at".into(),
        per_length
            .iter()
            .find(|l| l["below"] == true)
            .map_or(Value::Null, |l| l["length"].clone()),
    );
    stats.insert("lengths".into(), Value::Array(per_length));
    if let Some(d) = diagnose::prompt_truncated(&cuts) {
        stats.insert("diagnosis".into(), d);
    }
    Outcome::done(tokens, stats)
}

/// The round's groups, sized with the reference tokenizer.
async fn build(
    ctx: &ProbeCtx<'_>,
    backend: &dyn Reference,
    settings: &Settings,
) -> Result<Vec<Group>, String> {
    let draft = Draft::new(&ctx.sets.haystack, settings).map_err(|e| e.to_string())?;
    let mut counts = std::collections::HashMap::new();
    for t in draft.texts() {
        let n = backend
            .tokenize(&t, false)
            .await
            .map_err(|e| format!("reference failed: {e}"))?
            .len();
        counts.insert(t, n);
    }
    draft
        .build(|t| counts.get(t).copied())
        .map_err(|e| e.to_string())
}

enum Failure {
    /// A 4xx: the endpoint refuses the request as asked.
    Refused(String),
    Other(String),
}

/// The endpoint's answers to `g`, and the tokens spent.
async fn endpoint_side(
    ctx: &ProbeCtx<'_>,
    target: &Target,
    g: &Group,
    generation: bool,
    margin: f64,
) -> Result<(Side, i64), Failure> {
    let mut body = if generation {
        score::generation_body(g)
    } else {
        score::likelihood_body(g)
    };
    body["model"] = json!(target.provider_model);
    let answer = match call(ctx, target, "/completions", &body).await {
        Ok(v) => v,
        Err(e)
            if e.status
                .is_some_and(|s| (400..500).contains(&s) && s != 429) =>
        {
            return Err(Failure::Refused(e.message));
        }
        Err(e) => return Err(Failure::Other(e.message)),
    };
    let spent = usage_tokens(&answer);
    let side = if generation {
        let texts =
            score::read_generation(g, &answer).map_err(|e| Failure::Other(e.to_string()))?;
        Side {
            passed: g
                .queries
                .iter()
                .zip(&texts)
                .filter(|(q, t)| score::string_match_all(t, &q.expected))
                .count(),
            kept_tokens: None,
            truncated: false,
            dropped_at: None,
        }
    } else {
        let echoed =
            score::read_likelihood(g, &answer).map_err(|e| Failure::Other(e.to_string()))?;
        let scores: Vec<Vec<Option<f64>>> = echoed.iter().map(|e| e.answers.clone()).collect();
        let first = echoed.first();
        Side {
            passed: score::rank_group(&scores, g.queries.len(), margin)
                .iter()
                .filter(|r| r.passed)
                .count(),
            kept_tokens: first.map(|e| e.kept_tokens),
            truncated: first.is_some_and(score::Echoed::truncated),
            dropped_at: first.and_then(|e| e.dropped_at),
        }
    };
    Ok((side, spent))
}

/// The reference's answers to `g`: its own scores of the same texts (or greedy answers).
async fn reference_side(
    backend: &dyn Reference,
    seed: u64,
    g: &Group,
    generation: bool,
    margin: f64,
) -> crate::Result<Side> {
    let vocab = backend.vocab();
    if generation {
        let mut passed = 0;
        for (p, q) in g.generation_prompts().iter().zip(&g.queries) {
            let ids = backend.tokenize(p, true).await?;
            let out = backend
                .sample(&SampleRequest {
                    prompt: ids,
                    n: 1,
                    max_tokens: g.generation_max_tokens() as usize,
                    temperature: 0.0,
                    seed,
                })
                .await?;
            if out
                .first()
                .is_some_and(|s| score::string_match_all(&s.text, &q.expected))
            {
                passed += 1;
            }
        }
        return Ok(Side {
            passed,
            kept_tokens: None,
            truncated: false,
            dropped_at: None,
        });
    }
    // every candidate in one call: they share the haystack, which the engine computes once
    let mut prompts = Vec::with_capacity(g.candidates());
    let mut all_ids = Vec::with_capacity(g.candidates());
    for c in 0..g.candidates() {
        let (text, spans) = g.candidate_prompt(c);
        all_ids.push(backend.tokenize(&text, true).await?);
        prompts.push((text, spans));
    }
    let all_scored = backend.score_many(&all_ids, 0).await?;
    let mut scores = Vec::with_capacity(g.candidates());
    for (((text, spans), ids), scored) in prompts.iter().zip(&all_ids).zip(all_scored) {
        // byte offsets of the tokens in the text they decode to
        let mut offsets = Vec::with_capacity(ids.len());
        let mut at = 0usize;
        for id in ids {
            offsets.push(at);
            at += vocab.token_bytes(*id).len();
        }
        // special tokens the tokenizer added at the start (a BOS with a text) are no part
        // of the text: offsets count from the text's first byte
        let extra = at.saturating_sub(text.len());
        for o in &mut offsets {
            *o = o.saturating_sub(extra);
        }
        let logprobs: Vec<Option<f64>> = scored.iter().map(|p| p.logprob).collect();
        scores.push(score::span_sums(
            &offsets,
            &logprobs,
            at - extra,
            text.len(),
            spans,
        ));
    }
    Ok(Side {
        passed: score::rank_group(&scores, g.queries.len(), margin)
            .iter()
            .filter(|r| r.passed)
            .count(),
        kept_tokens: None,
        truncated: false,
        dropped_at: None,
    })
}
