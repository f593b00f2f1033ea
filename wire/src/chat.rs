//! `/v1/chat/completions`: the request, the response, the stream chunk, and the message,
//! tool and logprob types they share.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Extra, Stop, Usage};

/// A chat-completion request. Fields samewise reads are typed; everything else (provider
/// extensions, `response_format`, penalties, ...) stays in `extra` untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// The model name the client asked for.
    pub model: String,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Stream the answer as SSE chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Stream options (`include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Upper bound on generated tokens (legacy name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Upper bound on generated tokens (current name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Sampling temperature; 0 means greedy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Number of choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Seed for sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Return the logprob of each generated token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// How many alternatives per position (0..=20), with `logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    /// `"none"`, `"auto"`, `"required"` or a named function object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Everything else the client sent.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatCompletionRequest {
    /// The generation limit, whichever of the two names was used.
    pub fn max_new_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` and no choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One message of a conversation, or the message of an answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text, or a list of content parts; absent on assistant tool-call messages.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Calls the assistant made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// On `tool` messages: the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// `refusal`, `reasoning_content`, ...
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatMessage {
    /// A message with plain-text content.
    pub fn text(role: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.to_owned(),
            content: Some(MessageContent::Text(content.into())),
            ..ChatMessage::default()
        }
    }

    /// The text of the message: the string, or the `text` of every text part joined.
    pub fn content_text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(c) => c.text(),
        }
    }
}

/// Message content: a string or a list of parts (`{"type":"text","text":...}`, images, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts, kept as JSON.
    Parts(Vec<Value>),
}

impl MessageContent {
    /// The text of the content (text parts concatenated; other parts ignored).
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(s) => s.clone(),
            MessageContent::Parts(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        }
    }
}

/// A tool the model may call (`{"type":"function","function":{...}}`). Another type (OpenAI's
/// `"custom"` tools, whose input is free text) is an error naming it, as vLLM refuses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ToolFields")]
pub struct Tool {
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A [`Tool`] as sent, before its type is checked.
#[derive(Deserialize)]
struct ToolFields {
    #[serde(rename = "type", default = "function_kind")]
    kind: String,
    function: Option<FunctionDef>,
    #[serde(flatten)]
    extra: Extra,
}

impl TryFrom<ToolFields> for Tool {
    type Error = String;

    fn try_from(t: ToolFields) -> Result<Self, String> {
        if t.kind != "function" {
            return Err(format!(
                "only \"function\" tools are supported, not {:?}",
                t.kind
            ));
        }
        let function = t.function.ok_or("missing field `function`")?;
        Ok(Tool {
            kind: t.kind,
            function,
            extra: t.extra,
        })
    }
}

/// A callable function: its name, description and JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    /// The name the model must use.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments object; absent means any object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// `strict` and anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id (`call_...`).
    #[serde(default)]
    pub id: String,
    /// Always `"function"` today.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// Which function, with what arguments.
    pub function: FunctionCall,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The function part of a [`ToolCall`]: `arguments` is JSON *text*, which may be invalid.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    #[serde(default)]
    pub name: String,
    /// Arguments as the model wrote them (a JSON document in a string).
    #[serde(default)]
    pub arguments: String,
}

fn function_kind() -> String {
    "function".to_owned()
}

/// A non-streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-...`.
    #[serde(default)]
    pub id: String,
    /// `"chat.completion"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered, as the server names it.
    #[serde(default)]
    pub model: String,
    /// One per `n`.
    #[serde(default)]
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// `system_fingerprint` and anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One choice of a [`ChatCompletionResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Position among the choices.
    #[serde(default)]
    pub index: u32,
    /// The answer.
    pub message: ChatMessage,
    /// `stop`, `length`, `tool_calls`, `content_filter`, ...
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Per-token logprobs when asked for.
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `choices[].logprobs` of the chat API.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per generated content token.
    #[serde(default)]
    pub content: Option<Vec<TokenLogprob>>,
    /// `refusal` and anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One generated token with its logprob and the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its natural-log probability.
    pub logprob: f64,
    /// Its UTF-8 bytes (a token may be part of a character).
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    /// The `top_logprobs` most likely tokens at this position.
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative in [`TokenLogprob::top_logprobs`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its natural-log probability.
    pub logprob: f64,
    /// Its UTF-8 bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
}

/// One SSE chunk of a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// Same id on every chunk of a stream.
    #[serde(default)]
    pub id: String,
    /// `"chat.completion.chunk"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// Deltas; empty on the final usage chunk.
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    /// Present on the usage chunk (`stream_options.include_usage`), else null or absent.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One choice of a [`ChatCompletionChunk`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    /// Which choice this delta extends.
    #[serde(default)]
    pub index: u32,
    /// What is new.
    #[serde(default)]
    pub delta: Delta,
    /// Set on the last chunk of the choice.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Logprobs of the tokens in this delta.
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The new part of a message in a chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// On the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Pieces of tool calls, assembled by `index`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// Anything else (`reasoning_content`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A piece of a streamed tool call: the first piece of an index carries id and name, later
/// ones more `arguments` text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which call (0-based, per choice).
    #[serde(default)]
    pub index: u32,
    /// The call id, on its first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"`, on its first piece.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name and/or a slice of the arguments text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// The function name, on the first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next slice of the arguments text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_keeps_unknown_fields_and_round_trips() {
        let text = r#"{"model":"m","messages":[{"role":"user","content":"hi","x_part":1}],
            "logprobs":true,"top_logprobs":5,"response_format":{"type":"json_object"},
            "provider_specific":{"a":[1,2]},"tools":[{"type":"function","function":{"name":"f",
            "parameters":{"type":"object"},"strict":true}}],"tool_choice":"auto","seed":7}"#;
        let req: ChatCompletionRequest = serde_json::from_str(text).unwrap();
        assert_eq!(req.top_logprobs, Some(5));
        assert_eq!(req.extra["provider_specific"]["a"][1], 2);
        assert_eq!(req.messages[0].extra["x_part"], 1);
        assert_eq!(
            req.tools.as_ref().unwrap()[0].function.extra["strict"],
            true
        );
        let again: Value = serde_json::to_value(&req).unwrap();
        let orig: Value = serde_json::from_str(text).unwrap();
        assert_eq!(again, orig);
    }

    #[test]
    fn content_parts_give_their_text() {
        let m: ChatMessage = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(m.content_text(), "ab");
    }

    #[test]
    fn chunk_with_tool_call_delta_and_null_usage() {
        let c: ChatCompletionChunk = serde_json::from_str(
            r#"{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","usage":null,
            "choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"a\""}}]},"finish_reason":null}]}"#,
        )
        .unwrap();
        let d = &c.choices[0].delta.tool_calls.as_ref().unwrap()[0];
        assert_eq!(d.index, 1);
        assert_eq!(
            d.function.as_ref().unwrap().arguments.as_deref(),
            Some("{\"a\"")
        );
        assert!(c.usage.is_none());
    }

    #[test]
    fn wrong_types_are_errors_not_panics() {
        assert!(
            serde_json::from_str::<ChatCompletionRequest>(r#"{"model":"m","messages":"hi"}"#)
                .is_err()
        );
        assert!(serde_json::from_str::<ChatCompletionRequest>(r#"{"model":"m"}"#).is_err());
        assert!(
            serde_json::from_str::<ChatCompletionRequest>(r#"{"model":1,"messages":[]}"#).is_err()
        );
    }

    #[test]
    fn only_function_tools_are_tools() {
        let tool = |t: &str| serde_json::from_str::<Tool>(t).map_err(|e| e.to_string());
        let f = r#"{"name":"get_weather","parameters":{"type":"object"}}"#;
        let ok = tool(&format!(r#"{{"type":"function","function":{f},"x":1}}"#));
        let ok = ok.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (ok.kind.as_str(), ok.function.name.as_str()),
            ("function", "get_weather")
        );
        assert_eq!(ok.extra.get("x"), Some(&serde_json::json!(1)));
        // the type defaults to function, and round-trips
        let bare = tool(&format!(r#"{{"function":{f}}}"#)).unwrap_or_else(|e| panic!("{e}"));
        let back = serde_json::to_value(&bare).unwrap_or_default();
        assert_eq!(back["type"], "function");
        let e = tool(r#"{"type":"custom","custom":{"name":"code_exec"}}"#).err();
        assert!(
            e.as_deref().is_some_and(|e| e.contains(r#"only "function" tools are supported, not "custom""#)),
            "{e:?}"
        );
        let e = tool(r#"{"type":"function"}"#).err();
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("missing field `function`")),
            "{e:?}"
        );
    }
}
