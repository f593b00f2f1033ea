//! From logits to numbers: log-softmax, the top-k list (sorted by logprob, ties by id),
//! greedy choice and seeded sampling (temperature, top-k, top-p).
//!
//! All of it is sequential over the vocabulary in id order, so it is as deterministic as
//! the logits it reads.

use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;

use crate::kernels::ops;

/// A token and its logprob.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// Token id.
    pub token: u32,
    /// Natural-log probability under the model (temperature 1, no filtering).
    pub logprob: f32,
}

/// Calls the compilation of a function for the widest vector unit this CPU has: its
/// AVX-512F copy, its AVX copy, or the plain one (each the same operations, so the same bits).
macro_rules! widest {
    ($avx512:ident, $avx:ident, $plain:ident ($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                return unsafe { $avx512($($arg),*) };
            }
            if std::arch::is_x86_feature_detected!("avx") {
                // SAFETY: the CPU has AVX.
                return unsafe { $avx($($arg),*) };
            }
        }
        $plain($($arg),*)
    }};
}

/// Log-sum-exp of a logits row: `max + ln Σ exp(l - max)`, exps in f32, summed in f64 in 8
/// fixed lanes (element i in lane i % 8, in order) then a fixed tree. Compiled for the
/// widest vector unit the CPU has: the same operations in the same order, so the same bits.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    widest!(
        log_sum_exp_avx512,
        log_sum_exp_avx,
        log_sum_exp_body(logits)
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn log_sum_exp_avx512(logits: &[f32]) -> f64 {
    log_sum_exp_body(logits)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn log_sum_exp_avx(logits: &[f32]) -> f64 {
    log_sum_exp_body(logits)
}

#[inline(always)]
fn log_sum_exp_body(logits: &[f32]) -> f64 {
    // the maximum over 16 lanes: the same value in any order (NaN ignored, as f32::max does)
    let mut m = [f32::NEG_INFINITY; 16];
    let blocks = logits.chunks_exact(16);
    let mut max = blocks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in blocks {
        for (a, &l) in m.iter_mut().zip(c) {
            *a = a.max(l);
        }
    }
    max = m.iter().copied().fold(max, f32::max);
    // exps a block at a time (one vector loop), then each added to its lane (another)
    let mut lanes = [0f64; 8];
    let mut buf = [0f32; 256];
    for chunk in logits.chunks(256) {
        let b = &mut buf[..chunk.len()];
        for (e, &l) in b.iter_mut().zip(chunk) {
            *e = ops::exp(l - max);
        }
        let blocks = b.chunks_exact(8);
        let rest = blocks.remainder();
        for c in blocks {
            for (a, &e) in lanes.iter_mut().zip(c) {
                *a += f64::from(e);
            }
        }
        // a chunk is 256 long but the last: its remainder starts at lane 0 too
        for (a, &e) in lanes.iter_mut().zip(rest) {
            *a += f64::from(e);
        }
    }
    let sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    f64::from(max) + sum.ln()
}

/// The logprob of token `t` given the row's log-sum-exp.
pub fn logprob(logits: &[f32], lse: f64, t: u32) -> f32 {
    (f64::from(logits[t as usize]) - lse) as f32
}

/// The `k` most likely tokens, by logit descending then id ascending. Once `k` are held, a
/// block of 16 logits none of which beats the k-th is passed over in one vector compare.
pub fn top_k(logits: &[f32], lse: f64, k: usize) -> Vec<TokenLogprob> {
    widest!(top_k_avx512, top_k_avx, top_k_body(logits, lse, k))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn top_k_avx512(logits: &[f32], lse: f64, k: usize) -> Vec<TokenLogprob> {
    top_k_body(logits, lse, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn top_k_avx(logits: &[f32], lse: f64, k: usize) -> Vec<TokenLogprob> {
    top_k_body(logits, lse, k)
}

#[inline(always)]
fn top_k_body(logits: &[f32], lse: f64, k: usize) -> Vec<TokenLogprob> {
    if k == 0 {
        return Vec::new();
    }
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (b, block) in logits.chunks(16).enumerate() {
        // a logit enters only if it is greater than the k-th held (never a NaN, never a tie,
        // which the lower id already holding it keeps)
        if best.len() == k {
            let kth = best[k - 1].0;
            if !block.iter().fold(false, |any, &l| any | (l > kth)) {
                continue;
            }
        }
        for (j, &l) in block.iter().enumerate() {
            offer(&mut best, k, l, (b * 16 + j) as u32);
        }
    }
    listed(best, lse)
}

/// Offers logit `l` of token `t` to `best`, the at most `k` largest so far by logit
/// descending (ids offered in ascending order, so a tie keeps the lower id first).
#[inline(always)]
fn offer(best: &mut Vec<(f32, u32)>, k: usize, l: f32, t: u32) {
    if best.len() == k && l.partial_cmp(&best[k - 1].0) != Some(std::cmp::Ordering::Greater) {
        return;
    }
    let pos = best
        .iter()
        .position(|&(bl, _)| l > bl)
        .unwrap_or(best.len());
    best.insert(pos, (l, t));
    best.truncate(k);
}

/// The held logits as logprobs.
fn listed(best: Vec<(f32, u32)>, lse: f64) -> Vec<TokenLogprob> {
    best.into_iter()
        .map(|(l, t)| TokenLogprob {
            token: t,
            logprob: (f64::from(l) - lse) as f32,
        })
        .collect()
}

/// How to pick the next token.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax, lowest id on ties).
    pub temperature: f32,
    /// Nucleus mass kept, in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// RNG seed; None draws one from the OS.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
        }
    }
}

/// A sampler: parameters plus its RNG.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler for these parameters.
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Self { params, rng }
    }

    /// Picks a token from a logits row.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        let inv_t = 1.0 / f64::from(p.temperature);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // candidates (weight, id); unnormalized probabilities exp((l - max) / T)
        let weight = |l: f32| ((f64::from(l) - f64::from(max)) * inv_t).exp();
        let mut cand: Vec<(f64, u32)> = if p.top_k > 0 || p.top_p < 1.0 {
            let mut all: Vec<(f64, u32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (weight(l), i as u32))
                .filter(|c| c.0 > 0.0)
                .collect();
            all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            if p.top_k > 0 {
                all.truncate(p.top_k);
            }
            if p.top_p < 1.0 {
                let total: f64 = all.iter().map(|c| c.0).sum();
                let mut acc = 0.0;
                let mut keep = all.len();
                for (i, c) in all.iter().enumerate() {
                    acc += c.0;
                    if acc >= f64::from(p.top_p) * total {
                        keep = i + 1;
                        break;
                    }
                }
                all.truncate(keep.max(1));
            }
            all
        } else {
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (weight(l), i as u32))
                .collect()
        };
        let total: f64 = cand.iter().map(|c| c.0).sum();
        let mut u = self.rng.random::<f64>() * total;
        for c in &cand {
            if u < c.0 {
                return c.1;
            }
            u -= c.0;
        }
        cand.pop().map_or_else(|| argmax(logits), |c| c.1)
    }
}

/// The index of the largest logit (lowest index on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar definitions the vectorized functions must equal bit for bit.
    fn log_sum_exp_reference(logits: &[f32]) -> f64 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut lanes = [0f64; 8];
        for (i, &l) in logits.iter().enumerate() {
            lanes[i % 8] += f64::from(ops::exp(l - max));
        }
        let sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
            + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        f64::from(max) + sum.ln()
    }

    /// Every logit offered in order, no block passed over.
    fn top_k_reference(logits: &[f32], lse: f64, k: usize) -> Vec<TokenLogprob> {
        let mut best = Vec::new();
        if k > 0 {
            for (i, &l) in logits.iter().enumerate() {
                offer(&mut best, k, l, i as u32);
            }
        }
        listed(best, lse)
    }

    type LseFn = fn(&[f32]) -> f64;
    type TopKFn = fn(&[f32], f64, usize) -> Vec<TokenLogprob>;

    #[test]
    fn vectorized_log_softmax_and_top_k_equal_the_scalar_definitions_bit_for_bit() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in [
            0usize, 1, 7, 8, 15, 16, 17, 100, 255, 256, 257, 4_099, 49_152,
        ] {
            for case in 0..6 {
                let row: Vec<f32> = (0..len)
                    .map(|i| {
                        let r = next();
                        match case {
                            // spread values; many exact ties (few distinct values)
                            0 => (r % 2_000_000) as f32 / 1e5 - 10.0,
                            1 => (r % 7) as f32,
                            // huge and tiny magnitudes, signed zeros, infinities, NaN
                            2 => match r % 9 {
                                0 => f32::NAN,
                                1 => f32::NEG_INFINITY,
                                2 => -0.0,
                                3 => 0.0,
                                4 => 1e30,
                                5 => -1e30,
                                6 => f32::INFINITY,
                                _ => f32::from_bits((r >> 9) as u32),
                            },
                            // an increasing row: every block beats the k-th
                            3 => i as f32 * 1e-3,
                            // all equal
                            4 => 1.5,
                            // NaNs first, then values
                            _ => {
                                if i < 20 {
                                    f32::NAN
                                } else {
                                    (r % 1000) as f32
                                }
                            }
                        }
                    })
                    .collect();
                let want = log_sum_exp_reference(&row);
                // every path this CPU can run: the dispatched one, each vector width, plain
                let mut paths: Vec<(&str, LseFn, TopKFn)> = vec![
                    ("dispatched", log_sum_exp, top_k),
                    ("plain", log_sum_exp_body, top_k_body),
                ];
                #[cfg(target_arch = "x86_64")]
                {
                    if std::arch::is_x86_feature_detected!("avx") {
                        // SAFETY: the CPU has AVX.
                        paths.push((
                            "avx",
                            |l| unsafe { log_sum_exp_avx(l) },
                            |l, s, k| unsafe { top_k_avx(l, s, k) },
                        ));
                    }
                    if std::arch::is_x86_feature_detected!("avx512f") {
                        // SAFETY: the CPU has AVX-512F.
                        paths.push((
                            "avx512",
                            |l| unsafe { log_sum_exp_avx512(l) },
                            |l, s, k| unsafe { top_k_avx512(l, s, k) },
                        ));
                    }
                }
                for (name, lse_fn, top_fn) in paths {
                    let got = lse_fn(&row);
                    // bit for bit, except that a NaN's sign and payload may differ (x86's
                    // vector units make the negative default NaN)
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "{name}: len {len} case {case}: {got} vs {want}"
                    );
                    for k in [0, 1, 5, 20] {
                        let (a, b) = (top_fn(&row, want, k), top_k_reference(&row, want, k));
                        let bits = |v: &[TokenLogprob]| -> Vec<(u32, u32)> {
                            v.iter()
                                .map(|t| {
                                    let l = if t.logprob.is_nan() {
                                        f32::NAN
                                    } else {
                                        t.logprob
                                    };
                                    (t.token, l.to_bits())
                                })
                                .collect()
                        };
                        assert_eq!(bits(&a), bits(&b), "{name}: len {len} case {case} k {k}");
                    }
                }
            }
        }
    }

    #[test]
    fn top_k_sorted_with_ties_by_id() {
        let logits = [1.0, 3.0, 2.0, 3.0, -1.0];
        let lse = log_sum_exp(&logits);
        let top = top_k(&logits, lse, 3);
        let ids: Vec<u32> = top.iter().map(|t| t.token).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        let total: f64 = logits.iter().map(|&l| (f64::from(l) - lse).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(argmax(&logits), 1);
    }

    #[test]
    fn seeded_sampling_repeats_and_respects_top_k() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 5,
            seed: Some(42),
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(params.clone());
            (0..50).map(|_| s.pick(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..50).map(|_| s.pick(&logits)).collect()
        };
        assert_eq!(a, b);
        let lse = log_sum_exp(&logits);
        let allowed: Vec<u32> = top_k(&logits, lse, 5).iter().map(|t| t.token).collect();
        assert!(a.iter().all(|t| allowed.contains(t)));
        assert!(a.iter().any(|&t| t != a[0]), "sampling at T=1 should vary");
    }
}
