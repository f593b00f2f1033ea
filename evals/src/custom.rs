//! Customer suites: JSONL files, one item per line, each a chat request and one check of its
//! answer. Validated on load, every error naming the line and the field
//! (`suite.jsonl:7: check.pattern: invalid regex: ...`); no input makes this module panic
//! (files, lines and schemas are bounded; JSON nesting is bounded by `serde_json`).
//!
//! ```json
//! {"id": "capital", "request": {"messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 16}, "check": {"kind": "contains", "value": "Paris"}}
//! ```
//!
//! A line holds `id` (optional; `line-N` by default, unique), `request` (`messages`, and
//! optionally `tools`, `tool_choice`, `parallel_tool_calls`, `response_format`, `max_tokens`; sent with
//! `temperature` 0 so both sides answer greedily) and `check`, one of:
//! - `{"kind": "exact", "value": S}`: the answer's text equals S (surrounding whitespace
//!   ignored);
//! - `{"kind": "contains", "value": S, "ignore_case": false}`: the text contains S;
//! - `{"kind": "regex", "pattern": P}`: P matches somewhere in the text (the `regex` crate:
//!   linear time, no backreferences or look-around; anchor with `^`/`$`);
//! - `{"kind": "json_schema", "schema": {...}}`: the text parses as JSON valid for the
//!   schema (bounded and compiled as `samewise-toolcheck` does for tool schemas);
//! - `{"kind": "tool_call", "calls": [{"name": F, "arguments": {"p": [allowed, ...]}}]}`:
//!   the answer's tool calls, scored by BFCL's rules (`samewise_toolcheck::bfcl`): one call
//!   expected → exactly that one; several → the same count in any order; `[]` → no call.
//!   Each argument lists its allowed values (BFCL's ground-truth form; `""` among them: the
//!   argument may be omitted).
//!
//! A failed item's bucket (`error_type`) is its check's kind (`request_error` when the
//! request itself failed); the record keeps the reason within the kind (the BFCL bucket of
//! a tool call, `not_json` / `schema_mismatch` of a JSON answer).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use samewise_store::EvalResult;
use samewise_toolcheck::ToolSet;
use samewise_toolcheck::bfcl::{self, ActualCall, Category, ExpectedCall};
use samewise_toolcheck::schema::{MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES, check_size, compile};
use serde_json::{Map, Value, json};

use crate::EvalsError;
use crate::target::{Target, Targets};

/// The largest suite file read.
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// The longest line (one item).
pub const MAX_LINE_BYTES: usize = 256 << 10;
/// The most items in one suite.
pub const MAX_ITEMS: usize = 10_000;
/// The largest `max_tokens` an item may ask for.
pub const MAX_TOKENS: u64 = 8192;
/// `max_tokens` when an item gives none.
pub const DEFAULT_MAX_TOKENS: u64 = 256;
/// The largest compiled regex (bytes of the `regex` crate's program).
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// The longest item id.
const MAX_ID_CHARS: usize = 128;

/// The check kinds, as written in files and as failure buckets.
pub const CHECK_KINDS: &[&str] = &["exact", "contains", "regex", "json_schema", "tool_call"];

/// One check.
#[derive(Debug, Clone)]
pub enum Check {
    /// The trimmed text equals `value` (trimmed).
    Exact {
        /// The expected text.
        value: String,
    },
    /// The text contains `value`.
    Contains {
        /// The expected substring.
        value: String,
        /// Compare case-insensitively.
        ignore_case: bool,
    },
    /// `regex` matches somewhere in the text.
    Regex {
        /// The compiled pattern.
        regex: regex::Regex,
    },
    /// The text is JSON valid for the schema.
    JsonSchema {
        /// The compiled schema.
        validator: Arc<jsonschema::Validator>,
    },
    /// The tool calls, by BFCL's rules.
    ToolCall {
        /// Simple / parallel / irrelevance, from the number of expected calls.
        category: Category,
        /// Ground truth.
        expected: Vec<ExpectedCall>,
    },
}

impl Check {
    /// The kind's name (also the failure bucket).
    pub fn kind(&self) -> &'static str {
        match self {
            Check::Exact { .. } => "exact",
            Check::Contains { .. } => "contains",
            Check::Regex { .. } => "regex",
            Check::JsonSchema { .. } => "json_schema",
            Check::ToolCall { .. } => "tool_call",
        }
    }
}

/// One item, ready to send.
#[derive(Debug, Clone)]
pub struct Item {
    /// Unique within the suite.
    pub id: String,
    /// The chat request (without `model`).
    pub request: Value,
    /// The request's tools (empty when none).
    pub tools: Vec<Value>,
    /// The check.
    pub check: Check,
    /// The item as given, with its id filled in (what a job stores, so that any worker
    /// runs exactly these items whatever its own files say).
    pub source: Value,
}

/// A loaded suite: its items, in file order.
#[derive(Debug, Clone, Default)]
pub struct Suite {
    /// The items.
    pub items: Vec<Item>,
}

impl Suite {
    /// The items as a job stores them (`params.custom.items`).
    pub fn sources(&self) -> Vec<Value> {
        self.items.iter().map(|i| i.source.clone()).collect()
    }
}

/// An error at `at` (`file:line` or `items[i]`) in `field`.
fn err(at: &str, field: &str, msg: impl std::fmt::Display) -> String {
    if field.is_empty() {
        format!("{at}: {msg}")
    } else {
        format!("{at}: {field}: {msg}")
    }
}

/// Reads and validates the suite at `path` (at most [`MAX_FILE_BYTES`]).
pub fn load(path: &Path) -> Result<Suite, EvalsError> {
    use std::io::Read;
    let name = path.display().to_string();
    let file = std::fs::File::open(path)
        .map_err(|e| EvalsError::Suite(format!("{name}: cannot open: {e}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| EvalsError::Suite(format!("{name}: cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(EvalsError::Suite(format!(
            "{name}: larger than {MAX_FILE_BYTES} bytes"
        )));
    }
    parse(&name, &bytes)
}

/// Validates JSONL `bytes`; `name` prefixes errors (`name:LINE: field: message`). Blank
/// lines are skipped; an empty file is a suite without items.
pub fn parse(name: &str, bytes: &[u8]) -> Result<Suite, EvalsError> {
    let mut items = Vec::new();
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let at = format!("{name}:{}", i + 1);
        if line.len() > MAX_LINE_BYTES {
            return Err(EvalsError::Suite(err(
                &at,
                "",
                format!("line longer than {MAX_LINE_BYTES} bytes"),
            )));
        }
        let text = std::str::from_utf8(line)
            .map_err(|e| EvalsError::Suite(err(&at, "", format!("not UTF-8: {e}"))))?;
        if text.trim().is_empty() {
            continue;
        }
        if items.len() == MAX_ITEMS {
            return Err(EvalsError::Suite(err(
                &at,
                "",
                format!("more than {MAX_ITEMS} items"),
            )));
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| EvalsError::Suite(err(&at, "", format!("not JSON: {e}"))))?;
        items.push(item(&at, &v, &format!("line-{}", i + 1)).map_err(EvalsError::Suite)?);
    }
    unique(&items).map_err(EvalsError::Suite)?;
    Ok(Suite { items })
}

/// Validates items a job stored (`params.custom.items`); errors name `items[i]`.
pub fn from_sources(sources: &[Value]) -> Result<Suite, EvalsError> {
    let mut items = Vec::with_capacity(sources.len());
    for (i, v) in sources.iter().enumerate() {
        let at = format!("params.custom.items[{i}]");
        items.push(item(&at, v, &format!("item-{i}")).map_err(EvalsError::Suite)?);
    }
    unique(&items).map_err(EvalsError::Suite)?;
    Ok(Suite { items })
}

fn unique(items: &[Item]) -> Result<(), String> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, it) in items.iter().enumerate() {
        if let Some(first) = seen.insert(it.id.as_str(), i) {
            return Err(format!(
                "item {:?}: id used twice (items {} and {})",
                it.id,
                first + 1,
                i + 1
            ));
        }
    }
    Ok(())
}

/// One item from its JSON object.
fn item(at: &str, v: &Value, default_id: &str) -> Result<Item, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| err(at, "", "an item is a JSON object"))?;
    for k in obj.keys() {
        if !["id", "request", "check"].contains(&k.as_str()) {
            return Err(err(at, k, "unknown field (allowed: id, request, check)"));
        }
    }
    let id = match obj.get("id") {
        None => default_id.to_owned(),
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= MAX_ID_CHARS => s.clone(),
        Some(_) => {
            return Err(err(
                at,
                "id",
                format!("must be a non-empty string of at most {MAX_ID_CHARS} characters"),
            ));
        }
    };
    let raw_request = obj
        .get("request")
        .ok_or_else(|| err(at, "request", "missing"))?;
    let (request, tools) = request(at, raw_request)?;
    let raw_check = obj
        .get("check")
        .ok_or_else(|| err(at, "check", "missing"))?;
    let check = check(at, raw_check, &tools)?;
    let mut source = v.clone();
    if let Some(o) = source.as_object_mut() {
        o.insert("id".to_owned(), Value::String(id.clone()));
    }
    Ok(Item {
        id,
        request,
        tools,
        check,
        source,
    })
}

/// The fields an item's request may hold.
pub const REQUEST_FIELDS: &[&str] = &[
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "max_tokens",
];

/// The request to send (temperature 0, `max_tokens` filled in) and its tools.
pub(crate) fn request(at: &str, v: &Value) -> Result<(Value, Vec<Value>), String> {
    let obj = v
        .as_object()
        .ok_or_else(|| err(at, "request", "must be an object"))?;
    for k in obj.keys() {
        if !REQUEST_FIELDS.contains(&k.as_str()) {
            return Err(err(
                at,
                &format!("request.{k}"),
                format!("unknown field (allowed: {})", REQUEST_FIELDS.join(", ")),
            ));
        }
    }
    let messages = obj
        .get("messages")
        .ok_or_else(|| err(at, "request.messages", "missing"))?
        .as_array()
        .ok_or_else(|| err(at, "request.messages", "must be an array"))?;
    if messages.is_empty() {
        return Err(err(at, "request.messages", "must not be empty"));
    }
    for (i, m) in messages.iter().enumerate() {
        let f = format!("request.messages[{i}]");
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| err(at, &format!("{f}.role"), "must be a string"))?;
        if !["system", "developer", "user", "assistant", "tool"].contains(&role) {
            return Err(err(
                at,
                &format!("{f}.role"),
                format!("unknown role {role:?} (system, developer, user, assistant, tool)"),
            ));
        }
        match m.get("content") {
            Some(Value::String(_) | Value::Array(_) | Value::Null) => {}
            None if role == "assistant" => {}
            None => return Err(err(at, &format!("{f}.content"), "missing")),
            Some(_) => {
                return Err(err(
                    at,
                    &format!("{f}.content"),
                    "must be a string or an array of parts",
                ));
            }
        }
    }
    let tools: Vec<Value> = match obj.get("tools") {
        None => Vec::new(),
        Some(Value::Array(t)) => t.clone(),
        Some(_) => return Err(err(at, "request.tools", "must be an array")),
    };
    let mut budget = MAX_SCHEMA_NODES;
    for (i, t) in tools.iter().enumerate() {
        let f = format!("request.tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(err(at, &format!("{f}.type"), "must be \"function\""));
        }
        if t.pointer("/function/name")
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(err(at, &format!("{f}.function.name"), "must be a string"));
        }
        if let Some(p) = t.pointer("/function/parameters") {
            budget = check_size(p, MAX_SCHEMA_DEPTH, budget)
                .map_err(|e| err(at, &format!("{f}.function.parameters"), e))?;
        }
    }
    let set = ToolSet::from_request_tools(&Value::Array(tools.clone()));
    if let Some((name, why)) = set.schema_errors().first() {
        return Err(err(at, "request.tools", format!("{name}: {why}")));
    }
    if let Some(c) = obj.get("tool_choice") {
        match c {
            Value::String(s) if ["none", "auto", "required"].contains(&s.as_str()) => {
                if s != "none" && tools.is_empty() {
                    return Err(err(at, "request.tool_choice", "no tools are offered"));
                }
            }
            Value::Object(_) => {
                let name = c
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| err(at, "request.tool_choice.function.name", "missing"))?;
                if !set.names().any(|n| n == name) {
                    return Err(err(
                        at,
                        "request.tool_choice.function.name",
                        format!("{name:?} is not among request.tools"),
                    ));
                }
            }
            _ => {
                return Err(err(
                    at,
                    "request.tool_choice",
                    "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        }
    }
    if let Some(rf) = obj.get("response_format") {
        let kind = rf.get("type").and_then(Value::as_str).ok_or_else(|| {
            err(
                at,
                "request.response_format.type",
                "must be a string (text, json_object, json_schema)",
            )
        })?;
        match kind {
            "text" | "json_object" => {}
            "json_schema" => {
                let s = rf.pointer("/json_schema/schema").ok_or_else(|| {
                    err(at, "request.response_format.json_schema.schema", "missing")
                })?;
                schema(at, "request.response_format.json_schema.schema", s)?;
            }
            other => {
                return Err(err(
                    at,
                    "request.response_format.type",
                    format!("unknown type {other:?} (text, json_object, json_schema)"),
                ));
            }
        }
    }
    if obj
        .get("parallel_tool_calls")
        .is_some_and(|p| !p.is_boolean())
    {
        return Err(err(
            at,
            "request.parallel_tool_calls",
            "must be true or false",
        ));
    }
    let max_tokens = match obj.get("max_tokens") {
        None => DEFAULT_MAX_TOKENS,
        Some(m) => m
            .as_u64()
            .filter(|n| (1..=MAX_TOKENS).contains(n))
            .ok_or_else(|| {
                err(
                    at,
                    "request.max_tokens",
                    format!("must be an integer in 1..={MAX_TOKENS}"),
                )
            })?,
    };
    let mut out = obj.clone();
    out.insert("max_tokens".to_owned(), max_tokens.into());
    out.insert("temperature".to_owned(), 0.into());
    Ok((Value::Object(out), tools))
}

/// A bounded, compiled schema.
fn schema(at: &str, field: &str, s: &Value) -> Result<jsonschema::Validator, String> {
    if !s.is_object() && !s.is_boolean() {
        return Err(err(at, field, "must be a JSON Schema (an object)"));
    }
    check_size(s, MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES).map_err(|e| err(at, field, e))?;
    compile(s).map_err(|e| err(at, field, format!("does not compile: {e}")))
}

fn string_field<'a>(at: &str, obj: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    obj.get(key)
        .ok_or_else(|| err(at, &format!("check.{key}"), "missing"))?
        .as_str()
        .ok_or_else(|| err(at, &format!("check.{key}"), "must be a string"))
}

fn check(at: &str, v: &Value, tools: &[Value]) -> Result<Check, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| err(at, "check", "must be an object with a \"kind\""))?;
    let kind = obj
        .get("kind")
        .ok_or_else(|| err(at, "check.kind", "missing"))?
        .as_str()
        .ok_or_else(|| err(at, "check.kind", "must be a string"))?;
    let allowed: &[&str] = match kind {
        "exact" => &["kind", "value"],
        "contains" => &["kind", "value", "ignore_case"],
        "regex" => &["kind", "pattern"],
        "json_schema" => &["kind", "schema"],
        "tool_call" => &["kind", "calls"],
        other => {
            return Err(err(
                at,
                "check.kind",
                format!("unknown kind {other:?} (known: {})", CHECK_KINDS.join(", ")),
            ));
        }
    };
    for k in obj.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(err(
                at,
                &format!("check.{k}"),
                format!(
                    "unknown field for kind {kind:?} (allowed: {})",
                    allowed.join(", ")
                ),
            ));
        }
    }
    match kind {
        "exact" => Ok(Check::Exact {
            value: string_field(at, obj, "value")?.trim().to_owned(),
        }),
        "contains" => {
            let value = string_field(at, obj, "value")?;
            if value.is_empty() {
                return Err(err(at, "check.value", "must not be empty"));
            }
            let ignore_case = match obj.get("ignore_case") {
                None => false,
                Some(b) => b
                    .as_bool()
                    .ok_or_else(|| err(at, "check.ignore_case", "must be true or false"))?,
            };
            Ok(Check::Contains {
                value: value.to_owned(),
                ignore_case,
            })
        }
        "regex" => {
            let pattern = string_field(at, obj, "pattern")?;
            let regex = regex::RegexBuilder::new(pattern)
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| {
                    // the regex crate's messages span lines (a caret under the pattern)
                    let m = e.to_string().replace('\n', " ");
                    err(at, "check.pattern", format!("invalid regex: {m}"))
                })?;
            Ok(Check::Regex { regex })
        }
        "json_schema" => {
            let s = obj
                .get("schema")
                .ok_or_else(|| err(at, "check.schema", "missing"))?;
            Ok(Check::JsonSchema {
                validator: Arc::new(schema(at, "check.schema", s)?),
            })
        }
        _ => {
            let calls = obj
                .get("calls")
                .ok_or_else(|| err(at, "check.calls", "missing"))?
                .as_array()
                .ok_or_else(|| err(at, "check.calls", "must be an array ([] = no call)"))?;
            let set = ToolSet::from_request_tools(&Value::Array(tools.to_vec()));
            if tools.is_empty() {
                return Err(err(at, "request.tools", "a tool_call check needs tools"));
            }
            let mut expected = Vec::with_capacity(calls.len());
            for (i, c) in calls.iter().enumerate() {
                let f = format!("check.calls[{i}]");
                let name = c
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| err(at, &format!("{f}.name"), "must be a string"))?;
                if !set.names().any(|n| n == name) {
                    return Err(err(
                        at,
                        &format!("{f}.name"),
                        format!("{name:?} is not among request.tools"),
                    ));
                }
                let args = match c.get("arguments") {
                    None => Map::new(),
                    Some(Value::Object(m)) => m.clone(),
                    Some(_) => {
                        return Err(err(
                            at,
                            &format!("{f}.arguments"),
                            "must be an object of allowed values",
                        ));
                    }
                };
                for (k, allowed) in &args {
                    if allowed.as_array().is_none_or(|a| a.is_empty()) {
                        return Err(err(
                            at,
                            &format!("{f}.arguments.{k}"),
                            "must be a non-empty array of allowed values, e.g. [\"Paris\"]",
                        ));
                    }
                }
                if let Some(extra) = c
                    .as_object()
                    .and_then(|o| o.keys().find(|k| *k != "name" && *k != "arguments"))
                {
                    return Err(err(
                        at,
                        &format!("{f}.{extra}"),
                        "unknown field (allowed: name, arguments)",
                    ));
                }
                expected.push(ExpectedCall {
                    name: name.to_owned(),
                    args,
                });
            }
            let category = match expected.len() {
                0 => Category::Irrelevance,
                1 => Category::Simple,
                _ => Category::Parallel,
            };
            Ok(Check::ToolCall { category, expected })
        }
    }
}

/// The outcome of one check: passed, or the reason within the kind and a line for people.
pub fn score(
    check: &Check,
    tools: &[Value],
    text: &str,
    calls: &[ActualCall],
) -> Result<(), (String, String)> {
    let short = |s: &str| -> String { s.chars().take(120).collect() };
    match check {
        Check::Exact { value } => {
            if text.trim() == value {
                Ok(())
            } else {
                Err((
                    "mismatch".into(),
                    format!("{:?} is not {:?}", short(text.trim()), short(value)),
                ))
            }
        }
        Check::Contains { value, ignore_case } => {
            let found = if *ignore_case {
                text.to_lowercase().contains(&value.to_lowercase())
            } else {
                text.contains(value.as_str())
            };
            if found {
                Ok(())
            } else {
                Err((
                    "missing".into(),
                    format!("no {:?} in the answer", short(value)),
                ))
            }
        }
        Check::Regex { regex } => {
            if regex.is_match(text) {
                Ok(())
            } else {
                Err((
                    "no_match".into(),
                    format!("/{}/ does not match", short(regex.as_str())),
                ))
            }
        }
        Check::JsonSchema { validator } => match serde_json::from_str::<Value>(text.trim()) {
            Err(e) => Err(("not_json".into(), format!("the answer is not JSON: {e}"))),
            Ok(v) => match validator.validate(&v) {
                Ok(()) => Ok(()),
                Err(e) => Err(("schema_mismatch".into(), short(&e.to_string()))),
            },
        },
        Check::ToolCall { category, expected } => bfcl::check(*category, tools, expected, calls)
            .map_err(|f| (f.error.as_str().to_owned(), f.detail)),
    }
}

/// Asks `target` item `item` and scores the answer (a failed request is a failed item,
/// `request_error`).
pub async fn run(targets: &Targets, target: &Target, role: &str, item: &Item) -> EvalResult {
    let answer = targets
        .post(target, "chat/completions", item.request.clone())
        .await;
    let answered = crate::tool_calls::Answered::of(answer);
    let text = answered
        .message
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let checked = match &answered.request_error {
        Some(e) => Err((
            "request_error".to_owned(),
            "request_error".to_owned(),
            e.clone(),
        )),
        None => score(&item.check, &item.tools, &text, &answered.calls)
            .map_err(|(reason, detail)| (item.check.kind().to_owned(), reason, detail)),
    };
    let (passed, error_type, reason, detail) = match checked {
        Ok(()) => (true, None, None, None),
        Err((t, r, d)) => (false, Some(t), Some(r), Some(d)),
    };
    EvalResult {
        item: item.id.clone(),
        target: role.to_owned(),
        passed,
        error_type: error_type.clone(),
        tokens: answered.tokens,
        record: json!({
            "request": item.request,
            "endpoint": target.label,
            "answer": answered.message,
            "text": text,
            "finish_reason": answered.finish,
            "calls": answered.calls_json(),
            "check": {
                "kind": item.check.kind(),
                "passed": passed,
                "error_type": error_type,
                "reason": reason,
                "detail": detail,
            },
        }),
    }
}

/// Per check kind: items answered by both sides and each side's passes.
pub fn extras(items: &[Item], results: &[EvalResult]) -> Value {
    let find = |id: &str, role: &str| results.iter().find(|r| r.item == id && r.target == role);
    let mut by: BTreeMap<&str, [u64; 3]> = BTreeMap::new();
    for it in items {
        let (Some(s), Some(b)) = (find(&it.id, "suspect"), find(&it.id, "baseline")) else {
            continue;
        };
        let e = by.entry(it.check.kind()).or_default();
        e[0] += 1;
        e[1] += u64::from(s.passed);
        e[2] += u64::from(b.passed);
    }
    let by_check: Map<String, Value> = by
        .into_iter()
        .map(|(k, [n, s, b])| {
            (
                k.to_owned(),
                json!({"items": n, "suspect_passed": s, "baseline_passed": b}),
            )
        })
        .collect();
    json!({ "by_check": by_check })
}

#[cfg(test)]
mod tests;
