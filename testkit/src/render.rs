//! Renders the mock's answers as OpenAI JSON and SSE: chat completions (`chat.completion`,
//! `chat.completion.chunk`) and legacy completions (`text_completion`), with tool calls,
//! logprobs in each endpoint's own shape, and usage.

use serde_json::{Value, json};

use crate::behavior::{LogprobsMode, Reply};

/// A fixed `created` timestamp: answers are deterministic.
const CREATED: u64 = 1_700_000_000;

/// Which completion endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// What the renderer needs from a request body.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub endpoint: Endpoint,
    /// The model id as sent (echoed in answers so tests can tell endpoints apart).
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The request asked for logprobs.
    pub logprobs: bool,
    /// How many alternatives per position (`top_logprobs` on chat, `logprobs: N` on completions).
    pub top_logprobs: usize,
    /// Whitespace-separated words in the prompt: the mock's prompt token count.
    pub prompt_tokens: u64,
}

impl Parsed {
    /// Reads the fields the mock cares about; `Err` is the message of a 400 answer.
    pub fn from_body(endpoint: Endpoint, body: &[u8]) -> Result<Parsed, String> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
        let model = value
            .get("model")
            .and_then(Value::as_str)
            .ok_or("missing string field `model`")?
            .to_owned();
        let stream = value
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let include_usage = value
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let (logprobs, top_logprobs) = match endpoint {
            Endpoint::Chat => (
                value
                    .get("logprobs")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                value
                    .get("top_logprobs")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
            ),
            Endpoint::Completions => match value.get("logprobs").and_then(Value::as_u64) {
                Some(n) => (true, n),
                None => (false, 0),
            },
        };
        let prompt_text = match endpoint {
            Endpoint::Chat => value
                .get("messages")
                .and_then(Value::as_array)
                .map(|msgs| {
                    msgs.iter()
                        .filter_map(|m| m.get("content").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default(),
            Endpoint::Completions => value
                .get("prompt")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        let prompt_tokens = prompt_text.split_whitespace().count().max(1) as u64;
        Ok(Parsed {
            endpoint,
            model,
            stream,
            include_usage,
            logprobs,
            top_logprobs: usize::try_from(top_logprobs).unwrap_or(usize::MAX).min(20),
            prompt_tokens,
        })
    }
}

/// A reply resolved against one request: the pieces, and whether logprobs and usage go out.
pub(crate) struct Answer<'a> {
    pub req: &'a Parsed,
    pub reply: &'a Reply,
    pub id: String,
    pub pieces: Vec<String>,
    pub with_logprobs: bool,
}

impl<'a> Answer<'a> {
    pub fn new(req: &'a Parsed, reply: &'a Reply, mock_name: &str, seq: u64) -> Self {
        let pieces = reply
            .content
            .clone()
            .unwrap_or_else(|| default_pieces(mock_name, &req.model));
        let with_logprobs = match reply.logprobs {
            LogprobsMode::WhenAsked => req.logprobs,
            LogprobsMode::Always => true,
            LogprobsMode::Never => false,
        };
        let prefix = match req.endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        Answer {
            req,
            reply,
            id: format!("{prefix}-{mock_name}-{seq}"),
            pieces,
            with_logprobs,
        }
    }

    fn finish_reason(&self) -> String {
        match &self.reply.finish_reason {
            Some(r) => r.clone(),
            None if !self.reply.tool_calls.is_empty() && self.req.endpoint == Endpoint::Chat => {
                "tool_calls".into()
            }
            None => "stop".into(),
        }
    }

    fn usage(&self) -> Value {
        let completion = self.pieces.len() as u64 + self.reply.tool_calls.len() as u64;
        json!({
            "prompt_tokens": self.req.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.req.prompt_tokens + completion,
        })
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.req.endpoint, stream) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    /// The whole non-streamed JSON body.
    pub fn full_body(&self) -> Vec<u8> {
        let text: String = self.pieces.concat();
        let choice = match self.req.endpoint {
            Endpoint::Chat => {
                let mut message = json!({"role": "assistant", "content": if text.is_empty() && !self.reply.tool_calls.is_empty() { Value::Null } else { Value::String(text) }});
                if !self.reply.tool_calls.is_empty() {
                    let calls: Vec<Value> = self
                        .reply
                        .tool_calls
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            json!({"id": call_id(c, i), "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
                        })
                        .collect();
                    message["tool_calls"] = Value::Array(calls);
                }
                let logprobs = if self.with_logprobs {
                    json!({"content": (0..self.pieces.len()).map(|i| self.chat_logprob(i)).collect::<Vec<_>>()})
                } else {
                    Value::Null
                };
                json!({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": self.finish_reason()})
            }
            Endpoint::Completions => {
                let logprobs = if self.with_logprobs {
                    self.completion_logprobs(0..self.pieces.len())
                } else {
                    Value::Null
                };
                json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": self.finish_reason()})
            }
        };
        let mut body = json!({
            "id": self.id,
            "object": self.object(false),
            "created": CREATED,
            "model": self.req.model,
            "choices": [choice],
        });
        if !self.reply.no_usage {
            body["usage"] = self.usage();
        }
        body.to_string().into_bytes()
    }

    /// The streamed events, each a complete `data: ...\n\n`, ending with `data: [DONE]`.
    pub fn events(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.req.endpoint == Endpoint::Chat {
            out.push(self.chunk(json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})));
        }
        for (i, piece) in self.pieces.iter().enumerate() {
            let choice = match self.req.endpoint {
                Endpoint::Chat => {
                    let logprobs = if self.with_logprobs {
                        json!({"content": [self.chat_logprob(i)]})
                    } else {
                        Value::Null
                    };
                    json!({"index": 0, "delta": {"content": piece}, "logprobs": logprobs, "finish_reason": null})
                }
                Endpoint::Completions => {
                    let logprobs = if self.with_logprobs {
                        self.completion_logprobs(i..i + 1)
                    } else {
                        Value::Null
                    };
                    json!({"index": 0, "text": piece, "logprobs": logprobs, "finish_reason": null})
                }
            };
            out.push(self.chunk(choice));
        }
        if self.req.endpoint == Endpoint::Chat {
            for (i, call) in self.reply.tool_calls.iter().enumerate() {
                out.push(self.chunk(json!({"index": 0, "delta": {"tool_calls": [{"index": i, "id": call_id(call, i), "type": "function", "function": {"name": call.name, "arguments": ""}}]}, "finish_reason": null})));
                for part in split3(&call.arguments) {
                    out.push(self.chunk(json!({"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": part}}]}, "finish_reason": null})));
                }
            }
        }
        let finish = match self.req.endpoint {
            Endpoint::Chat => {
                json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": self.finish_reason()})
            }
            Endpoint::Completions => {
                json!({"index": 0, "text": "", "logprobs": null, "finish_reason": self.finish_reason()})
            }
        };
        out.push(self.chunk(finish));
        if self.req.include_usage && !self.reply.no_usage {
            let usage = json!({"id": self.id, "object": self.object(true), "created": CREATED, "model": self.req.model, "choices": [], "usage": self.usage()});
            out.push(format!("data: {usage}\n\n"));
        }
        out.push("data: [DONE]\n\n".to_owned());
        out
    }

    fn chunk(&self, choice: Value) -> String {
        let chunk = json!({"id": self.id, "object": self.object(true), "created": CREATED, "model": self.req.model, "choices": [choice]});
        format!("data: {chunk}\n\n")
    }

    fn chat_logprob(&self, i: usize) -> Value {
        let token = &self.pieces[i];
        let lp = logprob(i);
        let top: Vec<Value> = (0..self.req.top_logprobs)
            .map(|j| {
                let t = if j == 0 {
                    token.clone()
                } else {
                    format!("alt{j}")
                };
                json!({"token": t, "logprob": lp - j as f64, "bytes": t.as_bytes()})
            })
            .collect();
        json!({"token": token, "logprob": lp, "bytes": token.as_bytes(), "top_logprobs": top})
    }

    fn completion_logprobs(&self, range: std::ops::Range<usize>) -> Value {
        let mut offset: usize = self.pieces[..range.start].iter().map(String::len).sum();
        let (mut tokens, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
        for i in range {
            let token = &self.pieces[i];
            let lp = logprob(i);
            let mut top = serde_json::Map::new();
            for j in 0..self.req.top_logprobs {
                let t = if j == 0 {
                    token.clone()
                } else {
                    format!("alt{j}")
                };
                top.insert(t, json!(lp - j as f64));
            }
            tokens.push(json!(token));
            lps.push(json!(lp));
            tops.push(Value::Object(top));
            offsets.push(json!(offset));
            offset += token.len();
        }
        json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
    }
}

/// The default text: names the mock and echoes the model id it was sent.
pub(crate) fn default_pieces(mock_name: &str, model: &str) -> Vec<String> {
    vec![
        "Hello".into(),
        " from".into(),
        format!(" {mock_name}"),
        " serving".into(),
        format!(" {model}"),
        ".".into(),
    ]
}

/// An OpenAI-shaped error body.
pub(crate) fn error_body(message: &str, kind: &str, code: Option<&str>) -> String {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}}).to_string()
}

/// A deterministic logprob for position `i`.
fn logprob(i: usize) -> f64 {
    -0.0625 * ((i % 7) as f64 + 1.0)
}

fn call_id(call: &crate::behavior::ToolCall, i: usize) -> String {
    call.id.clone().unwrap_or_else(|| format!("call_{i}"))
}

/// Splits a string into three pieces at character boundaries (some may be empty), so streamed
/// arguments arrive in several deltas.
fn split3(s: &str) -> Vec<&str> {
    let boundary = |mut at: usize| {
        while !s.is_char_boundary(at) {
            at += 1;
        }
        at
    };
    let a = boundary(s.len() / 3);
    let b = boundary((2 * s.len() / 3).max(a));
    [&s[..a], &s[a..b], &s[b..]]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split3_keeps_every_byte_in_order() {
        for s in ["", "a", "ab", "{\"city\": \"Zürich\"}", "ééé", "{}"] {
            assert_eq!(split3(s).concat(), s);
        }
    }
}
