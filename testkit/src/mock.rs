//! [`MockUpstream`]: an OpenAI-protocol provider on a loopback port that answers from a
//! scripted queue of [`Behavior`]s and records every request it receives.
//!
//! ```no_run
//! # async fn demo() -> Result<(), samewise_testkit::TestkitError> {
//! use samewise_testkit::{Behavior, MockUpstream};
//! let mock = MockUpstream::builder()
//!     .name("a")
//!     .behavior(Behavior::Status(500, "{}".into()))
//!     .start()
//!     .await?;
//! // point a provider's base_url at mock.base_url(); the first completion gets a 500,
//! // later ones the default answer
//! let seen = mock.requests();
//! mock.shutdown().await;
//! # let _ = seen; Ok(()) }
//! ```

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::TestkitError;
use crate::behavior::{Behavior, Reply};
use crate::chaos::Chaos;
use crate::http1::{self, Conn, LAST_CHUNK};
use crate::render::{self, Answer, Endpoint, Parsed};

/// Pause between the separate writes of a split body, so the reader sees separate reads.
const SPLIT_PAUSE: Duration = Duration::from_millis(3);

/// A running mock provider. Dropping it stops it (connections close as their tasks see the
/// cancellation); [`MockUpstream::shutdown`] also waits for every task to finish.
pub struct MockUpstream {
    /// The bound loopback address.
    addr: SocketAddr,
    /// State shared with the connection tasks.
    shared: Arc<Shared>,
    /// Cancels the accept loop and every connection (including held-open ones).
    cancel: CancellationToken,
    /// Every task the mock spawned, so shutdown can drain them.
    tracker: TaskTracker,
}

/// Configures a [`MockUpstream`]; see [`MockUpstream::builder`].
#[derive(Debug, Clone)]
pub struct MockUpstreamBuilder {
    /// Appears in default answers, ids and the `x-mock-upstream` header.
    name: String,
    /// Listed by `GET /v1/models`.
    models: Vec<String>,
    /// Behaviors consumed one per completion request, in order.
    queue: VecDeque<Behavior>,
    /// The behavior once the queue is empty.
    default: Behavior,
    /// Keep request bodies (off for load tests, where they would pile up).
    record_bodies: bool,
    /// Keep requests at all (off for load tests; they are still counted).
    record: bool,
    /// Where to listen; `127.0.0.1:0` unless set.
    bind: String,
    /// Draws unscripted answers from a seeded fault stream instead of the default.
    chaos: Option<Chaos>,
}

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target (path and query).
    pub path: String,
    /// Header names lower-cased, values as sent, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The raw body bytes after transfer decoding (empty when recording bodies is off).
    pub body: Bytes,
}

struct Shared {
    name: String,
    models: Vec<String>,
    queue: Mutex<VecDeque<Behavior>>,
    default: Mutex<Behavior>,
    record_bodies: bool,
    record: bool,
    requests: Mutex<Vec<RecordedRequest>>,
    /// Requests seen so far (also numbers the answers' ids).
    seen: AtomicU64,
    /// Woken on every arriving request, for [`MockUpstream::wait_for_requests`].
    arrived: Notify,
    /// Requests held unanswered by [`Behavior::Hang`] right now.
    hanging: AtomicUsize,
    /// The seeded fault stream unscripted completions are answered from, when set.
    chaos: Option<Mutex<Chaos>>,
    /// Completion requests (`POST /v1/chat/completions`, `/v1/completions`) seen so far.
    completions: AtomicU64,
}

/// Counts one hung request while alive.
struct Held<'a>(&'a AtomicUsize);

impl<'a> Held<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Held(count)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a connection does after answering.
enum Flow {
    KeepAlive,
    Close,
}

impl MockUpstreamBuilder {
    /// Names the mock (default `"mock"`).
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Adds a model id to `GET /v1/models` (default: `mock-model` when none is added).
    #[must_use]
    pub fn model(mut self, id: &str) -> Self {
        self.models.push(id.to_owned());
        self
    }

    /// Queues a behavior for the next completion request not yet scripted.
    #[must_use]
    pub fn behavior(mut self, behavior: Behavior) -> Self {
        self.queue.push_back(behavior);
        self
    }

    /// Queues several behaviors in order.
    #[must_use]
    pub fn behaviors(mut self, behaviors: impl IntoIterator<Item = Behavior>) -> Self {
        self.queue.extend(behaviors);
        self
    }

    /// The behavior once the queue is empty (default: the well-formed default reply).
    #[must_use]
    pub fn default_behavior(mut self, behavior: Behavior) -> Self {
        self.default = behavior;
        self
    }

    /// Whether recorded requests keep their bodies (default true).
    #[must_use]
    pub fn record_bodies(mut self, on: bool) -> Self {
        self.record_bodies = on;
        self
    }

    /// Whether requests are recorded at all (default true; they are always counted).
    #[must_use]
    pub fn record(mut self, on: bool) -> Self {
        self.record = on;
        self
    }

    /// Listens on this address instead of `127.0.0.1:0`.
    #[must_use]
    pub fn bind(mut self, addr: &str) -> Self {
        self.bind = addr.to_owned();
        self
    }

    /// Answers every completion the queue does not script from this seeded fault stream
    /// (chaos runs; the default behavior is then never used).
    #[must_use]
    pub fn chaos(mut self, chaos: Chaos) -> Self {
        self.chaos = Some(chaos);
        self
    }

    /// Binds the listener and starts serving.
    pub async fn start(self) -> Result<MockUpstream, TestkitError> {
        let listener =
            TcpListener::bind(&self.bind)
                .await
                .map_err(|source| TestkitError::Bind {
                    addr: self.bind.clone(),
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| TestkitError::Bind {
            addr: self.bind.clone(),
            source,
        })?;
        let models = if self.models.is_empty() {
            vec!["mock-model".to_owned()]
        } else {
            self.models
        };
        let shared = Arc::new(Shared {
            name: self.name,
            models,
            queue: Mutex::new(self.queue),
            default: Mutex::new(self.default),
            record_bodies: self.record_bodies,
            record: self.record,
            requests: Mutex::new(Vec::new()),
            hanging: AtomicUsize::new(0),
            chaos: self.chaos.map(Mutex::new),
            completions: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            arrived: Notify::new(),
        });
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracker.spawn(accept_loop(
            listener,
            shared.clone(),
            cancel.clone(),
            tracker.clone(),
        ));
        Ok(MockUpstream {
            addr,
            shared,
            cancel,
            tracker,
        })
    }
}

impl MockUpstream {
    /// A builder with defaults: name `mock`, model `mock-model`, empty queue, default reply.
    pub fn builder() -> MockUpstreamBuilder {
        MockUpstreamBuilder {
            name: "mock".to_owned(),
            models: Vec::new(),
            queue: VecDeque::new(),
            default: Behavior::Ok(Reply::default()),
            record_bodies: true,
            record: true,
            bind: "127.0.0.1:0".to_owned(),
            chaos: None,
        }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`, the value a provider's `base_url` takes.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The mock's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Queues a behavior for the next completion request not yet scripted.
    pub fn push(&self, behavior: Behavior) {
        lock(&self.shared.queue).push_back(behavior);
    }

    /// Replaces the behavior used once the queue is empty.
    pub fn set_default(&self, behavior: Behavior) {
        *lock(&self.shared.default) = behavior;
    }

    /// Behaviors still queued.
    pub fn queued(&self) -> usize {
        lock(&self.shared.queue).len()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests arrived so far (of any path).
    pub fn request_count(&self) -> usize {
        usize::try_from(self.shared.seen.load(Ordering::SeqCst)).unwrap_or(usize::MAX)
    }

    /// Completion requests (`POST /v1/chat/completions` and `/v1/completions`) received so
    /// far: the attempts a gateway made here.
    pub fn completion_count(&self) -> u64 {
        self.shared.completions.load(Ordering::SeqCst)
    }

    /// Requests held unanswered by [`Behavior::Hang`] right now: one leaves the count when its
    /// client closes the connection (or the mock shuts down).
    pub fn hanging(&self) -> usize {
        self.shared.hanging.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests have arrived, or fails at the deadline.
    pub async fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedRequest>, TestkitError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.request_count() >= n {
                return Ok(self.requests());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(TestkitError::WaitTimeout {
                    wanted: n,
                    seen: self.request_count(),
                });
            }
        }
    }

    /// Stops accepting, closes every connection (held-open streams too) and waits for all
    /// of the mock's tasks to finish.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.tracker.close();
    }
}

impl RecordedRequest {
    /// The first value of a header (name matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// A poisoned lock only means a test thread panicked while holding it; the data is still fine
/// for a test double.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tracker.spawn(serve_conn(stream, shared.clone(), cancel.clone()));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "mock upstream: accept failed");
                    // out of descriptors or similar: back off instead of spinning
                    if pause(&cancel, Duration::from_millis(20)).await {
                        return;
                    }
                }
            },
        }
    }
}

async fn serve_conn(stream: TcpStream, shared: Arc<Shared>, cancel: CancellationToken) {
    // best effort: without it small writes may be delayed, which only slows a test down
    let _ = stream.set_nodelay(true);
    let mut conn = Conn::new(stream);
    loop {
        let request = tokio::select! {
            () = cancel.cancelled() => return,
            r = conn.read_request() => r,
        };
        let Ok(Some(request)) = request else { return };
        let seq = shared.seen.load(Ordering::SeqCst) + 1;
        if shared.record {
            let mut log = lock(&shared.requests);
            log.push(RecordedRequest {
                method: request.method.clone(),
                path: request.path.clone(),
                headers: request.headers.clone(),
                body: if shared.record_bodies {
                    request.body.clone()
                } else {
                    Bytes::new()
                },
            });
            shared.seen.fetch_add(1, Ordering::SeqCst);
        } else {
            shared.seen.fetch_add(1, Ordering::SeqCst);
        }
        shared.arrived.notify_waiters();
        match answer(&mut conn, &request, &shared, &cancel, seq).await {
            Ok(Flow::KeepAlive) if request.keep_alive => {}
            _ => return,
        }
    }
}

/// Answers one request.
async fn answer(
    conn: &mut Conn,
    req: &http1::Request,
    shared: &Shared,
    cancel: &CancellationToken,
    seq: u64,
) -> std::io::Result<Flow> {
    let path = req.path.split('?').next().unwrap_or_default();
    let endpoint = match (req.method.as_str(), path) {
        ("GET", "/v1/models") => {
            let data: Vec<serde_json::Value> = shared
                .models
                .iter()
                .map(|m| serde_json::json!({"id": m, "object": "model", "created": 1_700_000_000u64, "owned_by": shared.name}))
                .collect();
            let body = serde_json::json!({"object": "list", "data": data}).to_string();
            return write_full(conn, shared, req, 200, &[], body.as_bytes()).await;
        }
        ("POST", "/v1/chat/completions") => Endpoint::Chat,
        ("POST", "/v1/completions") => Endpoint::Completions,
        (_, "/v1/models" | "/v1/chat/completions" | "/v1/completions") => {
            let body = render::error_body("method not allowed", "invalid_request_error", None);
            return write_full(conn, shared, req, 405, &[], body.as_bytes()).await;
        }
        _ => {
            let body = render::error_body(
                &format!("unknown path {path}"),
                "invalid_request_error",
                Some("not_found"),
            );
            return write_full(conn, shared, req, 404, &[], body.as_bytes()).await;
        }
    };
    shared.completions.fetch_add(1, Ordering::SeqCst);
    let parsed = match Parsed::from_body(endpoint, &req.body) {
        Ok(p) => p,
        Err(message) => {
            let body = render::error_body(&message, "invalid_request_error", None);
            return write_full(conn, shared, req, 400, &[], body.as_bytes()).await;
        }
    };
    let scripted = lock(&shared.queue).pop_front();
    let behavior = scripted
        .or_else(|| shared.chaos.as_ref().map(|c| lock(c).next_behavior()))
        .unwrap_or_else(|| lock(&shared.default).clone());
    if let Some(reply) = behavior.reply() {
        return write_reply(conn, shared, req, &parsed, &reply, cancel, seq).await;
    }
    let default = Reply::default();
    let answer = Answer::new(&parsed, &default, &shared.name, seq);
    match behavior {
        Behavior::Status(status, body) => {
            write_full(conn, shared, req, status, &[], body.as_bytes()).await
        }
        Behavior::RateLimited { retry_after } => {
            let headers: Vec<(&str, String)> = retry_after
                .map(|s| ("retry-after", s.to_string()))
                .into_iter()
                .collect();
            let body = render::error_body(
                "Rate limit reached for requests",
                "requests",
                Some("rate_limit_exceeded"),
            );
            write_full(conn, shared, req, 429, &headers, body.as_bytes()).await
        }
        Behavior::ResetBeforeResponse => {
            conn.stream.set_zero_linger()?;
            Ok(Flow::Close)
        }
        Behavior::ResetAfterBytes(n) => {
            let (head, body) = if parsed.stream {
                (stream_head(shared), answer.events().concat().into_bytes())
            } else {
                let body = answer.full_body();
                (json_head(shared, 200, &[], Some(body.len()), false), body)
            };
            conn.stream.write_all(head.as_bytes()).await?;
            let part = &body[..n.min(body.len())];
            if !part.is_empty() {
                if parsed.stream {
                    conn.stream.write_all(&http1::chunk(part)).await?;
                } else {
                    conn.stream.write_all(part).await?;
                }
            }
            conn.stream.flush().await?;
            // let the bytes leave before the reset discards the send buffer
            if pause(cancel, SPLIT_PAUSE).await {
                return Ok(Flow::Close);
            }
            conn.stream.set_zero_linger()?;
            Ok(Flow::Close)
        }
        Behavior::MalformedJson => {
            if parsed.stream {
                let events = answer.events();
                let mut body = events.first().cloned().unwrap_or_default();
                body.push_str("data: {\"id\": \"chatcmpl-broken\", \"choices\": [{\"delta\": {\"content\": \"oops\"\n\n");
                body.push_str("data: [DONE]\n\n");
                write_stream_body(conn, shared, &[body]).await
            } else {
                let body = format!(
                    "{{\"id\":\"{}\",\"object\":\"chat.completion\",\"model\":\"{}\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"trunc",
                    answer.id, parsed.model
                );
                write_full(conn, shared, req, 200, &[], body.as_bytes()).await
            }
        }
        Behavior::BrokenSse => {
            let events = answer.events();
            let mut body: String = events.iter().take(2).map(String::as_str).collect();
            if let Some(third) = events.get(2) {
                body.push_str(&third[..floor_boundary(third, third.len() / 2)]);
            }
            if parsed.stream {
                write_stream_body(conn, shared, &[body]).await
            } else {
                let head = http1::response_head(
                    200,
                    &common_headers(shared, "text/event-stream"),
                    Some(body.len()),
                    req.keep_alive,
                );
                conn.stream.write_all(head.as_bytes()).await?;
                conn.stream.write_all(body.as_bytes()).await?;
                Ok(Flow::KeepAlive)
            }
        }
        Behavior::NeverEnds => {
            if parsed.stream {
                conn.stream
                    .write_all(stream_head(shared).as_bytes())
                    .await?;
                for event in answer.events().iter().take(2) {
                    conn.stream
                        .write_all(&http1::chunk(event.as_bytes()))
                        .await?;
                }
            } else {
                let body = answer.full_body();
                conn.stream
                    .write_all(json_head(shared, 200, &[], Some(body.len()), false).as_bytes())
                    .await?;
                conn.stream.write_all(&body[..body.len() / 2]).await?;
            }
            conn.stream.flush().await?;
            cancel.cancelled().await;
            Ok(Flow::Close)
        }
        Behavior::Hang => {
            let _held = Held::new(&shared.hanging);
            let mut scratch = [0u8; 1024];
            tokio::select! {
                () = cancel.cancelled() => {}
                // until the client closes (EOF or a reset); anything it sends is ignored
                () = async {
                    while matches!(conn.stream.read(&mut scratch).await, Ok(n) if n > 0) {}
                } => {}
            }
            Ok(Flow::Close)
        }
        // the well-formed behaviors were answered above
        Behavior::Ok(_)
        | Behavior::DelayHeaders(_)
        | Behavior::DelayBetweenChunks(_)
        | Behavior::SplitEvents
        | Behavior::ToolCalls { .. }
        | Behavior::Logprobs
        | Behavior::RepeatToken { .. }
        | Behavior::NoUsage => Ok(Flow::Close),
    }
}

async fn write_reply(
    conn: &mut Conn,
    shared: &Shared,
    req: &http1::Request,
    parsed: &Parsed,
    reply: &Reply,
    cancel: &CancellationToken,
    seq: u64,
) -> std::io::Result<Flow> {
    if !reply.header_delay.is_zero() && pause(cancel, reply.header_delay).await {
        return Ok(Flow::Close);
    }
    let answer = Answer::new(parsed, reply, &shared.name, seq);
    if !parsed.stream {
        let body = answer.full_body();
        if !reply.split_writes {
            return write_full(conn, shared, req, 200, &[], &body).await;
        }
        conn.stream
            .write_all(json_head(shared, 200, &[], Some(body.len()), req.keep_alive).as_bytes())
            .await?;
        for piece in awkward_pieces(&body) {
            conn.stream.write_all(piece).await?;
            conn.stream.flush().await?;
            if pause(cancel, SPLIT_PAUSE).await {
                return Ok(Flow::Close);
            }
        }
        return Ok(Flow::KeepAlive);
    }
    if reply.one_write && reply.chunk_delay.is_zero() && !reply.split_writes {
        let mut all = stream_head(shared).into_bytes();
        for event in answer.events() {
            all.extend_from_slice(&http1::chunk(event.as_bytes()));
        }
        all.extend_from_slice(LAST_CHUNK);
        conn.stream.write_all(&all).await?;
        return Ok(Flow::KeepAlive);
    }
    conn.stream
        .write_all(stream_head(shared).as_bytes())
        .await?;
    for (i, event) in answer.events().iter().enumerate() {
        if i > 0 && !reply.chunk_delay.is_zero() && pause(cancel, reply.chunk_delay).await {
            return Ok(Flow::Close);
        }
        if reply.split_writes {
            for piece in awkward_pieces(event.as_bytes()) {
                conn.stream.write_all(&http1::chunk(piece)).await?;
                conn.stream.flush().await?;
                if pause(cancel, SPLIT_PAUSE).await {
                    return Ok(Flow::Close);
                }
            }
        } else {
            conn.stream
                .write_all(&http1::chunk(event.as_bytes()))
                .await?;
        }
    }
    conn.stream.write_all(LAST_CHUNK).await?;
    Ok(Flow::KeepAlive)
}

/// A complete chunked SSE response of these body parts.
async fn write_stream_body(
    conn: &mut Conn,
    shared: &Shared,
    parts: &[String],
) -> std::io::Result<Flow> {
    conn.stream
        .write_all(stream_head(shared).as_bytes())
        .await?;
    for part in parts.iter().filter(|p| !p.is_empty()) {
        conn.stream
            .write_all(&http1::chunk(part.as_bytes()))
            .await?;
    }
    conn.stream.write_all(LAST_CHUNK).await?;
    Ok(Flow::KeepAlive)
}

async fn write_full(
    conn: &mut Conn,
    shared: &Shared,
    req: &http1::Request,
    status: u16,
    extra: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<Flow> {
    let mut out = json_head(shared, status, extra, Some(body.len()), req.keep_alive).into_bytes();
    out.extend_from_slice(body);
    conn.stream.write_all(&out).await?;
    Ok(Flow::KeepAlive)
}

fn common_headers(shared: &Shared, content_type: &str) -> Vec<(&'static str, String)> {
    vec![
        ("content-type", content_type.to_owned()),
        ("x-mock-upstream", shared.name.clone()),
    ]
}

fn json_head(
    shared: &Shared,
    status: u16,
    extra: &[(&str, String)],
    len: Option<usize>,
    keep_alive: bool,
) -> String {
    let mut headers = common_headers(shared, "application/json");
    headers.extend(extra.iter().map(|(n, v)| (*n, v.clone())));
    http1::response_head(status, &headers, len, keep_alive)
}

fn stream_head(shared: &Shared) -> String {
    let mut headers = common_headers(shared, "text/event-stream");
    headers.push(("cache-control", "no-cache".to_owned()));
    http1::response_head(200, &headers, None, true)
}

/// Splits bytes at awkward offsets: after the first byte (inside `data:`), after seven bytes
/// (inside the JSON), in the middle, and before the last byte (between the two `\n`s).
fn awkward_pieces(bytes: &[u8]) -> Vec<&[u8]> {
    let len = bytes.len();
    let mut cuts: Vec<usize> = [1, 7, len / 2, len.saturating_sub(1)]
        .into_iter()
        .filter(|&c| c > 0 && c < len)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts {
        pieces.push(&bytes[start..cut]);
        start = cut;
    }
    pieces.push(&bytes[start..]);
    pieces
}

fn floor_boundary(s: &str, mut at: usize) -> usize {
    while at > 0 && !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Sleeps unless cancelled first; true when cancelled.
async fn pause(cancel: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        () = cancel.cancelled() => true,
        () = tokio::time::sleep(d) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::awkward_pieces;

    #[test]
    fn awkward_pieces_cover_the_input_in_order() {
        for s in [&b""[..], b"a", b"ab", b"data: {}\n\n", b"data: [DONE]\n\n"] {
            let pieces = awkward_pieces(s);
            assert_eq!(pieces.concat(), s);
            assert!(pieces.len() == 1 || pieces.iter().all(|p| !p.is_empty()));
        }
    }
}
