//! The calibration ladder: what each level of degradation of *this* model looks like, as
//! measured by `samewise calibrate` (issue 3), and the lookups that turn a probe statistic
//! into "≈ N-bit equivalent" and into a faithful/unfaithful threshold.
//!
//! The JSON format (documented for users in `probes/data/README.md`):
//! `{ "model", "model_sha256", "corpus", "positions", "top_k", "levels": [ { "name": "w8" |
//! "w6" | "w5" | "w4" | "w3" | "w2" | "a8", "kind": "weights" | "activations", "bits",
//! "kl_mean", "kl_p99", "kl_topk_mean", "dlogprob_mean", "top1_same", "topk_overlap" } ] }`.
//! `kl_mean`/`kl_p99` are full-vocabulary; `kl_topk_mean` uses `top_k` and the top-k + tail
//! definition of [`crate::compare`], so it compares like with like against a probe's KL;
//! `dlogprob_mean` is the mean |Δ logprob| of the actual token.
//!
//! # From a statistic to "≈ N-bit"
//! Only `kind = "weights"` levels form the bit scale, ordered from most bits to fewest. Every
//! metric is read as a *badness* that grows as bits fall: the value itself for KL and
//! |Δ logprob|, `1 − value` for the rates (same-top-1, overlap). A ladder measured on a finite
//! corpus can be slightly non-monotone at the top (8 and 6 bits are both near zero); the
//! badness is made monotone by a running maximum down the ladder. A measured badness `x` is
//! then:
//! - at or below the best level's: "no worse than 8-bit" (or whatever the best level is);
//! - above the worst level's: "worse than 2-bit";
//! - otherwise between two adjacent levels `b_hi` bits (badness `x_hi`) and `b_lo` bits
//!   (`x_lo`): `≈ b_hi − f·(b_hi − b_lo)` bits with `f = (ln x − ln x_hi)/(ln x_lo − ln x_hi)`,
//!   interpolating on a log scale because drift grows roughly geometrically as bits fall.
//!
//! # Thresholds
//! [`Ladder::judge`] flags an endpoint unfaithful when its badness exceeds that of a chosen
//! level ([`DEFAULT_UNFAITHFUL_LEVEL`] = `"w6"`: worse than 6-bit weights). The noise-floor
//! rule in [`crate::noise`] raises the threshold for endpoints that are noisy on their own.
//!
//! [`Ladder::judge`]: crate::ladder::Ladder::judge
//! [`DEFAULT_UNFAITHFUL_LEVEL`]: crate::ladder::DEFAULT_UNFAITHFUL_LEVEL

use std::fmt;

use crate::compare::RunSummary;
use crate::{ProbesError, Result};

/// The ladder shipped for the test model (SmolLM2-135M-Instruct, Q4_1), as
/// `probes/data/ladders/smollm2-135m-instruct-q4_1.json` holds it; `samewise demo` writes it
/// next to its configuration.
pub const SMOLLM2_135M_INSTRUCT_Q4_1: &str =
    include_str!("../data/ladders/smollm2-135m-instruct-q4_1.json");

/// The level an endpoint must not be worse than, unless configured otherwise.
pub const DEFAULT_UNFAITHFUL_LEVEL: &str = "w6";

/// Smallest badness used on the log scale (an exact-zero level would make `ln` infinite).
const BADNESS_FLOOR: f64 = 1e-12;

/// A model's calibration ladder, as `samewise calibrate` writes it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ladder {
    /// Model name.
    pub model: String,
    /// sha256 of the weights file the ladder was measured on (hex).
    pub model_sha256: String,
    /// Name of the scored corpus.
    pub corpus: String,
    /// Positions scored per level.
    pub positions: u64,
    /// k of the top-k statistics.
    pub top_k: u32,
    /// One entry per degradation level.
    pub levels: Vec<Level>,
}

/// What kind of degradation a level is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LevelKind {
    /// Weights re-quantized to `bits`.
    Weights,
    /// Activations quantized to `bits` before each matmul.
    Activations,
}

/// The measured statistics of one level against the unmodified reference.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Level {
    /// `w8`, `w6`, `w5`, `w4`, `w3`, `w2`, `a8`, ...
    pub name: String,
    /// Weights or activations.
    pub kind: LevelKind,
    /// Bits of the quantization.
    pub bits: u32,
    /// Mean full-vocabulary KL(ref‖level).
    pub kl_mean: f64,
    /// 99th percentile of the full-vocabulary KL.
    pub kl_p99: f64,
    /// Mean top-k + tail KL, as [`crate::compare`] computes it.
    pub kl_topk_mean: f64,
    /// Mean |Δ logprob| of the actual token.
    pub dlogprob_mean: f64,
    /// Same-top-1 rate.
    pub top1_same: f64,
    /// Mean top-k overlap.
    pub topk_overlap: f64,
}

/// A statistic the ladder records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Full-vocabulary mean KL.
    KlMean,
    /// Full-vocabulary p99 KL.
    KlP99,
    /// Top-k + tail mean KL (what logprob probes measure).
    KlTopkMean,
    /// Mean |Δ logprob| of the actual token.
    DlogprobMean,
    /// Same-top-1 rate (higher is better).
    Top1Same,
    /// Top-k overlap (higher is better).
    TopkOverlap,
}

impl Metric {
    /// Whether larger values mean closer to the reference.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::Top1Same | Metric::TopkOverlap)
    }

    /// This metric's value at a level.
    pub fn of_level(self, l: &Level) -> f64 {
        match self {
            Metric::KlMean => l.kl_mean,
            Metric::KlP99 => l.kl_p99,
            Metric::KlTopkMean => l.kl_topk_mean,
            Metric::DlogprobMean => l.dlogprob_mean,
            Metric::Top1Same => l.top1_same,
            Metric::TopkOverlap => l.topk_overlap,
        }
    }

    /// This metric's value in a probe run's summary, where the probe measures the same thing
    /// (`None` for the full-vocabulary KLs, which a probe cannot see).
    pub fn of_summary(self, s: &RunSummary) -> Option<f64> {
        match self {
            Metric::KlMean | Metric::KlP99 => None,
            Metric::KlTopkMean => Some(s.kl_mean),
            Metric::DlogprobMean => Some(s.abs_dlogprob_mean),
            Metric::Top1Same => Some(s.top1_same),
            Metric::TopkOverlap => Some(s.topk_overlap),
        }
    }

    fn badness(self, value: f64) -> f64 {
        if self.higher_is_better() {
            1.0 - value
        } else {
            value
        }
    }
}

/// Where a statistic falls on the bit scale.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "relation", rename_all = "snake_case")]
pub enum Equivalent {
    /// At or better than the best (most bits) level.
    NoWorseThan {
        /// Bits of that level.
        bits: u32,
    },
    /// Between two adjacent levels.
    Approx {
        /// Interpolated bits.
        bits: f64,
        /// The level above (more bits).
        better: u32,
        /// The level below (fewer bits).
        worse: u32,
    },
    /// Worse than the worst (fewest bits) level.
    WorseThan {
        /// Bits of that level.
        bits: u32,
    },
}

impl fmt::Display for Equivalent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Equivalent::NoWorseThan { bits } => write!(f, "no worse than {bits}-bit"),
            Equivalent::Approx {
                bits,
                better,
                worse,
            } => {
                write!(f, "≈ {bits:.1}-bit (between {better} and {worse} bits)")
            }
            Equivalent::WorseThan { bits } => write!(f, "worse than {bits}-bit"),
        }
    }
}

/// The faithful? verdict for one statistic.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Judgement {
    /// The statistic's value.
    pub value: f64,
    /// The threshold value (the level's, in the metric's own units).
    pub threshold: f64,
    /// Whether the statistic is worse than the threshold.
    pub unfaithful: bool,
    /// Where the statistic sits on the bit scale.
    pub equivalent: Equivalent,
}

fn ladder_err(msg: impl Into<String>) -> ProbesError {
    ProbesError::Ladder(msg.into())
}

impl Ladder {
    /// Parses and validates a ladder from JSON.
    pub fn from_json(text: &str) -> Result<Self> {
        let l: Ladder =
            serde_json::from_str(text).map_err(|e| ladder_err(format!("bad JSON: {e}")))?;
        l.validate()?;
        Ok(l)
    }

    /// Checks names are unique, values finite and in range, and at least one weights level.
    pub fn validate(&self) -> Result<()> {
        if !self.levels.iter().any(|l| l.kind == LevelKind::Weights) {
            return Err(ladder_err("no weights level"));
        }
        for (i, l) in self.levels.iter().enumerate() {
            if self.levels[..i].iter().any(|o| o.name == l.name) {
                return Err(ladder_err(format!("level {} appears twice", l.name)));
            }
            if !(1..=32).contains(&l.bits) {
                return Err(ladder_err(format!(
                    "level {}: bits {} out of range",
                    l.name, l.bits
                )));
            }
            if l.kind == LevelKind::Weights
                && self.levels[..i]
                    .iter()
                    .any(|o| o.kind == LevelKind::Weights && o.bits == l.bits)
            {
                return Err(ladder_err(format!(
                    "two weights levels with {} bits",
                    l.bits
                )));
            }
            let all = [
                l.kl_mean,
                l.kl_p99,
                l.kl_topk_mean,
                l.dlogprob_mean,
                l.top1_same,
                l.topk_overlap,
            ];
            if all.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(ladder_err(format!(
                    "level {}: values must be finite and ≥ 0",
                    l.name
                )));
            }
            if l.top1_same > 1.0 || l.topk_overlap > 1.0 {
                return Err(ladder_err(format!("level {}: rates must be ≤ 1", l.name)));
            }
        }
        Ok(())
    }

    /// A level by name.
    pub fn level(&self, name: &str) -> Option<&Level> {
        self.levels.iter().find(|l| l.name == name)
    }

    /// The weights levels, most bits first, with their monotone (running-max) badness.
    fn scale(&self, metric: Metric) -> Vec<(u32, f64)> {
        let mut w: Vec<&Level> = self
            .levels
            .iter()
            .filter(|l| l.kind == LevelKind::Weights)
            .collect();
        w.sort_by_key(|l| std::cmp::Reverse(l.bits));
        let mut running = f64::NEG_INFINITY;
        w.iter()
            .map(|l| {
                running = running.max(metric.badness(metric.of_level(l)));
                (l.bits, running)
            })
            .collect()
    }

    /// Where `value` of `metric` falls on the bit scale (see the module doc).
    pub fn equivalent(&self, metric: Metric, value: f64) -> Result<Equivalent> {
        if !value.is_finite() {
            return Err(ProbesError::InvalidInput(format!(
                "statistic {value} is not finite"
            )));
        }
        let scale = self.scale(metric);
        let (Some(&(best_bits, best)), Some(&(worst_bits, worst))) = (scale.first(), scale.last())
        else {
            return Err(ladder_err("no weights level"));
        };
        let x = metric.badness(value);
        if x <= best {
            return Ok(Equivalent::NoWorseThan { bits: best_bits });
        }
        if x > worst {
            return Ok(Equivalent::WorseThan { bits: worst_bits });
        }
        let ln = |v: f64| v.max(BADNESS_FLOOR).ln();
        for pair in scale.windows(2) {
            let ((b_hi, x_hi), (b_lo, x_lo)) = (pair[0], pair[1]);
            if x > x_hi && x <= x_lo {
                let span = ln(x_lo) - ln(x_hi);
                let f = if span > 0.0 {
                    ((ln(x) - ln(x_hi)) / span).clamp(0.0, 1.0)
                } else {
                    1.0
                };
                let bits = f64::from(b_hi) - f * f64::from(b_hi - b_lo);
                return Ok(Equivalent::Approx {
                    bits,
                    better: b_hi,
                    worse: b_lo,
                });
            }
        }
        // unreachable for a monotone scale with best < x ≤ worst; answer conservatively
        Ok(Equivalent::WorseThan { bits: worst_bits })
    }

    /// The value of `metric` at level `level_name` (monotone-adjusted for weights levels), in
    /// the metric's own units: an endpoint past it is worse than that level.
    pub fn threshold(&self, metric: Metric, level_name: &str) -> Result<f64> {
        let level = self
            .level(level_name)
            .ok_or_else(|| ladder_err(format!("no level {level_name}")))?;
        let badness = match level.kind {
            LevelKind::Weights => self
                .scale(metric)
                .into_iter()
                .find(|&(b, _)| b == level.bits)
                .map_or(metric.badness(metric.of_level(level)), |(_, x)| x),
            LevelKind::Activations => metric.badness(metric.of_level(level)),
        };
        Ok(if metric.higher_is_better() {
            1.0 - badness
        } else {
            badness
        })
    }

    /// The faithful? verdict: `value` against the threshold at `level_name`.
    pub fn judge(&self, metric: Metric, value: f64, level_name: &str) -> Result<Judgement> {
        let threshold = self.threshold(metric, level_name)?;
        let equivalent = self.equivalent(metric, value)?;
        let unfaithful = metric.badness(value) > metric.badness(threshold);
        Ok(Judgement {
            value,
            threshold,
            unfaithful,
            equivalent,
        })
    }
}

/// Builds one ladder [`Level`] from per-position full logits, with exactly the definitions
/// the probes use: `samewise calibrate` feeds it the unmodified engine's logits and the
/// degraded engine's logits at each scored position.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelBuilder {
    top_k: usize,
    full_kl: Vec<f64>,
    positions: Vec<crate::compare::PositionMetrics>,
}

impl LevelBuilder {
    /// A builder for top-k statistics at `top_k` (≥ 1).
    pub fn new(top_k: usize) -> Result<Self> {
        if top_k == 0 {
            return Err(ProbesError::InvalidInput("top_k must be at least 1".into()));
        }
        Ok(Self {
            top_k,
            full_kl: Vec::new(),
            positions: Vec::new(),
        })
    }

    /// Adds one position: both sides' raw logits over the whole vocabulary and the actual
    /// next token.
    pub fn add(
        &mut self,
        reference_logits: &[f32],
        level_logits: &[f32],
        actual_id: u32,
    ) -> Result<()> {
        use crate::compare::{compare_position, kl_full, log_softmax, position_from_full_logprobs};
        let kl = kl_full(reference_logits, level_logits)?;
        let (r, l) = (log_softmax(reference_logits)?, log_softmax(level_logits)?);
        let p = position_from_full_logprobs(&r, &l, actual_id, self.top_k)?;
        self.positions.push(compare_position(&p)?);
        self.full_kl.push(kl);
        Ok(())
    }

    /// Positions added so far.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether no position was added.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// The level's statistics (errors when no position was added).
    pub fn finish(&self, name: &str, kind: LevelKind, bits: u32) -> Result<Level> {
        let s = crate::compare::summarize(&self.positions)?;
        Ok(Level {
            name: name.to_owned(),
            kind,
            bits,
            kl_mean: self.full_kl.iter().sum::<f64>() / self.full_kl.len() as f64,
            kl_p99: crate::compare::quantile_nearest_rank(&self.full_kl, 0.99)?,
            kl_topk_mean: s.kl_mean,
            dlogprob_mean: s.abs_dlogprob_mean,
            top1_same: s.top1_same,
            topk_overlap: s.topk_overlap,
        })
    }
}

#[cfg(test)]
mod tests;
