//! Tests of `ladder`: parsing and validation, the bit-scale interpolation (hand-computed),
//! thresholds and the faithful? verdict, on a hand-written ladder whose values are chosen
//! to make the arithmetic easy to follow.

use super::*;

/// kl_topk_mean doubles-ish per level; top1_same falls; w8 is deliberately *better* on
/// dlogprob than w6 is worse, and w6 lower than w8 on kl_p99, to exercise the monotone fix.
const LADDER: &str = r#"{
  "model": "SmolLM2-135M-Instruct", "model_sha256": "b179c952", "corpus": "probes/data/prompt_logprob_texts.jsonl",
  "positions": 2048, "top_k": 5,
  "levels": [
    {"name": "w8", "kind": "weights", "bits": 8, "kl_mean": 0.001, "kl_p99": 0.02, "kl_topk_mean": 0.001, "dlogprob_mean": 0.01, "top1_same": 0.99, "topk_overlap": 0.98},
    {"name": "w6", "kind": "weights", "bits": 6, "kl_mean": 0.01, "kl_p99": 0.01, "kl_topk_mean": 0.01, "dlogprob_mean": 0.05, "top1_same": 0.97, "topk_overlap": 0.95},
    {"name": "w5", "kind": "weights", "bits": 5, "kl_mean": 0.04, "kl_p99": 0.4, "kl_topk_mean": 0.04, "dlogprob_mean": 0.1, "top1_same": 0.93, "topk_overlap": 0.9},
    {"name": "w4", "kind": "weights", "bits": 4, "kl_mean": 0.16, "kl_p99": 1.6, "kl_topk_mean": 0.16, "dlogprob_mean": 0.3, "top1_same": 0.8, "topk_overlap": 0.8},
    {"name": "w3", "kind": "weights", "bits": 3, "kl_mean": 0.64, "kl_p99": 6.4, "kl_topk_mean": 0.64, "dlogprob_mean": 0.9, "top1_same": 0.6, "topk_overlap": 0.6},
    {"name": "w2", "kind": "weights", "bits": 2, "kl_mean": 3.0, "kl_p99": 20.0, "kl_topk_mean": 3.0, "dlogprob_mean": 3.0, "top1_same": 0.2, "topk_overlap": 0.3},
    {"name": "a8", "kind": "activations", "bits": 8, "kl_mean": 0.004, "kl_p99": 0.05, "kl_topk_mean": 0.004, "dlogprob_mean": 0.03, "top1_same": 0.98, "topk_overlap": 0.97}
  ]
}"#;

fn ladder() -> Ladder {
    Ladder::from_json(LADDER).unwrap()
}

#[test]
fn parses_validates_and_round_trips() {
    let l = ladder();
    assert_eq!(l.levels.len(), 7);
    assert_eq!(l.level("a8").unwrap().kind, LevelKind::Activations);
    let back = Ladder::from_json(&serde_json::to_string(&l).unwrap()).unwrap();
    assert_eq!(back, l);
}

#[test]
fn invalid_ladders_are_refused() {
    let mut l = ladder();
    l.levels[1].name = "w8".into();
    assert!(l.validate().is_err());
    let mut l = ladder();
    l.levels.retain(|x| x.kind == LevelKind::Activations);
    assert!(l.validate().is_err());
    let mut l = ladder();
    l.levels[0].kl_mean = -1.0;
    assert!(l.validate().is_err());
    let mut l = ladder();
    l.levels[0].top1_same = 1.5;
    assert!(l.validate().is_err());
    let mut l = ladder();
    l.levels[1].bits = 8;
    assert!(l.validate().is_err());
    assert!(Ladder::from_json("{").is_err());
    assert!(Ladder::from_json(r#"{"model":"m"}"#).is_err());
}

#[test]
fn equivalent_on_the_kl_scale() {
    let l = ladder();
    let m = Metric::KlTopkMean;
    assert_eq!(
        l.equivalent(m, 0.0).unwrap(),
        Equivalent::NoWorseThan { bits: 8 }
    );
    assert_eq!(
        l.equivalent(m, 0.001).unwrap(),
        Equivalent::NoWorseThan { bits: 8 }
    );
    assert_eq!(
        l.equivalent(m, 3.5).unwrap(),
        Equivalent::WorseThan { bits: 2 }
    );
    // exactly at w4: f = 1 between w5 and w4
    assert_eq!(
        l.equivalent(m, 0.16).unwrap(),
        Equivalent::Approx {
            bits: 4.0,
            better: 5,
            worse: 4
        }
    );
    // geometric mean of w5 (0.04) and w4 (0.16) is 0.08: halfway on the log scale → 4.5
    let Equivalent::Approx {
        bits,
        better,
        worse,
    } = l.equivalent(m, 0.08).unwrap()
    else {
        panic!("expected Approx");
    };
    assert!((bits - 4.5).abs() < 1e-12 && better == 5 && worse == 4);
    // between w8 (0.001) and w6 (0.01): 10^-2.5 is halfway → 7 bits
    let Equivalent::Approx { bits, .. } = l.equivalent(m, 10f64.powf(-2.5)).unwrap() else {
        panic!("expected Approx");
    };
    assert!((bits - 7.0).abs() < 1e-9, "{bits}");
    assert!(l.equivalent(m, f64::NAN).is_err());
}

#[test]
fn equivalent_on_rate_metrics() {
    let l = ladder();
    // top1_same 0.7: badness 0.3, between w4 (0.2) and w3 (0.4)
    let Equivalent::Approx {
        bits,
        better,
        worse,
    } = l.equivalent(Metric::Top1Same, 0.7).unwrap()
    else {
        panic!("expected Approx");
    };
    let f = (0.3f64.ln() - 0.2f64.ln()) / (0.4f64.ln() - 0.2f64.ln());
    assert!((bits - (4.0 - f)).abs() < 1e-12 && (better, worse) == (4, 3));
    assert_eq!(
        l.equivalent(Metric::Top1Same, 1.0).unwrap(),
        Equivalent::NoWorseThan { bits: 8 }
    );
    assert_eq!(
        l.equivalent(Metric::Top1Same, 0.1).unwrap(),
        Equivalent::WorseThan { bits: 2 }
    );
}

#[test]
fn non_monotone_ladder_is_made_monotone() {
    let l = ladder();
    // kl_p99: w8 0.02 > w6 0.01 → w6 is raised to 0.02; a value of 0.015 is no worse than 8-bit
    assert_eq!(
        l.equivalent(Metric::KlP99, 0.015).unwrap(),
        Equivalent::NoWorseThan { bits: 8 }
    );
    assert_eq!(l.threshold(Metric::KlP99, "w6").unwrap(), 0.02);
}

#[test]
fn thresholds_and_verdicts() {
    let l = ladder();
    assert_eq!(
        l.threshold(Metric::KlTopkMean, DEFAULT_UNFAITHFUL_LEVEL)
            .unwrap(),
        0.01
    );
    assert!((l.threshold(Metric::Top1Same, "w6").unwrap() - 0.97).abs() < 1e-12);
    assert_eq!(l.threshold(Metric::KlTopkMean, "a8").unwrap(), 0.004);
    assert!(l.threshold(Metric::KlTopkMean, "w7").is_err());
    let ok = l.judge(Metric::KlTopkMean, 0.004, "w6").unwrap();
    assert!(!ok.unfaithful);
    let bad = l.judge(Metric::KlTopkMean, 0.2, "w6").unwrap();
    assert!(bad.unfaithful);
    assert_eq!(bad.threshold, 0.01);
    assert_eq!(
        bad.equivalent.to_string(),
        "≈ 3.8-bit (between 4 and 3 bits)"
    );
    let low_rate = l.judge(Metric::Top1Same, 0.9, "w6").unwrap();
    assert!(low_rate.unfaithful);
    assert_eq!(
        Equivalent::NoWorseThan { bits: 8 }.to_string(),
        "no worse than 8-bit"
    );
    assert_eq!(
        Equivalent::WorseThan { bits: 2 }.to_string(),
        "worse than 2-bit"
    );
}

#[test]
fn summary_metrics_map_to_probe_statistics() {
    let s = RunSummary {
        count: 10,
        kl_mean: 0.1,
        kl_p99: 1.0,
        abs_dlogprob_mean: 0.2,
        top1_same: 0.9,
        topk_overlap: 0.8,
    };
    assert_eq!(Metric::KlTopkMean.of_summary(&s), Some(0.1));
    assert_eq!(Metric::DlogprobMean.of_summary(&s), Some(0.2));
    assert_eq!(Metric::Top1Same.of_summary(&s), Some(0.9));
    assert_eq!(Metric::TopkOverlap.of_summary(&s), Some(0.8));
    assert_eq!(Metric::KlMean.of_summary(&s), None);
    assert_eq!(Metric::KlP99.of_summary(&s), None);
}

#[test]
fn level_builder_uses_the_probe_definitions() {
    let mut same = LevelBuilder::new(2).unwrap();
    let mut moved = LevelBuilder::new(2).unwrap();
    assert!(same.is_empty());
    assert!(same.finish("w8", LevelKind::Weights, 8).is_err());
    let r = [2.0f32, 1.0, 0.0, -1.0];
    // the level swaps the two most likely tokens
    let l = [1.0f32, 2.0, 0.0, -1.0];
    for actual in [0u32, 1, 2] {
        same.add(&r, &r, actual).unwrap();
        moved.add(&r, &l, actual).unwrap();
    }
    let s = same.finish("w8", LevelKind::Weights, 8).unwrap();
    assert_eq!(
        (s.kl_mean, s.kl_topk_mean, s.dlogprob_mean),
        (0.0, 0.0, 0.0)
    );
    assert_eq!((s.top1_same, s.topk_overlap), (1.0, 1.0));
    let m = moved.finish("w2", LevelKind::Weights, 2).unwrap();
    assert_eq!(moved.len(), 3);
    assert_eq!(m.top1_same, 0.0);
    assert_eq!(m.topk_overlap, 1.0);
    // p = softmax(2,1,0,-1): swapping the top two gives KL = (p0 − p1)·1 (p0·(2−1) + p1·(1−2))
    let z: f64 = [2.0f64, 1.0, 0.0, -1.0].iter().map(|x| x.exp()).sum();
    let want = (2f64.exp() - 1f64.exp()) / z;
    assert!((m.kl_mean - want).abs() < 1e-6, "{} vs {want}", m.kl_mean);
    // the top-2 support holds both swapped tokens: the coarsening loses nothing here
    assert!((m.kl_topk_mean - want).abs() < 1e-6);
    // |Δ logprob| is 1 for actual 0 and 1, 0 for actual 2
    assert!((m.dlogprob_mean - 2.0 / 3.0).abs() < 1e-6);
    assert!(LevelBuilder::new(0).is_err());
    assert!(same.add(&r, &r[..3], 0).is_err());
}
