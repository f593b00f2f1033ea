//! Chat templates and tool calls: renders a model's Jinja chat template with `minijinja` the
//! way Hugging Face's `apply_chat_template` does, and parses tool calls out of generated text.
//!
//! HF compatibility: `trim_blocks` and `lstrip_blocks` on, the template's one trailing
//! newline dropped, Python string/dict methods (`strip`, `split`, `startswith`, `items`, …)
//! through minijinja-contrib's pycompat, `raise_exception(msg)`, `strftime_now(fmt)`, and a
//! `tojson` that writes what Python's `json.dumps(x, ensure_ascii=False)` writes (no HTML
//! escaping, `", "`/`": "` separators, key order kept, `indent=` honoured). The context has
//! `messages`, `tools` (when given), `add_generation_prompt`, `bos_token`, `eos_token` and
//! any extra keyword arguments.
//!
//! Messages are OpenAI-shaped JSON. As vLLM does, text content parts are joined into one
//! string and a tool call's `arguments` JSON string is parsed into an object before
//! rendering, so templates that expect `arguments` as a mapping work. A `developer` message is
//! rendered as a `system` one unless the template names that role.
//!
//! **Tools with a template that has no tools support** (it never mentions `tools`, like
//! SmolLM2's): the engine's documented convention is used instead. A system message is
//! prepended (or the first system message extended) with [`TOOLS_PREAMBLE`] followed by one
//! JSON line per tool, and `tool` messages keep their role with their content wrapped in
//! `<tool_response>…</tool_response>`. Earlier assistant tool calls are rendered as
//! `<tool_call>{"name": …, "arguments": …}</tool_call>` lines of the content with such a
//! template whether or not the request has tools (it could not render them otherwise).
//! [`parse_tool_calls`] reads calls back from `<tool_call>` blocks or from a bare JSON
//! object (or array of objects) with `name` and `arguments` (or `parameters`).
//!
//! [`TOOLS_PREAMBLE`]: crate::chat::TOOLS_PREAMBLE
//! [`parse_tool_calls`]: crate::chat::parse_tool_calls

use minijinja::value::{Kwargs, Value as JValue, ValueKind};
use minijinja::{Environment, Error as JError, ErrorKind};
use serde_json::{Map, Value};

use crate::error::{EngineError, Result};

/// Text put before the tool list in the system prompt when the template has no tools support.
pub const TOOLS_PREAMBLE: &str = "You can call the following tools. To call a tool, answer with one line per call, \
exactly in the form <tool_call>{\"name\": \"<tool name>\", \"arguments\": {<arguments as a JSON object>}}</tool_call> \
and nothing else. Tools (JSON schema, one per line):";

/// A compiled chat template plus the special-token strings it may use.
pub struct ChatTemplate {
    /// The environment holding the compiled template under the name "chat".
    env: Environment<'static>,
    /// Whether the template itself renders `tools` (else the system-prompt convention is used).
    supports_tools: bool,
    /// Whether the template names the `developer` role (else it is rendered as `system`).
    knows_developer: bool,
    /// `bos_token` in the template context.
    bos_token: String,
    /// `eos_token` in the template context.
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("supports_tools", &self.supports_tools)
            .finish_non_exhaustive()
    }
}

/// One tool call parsed from generated text.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedToolCall {
    /// The function name.
    pub name: String,
    /// The arguments, serialized as a JSON string (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// What generated text says: free text and/or tool calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedOutput {
    /// Text outside the tool calls (None when there is none).
    pub content: Option<String>,
    /// The calls, in order.
    pub tool_calls: Vec<ParsedToolCall>,
}

impl ChatTemplate {
    /// Compiles a template source. `bos_token`/`eos_token` are the strings the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| {
                EngineError::ChatTemplate(format!("cannot compile the template: {e:#}"))
            })?;
        Ok(Self {
            env,
            supports_tools: source.contains("tools"),
            knows_developer: source.contains("developer"),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Whether the template renders `tools` itself.
    pub fn supports_tools(&self) -> bool {
        self.supports_tools
    }

    /// Renders messages (OpenAI-shaped JSON objects) to the prompt text.
    ///
    /// `tools` are OpenAI tool definitions (`{"type": "function", "function": {...}}`);
    /// `extra` holds additional template variables (e.g. `chat_template_kwargs`).
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        extra: Option<&Map<String, Value>>,
    ) -> Result<String> {
        let mut messages = messages
            .iter()
            .map(normalize_message)
            .collect::<Result<Vec<_>>>()?;
        if !self.knows_developer {
            developer_as_system(&mut messages);
        }
        let tools = tools.filter(|t| !t.is_empty());
        let mut ctx = Map::new();
        if let Some(extra) = extra {
            ctx.extend(extra.clone());
        }
        if !self.supports_tools {
            // calls in the history are rendered as text even when this request has no tools
            calls_as_text(&mut messages);
        }
        match tools {
            Some(tools) if !self.supports_tools => apply_tool_convention(&mut messages, tools),
            Some(tools) => {
                ctx.insert("tools".into(), Value::Array(tools.to_vec()));
            }
            None => {}
        }
        ctx.insert("messages".into(), Value::Array(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Value::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Value::String(self.eos_token.clone()));
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| EngineError::ChatTemplate(e.to_string()))?;
        tmpl.render(JValue::from_serialize(&ctx))
            .map_err(|e| EngineError::ChatTemplate(describe(&e)))
    }
}

/// How a rendered chat ends ([`ChatTemplate::render_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptEnd {
    /// With the template's generation prompt: a new assistant turn opened
    /// (`add_generation_prompt`, what a chat completion asks by default).
    NewTurn,
    /// As the last message ends.
    Closed,
    /// Inside the last message: the rendered text is cut after that message's content (its
    /// end-of-turn dropped), so a generation continues it — an assistant "prefill", vLLM's and
    /// transformers' `continue_final_message`, cut as transformers cuts it.
    ContinueLast,
}

impl ChatTemplate {
    /// [`ChatTemplate::render`], ending as `end` says.
    pub fn render_to(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        end: PromptEnd,
        extra: Option<&Map<String, Value>>,
    ) -> Result<String> {
        let text = self.render(messages, tools, end == PromptEnd::NewTurn, extra)?;
        if end != PromptEnd::ContinueLast {
            return Ok(text);
        }
        let last = messages.last().map(normalize_message).transpose()?;
        let content = last
            .as_ref()
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        cut_after(&text, content).map(str::to_owned)
    }
}

/// `rendered` up to the end of its last occurrence of the final message's `content`: its
/// trailing whitespace kept where the template kept it, else the text up to the stripped
/// content (transformers' `continue_final_message`).
fn cut_after<'a>(rendered: &'a str, content: &str) -> Result<&'a str> {
    let stripped = content.trim();
    if stripped.is_empty() {
        return Err(EngineError::InvalidRequest(
            "continue_final_message needs a final message with text to continue".into(),
        ));
    }
    let Some(at) = rendered.rfind(stripped) else {
        return Err(EngineError::InvalidRequest(
            "continue_final_message: the final message's text does not appear in the chat as \
             the chat template renders it, so it cannot be continued"
                .into(),
        ));
    };
    let kept = content.trim_start();
    let end = if rendered[at..].starts_with(kept) {
        at + kept.len()
    } else {
        at + stripped.len()
    };
    Ok(&rendered[..end])
}

/// What opens a tool call in generated text ([`parse_tool_calls`]).
pub const TOOL_CALL_OPEN: &str = "<tool_call>";

/// Parses tool calls from generated text (see the module doc for the accepted forms).
pub fn parse_tool_calls(text: &str) -> ParsedOutput {
    const OPEN: &str = TOOL_CALL_OPEN;
    const CLOSE: &str = "</tool_call>";
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        let (body, next) = match after.find(CLOSE) {
            Some(end) => (&after[..end], &after[end + CLOSE.len()..]),
            None => (after, ""),
        };
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| call_from_json(&v))
        {
            Some(call) => calls.push(call),
            // not a call after all: keep the text as it was
            None => content.push_str(&rest[start..rest.len() - next.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    if calls.is_empty() {
        let trimmed = strip_fence(text.trim());
        if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
            let bare: Option<Vec<ParsedToolCall>> = match &v {
                Value::Array(items) if !items.is_empty() => {
                    items.iter().map(call_from_json).collect()
                }
                Value::Object(_) => call_from_json(&v).map(|c| vec![c]),
                _ => None,
            };
            if let Some(bare) = bare {
                return ParsedOutput {
                    content: None,
                    tool_calls: bare,
                };
            }
        }
    }
    let content = content.trim();
    ParsedOutput {
        content: if content.is_empty() && !calls.is_empty() {
            None
        } else if calls.is_empty() {
            Some(text.to_owned())
        } else {
            Some(content.to_owned())
        },
        tool_calls: calls,
    }
}

fn call_from_json(v: &Value) -> Option<ParsedToolCall> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?.to_owned();
    let args = obj.get("arguments").or_else(|| obj.get("parameters"))?;
    let arguments = match args {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some(ParsedToolCall { name, arguments })
}

fn strip_fence(s: &str) -> &str {
    let Some(inner) = s.strip_prefix("```") else {
        return s;
    };
    let inner = inner.strip_prefix("json").unwrap_or(inner);
    inner.strip_suffix("```").unwrap_or(inner).trim()
}

/// OpenAI's `developer` role is its newer name for instructions (`system`); clients such as
/// Codex CLI send it. A template that never names it would render it as an unknown role (next
/// to its default system prompt) or refuse it, so it is rendered as `system`, as llama.cpp's
/// server does.
fn developer_as_system(messages: &mut [Value]) {
    for m in messages {
        if m.get("role").and_then(Value::as_str) == Some("developer") {
            m["role"] = Value::String("system".into());
        }
    }
}

/// Joins text parts, parses tool-call arguments; rejects what is not a message object.
fn normalize_message(m: &Value) -> Result<Value> {
    let Some(obj) = m.as_object() else {
        return Err(EngineError::InvalidRequest(
            "each message must be a JSON object".into(),
        ));
    };
    if !obj.get("role").is_some_and(Value::is_string) {
        return Err(EngineError::InvalidRequest(
            "each message needs a string \"role\"".into(),
        ));
    }
    let mut out = obj.clone();
    if let Some(Value::Array(parts)) = obj.get("content") {
        let mut texts = Vec::new();
        for part in parts {
            match (
                part.get("type").and_then(Value::as_str),
                part.get("text").and_then(Value::as_str),
            ) {
                (Some("text"), Some(t)) => texts.push(t),
                (kind, _) => {
                    return Err(EngineError::InvalidRequest(format!(
                        "content part of type {} is not supported (text only)",
                        kind.unwrap_or("<missing>")
                    )));
                }
            }
        }
        out.insert("content".into(), Value::String(texts.join("\n")));
    }
    if let Some(Value::Array(calls)) = obj.get("tool_calls") {
        let calls = calls
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(f) = c.get_mut("function").and_then(Value::as_object_mut)
                    && let Some(Value::String(args)) = f.get("arguments")
                    && let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(args)
                {
                    f.insert("arguments".into(), parsed);
                }
                c
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(Value::Object(out))
}

/// Assistant `tool_calls` become `<tool_call>{"name": …, "arguments": …}</tool_call>` lines
/// of the content (for templates that cannot render them).
fn calls_as_text(messages: &mut [Value]) {
    for m in messages.iter_mut() {
        let Some(obj) = m.as_object_mut() else {
            continue;
        };
        if obj.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let Some(Value::Array(calls)) = obj.remove("tool_calls") else {
            continue;
        };
        let mut text = obj
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        for c in &calls {
            let f = c.get("function").unwrap_or(c);
            let call = serde_json::json!({
                "name": f.get("name").cloned().unwrap_or(Value::Null),
                "arguments": f.get("arguments").cloned().unwrap_or(Value::Null),
            });
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!(
                "<tool_call>{}</tool_call>",
                python_json(&call, None)
            ));
        }
        obj.insert("content".into(), Value::String(text));
    }
}

/// The system-prompt convention for templates without tools support.
fn apply_tool_convention(messages: &mut Vec<Value>, tools: &[Value]) {
    let mut preamble = String::from(TOOLS_PREAMBLE);
    for tool in tools {
        preamble.push('\n');
        preamble.push_str(&python_json(tool.get("function").unwrap_or(tool), None));
    }
    for m in messages.iter_mut() {
        let Some(obj) = m.as_object_mut() else {
            continue;
        };
        if obj.get("role").and_then(Value::as_str) == Some("tool") {
            let body = match obj.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            obj.insert(
                "content".into(),
                Value::String(format!("<tool_response>\n{body}\n</tool_response>")),
            );
        }
    }
    match messages.first_mut().and_then(Value::as_object_mut) {
        Some(first) if first.get("role").and_then(Value::as_str) == Some("system") => {
            let existing = first
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let joined = if existing.is_empty() {
                preamble
            } else {
                format!("{existing}\n\n{preamble}")
            };
            first.insert("content".into(), Value::String(joined));
        }
        _ => messages.insert(
            0,
            serde_json::json!({"role": "system", "content": preamble}),
        ),
    }
}

fn raise_exception(msg: String) -> std::result::Result<JValue, JError> {
    Err(JError::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the current UTC time; supports %Y %m %d %e %b %B %H %M %S %%.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let (y, m, d) = civil_from_days(days);
    let tod = secs % 86_400;
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m as usize).saturating_sub(1) % 12];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// HF's `tojson`: Python `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(value: JValue, kwargs: Kwargs) -> std::result::Result<JValue, JError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // accepted for compatibility; output is never ASCII-escaped nor key-sorted
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = to_serde(&value)?;
    Ok(JValue::from_safe_string(python_json(&json, indent)))
}

fn to_serde(v: &JValue) -> std::result::Result<Value, JError> {
    Ok(match v.kind() {
        ValueKind::Undefined | ValueKind::None => Value::Null,
        ValueKind::Bool => Value::Bool(v.is_true()),
        ValueKind::Number => serde_json::to_value(v)
            .map_err(|e| JError::new(ErrorKind::InvalidOperation, e.to_string()))?,
        ValueKind::String => Value::String(v.as_str().unwrap_or_default().to_owned()),
        ValueKind::Seq | ValueKind::Iterable => Value::Array(
            v.try_iter()?
                .map(|x| to_serde(&x))
                .collect::<std::result::Result<_, _>>()?,
        ),
        ValueKind::Map => {
            let mut m = Map::new();
            for k in v.try_iter()? {
                let val = v.get_item(&k)?;
                m.insert(
                    k.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| k.to_string()),
                    to_serde(&val)?,
                );
            }
            Value::Object(m)
        }
        _ => serde_json::to_value(v)
            .map_err(|e| JError::new(ErrorKind::InvalidOperation, e.to_string()))?,
    })
}

/// Serializes as Python's `json.dumps(ensure_ascii=False)` does: `", "` and `": "`
/// separators without indent, `","` + newlines with it.
pub fn python_json(v: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_py(v, indent, 0, &mut out);
    out
}

fn write_py(v: &Value, indent: Option<usize>, level: usize, out: &mut String) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                write_py(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_py(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        Value::Number(n) if n.is_f64() => {
            // Python prints floats with a decimal point (1.0), as serde_json does
            out.push_str(&n.to_string());
        }
        other => out.push_str(&other.to_string()),
    }
}

fn describe(e: &JError) -> String {
    match e.kind() {
        // the template's own raise_exception: its message is the whole story
        ErrorKind::InvalidOperation => e.detail().unwrap_or("template error").to_owned(),
        _ => format!("{e:#}"),
    }
}

/// The tokenizer and chat template (None when the model has none) of the model at `path`:
/// a GGUF file, or a Hugging Face directory.
pub fn load_tokenizer_and_template(
    path: &std::path::Path,
) -> Result<(crate::tokenizer::Tokenizer, Option<ChatTemplate>)> {
    use crate::tokenizer::Tokenizer;
    let (tokenizer, template_src) = if path.is_dir() {
        (Tokenizer::from_hf_dir(path)?, template_from_hf_dir(path)?)
    } else {
        let gguf = crate::gguf::GgufFile::open(path)?;
        (Tokenizer::from_gguf(&gguf)?, template_from_gguf(&gguf))
    };
    let template = match template_src {
        Some(src) => Some(ChatTemplate::new(
            &src,
            tokenizer.bos_token().unwrap_or_default(),
            tokenizer.eos_token().unwrap_or_default(),
        )?),
        None => None,
    };
    Ok((tokenizer, template))
}

/// Finds a model's chat template source: GGUF `tokenizer.chat_template`.
pub fn template_from_gguf(gguf: &crate::gguf::GgufFile) -> Option<String> {
    gguf.get_str("tokenizer.chat_template").map(str::to_owned)
}

/// Finds a HF directory's chat template: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of `{name, template}` where "default" is used).
pub fn template_from_hf_dir(dir: &std::path::Path) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|source| EngineError::Io {
                path: jinja,
                source,
            });
    }
    let path = dir.join("tokenizer_config.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(EngineError::Io { path, source }),
    };
    let cfg: Value = serde_json::from_slice(&bytes)
        .map_err(|e| EngineError::ChatTemplate(format!("{}: invalid JSON: {e}", path.display())))?;
    Ok(match cfg.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    })
}
