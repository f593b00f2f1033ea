//! API keys: create, find by plaintext, wrong keys, revoke, names; only the hash is stored;
//! each key's usage summed from the request records.

use super::*;
use anyhow::Context;

both!(api_key_lifecycle, api_key_names, usage_by_key);

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
    let close = |a: &KeyUsage, b: &KeyUsage| {
        (a.cost_usd - b.cost_usd).abs() < 1e-12
            && KeyUsage {
                cost_usd: 0.0,
                ..a.clone()
            } == KeyUsage {
                cost_usd: 0.0,
                ..b.clone()
            }
    };
    ensure!(
        got.len() == 2 && got.iter().zip(&want).all(|(a, b)| close(a, b)),
        "got {got:#?}\nwant {want:#?}"
    );
    ensure!(db.store.key_usage(t + 7).await?.is_empty());
    Ok(())
}
