//! Per-endpoint health as the router sees it: a circuit breaker, a peak-EWMA latency estimate
//! with an in-flight count (for lowest-latency routing), a "not before" instant set by an
//! upstream's `Retry-After`, and a quality flag that drift alerts will set (an endpoint can be
//! demoted to the back of every plan or excluded from it).
//!
//! The breaker's admission of one attempt is a [`Permit`] the attempt owns: recording the
//! outcome consumes it, and dropping it unrecorded (the client went away, the attempt's future
//! was cancelled) frees its half-open trial slot, so no path can leave a trial counted forever.
//!
//! Outlier ejection and the adaptive first-byte timeout: each endpoint keeps a
//! [`FirstByteEstimate`] of its time to the response head (per streamed and non-streamed
//! requests, which differ: a non-streamed head comes after the whole generation), from which an
//! attempt gets its [`Deadlines`]. An attempt still waiting past `overdue_after`, past what
//! another endpoint of its plan usually takes (an outlier: a slow start everywhere is not one),
//! with no head from its endpoint since it was sent (one that answers others is alive, and this
//! request merely long), counts as a breaker failure *while in flight* (not when its timeout ends), so a hung endpoint's breaker
//! opens within the first seconds; opening wakes the attempts still overdue on it
//! ([`EndpointHealth::ejected`]), which give up and fail over. Ejection ends as breaking does:
//! a half-open trial that answers in time closes the breaker.
//!
//! All clocks are `tokio::time::Instant`, so tests drive them with `tokio::time::pause()`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::BreakerConfig;

/// The first-byte timeout is this many times the endpoint's expected first-byte time.
const TIMEOUT_FACTOR: u32 = 3;

/// Breaker states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests flow; outcomes are counted.
    Closed,
    /// Requests are refused until the cool-down ends.
    Open,
    /// A limited number of trial requests are let through.
    HalfOpen,
}

impl BreakerState {
    /// The value exported on `/metrics` (0 closed, 1 half-open, 2 open).
    pub fn as_gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

/// Quality verdict on an endpoint, set by the probe path's alerts (none yet set it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quality {
    /// Routed normally.
    Ok,
    /// Tried only after every healthy endpoint.
    Demoted,
    /// Never routed to.
    Excluded,
}

/// What the breaker allowed for one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A normal request.
    Normal,
    /// One of the limited trials of a half-open breaker.
    Trial,
}

/// A circuit breaker (see the module doc); not thread-safe by itself, see [`EndpointHealth`].
#[derive(Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: BreakerState,
    /// Failures in a row while closed.
    consecutive: u32,
    /// Outcomes (time, failed) in the error-rate window.
    window: VecDeque<(Instant, bool)>,
    /// When the open state ends.
    open_until: Instant,
    /// Trials in flight while half-open.
    trials: u32,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        Breaker {
            cfg,
            state: BreakerState::Closed,
            consecutive: 0,
            window: VecDeque::new(),
            open_until: Instant::now(),
            trials: 0,
        }
    }

    /// The state at `now` (an open breaker whose cool-down has passed reports half-open).
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.state {
            BreakerState::Open if now >= self.open_until => BreakerState::HalfOpen,
            s => s,
        }
    }

    /// Asks to send one request at `now`; None when the breaker refuses.
    pub fn try_acquire(&mut self, now: Instant) -> Option<Admission> {
        if self.state == BreakerState::Open && now >= self.open_until {
            self.state = BreakerState::HalfOpen;
            self.trials = 0;
        }
        match self.state {
            BreakerState::Closed => Some(Admission::Normal),
            BreakerState::Open => None,
            BreakerState::HalfOpen if self.trials < self.cfg.half_open_trials => {
                self.trials += 1;
                Some(Admission::Trial)
            }
            BreakerState::HalfOpen => None,
        }
    }

    /// A trial that ended without an outcome (the client went away) frees its slot.
    pub fn release_trial(&mut self) {
        if self.state == BreakerState::HalfOpen {
            self.trials = self.trials.saturating_sub(1);
        }
    }

    /// Records a success.
    pub fn on_success(&mut self, now: Instant, admission: Admission) {
        match (self.state, admission) {
            (BreakerState::HalfOpen, Admission::Trial) => self.close(),
            (BreakerState::Closed, _) => {
                self.consecutive = 0;
                self.push(now, false);
            }
            _ => {}
        }
    }

    /// Records a failure; true when it opened the breaker.
    pub fn on_failure(&mut self, now: Instant, admission: Admission) -> bool {
        match (self.state, admission) {
            (BreakerState::HalfOpen, Admission::Trial) => self.open(now),
            (BreakerState::Closed, _) => {
                self.consecutive += 1;
                self.push(now, true);
                if self.consecutive >= self.cfg.consecutive_failures || self.rate_tripped() {
                    self.open(now);
                } else {
                    return false;
                }
            }
            _ => return false,
        }
        true
    }

    fn push(&mut self, now: Instant, failed: bool) {
        self.window.push_back((now, failed));
        while let Some((t, _)) = self.window.front() {
            if now.duration_since(*t) > self.cfg.window {
                self.window.pop_front();
            } else {
                break;
            }
        }
        // Bound memory under very high rates: the oldest outcomes matter least.
        while self.window.len() > 10_000 {
            self.window.pop_front();
        }
    }

    fn rate_tripped(&self) -> bool {
        let n = self.window.len();
        if n < self.cfg.min_requests as usize || n == 0 {
            return false;
        }
        let failed = self.window.iter().filter(|(_, f)| *f).count();
        failed as f64 / n as f64 >= self.cfg.error_rate
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open;
        self.open_until = now + self.cfg.cooldown;
        self.trials = 0;
        self.consecutive = 0;
        self.window.clear();
    }

    fn close(&mut self) {
        self.state = BreakerState::Closed;
        self.trials = 0;
        self.consecutive = 0;
        self.window.clear();
    }
}

/// Peak-EWMA latency (Finagle / linkerd): a new sample above the estimate replaces it at once
/// (peak), a lower one is blended in with weight decaying over `tau`. The routing cost is the
/// estimate times (in-flight + 1), so a busy endpoint looks slower before its latency shows it.
#[derive(Debug)]
pub struct PeakEwma {
    tau: Duration,
    estimate_ms: f64,
    stamp: Instant,
}

impl PeakEwma {
    /// An estimator starting at `initial` (a guess for endpoints not yet measured).
    pub fn new(tau: Duration, initial: Duration) -> Self {
        PeakEwma {
            tau,
            estimate_ms: initial.as_secs_f64() * 1e3,
            stamp: Instant::now(),
        }
    }

    /// Adds one latency sample observed at `now`.
    pub fn observe(&mut self, now: Instant, sample: Duration) {
        let ms = sample.as_secs_f64() * 1e3;
        if ms > self.estimate_ms {
            self.estimate_ms = ms;
        } else {
            let elapsed = now.saturating_duration_since(self.stamp).as_secs_f64();
            let w = (-elapsed / self.tau.as_secs_f64().max(1e-9)).exp();
            self.estimate_ms = self.estimate_ms * w + ms * (1.0 - w);
        }
        self.stamp = now;
    }

    /// The current estimate in milliseconds.
    pub fn estimate_ms(&self) -> f64 {
        self.estimate_ms
    }
}

/// Floor and cap of an endpoint's adaptive first-byte timeout (a provider's
/// `first_byte_floor_ms` and `first_byte_timeout_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstByteBounds {
    /// No deadline is shorter than this.
    pub floor: Duration,
    /// No deadline is longer than this.
    pub cap: Duration,
}

/// When one attempt counts as overdue and when it times out, measured from its send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Past this without a response head the attempt counts against the endpoint.
    pub overdue_after: Duration,
    /// Past this the attempt is given up and the request fails over, if its endpoint sent no
    /// head since the attempt started; else it may wait up to `cap`.
    pub timeout: Duration,
    /// The longest any attempt waits (`first_byte_timeout_ms`).
    pub cap: Duration,
}

/// An endpoint's time to first byte, estimated as TCP estimates a round trip (RFC 6298): a
/// smoothed mean and a smoothed mean deviation, whose sum `mean + 4 * deviation` is a high
/// quantile of what the endpoint usually takes.
#[derive(Debug, Clone, Copy, Default)]
pub struct FirstByteEstimate {
    /// Smoothed time to first byte (ms); meaningless before the first sample.
    mean_ms: f64,
    /// Smoothed mean deviation (ms).
    dev_ms: f64,
    /// Whether any sample was seen.
    seen: bool,
}

impl FirstByteEstimate {
    /// Adds one time to first byte (or, for an attempt given up, the time it waited: a lower
    /// bound, which lengthens the deadlines the way TCP backs off its timer).
    pub fn observe(&mut self, sample: Duration) {
        let r = sample.as_secs_f64() * 1e3;
        if self.seen {
            self.dev_ms = 0.75 * self.dev_ms + 0.25 * (self.mean_ms - r).abs();
            self.mean_ms = 0.875 * self.mean_ms + 0.125 * r;
        } else {
            self.mean_ms = r;
            self.dev_ms = r / 2.0;
            self.seen = true;
        }
    }

    /// The time within which the endpoint usually answers; None before any sample.
    pub fn expected(&self) -> Option<Duration> {
        let ms = self.mean_ms + 4.0 * self.dev_ms;
        (self.seen && ms.is_finite()).then(|| Duration::from_secs_f64(ms.max(0.0) / 1e3))
    }

    /// One attempt's deadlines: overdue past the expected time, timed out past
    /// [`TIMEOUT_FACTOR`] times it, both within `bounds`. Before any sample the endpoint is
    /// overdue past the floor (a hung endpoint is found at once) but times out only at the cap
    /// (a slow one is not cut before it was ever measured).
    pub fn deadlines(&self, bounds: FirstByteBounds) -> Deadlines {
        let clamp = |d: Duration| d.max(bounds.floor).min(bounds.cap);
        match self.expected() {
            None => Deadlines {
                overdue_after: clamp(bounds.floor),
                timeout: bounds.cap,
                cap: bounds.cap,
            },
            Some(e) => Deadlines {
                overdue_after: clamp(e),
                timeout: clamp(e.saturating_mul(TIMEOUT_FACTOR)),
                cap: bounds.cap,
            },
        }
    }
}

/// Everything the router and the attempt loop know about one endpoint's health.
#[derive(Debug)]
pub struct EndpointHealth {
    breaker: Mutex<Breaker>,
    ewma: Mutex<PeakEwma>,
    /// Requests in flight now (for the latency cost).
    inflight: AtomicU32,
    /// Not routed to before this instant (an upstream `Retry-After`).
    not_before: Mutex<Option<Instant>>,
    /// [`Quality`] as a byte: 0 ok, 1 demoted, 2 excluded.
    quality: AtomicU8,
    /// Time to first byte of non-streamed `[0]` and streamed `[1]` requests.
    first_byte: Mutex<[FirstByteEstimate; 2]>,
    /// Woken when the breaker opens: attempts overdue on the endpoint give up.
    ejected: Notify,
    /// When the endpoint last sent a response head (any status): a late attempt on an endpoint
    /// that answered others meanwhile is a long request, not a hung endpoint.
    last_head: Mutex<Option<Instant>>,
}

impl EndpointHealth {
    /// A healthy endpoint.
    pub fn new(cfg: BreakerConfig) -> Self {
        EndpointHealth {
            breaker: Mutex::new(Breaker::new(cfg)),
            ewma: Mutex::new(PeakEwma::new(
                Duration::from_secs(10),
                Duration::from_millis(50),
            )),
            inflight: AtomicU32::new(0),
            not_before: Mutex::new(None),
            quality: AtomicU8::new(0),
            first_byte: Mutex::new([FirstByteEstimate::default(); 2]),
            ejected: Notify::new(),
            last_head: Mutex::new(None),
        }
    }

    /// The breaker state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker
            .lock()
            .map(|b| b.state(Instant::now()))
            .unwrap_or(BreakerState::Closed)
    }

    /// Whether the breaker would refuse a request now (used to order plans; the attempt itself
    /// asks [`EndpointHealth::try_acquire`]).
    pub fn is_open(&self) -> bool {
        self.breaker
            .lock()
            .map(|b| b.state(Instant::now()) == BreakerState::Open)
            .unwrap_or(false)
    }

    /// Asks the breaker for one attempt; the permit records its outcome or, dropped
    /// unrecorded, gives its trial slot back.
    pub fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let admission = self
            .breaker
            .lock()
            .ok()
            .and_then(|mut b| b.try_acquire(Instant::now()))?;
        Some(Permit {
            health: Arc::clone(self),
            admission,
            settled: false,
        })
    }

    /// Records the outcome of an attempt that the breaker admitted; a failure that opens the
    /// breaker wakes the attempts waiting on [`EndpointHealth::ejected`].
    pub fn record(&self, admission: Admission, ok: bool) {
        let opened = match self.breaker.lock() {
            Ok(mut b) if ok => {
                b.on_success(Instant::now(), admission);
                false
            }
            Ok(mut b) => b.on_failure(Instant::now(), admission),
            Err(_) => false,
        };
        if opened {
            self.ejected.notify_waiters();
        }
    }

    /// Resolves when the breaker next opens (create it, then check [`EndpointHealth::is_open`],
    /// then await it, so an opening in between is not missed: `Notified` counts from its
    /// creation once enabled).
    pub fn ejected(&self) -> tokio::sync::futures::Notified<'_> {
        self.ejected.notified()
    }

    /// Adds a time to first byte (see [`FirstByteEstimate::observe`]).
    pub fn observe_first_byte(&self, stream: bool, sample: Duration) {
        if let Ok(mut e) = self.first_byte.lock() {
            e[usize::from(stream)].observe(sample);
        }
    }

    /// The time within which the endpoint usually sends a head (None: never measured).
    pub fn expected(&self, stream: bool) -> Option<Duration> {
        self.first_byte
            .lock()
            .ok()
            .and_then(|e| e[usize::from(stream)].expected())
    }

    /// The deadlines of an attempt starting now.
    pub fn deadlines(&self, stream: bool, bounds: FirstByteBounds) -> Deadlines {
        self.first_byte
            .lock()
            .map(|e| e[usize::from(stream)].deadlines(bounds))
            .unwrap_or(Deadlines {
                overdue_after: bounds.cap,
                timeout: bounds.cap,
                cap: bounds.cap,
            })
    }

    /// An admitted attempt that ended without an outcome.
    fn release(&self, admission: Admission) {
        if admission == Admission::Trial
            && let Ok(mut b) = self.breaker.lock()
        {
            b.release_trial();
        }
    }

    /// Adds a latency sample (time to the response head), which also shows the endpoint alive.
    pub fn observe_latency(&self, sample: Duration) {
        let now = Instant::now();
        if let Ok(mut e) = self.ewma.lock() {
            e.observe(now, sample);
        }
        if let Ok(mut t) = self.last_head.lock() {
            *t = Some(now);
        }
    }

    /// Whether the endpoint sent any response head after `since`.
    pub fn answered_since(&self, since: Instant) -> bool {
        self.last_head
            .lock()
            .ok()
            .and_then(|t| *t)
            .is_some_and(|t| t > since)
    }

    /// The lowest-latency policy's cost: peak-EWMA estimate times (in-flight + 1).
    pub fn latency_cost(&self) -> f64 {
        let est = self
            .ewma
            .lock()
            .map(|e| e.estimate_ms())
            .unwrap_or(f64::MAX);
        est * f64::from(self.inflight.load(Ordering::Relaxed) + 1)
    }

    /// Counts a request in flight until the guard drops.
    pub fn start_request(self: &Arc<Self>) -> InflightGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        InflightGuard {
            health: Arc::clone(self),
        }
    }

    /// Marks the endpoint unavailable until `until` (from `Retry-After`).
    pub fn set_not_before(&self, until: Instant) {
        if let Ok(mut nb) = self.not_before.lock() {
            *nb = Some(nb.map_or(until, |old| old.max(until)));
        }
    }

    /// When the endpoint may be used again, if it asked us to wait.
    pub fn not_before(&self) -> Option<Instant> {
        self.not_before
            .lock()
            .ok()
            .and_then(|nb| *nb)
            .filter(|t| *t > Instant::now())
    }

    /// The quality verdict.
    pub fn quality(&self) -> Quality {
        match self.quality.load(Ordering::Relaxed) {
            0 => Quality::Ok,
            1 => Quality::Demoted,
            _ => Quality::Excluded,
        }
    }

    /// Sets the quality verdict (for the probe path's alerts).
    pub fn set_quality(&self, q: Quality) {
        let v = match q {
            Quality::Ok => 0,
            Quality::Demoted => 1,
            Quality::Excluded => 2,
        };
        self.quality.store(v, Ordering::Relaxed);
    }
}

/// One attempt the breaker admitted (see [`EndpointHealth::try_acquire`]). Its outcome is
/// recorded once with [`Permit::record`]; a permit dropped unrecorded is an attempt that ended
/// without an outcome (rate limited, unusable body, or cancelled with its client), and frees
/// its half-open trial slot.
#[derive(Debug)]
pub struct Permit {
    /// The endpoint whose breaker admitted the attempt.
    health: Arc<EndpointHealth>,
    /// What the breaker allowed.
    admission: Admission,
    /// The outcome was recorded: nothing to release on drop.
    settled: bool,
}

impl Permit {
    /// What the breaker allowed.
    pub fn admission(&self) -> Admission {
        self.admission
    }

    /// Records the attempt's outcome (consumes the permit).
    pub fn record(mut self, ok: bool) {
        self.settled = true;
        self.health.record(self.admission, ok);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.settled {
            self.health.release(self.admission);
        }
    }
}

/// Decrements the in-flight count on drop.
#[derive(Debug)]
pub struct InflightGuard {
    health: Arc<EndpointHealth>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.health.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
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

    #[tokio::test(start_paused = true)]
    async fn old_outcomes_leave_the_window() {
        let mut b = Breaker::new(cfg());
        for _ in 0..8 {
            b.on_success(Instant::now(), Admission::Normal);
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        for i in 0..9 {
            if i % 2 == 0 {
                b.on_failure(Instant::now(), Admission::Normal);
            } else {
                b.on_success(Instant::now(), Admission::Normal)
            }
        }
        // 9 outcomes in the window (the 8 old ones expired): below min_requests
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
}
