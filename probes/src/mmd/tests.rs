//! Tests of `mmd`: hand-computed kernel and MMD² values, and seeded simulations with toy
//! character-level language models: identical generators give uniform p-values (false-alarm
//! rate at α = 0.05 within a binomial band over 200 trials), a perturbed generator is found
//! with power near 1.

use rand::Rng;
use rand::rngs::StdRng;

use super::*;
use crate::sim;

#[test]
fn hamming_kernel_hand_values() {
    assert_eq!(hamming_kernel("abc", "abd"), 0.999);
    assert_eq!(hamming_kernel("", ""), 1.0);
    assert_eq!(hamming_kernel("ab", ""), 0.998);
    let a = "a".repeat(1000);
    let b = "b".repeat(1000);
    assert_eq!(hamming_kernel(&a, &b), 0.0);
    // only the first 1,000 characters count
    assert_eq!(hamming_kernel(&format!("{a}xyz"), &format!("{a}uvw")), 1.0);
    // characters, not bytes: é is one position
    assert_eq!(hamming_kernel("éa", "éb"), 0.999);
    assert_eq!(hamming_kernel("éa", "ea"), 0.999);
}

#[test]
fn mmd_hand_value_and_p_value_range() {
    // X = {aa, aa}, Y = {bb, bb}: k(x,x) = k(y,y) = 1, k(x,y) = 998/1000
    // MMD² = 1 + 1 − 2·0.998 = 0.004
    let p = PromptSamples {
        endpoint: vec!["aa".into(), "aa".into()],
        reference: vec!["bb".into(), "bb".into()],
    };
    let cfg = PermutationConfig {
        permutations: 99,
        seed: 1,
    };
    let r = mmd_test(std::slice::from_ref(&p), &cfg).unwrap();
    assert!((r.statistic - 0.004).abs() < 1e-12, "{r:?}");
    assert_eq!(r.prompts, 1);
    // of the 6 labelings, 2 ({aa,aa}|{bb,bb} and its swap) reach the maximum: p ≈ 1/3
    assert!(r.p_value > 0.15 && r.p_value < 0.55, "{r:?}");
    // reproducible
    assert_eq!(mmd_test(std::slice::from_ref(&p), &cfg).unwrap(), r);
    // identical sets: MMD² is negative (unbiased estimator), p-value high
    let same = PromptSamples {
        endpoint: vec!["ab".into(), "cd".into()],
        reference: vec!["ab".into(), "cd".into()],
    };
    let r = mmd_test(&[same], &cfg).unwrap();
    assert!(r.statistic < 0.0 && r.p_value > 0.5, "{r:?}");
}

#[test]
fn bad_inputs_are_errors() {
    let cfg = PermutationConfig::default();
    assert!(mmd_test(&[], &cfg).is_err());
    let one = PromptSamples {
        endpoint: vec!["a".into()],
        reference: vec!["a".into(), "b".into()],
    };
    assert!(mmd_test(&[one], &cfg).is_err());
    let p = PromptSamples {
        endpoint: vec!["a".into(), "b".into()],
        reference: vec!["a".into(), "b".into()],
    };
    assert!(
        mmd_test(
            &[p],
            &PermutationConfig {
                permutations: 0,
                seed: 0
            }
        )
        .is_err()
    );
    assert!(loglik_test(&[], &cfg).is_err());
    let bad = PromptLoglik {
        endpoint: vec![f64::NAN],
        reference: vec![-1.0],
    };
    assert!(loglik_test(&[bad], &cfg).is_err());
    let empty = PromptLoglik {
        endpoint: vec![],
        reference: vec![-1.0],
    };
    assert!(loglik_test(&[empty], &cfg).is_err());
}

#[test]
fn loglik_hand_value() {
    // prompt 1: ep mean −1, ref mean −2 → +1; prompt 2: ep −3, ref −3 → 0; T = 0.5
    let p = vec![
        PromptLoglik {
            endpoint: vec![-1.0, -1.0],
            reference: vec![-2.0, -2.0],
        },
        PromptLoglik {
            endpoint: vec![-3.0],
            reference: vec![-3.0],
        },
    ];
    let r = loglik_test(
        &p,
        &PermutationConfig {
            permutations: 200,
            seed: 3,
        },
    )
    .unwrap();
    assert_eq!(r.statistic, 0.5);
    assert_eq!(r.prompts, 2);
}

const ALPHABET: [char; 8] = ['a', 'b', 'c', 'd', 'e', 'f', 'g', ' '];
const PROMPTS: usize = 10;
const SAMPLES: usize = 10;
const LENGTH: usize = 40;

/// A toy character-level "model": per prompt and position, log-probabilities over ALPHABET.
struct ToyModel {
    logprobs: Vec<Vec<[f64; 8]>>,
}

impl ToyModel {
    /// Logits N(0, 1.5²) from `seed`; `noise` adds N(0, noise²) to every logit, the way
    /// re-quantized weights perturb a real model's logits.
    fn new(seed: u64, noise: f64, noise_seed: u64) -> Self {
        let mut g = sim::rng(seed);
        let mut n = sim::rng(noise_seed);
        let logprobs = (0..PROMPTS)
            .map(|_| {
                (0..LENGTH)
                    .map(|_| {
                        let mut l = [0.0; 8];
                        for v in &mut l {
                            *v = 1.5 * sim::normal(&mut g) + noise * sim::normal(&mut n);
                        }
                        let lse = l.iter().map(|v| v.exp()).sum::<f64>().ln();
                        l.map(|v| v - lse)
                    })
                    .collect()
            })
            .collect();
        Self { logprobs }
    }

    fn sample(&self, prompt: usize, g: &mut StdRng) -> String {
        self.logprobs[prompt]
            .iter()
            .map(|lp| {
                let mut u: f64 = g.random();
                for (c, l) in ALPHABET.iter().zip(lp) {
                    u -= l.exp();
                    if u <= 0.0 {
                        return *c;
                    }
                }
                ALPHABET[7]
            })
            .collect()
    }

    fn mean_loglik(&self, prompt: usize, s: &str) -> f64 {
        let total: f64 = s
            .chars()
            .zip(&self.logprobs[prompt])
            .map(|(c, lp)| lp[ALPHABET.iter().position(|&a| a == c).unwrap_or(7)])
            .sum();
        total / LENGTH as f64
    }
}

/// Runs both tests on one seeded draw of samples; returns (MMD p, log-likelihood p).
fn trial(reference: &ToyModel, endpoint: &ToyModel, seed: u64) -> (f64, f64) {
    let mut g = sim::rng(seed);
    let mut samples = Vec::new();
    let mut lls = Vec::new();
    for p in 0..PROMPTS {
        let e: Vec<String> = (0..SAMPLES).map(|_| endpoint.sample(p, &mut g)).collect();
        let r: Vec<String> = (0..SAMPLES).map(|_| reference.sample(p, &mut g)).collect();
        lls.push(PromptLoglik {
            endpoint: e.iter().map(|s| reference.mean_loglik(p, s)).collect(),
            reference: r.iter().map(|s| reference.mean_loglik(p, s)).collect(),
        });
        samples.push(PromptSamples {
            endpoint: e,
            reference: r,
        });
    }
    let cfg = PermutationConfig {
        permutations: 200,
        seed: seed ^ 0xabcdef,
    };
    let m = mmd_test(&samples, &cfg).unwrap();
    let l = loglik_test(&lls, &cfg).unwrap();
    (m.p_value, l.p_value)
}

/// Two identical generators, 200 seeded trials: the number of p ≤ 0.05 must be a plausible
/// Binomial(200, 0.05) count (3σ band), and p ≤ 0.5 a plausible Binomial(200, 0.5) count.
#[test]
fn identical_generators_give_uniform_p_values() {
    let model = ToyModel::new(11, 0.0, 0);
    let trials = 200;
    let ps: Vec<(f64, f64)> = (0..trials)
        .map(|t| trial(&model, &model, 1000 + t as u64))
        .collect();
    let (lo5, hi5) = sim::binomial_band(trials, 0.05);
    let (lo50, hi50) = sim::binomial_band(trials, 0.5);
    for (name, pick) in [("MMD", 0usize), ("log-likelihood", 1)] {
        let p: Vec<f64> = ps
            .iter()
            .map(|t| if pick == 0 { t.0 } else { t.1 })
            .collect();
        let rej = p.iter().filter(|&&v| v <= 0.05).count() as f64;
        let half = p.iter().filter(|&&v| v <= 0.5).count() as f64;
        eprintln!(
            "{name} under H0: false alarms at α=0.05: {rej}/{trials} ({:.3}); p ≤ 0.5: {half}/{trials}",
            rej / trials as f64
        );
        assert!(
            (lo5..=hi5).contains(&rej),
            "{name}: {rej} false alarms outside [{lo5:.1}, {hi5:.1}]"
        );
        assert!(
            (lo50..=hi50).contains(&half),
            "{name}: {half} outside [{lo50:.1}, {hi50:.1}]"
        );
    }
}

/// A generator whose logits carry N(0, 1) noise (as re-quantized weights would): with 10
/// prompts × 10 samples per side, both tests reject at α = 0.05 in ≥ 95% of 100 trials.
#[test]
fn perturbed_generator_is_detected() {
    let reference = ToyModel::new(11, 0.0, 0);
    let endpoint = ToyModel::new(11, 1.0, 99);
    let trials = 100;
    let ps: Vec<(f64, f64)> = (0..trials)
        .map(|t| trial(&reference, &endpoint, 5000 + t as u64))
        .collect();
    let power_mmd = ps.iter().filter(|t| t.0 <= 0.05).count() as f64 / trials as f64;
    let power_ll = ps.iter().filter(|t| t.1 <= 0.05).count() as f64 / trials as f64;
    eprintln!(
        "power at α=0.05 (10 prompts × 10 samples, logit noise sd 1): MMD {power_mmd:.2}, log-likelihood {power_ll:.2}"
    );
    assert!(power_mmd >= 0.95, "MMD power {power_mmd}");
    assert!(power_ll >= 0.95, "log-likelihood power {power_ll}");
    // a subtler perturbation (noise sd 0.4): power is lower but still well above α
    let subtle = ToyModel::new(11, 0.4, 99);
    let ps: Vec<(f64, f64)> = (0..trials)
        .map(|t| trial(&reference, &subtle, 7000 + t as u64))
        .collect();
    let weak_mmd = ps.iter().filter(|t| t.0 <= 0.05).count() as f64 / trials as f64;
    let weak_ll = ps.iter().filter(|t| t.1 <= 0.05).count() as f64 / trials as f64;
    eprintln!(
        "power at α=0.05, logit noise sd 0.4: MMD {weak_mmd:.2}, log-likelihood {weak_ll:.2}"
    );
    assert!(weak_mmd > 0.2 && weak_ll > 0.2, "{weak_mmd} {weak_ll}");
}

#[test]
fn samples_p_value_is_bonferroni_over_both_tests() {
    assert_eq!(samples_p_value(0.3, None), (0.3, SamplesTest::Mmd));
    assert_eq!(
        samples_p_value(0.3, Some(0.002)),
        (0.004, SamplesTest::Loglik)
    );
    assert_eq!(samples_p_value(0.001, Some(0.5)), (0.002, SamplesTest::Mmd));
    // ties go to the MMD; the p-value never exceeds 1
    assert_eq!(samples_p_value(0.7, Some(0.7)), (1.0, SamplesTest::Mmd));
    assert_eq!(SamplesTest::Loglik.statistic(), "loglik_diff");
    assert_eq!(SamplesTest::Mmd.statistic(), "mmd");
}
