//! The side reader of a response: it looks at the decoded SSE events of a stream (or the whole
//! JSON body of a non-streamed answer) while the bytes go to the client untouched, and keeps
//! what a request record needs — time to first token, token timing, usage, finish reason,
//! output length, tool calls — and whether the generation degenerated.
//!
//! Token counts when the upstream sends no `usage` (marked `usage_counted` in the record):
//! completion tokens are the number of streamed content and tool-call deltas (servers send
//! about one token per delta), or ceil(output characters / 4) for a non-streamed answer;
//! prompt tokens are ceil(prompt characters / 4). Both are approximations.
//!
//! Time to first token is measured from the start of the attempt to the first content or
//! tool-call delta of a stream; for a non-streamed answer, to the arrival of its whole body
//! (the first moment a client can use any token).

use std::borrow::Cow;

use serde::Deserialize;
use tokio::time::Instant;

use crate::body::Route;

/// What the side reader saw of one attempt's answer.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// When the first content (or tool-call) delta arrived.
    pub first_token_at: Option<Instant>,
    /// When the last one arrived.
    pub last_token_at: Option<Instant>,
    /// Content and tool-call deltas seen (streams).
    pub deltas: u64,
    /// Characters of generated text (content and tool-call arguments).
    pub output_chars: usize,
    /// The first choice's finish reason.
    pub finish_reason: Option<String>,
    /// `usage` as reported by the upstream.
    pub usage: Option<(i64, i64)>,
    /// The upstream sent an error object inside a 200 answer.
    pub upstream_error: bool,
    /// The `[DONE]` sentinel arrived.
    pub done: bool,
    /// Events whose data was not JSON (passed on as they were).
    pub invalid_events: u32,
    /// The degeneration guard fired.
    pub degenerate: bool,
    /// Tool-call check results.
    pub tools: ToolCounts,
    /// The assembled answer of the first choice (`text`, `text_truncated`, `tool_calls`,
    /// `finish_reason`), kept only for a model that captures bodies.
    pub answer: Option<serde_json::Value>,
}

/// Tool-call classification counts of one answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCounts {
    /// Calls returned.
    pub calls: u32,
    /// Calls whose arguments are not JSON.
    pub invalid_json: u32,
    /// Calls naming an undeclared tool.
    pub unknown_name: u32,
    /// Calls whose arguments fail the declared schema.
    pub schema_mismatch: u32,
    /// Finish reason and calls disagree.
    pub finish_mismatch: Option<String>,
}

impl ToolCounts {
    /// Whether any check failed.
    pub fn errored(&self) -> bool {
        self.invalid_json + self.unknown_name + self.schema_mismatch > 0
            || self.finish_mismatch.is_some()
    }
}

/// What to do with one decoded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventAction {
    /// Send it on.
    Forward,
    /// Drop it (the usage-only chunk the client did not ask for).
    Drop,
    /// The generation degenerated here: end the stream (this event is not sent).
    Cut,
}

/// Side reader state for one attempt.
#[derive(Debug)]
pub struct Inspector {
    route: Route,
    strip_usage_chunk: bool,
    obs: Observation,
    degen: crate::degen::RepeatGuard,
    tools: Option<std::sync::Arc<samewise_toolcheck::ToolSet>>,
    assembler: samewise_toolcheck::ToolCallAssembler,
    /// When capturing: the first choice's text so far, and the most bytes kept of it.
    kept: Option<(String, usize)>,
    /// Text beyond the bound was left out.
    kept_truncated: bool,
}

/// A stream chunk as read: its texts borrowed from the event's data where they hold no escapes.
#[derive(Debug, Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Choices<ChunkChoice<'a>>,
    #[serde(default)]
    usage: Option<UsageLite>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    delta: Option<DeltaLite<'a>>,
    #[serde(default, borrow, deserialize_with = "opt_text")]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "opt_text")]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct DeltaLite<'a> {
    #[serde(default, borrow, deserialize_with = "opt_text")]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
struct UsageLite {
    #[serde(default)]
    prompt_tokens: i64,
    #[serde(default)]
    completion_tokens: i64,
}

/// A non-streamed answer as read: the texts borrowed from the body where they hold no escapes.
#[derive(Debug, Deserialize)]
struct FullResponse<'a> {
    #[serde(default, borrow)]
    choices: Choices<FullChoice<'a>>,
    #[serde(default)]
    usage: Option<UsageLite>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct FullChoice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(default, borrow)]
    message: Option<FullMessage<'a>>,
    #[serde(default, borrow, deserialize_with = "opt_text")]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    logprobs: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct FullMessage<'a> {
    #[serde(default, borrow, deserialize_with = "opt_text")]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Vec<serde_json::Value>>,
}

/// A `choices` array as read: the first choice kept in place, any others in a vector, so
/// that the usual answer of one choice (every chunk of a stream) allocates nothing for it.
#[derive(Debug)]
struct Choices<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Default for Choices<T> {
    fn default() -> Self {
        Choices {
            first: None,
            rest: Vec::new(),
        }
    }
}

impl<T> Choices<T> {
    fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(&self.rest)
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Choices<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Seq<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Seq<T> {
            type Value = Choices<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Choices<T>, A::Error> {
                let first = seq.next_element()?;
                let mut rest = Vec::new();
                if first.is_some() {
                    while let Some(c) = seq.next_element()? {
                        rest.push(c);
                    }
                }
                Ok(Choices { first, rest })
            }
        }
        d.deserialize_seq(Seq(std::marker::PhantomData))
    }
}

/// An optional string borrowed from the JSON where it holds no escapes. (`#[serde(borrow)]`
/// borrows a `Cow<str>` field, but an `Option<Cow<str>>` one is always copied.)
fn opt_text<'de: 'a, 'a, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Text<'a>>::deserialize(d)?.map(|t| t.0))
}

impl Inspector {
    /// A reader for one attempt; `tools` are the request's declared tools, compiled once per
    /// request.
    pub fn new(
        route: Route,
        strip_usage_chunk: bool,
        tools: Option<std::sync::Arc<samewise_toolcheck::ToolSet>>,
        degen: crate::degen::RepeatGuard,
    ) -> Self {
        Inspector {
            route,
            strip_usage_chunk,
            obs: Observation::default(),
            degen,
            tools,
            assembler: samewise_toolcheck::ToolCallAssembler::new(),
            kept: None,
            kept_truncated: false,
        }
    }

    /// Keeps the first choice's assembled answer (its text up to `max_bytes`) for a captured
    /// body.
    pub fn keep_answer(mut self, max_bytes: usize) -> Self {
        self.kept = Some((String::new(), max_bytes));
        self
    }

    fn keep_text(&mut self, t: &str) {
        if let Some((text, max)) = self.kept.as_mut() {
            let room = max.saturating_sub(text.len());
            if t.len() <= room {
                text.push_str(t);
            } else {
                let mut cut = room;
                while !t.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.push_str(&t[..cut]);
                self.kept_truncated = true;
            }
        }
    }

    /// Whether a finish reason arrived (the generation completed).
    pub fn saw_finish(&self) -> bool {
        self.obs.finish_reason.is_some()
    }

    /// Reads one stream event's data (everything but `[DONE]`).
    pub fn on_event(&mut self, data: &str, now: Instant) -> EventAction {
        if data.trim() == samewise_wire::sse::DONE {
            self.obs.done = true;
            return EventAction::Forward;
        }
        let Ok(chunk) = serde_json::from_str::<Chunk>(data) else {
            // Not a chunk we understand: pass it on (the client decides) and count it.
            self.obs.invalid_events += 1;
            return EventAction::Forward;
        };
        if chunk.error.is_some() {
            self.obs.upstream_error = true;
        }
        if let Some(u) = &chunk.usage {
            self.obs.usage = Some((u.prompt_tokens, u.completion_tokens));
        }
        let mut action = EventAction::Forward;
        for choice in chunk.choices.iter() {
            let text = match self.route {
                Route::Chat => choice.delta.as_ref().and_then(|d| d.content.as_deref()),
                Route::Completions => choice.text.as_deref(),
            };
            let mut produced = false;
            if let Some(t) = text.filter(|t| !t.is_empty()) {
                produced = true;
                self.obs.output_chars += t.chars().count();
                if choice.index == 0 {
                    self.keep_text(t);
                }
                if choice.index == 0 && self.degen.push(t) {
                    self.obs.degenerate = true;
                    action = EventAction::Cut;
                }
            }
            if let Some(calls) = choice.delta.as_ref().and_then(|d| d.tool_calls.as_ref()) {
                for call in calls {
                    produced = true;
                    if let Some(args) = call.pointer("/function/arguments").and_then(|a| a.as_str())
                    {
                        self.obs.output_chars += args.chars().count();
                    }
                    if choice.index == 0 {
                        self.assembler.push(call);
                    }
                }
            }
            if produced {
                self.obs.deltas += 1;
                self.obs.first_token_at.get_or_insert(now);
                self.obs.last_token_at = Some(now);
            }
            if choice.index == 0
                && let Some(reason) = &choice.finish_reason
            {
                self.obs.finish_reason = Some(reason.as_ref().to_owned());
            }
        }
        if action == EventAction::Forward
            && self.strip_usage_chunk
            && chunk.choices.is_empty()
            && chunk.usage.is_some()
        {
            return EventAction::Drop;
        }
        action
    }

    /// Reads a whole non-streamed body. Returns false when it is not valid JSON.
    pub fn on_body(&mut self, body: &[u8], now: Instant) -> bool {
        let Ok(resp) = serde_json::from_slice::<FullResponse>(body) else {
            return false;
        };
        if resp.error.is_some() {
            self.obs.upstream_error = true;
        }
        if let Some(u) = &resp.usage {
            self.obs.usage = Some((u.prompt_tokens, u.completion_tokens));
        }
        self.obs.first_token_at = Some(now);
        self.obs.last_token_at = Some(now);
        for choice in resp.choices.iter() {
            let text = match self.route {
                Route::Chat => choice.message.as_ref().and_then(|m| m.content.as_deref()),
                Route::Completions => choice.text.as_deref(),
            };
            if let Some(t) = text {
                self.obs.output_chars += t.chars().count();
            }
            if choice.index != 0 {
                continue;
            }
            if let Some(t) = text {
                self.keep_text(t);
            }
            self.obs.finish_reason.clone_from(&choice.finish_reason);
            // Units: the logprob tokens when present, else the words of the text.
            let tokens = logprob_tokens(choice.logprobs.as_ref());
            let units: Box<dyn Iterator<Item = &str>> = if tokens.is_empty() {
                Box::new(crate::degen::text_units(text.unwrap_or_default()))
            } else {
                Box::new(tokens.into_iter())
            };
            for unit in units {
                if self.degen.push(unit) {
                    self.obs.degenerate = true;
                    break;
                }
            }
            if let Some(calls) = choice.message.as_ref().and_then(|m| m.tool_calls.as_ref()) {
                for call in calls {
                    if let Some(args) = call.pointer("/function/arguments").and_then(|a| a.as_str())
                    {
                        self.obs.output_chars += args.chars().count();
                    }
                    self.assembler.push_whole(call);
                }
            }
        }
        true
    }

    /// Ends the reading: runs the tool-call checks and returns the observation.
    pub fn finish(mut self) -> Observation {
        let calls = self.assembler.finish();
        if let Some((text, _)) = self.kept.take() {
            let kept: Vec<serde_json::Value> = calls
                .iter()
                .map(|c| serde_json::json!({"name": c.name, "arguments": c.arguments}))
                .collect();
            self.obs.answer = Some(serde_json::json!({
                "text": text,
                "text_truncated": self.kept_truncated,
                "tool_calls": kept,
                "finish_reason": self.obs.finish_reason,
            }));
        }
        if self.tools.is_some() || !calls.is_empty() {
            let empty = samewise_toolcheck::ToolSet::default();
            let set = self.tools.as_deref().unwrap_or(&empty);
            let report =
                samewise_toolcheck::check_calls(set, &calls, self.obs.finish_reason.as_deref());
            self.obs.tools = ToolCounts {
                calls: report.calls,
                invalid_json: report.invalid_json,
                unknown_name: report.unknown_name,
                schema_mismatch: report.schema_mismatch,
                finish_mismatch: report.finish_mismatch.map(|m| m.as_str().to_owned()),
            };
        }
        self.obs
    }
}

/// The generated tokens of a non-streamed choice's logprobs (chat `content[].token`, or
/// completions `tokens[]`).
fn logprob_tokens(lp: Option<&serde_json::Value>) -> Vec<&str> {
    let Some(lp) = lp else { return Vec::new() };
    if let Some(content) = lp.get("content").and_then(|c| c.as_array()) {
        return content
            .iter()
            .filter_map(|t| t.get("token").and_then(|s| s.as_str()))
            .collect();
    }
    if let Some(tokens) = lp.get("tokens").and_then(|c| c.as_array()) {
        return tokens.iter().filter_map(|s| s.as_str()).collect();
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_choice_is_read_in_order() {
        let read = |data: &str| {
            serde_json::from_str::<super::Chunk<'_>>(data).map(|c| {
                c.choices
                    .iter()
                    .map(|c| (c.index, c.delta.as_ref().and_then(|d| d.content.clone())))
                    .map(|(i, t)| format!("{i}:{}", t.unwrap_or_default()))
                    .collect::<Vec<_>>()
            })
        };
        let three = r#"{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}},{"index":2,"delta":{}}]}"#;
        assert_eq!(
            read(three).ok(),
            Some(vec!["0:a".into(), "1:b".into(), "2:".into()])
        );
        assert_eq!(read(r#"{"choices":[]}"#).ok(), Some(vec![]));
        assert_eq!(read("{}").ok(), Some(vec![]));
        for bad in [
            r#"{"choices":null}"#,
            r#"{"choices":{}}"#,
            r#"{"choices":[1]}"#,
            r#"{"choices":[{},2]}"#,
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
        let chunk: super::Chunk<'_> =
            serde_json::from_str(r#"{"choices":[],"usage":{"prompt_tokens":1}}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(chunk.choices.is_empty());
    }

    #[test]
    fn texts_are_borrowed_unless_escaped() {
        let data = r#"{"choices":[{"index":0,"delta":{"content":"plain"},"text":"a\nb","finish_reason":null}]}"#;
        let chunk: super::Chunk<'_> = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}"));
        let Some(choice) = chunk.choices.iter().next() else {
            panic!("no choice read")
        };
        let content = choice.delta.as_ref().and_then(|d| d.content.as_ref());
        assert!(
            matches!(content, Some(std::borrow::Cow::Borrowed("plain"))),
            "{content:?}"
        );
        assert!(
            matches!(&choice.text, Some(std::borrow::Cow::Owned(t)) if t == "a\nb"),
            "{:?}",
            choice.text
        );
        assert!(choice.finish_reason.is_none());
        let body =
            r#"{"choices":[{"index":0,"message":{"content":"whole"},"finish_reason":"stop"}]}"#;
        let full: super::FullResponse<'_> =
            serde_json::from_slice(body.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let content = full
            .choices
            .iter()
            .next()
            .and_then(|c| c.message.as_ref())
            .and_then(|m| m.content.as_ref());
        assert!(
            matches!(content, Some(std::borrow::Cow::Borrowed("whole"))),
            "{content:?}"
        );
    }

    use super::*;

    /// A capturing inspector assembles a stream's answer (text within its bound, tool calls by
    /// index, the finish reason), and a non-capturing one keeps none.
    #[test]
    fn the_answer_is_assembled_only_when_capturing() {
        let events = [
            r#"{"choices":[{"index":0,"delta":{"content":"Héllo "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"wörld, and more"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\"a\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]},"finish_reason":"tool_calls"}]}"#,
        ];
        let run = |inspector: Inspector| {
            let mut i = inspector;
            for e in events {
                i.on_event(e, Instant::now());
            }
            i.finish().answer
        };
        let plain = Inspector::new(Route::Chat, false, None, Default::default());
        assert_eq!(run(plain), None);
        // 12 bytes: "Héllo wörld" is 13, so the cut lands before the 'd' (on a char boundary)
        let capturing =
            Inspector::new(Route::Chat, false, None, Default::default()).keep_answer(12);
        let answer = run(capturing).unwrap_or_default();
        assert_eq!(answer["text"], "Héllo wörl");
        assert_eq!(answer["text_truncated"], true);
        assert_eq!(
            answer["tool_calls"],
            serde_json::json!([{"name": "f", "arguments": "{\"a\":1}"}])
        );
        assert_eq!(answer["finish_reason"], "tool_calls");
    }
}
