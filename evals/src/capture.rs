//! `samewise evals capture`: flagged traffic → regression cases.
//!
//! The captured bodies (opt-in per model, kept by the gateway for flagged requests: degenerate
//! cuts, tool-call errors, upstream errors, and a sample when configured) of one request, or of
//! an alert's endpoint in a window around the alert, are replayed on the *baseline* (the
//! reference engine by default, or a named healthy endpoint) at temperature 0; its answer is
//! the expectation, and each case gets the check that fits the request:
//! - `tools` offered → a `tool_call` check (BFCL's rules): the baseline's calls, each argument
//!   allowed exactly the baseline's value; no call by the baseline → "no call" (irrelevance),
//!   unless the request forces one (`tool_choice` "required" or a named function: then the
//!   request is skipped — the baseline itself failed it);
//! - `response_format` `json_schema` → a `json_schema` check with the request's own schema
//!   (`json_object` → any JSON object);
//! - otherwise the text, as greedy decoding gives it: `exact` when the baseline finished
//!   (`stop`) within [`EXACT_MAX_CHARS`] characters, else `contains` of its first line's first
//!   [`PREFIX_CHARS`] characters (a faithful but not bit-identical endpoint agrees on the start
//!   of a greedy answer long before it agrees on all of it, so a long exact match would count
//!   its numeric noise as regressions).
//!
//! Only chat requests become cases (a customer-suite item is a chat request). Cases are stored
//! per model and suite (`regression`, or `regression-NAME`), one per source request; a job of
//! that suite runs them (`Opener` snapshots them into the job).

use std::sync::Arc;

use samewise_store::{BodyQuery, CapturedBody, RegressionCase, Store};
use samewise_toolcheck::bfcl::ActualCall;
use serde_json::{Map, Value, json};

use crate::EvalsError;
use crate::config::is_regression;
use crate::custom::{self, DEFAULT_MAX_TOKENS, MAX_TOKENS, REQUEST_FIELDS};
use crate::target::{REFERENCE, Targets};

/// Longest baseline answer (characters) checked by `exact`.
pub const EXACT_MAX_CHARS: usize = 64;
/// Characters of a longer answer's first line checked by `contains`.
pub const PREFIX_CHARS: usize = 48;
/// Default half-width of the window around an alert: 30 minutes.
pub const DEFAULT_WINDOW_MS: i64 = 30 * 60 * 1000;
/// Most captured requests one `--alert` capture reads.
pub const MAX_BODIES: u32 = 500;

/// Which traffic to turn into cases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureSource {
    /// One request, by id.
    Request(String),
    /// The flagged requests of an alert's endpoint from `window_ms` before it opened to
    /// `window_ms` after it was last seen.
    Alert {
        /// The alert.
        id: i64,
        /// Half-width of the window.
        window_ms: i64,
    },
}

/// What one capture did, per source request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CaptureReport {
    /// Cases stored: (case id, source request id, check kind).
    pub made: Vec<(i64, String, String)>,
    /// Requests that made no case, and why.
    pub skipped: Vec<(String, String)>,
}

/// Turns captured bodies into regression cases.
#[derive(Debug, Clone)]
pub struct Capturer {
    store: Store,
    targets: Arc<Targets>,
}

impl Capturer {
    /// A capturer reading bodies from `store` and replaying them through `targets`.
    pub fn new(store: Store, targets: Arc<Targets>) -> Capturer {
        Capturer { store, targets }
    }

    /// Makes cases of `suite` (`regression` or `regression-NAME`) from `source`, the
    /// expectation from `baseline` (None: "reference").
    pub async fn capture(
        &self,
        source: &CaptureSource,
        suite: &str,
        baseline: Option<&str>,
    ) -> Result<CaptureReport, EvalsError> {
        if !is_regression(suite) {
            return Err(EvalsError::UnknownSuite {
                name: suite.to_owned(),
                known: "regression, regression-NAME (a-z, 0-9, '_', '-')".to_owned(),
            });
        }
        let baseline = self.targets.get(baseline.unwrap_or(REFERENCE)).map_err(|_| {
            EvalsError::UnknownBaseline(format!(
                "unknown baseline {:?} (\"reference\" with a reference URL, or a configured endpoint: {})",
                baseline.unwrap_or(REFERENCE),
                self.targets.labels().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let now = samewise_store::now_ms();
        let (bodies, alert_id) = match source {
            CaptureSource::Request(id) => {
                let b = self.store.captured_body(id, now).await?.ok_or_else(|| {
                    EvalsError::Suite(format!(
                        "no captured body for request {id:?} (capture is off for its model, the \
                         request was not flagged, or its body expired or was purged)"
                    ))
                })?;
                (vec![b], None)
            }
            CaptureSource::Alert { id, window_ms } => {
                let a = self
                    .store
                    .alert(*id)
                    .await?
                    .ok_or_else(|| EvalsError::Suite(format!("no alert {id}")))?;
                let q = BodyQuery {
                    model: Some(a.model.clone()),
                    endpoint: Some(a.endpoint.clone()),
                    since_ms: Some(a.opened_ms.saturating_sub(*window_ms)),
                    until_ms: Some(a.last_seen_ms.saturating_add(*window_ms)),
                    limit: MAX_BODIES,
                };
                let mut bodies = self.store.captured_bodies(&q, now).await?;
                bodies.reverse(); // oldest first: cases in the order traffic came
                (bodies, Some(*id))
            }
        };
        let mut report = CaptureReport::default();
        // requests already made into cases of this suite are not replayed again
        let mut known: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            Default::default();
        for b in &bodies {
            if !known.contains_key(&b.model) {
                let ids = self.store.regression_cases(&b.model, suite).await?;
                known.insert(
                    b.model.clone(),
                    ids.into_iter().map(|c| c.source_request_id).collect(),
                );
            }
            if known
                .get(&b.model)
                .is_some_and(|ids| ids.contains(&b.request_id))
            {
                report.skipped.push((
                    b.request_id.clone(),
                    "already a case of this suite".to_owned(),
                ));
                continue;
            }
            match self.case(b, suite, baseline, alert_id).await {
                Ok(Some((id, kind))) => report.made.push((id, b.request_id.clone(), kind)),
                Ok(None) => report.skipped.push((
                    b.request_id.clone(),
                    "already a case of this suite".to_owned(),
                )),
                Err(CaseError::Skip(why)) => report.skipped.push((b.request_id.clone(), why)),
                Err(CaseError::Store(e)) => return Err(e.into()),
            }
        }
        Ok(report)
    }

    /// One case from `b`: replayed on `baseline`, checked per the rules, stored.
    async fn case(
        &self,
        b: &CapturedBody,
        suite: &str,
        baseline: &crate::target::Target,
        alert_id: Option<i64>,
    ) -> Result<Option<(i64, String)>, CaseError> {
        if b.route != "chat" {
            return Err(CaseError::Skip(format!(
                "a {} request (only chat requests become cases)",
                b.route
            )));
        }
        let request = case_request(&b.request)?;
        let (sent, _tools) = custom::request("captured", &request).map_err(CaseError::Skip)?;
        let answer = self
            .targets
            .post(baseline, "chat/completions", sent)
            .await
            .map_err(|e| CaseError::Skip(format!("the baseline failed: {e}")))?;
        let check = check_for(&request, &answer.body)?;
        let kind = check["kind"].as_str().unwrap_or("?").to_owned();
        let item = json!({
            "id": format!("case-{}", b.request_id),
            "request": request,
            "check": check,
        });
        // the item must load as any suite item does
        custom::from_sources(std::slice::from_ref(&item))
            .map_err(|e| CaseError::Skip(format!("not a valid case: {e}")))?;
        let case = RegressionCase {
            id: 0,
            model: b.model.clone(),
            suite: suite.to_owned(),
            source_request_id: b.request_id.clone(),
            endpoint: b.endpoint.clone(),
            alert_id,
            item,
            created_ms: samewise_store::now_ms(),
        };
        let id = self
            .store
            .insert_regression_case(&case)
            .await
            .map_err(CaseError::Store)?;
        Ok(id.map(|id| (id, kind)))
    }
}

/// Why a body made no case.
enum CaseError {
    /// The body does not fit (the reason, for the report).
    Skip(String),
    /// The store failed: the capture stops.
    Store(samewise_store::StoreError),
}

/// The case's request: the captured body's item fields only (`stream`, sampling and the like
/// are dropped: cases run greedily), `max_tokens` from `max_tokens` or
/// `max_completion_tokens`, within the suite's bound.
fn case_request(body: &Value) -> Result<Value, CaseError> {
    let obj = body
        .as_object()
        .ok_or_else(|| CaseError::Skip("the body is not a JSON object".to_owned()))?;
    let mut out = Map::new();
    for k in REQUEST_FIELDS {
        if let Some(v) = obj.get(*k).filter(|v| !v.is_null()) {
            out.insert((*k).to_owned(), v.clone());
        }
    }
    let max = obj
        .get("max_tokens")
        .or_else(|| obj.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_MAX_TOKENS)
        .clamp(1, MAX_TOKENS);
    out.insert("max_tokens".to_owned(), max.into());
    Ok(Value::Object(out))
}

/// The check of a case, from its request and the baseline's answer (the module's rules).
fn check_for(request: &Value, answer: &Value) -> Result<Value, CaseError> {
    let skip = |s: &str| Err(CaseError::Skip(s.to_owned()));
    let message = answer.pointer("/choices/0/message").unwrap_or(&Value::Null);
    let finish = answer
        .pointer("/choices/0/finish_reason")
        .and_then(Value::as_str);
    let tools = request
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if tools {
        let calls = ActualCall::of_message(message);
        let forced = match request.get("tool_choice") {
            Some(Value::String(s)) => s == "required",
            Some(Value::Object(_)) => true,
            _ => false,
        };
        if calls.is_empty() && forced {
            return skip("the baseline made no tool call where the request forces one");
        }
        let mut expected = Vec::with_capacity(calls.len());
        for c in &calls {
            let args = serde_json::from_str::<Value>(&c.arguments).ok();
            let (false, Some(Value::Object(args))) = (c.name.is_empty(), args) else {
                return skip("the baseline's own tool call is not a name with a JSON object");
            };
            let allowed: Map<String, Value> =
                args.into_iter().map(|(k, v)| (k, json!([v]))).collect();
            expected.push(json!({"name": c.name, "arguments": allowed}));
        }
        return Ok(json!({"kind": "tool_call", "calls": expected}));
    }
    if let Some(rf) = request.get("response_format") {
        match rf.get("type").and_then(Value::as_str) {
            Some("json_schema") => {
                if let Some(s) = rf.pointer("/json_schema/schema") {
                    return Ok(json!({"kind": "json_schema", "schema": s}));
                }
            }
            Some("json_object") => {
                return Ok(json!({"kind": "json_schema", "schema": {"type": "object"}}));
            }
            _ => {}
        }
    }
    let text = message
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .trim();
    if text.is_empty() {
        return skip("the baseline answered no text to check against");
    }
    if finish == Some("stop") && text.chars().count() <= EXACT_MAX_CHARS {
        return Ok(json!({"kind": "exact", "value": text}));
    }
    let first = text.lines().next().unwrap_or("").trim();
    let prefix: String = first.chars().take(PREFIX_CHARS).collect();
    let prefix = prefix.trim();
    if prefix.is_empty() {
        return skip("the baseline's answer starts with no text to check against");
    }
    Ok(json!({"kind": "contains", "value": prefix}))
}

/// The items of `model`'s regression suite `suite` as a job stores them.
pub async fn items(store: &Store, model: &str, suite: &str) -> Result<Vec<Value>, EvalsError> {
    Ok(store
        .regression_cases(model, suite)
        .await?
        .into_iter()
        .map(|c| c.item)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(message: Value, finish: &str) -> Value {
        json!({"choices": [{"message": message, "finish_reason": finish}]})
    }

    fn kind(r: &Result<Value, CaseError>) -> String {
        match r {
            Ok(c) => c["kind"].as_str().unwrap_or("?").to_owned(),
            Err(CaseError::Skip(why)) => format!("skip: {why}"),
            Err(CaseError::Store(e)) => format!("store: {e}"),
        }
    }

    #[test]
    fn the_check_follows_the_request_and_the_baseline() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let call = json!({"tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Oslo\", \"n\": 2}"}}]});
        let req = json!({"messages": [], "tools": tools, "tool_choice": "required"});
        let c = check_for(&req, &answer(call, "tool_calls"));
        assert_eq!(kind(&c), "tool_call");
        assert_eq!(
            c.ok().map(|c| c["calls"][0]["arguments"].clone()),
            Some(json!({"city": ["Oslo"], "n": [2]}))
        );
        // arguments sent as an object are read as the gateway reads them, as their JSON text
        let object = json!({"tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"city": "Oslo"}}}]});
        let c = check_for(&req, &answer(object, "tool_calls"));
        assert_eq!(
            c.ok().map(|c| c["calls"][0]["arguments"].clone()),
            Some(json!({"city": ["Oslo"]}))
        );
        let nameless =
            json!({"tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]});
        assert!(
            kind(&check_for(&req, &answer(nameless, "tool_calls")))
                .starts_with("skip: the baseline's own tool call")
        );
        let none = answer(json!({"content": "no"}), "stop");
        assert!(kind(&check_for(&req, &none)).starts_with("skip: the baseline made no tool call"));
        let auto = json!({"messages": [], "tools": tools});
        let c = check_for(&auto, &none);
        assert_eq!(c.ok().map(|c| c["calls"].clone()), Some(json!([])));
        let schema = json!({"type": "object", "required": ["a"]});
        let js = json!({"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}});
        assert_eq!(kind(&check_for(&js, &none)), "json_schema");
        let short = answer(json!({"content": " Paris. "}), "stop");
        let c = check_for(&json!({"messages": []}), &short);
        assert_eq!(c.ok().map(|c| c["value"].clone()), Some(json!("Paris.")));
        let long_text = format!("{}\nmore", "word ".repeat(30));
        let long = answer(json!({ "content": long_text }), "length");
        let c = check_for(&json!({"messages": []}), &long);
        let v = c.ok().map(|c| (c["kind"].clone(), c["value"].clone()));
        let want: String = "word ".repeat(30).chars().take(PREFIX_CHARS).collect();
        assert_eq!(v, Some((json!("contains"), json!(want.trim()))));
        let cut = answer(json!({"content": "Paris"}), "length");
        assert_eq!(kind(&check_for(&json!({"messages": []}), &cut)), "contains");
        let empty = answer(json!({"content": "  "}), "stop");
        assert!(kind(&check_for(&json!({"messages": []}), &empty)).starts_with("skip"));
    }

    #[test]
    fn the_request_keeps_only_item_fields() {
        let body = json!({"model": "m", "stream": true, "temperature": 0.7, "messages": [{"role": "user", "content": "hi"}],
                          "max_completion_tokens": 99999, "api_key": "[redacted]", "tool_choice": null});
        let r = case_request(&body).ok();
        assert_eq!(
            r,
            Some(
                json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS})
            )
        );
    }
}
