//! `/v1/completions` (the legacy text API): the request with `echo` and numeric `logprobs`,
//! and the response whose logprobs are parallel arrays.
//!
//! With `echo` and `logprobs`, servers such as vLLM return the prompt's tokens first: entry i
//! of `token_logprobs` is the logprob of token i given the tokens before it, and the first
//! entry is null. samewise's prompt-logprob probes depend on that alignment.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Extra, Stop, StreamOptions, Usage};

/// A completions request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The model name the client asked for.
    pub model: String,
    /// Text, texts, token ids, or lists of token ids.
    pub prompt: Prompt,
    /// Return the prompt (text and, with `logprobs`, its token logprobs) before the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// How many alternatives per position (0..=20; OpenAI caps at 5); presence asks for logprobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Upper bound on generated tokens (0 allowed with `echo`: score only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature; 0 means greedy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Number of choices per prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Seed for sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Stream the answer as SSE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Stream options (`include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Everything else the client sent.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The four shapes of `prompt`. An empty array reads as `Tokens(vec![])`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// One pre-tokenized prompt.
    Tokens(Vec<u32>),
    /// Several texts (one choice set each).
    Texts(Vec<String>),
    /// Several pre-tokenized prompts.
    TokenBatches(Vec<Vec<u32>>),
}

/// A non-streamed completion (a streamed one sends the same shape per chunk).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// `cmpl-...`.
    #[serde(default)]
    pub id: String,
    /// `"text_completion"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// One per prompt and `n`.
    #[serde(default)]
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One choice of a [`CompletionResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Position among the choices.
    #[serde(default)]
    pub index: u32,
    /// Generated text (prefixed by the prompt with `echo`).
    #[serde(default)]
    pub text: String,
    /// Per-token logprobs when asked for.
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop`, `length`, ...
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Anything else (vLLM's `prompt_logprobs`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// The legacy logprobs object: parallel arrays over tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Each token's logprob; null for the first prompt token under `echo`.
    #[serde(default)]
    pub token_logprobs: Vec<Option<f64>>,
    /// Per position, token text -> logprob of the most likely alternatives (null where none).
    #[serde(default)]
    pub top_logprobs: Option<Vec<Option<serde_json::Map<String, Value>>>>,
    /// Character offset of each token in `text`.
    #[serde(default)]
    pub text_offset: Vec<u32>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

impl CompletionLogprobs {
    /// The alternatives at position `i` as (token text, logprob), in the order sent; entries
    /// whose value is not a number are skipped.
    pub fn top_at(&self, i: usize) -> Vec<(String, f64)> {
        self.top_logprobs
            .as_ref()
            .and_then(|v| v.get(i))
            .and_then(|o| o.as_ref())
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_f64().map(|f| (k.clone(), f)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_shapes() {
        let p = |s: &str| serde_json::from_str::<Prompt>(s).unwrap();
        assert_eq!(p(r#""hi""#), Prompt::Text("hi".into()));
        assert_eq!(p("[1,2]"), Prompt::Tokens(vec![1, 2]));
        assert_eq!(
            p(r#"["a","b"]"#),
            Prompt::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            p("[[1],[2,3]]"),
            Prompt::TokenBatches(vec![vec![1], vec![2, 3]])
        );
        assert!(serde_json::from_str::<Prompt>("[1,\"a\"]").is_err());
        assert!(serde_json::from_str::<Prompt>("[-1]").is_err());
    }

    #[test]
    fn echo_logprobs_with_null_first_entry() {
        let r: CompletionResponse = serde_json::from_str(
            r#"{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,
            "text":"Hello world","finish_reason":"length","logprobs":{"tokens":["Hello"," world"],
            "token_logprobs":[null,-1.5],"top_logprobs":[null,{" world":-1.5," there":-2.0}],
            "text_offset":[0,5]}}],"usage":{"prompt_tokens":2,"completion_tokens":0,"total_tokens":2}}"#,
        )
        .unwrap();
        let lp = r.choices[0].logprobs.as_ref().unwrap();
        assert_eq!(lp.token_logprobs, vec![None, Some(-1.5)]);
        assert!(lp.top_at(0).is_empty());
        assert_eq!(
            lp.top_at(1),
            vec![(" world".into(), -1.5), (" there".into(), -2.0)]
        );
    }
}
