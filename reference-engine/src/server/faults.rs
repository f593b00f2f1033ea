//! The behavioural faults of a serving [`Profile`], applied by the HTTP server so the engine
//! behaves like a drifting provider from the outside: silent prompt truncation, tool-call
//! corruption, the repeat-token bug, chat-template variants, API differences (logprobs
//! refused, `top_logprobs` capped, echo logprobs shifted), added latency, injected 500s and
//! 429s, and streams cut in the middle.
//!
//! Determinism: every random choice comes from a [`SplitMix64`] stream keyed by the
//! profile's `seed`, the request's arrival number on the OpenAI routes (counted from 0 per
//! server), a knob tag and a sub-index (the choice, the tool call). A fresh server given
//! the same request sequence therefore makes the same choices, and one knob's draws never
//! shift another's. Faults are decided per request and per value, never from what else is
//! in the batch, so the engine's batch invariance is untouched.
//!
//! Wiring: `middleware` wraps `/v1/completions` and `/v1/chat/completions`: it numbers the
//! request, sleeps the drawn latency, answers an injected 500 or 429, hands the handler a
//! `RequestFaults` (request extension), and cuts an SSE body after the drawn number of
//! events. The handlers call `RequestFaults` (logprob refusal and cap, echo shift,
//! repeat point, tool-call corruption) and `Faults` (template variant, truncation).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use samewise_wire::ToolCall;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::batcher::GenEvent;
use crate::engine::{Finish, FinishReason, GeneratedToken, ScoredSequence};
use crate::profile::{Profile, TemplateVariant, ToolCorruption, TruncateDrop};

use super::stream::GenRequest;
use super::{ApiError, ServerState};

/// Knob tags: each knob draws from its own stream.
const TAG_ERRORS: u64 = 1;
const TAG_LATENCY: u64 = 2;
const TAG_DISCONNECT: u64 = 3;
const TAG_REPEAT: u64 = 4;
const TAG_TOOLS: u64 = 5;
const TAG_JITTER: u64 = 6;

/// The repeat bug starts within the first this-many generated tokens.
const REPEAT_WINDOW: usize = 16;
/// A cut stream delivers between 1 and this many events first.
const DISCONNECT_WINDOW: u64 = 8;
/// Longest latency ever added (the log-normal's tail is cut here).
const MAX_LATENCY_S: f64 = 120.0;
/// `Retry-After` of an injected 429, seconds.
const RETRY_AFTER_S: u64 = 1;
/// The standard normal's 99th percentile.
const Z99: f64 = 2.326_347_874_040_841;

/// SplitMix64: a tiny generator whose output is fixed forever (unlike library RNGs, whose
/// streams may change between versions), so recorded profiles replay.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a 64-bit state.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The stream for (`seed`, `request`, `tag`, `sub`).
    pub fn keyed(seed: u64, request: u64, tag: u64, sub: u64) -> Self {
        let mut k = Self(seed);
        let a = k.next_u64() ^ request;
        let mut k = Self(a);
        let b = k.next_u64() ^ tag.rotate_left(32);
        let mut k = Self(b);
        Self(k.next_u64() ^ sub.rotate_left(17))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..n (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A standard normal draw (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// A latency in milliseconds from the log-normal with this median and 99th percentile
/// (`p99 == median`, or none, gives a fixed delay).
pub fn lognormal_ms(rng: &mut SplitMix64, median_ms: f64, p99_ms: Option<f64>) -> f64 {
    if median_ms <= 0.0 {
        return 0.0;
    }
    let p99 = p99_ms.unwrap_or(median_ms).max(median_ms);
    let sigma = (p99 / median_ms).ln() / Z99;
    let z = rng.normal();
    (median_ms * (sigma * z).exp()).min(MAX_LATENCY_S * 1000.0)
}

/// A server's faults: the profile and the request counter.
#[derive(Debug)]
pub(crate) struct Faults {
    profile: Arc<Profile>,
    requests: AtomicU64,
}

impl Faults {
    pub(crate) fn new(profile: Profile) -> Self {
        Self {
            profile: Arc::new(profile),
            requests: AtomicU64::new(0),
        }
    }

    pub(crate) fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Numbers a new request and returns its draws.
    fn begin(&self) -> RequestFaults {
        let index = self.requests.fetch_add(1, Ordering::Relaxed);
        RequestFaults {
            profile: Arc::clone(&self.profile),
            index,
        }
    }

    /// Messages as the faulty chat template sees them: system messages dropped, a default
    /// system prompt added, or user/assistant roles renamed (`human`/`bot`).
    pub(crate) fn template_messages<'a>(&self, messages: &'a [Value]) -> Cow<'a, [Value]> {
        let Some(c) = &self.profile.chat_template else {
            return Cow::Borrowed(messages);
        };
        let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
        match c.variant {
            TemplateVariant::DropSystem => Cow::Owned(
                messages
                    .iter()
                    .filter(|m| role(m).as_deref() != Some("system"))
                    .cloned()
                    .collect(),
            ),
            TemplateVariant::DefaultSystem => {
                if messages
                    .iter()
                    .any(|m| role(m).as_deref() == Some("system"))
                {
                    return Cow::Borrowed(messages);
                }
                let system = c.system_prompt.clone().unwrap_or_default();
                let mut out = Vec::with_capacity(messages.len() + 1);
                out.push(serde_json::json!({"role": "system", "content": system}));
                out.extend(messages.iter().cloned());
                Cow::Owned(out)
            }
            TemplateVariant::WrongRoleTags => Cow::Owned(
                messages
                    .iter()
                    .map(|m| {
                        let mut m = m.clone();
                        let renamed = match role(&m).as_deref() {
                            Some("user") => Some("human"),
                            Some("assistant") => Some("bot"),
                            _ => None,
                        };
                        if let (Some(r), Some(o)) = (renamed, m.as_object_mut()) {
                            o.insert("role".into(), Value::String(r.into()));
                        }
                        m
                    })
                    .collect(),
            ),
        }
    }

    /// Silently truncates a prompt over the limit: keeps its last `max_prompt_tokens`
    /// (drop = start) or its first and last halves (drop = middle). True if it cut.
    pub(crate) fn truncate(&self, ids: &mut Vec<u32>) -> bool {
        let Some(t) = &self.profile.truncation else {
            return false;
        };
        let keep = t.max_prompt_tokens;
        if ids.len() <= keep {
            return false;
        }
        match t.drop {
            TruncateDrop::Start => {
                ids.drain(..ids.len() - keep);
            }
            TruncateDrop::Middle => {
                let head = keep / 2;
                let tail = keep - head;
                ids.drain(head..ids.len() - tail);
            }
        }
        true
    }
}

/// What one request draws; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct RequestFaults {
    profile: Arc<Profile>,
    /// Arrival number on the OpenAI routes.
    index: u64,
}

/// What the middleware does with a request before the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Serve,
    Error500,
    Error429,
}

impl RequestFaults {
    fn rng(&self, tag: u64, sub: u64) -> SplitMix64 {
        SplitMix64::keyed(self.profile.seed, self.index, tag, sub)
    }

    fn outcome(&self) -> Outcome {
        let Some(e) = &self.profile.errors else {
            return Outcome::Serve;
        };
        let u = self.rng(TAG_ERRORS, 0).next_f64();
        if u < e.rate_500 {
            Outcome::Error500
        } else if u < e.rate_500 + e.rate_429 {
            Outcome::Error429
        } else {
            Outcome::Serve
        }
    }

    fn latency(&self) -> Duration {
        let Some(l) = &self.profile.latency else {
            return Duration::ZERO;
        };
        let ms = lognormal_ms(&mut self.rng(TAG_LATENCY, 0), l.median_ms, l.p99_ms);
        Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::ZERO)
    }

    /// For a cut stream, how many SSE events get through first (at least 1; `[DONE]` never).
    fn disconnect_after(&self) -> Option<u64> {
        let e = self.profile.errors.as_ref()?;
        let mut rng = self.rng(TAG_DISCONNECT, 0);
        (rng.next_f64() < e.disconnect_rate).then(|| 1 + rng.below(DISCONNECT_WINDOW))
    }

    /// The 400 of a provider without logprob support, when the request asks for them.
    pub(crate) fn check_logprobs(&self, asked: bool) -> Result<(), ApiError> {
        if asked && self.profile.api.as_ref().is_some_and(|a| a.refuse_logprobs) {
            return Err(ApiError::bad_request(
                "logprobs are not supported by this model",
                Some("logprobs"),
            ));
        }
        Ok(())
    }

    /// The 400 of a provider that does not echo prompts, when the request asks it to.
    pub(crate) fn check_echo(&self, asked: bool) -> Result<(), ApiError> {
        if asked && self.profile.api.as_ref().is_some_and(|a| a.refuse_echo) {
            return Err(ApiError::bad_request(
                "echo is not supported by this model",
                Some("echo"),
            ));
        }
        Ok(())
    }

    /// `top_logprobs` (or completions' `logprobs`) after the silent cap.
    pub(crate) fn cap_top(&self, k: usize) -> usize {
        match self.profile.api.as_ref().and_then(|a| a.max_top_logprobs) {
            Some(cap) => k.min(cap as usize),
            None => k,
        }
    }

    /// The request's sampling as this profile serves it: with `api.fixed_temperature`, the
    /// temperature the request asked for is ignored.
    pub(crate) fn sampling(&self, mut g: GenRequest) -> GenRequest {
        if let Some(t) = self.profile.api.as_ref().and_then(|a| a.fixed_temperature) {
            g.sampling.temperature = t as f32;
        }
        g
    }

    /// Shifts prompt (echo) logprobs: entry i takes entry i + shift's logprob and
    /// alternatives; the last `shift` entries become null. Tokens stay in place.
    pub(crate) fn shift_echo(&self, s: &mut ScoredSequence) {
        let shift = self
            .profile
            .api
            .as_ref()
            .map_or(0, |a| a.echo_shift as usize);
        if shift == 0 {
            return;
        }
        let n = s.positions.len();
        for i in 0..n {
            let (logprob, top) = match s.positions.get(i + shift) {
                Some(p) => (p.logprob, p.top.clone()),
                None => (None, Vec::new()),
            };
            if let Some(p) = s.positions.get_mut(i) {
                p.logprob = logprob;
                p.top = top;
            }
        }
    }

    /// Prompt `prompt`'s (echo) logprobs under `api.echo_jitter`: at each position the listed
    /// tokens (its alternatives and its own token) get one normal draw each on their logits,
    /// per (position, token), and the position is renormalized over the whole vocabulary (the
    /// unlisted tokens' logits kept): `lp' = lp + e − ln(1 + Σ p·(exp(e) − 1))`. So logprobs
    /// stay at most 0 and a near-certain token stays near 0, as a real server's logit noise
    /// leaves it; the token's own logprob and its entry among the alternatives move together;
    /// alternatives are re-sorted (logprob descending, then id).
    pub(crate) fn jitter_echo(&self, prompt: usize, s: &mut ScoredSequence) {
        let sd = self.profile.api.as_ref().map_or(0.0, |a| a.echo_jitter);
        if sd == 0.0 {
            return;
        }
        let draw = |pos: usize, token: u32| {
            let sub = ((prompt as u64) << 48) ^ ((pos as u64) << 20) ^ u64::from(token);
            sd * self.rng(TAG_JITTER, sub).normal()
        };
        for (pos, p) in s.positions.iter_mut().enumerate() {
            // the listed tokens once each: the alternatives, and the own token where it is not
            // one of them
            let own_listed = p.top.iter().any(|a| a.token == p.token);
            let own = p.logprob.filter(|_| !own_listed).map(|lp| (p.token, lp));
            let listed = p.top.iter().map(|a| (a.token, a.logprob)).chain(own);
            let moved: f64 = listed
                .map(|(t, lp)| f64::from(lp).exp() * (draw(pos, t).exp() - 1.0))
                .sum();
            let log_z = moved.ln_1p();
            let shift = |t: u32, lp: f32| (f64::from(lp) + draw(pos, t) - log_z).min(0.0) as f32;
            if let Some(lp) = p.logprob {
                p.logprob = Some(shift(p.token, lp));
            }
            for a in &mut p.top {
                a.logprob = shift(a.token, a.logprob);
            }
            p.top
                .sort_by(|a, b| b.logprob.total_cmp(&a.logprob).then(a.token.cmp(&b.token)));
        }
    }

    /// For choice `choice` of this request: the index of the generated token that the
    /// repeat bug repeats until `max_tokens`, if the bug strikes this generation.
    pub(crate) fn repeat_from(&self, choice: u32, max_tokens: usize) -> Option<usize> {
        let r = self.profile.repeat_bug.as_ref()?;
        let mut rng = self.rng(TAG_REPEAT, u64::from(choice));
        let strikes = rng.next_f64() < r.probability;
        let window = max_tokens.clamp(1, REPEAT_WINDOW) as u64;
        strikes.then(|| rng.below(window) as usize)
    }

    /// Whether this profile corrupts tool calls (a corrupted call is only known whole, so
    /// forced calls are then streamed in one delta).
    pub(crate) fn corrupts_tool_calls(&self) -> bool {
        self.profile.tool_calls.is_some()
    }

    /// Corrupts a fraction of one choice's tool calls; `tools` are the request's tool
    /// definitions (their names and `parameters.required` are consulted).
    pub(crate) fn corrupt_tool_calls(&self, choice: u32, calls: &mut [ToolCall], tools: &[Value]) {
        let Some(t) = &self.profile.tool_calls else {
            return;
        };
        for (i, call) in calls.iter_mut().enumerate() {
            let mut rng = self.rng(TAG_TOOLS, (u64::from(choice) << 20) | i as u64);
            if rng.next_f64() >= t.corrupt_fraction || t.modes.is_empty() {
                continue;
            }
            let mode = t.modes[rng.below(t.modes.len() as u64) as usize];
            let f = &mut call.function;
            match mode {
                ToolCorruption::InvalidJson => f.arguments = invalid_json(&f.arguments),
                ToolCorruption::UnknownName => f.name = unknown_name(&f.name, tools),
                ToolCorruption::MissingRequired => {
                    match drop_required(&f.name, &f.arguments, tools, &mut rng) {
                        Some(args) => f.arguments = args,
                        // nothing required to remove: the call is broken the other way
                        None => f.arguments = invalid_json(&f.arguments),
                    }
                }
            }
        }
    }
}

/// The names the request declared.
fn declared_names(tools: &[Value]) -> Vec<&str> {
    tools
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .collect()
}

/// Arguments cut in the middle (a truncated generation), guaranteed not to parse.
fn invalid_json(args: &str) -> String {
    let n = args.chars().count();
    let cut: String = args.chars().take(n / 2).collect();
    if serde_json::from_str::<Value>(&cut).is_err() {
        cut
    } else {
        format!("{{{cut}")
    }
}

/// A function name close to the real one but not declared.
fn unknown_name(name: &str, tools: &[Value]) -> String {
    let declared = declared_names(tools);
    let mut candidate = format!("{name}_v2");
    while declared.contains(&candidate.as_str()) {
        candidate.push('_');
    }
    candidate
}

/// The arguments without one required parameter that they had; None if there is none.
fn drop_required(name: &str, args: &str, tools: &[Value], rng: &mut SplitMix64) -> Option<String> {
    let tool = tools
        .iter()
        .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))?;
    let required: Vec<&str> = tool
        .pointer("/function/parameters/required")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut obj = match serde_json::from_str::<Value>(args).ok()? {
        Value::Object(o) => o,
        _ => return None,
    };
    let present: Vec<&str> = required
        .into_iter()
        .filter(|r| obj.contains_key(*r))
        .collect();
    let victim = *present.get(rng.below(present.len() as u64) as usize)?;
    obj.remove(victim);
    Some(Value::Object(obj).to_string())
}

/// Generation events with the repeat bug: tokens pass through until the one at index
/// `at`; from then on (the engine's generation cancelled) that token is emitted again and
/// again until `max_tokens`, ignoring stop tokens. A generation that stops on a stop token
/// before `at` repeats its last token instead. With `at` = None, a plain pass-through.
pub(crate) struct GenSource {
    inner: Option<mpsc::UnboundedReceiver<GenEvent>>,
    at: Option<usize>,
    max_tokens: usize,
    prompt_tokens: usize,
    seen: usize,
    last: Option<GeneratedToken>,
    repeating: Option<GeneratedToken>,
    done: bool,
}

impl GenSource {
    pub(crate) fn new(
        rx: mpsc::UnboundedReceiver<GenEvent>,
        at: Option<usize>,
        max_tokens: usize,
        prompt_tokens: usize,
    ) -> Self {
        Self {
            inner: Some(rx),
            at,
            max_tokens,
            prompt_tokens,
            seen: 0,
            last: None,
            repeating: None,
            done: false,
        }
    }

    /// The next event; None once the generation is over (or the engine went away).
    pub(crate) async fn recv(&mut self) -> Option<GenEvent> {
        loop {
            if self.done {
                return None;
            }
            if let Some(t) = &self.repeating {
                if self.seen >= self.max_tokens {
                    self.done = true;
                    return Some(GenEvent::Done(Finish {
                        reason: FinishReason::Length,
                        stop_token: None,
                        prompt_tokens: self.prompt_tokens,
                        completion_tokens: self.seen,
                    }));
                }
                self.seen += 1;
                return Some(GenEvent::Token(t.clone()));
            }
            let ev = self.inner.as_mut()?.recv().await;
            match ev {
                Some(GenEvent::Token(t)) => {
                    self.seen += 1;
                    if self.at == Some(self.seen - 1) {
                        self.repeating = Some(t.clone());
                        self.inner = None; // cancels the engine's generation
                    } else if self.at.is_some() {
                        self.last = Some(t.clone());
                    }
                    return Some(GenEvent::Token(t));
                }
                Some(GenEvent::Done(f))
                    if f.reason == FinishReason::Stop
                        && self.last.is_some()
                        && self.seen < self.max_tokens =>
                {
                    self.inner = None;
                    self.repeating = self.last.take();
                }
                other => {
                    if other.is_none()
                        || matches!(other, Some(GenEvent::Done(_) | GenEvent::Error(_)))
                    {
                        self.inner = None;
                        self.done = other.is_some();
                    }
                    return other;
                }
            }
        }
    }
}

/// Applies the request-level faults around `/v1/completions` and `/v1/chat/completions`:
/// numbering, latency, injected errors, the handler's [`RequestFaults`], stream cuts.
pub(crate) async fn middleware(
    State(state): State<ServerState>,
    mut req: Request,
    next: Next,
) -> Response {
    let faults = state.inner.faults.begin();
    let delay = faults.latency();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match faults.outcome() {
        Outcome::Serve => {}
        Outcome::Error500 => {
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
                None,
            )
            .into_response();
        }
        Outcome::Error429 => {
            let mut r = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("Rate limit reached for requests. Please try again in {RETRY_AFTER_S}s."),
                "requests",
                Some("rate_limit_exceeded"),
            )
            .into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
            return r;
        }
    }
    let cut = faults.disconnect_after();
    req.extensions_mut().insert(faults);
    let resp = next.run(req).await;
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    match cut {
        Some(after) if is_sse && resp.status() == StatusCode::OK => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, cut_body(body, after))
        }
        _ => resp,
    }
}

/// A body that delivers `after` chunks (each an SSE event), but never the last one, then
/// fails, which makes the server drop the connection mid-response.
fn cut_body(body: Body, after: u64) -> Body {
    struct St {
        inner: axum::body::BodyDataStream,
        sent: u64,
        pending: Option<Bytes>,
        over: bool,
    }
    let st = St {
        inner: body.into_data_stream(),
        sent: 0,
        pending: None,
        over: false,
    };
    let cut = || {
        std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "profile: connection dropped mid-stream",
        )
    };
    let stream = futures_util::stream::unfold(st, move |mut s| async move {
        if s.over {
            return None;
        }
        loop {
            match s.inner.next().await {
                Some(Ok(b)) => {
                    if let Some(p) = s.pending.replace(b) {
                        if s.sent >= after {
                            s.over = true;
                            return Some((Err(cut()), s));
                        }
                        s.sent += 1;
                        return Some((Ok(p), s));
                    }
                }
                Some(Err(e)) => {
                    s.over = true;
                    return Some((Err(std::io::Error::other(e)), s));
                }
                None => {
                    s.over = true;
                    return Some((Err(cut()), s));
                }
            }
        }
    });
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_streams_are_fixed_and_distinct() {
        // the first output of SplitMix64 from state 0 (the reference implementation's value)
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let a: Vec<u64> = (0..4)
            .map(|_| SplitMix64::keyed(7, 3, TAG_ERRORS, 0).next_u64())
            .collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let b = SplitMix64::keyed(7, 4, TAG_ERRORS, 0).next_u64();
        let c = SplitMix64::keyed(7, 3, TAG_LATENCY, 0).next_u64();
        let d = SplitMix64::keyed(8, 3, TAG_ERRORS, 0).next_u64();
        assert!(a[0] != b && a[0] != c && a[0] != d && b != c);
    }

    #[test]
    fn lognormal_has_the_configured_median_and_p99() {
        let mut rng = SplitMix64::new(42);
        let mut v: Vec<f64> = (0..20_000)
            .map(|_| lognormal_ms(&mut rng, 20.0, Some(200.0)))
            .collect();
        v.sort_by(f64::total_cmp);
        let median = v[v.len() / 2];
        let p99 = v[v.len() * 99 / 100];
        assert!((median / 20.0 - 1.0).abs() < 0.05, "median {median}");
        assert!((p99 / 200.0 - 1.0).abs() < 0.15, "p99 {p99}");
        assert_eq!(lognormal_ms(&mut rng, 50.0, None), 50.0);
        assert_eq!(lognormal_ms(&mut rng, 0.0, Some(10.0)), 0.0);
    }

    #[test]
    fn truncation_keeps_the_end_or_both_ends() {
        let mut p = Profile::builtin("truncate-512").unwrap_or_default();
        let f = Faults::new(p.clone());
        let mut ids: Vec<u32> = (0..600).collect();
        assert!(f.truncate(&mut ids));
        assert_eq!(ids, (88..600).collect::<Vec<u32>>());
        let mut short: Vec<u32> = (0..512).collect();
        assert!(!f.truncate(&mut short));
        if let Some(t) = p.truncation.as_mut() {
            t.drop = TruncateDrop::Middle;
            t.max_prompt_tokens = 5;
        }
        let f = Faults::new(p);
        let mut ids: Vec<u32> = (0..10).collect();
        assert!(f.truncate(&mut ids));
        assert_eq!(ids, vec![0, 1, 7, 8, 9]);
    }

    fn weather_tool() -> Value {
        serde_json::json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                           "required": ["city", "unit"]}}})
    }

    #[test]
    fn every_corruption_breaks_the_call() {
        let tools = vec![weather_tool()];
        let args = r#"{"city":"Paris","unit":"C"}"#;
        assert!(serde_json::from_str::<Value>(&invalid_json(args)).is_err());
        assert!(serde_json::from_str::<Value>(&invalid_json("{}")).is_err());
        assert!(serde_json::from_str::<Value>(&invalid_json("1")).is_err());
        let name = unknown_name("get_weather", &tools);
        assert!(!declared_names(&tools).contains(&name.as_str()));
        let mut rng = SplitMix64::new(1);
        let dropped = drop_required("get_weather", args, &tools, &mut rng).unwrap_or_default();
        let v: Value = serde_json::from_str(&dropped).unwrap_or(Value::Null);
        let o = v.as_object().cloned().unwrap_or_default();
        assert_eq!(o.len(), 1, "{dropped}");
        assert!(drop_required("get_weather", "{}", &tools, &mut rng).is_none());
        assert!(drop_required("other", args, &tools, &mut rng).is_none());
    }

    #[test]
    fn template_variants_rewrite_the_messages() {
        let msgs = vec![
            serde_json::json!({"role": "system", "content": "S"}),
            serde_json::json!({"role": "user", "content": "U"}),
            serde_json::json!({"role": "assistant", "content": "A"}),
        ];
        let f = Faults::new(Profile::builtin("drop-system").unwrap_or_default());
        assert_eq!(f.template_messages(&msgs).len(), 2);
        let mut p = Profile::builtin("drop-system").unwrap_or_default();
        if let Some(c) = p.chat_template.as_mut() {
            c.variant = TemplateVariant::WrongRoleTags;
        }
        let roles: Vec<Value> = Faults::new(p.clone())
            .template_messages(&msgs)
            .iter()
            .map(|m| m["role"].clone())
            .collect();
        assert_eq!(roles, vec!["system", "human", "bot"]);
        if let Some(c) = p.chat_template.as_mut() {
            c.variant = TemplateVariant::DefaultSystem;
            c.system_prompt = Some("You are a pirate.".into());
        }
        let f = Faults::new(p);
        assert_eq!(f.template_messages(&msgs).len(), 3);
        let out = f.template_messages(&msgs[1..]);
        assert_eq!(
            out[0],
            serde_json::json!({"role": "system", "content": "You are a pirate."})
        );
        assert_eq!(
            Faults::new(Profile::default())
                .template_messages(&msgs)
                .len(),
            3
        );
    }
}
