//! The breaker's, the deadlines' and the latency estimate's unit tests (paused Tokio time).

use super::*;

fn cfg() -> BreakerConfig {
    BreakerConfig {
        consecutive_failures: 3,
        error_rate: 0.5,
        min_requests: 10,
        window: Duration::from_secs(10),
        cooldown: Duration::from_secs(5),
        half_open_trials: 1,
    }
}

#[tokio::test(start_paused = true)]
async fn opens_after_consecutive_failures_then_half_opens_after_cooldown() {
    let mut b = Breaker::new(cfg());
    for _ in 0..2 {
        let a = b.try_acquire(Instant::now());
        assert_eq!(a, Some(Admission::Normal));
        b.on_failure(Instant::now(), Admission::Normal);
    }
    assert_eq!(b.state(Instant::now()), BreakerState::Closed);
    b.on_failure(Instant::now(), Admission::Normal);
    assert_eq!(b.state(Instant::now()), BreakerState::Open);
    assert_eq!(b.try_acquire(Instant::now()), None);

    tokio::time::advance(Duration::from_millis(4_999)).await;
    assert_eq!(b.try_acquire(Instant::now()), None);
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(b.try_acquire(Instant::now()), Some(Admission::Trial));
    // only one trial at a time
    assert_eq!(b.try_acquire(Instant::now()), None);
    // a failed trial re-opens for another cool-down
    b.on_failure(Instant::now(), Admission::Trial);
    assert_eq!(b.state(Instant::now()), BreakerState::Open);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(b.try_acquire(Instant::now()), Some(Admission::Trial));
    b.on_success(Instant::now(), Admission::Trial);
    assert_eq!(b.state(Instant::now()), BreakerState::Closed);
    assert_eq!(b.try_acquire(Instant::now()), Some(Admission::Normal));
}

#[tokio::test(start_paused = true)]
async fn opens_on_error_rate_over_window() {
    let mut b = Breaker::new(cfg());
    // alternate: never 3 in a row, but 50% errors once 10 outcomes are in the window
    for i in 0..9 {
        if i % 2 == 0 {
            b.on_failure(Instant::now(), Admission::Normal);
        } else {
            b.on_success(Instant::now(), Admission::Normal)
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed, "after {i}");
    }
    b.on_failure(Instant::now(), Admission::Normal);
    assert_eq!(b.state(Instant::now()), BreakerState::Open);
}

/// `n` outcomes now: failure, success, failure, … (never 3 failures in a row).
fn alternate(b: &mut Breaker, n: usize) {
    for i in 0..n {
        if i % 2 == 0 {
            b.on_failure(Instant::now(), Admission::Normal);
        } else {
            b.on_success(Instant::now(), Admission::Normal);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn old_outcomes_leave_the_window() {
    let mut b = Breaker::new(cfg());
    for _ in 0..8 {
        b.on_success(Instant::now(), Admission::Normal);
    }
    tokio::time::advance(Duration::from_secs(11)).await;
    alternate(&mut b, 9);
    // 9 outcomes in the window (the 8 old ones expired): below min_requests
    assert_eq!(b.state(Instant::now()), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn expired_failures_no_longer_count_toward_the_rate() {
    let mut b = Breaker::new(cfg());
    alternate(&mut b, 8);
    tokio::time::advance(Duration::from_secs(11)).await;
    // 10 outcomes in the window, 1 failed: 10% (the 4 expired failures would make it 50%)
    for _ in 0..9 {
        b.on_success(Instant::now(), Admission::Normal);
    }
    b.on_failure(Instant::now(), Admission::Normal);
    assert_eq!(b.state(Instant::now()), BreakerState::Closed);
    // a second failure: 2 of 11 and 2 in a row, still closed
    b.on_failure(Instant::now(), Admission::Normal);
    assert_eq!(b.state(Instant::now()), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn abandoned_trial_frees_its_slot() {
    let mut b = Breaker::new(cfg());
    for _ in 0..3 {
        b.on_failure(Instant::now(), Admission::Normal);
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(b.try_acquire(Instant::now()), Some(Admission::Trial));
    b.release_trial();
    assert_eq!(b.try_acquire(Instant::now()), Some(Admission::Trial));
}

/// Opens `h`'s breaker (3 failures in a row) and waits out its cool-down.
async fn open_then_cool_down(h: &Arc<EndpointHealth>) {
    for _ in 0..3 {
        h.record(Admission::Normal, false);
    }
    assert_eq!(h.breaker_state(), BreakerState::Open);
    tokio::time::advance(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_trial_permit_dropped_unrecorded_frees_its_slot() {
    let h = Arc::new(EndpointHealth::new(cfg()));
    open_then_cool_down(&h).await;
    let trial = h.try_acquire().map(|p| p.admission());
    assert_eq!(trial, Some(Admission::Trial));
    // the permit above was dropped at once (its client went away): the slot is free again
    let again = h.try_acquire();
    assert_eq!(
        again.as_ref().map(Permit::admission),
        Some(Admission::Trial)
    );
    // while it is held, no second trial
    assert!(h.try_acquire().is_none());
    // a recorded success closes the breaker; dropping the settled permit changes nothing
    if let Some(p) = again {
        p.record(true);
    }
    assert_eq!(h.breaker_state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_failed_trial_reopens_and_its_drop_releases_nothing() {
    let h = Arc::new(EndpointHealth::new(cfg()));
    open_then_cool_down(&h).await;
    if let Some(p) = h.try_acquire() {
        p.record(false);
    }
    assert_eq!(h.breaker_state(), BreakerState::Open);
    assert!(h.try_acquire().is_none());
}

#[tokio::test(start_paused = true)]
async fn peak_ewma_jumps_up_and_decays_down() {
    let mut e = PeakEwma::new(Duration::from_secs(10), Duration::from_millis(50));
    e.observe(Instant::now(), Duration::from_millis(500));
    assert!((e.estimate_ms() - 500.0).abs() < 1e-9);
    tokio::time::advance(Duration::from_secs(10)).await;
    e.observe(Instant::now(), Duration::from_millis(100));
    let expected = 500.0 * (-1.0f64).exp() + 100.0 * (1.0 - (-1.0f64).exp());
    assert!(
        (e.estimate_ms() - expected).abs() < 1e-6,
        "{}",
        e.estimate_ms()
    );
}

fn bounds(floor_ms: u64, cap_ms: u64) -> FirstByteBounds {
    FirstByteBounds {
        floor: Duration::from_millis(floor_ms),
        cap: Duration::from_millis(cap_ms),
    }
}

#[test]
fn an_unmeasured_endpoint_is_overdue_at_the_floor_and_times_out_at_the_cap() {
    let e = FirstByteEstimate::default();
    assert_eq!(e.expected(), None);
    let d = e.deadlines(bounds(1_000, 60_000));
    assert_eq!(d.overdue_after, Duration::from_secs(1));
    assert_eq!(d.timeout, Duration::from_secs(60));
}

#[test]
fn deadlines_follow_the_estimate_within_floor_and_cap() {
    let mut e = FirstByteEstimate::default();
    // first sample: mean 400, deviation 200 -> expected 1200 ms, timeout 3600 ms
    e.observe(Duration::from_millis(400));
    assert_eq!(e.expected(), Some(Duration::from_millis(1_200)));
    let d = e.deadlines(bounds(100, 60_000));
    assert_eq!(d.overdue_after, Duration::from_millis(1_200));
    assert_eq!(d.timeout, Duration::from_millis(3_600));
    // the cap bounds both
    let d = e.deadlines(bounds(100, 2_000));
    assert_eq!(
        (d.overdue_after, d.timeout),
        (Duration::from_millis(1_200), Duration::from_millis(2_000))
    );
    // steady fast answers pull the estimate under the floor, which then holds
    for _ in 0..100 {
        e.observe(Duration::from_millis(5));
    }
    let expected = e.expected().map(|d| d.as_secs_f64() * 1e3);
    assert!(
        expected.is_some_and(|ms| (5.0..10.0).contains(&ms)),
        "{expected:?}"
    );
    let d = e.deadlines(bounds(1_000, 60_000));
    assert_eq!(
        (d.overdue_after, d.timeout),
        (Duration::from_secs(1), Duration::from_secs(1))
    );
    // a slower stretch lengthens them again (a mean deviation reacts faster than the mean)
    e.observe(Duration::from_millis(2_000));
    let d = e.deadlines(bounds(100, 60_000));
    assert!(d.overdue_after > Duration::from_millis(700), "{d:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failure_that_opens_the_breaker_wakes_ejection_waiters() {
    let h = Arc::new(EndpointHealth::new(cfg()));
    let mut ejected = std::pin::pin!(h.ejected());
    ejected.as_mut().enable();
    h.record(Admission::Normal, false);
    h.record(Admission::Normal, false);
    assert!(futures_util::poll!(ejected.as_mut()).is_pending());
    h.record(Admission::Normal, false);
    assert!(h.is_open());
    assert!(futures_util::poll!(ejected.as_mut()).is_ready());
}
