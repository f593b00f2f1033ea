//! The HTTP surface: [`router`] maps routes to thin handlers over [`AppState`], and [`serve`]
//! runs it on a listener, on serving threads of their own (see [`serve_router_with`]), until a
//! shutdown future resolves, then waits for in-flight requests
//! (streams included) to finish — for at most the drain timeout (`[server] drain_timeout_ms`).
//! At the deadline every response still open is cut (a body mid-stream ends with an error, so
//! its connection closes; a request still waiting for its answer gets a 503) and the server
//! returns: a client trickling a stream cannot hold the exit forever.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body::Frame;
use samewise_wire::{ModelList, ModelObject};
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::body::Route;
use crate::config::Config;
use crate::cors::Cors;
use crate::error::ApiError;
use crate::forward;
use crate::record::RequestCtx;
use crate::state::AppState;

/// The gateway's routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
/// `/v1/models/{model}`, `/metrics`, `/healthz`; anything else is an OpenAI-shaped 404.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*model}", get(model))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The default of `[server] drain_timeout_ms`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// After the drain deadline has cut every open response, how long the server still waits for
/// the connections to close (a client stuck sending its request head has no response to cut)
/// before it returns anyway.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How [`serve_router_with`] serves: `[server] drain_timeout_ms` and `[server] threads`, and
/// the period of each serving thread's `TimerAnchor`.
#[derive(Debug, Clone)]
pub struct Serving {
    /// After shutdown, how long open requests and streams have to finish.
    pub drain: Duration,
    /// Serving threads (at least one is used).
    pub threads: usize,
    /// The period of the timer each serving thread keeps armed while it serves requests: at
    /// most the shortest timer a request arms (see `TimerAnchor`); None keeps none.
    pub timer_anchor: Option<Duration>,
    /// The origins whose browser pages may call the OpenAI routes (`[server]
    /// cors_allow_origins`), if any.
    pub cors: Option<Arc<Cors>>,
}

/// The shortest period a [`TimerAnchor`] ticks at: a gateway configured with shorter request
/// timers than this wakes its poller for them as it did without an anchor.
const ANCHOR_MIN: Duration = Duration::from_millis(10);
/// The longest period a [`TimerAnchor`] ticks at (while its thread serves requests).
const ANCHOR_MAX: Duration = Duration::from_secs(1);

impl Serving {
    /// How `config` serves: its `[server]` settings, and an anchor period no longer than any
    /// timer a request arms (first-byte floors, idle timeouts, hedging delays), within
    /// `ANCHOR_MIN`..=`ANCHOR_MAX`.
    pub fn of(config: &Config) -> Serving {
        let providers = config
            .providers
            .values()
            .flat_map(|p| [p.first_byte_floor, p.idle_timeout]);
        let hedges = config.models.values().filter_map(|m| m.hedge_after);
        let shortest = providers.chain(hedges).min().unwrap_or(ANCHOR_MAX);
        Serving {
            drain: config.server.drain_timeout,
            threads: config.server.threads,
            timer_anchor: Some(shortest.clamp(ANCHOR_MIN, ANCHOR_MAX)),
            cors: config.server.cors.clone(),
        }
    }
}

/// A timer a serving thread keeps armed while it serves requests, so that the timers a request
/// arms (its first-byte deadline above all) are never the earliest of the thread's timers.
///
/// Why: tokio's timer driver computes, each time its thread parks, when it must wake next; a
/// timer armed earlier than that wakes the poller so that it parks again with a shorter timeout
/// (one eventfd `write` and one more `epoll_wait`). A serving thread that is idle between
/// requests has no timer at all, so every request paid that (`strace` at 1,000 JSON requests/s:
/// one `write` per request per serving thread). With a timer armed at most `period` ahead, and
/// no request timer shorter than `period`, a request's timers land behind it.
///
/// It ticks only while requests come ([`TimerAnchor::touch`], per request): an idle gateway
/// stays asleep, and the first request after a pause pays the wake-up once.
#[derive(Debug)]
struct TimerAnchor {
    period: Duration,
    /// [`PAUSED`], [`QUIET`] or [`RECENT`].
    state: AtomicU8,
    /// Wakes the ticking after a pause.
    resume: Notify,
    /// Periods ticked so far.
    ticks: AtomicU64,
}

/// A [`TimerAnchor`] waits, untimed, for a request.
const PAUSED: u8 = 0;
/// A [`TimerAnchor`] ticks; no request came since its last tick.
const QUIET: u8 = 1;
/// A [`TimerAnchor`] ticks; a request came since its last tick.
const RECENT: u8 = 2;

impl TimerAnchor {
    fn new(period: Duration) -> TimerAnchor {
        TimerAnchor {
            period,
            state: AtomicU8::new(PAUSED),
            resume: Notify::new(),
            ticks: AtomicU64::new(0),
        }
    }

    /// A request arrived on this thread.
    fn touch(&self) {
        if self.state.load(Ordering::Relaxed) != RECENT
            && self.state.swap(RECENT, Ordering::Relaxed) == PAUSED
        {
            self.resume.notify_one();
        }
    }

    /// Ticks every `period` while requests come, pauses after a period without one; runs
    /// until dropped with its runtime.
    async fn run(self: Arc<Self>) {
        loop {
            if self.state.swap(QUIET, Ordering::Relaxed) != RECENT {
                self.state.store(PAUSED, Ordering::Relaxed);
                self.resume.notified().await;
            }
            tokio::time::sleep(self.period).await;
            self.ticks.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Serves `router(state)` on `listener` until `shutdown` resolves, then drains in-flight
/// requests for at most the configured `[server] drain_timeout_ms`; on `[server] threads`
/// serving threads, each with HTTP clients of its own ([`AppState::for_shard`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), crate::ProxyError> {
    let opts = state.inner.serving.clone();
    serve_router_with(listener, || Ok(router(state.for_shard()?)), shutdown, opts).await
}

/// Serves the routers `app` makes (the gateway's [`router`], possibly merged with other
/// routers, such as the dashboards', at composition) on `listener` until `shutdown` resolves.
///
/// The serving threads: `opts.threads` OS threads, each running a single-threaded runtime
/// that accepts on (a duplicate of) `listener` and serves its connections with its own router
/// from `app` — so a request is read, forwarded, answered and recorded on one thread, and no
/// request wakes another thread (a multi-threaded runtime wakes an idle worker for nearly
/// every task it schedules: measured as the largest part of the gateway's CPU per request at
/// moderate rates). Whichever thread is free takes a new connection. Work that must outlive
/// the serving threads (the store's connections, background tasks) belongs on the caller's
/// runtime: see [`on_runtime`]. Accepted sockets get TCP_NODELAY.
///
/// Shutdown: after `shutdown` resolves, open requests and streams have `opts.drain` to
/// finish; then each is cut, its connection closes, and this returns (waiting at most a
/// further `CLOSE_GRACE` for the connections to go). Dropping the returned future stops the
/// serving threads too.
pub async fn serve_router_with(
    listener: tokio::net::TcpListener,
    app: impl Fn() -> Result<Router, crate::ProxyError>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    opts: Serving,
) -> Result<(), crate::ProxyError> {
    let cut = CancellationToken::new();
    let draining = CancellationToken::new();
    // cancelled when this future ends or is dropped: every serving thread then stops
    let force = CancellationToken::new();
    let _stop = force.clone().drop_guard();
    let listener = listener.into_std()?;
    let mut shards = Vec::with_capacity(opts.threads.max(1));
    for i in 0..opts.threads.max(1) {
        let anchor = opts.timer_anchor.map(|p| Arc::new(TimerAnchor::new(p)));
        let app = PerRequest {
            // every handler made into its service here, once per thread (see `shard`)
            router: app()?.with_state(()),
            // a child per thread: its requests lock that thread's token, not one both share
            cut: cut.child_token(),
            anchor: anchor.clone(),
            cors: opts.cors.clone(),
        };
        // each thread makes its runtime and registers its listener there (a runtime must not
        // be dropped on an async thread), and says whether that worked before it serves
        let accepting = listener.try_clone()?;
        let (ready, started) = tokio::sync::oneshot::channel::<std::io::Result<()>>();
        let (done, finished) = tokio::sync::oneshot::channel();
        let (draining, force) = (draining.clone(), force.clone());
        std::thread::Builder::new()
            .name(format!("sw-serve-{i}"))
            .spawn(move || {
                let made = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .and_then(|runtime| {
                        let l = {
                            let _in = runtime.enter();
                            tokio::net::TcpListener::from_std(accepting)?
                        };
                        Ok((runtime, l))
                    });
                let (runtime, accepting) = match made {
                    Ok(made) => made,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                if let Some(anchor) = anchor {
                    runtime.spawn(anchor.run());
                }
                let served = runtime.block_on(shard(accepting, app, draining, force));
                // tasks still running (connections past the grace) are dropped here
                runtime.shutdown_timeout(CLOSE_GRACE);
                let _ = done.send(served);
            })?;
        started
            .await
            .map_err(|_| std::io::Error::other("a serving thread ended abruptly"))??;
        shards.push(finished);
    }
    drop(listener);
    let all = futures_util::future::join_all(shards);
    tokio::pin!(all);
    tokio::select! {
        served = &mut all => return outcome(served),
        () = async {
            shutdown.await;
            draining.cancel();
            tokio::time::sleep(opts.drain).await;
        } => {}
    }
    tracing::warn!(
        drain_ms = u64::try_from(opts.drain.as_millis()).unwrap_or(u64::MAX),
        "drain deadline passed: closing the connections still open"
    );
    cut.cancel();
    if let Ok(served) = tokio::time::timeout(CLOSE_GRACE, &mut all).await {
        return outcome(served);
    }
    tracing::warn!("connections still open after the drain deadline; exiting anyway");
    force.cancel();
    outcome(all.await)
}

/// One serving thread's work: `app` on `listener` until `draining` fires and its connections
/// are done, or until `force` fires.
async fn shard(
    listener: tokio::net::TcpListener,
    app: PerRequest,
    draining: CancellationToken,
    force: CancellationToken,
) -> std::io::Result<()> {
    // Streamed answers are many small writes: without TCP_NODELAY on accepted sockets, Nagle's
    // algorithm and the client's delayed ACK add ~40 ms per stream (measured by bench/proxy).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted socket");
        }
    });
    // each connection gets a clone of `app` (the router behind an Arc): `axum::serve(listener,
    // router)` would re-make the router, every route's service cloned, per connection accepted
    let server = axum::serve(
        listener,
        axum::ServiceExt::<Request>::into_make_service(app),
    )
    .with_graceful_shutdown(draining.cancelled_owned())
    .into_future();
    tokio::select! {
        served = server => served,
        () = force.cancelled() => Ok(()),
    }
}

/// The first error of the serving threads, if any (a thread that ended without saying
/// counts as one).
fn outcome(
    served: Vec<Result<std::io::Result<()>, tokio::sync::oneshot::error::RecvError>>,
) -> Result<(), crate::ProxyError> {
    for s in served {
        match s {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(std::io::Error::other("a serving thread ended abruptly").into()),
        }
    }
    Ok(())
}

/// `router` with every request handled on `runtime` (the handler runs there; the response
/// body is polled by the serving thread). The composition puts the dashboards' routes on the
/// main runtime this way: whatever they open (database connections above all) then belongs
/// to the runtime that outlives the serving threads.
pub fn on_runtime(router: Router, runtime: tokio::runtime::Handle) -> Router {
    router.layer(axum::middleware::from_fn_with_state(runtime, run_on))
}

/// Middleware of [`on_runtime`].
async fn run_on(
    State(runtime): State<tokio::runtime::Handle>,
    req: Request,
    next: Next,
) -> Response {
    match runtime.spawn(next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::ShuttingDown.into_response(),
    }
}

/// What a serving thread serves: its router, with what each request does first: touch the
/// thread's [`TimerAnchor`], and, once `cut` fires (the drain deadline), answer a request still
/// waiting for its answer with a 503 and end a response body still open with an error; with
/// [`Cors`] on, a browser's preflight to an OpenAI route is answered here, before the router,
/// and an allowed origin's answers are marked readable.
///
/// A service around the whole router rather than a per-route middleware
/// (`axum::middleware::from_fn`), which boxes its inner service and clones a route per request.
#[derive(Clone)]
struct PerRequest {
    router: Router,
    /// Fires at the drain deadline.
    cut: CancellationToken,
    /// The thread's timer anchor, if it keeps one.
    anchor: Option<Arc<TimerAnchor>>,
    /// The origins allowed to call the OpenAI routes, if any.
    cors: Option<Arc<Cors>>,
}

impl tower_service::Service<Request> for PerRequest {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // a router is always ready
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        if let Some(a) = &self.anchor {
            a.touch();
        }
        let cors = match &self.cors {
            Some(cors) if Cors::covers(req.uri().path()) => {
                if let Some(answer) = cors.preflight(req.method(), req.headers()) {
                    return Box::pin(std::future::ready(Ok(answer)));
                }
                (req.headers().get(header::ORIGIN).cloned()).map(|o| (cors.clone(), o))
            }
            _ => None,
        };
        let answer = tower_service::Service::call(&mut self.router, req);
        let cut = self.cut.clone();
        Box::pin(async move {
            let mut resp = tokio::select! {
                resp = answer => match resp {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                },
                () = cut.cancelled() => return Ok(ApiError::ShuttingDown.into_response()),
            };
            if let Some((cors, origin)) = cors {
                cors.expose(&origin, &mut resp);
            }
            Ok(resp.map(|inner| {
                Body::new(CutBody {
                    inner,
                    cut: Box::pin(cut.cancelled_owned()),
                })
            }))
        })
    }
}

/// A response body that ends with an error when the drain deadline fires (see
/// [`PerRequest`]); until then it is `inner`, frame for frame.
struct CutBody {
    /// The response's own body.
    inner: Body,
    /// Resolves at the drain deadline.
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl http_body::Body for CutBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(
                "the drain deadline passed: response cut",
            ))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

// (the request whole, not `HeaderMap` and `Body` extractors: those clone the headers)
async fn chat(State(state): State<AppState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    forward::handle(state, Route::Chat, parts.headers, body).await
}

async fn completions(State(state): State<AppState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    forward::handle(state, Route::Completions, parts.headers, body).await
}

async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(refused) = allowed_to_list(&state, &headers).await {
        return refused;
    }
    let mut names: Vec<String> = state.inner.models.keys().cloned().collect();
    names.sort();
    json_ok(&ModelList::of(names, "samewise", 0), "model list")
}

/// `GET /v1/models/{model}`: the model's entry of `/v1/models`, or an OpenAI-shaped 404
/// (`model_not_found`). A model's name may hold slashes (`org/name`); one that is not UTF-8
/// once percent-decoded is a 400 (`invalid_path`).
async fn model(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = allowed_to_list(&state, &headers).await {
        return refused;
    }
    let id = match id {
        Ok(Path(id)) => id,
        Err(e) => {
            return ApiError::bad_request("invalid_path", e.body_text(), Some("model"))
                .into_response();
        }
    };
    if !state.inner.models.contains_key(&id) {
        return ApiError::ModelNotFound { model: id }.into_response();
    }
    json_ok(&ModelObject::new(id, "samewise", 0), "model")
}

/// Whether `headers` carry a valid key for the model routes; a refusal is recorded as the
/// chat routes record theirs, and comes back as the response to send.
async fn allowed_to_list(state: &AppState, headers: &HeaderMap) -> Result<(), Response> {
    let Err(e) = state.inner.auth.authenticate(headers).await else {
        return Ok(());
    };
    let ts_ms = samewise_store::now_ms();
    let mut ctx = RequestCtx {
        request_id: samewise_store::new_request_id(ts_ms, &mut state.rng()),
        ts_ms,
        started: tokio::time::Instant::now(),
        key_id: None,
        model: String::new(),
        model_label: crate::metrics::UNKNOWN_MODEL.to_owned(),
        route: "models",
        stream: false,
        prompt_chars: 0,
        earlier: Vec::new(),
        capture: None,
        answer: None,
    };
    let rec = ctx.rejected_record(e.status_code().as_u16(), e.code());
    crate::record::finish(state, &mut ctx, rec);
    Err(e.into_response())
}

/// `value` as a 200 JSON response (`what` names it in the 500 if it cannot be serialised).
fn json_ok(value: &impl serde::Serialize, what: &'static str) -> Response {
    match serde_json::to_string(value) {
        Ok(json) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json,
        )
            .into_response(),
        Err(_) => ApiError::Internal { what }.into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        state.render_metrics(),
    )
        .into_response()
}

async fn healthz() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        r#"{"status":"ok"}"#,
    )
        .into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::MethodNotAllowed.into_response()
}

async fn not_found() -> Response {
    ApiError::RouteNotFound.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another thread's answer after `after`.
    fn answer_after(after: Duration) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            let _ = tx.send(());
        });
        rx
    }

    /// How often a current-thread runtime parks per request-like round: wait untimed for the
    /// request (from another thread, after 200 µs), then arm a 1 s deadline (as a request's
    /// first-byte wait does) and wait for the answer (another 200 µs); with `anchor`, a
    /// [`TimerAnchor`] of that period runs beside and is touched per request.
    fn parks_per_round(anchor: Option<Duration>) -> f64 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        runtime.block_on(async {
            let anchor = anchor.map(|p| Arc::new(TimerAnchor::new(p)));
            if let Some(a) = &anchor {
                tokio::spawn(Arc::clone(a).run());
            }
            let metrics = tokio::runtime::Handle::current().metrics();
            const ROUNDS: u32 = 200;
            let wait = Duration::from_micros(200);
            let before = metrics.worker_park_count(0);
            for _ in 0..ROUNDS {
                assert!(answer_after(wait).await.is_ok());
                if let Some(a) = &anchor {
                    a.touch();
                }
                let deadline = tokio::time::sleep(Duration::from_secs(1));
                tokio::select! {
                    biased;
                    answered = answer_after(wait) => assert!(answered.is_ok()),
                    () = deadline => panic!("no answer within 1 s"),
                }
            }
            let parks = metrics.worker_park_count(0) - before;
            parks as f64 / f64::from(ROUNDS)
        })
    }

    #[test]
    fn a_timer_anchor_saves_a_park_per_request() {
        // two waits per round: two parks; without an anchor, arming the deadline on a thread
        // that parked with no timer wakes its poller, which parks once more
        let bare = parks_per_round(None);
        let anchored = parks_per_round(Some(Duration::from_millis(500)));
        eprintln!("parks per round: {bare} without an anchor, {anchored} with one");
        assert!(bare >= 2.8, "without an anchor: {bare} parks per round");
        assert!(
            anchored <= 2.2,
            "with an anchor: {anchored} parks per round"
        );
    }

    #[test]
    fn an_anchor_ticks_only_while_requests_come() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        runtime.block_on(async {
            let anchor = Arc::new(TimerAnchor::new(Duration::from_millis(10)));
            let ticks = || anchor.ticks.load(Ordering::Relaxed);
            tokio::spawn(Arc::clone(&anchor).run());
            // idle from the start: no tick in an hour (the paused clock jumps timer to timer)
            tokio::time::sleep(Duration::from_secs(3600)).await;
            assert_eq!(ticks(), 0);
            // a request every 5 ms for 100 ms: it ticks throughout
            for _ in 0..20 {
                anchor.touch();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let busy = ticks();
            assert!(
                (9..=11).contains(&busy),
                "{busy} ticks in 100 ms of requests"
            );
            // then quiet: one more period with nothing, and it stops
            tokio::time::sleep(Duration::from_secs(3600)).await;
            assert!(ticks() <= busy + 2, "{} ticks after {busy}", ticks());
            let stopped = ticks();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            assert_eq!(ticks(), stopped);
            // and a request resumes it
            anchor.touch();
            tokio::time::sleep(Duration::from_millis(15)).await;
            assert!(ticks() > stopped);
        });
    }

    #[test]
    fn the_anchor_period_is_the_shortest_request_timer_within_bounds() {
        let config = |extra: &str| {
            let src = format!(
                "[providers.a]\nbase_url = \"http://127.0.0.1:9/v1\"\n{extra}\n\
                 [models.m]\n[[models.m.endpoints]]\nprovider = \"a\"\nmodel = \"m-1\"\n"
            );
            let c = Config::from_toml_str(&src).unwrap_or_else(|e| panic!("{e}"));
            Serving::of(&c).timer_anchor
        };
        // the default first-byte floor is 1 s, the default idle timeout 60 s
        assert_eq!(config(""), Some(Duration::from_secs(1)));
        assert_eq!(
            config("first_byte_floor_ms = 250"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            config("idle_timeout_ms = 40"),
            Some(Duration::from_millis(40))
        );
        assert_eq!(config("first_byte_floor_ms = 2"), Some(ANCHOR_MIN));
        assert_eq!(config("first_byte_floor_ms = 5000"), Some(ANCHOR_MAX));
    }
}
