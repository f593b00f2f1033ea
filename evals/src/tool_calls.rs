//! The `tool_calls` suite: items authored in this repo (`data/tool_calls.json`), each a
//! question with the tools offered and BFCL-style ground truth, asked after a few-shot
//! dialog that teaches the answer format. Call items send `tool_choice: "required"`,
//! irrelevance items `"auto"`. An answer is scored by [`samewise_toolcheck::bfcl::check`];
//! over the job, K2-Vendor-Verifier's trigger F1 (finish reason `tool_calls` on the suspect
//! vs the baseline) and schema accuracy (the suspect's calls valid for their schema).

use samewise_store::EvalResult;
use samewise_toolcheck::bfcl::{self, ActualCall, Category, ExpectedCall};
use samewise_toolcheck::vendor::{SchemaAccuracy, trigger_f1};
use samewise_toolcheck::{ToolCall, ToolSet};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EvalsError;
use crate::target::{Target, Targets};

const DATA: &str = include_str!("../data/tool_calls.json");

#[derive(Debug, Clone, Deserialize)]
struct Doc {
    tools: Vec<Value>,
    few_shot: Vec<Value>,
    items: Vec<RawItem>,
}

#[derive(Debug, Clone, Deserialize)]
struct RawItem {
    id: String,
    category: String,
    tools: Vec<String>,
    prompt: String,
    expected: Vec<RawExpected>,
}

#[derive(Debug, Clone, Deserialize)]
struct RawExpected {
    name: String,
    args: serde_json::Map<String, Value>,
}

/// One item, ready to send.
#[derive(Debug, Clone)]
pub struct Item {
    /// Unique within the suite.
    pub id: String,
    /// BFCL category.
    pub category: Category,
    /// The offered tools (OpenAI form).
    pub tools: Vec<Value>,
    /// The chat request (without `model`).
    pub request: Value,
    /// Ground truth.
    pub expected: Vec<ExpectedCall>,
}

/// The suite's items, from the shipped data file.
pub fn items() -> Result<Vec<Item>, EvalsError> {
    let doc: Doc = serde_json::from_str(DATA)
        .map_err(|e| EvalsError::Suite(format!("tool_calls.json: {e}")))?;
    let mut out = Vec::with_capacity(doc.items.len());
    for it in doc.items {
        let category = Category::parse(&it.category).ok_or_else(|| {
            EvalsError::Suite(format!(
                "item {}: unknown category {:?}",
                it.id, it.category
            ))
        })?;
        let mut tools = Vec::new();
        for name in &it.tools {
            let t = doc
                .tools
                .iter()
                .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
                .ok_or_else(|| EvalsError::Suite(format!("item {}: no tool {name:?}", it.id)))?;
            tools.push(t.clone());
        }
        let mut messages = doc.few_shot.clone();
        messages.push(json!({"role": "user", "content": it.prompt}));
        let tool_choice = if category == Category::Irrelevance {
            "auto"
        } else {
            "required"
        };
        let request = json!({
            "messages": messages,
            "tools": tools,
            "tool_choice": tool_choice,
            "temperature": 0,
            "max_tokens": 96,
        });
        out.push(Item {
            id: it.id,
            category,
            tools,
            request,
            expected: it
                .expected
                .into_iter()
                .map(|e| ExpectedCall {
                    name: e.name,
                    args: e.args,
                })
                .collect(),
        });
    }
    Ok(out)
}

/// An endpoint's answer to a chat request, taken apart: the message, its finish reason, its
/// tool calls, the tokens spent, or the request's error (shared by every chat suite).
#[derive(Debug, Clone)]
pub(crate) struct Answered {
    /// `choices[0].message` (null when the request failed).
    pub message: Value,
    /// `choices[0].finish_reason`.
    pub finish: Option<String>,
    /// prompt + completion tokens.
    pub tokens: i64,
    /// Why the request failed, when it did.
    pub request_error: Option<String>,
    /// The message's tool calls.
    pub calls: Vec<ActualCall>,
}

impl Answered {
    /// Takes `answer` apart.
    pub fn of(answer: Result<crate::target::Answer, EvalsError>) -> Answered {
        let (message, finish, tokens, request_error) = match &answer {
            Ok(a) => (
                a.body
                    .pointer("/choices/0/message")
                    .cloned()
                    .unwrap_or(Value::Null),
                a.body
                    .pointer("/choices/0/finish_reason")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                a.tokens,
                None,
            ),
            Err(e) => (Value::Null, None, 0, Some(e.to_string())),
        };
        let calls = ActualCall::of_message(&message);
        Answered {
            message,
            finish,
            tokens,
            request_error,
            calls,
        }
    }

    /// The calls as a record stores them.
    pub fn calls_json(&self) -> Vec<Value> {
        self.calls
            .iter()
            .map(|c| json!({"name": c.name, "arguments": c.arguments}))
            .collect()
    }
}

/// Asks `target` item `item` and scores the answer. A failed request is a failed item
/// (`request_error`), recorded with the error.
pub async fn run(targets: &Targets, target: &Target, role: &str, item: &Item) -> EvalResult {
    let answer = targets
        .post(target, "chat/completions", item.request.clone())
        .await;
    let a = Answered::of(answer);
    let checked = match &a.request_error {
        Some(e) => Err(("request_error".to_owned(), e.clone())),
        None => bfcl::check(item.category, &item.tools, &item.expected, &a.calls)
            .map_err(|f| (f.error.as_str().to_owned(), f.detail)),
    };
    let (passed, error_type, detail) = match checked {
        Ok(()) => (true, None, None),
        Err((t, d)) => (false, Some(t), Some(d)),
    };
    EvalResult {
        item: item.id.clone(),
        target: role.to_owned(),
        passed,
        error_type: error_type.clone(),
        tokens: a.tokens,
        record: json!({
            "request": item.request,
            "endpoint": target.label,
            "category": item.category.as_str(),
            "answer": a.message,
            "finish_reason": a.finish,
            "calls": a.calls_json(),
            "check": {"passed": passed, "error_type": error_type, "detail": detail},
        }),
    }
}

/// The calls a result's record holds (name and arguments).
fn record_calls(record: &Value) -> Vec<ToolCall> {
    record["calls"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| ToolCall {
                    name: c["name"].as_str().map(str::to_owned),
                    arguments: c["arguments"].as_str().unwrap_or("").to_owned(),
                    ..ToolCall::default()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether every call in a result's record names a declared tool and has arguments valid
/// for its schema (K2-Vendor-Verifier's schema check, item by item). None when the request
/// offered no tools, the request failed, or the answer made no call: an answer without
/// calls has no schema to check (whether it should have called is the check's and trigger
/// F1's question), so the schema table pairs only items on which both sides called, and its
/// rates are rates of calling answers, as K2-Vendor-Verifier's schema accuracy is a rate of
/// calls.
pub fn schema_valid(record: &Value) -> Option<bool> {
    let tools = record.pointer("/request/tools")?;
    if tools.as_array().is_none_or(Vec::is_empty) || record["answer"].is_null() {
        return None;
    }
    let calls = record_calls(record);
    if calls.is_empty() {
        return None;
    }
    let set = ToolSet::from_request_tools(tools);
    let mut acc = SchemaAccuracy::default();
    acc.add(&set, &calls);
    Some(acc.valid == acc.calls)
}

/// Trigger F1 and schema accuracy over the items both sides answered.
pub fn extras(items: &[Item], results: &[EvalResult]) -> Value {
    let find = |id: &str, role: &str| results.iter().find(|r| r.item == id && r.target == role);
    let called = |r: &EvalResult| r.record["finish_reason"] == "tool_calls";
    let mut pairs = Vec::new();
    let mut schema = SchemaAccuracy::default();
    let mut schema_base = SchemaAccuracy::default();
    for it in items {
        let (Some(s), Some(b)) = (find(&it.id, "suspect"), find(&it.id, "baseline")) else {
            continue;
        };
        pairs.push((called(b), called(s)));
        let set = ToolSet::from_request_tools(&Value::Array(it.tools.clone()));
        for (r, acc) in [(s, &mut schema), (b, &mut schema_base)] {
            acc.add(&set, &record_calls(&r.record));
        }
    }
    let f1 = trigger_f1(&pairs);
    json!({
        "trigger_f1": f1.map_or(json!("n/a"), |v| json!(v)),
        "schema_accuracy": {
            "suspect": schema.rate().map_or(json!("n/a"), |v| json!(v)),
            "suspect_calls": schema.calls,
            "baseline": schema_base.rate().map_or(json!("n/a"), |v| json!(v)),
            "baseline_calls": schema_base.calls,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_validity_is_per_item_and_absent_without_calls() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}]);
        let record = |calls: Value| json!({"request": {"tools": tools}, "answer": {"role": "assistant"}, "calls": calls});
        let call = |name: &str, args: &str| json!({"name": name, "arguments": args});
        assert_eq!(
            schema_valid(&record(json!([call("f", r#"{"n":1}"#)]))),
            Some(true)
        );
        // no call has no schema to check (irrelevance items): not counted
        assert_eq!(schema_valid(&record(json!([]))), None);
        // one bad call of two spoils the item
        let two = json!([call("f", r#"{"n":1}"#), call("f", r#"{"n":"#)]);
        assert_eq!(schema_valid(&record(two)), Some(false));
        assert_eq!(schema_valid(&record(json!([call("g", "{}")]))), Some(false));
        assert_eq!(schema_valid(&record(json!([call("f", "{}")]))), Some(false));
        assert_eq!(
            schema_valid(&record(json!([call("f", r#"{"n":true}"#)]))),
            Some(false)
        );
        // no tools offered, or no answer (a failed request): not counted
        assert_eq!(
            schema_valid(&json!({"request": {}, "answer": {}, "calls": []})),
            None
        );
        let mut failed = record(json!([]));
        failed["answer"] = Value::Null;
        assert_eq!(schema_valid(&failed), None);
    }

    /// The suite reads an answer's calls as the gateway's records and the probes do: an
    /// `arguments` sent as a JSON object is that object's text (scored on its content, not
    /// emptied into a failure), a missing name or arguments is "".
    #[test]
    fn answers_are_read_as_the_gateway_reads_them() {
        let answer = json!({"choices": [{"finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"n\":1}"}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": {"n": 2}}},
                {"id": "c", "type": "function", "function": {}}]}}],
            "usage": {"total_tokens": 9}});
        let a = Answered::of(Ok(crate::target::Answer {
            body: answer.clone(),
            tokens: 9,
        }));
        let read: Vec<(&str, &str)> = a
            .calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(read, [("f", r#"{"n":1}"#), ("f", r#"{"n":2}"#), ("", "")]);
        assert_eq!(a.finish.as_deref(), Some("tool_calls"));
        let gateway: Vec<String> =
            samewise_toolcheck::ToolCall::of_message(&answer["choices"][0]["message"])
                .into_iter()
                .map(|c| c.arguments)
                .collect();
        assert_eq!(
            gateway,
            a.calls
                .iter()
                .map(|c| c.arguments.clone())
                .collect::<Vec<_>>()
        );
        let failed = Answered::of(Err(EvalsError::UnknownTarget("down".into())));
        assert!(failed.calls.is_empty() && failed.request_error.is_some());
    }

    #[test]
    fn the_shipped_items_load_and_their_ground_truth_passes_itself() {
        let items = items().unwrap_or_default();
        assert!(items.len() >= 20, "{}", items.len());
        let mut ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), items.len(), "duplicate item ids");
        for it in &items {
            // the first allowed value of each expected parameter is a passing answer
            let calls: Vec<ActualCall> = it
                .expected
                .iter()
                .map(|e| {
                    let args: serde_json::Map<String, Value> = e
                        .args
                        .iter()
                        .filter_map(|(k, v)| {
                            let first = v.as_array()?.first()?.clone();
                            (first != "").then(|| (k.clone(), first))
                        })
                        .collect();
                    ActualCall {
                        name: e.name.clone(),
                        arguments: Value::Object(args).to_string(),
                    }
                })
                .collect();
            assert_eq!(
                bfcl::check(it.category, &it.tools, &it.expected, &calls),
                Ok(()),
                "{}",
                it.id
            );
            let want = if it.category == Category::Irrelevance {
                "auto"
            } else {
                "required"
            };
            assert_eq!(it.request["tool_choice"], want);
        }
    }
}
