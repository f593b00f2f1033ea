//! The first half of an attempt: send the request to one endpoint and wait for a response head
//! worth committing to (a 2xx, or a 4xx that is the request's own fault).
//!
//! The wait follows the endpoint's [`Deadlines`] (adaptive, see `health`): past `overdue_after`
//! and past the expected time of the fastest other endpoint of the plan (an outlier; with no
//! other endpoint measured, never), with no head from its endpoint meanwhile, the attempt counts as a breaker failure at once, while still
//! in flight; if the breaker is or
//! becomes open (the endpoint is ejected), the overdue attempt gives up and the request fails
//! over instead of waiting for a timeout; past `timeout` it times out. Connect errors, resets,
//! 429 and 5xx heads are failures too. Nothing here touches the request's records: a failure
//! comes back as its record, so two attempts of one request (a hedge) can wait side by side.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use samewise_store::{ErrorKind, RequestRecord};
use tokio::time::{Instant, sleep_until};

use crate::body::ClientRequest;
use crate::error::ApiError;
use crate::health::{Deadlines, EndpointHealth, InflightGuard, Permit};
use crate::record::{AttemptCtx, RequestCtx};
use crate::routing::Endpoint;
use crate::state::{AppState, Upstream};

/// An attempt whose endpoint answered with a head the client will get.
pub(crate) struct Head {
    /// The upstream response, body unread.
    pub(crate) resp: http::Response<hyper::body::Incoming>,
    /// The breaker's admission, None when the attempt already counted as overdue.
    pub(crate) permit: Option<Permit>,
    /// Counts the attempt in flight until its body is done.
    pub(crate) inflight: InflightGuard,
}

/// How an attempt ended without a head worth committing to.
pub(crate) enum NoHead {
    /// The attempt failed (`record` says how); `err` is what the client sees if no attempt
    /// is left.
    Failed {
        /// The attempt's record, not yet sent (boxed: records are large).
        record: Box<RequestRecord>,
        /// The client's error should this be the last attempt.
        err: ApiError,
    },
    /// The request cannot be sent at all: this is the client's answer.
    Refused(Response),
}

/// How waiting for the head ended.
enum Wait<T> {
    /// The request future finished.
    Done(T),
    /// Past the attempt's timeout.
    TimedOut,
    /// Overdue on an endpoint that is ejected now.
    Ejected,
}

/// Sends `req` to `att`'s endpoint and waits for its head (see the module doc). `slot` holds
/// the breaker's permit: an outcome recorded here takes it, a usable head carries it on; left
/// in place (the future was dropped: a lost hedge, a client gone), the caller decides.
pub(crate) async fn send(
    state: &AppState,
    req: &ClientRequest,
    ctx: &RequestCtx,
    plan: &[Arc<Endpoint>],
    att: &AttemptCtx,
    slot: &mut Option<Permit>,
) -> Result<Head, NoHead> {
    let ep = &att.endpoint;
    let (Some(up), Some(client)) = (
        state.inner.upstreams.get(&ep.provider),
        state.client(&ep.provider),
    ) else {
        drop(slot.take()); // no outcome: the endpoint was never called
        return Err(failed(ctx, att, None, None, ErrorKind::Config));
    };
    let body = match req.body_for(&ep.upstream_model) {
        Ok(b) => b,
        Err(e) => {
            drop(slot.take());
            return Err(NoHead::Refused(e.into_response()));
        }
    };
    let inflight = ep.health.start_request();
    let deadlines = ep.health.deadlines(req.stream, up.first_byte);
    // What the other endpoints of the plan usually take, read when the attempt is late.
    let peers = || {
        plan.iter()
            .filter(|e| !Arc::ptr_eq(e, ep))
            .filter_map(|e| e.health.expected(req.stream))
            .min()
    };
    let sent = wait(
        &ep.health,
        deadlines,
        att.started,
        slot,
        peers,
        client.request(request(up, req, body)),
    )
    .await;
    let permit = slot.take();
    let resp = match sent {
        Wait::TimedOut | Wait::Ejected => {
            // Given up: the wait is a lower bound of this endpoint's first-byte time.
            ep.health
                .observe_first_byte(req.stream, att.started.elapsed());
            return Err(failed(ctx, att, permit, None, ErrorKind::Timeout));
        }
        Wait::Done(Err(e)) => {
            // a connect timeout is a connect error too (as it was with reqwest)
            let kind = if e.is_connect() {
                ErrorKind::Connect
            } else {
                ErrorKind::UpstreamIo
            };
            return Err(failed(ctx, att, permit, None, kind));
        }
        Wait::Done(Ok(r)) => r,
    };
    let status = resp.status();
    ep.health.observe_latency(att.started.elapsed());

    if status == StatusCode::TOO_MANY_REQUESTS {
        let retry_after = retry_after(resp.headers());
        if let Some(d) = retry_after {
            ep.health.set_not_before(Instant::now() + d);
        }
        // Rate limiting says nothing about the endpoint's health: no breaker outcome.
        drop(permit);
        let record = ctx.attempt_record(
            att,
            Some(429),
            Some(ErrorKind::RateLimited),
            None,
            Instant::now(),
        );
        let err = ApiError::UpstreamRateLimited {
            retry_after: retry_after.map(|d| d.as_secs().max(1)),
        };
        return Err(NoHead::Failed {
            record: Box::new(record),
            err,
        });
    }
    if status.is_server_error() {
        let code = Some(status.as_u16());
        return Err(failed(ctx, att, permit, code, ErrorKind::Upstream5xx));
    }
    if status.is_success() {
        ep.health
            .observe_first_byte(req.stream, att.started.elapsed());
    }
    Ok(Head {
        resp,
        permit,
        inflight,
    })
}

/// The upstream request: the rewritten body, the provider's auth, SSE accepted for streams.
fn request(
    up: &Upstream,
    req: &ClientRequest,
    body: bytes::Bytes,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut r = http::Request::new(http_body_util::Full::new(body));
    *r.method_mut() = http::Method::POST;
    *r.uri_mut() = up.url(req.route).clone();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Some(auth) = &up.auth {
        h.insert(header::AUTHORIZATION, auth.clone());
    }
    if let Some(host) = &up.host {
        h.insert(header::HOST, host.clone());
    }
    h.insert(
        header::ACCEPT,
        http::HeaderValue::from_static(if req.stream {
            "text/event-stream"
        } else {
            "*/*"
        }),
    );
    r
}

/// Waits for `send` within `deadlines` from `started`; once overdue (past `overdue_after` and
/// past what the fastest peer usually takes), the permit is recorded as a failure (taken out of
/// `permit`) and an ejection of the endpoint ends the wait.
async fn wait<F: Future>(
    health: &EndpointHealth,
    deadlines: Deadlines,
    started: Instant,
    permit: &mut Option<Permit>,
    peers: impl Fn() -> Option<Duration>,
    send: F,
) -> Wait<F::Output> {
    let mut send = pin!(send);
    let mut timeout_at = started + deadlines.timeout;
    let mut check_at = started + deadlines.overdue_after;
    loop {
        tokio::select! {
            r = &mut send => return Wait::Done(r),
            () = sleep_until(check_at.min(timeout_at)) => {}
        }
        if check_at >= timeout_at {
            // the adaptive timeout cuts only a silent endpoint's attempt: one that answered
            // others meanwhile is alive, and this request long (a big prompt, a long answer)
            let cap_at = started + deadlines.cap;
            if timeout_at < cap_at && health.answered_since(started) {
                timeout_at = cap_at;
                continue;
            }
            return Wait::TimedOut;
        }
        // an endpoint that answered other requests since this one was sent is alive
        let alive = health.answered_since(started);
        match peers() {
            // silent, and slower than another endpoint usually is: an outlier
            Some(p) if !alive && started + p <= check_at => break,
            Some(p) if started + p > check_at => check_at = started + p,
            // no other endpoint measured yet, or alive: look again later
            _ => check_at += deadlines.overdue_after,
        }
    }
    // Overdue: it counts against the endpoint now, not when (or if) its timeout ends.
    if let Some(p) = permit.take() {
        p.record(false);
    }
    let mut ejected = pin!(health.ejected());
    ejected.as_mut().enable();
    if health.is_open() {
        return Wait::Ejected;
    }
    tokio::select! {
        r = &mut send => Wait::Done(r),
        () = sleep_until(timeout_at) => Wait::TimedOut,
        () = ejected => Wait::Ejected,
    }
}

/// A failed attempt before a usable head: its breaker outcome (unless already counted as
/// overdue) and its record.
fn failed(
    ctx: &RequestCtx,
    att: &AttemptCtx,
    permit: Option<Permit>,
    status: Option<u16>,
    kind: ErrorKind,
) -> NoHead {
    if let Some(p) = permit {
        p.record(false);
    }
    tracing::debug!(endpoint = %att.endpoint.id, attempt = att.attempt, kind = kind.as_str(), "upstream attempt failed");
    let record = ctx.attempt_record(att, status, Some(kind), None, Instant::now());
    NoHead::Failed {
        record: Box::new(record),
        err: ApiError::Upstream { kind },
    }
}

/// The longest an upstream `Retry-After` keeps an endpoint out of rotation: one provider
/// answering `Retry-After: 86400` must not lose it for a day; past this the endpoint is simply
/// tried again (and a new 429 sets a new wait).
const MAX_RETRY_AFTER_SECS: f64 = 60.0;

/// `Retry-After` in seconds, capped at [`MAX_RETRY_AFTER_SECS`] (the HTTP-date form is not
/// used by LLM providers; it is ignored).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(MAX_RETRY_AFTER_SECS)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn retry_after_seconds() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        // a day-long Retry-After does not take the endpoint out for a day
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("86400"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(60)));
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("1e300"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(60)));
        h.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None);
    }
}
