//! samewise API keys. A key is `sw-` followed by 32 random bytes in hex, shown to the
//! operator once by [`Store::create_api_key`]; the database keeps only its SHA-256 hash and
//! its first 8 characters (for display). Lookup hashes the presented key and finds it by
//! hash, so the plaintext never touches the database, logs or errors.

use rand::TryRngCore;
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::connect::Pool;
use crate::{Store, StoreError};

/// A stored API key (never its plaintext).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Database id; request records refer to it as `key_id`.
    pub id: i64,
    /// Operator-chosen name, unique among live keys.
    pub name: String,
    /// The key's first 8 characters, to tell keys apart in listings.
    pub prefix: String,
    /// Requests per minute allowed for this key; None = no per-key limit.
    pub rpm_limit: Option<u32>,
    /// When the key was created, unix milliseconds.
    pub created_ms: i64,
    /// True once revoked; revoked keys no longer authenticate.
    pub revoked: bool,
    /// True for an admin key: it opens the dashboards and their JSON API (and still works
    /// on the gateway routes).
    pub admin: bool,
}

/// What a new key is allowed ([`Store::create_api_key_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyOptions {
    /// Requests per minute; None = no per-key limit.
    pub rpm_limit: Option<u32>,
    /// An admin key (dashboards, admin APIs).
    pub admin: bool,
}

/// What every plaintext key starts with.
pub const KEY_PREFIX: &str = "sw-";
/// Characters of the plaintext kept for display.
pub const DISPLAY_PREFIX_LEN: usize = 8;
/// Longest accepted key name.
pub const MAX_NAME_LEN: usize = 200;

const SELECT: &str =
    "SELECT id, name, prefix, rpm_limit, created_ms, revoked_ms, admin FROM api_keys";

impl Store {
    /// Creates a key named `name` and returns it with its plaintext (`sw-` + 64 hex
    /// characters), which is not stored and cannot be shown again. Fails with
    /// [`StoreError::KeyNameTaken`] when a live key already has this name.
    pub async fn create_api_key(
        &self,
        name: &str,
        rpm_limit: Option<u32>,
    ) -> Result<(ApiKey, String), StoreError> {
        let opts = KeyOptions {
            rpm_limit,
            admin: false,
        };
        self.create_api_key_with(name, opts).await
    }

    /// As [`Store::create_api_key`], with every option (an admin key, a rate limit).
    pub async fn create_api_key_with(
        &self,
        name: &str,
        opts: KeyOptions,
    ) -> Result<(ApiKey, String), StoreError> {
        let KeyOptions { rpm_limit, admin } = opts;
        validate_name(name)?;
        let mut secret = [0u8; 32];
        rand::rngs::OsRng
            .try_fill_bytes(&mut secret)
            .map_err(|e| StoreError::Random(e.to_string()))?;
        let plaintext = format!("{KEY_PREFIX}{}", hex::encode(secret));
        let hash = hash_key(&plaintext);
        let prefix: String = plaintext.chars().take(DISPLAY_PREFIX_LEN).collect();
        let created_ms = crate::now_ms();
        let rpm = rpm_limit.map(i64::from);
        const OP: &str = "creating an API key";
        let result = match &self.pool {
            Pool::Postgres(pool) => sqlx::query(
                "INSERT INTO api_keys (name, key_hash, prefix, rpm_limit, created_ms, admin) \
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
            )
            .bind(name)
            .bind(&hash)
            .bind(&prefix)
            .bind(rpm)
            .bind(created_ms)
            .bind(admin)
            .fetch_one(pool)
            .await
            .and_then(|row| row.try_get::<i64, _>(0)),
            Pool::Sqlite(pool) => sqlx::query(
                "INSERT INTO api_keys (name, key_hash, prefix, rpm_limit, created_ms, admin) \
                     VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
            )
            .bind(name)
            .bind(&hash)
            .bind(&prefix)
            .bind(rpm)
            .bind(created_ms)
            .bind(admin)
            .fetch_one(pool)
            .await
            .and_then(|row| row.try_get::<i64, _>(0)),
        };
        let id = match result {
            Ok(id) => id,
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                return Err(StoreError::KeyNameTaken(name.to_owned()));
            }
            Err(e) => return Err(StoreError::Query { op: OP, source: e }),
        };
        let key = ApiKey {
            id,
            name: name.to_owned(),
            prefix,
            rpm_limit,
            created_ms,
            revoked: false,
            admin,
        };
        Ok((key, plaintext))
    }

    /// The live key whose plaintext is `presented`, or None (unknown or revoked).
    pub async fn find_api_key(&self, presented: &str) -> Result<Option<ApiKey>, StoreError> {
        if !presented.starts_with(KEY_PREFIX) {
            return Ok(None);
        }
        let hash = hash_key(presented);
        const OP: &str = "looking up an API key";
        match &self.pool {
            Pool::Postgres(pool) => {
                let row = sqlx::query(&format!(
                    "{SELECT} WHERE key_hash = $1 AND revoked_ms IS NULL"
                ))
                .bind(&hash)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query(OP))?;
                row.as_ref().map(key_from_row).transpose()
            }
            Pool::Sqlite(pool) => {
                let row = sqlx::query(&format!(
                    "{SELECT} WHERE key_hash = ? AND revoked_ms IS NULL"
                ))
                .bind(&hash)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query(OP))?;
                row.as_ref().map(key_from_row).transpose()
            }
        }
    }

    /// Every key, live and revoked, oldest first.
    pub async fn list_api_keys(&self) -> Result<Vec<ApiKey>, StoreError> {
        const OP: &str = "listing API keys";
        let sql = format!("{SELECT} ORDER BY id");
        match &self.pool {
            Pool::Postgres(pool) => {
                let rows = sqlx::query(&sql)
                    .fetch_all(pool)
                    .await
                    .map_err(StoreError::query(OP))?;
                rows.iter().map(key_from_row).collect()
            }
            Pool::Sqlite(pool) => {
                let rows = sqlx::query(&sql)
                    .fetch_all(pool)
                    .await
                    .map_err(StoreError::query(OP))?;
                rows.iter().map(key_from_row).collect()
            }
        }
    }

    /// Revokes the live key named `name`; false when there is none.
    pub async fn revoke_api_key(&self, name: &str) -> Result<bool, StoreError> {
        const OP: &str = "revoking an API key";
        let now = crate::now_ms();
        let n = match &self.pool {
            Pool::Postgres(pool) => sqlx::query(
                "UPDATE api_keys SET revoked_ms = $1 WHERE name = $2 AND revoked_ms IS NULL",
            )
            .bind(now)
            .bind(name)
            .execute(pool)
            .await
            .map_err(StoreError::query(OP))?
            .rows_affected(),
            Pool::Sqlite(pool) => sqlx::query(
                "UPDATE api_keys SET revoked_ms = ? WHERE name = ? AND revoked_ms IS NULL",
            )
            .bind(now)
            .bind(name)
            .execute(pool)
            .await
            .map_err(StoreError::query(OP))?
            .rows_affected(),
        };
        Ok(n > 0)
    }
}

/// SHA-256 of the key's text, lowercase hex: what the database stores.
pub fn hash_key(plaintext: &str) -> String {
    hex::encode(key_digest(plaintext))
}

/// SHA-256 of the key's text, as bytes: [`hash_key`] before its hex (what an in-memory cache
/// of lookups can be keyed by without spelling it out per request).
pub fn key_digest(plaintext: &str) -> [u8; 32] {
    Sha256::digest(plaintext.as_bytes()).into()
}

fn validate_name(name: &str) -> Result<(), StoreError> {
    if name.trim().is_empty() {
        return Err(StoreError::InvalidInput(
            "an API key name must not be empty".to_owned(),
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(StoreError::InvalidInput(format!(
            "an API key name must be at most {MAX_NAME_LEN} bytes"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(StoreError::InvalidInput(
            "an API key name must not contain control characters".to_owned(),
        ));
    }
    Ok(())
}

fn key_from_row<R>(row: &R) -> Result<ApiKey, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding an API key";
    let rpm: Option<i64> = row.try_get(3).map_err(StoreError::query(OP))?;
    let rpm_limit = rpm
        .map(|v| {
            u32::try_from(v).map_err(|_| StoreError::Corrupt {
                column: "rpm_limit",
                detail: format!("{v} is not a u32"),
            })
        })
        .transpose()?;
    let revoked_ms: Option<i64> = row.try_get(5).map_err(StoreError::query(OP))?;
    Ok(ApiKey {
        id: row.try_get(0).map_err(StoreError::query(OP))?,
        name: row.try_get(1).map_err(StoreError::query(OP))?,
        prefix: row.try_get(2).map_err(StoreError::query(OP))?,
        rpm_limit,
        created_ms: row.try_get(4).map_err(StoreError::query(OP))?,
        revoked: revoked_ms.is_some(),
        admin: row.try_get(6).map_err(StoreError::query(OP))?,
    })
}
