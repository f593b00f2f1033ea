//! The in-process reference: the engine loaded in this process, driven through its batcher
//! (a worker thread), so scoring and sampling never block the async runtime. Forced tool
//! calls are generated under the engine's own constrained decoding (the grammar its server
//! compiles for `tool_choice: "required"`), so they equal a faithful server's bit for bit.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;
use samewise_engine::Tokenizer;
use samewise_engine::chat::{self, ChatTemplate};
use samewise_engine::constrain::{
    Constraint, GrammarCache, SchemaError, Spec, TokenTrie, ToolSplitter,
};
use samewise_engine::{Batcher, BatcherHandle, GenEvent};
use samewise_engine::{Engine, GenerateParams, LoadOptions, SamplingParams};
use samewise_toolcheck::ToolCall;
use serde_json::Value;

use super::{
    RefPosition, RefSample, Reference, SampleRequest, ToolCallRequest, auto_tool_calls, norm,
    numbered_calls,
};
use crate::align::ReferenceVocab;
use crate::compare::TopEntry;
use crate::vocab::{EngineVocab, render_chat_ids};
use crate::{ProbesError, Result};

/// The engine in this process.
pub struct InProcess {
    /// Kept so the worker lives as long as this backend (dropping it joins the thread).
    _batcher: Batcher,
    handle: BatcherHandle,
    vocab: Arc<EngineVocab>,
    template: Option<ChatTemplate>,
    n_ctx: usize,
    /// Tool-call grammars compiled for forced calls.
    grammars: GrammarCache,
    /// The vocabulary trie, built on the first forced call.
    trie: OnceLock<Arc<TokenTrie>>,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("n_ctx", &self.n_ctx)
            .finish_non_exhaustive()
    }
}

fn rerr(source: samewise_engine::EngineError) -> ProbesError {
    ProbesError::Engine {
        context: "the in-process engine".into(),
        source,
    }
}

impl InProcess {
    /// Loads the model (GGUF file or HF directory), its tokenizer and chat template on a
    /// blocking thread, and starts the batcher.
    pub async fn load(path: PathBuf, threads: usize) -> Result<Self> {
        tokio::task::spawn_blocking(move || Self::load_blocking(&path, threads))
            .await
            .map_err(|e| ProbesError::Reference(format!("loading the reference model: {e}")))?
    }

    fn load_blocking(path: &std::path::Path, threads: usize) -> Result<Self> {
        let ctx = |source: samewise_engine::EngineError| ProbesError::Engine {
            context: path.display().to_string(),
            source,
        };
        let engine = Engine::load(
            path,
            LoadOptions {
                threads,
                ..LoadOptions::default()
            },
        )
        .map_err(ctx)?;
        let (tokenizer, template) = chat::load_tokenizer_and_template(path).map_err(ctx)?;
        Ok(Self::from_parts(
            Arc::new(engine),
            Arc::new(tokenizer),
            template,
        ))
    }

    /// Over an already loaded engine (tests share one with an engine server).
    pub fn from_parts(
        engine: Arc<Engine>,
        tokenizer: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
    ) -> Self {
        let n_ctx = engine.config().n_ctx;
        let batcher = Batcher::start(engine);
        let handle = batcher.handle();
        Self {
            _batcher: batcher,
            handle,
            vocab: Arc::new(EngineVocab::new(tokenizer)),
            template,
            n_ctx,
            grammars: GrammarCache::default(),
            trie: OnceLock::new(),
        }
    }

    fn tokenizer(&self) -> &Tokenizer {
        self.vocab.tokenizer()
    }

    /// The constraint of forced calls of `tools`, as the engine's server builds it.
    fn forced_calls(&self, tools: &[Value]) -> Result<Constraint> {
        let spec = Spec::forced_tools(tools, None, false).map_err(ProbesError::Reference)?;
        let (grammar, _hit) = self
            .grammars
            .get(&spec)
            .map_err(|SchemaError(m)| ProbesError::Reference(format!("the tools' schemas: {m}")))?;
        let trie = self
            .trie
            .get_or_init(|| Arc::new(TokenTrie::of_tokenizer(self.tokenizer())));
        Ok(Constraint {
            grammar,
            trie: Arc::clone(trie),
        })
    }

    async fn sample_one(
        &self,
        prompt: Vec<u32>,
        max_tokens: usize,
        temperature: f64,
        seed: u64,
        constraint: Option<Constraint>,
    ) -> Result<RefSample> {
        let params = GenerateParams {
            sampling: SamplingParams {
                temperature: temperature as f32,
                top_p: 1.0,
                top_k: 0,
                seed: Some(seed),
                ..SamplingParams::default()
            },
            max_tokens,
            stop_token_ids: self.tokenizer().stop_ids().iter().copied().collect(),
            ..GenerateParams::default()
        };
        let mut rx = self
            .handle
            .generate_constrained(prompt, params, constraint)
            .map_err(rerr)?;
        let mut ids = Vec::new();
        let mut logprobs = Vec::new();
        while let Some(ev) = rx.recv().await {
            match ev {
                GenEvent::Token(t) => {
                    ids.push(t.token);
                    logprobs.push(f64::from(t.logprob));
                }
                GenEvent::Done(_) => {
                    let text = self.tokenizer().decode(&ids, true).map_err(rerr)?;
                    return Ok(RefSample { text, logprobs });
                }
                GenEvent::Error(e) => return Err(rerr(e)),
            }
        }
        Err(ProbesError::Reference(
            "the engine stopped mid-generation".into(),
        ))
    }
}

impl Reference for InProcess {
    fn backend(&self) -> &'static str {
        "in_process"
    }

    fn vocab(&self) -> Arc<dyn ReferenceVocab + Send + Sync> {
        self.vocab.clone()
    }

    fn context_window(&self) -> Option<usize> {
        Some(self.n_ctx)
    }

    fn tokenize<'a>(
        &'a self,
        text: &'a str,
        add_special_tokens: bool,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move {
            self.tokenizer()
                .encode(text, add_special_tokens)
                .map_err(rerr)
        })
    }

    fn render_chat<'a>(
        &'a self,
        messages: &'a [Value],
        tools: Option<&'a [Value]>,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move {
            let t = self.template.as_ref().ok_or_else(|| {
                ProbesError::Reference("the reference model has no chat template".into())
            })?;
            render_chat_ids(t, self.tokenizer(), messages, tools).map_err(rerr)
        })
    }

    fn score<'a>(
        &'a self,
        ids: &'a [u32],
        top_k: usize,
    ) -> BoxFuture<'a, Result<Vec<RefPosition>>> {
        Box::pin(async move {
            let mut scored = self
                .score_many(std::slice::from_ref(&ids.to_vec()), top_k)
                .await?;
            scored
                .pop()
                .ok_or_else(|| ProbesError::Reference("the engine returned no sequence".into()))
        })
    }

    fn score_many<'a>(
        &'a self,
        seqs: &'a [Vec<u32>],
        top_k: usize,
    ) -> BoxFuture<'a, Result<Vec<Vec<RefPosition>>>> {
        Box::pin(async move {
            let scored = self
                .handle
                .score(seqs.to_vec(), top_k)
                .await
                .map_err(rerr)?;
            if scored.len() != seqs.len() {
                return Err(ProbesError::Reference(format!(
                    "the engine returned {} sequences for {}",
                    scored.len(),
                    seqs.len()
                )));
            }
            Ok(scored
                .into_iter()
                .map(|seq| {
                    seq.positions
                        .into_iter()
                        .map(|p| RefPosition {
                            token: p.token,
                            logprob: p.logprob.map(f64::from),
                            top: p
                                .top
                                .iter()
                                .map(|t| TopEntry {
                                    id: t.token,
                                    logprob: norm(f64::from(t.logprob)),
                                })
                                .collect(),
                        })
                        .collect()
                })
                .collect())
        })
    }

    fn sample<'a>(&'a self, req: &'a SampleRequest) -> BoxFuture<'a, Result<Vec<RefSample>>> {
        Box::pin(async move {
            let futs = (0..req.n).map(|i| {
                self.sample_one(
                    req.prompt.clone(),
                    req.max_tokens,
                    req.temperature,
                    req.seed.wrapping_add(i as u64),
                    None,
                )
            });
            futures_util::future::join_all(futs)
                .await
                .into_iter()
                .collect()
        })
    }

    fn tool_calls<'a>(&'a self, req: &'a ToolCallRequest) -> BoxFuture<'a, Result<Vec<ToolCall>>> {
        Box::pin(async move {
            if !req.forced {
                return auto_tool_calls(self, req).await;
            }
            let constraint = self.forced_calls(&req.tools)?;
            let prompt = self.render_chat(&req.messages, Some(&req.tools)).await?;
            let answer = self
                .sample_one(prompt, req.max_tokens, 0.0, req.seed, Some(constraint))
                .await?;
            // read as the engine's server reads forced calls: one the limit cut is kept, partial
            let mut split = ToolSplitter::default();
            split.push(&answer.text);
            Ok(numbered_calls(split.calls().iter().cloned()))
        })
    }
}
