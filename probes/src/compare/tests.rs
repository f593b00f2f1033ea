//! Unit and property tests of `compare`: hand-computed KL values, the lower-bound property
//! against the full-vocabulary KL, aggregates, and the encoding round trip.

use proptest::prelude::*;

use super::*;

fn e(id: u32, p: f64) -> TopEntry {
    TopEntry {
        id,
        logprob: p.ln(),
    }
}

fn pos(actual: u32, r: Vec<TopEntry>, ep: Vec<TopEntry>) -> PositionInput {
    let ra = r
        .iter()
        .find(|x| x.id == actual)
        .map_or(-20.0, |x| x.logprob);
    let ea = ep
        .iter()
        .find(|x| x.id == actual)
        .map_or(-20.0, |x| x.logprob);
    PositionInput {
        actual_id: actual,
        reference: Side {
            actual_logprob: ra,
            top: r,
        },
        endpoint: Side {
            actual_logprob: ea,
            top: ep,
        },
    }
}

#[test]
fn identical_sides_give_zero_drift() {
    let p = pos(
        1,
        vec![e(1, 0.6), e(2, 0.3), e(3, 0.05)],
        vec![e(3, 0.05), e(1, 0.6), e(2, 0.3)],
    );
    let m = compare_position(&p).unwrap();
    assert_eq!(m.kl, 0.0);
    assert_eq!(m.dlogprob, 0.0);
    assert!(m.same_top1);
    assert_eq!(m.overlap, 1.0);
    // an actual token far below the clamp, identical on both sides: still exactly 0
    let mut tiny = pos(9, vec![e(1, 0.9), e(2, 0.05)], vec![e(1, 0.9), e(2, 0.05)]);
    tiny.reference.actual_logprob = -30.0;
    tiny.endpoint.actual_logprob = -30.0;
    assert_eq!(compare_position(&tiny).unwrap().kl, 0.0);
}

#[test]
fn hand_computed_kl_with_tail_bucket() {
    // ref: A .6, B .3 (tail .1); ep: A .5, B .4 (tail .1); actual A.
    // KL = .6 ln(.6/.5) + .3 ln(.3/.4) + .1 ln(.1/.1) = 0.0230880...
    let p = pos(0, vec![e(0, 0.6), e(1, 0.3)], vec![e(0, 0.5), e(1, 0.4)]);
    let m = compare_position(&p).unwrap();
    let want = 0.6 * (0.6f64 / 0.5).ln() + 0.3 * (0.3f64 / 0.4).ln();
    assert!((m.kl - want).abs() < 1e-12, "{} vs {want}", m.kl);
    assert!((m.kl - 0.023_088).abs() < 1e-6);
    assert!((m.dlogprob - (0.5f64.ln() - 0.6f64.ln())).abs() < 1e-12);
    assert!(m.same_top1);
    assert_eq!(m.overlap, 1.0);
}

#[test]
fn disjoint_lists_use_actual_token_and_tail() {
    // ref top {0: .7, 1: .2}, ep top {2: .8, 3: .1}; actual is 1, with ep logprob ln .05.
    // S = {1}: ref .2 vs ep .05; tails .8 vs .95.
    let mut p = pos(1, vec![e(0, 0.7), e(1, 0.2)], vec![e(2, 0.8), e(3, 0.1)]);
    p.endpoint.actual_logprob = 0.05f64.ln();
    let m = compare_position(&p).unwrap();
    let want = 0.2 * (0.2f64 / 0.05).ln() + 0.8 * (0.8f64 / 0.95).ln();
    assert!((m.kl - want).abs() < 1e-12);
    assert!(!m.same_top1);
    assert_eq!(m.overlap, 0.0);
}

#[test]
fn endpoint_with_smaller_k_is_compared_at_its_k() {
    // ref gives 4 alternatives, ep only 2; the common k is 2: ref's {0,1} vs ep's {0,2}.
    let p = pos(
        0,
        vec![e(0, 0.5), e(1, 0.2), e(2, 0.1), e(3, 0.1)],
        vec![e(0, 0.5), e(2, 0.25)],
    );
    let m = compare_position(&p).unwrap();
    assert_eq!(m.overlap, 0.5);
    // S = {0}; both .5 → KL 0 exactly.
    assert!(m.kl.abs() < 1e-15);
}

#[test]
fn rounding_and_neg_inf_stay_finite() {
    // top-k sums above 1 (rounding) and a -inf endpoint logprob.
    let mut p = pos(
        0,
        vec![e(0, 0.9), e(1, 0.1000001)],
        vec![e(0, 0.95), e(1, 0.06)],
    );
    p.endpoint.actual_logprob = f64::NEG_INFINITY;
    let m = compare_position(&p).unwrap();
    assert!(m.kl.is_finite() && m.kl > 0.0);
    assert_eq!(m.dlogprob, f64::NEG_INFINITY);
}

#[test]
fn bad_inputs_are_errors() {
    let mut p = pos(0, vec![e(0, 0.9)], vec![e(0, 0.9)]);
    p.reference.actual_logprob = f64::NAN;
    assert!(compare_position(&p).is_err());
    let p = pos(0, vec![], vec![e(0, 0.9)]);
    assert!(compare_position(&p).is_err());
    let p = pos(
        0,
        vec![TopEntry {
            id: 0,
            logprob: 0.5,
        }],
        vec![e(0, 0.9)],
    );
    assert!(compare_position(&p).is_err());
    assert!(summarize(&[]).is_err());
    assert!(kl_full(&[0.0, 1.0], &[0.0]).is_err());
    assert!(kl_full(&[f32::NAN, 1.0], &[0.0, 1.0]).is_err());
    assert!(position_from_full_logprobs(&[-0.1], &[-0.1], 3, 1).is_err());
}

#[test]
fn summary_aggregates_and_nearest_rank_p99() {
    let metrics: Vec<PositionMetrics> = (1..=100)
        .map(|i| PositionMetrics {
            kl: f64::from(i),
            dlogprob: if i % 2 == 0 { 1.0 } else { -1.0 },
            same_top1: i <= 75,
            overlap: 0.5,
        })
        .collect();
    let s = summarize(&metrics).unwrap();
    assert_eq!(s.count, 100);
    assert_eq!(s.kl_mean, 50.5);
    assert_eq!(s.kl_p99, 99.0);
    assert_eq!(s.abs_dlogprob_mean, 1.0);
    assert_eq!(s.top1_same, 0.75);
    assert_eq!(s.topk_overlap, 0.5);
    assert_eq!(quantile_nearest_rank(&[3.0, 1.0, 2.0], 0.5).unwrap(), 2.0);
    assert_eq!(quantile_nearest_rank(&[3.0], 0.99).unwrap(), 3.0);
}

#[test]
fn full_kl_hand_computed() {
    // logits ln(.5), ln(.25), ln(.25) vs uniform: KL = .5 ln 1.5 + 2·.25 ln .75.
    let r = [0.5f32.ln(), 0.25f32.ln(), 0.25f32.ln()];
    let u = [0.0f32, 0.0, 0.0];
    let want = 0.5 * 1.5f64.ln() + 0.5 * 0.75f64.ln();
    assert!((kl_full(&r, &u).unwrap() - want).abs() < 1e-6);
    // a constant shift of logits changes nothing
    let shifted: Vec<f32> = r.iter().map(|x| x + 7.0).collect();
    assert!(kl_full(&r, &shifted).unwrap() < 1e-6);
}

fn logits_strategy() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (3usize..40).prop_flat_map(|n| {
        (
            prop::collection::vec(-8.0f32..8.0, n),
            prop::collection::vec(-8.0f32..8.0, n),
        )
    })
}

proptest! {
    #[test]
    fn topk_kl_is_a_lower_bound_of_full_kl((a, b) in logits_strategy(), k in 1usize..10, actual in 0usize..3) {
        let la = log_softmax(&a).unwrap();
        let lb = log_softmax(&b).unwrap();
        let full = kl_full(&a, &b).unwrap();
        let p = position_from_full_logprobs(&la, &lb, actual as u32, k).unwrap();
        let m = compare_position(&p).unwrap();
        // up to f32 rounding: the two sides reach the KL by different f32/f64 paths (the
        // coarse one through f32 top-k logprobs), which differ by ~1e-7 relative
        prop_assert!(m.kl <= full + 1e-6 * full.max(1.0), "top-k {} > full {}", m.kl, full);
        prop_assert!(m.kl >= 0.0);
        // with k = whole vocabulary, the coarsening is the identity (logits halved so every
        // endpoint probability stays above TAIL_EPSILON, where the clamp does not act)
        let (a2, b2): (Vec<f32>, Vec<f32>) = (a.iter().map(|x| x / 2.0).collect(), b.iter().map(|x| x / 2.0).collect());
        let full = kl_full(&a2, &b2).unwrap();
        let (la, lb) = (log_softmax(&a2).unwrap(), log_softmax(&b2).unwrap());
        let p = position_from_full_logprobs(&la, &lb, actual as u32, a.len()).unwrap();
        let m = compare_position(&p).unwrap();
        prop_assert!((m.kl - full).abs() < 1e-6 * (1.0 + full), "{} vs {}", m.kl, full);
    }

    #[test]
    fn encoding_round_trips(raw in prop::collection::vec(
        (any::<u32>(), -30.0f32..0.0, -30.0f32..0.0,
         prop::collection::vec((any::<u32>(), -30.0f32..0.0), 0..8),
         prop::collection::vec((any::<u32>(), -30.0f32..0.0), 0..8)), 0..20)) {
        let positions: Vec<PositionInput> = raw.iter().map(|(id, ra, ea, rt, et)| PositionInput {
            actual_id: *id,
            reference: Side { actual_logprob: f64::from(*ra), top: rt.iter().map(|&(i, l)| TopEntry { id: i, logprob: f64::from(l) }).collect() },
            endpoint: Side { actual_logprob: f64::from(*ea), top: et.iter().map(|&(i, l)| TopEntry { id: i, logprob: f64::from(l) }).collect() },
        }).collect();
        let bytes = encode_positions(&positions).unwrap();
        prop_assert_eq!(&decode_positions(&bytes).unwrap(), &positions);
        let text = encode_positions_base64(&positions).unwrap();
        prop_assert_eq!(&decode_positions_base64(&text).unwrap(), &positions);
        // every strict prefix is refused, never a panic
        for cut in 0..bytes.len() {
            prop_assert!(decode_positions(&bytes[..cut]).is_err());
        }
    }
}

#[test]
fn encoding_is_compact_and_rejects_garbage() {
    let p = pos(7, vec![e(7, 0.5), e(8, 0.25)], vec![e(7, 0.4), e(9, 0.3)]);
    let bytes = encode_positions(std::slice::from_ref(&p)).unwrap();
    // header 9 + id 4 + 2 actual f32 8 + 2 × (1 + 2 × 8)
    assert_eq!(bytes.len(), 9 + 4 + 8 + 2 * 17);
    // metrics recomputed from the stored data agree with the originals to f32 precision
    let back = decode_positions(&bytes).unwrap();
    let (m0, m1) = (
        compare_position(&p).unwrap(),
        compare_position(&back[0]).unwrap(),
    );
    assert!((m0.kl - m1.kl).abs() < 1e-6);
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert!(decode_positions(&bad).is_err());
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(decode_positions(&extra).is_err());
    assert!(decode_positions_base64("not base64!").is_err());
    let many = vec![
        TopEntry {
            id: 0,
            logprob: -1.0
        };
        256
    ];
    let big = PositionInput {
        actual_id: 0,
        reference: Side {
            actual_logprob: -1.0,
            top: many,
        },
        endpoint: p.endpoint,
    };
    assert!(encode_positions(&[big]).is_err());
}

/// The full sort `top_k_ids` replaces: (logprob descending, index ascending), first `k`.
fn top_k_by_sorting(lp: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..lp.len()).collect();
    idx.sort_by(|&x, &y| lp[y].total_cmp(&lp[x]).then(x.cmp(&y)));
    idx.truncate(k);
    idx
}

proptest! {
    #[test]
    fn top_k_selection_equals_the_full_sort(
        // few distinct values, so ties are common; NaN and infinities included
        vals in prop::collection::vec(
            prop_oneof![
                (0u8..6).prop_map(|v| -f64::from(v)),
                Just(f64::NEG_INFINITY),
                Just(f64::NAN),
                Just(-0.0),
                any::<f64>(),
            ],
            0..300,
        ),
        k in 0usize..40,
    ) {
        prop_assert_eq!(top_k_ids(&vals, k), top_k_by_sorting(&vals, k));
    }
}

#[test]
fn top_k_selection_on_a_vocabulary_row() {
    // a 49,152-entry row like the test model's, with ties at the top
    let mut lp: Vec<f64> = (0..49_152)
        .map(|i| -((i * 7919 % 49_152) as f64) / 1000.0)
        .collect();
    lp[17] = 0.5;
    lp[40_000] = 0.5;
    lp[3] = 0.25;
    for k in [1, 5, 20] {
        assert_eq!(top_k_ids(&lp, k), top_k_by_sorting(&lp, k));
    }
    assert_eq!(top_k_ids(&lp, 3), vec![17, 40_000, 3]);
}
