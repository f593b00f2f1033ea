//! samewise API keys. A key is `sw-` followed by 32 random bytes in hex, shown to the
//! operator once by [`Store::create_api_key`]; the database keeps only its SHA-256 hash and
//! its first 8 characters (for display). Lookup hashes the presented key and finds it by
//! hash, so the plaintext never touches the database, logs or errors.

use rand::TryRngCore;
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::connect::Pool;
use crate::probe_runs::{on_pool, sql};
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

/// What one key's requests used over a time window ([`Store::key_usage`]), from the request
/// records.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyUsage {
    /// The key's id ([`ApiKey::id`]).
    pub key_id: i64,
    /// Client requests: each request's final attempt, or its refusal (rate limited, bad input).
    pub requests: i64,
    /// Of those, the ones that ended in an error (the client's answer an error status, or a
    /// stream cut by one).
    pub failed: i64,
    /// Upstream attempts, failovers and hedges included.
    pub attempts: i64,
    /// Prompt tokens over every attempt (what the providers were paid for).
    pub prompt_tokens: i64,
    /// Completion tokens over every attempt.
    pub completion_tokens: i64,
    /// Cost from the configured prices over every attempt, US dollars.
    pub cost_usd: f64,
    /// When its last request in the window came, unix milliseconds.
    pub last_ms: i64,
}

impl KeyUsage {
    /// Counts one stored record of this key (as `key_hours` sums them, and as the window's
    /// partial hour is summed from the records in SQL).
    pub(crate) fn add(&mut self, r: &crate::RequestRecord) {
        if r.final_attempt {
            self.requests += 1;
            if r.error_kind.is_some() || r.status.is_none_or(|s| s >= 400) {
                self.failed += 1;
            }
        }
        if r.attempt > 0 {
            self.attempts += 1;
        }
        self.prompt_tokens = self
            .prompt_tokens
            .saturating_add(r.prompt_tokens.unwrap_or(0));
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(r.completion_tokens.unwrap_or(0));
        self.cost_usd += r.cost_usd.unwrap_or(0.0);
        self.last_ms = self.last_ms.max(r.ts_ms);
    }
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

    /// What each key's requests used since `since_ms` (records at or after it), by key id;
    /// keys without a request there are left out. The whole hours of the window are read from
    /// `key_hours` (per key and UTC hour, upserted with the records and kept as long as the
    /// rollups), and only the records of the partial hour at its start from `request_records`,
    /// so a window of any length reads at most an hour of records.
    pub async fn key_usage(&self, since_ms: i64) -> Result<Vec<KeyUsage>, StoreError> {
        const OP: &str = "summing usage by key";
        let hour = crate::rollups::HOUR_MS;
        // the first whole hour of the window
        let whole_from = since_ms.div_euclid(hour) * hour
            + if since_ms.rem_euclid(hour) == 0 {
                0
            } else {
                hour
            };
        let stmt = sql(
            self.backend(),
            "SELECT key_id, CAST(SUM(requests) AS BIGINT), CAST(SUM(failed) AS BIGINT), \
             CAST(SUM(attempts) AS BIGINT), CAST(SUM(prompt_tokens) AS BIGINT), \
             CAST(SUM(completion_tokens) AS BIGINT), CAST(SUM(cost_usd) AS DOUBLE PRECISION), \
             MAX(last_ms) FROM (\
             SELECT key_id, requests, failed, attempts, prompt_tokens, completion_tokens, \
             cost_usd, last_ms FROM key_hours WHERE hour_ms >= $2 \
             UNION ALL \
             SELECT key_id, CASE WHEN final_attempt THEN 1 ELSE 0 END, \
             CASE WHEN final_attempt AND (error_kind IS NOT NULL OR status IS NULL \
                 OR status >= 400) THEN 1 ELSE 0 END, \
             CASE WHEN attempt > 0 THEN 1 ELSE 0 END, \
             COALESCE(prompt_tokens, 0), COALESCE(completion_tokens, 0), \
             COALESCE(cost_usd, 0), ts_ms \
             FROM request_records WHERE ts_ms >= $1 AND ts_ms < $2 AND key_id IS NOT NULL\
             ) AS used GROUP BY key_id ORDER BY key_id",
        )
        .into_owned();
        type Row = (i64, i64, i64, i64, i64, i64, f64, i64);
        let rows: Vec<Row> = on_pool!(&self.pool, |p| {
            sqlx::query_as(&stmt)
                .bind(since_ms)
                .bind(whole_from)
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?
        });
        Ok(rows
            .into_iter()
            .map(|r| KeyUsage {
                key_id: r.0,
                requests: r.1,
                failed: r.2,
                attempts: r.3,
                prompt_tokens: r.4,
                completion_tokens: r.5,
                cost_usd: r.6,
                last_ms: r.7,
            })
            .collect())
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
