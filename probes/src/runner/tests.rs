//! Tests of the scheduler's timing rule: the seeded jitter stays within ± the configured
//! share of the interval, spreads, and repeats for a seed.

use super::*;

#[test]
fn jitter_stays_within_bounds_and_is_seeded() {
    let interval = Duration::from_secs(300);
    let mut a = StdRng::seed_from_u64(7);
    let mut b = StdRng::seed_from_u64(7);
    let gaps: Vec<Duration> = (0..2000).map(|_| next_gap(interval, 0.1, &mut a)).collect();
    let again: Vec<Duration> = (0..2000).map(|_| next_gap(interval, 0.1, &mut b)).collect();
    assert_eq!(gaps, again, "same seed, same schedule");
    let (lo, hi) = (interval.mul_f64(0.9), interval.mul_f64(1.1));
    assert!(gaps.iter().all(|g| *g >= lo && *g <= hi));
    // spread over the band, centred on the interval
    assert!(
        gaps.iter().any(|g| *g < interval.mul_f64(0.92))
            && gaps.iter().any(|g| *g > interval.mul_f64(1.08))
    );
    let mean = gaps.iter().map(Duration::as_secs_f64).sum::<f64>() / gaps.len() as f64;
    assert!((mean - 300.0).abs() < 3.0, "mean gap {mean}");
    let mut c = StdRng::seed_from_u64(8);
    assert_ne!(
        gaps[..10],
        (0..10)
            .map(|_| next_gap(interval, 0.1, &mut c))
            .collect::<Vec<_>>()[..]
    );
}

#[test]
fn no_jitter_is_the_interval() {
    let mut r = StdRng::seed_from_u64(1);
    assert_eq!(
        next_gap(Duration::from_millis(1500), 0.0, &mut r),
        Duration::from_millis(1500)
    );
}
