//! The reference client: one trait ([`Reference`]), three backends — the engine in this
//! process ([`InProcess`]), a `samewise engine serve` over HTTP ([`Remote`]), and a vLLM or
//! SGLang server hosting the reference weights ([`External`]), for models our engine cannot
//! host.
//!
//! Operations: tokenize text, render a chat to prompt ids, score token ids (per position
//! the logprob of the actual token and the top-k), sample, and answer a chat with tools
//! (greedy; with `tool_choice: "required"` the calls are held to the tools' schemas). [`Cached`] wraps any backend
//! with a bounded memo of scores (the scheduler uses it: probes re-send the same sequences). Logprobs are normalised to
//! the f32 the engines compute in (widened to f64), so every backend over the same engine
//! returns the same numbers bit for bit. Nothing here blocks the async runtime: the
//! in-process engine runs on its batcher's worker thread.
//!
//! [`Reference`]: crate::reference::Reference
//! [`InProcess`]: crate::reference::InProcess
//! [`Remote`]: crate::reference::Remote
//! [`External`]: crate::reference::External
//! [`Cached`]: crate::reference::Cached

use std::sync::Arc;

use futures_util::future::BoxFuture;
use samewise_toolcheck::ToolCall;
use serde_json::Value;

use crate::Result;
use crate::align::ReferenceVocab;
use crate::compare::TopEntry;
use crate::config::ReferenceConfig;

mod cached;
mod external;
pub(crate) mod http;
mod in_process;
mod remote;

pub use cached::{CacheStats, Cached};
pub use external::External;
pub use in_process::InProcess;
pub use remote::Remote;

/// One scored position of the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct RefPosition {
    /// The token at this position.
    pub token: u32,
    /// `log p(token | tokens before it)`; None at position 0.
    pub logprob: Option<f64>,
    /// The most likely tokens here (empty at position 0), highest first.
    pub top: Vec<TopEntry>,
}

/// A sampling request to the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Number of samples (sample `i` uses seed `seed + i`).
    pub n: usize,
    /// Most tokens per sample.
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    pub temperature: f64,
    /// Seed of the first sample.
    pub seed: u64,
}

/// One sample of the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct RefSample {
    /// The generated text.
    pub text: String,
    /// Each generated token's logprob under the model.
    pub logprobs: Vec<f64>,
}

/// A chat with tools for the reference to answer greedily (the tool_calls probe's cases).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallRequest {
    /// OpenAI-shaped messages.
    pub messages: Vec<Value>,
    /// OpenAI-shaped tool definitions.
    pub tools: Vec<Value>,
    /// `tool_choice: "required"` and `parallel_tool_calls: false`: the answer is one call of
    /// one of the tools, held to its parameters schema (the engine's constrained decoding;
    /// vLLM's and SGLang's guided decoding). Else `"auto"`: the model decides whether to
    /// call.
    pub forced: bool,
    /// Most tokens of the answer.
    pub max_tokens: usize,
    /// The seed (the answer is greedy; sent as the endpoint is sent it).
    pub seed: u64,
}

/// What every reference backend does.
pub trait Reference: Send + Sync {
    /// `in_process`, `remote`, or `external`.
    fn backend(&self) -> &'static str;
    /// The reference vocabulary (for aligning endpoint tokens).
    fn vocab(&self) -> Arc<dyn ReferenceVocab + Send + Sync>;
    /// The context window, if known.
    fn context_window(&self) -> Option<usize>;
    /// Token ids of `text` (with the tokenizer's special tokens if asked).
    fn tokenize<'a>(
        &'a self,
        text: &'a str,
        add_special_tokens: bool,
    ) -> BoxFuture<'a, Result<Vec<u32>>>;
    /// Prompt ids of a chat (OpenAI-shaped messages and tools), ending with the assistant
    /// header.
    fn render_chat<'a>(
        &'a self,
        messages: &'a [Value],
        tools: Option<&'a [Value]>,
    ) -> BoxFuture<'a, Result<Vec<u32>>>;
    /// Scores `ids`: one [`RefPosition`] per id, with `top_k` alternatives.
    fn score<'a>(&'a self, ids: &'a [u32], top_k: usize)
    -> BoxFuture<'a, Result<Vec<RefPosition>>>;
    /// Scores several sequences, as [`Reference::score`] each, in order. The in-process
    /// engine takes them as one job and computes a prefix they share once (the same bits);
    /// other backends score them one by one.
    fn score_many<'a>(
        &'a self,
        seqs: &'a [Vec<u32>],
        top_k: usize,
    ) -> BoxFuture<'a, Result<Vec<Vec<RefPosition>>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(seqs.len());
            for ids in seqs {
                out.push(self.score(ids, top_k).await?);
            }
            Ok(out)
        })
    }
    /// Samples from the model.
    fn sample<'a>(&'a self, req: &'a SampleRequest) -> BoxFuture<'a, Result<Vec<RefSample>>>;
    /// The tool calls of the model's greedy answer to a chat with tools (none when it
    /// answers in text).
    fn tool_calls<'a>(&'a self, req: &'a ToolCallRequest) -> BoxFuture<'a, Result<Vec<ToolCall>>>;
}

/// An unforced [`ToolCallRequest`] answered as the engine's server answers `"auto"`: the
/// chat rendered with the reference's template and tools, one greedy sample, its calls read
/// in the engine's tools convention.
pub(crate) async fn auto_tool_calls(
    reference: &dyn Reference,
    req: &ToolCallRequest,
) -> Result<Vec<ToolCall>> {
    let prompt = reference
        .render_chat(&req.messages, Some(&req.tools))
        .await?;
    let sample = SampleRequest {
        prompt,
        n: 1,
        max_tokens: req.max_tokens,
        temperature: 0.0,
        seed: req.seed,
    };
    let text = reference
        .sample(&sample)
        .await?
        .pop()
        .map(|s| s.text)
        .unwrap_or_default();
    Ok(calls_in_text(&text))
}

/// The calls in generated text, in the engine's tools convention
/// ([`samewise_engine::chat::parse_tool_calls`]).
fn calls_in_text(text: &str) -> Vec<ToolCall> {
    numbered_calls(
        samewise_engine::chat::parse_tool_calls(text)
            .tool_calls
            .into_iter()
            .map(|c| (c.name, c.arguments)),
    )
}

/// Calls from (name, arguments) pairs, indexed in order.
pub(crate) fn numbered_calls(calls: impl IntoIterator<Item = (String, String)>) -> Vec<ToolCall> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, (name, arguments))| ToolCall {
            index: u32::try_from(i).unwrap_or(u32::MAX),
            id: None,
            name: Some(name),
            arguments,
        })
        .collect()
}

/// The calls of a chat completion answering a [`ToolCallRequest`]; an answer without a
/// message is malformed (one with no calls is the server's, and stands).
pub(crate) fn calls_of_answer(answer: &Value) -> Result<Vec<ToolCall>> {
    let message = answer.pointer("/choices/0/message").ok_or_else(|| {
        crate::ProbesError::Reference(
            "malformed answer from the reference: choices[0].message".into(),
        )
    })?;
    Ok(ToolCall::of_message(message))
}

/// The body of a chat completion asking for `req` (the remote and external backends; the
/// probe sends endpoints the same fields).
pub(crate) fn tool_chat_body(req: &ToolCallRequest) -> Value {
    let mut body = serde_json::json!({"messages": req.messages, "tools": req.tools, "temperature": 0.0,
                                      "max_tokens": req.max_tokens, "seed": req.seed});
    if req.forced {
        body["tool_choice"] = "required".into();
        body["parallel_tool_calls"] = false.into();
    }
    body
}

/// Why the configured reference cannot render the chats that the configured kinds send it, told
/// without starting anything (`samewise config check`): an SGLang reference renders chats here
/// from its `tokenizer` path's chat template ([`External::chat_rendering_problem`]). None when
/// it can, or no kind needs it (the other backends render on their server or from the model
/// file they load).
pub fn chat_rendering_problem(cfg: &crate::ProbesConfig) -> Option<String> {
    let Some(ReferenceConfig::External {
        url,
        flavour: flavour @ crate::ExternalFlavour::Sglang,
        model_name,
        tokenizer,
        ..
    }) = &cfg.reference
    else {
        return None;
    };
    let needing: Vec<String> = cfg
        .models
        .iter()
        .flat_map(|(name, m)| {
            m.kinds
                .iter()
                .filter(|k| k.renders_chats())
                .map(move |k| format!("{name}: {}", k.name()))
        })
        .collect();
    if needing.is_empty() {
        return None;
    }
    let why = match External::new(url, *flavour, model_name, tokenizer, None) {
        Ok(r) => r.chat_rendering_problem()?.to_owned(),
        Err(e) => e.to_string(),
    };
    Some(format!(
        "the SGLang reference renders chats with the model's template, and cannot: {why}; these probes will fail: {}",
        needing.join(", ")
    ))
}

/// Builds the configured backend (loading the model for `in_process`).
pub async fn connect(cfg: &ReferenceConfig) -> Result<Arc<dyn Reference>> {
    Ok(match cfg {
        ReferenceConfig::InProcess { model, threads } => {
            Arc::new(InProcess::load(model.clone(), *threads).await?)
        }
        ReferenceConfig::Remote { url, tokenizer } => Arc::new(Remote::new(url, tokenizer)?),
        ReferenceConfig::External {
            url,
            flavour,
            model_name,
            tokenizer,
            api_key_env,
        } => {
            let key = api_key_env.as_ref().and_then(|k| std::env::var(k).ok());
            Arc::new(External::new(url, *flavour, model_name, tokenizer, key)?)
        }
    })
}

/// The reference's mean per-token log-likelihood of `text` as the continuation of `prompt`
/// (the samples probe's second test, and its benchmark); None for a text of no tokens.
pub async fn mean_loglik(
    reference: &dyn Reference,
    prompt: &[u32],
    text: &str,
) -> Result<Option<f64>> {
    let ids = reference.tokenize(text, false).await?;
    if ids.is_empty() {
        return Ok(None);
    }
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(&ids);
    let scored = reference.score(&seq, 1).await?;
    let lps: Vec<f64> = scored[prompt.len().min(scored.len())..]
        .iter()
        .filter_map(|p| p.logprob)
        .collect();
    Ok(if lps.is_empty() {
        None
    } else {
        Some(lps.iter().sum::<f64>() / lps.len() as f64)
    })
}

/// The engines compute logprobs in f32: widen through f32 so every backend agrees bitwise.
pub fn norm(lp: f64) -> f64 {
    f64::from(lp as f32)
}
