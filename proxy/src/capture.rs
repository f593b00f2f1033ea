//! Captured request bodies (opt-in per model, `[models.NAME.capture]`, off by default): the
//! raw material of the `regression` eval suite.
//!
//! When a model captures, its requests keep their body (the bytes already read, shared, no
//! copy) until they end. A request is kept only when it is *flagged* — an attempt cut as
//! degenerate, a tool call that failed its check, an upstream error that was the endpoint's
//! (connect, timeout, 5xx, broken or truncated streams; not 429s, request-caused 4xx, client
//! disconnects or lost hedges) — or *sampled* (`sample`, a fraction of every request, 0 by
//! default: probe alerts have no flagged traffic of their own, so a small sample is what
//! `evals capture --alert` can draw on for them). Kept is the request body with every
//! auth-looking field redacted (headers are never kept) and the final attempt's assembled
//! answer (text, tool calls, finish reason; for a stream the assembled result, never the raw
//! events). The body rides the record queue beside the final record
//! ([`samewise_store::RecordSender::try_send_with_body`]): nothing here waits on the database,
//! a body over `max_body_bytes` is not kept, and the store bounds the model's bodies in total
//! bytes (`max_bytes`, oldest evicted) and age (`max_age_hours`).

use bytes::Bytes;
use samewise_store::{CapturedBody, ErrorKind, NewCapturedBody, RequestRecord};
use serde_json::{Value, json};

use crate::config::CaptureConfig;

/// What replaces a redacted value.
pub const REDACTED: &str = "[redacted]";

/// Field names (lowercase, `-` and `_` removed) whose scalar values are redacted wherever they
/// appear in a captured body.
const AUTH_KEYS: &[&str] = &[
    "apikey",
    "xapikey",
    "authorization",
    "proxyauthorization",
    "auth",
    "bearer",
    "token",
    "accesstoken",
    "refreshtoken",
    "idtoken",
    "sessiontoken",
    "authtoken",
    "secret",
    "clientsecret",
    "secretkey",
    "password",
    "passwd",
    "privatekey",
    "cookie",
    "setcookie",
];

/// Whether `key` names an auth-looking field.
fn auth_key(key: &str) -> bool {
    let k: String = key
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    AUTH_KEYS.contains(&k.as_str())
}

/// Redacts `v` in place: the scalar value of every auth-looking field (objects and arrays under
/// such a key are walked, so a tool's JSON Schema property named `api_key` keeps its shape),
/// and every string that starts with `Bearer ` or `Basic `. Returns how many values changed.
pub fn redact(v: &mut Value) -> usize {
    let mut n = 0;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(map) => {
                for (k, child) in map.iter_mut() {
                    if auth_key(k) && !(child.is_object() || child.is_array() || child.is_null()) {
                        *child = Value::String(REDACTED.to_owned());
                        n += 1;
                    } else {
                        stack.push(child);
                    }
                }
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::String(s) if credential_text(s) => {
                *s = REDACTED.to_owned();
                n += 1;
            }
            _ => {}
        }
    }
    n
}

fn credential_text(s: &str) -> bool {
    let head: String = s.chars().take(7).flat_map(char::to_lowercase).collect();
    head.starts_with("bearer ") || head.starts_with("basic ")
}

/// A request of a capturing model, while it runs.
#[derive(Debug, Clone)]
pub(crate) struct Capturing {
    pub(crate) config: CaptureConfig,
    /// The body as the client sent it (shared with the request path, not copied).
    pub(crate) request: Bytes,
    /// Drawn at the start: kept whatever happens.
    pub(crate) sampled: bool,
}

/// Whether `kind` is a failure of the endpoint itself.
fn endpoint_failure(kind: &str) -> bool {
    !matches!(
        ErrorKind::parse(kind),
        None | Some(
            ErrorKind::Config
                | ErrorKind::RateLimited
                | ErrorKind::Upstream4xx
                | ErrorKind::Degenerate
                | ErrorKind::ClientDisconnect
                | ErrorKind::HedgeLost
                | ErrorKind::MissingDone
        )
    )
}

/// Why a request's attempts make it worth keeping; empty when they do not.
pub(crate) fn flags(attempts: &[&RequestRecord]) -> Vec<&'static str> {
    let mut out = Vec::new();
    let with_endpoint = || attempts.iter().filter(|r| r.endpoint.is_some());
    if with_endpoint().any(|r| r.degenerate) {
        out.push("degenerate");
    }
    if with_endpoint().any(|r| r.tool_errored) {
        out.push("tool_error");
    }
    if with_endpoint().any(|r| r.error_kind.as_deref().is_some_and(endpoint_failure)) {
        out.push("upstream_error");
    }
    out
}

fn flagged(r: &RequestRecord) -> bool {
    r.endpoint.is_some() && !flags(&[r]).is_empty()
}

/// The body to keep for a finished request whose attempts are `earlier` and `last`, with the
/// final attempt's assembled `answer`; None when it is neither flagged nor sampled, has no
/// upstream attempt, or is larger than `max_body_bytes`. Errs with "too_large" in that last
/// case, so it is counted.
pub(crate) fn body(
    cap: &Capturing,
    earlier: &[RequestRecord],
    last: &RequestRecord,
    answer: Option<&Value>,
) -> Result<Option<NewCapturedBody>, &'static str> {
    let all: Vec<&RequestRecord> = earlier.iter().chain(std::iter::once(last)).collect();
    let mut why = flags(&all);
    if cap.sampled {
        why.push("sampled");
    }
    if why.is_empty() || all.iter().all(|r| r.endpoint.is_none()) {
        return Ok(None);
    }
    let Ok(mut request) = serde_json::from_slice::<Value>(&cap.request) else {
        return Ok(None);
    };
    redact(&mut request);
    let mut answer = answer.cloned().unwrap_or_else(|| json!({}));
    redact(&mut answer);
    let approx = cap.request.len() + answer.to_string().len();
    if approx > cap.config.max_body_bytes {
        return Err("too_large");
    }
    // the endpoint the request is flagged on: the final attempt's when it is flagged
    let on = if flagged(last) || cap.sampled {
        last
    } else {
        all.iter().copied().find(|r| flagged(r)).unwrap_or(last)
    };
    let response = json!({
        "endpoint": last.endpoint,
        "status": last.status,
        "error_kind": last.error_kind,
        "attempts": all.len(),
        "answer": answer,
    });
    let age = i64::try_from(cap.config.max_age.as_millis()).unwrap_or(i64::MAX);
    Ok(Some(NewCapturedBody {
        body: CapturedBody {
            request_id: last.request_id.clone(),
            ts_ms: all.first().map_or(last.ts_ms, |r| r.ts_ms),
            expires_ms: samewise_store::now_ms().saturating_add(age),
            model: last.model.clone(),
            endpoint: on.endpoint.clone(),
            route: last.route.clone(),
            flags: why.into_iter().map(str::to_owned).collect(),
            request,
            response,
            bytes: i64::try_from(approx).unwrap_or(i64::MAX),
        },
        model_max_bytes: i64::try_from(cap.config.max_bytes).unwrap_or(i64::MAX),
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn auth_fields_are_redacted_and_schemas_keep_their_shape() {
        let mut v = json!({
            "model": "m",
            "api_key": "sk-live-123",
            "messages": [{"role": "user", "content": "hello"},
                         {"role": "user", "content": "Bearer abc.def"}],
            "metadata": {"Authorization": "Basic dXNlcjpwdw==", "X-Api-Key": 42,
                         "nested": [{"access_token": "t0k"}, {"password": null}]},
            "max_tokens": 16,
            "tools": [{"type": "function", "function": {"name": "login", "parameters": {
                "type": "object", "properties": {"api_key": {"type": "string"}}}}}],
        });
        let n = redact(&mut v);
        assert_eq!(n, 5, "{v}");
        let s = v.to_string();
        for secret in ["sk-live-123", "abc.def", "dXNlcjpwdw==", "t0k", "42"] {
            assert!(!s.contains(secret), "{secret} left in {s}");
        }
        assert_eq!(v["max_tokens"], 16);
        assert_eq!(v["messages"][0]["content"], "hello");
        assert_eq!(
            v.pointer("/tools/0/function/parameters/properties/api_key/type"),
            Some(&json!("string"))
        );
    }

    fn rec(endpoint: Option<&str>, kind: Option<&str>, tool: bool, degen: bool) -> RequestRecord {
        RequestRecord {
            request_id: "req-1".into(),
            model: "m".into(),
            route: "chat".into(),
            endpoint: endpoint.map(str::to_owned),
            error_kind: kind.map(str::to_owned),
            tool_errored: tool,
            degenerate: degen,
            ..RequestRecord::default()
        }
    }

    #[test]
    fn only_flagged_or_sampled_requests_are_kept() {
        let cap = |sampled| Capturing {
            config: CaptureConfig {
                max_bytes: 1 << 20,
                max_age: Duration::from_secs(3600),
                max_body_bytes: 4096,
                sample: 0.0,
            },
            request: Bytes::from_static(br#"{"model":"m","messages":[],"api_key":"s3cret"}"#),
            sampled,
        };
        let plain = rec(Some("p/m"), None, false, false);
        assert!(matches!(body(&cap(false), &[], &plain, None), Ok(None)));
        for (r, flag) in [
            (rec(Some("p/m"), None, true, false), "tool_error"),
            (
                rec(Some("p/m"), Some("degenerate"), false, true),
                "degenerate",
            ),
            (
                rec(Some("p/m"), Some("upstream_5xx"), false, false),
                "upstream_error",
            ),
        ] {
            let b = body(&cap(false), &[], &r, None);
            let b = b.ok().flatten().map(|b| b.body);
            assert_eq!(
                b.as_ref().map(|b| b.flags.clone()),
                Some(vec![flag.to_owned()])
            );
            assert!(b.is_some_and(|b| !b.request.to_string().contains("s3cret")));
        }
        // not the endpoint's doing: a 429, a client that left, a rejection before any attempt
        for r in [
            rec(Some("p/m"), Some("rate_limited"), false, false),
            rec(Some("p/m"), Some("client_disconnect"), false, false),
            rec(None, Some("unauthorized"), false, false),
        ] {
            assert!(
                matches!(body(&cap(false), &[], &r, None), Ok(None)),
                "{r:?}"
            );
        }
        // a failover: flagged on the endpoint that failed, the answer from the one that worked
        let failed = rec(Some("a/m"), Some("timeout"), false, false);
        let b = body(&cap(false), &[failed], &plain, Some(&json!({"text": "ok"})));
        let b = b.ok().flatten().map(|b| b.body);
        assert_eq!(
            b.as_ref().and_then(|b| b.endpoint.clone()),
            Some("a/m".into())
        );
        assert_eq!(
            b.map(|b| b.response["answer"]["text"].clone()),
            Some(json!("ok"))
        );
        let sampled = body(&cap(true), &[], &plain, None).ok().flatten();
        assert_eq!(
            sampled.map(|b| b.body.flags),
            Some(vec!["sampled".to_owned()])
        );
        let mut small = cap(false);
        small.config.max_body_bytes = 10;
        let r = rec(Some("p/m"), None, true, false);
        assert!(matches!(body(&small, &[], &r, None), Err("too_large")));
    }
}
