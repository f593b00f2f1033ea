//! The probe scheduler. For every model × endpoint × enabled kind it runs a probe on the
//! model's interval with seeded jitter, within the endpoint's hourly probe-token budget
//! (`Store::probe_tokens_since`), stores each run (`Store::insert_probe_run`), runs the
//! "faithful?" and "changed?" detectors after it, and sweeps the passive detectors
//! periodically. Every `noise_pair_every`-th round of a kind with per-position data, or of a
//! fingerprint (the first included), is a noise-floor pair: the same probe twice, the second
//! stored with `repeat_of` and the pair's statistics (`stats.noise_pair`,
//! [`crate::detect::noise_pair_stats`], [`crate::detect::fingerprint_pair_stats`]). A run of
//! such a kind that would open an alert is paired at once too, and a paired run is judged
//! after its pair, so an alarm is judged with the endpoint's repeat noise of that moment
//! ([`crate::detect::Detectors::opens_alert`]); a round without a pair is judged once. The reference's scores are memoized ([`crate::reference::Cached`], `reference_cache_positions`): rounds
//! re-send the same sequences, and the reference's answer to one never changes.
//!
//! Probe runs are concurrent across endpoints, at most `concurrency` in flight (a semaphore
//! the scheduled loops and [`Scheduler::run_once`] share), and every HTTP request to an
//! endpoint has `request_timeout`: a slow or hung endpoint holds one slot and stalls no other.
//!
//! One scheduler is active per database: it runs only while it holds
//! `Store::try_scheduler_lock`; a standby retries every `lock_retry` and takes over when the
//! holder's session dies; an active one checks its lock as often and stands down if it was
//! lost. It runs beside the gateway (inside `samewise serve`) or alone (`samewise probes
//! run`), never on the request path. Every task it starts is tracked and drained when the
//! shutdown token fires.
//!
//! [`Scheduler::run_once`]: crate::runner::Scheduler::run_once

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samewise_store::{ProbeRun, ProbeRunQuery, Store};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{ModelProbes, ProbeKind, ProbesConfig};
use crate::detect::{Detectors, Judgement};
use crate::kinds::{self, Outcome, ProbeCtx, PromptSets, Target};
use crate::reference::{Cached, Reference};
use crate::{ProbesError, Result};

const HOUR_MS: i64 = 3_600_000;

/// The most stored fingerprint runs of an endpoint read for a refusal of echo (an hour of them
/// at a round a minute, each with its noise pair, with room to spare); where more were stored
/// within the hour, an older refusal is not found and echo is asked once.
const ECHO_RECALL_RUNS: u32 = 500;

/// Milliseconds since the Unix epoch (wall clock: stored times).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The scheduler: configuration, store, reference, detectors and the endpoints to probe.
pub struct Scheduler {
    cfg: Arc<ProbesConfig>,
    store: Store,
    /// None only when no probed model has a kind that needs one (fingerprint probes, the
    /// passive detectors and alerts only).
    reference: Option<Arc<dyn Reference>>,
    detectors: Option<Arc<Detectors>>,
    targets: Vec<Target>,
    sets: BTreeMap<String, Arc<PromptSets>>,
    http: reqwest::Client,
    /// Probe runs in flight across endpoints (`ProbesConfig::concurrency`).
    slots: tokio::sync::Semaphore,
    /// Endpoints whose fingerprint rounds ask by chat at once (they refused echo).
    echo_refusals: kinds::EchoRefusals,
    /// Times a standby found the lock held by another process; a test waits for it to
    /// advance before asserting that a standby probed nothing.
    standby_checks: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

/// What a round did.
#[derive(Debug, Clone, PartialEq)]
pub enum RoundResult {
    /// The runs stored (two for a noise-floor pair), with their ids.
    Stored(Vec<ProbeRun>),
    /// The endpoint's hourly budget was spent; nothing ran.
    OverBudget {
        /// Tokens spent in the last hour.
        spent: i64,
    },
}

impl Scheduler {
    /// A scheduler over `targets` (the endpoints of the models that have probes; endpoints of
    /// other models are ignored). Loads every model's prompt sets. Without a `reference` only
    /// fingerprint probes run ([`ProbeKind::needs_reference`]) beside the sweeps (passive
    /// detectors, quiet alerts).
    pub fn new(
        cfg: Arc<ProbesConfig>,
        store: Store,
        reference: Option<Arc<dyn Reference>>,
        detectors: Option<Arc<Detectors>>,
        targets: Vec<Target>,
    ) -> Result<Self> {
        let mut sets = BTreeMap::new();
        for (model, m) in &cfg.models {
            let s = PromptSets::load(&m.prompt_sets).map_err(|e| {
                ProbesError::Config(format!("models.{model}.probes.prompt_sets: {e}"))
            })?;
            sets.insert(model.clone(), Arc::new(s));
        }
        let targets = targets
            .into_iter()
            .filter(|t| cfg.models.contains_key(&t.model))
            .collect();
        if reference.is_none()
            && let Some((model, kind)) = crate::config::first_needing_reference(&cfg.models)
        {
            return Err(crate::config::missing_reference(model, kind));
        }
        let reference = reference.map(|r| -> Arc<dyn Reference> {
            match cfg.reference_cache_positions {
                0 => r,
                n => Arc::new(Cached::new(r, n)),
            }
        });
        Ok(Self {
            http: kinds::endpoint_client(cfg.request_timeout),
            slots: tokio::sync::Semaphore::new(cfg.concurrency),
            echo_refusals: kinds::EchoRefusals::default(),
            cfg,
            store,
            reference,
            detectors,
            targets,
            sets,
            standby_checks: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The endpoints probed.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    fn model(&self, t: &Target) -> Result<(&ModelProbes, &Arc<PromptSets>)> {
        let m = self
            .cfg
            .models
            .get(&t.model)
            .ok_or_else(|| ProbesError::Config(format!("no probes for model {}", t.model)))?;
        let s = self
            .sets
            .get(&t.model)
            .ok_or_else(|| ProbesError::Config(format!("no prompt sets for model {}", t.model)))?;
        Ok((m, s))
    }

    /// One round of `kind` on `target`: budget check, the probe (twice for a noise-floor
    /// round), storage, detectors. Errors only when the store fails.
    pub async fn run_round(
        &self,
        target: &Target,
        kind: ProbeKind,
        round: u64,
    ) -> Result<RoundResult> {
        let (mcfg, sets) = self.model(target)?;
        let spent = self
            .store
            .probe_tokens_since(&target.endpoint, now_ms() - HOUR_MS)
            .await?;
        if spent >= mcfg.token_budget_per_hour {
            tracing::info!(endpoint = %target.endpoint, kind = kind.name(), spent, "probe skipped: hourly token budget spent");
            return Ok(RoundResult::OverBudget { spent });
        }
        let seed = self.cfg.seed ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (kind as u64);
        if kind.needs_reference() && self.reference.is_none() {
            return Err(crate::config::missing_reference(&target.model, kind));
        }
        if kind == ProbeKind::Fingerprint && self.echo_refusals.first_recall(&target.endpoint) {
            self.recall_echo_refusal(target).await;
        }
        let ctx = ProbeCtx {
            reference: self.reference.as_deref(),
            cfg: mcfg,
            sets,
            http: &self.http,
            round,
            seed,
            echo_refusals: Some(&self.echo_refusals),
        };
        let pair = round.is_multiple_of(u64::from(self.cfg.noise_pair_every));
        // the detectors judge the first run after its round's pair, if it has one
        let first = self
            .probe_and_store(&ctx, target, kind, None, false)
            .await?;
        let mut out = vec![first];
        // a repeat measures a noise floor from per-position data (logprob kinds) or, for a
        // fingerprint, from its statistics: on every `noise_pair_every`-th round, and on a
        // round whose run would open an alert, so that the alarm is judged against the
        // endpoint's repeat noise of that moment (a nondeterministic endpoint is not flagged for
        // noise its last pair did not see). A round without a pair is judged once.
        let pairs = out[0].ok && (out[0].raw.is_some() || kind == ProbeKind::Fingerprint);
        let mut judged = if pairs && pair {
            None
        } else {
            self.judge(target, &out[0]).await
        };
        let alarm = pairs && !pair && self.opens_alert(target, judged.as_ref()).await;
        if pairs && (pair || alarm) {
            let second = self
                .probe_and_store(&ctx, target, kind, Some(&out[0]), true)
                .await?;
            out.push(second);
            judged = self.judge(target, &out[0]).await;
        }
        self.raise(target, &out[0], judged).await;
        Ok(RoundResult::Stored(out))
    }

    /// Reads `target`'s fingerprint runs of the last [`kinds::ECHO_RETRY_MS`] for a refusal of
    /// echo that an earlier process met ([`kinds::EchoRefusals::recall`]). A failed read is
    /// logged, and echo is asked as if nothing were stored.
    async fn recall_echo_refusal(&self, target: &Target) {
        let q = ProbeRunQuery {
            endpoint: Some(target.endpoint.clone()),
            kind: Some(ProbeKind::Fingerprint.name().to_owned()),
            since_ms: Some(now_ms() - kinds::ECHO_RETRY_MS),
            limit: ECHO_RECALL_RUNS,
            ..ProbeRunQuery::default()
        };
        match self.store.probe_runs(&q).await {
            Ok(runs) => {
                if self.echo_refusals.recall(&target.endpoint, &runs) {
                    tracing::info!(endpoint = %target.endpoint, "fingerprints ask by chat: the endpoint refused echo within the hour (stored runs)");
                }
            }
            Err(e) => {
                tracing::warn!(endpoint = %target.endpoint, error = %e, "reading stored fingerprint runs for a refusal of echo failed; echo will be asked")
            }
        }
    }

    /// The detectors' judgement of a stored run (`None` without detectors, or when they fail:
    /// logged).
    async fn judge(&self, target: &Target, run: &ProbeRun) -> Option<Judgement> {
        let d = self.detectors.as_ref()?;
        d.judge(&self.store, run)
            .await
            .inspect_err(|e| tracing::error!(endpoint = %target.endpoint, kind = %run.kind, error = %e, "detectors failed after a probe run"))
            .ok()
    }

    /// Whether raising `judged` would open an alert (false without a judgement, or when the
    /// store fails: logged).
    async fn opens_alert(&self, target: &Target, judged: Option<&Judgement>) -> bool {
        let (Some(d), Some(judged)) = (&self.detectors, judged) else {
            return false;
        };
        d.opens_alert(&self.store, judged)
            .await
            .inspect_err(|e| tracing::error!(endpoint = %target.endpoint, error = %e, "reading the active alerts failed"))
            .unwrap_or(false)
    }

    /// Raises what the detectors found on `run`.
    async fn raise(&self, target: &Target, run: &ProbeRun, judged: Option<Judgement>) {
        let (Some(d), Some(judged)) = (&self.detectors, judged) else {
            return;
        };
        if judged.is_empty() {
            return;
        }
        match d.raise(&self.store, judged).await {
            Ok(alerts) if !alerts.is_empty() => {
                tracing::warn!(endpoint = %target.endpoint, kind = %run.kind, alerts = alerts.len(), "probe run raised alerts");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(endpoint = %target.endpoint, error = %e, "raising a probe run's alerts failed")
            }
        }
    }

    /// One probe run, stored (with its noise-floor pair's statistics when it repeats
    /// `repeat_of`), then, with `detect`, the detectors after it.
    async fn probe_and_store(
        &self,
        ctx: &ProbeCtx<'_>,
        target: &Target,
        kind: ProbeKind,
        repeat_of: Option<&ProbeRun>,
        detect: bool,
    ) -> Result<ProbeRun> {
        // the semaphore is never closed, so acquiring only waits
        let slot = self.slots.acquire().await.ok();
        let started_ms = now_ms();
        let o: Outcome = kinds::run(kind, ctx, target).await;
        drop(slot);
        let mut run = ProbeRun {
            id: 0,
            model: target.model.clone(),
            endpoint: target.endpoint.clone(),
            kind: kind.name().to_owned(),
            started_ms,
            finished_ms: now_ms(),
            ok: o.ok,
            error: o.error,
            tokens: o.tokens,
            stats: o.stats,
            raw: o.raw,
            repeat_of: repeat_of.map(|first| first.id),
        };
        // a noise-floor pair's statistics go with the repeat, so that the detectors read the
        // floor without either run's raw data
        if let (Some(first_raw), Some(raw), true) = (
            repeat_of.and_then(|f| f.raw.as_deref()),
            run.raw.as_deref(),
            run.ok,
        ) {
            match crate::detect::noise_pair_stats(first_raw, raw) {
                Ok(pair) => {
                    if let Some(stats) = run.stats.as_object_mut() {
                        stats.insert("noise_pair".to_owned(), pair);
                    }
                }
                Err(e) => {
                    // null: the pair measures no floor, and its raw data need not be read
                    tracing::debug!(endpoint = %target.endpoint, error = %e, "noise-floor pair does not line up");
                    if let Some(stats) = run.stats.as_object_mut() {
                        stats.insert("noise_pair".to_owned(), serde_json::Value::Null);
                    }
                }
            }
        }
        // a fingerprint's pair: how far its statistics moved between the two
        if let (Some(first), true) = (repeat_of, run.ok)
            && kind == ProbeKind::Fingerprint
        {
            let pair = crate::detect::fingerprint_pair_stats(&first.stats, &run.stats);
            if let Some(stats) = run.stats.as_object_mut() {
                stats.insert("noise_pair".to_owned(), pair);
            }
        }
        if let Some(e) = &run.error {
            tracing::warn!(endpoint = %target.endpoint, kind = kind.name(), error = %e, "probe could not run");
        }
        run.id = self.store.insert_probe_run(&run).await?;
        if detect {
            let judged = self.judge(target, &run).await;
            self.raise(target, &run, judged).await;
        }
        Ok(run)
    }

    /// One round of every enabled kind on every endpoint (`samewise probes run`, tests), then
    /// a passive sweep. Endpoints run concurrently (within `concurrency`), each one's kinds in
    /// order; the results are in target order, each target's kinds in configured order.
    pub async fn run_once(&self, round: u64) -> Result<Vec<RoundResult>> {
        let per_target = futures_util::future::join_all(self.targets.iter().map(|t| async move {
            let (m, _) = self.model(t)?;
            let mut out = Vec::with_capacity(m.kinds.len());
            for &kind in &m.kinds {
                out.push(self.run_round(t, kind, round).await?);
            }
            Ok::<_, ProbesError>(out)
        }))
        .await;
        let mut out = Vec::new();
        for r in per_target {
            out.extend(r?);
        }
        self.sweep().await;
        Ok(out)
    }

    async fn sweep(&self) {
        if let Some(d) = &self.detectors
            && let Err(e) = d.sweep(&self.store, now_ms()).await
        {
            tracing::error!(error = %e, "passive detector sweep failed");
        }
    }

    /// Times this scheduler, standing by, found the lock held by another process.
    pub fn standby_checks(&self) -> u64 {
        self.standby_checks
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Runs until `shutdown` fires: standby until the database lock is won, then probes on
    /// schedule until shutdown or until the lock is lost.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let lock = tokio::select! {
                () = shutdown.cancelled() => return,
                l = self.store.try_scheduler_lock() => l,
            };
            match lock {
                Ok(Some(lock)) => {
                    tracing::info!(endpoints = self.targets.len(), "probe scheduler active");
                    let lost = Arc::clone(&self).active(lock, &shutdown).await;
                    if !lost {
                        return;
                    }
                    tracing::warn!("probe scheduler lost its database lock; standing by");
                }
                Ok(None) => {
                    self.standby_checks
                        .fetch_add(1, std::sync::atomic::Ordering::Release);
                    tracing::debug!("another process runs the probe scheduler; standing by")
                }
                Err(e) => tracing::error!(error = %e, "cannot take the probe scheduler lock"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.cfg.lock_retry) => {}
            }
        }
    }

    /// Active: one tracked task per endpoint; returns true if the lock was lost, false on
    /// shutdown. Always drains its tasks before returning.
    async fn active(
        self: Arc<Self>,
        mut lock: samewise_store::SchedulerLock,
        shutdown: &CancellationToken,
    ) -> bool {
        let stop = shutdown.child_token();
        let tracker = TaskTracker::new();
        for (i, t) in self.targets.iter().enumerate() {
            let me = Arc::clone(&self);
            let t = t.clone();
            let stop = stop.clone();
            tracker.spawn(async move { me.endpoint_loop(t, i as u64, stop).await });
        }
        tracker.close();
        let mut lost = false;
        let mut next_check = Instant::now() + self.cfg.lock_retry;
        let mut next_sweep = Instant::now() + self.cfg.sweep_interval;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep_until(next_check) => {
                    next_check += self.cfg.lock_retry;
                    if let Err(e) = lock.check().await {
                        tracing::error!(error = %e, "probe scheduler lock lost");
                        lost = true;
                        break;
                    }
                }
                () = tokio::time::sleep_until(next_sweep) => {
                    next_sweep += self.cfg.sweep_interval;
                    self.sweep().await;
                }
            }
        }
        stop.cancel();
        tracker.wait().await;
        if !lost && let Err(e) = lock.release().await {
            tracing::warn!(error = %e, "releasing the probe scheduler lock");
        }
        lost
    }

    /// The schedule of one endpoint: every kind due at its own time, first round at a
    /// seeded offset within one interval so endpoints and kinds spread out.
    async fn endpoint_loop(&self, target: Target, index: u64, stop: CancellationToken) {
        let Ok((m, _)) = self.model(&target) else {
            return;
        };
        let mut rng =
            StdRng::seed_from_u64(self.cfg.seed ^ index.wrapping_mul(0xa076_1d64_78bd_642f));
        let start = Instant::now();
        let mut due: Vec<(ProbeKind, Instant, u64)> = m
            .kinds
            .iter()
            .map(|&k| {
                (
                    k,
                    start
                        + m.interval_of(k)
                            .mul_f64(rng.random_range(0.0..1.0) * m.jitter.max(0.05)),
                    0,
                )
            })
            .collect();
        loop {
            let Some(i) = (0..due.len()).min_by_key(|&i| due[i].1) else {
                return;
            };
            let (kind, at, round) = due[i];
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(at) => {}
            }
            let r = tokio::select! {
                () = stop.cancelled() => return,
                r = self.run_round(&target, kind, round) => r,
            };
            if let Err(e) = r {
                tracing::error!(endpoint = %target.endpoint, kind = kind.name(), error = %e, "probe round failed");
            }
            due[i] = (
                kind,
                at + next_gap(m.interval_of(kind), m.jitter, &mut rng),
                round + 1,
            );
        }
    }
}

/// The interval with a uniform ± `jitter` share.
pub fn next_gap(interval: Duration, jitter: f64, rng: &mut StdRng) -> Duration {
    let f = if jitter > 0.0 {
        1.0 + rng.random_range(-jitter..=jitter)
    } else {
        1.0
    };
    interval.mul_f64(f.max(0.01))
}

#[cfg(test)]
mod tests;
