//! The external reference: a vLLM or SGLang server hosting the reference weights, for
//! models our engine cannot host.
//!
//! - vLLM: scoring is `/v1/completions` on token ids with `prompt_logprobs: k` and
//!   `max_tokens: 1` (each position's map holds the top-k by `rank` plus the actual token);
//!   `/tokenize` for text and chats; samples from `/v1/completions`.
//! - SGLang: scoring is `/generate` on `input_ids` with `return_logprob`,
//!   `logprob_start_len: 0`, `top_logprobs_num: k` and `max_new_tokens: 0`; text is tokenized
//!   with the local tokenizer; SGLang has no chat-tokenize route, so chats are rendered
//!   locally with the model's own chat template (from the GGUF file or Hugging Face directory
//!   given as the tokenizer, as the in-process reference renders them), and where that has
//!   none, rendering is refused with the reason (the probes that need it report it).
//! - Tool calls, both: `/v1/chat/completions`, forced with `tool_choice: "required"` (their
//!   guided decoding holds the calls to the tools' schemas), unforced with `"auto"`, so the
//!   calls are read by the server's own tool parser for the model it serves (our engine's
//!   parser knows the Hermes `<tool_call>` form and bare JSON, not every model's). A server
//!   that refuses `"auto"` with a 400 (vLLM without `--enable-auto-tool-choice`, SGLang
//!   without `--tool-call-parser`) is remembered as refusing, and its unforced chats are
//!   rendered and sampled as the in-process backend's are.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use samewise_engine::chat::ChatTemplate;
use samewise_toolcheck::ToolCall;
use serde_json::{Value, json};

use super::http::{HttpFailure, client, post_json};
use super::remote::ids_of;
use super::{
    RefPosition, RefSample, Reference, SampleRequest, ToolCallRequest, auto_tool_calls,
    calls_of_answer, norm, tool_chat_body,
};
use crate::align::ReferenceVocab;
use crate::compare::TopEntry;
use crate::config::ExternalFlavour;
use crate::vocab::{EngineVocab, load_chat_template, render_chat_ids};
use crate::{ProbesError, Result};

/// A vLLM or SGLang server.
pub struct External {
    url: String,
    flavour: ExternalFlavour,
    model: String,
    key: Option<String>,
    http: reqwest::Client,
    vocab: Arc<EngineVocab>,
    /// The model's chat template, for SGLang, or why there is none (vLLM renders chats on its
    /// server: not loaded).
    template: std::result::Result<ChatTemplate, String>,
    /// The server refused `tool_choice: "auto"` (a 400): unforced chats are rendered and
    /// sampled instead.
    auto_refused: AtomicBool,
}

impl std::fmt::Debug for External {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("External")
            .field("url", &self.url)
            .field("flavour", &self.flavour)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

fn http_error(e: HttpFailure) -> ProbesError {
    ProbesError::ReferenceHttp {
        message: e.message,
        source: e.source,
    }
}

fn bad(what: &str) -> ProbesError {
    ProbesError::Reference(format!(
        "malformed answer from the external reference: {what}"
    ))
}

fn as_id(v: Option<&Value>) -> Option<u32> {
    v.and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

impl External {
    /// A client of the server at `url` (no `/v1`) serving `model`; `key` is its API key.
    pub fn new(
        url: &str,
        flavour: ExternalFlavour,
        model: &str,
        tokenizer: &Path,
        key: Option<String>,
    ) -> Result<Self> {
        let vocab = Arc::new(EngineVocab::load(tokenizer)?);
        let template = match flavour {
            ExternalFlavour::Sglang => load_chat_template(tokenizer, vocab.tokenizer()),
            ExternalFlavour::Vllm => Err("a vLLM reference renders chats on its server".into()),
        };
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            flavour,
            model: model.to_owned(),
            key,
            http: client(Duration::from_secs(600)),
            vocab,
            template,
            auto_refused: AtomicBool::new(false),
        })
    }

    /// Why this reference cannot render chats (an SGLang one whose tokenizer path holds no
    /// usable chat template); None where it can, or where its server renders them (vLLM).
    pub fn chat_rendering_problem(&self) -> Option<&str> {
        match (self.flavour, &self.template) {
            (ExternalFlavour::Sglang, Err(why)) => Some(why),
            _ => None,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.post_raw(path, body).await.map_err(http_error)
    }

    async fn post_raw(&self, path: &str, body: &Value) -> std::result::Result<Value, HttpFailure> {
        post_json(
            &self.http,
            &format!("{}{path}", self.url),
            self.key.as_deref(),
            body,
        )
        .await
    }

    /// An unforced chat with tools, by the server's chat API with `tool_choice: "auto"`; where
    /// the server refuses that (a 400 whose message speaks of tools; remembered), rendered and
    /// sampled.
    async fn auto_calls(&self, req: &ToolCallRequest) -> Result<Vec<ToolCall>> {
        if !self.auto_refused.load(Ordering::Relaxed) {
            let mut body = tool_chat_body(req);
            body["model"] = self.model.clone().into();
            body["tool_choice"] = "auto".into();
            match self.post_raw("/v1/chat/completions", &body).await {
                Ok(answer) => return calls_of_answer(&answer),
                // a refusal of the tool choice, not of this chat (a 400 for a prompt too long
                // is the case's and says nothing of "auto")
                Err(e) if e.status == Some(400) && e.message.to_lowercase().contains("tool") => {
                    tracing::info!(url = %self.url, error = %e.message, "the external reference refuses tool_choice \"auto\": unforced tool calls are rendered and sampled");
                    self.auto_refused.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(http_error(e)),
            }
        }
        auto_tool_calls(self, req).await
    }

    async fn score_vllm(&self, ids: &[u32], top_k: usize) -> Result<Vec<RefPosition>> {
        let body = json!({"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": top_k});
        let v = self.post("/v1/completions", &body).await?;
        let lps = v
            .pointer("/choices/0/prompt_logprobs")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("choices[0].prompt_logprobs"))?;
        if lps.len() != ids.len() {
            return Err(bad("prompt_logprobs: wrong count"));
        }
        ids.iter()
            .zip(lps)
            .map(|(&token, entry)| {
                let Some(map) = entry.as_object() else {
                    return Ok(RefPosition {
                        token,
                        logprob: None,
                        top: Vec::new(),
                    });
                };
                let mut top = Vec::new();
                let mut actual = None;
                for (k, e) in map {
                    let id: u32 = k.parse().map_err(|_| bad("prompt_logprobs key"))?;
                    let lp = norm(
                        e.get("logprob")
                            .and_then(Value::as_f64)
                            .ok_or_else(|| bad("logprob"))?,
                    );
                    let rank = e.get("rank").and_then(Value::as_u64).unwrap_or(u64::MAX);
                    if id == token {
                        actual = Some(lp);
                    }
                    if rank >= 1 && rank <= top_k as u64 {
                        top.push(TopEntry { id, logprob: lp });
                    }
                }
                top.sort_by(|a, b| b.logprob.total_cmp(&a.logprob).then(a.id.cmp(&b.id)));
                Ok(RefPosition {
                    token,
                    logprob: Some(
                        actual.ok_or_else(|| bad("actual token missing from prompt_logprobs"))?,
                    ),
                    top,
                })
            })
            .collect()
    }

    async fn score_sglang(&self, ids: &[u32], top_k: usize) -> Result<Vec<RefPosition>> {
        let body = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                          "return_logprob": true, "logprob_start_len": 0, "top_logprobs_num": top_k});
        let v = self.post("/generate", &body).await?;
        let input = v
            .pointer("/meta_info/input_token_logprobs")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("meta_info.input_token_logprobs"))?;
        let tops = v
            .pointer("/meta_info/input_top_logprobs")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("meta_info.input_top_logprobs"))?;
        if input.len() != ids.len() || tops.len() != ids.len() {
            return Err(bad("input logprobs: wrong count"));
        }
        ids.iter()
            .zip(input.iter().zip(tops))
            .map(|(&token, (e, t))| {
                let logprob = e.get(0).and_then(Value::as_f64).map(norm);
                let top = match t.as_array() {
                    None => Vec::new(),
                    Some(list) => list
                        .iter()
                        .map(|x| {
                            let lp = x
                                .get(0)
                                .and_then(Value::as_f64)
                                .ok_or_else(|| bad("top logprob"))?;
                            Ok(TopEntry {
                                id: as_id(x.get(1)).ok_or_else(|| bad("top id"))?,
                                logprob: norm(lp),
                            })
                        })
                        .collect::<Result<Vec<_>>>()?,
                };
                Ok(RefPosition {
                    token,
                    logprob: if top.is_empty() && logprob.is_none() {
                        None
                    } else {
                        logprob
                    },
                    top,
                })
            })
            .collect()
    }
}

impl Reference for External {
    fn backend(&self) -> &'static str {
        "external"
    }

    fn vocab(&self) -> Arc<dyn ReferenceVocab + Send + Sync> {
        self.vocab.clone()
    }

    fn context_window(&self) -> Option<usize> {
        None
    }

    fn tokenize<'a>(
        &'a self,
        text: &'a str,
        add_special_tokens: bool,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move {
            match self.flavour {
                ExternalFlavour::Vllm => {
                    let v = self.post("/tokenize", &json!({"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens})).await?;
                    ids_of(v.get("tokens"), "tokens")
                }
                ExternalFlavour::Sglang => self
                    .vocab
                    .tokenizer()
                    .encode(text, add_special_tokens)
                    .map_err(|source| ProbesError::Engine {
                        context: "the SGLang reference's tokenizer".into(),
                        source,
                    }),
            }
        })
    }

    fn render_chat<'a>(
        &'a self,
        messages: &'a [Value],
        tools: Option<&'a [Value]>,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move {
            match self.flavour {
                ExternalFlavour::Vllm => {
                    let mut body = json!({"model": self.model, "messages": messages, "add_generation_prompt": true});
                    if let Some(t) = tools.filter(|t| !t.is_empty()) {
                        body["tools"] = Value::Array(t.to_vec());
                    }
                    let v = self.post("/tokenize", &body).await?;
                    ids_of(v.get("tokens"), "tokens")
                }
                ExternalFlavour::Sglang => match &self.template {
                    Ok(t) => render_chat_ids(t, self.vocab.tokenizer(), messages, tools).map_err(
                        |source| ProbesError::Engine {
                            context: "rendering a chat for the SGLang reference".into(),
                            source,
                        },
                    ),
                    Err(why) => Err(ProbesError::Reference(format!(
                        "the SGLang reference renders chats with the model's own template (SGLang has no chat tokenize route): {why}"
                    ))),
                },
            }
        })
    }

    fn score<'a>(
        &'a self,
        ids: &'a [u32],
        top_k: usize,
    ) -> BoxFuture<'a, Result<Vec<RefPosition>>> {
        Box::pin(async move {
            match self.flavour {
                ExternalFlavour::Vllm => self.score_vllm(ids, top_k).await,
                ExternalFlavour::Sglang => self.score_sglang(ids, top_k).await,
            }
        })
    }

    fn sample<'a>(&'a self, req: &'a SampleRequest) -> BoxFuture<'a, Result<Vec<RefSample>>> {
        Box::pin(async move {
            let futs = (0..req.n).map(|i| async move {
                let seed = req.seed.wrapping_add(i as u64);
                match self.flavour {
                    ExternalFlavour::Vllm => {
                        let body = json!({"model": self.model, "prompt": req.prompt, "max_tokens": req.max_tokens,
                                          "temperature": req.temperature, "seed": seed, "logprobs": 0});
                        let v = self.post("/v1/completions", &body).await?;
                        let text = v.pointer("/choices/0/text").and_then(Value::as_str).ok_or_else(|| bad("choices[0].text"))?.to_owned();
                        let logprobs = v
                            .pointer("/choices/0/logprobs/token_logprobs")
                            .and_then(Value::as_array)
                            .map(|a| a.iter().filter_map(Value::as_f64).map(norm).collect())
                            .unwrap_or_default();
                        Ok(RefSample { text, logprobs })
                    }
                    ExternalFlavour::Sglang => {
                        let body = json!({"input_ids": req.prompt, "return_logprob": true,
                                          "sampling_params": {"max_new_tokens": req.max_tokens, "temperature": req.temperature, "sampling_seed": seed}});
                        let v = self.post("/generate", &body).await?;
                        let text = v.get("text").and_then(Value::as_str).ok_or_else(|| bad("text"))?.to_owned();
                        let logprobs = v
                            .pointer("/meta_info/output_token_logprobs")
                            .and_then(Value::as_array)
                            .map(|a| a.iter().filter_map(|e| e.get(0).and_then(Value::as_f64)).map(norm).collect())
                            .unwrap_or_default();
                        Ok(RefSample { text, logprobs })
                    }
                }
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
                return self.auto_calls(req).await;
            }
            let mut body = tool_chat_body(req);
            body["model"] = self.model.clone().into();
            let answer = self.post("/v1/chat/completions", &body).await?;
            calls_of_answer(&answer)
        })
    }
}
