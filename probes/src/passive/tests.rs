//! Tests of `passive` against scipy's answers (computed once with scipy 1.x and written here
//! as constants, the call given beside each) and a seeded simulation that Benjamini–Hochberg
//! holds the false-discovery rate.

use rand::Rng;

use super::*;
use crate::sim;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn two_proportion_matches_hand_computation() {
    // p = 75/2000; z = (30/400 − 45/1600)/sqrt(p(1−p)(1/400+1/1600)); scipy norm.sf for p.
    let r = two_proportion_z(30, 400, 45, 1600).unwrap();
    assert!(close(r.statistic, 4.413674147523747, 1e-12), "{r:?}");
    assert!(close(r.p_value, 1.0163089361048596e-05, 1e-6), "{r:?}");
    let r = two_proportion_z(0, 10, 0, 20).unwrap();
    assert_eq!((r.statistic, r.p_value), (0.0, 1.0));
    assert!(two_proportion_z(11, 10, 0, 20).is_err());
    assert!(two_proportion_z(0, 0, 0, 20).is_err());
}

#[test]
fn proportions_vs_rest_flags_the_outlier() {
    let r = proportions_vs_rest(&[(5, 1000), (6, 1000), (40, 1000), (4, 1000)]).unwrap();
    assert!(r[2].p_value < 1e-6 && r[2].statistic > 0.0);
    // the others differ from a rest that contains the outlier, but only downwards: a
    // detector for harm (a higher error rate) reads the sign and flags only the outlier
    let harmful: Vec<usize> = (0..4)
        .filter(|&i| r[i].statistic > 0.0 && r[i].p_value < 0.01)
        .collect();
    assert_eq!(harmful, [2]);
    assert!(proportions_vs_rest(&[(1, 2)]).is_err());
}

#[test]
fn mann_whitney_matches_scipy() {
    // scipy.stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic")
    let x = [12.0, 15.0, 15.0, 20.0, 22.0, 22.0, 22.0, 30.0, 31.0, 40.0];
    let y = [10.0, 11.0, 12.0, 15.0, 16.0, 18.0, 18.0, 19.0, 25.0];
    let r = mann_whitney_u(&x, &y).unwrap();
    assert_eq!(r.statistic, 68.5);
    assert!(close(r.p_value, 0.05926352141664048, 1e-9), "{r:?}");
    let r = mann_whitney_u(
        &[1.0, 2.0, 3.0, 4.0, 5.0],
        &[6.0, 7.0, 8.0, 9.0, 10.0, 11.0],
    )
    .unwrap();
    assert_eq!(r.statistic, 0.0);
    assert!(close(r.p_value, 0.00811311726556578, 1e-9), "{r:?}");
    let r = mann_whitney_u(&[3.0, 3.0], &[3.0, 3.0, 3.0]).unwrap();
    assert_eq!(r.p_value, 1.0);
    assert!(mann_whitney_u(&[], &[1.0]).is_err());
    assert!(mann_whitney_u(&[f64::NAN], &[1.0]).is_err());
}

#[test]
fn chi_square_matches_scipy() {
    // scipy.stats.chi2_contingency(t, correction=False)
    let t = vec![vec![120, 30, 10], vec![90, 55, 5], vec![100, 40, 20]];
    let (r, dof) = chi_square_independence(&t).unwrap();
    assert_eq!(dof, 4);
    assert!(close(r.statistic, 21.859692780337937, 1e-12), "{r:?}");
    assert!(close(r.p_value, 0.00021372871585111233, 1e-8), "{r:?}");
    // a zero column is dropped: same answer as without it
    let t = vec![vec![50, 0, 10, 3], vec![500, 0, 60, 40]];
    let (r, dof) = chi_square_independence(&t).unwrap();
    assert_eq!(dof, 2);
    assert!(close(r.statistic, 2.2897470193151257, 1e-12), "{r:?}");
    assert!(close(r.p_value, 0.31826417258862, 1e-8), "{r:?}");
    let (r, dof) = chi_square_independence(&[vec![5, 0], vec![7, 0]]).unwrap();
    assert_eq!((r.p_value, dof), (1.0, 0));
    assert!(chi_square_independence(&[vec![1, 2], vec![1]]).is_err());
    // vs-rest on finish reasons: the endpoint that stops on length far more often stands out
    let counts = vec![
        vec![900, 90, 10],
        vec![880, 100, 20],
        vec![600, 390, 10],
        vec![910, 80, 10],
    ];
    let r = counts_vs_rest(&counts).unwrap();
    assert!(r[2].p_value < 1e-10);
    let others = r[0].p_value.min(r[1].p_value).min(r[3].p_value);
    assert!(r[2].p_value < others * 1e-6, "{r:?}");
}

#[test]
fn samples_vs_rest_flags_shorter_outputs() {
    let mut g = sim::rng(7);
    let mut samples: Vec<Vec<f64>> = (0..4)
        .map(|_| {
            (0..200)
                .map(|_| (200.0 + 40.0 * sim::normal(&mut g)).round())
                .collect()
        })
        .collect();
    for v in &mut samples[1] {
        *v *= 0.7;
    }
    let r = samples_vs_rest(&samples).unwrap();
    assert!(r[1].p_value < 1e-10, "{r:?}");
}

#[test]
fn bh_matches_scipy_and_rejects_the_right_set() {
    // scipy.stats.false_discovery_control(ps, method="bh")
    let ps = [
        0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216,
    ];
    let want = [
        0.01,
        0.04,
        0.084,
        0.084,
        0.084,
        0.1,
        0.1057142857142857,
        0.216,
        0.216,
        0.216,
    ];
    let adj = bh_adjusted(&ps).unwrap();
    for (a, w) in adj.iter().zip(want) {
        assert!(close(*a, w, 1e-12), "{adj:?}");
    }
    let rej = benjamini_hochberg(&ps, 0.05).unwrap();
    assert_eq!(
        rej,
        [
            true, true, false, false, false, false, false, false, false, false
        ]
    );
    assert!(benjamini_hochberg(&ps, 0.0).is_err());
    assert!(bh_adjusted(&[1.5]).is_err());
    assert!(benjamini_hochberg(&[], 0.1).unwrap().is_empty());
}

/// 50 endpoints, 40 faithful (uniform p-values) and 10 shifted (z ~ N(3, 1)); over 1,000
/// seeded trials the mean false-discovery proportion must stay ≤ q (theory: q·m0/m = 0.08).
#[test]
fn bh_simulation_holds_fdr() {
    let (m, m0, q, trials) = (50usize, 40usize, 0.10, 1000usize);
    let mut g = sim::rng(2024);
    let (mut fdp_sum, mut power_sum) = (0.0, 0.0);
    for _ in 0..trials {
        let ps: Vec<f64> = (0..m)
            .map(|i| {
                if i < m0 {
                    g.random::<f64>()
                } else {
                    let z = 3.0 + sim::normal(&mut g);
                    2.0 * normal_sf(z.abs())
                }
            })
            .collect();
        let rej = benjamini_hochberg(&ps, q).unwrap();
        let v = rej[..m0].iter().filter(|&&r| r).count();
        let r = rej.iter().filter(|&&r| r).count();
        fdp_sum += v as f64 / r.max(1) as f64;
        power_sum += rej[m0..].iter().filter(|&&r| r).count() as f64 / (m - m0) as f64;
    }
    let fdr = fdp_sum / trials as f64;
    let power = power_sum / trials as f64;
    eprintln!(
        "BH simulation: FDR {fdr:.4} (q = {q}, theory {:.3}), power {power:.3}",
        q * m0 as f64 / m as f64
    );
    assert!(fdr <= q, "FDR {fdr} above q {q}");
    // BH is not vacuous: most true shifts are found
    assert!(power > 0.5, "power {power}");
}

mod properties {
    use proptest::prelude::*;

    use super::super::*;

    proptest! {
        #[test]
        fn mann_whitney_is_symmetric(x in prop::collection::vec(0u8..20, 1..30), y in prop::collection::vec(0u8..20, 1..30)) {
            let x: Vec<f64> = x.into_iter().map(f64::from).collect();
            let y: Vec<f64> = y.into_iter().map(f64::from).collect();
            let a = mann_whitney_u(&x, &y).unwrap();
            let b = mann_whitney_u(&y, &x).unwrap();
            prop_assert!((a.p_value - b.p_value).abs() < 1e-12);
            prop_assert!((a.statistic + b.statistic - (x.len() * y.len()) as f64).abs() < 1e-9);
            prop_assert!((0.0..=1.0).contains(&a.p_value));
        }

        #[test]
        fn bh_rejections_are_the_smallest_p_values(ps in prop::collection::vec(0.0f64..=1.0, 0..40), q in 0.01f64..0.5) {
            let rej = benjamini_hochberg(&ps, q).unwrap();
            let max_rejected = ps.iter().zip(&rej).filter(|(_, r)| **r).map(|(p, _)| *p).fold(f64::NEG_INFINITY, f64::max);
            for (p, r) in ps.iter().zip(&rej) {
                if *p < max_rejected {
                    prop_assert!(*r, "p {} below a rejected {} but kept", p, max_rejected);
                }
            }
            // BH rejects at least what Bonferroni rejects
            let m = ps.len() as f64;
            for (p, r) in ps.iter().zip(&rej) {
                if *p <= q / m {
                    prop_assert!(*r);
                }
            }
        }

        #[test]
        fn chi_square_ignores_row_order(t in prop::collection::vec(prop::collection::vec(0u64..50, 3), 2..5)) {
            let (a, da) = chi_square_independence(&t).unwrap();
            let mut r = t.clone();
            r.reverse();
            let (b, db) = chi_square_independence(&r).unwrap();
            prop_assert_eq!(da, db);
            prop_assert!((a.statistic - b.statistic).abs() < 1e-9 * (1.0 + a.statistic));
            prop_assert!((0.0..=1.0).contains(&a.p_value));
        }
    }
}
