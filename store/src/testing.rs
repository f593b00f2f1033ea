//! Test support (feature `testing`): a fresh, private database per test on either backend,
//! for this crate's tests and any other crate's. PostgreSQL tests use the real server at
//! `$SAMEWISE_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`): each
//! [`TestDb`] creates a database `samewise_test_<random>` and drops it (with `FORCE`) when
//! the `TestDb` is dropped, even after a failed assertion. SQLite tests get a file in a
//! fresh temporary directory. An unreachable PostgreSQL is an error that says so; it is
//! never a reason to skip.
//!
//! [`cluster`] starts a private PostgreSQL cluster (its own port, stopped and started at will,
//! optionally over TLS) for tests that take the database away; [`TestDb::postgres_on`] makes a
//! test database on it.

pub mod cluster;

pub use cluster::{PgCluster, TlsFiles};

use std::path::Path;

use rand::TryRngCore;
use sqlx::Connection;
use tempfile::TempDir;

use crate::error::redact_url;
use crate::{Backend, Store, StoreError};

/// The PostgreSQL server tests use when `SAMEWISE_TEST_PG_URL` is unset.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The maintenance database URL tests create their databases through.
pub fn pg_admin_url() -> String {
    std::env::var("SAMEWISE_TEST_PG_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_PG_URL.to_owned())
}

/// A private database with a connected, migrated [`Store`] on it.
pub struct TestDb {
    /// The store, connected and migrated.
    pub store: Store,
    /// The URL that reaches the same database (give it to another process or a second
    /// `Store::connect`).
    url: String,
    /// Data directory: holds the SQLite file; empty for PostgreSQL but usable as a data dir.
    dir: TempDir,
    /// Set for PostgreSQL: drops the database when the `TestDb` goes. Declared after
    /// `store` so that it is dropped after it.
    #[allow(dead_code, reason = "held for its Drop")]
    pg: Option<PgTestDatabase>,
}

/// An empty database `samewise_test_<random>` on the test PostgreSQL server, dropped (with
/// `FORCE`) when this guard is dropped. [`TestDb::postgres`] migrates one; use this one
/// directly to test what happens on an empty database.
pub struct PgTestDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl PgTestDatabase {
    /// Creates the database; fails with a message that names the server when it is down.
    pub async fn create() -> Result<PgTestDatabase, StoreError> {
        PgTestDatabase::create_on(&pg_admin_url()).await
    }

    /// Creates the database through `admin_url` (a maintenance database of any server).
    pub async fn create_on(admin_url: &str) -> Result<PgTestDatabase, StoreError> {
        let admin_url = admin_url.to_owned();
        let mut random = [0u8; 8];
        rand::rngs::OsRng
            .try_fill_bytes(&mut random)
            .map_err(|e| StoreError::Random(e.to_string()))?;
        let name = format!("samewise_test_{}", hex::encode(random));
        let mut admin = sqlx::PgConnection::connect(&admin_url).await.map_err(|e| StoreError::Connect {
            backend: "PostgreSQL",
            url: redact_url(&admin_url),
            detail: format!(
                "{}; the store's PostgreSQL tests need a running server (start it, or set SAMEWISE_TEST_PG_URL)",
                crate::error::scrub(e.to_string(), &admin_url)
            ),
        })?;
        sqlx::Executor::execute(&mut admin, format!("CREATE DATABASE \"{name}\"").as_str())
            .await
            .map_err(StoreError::query("creating a test database"))?;
        let _ = admin.close().await;
        let url = with_database(&admin_url, &name);
        Ok(PgTestDatabase {
            admin_url,
            name,
            url,
        })
    }

    /// The URL of the new database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Fault injection for tests of the PostgreSQL advisory lock (`SchedulerLock`): the backend
/// pid holding an advisory lock in the database at `url`, if any session holds one.
pub async fn pg_advisory_lock_holder(url: &str) -> Result<Option<i32>, StoreError> {
    const OP: &str = "finding the advisory lock's holder";
    let mut c = pg_connect(url).await?;
    let pid: Option<i32> = sqlx::query_scalar(
        "SELECT l.pid FROM pg_locks l JOIN pg_database d ON l.database = d.oid \
         WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()",
    )
    .fetch_optional(&mut c)
    .await
    .map_err(StoreError::query(OP))?;
    let _ = c.close().await;
    Ok(pid)
}

/// Fault injection: ends PostgreSQL backend `pid` (as when a lock holder crashes or its
/// connection drops), through a new session on the database at `url`.
pub async fn pg_terminate_backend(url: &str, pid: i32) -> Result<(), StoreError> {
    let mut c = pg_connect(url).await?;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&mut c)
        .await
        .map_err(StoreError::query("terminating a backend"))?;
    let _ = c.close().await;
    Ok(())
}

/// Fault injection for SQLite: a full disk, as the database sees it. Sets `PRAGMA
/// max_page_count` on every connection of `store`'s pool (all are held at once while it is
/// set), so the file cannot grow past its current size plus `extra_pages` and a write that
/// needs room fails with SQLITE_FULL; `None` lifts the limit again. Returns the limit now in
/// force, in pages. A SQLite store only.
pub async fn sqlite_limit_pages(
    store: &Store,
    extra_pages: Option<u64>,
) -> Result<u64, StoreError> {
    const OP: &str = "setting max_page_count";
    let crate::connect::Pool::Sqlite(pool) = &store.pool else {
        return Err(StoreError::InvalidInput(
            "sqlite_limit_pages needs a SQLite store".to_owned(),
        ));
    };
    let mut held = Vec::new();
    for _ in 0..crate::connect::SQLITE_MAX_CONNECTIONS {
        held.push(pool.acquire().await.map_err(StoreError::query(OP))?);
    }
    let mut limit = 0;
    for conn in &mut held {
        let pages = match extra_pages {
            Some(extra) => {
                let count: i64 = sqlx::query_scalar("PRAGMA page_count")
                    .fetch_one(&mut **conn)
                    .await
                    .map_err(StoreError::query(OP))?;
                u64::try_from(count).unwrap_or(0).saturating_add(extra)
            }
            None => 4_294_967_294,
        };
        let set: i64 = sqlx::query_scalar(&format!("PRAGMA max_page_count = {pages}"))
            .fetch_one(&mut **conn)
            .await
            .map_err(StoreError::query(OP))?;
        limit = u64::try_from(set).unwrap_or(0);
    }
    Ok(limit)
}

/// Every row of every table of `store`'s database, each as a JSON object of its columns
/// (binary values as hex), for tests that search everything stored (for secrets, say). On
/// PostgreSQL the tables of the `public` schema (a partitioned table's rows are read through
/// its partitions, each listed); on SQLite every table but SQLite's own.
pub async fn dump_tables(store: &Store) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
    const OP: &str = "dumping the tables";
    let mut out = Vec::new();
    match &store.pool {
        crate::connect::Pool::Postgres(pool) => {
            let tables: Vec<(String,)> = sqlx::query_as(
                "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY 1",
            )
            .fetch_all(pool)
            .await
            .map_err(StoreError::query(OP))?;
            for (t,) in tables {
                let rows: Vec<(String,)> =
                    sqlx::query_as(&format!("SELECT row_to_json(t)::text FROM \"{t}\" t"))
                        .fetch_all(pool)
                        .await
                        .map_err(StoreError::query(OP))?;
                for (row,) in rows {
                    let v = serde_json::from_str(&row).unwrap_or(serde_json::Value::String(row));
                    out.push((t.clone(), v));
                }
            }
        }
        crate::connect::Pool::Sqlite(pool) => {
            let tables: Vec<(String,)> = sqlx::query_as(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY 1",
            )
            .fetch_all(pool)
            .await
            .map_err(StoreError::query(OP))?;
            for (t,) in tables {
                let cols: Vec<(String,)> =
                    sqlx::query_as("SELECT name FROM pragma_table_info(?) ORDER BY cid")
                        .bind(&t)
                        .fetch_all(pool)
                        .await
                        .map_err(StoreError::query(OP))?;
                let fields: Vec<String> = cols
                    .iter()
                    .map(|(c,)| {
                        format!(
                            "'{c}', CASE WHEN typeof(\"{c}\") = 'blob' THEN hex(\"{c}\") ELSE \"{c}\" END"
                        )
                    })
                    .collect();
                let sql = format!("SELECT json_object({}) FROM \"{t}\"", fields.join(", "));
                let rows: Vec<(String,)> = sqlx::query_as(&sql)
                    .fetch_all(pool)
                    .await
                    .map_err(StoreError::query(OP))?;
                for (row,) in rows {
                    let v = serde_json::from_str(&row).unwrap_or(serde_json::Value::String(row));
                    out.push((t.clone(), v));
                }
            }
        }
    }
    Ok(out)
}

async fn pg_connect(url: &str) -> Result<sqlx::PgConnection, StoreError> {
    sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| StoreError::Connect {
            backend: "PostgreSQL",
            url: redact_url(url),
            detail: crate::error::scrub(e.to_string(), url),
        })
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb")
            .field("backend", &self.backend())
            .field("url", &redact_url(&self.url))
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PgTestDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTestDatabase")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

impl Drop for PgTestDatabase {
    fn drop(&mut self) {
        drop_pg_database(self);
    }
}

impl TestDb {
    /// A fresh database on `backend`.
    pub async fn new(backend: Backend) -> Result<TestDb, StoreError> {
        match backend {
            Backend::Postgres => TestDb::postgres().await,
            Backend::Sqlite => TestDb::sqlite().await,
        }
    }

    /// A fresh SQLite file in a new temporary directory.
    pub async fn sqlite() -> Result<TestDb, StoreError> {
        let dir = temp_dir()?;
        let path = dir.path().join(crate::connect::DEFAULT_SQLITE_FILE);
        let url = format!("sqlite://{}", path.display());
        let store = Store::connect(Some(&url), dir.path()).await?;
        Ok(TestDb {
            store,
            url,
            dir,
            pg: None,
        })
    }

    /// A fresh, migrated database `samewise_test_<random>` on the test PostgreSQL server.
    pub async fn postgres() -> Result<TestDb, StoreError> {
        TestDb::postgres_on(&pg_admin_url()).await
    }

    /// A fresh, migrated database `samewise_test_<random>` on the server `admin_url` names
    /// (a [`cluster::PgCluster`]; TLS parameters in its query are kept).
    pub async fn postgres_on(admin_url: &str) -> Result<TestDb, StoreError> {
        let pg = PgTestDatabase::create_on(admin_url).await?;
        let dir = temp_dir()?;
        let store = Store::connect(Some(pg.url()), dir.path()).await?;
        Ok(TestDb {
            store,
            url: pg.url.clone(),
            dir,
            pg: Some(pg),
        })
    }

    /// Which backend this database is on.
    pub fn backend(&self) -> Backend {
        self.store.backend()
    }

    /// A URL that reaches this same database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A temporary directory that lives as long as this `TestDb`.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Drops the test database from a separate thread with its own runtime (Drop cannot await,
/// and the test's runtime may be single-threaded). `FORCE` ends the store's open sessions.
fn drop_pg_database(pg: &PgTestDatabase) {
    let admin_url = pg.admin_url.clone();
    let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", pg.name);
    let name = pg.name.clone();
    let joined = std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => return Err(e.to_string()),
        };
        runtime.block_on(async {
            let mut admin = sqlx::PgConnection::connect(&admin_url)
                .await
                .map_err(|e| e.to_string())?;
            sqlx::Executor::execute(&mut admin, sql.as_str())
                .await
                .map_err(|e| e.to_string())?;
            let _ = admin.close().await;
            Ok(())
        })
    })
    .join();
    match joined {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("samewise-store testing: could not drop test database {name}: {e}"),
        Err(_) => eprintln!("samewise-store testing: dropping test database {name} panicked"),
    }
}

/// `admin_url` with its database path replaced by `database`.
fn with_database(admin_url: &str, database: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (admin_url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map(|i| i + authority_start);
    let root = match path_start {
        Some(i) => &base[..i],
        None => base,
    };
    match query {
        Some(q) => format!("{root}/{database}?{q}"),
        None => format!("{root}/{database}"),
    }
}

fn temp_dir() -> Result<TempDir, StoreError> {
    tempfile::Builder::new()
        .prefix("samewise-store-test")
        .tempdir()
        .map_err(|source| StoreError::DataDir {
            path: std::env::temp_dir(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_in_a_url() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
            "postgres://postgres@127.0.0.1:5432/t1"
        );
        assert_eq!(with_database("postgres://u@h", "t1"), "postgres://u@h/t1");
        assert_eq!(
            with_database("postgres://u@h/db?sslmode=disable", "t1"),
            "postgres://u@h/t1?sslmode=disable"
        );
    }
}
