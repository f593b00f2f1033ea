//! The job worker.
//!
//! [`Worker::run`] claims jobs (a lease, renewed by heartbeats every lease/3 while the job
//! runs), runs each item on the suspect and the baseline (items already stored — a job
//! resumed after its worker died — are skipped), writes each result once, looks at the
//! paired results at the fixed look points (a chat suite's checks and, where items offer
//! tools, its calls' schema validity: co-primary tables, `stats::decide_all`) and stops as
//! soon as the verdict is decided or
//! the token budget is spent, then finishes the job with its verdict document, attaches it
//! to the alert that opened the job and POSTs it to the webhooks; a "degraded" verdict also
//! raises an `eval_degraded` alert on the endpoint, which routing honours (`on_drift`; the
//! alert watcher holds it while an alert the job answers stays active), through the
//! [`RaiseAlert`] the binary gives (the alerting that tells the alert webhooks of an
//! opening). A worker that loses its lease stops at once; a cancelled worker stops and leaves
//! its lease to expire.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use samewise_store::{EvalJob, JobState, Lease, NewAlert, Store};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::{EvalsConfig, LongContextConfig};
use crate::long_context::{self, Scoring};
use crate::report::{Stop, document, paired, schema_block, schema_paired};
use crate::stats::{
    Decision, Verdict, VerdictParams, decide, decide_all, look_points, plan_looks, stop_reason,
};
use crate::target::Targets;
use crate::{EvalsError, custom, tool_calls};

/// What every group of one `long_context` job shares.
struct LongContextJob<'a> {
    job: &'a EvalJob,
    lease: &'a Lease,
    suspect: &'a crate::target::Target,
    baseline: &'a crate::target::Target,
    /// The likelihood margin an answer must win by.
    margin: f64,
    /// The job's seed (its items and sampling).
    seed: u64,
}

/// How one worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Unique among live workers (host, pid, index).
    pub id: String,
    /// Lease of a claimed job.
    pub lease: Duration,
    /// Idle poll period.
    pub poll: Duration,
    /// Token budget per job (a job's `params.budget_tokens` overrides it).
    pub budget_tokens: i64,
    /// Items in flight.
    pub concurrency: usize,
    /// Verdict parameters (a job's `params` may override delta, alpha, looks).
    pub verdict: VerdictParams,
    /// Verdicts are POSTed here.
    pub webhooks: Vec<String>,
    /// The `long_context` suite's settings (a job's params override them).
    pub long_context: LongContextConfig,
}

impl WorkerSettings {
    /// Settings from the config, with worker id `id`.
    pub fn from_config(cfg: &EvalsConfig, id: String) -> WorkerSettings {
        WorkerSettings {
            id,
            lease: cfg.lease,
            poll: cfg.poll,
            budget_tokens: cfg.budget_tokens,
            concurrency: cfg.concurrency,
            verdict: cfg.verdict,
            webhooks: cfg.webhooks.clone(),
            long_context: cfg.long_context.clone(),
        }
    }
}

/// A job worker.
#[derive(Debug, Clone)]
pub struct Worker {
    store: Store,
    targets: Arc<Targets>,
    settings: WorkerSettings,
    raiser: Option<Arc<dyn RaiseAlert>>,
}

/// Opens (or refreshes) the `eval_degraded` alert of a degraded verdict. The binary passes the
/// alerting of `[probes.alerts]`, which tells the alert webhooks of an opening, as it does of
/// every other alert's; without one the worker writes the alert into the store, telling nobody.
pub trait RaiseAlert: Send + Sync + std::fmt::Debug {
    /// Opens `alert`, or refreshes the active one of its endpoint and kind.
    fn raise<'a>(&'a self, alert: &'a NewAlert) -> BoxFuture<'a, Result<(), String>>;
}

/// `d` in milliseconds, as the store takes times.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Worker {
    /// A worker over `store`, reaching endpoints through `targets`.
    pub fn new(store: Store, targets: Arc<Targets>, settings: WorkerSettings) -> Worker {
        Worker {
            store,
            targets,
            settings,
            raiser: None,
        }
    }

    /// Raises a degraded verdict's alert through `raiser` instead of writing it itself.
    pub fn raising_through(mut self, raiser: Arc<dyn RaiseAlert>) -> Worker {
        self.raiser = Some(raiser);
        self
    }

    /// Claims and runs jobs until `cancel`. Errors of one job fail that job (or, for a lost
    /// lease, leave it to its new holder); store errors are logged and retried after a poll.
    pub async fn run(&self, cancel: CancellationToken) {
        loop {
            if cancel.is_cancelled() {
                return;
            }
            match self.run_next(&cancel).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => tracing::warn!(worker = %self.settings.id, error = %e, "eval worker"),
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.settings.poll) => {}
            }
        }
    }

    /// Claims one job and runs it to its end. Ok(false) when nothing was claimable.
    pub async fn run_next(&self, cancel: &CancellationToken) -> Result<bool, EvalsError> {
        let now = samewise_store::now_ms();
        let Some((job, lease)) = self
            .store
            .claim_eval_job(&self.settings.id, now, ms(self.settings.lease))
            .await?
        else {
            return Ok(false);
        };
        tracing::info!(job = job.id, suite = %job.suite, endpoint = %job.endpoint, attempt = lease.attempt, worker = %self.settings.id, "eval job claimed");
        let work = self.work(&job, &lease);
        tokio::pin!(work);
        let mut beat = tokio::time::interval(self.settings.lease / 3);
        beat.tick().await;
        let outcome = loop {
            tokio::select! {
                r = &mut work => break r,
                () = cancel.cancelled() => return Ok(true),
                _ = beat.tick() => {
                    let alive = self.store.heartbeat_eval_job(&lease, samewise_store::now_ms(), ms(self.settings.lease), None).await?;
                    if !alive {
                        break Err(EvalsError::LeaseLost(job.id));
                    }
                }
            }
        };
        match outcome {
            Ok(verdict) => self.publish(&job, &verdict).await,
            Err(EvalsError::LeaseLost(id)) => {
                tracing::warn!(job = id, "lost the lease; the job continues elsewhere");
            }
            Err(e) => {
                tracing::warn!(job = job.id, error = %e, "eval job failed");
                self.store
                    .finish_eval_job(
                        &lease,
                        JobState::Failed,
                        None,
                        Some(&e.to_string()),
                        samewise_store::now_ms(),
                    )
                    .await?;
            }
        }
        Ok(true)
    }

    fn params(&self, job: &EvalJob) -> (VerdictParams, i64) {
        let p = &job.params;
        let d = self.settings.verdict;
        let verdict = VerdictParams {
            delta: p["delta"].as_f64().unwrap_or(d.delta),
            alpha: p["alpha"].as_f64().unwrap_or(d.alpha),
            looks: p["looks"]
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(d.looks)
                .max(1),
        };
        let budget = p["budget_tokens"]
            .as_i64()
            .unwrap_or(self.settings.budget_tokens);
        (verdict, budget)
    }

    /// Runs the job's items under `lease` and finishes it; returns the verdict document.
    async fn work(&self, job: &EvalJob, lease: &Lease) -> Result<Value, EvalsError> {
        match job.suite.as_str() {
            "tool_calls" => self.work_tool_calls(job, lease).await,
            "long_context" => self.work_long_context(job, lease).await,
            _ if job.params.get("custom").is_some() => self.work_custom(job, lease).await,
            // a regression job opened without its snapshot runs the model's cases as they are
            s if crate::config::is_regression(s) => {
                let items = crate::capture::items(&self.store, &job.model, s).await?;
                let mut job = job.clone();
                job.params["custom"] =
                    json!({"name": s, "source": "regression cases", "items": items});
                self.work_custom(&job, lease).await
            }
            s => Err(EvalsError::Suite(format!("unknown suite {s:?}"))),
        }
    }

    /// Renews the lease, recording the job's item count when known.
    async fn renew(
        &self,
        job: &EvalJob,
        lease: &Lease,
        total: Option<usize>,
    ) -> Result<(), EvalsError> {
        let alive = self
            .store
            .heartbeat_eval_job(
                lease,
                samewise_store::now_ms(),
                ms(self.settings.lease),
                total.and_then(|n| u32::try_from(n).ok()),
            )
            .await?;
        if alive {
            Ok(())
        } else {
            Err(EvalsError::LeaseLost(job.id))
        }
    }

    /// Writes results (each once); a result already written under a lost lease stops the job.
    async fn write(
        &self,
        job: &EvalJob,
        lease: &Lease,
        results: &[samewise_store::EvalResult],
    ) -> Result<(), EvalsError> {
        for r in results {
            let written = self
                .store
                .insert_eval_result(lease, r, samewise_store::now_ms())
                .await?;
            if !written {
                self.renew(job, lease, None).await?;
            }
        }
        Ok(())
    }

    /// Finishes the job with its verdict document.
    async fn finish(&self, job: &EvalJob, lease: &Lease, doc: &Value) -> Result<(), EvalsError> {
        if !self
            .store
            .finish_eval_job(
                lease,
                JobState::Succeeded,
                Some(doc),
                None,
                samewise_store::now_ms(),
            )
            .await?
        {
            return Err(EvalsError::LeaseLost(job.id));
        }
        tracing::info!(
            job = job.id,
            verdict = doc["verdict"].as_str().unwrap_or("?"),
            "eval job finished"
        );
        Ok(())
    }

    /// The `long_context` suite: its groups task by task (each on both targets), a look
    /// after each task's sweep of the lengths at the usual look points, the per-length
    /// analysis beside the verdict.
    async fn work_long_context(&self, job: &EvalJob, lease: &Lease) -> Result<Value, EvalsError> {
        let started = Instant::now();
        let suspect = self.targets.get(&job.endpoint)?.clone();
        let baseline = self.targets.get(&job.baseline)?.clone();
        let tokenizer = self
            .targets
            .get(crate::target::REFERENCE)
            .unwrap_or(&baseline)
            .clone();
        let cfg = self.settings.long_context.with_params(&job.params)?;
        let seed = job.params["seed"]
            .as_u64()
            .unwrap_or_else(|| u64::try_from(job.id).unwrap_or(0));
        let suite = long_context::prepare(&self.targets, &tokenizer, &cfg, seed).await?;
        let (mut params, budget) = self.params(job);
        let order = suite.order();
        self.renew(job, lease, Some(order.len())).await?;
        let ends = suite.task_ends();
        // looks only where a task's sweep of every length is complete
        let looks: Vec<usize> = look_points(ends.len(), params.looks)
            .into_iter()
            .filter_map(|i| ends.get(i.wrapping_sub(1)).copied())
            .collect();
        params.looks = u32::try_from(looks.len()).unwrap_or(1).max(1);
        let stored = self.store.eval_results(job.id).await?;
        let mut scoring = stored.iter().find_map(Scoring::of);
        let margin = cfg.margin;
        let mut looks_done = 0u32;
        let mut from = 0usize;
        let mut reason = "all_items";
        for point in looks {
            let lc = LongContextJob {
                job,
                lease,
                suspect: &suspect,
                baseline: &baseline,
                margin,
                seed,
            };
            for g in &suite.groups[from..point] {
                self.long_context_group(&lc, g, &mut scoring).await?;
            }
            from = point;
            looks_done += 1;
            let results = self.store.eval_results(job.id).await?;
            let d = decide(&paired(&order, &results), &params, looks_done);
            let spent: i64 = results.iter().map(|r| r.tokens).sum();
            tracing::info!(
                job = job.id,
                groups = point,
                verdict = d.verdict.as_str(),
                p = d.p_value,
                tokens = spent,
                "eval look"
            );
            if d.verdict == Verdict::Degraded {
                reason = "decided";
                break;
            }
            if spent >= budget {
                reason = "budget";
                break;
            }
        }
        let results = self.store.eval_results(job.id).await?;
        let t = paired(&order, &results);
        let mut d = decide(&t, &params, looks_done.max(1));
        let scoring = scoring.unwrap_or(Scoring::Likelihood);
        let (mut extras, below_any) = long_context::analyze(&suite, &results, &params, scoring);
        if d.verdict == Verdict::Equivalent && below_any {
            d.verdict = Verdict::Inconclusive;
            extras["verdict_note"] =
                json!("pooled equivalent, but a length is significantly below the baseline");
        }
        let stop = Stop {
            looks_done,
            reason,
            items_total: order.len(),
            wall_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        };
        let doc = document(&job.suite, &t, &d, &params, &results, &stop, extras);
        self.finish(job, lease, &doc).await?;
        Ok(doc)
    }

    /// One group of a `long_context` job on the sides that have not answered it yet (a
    /// resumed job skips what is stored). The first group decides the scoring: a side refusing
    /// echo logprobs makes both sides answer by generation, so they are judged alike.
    async fn long_context_group(
        &self,
        lc: &LongContextJob<'_>,
        g: &samewise_longctx::Group,
        scoring: &mut Option<Scoring>,
    ) -> Result<(), EvalsError> {
        let done = self.store.eval_results(lc.job.id).await?;
        let has = |role: &str| {
            g.queries
                .iter()
                .all(|q| done.iter().any(|r| r.item == q.id && r.target == role))
        };
        let todo: Vec<(&crate::target::Target, &str)> =
            [(lc.suspect, "suspect"), (lc.baseline, "baseline")]
                .into_iter()
                .filter(|(_, role)| !has(role))
                .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let mode = scoring.unwrap_or(Scoring::Likelihood);
        let mut futs = Vec::with_capacity(todo.len());
        for (t, role) in &todo {
            futs.push(long_context::run_group(
                &self.targets,
                t,
                role,
                g,
                mode,
                lc.margin,
                lc.seed,
            ));
        }
        let runs = futures_util::future::join_all(futs).await;
        if scoring.is_none() {
            if runs
                .iter()
                .any(|r| r.as_ref().err().is_some_and(long_context::is_refusal))
            {
                tracing::info!(
                    job = lc.job.id,
                    "long_context: logprobs refused; scoring by generation"
                );
                *scoring = Some(Scoring::Generation);
                let mut futs = Vec::with_capacity(todo.len());
                for (t, role) in &todo {
                    futs.push(long_context::run_group(
                        &self.targets,
                        t,
                        role,
                        g,
                        Scoring::Generation,
                        lc.margin,
                        lc.seed,
                    ));
                }
                let again = futures_util::future::join_all(futs).await;
                for (r, (t, role)) in again.into_iter().zip(&todo) {
                    let rs = r.unwrap_or_else(|e| {
                        long_context::failed_group(
                            g,
                            t,
                            role,
                            Scoring::Generation,
                            lc.seed,
                            &e.to_string(),
                        )
                    });
                    self.write(lc.job, lc.lease, &rs).await?;
                }
                return Ok(());
            }
            *scoring = Some(Scoring::Likelihood);
        }
        for (r, (t, role)) in runs.into_iter().zip(&todo) {
            let rs = r.unwrap_or_else(|e| {
                long_context::failed_group(g, t, role, mode, lc.seed, &e.to_string())
            });
            self.write(lc.job, lc.lease, &rs).await?;
        }
        Ok(())
    }

    /// The `tool_calls` suite.
    async fn work_tool_calls(&self, job: &EvalJob, lease: &Lease) -> Result<Value, EvalsError> {
        let items = tool_calls::items()?;
        self.work_items(
            job,
            lease,
            items,
            |it| it.id.as_str(),
            |targets, t, role, it| async move { tool_calls::run(&targets, &t, role, &it).await },
            tool_calls::extras,
        )
        .await
    }

    /// A customer suite: the items the job carries (`params.custom.items`).
    async fn work_custom(&self, job: &EvalJob, lease: &Lease) -> Result<Value, EvalsError> {
        let sources = job.params["custom"]["items"]
            .as_array()
            .ok_or_else(|| EvalsError::Suite("params.custom.items: not an array".to_owned()))?;
        let suite = custom::from_sources(sources)?;
        let source = job.params["custom"]["source"].clone();
        self.work_items(
            job,
            lease,
            suite.items,
            |it| it.id.as_str(),
            |targets, t, role, it| async move { custom::run(&targets, &t, role, &it).await },
            |items, results| {
                let mut e = custom::extras(items, results);
                e["source"] = source;
                if items.is_empty() {
                    e["verdict_note"] = json!("the suite has no items: nothing to compare");
                }
                e
            },
        )
        .await
    }

    /// Runs `items` (the first `params.max_items`) on the suspect and the baseline, each
    /// result written once, looking at the paired results at the look points and stopping
    /// once decided or out of budget; finishes the job with the verdict document, `extras`
    /// computed from the items and the stored results.
    async fn work_items<I, F, Fut, X>(
        &self,
        job: &EvalJob,
        lease: &Lease,
        mut items: Vec<I>,
        id: fn(&I) -> &str,
        run: F,
        extras: X,
    ) -> Result<Value, EvalsError>
    where
        I: Clone,
        F: Fn(Arc<Targets>, crate::target::Target, &'static str, I) -> Fut,
        Fut: std::future::Future<Output = samewise_store::EvalResult>,
        X: FnOnce(&[I], &[samewise_store::EvalResult]) -> Value,
    {
        let started = Instant::now();
        if let Some(n) = job.params["max_items"].as_u64() {
            items.truncate(usize::try_from(n).unwrap_or(usize::MAX));
        }
        let suspect = self.targets.get(&job.endpoint)?.clone();
        let baseline = self.targets.get(&job.baseline)?.clone();
        let (mut params, budget) = self.params(job);
        let total = items.len();
        let points = plan_looks(total, &mut params);
        self.renew(job, lease, Some(total)).await?;
        let order: Vec<String> = items.iter().map(|i| id(i).to_owned()).collect();
        let mut looks_done = 0u32;
        let mut from = 0usize;
        let mut reason = "all_items";
        for point in points {
            let done = self.store.eval_results(job.id).await?;
            let has = |id: &str, role: &str| done.iter().any(|r| r.item == id && r.target == role);
            // (item, is the suspect): owned, so the stream's futures borrow nothing
            let todo: Vec<(I, bool)> = items[from..point]
                .iter()
                .flat_map(|it| [(it.clone(), true), (it.clone(), false)])
                .filter(|(it, s)| !has(id(it), role_name(*s)))
                .collect();
            from = point;
            let mut stream = futures_util::stream::iter(todo)
                .map(|(it, is_suspect)| {
                    let t = if is_suspect {
                        suspect.clone()
                    } else {
                        baseline.clone()
                    };
                    run(self.targets.clone(), t, role_name(is_suspect), it)
                })
                .buffered(self.settings.concurrency * 2);
            while let Some(r) = stream.next().await {
                self.write(job, lease, std::slice::from_ref(&r)).await?;
            }
            looks_done += 1;
            let results = self.store.eval_results(job.id).await?;
            let (verdict, ds) = decide_all(&tables(&order, &results), &params, looks_done);
            let spent: i64 = results.iter().map(|r| r.tokens).sum();
            tracing::info!(
                job = job.id,
                items = point,
                total,
                verdict = verdict.as_str(),
                p = ds[0].p_value,
                p_schema = ds[1].p_value,
                tokens = spent,
                "eval look"
            );
            if let Some(r) = stop_reason(verdict, spent, budget) {
                reason = r;
                break;
            }
        }
        let results = self.store.eval_results(job.id).await?;
        let [t, schema] = tables(&order, &results);
        let (verdict, ds) = decide_all(&[t, schema], &params, looks_done.max(1));
        let d = Decision { verdict, ..ds[0] };
        let stop = Stop {
            looks_done,
            reason,
            items_total: total,
            wall_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        };
        let extras = extras(&items, &results);
        let mut doc = document(&job.suite, &t, &d, &params, &results, &stop, extras);
        if schema.n() > 0 {
            doc["schema_validity"] = schema_block(&schema, &ds[1]);
        }
        self.finish(job, lease, &doc).await?;
        Ok(doc)
    }

    /// Attaches the verdict to the job's alert and POSTs it to the webhooks (failures are
    /// logged: the verdict is already on the job).
    async fn publish(&self, job: &EvalJob, verdict: &Value) {
        if let Some(a) = job.alert_id
            && let Err(e) = self.store.attach_eval_verdict(a, job.id, verdict).await
        {
            tracing::warn!(job = job.id, alert = a, error = %e, "attaching the verdict to the alert");
        }
        // a degraded verdict is an alert of its own, so routing applies the model's on_drift
        if verdict["verdict"] == "degraded" {
            let alert = samewise_store::NewAlert {
                model: job.model.clone(),
                endpoint: job.endpoint.clone(),
                kind: crate::watcher::KIND_EVAL_DEGRADED.to_owned(),
                summary: format!(
                    "eval {} degraded against {} (job {})",
                    job.suite, job.baseline, job.id
                ),
                evidence: json!({"signal": "eval", "job_id": job.id, "suite": job.suite, "verdict": verdict}),
                now_ms: samewise_store::now_ms(),
            };
            let raised = match &self.raiser {
                Some(r) => r.raise(&alert).await,
                None => self
                    .store
                    .upsert_alert(&alert)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()),
            };
            if let Err(e) = raised {
                tracing::warn!(job = job.id, error = %e, "raising the eval_degraded alert");
            }
        }
        let body = json!({
            "event": "eval_verdict",
            "job_id": job.id,
            "alert_id": job.alert_id,
            "model": job.model,
            "endpoint": job.endpoint,
            "suite": job.suite,
            "baseline": job.baseline,
            "verdict": verdict,
        });
        for url in &self.settings.webhooks {
            let client = reqwest::Client::new();
            let sent = client
                .post(url)
                .timeout(Duration::from_secs(10))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string())
                .send()
                .await;
            if let Err(e) = sent.and_then(reqwest::Response::error_for_status) {
                tracing::warn!(job = job.id, url = %url, error = %e, "eval webhook");
            }
        }
    }
}

/// A chat suite's co-primary tables: its checks' pass/fail, and its calls' schema validity
/// (items that offered tools; empty for a suite without them, which then does not count).
fn tables(order: &[String], results: &[samewise_store::EvalResult]) -> [crate::stats::Paired; 2] {
    [paired(order, results), schema_paired(order, results)]
}

fn role_name(is_suspect: bool) -> &'static str {
    if is_suspect { "suspect" } else { "baseline" }
}
