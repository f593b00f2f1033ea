//! Passive traffic detectors: one endpoint's traffic against the pooled rest of the endpoints
//! serving the same model, with Benjamini–Hochberg across endpoints.
//!
//! The proxy records, per request, whether a tool call failed, whether the request errored,
//! whether the repetition guard cut it, the output length and the finish reason. These tests
//! compare those records across endpoints of one model:
//! - [`two_proportion_z`] (pooled, two-sided) for rates — tool-call errors, errors,
//!   repetition cuts — and [`proportions_vs_rest`] to run it for every endpoint against the
//!   union of the others (with one strong outlier the others differ from the contaminated
//!   rest too, in the opposite direction: a harm detector reads the sign of `z`);
//! - [`mann_whitney_u`] for output lengths (two-sided, normal approximation with tie
//!   correction and continuity correction: the numbers of scipy's
//!   `mannwhitneyu(x, y, method="asymptotic")`);
//! - [`chi_square_independence`] on a table of finish-reason counts (no Yates correction:
//!   scipy's `chi2_contingency(t, correction=False)`), [`counts_vs_rest`] per endpoint;
//! - [`benjamini_hochberg`] turns the per-endpoint p-values into the set of endpoints flagged
//!   at false-discovery rate `q` (valid under independence or positive dependence).
//!
//! Distributions come from `statrs`.
//!
//! [`two_proportion_z`]: crate::passive::two_proportion_z
//! [`proportions_vs_rest`]: crate::passive::proportions_vs_rest
//! [`mann_whitney_u`]: crate::passive::mann_whitney_u
//! [`chi_square_independence`]: crate::passive::chi_square_independence
//! [`counts_vs_rest`]: crate::passive::counts_vs_rest
//! [`benjamini_hochberg`]: crate::passive::benjamini_hochberg

use statrs::distribution::{ChiSquared, ContinuousCDF, Normal};

use crate::{ProbesError, Result, invalid};

/// A test's statistic and two-sided p-value.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TestResult {
    /// z for the z-test, U of the first sample for Mann–Whitney, X² for chi-square.
    pub statistic: f64,
    /// The p-value, in [0, 1].
    pub p_value: f64,
}

/// Upper tail of the standard normal, `P(Z > z)`.
pub fn normal_sf(z: f64) -> f64 {
    // statrs's Normal::new(0, 1) cannot fail; fall back to the erfc identity regardless.
    match Normal::new(0.0, 1.0) {
        Ok(n) => n.sf(z),
        Err(_) => 0.5 * statrs::function::erf::erfc(z / std::f64::consts::SQRT_2),
    }
}

/// Two-sided pooled two-proportion z-test of `x1/n1` against `x2/n2`.
/// `z = (p1 − p2) / sqrt(p(1−p)(1/n1 + 1/n2))` with `p = (x1+x2)/(n1+n2)`; when `p` is 0 or 1
/// the samples cannot differ and the result is `z = 0, p = 1`.
pub fn two_proportion_z(x1: u64, n1: u64, x2: u64, n2: u64) -> Result<TestResult> {
    if n1 == 0 || n2 == 0 {
        return Err(invalid("two-proportion test needs two non-empty samples"));
    }
    if x1 > n1 || x2 > n2 {
        return Err(invalid("successes exceed trials"));
    }
    let (x1, n1, x2, n2) = (x1 as f64, n1 as f64, x2 as f64, n2 as f64);
    let p = (x1 + x2) / (n1 + n2);
    let se = (p * (1.0 - p) * (1.0 / n1 + 1.0 / n2)).sqrt();
    if se == 0.0 {
        return Ok(TestResult {
            statistic: 0.0,
            p_value: 1.0,
        });
    }
    let z = (x1 / n1 - x2 / n2) / se;
    Ok(TestResult {
        statistic: z,
        p_value: (2.0 * normal_sf(z.abs())).min(1.0),
    })
}

/// For each endpoint `(successes, trials)`, the two-proportion test of it against the sum of
/// all the others. Needs at least two endpoints; an endpoint with no trials is an error.
pub fn proportions_vs_rest(counts: &[(u64, u64)]) -> Result<Vec<TestResult>> {
    if counts.len() < 2 {
        return Err(invalid("need at least two endpoints"));
    }
    let (sx, sn) = counts
        .iter()
        .fold((0u64, 0u64), |(a, b), &(x, n)| (a + x, b + n));
    counts
        .iter()
        .map(|&(x, n)| two_proportion_z(x, n, sx - x, sn - n))
        .collect()
}

/// Average ranks (1-based) of `values`, ties sharing the mean of their ranks, plus the tie
/// correction term `Σ (t³ − t)` over tie groups.
fn average_ranks(values: &[f64]) -> (Vec<f64>, f64) {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    let mut ties = 0.0;
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && values[idx[j + 1]] == values[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            ranks[k] = avg;
        }
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        i = j + 1;
    }
    (ranks, ties)
}

/// Two-sided Mann–Whitney U test of `x` against `y`. The statistic is `U` of `x`
/// (`R_x − n_x(n_x+1)/2`); the p-value is the normal approximation with tie correction
/// `σ² = n_x n_y / 12 · ((n+1) − Σ(t³−t)/(n(n−1)))` and continuity correction, computed from
/// `max(U_x, U_y)` as scipy does. All values tied gives p = 1.
pub fn mann_whitney_u(x: &[f64], y: &[f64]) -> Result<TestResult> {
    if x.is_empty() || y.is_empty() {
        return Err(invalid("Mann-Whitney needs two non-empty samples"));
    }
    if x.iter().chain(y).any(|v| v.is_nan()) {
        return Err(invalid("Mann-Whitney sample contains NaN"));
    }
    let (n1, n2) = (x.len() as f64, y.len() as f64);
    let all: Vec<f64> = x.iter().chain(y).copied().collect();
    let (ranks, ties) = average_ranks(&all);
    let r1: f64 = ranks[..x.len()].iter().sum();
    let u1 = r1 - n1 * (n1 + 1.0) / 2.0;
    let u2 = n1 * n2 - u1;
    let n = n1 + n2;
    let mu = n1 * n2 / 2.0;
    let var = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if var <= 0.0 {
        return Ok(TestResult {
            statistic: u1,
            p_value: 1.0,
        });
    }
    let z = (u1.max(u2) - mu - 0.5) / var.sqrt();
    Ok(TestResult {
        statistic: u1,
        p_value: (2.0 * normal_sf(z)).clamp(0.0, 1.0),
    })
}

/// Chi-square test of independence on a contingency table of counts (rows: groups, columns:
/// categories), without Yates correction. All-zero rows and columns are dropped first; a
/// table left with fewer than two rows or columns has nothing to test (`X² = 0, p = 1`).
/// Returns the statistic, the p-value and the degrees of freedom.
pub fn chi_square_independence(table: &[Vec<u64>]) -> Result<(TestResult, usize)> {
    let cols = table.first().map_or(0, Vec::len);
    if table.iter().any(|r| r.len() != cols) {
        return Err(invalid("contingency table rows differ in length"));
    }
    let keep_cols: Vec<usize> = (0..cols)
        .filter(|&c| table.iter().any(|r| r[c] > 0))
        .collect();
    let rows: Vec<Vec<f64>> = table
        .iter()
        .filter(|r| r.iter().any(|&v| v > 0))
        .map(|r| keep_cols.iter().map(|&c| r[c] as f64).collect())
        .collect();
    if rows.len() < 2 || keep_cols.len() < 2 {
        return Ok((
            TestResult {
                statistic: 0.0,
                p_value: 1.0,
            },
            0,
        ));
    }
    let row_sums: Vec<f64> = rows.iter().map(|r| r.iter().sum()).collect();
    let col_sums: Vec<f64> = (0..keep_cols.len())
        .map(|c| rows.iter().map(|r| r[c]).sum())
        .collect();
    let total: f64 = row_sums.iter().sum();
    let mut x2 = 0.0;
    for (r, row) in rows.iter().enumerate() {
        for (c, &obs) in row.iter().enumerate() {
            let exp = row_sums[r] * col_sums[c] / total;
            x2 += (obs - exp).powi(2) / exp;
        }
    }
    let dof = (rows.len() - 1) * (keep_cols.len() - 1);
    let chi = ChiSquared::new(dof as f64).map_err(|e| invalid(format!("chi-square: {e}")))?;
    Ok((
        TestResult {
            statistic: x2,
            p_value: chi.sf(x2).clamp(0.0, 1.0),
        },
        dof,
    ))
}

/// For each endpoint's category counts (e.g. finish reasons `stop`, `length`, `tool_calls`,
/// ...), the chi-square test of the 2 × K table {this endpoint, all the others}.
pub fn counts_vs_rest(counts: &[Vec<u64>]) -> Result<Vec<TestResult>> {
    if counts.len() < 2 {
        return Err(invalid("need at least two endpoints"));
    }
    let k = counts[0].len();
    if counts.iter().any(|c| c.len() != k) {
        return Err(invalid("endpoints report different numbers of categories"));
    }
    let total: Vec<u64> = (0..k).map(|c| counts.iter().map(|r| r[c]).sum()).collect();
    counts
        .iter()
        .map(|row| {
            let rest: Vec<u64> = total.iter().zip(row).map(|(t, v)| t - v).collect();
            chi_square_independence(&[row.clone(), rest]).map(|(r, _)| r)
        })
        .collect()
}

/// For each endpoint's sample (e.g. output lengths), Mann–Whitney U against the pooled
/// samples of all the others.
pub fn samples_vs_rest(samples: &[Vec<f64>]) -> Result<Vec<TestResult>> {
    if samples.len() < 2 {
        return Err(invalid("need at least two endpoints"));
    }
    (0..samples.len())
        .map(|i| {
            let rest: Vec<f64> = samples
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .flat_map(|(_, s)| s.iter().copied())
                .collect();
            mann_whitney_u(&samples[i], &rest)
        })
        .collect()
}

/// Benjamini–Hochberg adjusted p-values (`min over j ≥ i of m·p_(j)/j`, capped at 1), in the
/// input order.
pub fn bh_adjusted(p_values: &[f64]) -> Result<Vec<f64>> {
    if p_values.iter().any(|p| !(0.0..=1.0).contains(p)) {
        return Err(invalid("p-values must lie in [0, 1]"));
    }
    let m = p_values.len();
    let mut idx: Vec<usize> = (0..m).collect();
    idx.sort_by(|&a, &b| p_values[a].total_cmp(&p_values[b]));
    let mut adj = vec![1.0; m];
    let mut running = 1.0f64;
    for rank in (0..m).rev() {
        let i = idx[rank];
        running = running.min(p_values[i] * m as f64 / (rank + 1) as f64);
        adj[i] = running.min(1.0);
    }
    Ok(adj)
}

/// Which hypotheses Benjamini–Hochberg rejects at false-discovery rate `q` (in the input
/// order): all those with rank ≤ the largest `i` such that `p_(i) ≤ i·q/m`.
pub fn benjamini_hochberg(p_values: &[f64], q: f64) -> Result<Vec<bool>> {
    if !(q > 0.0 && q < 1.0) {
        return Err(ProbesError::InvalidInput(format!(
            "FDR level {q} not in (0, 1)"
        )));
    }
    Ok(bh_adjusted(p_values)?.into_iter().map(|a| a <= q).collect())
}

#[cfg(test)]
mod tests;
