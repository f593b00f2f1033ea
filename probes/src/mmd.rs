//! The samples probe's two-sample tests, for endpoints that return no logprobs: Model
//! Equality Testing's MMD with a Hamming kernel (Gao, Liang & Guestrin, ICLR 2025), and a
//! test on the reference's log-likelihood of the samples.
//!
//! For each prompt the endpoint and the reference each produce several samples at
//! temperature 1. Under "same model" the two sets are draws from one distribution, so the
//! labels endpoint/reference are exchangeable *within each prompt*; both tests get their
//! p-values by permuting labels within prompts (seeded, reproducible), which is exact at any
//! sample size.
//!
//! # The Hamming kernel
//! Each sample is cut to its first [`HAMMING_LENGTH`] = 1,000 Unicode scalar values and padded
//! to that length with a pad symbol that equals itself and no character. Then
//! `k(x, y) = (1/1000) · #{i < 1000 : x_i = y_i}`: the matches over the shorter length, plus
//! `1000 − max(|x|, |y|)` for the positions where both are padding. It is a positive-definite
//! kernel (a normalised sum of per-position indicator kernels).
//!
//! # MMD²
//! Per prompt, with `m` endpoint samples X and `n` reference samples Y (each ≥ 2), the
//! unbiased estimator `MMD²_u = Σ_{i≠j} k(x_i,x_j)/(m(m−1)) + Σ_{i≠j} k(y_i,y_j)/(n(n−1)) −
//! 2 Σ_{i,j} k(x_i,y_j)/(mn)`; the statistic is its mean over prompts. The p-value is
//! `(1 + #{b : T_b ≥ T}) / (B + 1)` over `B` within-prompt label permutations.
//!
//! # Log-likelihood test
//! [`loglik_test`] takes, per prompt, the reference's mean per-token log-likelihood of each
//! endpoint sample and of each reference sample. Prompts differ in scale (an easy prompt's
//! samples are all likely), so instead of pooling them into one rank test the statistic is
//! `T = mean over prompts of (mean_endpoint − mean_reference)`, two-sided, with the same
//! within-prompt permutation p-value `(1 + #{b : |T_b| ≥ |T|}) / (B + 1)`. A quantized or
//! re-tempered endpoint moves the likelihood of its samples one way consistently; the sign of
//! `T` says which.
//!
//! # One decision over both
//! The detector flags a samples run on [`samples_p_value`]: Bonferroni's `2 · min(p_mmd,
//! p_loglik)`, so a flag at `p < α` keeps the per-round false-flag rate at most α whatever the
//! two tests' dependence. The log-likelihood test carries the power on quantized weights (see
//! the README's detection benchmark, part C); the MMD stays for what the reference's
//! likelihood cannot see.
//!
//! [`HAMMING_LENGTH`]: crate::mmd::HAMMING_LENGTH
//! [`loglik_test`]: crate::mmd::loglik_test
//! [`samples_p_value`]: crate::mmd::samples_p_value

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::{Result, invalid};

/// Characters of each sample the Hamming kernel looks at.
pub const HAMMING_LENGTH: usize = 1000;

/// Permutation settings shared by both tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PermutationConfig {
    /// Number of label permutations `B` (the smallest reachable p-value is `1/(B+1)`).
    pub permutations: usize,
    /// Seed of the permutation generator, so a stored run's p-value can be recomputed.
    pub seed: u64,
}

impl Default for PermutationConfig {
    fn default() -> Self {
        Self {
            permutations: 1000,
            seed: 0x5a3e_5157,
        }
    }
}

/// The samples of one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSamples {
    /// Completions from the endpoint under test.
    pub endpoint: Vec<String>,
    /// Completions from the reference engine.
    pub reference: Vec<String>,
}

/// A permutation test's outcome.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PermutationResult {
    /// The observed statistic (mean MMD², or mean log-likelihood difference).
    pub statistic: f64,
    /// Permutation p-value, in `[1/(B+1), 1]`.
    pub p_value: f64,
    /// Number of prompts that entered the statistic.
    pub prompts: usize,
}

/// A sample cut to the kernel's window, as characters.
fn window(s: &str) -> Vec<char> {
    s.chars().take(HAMMING_LENGTH).collect()
}

/// The Hamming kernel on two windows (see the module doc).
fn hamming_windows(x: &[char], y: &[char]) -> f64 {
    let same = x.iter().zip(y).filter(|(a, b)| a == b).count();
    let both_pad = HAMMING_LENGTH - x.len().max(y.len());
    (same + both_pad) as f64 / HAMMING_LENGTH as f64
}

/// The Hamming kernel of two strings over their first 1,000 characters.
pub fn hamming_kernel(x: &str, y: &str) -> f64 {
    hamming_windows(&window(x), &window(y))
}

/// One prompt's pooled Gram matrix; index `< m` are the endpoint's samples at first.
struct PromptGram {
    k: Vec<f64>,
    size: usize,
    m: usize,
}

impl PromptGram {
    fn new(p: &PromptSamples) -> Result<Self> {
        if p.endpoint.len() < 2 || p.reference.len() < 2 {
            return Err(invalid(
                "MMD needs at least two samples per side for every prompt",
            ));
        }
        let w: Vec<Vec<char>> = p
            .endpoint
            .iter()
            .chain(&p.reference)
            .map(|s| window(s))
            .collect();
        let size = w.len();
        let mut k = vec![0.0; size * size];
        for i in 0..size {
            for j in i + 1..size {
                let v = hamming_windows(&w[i], &w[j]);
                k[i * size + j] = v;
                k[j * size + i] = v;
            }
        }
        Ok(Self {
            k,
            size,
            m: p.endpoint.len(),
        })
    }

    /// Unbiased MMD² with `is_x[i]` saying which pooled samples play the endpoint.
    fn mmd2(&self, is_x: &[bool]) -> f64 {
        let (mut sxx, mut syy, mut sxy) = (0.0, 0.0, 0.0);
        for i in 0..self.size {
            let row = &self.k[i * self.size..(i + 1) * self.size];
            for j in i + 1..self.size {
                match (is_x[i], is_x[j]) {
                    (true, true) => sxx += row[j],
                    (false, false) => syy += row[j],
                    _ => sxy += row[j],
                }
            }
        }
        let m = self.m as f64;
        let n = (self.size - self.m) as f64;
        2.0 * sxx / (m * (m - 1.0)) + 2.0 * syy / (n * (n - 1.0)) - 2.0 * sxy / (m * n)
    }
}

fn check_config(cfg: &PermutationConfig) -> Result<()> {
    if cfg.permutations == 0 {
        return Err(invalid("at least one permutation is needed"));
    }
    Ok(())
}

/// MMD² with the Hamming kernel, averaged over prompts, with its within-prompt permutation
/// p-value. Every prompt needs ≥ 2 samples on each side.
pub fn mmd_test(prompts: &[PromptSamples], cfg: &PermutationConfig) -> Result<PermutationResult> {
    check_config(cfg)?;
    if prompts.is_empty() {
        return Err(invalid("no prompts"));
    }
    let grams: Vec<PromptGram> = prompts.iter().map(PromptGram::new).collect::<Result<_>>()?;
    let mut labels: Vec<Vec<bool>> = grams
        .iter()
        .map(|g| (0..g.size).map(|i| i < g.m).collect())
        .collect();
    let np = grams.len() as f64;
    let stat = |labels: &[Vec<bool>]| -> f64 {
        grams
            .iter()
            .zip(labels)
            .map(|(g, l)| g.mmd2(l))
            .sum::<f64>()
            / np
    };
    let observed = stat(&labels);
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut at_least = 0usize;
    for _ in 0..cfg.permutations {
        for l in &mut labels {
            l.shuffle(&mut rng);
        }
        // ties count as "at least as extreme" (a small tolerance absorbs summation order)
        if stat(&labels) >= observed - 1e-12 {
            at_least += 1;
        }
    }
    Ok(PermutationResult {
        statistic: observed,
        p_value: (1 + at_least) as f64 / (cfg.permutations + 1) as f64,
        prompts: grams.len(),
    })
}

/// Per prompt, the reference's mean per-token log-likelihood of each sample.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLoglik {
    /// Of the endpoint's samples.
    pub endpoint: Vec<f64>,
    /// Of the reference's own samples.
    pub reference: Vec<f64>,
}

/// The two-sided within-prompt permutation test on the reference log-likelihood of the
/// endpoint's samples against the reference's own (see the module doc). Every prompt needs
/// ≥ 1 finite value on each side.
pub fn loglik_test(prompts: &[PromptLoglik], cfg: &PermutationConfig) -> Result<PermutationResult> {
    check_config(cfg)?;
    if prompts.is_empty() {
        return Err(invalid("no prompts"));
    }
    let mut pooled: Vec<(Vec<f64>, usize)> = Vec::with_capacity(prompts.len());
    for p in prompts {
        if p.endpoint.is_empty() || p.reference.is_empty() {
            return Err(invalid(
                "log-likelihood test needs samples on both sides of every prompt",
            ));
        }
        if p.endpoint
            .iter()
            .chain(&p.reference)
            .any(|v| !v.is_finite())
        {
            return Err(invalid("log-likelihoods must be finite"));
        }
        let v: Vec<f64> = p.endpoint.iter().chain(&p.reference).copied().collect();
        pooled.push((v, p.endpoint.len()));
    }
    let np = pooled.len() as f64;
    let stat = |pooled: &[(Vec<f64>, usize)]| -> f64 {
        pooled
            .iter()
            .map(|(v, m)| {
                let (a, b) = v.split_at(*m);
                a.iter().sum::<f64>() / a.len() as f64 - b.iter().sum::<f64>() / b.len() as f64
            })
            .sum::<f64>()
            / np
    };
    let observed = stat(&pooled);
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut at_least = 0usize;
    for _ in 0..cfg.permutations {
        for (v, _) in &mut pooled {
            v.shuffle(&mut rng);
        }
        if stat(&pooled).abs() >= observed.abs() - 1e-12 {
            at_least += 1;
        }
    }
    Ok(PermutationResult {
        statistic: observed,
        p_value: (1 + at_least) as f64 / (cfg.permutations + 1) as f64,
        prompts: pooled.len(),
    })
}

/// Which of the samples probe's two tests gave its p-value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplesTest {
    /// [`mmd_test`].
    Mmd,
    /// [`loglik_test`].
    Loglik,
}

impl SamplesTest {
    /// The statistic's name in a samples run's stats (`mmd`, `loglik_diff`).
    pub fn statistic(self) -> &'static str {
        match self {
            SamplesTest::Mmd => "mmd",
            SamplesTest::Loglik => "loglik_diff",
        }
    }
}

/// The samples probe's one p-value over its two tests: Bonferroni's `min(1, 2 · min(p_mmd,
/// p_loglik))` and the test that gave the smaller p when the log-likelihood test ran (so a
/// flag at `p < α` keeps the false-flag rate per round at most α whatever the two tests'
/// dependence), else the MMD's own p.
pub fn samples_p_value(p_mmd: f64, p_loglik: Option<f64>) -> (f64, SamplesTest) {
    match p_loglik {
        Some(pl) if pl < p_mmd => ((2.0 * pl).min(1.0), SamplesTest::Loglik),
        Some(_) => ((2.0 * p_mmd).min(1.0), SamplesTest::Mmd),
        None => (p_mmd, SamplesTest::Mmd),
    }
}

#[cfg(test)]
mod tests;
