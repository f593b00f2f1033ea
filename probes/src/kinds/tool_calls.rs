//! tool_calls: cases that should and should not call a tool are sent to the endpoint's
//! `/v1/chat/completions` with their tools at temperature 0; the reference answers the same
//! chats greedily (rendered with its template and tools, calls parsed as the engine's server
//! parses them). Metrics, as Moonshot's vendor verifier reports them: trigger F1 of the
//! endpoint's call/no-call decisions against the reference's (null when neither side ever
//! calls: undefined, not perfect), and schema accuracy — the share of the endpoint's calls
//! that the shared checker (`samewise_toolcheck`, the gateway's and the evals' too) finds ok:
//! a declared name and arguments that validate against its JSON Schema.
//!
//! Each case is also judged pass/fail on both sides alike (`passes`, `[reference, endpoint]`
//! per case, in the order of `cases`): a side passes when it calls a tool exactly when the case
//! expects a call and every call it makes is ok. faithful? pairs those outcomes over the
//! endpoint's recent runs (`crate::detect`), so an endpoint whose calls break where the
//! reference's hold is flagged even when no live traffic offers it tools.

use samewise_toolcheck::vendor::{SchemaAccuracy, trigger_f1};
use samewise_toolcheck::{CallVerdict, ToolCall, ToolSet};
use serde_json::{Map, Value, json};

use super::{Outcome, ProbeCtx, Target, call, usage_tokens, window};
use crate::prompts::ToolExpectation;
use crate::reference::{Reference, SampleRequest};

/// Runs one tool_calls probe.
pub async fn run(ctx: &ProbeCtx<'_>, backend: &dyn Reference, target: &Target) -> Outcome {
    let cases = window(
        &ctx.sets.tool_call_prompts,
        ctx.round,
        ctx.cfg.items_per_round,
    );
    let mut tokens = 0i64;
    let mut pairs = Vec::new();
    let mut accuracy = SchemaAccuracy::default();
    let mut ref_accuracy = SchemaAccuracy::default();
    let mut passes = Vec::new();
    let mut ep_expected = 0usize;
    let mut ref_expected = 0usize;
    for c in &cases {
        let tools = match ctx.sets.tools.select(&c.tools).and_then(|t| {
            serde_json::to_value(t).map_err(|source| crate::ProbesError::DataJson {
                context: "tool definitions".into(),
                source,
            })
        }) {
            Ok(Value::Array(t)) => t,
            Ok(_) => return Outcome::failed("tool definitions are not a list", tokens),
            Err(e) => return Outcome::failed(e.to_string(), tokens),
        };
        let messages: Vec<Value> = match c.messages.iter().map(serde_json::to_value).collect() {
            Ok(m) => m,
            Err(e) => return Outcome::failed(format!("case {}: {e}", c.id), tokens),
        };
        let body = json!({"model": target.provider_model, "messages": messages, "tools": tools, "temperature": 0.0,
                          "max_tokens": ctx.cfg.max_tokens, "seed": ctx.seed});
        let answer = match call(ctx, target, "/chat/completions", &body).await {
            Ok(v) => v,
            Err(e) => return Outcome::failed(e.message, tokens),
        };
        tokens += usage_tokens(&answer);
        let tool_set = ToolSet::from_request_tools(&Value::Array(tools.clone()));
        let ep_calls: Vec<ToolCall> = answer
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .enumerate()
                    .map(|(i, tc)| ToolCall {
                        index: u32::try_from(i).unwrap_or(u32::MAX),
                        id: None,
                        name: tc
                            .pointer("/function/name")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        arguments: tc
                            .pointer("/function/arguments")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let prompt = match backend.render_chat(&messages, Some(&tools)).await {
            Ok(p) => p,
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let req = SampleRequest {
            prompt,
            n: 1,
            max_tokens: ctx.cfg.max_tokens as usize,
            temperature: 0.0,
            seed: ctx.seed,
        };
        let ref_text = match backend.sample(&req).await {
            Ok(mut s) => s.pop().map(|s| s.text).unwrap_or_default(),
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let ref_calls: Vec<ToolCall> = samewise_engine::chat::parse_tool_calls(&ref_text)
            .tool_calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                index: u32::try_from(i).unwrap_or(u32::MAX),
                id: None,
                name: Some(c.name),
                arguments: c.arguments,
            })
            .collect();
        let (ref_called, ep_called) = (!ref_calls.is_empty(), !ep_calls.is_empty());
        pairs.push((ref_called, ep_called));
        let want = c.expect == ToolExpectation::Call;
        ep_expected += usize::from(ep_called == want);
        ref_expected += usize::from(ref_called == want);
        let pass = |calls: &[ToolCall]| {
            calls.is_empty() != want
                && calls
                    .iter()
                    .all(|call| tool_set.classify(call) == CallVerdict::Ok)
        };
        passes.push([pass(&ref_calls), pass(&ep_calls)]);
        accuracy.add(&tool_set, &ep_calls);
        ref_accuracy.add(&tool_set, &ref_calls);
    }
    let n = cases.len().max(1) as f64;
    let mut stats = Map::new();
    stats.insert(
        "cases".into(),
        json!(cases.iter().map(|c| c.id.clone()).collect::<Vec<_>>()),
    );
    stats.insert("trigger_f1".into(), json!(trigger_f1(&pairs)));
    stats.insert("schema_accuracy".into(), json!(accuracy.rate()));
    stats.insert("endpoint_calls".into(), json!(accuracy.calls));
    stats.insert(
        "reference_schema_accuracy".into(),
        json!(ref_accuracy.rate()),
    );
    stats.insert("reference_calls".into(), json!(ref_accuracy.calls));
    stats.insert("passes".into(), json!(passes));
    stats.insert(
        "endpoint_triggers".into(),
        json!(pairs.iter().filter(|p| p.1).count()),
    );
    stats.insert(
        "reference_triggers".into(),
        json!(pairs.iter().filter(|p| p.0).count()),
    );
    stats.insert(
        "endpoint_expected_rate".into(),
        json!(ep_expected as f64 / n),
    );
    stats.insert(
        "reference_expected_rate".into(),
        json!(ref_expected as f64 / n),
    );
    Outcome::done(tokens, stats)
}
