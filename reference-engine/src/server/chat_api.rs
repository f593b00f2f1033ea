//! `POST /v1/chat/completions`: messages through the model's chat template, generation with
//! OpenAI's sampling parameters, `logprobs`/`top_logprobs`, `n`, `stop`, SSE streaming with
//! `stream_options.include_usage`, and `tools`: rendered by the template when it supports
//! them, else by the engine's system-prompt convention ([`crate::chat`]); calls found in
//! the output become `tool_calls` with finish reason `tool_calls`. With free tools
//! (`tool_choice` `"auto"`), a streamed answer's content is sent as it comes, up to where it
//! could become a call (a `<tool_call>` tag, or an answer that opens like bare JSON or a code
//! fence, which [`parse_tool_calls`] would read as calls): the rest is held to the end, then the
//! content not yet sent and the calls come in one delta ([`FreeText`]).
//!
//! With `tool_choice` `"required"` or a named function the output is constrained to calls of
//! the declared functions whose arguments validate ([`super::constrained`]); they stream as
//! OpenAI streams them: the name first, then the arguments in pieces (in one delta at the end
//! when the serving profile corrupts tool calls, which needs the whole call). A forced
//! generation cut by `max_tokens` ends with finish reason `length` and the call as it stood.
//! `response_format` (`json_object`, `json_schema`) constrains the content the same way.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use samewise_wire::{
    ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs, ChatMessage, Extra,
    FunctionCall, MessageContent, ToolCall, Usage,
};
use serde_json::{Value, json};

use crate::chat::{PromptEnd, TOOL_CALL_OPEN, parse_tool_calls};
use crate::constrain::{ToolEvent, ToolSplitter};
use crate::engine::GeneratedToken;

use super::constrained::plan;
use super::faults::RequestFaults;
use super::stream::{
    GenRequest, chat_logprob, check_prompt, check_stream_options, refuse_unsupported, sse_response,
};
use super::text::{ChoiceEvent, TextStream};
use super::{ApiError, ServerState, extra_bool, json_response, now_secs, parse_body};

pub(crate) async fn handle(
    State(state): State<ServerState>,
    Extension(faults): Extension<RequestFaults>,
    body: Bytes,
) -> Response {
    match run(&state, faults, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// How a chat request's prompt ends, from vLLM's `add_generation_prompt` (default true) and
/// `continue_final_message` (default false; alone it means the first false), which cannot
/// both be true.
pub(crate) fn prompt_end(
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
) -> Result<PromptEnd, ApiError> {
    match (add_generation_prompt, continue_final_message) {
        (Some(true), Some(true)) => Err(ApiError::bad_request(
            "continue_final_message and add_generation_prompt cannot both be true: continue the \
             last message, or open a new assistant turn",
            Some("continue_final_message"),
        )),
        (_, Some(true)) => Ok(PromptEnd::ContinueLast),
        (Some(false), _) => Ok(PromptEnd::Closed),
        _ => Ok(PromptEnd::NewTurn),
    }
}

/// vLLM's `chat_template_kwargs` (the template's own variables, such as a Qwen3 template's
/// `enable_thinking`), as a chat request or `/tokenize` sends it: an object, or absent.
pub(crate) fn template_kwargs(
    sent: Option<&Value>,
) -> Result<Option<&serde_json::Map<String, Value>>, ApiError> {
    match sent {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(ApiError::bad_request(
            "chat_template_kwargs must be an object",
            Some("chat_template_kwargs"),
        )),
    }
}

/// Renders a chat request's messages (and tools) to prompt ids; shared with `/v1/score`
/// and `/tokenize`.
pub(crate) fn render_prompt(
    state: &ServerState,
    messages: &[Value],
    tools: Option<&[Value]>,
    end: PromptEnd,
    kwargs: Option<&serde_json::Map<String, Value>>,
) -> Result<Vec<u32>, ApiError> {
    let template = state.template().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template; use /v1/completions",
            Some("messages"),
        )
    })?;
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let messages = state.inner.faults.template_messages(messages);
    let text = template.render_to(&messages, tools, end, kwargs)?;
    Ok(state.tokenizer().encode(&text, false)?)
}

async fn run(
    state: &ServerState,
    faults: RequestFaults,
    body: &[u8],
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_body(body)?;
    state.check_model(&req.model)?;
    refuse_unsupported(&req.extra)?;
    check_stream_options(req.stream, req.stream_options.is_some())?;
    faults.check_logprobs(req.logprobs.unwrap_or(false))?;
    let messages = req
        .messages
        .iter()
        .map(|m| {
            serde_json::to_value(m)
                .map_err(|e| ApiError::bad_request(format!("bad message: {e}"), Some("messages")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let all_tools: Vec<Value> = req
        .tools
        .iter()
        .flatten()
        .map(|t| {
            serde_json::to_value(t)
                .map_err(|e| ApiError::bad_request(format!("bad tool: {e}"), Some("tools")))
        })
        .collect::<Result<_, _>>()?;
    let plan = plan(state, &all_tools, req.tool_choice.as_ref(), &req.extra)?;
    let tools: Option<Vec<Value>> = (!all_tools.is_empty() && !plan.tools_off).then_some(all_tools);
    let kwargs = template_kwargs(req.extra.get("chat_template_kwargs"))?;
    let end = prompt_end(
        extra_bool(&req.extra, "add_generation_prompt")?,
        extra_bool(&req.extra, "continue_final_message")?,
    )?;
    let mut prompt = render_prompt(state, &messages, tools.as_deref(), end, kwargs)?;
    state.inner.faults.truncate(&mut prompt);

    let want_logprobs = req.logprobs.unwrap_or(false);
    let (gen_req, max_tokens) = sampling(state, &faults, &req, prompt.len())?;
    check_prompt(state, &prompt, max_tokens)?;
    gen_req.check_max_tokens(max_tokens)?;

    let mut streams = Vec::new();
    for j in 0..gen_req.n {
        let repeat = faults.repeat_from(j, max_tokens);
        streams.push((
            j,
            TextStream::start(
                state,
                prompt.clone(),
                gen_req.params(state, max_tokens, j),
                plan.constraint.clone(),
                gen_req.stops.clone(),
                repeat,
            )?,
        ));
    }
    let id = state.next_id("chatcmpl");
    let created = now_secs();
    let prompt_tokens = prompt.len() as u64;
    let ctx = Ctx {
        state: state.clone(),
        id,
        created,
        want_logprobs,
        tools: tools.unwrap_or_default().into(),
        forced: plan.forced_tools,
        parallel: plan.parallel,
        faults,
    };

    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        return Ok(stream(ctx, streams, prompt_tokens, include_usage));
    }

    Ok(json_response(&whole(&ctx, streams, prompt_tokens).await?))
}

/// The request's sampling (`n`, temperature, stops, top logprobs within the faults' cap) and
/// its `max_tokens` (the context left after a `prompt_len`-token prompt when not given).
fn sampling(
    state: &ServerState,
    faults: &RequestFaults,
    req: &ChatCompletionRequest,
    prompt_len: usize,
) -> Result<(GenRequest, usize), ApiError> {
    let top = req.top_logprobs.unwrap_or(0) as usize;
    if top > 0 && !req.logprobs.unwrap_or(false) {
        return Err(ApiError::bad_request(
            "top_logprobs needs logprobs: true",
            Some("top_logprobs"),
        ));
    }
    let top = faults.cap_top(top);
    let stops = req
        .stop
        .as_ref()
        .map(samewise_wire::Stop::to_vec)
        .unwrap_or_default();
    let gen_req = GenRequest::new(req.temperature, req.top_p, req.seed, req.n, stops, top)
        .map_err(|e| rename_param(e, "logprobs", "top_logprobs"))?
        .with_adjustments(&req.extra, state.inner.vocab_size)?;
    let gen_req = faults.sampling(gen_req);
    let max_tokens = match req.max_completion_tokens.or(req.max_tokens) {
        Some(0) => {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1",
                Some("max_tokens"),
            ));
        }
        Some(m) => m as usize,
        None => state.inner.n_ctx.saturating_sub(prompt_len).max(1),
    };
    Ok((gen_req, max_tokens))
}

/// The non-streamed answer: every choice, once all are generated, and the usage.
async fn whole(
    ctx: &Ctx,
    streams: Vec<(u32, TextStream)>,
    prompt_tokens: u64,
) -> Result<ChatCompletionResponse, ApiError> {
    let results = futures_util::future::join_all(
        streams
            .into_iter()
            .map(|(i, s)| async move { (i, s.collect().await) }),
    )
    .await;
    let mut choices = Vec::new();
    let mut completion_tokens = 0u64;
    for (index, r) in results {
        let c = r?;
        completion_tokens += c.completion_tokens as u64;
        let (message, reason) = ctx.message(index, c.text, c.reason);
        choices.push(ChatChoice {
            index,
            message,
            finish_reason: Some(reason.to_owned()),
            logprobs: ctx.logprobs(&c.tokens),
            extra: Extra::new(),
        });
    }
    Ok(ChatCompletionResponse {
        id: ctx.id.clone(),
        object: "chat.completion".into(),
        created: ctx.created,
        model: ctx.state.model_name().to_owned(),
        choices,
        usage: Some(Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            extra: Extra::new(),
        }),
        extra: Extra::new(),
    })
}

fn rename_param(mut e: ApiError, from: &str, to: &str) -> ApiError {
    if e.body.error.param.as_deref() == Some(from) {
        e.body.error.param = Some(to.to_owned());
    }
    e
}

/// What every choice of one response shares.
#[derive(Clone)]
struct Ctx {
    state: ServerState,
    id: String,
    created: u64,
    want_logprobs: bool,
    /// The request's tool definitions (empty: tools off).
    tools: std::sync::Arc<[Value]>,
    /// The output is forced tool calls (constrained), read with [`ToolSplitter`].
    forced: bool,
    /// `parallel_tool_calls`: false keeps only the first call parsed from free text.
    parallel: bool,
    /// For tool-call corruption.
    faults: RequestFaults,
}

impl Ctx {
    /// The assistant message for a finished choice; tool calls parsed when tools are on.
    fn message(
        &self,
        index: u32,
        text: String,
        reason: &'static str,
    ) -> (ChatMessage, &'static str) {
        if self.forced {
            let mut split = ToolSplitter::default();
            split.push(&text);
            if split.calls().is_empty() {
                return (ChatMessage::text("assistant", text), reason);
            }
            let mut calls: Vec<ToolCall> = split
                .calls()
                .iter()
                .enumerate()
                .map(|(i, (name, args))| self.tool_call(index, i, name.clone(), args.clone()))
                .collect();
            self.faults
                .corrupt_tool_calls(index, &mut calls, &self.tools);
            let msg = ChatMessage {
                role: "assistant".into(),
                content: None,
                tool_calls: Some(calls),
                ..ChatMessage::default()
            };
            return (
                msg,
                if reason == "length" {
                    "length"
                } else {
                    "tool_calls"
                },
            );
        }
        if !self.tools.is_empty() {
            let parsed = parse_tool_calls(&text);
            if !parsed.tool_calls.is_empty() {
                let keep = if self.parallel { usize::MAX } else { 1 };
                let mut calls: Vec<ToolCall> = parsed
                    .tool_calls
                    .into_iter()
                    .take(keep)
                    .enumerate()
                    .map(|(i, c)| self.tool_call(index, i, c.name, c.arguments))
                    .collect();
                self.faults
                    .corrupt_tool_calls(index, &mut calls, &self.tools);
                let msg = ChatMessage {
                    role: "assistant".into(),
                    content: parsed.content.map(MessageContent::Text),
                    tool_calls: Some(calls),
                    ..ChatMessage::default()
                };
                return (msg, "tool_calls");
            }
        }
        (ChatMessage::text("assistant", text), reason)
    }

    fn tool_call(&self, index: u32, i: usize, name: String, arguments: String) -> ToolCall {
        ToolCall {
            id: self.call_id(index, i),
            kind: "function".into(),
            function: FunctionCall { name, arguments },
            extra: Extra::new(),
        }
    }

    fn call_id(&self, index: u32, i: usize) -> String {
        format!("call_{}_{index}_{i}", self.id)
    }

    /// Whether forced calls stream in pieces (not when the profile corrupts whole calls).
    fn streams_calls(&self) -> bool {
        self.forced && !self.faults.corrupts_tool_calls()
    }

    /// The chunks for one piece of a forced call stream: names first, arguments in pieces.
    /// The piece's tokens ride on the first chunk (or wait in `pending` for the next one).
    fn call_chunks(
        &self,
        index: u32,
        events: Vec<ToolEvent>,
        pending: &mut Vec<GeneratedToken>,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        for ev in events {
            let delta = match ev {
                ToolEvent::Name(i, name) => {
                    json!({"tool_calls": [{"index": i, "id": self.call_id(index, i),
                    "type": "function", "function": {"name": name, "arguments": ""}}]})
                }
                ToolEvent::Args(i, args) => {
                    json!({"tool_calls": [{"index": i, "function": {"arguments": args}}]})
                }
            };
            let tokens = std::mem::take(pending);
            out.push(self.chunk(index, delta, self.logprobs(&tokens), None));
        }
        out
    }

    fn logprobs(&self, tokens: &[GeneratedToken]) -> Option<ChatLogprobs> {
        self.want_logprobs.then(|| ChatLogprobs {
            content: Some(
                tokens
                    .iter()
                    .map(|t| chat_logprob(&self.state, t))
                    .collect(),
            ),
            extra: Extra::new(),
        })
    }

    fn chunk(
        &self,
        index: u32,
        delta: Value,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&str>,
    ) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
               "model": self.state.model_name(),
               "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
    }
}

/// A choice's text under free tools, streamed: content is released as it comes while the
/// text cannot (yet) be a tool call. Held back: leading and trailing whitespace (a message with
/// calls has its content trimmed), an ending that could begin `<tool_call>`, everything from a
/// `<tool_call>` on, and the whole answer when it opens with `{`, `[` or a code fence (a bare
/// JSON call). So what was sent always begins the final message's content, or its trimmed
/// start when there are calls, and the end sends the rest.
#[derive(Default)]
struct FreeText {
    /// Everything generated so far.
    text: String,
    /// Bytes of `text` sent as content.
    sent: usize,
    /// Nothing more is sent before the end.
    holding: bool,
    /// Tokens whose logprobs have not been sent.
    pending: Vec<GeneratedToken>,
}

impl FreeText {
    /// Appends a piece; returns the content to send now, if any.
    fn push(&mut self, piece: &str) -> Option<String> {
        self.text.push_str(piece);
        if self.holding {
            return None;
        }
        if self.sent == 0 {
            let lead = self.text.trim_start();
            if lead.starts_with(['{', '[']) || lead.starts_with("```") {
                self.holding = true;
                return None;
            }
            if lead.is_empty() || "``".starts_with(lead) {
                return None; // undecided yet
            }
        }
        let rest = &self.text[self.sent..];
        let end = match rest.find(TOOL_CALL_OPEN) {
            Some(at) => {
                self.holding = true;
                at
            }
            None => {
                // the longest ending that could begin the tag (ASCII, so a char boundary)
                let partial = (1..TOOL_CALL_OPEN.len())
                    .rev()
                    .find(|&k| rest.ends_with(&TOOL_CALL_OPEN[..k]))
                    .unwrap_or(0);
                rest.len() - partial
            }
        };
        let end = rest[..end].trim_end().len();
        if end == 0 {
            return None;
        }
        let out = rest[..end].to_owned();
        self.sent += end;
        Some(out)
    }
}

fn stream(
    ctx: Ctx,
    streams: Vec<(u32, TextStream)>,
    prompt_tokens: u64,
    include_usage: bool,
) -> Response {
    let head: Vec<Value> = streams
        .iter()
        .map(|(i, _)| ctx.chunk(*i, json!({"role": "assistant", "content": ""}), None, None))
        .collect();
    let render_ctx = ctx.clone();
    // with free tools, each choice's text: sent while it cannot be a call, then held (forced
    // calls come here only when the profile corrupts them, which needs them whole: held)
    let mut held: Vec<FreeText> = streams
        .iter()
        .map(|_| FreeText {
            holding: ctx.forced,
            ..FreeText::default()
        })
        .collect();
    // forced calls stream in pieces: per choice, the reader and tokens not yet sent
    let mut split: Vec<(ToolSplitter, Vec<GeneratedToken>)> =
        streams.iter().map(|_| Default::default()).collect();
    let render = Box::new(move |index: u32, ev: ChoiceEvent, total: &mut u64| {
        let c = &render_ctx;
        let slot = index as usize;
        match ev {
            ChoiceEvent::Piece(p) if c.streams_calls() => {
                let Some((reader, pending)) = split.get_mut(slot) else {
                    return Vec::new();
                };
                pending.extend(p.tokens);
                let events = reader.push(&p.text);
                c.call_chunks(index, events, pending)
            }
            ChoiceEvent::Piece(p) if !c.tools.is_empty() || c.forced => {
                let Some(free) = held.get_mut(slot) else {
                    return Vec::new();
                };
                free.pending.extend(p.tokens);
                match free.push(&p.text) {
                    Some(text) => {
                        let tokens = std::mem::take(&mut free.pending);
                        vec![c.chunk(index, json!({"content": text}), c.logprobs(&tokens), None)]
                    }
                    None => Vec::new(),
                }
            }
            ChoiceEvent::Piece(p) => {
                if p.text.is_empty() && p.tokens.is_empty() {
                    return Vec::new();
                }
                vec![c.chunk(
                    index,
                    json!({"content": p.text}),
                    c.logprobs(&p.tokens),
                    None,
                )]
            }
            ChoiceEvent::End {
                reason,
                completion_tokens,
            } => {
                *total += completion_tokens as u64;
                let mut out = Vec::new();
                let mut reason = reason;
                if c.streams_calls() {
                    let (reader, pending) =
                        split.get_mut(slot).map(std::mem::take).unwrap_or_default();
                    // the tokens after the last argument piece carry only their logprobs
                    if !pending.is_empty() && c.want_logprobs {
                        out.push(c.chunk(index, json!({}), c.logprobs(&pending), None));
                    }
                    if reader.calls().is_empty() {
                        // cut before a name was complete: the text as it stood
                        out.push(c.chunk(index, json!({"content": reader.text()}), None, None));
                    } else {
                        reason = if reason == "length" {
                            "length"
                        } else {
                            "tool_calls"
                        };
                    }
                } else if !c.tools.is_empty() || c.forced {
                    let free = held.get_mut(slot).map(std::mem::take).unwrap_or_default();
                    let sent = free.text[..free.sent].to_owned();
                    let (msg, r) = c.message(index, free.text, reason);
                    reason = r;
                    let mut delta = json!({});
                    if let Some(MessageContent::Text(t)) = &msg.content {
                        // what was sent begins the content (trimmed at the start when
                        // there are calls; see `FreeText::push`)
                        let rest = t
                            .strip_prefix(sent.as_str())
                            .or_else(|| t.strip_prefix(sent.trim_start()))
                            .unwrap_or(t);
                        if !rest.is_empty() {
                            delta["content"] = json!(rest);
                        }
                    }
                    if let Some(calls) = &msg.tool_calls {
                        delta["tool_calls"] = calls
                            .iter()
                            .enumerate()
                            .map(|(i, tc)| json!({"index": i, "id": tc.id, "type": "function",
                                "function": {"name": tc.function.name, "arguments": tc.function.arguments}}))
                            .collect();
                    }
                    let tokens = free.pending;
                    if delta.as_object().is_some_and(|d| !d.is_empty())
                        || (c.want_logprobs && !tokens.is_empty())
                    {
                        out.push(c.chunk(index, delta, c.logprobs(&tokens), None));
                    }
                }
                out.push(c.chunk(index, json!({}), None, Some(reason)));
                out
            }
            ChoiceEvent::Failed(_) => Vec::new(),
        }
    });
    let tail = Box::new(move |completion_tokens: u64| {
        include_usage.then(|| {
            json!({"id": ctx.id, "object": "chat.completion.chunk", "created": ctx.created,
                   "model": ctx.state.model_name(), "choices": [],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}})
        })
    });
    sse_response(head, streams, render, tail)
}

#[cfg(test)]
mod tests {
    use super::FreeText;
    use crate::chat::parse_tool_calls;

    /// Streams `pieces` through a [`FreeText`]: what was sent before the end, and whether it
    /// begins the final content as the end's rest assumes.
    fn sent(pieces: &[&str]) -> (Vec<String>, bool) {
        let mut free = FreeText::default();
        let out: Vec<String> = pieces.iter().filter_map(|p| free.push(p)).collect();
        assert_eq!(out.concat(), free.text[..free.sent]);
        let parsed = parse_tool_calls(&free.text);
        let content = parsed.content.unwrap_or_default();
        let so_far = &free.text[..free.sent];
        let begins = content.starts_with(so_far)
            || (!parsed.tool_calls.is_empty() && content.starts_with(so_far.trim_start()));
        (out, begins)
    }

    #[test]
    fn free_tool_text_streams_until_it_could_be_a_call() {
        let call = r#"{"name": "f", "arguments": {"a": 1}}</tool_call>"#;
        let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
            // plain text streams, whitespace waits for what follows it
            (
                vec!["Hello", " there", "!", " "],
                vec!["Hello", " there", "!"],
            ),
            // text, then a call split across pieces: the text up to it, trimmed
            (
                vec!["Let me check.", " <", "tool", "_call>", call],
                vec!["Let me check."],
            ),
            // a tag-like start that is not the tag is released once it cannot be
            (vec!["a <to", "ol> b"], vec!["a", " <tool> b"]),
            // leading whitespace waits; a bare JSON call or a fence holds everything
            (vec!["\n ", "Hi"], vec!["\n Hi"]),
            (vec![" ", r#"{"name": "f", "arguments": {}}"#], vec![]),
            (vec!["[", r#"{"name": "f", "arguments": {}}]"#], vec![]),
            (vec!["`", "`", "`json\n{}\n```"], vec![]),
            // one backtick is inline code, not a fence
            (vec!["`", "x` is a variable"], vec!["`x` is a variable"]),
            // the tag first: nothing sent
            (vec!["<tool_call>", call], vec![]),
        ];
        for (pieces, want) in cases {
            let (got, begins) = sent(&pieces);
            assert_eq!(got, want, "{pieces:?}");
            assert!(
                begins,
                "{pieces:?}: what was sent does not begin the content"
            );
        }
    }
}
