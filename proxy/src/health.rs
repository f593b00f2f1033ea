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

/// Quality verdict on an endpoint, set from its active alerts (probes, passive checks, eval
/// verdicts) and its model's `on_drift` by [`crate::QualityWatcher`].
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
    /// How many of `window`'s outcomes are failures (kept as they come and go, so a failure
    /// under an error storm does not count 10,000 outcomes).
    window_failed: usize,
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
            window_failed: 0,
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
        self.window_failed += usize::from(failed);
        // Bound memory under very high rates: the oldest outcomes matter least.
        while self.window.front().is_some_and(|(t, _)| {
            now.duration_since(*t) > self.cfg.window || self.window.len() > 10_000
        }) {
            if let Some((_, f)) = self.window.pop_front() {
                self.window_failed -= usize::from(f);
            }
        }
    }

    fn rate_tripped(&self) -> bool {
        let n = self.window.len();
        if n < self.cfg.min_requests as usize || n == 0 {
            return false;
        }
        self.window_failed as f64 / n as f64 >= self.cfg.error_rate
    }

    fn clear_window(&mut self) {
        self.window.clear();
        self.window_failed = 0;
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open;
        self.open_until = now + self.cfg.cooldown;
        self.trials = 0;
        self.consecutive = 0;
        self.clear_window();
    }

    fn close(&mut self) {
        self.state = BreakerState::Closed;
        self.trials = 0;
        self.consecutive = 0;
        self.clear_window();
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

    /// Sets the quality verdict ([`crate::QualityWatcher`], from the endpoint's active alerts).
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
mod tests;
