//! The crate's error type, and how errors reach an HTTP client: OpenAI-shaped JSON
//! (`{"error": {"message", "type", "code"}}`) with a status, never a leaked internal message
//! (store failures are logged and answered with a generic "internal error").

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Everything that can go wrong in the dashboards.
#[derive(Debug, thiserror::Error)]
pub enum DashError {
    /// A `[dashboards]` or `[models.NAME.slo]` value is invalid; names the key.
    #[error("invalid configuration at {key}: {reason}")]
    Config {
        /// The TOML key, e.g. `models.smol.slo.ttft_ms`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A store query failed.
    #[error(transparent)]
    Store(#[from] samewise_store::StoreError),
    /// No credentials (or an unknown key / expired session).
    #[error("an admin key or a dashboard session is required")]
    Unauthenticated,
    /// A valid key that is not an admin key.
    #[error("this key is not an admin key")]
    Forbidden,
    /// A POST under a session without its CSRF token.
    #[error("missing or wrong CSRF token")]
    Csrf,
    /// Something asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A malformed parameter.
    #[error("{0}")]
    BadRequest(String),
    /// A request an extractor refused (a malformed query string or path, a form without its
    /// content type), with the status axum gave it.
    #[error("{1}")]
    Rejected(StatusCode, String),
    /// A route asked with a method it does not take (`GET` of an action, `DELETE` of a list).
    #[error("this route does not accept that method")]
    MethodNotAllowed,
    /// A named parameter with a value the server does not know (e.g. an unknown suite).
    #[error("{message}")]
    Invalid {
        /// The parameter (`endpoint`, `suite`, `baseline`).
        param: &'static str,
        /// The error code (`unknown_endpoint`, ...).
        code: &'static str,
        /// What is wrong, in the caller's terms.
        message: String,
    },
}

impl From<samewise_evals::EvalsError> for DashError {
    /// Opening a job: a bad endpoint, suite or baseline is the caller's 400 naming the
    /// parameter; the store failing is ours.
    fn from(e: samewise_evals::EvalsError) -> Self {
        use samewise_evals::EvalsError as E;
        let message = e.to_string();
        let (param, code) = match e {
            E::Store(s) => return DashError::Store(s),
            E::UnknownEndpoint { .. } | E::UnknownTarget(_) => ("endpoint", "unknown_endpoint"),
            E::UnknownSuite { .. } | E::Suite(_) => ("suite", "unknown_suite"),
            E::UnknownBaseline(_) => ("baseline", "unknown_baseline"),
            _ => return DashError::BadRequest(message),
        };
        DashError::Invalid {
            param,
            code,
            message,
        }
    }
}

impl DashError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            DashError::Config { .. } | DashError::Store(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal",
            ),
            DashError::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
            ),
            DashError::Forbidden => (
                StatusCode::FORBIDDEN,
                "permission_error",
                "admin_key_required",
            ),
            DashError::Csrf => (StatusCode::FORBIDDEN, "permission_error", "csrf"),
            DashError::NotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error", "not_found"),
            DashError::BadRequest(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_parameter",
            ),
            DashError::Rejected(s, _) if s.is_server_error() => (*s, "server_error", "internal"),
            DashError::Rejected(s, _) => (
                *s,
                "invalid_request_error",
                match *s {
                    StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
                    StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
                    _ => "invalid_parameter",
                },
            ),
            DashError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method_not_allowed",
            ),
            DashError::Invalid { code, .. } => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", code)
            }
        }
    }
}

impl IntoResponse for DashError {
    fn into_response(self) -> Response {
        let (status, kind, code) = self.parts();
        let message = match &self {
            DashError::Store(e) => {
                tracing::error!(error = %e, "a dashboard query failed");
                "internal error".to_owned()
            }
            DashError::Config { .. } => "internal error".to_owned(),
            other => other.to_string(),
        };
        let mut body = serde_json::json!({
            "error": { "message": message, "type": kind, "code": code }
        });
        if let DashError::Invalid { param, .. } = &self {
            body["error"]["param"] = serde_json::json!(param);
        }
        (status, axum::Json(body)).into_response()
    }
}
