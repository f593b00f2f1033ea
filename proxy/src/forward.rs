//! The completion request path: authenticate, read and check the body, plan endpoints, then
//! walk the plan attempt by attempt until one answers.
//!
//! An attempt has two halves: `head` sends it and waits for a usable response head (with the
//! endpoint's adaptive first-byte deadlines, and `hedge` racing a second endpoint when the model
//! hedges), then [`commit`] relays or reads the answer. Failover happens only before the first
//! byte reaches the client: connect errors, timeouts (connect, response head, or overdue on an
//! ejected endpoint), 429 and 5xx move the request to the next endpoint after a jittered
//! exponential backoff, within `limits.max_attempts` (a hedge counts as an attempt). A 429's `Retry-After` marks
//! that endpoint unavailable until then (for every request); when every endpoint of the plan
//! is waiting, the request waits for the first to come back if that is within
//! `limits.retry_after_max`. Each endpoint's breaker is asked before each attempt; its
//! admission is a `Permit` the attempt owns, so a request cancelled mid-attempt (its client
//! went away) gives a half-open trial back instead of holding it forever. Other 4xx
//! answers are the client's and pass through. Once an answer is committed, a non-streamed
//! body is sent whole (after its side reading, so a degenerate answer can still be retried
//! once elsewhere) and a stream goes through [`Relay`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use rand::Rng;
use samewise_store::ErrorKind;
use samewise_wire::sse::SseDecoder;
use tokio::time::Instant;

use crate::body::{ClientRequest, Route};
use crate::error::ApiError;
use crate::frames::EventFramer;
use crate::head::{Head, NoHead};
use crate::hedge;
use crate::inspect::Inspector;
use crate::record::{self, AttemptCtx, RequestCtx};
use crate::relay::Relay;
use crate::routing::{self, Endpoint, NoPlan};
use crate::state::AppState;

/// Largest non-streamed upstream answer read (a bigger one is an error, not an OOM).
const MAX_UPSTREAM_BODY: usize = 64 * 1024 * 1024;

/// Header carrying samewise's request id (also the records' `request_id`).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Header of an answer naming the endpoint that gave it (`provider/model`, as the records and
/// dashboards name it): the last attempt's, after any failover or hedge.
pub const ENDPOINT_HEADER: &str = "x-samewise-endpoint";

/// Header that pins a conversation to one endpoint under cache affinity.
pub const SESSION_HEADER: &str = "x-session-id";

/// Handles one `POST /v1/chat/completions` or `/v1/completions`.
pub async fn handle(state: AppState, route: Route, headers: HeaderMap, body: Body) -> Response {
    let mut rng = state.rng();
    let ts_ms = samewise_store::now_ms();
    let request_id = samewise_store::new_request_id(ts_ms, &mut rng);
    let mut ctx = RequestCtx {
        request_id: request_id.clone(),
        ts_ms,
        started: Instant::now(),
        key_id: None,
        model: String::new(),
        model_label: crate::metrics::UNKNOWN_MODEL.to_owned(),
        route: route.label(),
        stream: false,
        prompt_chars: 0,
        earlier: Vec::new(),
        capture: None,
        answer: None,
    };
    let mut resp = run(&state, route, &headers, body, &mut ctx, &mut rng).await;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

/// A body with a `Content-Encoding` other than `identity` is refused in the client's terms:
/// the gateway reads and forwards JSON as sent, and a compressed body would otherwise be
/// reported as "not valid JSON".
fn uncompressed(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(header::CONTENT_ENCODING) {
        None => Ok(()),
        Some(v) if v.as_bytes().eq_ignore_ascii_case(b"identity") => Ok(()),
        Some(v) => Err(ApiError::BadRequest {
            code: "unsupported_content_encoding",
            message: format!(
                "the request body is compressed (`Content-Encoding: {}`); send it uncompressed",
                String::from_utf8_lossy(v.as_bytes())
            ),
            param: None,
        }),
    }
}

/// Rejects a request before any upstream attempt, recording it.
fn reject(state: &AppState, ctx: &mut RequestCtx, err: ApiError) -> Response {
    let rec = ctx.rejected_record(err.status_code().as_u16(), err.code());
    record::finish(state, ctx, rec);
    err.into_response()
}

async fn run(
    state: &AppState,
    route: Route,
    headers: &HeaderMap,
    body: Body,
    ctx: &mut RequestCtx,
    rng: &mut impl Rng,
) -> Response {
    let key = match state.inner.auth.identify(headers).await {
        Ok(k) => k,
        Err(e) => return reject(state, ctx, e),
    };
    ctx.key_id = Some(key.id);
    if let Err(e) = state.inner.auth.charge(&key) {
        return reject(state, ctx, e);
    }

    if let Err(e) = uncompressed(headers) {
        return reject(state, ctx, e);
    }
    let bytes = match read_limited(body, state.inner.body_limit).await {
        Ok(b) => b,
        Err(e) => return reject(state, ctx, e),
    };
    let req = match ClientRequest::parse_cached(route, bytes.clone(), Some(&state.inner.tools)) {
        Ok(r) => r,
        Err(e) => {
            // Keep the model name when it could be read, so the rejection is attributed.
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
                && let Some(m) = v.get("model").and_then(|m| m.as_str())
            {
                ctx.model = m.to_owned();
            }
            return reject(state, ctx, e);
        }
    };
    ctx.model.clone_from(&req.model);
    ctx.stream = req.stream;
    ctx.prompt_chars = req.prompt_chars;

    let Some(model) = state.inner.models.get(&req.model).cloned() else {
        let e = ApiError::ModelNotFound {
            model: req.model.clone(),
        };
        return reject(state, ctx, e);
    };
    ctx.model_label.clone_from(&model.name);
    if let Some(config) = model.capture {
        ctx.capture = Some(crate::capture::Capturing {
            config,
            request: bytes.clone(),
            sampled: config.sample > 0.0 && rng.random::<f64>() < config.sample,
        });
    }

    let affinity = headers
        .get(SESSION_HEADER)
        .map(|v| routing::stable_hash(v.as_bytes(), 1))
        .unwrap_or(req.prefix_hash);
    let plan = match routing::plan(&model, &req.prefs, affinity, rng) {
        Ok(p) => p,
        Err(NoPlan::NoneMatch) => {
            let e = ApiError::NoEndpointsMatch;
            return reject(state, ctx, e);
        }
        Err(NoPlan::AllExcluded) => {
            let e = ApiError::AllEndpointsExcluded;
            return reject(state, ctx, e);
        }
    };

    // a stream holds one of its key's slots until its body ends or is dropped
    let permit = if req.stream {
        match state
            .inner
            .streams
            .acquire(key.id, state.inner.limits.max_streams_per_key)
        {
            Ok(p) => Some(p),
            Err(e) => return reject(state, ctx, e),
        }
    } else {
        None
    };
    let resp = attempts(state, &req, &plan.endpoints, model.hedge_after, ctx, rng).await;
    match permit {
        Some(p) => crate::streams::hold(resp, p),
        None => resp,
    }
}

/// Reads the request body up to `limit` bytes; more is a 413.
async fn read_limited(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::RequestTooLarge { limit };
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(too_large())
        }
        Err(_) => Err(ApiError::bad_request(
            "invalid_body",
            "the request body could not be read",
            None,
        )),
    }
}

/// How one committed attempt ended.
enum Outcome {
    /// The client has its answer.
    Answered(Response),
    /// The body broke before anything reached the client: try the next endpoint.
    Retry(ApiError),
    /// A degenerate non-streamed answer: retry once elsewhere, else send this.
    Degenerate(Response),
}

async fn attempts(
    state: &AppState,
    req: &ClientRequest,
    plan: &[Arc<Endpoint>],
    mut hedge_after: Option<Duration>,
    ctx: &mut RequestCtx,
    rng: &mut impl Rng,
) -> Response {
    let limits = &state.inner.limits;
    let give_up_waiting_at = Instant::now() + limits.retry_after_max;
    let mut next = 0usize;
    let mut attempt = 0u32;
    let mut last_err: Option<ApiError> = None;
    let mut degenerate_fallback: Option<Response> = None;
    let mut excluded: Option<usize> = None; // endpoint not to retry on (degenerate)
    while attempt < limits.max_attempts {
        // The next endpoint in plan order (cycling) that is not waiting out a Retry-After
        // and whose breaker lets a request through.
        let skip: Vec<usize> = excluded.filter(|_| plan.len() > 1).into_iter().collect();
        // The permit is owned from here: should this future be dropped (the client went away
        // during the backoff or the attempt), its drop frees a half-open trial slot.
        let Some((i, permit)) = routing::next_admitted(plan, next, &skip) else {
            // Everything is waiting or refusing: wait for the earliest Retry-After if it is
            // within the budget, else give up.
            let earliest = plan.iter().filter_map(|e| e.health.not_before()).min();
            match earliest {
                Some(t) if t <= give_up_waiting_at => {
                    tokio::time::sleep_until(t).await;
                    continue;
                }
                _ => break,
            }
        };
        if attempt > 0 {
            tokio::time::sleep(backoff(
                limits.backoff_base,
                limits.backoff_max,
                attempt,
                rng,
            ))
            .await;
        }
        attempt += 1;
        next = i + 1;
        let att = AttemptCtx::new(attempt, Arc::clone(&plan[i]));
        // At most one hedge per request, and only while another attempt is allowed.
        let hedge = hedge_after.filter(|_| attempt < limits.max_attempts);
        let raced =
            hedge::first_head(state, req, ctx, plan, (i, att, permit), hedge, excluded).await;
        ctx.earlier.extend(raced.side);
        if let Some(j) = raced.hedged {
            attempt += 1;
            next = next.max(j + 1);
            hedge_after = None;
        }
        let (head, att, winner) = match raced.result {
            Ok(won) => won,
            Err(NoHead::Failed { record, err }) => {
                ctx.earlier.push(*record);
                last_err = Some(err);
                continue;
            }
            Err(NoHead::Refused(resp)) => return resp,
        };
        match commit(state, req, head, att, ctx).await {
            Outcome::Answered(resp) => return resp,
            Outcome::Retry(err) => last_err = Some(err),
            Outcome::Degenerate(resp) => {
                if degenerate_fallback.is_some() || plan.len() < 2 {
                    // Retried once already (or nowhere else to go): the last answer stands.
                    return finish_degenerate(state, ctx, resp);
                }
                degenerate_fallback = Some(resp);
                excluded = Some(winner);
            }
        }
    }
    if let Some(resp) = degenerate_fallback {
        return finish_degenerate(state, ctx, resp);
    }
    let err = last_err.unwrap_or(ApiError::AllEndpointsUnavailable);
    // The last failed attempt becomes the final one; with none, record a rejection.
    match ctx.earlier.pop() {
        Some(last) => record::finish(state, ctx, last),
        None => {
            let rec = ctx.rejected_record(err.status_code().as_u16(), err.code());
            record::finish(state, ctx, rec);
        }
    }
    err.into_response()
}

/// A degenerate answer that was not (or could not be) replaced: its record was kept as the
/// last earlier attempt; finish with it.
fn finish_degenerate(state: &AppState, ctx: &mut RequestCtx, resp: Response) -> Response {
    if let Some(pos) = ctx.earlier.iter().rposition(|r| r.degenerate) {
        let rec = ctx.earlier.remove(pos);
        record::finish(state, ctx, rec);
    }
    resp
}

/// Full-jitter-on-top exponential backoff: half the exponential delay plus a random half.
fn backoff(base: Duration, max: Duration, retry: u32, rng: &mut impl Rng) -> Duration {
    let exp = base.saturating_mul(1u32 << (retry - 1).min(16)).min(max);
    let half = exp / 2;
    half + half.mul_f64(rng.random::<f64>())
}

/// The second half of an attempt: the endpoint answered with a usable head, which is
/// committed to: a stream goes through [`Relay`], a non-streamed body is read whole first.
async fn commit(
    state: &AppState,
    req: &ClientRequest,
    head: Head,
    att: AttemptCtx,
    ctx: &mut RequestCtx,
) -> Outcome {
    let Head {
        resp,
        permit,
        inflight,
    } = head;
    let status = resp.status();
    let ep = Arc::clone(&att.endpoint);
    // The endpoint answered: it is alive (a 4xx is the request's fault, not the endpoint's).
    if let Some(p) = permit {
        p.record(true);
    }
    let idle = state
        .inner
        .upstreams
        .get(&ep.provider)
        .map_or(Duration::from_secs(60), |u| u.idle_timeout);

    let upstream_ct = resp.headers().get(header::CONTENT_TYPE).cloned();
    let is_sse = upstream_ct
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut inspector = Inspector::new(
        req.route,
        req.strip_usage_chunk,
        req.tools.clone(),
        crate::degen::RepeatGuard::new(
            state.inner.limits.degenerate_repeat,
            state.inner.limits.degenerate_min_chars,
        ),
    );
    if let Some(cap) = &ctx.capture {
        inspector = inspector.keep_answer(cap.config.max_body_bytes);
    }

    if req.stream && status.is_success() && is_sse {
        let relay = Relay {
            state: state.clone(),
            // the relay owns the earlier attempts' records from here on
            ctx: RequestCtx {
                earlier: std::mem::take(&mut ctx.earlier),
                ..ctx.clone()
            },
            att,
            status: status.as_u16(),
            upstream: http_body_util::BodyDataStream::new(resp.into_body()).boxed(),
            idle: crate::relay::IdleTimer::new(idle),
            framer: EventFramer::new(samewise_wire::sse::DEFAULT_MAX_EVENT_BYTES),
            decoder: SseDecoder::new(),
            blocks: Vec::new(),
            events: Vec::new(),
            inspector: Some(inspector),
            _inflight: inflight,
        };
        let mut out = Response::new(relay.into_body());
        *out.status_mut() = status;
        let h = out.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if let Some(v) = &ep.id_header {
            h.insert(ENDPOINT_HEADER, v.clone());
        }
        return Outcome::Answered(out);
    }

    // Not a stream (or not SSE): read the whole answer, bounded, with the idle timeout.
    let body = match read_upstream(resp, idle).await {
        Ok(b) => b,
        Err(kind) => {
            drop(inflight);
            ep.health.record(crate::health::Admission::Normal, false);
            return failed_after_head(ctx, &att, status.as_u16(), kind);
        }
    };
    drop(inflight);
    let mut inspector = inspector;
    let parsed = inspector.on_body(&body, Instant::now());
    let obs = inspector.finish();
    ctx.answer.clone_from(&obs.answer);
    let kind = if !status.is_success() {
        Some(ErrorKind::Upstream4xx)
    } else if req.stream {
        Some(ErrorKind::NotSse)
    } else if !parsed {
        Some(ErrorKind::InvalidJson)
    } else if obs.degenerate {
        Some(ErrorKind::Degenerate)
    } else if obs.upstream_error {
        Some(ErrorKind::UpstreamErrorBody)
    } else {
        None
    };
    let rec = ctx.attempt_record(
        &att,
        Some(status.as_u16()),
        kind,
        Some(&obs),
        Instant::now(),
    );
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = status;
    out.headers_mut().insert(
        header::CONTENT_TYPE,
        upstream_ct.unwrap_or_else(|| HeaderValue::from_static("application/json")),
    );
    if let Some(v) = &ep.id_header {
        out.headers_mut().insert(ENDPOINT_HEADER, v.clone());
    }
    if obs.degenerate {
        ctx.earlier.push(rec);
        return Outcome::Degenerate(out);
    }
    record::finish(state, ctx, rec);
    Outcome::Answered(out)
}

/// The body of a committed non-streamed answer broke: nothing reached the client yet, so it
/// can still be retried.
fn failed_after_head(
    ctx: &mut RequestCtx,
    att: &AttemptCtx,
    status: u16,
    kind: ErrorKind,
) -> Outcome {
    tracing::debug!(endpoint = %att.endpoint.id, attempt = att.attempt, kind = kind.as_str(), "upstream body failed");
    let rec = ctx.attempt_record(att, Some(status), Some(kind), None, Instant::now());
    ctx.earlier.push(rec);
    Outcome::Retry(ApiError::Upstream { kind })
}

/// Reads a whole upstream body with a per-read idle timeout and a size bound. A body that
/// arrives in one piece (most answers) is kept as read, not copied.
async fn read_upstream(
    resp: http::Response<hyper::body::Incoming>,
    idle: Duration,
) -> Result<Bytes, ErrorKind> {
    let mut stream = http_body_util::BodyDataStream::new(resp.into_body());
    let mut first = Bytes::new();
    let mut joined: Option<bytes::BytesMut> = None;
    loop {
        match tokio::time::timeout(idle, stream.next()).await {
            Err(_) => return Err(ErrorKind::BodyIdleTimeout),
            Ok(None) => return Ok(joined.map_or(first, bytes::BytesMut::freeze)),
            Ok(Some(Err(_))) => return Err(ErrorKind::BodyReset),
            Ok(Some(Ok(b))) => {
                let read = joined.as_ref().map_or(first.len(), bytes::BytesMut::len);
                if read + b.len() > MAX_UPSTREAM_BODY {
                    return Err(ErrorKind::BodyTooLarge);
                }
                match &mut joined {
                    Some(j) => j.extend_from_slice(&b),
                    None if first.is_empty() => first = b,
                    None => {
                        let mut j = bytes::BytesMut::with_capacity(2 * (first.len() + b.len()));
                        j.extend_from_slice(&first);
                        j.extend_from_slice(&b);
                        joined = Some(j);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let base = Duration::from_millis(100);
        let max = Duration::from_millis(1000);
        for retry in 1..8u32 {
            let exp = (base * (1 << (retry - 1))).min(max);
            for _ in 0..100 {
                let d = backoff(base, max, retry, &mut rng);
                assert!(d >= exp / 2 && d <= exp, "{retry}: {d:?}");
            }
        }
    }
}
