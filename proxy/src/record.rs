//! Turning what happened into telemetry: one [`RequestRecord`] per upstream attempt (and one
//! for a request rejected before any), sent through the non-blocking record queue, and the
//! matching metric updates. The request path never waits here.

use std::sync::Arc;

use samewise_store::{ErrorKind, RequestRecord};
use tokio::time::Instant;

use crate::inspect::Observation;
use crate::metrics::{ErrorLabels, StatusClass, ToolLabels};
use crate::routing::Endpoint;
use crate::state::AppState;

/// What is known about a client request from its start.
#[derive(Debug, Clone)]
pub(crate) struct RequestCtx {
    pub(crate) request_id: String,
    pub(crate) ts_ms: i64,
    pub(crate) started: Instant,
    pub(crate) key_id: Option<i64>,
    /// The model as the client sent it.
    pub(crate) model: String,
    /// The model for metric labels: a configured name, or `unknown`.
    pub(crate) model_label: String,
    pub(crate) route: &'static str,
    pub(crate) stream: bool,
    pub(crate) prompt_chars: usize,
    /// Records of failed attempts so far, sent with the final one.
    pub(crate) earlier: Vec<RequestRecord>,
    /// The request's body and its model's capture settings, when the model captures.
    pub(crate) capture: Option<crate::capture::Capturing>,
    /// The assembled answer of the last attempt read (kept only when capturing).
    pub(crate) answer: Option<serde_json::Value>,
}

/// One attempt on one endpoint.
#[derive(Debug, Clone)]
pub(crate) struct AttemptCtx {
    pub(crate) attempt: u32,
    pub(crate) ts_ms: i64,
    pub(crate) started: Instant,
    pub(crate) endpoint: Arc<Endpoint>,
}

impl AttemptCtx {
    /// Attempt number `attempt` (1-based) on `endpoint`, starting now.
    pub(crate) fn new(attempt: u32, endpoint: Arc<Endpoint>) -> Self {
        AttemptCtx {
            attempt,
            ts_ms: samewise_store::now_ms(),
            started: Instant::now(),
            endpoint,
        }
    }
}

impl RequestCtx {
    /// A record of this request with nothing measured yet.
    fn base(&self) -> RequestRecord {
        RequestRecord {
            request_id: self.request_id.clone(),
            ts_ms: self.ts_ms,
            key_id: self.key_id,
            model: self.model.clone(),
            route: self.route.to_owned(),
            stream: self.stream,
            ..RequestRecord::default()
        }
    }

    /// The record of an attempt.
    pub(crate) fn attempt_record(
        &self,
        att: &AttemptCtx,
        status: Option<u16>,
        error_kind: Option<ErrorKind>,
        obs: Option<&Observation>,
        now: Instant,
    ) -> RequestRecord {
        let mut r = self.base();
        r.attempt = att.attempt;
        r.ts_ms = att.ts_ms;
        r.provider = Some(att.endpoint.provider.clone());
        r.endpoint = Some(att.endpoint.id.clone());
        r.status = status;
        r.error_kind = error_kind.map(|k| k.as_str().to_owned());
        r.latency_ms = ms(now.saturating_duration_since(att.started));
        if let Some(o) = obs {
            r.ttft_ms = o
                .first_token_at
                .map(|t| ms(t.saturating_duration_since(att.started)));
            r.finish_reason.clone_from(&o.finish_reason);
            r.output_chars = i64::try_from(o.output_chars).unwrap_or(i64::MAX);
            let (prompt, completion, counted) = match o.usage {
                Some((p, c)) => (p, c, false),
                None => {
                    let completion = if self.stream {
                        o.deltas as i64
                    } else {
                        o.output_chars.div_ceil(4) as i64
                    };
                    (self.prompt_chars.div_ceil(4) as i64, completion, true)
                }
            };
            r.prompt_tokens = Some(prompt);
            r.completion_tokens = Some(completion);
            r.usage_counted = counted;
            r.cost_usd = Some(
                prompt as f64 * att.endpoint.price_input_per_mtok / 1e6
                    + completion as f64 * att.endpoint.price_output_per_mtok / 1e6,
            );
            if let (Some(first), Some(last)) = (o.first_token_at, o.last_token_at)
                && self.stream
                && completion > 1
            {
                r.tpot_ms =
                    Some(ms(last.saturating_duration_since(first)) / (completion - 1) as f64);
            }
            r.tool_calls = o.tools.calls;
            r.tool_invalid_json = o.tools.invalid_json;
            r.tool_unknown_name = o.tools.unknown_name;
            r.tool_schema_mismatch = o.tools.schema_mismatch;
            r.tool_finish_mismatch.clone_from(&o.tools.finish_mismatch);
            r.tool_errored = o.tools.errored();
            r.degenerate = o.degenerate;
        }
        r
    }

    /// A request answered before any upstream attempt.
    pub(crate) fn rejected_record(&self, status: u16, kind: &str) -> RequestRecord {
        let mut r = self.base();
        r.final_attempt = true;
        r.status = Some(status);
        r.error_kind = Some(kind.to_owned());
        r.latency_ms = ms(self.started.elapsed());
        r
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Sends every record of a finished request (the earlier attempts and `last`, the one whose
/// answer reached the client) and updates the request metrics.
pub(crate) fn finish(state: &AppState, ctx: &mut RequestCtx, mut last: RequestRecord) {
    let m = &state.inner.metrics;
    let attempts =
        u32::try_from(ctx.earlier.len()).unwrap_or(u32::MAX) + u32::from(last.attempt > 0);
    last.final_attempt = true;
    last.attempts = attempts;
    let class = StatusClass::of(last.status, last.error_kind.is_some());
    let label = ctx.model_label.as_str();
    m.count_request(
        label,
        last.endpoint.as_deref(),
        class,
        ctx.started.elapsed().as_secs_f64(),
    );
    if let Some(endpoint) = &last.endpoint {
        if let Some(t) = last.ttft_ms {
            m.observe_ttft(label, endpoint, t / 1e3);
        }
        if last.degenerate {
            m.count_degenerate(label, endpoint);
        }
    }
    for r in ctx.earlier.iter().chain(std::iter::once(&last)) {
        let Some(ep) = &r.endpoint else { continue };
        if let Some(kind) = r
            .error_kind
            .as_ref()
            // not the endpoint's failure: the client left, or another endpoint was faster
            .filter(|k| ErrorKind::parse(k).is_none_or(ErrorKind::may_be_the_endpoints))
        {
            m.upstream_errors
                .get_or_create(&ErrorLabels {
                    endpoint: ep.clone(),
                    kind: kind.clone(),
                })
                .inc();
        }
        for (kind, n) in [
            ("invalid_json", r.tool_invalid_json),
            ("unknown_name", r.tool_unknown_name),
            ("schema_mismatch", r.tool_schema_mismatch),
            (
                "finish_mismatch",
                u32::from(r.tool_finish_mismatch.is_some()),
            ),
        ] {
            if n > 0 {
                let labels = ToolLabels {
                    model: ctx.model_label.clone(),
                    endpoint: ep.clone(),
                    kind: kind.to_owned(),
                };
                m.tool_call_errors
                    .get_or_create(&labels)
                    .inc_by(u64::from(n));
            }
        }
    }
    let body = ctx.capture.as_ref().and_then(|cap| {
        match crate::capture::body(cap, &ctx.earlier, &last, ctx.answer.as_ref()) {
            Ok(b) => b,
            Err(outcome) => {
                count_capture(state, &ctx.model_label, outcome);
                None
            }
        }
    });
    for mut r in ctx.earlier.drain(..) {
        r.attempts = attempts;
        send(state, r);
    }
    match body {
        None => send(state, last),
        Some(b) => {
            count_capture(state, &ctx.model_label, "queued");
            if !state.inner.records.try_send_with_body(last, b) {
                tracing::debug!("request-record queue full; record and body dropped (counted)");
            }
        }
    }
}

fn count_capture(state: &AppState, model: &str, outcome: &str) {
    state
        .inner
        .metrics
        .body_captures
        .get_or_create(&crate::metrics::CaptureLabels {
            model: model.to_owned(),
            outcome: outcome.to_owned(),
        })
        .inc();
}

fn send(state: &AppState, r: RequestRecord) {
    if !state.inner.records.try_send(r) {
        tracing::debug!(
            "request-record queue full (in records or in bytes); record dropped (counted in samewise_record_queue_dropped_total)"
        );
    }
}
