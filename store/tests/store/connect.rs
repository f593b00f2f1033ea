//! Connecting: URL forms, the default SQLite file, migrations run twice and by eight
//! processes at once, and what an unreachable server looks like.

use super::*;
use anyhow::Context;
use samewise_store::testing::PgTestDatabase;

both!(migrations_are_idempotent, concurrent_connects_migrate_once);

async fn migrations_are_idempotent(db: TestDb) -> Result<()> {
    db.store
        .insert_request_records(&[full_record("r1", 1, 1000)])
        .await?;
    db.store.create_api_key("k", None).await?;
    // connect again, twice: the migrations find everything applied and leave data alone
    for _ in 0..2 {
        let again = Store::connect(Some(db.url()), db.data_dir()).await?;
        ensure!(again.backend() == db.backend());
        ensure!(again.request_records(&all(10)).await?.len() == 1);
        ensure!(again.list_api_keys().await?.len() == 1);
        again.close().await;
    }
    Ok(())
}

async fn concurrent_connects_migrate_once(db: TestDb) -> Result<()> {
    // Eight stores start at once on an empty database (a new PostgreSQL database, or a new
    // SQLite file next to the test's): all succeed, and the schema is migrated once.
    let _guard;
    let url = match db.backend() {
        Backend::Postgres => {
            let pg = PgTestDatabase::create().await?;
            let url = pg.url().to_owned();
            _guard = Some(pg);
            url
        }
        Backend::Sqlite => {
            _guard = None;
            format!("sqlite://{}", db.data_dir().join("race.db").display())
        }
    };
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let url = url.clone();
        let dir = db.data_dir().to_path_buf();
        set.spawn(async move { Store::connect(Some(&url), &dir).await });
    }
    let mut stores = Vec::new();
    while let Some(joined) = set.join_next().await {
        stores.push(
            joined
                .context("connect task panicked")?
                .context("concurrent connect failed")?,
        );
    }
    ensure!(stores.len() == 8);
    stores[0]
        .insert_request_records(&[full_record("race", 1, 5)])
        .await?;
    // versions may have gaps (numbers are reserved per branch): the latest is the highest
    let migrations = samewise_store::POSTGRES_MIGRATIONS;
    let latest = migrations.iter().map(|m| m.version).max().unwrap_or(0);
    for s in &stores {
        ensure!(s.request_records(&by_id("race")).await?.len() == 1);
        ensure!(s.schema_version().await? == latest);
        ensure!(
            s.applied_migrations().await? == migrations.len() as u64,
            "a migration was recorded twice"
        );
    }
    for s in &stores {
        s.close().await;
    }
    Ok(())
}

#[tokio::test]
async fn unreachable_postgres_is_a_clear_error_without_password() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // port 1 on loopback: nothing listens there
    let err = Store::connect(
        Some("postgres://app:hunter2@127.0.0.1:1/x?connect_timeout=2"),
        dir.path(),
    )
    .await
    .err()
    .context("connecting to a closed port succeeded")?;
    let msg = err.to_string();
    ensure!(
        msg.contains("PostgreSQL") && msg.contains("127.0.0.1:1"),
        "{msg}"
    );
    ensure!(!msg.contains("hunter2"), "password leaked: {msg}");
    ensure!(
        !format!("{err:?}").contains("hunter2"),
        "password leaked in Debug"
    );
    Ok(())
}

#[tokio::test]
async fn bad_urls_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let err = Store::connect(Some("mysql://u:pw@h/db"), dir.path())
        .await
        .err()
        .context("mysql accepted")?;
    ensure!(matches!(err, StoreError::InvalidUrl { .. }));
    ensure!(!err.to_string().contains("pw@"), "{err}");
    Ok(())
}

#[tokio::test]
async fn default_is_sqlite_in_the_data_dir() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("nested").join("data");
    let store = Store::connect(None, &data).await?;
    ensure!(store.backend() == Backend::Sqlite);
    ensure!(data.join("samewise.db").is_file());
    store.close().await;
    // an empty DATABASE_URL means the same
    let store = Store::connect(Some(""), &data).await?;
    ensure!(store.backend() == Backend::Sqlite);
    store.close().await;
    Ok(())
}

#[tokio::test]
async fn in_memory_sqlite_works() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::connect(Some("sqlite::memory:"), dir.path()).await?;
    store
        .insert_request_records(&[full_record("m", 1, 1)])
        .await?;
    ensure!(store.request_records(&by_id("m")).await?.len() == 1);
    store.close().await;
    Ok(())
}

both!(integrity_check_finds_what_is_broken);

async fn integrity_check_finds_what_is_broken(db: TestDb) -> Result<()> {
    db.store
        .insert_request_records(&[full_record("r1", 1, 1000), full_record("r2", 1, 1000)])
        .await?;
    let clean = db.store.integrity_check().await?;
    ensure!(clean.is_empty(), "a fresh database has problems: {clean:?}");
    // break it the way each engine can be broken, behind the store's back
    match db.backend() {
        Backend::Sqlite => {
            use sqlx::Connection;
            let path = db.data_dir().join(samewise_store::DEFAULT_SQLITE_FILE);
            let mut conn =
                sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display())).await?;
            sqlx::query("PRAGMA foreign_keys = OFF")
                .execute(&mut conn)
                .await?;
            sqlx::query(
                "INSERT INTO eval_results (job_id, item, target, passed, tokens, record, created_ms) \
                 VALUES (999, 'i', 'suspect', 1, 0, '{}', 0)",
            )
            .execute(&mut conn)
            .await?;
            conn.close().await?;
        }
        Backend::Postgres => {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(db.url()).await?;
            // a concurrent unique index build that meets duplicates fails and stays INVALID
            db.store.create_api_key("k1", None).await?;
            db.store.create_api_key("k2", None).await?;
            let built = sqlx::query(
                "CREATE UNIQUE INDEX CONCURRENTLY broken_live ON api_keys ((revoked_ms IS NULL))",
            )
            .execute(&mut conn)
            .await;
            ensure!(
                built.is_err(),
                "duplicate models did not fail the unique index"
            );
            conn.close().await?;
        }
    }
    let found = db.store.integrity_check().await?;
    ensure!(found.len() == 1, "{found:?}");
    ensure!(
        found[0].contains("eval_results") || found[0].contains("broken_live"),
        "{found:?}"
    );
    Ok(())
}

#[tokio::test]
async fn postgres_over_tls_with_verify_full() -> Result<()> {
    use samewise_store::testing::{PgCluster, TlsFiles};
    // a private cluster with ssl = on, a certificate for 127.0.0.1 signed by a CA made here,
    // and TCP connections over TLS only (hostssl)
    let tls = TlsFiles::generate()?;
    let cluster = PgCluster::start_tls(&tls).await?;
    let verified = |ca: &std::path::Path| {
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            cluster.admin_url(),
            ca.display()
        )
    };
    // Store::connect (TestDb connects and migrates through it) over verified TLS
    let db = TestDb::postgres_on(&verified(&tls.ca_cert())).await?;
    db.store
        .insert_request_records(&[full_record("tls", 1, 1)])
        .await?;
    ensure!(db.store.request_records(&by_id("tls")).await?.len() == 1);
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(db.url()).await?;
    let (ssl, version): (bool, Option<String>) =
        sqlx::query_as("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&mut conn)
            .await?;
    ensure!(ssl, "the session is not encrypted");
    eprintln!("connected over {version:?}");
    // without TLS the server refuses; with another CA the client refuses the server
    let plain = format!("{}?sslmode=disable", cluster.admin_url());
    let refused = Store::connect(Some(&plain), db.data_dir()).await;
    ensure!(refused.is_err(), "a plain connection was accepted");
    let other = TlsFiles::generate()?;
    let untrusted = Store::connect(Some(&verified(&other.ca_cert())), db.data_dir()).await;
    let Err(e) = untrusted else {
        anyhow::bail!("a server whose CA is not trusted was accepted");
    };
    ensure!(
        e.to_string().to_lowercase().contains("certificate"),
        "not a certificate error: {e}"
    );
    Ok(())
}
