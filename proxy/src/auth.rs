//! samewise API keys on the request path: `Authorization: Bearer <key>` is looked up in the
//! store through a short-lived in-memory cache (keyed by the key's SHA-256, never the
//! plaintext), and each key's requests-per-minute limit is enforced with a token bucket.
//!
//! Revocation is bounded: a cached lookup (positive or negative) is reused for at most
//! `limits.key_cache_ttl` (default 10 s), so a key revoked in the database stops working within
//! that time on every proxy.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use samewise_store::{ApiKey, Store};
use tokio::time::Instant;

use crate::error::ApiError;

/// Most cached lookups; the cache is cleared when full (a flood of random keys cannot grow it).
const MAX_CACHED: usize = 50_000;

/// Authenticates requests and applies per-key rate limits.
#[derive(Debug)]
pub struct Authenticator {
    store: Store,
    ttl: Duration,
    /// key hash -> (lookup result, when it was fetched)
    cache: Mutex<HashMap<String, (Option<ApiKey>, Instant)>>,
    /// key id -> bucket
    buckets: Mutex<HashMap<i64, Bucket>>,
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
    /// An authenticator over `store` whose lookups live `ttl`.
    pub fn new(store: Store, ttl: Duration) -> Self {
        Authenticator {
            store,
            ttl,
            cache: Mutex::new(HashMap::new()),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// The key a request presents, checked and charged against its rate limit.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<ApiKey, ApiError> {
        let key = self.identify(headers).await?;
        self.charge(&key)?;
        Ok(key)
    }

    /// The valid key a request presents (401 otherwise).
    pub async fn identify(&self, headers: &HeaderMap) -> Result<ApiKey, ApiError> {
        let presented = bearer(headers).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "authentication_error",
                "missing API key: send `Authorization: Bearer <samewise key>`",
            )
        })?;
        self.lookup(presented).await?.ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "authentication_error",
                "invalid API key",
            )
        })
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
        verdict.map_err(|wait| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "rate_limit_error",
                format!("rate limit of {rpm} requests per minute reached for this key"),
            )
            .with_retry_after(wait)
        })
    }

    async fn lookup(&self, presented: &str) -> Result<Option<ApiKey>, ApiError> {
        let hash = samewise_store::keys::hash_key(presented);
        let now = Instant::now();
        if let Ok(cache) = self.cache.lock()
            && let Some((hit, at)) = cache.get(&hash)
            && now.saturating_duration_since(*at) < self.ttl
        {
            return Ok(hit.clone());
        }
        let found = self.store.find_api_key(presented).await.map_err(|e| {
            tracing::error!(error = %e, "API key lookup failed");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "server_error",
                "the key store is unavailable; try again",
            )
            .with_retry_after(1)
        })?;
        let found = found.filter(|k| !k.revoked);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
            cache.insert(hash, (found.clone(), now));
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
