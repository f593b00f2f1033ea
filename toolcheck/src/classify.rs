//! Tool-call classification: the tools a request declares, compiled once into JSON Schema validators
//! ([`ToolSet`]); streamed tool-call deltas assembled into whole calls by `index`
//! ([`ToolCallAssembler`]); and every returned call classified ok / invalid_json /
//! unknown_name / schema_mismatch, with the finish reason checked against the calls
//! ([`check_calls`] -> [`ToolReport`]).
//!
//! Rules, in the order they are applied to one call:
//! 1. `unknown_name`: the call names no declared function (or no name at all).
//! 2. `invalid_json`: the arguments string is not JSON. An empty (or all-whitespace) string
//!    counts as `{}`, which some servers send for functions without parameters.
//! 3. `schema_mismatch`: the arguments fail the declared `parameters` schema. A function with
//!    no (or an empty) schema accepts any JSON object, and only objects. A function whose
//!    schema does not compile cannot be checked: its calls count as ok (only JSON and object
//!    shape are checked) and the compile error is kept in [`ToolSet::schema_errors`]; the
//!    fault is the app's, not the endpoint's. Schemas compile with linear-time regexes
//!    ([`crate::schema::compile`]): a `pattern` that needs backtracking does not compile.
//!
//! Finish reason: `tool_calls` (or the legacy `function_call`) with no call is
//! `finish_without_calls`; calls with any other finish reason is `calls_without_finish`; no
//! finish reason at all (a stream cut short) gives no verdict. A request is errored when any
//! call errs or the finish reason mismatches.
//!
//! Nothing here panics on any input: malformed `tools` give an empty set (with the reason in
//! `schema_errors`), malformed deltas are skipped.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// The functions a request declares, with a compiled validator for each.
#[derive(Debug, Default)]
pub struct ToolSet {
    /// Function name -> how its arguments are checked.
    tools: HashMap<String, ArgCheck>,
    /// Declared tools that could not be used as given: (name or position, reason).
    schema_errors: Vec<(String, String)>,
}

/// How one function's arguments are checked.
#[derive(Debug)]
enum ArgCheck {
    /// Against the compiled `parameters` schema.
    Schema(Box<jsonschema::Validator>),
    /// Any JSON object (no schema, an empty schema, or one that did not compile).
    AnyObject,
}

/// One tool call, whole: assembled from streamed deltas or taken from a non-streamed message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's position in the answer (the deltas' `index`).
    pub index: u32,
    /// The call id, from the first delta that carried one.
    pub id: Option<String>,
    /// The function name, from the first delta that carried one.
    pub name: Option<String>,
    /// The arguments string, all deltas' pieces concatenated in arrival order.
    pub arguments: String,
}

impl ToolCall {
    /// The calls of a non-streamed chat completion's `message` (`message.tool_calls`, in
    /// order; none when it has none), taken as [`ToolCallAssembler::push_whole`] takes them.
    pub fn of_message(message: &Value) -> Vec<ToolCall> {
        let mut calls = ToolCallAssembler::new();
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            calls.push_whole(call);
        }
        calls.finish()
    }
}

/// What one call was found to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallVerdict {
    /// A declared function, JSON arguments that satisfy its schema.
    Ok,
    /// The arguments are not JSON.
    InvalidJson,
    /// The name is not a declared function.
    UnknownName,
    /// The arguments do not satisfy the declared schema.
    SchemaMismatch,
}

impl CallVerdict {
    /// The verdict's name, as records and dashboards count it (`ok`, `invalid_json`,
    /// `unknown_name`, `schema_mismatch`).
    pub fn as_str(self) -> &'static str {
        match self {
            CallVerdict::Ok => "ok",
            CallVerdict::InvalidJson => "invalid_json",
            CallVerdict::UnknownName => "unknown_name",
            CallVerdict::SchemaMismatch => "schema_mismatch",
        }
    }
}

/// The finish reason disagrees with the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishMismatch {
    /// `finish_reason` says `tool_calls`, but no call came.
    FinishWithoutCalls,
    /// Calls came, but `finish_reason` is something else.
    CallsWithoutFinish,
}

/// The checks of one answer's tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolReport {
    /// Calls returned.
    pub calls: u32,
    /// Calls whose arguments are not JSON.
    pub invalid_json: u32,
    /// Calls naming an undeclared function.
    pub unknown_name: u32,
    /// Calls whose arguments fail the declared schema.
    pub schema_mismatch: u32,
    /// The finish reason disagrees with the calls.
    pub finish_mismatch: Option<FinishMismatch>,
    /// Any call erred or the finish reason mismatches.
    pub errored: bool,
    /// Each call's verdict, in call order.
    pub verdicts: Vec<CallVerdict>,
}

/// Assembles whole tool calls from streamed `tool_calls` deltas (and takes whole calls from
/// non-streamed messages).
///
/// Deltas are grouped by `index`: the id and the name come from the first delta of an index
/// that carries them, argument pieces are concatenated in arrival order. A delta without
/// `index` (some servers send each call whole in one delta) starts a new call when it carries
/// an id or a name, and otherwise continues the last call.
#[derive(Debug, Default)]
pub struct ToolCallAssembler {
    /// Calls by index.
    calls: BTreeMap<u32, ToolCall>,
    /// The index the last delta went to (for deltas without one).
    last: Option<u32>,
}

impl ToolSet {
    /// Compiles the request's `tools` array. Never fails: what cannot be used is listed in
    /// [`ToolSet::schema_errors`].
    pub fn from_request_tools(tools: &Value) -> ToolSet {
        let mut set = ToolSet::default();
        let Some(list) = tools.as_array() else {
            set.schema_errors
                .push(("tools".to_owned(), "`tools` is not an array".to_owned()));
            return set;
        };
        for (i, tool) in list.iter().enumerate() {
            // {"type": "function", "function": {"name", "parameters"}}; other tool types
            // (custom, built-in) declare no function schema and are skipped.
            if tool
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t != "function")
            {
                continue;
            }
            let Some(function) = tool.get("function") else {
                set.schema_errors
                    .push((format!("tools[{i}]"), "no `function` object".to_owned()));
                continue;
            };
            let Some(name) = function.get("name").and_then(Value::as_str) else {
                set.schema_errors.push((
                    format!("tools[{i}]"),
                    "function has no string `name`".to_owned(),
                ));
                continue;
            };
            let check = match function.get("parameters") {
                None | Some(Value::Null) => ArgCheck::AnyObject,
                Some(Value::Object(o)) if o.is_empty() => ArgCheck::AnyObject,
                Some(schema) => match crate::schema::compile(schema) {
                    Ok(v) => ArgCheck::Schema(Box::new(v)),
                    Err(err) => {
                        set.schema_errors.push((
                            name.to_owned(),
                            format!("parameters schema does not compile: {err}"),
                        ));
                        ArgCheck::AnyObject
                    }
                },
            };
            set.tools.insert(name.to_owned(), check);
        }
        set
    }

    /// Declared function names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// Declared tools that could not be used as given: (name or `tools[i]`, reason).
    pub fn schema_errors(&self) -> &[(String, String)] {
        &self.schema_errors
    }

    /// Classifies one call (see the module doc for the rules and their order).
    pub fn classify(&self, call: &ToolCall) -> CallVerdict {
        let Some(check) = call.name.as_deref().and_then(|n| self.tools.get(n)) else {
            return CallVerdict::UnknownName;
        };
        let args = if call.arguments.trim().is_empty() {
            Value::Object(serde_json::Map::new())
        } else {
            match serde_json::from_str::<Value>(&call.arguments) {
                Ok(v) => v,
                Err(_) => return CallVerdict::InvalidJson,
            }
        };
        let ok = match check {
            ArgCheck::AnyObject => args.is_object(),
            ArgCheck::Schema(v) => v.is_valid(&args),
        };
        if ok {
            CallVerdict::Ok
        } else {
            CallVerdict::SchemaMismatch
        }
    }
}

impl FinishMismatch {
    /// The name recorded in the store and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishMismatch::FinishWithoutCalls => "finish_without_calls",
            FinishMismatch::CallsWithoutFinish => "calls_without_finish",
        }
    }
}

impl ToolCallAssembler {
    /// An empty assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one element of a streamed `delta.tool_calls` array.
    pub fn push(&mut self, delta: &Value) {
        let id = delta
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let name = delta
            .pointer("/function/name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let index = match delta
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| u32::try_from(i).ok())
        {
            Some(i) => i,
            None if id.is_some() || name.is_some() || self.last.is_none() => self.next_index(),
            None => self.last.unwrap_or_default(),
        };
        let call = self.calls.entry(index).or_insert_with(|| ToolCall {
            index,
            ..ToolCall::default()
        });
        if call.id.is_none() {
            call.id = id.map(str::to_owned);
        }
        if call.name.is_none() {
            call.name = name.map(str::to_owned);
        }
        if let Some(piece) = delta.pointer("/function/arguments").and_then(Value::as_str) {
            call.arguments.push_str(piece);
        }
        self.last = Some(index);
    }

    /// Takes one whole call from a non-streamed `message.tool_calls` array (its position is
    /// its arrival order). Arguments that are a JSON object instead of a string (a server
    /// bug) are kept as their JSON text.
    pub fn push_whole(&mut self, call: &Value) {
        let index = self.next_index();
        let arguments = match call.pointer("/function/arguments") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        self.calls.insert(
            index,
            ToolCall {
                index,
                id: call.get("id").and_then(Value::as_str).map(str::to_owned),
                name: call
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                arguments,
            },
        );
        self.last = Some(index);
    }

    /// The assembled calls, by index.
    pub fn finish(self) -> Vec<ToolCall> {
        self.calls.into_values().collect()
    }

    fn next_index(&self) -> u32 {
        self.calls
            .keys()
            .next_back()
            .map_or(0, |i| i.saturating_add(1))
    }
}

/// Classifies every call and checks the finish reason against them.
pub fn check_calls(tools: &ToolSet, calls: &[ToolCall], finish_reason: Option<&str>) -> ToolReport {
    let mut report = ToolReport {
        calls: saturating_u32(calls.len()),
        ..ToolReport::default()
    };
    for call in calls {
        let verdict = tools.classify(call);
        match verdict {
            CallVerdict::Ok => {}
            CallVerdict::InvalidJson => report.invalid_json += 1,
            CallVerdict::UnknownName => report.unknown_name += 1,
            CallVerdict::SchemaMismatch => report.schema_mismatch += 1,
        }
        report.verdicts.push(verdict);
    }
    let says_calls = |r: &str| r == "tool_calls" || r == "function_call";
    report.finish_mismatch = match finish_reason {
        Some(r) if says_calls(r) && calls.is_empty() => Some(FinishMismatch::FinishWithoutCalls),
        Some(r) if !says_calls(r) && !calls.is_empty() => Some(FinishMismatch::CallsWithoutFinish),
        _ => None,
    };
    report.errored = report.invalid_json + report.unknown_name + report.schema_mismatch > 0
        || report.finish_mismatch.is_some();
    report
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn weather_tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "now"}},
            {"type": "function", "function": {"name": "empty", "parameters": {}}},
        ])
    }

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            index: 0,
            id: None,
            name: Some(name.to_owned()),
            arguments: args.to_owned(),
        }
    }

    #[test]
    fn classifies_each_kind_of_call() {
        let set = ToolSet::from_request_tools(&weather_tools());
        assert!(set.schema_errors().is_empty());
        assert_eq!(
            set.classify(&call("get_weather", r#"{"city": "Oslo", "days": 2}"#)),
            CallVerdict::Ok
        );
        assert_eq!(
            set.classify(&call("get_weather", r#"{"city": "Oslo""#)),
            CallVerdict::InvalidJson
        );
        assert_eq!(
            set.classify(&call("get_wether", r#"{"city": "Oslo"}"#)),
            CallVerdict::UnknownName
        );
        assert_eq!(
            set.classify(&ToolCall {
                name: None,
                ..call("x", "{}")
            }),
            CallVerdict::UnknownName
        );
        assert_eq!(
            set.classify(&call("get_weather", r#"{"days": 2}"#)),
            CallVerdict::SchemaMismatch
        );
        assert_eq!(
            set.classify(&call("get_weather", r#"{"city": "Oslo", "days": 0}"#)),
            CallVerdict::SchemaMismatch
        );
        assert_eq!(
            set.classify(&call("get_weather", r#"{"city": 3}"#)),
            CallVerdict::SchemaMismatch
        );
        assert_eq!(
            set.classify(&call("get_weather", "")),
            CallVerdict::SchemaMismatch,
            "empty args are {{}} and miss `city`"
        );
        // no schema / empty schema: any object, only objects
        assert_eq!(
            set.classify(&call("now", r#"{"tz": "UTC"}"#)),
            CallVerdict::Ok
        );
        assert_eq!(set.classify(&call("now", "")), CallVerdict::Ok);
        assert_eq!(set.classify(&call("empty", "{}")), CallVerdict::Ok);
        assert_eq!(
            set.classify(&call("now", "[1, 2]")),
            CallVerdict::SchemaMismatch
        );
        assert_eq!(
            set.classify(&call("now", "not json")),
            CallVerdict::InvalidJson
        );
        // unknown name wins over bad JSON
        assert_eq!(set.classify(&call("nope", "{{")), CallVerdict::UnknownName);
    }

    #[test]
    fn uncompilable_and_malformed_declarations_are_reported_not_fatal() {
        let tools = json!([
            {"type": "function", "function": {"name": "bad", "parameters": {"type": "no-such-type"}}},
            {"type": "function", "function": {"parameters": {}}},
            {"type": "function"},
            {"type": "custom", "custom": {"name": "grammar"}},
        ]);
        let set = ToolSet::from_request_tools(&tools);
        assert_eq!(set.schema_errors().len(), 3, "{:?}", set.schema_errors());
        assert_eq!(set.names().collect::<Vec<_>>(), vec!["bad"]);
        // the uncompilable schema is the app's fault: its calls are checked for JSON objects only
        assert_eq!(set.classify(&call("bad", r#"{"a": 1}"#)), CallVerdict::Ok);
        assert_eq!(set.classify(&call("bad", "{")), CallVerdict::InvalidJson);

        let not_array = ToolSet::from_request_tools(&json!({"name": "x"}));
        assert_eq!(not_array.names().count(), 0);
        assert_eq!(not_array.schema_errors().len(), 1);
    }

    #[test]
    fn local_refs_resolve_and_remote_refs_are_never_fetched() {
        // pydantic-style schemas put shared types under $defs
        let tools = json!([
            {"type": "function", "function": {"name": "book", "parameters": {
                "type": "object",
                "$defs": {"Date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
                "properties": {"from": {"$ref": "#/$defs/Date"}},
                "required": ["from"]}}},
            {"type": "function", "function": {"name": "remote", "parameters": {
                "$ref": "http://127.0.0.1:9/schema.json"}}},
        ]);
        let set = ToolSet::from_request_tools(&tools);
        assert_eq!(
            set.classify(&call("book", r#"{"from": "2025-01-31"}"#)),
            CallVerdict::Ok
        );
        assert_eq!(
            set.classify(&call("book", r#"{"from": "next tuesday"}"#)),
            CallVerdict::SchemaMismatch
        );
        // a remote reference is not fetched (no network from the request path): the schema is
        // reported as unusable and its calls are checked for JSON objects only
        assert_eq!(set.schema_errors().len(), 1, "{:?}", set.schema_errors());
        assert_eq!(set.schema_errors()[0].0, "remote");
        assert_eq!(set.classify(&call("remote", "{}")), CallVerdict::Ok);
    }

    #[test]
    fn finish_reason_consistency() {
        let set = ToolSet::from_request_tools(&weather_tools());
        let ok = [call("now", "{}")];
        assert_eq!(
            check_calls(&set, &ok, Some("tool_calls")).finish_mismatch,
            None
        );
        assert!(!check_calls(&set, &ok, Some("tool_calls")).errored);
        let r = check_calls(&set, &[], Some("tool_calls"));
        assert_eq!(r.finish_mismatch, Some(FinishMismatch::FinishWithoutCalls));
        assert!(r.errored);
        assert_eq!(
            r.finish_mismatch.map(FinishMismatch::as_str),
            Some("finish_without_calls")
        );
        let r = check_calls(&set, &ok, Some("stop"));
        assert_eq!(
            r.finish_mismatch.map(FinishMismatch::as_str),
            Some("calls_without_finish")
        );
        assert!(r.errored);
        assert_eq!(check_calls(&set, &[], Some("stop")), ToolReport::default());
        // no finish reason (a cut stream): no verdict on consistency
        assert_eq!(check_calls(&set, &ok, None).finish_mismatch, None);
    }

    #[test]
    fn report_counts_every_class() {
        let set = ToolSet::from_request_tools(&weather_tools());
        let calls = [
            call("get_weather", r#"{"city": "Rome"}"#),
            call("get_weather", "{"),
            call("nope", "{}"),
            call("get_weather", "{}"),
            call("now", "{}"),
        ];
        let r = check_calls(&set, &calls, Some("tool_calls"));
        assert_eq!(
            (r.calls, r.invalid_json, r.unknown_name, r.schema_mismatch),
            (5, 1, 1, 1)
        );
        assert!(r.errored);
        assert_eq!(r.verdicts[4], CallVerdict::Ok);
    }

    #[test]
    fn assembles_streamed_deltas_by_index() {
        let mut a = ToolCallAssembler::new();
        a.push(&json!({"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}));
        a.push(&json!({"index": 1, "id": "call_b", "type": "function", "function": {"name": "now", "arguments": "{"}}));
        a.push(&json!({"index": 0, "function": {"arguments": "{\"city\": "}}));
        a.push(&json!({"index": 1, "function": {"arguments": "}"}}));
        a.push(&json!({"index": 0, "function": {"arguments": "\"Oslo\"}"}}));
        let calls = a.finish();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id.as_deref(), Some("call_a"));
        assert_eq!(calls[0].name.as_deref(), Some("get_weather"));
        assert_eq!(calls[0].arguments, r#"{"city": "Oslo"}"#);
        assert_eq!(calls[1].arguments, "{}");
    }

    #[test]
    fn deltas_without_index_and_whole_calls() {
        let mut a = ToolCallAssembler::new();
        a.push(&json!({"id": "c1", "function": {"name": "a", "arguments": "{\"x\""}}));
        a.push(&json!({"function": {"arguments": ": 1}"}}));
        a.push(&json!({"id": "c2", "function": {"name": "b", "arguments": "{}"}}));
        a.push(&json!("garbage"));
        let calls = a.finish();
        assert_eq!(
            calls
                .iter()
                .map(|c| c.arguments.as_str())
                .collect::<Vec<_>>(),
            vec![r#"{"x": 1}"#, "{}"]
        );

        let mut whole = ToolCallAssembler::new();
        whole.push_whole(
            &json!({"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}}),
        );
        whole.push_whole(&json!({"id": "c2", "type": "function", "function": {"name": "b", "arguments": {"k": 1}}}));
        let calls = whole.finish();
        assert_eq!(calls[1].index, 1);
        assert_eq!(calls[1].arguments, r#"{"k":1}"#);

        let message = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "b", "arguments": {"k": 1}}}]});
        assert_eq!(ToolCall::of_message(&message), calls);
        assert!(ToolCall::of_message(&json!({"role": "assistant", "content": "hi"})).is_empty());
        assert!(ToolCall::of_message(&json!({"tool_calls": "nonsense"})).is_empty());
    }

    /// `^(a+)+\1$` makes a backtracking engine try every split of a run of a's (2^28 of
    /// them for 29 a's and a `!`). The pattern is the client's: checking a call against it
    /// must finish, and must not make the endpoint's call a schema_mismatch. A nested
    /// quantifier without backreferences is run in linear time and still checks.
    #[test]
    fn a_catastrophic_pattern_neither_hangs_nor_blames_the_endpoint() {
        let tool = |pattern: &str| {
            json!([{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object",
                "properties": {"s": {"type": "string", "pattern": pattern}}
            }}}])
        };
        let evil = format!("{}!", "a".repeat(29));
        let args = json!({ "s": evil }).to_string();
        let set = ToolSet::from_request_tools(&tool("^(a+)+\\1$"));
        assert_eq!(set.classify(&call("f", &args)), CallVerdict::Ok);
        assert_eq!(set.schema_errors().len(), 1, "{:?}", set.schema_errors());
        let linear = ToolSet::from_request_tools(&tool("^(a+)+$"));
        assert!(linear.schema_errors().is_empty());
        assert_eq!(
            linear.classify(&call("f", &args)),
            CallVerdict::SchemaMismatch
        );
        let fine = json!({ "s": "a".repeat(29) }).to_string();
        assert_eq!(linear.classify(&call("f", &fine)), CallVerdict::Ok);
    }

    proptest! {
        /// However the arguments are cut into deltas and however the calls interleave, the
        /// assembled calls are the original ones.
        #[test]
        fn assembly_is_independent_of_delta_boundaries(
            calls in proptest::collection::vec(("[a-z_]{1,12}", ".{0,40}"), 1..5),
            cuts in proptest::collection::vec(proptest::collection::vec(0usize..48, 0..5), 5),
            order_seed in proptest::collection::vec(0usize..5, 0..60),
        ) {
            // one queue of deltas per call: a head with id and name, then argument pieces
            let mut queues: Vec<Vec<Value>> = calls.iter().enumerate().map(|(i, (name, args))| {
                let mut points: Vec<usize> = cuts[i].iter().map(|c| c % (args.len() + 1)).filter(|&c| args.is_char_boundary(c)).collect();
                points.sort_unstable();
                points.dedup();
                let mut pieces = Vec::new();
                let mut start = 0;
                for p in points.into_iter().chain([args.len()]) {
                    pieces.push(json!({"index": i, "function": {"arguments": &args[start..p]}}));
                    start = p;
                }
                let mut q = vec![json!({"index": i, "id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": ""}})];
                q.extend(pieces);
                q.reverse(); // pop from the back
                q
            }).collect();
            let mut a = ToolCallAssembler::new();
            let mut seed = order_seed.into_iter();
            while queues.iter().any(|q| !q.is_empty()) {
                let live: Vec<usize> = (0..queues.len()).filter(|&i| !queues[i].is_empty()).collect();
                let pick = live[seed.next().unwrap_or(0) % live.len()];
                if let Some(d) = queues[pick].pop() {
                    a.push(&d);
                }
            }
            let got = a.finish();
            prop_assert_eq!(got.len(), calls.len());
            for (i, (name, args)) in calls.iter().enumerate() {
                prop_assert_eq!(got[i].index as usize, i);
                prop_assert_eq!(got[i].name.as_deref(), Some(name.as_str()));
                prop_assert_eq!(&got[i].arguments, args);
                let id = format!("call_{i}");
                prop_assert_eq!(got[i].id.as_deref(), Some(id.as_str()));
            }
        }

        /// The report's counts add up, `errored` is exactly "some call erred or the finish
        /// reason mismatches", and nothing panics on arbitrary names and argument strings.
        #[test]
        fn report_is_consistent(
            calls in proptest::collection::vec((prop_oneof!["get_weather", "now", "empty", "[a-z]{1,6}"], ".{0,30}"), 0..6),
            finish in prop_oneof![Just(None), Just(Some("tool_calls")), Just(Some("stop")), Just(Some("length"))],
        ) {
            let set = ToolSet::from_request_tools(&weather_tools());
            let calls: Vec<ToolCall> = calls.iter().map(|(n, a)| call(n, a)).collect();
            let r = check_calls(&set, &calls, finish);
            let ok = r.verdicts.iter().filter(|v| **v == CallVerdict::Ok).count() as u32;
            prop_assert_eq!(r.calls as usize, calls.len());
            prop_assert_eq!(ok + r.invalid_json + r.unknown_name + r.schema_mismatch, r.calls);
            prop_assert_eq!(r.errored, ok < r.calls || r.finish_mismatch.is_some());
        }

        /// Any JSON object is a valid call of a function without a schema; any string that
        /// does not parse as JSON (and is not blank) is invalid_json for a declared function.
        #[test]
        fn schemaless_accepts_objects_and_bad_json_is_invalid(key in "[a-z]{1,8}", n in any::<i64>(), junk in ".{1,30}") {
            let set = ToolSet::from_request_tools(&weather_tools());
            let args = json!({ key: n }).to_string();
            prop_assert_eq!(set.classify(&call("now", &args)), CallVerdict::Ok);
            if serde_json::from_str::<Value>(&junk).is_err() && !junk.trim().is_empty() {
                prop_assert_eq!(set.classify(&call("now", &junk)), CallVerdict::InvalidJson);
            }
        }
    }
}
