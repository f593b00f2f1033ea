//! The remote reference: a `samewise engine serve` reached over HTTP — `/v1/score` for
//! scoring, `/tokenize` for text and chats, `/v1/completions` for samples,
//! `/v1/chat/completions` for forced tool calls. Token alignment uses a local copy of the
//! tokenizer.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use samewise_toolcheck::ToolCall;
use serde_json::{Value, json};

use super::http::{client, post_json};
use super::{
    RefPosition, RefSample, Reference, SampleRequest, ToolCallRequest, auto_tool_calls,
    calls_of_answer, norm, tool_chat_body,
};
use crate::align::ReferenceVocab;
use crate::compare::TopEntry;
use crate::vocab::EngineVocab;
use crate::{ProbesError, Result};

/// A `samewise engine serve` over HTTP.
#[derive(Debug)]
pub struct Remote {
    url: String,
    http: reqwest::Client,
    vocab: Arc<EngineVocab>,
}

fn bad(what: &str) -> ProbesError {
    ProbesError::Reference(format!("malformed answer from the reference: {what}"))
}

pub(crate) fn ids_of(v: Option<&Value>, what: &str) -> Result<Vec<u32>> {
    v.and_then(Value::as_array)
        .ok_or_else(|| bad(what))?
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(what))
        })
        .collect()
}

impl Remote {
    /// A client of the engine server at `url` (no `/v1`), aligning with the tokenizer at
    /// `tokenizer`.
    pub fn new(url: &str, tokenizer: &Path) -> Result<Self> {
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            http: client(Duration::from_secs(600)),
            vocab: Arc::new(EngineVocab::load(tokenizer)?),
        })
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        post_json(&self.http, &format!("{}{path}", self.url), None, body)
            .await
            .map_err(|e| ProbesError::ReferenceHttp {
                message: e.message,
                source: e.source,
            })
    }
}

impl Reference for Remote {
    fn backend(&self) -> &'static str {
        "remote"
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
            let v = self
                .post(
                    "/tokenize",
                    &json!({"prompt": text, "add_special_tokens": add_special_tokens}),
                )
                .await?;
            ids_of(v.get("tokens"), "tokens")
        })
    }

    fn render_chat<'a>(
        &'a self,
        messages: &'a [Value],
        tools: Option<&'a [Value]>,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move {
            let mut body = json!({"messages": messages, "add_generation_prompt": true});
            if let Some(t) = tools.filter(|t| !t.is_empty()) {
                body["tools"] = Value::Array(t.to_vec());
            }
            let v = self.post("/tokenize", &body).await?;
            ids_of(v.get("tokens"), "tokens")
        })
    }

    fn score<'a>(
        &'a self,
        ids: &'a [u32],
        top_k: usize,
    ) -> BoxFuture<'a, Result<Vec<RefPosition>>> {
        Box::pin(async move {
            let v = self
                .post("/v1/score", &json!({"tokens": ids, "top_k": top_k}))
                .await?;
            let positions = v
                .get("positions")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("positions"))?;
            if positions.len() != ids.len() {
                return Err(bad("positions: wrong count"));
            }
            positions
                .iter()
                .map(|p| {
                    let token = p
                        .get("token")
                        .and_then(Value::as_u64)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| bad("token"))?;
                    let logprob = p.get("logprob").and_then(Value::as_f64).map(norm);
                    let top = p
                        .get("top")
                        .and_then(Value::as_array)
                        .ok_or_else(|| bad("top"))?
                        .iter()
                        .map(|t| {
                            let id = t
                                .get("token")
                                .and_then(Value::as_u64)
                                .and_then(|n| u32::try_from(n).ok())
                                .ok_or_else(|| bad("top token"))?;
                            let lp = t
                                .get("logprob")
                                .and_then(Value::as_f64)
                                .ok_or_else(|| bad("top logprob"))?;
                            Ok(TopEntry {
                                id,
                                logprob: norm(lp),
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(RefPosition {
                        token,
                        logprob,
                        top,
                    })
                })
                .collect()
        })
    }

    fn sample<'a>(&'a self, req: &'a SampleRequest) -> BoxFuture<'a, Result<Vec<RefSample>>> {
        Box::pin(async move {
            let futs = (0..req.n).map(|i| async move {
                let body = json!({"prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": req.temperature,
                                  "seed": req.seed.wrapping_add(i as u64), "logprobs": 0});
                let v = self.post("/v1/completions", &body).await?;
                let choice = v.pointer("/choices/0").ok_or_else(|| bad("choices"))?;
                let text = choice.get("text").and_then(Value::as_str).ok_or_else(|| bad("text"))?.to_owned();
                let logprobs = choice
                    .pointer("/logprobs/token_logprobs")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_f64).map(norm).collect())
                    .unwrap_or_default();
                Ok(RefSample { text, logprobs })
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
            let answer = self
                .post("/v1/chat/completions", &tool_chat_body(req))
                .await?;
            calls_of_answer(&answer)
        })
    }
}
