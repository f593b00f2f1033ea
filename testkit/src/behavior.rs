//! What the mock upstream answers: a [`Behavior`] per request, taken from the mock's scripted
//! queue (or its default when the queue is empty).
//!
//! Well-formed answers are a [`Reply`] (content pieces, tool calls, finish reason, logprobs,
//! usage, pacing); the misbehaviours are transport- or format-level faults that a real provider
//! shows in production: error statuses, rate limits, resets, malformed JSON, broken or split
//! SSE, bodies that never end, and requests never answered at all.

use std::time::Duration;

/// One scripted answer of the mock upstream, consumed by one completion request.
///
/// `GET /v1/models` never consumes a behavior: it always lists the mock's models.
#[derive(Debug, Clone)]
pub enum Behavior {
    /// A well-formed answer described by the reply script.
    Ok(Reply),
    /// This HTTP status with this body (sent as `application/json`).
    Status(u16, String),
    /// 429 with an OpenAI rate-limit error, and a `Retry-After` header (seconds) when set.
    RateLimited {
        /// Value of the `Retry-After` header, in seconds; no header when `None`.
        retry_after: Option<u64>,
    },
    /// The default reply, after waiting this long before sending the response head.
    DelayHeaders(Duration),
    /// The default reply, pausing this long before every streamed event after the first.
    DelayBetweenChunks(Duration),
    /// Read the request, then reset the connection (TCP RST) without answering.
    ResetBeforeResponse,
    /// Send the response head and this many bytes of the default body, then reset the
    /// connection (TCP RST).
    ResetAfterBytes(usize),
    /// 200 whose JSON is malformed: a truncated object for a non-streamed request, a `data:`
    /// event whose payload is not JSON (then `[DONE]`) for a streamed one.
    MalformedJson,
    /// A streamed answer whose SSE framing breaks: two valid events, then half an event with no
    /// terminating blank line, then the body ends without `[DONE]`. A non-streamed request gets
    /// the same bytes labelled `text/event-stream`.
    BrokenSse,
    /// The default reply, with the body written in pieces split at awkward byte offsets (inside
    /// `data:`, inside JSON strings, between `\n` and `\n`), flushed separately with a pause
    /// between writes so that the reader sees them as separate reads.
    SplitEvents,
    /// The response head and the first part of the body, then nothing until the mock shuts
    /// down (the connection is held open; for the open-streams benchmark too).
    NeverEnds,
    /// A hung provider: accept, read the request, and never answer, not even a response head;
    /// the connection stays open until the client drops it or the mock shuts down
    /// ([`crate::MockUpstream::hanging`] counts the connections held so).
    Hang,
    /// An answer with these tool calls and this finish reason (no text content).
    ToolCalls {
        /// The calls, valid or not: names and raw argument strings are sent as given.
        calls: Vec<ToolCall>,
        /// The `finish_reason` sent with them (`"tool_calls"`, or `"stop"` to script a mismatch).
        finish_reason: String,
    },
    /// The default reply with logprobs attached even when the request did not ask for them.
    Logprobs,
    /// A reply made of `token` repeated `times` times, one streamed delta (and one logprob
    /// token) per repetition.
    RepeatToken {
        /// The repeated text unit.
        token: String,
        /// How many times in a row it is sent.
        times: usize,
    },
    /// The default reply without any `usage`, even when `stream_options.include_usage` is set.
    NoUsage,
}

/// A well-formed answer: what the mock says and how it paces it.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// Text pieces, one streamed delta (and one logprob token) each; `None` means the default
    /// text, which names the mock and echoes the requested model id.
    pub content: Option<Vec<String>>,
    /// Tool calls in the answer, after the text.
    pub tool_calls: Vec<ToolCall>,
    /// The `finish_reason`; `None` means `"tool_calls"` when there are calls, else `"stop"`.
    pub finish_reason: Option<String>,
    /// When logprobs are attached.
    pub logprobs: LogprobsMode,
    /// Leave `usage` out even when it would be sent.
    pub no_usage: bool,
    /// Wait before sending the response head.
    pub header_delay: Duration,
    /// Wait before every streamed event after the first.
    pub chunk_delay: Duration,
    /// Write the body in pieces split at awkward offsets (see [`Behavior::SplitEvents`]).
    pub split_writes: bool,
    /// Send a streamed answer (head, every event, the last chunk) in one write: a burst, as a
    /// provider that flushes several events at once sends it. Ignored with `chunk_delay` or
    /// `split_writes`, which pace the writes themselves.
    pub one_write: bool,
}

/// When a reply carries logprobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogprobsMode {
    /// When the request asks (`logprobs: true` on chat, `logprobs: N` on completions).
    #[default]
    WhenAsked,
    /// Always.
    Always,
    /// Never, even when asked (a provider without logprobs).
    Never,
}

/// One tool call as the mock sends it; the arguments are a raw string so tests can send
/// invalid JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call id; `None` means a generated `call_<n>`.
    pub id: Option<String>,
    /// The function name, sent as given (it may name no declared tool).
    pub name: String,
    /// The arguments string, sent as given (it may be invalid JSON or mismatch the schema).
    pub arguments: String,
}

impl Behavior {
    /// A well-formed reply with these text pieces.
    pub fn text<I, S>(pieces: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Behavior::Ok(Reply::text(pieces))
    }

    /// Tool calls with the given finish reason.
    pub fn tool_calls(calls: Vec<ToolCall>, finish_reason: &str) -> Self {
        Behavior::ToolCalls {
            calls,
            finish_reason: finish_reason.to_owned(),
        }
    }

    /// The reply script this behavior answers with, for the well-formed ones; `None` for the
    /// transport- and format-level faults, which the server renders itself.
    pub(crate) fn reply(&self) -> Option<Reply> {
        let reply = match self {
            Behavior::Ok(reply) => reply.clone(),
            Behavior::DelayHeaders(d) => Reply {
                header_delay: *d,
                ..Reply::default()
            },
            Behavior::DelayBetweenChunks(d) => Reply {
                chunk_delay: *d,
                ..Reply::default()
            },
            Behavior::SplitEvents => Reply {
                split_writes: true,
                ..Reply::default()
            },
            Behavior::ToolCalls {
                calls,
                finish_reason,
            } => Reply {
                content: Some(Vec::new()),
                tool_calls: calls.clone(),
                finish_reason: Some(finish_reason.clone()),
                ..Reply::default()
            },
            Behavior::Logprobs => Reply {
                logprobs: LogprobsMode::Always,
                ..Reply::default()
            },
            Behavior::RepeatToken { token, times } => Reply::text(vec![token.clone(); *times]),
            Behavior::NoUsage => Reply {
                no_usage: true,
                ..Reply::default()
            },
            Behavior::Status(..)
            | Behavior::RateLimited { .. }
            | Behavior::ResetBeforeResponse
            | Behavior::ResetAfterBytes(_)
            | Behavior::MalformedJson
            | Behavior::BrokenSse
            | Behavior::NeverEnds
            | Behavior::Hang => return None,
        };
        Some(reply)
    }
}

impl Reply {
    /// A reply with these text pieces and defaults otherwise.
    pub fn text<I, S>(pieces: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Reply {
            content: Some(pieces.into_iter().map(Into::into).collect()),
            ..Reply::default()
        }
    }

    /// The same reply with this finish reason.
    #[must_use]
    pub fn finish(mut self, reason: &str) -> Self {
        self.finish_reason = Some(reason.to_owned());
        self
    }

    /// The same reply with these tool calls after the text.
    #[must_use]
    pub fn with_tool_calls(mut self, calls: Vec<ToolCall>) -> Self {
        self.tool_calls = calls;
        self
    }

    /// The same reply with this logprobs mode.
    #[must_use]
    pub fn logprobs(mut self, mode: LogprobsMode) -> Self {
        self.logprobs = mode;
        self
    }
}

impl ToolCall {
    /// A call of `name` with this raw arguments string and a generated id.
    pub fn new(name: &str, arguments: &str) -> Self {
        ToolCall {
            id: None,
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }
    }
}
