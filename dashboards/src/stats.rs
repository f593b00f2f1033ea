//! The few statistics the pages show beside the counts: Wilson score intervals for rates,
//! what a per-call rate means for an N-step agent task, and goodput against an SLO from the
//! rollups' fixed-bucket histograms.

use samewise_store::Rollup;

use crate::Slo;

/// z for a two-sided 95% interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// The agent task lengths the endpoint page compounds a per-call rate over.
pub const AGENT_STEPS: [u32; 3] = [5, 15, 50];

/// A rate `k / n` with its 95% Wilson score interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Rate {
    /// Events.
    pub k: i64,
    /// Trials.
    pub n: i64,
    /// `k / n`.
    pub p: f64,
    /// Lower end of the 95% Wilson interval.
    pub lo: f64,
    /// Upper end of the 95% Wilson interval.
    pub hi: f64,
}

impl Rate {
    /// `k / n` with its interval; None when `n` is 0.
    pub fn of(k: i64, n: i64) -> Option<Rate> {
        if n <= 0 {
            return None;
        }
        let k = k.clamp(0, n);
        let (lo, hi) = wilson(k, n, Z95);
        Some(Rate {
            k,
            n,
            p: k as f64 / n as f64,
            lo,
            hi,
        })
    }
}

/// The Wilson score interval of `k` successes in `n` trials at `z`.
pub fn wilson(k: i64, n: i64, z: f64) -> (f64, f64) {
    if n <= 0 {
        return (0.0, 1.0);
    }
    let n = n as f64;
    let p = k as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// The chance that an `steps`-step task meets at least one deviation when each call
/// deviates independently with probability `p`: `1 − (1 − p)^steps`.
pub fn task_failure(p: f64, steps: u32) -> f64 {
    1.0 - (1.0 - p.clamp(0.0, 1.0)).powi(i32::try_from(steps).unwrap_or(i32::MAX))
}

/// Goodput against an SLO, from the histograms.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Goodput {
    /// Share of TTFT samples at or under the target.
    pub ttft_within: Option<f64>,
    /// Share of TPOT samples at or under the target.
    pub tpot_within: Option<f64>,
    /// Share of attempts without an error.
    pub ok: f64,
    /// Lower bound of the share of attempts that succeed and meet both targets (Fréchet:
    /// `max(0, a + b + c − 2)`; the rollups keep the two latencies' marginals, not their
    /// joint distribution).
    pub at_least: f64,
}

/// Goodput of `r` against `slo`, None without attempts.
pub fn goodput(r: &Rollup, slo: &Slo) -> Option<Goodput> {
    if r.requests <= 0 {
        return None;
    }
    let ok = 1.0 - r.errors as f64 / r.requests as f64;
    let ttft_within = r.ttft_share_within(slo.ttft_ms);
    let tpot_within = r.tpot_share_within(slo.tpot_ms);
    let at_least = (ttft_within.unwrap_or(1.0) + tpot_within.unwrap_or(1.0) + ok - 2.0).max(0.0);
    Some(Goodput {
        ttft_within,
        tpot_within,
        ok,
        at_least,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_known_values() {
        // 0 of 10: [0, 0.2775]; 5 of 10: [0.2366, 0.7634]
        let (lo, hi) = wilson(0, 10, Z95);
        assert!(lo == 0.0 && (hi - 0.2775).abs() < 1e-4, "{hi}");
        let (lo, hi) = wilson(5, 10, Z95);
        assert!((lo - 0.2366).abs() < 1e-4 && (hi - 0.7634).abs() < 1e-4);
        assert!(Rate::of(1, 0).is_none());
    }

    #[test]
    fn agent_compounding() {
        assert!((task_failure(0.01, 50) - 0.394_994).abs() < 1e-5);
        assert_eq!(task_failure(0.0, 15), 0.0);
        assert_eq!(task_failure(1.0, 5), 1.0);
    }

    #[test]
    fn goodput_bound() {
        let mut r = Rollup {
            requests: 10,
            errors: 1,
            ..Rollup::default()
        };
        r.ttft_hist[0] = 10; // all ≤ 50 ms
        r.tpot_hist[12] = 10; // all > 500 ms
        let slo = Slo {
            ttft_ms: 100.0,
            tpot_ms: 50.0,
        };
        let g = goodput(&r, &slo).unwrap_or_else(|| panic!("no goodput"));
        assert_eq!(g.ttft_within, Some(1.0));
        assert_eq!(g.tpot_within, Some(0.0));
        assert_eq!(g.at_least, 0.0);
    }
}
