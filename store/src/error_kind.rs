//! [`ErrorKind`]: why an upstream attempt failed, as `request_records.error_kind` stores it
//! for a record with an endpoint. The gateway records it, the passive detectors, metrics and
//! pages read it back: one closed set of names, so a reader never filters on a string a
//! writer no longer sends. (A request rejected before any attempt — no endpoint — carries the
//! code of the OpenAI error its client was sent instead, e.g. `invalid_api_key`.)

/// Why an upstream attempt failed (or ended badly); `None` in a record means it did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The endpoint could not be called as configured (its provider is missing).
    Config,
    /// No connection could be made.
    Connect,
    /// No response head within the first-byte timeout.
    Timeout,
    /// The connection failed otherwise before the response head.
    UpstreamIo,
    /// The endpoint answered 429.
    RateLimited,
    /// The endpoint answered another 4xx.
    Upstream4xx,
    /// The endpoint answered 5xx.
    Upstream5xx,
    /// A 2xx JSON body that carries an OpenAI error object.
    UpstreamErrorBody,
    /// A streamed request answered with something other than SSE.
    NotSse,
    /// A body or an event that is not JSON.
    InvalidJson,
    /// The degeneration guard cut the answer (a token repeated N times).
    Degenerate,
    /// A non-streamed body went silent past the idle timeout.
    BodyIdleTimeout,
    /// A non-streamed body's connection broke.
    BodyReset,
    /// A non-streamed body exceeded the size bound.
    BodyTooLarge,
    /// A stream went silent past the idle timeout.
    StreamIdleTimeout,
    /// A stream's connection broke.
    StreamReset,
    /// A stream that is not valid SSE.
    BrokenSse,
    /// A stream that ended in the middle of an event or before it finished.
    StreamTruncated,
    /// A stream that finished but never sent its `[DONE]`.
    MissingDone,
    /// A stream that carried an OpenAI error event.
    UpstreamStreamError,
    /// The client went away before the answer ended: not the endpoint's doing.
    ClientDisconnect,
    /// A hedged attempt that lost the race: another attempt of the same request produced its
    /// first byte sooner, so this one was cancelled (its connection dropped) before answering.
    HedgeLost,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 22] = [
        ErrorKind::Config,
        ErrorKind::Connect,
        ErrorKind::Timeout,
        ErrorKind::UpstreamIo,
        ErrorKind::RateLimited,
        ErrorKind::Upstream4xx,
        ErrorKind::Upstream5xx,
        ErrorKind::UpstreamErrorBody,
        ErrorKind::NotSse,
        ErrorKind::InvalidJson,
        ErrorKind::Degenerate,
        ErrorKind::BodyIdleTimeout,
        ErrorKind::BodyReset,
        ErrorKind::BodyTooLarge,
        ErrorKind::StreamIdleTimeout,
        ErrorKind::StreamReset,
        ErrorKind::BrokenSse,
        ErrorKind::StreamTruncated,
        ErrorKind::MissingDone,
        ErrorKind::UpstreamStreamError,
        ErrorKind::ClientDisconnect,
        ErrorKind::HedgeLost,
    ];

    /// The stored name (also the `code` of the error a client is sent, and a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::UpstreamIo => "upstream_io",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Upstream4xx => "upstream_4xx",
            ErrorKind::Upstream5xx => "upstream_5xx",
            ErrorKind::UpstreamErrorBody => "upstream_error_body",
            ErrorKind::NotSse => "not_sse",
            ErrorKind::InvalidJson => "invalid_json",
            ErrorKind::Degenerate => "degenerate",
            ErrorKind::BodyIdleTimeout => "body_idle_timeout",
            ErrorKind::BodyReset => "body_reset",
            ErrorKind::BodyTooLarge => "body_too_large",
            ErrorKind::StreamIdleTimeout => "stream_idle_timeout",
            ErrorKind::StreamReset => "stream_reset",
            ErrorKind::BrokenSse => "broken_sse",
            ErrorKind::StreamTruncated => "stream_truncated",
            ErrorKind::MissingDone => "missing_done",
            ErrorKind::UpstreamStreamError => "upstream_stream_error",
            ErrorKind::ClientDisconnect => "client_disconnect",
            ErrorKind::HedgeLost => "hedge_lost",
        }
    }

    /// The kind a stored name stands for; None for a name no version of samewise writes.
    pub fn parse(s: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether an attempt that ended this way may be the endpoint's failure: every kind but
    /// the client going away and a hedge the gateway cancelled because another endpoint
    /// answered first. (An `upstream_4xx` may still be the request's own fault: see
    /// [`refuses_the_request`].)
    pub fn may_be_the_endpoints(self) -> bool {
        !matches!(self, ErrorKind::ClientDisconnect | ErrorKind::HedgeLost)
    }
}

/// 4xx statuses that are the endpoint's (or the gateway's credentials'), not the request's:
/// the provider refused our key (401, 403, 407) or timed out reading the request (408).
const ENDPOINT_4XX: [u16; 4] = [401, 403, 407, 408];

/// Whether an answer with `status` refused the request itself (400, 404, 413, 422, ...: any
/// 4xx but 429 and `ENDPOINT_4XX`): the client's fault, not the endpoint's.
pub fn refuses_the_request(status: Option<u16>) -> bool {
    status.is_some_and(|s| (400..500).contains(&s) && s != 429 && !ENDPOINT_4XX.contains(&s))
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn names_are_distinct_and_round_trip() {
        let names: std::collections::BTreeSet<&str> =
            ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), ErrorKind::ALL.len());
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(ErrorKind::parse("stream_error"), None);
    }
}
