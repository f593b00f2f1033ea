//! From logits to numbers: log-softmax, the top-k list (sorted by logprob, ties by id),
//! greedy choice and seeded sampling (temperature, min-p, top-k, top-p), after the logit
//! adjustments: OpenAI's `logit_bias`, `presence_penalty` and `frequency_penalty`, and
//! vLLM's (Hugging Face's) `repetition_penalty`.
//!
//! All of it is sequential over the vocabulary in id order, so it is as deterministic as
//! the logits it reads. The adjustments change only which token is chosen: logprobs stay the
//! model's own.

use std::collections::BTreeMap;

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
    /// Keep only tokens at least this fraction as likely as the most likely one (after the
    /// temperature), in [0, 1]; 0 disables it.
    pub min_p: f32,
    /// RNG seed; None draws one from the OS.
    pub seed: Option<u64>,
    /// Added to these tokens' logits before choosing (OpenAI's `logit_bias`): (id, bias).
    pub logit_bias: Vec<(u32, f32)>,
    /// Subtracted once from the logit of every token generated so far (`presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated so far
    /// (`frequency_penalty`).
    pub frequency_penalty: f32,
    /// Divides the positive logits and multiplies the others of every token in the prompt or
    /// generated so far (`repetition_penalty`, > 0); 1 disables it.
    pub repetition_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            logit_bias: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

impl SamplingParams {
    /// Whether the penalties count generated tokens.
    fn penalises(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 || self.repeats()
    }

    /// Whether the repetition penalty is on (it also reads the prompt).
    fn repeats(&self) -> bool {
        self.repetition_penalty != 1.0
    }

    /// The first parameter out of its range, if any: its API name and what is wrong. The one
    /// range check for library callers and the HTTP API (which adds only type checks).
    pub fn invalid(&self) -> Option<(&'static str, String)> {
        let in_range = |x: f32, lo: f32, hi: f32| x.is_finite() && (lo..=hi).contains(&x);
        let bad =
            |param: &'static str, range: &str| Some((param, format!("{param} must be {range}")));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", ">= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "in (0, 1]");
        }
        if !in_range(self.min_p, 0.0, 1.0) {
            return bad("min_p", "in [0, 1]");
        }
        if !in_range(self.presence_penalty, -2.0, 2.0) {
            return bad("presence_penalty", "in [-2, 2]");
        }
        if !in_range(self.frequency_penalty, -2.0, 2.0) {
            return bad("frequency_penalty", "in [-2, 2]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 100.0) {
            return bad("repetition_penalty", "in (0, 100]");
        }
        if let Some(&(token, _)) = self
            .logit_bias
            .iter()
            .find(|&&(_, b)| !in_range(b, -100.0, 100.0))
        {
            return Some((
                "logit_bias",
                format!("logit_bias for token {token} must be in [-100, 100]"),
            ));
        }
        None
    }
}

/// A sampler: parameters, its RNG, and how often each token was generated (when a penalty
/// needs it).
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Token -> times generated so far (kept only when a penalty is set; a prompt token the
    /// repetition penalty reads is here with 0 until generated).
    counts: BTreeMap<u32, u32>,
    /// The adjusted row, kept between picks.
    scratch: Vec<f32>,
}

impl Sampler {
    /// A sampler for these parameters.
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Self {
            params,
            rng,
            counts: BTreeMap::new(),
            scratch: Vec::new(),
        }
    }

    /// Notes the prompt's tokens for the repetition penalty (which reads them; the other
    /// penalties count generated tokens only).
    pub fn observe_prompt(&mut self, prompt: &[u32]) {
        if self.params.repeats() {
            for &t in prompt {
                self.counts.entry(t).or_insert(0);
            }
        }
    }

    /// Counts a generated token for the penalties of the picks after it.
    pub fn observe(&mut self, token: u32) {
        if self.params.penalises() {
            *self.counts.entry(token).or_insert(0) += 1;
        }
    }

    /// Applies the adjustments to a logits row, in f32 and in this order: the bias is added;
    /// a token in the prompt or generated so far (repetition penalty r ≠ 1) becomes `l / r`
    /// if `l > 0`, else `l * r`; a token generated c > 0 times so far then loses
    /// `c * frequency_penalty + presence_penalty` (OpenAI's definition). Other tokens keep
    /// theirs; ids outside the row are passed over.
    pub fn adjust(&self, row: &mut [f32]) {
        let p = &self.params;
        for &(t, b) in &p.logit_bias {
            if let Some(l) = row.get_mut(t as usize) {
                *l += b;
            }
        }
        let repeats = p.repeats();
        for (&t, &c) in &self.counts {
            let Some(l) = row.get_mut(t as usize) else {
                continue;
            };
            if repeats {
                *l = if *l > 0.0 {
                    *l / p.repetition_penalty
                } else {
                    *l * p.repetition_penalty
                };
            }
            if c > 0 {
                *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
    }

    /// Picks a token from a logits row, after the adjustments.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.params.logit_bias.is_empty() && self.counts.is_empty() {
            return self.choose(logits);
        }
        let mut row = std::mem::take(&mut self.scratch);
        row.clear();
        row.extend_from_slice(logits);
        self.adjust(&mut row);
        let t = self.choose(&row);
        self.scratch = row;
        t
    }

    /// Picks a token from a row as it is.
    fn choose(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        let inv_t = 1.0 / f64::from(p.temperature);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // candidates (weight, id); unnormalized probabilities exp((l - max) / T)
        let weight = |l: f32| ((f64::from(l) - f64::from(max)) * inv_t).exp();
        let mut cand: Vec<(f64, u32)> = if p.top_k > 0 || p.top_p < 1.0 || p.min_p > 0.0 {
            // min-p first: the most likely token's weight is exactly 1
            let floor = f64::from(p.min_p);
            let mut all: Vec<(f64, u32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (weight(l), i as u32))
                .filter(|c| c.0 > 0.0 && c.0 >= floor)
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

/// `logits` with the `tokens` (those within the row) set to −∞: never chosen.
pub fn masked(logits: &[f32], tokens: &[u32]) -> Vec<f32> {
    let mut row = logits.to_vec();
    for &t in tokens {
        if let Some(x) = row.get_mut(t as usize) {
            *x = f32::NEG_INFINITY;
        }
    }
    row
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
            ..SamplingParams::default()
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

    /// The definitions, written out: `l + bias`; then, for a token in the prompt or
    /// generated, `/ r` if positive else `* r`; then `- (c * frequency + presence)` for a token
    /// generated c > 0 times so far.
    fn adjusted_by_hand(
        logits: &[f32],
        p: &SamplingParams,
        prompt: &[u32],
        generated: &[u32],
    ) -> Vec<f32> {
        logits
            .iter()
            .enumerate()
            .map(|(j, &l)| {
                let b = p
                    .logit_bias
                    .iter()
                    .find(|(t, _)| *t as usize == j)
                    .map_or(0.0, |x| x.1);
                let c = generated.iter().filter(|&&t| t as usize == j).count();
                let mut l = l + b;
                if p.repetition_penalty != 1.0 && (c > 0 || prompt.contains(&(j as u32))) {
                    l = if l > 0.0 {
                        l / p.repetition_penalty
                    } else {
                        l * p.repetition_penalty
                    };
                }
                if c > 0 {
                    l -= c as f32 * p.frequency_penalty + p.presence_penalty;
                }
                l
            })
            .collect()
    }

    #[test]
    fn adjustments_follow_their_definitions_bit_for_bit() {
        let logits: Vec<f32> = (0..64).map(|i| (i as f32 * 0.73).cos() * 3.0).collect();
        let prompt = [1u32, 2, 5, 40, 41, 2];
        let generated = [5u32, 7, 5, 63, 5, 10];
        for repetition_penalty in [1.0, 1.3, 0.8] {
            let params = SamplingParams {
                logit_bias: vec![(3, 2.5), (10, -100.0), (63, 0.125), (500, 7.0)],
                presence_penalty: 0.7,
                frequency_penalty: -0.3,
                repetition_penalty,
                ..SamplingParams::default()
            };
            assert_eq!(params.invalid(), None);
            let mut s = Sampler::new(params.clone());
            s.observe_prompt(&prompt);
            let mut seen = Vec::new();
            for &t in &generated {
                let mut row = logits.clone();
                s.adjust(&mut row);
                let want = adjusted_by_hand(&logits, &params, &prompt, &seen);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&row), bits(&want), "after {seen:?}");
                // greedy picks the adjusted row's argmax
                assert_eq!(s.pick(&logits), argmax(&want), "after {seen:?}");
                s.observe(t);
                seen.push(t);
            }
            // a masked (-inf) logit stays masked whatever its bias or count
            let mut row = vec![f32::NEG_INFINITY; 64];
            s.adjust(&mut row);
            assert!(row.iter().all(|&l| l == f32::NEG_INFINITY));
        }
    }

    #[test]
    fn min_p_keeps_tokens_as_likely_as_a_fraction_of_the_top_one() {
        // at temperature 1: weights relative to token 0's are 1, e^-0.5, e^-1, e^-3
        let logits = [2.0f32, 1.5, 1.0, -1.0];
        let drawn = |min_p: f32| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.0,
                min_p,
                seed: Some(11),
                ..SamplingParams::default()
            });
            (0..400)
                .map(|_| s.pick(&logits))
                .collect::<std::collections::BTreeSet<u32>>()
        };
        assert_eq!(drawn(0.0), [0, 1, 2, 3].into());
        // e^-1 = 0.37 passes 0.3, e^-3 = 0.05 does not
        assert_eq!(drawn(0.3), [0, 1, 2].into());
        assert_eq!(drawn(0.5), [0, 1].into());
        assert_eq!(drawn(1.0), [0].into());
    }

    #[test]
    fn out_of_range_parameters_are_named() {
        let bad = [
            SamplingParams {
                min_p: 1.5,
                ..SamplingParams::default()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..SamplingParams::default()
            },
            SamplingParams {
                repetition_penalty: 100.5,
                ..SamplingParams::default()
            },
            SamplingParams {
                presence_penalty: f32::NAN,
                ..SamplingParams::default()
            },
            SamplingParams {
                frequency_penalty: -2.5,
                ..SamplingParams::default()
            },
            SamplingParams {
                logit_bias: vec![(1, 101.0)],
                ..SamplingParams::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: -1.0,
                ..SamplingParams::default()
            },
        ];
        for p in bad {
            assert!(p.invalid().is_some(), "{p:?}");
        }
        assert_eq!(SamplingParams::default().invalid(), None);
    }

    #[test]
    fn penalties_turn_greedy_away_from_repeats_and_defaults_change_nothing() {
        // token 0 leads by 1.0 over token 1, which leads token 2 by 1.0
        let logits = [3.0f32, 2.0, 1.0, -5.0];
        let run = |params: SamplingParams| {
            let mut s = Sampler::new(params);
            (0..6)
                .map(|_| {
                    let t = s.pick(&logits);
                    s.observe(t);
                    t
                })
                .collect::<Vec<u32>>()
        };
        assert_eq!(run(SamplingParams::default()), vec![0; 6]);
        // presence 1.5: each token can be chosen once before the unused next one wins
        let presence = SamplingParams {
            presence_penalty: 1.5,
            ..SamplingParams::default()
        };
        assert_eq!(run(presence), vec![0, 1, 0, 0, 0, 0]);
        // frequency 0.6: 0 (3.0), 0 (2.4 over 2.0), 1 (2.0 over 1.8), 0 (1.8 over 1.4),
        // 1 (1.4 over 1.2), 0 (1.2 over 1.0)
        let frequency = SamplingParams {
            frequency_penalty: 0.6,
            ..SamplingParams::default()
        };
        assert_eq!(run(frequency), vec![0, 0, 1, 0, 1, 0]);
        // a bias of -100 bans the leader; +100 on the last makes it the only choice
        let ban = SamplingParams {
            logit_bias: vec![(0, -100.0)],
            ..SamplingParams::default()
        };
        assert_eq!(run(ban), vec![1; 6]);
        let force = SamplingParams {
            logit_bias: vec![(3, 100.0)],
            temperature: 1.0,
            seed: Some(7),
            ..SamplingParams::default()
        };
        assert_eq!(run(force), vec![3; 6]);
        // no adjustment asked: nothing counted, the row used as it is
        let mut s = Sampler::new(SamplingParams::default());
        s.observe(0);
        assert!(s.counts.is_empty());
    }
}
