//! API keys: create, find by plaintext, wrong keys, revoke, names; only the hash is stored;
//! each key's usage: its whole hours from `key_hours` (upserted with the records, filled from
//! stored records by the migration, kept after the records are deleted), the partial hour at
//! the window's start from the records.

use super::*;
use anyhow::Context;

both!(
    api_key_lifecycle,
    api_key_names,
    usage_by_key,
    usage_over_hours_reads_whole_hours_and_the_partial_one,
    key_hours_are_filled_from_stored_records_when_migrated,
);

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
    ensure!(stored.contains(&samewise_store::hash_key(&other)));
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

/// A served attempt of key `key` (`final_attempt` as given), 10 prompt and 5 completion
/// tokens, a cent.
fn served(id: &str, attempt: u32, last: bool, key: i64, ts_ms: i64) -> RequestRecord {
    RequestRecord {
        final_attempt: last,
        key_id: Some(key),
        status: Some(200),
        error_kind: None,
        prompt_tokens: Some(10),
        completion_tokens: Some(5),
        cost_usd: Some(0.01),
        ..full_record(id, attempt, ts_ms)
    }
}

async fn usage_by_key(db: TestDb) -> Result<()> {
    let t = 1_700_000_000_000;
    let mut failed_over = served("r2", 1, false, 1, t + 2);
    (failed_over.status, failed_over.error_kind) = (Some(503), Some("upstream_5xx".into()));
    (failed_over.prompt_tokens, failed_over.completion_tokens) = (None, None);
    failed_over.cost_usd = None;
    let mut cut = served("r3", 1, true, 1, t + 3);
    cut.error_kind = Some("degenerate".into());
    let mut limited = bare_record("r4", t + 4);
    (limited.key_id, limited.status) = (Some(1), Some(429));
    let rows = vec![
        served("r0", 1, true, 1, t - 1), // before the window
        served("r1", 1, true, 1, t),
        failed_over,
        served("r2", 2, true, 1, t + 2),
        cut,
        limited,
        served("r5", 1, true, 2, t + 5),
        bare_record("r6", t + 6), // no key: refused before auth
    ];
    db.store.insert_request_records(&rows).await?;
    let got = db.store.key_usage(t).await?;
    let want = vec![
        KeyUsage {
            key_id: 1,
            requests: 4,
            failed: 2,
            attempts: 4,
            prompt_tokens: 30,
            completion_tokens: 15,
            cost_usd: 0.03,
            last_ms: t + 4,
        },
        KeyUsage {
            key_id: 2,
            requests: 1,
            failed: 0,
            attempts: 1,
            prompt_tokens: 10,
            completion_tokens: 5,
            cost_usd: 0.01,
            last_ms: t + 5,
        },
    ];
    ensure!(same_usage(&got, &want), "got {got:#?}\nwant {want:#?}");
    ensure!(db.store.key_usage(t + 7).await?.is_empty());
    Ok(())
}

/// Equal usage lists, the costs within rounding (summed in another order).
fn same_usage(a: &[KeyUsage], b: &[KeyUsage]) -> bool {
    let cost_free = |u: &KeyUsage| KeyUsage {
        cost_usd: 0.0,
        ..u.clone()
    };
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(a, b)| (a.cost_usd - b.cost_usd).abs() < 1e-9 && cost_free(a) == cost_free(b))
}

/// 240 records of three keys (and some without one) over about six and a half hours, in mixed
/// shapes: final and failed-over attempts, refusals, errors, with and without usage.
fn hours_of_records(t0: i64) -> Vec<RequestRecord> {
    (0..240i64)
        .map(|i| {
            let mut r = served(
                &format!("h{i}"),
                if i % 4 == 0 { 2 } else { 1 },
                i % 5 != 0,
                1 + i % 3,
                t0 + i * 97_000,
            );
            if i % 7 == 0 {
                r.key_id = None;
            }
            if i % 6 == 0 {
                (r.status, r.error_kind) = (Some(502), Some("upstream_5xx".into()));
            }
            if i % 11 == 0 {
                (r.prompt_tokens, r.completion_tokens, r.cost_usd) = (None, None, None);
            } else {
                r.prompt_tokens = Some(i);
                r.cost_usd = Some(i as f64 * 0.001);
            }
            if i % 13 == 0 {
                (r.attempt, r.status) = (0, Some(429));
            }
            r
        })
        .collect()
}

/// Usage since `since_ms` summed straight from `rows`, by key id.
fn usage_of(rows: &[RequestRecord], since_ms: i64) -> Vec<KeyUsage> {
    let mut by_key = std::collections::BTreeMap::<i64, KeyUsage>::new();
    for r in rows.iter().filter(|r| r.ts_ms >= since_ms) {
        let Some(key) = r.key_id else { continue };
        let u = by_key.entry(key).or_insert_with(|| KeyUsage {
            key_id: key,
            ..KeyUsage::default()
        });
        if r.final_attempt {
            u.requests += 1;
            if r.error_kind.is_some() || r.status.is_none_or(|s| s >= 400) {
                u.failed += 1;
            }
        }
        u.attempts += i64::from(r.attempt > 0);
        u.prompt_tokens += r.prompt_tokens.unwrap_or(0);
        u.completion_tokens += r.completion_tokens.unwrap_or(0);
        u.cost_usd += r.cost_usd.unwrap_or(0.0);
        u.last_ms = u.last_ms.max(r.ts_ms);
    }
    by_key.into_values().collect()
}

/// Windows starting on an hour, inside one, and past the last record read what the records
/// say; a batch stored twice counts once; the whole hours outlive the records' deletion and go
/// with the rollups'.
async fn usage_over_hours_reads_whole_hours_and_the_partial_one(db: TestDb) -> Result<()> {
    use samewise_store::{DAY_MS, HOUR_MS};
    let t0 = 20_000 * DAY_MS;
    let rows = hours_of_records(t0);
    for batch in rows.chunks(80) {
        db.store.insert_request_records(batch).await?;
    }
    db.store.insert_request_records(&rows[80..160]).await?; // again: skipped
    for since in [
        t0,
        t0 + 1,
        t0 + 90 * 60_000,
        t0 + 3 * HOUR_MS + 17_000,
        t0 + 6 * HOUR_MS,
        t0 + 7 * HOUR_MS,
    ] {
        let (got, want) = (db.store.key_usage(since).await?, usage_of(&rows, since));
        ensure!(
            same_usage(&got, &want),
            "since t0 + {} ms:\n got {got:#?}\nwant {want:#?}",
            since - t0
        );
    }
    ensure!(db.store.key_usage(t0 + 7 * HOUR_MS).await?.is_empty());
    // the records before t0 + 4 h deleted: a window from t0 + 3 h reads whole hours only
    let before = db.store.key_usage(t0 + 3 * HOUR_MS).await?;
    ensure!(!before.is_empty());
    db.store
        .delete_request_records_before(t0 + 4 * HOUR_MS)
        .await?;
    ensure!(same_usage(
        &db.store.key_usage(t0 + 3 * HOUR_MS).await?,
        &before
    ));
    // the rollups' retention takes the hours with it
    db.store.delete_rollups_before(t0 + DAY_MS).await?;
    ensure!(db.store.key_usage(t0).await?.is_empty());
    Ok(())
}

/// A database migrated to version 8 with records already stored gets their hours: migration 8
/// undone behind the store's back (its table dropped, its version forgotten), then run again by
/// a new connection, gives the same usage.
async fn key_hours_are_filled_from_stored_records_when_migrated(db: TestDb) -> Result<()> {
    use samewise_store::DAY_MS;
    let t0 = 20_000 * DAY_MS;
    let rows = hours_of_records(t0);
    db.store.insert_request_records(&rows).await?;
    let want = usage_of(&rows, t0);
    ensure!(same_usage(&db.store.key_usage(t0).await?, &want));
    const UNDO: [&str; 2] = [
        "DROP TABLE key_hours",
        "DELETE FROM schema_migrations WHERE version = 8",
    ];
    behind_the_back(&db, &UNDO).await?;
    let again = Store::connect(Some(db.url()), db.data_dir()).await?;
    let latest = samewise_store::POSTGRES_MIGRATIONS
        .iter()
        .map(|m| m.version)
        .max();
    ensure!(Some(again.schema_version().await?) == latest);
    let got = again.key_usage(t0).await?;
    ensure!(same_usage(&got, &want), "got {got:#?}\nwant {want:#?}");
    again.close().await;
    Ok(())
}
