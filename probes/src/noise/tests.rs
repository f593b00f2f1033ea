//! Tests of `noise`: the floor's bookkeeping, and a seeded simulation through the real
//! pipeline (full logits → top-k view → compare → summary → ladder): a toy model, a ladder
//! calibrated on it with fixed weight-like perturbations, a faithful endpoint with per-request
//! noise (not flagged thanks to its floor, though the ladder alone would flag it) and a
//! biased 4-bit-like endpoint (flagged, ≈ 4-bit).

use rand::Rng;
use rand::rngs::StdRng;

use super::*;
use crate::compare::{kl_full, log_softmax, position_from_full_logprobs};
use crate::ladder::{Level, LevelKind};
use crate::sim;

const V: usize = 64;
const P: usize = 300;
const K: usize = 5;

struct Toy {
    logits: Vec<Vec<f32>>,
    actual: Vec<u32>,
}

fn toy(g: &mut StdRng) -> Toy {
    let logits: Vec<Vec<f32>> = (0..P)
        .map(|_| (0..V).map(|_| (2.5 * sim::normal(g)) as f32).collect())
        .collect();
    let actual = logits
        .iter()
        .map(|l| {
            let lp = log_softmax(l).unwrap();
            let mut u: f64 = g.random();
            for (i, v) in lp.iter().enumerate() {
                u -= v.exp();
                if u <= 0.0 {
                    return i as u32;
                }
            }
            (V - 1) as u32
        })
        .collect();
    Toy { logits, actual }
}

fn perturb(base: &[Vec<f32>], sd: f64, g: &mut StdRng) -> Vec<Vec<f32>> {
    base.iter()
        .map(|l| {
            l.iter()
                .map(|&x| x + (sd * sim::normal(g)) as f32)
                .collect()
        })
        .collect()
}

/// Positions as a probe would see them: reference full logits vs an endpoint's.
fn positions(t: &Toy, ep: &[Vec<f32>]) -> Vec<PositionInput> {
    (0..P)
        .map(|i| {
            let r = log_softmax(&t.logits[i]).unwrap();
            let e = log_softmax(&ep[i]).unwrap();
            position_from_full_logprobs(&r, &e, t.actual[i], K).unwrap()
        })
        .collect()
}

fn calibrate(t: &Toy, g: &mut StdRng) -> Ladder {
    let levels = [
        (8u32, 0.02),
        (6, 0.08),
        (5, 0.16),
        (4, 0.32),
        (3, 0.64),
        (2, 1.28),
    ]
    .iter()
    .map(|&(bits, sd)| {
        let ep = perturb(&t.logits, sd, g);
        let s = summarize(&compare_run(&positions(t, &ep)).unwrap()).unwrap();
        let full: Vec<f64> = (0..P)
            .map(|i| kl_full(&t.logits[i], &ep[i]).unwrap())
            .collect();
        Level {
            name: format!("w{bits}"),
            kind: LevelKind::Weights,
            bits,
            kl_mean: full.iter().sum::<f64>() / P as f64,
            kl_p99: crate::compare::quantile_nearest_rank(&full, 0.99).unwrap(),
            kl_topk_mean: s.kl_mean,
            dlogprob_mean: s.abs_dlogprob_mean,
            top1_same: s.top1_same,
            topk_overlap: s.topk_overlap,
        }
    })
    .collect();
    let l = Ladder {
        model: "toy".into(),
        model_sha256: "0".into(),
        corpus: "simulated".into(),
        positions: P as u64,
        top_k: K as u32,
        levels,
    };
    l.validate().unwrap();
    l
}

#[test]
fn floor_keeps_recent_extremes() {
    let mut f = NoiseFloor::default();
    assert_eq!(f.floor(), None);
    for v in [0.5, 0.1, 0.2] {
        f.record(v).unwrap();
    }
    assert_eq!(f.floor(), Some(0.5));
    assert_eq!(f.floor_rate(), Some(0.1));
    assert_eq!(f.floor_for(Metric::KlTopkMean), Some(0.5));
    assert_eq!(f.floor_for(Metric::Top1Same), Some(0.1));
    for _ in 0..FLOOR_WINDOW {
        f.record(0.05).unwrap();
    }
    assert_eq!(f.floor(), Some(0.05), "old values leave the window");
    assert!(f.record(f64::NAN).is_err());
}

#[test]
fn repeat_summary_checks_its_inputs() {
    let mut g = sim::rng(3);
    let t = toy(&mut g);
    let a = positions(&t, &t.logits);
    let s = repeat_summary(&a, &a).unwrap();
    assert!(s.kl_mean < 1e-12 && s.top1_same == 1.0 && s.topk_overlap == 1.0);
    assert!(repeat_summary(&a, &a[1..]).is_err());
    let mut b = a.clone();
    b[0].actual_id += 1;
    assert!(repeat_summary(&a, &b).is_err());
}

#[test]
fn rule_arithmetic() {
    let mut g = sim::rng(4);
    let t = toy(&mut g);
    let l = calibrate(&t, &mut g);
    let rule = FaithfulRule::default();
    let thr = l.threshold(Metric::KlTopkMean, "w6").unwrap();
    let j = judge(&l, Metric::KlTopkMean, thr * 2.0, None, &rule).unwrap();
    assert!(j.unfaithful && j.effective_threshold == thr);
    let j = judge(&l, Metric::KlTopkMean, thr * 2.0, Some(thr), &rule).unwrap();
    assert!(!j.unfaithful && (j.effective_threshold - 3.0 * thr).abs() < 1e-15);
    // rates work on 1 − rate
    let t1 = l.threshold(Metric::Top1Same, "w6").unwrap();
    let j = judge(
        &l,
        Metric::Top1Same,
        1.0 - 2.0 * (1.0 - t1),
        Some(1.0 - (1.0 - t1)),
        &rule,
    )
    .unwrap();
    assert!(!j.unfaithful, "{j:?}");
    assert!(
        judge(
            &l,
            Metric::KlTopkMean,
            0.1,
            None,
            &FaithfulRule {
                floor_factor: 0.5,
                ..rule.clone()
            }
        )
        .is_err()
    );
    assert!(judge(&l, Metric::KlTopkMean, 0.1, Some(f64::NAN), &rule).is_err());
}

/// Over 20 seeded worlds: the nondeterministic faithful endpoint (fresh logit noise sd 0.15
/// per request) is worse than 6-bit by the ladder alone in most of them, yet never flagged
/// with its noise floor; the biased endpoint (fixed sd 0.32 perturbation, like the w4 level,
/// plus sd 0.01 request noise) is always flagged and placed near 4 bits.
#[test]
fn noisy_faithful_passes_and_biased_is_flagged() {
    let rule = FaithfulRule::default();
    let (mut ladder_alone_flags, mut noisy_flags, mut biased_flags) = (0, 0, 0);
    let mut biased_bits = Vec::new();
    let worlds = 20;
    for w in 0..worlds {
        let mut g = sim::rng(100 + w);
        let t = toy(&mut g);
        let l = calibrate(&t, &mut g);

        let mut floor = NoiseFloor::default();
        let r1 = positions(&t, &perturb(&t.logits, 0.15, &mut g));
        let r2 = positions(&t, &perturb(&t.logits, 0.15, &mut g));
        floor
            .record(repeat_summary(&r1, &r2).unwrap().kl_mean)
            .unwrap();
        let stat = summarize(&compare_run(&r1).unwrap()).unwrap().kl_mean;
        let j = judge(&l, Metric::KlTopkMean, stat, floor.floor(), &rule).unwrap();
        ladder_alone_flags += usize::from(j.ladder.unfaithful);
        noisy_flags += usize::from(j.unfaithful);

        let bias = perturb(&t.logits, 0.32, &mut g);
        let b1 = positions(&t, &perturb(&bias, 0.01, &mut g));
        let b2 = positions(&t, &perturb(&bias, 0.01, &mut g));
        let mut bfloor = NoiseFloor::default();
        bfloor
            .record(repeat_summary(&b1, &b2).unwrap().kl_mean)
            .unwrap();
        let bstat = summarize(&compare_run(&b1).unwrap()).unwrap().kl_mean;
        let bj = judge(&l, Metric::KlTopkMean, bstat, bfloor.floor(), &rule).unwrap();
        biased_flags += usize::from(bj.unfaithful);
        let bits = match bj.ladder.equivalent {
            crate::ladder::Equivalent::Approx { bits, .. } => bits,
            crate::ladder::Equivalent::NoWorseThan { bits }
            | crate::ladder::Equivalent::WorseThan { bits } => f64::from(bits),
        };
        biased_bits.push(bits);
    }
    let mean_bits = biased_bits.iter().sum::<f64>() / worlds as f64;
    eprintln!(
        "noise rule over {worlds} worlds: noisy-faithful flagged by ladder alone {ladder_alone_flags}, with floor {noisy_flags}; biased flagged {biased_flags}, mean ≈{mean_bits:.2}-bit"
    );
    assert!(
        ladder_alone_flags > worlds as usize / 2,
        "the scenario must need the floor"
    );
    assert_eq!(noisy_flags, 0);
    assert_eq!(biased_flags, worlds as usize);
    assert!((mean_bits - 4.0).abs() < 0.5, "{mean_bits}");
}
