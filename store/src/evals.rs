//! Eval jobs: the queue behind `samewise evals` (issue #10). A job runs one suite against a
//! suspect endpoint and a baseline; workers claim it with a lease, heartbeat while they run,
//! write one result per item and target, and finish it with a verdict document.
//!
//! Invariants kept here, on both backends:
//! - Claiming is one atomic statement: on PostgreSQL the candidate row is picked with
//!   `FOR UPDATE SKIP LOCKED` (several workers on one database never take the same job); on
//!   SQLite the single `UPDATE ... WHERE id = (SELECT ...)` runs under the database's write
//!   lock (the claiming transaction).
//! - A running job whose lease expired is claimable again (its worker died); each claim counts
//!   an attempt, and a job out of attempts is failed instead of claimed.
//! - The lease is a fence: heartbeat, result writes and finishing all require that the
//!   caller still holds it (same worker, same attempt), so a worker that lost its job
//!   cannot write into it.
//! - An item's result is written at most once per job and target (a unique index on
//!   `(job_id, item, target)`), so a resumed job never yields two results for one item.
//! - Opening a job takes the endpoint+suite cooldown in the same transaction: several
//!   gateways reacting to the same alert open one job.

use sqlx::Row;

use crate::alerts::CAS_ATTEMPTS;
use crate::probe_runs::{on_pool, sql, text};
use crate::{Store, StoreError};

/// Where a job is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// Held by a worker (its lease may have expired: then it is claimable again).
    Running,
    /// Finished with a verdict.
    Succeeded,
    /// Gave up: an error, or out of attempts.
    Failed,
    /// Cancelled by an operator.
    Cancelled,
}

impl JobState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<JobState> {
        match s {
            "queued" => Some(JobState::Queued),
            "running" => Some(JobState::Running),
            "succeeded" => Some(JobState::Succeeded),
            "failed" => Some(JobState::Failed),
            "cancelled" => Some(JobState::Cancelled),
            _ => None,
        }
    }

    /// Whether the job is over.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A job to open.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvalJob {
    /// The logical model.
    pub model: String,
    /// The suspect endpoint's label.
    pub endpoint: String,
    /// The suite's name ("tool_calls", "long_context", ...).
    pub suite: String,
    /// "reference" or a peer endpoint's label.
    pub baseline: String,
    /// The alert that opened the job, if any.
    pub alert_id: Option<i64>,
    /// Suite parameters, budget, verdict parameters (a JSON object).
    pub params: serde_json::Value,
    /// How many claims the job gets before it is failed.
    pub max_attempts: u32,
    /// Now, unix milliseconds.
    pub now_ms: i64,
}

/// A stored job.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalJob {
    /// Database id.
    pub id: i64,
    /// The logical model.
    pub model: String,
    /// The suspect endpoint.
    pub endpoint: String,
    /// The suite.
    pub suite: String,
    /// "reference" or a peer endpoint.
    pub baseline: String,
    /// The alert that opened it.
    pub alert_id: Option<i64>,
    /// Suite parameters (a JSON object).
    pub params: serde_json::Value,
    /// Lifecycle state.
    pub state: JobState,
    /// When it was opened.
    pub created_ms: i64,
    /// When it last changed.
    pub updated_ms: i64,
    /// When a worker first claimed it.
    pub started_ms: Option<i64>,
    /// When it finished.
    pub finished_ms: Option<i64>,
    /// Claims so far.
    pub attempts: u32,
    /// Claims allowed.
    pub max_attempts: u32,
    /// The worker holding (or last holding) it.
    pub worker: Option<String>,
    /// When the current lease expires.
    pub lease_until_ms: Option<i64>,
    /// Items in the suite, once a worker has loaded it.
    pub items_total: Option<u32>,
    /// Tokens spent (both targets), written when it finishes.
    pub tokens: i64,
    /// The verdict document, once finished.
    pub verdict: Option<serde_json::Value>,
    /// Why it failed.
    pub error: Option<String>,
}

/// A worker's hold on a claimed job: every write into the job presents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The job.
    pub job_id: i64,
    /// The worker's id.
    pub worker: String,
    /// The attempt number of this claim (1-based).
    pub attempt: u32,
}

/// One item's result on one target.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalResult {
    /// The item's id within the suite.
    pub item: String,
    /// "suspect" or "baseline".
    pub target: String,
    /// Whether the item passed its check.
    pub passed: bool,
    /// The failure bucket (e.g. "wrong_name"), None when passed.
    pub error_type: Option<String>,
    /// Tokens spent on it.
    pub tokens: i64,
    /// The request, the answer, the check's detail (a JSON object).
    pub record: serde_json::Value,
}

/// A job's progress: results written and tokens spent so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobProgress {
    /// Result rows (items × targets).
    pub results: u64,
    /// Sum of their tokens.
    pub tokens: i64,
}

const COLUMNS: &str = "id, model, endpoint, suite, baseline, alert_id, params, state, created_ms, \
     updated_ms, started_ms, finished_ms, attempts, max_attempts, worker, lease_until_ms, \
     items_total, tokens, verdict, error";

const RESULT_COLUMNS: &str = "item, target, passed, error_type, tokens, record";

/// Longest error text kept on a failed job (characters).
const MAX_ERROR_CHARS: usize = 2_000;

fn json_text(v: &serde_json::Value, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::InvalidInput(format!("{what}: {e}")))
}

impl Store {
    /// Opens `job` unless its endpoint+suite is cooling down: takes the cooldown until
    /// `now + cooldown_ms` and inserts the job in one transaction. Returns the job, or None
    /// when another caller opened one within the cooldown. A zero cooldown always opens.
    pub async fn enqueue_eval_job(
        &self,
        job: &NewEvalJob,
        cooldown_ms: i64,
    ) -> Result<Option<EvalJob>, StoreError> {
        const OP: &str = "opening an eval job";
        if job.model.is_empty()
            || job.endpoint.is_empty()
            || job.suite.is_empty()
            || job.baseline.is_empty()
        {
            return Err(StoreError::InvalidInput(
                "an eval job needs a model, an endpoint, a suite and a baseline".to_owned(),
            ));
        }
        let params = json_text(&job.params, "eval job params")?;
        let cool = sql(
            self.backend(),
            "INSERT INTO eval_cooldowns (endpoint, suite, until_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (endpoint, suite) DO UPDATE SET until_ms = excluded.until_ms \
             WHERE eval_cooldowns.until_ms <= $4 RETURNING until_ms",
        )
        .into_owned();
        let insert = sql(
            self.backend(),
            &format!(
                "INSERT INTO eval_jobs (model, endpoint, suite, baseline, alert_id, params, state, \
                 created_ms, updated_ms, attempts, max_attempts, tokens) \
                 VALUES ($1, $2, $3, $4, $5, $6, 'queued', $7, $7, 0, $8, 0) RETURNING {COLUMNS}"
            ),
        )
        .into_owned();
        let max_attempts = i32::try_from(job.max_attempts.max(1)).unwrap_or(i32::MAX);
        on_pool!(&self.pool, |p| {
            let mut tx = p.begin().await.map_err(StoreError::query(OP))?;
            if cooldown_ms > 0 {
                let took: Option<i64> = sqlx::query_scalar(&cool)
                    .bind(text(&job.endpoint))
                    .bind(text(&job.suite))
                    .bind(job.now_ms.saturating_add(cooldown_ms))
                    .bind(job.now_ms)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
                if took.is_none() {
                    tx.rollback().await.map_err(StoreError::query(OP))?;
                    return Ok(None);
                }
            }
            let row = sqlx::query(&insert)
                .bind(text(&job.model))
                .bind(text(&job.endpoint))
                .bind(text(&job.suite))
                .bind(text(&job.baseline))
                .bind(job.alert_id)
                .bind(text(&params))
                .bind(job.now_ms)
                .bind(max_attempts)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let out = job_from_row(&row)?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Some(out))
        })
    }

    /// Claims the oldest claimable job for `worker` with a lease until `now + lease_ms`: a
    /// queued job, or a running one whose lease expired before `now_ms` (its worker died).
    /// Jobs whose lease expired with no attempts left are failed first. None when nothing
    /// is claimable.
    pub async fn claim_eval_job(
        &self,
        worker: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<(EvalJob, Lease)>, StoreError> {
        const OP: &str = "claiming an eval job";
        let exhausted = sql(
            self.backend(),
            "UPDATE eval_jobs SET state = 'failed', finished_ms = $1, updated_ms = $1, \
             error = 'lease expired with no attempts left (the worker died each time)' \
             WHERE state = 'running' AND lease_until_ms < $1 AND attempts >= max_attempts",
        )
        .into_owned();
        let lock = match self.backend() {
            crate::Backend::Postgres => " FOR UPDATE SKIP LOCKED",
            crate::Backend::Sqlite => "",
        };
        let claim = sql(
            self.backend(),
            &format!(
                "UPDATE eval_jobs SET state = 'running', worker = $1, lease_until_ms = $2, \
                 attempts = attempts + 1, started_ms = COALESCE(started_ms, $3), updated_ms = $3 \
                 WHERE id = (SELECT id FROM eval_jobs WHERE (state = 'queued' OR \
                 (state = 'running' AND lease_until_ms < $3)) AND attempts < max_attempts \
                 ORDER BY id LIMIT 1{lock}) RETURNING {COLUMNS}"
            ),
        )
        .into_owned();
        let job = on_pool!(&self.pool, |p| {
            sqlx::query(&exhausted)
                .bind(now_ms)
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?;
            let row = sqlx::query(&claim)
                .bind(text(worker))
                .bind(now_ms.saturating_add(lease_ms))
                .bind(now_ms)
                .fetch_optional(p)
                .await
                .map_err(StoreError::query(OP))?;
            row.as_ref().map(job_from_row).transpose()?
        });
        Ok(job.map(|j| {
            let lease = Lease {
                job_id: j.id,
                worker: worker.to_owned(),
                attempt: j.attempts,
            };
            (j, lease)
        }))
    }

    /// Extends `lease` to `now + lease_ms` and records the suite's size. False when the
    /// lease is lost (expired and taken over, or the job was cancelled): stop working.
    pub async fn heartbeat_eval_job(
        &self,
        lease: &Lease,
        now_ms: i64,
        lease_ms: i64,
        items_total: Option<u32>,
    ) -> Result<bool, StoreError> {
        const OP: &str = "renewing an eval job's lease";
        let stmt = sql(
            self.backend(),
            "UPDATE eval_jobs SET lease_until_ms = $1, updated_ms = $2, \
             items_total = COALESCE($3, items_total) \
             WHERE id = $4 AND worker = $5 AND attempts = $6 AND state = 'running'",
        )
        .into_owned();
        let total = items_total.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        let n = on_pool!(&self.pool, |p| {
            sqlx::query(&stmt)
                .bind(now_ms.saturating_add(lease_ms))
                .bind(now_ms)
                .bind(total)
                .bind(lease.job_id)
                .bind(text(&lease.worker))
                .bind(lease_attempt(lease))
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected()
        });
        Ok(n == 1)
    }

    /// Writes `r` for the leased job unless a result for the same item and target exists.
    /// Ok(true) when written, Ok(false) when it was already there or the lease is lost.
    pub async fn insert_eval_result(
        &self,
        lease: &Lease,
        r: &EvalResult,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        const OP: &str = "writing an eval item result";
        let record = json_text(&r.record, "eval result record")?;
        let stmt = sql(
            self.backend(),
            "INSERT INTO eval_results (job_id, item, target, passed, error_type, tokens, record, \
             created_ms) SELECT $1, $2, $3, $4, $5, $6, $7, $8 WHERE EXISTS (SELECT 1 FROM \
             eval_jobs WHERE id = $1 AND worker = $9 AND attempts = $10 AND state = 'running') \
             ON CONFLICT (job_id, item, target) DO NOTHING",
        )
        .into_owned();
        let n = on_pool!(&self.pool, |p| {
            sqlx::query(&stmt)
                .bind(lease.job_id)
                .bind(text(&r.item))
                .bind(text(&r.target))
                .bind(r.passed)
                .bind(r.error_type.as_deref())
                .bind(r.tokens)
                .bind(text(&record))
                .bind(now_ms)
                .bind(text(&lease.worker))
                .bind(lease_attempt(lease))
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected()
        });
        Ok(n == 1)
    }

    /// Finishes the leased job as `state` (succeeded or failed) with its verdict document,
    /// error and tokens. False when the lease was lost (nothing written).
    pub async fn finish_eval_job(
        &self,
        lease: &Lease,
        state: JobState,
        verdict: Option<&serde_json::Value>,
        error: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        const OP: &str = "finishing an eval job";
        if !matches!(state, JobState::Succeeded | JobState::Failed) {
            return Err(StoreError::InvalidInput(format!(
                "a worker finishes a job as succeeded or failed, not {state}"
            )));
        }
        let verdict = verdict.map(|v| json_text(v, "eval verdict")).transpose()?;
        let error: Option<String> = error.map(|e| text(e).chars().take(MAX_ERROR_CHARS).collect());
        let stmt = sql(
            self.backend(),
            "UPDATE eval_jobs SET state = $1, verdict = $2, error = $3, finished_ms = $4, \
             updated_ms = $4, lease_until_ms = NULL, tokens = (SELECT CAST(COALESCE(SUM(tokens), \
             0) AS BIGINT) FROM eval_results WHERE job_id = $5) \
             WHERE id = $5 AND worker = $6 AND attempts = $7 AND state = 'running'",
        )
        .into_owned();
        let n = on_pool!(&self.pool, |p| {
            sqlx::query(&stmt)
                .bind(state.as_str())
                .bind(verdict.as_deref())
                .bind(error.as_deref())
                .bind(now_ms)
                .bind(lease.job_id)
                .bind(text(&lease.worker))
                .bind(lease_attempt(lease))
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected()
        });
        Ok(n == 1)
    }

    /// Cancels job `id` if it is queued or running. Returns the job as it stands (None when
    /// there is no such job).
    pub async fn cancel_eval_job(&self, id: i64) -> Result<Option<EvalJob>, StoreError> {
        const OP: &str = "cancelling an eval job";
        let stmt = sql(
            self.backend(),
            "UPDATE eval_jobs SET state = 'cancelled', finished_ms = $1, updated_ms = $1, \
             lease_until_ms = NULL WHERE id = $2 AND state IN ('queued', 'running')",
        )
        .into_owned();
        let now = crate::now_ms();
        on_pool!(&self.pool, |p| {
            sqlx::query(&stmt)
                .bind(now)
                .bind(id)
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?;
        });
        self.eval_job(id).await
    }

    /// The job `id`.
    pub async fn eval_job(&self, id: i64) -> Result<Option<EvalJob>, StoreError> {
        const OP: &str = "reading an eval job";
        let stmt = sql(
            self.backend(),
            &format!("SELECT {COLUMNS} FROM eval_jobs WHERE id = $1"),
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let row = sqlx::query(&stmt)
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(StoreError::query(OP))?;
            row.as_ref().map(job_from_row).transpose()
        })
    }

    /// Jobs, newest first; only those opened by `alert_id`, and only those of `endpoint`,
    /// when given.
    pub async fn eval_jobs(
        &self,
        alert_id: Option<i64>,
        endpoint: Option<&str>,
        limit: u32,
    ) -> Result<Vec<EvalJob>, StoreError> {
        const OP: &str = "reading eval jobs";
        on_pool!(&self.pool, |p| {
            let mut qb =
                sqlx::QueryBuilder::new(format!("SELECT {COLUMNS} FROM eval_jobs WHERE 1=1"));
            if let Some(a) = alert_id {
                qb.push(" AND alert_id = ").push_bind(a);
            }
            if let Some(e) = endpoint {
                qb.push(" AND endpoint = ").push_bind(e.to_owned());
            }
            qb.push(" ORDER BY id DESC LIMIT ")
                .push_bind(i64::from(limit));
            let rows = qb
                .build()
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(job_from_row).collect()
        })
    }

    /// Every result of job `id`, in write order.
    pub async fn eval_results(&self, id: i64) -> Result<Vec<EvalResult>, StoreError> {
        const OP: &str = "reading eval item results";
        let stmt = sql(
            self.backend(),
            &format!("SELECT {RESULT_COLUMNS} FROM eval_results WHERE job_id = $1 ORDER BY id"),
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let rows = sqlx::query(&stmt)
                .bind(id)
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(result_from_row).collect()
        })
    }

    /// Results written and tokens spent so far on job `id`.
    pub async fn eval_progress(&self, id: i64) -> Result<JobProgress, StoreError> {
        const OP: &str = "reading an eval job's progress";
        let stmt = sql(
            self.backend(),
            "SELECT COUNT(*), CAST(COALESCE(SUM(tokens), 0) AS BIGINT) FROM eval_results \
             WHERE job_id = $1",
        )
        .into_owned();
        let (n, tokens): (i64, i64) = on_pool!(&self.pool, |p| {
            sqlx::query_as(&stmt)
                .bind(id)
                .fetch_one(p)
                .await
                .map_err(StoreError::query(OP))?
        });
        Ok(JobProgress {
            results: u64::try_from(n).unwrap_or(0),
            tokens,
        })
    }
}

impl Store {
    /// Attaches `verdict` to alert `alert_id`'s evidence as `evidence.evals["<job_id>"]`
    /// (other keys untouched). Returns the alert as updated; None when it does not exist.
    /// A detector refreshing the alert later replaces its evidence; `eval_jobs(Some(id), ..)`
    /// keeps the verdicts regardless.
    pub async fn attach_eval_verdict(
        &self,
        alert_id: i64,
        job_id: i64,
        verdict: &serde_json::Value,
    ) -> Result<Option<crate::Alert>, StoreError> {
        // compare-and-set; under contention (a detector refreshing the alert) back off a
        // little longer each time rather than lose the verdict
        for attempt in 0..CAS_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(attempt)).await;
            }
            let Some(old) = self.alert_evidence_text(alert_id).await? else {
                return Ok(None);
            };
            let mut evidence: serde_json::Value =
                serde_json::from_str(&old).unwrap_or(serde_json::Value::Null);
            if !evidence.is_object() {
                evidence = serde_json::json!({ "finding": evidence });
            }
            if let Some(obj) = evidence.as_object_mut() {
                let evals = obj.entry("evals").or_insert_with(|| serde_json::json!({}));
                if !evals.is_object() {
                    *evals = serde_json::json!({});
                }
                if let Some(e) = evals.as_object_mut() {
                    e.insert(job_id.to_string(), verdict.clone());
                }
            }
            if self
                .replace_alert_evidence(alert_id, &old, &evidence)
                .await?
            {
                return self.alert(alert_id).await;
            }
        }
        Err(StoreError::InvalidInput(format!(
            "alert {alert_id}'s evidence kept changing under concurrent writers"
        )))
    }

    /// Compare-and-set of an alert's evidence: true when `old` (its stored text) was still its
    /// evidence.
    async fn replace_alert_evidence(
        &self,
        alert_id: i64,
        old: &str,
        new: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        const OP: &str = "attaching an eval verdict to an alert";
        let new = json_text(new, "alert evidence")?;
        let stmt = sql(
            self.backend(),
            "UPDATE alerts SET evidence = $1, updated_ms = $2 WHERE id = $3 AND evidence = $4",
        )
        .into_owned();
        let now = crate::now_ms();
        let n = on_pool!(&self.pool, |p| {
            sqlx::query(&stmt)
                .bind(text(&new))
                .bind(now)
                .bind(alert_id)
                .bind(text(old))
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected()
        });
        Ok(n == 1)
    }
}

fn lease_attempt(lease: &Lease) -> i32 {
    i32::try_from(lease.attempt).unwrap_or(i32::MAX)
}

fn corrupt(column: &'static str) -> impl FnOnce(serde_json::Error) -> StoreError {
    move |e| StoreError::Corrupt {
        column,
        detail: e.to_string(),
    }
}

fn job_from_row<R>(row: &R) -> Result<EvalJob, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i32>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding an eval job";
    let q = || StoreError::query(OP);
    let params: String = row.try_get(6).map_err(q())?;
    let state: String = row.try_get(7).map_err(q())?;
    let state = JobState::parse(&state).ok_or_else(|| StoreError::Corrupt {
        column: "eval_jobs.state",
        detail: format!("{state:?} is not a job state"),
    })?;
    let verdict: Option<String> = row.try_get(18).map_err(q())?;
    let attempts: i32 = row.try_get(12).map_err(q())?;
    let max_attempts: i32 = row.try_get(13).map_err(q())?;
    let items_total: Option<i32> = row.try_get(16).map_err(q())?;
    Ok(EvalJob {
        id: row.try_get(0).map_err(q())?,
        model: row.try_get(1).map_err(q())?,
        endpoint: row.try_get(2).map_err(q())?,
        suite: row.try_get(3).map_err(q())?,
        baseline: row.try_get(4).map_err(q())?,
        alert_id: row.try_get(5).map_err(q())?,
        params: serde_json::from_str(&params).map_err(corrupt("eval_jobs.params"))?,
        state,
        created_ms: row.try_get(8).map_err(q())?,
        updated_ms: row.try_get(9).map_err(q())?,
        started_ms: row.try_get(10).map_err(q())?,
        finished_ms: row.try_get(11).map_err(q())?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        max_attempts: u32::try_from(max_attempts).unwrap_or(0),
        worker: row.try_get(14).map_err(q())?,
        lease_until_ms: row.try_get(15).map_err(q())?,
        items_total: items_total.and_then(|n| u32::try_from(n).ok()),
        tokens: row.try_get(17).map_err(q())?,
        verdict: verdict
            .map(|v| serde_json::from_str(&v))
            .transpose()
            .map_err(corrupt("eval_jobs.verdict"))?,
        error: row.try_get(19).map_err(q())?,
    })
}

fn result_from_row<R>(row: &R) -> Result<EvalResult, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding an eval item result";
    let q = || StoreError::query(OP);
    let record: String = row.try_get(5).map_err(q())?;
    Ok(EvalResult {
        item: row.try_get(0).map_err(q())?,
        target: row.try_get(1).map_err(q())?,
        passed: row.try_get(2).map_err(q())?,
        error_type: row.try_get(3).map_err(q())?,
        tokens: row.try_get(4).map_err(q())?,
        record: serde_json::from_str(&record).map_err(corrupt("eval_results.record"))?,
    })
}
