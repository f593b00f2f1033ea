//! Constrained chat output: `tool_choice` (`"none"`, `"auto"`, `"required"`, a named
//! function), `parallel_tool_calls` and `response_format` (`text`, `json_object`,
//! `json_schema`) read from a chat request and turned into a [`Constraint`]. Forced calls are
//! read back out of the constrained text with [`crate::constrain::ToolSplitter`].
//!
//! `"auto"` stays free (the model may or may not call); `"required"` and a named function
//! compile the declared functions' parameter schemas into a tool-call grammar. A forced call
//! wins over `response_format`. Schemas the compiler refuses are a 400 naming the keyword
//! (code `invalid_schema`).

use std::sync::Arc;

use samewise_wire::Extra;
use serde_json::Value;

use crate::constrain::{Constraint, SchemaError, Spec, TokenTrie};

use super::{ApiError, ServerState, extra_bool};

/// What a chat request's tool and format fields ask of the output.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The constraint, when the output is constrained.
    pub constraint: Option<Constraint>,
    /// The output is forced tool calls (read with [`ToolSplitter`]).
    pub forced_tools: bool,
    /// Tools are off (`tool_choice: "none"`): not rendered, not parsed.
    pub tools_off: bool,
    /// `parallel_tool_calls` (default true): false allows at most one call, by the grammar
    /// when calls are forced, else by keeping the first call parsed (as vLLM does).
    pub parallel: bool,
}

/// Reads `tool_choice`, `parallel_tool_calls` and `response_format`; `tools` are the
/// request's tool definitions (OpenAI-shaped JSON).
pub(crate) fn plan(
    state: &ServerState,
    tools: &[Value],
    tool_choice: Option<&Value>,
    extra: &Extra,
) -> Result<Plan, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m, Some("tool_choice"));
    let parallel = extra_bool(extra, "parallel_tool_calls")?.unwrap_or(true);
    let names: Vec<&str> = tools
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .collect();
    let forced: Option<Vec<&str>> = match tool_choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match s.as_str() {
            "none" => {
                return Ok(Plan {
                    constraint: json_constraint(state, extra)?,
                    forced_tools: false,
                    tools_off: true,
                    parallel,
                });
            }
            "auto" => None,
            "required" if tools.is_empty() => {
                return Err(bad("tool_choice \"required\" needs tools"));
            }
            "required" => Some(names.clone()),
            _ => {
                return Err(bad(
                    "tool_choice must be \"none\", \"auto\", \"required\" or a named function",
                ));
            }
        },
        Some(v) => {
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| bad("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}"))?;
            if !names.contains(&name) {
                return Err(bad(&format!(
                    "tool_choice names {name:?}, which is not among the tools"
                )));
            }
            Some(vec![name])
        }
    };
    let Some(forced) = forced else {
        return Ok(Plan {
            constraint: json_constraint(state, extra)?,
            forced_tools: false,
            tools_off: false,
            parallel,
        });
    };
    let spec = Spec::forced_tools(tools, Some(forced.as_slice()), parallel)
        .map_err(|m| ApiError::bad_request(m, Some("tools")))?;
    Ok(Plan {
        constraint: Some(constraint(state, &spec, "tools")?),
        forced_tools: true,
        tools_off: false,
        parallel,
    })
}

/// The constraint `response_format` asks for, if any.
fn json_constraint(state: &ServerState, extra: &Extra) -> Result<Option<Constraint>, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m, Some("response_format"));
    let Some(rf) = extra.get("response_format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let spec = match rf.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Spec::Json { schema: None },
        Some("json_schema") => {
            let js = rf
                .get("json_schema")
                .filter(|v| v.is_object())
                .ok_or_else(|| bad("response_format json_schema needs a json_schema object"))?;
            let schema = js.get("schema").cloned().unwrap_or(Value::Bool(true));
            Spec::Json {
                schema: Some(schema),
            }
        }
        _ => {
            return Err(bad(
                "response_format type must be \"text\", \"json_object\" or \"json_schema\"",
            ));
        }
    };
    constraint(state, &spec, "response_format").map(Some)
}

fn constraint(state: &ServerState, spec: &Spec, param: &str) -> Result<Constraint, ApiError> {
    let (grammar, _hit) = state.inner.grammars.get(spec).map_err(|SchemaError(m)| {
        let mut e = ApiError::bad_request(m, Some(param));
        e.body.error.code = Some("invalid_schema".into());
        e
    })?;
    Ok(Constraint {
        grammar,
        trie: trie(state),
    })
}

/// The vocabulary trie, built on first use.
pub(crate) fn trie(state: &ServerState) -> Arc<TokenTrie> {
    Arc::clone(
        state
            .inner
            .trie
            .get_or_init(|| Arc::new(TokenTrie::of_tokenizer(state.tokenizer()))),
    )
}
