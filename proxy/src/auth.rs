//! samewise API keys on the request path: `Authorization: Bearer <key>` is looked up in the
//! store through an in-memory cache (keyed by the key's SHA-256 digest, never the plaintext;
//! a hit hands out the cached row behind an `Arc`, copying nothing), and
//! each key's requests-per-minute limit is enforced with a token bucket.
//!
//! The cache holds valid keys and invalid ones apart, each a bounded LRU: valid keys up to
//! [`KeyCacheConfig::max_valid`], unknown or revoked ones up to the smaller
//! [`KeyCacheConfig::max_invalid`]. A flood of random keys only evicts other random keys, never
//! a valid one, so it cannot send every client's lookups to the database.
//!
//! Revocation is bounded: a cached lookup is trusted for `limits.key_cache_ttl` (default 10 s),
//! so a key revoked in the database stops working within that time on every proxy.
//!
//! The database going away must not take valid clients with it: when the refresh of an expired
//! valid key fails (an error, or no answer within [`LOOKUP_TIMEOUT`]), the key keeps working on
//! its cached entry for up to `limits.key_stale_grace` past its TTL, and only one request per
//! key per [`LOOKUP_TIMEOUT`] asks the database again. A key the cache has never seen cannot be
//! checked then: it gets an OpenAI-shaped 503 (`store_unavailable`, with `Retry-After`).
//!
//! A lookup runs on the runtime that built the authenticator (the process's main one), not on
//! the serving thread that asks: a database connection the pool opens for it is then driven by
//! the runtime that outlives every serving thread.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, header};
use hashlink::LruCache;
use samewise_store::{ApiKey, Store};
use tokio::time::Instant;

use crate::error::ApiError;

/// Longest wait for the database on one key lookup; past it the lookup counts as failed (a
/// stopped database must not hold requests for the pool's whole acquire timeout).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Bounds and times of the key cache.
#[derive(Debug, Clone, Copy)]
pub struct KeyCacheConfig {
    /// How long a lookup is trusted (`limits.key_cache_ttl_ms`).
    pub ttl: Duration,
    /// How long past its TTL a valid key keeps working while the database cannot be asked
    /// (`limits.key_stale_grace_ms`).
    pub stale_grace: Duration,
    /// Most valid keys cached.
    pub max_valid: usize,
    /// Most unknown or revoked keys cached (apart from the valid ones).
    pub max_invalid: usize,
}

impl KeyCacheConfig {
    /// The default bounds (50k valid keys, 10k invalid ones) with these times.
    pub fn new(ttl: Duration, stale_grace: Duration) -> Self {
        KeyCacheConfig {
            ttl,
            stale_grace,
            max_valid: 50_000,
            max_invalid: 10_000,
        }
    }
}

/// Authenticates requests and applies per-key rate limits.
#[derive(Debug)]
pub struct Authenticator {
    store: Store,
    /// The runtime lookups run on (the one current at construction, if any).
    home: Option<tokio::runtime::Handle>,
    cfg: KeyCacheConfig,
    /// The two LRUs of lookups, by key hash.
    cache: Mutex<KeyCache>,
    /// key id -> bucket
    buckets: Mutex<std::collections::HashMap<i64, Bucket>>,
}

/// Valid and invalid lookups, kept apart so that one kind cannot evict the other.
struct KeyCache {
    /// key digest -> the valid key and when the store last confirmed it.
    valid: LruCache<Digest, ValidEntry>,
    /// key digest -> when the store last said the key is unknown or revoked.
    invalid: LruCache<Digest, Instant>,
}

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCache")
            .field("valid", &self.valid.len())
            .field("invalid", &self.invalid.len())
            .finish()
    }
}

/// A key's SHA-256 ([`samewise_store::key_digest`]).
type Digest = [u8; 32];

/// One cached valid key.
struct ValidEntry {
    /// The key row (no secret: the hash only).
    key: Arc<ApiKey>,
    /// When the store last confirmed it.
    confirmed: Instant,
    /// No request asks the store about this key again before this instant (one refresh at a
    /// time; after a failed one, a pause).
    next_ask: Instant,
}

/// What the cache says about a key.
enum Cached {
    /// Trust this answer.
    Answer(Option<Arc<ApiKey>>),
    /// Ask the store; on failure, fall back to this stale key if any.
    Ask(Option<Arc<ApiKey>>),
}

/// A token bucket holding up to `rpm` requests, refilled at `rpm` per minute.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    stamp: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn full(rpm: u32, now: Instant) -> Self {
        Bucket {
            tokens: f64::from(rpm),
            stamp: now,
        }
    }

    /// Takes one request; Err(seconds to wait) when empty.
    pub fn take(&mut self, rpm: u32, now: Instant) -> Result<(), u64> {
        let rate = f64::from(rpm) / 60.0;
        let elapsed = now.saturating_duration_since(self.stamp).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(rpm));
        self.stamp = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else if rate <= 0.0 {
            Err(60)
        } else {
            Err(((1.0 - self.tokens) / rate).ceil().max(1.0) as u64)
        }
    }
}

impl Authenticator {
    /// An authenticator over `store` with the cache's bounds and times.
    pub fn new(store: Store, cfg: KeyCacheConfig) -> Self {
        Authenticator {
            store,
            home: tokio::runtime::Handle::try_current().ok(),
            cfg,
            cache: Mutex::new(KeyCache {
                valid: LruCache::new(cfg.max_valid.max(1)),
                invalid: LruCache::new(cfg.max_invalid.max(1)),
            }),
            buckets: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The key a request presents, checked and charged against its rate limit.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<ApiKey>, ApiError> {
        let key = self.identify(headers).await?;
        self.charge(&key)?;
        Ok(key)
    }

    /// The valid key a request presents (401 otherwise; 503 when it cannot be checked).
    pub async fn identify(&self, headers: &HeaderMap) -> Result<Arc<ApiKey>, ApiError> {
        let presented = bearer(headers).ok_or(ApiError::MissingApiKey)?;
        self.lookup(presented).await?.ok_or(ApiError::InvalidApiKey)
    }

    /// Charges one request to `key`'s per-minute limit (429 with Retry-After when spent).
    pub fn charge(&self, key: &ApiKey) -> Result<(), ApiError> {
        let Some(rpm) = key.rpm_limit else {
            return Ok(());
        };
        let now = Instant::now();
        let verdict = match self.buckets.lock() {
            Ok(mut b) => b
                .entry(key.id)
                .or_insert_with(|| Bucket::full(rpm, now))
                .take(rpm, now),
            Err(_) => Ok(()),
        };
        verdict.map_err(|wait| ApiError::KeyRateLimited {
            rpm,
            retry_after: wait,
        })
    }

    /// What the cache says about `hash` at `now`; claims the refresh of an expired valid key.
    fn cached(&self, hash: &Digest, now: Instant) -> Cached {
        let Ok(mut cache) = self.cache.lock() else {
            return Cached::Ask(None);
        };
        let (ttl, grace) = (self.cfg.ttl, self.cfg.stale_grace);
        if let Some(e) = cache.valid.get_mut(hash) {
            let age = now.saturating_duration_since(e.confirmed);
            if age < ttl {
                return Cached::Answer(Some(Arc::clone(&e.key)));
            }
            if age < ttl.saturating_add(grace) {
                if now < e.next_ask {
                    // another request is asking the store, or the last ask failed just now
                    return Cached::Answer(Some(Arc::clone(&e.key)));
                }
                e.next_ask = now + LOOKUP_TIMEOUT;
                return Cached::Ask(Some(Arc::clone(&e.key)));
            }
            return Cached::Ask(None);
        }
        match cache.invalid.get(hash) {
            Some(at) if now.saturating_duration_since(*at) < ttl => Cached::Answer(None),
            _ => Cached::Ask(None),
        }
    }

    /// The store's answer for `presented`, asked on the home runtime.
    async fn find(&self, presented: &str) -> Result<Option<ApiKey>, String> {
        let Some(home) = &self.home else {
            return self
                .store
                .find_api_key(presented)
                .await
                .map_err(|e| e.to_string());
        };
        let store = self.store.clone();
        let presented = presented.to_owned();
        match home
            .spawn(async move { store.find_api_key(&presented).await })
            .await
        {
            Ok(found) => found.map_err(|e| e.to_string()),
            Err(e) => Err(format!("the lookup task ended: {e}")),
        }
    }

    async fn lookup(&self, presented: &str) -> Result<Option<Arc<ApiKey>>, ApiError> {
        let hash = samewise_store::key_digest(presented);
        let stale = match self.cached(&hash, Instant::now()) {
            Cached::Answer(found) => return Ok(found),
            Cached::Ask(stale) => stale,
        };
        let asked = tokio::time::timeout(LOOKUP_TIMEOUT, self.find(presented)).await;
        let now = Instant::now();
        let found = match asked {
            Ok(Ok(found)) => found.filter(|k| !k.revoked).map(Arc::new),
            failed => {
                match &failed {
                    Ok(Err(e)) => tracing::error!(error = %e, "API key lookup failed"),
                    _ => tracing::error!(timeout = ?LOOKUP_TIMEOUT, "API key lookup timed out"),
                }
                if let Some(key) = stale {
                    // valid before the store went away: keep serving it, within the grace
                    if let Ok(mut cache) = self.cache.lock()
                        && let Some(e) = cache.valid.peek_mut(&hash)
                    {
                        e.next_ask = now + LOOKUP_TIMEOUT;
                    }
                    return Ok(Some(key));
                }
                return Err(ApiError::KeyStoreUnavailable);
            }
        };
        if let Ok(mut cache) = self.cache.lock() {
            match &found {
                Some(key) => {
                    cache.invalid.remove(&hash);
                    cache.valid.insert(
                        hash,
                        ValidEntry {
                            key: Arc::clone(key),
                            confirmed: now,
                            next_ask: now,
                        },
                    );
                }
                None => {
                    cache.valid.remove(&hash);
                    cache.invalid.insert(hash, now);
                }
            }
        }
        Ok(found)
    }
}

/// The bearer token of `Authorization`, if well-formed.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_rpm_then_refills() {
        let mut b = Bucket::full(3, Instant::now());
        for _ in 0..3 {
            assert_eq!(b.take(3, Instant::now()), Ok(()));
        }
        assert_eq!(b.take(3, Instant::now()), Err(20));
        tokio::time::advance(Duration::from_secs(19)).await;
        assert!(b.take(3, Instant::now()).is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(b.take(3, Instant::now()), Ok(()));
    }

    fn presenting(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!("Bearer {key}")) {
            h.insert(header::AUTHORIZATION, v);
        }
        h
    }

    #[tokio::test]
    async fn a_flood_of_invalid_keys_does_not_evict_a_valid_one() {
        let db = samewise_store::testing::TestDb::new(samewise_store::Backend::Sqlite)
            .await
            .unwrap();
        let (_, key) = db.store.create_api_key("t", None).await.unwrap();
        let auth = Authenticator::new(
            db.store.clone(),
            KeyCacheConfig::new(Duration::from_secs(600), Duration::from_secs(60)),
        );
        assert!(auth.identify(&presenting(&key)).await.is_ok());
        // 60k distinct invalid keys (an attacker's random keys)
        for i in 0..60_000 {
            let e = auth.identify(&presenting(&format!("junk-{i}"))).await;
            assert_eq!(
                e.map_err(|e| e.status_code()),
                Err(StatusCode::UNAUTHORIZED)
            );
        }
        // the database goes away: the valid key, still within its TTL, is served from the cache
        db.store.close().await;
        let again = auth.identify(&presenting(&key)).await;
        assert!(
            again.is_ok(),
            "the valid key was flushed: {:?}",
            again.err()
        );
    }

    #[tokio::test]
    async fn a_valid_key_outlives_a_store_outage_and_unknown_keys_get_503() {
        let db = samewise_store::testing::TestDb::new(samewise_store::Backend::Sqlite)
            .await
            .unwrap();
        let (_, key) = db.store.create_api_key("t", None).await.unwrap();
        let auth = Authenticator::new(
            db.store.clone(),
            KeyCacheConfig::new(Duration::from_secs(10), Duration::from_secs(60)),
        );
        assert!(auth.identify(&presenting(&key)).await.is_ok());
        // (a store with a closed pool answers every query with an error, at once)
        db.store.close().await;
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(11)).await;
        // past its TTL, with the store away: the key that was valid keeps working
        let got = auth.identify(&presenting(&key)).await;
        assert!(got.is_ok(), "{:?}", got.err());
        assert!(auth.identify(&presenting(&key)).await.is_ok());
        // a key never seen cannot be checked: a clear 503, not a 401
        let unknown = auth
            .identify(&presenting("sw-0123456789abcdef"))
            .await
            .err()
            .unwrap();
        assert_eq!(unknown.status_code(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(unknown, ApiError::KeyStoreUnavailable);
        let body = axum::response::IntoResponse::into_response(unknown);
        assert_eq!(body.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.headers().contains_key(header::RETRY_AFTER));
        // the grace is bounded: an hour later, the stale key is refused too
        tokio::time::advance(Duration::from_secs(3600)).await;
        let late = auth.identify(&presenting(&key)).await.err().unwrap();
        assert_eq!(late.status_code(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn each_kind_of_entry_has_its_own_bound() {
        let db = samewise_store::testing::TestDb::new(samewise_store::Backend::Sqlite)
            .await
            .unwrap();
        let mut keys = Vec::new();
        for i in 0..3 {
            keys.push(
                db.store
                    .create_api_key(&format!("k{i}"), None)
                    .await
                    .unwrap()
                    .1,
            );
        }
        let cfg = KeyCacheConfig {
            max_valid: 2,
            max_invalid: 3,
            ..KeyCacheConfig::new(Duration::from_secs(600), Duration::from_secs(60))
        };
        let auth = Authenticator::new(db.store.clone(), cfg);
        // k0, k1 cached; k0 used again; k2 evicts the least recently used: k1 (not k0, the
        // oldest inserted)
        for k in [&keys[0], &keys[1], &keys[0], &keys[2]] {
            assert!(auth.identify(&presenting(k)).await.is_ok());
        }
        for i in 0..10 {
            assert!(
                auth.identify(&presenting(&format!("sw-bad-{i}")))
                    .await
                    .is_err()
            );
        }
        let (valid, invalid) = {
            let c = auth.cache.lock().unwrap();
            (c.valid.len(), c.invalid.len())
        };
        assert_eq!((valid, invalid), (2, 3));
        db.store.close().await;
        assert!(auth.identify(&presenting(&keys[0])).await.is_ok());
        assert!(auth.identify(&presenting(&keys[2])).await.is_ok());
        let evicted = auth.identify(&presenting(&keys[1])).await.err().unwrap();
        assert_eq!(evicted.status_code(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            axum::http::HeaderValue::from_static("Bearer sw-abc"),
        );
        assert_eq!(bearer(&h), Some("sw-abc"));
        h.insert(
            header::AUTHORIZATION,
            axum::http::HeaderValue::from_static("Basic xyz"),
        );
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            axum::http::HeaderValue::from_static("Bearer "),
        );
        assert_eq!(bearer(&h), None);
    }
}
