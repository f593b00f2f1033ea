//! samewise-wire: the OpenAI wire format as samewise speaks it, and the SSE codec.
//!
//! This crate owns the request, response and stream-chunk types of OpenAI's
//! `/v1/chat/completions`, `/v1/completions` and `/v1/models`, the OpenAI error body, and an
//! incremental Server-Sent Events decoder/encoder. It must not do IO: every other crate
//! (proxy, engine, probes) exchanges these values, and the proxy forwards raw bytes rather than
//! re-serialising these types, so fidelity to what a client sent never depends on them.
//!
//! Every object type keeps the fields it does not know in an `extra` map (`#[serde(flatten)]`),
//! so a value read and written again loses nothing a provider or client added.
//!
//! # Layout
//! - `chat`: chat-completion requests, responses, chunks, messages, tools and tool calls.
//! - `completions`: legacy completions with `echo` and numeric `logprobs`.
//! - `common`: `Usage`, `ErrorBody`, the model list.
//! - [`sse`]: `SseDecoder` (incremental, split-safe, bounded) and the event encoder.
//!
//! The API is the types re-exported below and the `sse` codec; the modules holding the types
//! are private.

mod chat;
mod common;
mod completions;
/// A namespace of the API: the SSE codec (`sse::SseDecoder`, `sse::encode_data`, ...).
pub mod sse;

pub use chat::{
    ChatChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs,
    ChatMessage, ChunkChoice, Delta, FunctionCall, FunctionCallDelta, FunctionDef, MessageContent,
    StreamOptions, TokenLogprob, Tool, ToolCall, ToolCallDelta, TopLogprob,
};
pub use common::{ErrorBody, ErrorDetail, ModelList, ModelObject, Stop, Usage};
pub use completions::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, Prompt,
};

/// The map that holds fields a type does not name, in the order they arrived.
pub type Extra = serde_json::Map<String, serde_json::Value>;
