//! The reference client: one trait ([`Reference`]), three backends — the engine in this
//! process ([`InProcess`]), a `samewise engine serve` over HTTP ([`Remote`]), and a vLLM or
//! SGLang server hosting the reference weights ([`External`]), for models our engine cannot
//! host.
//!
//! Operations: tokenize text, render a chat to prompt ids, score token ids (per position
//! the logprob of the actual token and the top-k), and sample. [`Cached`] wraps any backend
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
