//! The verdict document of a job, computed from its stored results (so a resumed job's
//! verdict counts every item once, whoever wrote it): per side, the pass rate with its
//! Wilson 95% interval and failures by bucket; the paired table, McNemar's p-value, the
//! difference and its interval; the verdict and its parameters; suite extras.

use std::collections::BTreeMap;

use samewise_store::EvalResult;
use serde_json::{Value, json};

use crate::stats::{Decision, Paired, VerdictParams, wilson};

/// The paired table over items answered by both sides, in `order` (item ids).
pub fn paired(order: &[String], results: &[EvalResult]) -> Paired {
    table(order, results, |r| Some(r.passed))
}

/// The paired table of the calls' schema validity ([`crate::tool_calls::schema_valid`]) over
/// items in `order` that offered tools and on which both sides answered with calls.
pub fn schema_paired(order: &[String], results: &[EvalResult]) -> Paired {
    table(order, results, |r| {
        crate::tool_calls::schema_valid(&r.record)
    })
}

/// The paired table of `outcome` over items in `order` where both sides have one.
fn table(
    order: &[String],
    results: &[EvalResult],
    outcome: impl Fn(&EvalResult) -> Option<bool>,
) -> Paired {
    let mut by: BTreeMap<(&str, &str), bool> = BTreeMap::new();
    for r in results {
        if let Some(v) = outcome(r) {
            by.insert((r.item.as_str(), r.target.as_str()), v);
        }
    }
    let mut t = Paired::default();
    for id in order {
        if let (Some(s), Some(b)) = (
            by.get(&(id.as_str(), "suspect")),
            by.get(&(id.as_str(), "baseline")),
        ) {
            t.add(*s, *b);
        }
    }
    t
}

/// The verdict document's block for the co-primary schema-validity table.
pub fn schema_block(t: &Paired, d: &Decision) -> Value {
    let n = t.n();
    json!({
        "verdict": d.verdict.as_str(),
        "items": n,
        "suspect": {"valid": t.suspect_pass(), "rate": (n > 0).then(|| t.suspect_pass() as f64 / n as f64)},
        "baseline": {"valid": t.baseline_pass(), "rate": (n > 0).then(|| t.baseline_pass() as f64 / n as f64)},
        "paired": t.to_json(),
        "diff": d.diff,
        "diff_interval": d.diff_interval.map(|(a, b)| [a, b]),
        "p_value": d.p_value,
        "alpha_at_look": d.look_alpha,
        "rule": "co-primary with the check: degraded when both tables are below the look's alpha, or either below half of it (Hochberg)",
    })
}

fn side(k: u64, n: u64, results: &[EvalResult], role: &str) -> Value {
    let mut buckets: BTreeMap<&str, u64> = BTreeMap::new();
    for r in results.iter().filter(|r| r.target == role) {
        if let Some(e) = &r.error_type {
            *buckets.entry(e.as_str()).or_default() += 1;
        }
    }
    json!({
        "passed": k,
        "n": n,
        "rate": (n > 0).then(|| k as f64 / n as f64),
        "wilson95": wilson(k, n, 0.95).map(|(a, b)| [a, b]),
        "failures": buckets,
    })
}

/// Where a job stopped and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    /// Looks taken.
    pub looks_done: u32,
    /// "decided" | "all_items" | "budget".
    pub reason: &'static str,
    /// Items in the suite.
    pub items_total: usize,
    /// Wall time of this run of the job, milliseconds.
    pub wall_ms: i64,
}

/// The verdict document.
pub fn document(
    suite: &str,
    t: &Paired,
    d: &Decision,
    params: &VerdictParams,
    results: &[EvalResult],
    stop: &Stop,
    extras: Value,
) -> Value {
    let n = t.n();
    json!({
        "suite": suite,
        "verdict": d.verdict.as_str(),
        "items": n,
        "items_total": stop.items_total,
        "suspect": side(t.suspect_pass(), n, results, "suspect"),
        "baseline": side(t.baseline_pass(), n, results, "baseline"),
        "paired": t.to_json(),
        "diff": d.diff,
        "diff_interval": d.diff_interval.map(|(a, b)| [a, b]),
        "diff_interval_level": d.interval_level,
        "p_value": d.p_value,
        "params": {
            "delta": params.delta,
            "alpha": params.alpha,
            "looks": params.looks,
            "alpha_at_look": d.look_alpha,
            "test": "McNemar exact, two-sided; Agresti-Min interval; O'Brien-Fleming-type alpha spending over looks (union bound)",
        },
        "looks_done": stop.looks_done,
        "stopped": stop.reason,
        "tokens": results.iter().map(|r| r.tokens).sum::<i64>(),
        "wall_ms": stop.wall_ms,
        "extras": extras,
    })
}
