//! Errors of the gateway: [`ProxyError`] for what goes wrong setting it up (configuration,
//! store, listener), and [`ApiError`] for what an HTTP client is told — always OpenAI's error
//! shape, never an internal message, a provider key or a provider's raw error text.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use samewise_wire::ErrorBody;

/// What can fail while building or running the gateway (not per request).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The configuration file could not be read.
    #[error("cannot read config file {path}: {source}")]
    ConfigRead {
        /// The file.
        path: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The configuration is not valid TOML or has a key of the wrong type or name.
    #[error("config error{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    ConfigParse {
        /// The line the parser stopped at.
        line: Option<usize>,
        /// The parser's message (it names the key).
        message: String,
    },
    /// A value is well-formed but unusable.
    #[error("config error{}: `{key}` {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    ConfigInvalid {
        /// The dotted key at fault, e.g. `models.m.endpoints[0].provider`.
        key: String,
        /// Its line, when known.
        line: Option<usize>,
        /// What is wrong with it.
        message: String,
    },
    /// A provider names an API-key variable that is not set (its value is never shown).
    #[error("provider \"{provider}\" reads its API key from ${env}, which is not set")]
    MissingProviderKey {
        /// The provider.
        provider: String,
        /// The variable's name.
        env: String,
    },
    /// The HTTP client for a provider could not be built.
    #[error("cannot build the HTTP client for provider \"{provider}\": {message}")]
    HttpClient {
        /// The provider.
        provider: String,
        /// reqwest's reason.
        message: String,
    },
    /// Serving failed (the listener broke).
    #[error("serving failed: {0}")]
    Serve(#[from] std::io::Error),
}

/// An error answered to an HTTP client, in OpenAI's shape.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The JSON body (boxed: errors travel in `Result`s on the hot path).
    pub body: Box<ErrorBody>,
    /// `Retry-After` seconds, for 429 and 503.
    pub retry_after: Option<u64>,
    /// Short machine-readable class recorded in telemetry (`invalid_json`, `auth`, ...).
    pub kind: &'static str,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn bad_request(
        kind: &'static str,
        message: impl Into<String>,
        param: Option<&str>,
    ) -> Self {
        let mut body = ErrorBody::new(message, "invalid_request_error", Some(kind));
        if let Some(p) = param {
            body = body.with_param(p);
        }
        ApiError {
            status: StatusCode::BAD_REQUEST,
            body: Box::new(body),
            retry_after: None,
            kind,
        }
    }

    /// Any status with a type and code.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        error_type: &str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            body: Box::new(ErrorBody::new(message, error_type, Some(kind))),
            retry_after: None,
            kind,
        }
    }

    /// The same error with a `Retry-After`.
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, self.body.to_json()).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
