//! tool_calls: cases that should and should not call a tool are sent to the endpoint's
//! `/v1/chat/completions` with their tools at temperature 0, and to the reference as the same
//! greedy chat ([`Reference::tool_calls`]). Cases that expect a call are sent with
//! `tool_choice: "required"` to both (unless the model's `force_tool_calls` is off): both must
//! answer with calls, the reference's held to the tools' schemas by constrained decoding, so
//! the test is whether the endpoint's calls are valid too — small models rarely call a tool
//! unprompted, and without forcing there would be no calls to compare. Cases that expect no
//! call are sent `"auto"`. Metrics, as Moonshot's vendor verifier reports them: trigger F1 of
//! the endpoint's call/no-call decisions against the reference's (null when neither side ever
//! calls: undefined, not perfect), and schema accuracy — the share of the endpoint's calls
//! that the shared checker (`samewise_toolcheck`, the gateway's and the evals' too) finds ok:
//! a declared name and arguments that validate against its JSON Schema.
//!
//! Each case is also judged pass/fail on both sides alike (`passes`, `[reference, endpoint]`
//! per case, in the order of `cases`): a side passes when it calls a tool exactly when the case
//! expects a call and every call it makes is ok; `faults`, aligned the same way, says why a side
//! failed (null where it passed; see `case_fault`). faithful? pairs those outcomes over the
//! endpoint's recent runs (`crate::detect`), so an endpoint whose calls break where the
//! reference's hold is flagged even when no live traffic offers it tools.

use samewise_toolcheck::vendor::{SchemaAccuracy, trigger_f1};
use samewise_toolcheck::{CallVerdict, ToolCall, ToolSet};
use serde_json::{Map, Value, json};

use super::{Outcome, ProbeCtx, Target, call, usage_tokens, window};
use crate::prompts::ToolExpectation;
use crate::reference::{Reference, ToolCallRequest, tool_chat_body};

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
    let mut why = Vec::new();
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
        let want = c.expect == ToolExpectation::Call;
        let req = ToolCallRequest {
            messages,
            tools,
            forced: want && ctx.cfg.force_tool_calls,
            max_tokens: ctx.cfg.max_tokens as usize,
            seed: ctx.seed,
        };
        let mut body = tool_chat_body(&req);
        body["model"] = target.provider_model.clone().into();
        let answer = match call(ctx, target, "/chat/completions", &body).await {
            Ok(v) => v,
            Err(e) => return Outcome::failed(e.message, tokens),
        };
        tokens += usage_tokens(&answer);
        let tool_set = ToolSet::from_request_tools(&Value::Array(req.tools.clone()));
        let ep_calls = answer
            .pointer("/choices/0/message")
            .map(ToolCall::of_message)
            .unwrap_or_default();
        let ref_calls = match backend.tool_calls(&req).await {
            Ok(calls) => calls,
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let (ref_called, ep_called) = (!ref_calls.is_empty(), !ep_calls.is_empty());
        pairs.push((ref_called, ep_called));
        ep_expected += usize::from(ep_called == want);
        ref_expected += usize::from(ref_called == want);
        let fault = |calls: &[ToolCall]| case_fault(&tool_set, want, calls);
        let faults = [fault(&ref_calls), fault(&ep_calls)];
        passes.push(faults.map(|f| f.is_none()));
        why.push(faults);
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
    stats.insert("faults".into(), json!(why));
    stats.insert("forced_calls".into(), json!(ctx.cfg.force_tool_calls));
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

/// Why a side failed a case, None when it passed: `no_call` (the case expects a call),
/// `unexpected_call` (it expects none), else the first call that is not ok, by its verdict
/// (`invalid_json`, `unknown_name`, `schema_mismatch`).
fn case_fault(tools: &ToolSet, want: bool, calls: &[ToolCall]) -> Option<&'static str> {
    match (want, calls.is_empty()) {
        (true, true) => Some("no_call"),
        (false, false) => Some("unexpected_call"),
        (false, true) => None,
        (true, false) => calls
            .iter()
            .map(|call| tools.classify(call))
            .find(|v| *v != CallVerdict::Ok)
            .map(CallVerdict::as_str),
    }
}
