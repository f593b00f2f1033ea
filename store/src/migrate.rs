//! The migration runner. Each dialect has an ordered list of SQL files embedded at build
//! time from `store/migrations/{postgres,sqlite}/`; the `schema_migrations` table records
//! which versions ran (with a SHA-256 of their text, so an edited migration is caught
//! instead of silently diverging). Every migration runs in its own transaction.
//!
//! Concurrency: on PostgreSQL the whole run holds a session advisory lock, so processes
//! that start together migrate one after the other and the later ones find nothing to do.
//! On SQLite the run is one `BEGIN IMMEDIATE` transaction, which takes the file's write
//! lock up front (other processes wait on the busy timeout).

use sha2::{Digest, Sha256};
use sqlx::Connection;

use crate::connect::{Backend, Pool};
use crate::{Store, StoreError};

/// One schema change, in both dialects' lists under the same version.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Position in the order; recorded in `schema_migrations.version`.
    pub version: i64,
    /// Short description, recorded next to the version.
    pub name: &'static str,
    /// The statements, run as one batch.
    pub sql: &'static str,
}

/// Defines [`POSTGRES`] and [`SQLITE`] from one list of (version, name, file): each version
/// has its statements for both backends, in `migrations/postgres/FILE` and
/// `migrations/sqlite/FILE`, under the same name.
macro_rules! migrations {
    ($($version:literal, $name:literal, $file:literal;)*) => {
        /// PostgreSQL migrations, in order.
        pub const POSTGRES: &[Migration] = &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../migrations/postgres/", $file)),
        }),*];

        /// SQLite migrations, in order (the same versions as [`POSTGRES`]).
        pub const SQLITE: &[Migration] = &[$(Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../migrations/sqlite/", $file)),
        }),*];
    };
}

migrations! {
    1, "request records and api keys", "0001_init.sql";
    2, "probe runs and alerts", "0002_probes_alerts.sql";
    3, "admin keys and endpoint rollups", "0003_dashboards.sql";
    4, "eval jobs and results", "0004_evals.sql";
    5, "rollup labels by time", "0005_rollup_label_time.sql";
    6, "day rollups and the probe-run summary", "0006_days_latest_runs.sql";
    7, "captured bodies and regression cases", "0007_captured_bodies.sql";
    8, "per-key hourly usage", "0008_key_hours.sql";
    9, "probe-run retention indexes", "0009_probe_run_retention.sql";
    10, "changed? baselines", "0010_probe_baselines.sql";
    11, "who resolved an alert", "0011_alert_resolved_by.sql";
}

/// Key of the PostgreSQL advisory lock held while migrating ("samewise" in ASCII, 8 bytes).
pub const PG_MIGRATION_LOCK: i64 = 0x7361_6d65_7769_7365;

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version    BIGINT PRIMARY KEY,
    name       TEXT   NOT NULL,
    checksum   TEXT   NOT NULL,
    applied_ms BIGINT NOT NULL
)";

/// Brings the store's schema up to date. Called by [`Store::connect`].
pub async fn run(store: &Store) -> Result<(), StoreError> {
    match &store.pool {
        Pool::Postgres(pool) => {
            let mut conn = pool
                .acquire()
                .await
                .map_err(pg_err("acquiring a connection"))?;
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(PG_MIGRATION_LOCK)
                .execute(&mut *conn)
                .await
                .map_err(pg_err("taking the migration lock"))?;
            let result = run_postgres(&mut conn).await;
            let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(PG_MIGRATION_LOCK)
                .execute(&mut *conn)
                .await;
            if unlocked.is_err() {
                // The lock is tied to this session: drop the connection so it goes with it.
                conn.detach();
            }
            result
        }
        Pool::Sqlite(pool) => {
            let mut conn = pool
                .acquire()
                .await
                .map_err(sqlite_err("acquiring a connection"))?;
            let mut tx = conn
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(sqlite_err("taking the write lock"))?;
            sqlx::query(CREATE_TABLE)
                .execute(&mut *tx)
                .await
                .map_err(sqlite_err("creating schema_migrations"))?;
            let applied = applied_sqlite(&mut tx).await?;
            check_known(&applied, SQLITE, Backend::Sqlite)?;
            for m in SQLITE {
                if applied.iter().any(|(v, _)| *v == m.version) {
                    continue;
                }
                sqlx::Executor::execute(&mut *tx, m.sql)
                    .await
                    .map_err(|e| failed(Backend::Sqlite, m, &e))?;
                record_sqlite(&mut tx, m)
                    .await
                    .map_err(|e| failed(Backend::Sqlite, m, &e))?;
                tracing::info!(
                    version = m.version,
                    name = m.name,
                    "applied SQLite migration"
                );
            }
            tx.commit()
                .await
                .map_err(sqlite_err("committing migrations"))?;
            Ok(())
        }
    }
}

async fn run_postgres(conn: &mut sqlx::PgConnection) -> Result<(), StoreError> {
    sqlx::query(CREATE_TABLE)
        .execute(&mut *conn)
        .await
        .map_err(pg_err("creating schema_migrations"))?;
    let applied = applied_postgres(&mut *conn).await?;
    check_known(&applied, POSTGRES, Backend::Postgres)?;
    for m in POSTGRES {
        if applied.iter().any(|(v, _)| *v == m.version) {
            continue;
        }
        let mut tx = conn
            .begin()
            .await
            .map_err(pg_err("starting a transaction"))?;
        sqlx::Executor::execute(&mut *tx, m.sql)
            .await
            .map_err(|e| failed(Backend::Postgres, m, &e))?;
        record_postgres(&mut tx, m)
            .await
            .map_err(|e| failed(Backend::Postgres, m, &e))?;
        tx.commit()
            .await
            .map_err(|e| failed(Backend::Postgres, m, &e))?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "applied PostgreSQL migration"
        );
    }
    Ok(())
}

const SELECT_APPLIED: &str = "SELECT version, checksum FROM schema_migrations ORDER BY version";

/// The versions already applied, with their recorded checksums.
async fn applied_postgres(conn: &mut sqlx::PgConnection) -> Result<Vec<(i64, String)>, StoreError> {
    sqlx::query_as(SELECT_APPLIED)
        .fetch_all(conn)
        .await
        .map_err(pg_err("reading schema_migrations"))
}

/// The versions already applied, with their recorded checksums.
async fn applied_sqlite(
    conn: &mut sqlx::SqliteConnection,
) -> Result<Vec<(i64, String)>, StoreError> {
    sqlx::query_as(SELECT_APPLIED)
        .fetch_all(conn)
        .await
        .map_err(sqlite_err("reading schema_migrations"))
}

/// Refuses a database migrated by a newer samewise, or one whose applied migration text
/// differs from ours.
fn check_known(
    applied: &[(i64, String)],
    known: &[Migration],
    backend: Backend,
) -> Result<(), StoreError> {
    for (version, checksum) in applied {
        match known.iter().find(|m| m.version == *version) {
            None => {
                let ours = known.iter().map(|m| m.version).max().unwrap_or(0);
                return Err(StoreError::Migrate {
                    backend: backend.name(),
                    detail: format!(
                        "the database has schema version {version}, newer than this build knows ({ours}); upgrade samewise"
                    ),
                });
            }
            Some(m) if checksum_of(m) != *checksum => {
                return Err(StoreError::Migrate {
                    backend: backend.name(),
                    detail: format!(
                        "migration {} ({}) was applied from different SQL than this build carries",
                        m.version, m.name
                    ),
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

async fn record_postgres(conn: &mut sqlx::PgConnection, m: &Migration) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO schema_migrations (version, name, checksum, applied_ms) VALUES ($1, $2, $3, $4)")
        .bind(m.version)
        .bind(m.name)
        .bind(checksum_of(m))
        .bind(crate::now_ms())
        .execute(conn)
        .await?;
    Ok(())
}

async fn record_sqlite(
    conn: &mut sqlx::SqliteConnection,
    m: &Migration,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO schema_migrations (version, name, checksum, applied_ms) VALUES (?, ?, ?, ?)",
    )
    .bind(m.version)
    .bind(m.name)
    .bind(checksum_of(m))
    .bind(crate::now_ms())
    .execute(conn)
    .await?;
    Ok(())
}

fn checksum_of(m: &Migration) -> String {
    hex::encode(Sha256::digest(m.sql.as_bytes()))
}

fn failed(backend: Backend, m: &Migration, e: &sqlx::Error) -> StoreError {
    StoreError::Migrate {
        backend: backend.name(),
        detail: format!("migration {} ({}): {e}", m.version, m.name),
    }
}

fn pg_err(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::Migrate {
        backend: Backend::Postgres.name(),
        detail: format!("{what}: {e}"),
    }
}

fn sqlite_err(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::Migrate {
        backend: Backend::Sqlite.name(),
        detail: format!("{what}: {e}"),
    }
}

impl Store {
    /// The highest schema version applied to the database (0 when none).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        const SQL: &str = "SELECT COALESCE(MAX(version), 0) FROM schema_migrations";
        const OP: &str = "reading the schema version";
        let v: i64 = match &self.pool {
            Pool::Postgres(p) => sqlx::query_scalar(SQL).fetch_one(p).await,
            Pool::Sqlite(p) => sqlx::query_scalar(SQL).fetch_one(p).await,
        }
        .map_err(StoreError::query(OP))?;
        Ok(v)
    }

    /// How many migrations are recorded as applied.
    pub async fn applied_migrations(&self) -> Result<u64, StoreError> {
        const SQL: &str = "SELECT COUNT(*) FROM schema_migrations";
        const OP: &str = "counting applied migrations";
        let n: i64 = match &self.pool {
            Pool::Postgres(p) => sqlx::query_scalar(SQL).fetch_one(p).await,
            Pool::Sqlite(p) => sqlx::query_scalar(SQL).fetch_one(p).await,
        }
        .map_err(StoreError::query(OP))?;
        u64::try_from(n).map_err(|_| StoreError::Corrupt {
            column: "schema_migrations",
            detail: format!("count {n}"),
        })
    }
}
