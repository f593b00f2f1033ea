//! Prompt sets for the probes: the built-in sets shipped in `probes/data/` (compiled in with
//! `include_str!`) and the parsers a scheduler uses for a user's own sets (it reads the file;
//! this module only parses text, so it stays free of IO).
//!
//! - [`LogprobText`]: fixed texts for the prompt-logprobs probe (`prompt_logprob_texts.jsonl`).
//! - [`CompletionPrompt`]: prompts for the completion-logprobs and samples probes
//!   (`completion_prompts.jsonl`).
//! - [`ToolCallPrompt`] and the tool definitions (`tool_call_prompts.jsonl`, `tools.json`):
//!   prompts that should, and should not, make the model call a tool.
//! - [`NeedleTemplate`] (`needle_haystack.json`): the long-context retrieval probe.
//!
//! [`pretoken_lower_bound`] bounds a text's token count from below for byte-level BPE
//! tokenizers of the GPT-2/Llama-3 family, without the tokenizer (used to check a set is big enough).

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

/// The needle-in-a-haystack template.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeedleTemplate {
    /// What the probe does, for people reading the file.
    pub description: String,
    /// The needle sentence with a `{value}` placeholder.
    pub needle: String,
    /// The question asked after the haystack.
    pub question: String,
    /// Values the needle carries (one per probe, rotating).
    pub values: Vec<String>,
    /// Depths (fraction of the haystack before the needle) to test.
    pub depths: Vec<f64>,
    /// The shortest haystack length tried, in tokens; lengths double up to the window.
    pub start_tokens: u32,
    /// Filler sentences, repeated in order.
    pub filler: Vec<String>,
}

/// One built long-context prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct NeedlePrompt {
    /// Haystack with the needle, then the question.
    pub prompt: String,
    /// The value a correct answer contains.
    pub expected: String,
}

impl NeedleTemplate {
    /// Checks the template is usable.
    pub fn validate(&self) -> Result<()> {
        if !self.needle.contains("{value}") {
            return Err(ProbesError::Data("needle has no {value} placeholder".into()));
        }
        if self.values.is_empty() || self.filler.is_empty() || self.depths.is_empty() {
            return Err(ProbesError::Data("needle template needs values, depths and filler".into()));
        }
        if self.depths.iter().any(|d| !(0.0..=1.0).contains(d)) {
            return Err(ProbesError::Data("needle depths must lie in [0, 1]".into()));
        }
        if self.start_tokens == 0 {
            return Err(ProbesError::Data("start_tokens must be positive".into()));
        }
        Ok(())
    }

    /// The haystack lengths to try, in tokens: `start_tokens`, doubling, up to `window`
    /// (the window itself included when it is not a power-of-two multiple).
    pub fn lengths(&self, window: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut n = self.start_tokens.max(1);
        while n < window {
            out.push(n);
            n = n.saturating_mul(2);
        }
        if window > 0 {
            out.push(window);
        }
        out
    }

    /// A prompt of `sentences` filler sentences (cycling through `filler`) with the needle
    /// carrying `value` inserted after `round(depth · sentences)` of them, then the question.
    /// The caller picks `sentences` to reach a token length with its tokenizer.
    pub fn build(&self, sentences: usize, depth: f64, value: &str) -> Result<NeedlePrompt> {
        self.validate()?;
        if !(0.0..=1.0).contains(&depth) {
            return Err(ProbesError::Data(format!("depth {depth} not in [0, 1]")));
        }
        let at = (depth * sentences as f64).round() as usize;
        let needle = self.needle.replace("{value}", value);
        let mut parts: Vec<&str> = Vec::with_capacity(sentences + 1);
        for i in 0..sentences {
            if i == at {
                parts.push(&needle);
            }
            parts.push(&self.filler[i % self.filler.len()]);
        }
        if at >= sentences {
            parts.push(&needle);
        }
        let prompt = format!("{}\n\n{}", parts.join(" "), self.question);
        Ok(NeedlePrompt { prompt, expected: value.to_owned() })
    }
}

/// Parses JSON Lines into `T` (blank lines skipped; errors name the 1-based line).
pub fn parse_jsonl<T: DeserializeOwned>(text: &str) -> Result<Vec<T>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| ProbesError::Data(format!("line {}: {e}", i + 1)))
        })
        .collect()
}

fn parse_json<T: DeserializeOwned>(text: &str, what: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| ProbesError::Data(format!("{what}: {e}")))
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

/// The built-in needle template.
pub fn builtin_needle() -> Result<NeedleTemplate> {
    let t: NeedleTemplate = parse_json(include_str!("../data/needle_haystack.json"), "needle_haystack.json")?;
    t.validate()?;
    Ok(t)
}

/// A lower bound on the number of tokens a byte-level BPE tokenizer with a GPT-2 or
/// Llama-3-style pre-tokenizer regex (SmolLM2, Llama 3, Qwen, ...) produces for `text`: the
/// number of maximal runs of letters plus the number of maximal runs of digits. Those
/// tokenizers first split text with a regex none of whose pieces holds two letter runs, two
/// digit runs, or letters and digits together (a piece may add one leading space or
/// punctuation mark, or be a contraction like `'s`), and BPE never merges across pieces, so
/// every run holds at least one token.
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
