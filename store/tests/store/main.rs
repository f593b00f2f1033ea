//! The store's test suite. Every test body is an async fn taking a fresh [`TestDb`]; the
//! `both!` macro runs it twice, as `<name>::postgres` against the real PostgreSQL server
//! (a new database per test, dropped afterwards) and as `<name>::sqlite` against a
//! temporary SQLite file. An unreachable PostgreSQL fails the `postgres` tests.
//!
//! Layout: `connect` (URLs, migrations, concurrent start-up), `records` (request records,
//! queries, retention and partitions), `keys` (API keys), `writer` (the batch writer),
//! `probe_runs` (probe runs and the scheduler lock), `alerts` (alert lifecycle), `evals`
//! (the eval job queue), `bodies` (captured bodies and regression cases), `rollups` (per-minute rollups, admin keys, probe statistics).

use std::time::Duration;

use anyhow::{Result, ensure};
use samewise_store::testing::TestDb;
use samewise_store::{
    Backend, KeyUsage, RecordQuery, RecordWriter, RecordWriterConfig, RequestRecord, Store,
    StoreError,
};

/// Runs each named `async fn(TestDb) -> Result<()>` on both backends.
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test]
            async fn postgres() -> Result<()> {
                let db = anyhow::Context::context(TestDb::new(Backend::Postgres).await, "creating a PostgreSQL test database")?;
                super::$name(db).await
            }

            #[tokio::test]
            async fn sqlite() -> Result<()> {
                let db = anyhow::Context::context(TestDb::new(Backend::Sqlite).await, "creating a SQLite test database")?;
                super::$name(db).await
            }
        }
    )*};
}

// after the macro, so that the modules can use it
mod alerts;
mod bodies;
mod connect;
mod evals;
mod keys;
mod probe_runs;
mod records;
mod rollups;
mod writer;

/// Runs `stmts` on `db`'s database over a connection of its own, behind the store's back (to
/// set up what the store's API cannot: an older schema's rows, say).
async fn behind_the_back(db: &TestDb, stmts: &[&str]) -> Result<()> {
    match db.backend() {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(db.url()).await?;
            for stmt in stmts {
                sqlx::query(stmt).execute(&pool).await?;
            }
            pool.close().await;
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(db.url()).await?;
            for stmt in stmts {
                sqlx::query(stmt).execute(&pool).await?;
            }
            pool.close().await;
        }
    }
    Ok(())
}

/// A record with every optional field set, distinct per `i`.
fn full_record(request_id: &str, attempt: u32, ts_ms: i64) -> RequestRecord {
    RequestRecord {
        request_id: request_id.to_owned(),
        attempt,
        final_attempt: attempt == 2,
        ts_ms,
        key_id: Some(42),
        model: "smollm2-135m".to_owned(),
        provider: Some("together".to_owned()),
        endpoint: Some("together/smollm2".to_owned()),
        route: "chat".to_owned(),
        stream: true,
        status: Some(503),
        error_kind: Some("upstream_5xx".to_owned()),
        attempts: 2,
        ttft_ms: Some(12.5),
        latency_ms: 250.25,
        tpot_ms: Some(3.125),
        prompt_tokens: Some(1_000_000_000_000),
        completion_tokens: Some(17),
        usage_counted: true,
        finish_reason: Some("tool_calls".to_owned()),
        output_chars: 1234,
        cost_usd: Some(0.000_123_4),
        tool_calls: 3,
        tool_invalid_json: 1,
        tool_unknown_name: 1,
        tool_schema_mismatch: u32::MAX,
        tool_finish_mismatch: Some("calls_without_finish".to_owned()),
        tool_errored: true,
        degenerate: true,
    }
}

/// A rejected request: attempt 0, no endpoint, every optional field None.
fn bare_record(request_id: &str, ts_ms: i64) -> RequestRecord {
    RequestRecord {
        request_id: request_id.to_owned(),
        attempt: 0,
        final_attempt: true,
        ts_ms,
        key_id: None,
        model: "no-such-model".to_owned(),
        provider: None,
        endpoint: None,
        route: "completions".to_owned(),
        stream: false,
        status: None,
        error_kind: None,
        attempts: 0,
        ttft_ms: None,
        latency_ms: 0.0,
        tpot_ms: None,
        prompt_tokens: None,
        completion_tokens: None,
        usage_counted: false,
        finish_reason: None,
        output_chars: 0,
        cost_usd: None,
        tool_calls: 0,
        tool_invalid_json: 0,
        tool_unknown_name: 0,
        tool_schema_mismatch: 0,
        tool_finish_mismatch: None,
        tool_errored: false,
        degenerate: false,
    }
}

fn by_id(id: &str) -> RecordQuery {
    RecordQuery {
        request_id: Some(id.to_owned()),
        limit: 1000,
        ..RecordQuery::default()
    }
}

fn all(limit: u32) -> RecordQuery {
    RecordQuery {
        limit,
        ..RecordQuery::default()
    }
}

/// Polls `cond` every 10 ms until it holds or `within` passes.
async fn eventually<F, Fut>(within: Duration, what: &str, mut cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond().await? {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
