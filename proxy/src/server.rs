//! The HTTP surface: [`router`] maps routes to thin handlers over [`AppState`], and [`serve`]
//! runs it on a listener until a shutdown future resolves, then waits for in-flight requests
//! (streams included) to finish — for at most the drain timeout (`[server] drain_timeout_ms`).
//! At the deadline every response still open is cut (a body mid-stream ends with an error, so
//! its connection closes; a request still waiting for its answer gets a 503) and the server
//! returns: a client trickling a stream cannot hold the exit forever.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body::Frame;
use samewise_wire::ModelList;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::body::Route;
use crate::error::ApiError;
use crate::forward;
use crate::record::RequestCtx;
use crate::state::AppState;

/// The gateway's routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
/// `/metrics`, `/healthz`; anything else is an OpenAI-shaped 404.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
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

/// Serves `router(state)` on `listener` until `shutdown` resolves, then drains in-flight
/// requests for at most the configured `[server] drain_timeout_ms`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), crate::ProxyError> {
    let drain = state.inner.drain_timeout;
    serve_router_with(listener, router(state), shutdown, drain).await
}

/// Serves `app` (the gateway's [`router`], possibly merged with other routers, such as the
/// dashboards', at composition) on `listener` until `shutdown` resolves (accepted sockets get
/// TCP_NODELAY, as in [`serve`]), with the drain timeout given (`Config::server.drain_timeout`): after
/// `shutdown` resolves, open requests and streams have `drain` to finish; then each is cut,
/// its connection closes, and this returns (waiting at most a further [`CLOSE_GRACE`] for the
/// connections to go).
pub async fn serve_router_with(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> Result<(), crate::ProxyError> {
    // Streamed answers are many small writes: without TCP_NODELAY on accepted sockets, Nagle's
    // algorithm and the client's delayed ACK add ~40 ms per stream (measured by bench/proxy).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted socket");
        }
    });
    let cut = CancellationToken::new();
    let app = app.layer(axum::middleware::from_fn_with_state(
        cut.clone(),
        cut_at_deadline,
    ));
    let draining = CancellationToken::new();
    let signal = {
        let draining = draining.clone();
        async move {
            shutdown.await;
            draining.cancel();
        }
    };
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .into_future();
    tokio::pin!(server);
    tokio::select! {
        served = &mut server => return Ok(served?),
        () = async {
            draining.cancelled().await;
            tokio::time::sleep(drain).await;
        } => {}
    }
    tracing::warn!(
        drain_ms = u64::try_from(drain.as_millis()).unwrap_or(u64::MAX),
        "drain deadline passed: closing the connections still open"
    );
    cut.cancel();
    match tokio::time::timeout(CLOSE_GRACE, server).await {
        Ok(served) => Ok(served?),
        Err(_) => {
            tracing::warn!("connections still open after the drain deadline; exiting anyway");
            Ok(())
        }
    }
}

/// Middleware of [`serve_router_with`]: once `cut` fires (the drain deadline), a request still
/// waiting for its answer gets a 503 and a response body still open ends with an error.
async fn cut_at_deadline(
    State(cut): State<CancellationToken>,
    req: Request,
    next: Next,
) -> Response {
    let resp = tokio::select! {
        resp = next.run(req) => resp,
        () = cut.cancelled() => {
            return ApiError::ShuttingDown
            .into_response();
        }
    };
    resp.map(|inner| {
        Body::new(CutBody {
            inner,
            cut: Box::pin(cut.cancelled_owned()),
        })
    })
}

/// A response body that ends with an error when the drain deadline fires (see
/// [`cut_at_deadline`]); until then it is `inner`, frame for frame.
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

async fn chat(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    forward::handle(state, Route::Chat, headers, body).await
}

async fn completions(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    forward::handle(state, Route::Completions, headers, body).await
}

async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(e) = state.inner.auth.authenticate(&headers).await {
        let mut ctx = RequestCtx {
            request_id: forward::new_request_id(&mut state.rng()),
            ts_ms: samewise_store::now_ms(),
            started: tokio::time::Instant::now(),
            key_id: None,
            model: String::new(),
            model_label: "unknown".to_owned(),
            route: "models",
            stream: false,
            prompt_chars: 0,
            earlier: Vec::new(),
            capture: None,
            answer: None,
        };
        let rec = ctx.rejected_record(e.status_code().as_u16(), e.code());
        crate::record::finish(&state, &mut ctx, rec);
        return e.into_response();
    }
    let mut names: Vec<String> = state.inner.models.keys().cloned().collect();
    names.sort();
    let list = ModelList::of(names, "samewise", 0);
    match serde_json::to_string(&list) {
        Ok(json) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json,
        )
            .into_response(),
        Err(_) => ApiError::Internal { what: "model list" }.into_response(),
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
