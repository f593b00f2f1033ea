//! API keys: create, find by plaintext, wrong keys, revoke, names; only the hash is stored.

use super::*;
use anyhow::Context;

both!(api_key_lifecycle, api_key_names);

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
