//! Captured request bodies and regression cases (issue #10, the `regression` suite).
//!
//! A [`CapturedBody`] is one flagged client request of a model that opted in
//! (`[models.NAME.capture]`): its body as the client sent it, auth-looking fields already
//! redacted by the proxy (headers are never captured), and the assembled answer of its final
//! attempt. The bodies ride the request-record queue ([`crate::RecordSender::try_send_with_body`])
//! and are written by the record writer through [`Store::insert_captured_bodies`], whose
//! transaction also enforces the bounds, in SQL:
//! - age: every row carries `expires_ms` (capture time + the model's `max_age_hours`); expired
//!   rows are deleted by every insert and never returned by a read;
//! - bytes: per model, the newest rows are kept while their running sum of `bytes` stays within
//!   the model's `max_bytes`; the oldest beyond it are deleted (a window-function sum).
//!
//! A [`RegressionCase`] is one item of a model's `regression` suite: a customer-suite item
//! (chat request and check) made from a captured body by `samewise evals capture`.

use sqlx::Row;

use crate::probe_runs::{on_pool, sql, text};
use crate::{Store, StoreError};

/// One captured request.
#[derive(Debug, Clone, PartialEq)]
pub struct CapturedBody {
    /// The client request's id (the records' `request_id`).
    pub request_id: String,
    /// When the request started, unix milliseconds.
    pub ts_ms: i64,
    /// When the row expires (deleted, and never read, from then on).
    pub expires_ms: i64,
    /// The logical model.
    pub model: String,
    /// The endpoint of the flagged attempt (the final one when it is flagged).
    pub endpoint: Option<String>,
    /// "chat" | "completions".
    pub route: String,
    /// Why it was kept: `degenerate`, `tool_error`, `upstream_error`, `sampled`.
    pub flags: Vec<String>,
    /// The request body (redacted JSON).
    pub request: serde_json::Value,
    /// The assembled answer of the final attempt: `endpoint`, `status`, `error_kind`, `text`,
    /// `tool_calls`, `finish_reason`.
    pub response: serde_json::Value,
    /// Bytes of the stored request and response texts (what the byte bound counts).
    pub bytes: i64,
}

/// A body to insert, with its model's byte bound as configured when it was captured.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCapturedBody {
    /// The body (`bytes` is computed by the store).
    pub body: CapturedBody,
    /// The model's `max_bytes`: after the insert its rows are trimmed (oldest first) to this.
    pub model_max_bytes: i64,
}

/// Filters of [`Store::captured_bodies`]; unset ones match everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyQuery {
    /// Only this model.
    pub model: Option<String>,
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Only requests at or after this time.
    pub since_ms: Option<i64>,
    /// Only requests before this time.
    pub until_ms: Option<i64>,
    /// At most this many (newest first).
    pub limit: u32,
}

impl Default for BodyQuery {
    fn default() -> Self {
        BodyQuery {
            model: None,
            endpoint: None,
            since_ms: None,
            until_ms: None,
            limit: 100,
        }
    }
}

/// What one insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BodyWrite {
    /// Rows inserted (a request id already stored is skipped).
    pub inserted: u64,
    /// Rows deleted by the age bound.
    pub expired: u64,
    /// Rows deleted by the byte bound.
    pub evicted: u64,
}

/// One item of a model's regression suite.
#[derive(Debug, Clone, PartialEq)]
pub struct RegressionCase {
    /// Row id.
    pub id: i64,
    /// The logical model.
    pub model: String,
    /// The suite ("regression", or the name given to `evals capture --suite`).
    pub suite: String,
    /// The captured request it was made from.
    pub source_request_id: String,
    /// The endpoint the request was flagged on.
    pub endpoint: Option<String>,
    /// The alert it was captured for.
    pub alert_id: Option<i64>,
    /// The customer-suite item: `id`, `request`, `check` (and `source` notes).
    pub item: serde_json::Value,
    /// When it was made.
    pub created_ms: i64,
}

/// Filters of [`Store::regression_cases_matching`] and [`Store::delete_regression_cases`];
/// unset ones match everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CaseQuery {
    /// Only this model's.
    pub model: Option<String>,
    /// Only this suite's.
    pub suite: Option<String>,
    /// Only the case with this id.
    pub id: Option<i64>,
}

impl CaseQuery {
    /// ` WHERE …` over the set filters with placeholders `$1…` in field order, or "".
    fn where_clause(&self) -> String {
        let conds: Vec<String> = [
            self.model.as_ref().map(|_| "model"),
            self.suite.as_ref().map(|_| "suite"),
            self.id.map(|_| "id"),
        ]
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, column)| format!("{column} = ${}", i + 1))
        .collect();
        if conds.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conds.join(" AND "))
        }
    }

    /// Binds the set filters in [`CaseQuery::where_clause`]'s order.
    fn bind<'q, DB: sqlx::Database>(
        &'q self,
        mut query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    ) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
    where
        std::borrow::Cow<'q, str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        if let Some(m) = &self.model {
            query = query.bind(text(m));
        }
        if let Some(s) = &self.suite {
            query = query.bind(text(s));
        }
        if let Some(id) = self.id {
            query = query.bind(id);
        }
        query
    }
}

const BODY_COLUMNS: &str =
    "request_id, ts_ms, expires_ms, model, endpoint, route, flags, request, response, bytes";
const CASE_COLUMNS: &str =
    "id, model, suite, source_request_id, endpoint, alert_id, item, created_ms";

/// The most rows one read returns.
const MAX_LIMIT: u32 = 10_000;

fn body_from_row<R>(row: &R) -> Result<CapturedBody, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding a captured body";
    let json = |i: usize, column: &'static str| -> Result<serde_json::Value, StoreError> {
        let s: String = row.try_get(i).map_err(StoreError::query(OP))?;
        serde_json::from_str(&s).map_err(|e| StoreError::Corrupt {
            column,
            detail: e.to_string(),
        })
    };
    let flags: String = row.try_get(6).map_err(StoreError::query(OP))?;
    Ok(CapturedBody {
        request_id: row.try_get(0).map_err(StoreError::query(OP))?,
        ts_ms: row.try_get(1).map_err(StoreError::query(OP))?,
        expires_ms: row.try_get(2).map_err(StoreError::query(OP))?,
        model: row.try_get(3).map_err(StoreError::query(OP))?,
        endpoint: row.try_get(4).map_err(StoreError::query(OP))?,
        route: row.try_get(5).map_err(StoreError::query(OP))?,
        flags: flags
            .split(',')
            .filter(|f| !f.is_empty())
            .map(str::to_owned)
            .collect(),
        request: json(7, "request")?,
        response: json(8, "response")?,
        bytes: row.try_get(9).map_err(StoreError::query(OP))?,
    })
}

fn case_from_row<R>(row: &R) -> Result<RegressionCase, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding a regression case";
    let item: String = row.try_get(6).map_err(StoreError::query(OP))?;
    Ok(RegressionCase {
        id: row.try_get(0).map_err(StoreError::query(OP))?,
        model: row.try_get(1).map_err(StoreError::query(OP))?,
        suite: row.try_get(2).map_err(StoreError::query(OP))?,
        source_request_id: row.try_get(3).map_err(StoreError::query(OP))?,
        endpoint: row.try_get(4).map_err(StoreError::query(OP))?,
        alert_id: row.try_get(5).map_err(StoreError::query(OP))?,
        item: serde_json::from_str(&item).map_err(|e| StoreError::Corrupt {
            column: "item",
            detail: e.to_string(),
        })?,
        created_ms: row.try_get(7).map_err(StoreError::query(OP))?,
    })
}

/// JSON as stored (serde_json escapes control characters, NUL included, so the text holds
/// none and PostgreSQL's TEXT takes it whole).
fn json_text(v: &serde_json::Value, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::InvalidInput(format!("{what}: {e}")))
}

impl Store {
    /// Inserts `rows` (a request id already stored is skipped), then, in the same
    /// transaction, deletes every row expired at `now_ms` and trims each inserted model's rows
    /// to its `model_max_bytes`, oldest first. A body larger than its model's bound is not
    /// inserted.
    pub async fn insert_captured_bodies(
        &self,
        rows: &[NewCapturedBody],
        now_ms: i64,
    ) -> Result<BodyWrite, StoreError> {
        const OP: &str = "inserting captured bodies";
        let mut prepared = Vec::with_capacity(rows.len());
        let mut bounds: std::collections::BTreeMap<&str, i64> = Default::default();
        for r in rows {
            let b = &r.body;
            let request = json_text(&b.request, "captured request")?;
            let response = json_text(&b.response, "captured response")?;
            let bytes = i64::try_from(request.len() + response.len()).unwrap_or(i64::MAX);
            bounds.insert(b.model.as_str(), r.model_max_bytes);
            if bytes > r.model_max_bytes {
                continue;
            }
            prepared.push((b, request, response, bytes, b.flags.join(",")));
        }
        let insert = sql(
            self.backend(),
            &format!(
                "INSERT INTO captured_bodies ({BODY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (request_id) DO NOTHING"
            ),
        )
        .into_owned();
        let expire = sql(
            self.backend(),
            "DELETE FROM captured_bodies WHERE expires_ms <= $1",
        )
        .into_owned();
        let evict = sql(
            self.backend(),
            "DELETE FROM captured_bodies WHERE request_id IN (SELECT request_id FROM \
             (SELECT request_id, SUM(bytes) OVER (ORDER BY ts_ms DESC, request_id DESC) AS kept \
             FROM captured_bodies WHERE model = $1) newest_first WHERE kept > $2)",
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let mut tx = p.begin().await.map_err(StoreError::query(OP))?;
            let mut out = BodyWrite::default();
            for (b, request, response, bytes, flags) in &prepared {
                let done = sqlx::query(&insert)
                    .bind(text(&b.request_id))
                    .bind(b.ts_ms)
                    .bind(b.expires_ms)
                    .bind(text(&b.model))
                    .bind(b.endpoint.as_deref().map(text))
                    .bind(text(&b.route))
                    .bind(text(flags))
                    .bind(request.as_str())
                    .bind(response.as_str())
                    .bind(*bytes)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
                out.inserted += done.rows_affected();
            }
            out.expired = sqlx::query(&expire)
                .bind(now_ms)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected();
            for (model, max) in &bounds {
                out.evicted += sqlx::query(&evict)
                    .bind(text(model))
                    .bind(*max)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?
                    .rows_affected();
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(out)
        })
    }

    /// The captured body of request `request_id`, unless it expired before `now_ms`.
    pub async fn captured_body(
        &self,
        request_id: &str,
        now_ms: i64,
    ) -> Result<Option<CapturedBody>, StoreError> {
        const OP: &str = "reading a captured body";
        let stmt = sql(
            self.backend(),
            &format!(
                "SELECT {BODY_COLUMNS} FROM captured_bodies WHERE request_id = $1 AND expires_ms > $2"
            ),
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let row = sqlx::query(&stmt)
                .bind(text(request_id))
                .bind(now_ms)
                .fetch_optional(p)
                .await
                .map_err(StoreError::query(OP))?;
            row.as_ref().map(body_from_row).transpose()
        })
    }

    /// Captured bodies matching `q` and not expired at `now_ms`, newest first.
    pub async fn captured_bodies(
        &self,
        q: &BodyQuery,
        now_ms: i64,
    ) -> Result<Vec<CapturedBody>, StoreError> {
        const OP: &str = "reading captured bodies";
        let mut s = format!("SELECT {BODY_COLUMNS} FROM captured_bodies WHERE expires_ms > $1");
        let mut n = 1;
        let mut next = |s: &mut String, cond: &str| {
            n += 1;
            s.push_str(&format!(" AND {cond} ${n}"));
        };
        if q.model.is_some() {
            next(&mut s, "model =");
        }
        if q.endpoint.is_some() {
            next(&mut s, "endpoint =");
        }
        if q.since_ms.is_some() {
            next(&mut s, "ts_ms >=");
        }
        if q.until_ms.is_some() {
            next(&mut s, "ts_ms <");
        }
        n += 1;
        s.push_str(&format!(" ORDER BY ts_ms DESC, request_id DESC LIMIT ${n}"));
        let stmt = sql(self.backend(), &s).into_owned();
        let limit = i64::from(q.limit.min(MAX_LIMIT));
        on_pool!(&self.pool, |p| {
            let mut query = sqlx::query(&stmt).bind(now_ms);
            if let Some(m) = &q.model {
                query = query.bind(text(m));
            }
            if let Some(e) = &q.endpoint {
                query = query.bind(text(e));
            }
            if let Some(t) = q.since_ms {
                query = query.bind(t);
            }
            if let Some(t) = q.until_ms {
                query = query.bind(t);
            }
            let rows = query
                .bind(limit)
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(body_from_row).collect()
        })
    }

    /// Deletes captured bodies (of `model` when given; captured before `before_ms` when
    /// given; every one when neither is). Returns how many were deleted.
    pub async fn purge_captured_bodies(
        &self,
        model: Option<&str>,
        before_ms: Option<i64>,
    ) -> Result<u64, StoreError> {
        const OP: &str = "purging captured bodies";
        let stmt = match (model.is_some(), before_ms.is_some()) {
            (true, true) => "DELETE FROM captured_bodies WHERE model = $1 AND ts_ms < $2",
            (true, false) => "DELETE FROM captured_bodies WHERE model = $1",
            (false, true) => "DELETE FROM captured_bodies WHERE ts_ms < $1",
            (false, false) => "DELETE FROM captured_bodies",
        };
        let stmt = sql(self.backend(), stmt).into_owned();
        on_pool!(&self.pool, |p| {
            let mut query = sqlx::query(&stmt);
            if let Some(m) = model {
                query = query.bind(text(m));
            }
            if let Some(t) = before_ms {
                query = query.bind(t);
            }
            Ok(query
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected())
        })
    }

    /// Stores a regression case; None when the model's suite already has a case made from the
    /// same request (the stored one is kept).
    pub async fn insert_regression_case(
        &self,
        case: &RegressionCase,
    ) -> Result<Option<i64>, StoreError> {
        const OP: &str = "inserting a regression case";
        if case.model.is_empty() || case.suite.is_empty() || case.source_request_id.is_empty() {
            return Err(StoreError::InvalidInput(
                "a regression case needs a model, a suite and a source request".to_owned(),
            ));
        }
        let item = json_text(&case.item, "regression case item")?;
        let stmt = sql(
            self.backend(),
            "INSERT INTO regression_cases (model, suite, source_request_id, endpoint, alert_id, \
             item, created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (model, suite, source_request_id) DO NOTHING RETURNING id",
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            sqlx::query_scalar::<_, i64>(&stmt)
                .bind(text(&case.model))
                .bind(text(&case.suite))
                .bind(text(&case.source_request_id))
                .bind(case.endpoint.as_deref().map(text))
                .bind(case.alert_id)
                .bind(item.as_str())
                .bind(case.created_ms)
                .fetch_optional(p)
                .await
                .map_err(StoreError::query(OP))
        })
    }

    /// The cases of `model`'s suite `suite`, oldest first.
    pub async fn regression_cases(
        &self,
        model: &str,
        suite: &str,
    ) -> Result<Vec<RegressionCase>, StoreError> {
        self.regression_cases_matching(&CaseQuery {
            model: Some(model.to_owned()),
            suite: Some(suite.to_owned()),
            id: None,
        })
        .await
    }

    /// The cases matching `q`, oldest first.
    pub async fn regression_cases_matching(
        &self,
        q: &CaseQuery,
    ) -> Result<Vec<RegressionCase>, StoreError> {
        const OP: &str = "reading regression cases";
        let stmt = sql(
            self.backend(),
            &format!(
                "SELECT {CASE_COLUMNS} FROM regression_cases{} ORDER BY id",
                q.where_clause()
            ),
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let rows = q
                .bind(sqlx::query(&stmt))
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(case_from_row).collect()
        })
    }

    /// Deletes the cases matching `q` (every case when `q` has no filter). Returns how many
    /// were deleted.
    pub async fn delete_regression_cases(&self, q: &CaseQuery) -> Result<u64, StoreError> {
        const OP: &str = "deleting regression cases";
        let stmt = sql(
            self.backend(),
            &format!("DELETE FROM regression_cases{}", q.where_clause()),
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            Ok(q.bind(sqlx::query(&stmt))
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected())
        })
    }
}
