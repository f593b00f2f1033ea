//! samewise-store owns every SQL statement of samewise: the schema and its versioned
//! migrations for PostgreSQL (production) and SQLite (the embedded default), the typed rows
//! that other crates read and write, and the batch writer that takes request records off
//! the request path. It must not know HTTP, and no other crate writes SQL: a crate that
//! needs a new query asks for a method here.
//!
//! Both backends sit behind one [`Store`] handle; each method carries its own statement per
//! dialect where they differ. Queries are built at run time with `sqlx::query` and
//! `QueryBuilder` (no compile-time macros, so no database is needed to build).
//!
//! # Layout
//! - `error`: [`StoreError`], what failed in the caller's terms; database URLs in it are
//!   redacted.
//! - `connect`: [`Store`], [`Backend`], URL resolution and pool set-up.
//! - `migrate`: the migration runner over the SQL files embedded from `migrations/`.
//! - `error_kind`: [`ErrorKind`], the closed set of `error_kind` names a record carries.
//! - `records`: [`RequestRecord`] (one row per upstream attempt) and its queries.
//! - `rollups`: [`Rollup`] per endpoint per minute (hours and days summed from the minutes)
//!   and each API key's usage per hour (`key_hours`), upserted with the records; the
//!   summaries and time series dashboards read, and what `keys usage` reads.
//! - `partitions`: daily partitions of `request_records` on PostgreSQL, and deleting old ones.
//! - `retention`: [`RetentionConfig`] (how long records, rollups, probe runs and their raw data
//!   are kept) and [`RetentionTask`], which deletes what is older at start and every hour, in
//!   short steps.
//! - `keys`: [`ApiKey`]; keys are stored as SHA-256 hashes only.
//! - `writer`: [`RecordWriter`] / [`RecordSender`], the bounded queue and batched writes.
//! - `probe_runs`: [`ProbeRun`], one probe of one endpoint, and its queries.
//! - `baselines`: [`ProbeBaseline`], the changed? detector's fixed baseline of one statistic
//!   of an endpoint's probe kind, kept apart from the runs (retention does not cut it).
//! - `alerts`: [`Alert`] and its lifecycle (open, acknowledged, resolved), deduplicated
//!   per model, endpoint and kind.
//! - `evals`: [`EvalJob`] queue (claim with a lease, heartbeat, take-over, bounded
//!   attempts), per-item [`EvalResult`]s written once, per-endpoint cooldowns.
//! - `bodies`: [`CapturedBody`] (opt-in, redacted, bounded in bytes and age in SQL) and
//!   [`RegressionCase`], the items of a model's `regression` suite.
//! - `scheduler_lock`: [`SchedulerLock`], one active probe scheduler per database.
//! - `testing` (feature `testing`): fresh PostgreSQL and SQLite databases for tests.

//!
//! The API is what this root re-exports (the `Store` handle, its row and query types) and
//! `testing`; the modules are private.

mod alerts;
mod baselines;
mod bodies;
mod connect;
mod error;
mod error_kind;
mod evals;
mod keys;
mod migrate;
mod partitions;
mod probe_runs;
mod records;
mod retention;
mod rollups;
mod scheduler_lock;
mod sqlite_records;
/// A namespace of the API (feature `testing`): fresh databases and fault injection for tests.
#[cfg(feature = "testing")]
pub mod testing;
mod writer;

pub use alerts::{Alert, AlertQuery, AlertState, NewAlert, Resolver};
pub use baselines::{BaselineRun, ProbeBaseline};
pub use bodies::{BodyQuery, BodyWrite, CapturedBody, CaseQuery, NewCapturedBody, RegressionCase};
pub use connect::{Backend, DEFAULT_SQLITE_FILE, Store};
pub use error::StoreError;
pub use error_kind::{ErrorKind, refuses_the_request};
pub use evals::{EvalJob, EvalResult, JobProgress, JobState, Lease, NewEvalJob};
pub use keys::{ApiKey, KeyOptions, KeyUsage, hash_key, key_digest};
pub use probe_runs::{ProbeRun, ProbeRunCount, ProbeRunQuery};
pub use records::{MAX_QUERY_LIMIT, RecordQuery, RequestRecord, new_request_id};
pub use retention::{RetentionConfig, RetentionPass, RetentionStats, RetentionTask, retention_cut};
pub use rollups::{EndpointRollup, Rollup, RollupPoint, RollupQuery};
pub use scheduler_lock::SchedulerLock;
pub use writer::{DEFAULT_MAX_QUEUED_RECORD_BYTES, RecordSender, RecordWriter, RecordWriterConfig};
// What the store's own tests check against: the migration list, partition days and names,
// rollup buckets and the histogram quantile.
pub use migrate::{Migration, POSTGRES as POSTGRES_MIGRATIONS};
pub use partitions::{DAY_MS, partition_name};
pub use rollups::{HOUR_MS, MINUTE_MS, hist_quantile, minute_of};

/// An endpoint's label, `provider/model-id` (the provider's key in the config and the id the
/// provider knows the model by): the one format request records, probe runs, alerts, metrics
/// and every page name an endpoint by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(String);

impl EndpointId {
    /// The label of `provider`'s endpoint serving `model_id`.
    pub fn new(provider: &str, model_id: &str) -> EndpointId {
        EndpointId(format!("{provider}/{model_id}"))
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The label, owned (record and alert fields are plain strings).
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for EndpointId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&self.0)
    }
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` UTC: how every stored timestamp is shown (the
/// CLI's tables, the dashboards), with the calendar arithmetic the partitions use.
pub fn utc_text(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = partitions::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
#[test]
fn utc_text_formats_known_instants() {
    assert_eq!(utc_text(0), "1970-01-01 00:00:00");
    assert_eq!(utc_text(951_782_400_000), "2000-02-29 00:00:00");
    assert_eq!(utc_text(1_798_761_599_999), "2026-12-31 23:59:59");
    assert_eq!(utc_text(-1_000), "1969-12-31 23:59:59");
}

/// The current time as unix milliseconds, the unit of every timestamp in the store.
pub fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}
