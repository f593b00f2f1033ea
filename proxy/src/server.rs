//! The HTTP surface: [`router`] maps routes to thin handlers over [`AppState`], and [`serve`]
//! runs it on a listener until a shutdown future resolves, then waits for in-flight requests
//! (streams included) to finish.

use std::future::Future;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use samewise_wire::ModelList;

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

/// Serves `router(state)` on `listener` until `shutdown` resolves, then drains in-flight
/// requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), crate::ProxyError> {
    serve_router(listener, router(state), shutdown).await
}

/// Serves `app` (the gateway's [`router`], possibly merged with other routers, such as the
/// dashboards', at composition) on `listener` until `shutdown` resolves, then drains
/// in-flight requests. Accepted sockets get TCP_NODELAY, as in [`serve`].
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), crate::ProxyError> {
    // Streamed answers are many small writes: without TCP_NODELAY on accepted sockets, Nagle's
    // algorithm and the client's delayed ACK add ~40 ms per stream (measured by bench/proxy).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an accepted socket");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
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
        };
        let rec = ctx.rejected_record(e.status.as_u16(), e.kind);
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
        Err(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "server_error",
            "model list",
        )
        .into_response(),
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
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "invalid_request_error",
        "this route does not accept that method",
    )
    .into_response()
}

async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "invalid_request_error",
        "no such route",
    )
    .into_response()
}
