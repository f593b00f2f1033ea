//! The detectors' configuration, `[probes.detectors]` typed (see [`super`] for the keys
//! and their defaults).

use std::time::Duration;

use serde::Deserialize;

use crate::ladder::Metric;
use crate::noise::FaithfulRule;
use crate::sequential::CusumConfig;
use crate::{ProbesError, Result};

/// `[probes.detectors]`, typed.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorConfig {
    /// Ladder level and noise-floor factor of the faithful? rule.
    pub rule: FaithfulRule,
    /// The statistic judged against the ladder.
    pub metric: Metric,
    /// Without a ladder: flag when `stats.kl_mean` exceeds this (raised by the noise floor).
    pub kl_threshold: Option<f64>,
    /// A samples run is flagged when its p-value is below this.
    pub samples_alpha: f64,
    /// A tool_calls run is flagged when McNemar's exact test of the cases its endpoint fails
    /// and the reference passes (each case's newest outcome over the endpoint's recent runs)
    /// against the reverse is below this.
    pub tool_calls_alpha: f64,
    /// A logprob run is flagged when more than this share of the endpoint's tokens do not
    /// map onto the reference vocabulary (a different tokenizer is a different model).
    pub max_mismatch_rate: f64,
    /// CUSUM chart parameters (`min_sd` is raised by the noise floor where one is measured).
    /// `cusum.arl0()` is the in-control ARL per chart (per endpoint, probe kind and
    /// statistic), not per endpoint: an endpoint with three watched statistics has about a
    /// third of it until its first "changed" alarm.
    pub cusum: CusumConfig,
    /// Raise the charts' `h` so that the in-control false-alarm rate averaged over the spread
    /// of a `cusum.baseline_rounds`-round estimated baseline is `1/cusum.arl0()`
    /// ([`CusumConfig::for_estimated_baseline`]); off, `h` assumes a known baseline and the
    /// rate is several times higher (see `crate::sequential`).
    pub cusum_baseline_correction: bool,
    /// Run statistics watched by the CUSUM (those a run lacks are skipped).
    pub cusum_statistics: Vec<String>,
    /// The least standard deviation the charts of a fingerprint probe's statistics assume
    /// (nats per token, and tokens for `own_tokens`): an endpoint whose baseline rounds
    /// echoed the same logprobs every time (a baseline spread of 0) is not flagged later for
    /// the rounding noise of batching; a shift must be a few times this to alarm.
    pub fingerprint_min_sd: f64,
    /// Most runs per endpoint and kind read to rebuild a chart (after its fixed baseline) or
    /// a noise floor.
    pub history_runs: u32,
    /// False-discovery rate of the passive tests.
    pub passive_q: f64,
    /// Request records this far back are compared.
    pub passive_window: Duration,
    /// Endpoints with fewer records in the window are not tested.
    pub passive_min_requests: u64,
}

/// The default `fingerprint_min_sd` (nats per token).
pub const FINGERPRINT_MIN_SD: f64 = 1e-3;

impl Default for DetectorConfig {
    fn default() -> Self {
        // k = 1 (fastest on a 2σ shift): the probes' shifts of interest are many σ, and a
        // larger k needs far less of the estimated-baseline correction of h (see
        // `crate::sequential`): 4.18 instead of 9.40 for 30 rounds, 14.5 instead of 53 for 8
        let cusum = CusumConfig::for_arl0(1.0, 1000.0, true).unwrap_or_default();
        DetectorConfig {
            rule: FaithfulRule::default(),
            metric: Metric::KlTopkMean,
            kl_threshold: None,
            samples_alpha: 0.01,
            tool_calls_alpha: 0.01,
            max_mismatch_rate: 0.02,
            cusum: CusumConfig {
                min_sd: 1e-6,
                ..cusum
            },
            cusum_baseline_correction: true,
            cusum_statistics: [
                "kl_mean",
                "top1_same",
                "dlogprob_mean",
                "mmd",
                "trigger_f1",
                "effective_context",
            ]
            .into_iter()
            .chain(super::FINGERPRINT_STATS)
            .map(str::to_owned)
            .collect(),
            fingerprint_min_sd: FINGERPRINT_MIN_SD,
            history_runs: 500,
            passive_q: 0.01,
            passive_window: Duration::from_secs(3_600),
            passive_min_requests: 30,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDetectors {
    level: Option<String>,
    floor_factor: Option<f64>,
    metric: Option<Metric>,
    kl_threshold: Option<f64>,
    samples_alpha: Option<f64>,
    tool_calls_alpha: Option<f64>,
    max_mismatch_rate: Option<f64>,
    cusum_k: Option<f64>,
    cusum_arl0: Option<f64>,
    cusum_baseline_rounds: Option<usize>,
    cusum_min_sd: Option<f64>,
    cusum_baseline_correction: Option<bool>,
    cusum_statistics: Option<Vec<String>>,
    fingerprint_min_sd: Option<f64>,
    history_runs: Option<u32>,
    passive_q: Option<f64>,
    passive_window_ms: Option<u64>,
    passive_min_requests: Option<u64>,
}

fn cfg_err(key: &str, msg: impl std::fmt::Display) -> ProbesError {
    ProbesError::Config(format!("probes.detectors.{key}: {msg}"))
}

impl DetectorConfig {
    /// Parses the detectors' part of the probes config (`ProbesConfig::detectors`: the
    /// `[probes.detectors]` keys; its `alerts` and `webhooks` entries belong to
    /// [`AlertsConfig`](crate::AlertsConfig) and are skipped here).
    pub fn parse(detectors: &toml::Table) -> Result<DetectorConfig> {
        let mut table = detectors.clone();
        table.remove("alerts");
        table.remove("webhooks");
        let raw = RawDetectors::deserialize(toml::Value::Table(table))
            .map_err(|e| ProbesError::Config(format!("probes.detectors: {}", e.message())))?;
        let mut c = DetectorConfig::default();
        if let Some(level) = raw.level {
            c.rule.level = level;
        }
        if let Some(f) = raw.floor_factor {
            if !(f >= 1.0 && f.is_finite()) {
                return Err(cfg_err("floor_factor", "must be ≥ 1"));
            }
            c.rule.floor_factor = f;
        }
        if let Some(m) = raw.metric {
            if matches!(m, Metric::KlMean | Metric::KlP99) {
                return Err(cfg_err(
                    "metric",
                    "full-vocabulary KL cannot be measured by a probe; use kl_topk_mean",
                ));
            }
            c.metric = m;
        }
        if let Some(t) = raw.kl_threshold {
            if !(t > 0.0 && t.is_finite()) {
                return Err(cfg_err("kl_threshold", "must be positive"));
            }
            c.kl_threshold = Some(t);
        }
        if let Some(a) = raw.samples_alpha {
            if !(a > 0.0 && a < 1.0) {
                return Err(cfg_err("samples_alpha", "must be in (0, 1)"));
            }
            c.samples_alpha = a;
        }
        if let Some(a) = raw.tool_calls_alpha {
            if !(a > 0.0 && a < 1.0) {
                return Err(cfg_err("tool_calls_alpha", "must be in (0, 1)"));
            }
            c.tool_calls_alpha = a;
        }
        if let Some(m) = raw.max_mismatch_rate {
            if !(0.0..1.0).contains(&m) {
                return Err(cfg_err("max_mismatch_rate", "must be in [0, 1)"));
            }
            c.max_mismatch_rate = m;
        }
        let k = raw.cusum_k.unwrap_or(c.cusum.k);
        let arl0 = raw.cusum_arl0.unwrap_or(1000.0);
        let chart =
            CusumConfig::for_arl0(k, arl0, true).map_err(|e| cfg_err("cusum_k / cusum_arl0", e))?;
        c.cusum = CusumConfig {
            baseline_rounds: raw.cusum_baseline_rounds.unwrap_or(chart.baseline_rounds),
            min_sd: raw.cusum_min_sd.unwrap_or(c.cusum.min_sd),
            ..chart
        };
        if c.cusum.baseline_rounds < 2 {
            return Err(cfg_err("cusum_baseline_rounds", "must be at least 2"));
        }
        if !(c.cusum.min_sd > 0.0 && c.cusum.min_sd.is_finite()) {
            return Err(cfg_err("cusum_min_sd", "must be positive"));
        }
        if let Some(b) = raw.cusum_baseline_correction {
            c.cusum_baseline_correction = b;
        }
        if c.cusum_baseline_correction {
            c.cusum
                .for_estimated_baseline()
                .map_err(|e| cfg_err("cusum_baseline_rounds / cusum_arl0", e))?;
        }
        if let Some(s) = raw.cusum_statistics {
            c.cusum_statistics = s;
        }
        if let Some(sd) = raw.fingerprint_min_sd {
            if !(sd > 0.0 && sd.is_finite()) {
                return Err(cfg_err("fingerprint_min_sd", "must be positive"));
            }
            c.fingerprint_min_sd = sd;
        }
        if let Some(h) = raw.history_runs {
            if (h as usize) < c.cusum.baseline_rounds + 1 {
                return Err(cfg_err("history_runs", "must exceed cusum_baseline_rounds"));
            }
            c.history_runs = h;
        }
        if let Some(q) = raw.passive_q {
            if !(q > 0.0 && q < 1.0) {
                return Err(cfg_err("passive_q", "must be in (0, 1)"));
            }
            c.passive_q = q;
        }
        if let Some(ms) = raw.passive_window_ms {
            if ms == 0 {
                return Err(cfg_err("passive_window_ms", "must be positive"));
            }
            c.passive_window = Duration::from_millis(ms);
        }
        if let Some(n) = raw.passive_min_requests {
            c.passive_min_requests = n.max(1);
        }
        Ok(c)
    }
}
