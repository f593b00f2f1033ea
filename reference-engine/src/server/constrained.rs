//! Constrained chat output: `tool_choice` (`"none"`, `"auto"`, `"required"`, a named
//! function), `parallel_tool_calls` and `response_format` (`text`, `json_object`,
//! `json_schema`) read from a chat request and turned into a [`Constraint`]; and
//! [`ToolSplitter`], which reads forced tool calls back out of the constrained text as it
//! is generated (the name as soon as it is complete, then the arguments in pieces).
//!
//! `"auto"` stays free (the model may or may not call); `"required"` and a named function
//! compile the declared functions' parameter schemas into a tool-call grammar. A forced call
//! wins over `response_format`. Schemas the compiler refuses are a 400 naming the keyword
//! (code `invalid_schema`).

use std::sync::Arc;

use samewise_wire::Extra;
use serde_json::Value;

use crate::constrain::{
    CALL_MID, CALL_PREFIX, CALL_SEP, CALL_SUFFIX, Constraint, SchemaError, Spec, TokenTrie,
};

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
    let mut functions = Vec::with_capacity(forced.len());
    for t in tools {
        let Some(name) = t.pointer("/function/name").and_then(Value::as_str) else {
            continue;
        };
        if !forced.contains(&name) {
            continue;
        }
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ApiError::bad_request(
                format!("function name {name:?} must match ^[a-zA-Z0-9_-]{{1,64}}$"),
                Some("tools"),
            ));
        }
        let params = t
            .pointer("/function/parameters")
            .filter(|p| !p.is_null())
            .cloned();
        functions.push((name.to_owned(), params));
    }
    let spec = Spec::Tools {
        functions,
        parallel,
    };
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
    Arc::clone(state.inner.trie.get_or_init(|| {
        let tok = state.tokenizer();
        let entries: Vec<(&[u8], bool)> = (0..tok.vocab_size() as u32)
            .map(|t| (tok.token_bytes(t).unwrap_or_default(), tok.is_special(t)))
            .collect();
        let stops: Vec<u32> = tok.stop_ids().iter().copied().collect();
        Arc::new(TokenTrie::new(&entries, &stops))
    }))
}

/// Where a [`ToolSplitter`] is in the call text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prefix,
    Name,
    Mid,
    Args,
    Suffix,
    Sep,
}

/// Something a forced tool-call stream learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolEvent {
    /// Call `.0`'s name is complete.
    Name(usize, String),
    /// More of call `.0`'s arguments.
    Args(usize, String),
}

/// Reads forced tool calls (text the tool grammar produced) as it arrives.
#[derive(Debug)]
pub(crate) struct ToolSplitter {
    phase: Phase,
    /// Bytes of the current literal matched.
    at: usize,
    /// The calls so far: name and arguments text (the last may be partial).
    calls: Vec<(String, String)>,
    /// The name being read.
    name: String,
    /// JSON nesting of the arguments.
    depth: usize,
    in_str: bool,
    esc: bool,
    /// Everything read (the text, should no call have started).
    text: String,
}

impl Default for ToolSplitter {
    fn default() -> Self {
        Self {
            phase: Phase::Prefix,
            at: 0,
            calls: Vec::new(),
            name: String::new(),
            depth: 0,
            in_str: false,
            esc: false,
            text: String::new(),
        }
    }
}

impl ToolSplitter {
    /// Reads more text; returns what it completed, in order.
    pub(crate) fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let mut frag = String::new();
        self.text.push_str(text);
        for c in text.chars() {
            match self.phase {
                Phase::Prefix => self.lit(c, CALL_PREFIX, Phase::Name),
                Phase::Name if c == '"' => {
                    let name = std::mem::take(&mut self.name);
                    out.push(ToolEvent::Name(self.calls.len(), name.clone()));
                    self.calls.push((name, String::new()));
                    self.phase = Phase::Mid;
                    self.at = 1;
                }
                Phase::Name => self.name.push(c),
                Phase::Mid => self.lit(c, CALL_MID, Phase::Args),
                Phase::Args => {
                    frag.push(c);
                    if let Some(call) = self.calls.last_mut() {
                        call.1.push(c);
                    }
                    if self.json_char(c) {
                        if let Some(i) = self.calls.len().checked_sub(1) {
                            out.push(ToolEvent::Args(i, std::mem::take(&mut frag)));
                        }
                        self.phase = Phase::Suffix;
                        self.at = 0;
                    }
                }
                Phase::Suffix => self.lit(c, CALL_SUFFIX, Phase::Sep),
                Phase::Sep => self.lit(c, CALL_SEP, Phase::Prefix),
            }
        }
        if !frag.is_empty()
            && let Some(i) = self.calls.len().checked_sub(1)
        {
            out.push(ToolEvent::Args(i, frag));
        }
        out
    }

    /// The calls read (name, arguments text); the last is partial if the text stopped early.
    pub(crate) fn calls(&self) -> &[(String, String)] {
        &self.calls
    }

    /// Everything read so far.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    fn lit(&mut self, c: char, lit: &str, next: Phase) {
        self.at += c.len_utf8();
        if self.at >= lit.len() {
            self.phase = next;
            self.at = 0;
        }
    }

    /// Tracks the arguments' JSON; true when the object just closed.
    fn json_char(&mut self, c: char) -> bool {
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if c == '\\' {
                self.esc = true;
            } else if c == '"' {
                self.in_str = false;
            }
            return false;
        }
        match c {
            '"' => self.in_str = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            _ => {}
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitter_reads_names_first_then_arguments_in_pieces() {
        let text = format!(
            "{CALL_PREFIX}get_weather{CALL_MID}{{\"city\":\"O}}\\\"slo\",\"n\":[1]}}{CALL_SUFFIX}{CALL_SEP}{CALL_PREFIX}ping{CALL_MID}{{}}{CALL_SUFFIX}"
        );
        // every split point gives the same calls
        for cut in 1..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut s = ToolSplitter::default();
            let mut ev = s.push(&text[..cut]);
            ev.extend(s.push(&text[cut..]));
            let mut args = vec![String::new(), String::new()];
            let mut names = Vec::new();
            for e in ev {
                match e {
                    ToolEvent::Name(i, n) => {
                        assert!(args[i].is_empty(), "name before arguments");
                        names.push(n);
                    }
                    ToolEvent::Args(i, a) => args[i].push_str(&a),
                }
            }
            assert_eq!(names, ["get_weather", "ping"]);
            assert_eq!(args, ["{\"city\":\"O}\\\"slo\",\"n\":[1]}", "{}"]);
            assert_eq!(s.calls()[1], ("ping".to_owned(), "{}".to_owned()));
        }
    }
}
