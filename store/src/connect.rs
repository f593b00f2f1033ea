//! The [`Store`] handle: which backend a database URL names, how its pool is set up, and
//! start-up (connect, then migrate). Methods that run SQL live in [`crate::records`] and
//! [`crate::keys`].

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::error::{redact_url, scrub};
use crate::{StoreError, migrate};

/// Which database engine a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// PostgreSQL, the production store (`DATABASE_URL=postgres://...`).
    Postgres,
    /// SQLite, the embedded default (a file in the data directory).
    Sqlite,
}

impl Backend {
    /// The engine's name for messages: "PostgreSQL" or "SQLite".
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "PostgreSQL",
            Backend::Sqlite => "SQLite",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// A cheap-to-clone handle on the database: one connection pool of one backend.
#[derive(Clone, Debug)]
pub struct Store {
    pub(crate) pool: Pool,
}

/// The pool behind a [`Store`]; each method matches on it to pick its dialect.
#[derive(Clone, Debug)]
pub(crate) enum Pool {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// Name of the SQLite file created in the data directory when no URL is given.
pub const DEFAULT_SQLITE_FILE: &str = "samewise.db";

/// Connections in a PostgreSQL pool: the writer holds one for each batch, readers the rest.
const PG_MAX_CONNECTIONS: u32 = 10;
/// Connections in a SQLite pool: writes serialise on the file lock anyway.
pub(crate) const SQLITE_MAX_CONNECTIONS: u32 = 4;
/// How long a SQLite statement waits for another writer (another process) before failing.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long acquiring a pooled connection may take before the call fails.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// `DATABASE_URL`, where it is set and not blank.
fn env_url() -> Option<String> {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
}

impl Store {
    /// [`Store::connect`] with the URL from the `DATABASE_URL` environment variable (unset or
    /// empty: the SQLite file in `data_dir`), the one way every `samewise` command opens the
    /// store; the URL, which may hold a password, never comes from a file.
    pub async fn connect_from_env(data_dir: &Path) -> Result<Store, StoreError> {
        Store::connect(env_url().as_deref(), data_dir).await
    }

    /// [`Store::connect_from_env`] for a command that reads or changes what a gateway stored
    /// (alerts, keys, captured bodies): where that is the SQLite file in `data_dir`, the file
    /// must exist already. A mistyped data directory is [`StoreError::NoDatabase`], not a new
    /// empty database (and directory) that answers "no alerts".
    pub async fn open_from_env(data_dir: &Path) -> Result<Store, StoreError> {
        let url = env_url();
        if url.is_none() {
            let path = data_dir.join(DEFAULT_SQLITE_FILE);
            if !path.try_exists().unwrap_or(true) {
                return Err(StoreError::NoDatabase { path });
            }
        }
        Store::connect(url.as_deref(), data_dir).await
    }

    /// Opens the database and brings its schema up to date.
    ///
    /// `database_url` is `Some("postgres://...")` (or `postgresql://`), `Some("sqlite://path")`
    /// (`sqlite::memory:` for a private in-memory database), or `None` (an empty string counts
    /// as `None`) for the SQLite file `<data_dir>/samewise.db`, created with its directory.
    /// Migrations are versioned and idempotent; on PostgreSQL they run under an advisory
    /// lock, so several processes may start at once.
    pub async fn connect(database_url: Option<&str>, data_dir: &Path) -> Result<Store, StoreError> {
        let url = database_url.map(str::trim).filter(|u| !u.is_empty());
        let store = match url {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Store::connect_postgres(url).await?
            }
            Some(url) if url.starts_with("sqlite:") => {
                let options =
                    SqliteConnectOptions::from_str(url).map_err(|e| StoreError::InvalidUrl {
                        url: redact_url(url),
                        reason: scrub(e.to_string(), url),
                    })?;
                Store::connect_sqlite(options, url).await?
            }
            Some(url) => {
                return Err(StoreError::InvalidUrl {
                    url: redact_url(url),
                    reason: "expected a postgres://, postgresql:// or sqlite: URL".to_owned(),
                });
            }
            None => {
                tokio::fs::create_dir_all(data_dir)
                    .await
                    .map_err(|source| StoreError::DataDir {
                        path: data_dir.to_path_buf(),
                        source,
                    })?;
                let path = data_dir.join(DEFAULT_SQLITE_FILE);
                let shown = format!("sqlite://{}", path.display());
                let options = SqliteConnectOptions::new().filename(&path);
                Store::connect_sqlite(options, &shown).await?
            }
        };
        migrate::run(&store).await?;
        if let Err(e) = store
            .ensure_record_partitions(crate::now_ms(), crate::partitions::DAYS_AHEAD)
            .await
        {
            // records still land in the default partition: degrade, do not refuse to start
            tracing::warn!(error = %e, "could not create request-record day partitions");
        }
        Ok(store)
    }

    /// Which engine this store talks to.
    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Postgres(_) => Backend::Postgres,
            Pool::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// What the database itself finds wrong with its contents; empty when it is consistent.
    /// SQLite: `PRAGMA integrity_check` (b-trees, indexes, page structure) and
    /// `PRAGMA foreign_key_check`. PostgreSQL enforces constraints transactionally and
    /// repairs its heap by WAL replay, so it reports indexes a failed build left invalid.
    /// `samewise demo` runs it after a stop; its end-to-end test asserts it is empty.
    pub async fn integrity_check(&self) -> Result<Vec<String>, StoreError> {
        const OP: &str = "checking the database's integrity";
        let mut problems = Vec::new();
        match &self.pool {
            Pool::Postgres(pool) => {
                let rows: Vec<(String,)> = sqlx::query_as(
                    "SELECT indexrelid::regclass::text FROM pg_index \
                     WHERE NOT indisvalid OR NOT indisready",
                )
                .fetch_all(pool)
                .await
                .map_err(StoreError::query(OP))?;
                problems.extend(rows.into_iter().map(|(i,)| format!("index {i} is invalid")));
            }
            Pool::Sqlite(pool) => {
                let rows: Vec<(String,)> = sqlx::query_as("PRAGMA integrity_check")
                    .fetch_all(pool)
                    .await
                    .map_err(StoreError::query(OP))?;
                problems.extend(rows.into_iter().map(|(r,)| r).filter(|r| r != "ok"));
                let rows: Vec<(String, Option<i64>, String, i64)> =
                    sqlx::query_as("PRAGMA foreign_key_check")
                        .fetch_all(pool)
                        .await
                        .map_err(StoreError::query(OP))?;
                problems.extend(rows.into_iter().map(|(table, row, parent, _)| {
                    format!("{table} row {row:?} references a missing {parent} row")
                }));
            }
        }
        Ok(problems)
    }

    /// Closes every pooled connection, waiting for those in use to be returned. Calls made
    /// after `close` fail with a [`StoreError::Query`] naming a closed pool.
    pub async fn close(&self) {
        match &self.pool {
            Pool::Postgres(p) => p.close().await,
            Pool::Sqlite(p) => p.close().await,
        }
    }

    async fn connect_postgres(url: &str) -> Result<Store, StoreError> {
        let options = PgConnectOptions::from_str(url).map_err(|e| StoreError::InvalidUrl {
            url: redact_url(url),
            reason: scrub(e.to_string(), url),
        })?;
        let pool = PgPoolOptions::new()
            .max_connections(PG_MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Connect {
                backend: Backend::Postgres.name(),
                url: redact_url(url),
                detail: scrub(e.to_string(), url),
            })?;
        Ok(Store {
            pool: Pool::Postgres(pool),
        })
    }

    async fn connect_sqlite(
        options: SqliteConnectOptions,
        shown_url: &str,
    ) -> Result<Store, StoreError> {
        let in_memory = options
            .get_filename()
            .to_string_lossy()
            .starts_with("file:sqlx-in-memory");
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            // statement journals (and temporary tables) in memory, not in files under /var/tmp:
            // a record batch's savepoint keeps one, a copy of every page the batch changes,
            // which SQLite spilled past 64 KiB to a new temporary file — about 900 pages of
            // 4 KiB per batch of 1,000 records (`strace`, 1,000 requests/s)
            .pragma("temp_store", "memory")
            .busy_timeout(SQLITE_BUSY_TIMEOUT)
            .foreign_keys(true);
        let mut pool_options = SqlitePoolOptions::new()
            .max_connections(SQLITE_MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT);
        if in_memory {
            // An in-memory database lives as long as one connection to it: keep one forever.
            pool_options = pool_options
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let pool = pool_options
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Connect {
                backend: Backend::Sqlite.name(),
                url: redact_url(shown_url),
                detail: e.to_string(),
            })?;
        Ok(Store {
            pool: Pool::Sqlite(pool),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pooled SQLite connection keeps its statement journals and temporary tables in
    /// memory (`temp_store` 2), so a record batch writes no temporary file.
    #[tokio::test]
    async fn sqlite_connections_keep_temporary_data_in_memory()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::connect(None, dir.path()).await?;
        let Pool::Sqlite(pool) = &store.pool else {
            return Err("no URL should open SQLite".into());
        };
        // more connections than the pool's first, each asked on its own
        let mut held = Vec::new();
        for _ in 0..SQLITE_MAX_CONNECTIONS {
            let mut conn = pool.acquire().await?;
            let temp_store: i64 = sqlx::query_scalar("PRAGMA temp_store")
                .fetch_one(&mut *conn)
                .await?;
            assert_eq!(temp_store, 2, "temp_store is MEMORY (2)");
            held.push(conn);
        }
        drop(held);
        store.close().await;
        Ok(())
    }
}
