//! The store's test suite. Every test body is an async fn taking a fresh [`TestDb`]; the
//! `both!` macro runs it twice, as `<name>::postgres` against the real PostgreSQL server
//! (a new database per test, dropped afterwards) and as `<name>::sqlite` against a
//! temporary SQLite file. An unreachable PostgreSQL fails the `postgres` tests.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_store::testing::{PgTestDatabase, TestDb};
use samewise_store::{
    Backend, RecordQuery, RecordWriter, RecordWriterConfig, RequestRecord, Store, StoreError,
};

/// Runs each named `async fn(TestDb) -> Result<()>` on both backends.
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test]
            async fn postgres() -> Result<()> {
                let db = TestDb::new(Backend::Postgres).await.context("creating a PostgreSQL test database")?;
                super::$name(db).await
            }

            #[tokio::test]
            async fn sqlite() -> Result<()> {
                let db = TestDb::new(Backend::Sqlite).await.context("creating a SQLite test database")?;
                super::$name(db).await
            }
        }
    )*};
}

both!(
    migrations_are_idempotent,
    concurrent_connects_migrate_once,
    round_trip_every_field,
    round_trip_none_values,
    nul_characters_do_not_fail_a_batch,
    batch_of_a_thousand,
    query_filters_and_order,
    duplicate_attempts_are_skipped,
    retention_deletes_old_records,
    retention_drops_day_partitions,
    api_key_lifecycle,
    api_key_names,
    writer_delivers_records,
    writer_counts_drops_when_full,
    writer_shutdown_flushes,
    writer_counts_write_errors,
    writer_isolates_a_refused_row,
);

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

/// The text columns of the live key `name`, read with plain SQL behind the store's back.
async fn stored_key_columns(db: &TestDb, name: &str) -> Result<Vec<String>> {
    const SQL: &str = "SELECT name, key_hash, prefix FROM api_keys WHERE name = ";
    let (a, b, c): (String, String, String) = match db.backend() {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(db.url()).await?;
            let row = sqlx::query_as(&format!("{SQL}$1"))
                .bind(name)
                .fetch_one(&pool)
                .await?;
            pool.close().await;
            row
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(db.url()).await?;
            let row = sqlx::query_as(&format!("{SQL}?"))
                .bind(name)
                .fetch_one(&pool)
                .await?;
            pool.close().await;
            row
        }
    };
    Ok(vec![a, b, c])
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
    let latest = samewise_store::migrate::POSTGRES.len() as i64;
    for s in &stores {
        ensure!(s.request_records(&by_id("race")).await?.len() == 1);
        ensure!(s.schema_version().await? == latest);
        ensure!(
            s.applied_migrations().await? == latest as u64,
            "a migration was recorded twice"
        );
    }
    for s in &stores {
        s.close().await;
    }
    Ok(())
}

async fn round_trip_every_field(db: TestDb) -> Result<()> {
    let rows = vec![
        full_record("req-a", 1, 1_700_000_000_000),
        full_record("req-a", 2, 1_700_000_000_001),
    ];
    db.store.insert_request_records(&rows).await?;
    let mut got = db.store.request_records(&by_id("req-a")).await?;
    got.reverse(); // newest first -> oldest first
    ensure!(
        got == rows,
        "round trip differs:\n got {got:#?}\nwant {rows:#?}"
    );
    Ok(())
}

async fn round_trip_none_values(db: TestDb) -> Result<()> {
    // None and Some values of the same column in one batch
    let row = bare_record("rejected", 7);
    let full = full_record("served", 1, 6);
    db.store
        .insert_request_records(&[row.clone(), full.clone()])
        .await?;
    let got = db.store.request_records(&by_id("rejected")).await?;
    ensure!(
        got == vec![row.clone()],
        "round trip differs: {got:#?} vs {row:#?}"
    );
    let got = db.store.request_records(&by_id("served")).await?;
    ensure!(
        got == vec![full.clone()],
        "round trip differs: {got:#?} vs {full:#?}"
    );
    Ok(())
}

async fn nul_characters_do_not_fail_a_batch(db: TestDb) -> Result<()> {
    let mut odd = full_record("nul\0id", 1, 3);
    odd.model = "m\0".into();
    odd.finish_reason = Some("\0".into());
    let ok = full_record("fine", 1, 4);
    db.store.insert_request_records(&[odd, ok.clone()]).await?;
    ensure!(db.store.request_records(&by_id("fine")).await? == vec![ok]);
    // stored with U+FFFD in place of NUL; a query naming the NUL form finds it too
    let got = db.store.request_records(&by_id("nul\0id")).await?;
    ensure!(got.len() == 1, "{got:?}");
    ensure!(got[0].request_id == "nul\u{FFFD}id" && got[0].model == "m\u{FFFD}");
    ensure!(got[0].finish_reason.as_deref() == Some("\u{FFFD}"));
    Ok(())
}

async fn batch_of_a_thousand(db: TestDb) -> Result<()> {
    let rows: Vec<RequestRecord> = (0..1000)
        .map(|i| full_record(&format!("bulk-{i:04}"), 1, 10_000 + i64::from(i)))
        .collect();
    db.store.insert_request_records(&rows).await?;
    let got = db.store.request_records(&all(5000)).await?;
    ensure!(got.len() == 1000, "got {} rows", got.len());
    ensure!(got[0].request_id == "bulk-0999" && got[999].request_id == "bulk-0000");
    ensure!(
        got.iter().rev().eq(rows.iter()),
        "rows differ after the bulk insert"
    );
    Ok(())
}

async fn query_filters_and_order(db: TestDb) -> Result<()> {
    let mut rows = Vec::new();
    for i in 0..10i64 {
        let mut r = full_record(&format!("q{i}"), 1, 100 + i);
        r.model = if i % 2 == 0 {
            "even".into()
        } else {
            "odd".into()
        };
        r.endpoint = Some(format!("ep{}", i % 3));
        rows.push(r);
    }
    db.store.insert_request_records(&rows).await?;
    let ids = |v: Vec<RequestRecord>| v.into_iter().map(|r| r.request_id).collect::<Vec<_>>();
    let q = RecordQuery {
        model: Some("even".into()),
        limit: 100,
        ..RecordQuery::default()
    };
    ensure!(ids(db.store.request_records(&q).await?) == ["q8", "q6", "q4", "q2", "q0"]);
    let q = RecordQuery {
        endpoint: Some("ep1".into()),
        limit: 100,
        ..RecordQuery::default()
    };
    ensure!(ids(db.store.request_records(&q).await?) == ["q7", "q4", "q1"]);
    let q = RecordQuery {
        since_ms: Some(107),
        limit: 100,
        ..RecordQuery::default()
    };
    ensure!(ids(db.store.request_records(&q).await?) == ["q9", "q8", "q7"]);
    let q = RecordQuery {
        model: Some("odd".into()),
        endpoint: Some("ep0".into()),
        since_ms: Some(100),
        limit: 100,
        request_id: None,
    };
    ensure!(ids(db.store.request_records(&q).await?) == ["q9", "q3"]);
    ensure!(ids(db.store.request_records(&all(2)).await?) == ["q9", "q8"]);
    ensure!(db.store.request_records(&all(0)).await?.is_empty());
    ensure!(db.store.request_records(&by_id("nope")).await?.is_empty());
    // attempts of one request come back newest (highest attempt) first at equal ts
    db.store
        .insert_request_records(&[full_record("multi", 1, 500), full_record("multi", 2, 500)])
        .await?;
    let got = db.store.request_records(&by_id("multi")).await?;
    ensure!(got.iter().map(|r| r.attempt).collect::<Vec<_>>() == [2, 1]);
    Ok(())
}

async fn duplicate_attempts_are_skipped(db: TestDb) -> Result<()> {
    let r = full_record("dup", 1, 1);
    db.store
        .insert_request_records(std::slice::from_ref(&r))
        .await?;
    let mut changed = r.clone();
    changed.latency_ms = 999.0;
    // a retried batch that partly reached the database must not fail or double-count
    db.store
        .insert_request_records(&[changed, full_record("dup", 2, 2)])
        .await?;
    let got = db.store.request_records(&by_id("dup")).await?;
    ensure!(got.len() == 2);
    ensure!(got[1] == r, "the first stored attempt was overwritten");
    Ok(())
}

async fn retention_deletes_old_records(db: TestDb) -> Result<()> {
    let rows: Vec<_> = (0..10)
        .map(|i| full_record(&format!("t{i}"), 1, i64::from(i) * 100))
        .collect();
    db.store.insert_request_records(&rows).await?;
    ensure!(db.store.delete_request_records_before(500).await? == 5);
    ensure!(db.store.delete_request_records_before(500).await? == 0);
    let left = db.store.request_records(&all(100)).await?;
    ensure!(left.len() == 5 && left.iter().all(|r| r.ts_ms >= 500));
    Ok(())
}

async fn retention_drops_day_partitions(db: TestDb) -> Result<()> {
    use samewise_store::partitions::{DAY_MS, partition_name};
    let d = 20_000i64; // 2024-10-04, long before "today"
    let created = db.store.ensure_record_partitions(d * DAY_MS + 5, 2).await?;
    let expected: Vec<String> = (d..=d + 2).map(partition_name).collect();
    match db.backend() {
        Backend::Postgres => ensure!(created == expected, "created {created:?}"),
        Backend::Sqlite => ensure!(created.is_empty()),
    }
    // asking again creates nothing
    ensure!(
        db.store
            .ensure_record_partitions(d * DAY_MS, 2)
            .await?
            .is_empty()
    );
    let mut rows = Vec::new();
    for day in d..=d + 2 {
        for i in 0..3 {
            rows.push(full_record(
                &format!("p{day}-{i}"),
                1,
                day * DAY_MS + i * 1000,
            ));
        }
    }
    rows.push(full_record("old", 1, 1)); // 1970: the default partition
    db.store.insert_request_records(&rows).await?;
    ensure!(db.store.request_records(&all(100)).await?.len() == 10);
    let partitions = db.store.record_partitions().await?;
    if db.backend() == Backend::Postgres {
        ensure!(
            expected.iter().all(|p| partitions.contains(p)),
            "{partitions:?}"
        );
    }
    // cut in the middle of day d+2: days d and d+1 go whole, plus "old" and one row of d+2
    let deleted = db
        .store
        .delete_request_records_before((d + 2) * DAY_MS + 500)
        .await?;
    ensure!(deleted == 3 + 3 + 1 + 1, "deleted {deleted}");
    let left = db.store.request_records(&all(100)).await?;
    ensure!(left.len() == 2 && left.iter().all(|r| r.ts_ms >= (d + 2) * DAY_MS + 500));
    let partitions = db.store.record_partitions().await?;
    ensure!(
        !partitions.contains(&partition_name(d)) && !partitions.contains(&partition_name(d + 1))
    );
    if db.backend() == Backend::Postgres {
        ensure!(partitions.contains(&partition_name(d + 2)));
        // today's partition (made at connect) is untouched
        ensure!(partitions.contains(&partition_name(samewise_store::now_ms().div_euclid(DAY_MS))));
    }
    // a day whose rows already sit in the default partition is skipped, not an error
    let late = d - 10;
    db.store
        .insert_request_records(&[full_record("late", 1, late * DAY_MS)])
        .await?;
    ensure!(
        db.store
            .ensure_record_partitions(late * DAY_MS, 0)
            .await?
            .is_empty()
    );
    ensure!(db.store.request_records(&by_id("late")).await?.len() == 1);
    Ok(())
}

async fn api_key_lifecycle(db: TestDb) -> Result<()> {
    let (key, plaintext) = db.store.create_api_key("team-a", Some(60)).await?;
    ensure!(
        plaintext.starts_with("sw-") && plaintext.len() == 3 + 64,
        "bad key shape: {}",
        plaintext.len()
    );
    ensure!(plaintext[3..].chars().all(|c| c.is_ascii_hexdigit()));
    ensure!(key.prefix == plaintext[..8]);
    ensure!(key.name == "team-a" && key.rpm_limit == Some(60) && !key.revoked);
    let found = db
        .store
        .find_api_key(&plaintext)
        .await?
        .context("created key not found")?;
    ensure!(found == key, "found {found:?}, created {key:?}");
    // wrong keys: another random key, a truncated one, garbage
    let (_, other) = db.store.create_api_key("team-b", None).await?;
    ensure!(other != plaintext);
    ensure!(
        db.store
            .find_api_key(&plaintext[..plaintext.len() - 1])
            .await?
            .is_none()
    );
    ensure!(db.store.find_api_key("sw-0000").await?.is_none());
    ensure!(db.store.find_api_key("").await?.is_none());
    ensure!(
        db.store
            .find_api_key(&plaintext.to_uppercase())
            .await?
            .is_none()
    );
    // only the hash is stored: no column of the row holds the plaintext
    let stored = stored_key_columns(&db, "team-b").await?;
    ensure!(stored.contains(&samewise_store::keys::hash_key(&other)));
    ensure!(
        stored.iter().all(|c| !c.contains(&other)),
        "plaintext stored: {stored:?}"
    );
    // revoke
    ensure!(db.store.revoke_api_key("team-a").await?);
    ensure!(!db.store.revoke_api_key("team-a").await?);
    ensure!(!db.store.revoke_api_key("nobody").await?);
    ensure!(
        db.store.find_api_key(&plaintext).await?.is_none(),
        "revoked key still authenticates"
    );
    ensure!(db.store.find_api_key(&other).await?.is_some());
    let listed = db.store.list_api_keys().await?;
    ensure!(listed.len() == 2);
    ensure!(listed[0].name == "team-a" && listed[0].revoked);
    ensure!(listed[1].name == "team-b" && !listed[1].revoked && listed[1].rpm_limit.is_none());
    Ok(())
}

async fn api_key_names(db: TestDb) -> Result<()> {
    db.store.create_api_key("dup", None).await?;
    match db.store.create_api_key("dup", None).await {
        Err(StoreError::KeyNameTaken(n)) => ensure!(n == "dup"),
        other => anyhow::bail!("expected KeyNameTaken, got {other:?}"),
    }
    // a revoked name can be reused
    ensure!(db.store.revoke_api_key("dup").await?);
    let (again, _) = db.store.create_api_key("dup", Some(u32::MAX)).await?;
    ensure!(again.rpm_limit == Some(u32::MAX));
    for bad in ["", "   ", "a\nb"] {
        ensure!(
            matches!(
                db.store.create_api_key(bad, None).await,
                Err(StoreError::InvalidInput(_))
            ),
            "name {bad:?} accepted"
        );
    }
    ensure!(matches!(
        db.store.create_api_key(&"x".repeat(201), None).await,
        Err(StoreError::InvalidInput(_))
    ));
    Ok(())
}

async fn writer_delivers_records(db: TestDb) -> Result<()> {
    let cfg = RecordWriterConfig {
        max_batch: 7,
        flush_interval: Duration::from_millis(20),
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    for i in 0..50 {
        ensure!(tx.try_send(full_record(&format!("w{i}"), 1, i)));
        if i % 10 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let store = db.store.clone();
    eventually(Duration::from_secs(20), "50 records written", || {
        let store = store.clone();
        let tx = tx.clone();
        async move { Ok(tx.written() == 50 && store.request_records(&all(100)).await?.len() == 50) }
    })
    .await?;
    // a lone record is written by the flush interval, without filling a batch
    ensure!(tx.try_send(full_record("lone", 1, 1000)));
    eventually(Duration::from_secs(20), "the lone record written", || {
        let store = store.clone();
        async move { Ok(store.request_records(&by_id("lone")).await?.len() == 1) }
    })
    .await?;
    ensure!(tx.dropped() == 0 && tx.write_errors() == 0 && tx.queued() == 0);
    writer.shutdown().await;
    ensure!(tx.written() == 51);
    Ok(())
}

async fn writer_counts_drops_when_full(db: TestDb) -> Result<()> {
    let cfg = RecordWriterConfig {
        capacity: 10,
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    // The test runtime is single-threaded and try_send never yields, so the writer cannot
    // drain between these sends: exactly 10 fit.
    let accepted = (0..15)
        .filter(|i| tx.try_send(full_record(&format!("d{i}"), 1, *i)))
        .count();
    ensure!(accepted == 10, "accepted {accepted}");
    ensure!(tx.dropped() == 5 && tx.queued() == 10);
    writer.shutdown().await;
    ensure!(tx.written() == 10 && tx.write_errors() == 0);
    ensure!(db.store.request_records(&all(100)).await?.len() == 10);
    // after shutdown nothing is accepted, and the refusal is counted
    ensure!(!tx.try_send(full_record("late", 1, 0)));
    ensure!(tx.dropped() == 6);
    Ok(())
}

async fn writer_shutdown_flushes(db: TestDb) -> Result<()> {
    // a flush interval far longer than the test: only shutdown can write these
    let cfg = RecordWriterConfig {
        max_batch: 1000,
        flush_interval: Duration::from_secs(3600),
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    for i in 0..300 {
        ensure!(tx.try_send(full_record(&format!("s{i}"), 1, i)));
    }
    tokio::task::yield_now().await; // let the writer take the first records into a batch
    ensure!(db.store.request_records(&all(1000)).await?.is_empty());
    writer.shutdown().await;
    ensure!(tx.written() == 300 && tx.queued() == 0);
    ensure!(db.store.request_records(&all(1000)).await?.len() == 300);
    Ok(())
}

async fn writer_counts_write_errors(db: TestDb) -> Result<()> {
    let cfg = RecordWriterConfig {
        max_batch: 4,
        max_retries: 2,
        retry_backoff: Duration::from_millis(1),
        ..RecordWriterConfig::default()
    };
    // a closed store refuses every write
    let closed = Store::connect(Some(db.url()), db.data_dir()).await?;
    closed.close().await;
    let (tx, writer) = RecordWriter::spawn(closed, cfg);
    for i in 0..10 {
        ensure!(tx.try_send(full_record(&format!("e{i}"), 1, i)));
    }
    writer.shutdown().await;
    ensure!(
        tx.write_errors() == 10,
        "write_errors = {}",
        tx.write_errors()
    );
    ensure!(tx.written() == 0 && tx.dropped() == 0);
    ensure!(db.store.request_records(&all(100)).await?.is_empty());
    Ok(())
}

async fn writer_isolates_a_refused_row(db: TestDb) -> Result<()> {
    // SQLite stores a bound NaN as NULL, which latency_ms (NOT NULL) refuses: that row,
    // and only that row, is lost (and counted). PostgreSQL stores NaN as it is.
    let cfg = RecordWriterConfig {
        max_batch: 100,
        retry_backoff: Duration::from_millis(1),
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    for i in 0..100 {
        let mut r = full_record(&format!("n{i:03}"), 1, i);
        if i == 37 {
            r.latency_ms = f64::NAN;
        }
        ensure!(tx.try_send(r));
    }
    writer.shutdown().await;
    let stored = db.store.request_records(&all(1000)).await?;
    match db.backend() {
        Backend::Sqlite => {
            ensure!(
                tx.written() == 99 && tx.write_errors() == 1,
                "written {} errors {}",
                tx.written(),
                tx.write_errors()
            );
            ensure!(stored.len() == 99 && stored.iter().all(|r| r.request_id != "n037"));
        }
        Backend::Postgres => {
            ensure!(tx.written() == 100 && tx.write_errors() == 0);
            let nan = db.store.request_records(&by_id("n037")).await?;
            ensure!(nan.len() == 1 && nan[0].latency_ms.is_nan());
        }
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
