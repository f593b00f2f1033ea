//! Targets: the OpenAI-compatible endpoints a job talks to — the suspect (a provider's
//! endpoint as the proxy config declares it: base URL, API key from the environment, the
//! provider's model id) and the baseline (the reference engine, or a healthy peer).
//! Requests go straight to the endpoint, never through the gateway, so eval traffic is
//! neither routed elsewhere nor recorded as user traffic.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::EvalsError;

/// Label of the reference engine as a baseline.
pub const REFERENCE: &str = "reference";

/// One endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The label (`provider/model-id`, or "reference").
    pub label: String,
    /// The OpenAI base URL (`.../v1` or the server root; `/v1/...` is appended when absent).
    pub base_url: String,
    /// The bearer key, read from the environment by the caller.
    pub api_key: Option<String>,
    /// The model name sent in requests.
    pub model: String,
}

/// An answer and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The response body.
    pub body: Value,
    /// prompt + completion tokens (`usage`; 0 when absent).
    pub tokens: i64,
}

/// Every endpoint a worker may be asked about, by label.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    by_label: BTreeMap<String, Target>,
    client: reqwest::Client,
}

impl Targets {
    /// The targets, with an HTTP client whose requests time out after `timeout`.
    pub fn new(targets: Vec<Target>, timeout: Duration) -> Result<Targets, EvalsError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|source| EvalsError::Http {
                context: "building the HTTP client".into(),
                source,
            })?;
        Ok(Targets {
            by_label: targets.into_iter().map(|t| (t.label.clone(), t)).collect(),
            client,
        })
    }

    /// The target labelled `label`.
    pub fn get(&self, label: &str) -> Result<&Target, EvalsError> {
        self.by_label
            .get(label)
            .ok_or_else(|| EvalsError::UnknownTarget(label.to_owned()))
    }

    /// Labels known.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.by_label.keys().map(String::as_str)
    }

    /// POSTs `body` (its `model` set to the target's) to `path` (e.g. "chat/completions").
    pub async fn post(&self, t: &Target, path: &str, body: Value) -> Result<Answer, EvalsError> {
        let base = t.base_url.trim_end_matches('/');
        let url = if base.ends_with("/v1") {
            format!("{base}/{path}")
        } else {
            format!("{base}/v1/{path}")
        };
        self.send(t, url, body).await
    }

    /// POSTs `body` (its `model` set to the target's) to `path` at the server's root, outside
    /// `/v1` (vLLM's and the engine's `tokenize`).
    pub async fn post_root(
        &self,
        t: &Target,
        path: &str,
        body: Value,
    ) -> Result<Answer, EvalsError> {
        let base = t.base_url.trim_end_matches('/');
        let root = base.strip_suffix("/v1").unwrap_or(base);
        self.send(t, format!("{root}/{path}"), body).await
    }

    async fn send(&self, t: &Target, url: String, mut body: Value) -> Result<Answer, EvalsError> {
        if let Some(o) = body.as_object_mut() {
            o.insert("model".into(), Value::String(t.model.clone()));
        }
        let payload = serde_json::to_vec(&body).map_err(|source| EvalsError::Json {
            context: format!("{}: encoding the request", t.label),
            source,
        })?;
        let mut req = self
            .client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(payload);
        if let Some(k) = &t.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.map_err(|source| EvalsError::Http {
            context: t.label.clone(),
            source,
        })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|source| EvalsError::Http {
            context: format!("{}: reading the body", t.label),
            source,
        })?;
        if !status.is_success() {
            let snippet: String = text.chars().take(300).collect();
            return Err(EvalsError::Status {
                status: status.as_u16(),
                message: format!("{}: HTTP {status}: {snippet}", t.label),
            });
        }
        let body: Value = serde_json::from_str(&text).map_err(|source| EvalsError::Json {
            context: format!("{}: the body is not JSON", t.label),
            source,
        })?;
        let tokens = body
            .pointer("/usage/total_tokens")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        Ok(Answer { body, tokens })
    }
}
