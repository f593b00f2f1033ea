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

/// Log-sum-exp of a logits row: `max + ln Σ exp(l - max)`, exps in f32 (vectorizable,
/// same bits either way), summed in f64 in 8 fixed lanes then a fixed tree.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut lanes = [0f64; 8];
    let mut buf = [0f32; 256];
    for chunk in logits.chunks(256) {
        let b = &mut buf[..chunk.len()];
        for (e, &l) in b.iter_mut().zip(chunk) {
            *e = ops::exp(l - max);
        }
        for (i, &e) in b.iter().enumerate() {
            lanes[i % 8] += f64::from(e);
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

/// The `k` most likely tokens, by logit descending then id ascending.
pub fn top_k(logits: &[f32], lse: f64, k: usize) -> Vec<TokenLogprob> {
    if k == 0 {
        return Vec::new();
    }
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if best.len() == k && l.partial_cmp(&best[k - 1].0) != Some(std::cmp::Ordering::Greater) {
            continue;
        }
        let pos = best
            .iter()
            .position(|&(bl, _)| l > bl)
            .unwrap_or(best.len());
        best.insert(pos, (l, i as u32));
        best.truncate(k);
    }
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
