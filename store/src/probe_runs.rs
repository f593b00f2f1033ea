//! Probe runs: one row per probe of one endpoint (a prompt-logprobs pass, a samples round,
//! ...), written by the probe scheduler and read back by the detectors, the token budget and
//! listings. The run's aggregate statistics are a JSON document (stored as TEXT); its raw
//! per-position data is an opaque compact blob (the `probes::compare` encoding).
//!
//! Statements here (and in [`crate::alerts`]) are written once with PostgreSQL's `$n`
//! placeholders; [`sql`] turns them into SQLite's numbered `?n` form, which binds the same
//! way.

use std::borrow::Cow;

use sqlx::{QueryBuilder, Row};

use crate::connect::Backend;
use crate::{Store, StoreError};

/// One probe of one endpoint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProbeRun {
    /// Database id; 0 before insert, assigned by the store.
    pub id: i64,
    /// The logical model the endpoint serves.
    pub model: String,
    /// The endpoint label as the proxy names it (`provider/model-id`).
    pub endpoint: String,
    /// "prompt_logprobs" | "completion_logprobs" | "samples" | "tool_calls" | "long_context".
    pub kind: String,
    /// When the probe started, unix milliseconds.
    pub started_ms: i64,
    /// When it finished, unix milliseconds.
    pub finished_ms: i64,
    /// False when the probe could not run (endpoint down, logprobs refused); `error` says why.
    pub ok: bool,
    /// Why the probe could not run.
    pub error: Option<String>,
    /// Probe tokens spent (prompt + completion), counted against the hourly budget.
    pub tokens: i64,
    /// Aggregates (kl_mean, kl_p99, top1_same, p_value, trigger_f1, ...), a JSON object.
    pub stats: serde_json::Value,
    /// Compact per-position data.
    pub raw: Option<Vec<u8>>,
    /// Set on the second run of a noise-floor pair: the id of the first.
    pub repeat_of: Option<i64>,
}

/// Which probe runs [`Store::probe_runs`] returns; `None` fields do not filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProbeRunQuery {
    /// Only runs of this model.
    pub model: Option<String>,
    /// Only runs of this endpoint.
    pub endpoint: Option<String>,
    /// Only runs of this kind.
    pub kind: Option<String>,
    /// Only runs started at or after this time (unix milliseconds).
    pub since_ms: Option<i64>,
    /// At most this many runs (the newest).
    pub limit: u32,
}

/// How many probe runs of one kind one endpoint has, with one outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeRunCount {
    /// The logical model.
    pub model: String,
    /// The endpoint label.
    pub endpoint: String,
    /// The probe kind.
    pub kind: String,
    /// The outcome.
    pub ok: bool,
    /// Runs.
    pub runs: i64,
}

/// Longest error text kept for a failed run (characters).
pub const MAX_ERROR_CHARS: usize = 2_000;

const COLUMNS: &str =
    "id, model, endpoint, kind, started_ms, finished_ms, ok, error, tokens, stats, raw, repeat_of";

/// [`COLUMNS`] with `raw` read as NULL: the statistics without the per-position data.
fn columns_without_raw(backend: Backend) -> String {
    let no_raw = match backend {
        Backend::Postgres => "CAST(NULL AS BYTEA)",
        Backend::Sqlite => "NULL",
    };
    COLUMNS.replace(" raw,", &format!(" {no_raw},"))
}

/// `stmt` in the dialect of `backend`: PostgreSQL's `$n` placeholders become SQLite's `?n`
/// (SQLite numbers `?n` parameters exactly as PostgreSQL numbers `$n`). Statements passed
/// here hold no other `$`.
pub(crate) fn sql(backend: Backend, stmt: &str) -> Cow<'_, str> {
    match backend {
        Backend::Postgres => Cow::Borrowed(stmt),
        Backend::Sqlite => Cow::Owned(stmt.replace('$', "?")),
    }
}

/// Text as stored: NUL (which PostgreSQL's TEXT cannot hold) becomes U+FFFD on both backends.
pub(crate) fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// Runs `$body` with `$p` bound to the concrete pool of either backend (the body is
/// compiled once per backend).
macro_rules! on_pool {
    ($pool:expr, |$p:ident| $body:expr) => {
        match $pool {
            $crate::connect::Pool::Postgres($p) => $body,
            $crate::connect::Pool::Sqlite($p) => $body,
        }
    };
}
pub(crate) use on_pool;

impl Store {
    /// Stores `run` (its `id` is ignored) and returns the id it was given.
    pub async fn insert_probe_run(&self, run: &ProbeRun) -> Result<i64, StoreError> {
        const OP: &str = "inserting a probe run";
        if run.model.is_empty() || run.endpoint.is_empty() || run.kind.is_empty() {
            return Err(StoreError::InvalidInput(
                "a probe run needs a model, an endpoint and a kind".to_owned(),
            ));
        }
        let stats = serde_json::to_string(&run.stats)
            .map_err(|e| StoreError::InvalidInput(format!("probe run stats: {e}")))?;
        let error: Option<String> = run
            .error
            .as_deref()
            .map(|e| text(e).chars().take(MAX_ERROR_CHARS).collect());
        let stmt = sql(
            self.backend(),
            "INSERT INTO probe_runs (model, endpoint, kind, started_ms, finished_ms, ok, error, \
             tokens, stats, raw, repeat_of) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             RETURNING id",
        );
        // the summary row of the run's (model, endpoint, kind, outcome): one more run, and
        // this one is the newest unless a run that started later is already there
        let latest = sql(
            self.backend(),
            "INSERT INTO probe_run_latest (model, endpoint, kind, ok, runs, run_id, started_ms) \
             VALUES ($1, $2, $3, $4, 1, $5, $6) \
             ON CONFLICT (model, endpoint, kind, ok) DO UPDATE SET \
             runs = probe_run_latest.runs + 1, \
             run_id = CASE WHEN (excluded.started_ms, excluded.run_id) > \
             (probe_run_latest.started_ms, probe_run_latest.run_id) \
             THEN excluded.run_id ELSE probe_run_latest.run_id END, \
             started_ms = CASE WHEN excluded.started_ms > probe_run_latest.started_ms \
             THEN excluded.started_ms ELSE probe_run_latest.started_ms END",
        );
        let id: i64 = on_pool!(&self.pool, |p| {
            let mut tx = p.begin().await.map_err(StoreError::query(OP))?;
            let id: i64 = sqlx::query_scalar(&stmt)
                .bind(text(&run.model))
                .bind(text(&run.endpoint))
                .bind(text(&run.kind))
                .bind(run.started_ms)
                .bind(run.finished_ms)
                .bind(run.ok)
                .bind(error.as_deref())
                .bind(run.tokens)
                .bind(text(&stats))
                .bind(run.raw.as_deref())
                .bind(run.repeat_of)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            sqlx::query(&latest)
                .bind(text(&run.model))
                .bind(text(&run.endpoint))
                .bind(text(&run.kind))
                .bind(run.ok)
                .bind(id)
                .bind(run.started_ms)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            id
        });
        Ok(id)
    }

    /// Probe runs matching `q`, newest first (by start time, then id).
    pub async fn probe_runs(&self, q: &ProbeRunQuery) -> Result<Vec<ProbeRun>, StoreError> {
        self.query_probe_runs(q, COLUMNS, "reading probe runs")
            .await
    }

    /// As [`Store::probe_runs`] without the raw per-position data (`raw` is None): the
    /// statistics series that dashboards draw.
    pub async fn probe_run_stats(&self, q: &ProbeRunQuery) -> Result<Vec<ProbeRun>, StoreError> {
        let columns = columns_without_raw(self.backend());
        self.query_probe_runs(q, &columns, "reading probe run statistics")
            .await
    }

    /// `columns` of the probe runs matching `q`, newest first.
    async fn query_probe_runs(
        &self,
        q: &ProbeRunQuery,
        columns: &str,
        op: &'static str,
    ) -> Result<Vec<ProbeRun>, StoreError> {
        on_pool!(&self.pool, |p| {
            let mut qb = QueryBuilder::new(format!("SELECT {columns} FROM probe_runs WHERE 1=1"));
            if let Some(m) = &q.model {
                qb.push(" AND model = ").push_bind(m.as_str());
            }
            if let Some(e) = &q.endpoint {
                qb.push(" AND endpoint = ").push_bind(e.as_str());
            }
            if let Some(k) = &q.kind {
                qb.push(" AND kind = ").push_bind(k.as_str());
            }
            if let Some(t) = q.since_ms {
                qb.push(" AND started_ms >= ").push_bind(t);
            }
            qb.push(" ORDER BY started_ms DESC, id DESC LIMIT ")
                .push_bind(i64::from(q.limit));
            let rows = qb
                .build()
                .fetch_all(p)
                .await
                .map_err(StoreError::query(op))?;
            rows.iter().map(run_from_row).collect()
        })
    }

    /// The raw per-position data of the runs with these ids that have it, by id (in no
    /// particular order): what the detectors read of the few runs whose data they need,
    /// beside [`Store::probe_run_stats`].
    pub async fn probe_run_raw(&self, ids: &[i64]) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        const OP: &str = "reading probe runs' raw data";
        let mut out = Vec::new();
        // bounded statements: SQLite binds at most 32,766 parameters
        for chunk in ids.chunks(1_000) {
            on_pool!(&self.pool, |p| {
                let mut qb = QueryBuilder::new(
                    "SELECT id, raw FROM probe_runs WHERE raw IS NOT NULL AND id IN (",
                );
                let mut list = qb.separated(", ");
                for &id in chunk {
                    list.push_bind(id);
                }
                qb.push(")");
                let rows = qb
                    .build()
                    .fetch_all(p)
                    .await
                    .map_err(StoreError::query(OP))?;
                for r in &rows {
                    out.push((
                        r.try_get(0).map_err(StoreError::query(OP))?,
                        r.try_get(1).map_err(StoreError::query(OP))?,
                    ));
                }
            });
        }
        Ok(out)
    }

    /// The oldest runs of `endpoint`'s `kind` for `model` that the changed? detector charts —
    /// those that ran (`ok`) and are not the repeat of a noise-floor pair — started after
    /// `after_ms` (all with `None`), at most `limit`, oldest first (by start time, then id),
    /// without raw data: where its fixed baseline comes from.
    pub async fn first_series_runs(
        &self,
        model: &str,
        endpoint: &str,
        kind: &str,
        after_ms: Option<i64>,
        limit: u32,
    ) -> Result<Vec<ProbeRun>, StoreError> {
        const OP: &str = "reading an endpoint's first probe runs";
        let stmt = sql(
            self.backend(),
            &format!(
                "SELECT {} FROM probe_runs WHERE model = $1 AND endpoint = $2 AND kind = $3 \
                 AND ok AND repeat_of IS NULL AND started_ms > $4 \
                 ORDER BY started_ms, id LIMIT $5",
                columns_without_raw(self.backend())
            ),
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let rows = sqlx::query(&stmt)
                .bind(text(model))
                .bind(text(endpoint))
                .bind(text(kind))
                .bind(after_ms.unwrap_or(i64::MIN))
                .bind(i64::from(limit))
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(run_from_row).collect()
        })
    }

    /// The newest run of each (endpoint, kind, outcome) started at or after `since_ms`, of
    /// `model` if given, without raw data, newest first: what a long range's overview needs
    /// (the latest verdict-bearing runs) without reading every run of the range. Read through
    /// `probe_run_latest`, one row per (model, endpoint, kind, outcome) kept at insert.
    pub async fn latest_probe_runs(
        &self,
        model: Option<&str>,
        since_ms: i64,
    ) -> Result<Vec<ProbeRun>, StoreError> {
        const OP: &str = "reading the latest probe runs";
        let columns = columns_without_raw(self.backend());
        on_pool!(&self.pool, |p| {
            let mut qb = QueryBuilder::new(format!(
                "SELECT {columns} FROM probe_runs WHERE id IN (SELECT run_id FROM \
                 probe_run_latest WHERE started_ms >= "
            ));
            qb.push_bind(since_ms);
            if let Some(m) = model {
                qb.push(" AND model = ").push_bind(m);
            }
            qb.push(") ORDER BY started_ms DESC, id DESC");
            let rows = qb
                .build()
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(run_from_row).collect()
        })
    }

    /// Probe runs per endpoint, kind and outcome (ok or not), over all time: what
    /// `/metrics` exports as `probe_runs_total` (counted at insert in `probe_run_latest`).
    pub async fn probe_run_counts(&self) -> Result<Vec<ProbeRunCount>, StoreError> {
        const OP: &str = "counting probe runs";
        let stmt = "SELECT model, endpoint, kind, ok, runs FROM probe_run_latest \
                    ORDER BY model, endpoint, kind, ok";
        on_pool!(&self.pool, |p| {
            let rows = sqlx::query(stmt)
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter()
                .map(|r| {
                    Ok(ProbeRunCount {
                        model: r.try_get(0).map_err(StoreError::query(OP))?,
                        endpoint: r.try_get(1).map_err(StoreError::query(OP))?,
                        kind: r.try_get(2).map_err(StoreError::query(OP))?,
                        ok: r.try_get(3).map_err(StoreError::query(OP))?,
                        runs: r.try_get(4).map_err(StoreError::query(OP))?,
                    })
                })
                .collect()
        })
    }

    /// Probe tokens spent on `endpoint` by runs started at or after `since_ms`.
    pub async fn probe_tokens_since(
        &self,
        endpoint: &str,
        since_ms: i64,
    ) -> Result<i64, StoreError> {
        const OP: &str = "summing probe tokens";
        let stmt = sql(
            self.backend(),
            "SELECT CAST(COALESCE(SUM(tokens), 0) AS BIGINT) FROM probe_runs \
             WHERE endpoint = $1 AND started_ms >= $2",
        );
        let n: i64 = on_pool!(&self.pool, |p| {
            sqlx::query_scalar(&stmt)
                .bind(text(endpoint))
                .bind(since_ms)
                .fetch_one(p)
                .await
        })
        .map_err(StoreError::query(OP))?;
        Ok(n)
    }
}

fn run_from_row<R>(row: &R) -> Result<ProbeRun, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<Vec<u8>>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding a probe run";
    let stats: String = row.try_get(9).map_err(StoreError::query(OP))?;
    let stats = serde_json::from_str(&stats).map_err(|e| StoreError::Corrupt {
        column: "probe_runs.stats",
        detail: e.to_string(),
    })?;
    Ok(ProbeRun {
        id: row.try_get(0).map_err(StoreError::query(OP))?,
        model: row.try_get(1).map_err(StoreError::query(OP))?,
        endpoint: row.try_get(2).map_err(StoreError::query(OP))?,
        kind: row.try_get(3).map_err(StoreError::query(OP))?,
        started_ms: row.try_get(4).map_err(StoreError::query(OP))?,
        finished_ms: row.try_get(5).map_err(StoreError::query(OP))?,
        ok: row.try_get(6).map_err(StoreError::query(OP))?,
        error: row.try_get(7).map_err(StoreError::query(OP))?,
        tokens: row.try_get(8).map_err(StoreError::query(OP))?,
        stats,
        raw: row.try_get(10).map_err(StoreError::query(OP))?,
        repeat_of: row.try_get(11).map_err(StoreError::query(OP))?,
    })
}
