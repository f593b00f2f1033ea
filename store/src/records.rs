//! Request records: one row per upstream attempt of one client request, written in batches
//! by [`crate::writer`] and read back for dashboards, drift statistics and tests.
//!
//! The primary key is `(request_id, attempt)` (on PostgreSQL `(request_id, attempt, ts_ms)`,
//! since the table is partitioned by `ts_ms`, see [`crate::partitions`]). Inserts skip rows
//! whose key is already stored (`ON CONFLICT DO NOTHING`), so a batch retried after an
//! ambiguous failure cannot fail forever or double-count; skipped rows are logged at WARN,
//! never silent. The same transaction adds the newly inserted rows to the per-minute
//! rollups ([`crate::rollups`]). Request ids ([`new_request_id`]) begin with their time, so a
//! batch's keys land at the right edge of the key's B-tree instead of on a random leaf each
//! (with random ids, SQLite rewrote one index page per row: see the README's writer figures).
//! NUL characters in text fields are stored as U+FFFD (PostgreSQL's TEXT
//! cannot hold them, and one such row would otherwise fail its whole batch).

use std::borrow::Cow;
use std::collections::HashMap;

use sqlx::{Database, QueryBuilder, Row};

use crate::connect::Pool;
use crate::probe_runs::text;
use crate::rollups::Deltas;
use crate::{ErrorKind, Store, StoreError};

/// A new request id, `req-` then 28 hex digits: the 48 low bits of `ts_ms` (unix
/// milliseconds, so ids sort by time until the year 10889) and 64 random bits (two gateways'
/// ids in one millisecond collide with odds 2^-64 per pair). Time-first ids keep inserts into
/// the primary key's index (and PostgreSQL's) appends, not random page writes.
pub fn new_request_id(ts_ms: i64, rng: &mut impl rand::Rng) -> String {
    let time = (ts_ms.max(0) as u64) & 0xffff_ffff_ffff;
    let random = rng.random::<u64>();
    // written digit by digit: `format!` cost a microsecond of the gateway's request path
    let mut id = String::with_capacity(32);
    id.push_str("req-");
    let hex = |v: u64, digits: u32, id: &mut String| {
        for i in (0..digits).rev() {
            let d = ((v >> (4 * i)) & 0xf) as u32;
            id.push(char::from_digit(d, 16).unwrap_or('0'));
        }
    };
    hex(time, 12, &mut id);
    hex(random, 16, &mut id);
    id
}

/// One upstream attempt of one client request (attempt 1..n; `final_attempt` marks the one
/// whose answer reached the client). Requests rejected before any upstream attempt (bad
/// input, auth, rate limit, unknown model) are recorded too, with `endpoint = None` and
/// `attempt = 0`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestRecord {
    /// The id samewise gave the client request; shared by all its attempts.
    pub request_id: String,
    /// 1-based attempt number; 0 for a request rejected before any upstream attempt.
    pub attempt: u32,
    /// True for the attempt whose answer (or error) reached the client.
    pub final_attempt: bool,
    /// When the attempt started, unix milliseconds.
    pub ts_ms: i64,
    /// The samewise API key's id, when the request presented a valid one.
    pub key_id: Option<i64>,
    /// The logical model name the client asked for (as sent, even if unknown).
    pub model: String,
    /// The provider that served this attempt.
    pub provider: Option<String>,
    /// The endpoint (provider + provider model) that served this attempt.
    pub endpoint: Option<String>,
    /// "chat" | "completions" | "models".
    pub route: String,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// HTTP status of the upstream answer (or samewise's own for rejected requests).
    pub status: Option<u16>,
    /// Short machine-readable error class ("timeout", "connect", "upstream_5xx", ...).
    pub error_kind: Option<String>,
    /// How many attempts the client request took in total.
    pub attempts: u32,
    /// Time to first token (first content byte), milliseconds.
    pub ttft_ms: Option<f64>,
    /// Total attempt latency, milliseconds.
    pub latency_ms: f64,
    /// Time per output token after the first, milliseconds.
    pub tpot_ms: Option<f64>,
    /// Prompt tokens (upstream usage, else counted by samewise).
    pub prompt_tokens: Option<i64>,
    /// Completion tokens (upstream usage, else counted by samewise).
    pub completion_tokens: Option<i64>,
    /// True when the token counts were counted by samewise, not reported by the upstream.
    pub usage_counted: bool,
    /// The finish reason of the (first) choice.
    pub finish_reason: Option<String>,
    /// Characters of generated output.
    pub output_chars: i64,
    /// Cost from the configured prices, US dollars.
    pub cost_usd: Option<f64>,
    /// Tool calls returned.
    pub tool_calls: u32,
    /// Tool calls whose arguments are not valid JSON.
    pub tool_invalid_json: u32,
    /// Tool calls naming a tool the request did not declare.
    pub tool_unknown_name: u32,
    /// Tool calls whose arguments fail the declared JSON Schema.
    pub tool_schema_mismatch: u32,
    /// "finish_without_calls" | "calls_without_finish" when finish_reason and calls disagree.
    pub tool_finish_mismatch: Option<String>,
    /// True if any tool call erred (or the finish reason disagreed).
    pub tool_errored: bool,
    /// True when the degeneration guard cut the generation.
    pub degenerate: bool,
}

impl RequestRecord {
    /// Bytes the record holds in memory: its own size and its strings' heap buffers (their
    /// capacities). What the record queue's byte bound counts.
    pub fn approx_bytes(&self) -> usize {
        let opt = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
        std::mem::size_of::<RequestRecord>()
            + self.request_id.capacity()
            + self.model.capacity()
            + self.route.capacity()
            + opt(&self.provider)
            + opt(&self.endpoint)
            + opt(&self.error_kind)
            + opt(&self.finish_reason)
            + opt(&self.tool_finish_mismatch)
    }

    /// Whether this attempt failed by the endpoint's doing — what an endpoint's error rate
    /// counts: it carries an error kind, and neither the client nor the gateway caused it (not
    /// a client that went away, not a hedge cancelled because another endpoint answered first,
    /// not a 4xx that refused the request itself, see [`crate::refuses_the_request`]). A name
    /// no version of samewise writes counts as a failure.
    pub fn failed_by_endpoint(&self) -> bool {
        match self.error_kind.as_deref().map(ErrorKind::parse) {
            None => false,
            Some(None) => true,
            Some(Some(ErrorKind::Upstream4xx)) => !crate::refuses_the_request(self.status),
            Some(Some(k)) => k.may_be_the_endpoints(),
        }
    }
}

/// Filters for [`Store::request_records`]; unset filters match everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordQuery {
    /// Only the attempts of this client request.
    pub request_id: Option<String>,
    /// Only this logical model.
    pub model: Option<String>,
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Only records with `ts_ms >= since_ms`.
    pub since_ms: Option<i64>,
    /// At most this many rows (capped at [`MAX_QUERY_LIMIT`]); 0 returns nothing.
    pub limit: u32,
}

impl Default for RecordQuery {
    fn default() -> Self {
        RecordQuery {
            request_id: None,
            model: None,
            endpoint: None,
            since_ms: None,
            limit: 100,
        }
    }
}

/// The most rows one [`Store::request_records`] call returns.
pub const MAX_QUERY_LIMIT: u32 = 100_000;

/// Splits `rows` into chunks whose lengths are powers of two, largest first, none over `max`
/// (itself a power of two). A multi-row statement has one text per chunk length, and sqlx keeps
/// every statement it ran prepared on its connection (up to 100 per connection): chunks of
/// every length from 1 to `max` would keep up to 100 large statements in each connection's
/// memory — in SQLite's case inside the gateway's own process, where a soak at 1,000 requests
/// per second grew the gateway by about 5 MB a minute — while power-of-two lengths make at
/// most log2(`max`) + 1 texts, each prepared once and reused.
pub(crate) fn pow2_chunks<T>(rows: &[T], max: usize) -> impl Iterator<Item = &[T]> {
    debug_assert!(max.is_power_of_two());
    let mut rest = rows;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = max.min(1 << rest.len().ilog2());
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    })
}

/// Rows per PostgreSQL INSERT: the rows travel as 29 arrays, so the statement text (and its
/// prepared plan) is the same whatever the batch size; this only bounds one message.
const PG_ROWS_PER_STATEMENT: usize = 10_000;

/// The PostgreSQL insert: one array per column, unnested into rows. One fixed statement,
/// prepared once per connection, instead of a new multi-row VALUES text per batch size.
const PG_INSERT: &str = "INSERT INTO request_records (request_id, attempt, final_attempt, ts_ms, \
key_id, model, provider, endpoint, route, stream, status, error_kind, attempts, ttft_ms, \
latency_ms, tpot_ms, prompt_tokens, completion_tokens, usage_counted, finish_reason, output_chars, \
cost_usd, tool_calls, tool_invalid_json, tool_unknown_name, tool_schema_mismatch, \
tool_finish_mismatch, tool_errored, degenerate) \
SELECT * FROM UNNEST($1::text[], $2::int8[], $3::bool[], $4::int8[], $5::int8[], $6::text[], \
$7::text[], $8::text[], $9::text[], $10::bool[], $11::int8[], $12::text[], $13::int8[], \
$14::float8[], $15::float8[], $16::float8[], $17::int8[], $18::int8[], $19::bool[], $20::text[], \
$21::int8[], $22::float8[], $23::int8[], $24::int8[], $25::int8[], $26::int8[], $27::text[], \
$28::bool[], $29::bool[]) \
ON CONFLICT (request_id, attempt, ts_ms) DO NOTHING RETURNING request_id, attempt, ts_ms";

/// The columns, in the order they are inserted and selected.
pub(crate) const COLUMNS: &str = "request_id, attempt, final_attempt, ts_ms, key_id, model, provider, endpoint, \
route, stream, status, error_kind, attempts, ttft_ms, latency_ms, tpot_ms, prompt_tokens, \
completion_tokens, usage_counted, finish_reason, output_chars, cost_usd, tool_calls, \
tool_invalid_json, tool_unknown_name, tool_schema_mismatch, tool_finish_mismatch, tool_errored, \
degenerate";

impl Store {
    /// Inserts `rows` in one transaction with multi-row statements. Rows whose
    /// `(request_id, attempt)` is already stored are skipped (and logged at WARN).
    pub async fn insert_request_records(&self, rows: &[RequestRecord]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        const OP: &str = "inserting request records";
        let inserted = match &self.pool {
            Pool::Postgres(pool) => {
                let mut tx = pool.begin().await.map_err(StoreError::query(OP))?;
                let mut keys = Vec::new();
                for chunk in rows.chunks(PG_ROWS_PER_STATEMENT) {
                    keys.extend(
                        insert_postgres(&mut tx, chunk)
                            .await
                            .map_err(StoreError::query(OP))?,
                    );
                }
                let inserted = keys.len() as u64;
                let deltas = Deltas::of(newly_inserted(rows, keys));
                for mut qb in deltas.statements::<sqlx::Postgres>() {
                    qb.build()
                        .execute(&mut *tx)
                        .await
                        .map_err(StoreError::query(OP))?;
                }
                tx.commit().await.map_err(StoreError::query(OP))?;
                inserted
            }
            Pool::Sqlite(pool) => insert_sqlite(pool, rows)
                .await
                .map_err(StoreError::query(OP))?,
        };
        let skipped = (rows.len() as u64).saturating_sub(inserted);
        if skipped > 0 {
            tracing::warn!(
                skipped,
                "request records already stored under the same (request_id, attempt) were skipped"
            );
        }
        Ok(())
    }

    /// Records matching `q`, newest first (ties: request id, then attempt, descending).
    pub async fn request_records(&self, q: &RecordQuery) -> Result<Vec<RequestRecord>, StoreError> {
        const OP: &str = "reading request records";
        match &self.pool {
            Pool::Postgres(pool) => {
                let mut qb = select_statement::<sqlx::Postgres>(q);
                let rows = qb
                    .build()
                    .fetch_all(pool)
                    .await
                    .map_err(StoreError::query(OP))?;
                rows.iter().map(record_from_row).collect()
            }
            Pool::Sqlite(pool) => {
                let mut qb = select_statement::<sqlx::Sqlite>(q);
                let rows = qb
                    .build()
                    .fetch_all(pool)
                    .await
                    .map_err(StoreError::query(OP))?;
                rows.iter().map(record_from_row).collect()
            }
        }
    }
}

/// Inserts `rows` into SQLite in one transaction and adds the new ones to the rollups; the
/// number inserted. The rows go in through SQLite's C API (`sqlite_records`), which says of
/// each whether it was new.
async fn insert_sqlite(
    pool: &sqlx::SqlitePool,
    rows: &[RequestRecord],
) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    match insert_sqlite_in(&mut tx, rows).await {
        Ok(inserted) => {
            tx.commit().await?;
            Ok(inserted)
        }
        Err(e) => {
            // Some errors (SQLITE_FULL, SQLITE_IOERR, ...) make SQLite roll the transaction back
            // itself; sqlx still counts it open, its ROLLBACK would then fail and leave the
            // pooled connection refusing every later BEGIN. A plain BEGIN opens one again in
            // that case (and fails harmlessly when the transaction is still open), so that the
            // rollback on drop finds one.
            let _ = sqlx::query("BEGIN").execute(&mut *tx).await;
            Err(e)
        }
    }
}

/// [`insert_sqlite`]'s statements inside its transaction: the number inserted.
async fn insert_sqlite_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    rows: &[RequestRecord],
) -> Result<u64, sqlx::Error> {
    let new = crate::sqlite_records::insert(tx, rows).await?;
    let new: Vec<&RequestRecord> = rows
        .iter()
        .zip(new)
        .filter_map(|(r, new)| new.then_some(r))
        .collect();
    let inserted = new.len() as u64;
    for mut qb in Deltas::of(new).statements::<sqlx::Sqlite>() {
        qb.build().execute(&mut **tx).await?;
    }
    Ok(inserted)
}

/// `(request_id, attempt, ts_ms)` of an inserted row, as the insert's RETURNING gives it.
type InsertedKey = (String, i64, i64);

fn inserted_key<R>(row: &R) -> Result<InsertedKey, sqlx::Error>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
}

/// The rows of `rows` that the insert reported as new (`keys`, one per inserted row; a key
/// given twice in one batch counts once), for the rollups.
fn newly_inserted(rows: &[RequestRecord], keys: Vec<InsertedKey>) -> Vec<&RequestRecord> {
    let mut left: HashMap<InsertedKey, usize> = HashMap::new();
    for k in keys {
        *left.entry(k).or_default() += 1;
    }
    rows.iter()
        .filter(|r| {
            let k = (
                text(&r.request_id).into_owned(),
                i64::from(r.attempt),
                r.ts_ms,
            );
            match left.get_mut(&k) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        })
        .collect()
}

/// Inserts `rows` on PostgreSQL with [`PG_INSERT`]; returns the keys of the new ones.
async fn insert_postgres(
    conn: &mut sqlx::PgConnection,
    rows: &[RequestRecord],
) -> Result<Vec<InsertedKey>, sqlx::Error> {
    fn col<'a, T>(rows: &'a [RequestRecord], f: impl Fn(&'a RequestRecord) -> T) -> Vec<T> {
        rows.iter().map(f).collect()
    }
    let done = sqlx::query(PG_INSERT)
        .bind(col(rows, |r| text(&r.request_id)))
        .bind(col(rows, |r| i64::from(r.attempt)))
        .bind(col(rows, |r| r.final_attempt))
        .bind(col(rows, |r| r.ts_ms))
        .bind(col(rows, |r| r.key_id))
        .bind(col(rows, |r| text(&r.model)))
        .bind(col(rows, |r| r.provider.as_deref().map(text)))
        .bind(col(rows, |r| r.endpoint.as_deref().map(text)))
        .bind(col(rows, |r| text(&r.route)))
        .bind(col(rows, |r| r.stream))
        .bind(col(rows, |r| r.status.map(i64::from)))
        .bind(col(rows, |r| r.error_kind.as_deref().map(text)))
        .bind(col(rows, |r| i64::from(r.attempts)))
        .bind(col(rows, |r| r.ttft_ms))
        .bind(col(rows, |r| r.latency_ms))
        .bind(col(rows, |r| r.tpot_ms))
        .bind(col(rows, |r| r.prompt_tokens))
        .bind(col(rows, |r| r.completion_tokens))
        .bind(col(rows, |r| r.usage_counted))
        .bind(col(rows, |r| r.finish_reason.as_deref().map(text)))
        .bind(col(rows, |r| r.output_chars))
        .bind(col(rows, |r| r.cost_usd))
        .bind(col(rows, |r| i64::from(r.tool_calls)))
        .bind(col(rows, |r| i64::from(r.tool_invalid_json)))
        .bind(col(rows, |r| i64::from(r.tool_unknown_name)))
        .bind(col(rows, |r| i64::from(r.tool_schema_mismatch)))
        .bind(col(rows, |r| r.tool_finish_mismatch.as_deref().map(text)))
        .bind(col(rows, |r| r.tool_errored))
        .bind(col(rows, |r| r.degenerate))
        .fetch_all(conn)
        .await?;
    done.iter().map(inserted_key).collect()
}

/// `SELECT ... WHERE <filters> ORDER BY ts_ms DESC ... LIMIT n` for `q`.
fn select_statement<'a, DB>(q: &'a RecordQuery) -> QueryBuilder<'a, DB>
where
    DB: Database,
    Cow<'a, str>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let mut qb = QueryBuilder::<DB>::new("SELECT ");
    qb.push(COLUMNS);
    qb.push(" FROM request_records WHERE 1 = 1");
    if let Some(id) = &q.request_id {
        qb.push(" AND request_id = ").push_bind(text(id));
    }
    if let Some(model) = &q.model {
        qb.push(" AND model = ").push_bind(text(model));
    }
    if let Some(endpoint) = &q.endpoint {
        qb.push(" AND endpoint = ").push_bind(text(endpoint));
    }
    if let Some(since) = q.since_ms {
        qb.push(" AND ts_ms >= ").push_bind(since);
    }
    qb.push(" ORDER BY ts_ms DESC, request_id DESC, attempt DESC LIMIT ")
        .push_bind(i64::from(q.limit.min(MAX_QUERY_LIMIT)));
    qb
}

/// Decodes one row selected with [`COLUMNS`] (by position).
fn record_from_row<R>(row: &R) -> Result<RequestRecord, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    f64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<f64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding a request record";
    let get_u32 = |i: usize, column: &'static str| -> Result<u32, StoreError> {
        let v: i64 = row.try_get(i).map_err(StoreError::query(OP))?;
        u32::try_from(v).map_err(|_| StoreError::Corrupt {
            column,
            detail: format!("{v} is not a u32"),
        })
    };
    let status: Option<i64> = row.try_get(10).map_err(StoreError::query(OP))?;
    let status = status
        .map(|s| {
            u16::try_from(s).map_err(|_| StoreError::Corrupt {
                column: "status",
                detail: format!("{s} is not an HTTP status"),
            })
        })
        .transpose()?;
    Ok(RequestRecord {
        request_id: row.try_get(0).map_err(StoreError::query(OP))?,
        attempt: get_u32(1, "attempt")?,
        final_attempt: row.try_get(2).map_err(StoreError::query(OP))?,
        ts_ms: row.try_get(3).map_err(StoreError::query(OP))?,
        key_id: row.try_get(4).map_err(StoreError::query(OP))?,
        model: row.try_get(5).map_err(StoreError::query(OP))?,
        provider: row.try_get(6).map_err(StoreError::query(OP))?,
        endpoint: row.try_get(7).map_err(StoreError::query(OP))?,
        route: row.try_get(8).map_err(StoreError::query(OP))?,
        stream: row.try_get(9).map_err(StoreError::query(OP))?,
        status,
        error_kind: row.try_get(11).map_err(StoreError::query(OP))?,
        attempts: get_u32(12, "attempts")?,
        ttft_ms: row.try_get(13).map_err(StoreError::query(OP))?,
        latency_ms: row.try_get(14).map_err(StoreError::query(OP))?,
        tpot_ms: row.try_get(15).map_err(StoreError::query(OP))?,
        prompt_tokens: row.try_get(16).map_err(StoreError::query(OP))?,
        completion_tokens: row.try_get(17).map_err(StoreError::query(OP))?,
        usage_counted: row.try_get(18).map_err(StoreError::query(OP))?,
        finish_reason: row.try_get(19).map_err(StoreError::query(OP))?,
        output_chars: row.try_get(20).map_err(StoreError::query(OP))?,
        cost_usd: row.try_get(21).map_err(StoreError::query(OP))?,
        tool_calls: get_u32(22, "tool_calls")?,
        tool_invalid_json: get_u32(23, "tool_invalid_json")?,
        tool_unknown_name: get_u32(24, "tool_unknown_name")?,
        tool_schema_mismatch: get_u32(25, "tool_schema_mismatch")?,
        tool_finish_mismatch: row.try_get(26).map_err(StoreError::query(OP))?,
        tool_errored: row.try_get(27).map_err(StoreError::query(OP))?,
        degenerate: row.try_get(28).map_err(StoreError::query(OP))?,
    })
}

#[cfg(test)]
mod tests {
    use super::{new_request_id, pow2_chunks};
    use rand::SeedableRng;

    #[test]
    fn request_ids_sort_by_time_and_differ_within_a_millisecond() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let t = 1_764_800_000_000i64; // December 2025
        let id = new_request_id(t, &mut rng);
        assert_eq!(id.len(), 4 + 28, "{id}");
        assert!(id.starts_with(&format!("req-{t:012x}")), "{id}");
        assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        // the digits are the time's and the random word's, as `format!` writes them
        let random: u64 = rand::Rng::random(&mut rand::rngs::SmallRng::seed_from_u64(9));
        let again = new_request_id(t, &mut rand::rngs::SmallRng::seed_from_u64(9));
        assert_eq!(again, format!("req-{t:012x}{random:016x}"));
        // later milliseconds sort after, whatever the random part
        let mut ids: Vec<String> = (0..1000)
            .map(|i| new_request_id(t + i / 10, &mut rng))
            .collect();
        let times: Vec<String> = ids.iter().map(|s| s[..16].to_owned()).collect();
        assert!(times.is_sorted(), "time prefixes in order");
        for w in ids.windows(2) {
            if w[0][..16] != w[1][..16] {
                assert!(w[0] < w[1], "{} then {}", w[0], w[1]);
            }
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 1000, "ten ids per millisecond, all distinct");
        // a time before the epoch or past 48 bits still makes a well-formed id
        assert_eq!(new_request_id(-5, &mut rng).len(), 32);
        assert_eq!(new_request_id(i64::MAX, &mut rng).len(), 32);
    }

    #[test]
    fn pow2_chunks_cover_the_rows_in_order_with_few_lengths() {
        let rows: Vec<usize> = (0..1100).collect();
        let mut lengths = std::collections::BTreeSet::new();
        for n in 0..rows.len() {
            let chunks: Vec<&[usize]> = pow2_chunks(&rows[..n], 256).collect();
            assert_eq!(chunks.concat(), &rows[..n], "n = {n}");
            for w in chunks.windows(2) {
                assert!(w[0].len() >= w[1].len(), "largest first: n = {n}");
            }
            for c in &chunks {
                assert!(
                    c.len().is_power_of_two() && c.len() <= 256,
                    "n = {n}: {}",
                    c.len()
                );
                lengths.insert(c.len());
            }
            // below the cap, one chunk per set bit of n
            if n < 256 {
                assert_eq!(chunks.len(), n.count_ones() as usize, "n = {n}");
            }
        }
        assert_eq!(lengths.len(), 9, "1, 2, 4, ..., 256: {lengths:?}");
    }
}
