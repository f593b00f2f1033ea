//! The statistics behind a verdict: Wilson 95% intervals of each side's pass rate, McNemar's
//! exact test on the discordant pairs (both sides answer the same items), an interval for
//! the paired difference of pass rates (Agresti–Min: the adjusted Wald interval with ½ added
//! to each cell of the 2×2 table), and the verdict rule with sequential looks.
//!
//! Sequential stopping: a job looks at its results at `looks` fixed points (after ⌈j·N/K⌉
//! items, j = 1..K) and stops at the first look that decides. Look j tests "degraded" at
//! its own level α_j ([`look_alpha`]: the increments of Lan–DeMets' O'Brien–Fleming-type
//! spending function, which sum to α and keep most of it for the last look) and
//! "equivalent" at (1 − level)/K; by the union bound over looks, whatever their dependence,
//! the chance of a false "degraded" over the whole job is at most α and of a false
//! "equivalent" at most 5%, whichever look decides. (An even α/K per look, measured on the
//! BFCL pool: 93.2% of 200-item jobs of 10% tool-call corruption judged degraded, against
//! 98.2% with one look; the spending keeps early stops for gross faults and most of the
//! single look's power.)

use statrs::distribution::{ContinuousCDF, Normal};

/// The verdict of one suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The suspect is worse than the baseline, significantly and by more than δ.
    Degraded,
    /// The paired difference's interval lies within ±δ.
    Equivalent,
    /// Neither, with the items seen.
    Inconclusive,
    /// No item to judge.
    NotApplicable,
}

impl Verdict {
    /// "degraded" | "equivalent" | "inconclusive" | "n/a".
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Degraded => "degraded",
            Verdict::Equivalent => "equivalent",
            Verdict::Inconclusive => "inconclusive",
            Verdict::NotApplicable => "n/a",
        }
    }

    /// Whether a look with this verdict stops the job.
    pub fn decided(self) -> bool {
        matches!(self, Verdict::Degraded | Verdict::Equivalent)
    }
}

/// The verdict's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerdictParams {
    /// Margin δ, as a fraction (0.05 = 5 points).
    pub delta: f64,
    /// Significance α of "degraded", over the whole job.
    pub alpha: f64,
    /// Fixed looks (≥ 1).
    pub looks: u32,
}

impl Default for VerdictParams {
    fn default() -> Self {
        VerdictParams {
            delta: 0.05,
            alpha: 0.01,
            looks: 4,
        }
    }
}

/// Paired outcomes of one suite: counts of the 2×2 table (suspect × baseline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Paired {
    /// Both passed.
    pub both_pass: u64,
    /// Suspect passed, baseline failed.
    pub suspect_only: u64,
    /// Baseline passed, suspect failed.
    pub baseline_only: u64,
    /// Both failed.
    pub both_fail: u64,
}

impl Paired {
    /// Adds one item answered by both sides.
    pub fn add(&mut self, suspect: bool, baseline: bool) {
        match (suspect, baseline) {
            (true, true) => self.both_pass += 1,
            (true, false) => self.suspect_only += 1,
            (false, true) => self.baseline_only += 1,
            (false, false) => self.both_fail += 1,
        }
    }

    /// Items.
    pub fn n(&self) -> u64 {
        self.both_pass + self.suspect_only + self.baseline_only + self.both_fail
    }

    /// Suspect passes.
    pub fn suspect_pass(&self) -> u64 {
        self.both_pass + self.suspect_only
    }

    /// Baseline passes.
    pub fn baseline_pass(&self) -> u64 {
        self.both_pass + self.baseline_only
    }

    /// The table as verdict documents write it (`both_pass`, `suspect_only`, ...).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "both_pass": self.both_pass,
            "suspect_only": self.suspect_only,
            "baseline_only": self.baseline_only,
            "both_fail": self.both_fail,
        })
    }

    /// Suspect rate − baseline rate; None without items.
    pub fn diff(&self) -> Option<f64> {
        let n = self.n();
        (n > 0).then(|| (self.suspect_only as f64 - self.baseline_only as f64) / n as f64)
    }
}

/// The two-sided standard normal quantile for confidence `level` (0.95 → 1.96).
pub fn z_for(level: f64) -> f64 {
    let level = level.clamp(1e-9, 1.0 - 1e-12);
    match Normal::new(0.0, 1.0) {
        Ok(n) => n.inverse_cdf(0.5 + level / 2.0),
        Err(_) => 1.959_963_984_540_054,
    }
}

/// Wilson score interval of `k` passes in `n` at confidence `level`; None when `n` is 0.
pub fn wilson(k: u64, n: u64, level: f64) -> Option<(f64, f64)> {
    if n == 0 {
        return None;
    }
    let z = z_for(level);
    let (k, n) = (k.min(n) as f64, n as f64);
    let p = k / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Some(((centre - half).max(0.0), (centre + half).min(1.0)))
}

pub use samewise_toolcheck::vendor::mcnemar_exact;

/// Agresti–Min interval of the paired difference (suspect − baseline) at confidence
/// `level`; None without items.
pub fn paired_diff_interval(t: &Paired, level: f64) -> Option<(f64, f64)> {
    if t.n() == 0 {
        return None;
    }
    let z = z_for(level);
    let n = t.n() as f64 + 2.0;
    let p_s = (t.suspect_only as f64 + 0.5) / n;
    let p_b = (t.baseline_only as f64 + 0.5) / n;
    let d = p_s - p_b;
    let var = ((p_s + p_b) - d * d) / n;
    let half = z * var.max(0.0).sqrt();
    Some(((d - half).max(-1.0), (d + half).min(1.0)))
}

/// The outcome of one look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// The verdict.
    pub verdict: Verdict,
    /// McNemar's exact p-value.
    pub p_value: f64,
    /// Suspect − baseline pass rate.
    pub diff: Option<f64>,
    /// The paired difference's interval at this look's Bonferroni level.
    pub diff_interval: Option<(f64, f64)>,
    /// α spent at this look ([`look_alpha`]).
    pub look_alpha: f64,
    /// Confidence level of `diff_interval` (1 − 0.05 / looks).
    pub interval_level: f64,
}

/// The α that look `look` (1-based) of `looks` spends on "degraded": α(t_j) − α(t_{j−1}) at
/// t_j = j/K under Lan–DeMets' O'Brien–Fleming-type spending function α(t) = 2 − 2Φ(z/√t),
/// z = Φ⁻¹(1 − α/2), so the looks together spend exactly α (α(1) = α). At α = 0.01 and four
/// looks: 2.6e-7, 2.7e-4, 2.7e-3 and 7.1e-3. A look past the last spends nothing.
pub fn look_alpha(alpha: f64, looks: u32, look: u32) -> f64 {
    let k = looks.max(1);
    if look == 0 || look > k {
        return 0.0;
    }
    // α(1) is α itself (not its rounded normal tail), so the looks sum to α exactly
    let at = |j: u32| {
        if j == k {
            alpha
        } else {
            spent(alpha, f64::from(j) / f64::from(k))
        }
    };
    at(look) - at(look - 1)
}

/// The O'Brien–Fleming-type spending function α(t), t in [0, 1].
fn spent(alpha: f64, t: f64) -> f64 {
    if t <= 0.0 {
        return 0.0;
    }
    let z = z_for(1.0 - alpha);
    match Normal::new(0.0, 1.0) {
        Ok(n) => (2.0 * (1.0 - n.cdf(z / t.sqrt()))).min(alpha),
        Err(_) => alpha * t,
    }
}

/// The verdict rule at look `look` (1-based) of `p.looks`: degraded when the suspect is
/// worse by more than δ with p below the look's α ([`look_alpha`]); equivalent when the
/// (1 − 0.05/K) interval of the difference lies within ±δ; otherwise inconclusive; n/a
/// without items.
pub fn decide(t: &Paired, p: &VerdictParams, look: u32) -> Decision {
    let looks = f64::from(p.looks.max(1));
    let look_alpha = look_alpha(p.alpha, p.looks, look);
    let interval_level = 1.0 - 0.05 / looks;
    let p_value = mcnemar_exact(t.baseline_only, t.suspect_only);
    let diff = t.diff();
    let diff_interval = paired_diff_interval(t, interval_level);
    let verdict = match (diff, diff_interval) {
        (None, _) | (_, None) => Verdict::NotApplicable,
        (Some(d), Some((lo, hi))) => {
            if d < -p.delta && t.baseline_only > t.suspect_only && p_value < look_alpha {
                Verdict::Degraded
            } else if lo >= -p.delta && hi <= p.delta {
                Verdict::Equivalent
            } else {
                Verdict::Inconclusive
            }
        }
    };
    Decision {
        verdict,
        p_value,
        diff,
        diff_interval,
        look_alpha,
        interval_level,
    }
}

/// The verdict over co-primary outcomes of the same items (a tool-call suite's check and
/// its calls' schema validity). *Degraded* by Hochberg's step-up rule over the tables that
/// have items: when every one is degraded at α, or any one at α/m (m tables; valid since
/// the outcomes are positively dependent — a broken call fails both), so the chance of a
/// false "degraded" stays at most α, and two tables that agree lose no power to the split;
/// *equivalent* when every table is; otherwise *inconclusive*; *n/a* when the first table
/// has no items. Returns the verdict and each table's decision at the full α (a later table
/// without items is decided "n/a" and does not count). `look` as for [`decide`].
pub fn decide_all(tables: &[Paired], p: &VerdictParams, look: u32) -> (Verdict, Vec<Decision>) {
    let m = tables.iter().filter(|t| t.n() > 0).count().max(1);
    let split = VerdictParams {
        alpha: p.alpha / m as f64,
        ..*p
    };
    let ds: Vec<Decision> = tables.iter().map(|t| decide(t, p, look)).collect();
    let live: Vec<Verdict> = ds
        .iter()
        .map(|d| d.verdict)
        .filter(|v| *v != Verdict::NotApplicable)
        .collect();
    let any_at_split = tables
        .iter()
        .any(|t| t.n() > 0 && decide(t, &split, look).verdict == Verdict::Degraded);
    let verdict = match ds.first().map(|d| d.verdict) {
        None | Some(Verdict::NotApplicable) => Verdict::NotApplicable,
        Some(_) if live.iter().all(|v| *v == Verdict::Degraded) || any_at_split => {
            Verdict::Degraded
        }
        Some(_) if live.iter().all(|v| *v == Verdict::Equivalent) => Verdict::Equivalent,
        Some(_) => Verdict::Inconclusive,
    };
    (verdict, ds)
}

/// Whether a job stops at this look, and why: "decided" when the look's verdict is decided,
/// "budget" once `spent` tokens reach the job's `budget`. The worker and the verdict-power
/// benchmark's resampled jobs stop by this one rule.
pub fn stop_reason(verdict: Verdict, spent: i64, budget: i64) -> Option<&'static str> {
    if verdict.decided() {
        Some("decided")
    } else if spent >= budget {
        Some("budget")
    } else {
        None
    }
}

/// The looks of a job of `n` items ([`look_points`]), with `p.looks` set to their count:
/// a job of fewer items than looks looks fewer times, its last look spending what is left
/// of α. The worker and the verdict-power benchmark plan their looks by this one rule.
pub fn plan_looks(n: usize, p: &mut VerdictParams) -> Vec<usize> {
    let points = look_points(n, p.looks);
    p.looks = u32::try_from(points.len()).unwrap_or(1).max(1);
    points
}

/// The item counts after which a job of `n` items looks: ⌈j·n/K⌉ for j = 1..K, deduplicated.
pub fn look_points(n: usize, looks: u32) -> Vec<usize> {
    let k = looks.max(1) as usize;
    let mut out: Vec<usize> = (1..=k)
        .map(|j| (j * n).div_ceil(k))
        .filter(|&x| x > 0)
        .collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn wilson_matches_published_values() {
        // 81/263 at 95%: 0.2553..0.3662 (Wilson 1927 / Newcombe 1998 example)
        let (lo, hi) = wilson(81, 263, 0.95).unwrap_or((0.0, 0.0));
        assert!(
            close(lo, 0.2553, 5e-4) && close(hi, 0.3662, 5e-4),
            "{lo} {hi}"
        );
        let (lo, hi) = wilson(0, 10, 0.95).unwrap_or((1.0, 1.0));
        assert!(lo.abs() < 1e-12 && close(hi, 0.2775, 5e-4), "{lo} {hi}");
        assert_eq!(wilson(0, 0, 0.95), None);
        assert!(close(z_for(0.95), 1.959_964, 1e-5));
    }

    #[test]
    fn paired_interval_is_centred_and_shrinks() {
        let mut t = Paired::default();
        for _ in 0..100 {
            t.add(true, true);
        }
        let (lo, hi) = paired_diff_interval(&t, 0.95).unwrap_or((-1.0, 1.0));
        assert!(close(lo, -hi, 1e-12) && hi < 0.02, "{lo} {hi}");
        let mut small = Paired::default();
        for _ in 0..10 {
            small.add(true, true);
        }
        let (_, hi_small) = paired_diff_interval(&small, 0.95).unwrap_or((-1.0, 1.0));
        assert!(hi_small > hi);
    }

    #[test]
    fn verdicts_each_reachable() {
        let p = VerdictParams {
            looks: 1,
            ..VerdictParams::default()
        };
        assert_eq!(
            decide(&Paired::default(), &p, 1).verdict,
            Verdict::NotApplicable
        );
        // the suspect fails 20 of 40 items the baseline passes
        let t = Paired {
            both_pass: 20,
            baseline_only: 20,
            ..Paired::default()
        };
        let d = decide(&t, &p, 1);
        assert_eq!(d.verdict, Verdict::Degraded, "{d:?}");
        assert!(d.p_value < 1e-5 && d.diff == Some(-0.5));
        // the same answers on 200 items
        let t = Paired {
            both_pass: 150,
            both_fail: 50,
            ..Paired::default()
        };
        assert_eq!(decide(&t, &p, 1).verdict, Verdict::Equivalent);
        // 12 items, all the same: too few for ±5 points
        let t = Paired {
            both_pass: 12,
            ..Paired::default()
        };
        assert_eq!(decide(&t, &p, 1).verdict, Verdict::Inconclusive);
        // better, not worse: never degraded
        let t = Paired {
            suspect_only: 20,
            both_pass: 20,
            ..Paired::default()
        };
        assert_eq!(decide(&t, &p, 1).verdict, Verdict::Inconclusive);
    }

    #[test]
    fn looks_spend_alpha() {
        let p = VerdictParams::default();
        let spend: Vec<f64> = (1..=4).map(|j| look_alpha(0.01, 4, j)).collect();
        // the O'Brien–Fleming-type increments (Lan & DeMets 1983) at α = 0.01, K = 4
        let want = [2.57e-7, 2.69e-4, 2.66e-3, 7.07e-3];
        for (got, want) in spend.iter().zip(want) {
            assert!(close(*got, want, want * 0.01), "{spend:?}");
        }
        assert!(close(spend.iter().sum::<f64>(), 0.01, 1e-15), "{spend:?}");
        assert!(close(look_alpha(0.01, 1, 1), 0.01, 1e-15));
        assert_eq!(look_alpha(0.01, 4, 0), 0.0);
        assert_eq!(look_alpha(0.01, 4, 5), 0.0);
        // 9 vs 0 discordant: p = 0.0039 < 0.01 with one look; with 4, not at the third look
        // (α_3 = 0.0027) but at the last (α_4 = 0.0071); 10 vs 0 (p = 0.0020) at the third
        let t = |k| Paired {
            both_pass: 11,
            baseline_only: k,
            ..Paired::default()
        };
        let one = VerdictParams {
            looks: 1,
            ..VerdictParams::default()
        };
        assert_eq!(decide(&t(9), &one, 1).verdict, Verdict::Degraded);
        assert_eq!(decide(&t(9), &p, 3).verdict, Verdict::Inconclusive);
        assert_eq!(decide(&t(9), &p, 4).verdict, Verdict::Degraded);
        assert_eq!(decide(&t(10), &p, 3).verdict, Verdict::Degraded);
        // the first look stops only for a fault far beyond chance
        assert_eq!(decide(&t(20), &p, 1).verdict, Verdict::Inconclusive);
        assert_eq!(decide(&t(24), &p, 1).verdict, Verdict::Degraded);
        assert_eq!(look_points(10, 4), vec![3, 5, 8, 10]);
        assert_eq!(look_points(2, 4), vec![1, 2]);
        assert_eq!(look_points(0, 4), Vec::<usize>::new());
    }

    #[test]
    fn co_primary_tables_follow_hochberg() {
        let p = VerdictParams {
            looks: 1,
            ..VerdictParams::default()
        };
        let same = |n| Paired {
            both_pass: n,
            ..Paired::default()
        };
        // the check alike on both sides, the calls' validity lost on 40 of 200 items: one
        // table degraded far below α/2
        let lost = Paired {
            both_pass: 160,
            baseline_only: 40,
            ..Paired::default()
        };
        let (v, ds) = decide_all(&[same(200), lost], &p, 1);
        assert_eq!(v, Verdict::Degraded);
        assert_eq!(ds[0].verdict, Verdict::Equivalent);
        assert!((ds[1].look_alpha - 0.01).abs() < 1e-12, "{:?}", ds[1]);
        // equivalent only when every table is
        assert_eq!(
            decide_all(&[same(200), same(200)], &p, 1).0,
            Verdict::Equivalent
        );
        assert_eq!(
            decide_all(&[same(200), same(12)], &p, 1).0,
            Verdict::Inconclusive
        );
        // a second table without items does not count
        let (v, ds) = decide_all(&[same(200), Paired::default()], &p, 1);
        assert_eq!(v, Verdict::Equivalent);
        assert_eq!(ds[1].verdict, Verdict::NotApplicable);
        // 8 vs 0 discordant (p = 0.0078): degraded at α = 0.01 alone; beside a table that
        // shows nothing it would need α/2; beside a table that agrees, α suffices
        let eight = Paired {
            both_pass: 12,
            baseline_only: 8,
            ..Paired::default()
        };
        assert_eq!(decide_all(&[eight], &p, 1).0, Verdict::Degraded);
        assert_eq!(
            decide_all(&[eight, same(20)], &p, 1).0,
            Verdict::Inconclusive
        );
        assert_eq!(decide_all(&[eight, eight], &p, 1).0, Verdict::Degraded);
        assert_eq!(
            decide_all(&[Paired::default(), lost], &p, 1).0,
            Verdict::NotApplicable
        );
    }

    proptest! {
        #[test]
        fn intervals_are_ordered_and_bounded(k in 0u64..200, extra in 0u64..200, b in 0u64..50, c in 0u64..50, s in 0u64..50) {
            let n = k + extra;
            if let Some((lo, hi)) = wilson(k, n, 0.95) {
                prop_assert!(0.0 <= lo && lo <= k as f64 / n as f64 + 1e-12);
                prop_assert!(hi <= 1.0 && hi + 1e-12 >= k as f64 / n as f64);
            }
            let t = Paired { both_pass: s, suspect_only: c, baseline_only: b, both_fail: 0 };
            let p = mcnemar_exact(b, c);
            prop_assert!((0.0..=1.0).contains(&p));
            prop_assert!((p - mcnemar_exact(c, b)).abs() < 1e-12);
            if let Some((lo, hi)) = paired_diff_interval(&t, 0.95) {
                prop_assert!(-1.0 <= lo && lo <= hi && hi <= 1.0);
            }
        }
    }
}
