//! tool_calls: cases that should and should not call a tool are sent to the endpoint's
//! `/v1/chat/completions` with their tools at temperature 0; the reference answers the same
//! chats greedily (rendered with its template and tools, calls parsed as the engine's server
//! parses them). Metrics, as Moonshot's vendor verifier reports them: trigger F1 of the
//! endpoint's call/no-call decisions against the reference's, and schema accuracy — the
//! share of the endpoint's calls whose name is offered and whose arguments are a JSON object
//! with every required parameter and no undeclared one.

use serde_json::{Map, Value, json};

use super::{Outcome, ProbeCtx, Target, call, usage_tokens, window};
use crate::prompts::ToolExpectation;
use crate::reference::SampleRequest;

/// Trigger F1: positives are "called a tool"; 1.0 when neither side ever calls.
pub fn trigger_f1(pairs: &[(bool, bool)]) -> f64 {
    let tp = pairs.iter().filter(|(r, e)| *r && *e).count() as f64;
    let fp = pairs.iter().filter(|(r, e)| !*r && *e).count() as f64;
    let fn_ = pairs.iter().filter(|(r, e)| *r && !*e).count() as f64;
    let d = 2.0 * tp + fp + fn_;
    if d == 0.0 { 1.0 } else { 2.0 * tp / d }
}

/// Whether a call (`name`, JSON-string `arguments`) fits one of `tools`' schemas.
pub fn call_fits_schema(tools: &[Value], name: &str, arguments: &str) -> bool {
    let Some(tool) = tools
        .iter()
        .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
    else {
        return false;
    };
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else {
        return false;
    };
    let params = tool.pointer("/function/parameters");
    let required = params
        .and_then(|p| p.get("required"))
        .and_then(Value::as_array);
    if let Some(req) = required
        && !req
            .iter()
            .filter_map(Value::as_str)
            .all(|r| args.contains_key(r))
    {
        return false;
    }
    match params
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object)
    {
        Some(props) => args.keys().all(|k| props.contains_key(k)),
        None => true,
    }
}

/// Runs one tool_calls probe.
pub async fn run(ctx: &ProbeCtx<'_>, target: &Target) -> Outcome {
    let cases = window(
        &ctx.sets.tool_call_prompts,
        ctx.round,
        ctx.cfg.items_per_round,
    );
    let mut tokens = 0i64;
    let mut pairs = Vec::new();
    let mut calls = 0usize;
    let mut valid = 0usize;
    let mut ep_expected = 0usize;
    let mut ref_expected = 0usize;
    for c in &cases {
        let tools = match ctx.sets.tools.select(&c.tools).and_then(|t| {
            serde_json::to_value(t).map_err(|e| crate::ProbesError::Data(e.to_string()))
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
        let ep_calls: Vec<(String, String)> = answer
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|tc| {
                        let name = tc
                            .pointer("/function/name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        let args = tc
                            .pointer("/function/arguments")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        (name, args)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let prompt = match ctx.reference.render_chat(&messages, Some(&tools)).await {
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
        let ref_text = match ctx.reference.sample(&req).await {
            Ok(mut s) => s.pop().map(|s| s.text).unwrap_or_default(),
            Err(e) => return Outcome::failed(format!("reference failed: {e}"), tokens),
        };
        let ref_called = !samewise_engine::chat::parse_tool_calls(&ref_text)
            .tool_calls
            .is_empty();
        let ep_called = !ep_calls.is_empty();
        pairs.push((ref_called, ep_called));
        let want = c.expect == ToolExpectation::Call;
        ep_expected += usize::from(ep_called == want);
        ref_expected += usize::from(ref_called == want);
        for (name, args) in &ep_calls {
            calls += 1;
            valid += usize::from(call_fits_schema(&tools, name, args));
        }
    }
    let n = cases.len().max(1) as f64;
    let mut stats = Map::new();
    stats.insert(
        "cases".into(),
        json!(cases.iter().map(|c| c.id.clone()).collect::<Vec<_>>()),
    );
    stats.insert("trigger_f1".into(), json!(trigger_f1(&pairs)));
    stats.insert(
        "schema_accuracy".into(),
        if calls == 0 {
            Value::Null
        } else {
            json!(valid as f64 / calls as f64)
        },
    );
    stats.insert("endpoint_calls".into(), json!(calls));
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
