//! The `long_context` suite: RULER-style tasks from `samewise-longctx` (the probes' long
//! context probe uses the same items and scoring), one haystack per task and length, sized
//! with the model's own tokenizer (`/tokenize` of the reference, else of the baseline) at
//! doubling lengths up to the window (`[evals.long_context] window`, a job's `window`
//! param, default the model's `max_model_len`).
//!
//! Scoring: by likelihood where both sides return echo logprobs — a group's candidate
//! prompts (true answers, then each distractor in every slot) in one `/v1/completions`
//! request; an item passes when its true answer beats every distractor by the margin — and
//! by generation (greedy, `string_match_all`) when either side refuses logprobs, so both
//! sides are always judged alike. A failed item's error type says why: `truncated` (the
//! endpoint's echo shows it dropped the prompt's start, needle included), `outranked` (a
//! distractor within the margin), `unscored`, `not_found` (generation), `request_error`.
//!
//! The verdict is the job's usual paired verdict over all items ([`crate::stats::decide`]);
//! beside it, per length: each side's pass rate with its Wilson interval and McNemar's exact
//! p; the suspect's effective context — the longest length L such that no length up to L is
//! significantly below the baseline (fewer passes, p < α) — and RULER's fixed 85.6% rule
//! for each side. An "equivalent" pooled verdict with some length significantly below
//! becomes "inconclusive".

use futures_util::StreamExt;
use samewise_longctx::task::{Draft, Group, Haystack, Query, Settings};
use samewise_longctx::{context, score};
use samewise_store::EvalResult;
use serde_json::{Map, Value, json};

use crate::EvalsError;
use crate::config::LongContextConfig;
use crate::report::paired;
use crate::stats::{VerdictParams, mcnemar_exact, wilson};
use crate::target::{Target, Targets};

/// How answers are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// Echo logprobs: the true answer against the distractors.
    Likelihood,
    /// Greedy answers containing every expected string.
    Generation,
}

impl Scoring {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scoring::Likelihood => "likelihood",
            Scoring::Generation => "generation",
        }
    }

    /// The scoring a stored result was judged by.
    pub fn of(r: &EvalResult) -> Option<Scoring> {
        match r.record["scoring"].as_str()? {
            "likelihood" => Some(Scoring::Likelihood),
            "generation" => Some(Scoring::Generation),
            _ => None,
        }
    }
}

/// A job's items.
#[derive(Debug, Clone)]
pub struct Suite {
    /// Groups, task by task, lengths ascending within a task.
    pub groups: Vec<Group>,
    /// The lengths.
    pub lengths: Vec<u32>,
    /// The settings after the job's params.
    pub config: LongContextConfig,
    /// The window used.
    pub window: u32,
    /// The seed (the job's id unless its params name one), so a resumed job rebuilds the
    /// same items.
    pub seed: u64,
    /// Whose tokenizer sized the haystacks.
    pub tokenizer: String,
}

impl Suite {
    /// Item ids in order.
    pub fn order(&self) -> Vec<String> {
        self.groups
            .iter()
            .flat_map(|g| g.queries.iter().map(|q| q.id.clone()))
            .collect()
    }

    /// Group counts at which each task's sweep over the lengths ends (where a look may be
    /// taken without judging some lengths only).
    pub fn task_ends(&self) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for (i, g) in self.groups.iter().enumerate() {
            if self.groups.get(i + 1).is_none_or(|n| n.task != g.task) {
                out.push(i + 1);
            }
        }
        out
    }
}

/// Token count (and the model's window, when the endpoint says) of `text` by `t`'s
/// `/tokenize` (vLLM's shape, which the engine serves).
async fn count(
    targets: &Targets,
    t: &Target,
    text: &str,
) -> Result<(usize, Option<u32>), EvalsError> {
    let a = targets
        .post_root(
            t,
            "tokenize",
            json!({"prompt": text, "add_special_tokens": false}),
        )
        .await?;
    let n = a.body["count"]
        .as_u64()
        .or_else(|| a.body["tokens"].as_array().map(|v| v.len() as u64))
        .ok_or_else(|| {
            EvalsError::BadAnswer(format!("{}: /tokenize answered without a count", t.label))
        })?;
    let window = a.body["max_model_len"]
        .as_u64()
        .and_then(|w| u32::try_from(w).ok());
    Ok((usize::try_from(n).unwrap_or(usize::MAX), window))
}

/// Builds the job's items with `tokenizer`'s token counts.
pub async fn prepare(
    targets: &Targets,
    tokenizer: &Target,
    cfg: &LongContextConfig,
    seed: u64,
) -> Result<Suite, EvalsError> {
    let (_, model_window) = count(targets, tokenizer, "window").await?;
    let window = match (cfg.window, model_window) {
        (Some(w), Some(m)) => w.min(m),
        (Some(w), None) => w,
        (None, Some(m)) => m,
        (None, None) => {
            return Err(EvalsError::Suite(format!(
                "long_context: {} does not report max_model_len; set evals.long_context.window",
                tokenizer.label
            )));
        }
    };
    let settings = Settings {
        tasks: cfg.tasks.clone(),
        start_tokens: cfg.start_tokens.min(window),
        window,
        distractors: cfg.distractors,
        digits: 5,
        seed,
    };
    let haystack = Haystack::builtin().map_err(|e| EvalsError::Suite(e.to_string()))?;
    let draft = Draft::new(&haystack, &settings).map_err(|e| EvalsError::Suite(e.to_string()))?;
    let texts = draft.texts();
    // futures gathered first: a stream over a borrowing iterator is not provably Send
    let mut futs = Vec::with_capacity(texts.len());
    for t in &texts {
        futs.push(count(targets, tokenizer, t));
    }
    let counted: Vec<Result<(usize, Option<u32>), EvalsError>> =
        futures_util::stream::iter(futs).buffered(8).collect().await;
    let mut counts = std::collections::HashMap::with_capacity(texts.len());
    for (t, c) in texts.iter().zip(counted) {
        counts.insert(t.as_str(), c?.0);
    }
    let groups = draft
        .build(|t| counts.get(t).copied())
        .map_err(|e| EvalsError::Suite(e.to_string()))?;
    Ok(Suite {
        groups,
        lengths: samewise_longctx::task::lengths(settings.start_tokens, window),
        config: cfg.clone(),
        window,
        seed,
        tokenizer: tokenizer.label.clone(),
    })
}

fn request_summary(g: &Group, scoring: Scoring, seed: u64) -> Value {
    let tail: String = {
        let n = g.prompt.chars().count();
        g.prompt.chars().skip(n.saturating_sub(160)).collect()
    };
    json!({
        "path": "/v1/completions",
        "group": g.id,
        "task": g.task.as_str(),
        "length": g.length,
        "prompt_tokens": g.tokens,
        "prompts": if scoring == Scoring::Likelihood { g.candidates() } else { g.queries.len() },
        "scoring": scoring.as_str(),
        "seed": seed,
        "prompt_tail": tail,
    })
}

/// Splits a request's tokens over its items (the remainder on the first).
fn shares(total: i64, n: usize) -> Vec<i64> {
    let n_i = i64::try_from(n.max(1)).unwrap_or(1);
    (0..n)
        .map(|i| total / n_i + if i == 0 { total % n_i } else { 0 })
        .collect()
}

/// Every item of `g` failed with `error` (a request that failed).
pub fn failed_group(
    g: &Group,
    t: &Target,
    role: &str,
    scoring: Scoring,
    seed: u64,
    error: &str,
) -> Vec<EvalResult> {
    g.queries
        .iter()
        .map(|q| EvalResult {
            item: q.id.clone(),
            target: role.to_owned(),
            passed: false,
            error_type: Some("request_error".into()),
            tokens: 0,
            record: json!({
                "request": request_summary(g, scoring, seed),
                "endpoint": t.label,
                "scoring": scoring.as_str(),
                "task": g.task.as_str(),
                "length": g.length,
                "depth": q.depth,
                "answer": Value::Null,
                "check": {"passed": false, "error_type": "request_error", "detail": error},
            }),
        })
        .collect()
}

/// Runs group `g` on `t` as `role`: its items' results, or the request's error (the caller
/// tells a refusal of logprobs from a failure).
pub async fn run_group(
    targets: &Targets,
    t: &Target,
    role: &str,
    g: &Group,
    scoring: Scoring,
    margin: f64,
    seed: u64,
) -> Result<Vec<EvalResult>, EvalsError> {
    let body = match scoring {
        Scoring::Likelihood => score::likelihood_body(g),
        Scoring::Generation => score::generation_body(g),
    };
    let a = targets.post(t, "completions", body).await?;
    let tokens = shares(a.tokens, g.queries.len());
    let bad = |source: samewise_longctx::LongctxError| EvalsError::LongContext {
        label: t.label.clone(),
        source,
    };
    let mut out = Vec::with_capacity(g.queries.len());
    // what every item's record holds, whichever the scoring, in this key order
    let base = |q: &Query| -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("request".into(), request_summary(g, scoring, seed));
        m.insert("endpoint".into(), json!(t.label));
        m.insert("scoring".into(), json!(scoring.as_str()));
        m.insert("task".into(), json!(g.task.as_str()));
        m.insert("length".into(), json!(g.length));
        m.insert("depth".into(), json!(q.depth));
        m
    };
    // the item's result: the record closed by its check
    let result = |q: &Query,
                  i: usize,
                  passed: bool,
                  error: Option<&str>,
                  detail: Option<String>,
                  mut record: Map<String, Value>| {
        record.insert(
            "check".into(),
            json!({"passed": passed, "error_type": error, "detail": detail}),
        );
        EvalResult {
            item: q.id.clone(),
            target: role.to_owned(),
            passed,
            error_type: error.map(str::to_owned),
            tokens: tokens.get(i).copied().unwrap_or(0),
            record: Value::Object(record),
        }
    };
    match scoring {
        Scoring::Likelihood => {
            let echoed = score::read_likelihood(g, &a.body).map_err(bad)?;
            let scores: Vec<Vec<Option<f64>>> = echoed.iter().map(|e| e.answers.clone()).collect();
            let ranked = score::rank_group(&scores, g.queries.len(), margin);
            let truth = echoed.first();
            let cut = truth.map_or(0, |e| e.sent_chars - e.kept_chars);
            for (i, (q, r)) in g.queries.iter().zip(&ranked).enumerate() {
                // the shallowest of the answer's needles, in characters of the prompt
                let needle = q
                    .expected
                    .iter()
                    .filter_map(|e| g.prompt.find(e.as_str()))
                    .min()
                    .map(|b| g.prompt[..b].chars().count());
                let error = if r.passed {
                    None
                } else if needle.is_some_and(|n| n < cut) {
                    Some("truncated")
                } else if r.margin.is_none() {
                    Some("unscored")
                } else {
                    Some("outranked")
                };
                let detail = error.map(|e| match e {
                    "truncated" => format!("the endpoint kept the last {} of {} prompt characters; the needle was at {}", truth.map_or(0, |e| e.kept_chars), truth.map_or(0, |e| e.sent_chars), needle.unwrap_or(0)),
                    "outranked" => format!("true answer {:.2} nats above the best distractor (margin {margin:.2})", r.margin.unwrap_or(f64::NAN)),
                    _ => "the answer's tokens have no logprobs in the echo".to_owned(),
                });
                let mut record = base(q);
                record.insert(
                    "candidates".into(),
                    json!(
                        std::iter::once(&q.answer)
                            .chain(&q.distractors)
                            .collect::<Vec<_>>()
                    ),
                );
                record.insert("answer".into(), json!({
                    "logprobs": scores.iter().map(|s| s.get(i).copied().flatten()).collect::<Vec<_>>(),
                    "margin": r.margin.filter(|m| m.is_finite()),
                    "rank": r.rank,
                    "kept_tokens": truth.map(|e| e.kept_tokens),
                    "truncated": truth.is_some_and(score::Echoed::truncated),
                }));
                out.push(result(q, i, r.passed, error, detail, record));
            }
        }
        Scoring::Generation => {
            let answers = score::read_generation(g, &a.body).map_err(bad)?;
            for (i, (q, text)) in g.queries.iter().zip(&answers).enumerate() {
                let passed = score::string_match_all(text, &q.expected);
                let error = (!passed).then_some("not_found");
                let mut record = base(q);
                record.insert(
                    "answer".into(),
                    json!({"text": text, "expected": q.expected}),
                );
                let detail = error.map(|_| format!("expected all of {:?}", q.expected));
                out.push(result(q, i, passed, error, detail, record));
            }
        }
    }
    Ok(out)
}

/// Whether an error is an endpoint refusing the request as asked (a 4xx, e.g. logprobs).
pub fn is_refusal(e: &EvalsError) -> bool {
    matches!(e, EvalsError::Status { status, .. } if (400..500).contains(status) && *status != 429)
}

fn side(k: u64, n: u64) -> Value {
    json!({"passed": k, "n": n, "rate": (n > 0).then(|| k as f64 / n as f64),
           "wilson95": wilson(k, n, 0.95).map(|(a, b)| [a, b])})
}

/// The per-length analysis of a job's results: the suite's extras, and whether some length
/// is significantly below the baseline.
pub fn analyze(
    suite: &Suite,
    results: &[EvalResult],
    params: &VerdictParams,
    scoring: Scoring,
) -> (Value, bool) {
    let mut per_length = Vec::new();
    let mut good = Vec::new();
    let mut ruler_s = Vec::new();
    let mut ruler_b = Vec::new();
    for &len in &suite.lengths {
        let order: Vec<String> = suite
            .groups
            .iter()
            .filter(|g| g.length == len)
            .flat_map(|g| g.queries.iter().map(|q| q.id.clone()))
            .collect();
        let t = paired(&order, results);
        let n = t.n();
        let p = mcnemar_exact(t.baseline_only, t.suspect_only);
        let below = t.baseline_only > t.suspect_only && p < params.alpha;
        good.push(!below && n > 0);
        let rate = |k: u64| if n > 0 { k as f64 / n as f64 } else { 0.0 };
        ruler_s.push(n > 0 && rate(t.suspect_pass()) >= context::RULER_THRESHOLD);
        ruler_b.push(n > 0 && rate(t.baseline_pass()) >= context::RULER_THRESHOLD);
        per_length.push(json!({
            "length": len,
            "items": n,
            "suspect": side(t.suspect_pass(), n),
            "baseline": side(t.baseline_pass(), n),
            "suspect_only": t.suspect_only,
            "baseline_only": t.baseline_only,
            "p_value": p,
            "below": below,
        }));
    }
    let below_any = good
        .iter()
        .zip(&per_length)
        .any(|(g, l)| !g && l["items"].as_u64().unwrap_or(0) > 0);
    let extras = json!({
        "scoring": scoring.as_str(),
        "window": suite.window,
        "lengths": suite.lengths,
        "tasks": suite.config.tasks.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
        "distractors": suite.config.distractors,
        "margin": suite.config.margin,
        "seed": suite.seed,
        "tokenizer": suite.tokenizer,
        "effective_context": context::effective_context(&suite.lengths, &good),
        "effective_context_rule": format!("longest L with no length ≤ L significantly below the baseline (fewer passes, McNemar exact p < {})", params.alpha),
        "ruler_effective_context": {
            "suspect": context::effective_context(&suite.lengths, &ruler_s),
            "baseline": context::effective_context(&suite.lengths, &ruler_b),
            "threshold": context::RULER_THRESHOLD,
        },
        "per_length": per_length,
    });
    (extras, below_any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use samewise_longctx::TaskKind;

    fn result(item: &str, role: &str, passed: bool) -> EvalResult {
        EvalResult {
            item: item.into(),
            target: role.into(),
            passed,
            error_type: None,
            tokens: 1,
            record: json!({"scoring": "likelihood"}),
        }
    }

    #[test]
    fn analysis_finds_the_first_length_below_and_rulers_rule() {
        let h = Haystack::builtin().unwrap_or_else(|e| panic!("{e}"));
        let s = Settings {
            tasks: vec![TaskKind::MultiQuery],
            window: 1024,
            ..Settings::default()
        };
        let groups = Draft::new(&h, &s)
            .and_then(|d| d.build(|t| Some(t.split_whitespace().count())))
            .unwrap_or_else(|e| panic!("{e}"));
        let suite = Suite {
            groups,
            lengths: vec![256, 512, 1024],
            config: LongContextConfig::default(),
            window: 1024,
            seed: 0,
            tokenizer: "reference".into(),
        };
        assert_eq!(suite.task_ends(), vec![3]);
        // the suspect loses 10 of the 16 items at 1024; everything else passes on both
        let mut rs = Vec::new();
        for g in &suite.groups {
            for (i, q) in g.queries.iter().enumerate() {
                rs.push(result(&q.id, "baseline", true));
                rs.push(result(&q.id, "suspect", !(g.length == 1024 && i < 10)));
            }
        }
        let params = VerdictParams::default();
        let (x, below) = analyze(&suite, &rs, &params, Scoring::Likelihood);
        assert!(below);
        assert_eq!(x["effective_context"], 512);
        assert_eq!(x["ruler_effective_context"]["suspect"], 512);
        assert_eq!(x["ruler_effective_context"]["baseline"], 1024);
        assert_eq!(x["per_length"][2]["baseline_only"], 10);
        // nothing lost: the window
        for r in rs.iter_mut() {
            r.passed = true;
        }
        let (x, below) = analyze(&suite, &rs, &params, Scoring::Likelihood);
        assert!(!below && x["effective_context"] == 1024);
        assert_eq!(shares(10, 3), vec![4, 3, 3]);
        assert_eq!(Scoring::of(&rs[0]), Some(Scoring::Likelihood));
        assert!(is_refusal(&EvalsError::Status {
            status: 400,
            message: String::new()
        }));
        assert!(!is_refusal(&EvalsError::Status {
            status: 429,
            message: String::new()
        }));
        assert!(!is_refusal(&EvalsError::BadAnswer(String::new())));
    }
}
