//! The alert watcher: what an active alert asks of the eval queue.
//!
//! [`AlertWatcher::run`] polls the store's active alerts. Each one needs the suites the rules
//! map it to, run against the reference, once: the jobs that answer an alert are its own
//! (but a failed one, which gave no verdict; a cancelled one counts, so it is not reopened)
//! and its endpoint's reference jobs of the suite opened since `cooldown_ms` before the
//! alert (by another alert of the same incident, or an operator), queued, running or with a
//! verdict. A suite nothing answers is opened, once, however long the alert stays active: an
//! alert held open for a day costs one run of each suite, not one per cooldown, and two
//! alerts raised together on an endpoint share one run, after the cooldown too. The
//! per-endpoint-and-suite cooldown is taken in the database, so several gateways open one
//! job. A job the opener refuses (an endpoint or baseline this config does not know) is
//! logged once per alert and suite, not on every poll.
//!
//! Jobs run against the reference; without one (no `[evals] reference_url`), against a peer: the
//! healthiest other endpoint of the alert's model on which no alert is active, by its last
//! hour of traffic in the rollups (one that served attempts first, then the smallest share that
//! failed or broke a tool call, then the most attempts, then by label; none: nothing is
//! opened, logged once). A job another alert of the incident opened is shared whatever its
//! baseline; one opened by hand only against the reference.
//!
//! A degraded verdict raises an [`KIND_EVAL_DEGRADED`] alert (the worker does), which routing
//! honours. The watcher holds it — confirms it once it was last seen `hold_every` ago (every
//! poll by default; the gateway passes a quarter of the alerts' quiet period), so its quiet
//! period does not resolve it — while a job answering an active alert has that degraded
//! verdict and no later job of the same endpoint, suite and baseline ended with another one.
//! Once the alerts it answers are resolved (the probes found the endpoint faithful again, or
//! an operator said so) or a later eval of the suite passes, it goes quiet and is resolved
//! after the quiet period like any other alert; an operator may resolve it at any time (a
//! confirmation never reopens).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use samewise_store::{
    Alert, AlertQuery, AlertState, EndpointRollup, EvalJob, JobState, RollupQuery, Store,
    StoreError, now_ms,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::EvalsError;
use crate::open::{OpenRequest, Opener, SuiteRef};
use crate::target::REFERENCE;
use crate::worker::ms;

/// The kind of the alert a degraded verdict raises.
pub const KIND_EVAL_DEGRADED: &str = "eval_degraded";

/// Jobs of one alert or endpoint the watcher reads (newest first).
const JOBS_READ: u32 = 100;

/// Opens jobs for active alerts, per the `[evals]` rules, and holds the `eval_degraded`
/// alerts of their degraded verdicts.
#[derive(Debug, Clone)]
pub struct AlertWatcher {
    store: Store,
    opener: Opener,
    /// (alert, suite) pairs whose job the opener refused (an endpoint or baseline this
    /// config does not know): logged once, not on every poll, while the alert stays active.
    refused: Arc<Mutex<BTreeSet<(i64, String)>>>,
    /// A held `eval_degraded` alert is confirmed once it was last seen this long ago.
    hold_every: Duration,
}

/// The eval jobs that answer alert `a`, newest first: every job it opened, and its
/// endpoint's jobs, queued, running or finished with a verdict, that were opened since
/// `cooldown` (`[evals] cooldown_ms`) before the alert by another alert of the same incident
/// (against the baseline the watcher chose: the reference, or without one a peer) or by hand
/// against the reference. What the alert watcher goes by, and what the alert's page and
/// `samewise alerts show` list.
pub async fn jobs_answering(
    store: &Store,
    a: &Alert,
    cooldown: Duration,
) -> Result<Vec<EvalJob>, StoreError> {
    let own = store.eval_jobs(Some(a.id), None, JOBS_READ).await?;
    let of_endpoint = store.eval_jobs(None, Some(&a.endpoint), JOBS_READ).await?;
    Ok(answering(a, &own, &of_endpoint, ms(cooldown)))
}

/// [`jobs_answering`] over jobs already read: `own` (the alert's) and `endpoint_jobs`.
fn answering(
    a: &Alert,
    own: &[EvalJob],
    endpoint_jobs: &[EvalJob],
    cooldown_ms: i64,
) -> Vec<EvalJob> {
    let since = a.opened_ms.saturating_sub(cooldown_ms);
    let shared = endpoint_jobs.iter().filter(|j| {
        j.alert_id != Some(a.id)
            && (j.alert_id.is_some() || j.baseline == REFERENCE)
            && j.created_ms >= since
            && matches!(
                j.state,
                JobState::Queued | JobState::Running | JobState::Succeeded
            )
    });
    let mut out: Vec<EvalJob> = own.iter().chain(shared).cloned().collect();
    out.sort_by_key(|j| std::cmp::Reverse(j.id));
    out
}

/// Whether the newest finished job of `job`'s endpoint and suite in `endpoint_jobs` (newest
/// first) against the same baseline is degraded (`job` itself, or a later degraded one): a
/// later pass ends the hold.
fn still_degraded(endpoint_jobs: &[EvalJob], job: &EvalJob) -> bool {
    endpoint_jobs
        .iter()
        .find(|j| {
            j.suite == job.suite && j.baseline == job.baseline && j.state == JobState::Succeeded
        })
        .is_none_or(is_degraded)
}

/// The job among `answering` (an alert's, newest first) whose degraded verdict holds its
/// endpoint's `eval_degraded` alert: one no later job of the same endpoint, suite and
/// baseline in `endpoint_jobs` ended with another verdict.
fn holding_job<'a>(answering: &'a [EvalJob], endpoint_jobs: &[EvalJob]) -> Option<&'a EvalJob> {
    answering
        .iter()
        .find(|j| is_degraded(j) && still_degraded(endpoint_jobs, j))
}

/// The active alerts that hold `d`, an active `eval_degraded` alert (what the watcher confirms
/// it for): those of its model and endpoint with a job answering them (per `cooldown`, as
/// [`jobs_answering`]) whose degraded verdict no later one ended; empty when nothing holds it
/// (it is resolved after its quiet period). None for an alert of another kind or a resolved one.
pub async fn holders(
    store: &Store,
    d: &Alert,
    cooldown: Duration,
) -> Result<Option<Vec<Alert>>, StoreError> {
    if d.kind != KIND_EVAL_DEGRADED || d.state == AlertState::Resolved {
        return Ok(None);
    }
    let q = AlertQuery {
        state: None,
        active_only: true,
        model: Some(d.model.clone()),
        endpoint: Some(d.endpoint.clone()),
        limit: JOBS_READ,
    };
    let endpoint_jobs = store.eval_jobs(None, Some(&d.endpoint), JOBS_READ).await?;
    let mut out = Vec::new();
    for a in store.alerts(&q).await? {
        if a.kind == KIND_EVAL_DEGRADED {
            continue;
        }
        let own = store.eval_jobs(Some(a.id), None, JOBS_READ).await?;
        let answering = answering(&a, &own, &endpoint_jobs, ms(cooldown));
        if holding_job(&answering, &endpoint_jobs).is_some() {
            out.push(a);
        }
    }
    Ok(Some(out))
}

fn is_degraded(job: &EvalJob) -> bool {
    job.state == JobState::Succeeded
        && job
            .verdict
            .as_ref()
            .is_some_and(|v| v["verdict"] == "degraded")
}

impl AlertWatcher {
    /// A watcher over `store`, opening jobs through `opener` (whose config holds the rules).
    pub fn new(store: Store, opener: Opener) -> AlertWatcher {
        AlertWatcher {
            store,
            opener,
            refused: Arc::default(),
            hold_every: Duration::ZERO,
        }
    }

    /// Confirms a held `eval_degraded` alert only once it was last seen `every` ago, not on
    /// every poll: one write per alert per `every`. It must stay well under the quiet period
    /// that resolves unconfirmed alerts (the gateway passes a quarter of it).
    #[must_use]
    pub fn hold_every(mut self, every: Duration) -> AlertWatcher {
        self.hold_every = every;
        self
    }

    /// Whether alert `id`'s `suite` was refused before; records it.
    fn refused_before(&self, id: i64, suite: &str) -> bool {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        !refused.insert((id, suite.to_owned()))
    }

    /// One pass: the jobs opened. An alert on an endpoint this config does not know opens
    /// nothing (logged once).
    pub async fn poll_once(&self) -> Result<Vec<EvalJob>, EvalsError> {
        let active = self.store.active_alerts().await?;
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(id, _)| active.iter().any(|a| a.id == *id));
        let cooldown = ms(self.opener.config().cooldown);
        // each endpoint's newest jobs, read once per pass (newest first)
        let mut of_endpoint: BTreeMap<String, Vec<EvalJob>> = BTreeMap::new();
        let mut opened = Vec::new();
        let mut held = BTreeSet::new();
        let stale_before = now_ms().saturating_sub(ms(self.hold_every));
        for a in active.iter().filter(|a| a.kind != KIND_EVAL_DEGRADED) {
            let endpoint_jobs = match of_endpoint.entry(a.endpoint.clone()) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(v) => {
                    let read = self.store.eval_jobs(None, Some(&a.endpoint), JOBS_READ);
                    v.insert(read.await?)
                }
            };
            let own = self.store.eval_jobs(Some(a.id), None, JOBS_READ).await?;
            let answering = answering(a, &own, endpoint_jobs, cooldown);
            let new = self.open_suites(a, &answering, &active).await?;
            for j in new.iter().rev() {
                endpoint_jobs.insert(0, j.clone());
            }
            opened.extend(new);
            let Some(job) = holding_job(&answering, endpoint_jobs) else {
                continue;
            };
            let held_alert = active.iter().find(|d| {
                d.kind == KIND_EVAL_DEGRADED && d.model == job.model && d.endpoint == job.endpoint
            });
            if let Some(d) = held_alert
                && held.insert(d.id)
                && d.last_seen_ms <= stale_before
            {
                self.store.confirm_alert(d.id).await?;
            }
        }
        Ok(opened)
    }

    /// The baseline of the jobs alert `a` opens: the reference when one is configured (None),
    /// else the healthiest peer ([`healthiest`] over the last [`PEER_WINDOW_MS`] of traffic)
    /// among the other endpoints of `a`'s model on which no alert in `active` is; an error
    /// when there is none.
    async fn baseline_for(
        &self,
        a: &Alert,
        active: &[Alert],
    ) -> Result<Option<String>, EvalsError> {
        if self.opener.config().reference_url.is_some() {
            return Ok(None);
        }
        let candidates: Vec<&str> = self
            .opener
            .peers(&a.endpoint)
            .filter(|p| !active.iter().any(|x| x.endpoint == *p))
            .collect();
        if candidates.is_empty() {
            return Err(EvalsError::UnknownBaseline(format!(
                "no reference ([evals] reference_url) and no other endpoint of model {} without an active alert to compare {} with",
                a.model, a.endpoint
            )));
        }
        let now = now_ms();
        let traffic = self
            .store
            .endpoint_rollups(&RollupQuery {
                model: Some(a.model.clone()),
                endpoint: None,
                since_ms: now - PEER_WINDOW_MS,
                until_ms: now,
            })
            .await?;
        Ok(healthiest(&candidates, &traffic).map(str::to_owned))
    }

    /// Opens the suites alert `a` maps to that none of the jobs `answering` it runs or ran
    /// (a failed one gave no verdict: its suite is opened again), against
    /// [`Self::baseline_for`]; returns the jobs opened.
    async fn open_suites(
        &self,
        a: &Alert,
        answering: &[EvalJob],
        active: &[Alert],
    ) -> Result<Vec<EvalJob>, EvalsError> {
        let config = self.opener.config();
        let mut opened = Vec::new();
        for suite in config.suites_for(&a.kind, &a.evidence) {
            if answering
                .iter()
                .any(|j| j.suite == suite && j.state != JobState::Failed)
            {
                continue;
            }
            let mut params = serde_json::Map::new();
            params.insert(
                "opened_by".to_owned(),
                json!({"alert": a.id, "kind": a.kind}),
            );
            if let Some(n) = config.max_items {
                params.insert("max_items".to_owned(), n.into());
            }
            let opening = async {
                let req = OpenRequest {
                    endpoint: a.endpoint.clone(),
                    suite: SuiteRef::Named(suite.clone()),
                    baseline: self.baseline_for(a, active).await?,
                    params,
                    alert_id: Some(a.id),
                };
                self.opener
                    .open(&self.store, &req, ms(config.cooldown))
                    .await
            };
            match opening.await {
                Ok(Some(j)) => {
                    tracing::info!(job = j.id, alert = a.id, suite = %j.suite, endpoint = %j.endpoint, "eval job opened by an alert");
                    opened.push(j);
                }
                Ok(None) => {}
                Err(EvalsError::Store(e)) => return Err(EvalsError::Store(e)),
                Err(e) => {
                    if !self.refused_before(a.id, &suite) {
                        tracing::warn!(alert = a.id, suite = %suite, error = %e, "no eval job for the alert");
                    }
                }
            }
        }
        Ok(opened)
    }

    /// Polls until `cancel`.
    pub async fn run(&self, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.poll_once().await {
                tracing::warn!(error = %e, "eval alert watcher");
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.opener.config().poll) => {}
            }
        }
    }
}

/// How far back the peers' own traffic is read to choose the healthiest.
const PEER_WINDOW_MS: i64 = 3_600_000;

/// The healthiest of `candidates` (given in label order) by their traffic in `rollups`: an
/// endpoint that served attempts before one that served none (it may be down), then the
/// smallest share of attempts that failed by its doing or returned a broken tool call, then the
/// most attempts; equal ones keep label order. None only without candidates.
fn healthiest<'a>(candidates: &[&'a str], rollups: &[EndpointRollup]) -> Option<&'a str> {
    let key = |c: &str| {
        let t = rollups.iter().find(|r| r.endpoint == c).map(|r| &r.totals);
        let requests = t.map_or(0, |t| t.requests);
        let failed = t.map_or(0, |t| t.errors + t.tool_errored);
        let share = if requests > 0 {
            failed as f64 / requests as f64
        } else {
            1.0
        };
        (requests == 0, share, -requests)
    };
    candidates.iter().copied().min_by(|a, b| {
        key(a)
            .partial_cmp(&key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    })
}

#[cfg(test)]
mod tests;
