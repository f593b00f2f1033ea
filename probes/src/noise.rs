//! The noise floor: how much an endpoint differs from *itself* when asked the same probe
//! twice, and the rule that keeps a nondeterministic but faithful endpoint from being flagged.
//!
//! Providers batch requests, use split-K kernels and race in reductions, so the same prompt
//! can get slightly different logprobs each time. Such an endpoint is faithful to the
//! weights on average, but its probe statistic against the reference carries that noise. Two
//! repeats of one probe on one endpoint measure it: [`repeat_summary`] scores run B against
//! run A exactly as [`crate::compare`] scores an endpoint against the reference (A plays the
//! reference), giving the same statistics in the same units. [`NoiseFloor`] keeps the last
//! few repeat values per endpoint and statistic; the floor is the largest of them (a
//! conservative choice: one quiet repeat must not lower the bar).
//!
//! # The rule
//! With `t` the ladder threshold for the chosen level (default `w6`) and `f` the floor, an
//! endpoint is flagged unfaithful only if its statistic is worse than
//! `max(t, factor · f)` (`factor` defaults to [`DEFAULT_FLOOR_FACTOR`] = 3), comparing
//! badness as the ladder does (`1 − rate` for same-top-1 and overlap). Why 3: if an endpoint
//! is the reference plus independent per-request noise, its distance to the reference is
//! about half its distance between two of its own repeats (KL grows with the variance of the
//! logit difference, which is σ² against the reference and 2σ² between repeats), so
//! `3 · floor` leaves a six-fold margin for a faithful endpoint, while a systematically
//! degraded one (quantized weights: a fixed bias, small repeat noise) still exceeds it. The
//! tests check both cases by simulation.
//!
//! [`repeat_summary`]: crate::noise::repeat_summary
//! [`NoiseFloor`]: crate::noise::NoiseFloor
//! [`DEFAULT_FLOOR_FACTOR`]: crate::noise::DEFAULT_FLOOR_FACTOR

use std::collections::VecDeque;

use crate::compare::{PositionInput, RunSummary, compare_run, summarize};
use crate::ladder::{Judgement, Ladder, Metric};
use crate::{ProbesError, Result, invalid};

/// Multiplier of the noise floor in the flagging rule.
pub const DEFAULT_FLOOR_FACTOR: f64 = 3.0;

/// Repeat values kept per endpoint and statistic.
pub const FLOOR_WINDOW: usize = 8;

/// Scores repeat B against repeat A of the same probe on the same endpoint: position by
/// position, A's endpoint view plays the reference. Both runs must cover the same positions
/// (same length, same actual tokens).
pub fn repeat_summary(run_a: &[PositionInput], run_b: &[PositionInput]) -> Result<RunSummary> {
    if run_a.len() != run_b.len() {
        return Err(ProbesError::LengthMismatch {
            what: "repeat runs",
            left: run_a.len(),
            right: run_b.len(),
        });
    }
    let mut pairs = Vec::with_capacity(run_a.len());
    for (i, (a, b)) in run_a.iter().zip(run_b).enumerate() {
        if a.actual_id != b.actual_id {
            return Err(invalid(format!(
                "repeat runs differ in the actual token at position {i}"
            )));
        }
        pairs.push(PositionInput {
            actual_id: a.actual_id,
            reference: a.endpoint.clone(),
            endpoint: b.endpoint.clone(),
        });
    }
    summarize(&compare_run(&pairs)?)
}

/// The recent repeat values of one statistic on one endpoint.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NoiseFloor {
    recent: VecDeque<f64>,
}

impl NoiseFloor {
    /// Records one repeat value (e.g. `repeat_summary(..).kl_mean`), forgetting the oldest
    /// beyond [`FLOOR_WINDOW`].
    pub fn record(&mut self, value: f64) -> Result<()> {
        if !value.is_finite() {
            return Err(invalid(format!("repeat value {value} is not finite")));
        }
        if self.recent.len() == FLOOR_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(value);
        Ok(())
    }

    /// The floor for a statistic where higher is worse: the largest recent repeat value
    /// (`None` before any repeat).
    pub fn floor(&self) -> Option<f64> {
        self.recent.iter().copied().reduce(f64::max)
    }

    /// The floor for a rate where higher is better (same-top-1, overlap): the smallest
    /// recent repeat value.
    pub fn floor_rate(&self) -> Option<f64> {
        self.recent.iter().copied().reduce(f64::min)
    }

    /// The floor for `metric`, oriented as the metric is.
    pub fn floor_for(&self, metric: Metric) -> Option<f64> {
        if metric.higher_is_better() {
            self.floor_rate()
        } else {
            self.floor()
        }
    }
}

/// How the ladder threshold and the noise floor combine.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FaithfulRule {
    /// Ladder level an endpoint must not be worse than.
    pub level: String,
    /// Multiplier of the noise floor.
    pub floor_factor: f64,
}

impl Default for FaithfulRule {
    fn default() -> Self {
        Self {
            level: crate::ladder::DEFAULT_UNFAITHFUL_LEVEL.to_owned(),
            floor_factor: DEFAULT_FLOOR_FACTOR,
        }
    }
}

/// A faithful? verdict that took the noise floor into account.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NoiseAwareJudgement {
    /// The ladder's verdict alone (its `unfaithful` ignores the floor).
    pub ladder: Judgement,
    /// The floor used, if any repeat was measured.
    pub floor: Option<f64>,
    /// `max(threshold, factor · floor)` in the metric's units (badness-wise for rates).
    pub effective_threshold: f64,
    /// The final verdict.
    pub unfaithful: bool,
}

/// Judges `value` of `metric` against the ladder level of `rule`, raised by the endpoint's
/// noise floor (see the module doc).
pub fn judge(
    ladder: &Ladder,
    metric: Metric,
    value: f64,
    floor: Option<f64>,
    rule: &FaithfulRule,
) -> Result<NoiseAwareJudgement> {
    if !(rule.floor_factor >= 1.0 && rule.floor_factor.is_finite()) {
        return Err(invalid(format!(
            "floor factor {} must be ≥ 1",
            rule.floor_factor
        )));
    }
    if floor.is_some_and(|f| !f.is_finite()) {
        return Err(invalid("noise floor is not finite"));
    }
    let lj = ladder.judge(metric, value, &rule.level)?;
    let bad = |v: f64| {
        if metric.higher_is_better() {
            1.0 - v
        } else {
            v
        }
    };
    let unbad = |b: f64| {
        if metric.higher_is_better() {
            1.0 - b
        } else {
            b
        }
    };
    let mut threshold_badness = bad(lj.threshold);
    if let Some(f) = floor {
        threshold_badness = threshold_badness.max(rule.floor_factor * bad(f).max(0.0));
    }
    Ok(NoiseAwareJudgement {
        ladder: lj,
        floor,
        effective_threshold: unbad(threshold_badness),
        unfaithful: bad(value) > threshold_badness,
    })
}

#[cfg(test)]
mod tests;
