//! Prompt sets for the probes: the built-in sets shipped in `probes/data/` (compiled in with
//! `include_str!`) and the parsers a scheduler uses for a user's own sets (it reads the file;
//! this module only parses text, so it stays free of IO).
//!
//! - [`LogprobText`]: fixed texts for the prompt-logprobs probe (`prompt_logprob_texts.jsonl`).
//! - [`CompletionPrompt`]: prompts for the completion-logprobs and samples probes
//!   (`completion_prompts.jsonl`).
//! - [`ToolCallPrompt`] and the tool definitions (`tool_call_prompts.jsonl`, `tools.json`):
//!   prompts that should, and should not, make the model call a tool.
//! - The long-context probe's haystack is `samewise_longctx::Haystack` (shared with the
//!   evals' `long_context` suite; built in: `longctx/data/haystack.json`).
//!
//! `pretoken_lower_bound` (test builds) bounds a text's token count from below for byte-level
//! BPE tokenizers of the GPT-2/Llama-3 family, without the tokenizer (the tests check with it
//! that a set is big enough).

use samewise_wire::{ChatMessage, Tool};
use serde::de::DeserializeOwned;

use crate::{ProbesError, Result};

/// One fixed text scored by the prompt-logprobs probe.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogprobText {
    /// Stable identifier (appears in stored probe runs).
    pub id: String,
    /// The text, sent as the prompt with `echo` + `logprobs`.
    pub text: String,
}

/// One prompt for the completion-logprobs and samples probes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionPrompt {
    /// Stable identifier.
    pub id: String,
    /// The user message.
    pub prompt: String,
    /// Generation budget for this prompt.
    pub max_tokens: u32,
}

/// Whether a tool-call prompt should trigger a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolExpectation {
    /// The model should call a tool.
    Call,
    /// The model should answer in text.
    NoCall,
}

/// One tool-call probe prompt.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallPrompt {
    /// Stable identifier.
    pub id: String,
    /// The conversation to send.
    pub messages: Vec<ChatMessage>,
    /// Names of the tools (from the tool definitions) offered with it.
    pub tools: Vec<String>,
    /// Call or no call.
    pub expect: ToolExpectation,
    /// The function that should be called (for `call`).
    #[serde(default)]
    pub expected_name: Option<String>,
    /// Arguments a correct call would carry (informative; scoring validates the schema).
    #[serde(default)]
    pub expected_arguments: Option<serde_json::Value>,
}

/// The tool definitions file: `{"tools": [...]}`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDefinitions {
    /// OpenAI-style tool definitions.
    pub tools: Vec<Tool>,
}

impl ToolDefinitions {
    /// The definitions named by a prompt, in the prompt's order.
    pub fn select(&self, names: &[String]) -> Result<Vec<Tool>> {
        names
            .iter()
            .map(|n| {
                self.tools
                    .iter()
                    .find(|t| &t.function.name == n)
                    .cloned()
                    .ok_or_else(|| ProbesError::Data(format!("no tool definition named {n}")))
            })
            .collect()
    }
}

/// Parses JSON Lines into `T` (blank lines skipped; errors name the 1-based line).
pub fn parse_jsonl<T: DeserializeOwned>(text: &str) -> Result<Vec<T>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| ProbesError::DataJson {
                context: format!("line {}", i + 1),
                source,
            })
        })
        .collect()
}

fn parse_json<T: DeserializeOwned>(text: &str, what: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|source| ProbesError::DataJson {
        context: what.to_owned(),
        source,
    })
}

/// The built-in prompt-logprobs texts.
pub fn builtin_logprob_texts() -> Result<Vec<LogprobText>> {
    parse_jsonl(include_str!("../data/prompt_logprob_texts.jsonl"))
}

/// The built-in completion prompts.
pub fn builtin_completion_prompts() -> Result<Vec<CompletionPrompt>> {
    parse_jsonl(include_str!("../data/completion_prompts.jsonl"))
}

/// The built-in tool-call prompts.
pub fn builtin_tool_call_prompts() -> Result<Vec<ToolCallPrompt>> {
    parse_jsonl(include_str!("../data/tool_call_prompts.jsonl"))
}

/// The built-in tool definitions.
pub fn builtin_tools() -> Result<ToolDefinitions> {
    parse_json(include_str!("../data/tools.json"), "tools.json")
}

/// A lower bound on the number of tokens a byte-level BPE tokenizer with a GPT-2 or
/// Llama-3-style pre-tokenizer regex (SmolLM2, Llama 3, Qwen, ...) produces for `text`: the
/// number of maximal runs of letters plus the number of maximal runs of digits. Those
/// tokenizers first split text with a regex none of whose pieces holds two letter runs, two
/// digit runs, or letters and digits together (a piece may add one leading space or
/// punctuation mark, or be a contraction like `'s`), and BPE never merges across pieces, so
/// every run holds at least one token.
#[cfg(test)]
pub fn pretoken_lower_bound(text: &str) -> usize {
    #[derive(PartialEq, Clone, Copy)]
    enum Class {
        Letter,
        Digit,
        Other,
    }
    let mut count = 0;
    let mut prev = Class::Other;
    for c in text.chars() {
        let k = if c.is_alphabetic() {
            Class::Letter
        } else if c.is_numeric() {
            Class::Digit
        } else {
            Class::Other
        };
        if k != Class::Other && k != prev {
            count += 1;
        }
        prev = k;
    }
    count
}

#[cfg(test)]
mod tests;
