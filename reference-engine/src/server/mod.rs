//! The engine's HTTP API: an OpenAI-compatible server (axum) over a loaded model.
//!
//! Routes: `POST /v1/completions` (text or token-id prompts, `echo` + `logprobs` giving
//! prompt logprobs in vLLM's alignment: entry i is the logprob of token i given the tokens
//! before it, the first null), `POST /v1/chat/completions` (chat template, logprobs,
//! sampling, `stop`, `n`, SSE streaming with `stream_options.include_usage`, `tools` →
//! `tool_calls`), `GET /v1/models`, `POST /tokenize`, `POST /detokenize`, `GET /healthz`, and
//! the native `POST /v1/score` (token ids, text or chat messages → per position logprob and
//! top-k).
//!
//! Handlers are thin: they parse the body themselves (so a malformed request gets an
//! OpenAI-shaped 400, not axum's plain-text rejection), then call the tokenizer, the chat
//! template and the `backend`. Every error a client can cause is an OpenAI error JSON with a
//! 4xx status; nothing on a request path panics. The `model` field of requests is accepted
//! whatever it names, or absent (the proxy in front rewrites it); responses carry the
//! served name.
//!
//! A serving [`Profile`] ([`ServerState::with_profile`]) adds a provider's behavioural
//! faults on the OpenAI routes ([`faults`]); the reference profile changes nothing.
//!
//! Layout: `backend` (the batching worker), `text` (stop strings and streamed text),
//! `stream` (SSE responses and shared request checks),
//! `completions`, `chat_api`, `constrained` (tool_choice and response_format as
//! constraints; forced tool calls read back as they stream), `native` (score, tokenize, detokenize, models, health),
//! [`faults`] (the profile's behavioural faults).
//!
//! [`ServerState::with_profile`]: crate::server::ServerState::with_profile
//! [`faults`]: crate::server::faults

mod backend;
mod chat_api;
mod completions;
mod constrained;
pub mod faults;
mod native;
mod stream;
mod text;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use samewise_wire::ErrorBody;

use crate::chat::{self, ChatTemplate};
use crate::engine::{Engine, LoadOptions};
use crate::error::{EngineError, Result};
use crate::profile::Profile;
use crate::tokenizer::Tokenizer;

use backend::Backend;

/// Largest request body accepted (token-id prompts of a full context fit easily).
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Bounds on one request's work, beyond the context window that bounds each prompt: a list
/// of prompts (`/v1/completions`) is at most `max_prompts` long and holds at most
/// `max_prompt_tokens` tokens in all. Past either, the request is an OpenAI-shaped 400
/// (`too_many_prompts`, `too_many_tokens`) before any work is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most prompts in one request (default 64).
    pub max_prompts: usize,
    /// Most prompt tokens in one request, all prompts together (default four context
    /// windows).
    pub max_prompt_tokens: usize,
}

impl ServerLimits {
    /// The defaults for a model with context window `n_ctx`.
    pub fn for_context(n_ctx: usize) -> Self {
        ServerLimits {
            max_prompts: 64,
            max_prompt_tokens: n_ctx.saturating_mul(4),
        }
    }
}

/// Everything a handler needs, cheap to clone.
#[derive(Clone)]
pub struct ServerState {
    /// Shared, immutable after start.
    inner: Arc<Inner>,
}

struct Inner {
    /// The name served in `/v1/models` and in responses.
    model_name: String,
    /// Unix seconds at start (`created` of the model object).
    created: u64,
    /// Text <-> ids.
    tokenizer: Tokenizer,
    /// The model's chat template, if it has one.
    template: Option<ChatTemplate>,
    /// The compute side.
    backend: Backend,
    /// Context window.
    n_ctx: usize,
    /// Vocabulary size of the model (ids at or above are rejected).
    vocab_size: usize,
    /// Source of response ids.
    next_id: AtomicU64,
    /// The serving profile's behavioural faults.
    faults: faults::Faults,
    /// [`ServerLimits::max_prompts`] (atomic: set after start by [`ServerState::set_limits`]).
    max_prompts: AtomicUsize,
    /// [`ServerLimits::max_prompt_tokens`].
    max_prompt_tokens: AtomicUsize,
    /// Compiled constraint grammars (LRU).
    grammars: crate::constrain::GrammarCache,
    /// The vocabulary's token trie, built on the first constrained request.
    trie: std::sync::OnceLock<Arc<crate::constrain::TokenTrie>>,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState")
            .field("model", &self.inner.model_name)
            .finish_non_exhaustive()
    }
}

impl ServerState {
    /// State over an already loaded engine, tokenizer and template, serving the behavioural
    /// faults of the profile the engine was loaded with (none for the reference profile).
    pub fn new(
        engine: Arc<Engine>,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        model_name: String,
    ) -> Result<Self> {
        let profile = engine.profile().clone();
        Self::with_profile(engine, tokenizer, template, model_name, profile)
    }

    /// State whose OpenAI routes show `profile`'s behavioural faults (truncation, tool-call
    /// corruption, repeat bug, template variant, API differences, latency, errors). Its
    /// numerical part is the engine's business: the engine applies the profile it was
    /// loaded with ([`LoadOptions::profile`]), whatever this one says. Errors when the
    /// profile's hidden context (`[substitute]`) does not tokenize or takes half the window.
    pub fn with_profile(
        engine: Arc<Engine>,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        model_name: String,
        profile: Profile,
    ) -> Result<Self> {
        let hidden = match &profile.substitute {
            Some(s) => tokenizer.encode(&s.context, true)?,
            None => Vec::new(),
        };
        let window = engine.config().n_ctx;
        if hidden.len() * 2 > window {
            return Err(EngineError::ProfileInvalid {
                source_name: profile.name.clone(),
                message: format!(
                    "substitute.context is {} tokens, over half of the model's {window}-token window",
                    hidden.len()
                ),
            });
        }
        // the window served is what the hidden context leaves
        let n_ctx = window - hidden.len();
        let vocab_size = engine.config().vocab_size;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(Self {
            inner: Arc::new(Inner {
                model_name,
                created,
                tokenizer,
                template,
                backend: Backend::new(engine, hidden),
                n_ctx,
                vocab_size,
                next_id: AtomicU64::new(1),
                faults: faults::Faults::new(profile),
                max_prompts: AtomicUsize::new(ServerLimits::for_context(n_ctx).max_prompts),
                max_prompt_tokens: AtomicUsize::new(
                    ServerLimits::for_context(n_ctx).max_prompt_tokens,
                ),
                grammars: crate::constrain::GrammarCache::default(),
                trie: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Loads a model (GGUF file or HF directory) with its tokenizer and chat template; the
    /// engine applies `opts.profile`'s numeric knobs and the server its behavioural ones.
    /// The served name defaults to the file (or directory) name without extension.
    pub fn load(path: &Path, opts: LoadOptions, model_name: Option<String>) -> Result<Self> {
        let engine = Arc::new(Engine::load(path, opts)?);
        let (tokenizer, template) = chat::load_tokenizer_and_template(path)?;
        let name = model_name.unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into())
        });
        Self::new(engine, tokenizer, template, name)
    }

    /// [`ServerState::load`] with `profile` (numeric and behavioural knobs) in place of
    /// `opts.profile`.
    pub fn load_with_profile(
        path: &Path,
        opts: LoadOptions,
        model_name: Option<String>,
        profile: Profile,
    ) -> Result<Self> {
        Self::load(path, LoadOptions { profile, ..opts }, model_name)
    }

    /// Bounds on one request's work (every clone of this state shares them).
    pub fn limits(&self) -> ServerLimits {
        ServerLimits {
            max_prompts: self.inner.max_prompts.load(Ordering::Relaxed),
            max_prompt_tokens: self.inner.max_prompt_tokens.load(Ordering::Relaxed),
        }
    }

    /// Sets the bounds on one request's work (see [`ServerLimits`]).
    pub fn set_limits(&self, limits: ServerLimits) {
        self.inner
            .max_prompts
            .store(limits.max_prompts, Ordering::Relaxed);
        self.inner
            .max_prompt_tokens
            .store(limits.max_prompt_tokens, Ordering::Relaxed);
    }

    /// The served model name.
    pub fn model_name(&self) -> &str {
        &self.inner.model_name
    }

    /// A request's `model` checked against the served name, as vLLM does: any other name is an
    /// OpenAI-shaped 404 `model_not_found`, so a gateway configured with the wrong model id
    /// finds out on its first request instead of being served whatever is loaded. A request
    /// without one (empty) means the served model.
    pub(crate) fn check_model(&self, requested: &str) -> Result<(), ApiError> {
        if requested.is_empty() || requested == self.model_name() {
            return Ok(());
        }
        Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            format!("The model `{requested}` does not exist"),
            "invalid_request_error",
            Some("model_not_found"),
        ))
    }

    /// The tokenizer (tests compare against the library with it).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The chat template, if the model has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.inner.template.as_ref()
    }

    /// The serving profile.
    pub fn profile(&self) -> &Profile {
        self.inner.faults.profile()
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        self.inner.backend.engine()
    }

    fn next_id(&self, prefix: &str) -> String {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:08x}", self.inner.created)
    }
}

/// The API's routes over `state`.
pub fn router(state: ServerState) -> Router {
    let faulty = || axum::middleware::from_fn_with_state(state.clone(), faults::middleware);
    Router::new()
        .route("/v1/completions", post(completions::handle).layer(faulty()))
        .route(
            "/v1/chat/completions",
            post(chat_api::handle).layer(faulty()),
        )
        .route("/v1/score", post(native::score))
        .route("/v1/models", get(native::models))
        .route("/v1/models/{*model}", get(native::model))
        .route("/tokenize", post(native::tokenize))
        .route("/detokenize", post(native::detokenize))
        .route("/healthz", get(native::health))
        // vLLM's and llama.cpp's name, for probes and tools written for them
        .route("/health", get(native::health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` completes and every open connection
/// (including open streams) has ended. The batching worker stops when the state is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route",
        "invalid_request_error",
        Some("not_found"),
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not accept that method",
        "invalid_request_error",
        Some("method_not_allowed"),
    )
}

/// An error as an HTTP client sees it: a status and OpenAI's error JSON.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        message: impl Into<String>,
        kind: &str,
        code: Option<&str>,
    ) -> Self {
        Self {
            status,
            body: ErrorBody::new(message, kind, code),
        }
    }

    /// A 400 `invalid_request_error` naming the field at fault.
    pub(crate) fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            message,
            "invalid_request_error",
            None,
        );
        if let Some(p) = param {
            e.body = e.body.with_param(p);
        }
        e
    }

    /// A 400 with this `code`, naming the field at fault.
    pub(crate) fn bad_request_code(message: impl Into<String>, param: &str, code: &str) -> Self {
        let mut e = Self::bad_request(message, Some(param));
        e.body.error.code = Some(code.into());
        e
    }

    /// The request body is not JSON.
    pub(crate) fn bad_json(err: &serde_json::Error) -> Self {
        let mut e = Self::bad_request(format!("invalid request body: {err}"), None);
        e.body.error.code = Some("invalid_json".into());
        e
    }

    /// The request body is JSON of the wrong shape: an `invalid_type` naming the field at
    /// fault (`max_tokens`, `messages[0].role`), as the gateway and OpenAI do.
    pub(crate) fn bad_shape(err: &serde_path_to_error::Error<serde_json::Error>) -> Self {
        let path = err.path().to_string();
        let at_root = path == ".";
        let message = if at_root {
            format!("invalid request body: {}", err.inner())
        } else {
            format!("invalid request body: {path}: {}", err.inner())
        };
        let mut e = Self::bad_request(message, (!at_root).then_some(path.as_str()));
        e.body.error.code = Some("invalid_type".into());
        e
    }

    pub(crate) fn body(&self) -> &ErrorBody {
        &self.body
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let code = match &e {
            EngineError::TokenOutOfVocab { .. } => Some("token_out_of_vocab"),
            EngineError::SequenceTooLong { .. } => Some("context_length_exceeded"),
            EngineError::ChatTemplate(_) => Some("chat_template_error"),
            _ => None,
        };
        if e.is_client_error() {
            return Self::new(
                StatusCode::BAD_REQUEST,
                e.to_string(),
                "invalid_request_error",
                code,
            );
        }
        if matches!(e, EngineError::Shutdown) {
            return Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                e.to_string(),
                "server_error",
                Some("shutting_down"),
            );
        }
        tracing::error!(error = %e, "engine request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal engine error",
            "server_error",
            None,
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body.to_json(),
        )
            .into_response()
    }
}

/// A JSON response with status 200.
pub(crate) fn json_response<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "serialising a response failed");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error",
                "server_error",
                None,
            )
            .into_response()
        }
    }
}

/// A boolean extension field of a request body (`None` when absent or null), or a 400 naming it.
pub(crate) fn extra_bool(
    extra: &serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Result<Option<bool>, ApiError> {
    match extra.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(
            format!("{name} must be a boolean"),
            Some(name),
        )),
    }
}

/// Parses a request body as `T`, or a 400 saying what is wrong. A missing `model` reads
/// as the empty name (one model is served; vLLM allows omitting it too).
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_json(&e))?;
    if let serde_json::Value::Object(o) = &mut v {
        o.entry("model")
            .or_insert_with(|| serde_json::Value::String(String::new()));
    }
    serde_path_to_error::deserialize(v).map_err(|e| ApiError::bad_shape(&e))
}

/// Unix seconds now.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
