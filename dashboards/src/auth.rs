//! Who may see the dashboards: an admin key presented as `Authorization: Bearer sw-...`, or
//! the session cookie (`samewise_session`, HttpOnly, SameSite=Strict, Path=/) that logging in
//! with an admin key sets. A non-admin key gets 403 on every route; no credentials get 401
//! (pages redirect to the login form instead).
//!
//! Sessions live in memory (a restart logs everyone out) and hold the key's id, an expiry
//! and a CSRF token; the token is embedded in every form and checked on every POST made
//! under a session (a Bearer-authenticated POST carries no ambient credential and needs
//! none). Session and CSRF tokens are 32 random bytes; the cookie holds only the session
//! token, never the key.
//!
//! [`security_headers`] sets the Content-Security-Policy (`default-src 'self'`) and the
//! other hardening headers on every response of the dashboards' router.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use rand::TryRngCore;

use crate::{DashError, Dashboards};

/// The session cookie's name.
pub const COOKIE: &str = "samewise_session";

/// The Content-Security-Policy of every dashboard response.
pub const CSP: &str = "default-src 'self'; img-src 'self' data:; base-uri 'none'; \
                       form-action 'self'; frame-ancestors 'none'; object-src 'none'";

/// Most sessions kept at once; the oldest-expiring are dropped beyond this.
const MAX_SESSIONS: usize = 10_000;

/// A logged-in admin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The admin key's id.
    pub key_id: i64,
    /// The CSRF token forms must carry.
    pub csrf: String,
    /// When the session ends, unix milliseconds.
    pub expires_ms: i64,
}

/// The live sessions, by session token.
#[derive(Debug)]
pub struct Sessions {
    ttl_ms: i64,
    map: Mutex<HashMap<String, Session>>,
}

/// The caller of a route, once authenticated as an admin.
#[derive(Debug, Clone)]
pub struct Admin {
    /// The session it came with; None for a Bearer key.
    pub session: Option<Session>,
}

/// A random 32-byte token, hex.
pub fn token() -> Result<String, DashError> {
    let mut b = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut b)
        .map_err(|_| DashError::BadRequest("no randomness available".to_owned()))?;
    Ok(hex::encode(b))
}

impl Sessions {
    /// No sessions; each new one lasts `ttl_ms`.
    pub fn new(ttl_ms: i64) -> Sessions {
        Sessions {
            ttl_ms,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// Starts a session for `key_id`; returns its token and the session.
    pub fn start(&self, key_id: i64) -> Result<(String, Session), DashError> {
        let now = samewise_store::now_ms();
        let s = Session {
            key_id,
            csrf: token()?,
            expires_ms: now.saturating_add(self.ttl_ms),
        };
        let t = token()?;
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, v| v.expires_ms > now);
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, v)| v.expires_ms)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(t.clone(), s.clone());
        Ok((t, s))
    }

    /// The live session of `token`.
    pub fn get(&self, token: &str) -> Option<Session> {
        let now = samewise_store::now_ms();
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(token).filter(|s| s.expires_ms > now).cloned()
    }

    /// Ends the session of `token`.
    pub fn end(&self, token: &str) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(token);
    }
}

/// The value of cookie `name` in `headers`.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The Bearer token of `headers`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// Authenticates `headers`: a Bearer admin key, else a live session cookie.
pub async fn authenticate(state: &Dashboards, headers: &HeaderMap) -> Result<Admin, DashError> {
    if let Some(key) = bearer(headers) {
        let found = state.inner.store.find_api_key(key).await?;
        return match found {
            Some(k) if k.admin => Ok(Admin { session: None }),
            Some(_) => Err(DashError::Forbidden),
            None => Err(DashError::Unauthenticated),
        };
    }
    match cookie(headers, COOKIE).and_then(|t| state.inner.sessions.get(t)) {
        Some(s) => Ok(Admin { session: Some(s) }),
        None => Err(DashError::Unauthenticated),
    }
}

impl Admin {
    /// Checks the CSRF token of a POST: required (and equal) under a session.
    pub fn check_csrf(&self, given: Option<&str>) -> Result<(), DashError> {
        match &self.session {
            None => Ok(()),
            Some(s) if given.is_some_and(|g| constant_time_eq(g, &s.csrf)) => Ok(()),
            Some(_) => Err(DashError::Csrf),
        }
    }

    /// The CSRF token to embed in forms ("" for a Bearer caller).
    pub fn csrf(&self) -> &str {
        self.session.as_ref().map_or("", |s| s.csrf.as_str())
    }
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl FromRequestParts<Dashboards> for Admin {
    type Rejection = DashError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Dashboards,
    ) -> Result<Self, Self::Rejection> {
        authenticate(state, &parts.headers).await
    }
}

/// Adds the CSP and hardening headers to a response.
pub async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_and_bearer() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; samewise_session=abc; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sw-x"),
        );
        assert_eq!(bearer(&h), Some("sw-x"));
    }

    #[test]
    fn sessions_expire_and_end() {
        let s = Sessions::new(60_000);
        let (t, sess) = s.start(7).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.get(&t), Some(sess.clone()));
        assert_eq!(s.get("nope"), None);
        let admin = Admin {
            session: Some(sess.clone()),
        };
        assert!(admin.check_csrf(Some(&sess.csrf)).is_ok());
        assert!(admin.check_csrf(Some("wrong")).is_err());
        assert!(admin.check_csrf(None).is_err());
        s.end(&t);
        assert_eq!(s.get(&t), None);
        let expired = Sessions::new(-1);
        let (t, _) = expired.start(1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(expired.get(&t), None);
    }
}
