//! Errors of the gateway: [`ProxyError`] for what goes wrong setting it up (configuration,
//! store, listener), and [`ApiError`] for what an HTTP client is told — always OpenAI's error
//! shape, never an internal message, a provider key or a provider's raw error text.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use samewise_store::ErrorKind;
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
    #[error(
        "config error{}{}: {message}",
        line.map(|l| format!(" at line {l}")).unwrap_or_default(),
        text.as_ref().map(|t| format!(" (`{t}`)")).unwrap_or_default()
    )]
    ConfigParse {
        /// The line the parser stopped at.
        line: Option<usize>,
        /// That line as written, after the header of its table.
        text: Option<String>,
        /// The parser's message (an unknown key is named; a value of the wrong type is not).
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
        /// The reason.
        message: String,
    },
    /// Serving failed (the listener broke).
    #[error("serving failed: {0}")]
    Serve(#[from] std::io::Error),
}

/// An error answered to an HTTP client. Each variant knows its HTTP status
/// ([`ApiError::status_code`]), OpenAI `type` ([`ApiError::error_type`]), `code` (also the
/// `error_kind` a rejected request's record carries, [`ApiError::code`]), message and
/// `Retry-After`; the JSON body is built in one place ([`ApiError::body`]), always OpenAI's
/// shape `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    /// 400 `invalid_request_error`: the body is not a request we forward.
    BadRequest {
        /// Which check failed (`invalid_json`, `invalid_type`, `missing_field`, a schema
        /// bound's code, ...).
        code: &'static str,
        /// What is wrong, naming the field.
        message: String,
        /// The request field at fault, when there is one.
        param: Option<String>,
    },
    /// 413: the body exceeds `limits.max_body_bytes`.
    RequestTooLarge {
        /// The bound in bytes.
        limit: usize,
    },
    /// 401: no `Authorization: Bearer` key.
    MissingApiKey,
    /// 401: the key is unknown or revoked.
    InvalidApiKey,
    /// 429: the key's requests-per-minute limit is spent.
    KeyRateLimited {
        /// The key's limit.
        rpm: u32,
        /// Seconds until a request is allowed again.
        retry_after: u64,
    },
    /// 429: the key has `limits.max_streams_per_key` streams open.
    TooManyStreams {
        /// The key's bound.
        limit: u32,
    },
    /// 503: the key store is down and the key is not cached.
    KeyStoreUnavailable,
    /// 404: no model of that name.
    ModelNotFound {
        /// The name the client sent.
        model: String,
    },
    /// 404: the request's `provider` preferences leave no endpoint.
    NoEndpointsMatch,
    /// 503: quality routing excludes every endpoint of the model.
    AllEndpointsExcluded,
    /// 503: every endpoint is out (circuit open or rate limited).
    AllEndpointsUnavailable,
    /// 429: every endpoint answered 429.
    UpstreamRateLimited {
        /// Seconds from the upstream's `Retry-After`, when it sent one.
        retry_after: Option<u64>,
    },
    /// 504 for a timeout, else 502: an upstream attempt failed before a usable answer.
    Upstream {
        /// Why (the attempt's record carries the same kind).
        kind: ErrorKind,
    },
    /// 503: the gateway is draining.
    ShuttingDown,
    /// 405 on a known route.
    MethodNotAllowed,
    /// 404: no such route.
    RouteNotFound,
    /// 403: a browser's preflight from an origin `[server] cors_allow_origins` does not list.
    OriginNotAllowed {
        /// The request's `Origin`.
        origin: String,
    },
    /// 500: something of ours failed; `what` is a fixed text, never an internal message.
    Internal {
        /// What could not be done.
        what: &'static str,
    },
}

impl ApiError {
    /// A 400 naming the check (`code`) and the field (`param`).
    pub fn bad_request(
        code: &'static str,
        message: impl Into<String>,
        param: Option<&str>,
    ) -> Self {
        ApiError::BadRequest {
            code,
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// The HTTP status.
    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::RequestTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::MissingApiKey | ApiError::InvalidApiKey => StatusCode::UNAUTHORIZED,
            ApiError::KeyRateLimited { .. }
            | ApiError::TooManyStreams { .. }
            | ApiError::UpstreamRateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::ModelNotFound { .. }
            | ApiError::NoEndpointsMatch
            | ApiError::RouteNotFound => StatusCode::NOT_FOUND,
            ApiError::KeyStoreUnavailable
            | ApiError::AllEndpointsExcluded
            | ApiError::AllEndpointsUnavailable
            | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Upstream {
                kind: ErrorKind::Timeout,
            } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::OriginNotAllowed { .. } => StatusCode::FORBIDDEN,
            ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's error `type`.
    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. }
            | ApiError::RequestTooLarge { .. }
            | ApiError::ModelNotFound { .. }
            | ApiError::NoEndpointsMatch
            | ApiError::MethodNotAllowed
            | ApiError::OriginNotAllowed { .. }
            | ApiError::RouteNotFound => "invalid_request_error",
            ApiError::MissingApiKey | ApiError::InvalidApiKey => "authentication_error",
            ApiError::KeyRateLimited { .. }
            | ApiError::TooManyStreams { .. }
            | ApiError::UpstreamRateLimited { .. } => "rate_limit_error",
            ApiError::KeyStoreUnavailable
            | ApiError::AllEndpointsExcluded
            | ApiError::AllEndpointsUnavailable
            | ApiError::Upstream { .. }
            | ApiError::ShuttingDown
            | ApiError::Internal { .. } => "server_error",
        }
    }

    /// The error's `code`: machine-readable, recorded as a rejected request's `error_kind`
    /// and, for upstream failures, the attempt's [`ErrorKind`] name.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest { code, .. } => code,
            ApiError::RequestTooLarge { .. } => "request_too_large",
            ApiError::MissingApiKey | ApiError::InvalidApiKey => "invalid_api_key",
            ApiError::KeyRateLimited { .. } => "rate_limit_exceeded",
            ApiError::TooManyStreams { .. } => "too_many_streams",
            ApiError::KeyStoreUnavailable => "store_unavailable",
            ApiError::ModelNotFound { .. } => "model_not_found",
            ApiError::NoEndpointsMatch => "no_endpoints_match",
            ApiError::AllEndpointsExcluded | ApiError::AllEndpointsUnavailable => {
                "no_endpoints_available"
            }
            ApiError::UpstreamRateLimited { .. } => "upstream_rate_limited",
            ApiError::Upstream { kind } => kind.as_str(),
            ApiError::ShuttingDown => "shutting_down",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::RouteNotFound => "not_found",
            ApiError::OriginNotAllowed { .. } => "origin_not_allowed",
            ApiError::Internal { .. } => "internal",
        }
    }

    /// What the client reads: in the client's terms, never an internal or provider message.
    pub fn message(&self) -> String {
        match self {
            ApiError::BadRequest { message, .. } => message.clone(),
            ApiError::RequestTooLarge { limit } => {
                format!("the request body is larger than {limit} bytes")
            }
            ApiError::MissingApiKey => {
                "missing API key: send `Authorization: Bearer <samewise key>`".to_owned()
            }
            ApiError::InvalidApiKey => "invalid API key".to_owned(),
            ApiError::KeyRateLimited { rpm, .. } => {
                format!("rate limit of {rpm} requests per minute reached for this key")
            }
            ApiError::TooManyStreams { limit } => format!(
                "this key has {limit} streams open, its limit (limits.max_streams_per_key); \
                 wait for one to finish"
            ),
            ApiError::KeyStoreUnavailable => {
                "the key store is unavailable and this key is not cached; try again".to_owned()
            }
            ApiError::ModelNotFound { model } => format!("The model `{model}` does not exist"),
            ApiError::NoEndpointsMatch => {
                "no endpoint of this model matches the request's `provider` preferences".to_owned()
            }
            ApiError::AllEndpointsExcluded => {
                "every endpoint of this model is currently excluded".to_owned()
            }
            ApiError::AllEndpointsUnavailable => "every endpoint of this model is unavailable \
                 (circuit open or rate limited); try again later"
                .to_owned(),
            ApiError::UpstreamRateLimited { .. } => {
                "every endpoint of this model is rate limited; try again later".to_owned()
            }
            ApiError::Upstream { kind } => match kind {
                ErrorKind::Timeout => "the upstream provider did not answer in time",
                ErrorKind::Connect => "the upstream provider could not be reached",
                ErrorKind::Upstream5xx => "the upstream provider failed",
                _ => "the upstream provider's answer was unusable",
            }
            .to_owned(),
            ApiError::ShuttingDown => "the gateway is shutting down; try again".to_owned(),
            ApiError::MethodNotAllowed => "this route does not accept that method".to_owned(),
            ApiError::RouteNotFound => "no such route".to_owned(),
            ApiError::OriginNotAllowed { origin } => format!(
                "pages of the origin {origin} may not call this gateway: \
                 its operator lists the origins allowed in [server] cors_allow_origins"
            ),
            ApiError::Internal { what } => (*what).to_owned(),
        }
    }

    /// `Retry-After` seconds, for the 429s and 503s that have one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::KeyRateLimited { retry_after, .. } => Some(*retry_after),
            ApiError::UpstreamRateLimited { retry_after } => *retry_after,
            ApiError::TooManyStreams { .. }
            | ApiError::KeyStoreUnavailable
            | ApiError::AllEndpointsUnavailable => Some(1),
            _ => None,
        }
    }

    /// The JSON body, in OpenAI's shape: the one place it is built.
    pub fn body(&self) -> ErrorBody {
        let body = ErrorBody::new(self.message(), self.error_type(), Some(self.code()));
        match self {
            ApiError::BadRequest { param: Some(p), .. } => body.with_param(p.as_str()),
            _ => body,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status_code(), self.body().to_json()).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each variant's status, type, code and Retry-After are the ones clients were sent before
    /// the variants existed (when every site passed them as strings).
    #[test]
    fn variants_keep_their_wire_status_type_and_code() {
        use ApiError as E;
        let upstream = |kind| E::Upstream { kind };
        // status, type, code, Retry-After ("-": none)
        #[rustfmt::skip]
        let cases = [
            (E::bad_request("invalid_type", "m", Some("n")), "400 invalid_request_error invalid_type -"),
            (E::RequestTooLarge { limit: 9 }, "413 invalid_request_error request_too_large -"),
            (E::MissingApiKey, "401 authentication_error invalid_api_key -"),
            (E::InvalidApiKey, "401 authentication_error invalid_api_key -"),
            (E::KeyRateLimited { rpm: 5, retry_after: 7 }, "429 rate_limit_error rate_limit_exceeded 7"),
            (E::TooManyStreams { limit: 2 }, "429 rate_limit_error too_many_streams 1"),
            (E::KeyStoreUnavailable, "503 server_error store_unavailable 1"),
            (E::ModelNotFound { model: "x".into() }, "404 invalid_request_error model_not_found -"),
            (E::NoEndpointsMatch, "404 invalid_request_error no_endpoints_match -"),
            (E::AllEndpointsExcluded, "503 server_error no_endpoints_available -"),
            (E::AllEndpointsUnavailable, "503 server_error no_endpoints_available 1"),
            (E::UpstreamRateLimited { retry_after: None }, "429 rate_limit_error upstream_rate_limited -"),
            (upstream(ErrorKind::Timeout), "504 server_error timeout -"),
            (upstream(ErrorKind::BodyReset), "502 server_error body_reset -"),
            (E::ShuttingDown, "503 server_error shutting_down -"),
            (E::MethodNotAllowed, "405 invalid_request_error method_not_allowed -"),
            (E::RouteNotFound, "404 invalid_request_error not_found -"),
            (E::Internal { what: "model list" }, "500 server_error internal -"),
        ];
        for (e, want) in cases {
            let retry = e.retry_after().map_or("-".to_owned(), |s| s.to_string());
            let got = format!(
                "{} {} {} {retry}",
                e.status_code().as_u16(),
                e.error_type(),
                e.code()
            );
            assert_eq!(got, want, "{e:?}");
        }
        let j: serde_json::Value = serde_json::from_str(
            &ApiError::bad_request("invalid_type", "`n` must be an integer", Some("n"))
                .body()
                .to_json(),
        )
        .unwrap_or_default();
        assert_eq!(
            j,
            serde_json::json!({"error": {"message": "`n` must be an integer",
                "type": "invalid_request_error", "param": "n", "code": "invalid_type"}})
        );
        let j: serde_json::Value = serde_json::from_str(
            &ApiError::ModelNotFound {
                model: "gpt-x".into(),
            }
            .body()
            .to_json(),
        )
        .unwrap_or_default();
        assert_eq!(
            j,
            serde_json::json!({"error": {"message": "The model `gpt-x` does not exist",
                "type": "invalid_request_error", "param": null, "code": "model_not_found"}})
        );
    }
}
