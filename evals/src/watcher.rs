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
//! first other endpoint of the alert's model on which no alert is active (none: nothing is
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

use samewise_store::{Alert, AlertQuery, AlertState, EvalJob, JobState, Store, StoreError, now_ms};
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
    /// else a peer — the first endpoint of `a`'s model (by label) on which no alert in `active`
    /// is; an error when there is none.
    fn baseline_for(&self, a: &Alert, active: &[Alert]) -> Result<Option<String>, EvalsError> {
        if self.opener.config().reference_url.is_some() {
            return Ok(None);
        }
        self.opener
            .peers(&a.endpoint)
            .find(|p| !active.iter().any(|x| x.endpoint == *p))
            .map(|p| Some(p.to_owned()))
            .ok_or_else(|| {
                EvalsError::UnknownBaseline(format!(
                    "no reference ([evals] reference_url) and no other endpoint of model {} without an active alert to compare {} with",
                    a.model, a.endpoint
                ))
            })
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
                    baseline: self.baseline_for(a, active)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::{Context, Result, ensure};
    use samewise_store::testing::TestDb;
    use samewise_store::{NewAlert, NewEvalJob, now_ms};

    const HOUR_MS: i64 = 3_600_000;

    /// A watcher with the default rules, `cooldown_ms`, and two endpoints, `a/m` and `b/m`.
    fn watcher(store: &Store, cooldown_ms: i64) -> Result<AlertWatcher> {
        let t: toml::Table =
            format!("reference_url = \"http://127.0.0.1:9\"\ncooldown_ms = {cooldown_ms}")
                .parse()?;
        let cfg = crate::EvalsConfig::parse(Some(&t), None)?;
        let endpoints = ["a/m", "b/m"].map(|e| (e.to_owned(), "m".to_owned()));
        Ok(AlertWatcher::new(
            store.clone(),
            Opener::new(cfg, endpoints),
        ))
    }

    async fn raise(
        store: &Store,
        (endpoint, kind): (&str, &str),
        evidence: serde_json::Value,
        at: i64,
    ) -> Result<Alert> {
        let a = NewAlert {
            model: "m".to_owned(),
            endpoint: endpoint.to_owned(),
            kind: kind.to_owned(),
            summary: format!("{kind} on {endpoint}"),
            evidence,
            now_ms: at,
        };
        Ok(store.upsert_alert(&a).await?.0)
    }

    /// Opens a `tool_calls` job against the reference on `endpoint` by hand.
    async fn open_by_hand(store: &Store, endpoint: &str) -> Result<()> {
        let job = NewEvalJob {
            model: "m".to_owned(),
            endpoint: endpoint.to_owned(),
            suite: "tool_calls".to_owned(),
            baseline: "reference".to_owned(),
            alert_id: None,
            params: json!({}),
            max_attempts: 1,
            now_ms: now_ms(),
        };
        store
            .enqueue_eval_job(&job, 0)
            .await?
            .context("not opened")?;
        Ok(())
    }

    /// The `eval_degraded` alert of `job`'s verdict on `endpoint`, last seen `at`.
    async fn verdict_alert(store: &Store, endpoint: &str, job: &EvalJob, at: i64) -> Result<Alert> {
        let evidence = json!({"signal": "eval", "job_id": job.id, "suite": "tool_calls"});
        raise(store, (endpoint, KIND_EVAL_DEGRADED), evidence, at).await
    }

    /// Claims the oldest queued job and finishes it with `verdict` (None: failed).
    async fn finish(store: &Store, verdict: Option<&str>) -> Result<EvalJob> {
        let (job, lease) = store
            .claim_eval_job("w", now_ms(), 60_000)
            .await?
            .context("no job to claim")?;
        let (state, doc) = match verdict {
            Some(v) => (JobState::Succeeded, Some(json!({"verdict": v}))),
            None => (JobState::Failed, None),
        };
        let error = verdict.is_none().then_some("the endpoint did not answer");
        ensure!(
            store
                .finish_eval_job(&lease, state, doc.as_ref(), error, now_ms())
                .await?
        );
        Ok(job)
    }

    async fn opened(w: &AlertWatcher) -> Result<Vec<(String, Option<i64>)>> {
        Ok(w.poll_once()
            .await?
            .into_iter()
            .map(|j| (j.suite, j.alert_id))
            .collect())
    }

    /// The holders of verdict alert `d` (an error for any other).
    async fn held_by(store: &Store, d: &Alert, cooldown: Duration) -> Result<Vec<Alert>> {
        holders(store, d, cooldown)
            .await?
            .context("not an active verdict alert")
    }

    fn ids(alerts: &[Alert]) -> Vec<i64> {
        alerts.iter().map(|a| a.id).collect()
    }

    async fn last_seen(store: &Store, id: i64) -> Result<i64> {
        Ok(store.alert(id).await?.context("alert gone")?.last_seen_ms)
    }

    fn tool_calls(a: &Alert) -> Vec<(String, Option<i64>)> {
        vec![("tool_calls".to_owned(), Some(a.id))]
    }

    /// With no cooldown, only the once-per-alert rule keeps an alert from opening a suite
    /// again.
    #[tokio::test]
    async fn an_alert_opens_each_suite_once_and_holds_its_degraded_verdict() -> Result<()> {
        let db = TestDb::sqlite().await?;
        let store = &db.store;
        let w = watcher(store, 0)?;
        let now = now_ms();
        let a = raise(store, ("a/m", "unfaithful"), json!({"bits": 4}), now).await?;
        ensure!(opened(&w).await? == tool_calls(&a));
        // still active, no cooldown: not again while its job is queued, running or done
        ensure!(opened(&w).await?.is_empty(), "reopened while queued");
        finish(store, None).await?;
        // a failed job gave no verdict: opened again, then not
        ensure!(
            opened(&w).await? == tool_calls(&a),
            "not reopened after a failure"
        );
        ensure!(opened(&w).await?.is_empty());
        let degraded = finish(store, Some("degraded")).await?;
        ensure!(opened(&w).await?.is_empty(), "reopened after a verdict");
        // both jobs answer it, newest first, the failed one too
        let answering = jobs_answering(store, &a, Duration::ZERO).await?;
        let states: Vec<JobState> = answering.iter().map(|j| j.state).collect();
        ensure!(
            states == [JobState::Succeeded, JobState::Failed],
            "{answering:?}"
        );

        // the verdict's eval_degraded alert, last seen ten hours ago, is held by the active
        // alert: the quiet sweep of an hour leaves it
        let d = verdict_alert(store, "a/m", &degraded, now - 10 * HOUR_MS).await?;
        ensure!(d.last_seen_ms == now - 10 * HOUR_MS);
        let before = now_ms();
        ensure!(opened(&w).await?.is_empty());
        ensure!(last_seen(store, d.id).await? >= before, "not held");
        ensure!(ids(&held_by(store, &d, Duration::ZERO).await?) == [a.id]);
        ensure!(
            holders(store, &a, Duration::ZERO).await?.is_none(),
            "not a verdict's alert"
        );
        let swept = store.resolve_quiet_alerts(now_ms() - HOUR_MS).await?;
        ensure!(swept.is_empty(), "swept: {swept:?}");

        // a later job of the suite on the endpoint (opened by hand) passes: no longer held
        open_by_hand(store, "a/m").await?;
        finish(store, Some("equivalent")).await?;
        let seen = last_seen(store, d.id).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
        ensure!(opened(&w).await?.is_empty());
        ensure!(last_seen(store, d.id).await? == seen, "held after a pass");
        let held = held_by(store, &d, Duration::ZERO).await?;
        ensure!(held.is_empty(), "held after a pass by {:?}", ids(&held));

        // another alert on the endpoint, raised after every job there: its own job; once
        // cancelled, not reopened
        let b = raise(
            store,
            ("a/m", "passive"),
            json!({"signal": "tool_call_errors"}),
            now_ms(),
        )
        .await?;
        ensure!(opened(&w).await? == tool_calls(&b));
        let queued = store.eval_jobs(Some(b.id), None, 10).await?;
        let first = queued.first().context("no job of b")?;
        store.cancel_eval_job(first.id).await?;
        ensure!(opened(&w).await?.is_empty(), "a cancelled job was reopened");

        // an alert on an endpoint this config does not know: refused, logged once while it
        // stays active, forgotten once resolved
        let lost = raise(store, ("gone/m", "unfaithful"), json!({}), now).await?;
        ensure!(opened(&w).await?.is_empty());
        ensure!(
            w.refused_before(lost.id, "tool_calls"),
            "the refusal was not recorded"
        );
        store.resolve_alert(lost.id).await?;
        ensure!(opened(&w).await?.is_empty());
        ensure!(
            !w.refused_before(lost.id, "tool_calls"),
            "kept after the resolution"
        );

        // a confirmation never reopens: an operator's resolution stands
        store.resolve_alert(d.id).await?;
        ensure!(
            store
                .confirm_alert(d.id)
                .await?
                .is_some_and(|x| x.resolved_ms.is_some())
        );
        ensure!(store.confirm_alert(i64::MAX).await?.is_none());
        Ok(())
    }

    /// Two alerts of one incident on an endpoint: the second, raised within the cooldown of
    /// the first one's job, shares it — after the cooldown too — and holds its verdict once
    /// the first is resolved.
    #[tokio::test]
    async fn alerts_of_one_incident_share_a_suites_run_and_its_verdict() -> Result<()> {
        const COOLDOWN_MS: i64 = 300;
        let db = TestDb::sqlite().await?;
        let store = &db.store;
        let w = watcher(store, COOLDOWN_MS)?;
        let first = raise(store, ("b/m", "unfaithful"), json!({"bits": 4}), now_ms()).await?;
        ensure!(opened(&w).await? == tool_calls(&first));
        let second = raise(
            store,
            ("b/m", "passive"),
            json!({"signal": "tool"}),
            now_ms(),
        )
        .await?;
        // past the cooldown the store would open another job; the second alert shares the
        // first one's instead
        tokio::time::sleep(Duration::from_millis(COOLDOWN_MS as u64 + 50)).await;
        ensure!(
            opened(&w).await?.is_empty(),
            "the second alert ran the suite again"
        );
        // the first one's job answers both; the alert pages and `alerts show` list it
        let cooldown = Duration::from_millis(COOLDOWN_MS as u64);
        for a in [&first, &second] {
            let jobs = jobs_answering(store, a, cooldown).await?;
            let by: Vec<Option<i64>> = jobs.iter().map(|j| j.alert_id).collect();
            ensure!(by == [Some(first.id)], "alert {}: {jobs:?}", a.id);
        }
        let degraded = finish(store, Some("degraded")).await?;
        ensure!(degraded.alert_id == Some(first.id));
        let d = verdict_alert(store, "b/m", &degraded, now_ms() - HOUR_MS).await?;
        store.resolve_alert(first.id).await?;
        let before = now_ms();
        ensure!(opened(&w).await?.is_empty());
        ensure!(
            last_seen(store, d.id).await? >= before,
            "the second alert does not hold it"
        );
        ensure!(ids(&held_by(store, &d, cooldown).await?) == [second.id]);

        // a third alert raised well after that job (more than the cooldown) runs its own
        store.resolve_alert(second.id).await?;
        tokio::time::sleep(Duration::from_millis(COOLDOWN_MS as u64 + 50)).await;
        let third = raise(store, ("b/m", "unfaithful"), json!({"bits": 3}), now_ms()).await?;
        ensure!(opened(&w).await? == tool_calls(&third));
        Ok(())
    }

    /// Without a reference an alert's suite runs against the first peer of its model with no
    /// active alert; with none left, nothing is opened (and the refusal is logged once). A
    /// second alert of an incident shares the first one's job against its peer.
    #[tokio::test]
    async fn without_a_reference_an_alert_is_answered_against_a_peer_without_alerts() -> Result<()>
    {
        let db = TestDb::sqlite().await?;
        let store = &db.store;
        let cfg = crate::EvalsConfig::parse(Some(&"cooldown_ms = 60000".parse()?), None)?;
        let endpoints = ["a/m", "b/m", "c/m", "x/other"].map(|e| {
            let model = e.split('/').nth(1).unwrap_or_default();
            (e.to_owned(), model.to_owned())
        });
        let w = AlertWatcher::new(store.clone(), Opener::new(cfg, endpoints));
        let mut first = None;
        for (endpoint, peer) in [("b/m", Some("a/m")), ("a/m", Some("c/m")), ("c/m", None)] {
            let a = raise(
                store,
                (endpoint, "unfaithful"),
                json!({"bits": 4}),
                now_ms(),
            )
            .await?;
            let jobs = w.poll_once().await?;
            let got: Vec<(&str, &str)> = jobs
                .iter()
                .map(|j| (j.endpoint.as_str(), j.baseline.as_str()))
                .collect();
            let expect: Vec<(&str, &str)> = peer.map(|p| (endpoint, p)).into_iter().collect();
            ensure!(got == expect, "alert on {endpoint}: {got:?}");
            if peer.is_none() {
                ensure!(
                    w.refused_before(a.id, "tool_calls"),
                    "the refusal was not recorded"
                );
            }
            first = first.or(Some(a));
        }
        // a second alert of b/m's incident shares the first one's job against a/m
        let first = first.context("no alert")?;
        let passive = json!({"signal": "tool_call_errors"});
        let second = raise(store, ("b/m", "passive"), passive, now_ms()).await?;
        ensure!(
            w.poll_once().await?.is_empty(),
            "the second alert opened its own"
        );
        let shared = jobs_answering(store, &second, Duration::from_secs(60)).await?;
        let by: Vec<(Option<i64>, &str)> = shared
            .iter()
            .map(|j| (j.alert_id, j.baseline.as_str()))
            .collect();
        ensure!(by == [(Some(first.id), "a/m")], "{by:?}");
        Ok(())
    }

    /// With `hold_every`, a held verdict's alert is written once per period, not every poll.
    #[tokio::test]
    async fn a_held_verdict_is_confirmed_once_per_hold_every() -> Result<()> {
        const EVERY_MS: u64 = 600;
        let db = TestDb::sqlite().await?;
        let store = &db.store;
        let w = watcher(store, 0)?.hold_every(Duration::from_millis(EVERY_MS));
        let a = raise(store, ("a/m", "unfaithful"), json!({"bits": 4}), now_ms()).await?;
        ensure!(opened(&w).await? == tool_calls(&a));
        let degraded = finish(store, Some("degraded")).await?;
        let d = verdict_alert(store, "a/m", &degraded, now_ms() - HOUR_MS).await?;
        // last seen an hour ago: confirmed at once
        let before = now_ms();
        ensure!(opened(&w).await?.is_empty());
        let first = last_seen(store, d.id).await?;
        ensure!(first >= before, "a stale held alert was not confirmed");
        // seen just now: the next polls leave it
        for _ in 0..3 {
            ensure!(opened(&w).await?.is_empty());
        }
        let polled = now_ms();
        ensure!(
            polled - first >= i64::try_from(EVERY_MS)? || last_seen(store, d.id).await? == first,
            "confirmed again within hold_every"
        );
        // once the period has passed, confirmed again
        tokio::time::sleep(Duration::from_millis(EVERY_MS + 50)).await;
        ensure!(opened(&w).await?.is_empty());
        ensure!(
            last_seen(store, d.id).await? > first,
            "not confirmed after hold_every"
        );
        Ok(())
    }
}
