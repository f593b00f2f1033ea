//! The vendor-verifier metrics (Moonshot's K2-Vendor-Verifier) over many answers to the same
//! prompts: trigger F1 of an endpoint's call / no-call decisions against a baseline's, and
//! schema accuracy, the share of the endpoint's calls that [`ToolSet::classify`] finds ok.
//!
//! Trigger F1 is undefined when neither side ever calls a tool (no positive to recall or be
//! precise about): it is `None` there, never 1.0, so a model that never calls tools cannot
//! look perfect.

use crate::classify::{CallVerdict, ToolCall, ToolSet};

/// Schema accuracy, counted call by call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchemaAccuracy {
    /// Calls checked.
    pub calls: u64,
    /// Calls whose name is declared and whose arguments satisfy its schema.
    pub valid: u64,
}

/// Trigger F1 of `pairs` = (baseline called a tool, endpoint called a tool), with the
/// baseline's decisions as the truth. `None` when neither side has a positive.
pub fn trigger_f1(pairs: &[(bool, bool)]) -> Option<f64> {
    let tp = pairs.iter().filter(|(b, e)| *b && *e).count() as f64;
    let fp = pairs.iter().filter(|(b, e)| !*b && *e).count() as f64;
    let fn_ = pairs.iter().filter(|(b, e)| *b && !*e).count() as f64;
    let d = 2.0 * tp + fp + fn_;
    if d == 0.0 { None } else { Some(2.0 * tp / d) }
}

impl SchemaAccuracy {
    /// Adds one answer's calls, classified against the request's `tools`.
    pub fn add(&mut self, tools: &ToolSet, calls: &[ToolCall]) {
        for c in calls {
            self.calls += 1;
            self.valid += u64::from(tools.classify(c) == CallVerdict::Ok);
        }
    }

    /// valid / calls; `None` with no call.
    pub fn rate(&self) -> Option<f64> {
        (self.calls > 0).then(|| self.valid as f64 / self.calls as f64)
    }
}

/// McNemar's exact test: the two-sided p-value of `b` vs `c` discordant pairs (items one side
/// passed and the other failed) under Binomial(b + c, ½); 1 when there is no discordant pair.
/// The evals' paired verdicts and the tool_calls probe's paired finding both use it.
pub fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let m = b.min(c);
    let tail: f64 = (0..=m)
        .map(|i| {
            (statrs::function::factorial::ln_binomial(n, i) - n as f64 * std::f64::consts::LN_2)
                .exp()
        })
        .sum();
    (2.0 * tail).min(1.0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn trigger_f1_is_undefined_without_positives_and_exact_otherwise() {
        assert_eq!(trigger_f1(&[]), None);
        assert_eq!(trigger_f1(&[(false, false), (false, false)]), None);
        assert_eq!(trigger_f1(&[(true, true), (false, false)]), Some(1.0));
        // tp 1, fp 1, fn 1: 2 / 4
        assert_eq!(
            trigger_f1(&[(true, true), (false, true), (true, false)]),
            Some(0.5)
        );
        assert_eq!(trigger_f1(&[(true, false)]), Some(0.0));
    }

    #[test]
    fn schema_accuracy_counts_only_ok_calls() {
        let tools = ToolSet::from_request_tools(&json!([{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object",
                "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]));
        let call = |name: &str, args: &str| ToolCall {
            name: Some(name.to_owned()),
            arguments: args.to_owned(),
            ..ToolCall::default()
        };
        let mut acc = SchemaAccuracy::default();
        assert_eq!(acc.rate(), None);
        acc.add(
            &tools,
            &[
                call("f", r#"{"x": 1}"#),
                call("f", r#"{"x": "1"}"#),
                call("g", "{}"),
            ],
        );
        acc.add(&tools, &[call("f", "not json")]);
        assert_eq!(acc, SchemaAccuracy { calls: 4, valid: 1 });
        assert_eq!(acc.rate(), Some(0.25));
    }

    #[test]
    fn mcnemar_exact_is_the_binomial_tail() {
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        // 10 vs 0: 2 · 0.5^10
        assert!(close_to(mcnemar_exact(10, 0), 2.0 * 0.5f64.powi(10), 1e-12));
        assert!(close_to(mcnemar_exact(0, 10), 2.0 * 0.5f64.powi(10), 1e-12));
        // 1 vs 5: 2 · (1 + 6) / 64
        assert!(close_to(mcnemar_exact(1, 5), 14.0 / 64.0, 1e-12));
        assert_eq!(mcnemar_exact(3, 3), 1.0);
    }

    fn close_to(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }
}
