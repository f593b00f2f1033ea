//! [`TestServer`]: the engine's HTTP API on 127.0.0.1:0 over the test model (or another
//! model path), under any serving profile, for integration tests: JSON posts, SSE streams
//! read whole, stopped when dropped. The one server every engine test talks to.

use std::path::Path;

use samewise_engine::LoadOptions;
use samewise_engine::Profile;
use samewise_engine::server::{self, ServerState};
use samewise_wire::sse::SseDecoder;
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// A running server.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The server's state (tokenizer, engine).
    pub state: ServerState,
    /// A client for requests the helpers below do not cover.
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// A server over the test model with the built-in serving profile `name` (`reference`:
    /// none).
    pub async fn start(name: &str) -> anyhow::Result<Self> {
        Self::with_profile(Profile::resolve(name)?).await
    }

    /// A server over the test model with a profile written in TOML.
    pub async fn toml(text: &str) -> anyhow::Result<Self> {
        Self::with_profile(Profile::from_toml(text, "test.toml")?).await
    }

    /// A server over the test model with `profile`.
    pub async fn with_profile(profile: Profile) -> anyhow::Result<Self> {
        Self::serve(&super::model_path()?, profile).await
    }

    /// A server over the model at `model` (a GGUF or an HF directory), no profile.
    pub async fn start_on(model: &Path) -> anyhow::Result<Self> {
        Self::serve(model, Profile::resolve("reference")?).await
    }

    async fn serve(model: &Path, profile: Profile) -> anyhow::Result<Self> {
        let state = ServerState::load_with_profile(
            model,
            LoadOptions {
                threads: 2,
                ..LoadOptions::default()
            },
            Some("smollm2".into()),
            profile,
        )?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server::serve(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        Ok(Self {
            base,
            state,
            client: reqwest::Client::new(),
            stop: Some(tx),
            task: Some(task),
        })
    }

    /// POSTs `body` as it is; returns (status, headers, body as JSON).
    pub async fn post_raw(
        &self,
        path: &str,
        body: String,
    ) -> anyhow::Result<(u16, reqwest::header::HeaderMap, Value)> {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await?;
        let v = serde_json::from_slice(&bytes)
            .map_err(|e| anyhow::anyhow!("{e}: {}", String::from_utf8_lossy(&bytes)))?;
        Ok((status, headers, v))
    }

    /// POSTs JSON (`model` set where it is missing); returns (status, body as JSON).
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let (status, _, v) = self.post_raw(path, with_model(body).to_string()).await?;
        Ok((status, v))
    }

    /// POSTs JSON and requires a 200.
    pub async fn ok(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let (status, v) = self.post(path, body).await?;
        anyhow::ensure!(status == 200, "{path} answered {status}: {v}");
        Ok(v)
    }

    /// GETs `path`; returns (status, body as JSON).
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await?;
        let status = resp.status().as_u16();
        Ok((status, serde_json::from_slice(&resp.bytes().await?)?))
    }

    /// GETs `path` and requires a 200.
    pub async fn get_ok(&self, path: &str) -> anyhow::Result<Value> {
        let (status, v) = self.get(path).await?;
        anyhow::ensure!(status == 200, "{path} answered {status}: {v}");
        Ok(v)
    }

    /// POSTs a streaming request (`stream` and a missing `model` set) that must answer 200
    /// with an event stream; returns the `data:` payloads received, `[DONE]` included, and
    /// whether the body ended in an error (the connection dropped) rather than cleanly.
    pub async fn events(&self, path: &str, body: &Value) -> anyhow::Result<(Vec<String>, bool)> {
        let mut b = with_model(body);
        b["stream"] = json!(true);
        let mut resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(b.to_string())
            .send()
            .await?;
        anyhow::ensure!(
            resp.status().as_u16() == 200,
            "stream answered {}",
            resp.status()
        );
        let ct = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        anyhow::ensure!(ct.starts_with("text/event-stream"), "content-type {ct}");
        let mut dec = SseDecoder::new();
        let mut out = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => out.extend(dec.feed(&chunk)?.into_iter().map(|e| e.data)),
                Ok(None) => break,
                Err(_) => return Ok((out, true)),
            }
        }
        out.extend(dec.finish()?.map(|e| e.data));
        Ok((out, false))
    }

    /// [`TestServer::events`] of a stream that must end cleanly with `[DONE]`: its chunks,
    /// parsed.
    pub async fn stream(&self, path: &str, body: &Value) -> anyhow::Result<Vec<Value>> {
        let (events, dropped) = self.events(path, body).await?;
        anyhow::ensure!(!dropped, "the stream broke off after {events:?}");
        let Some((last, chunks)) = events.split_last() else {
            anyhow::bail!("an empty stream");
        };
        anyhow::ensure!(
            last == "[DONE]",
            "the stream ended with {last:?}, not [DONE]"
        );
        chunks
            .iter()
            .map(|d| serde_json::from_str(d).map_err(|e| anyhow::anyhow!("{e}: a chunk {d:?}")))
            .collect()
    }

    /// Stops the server and waits for it to finish.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await??;
        }
        Ok(())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// `body` with `model` set where it is missing (OpenAI requires it; the engine accepts any
/// name).
pub fn with_model(body: &Value) -> Value {
    let mut b = body.clone();
    if let Some(o) = b.as_object_mut() {
        o.entry("model").or_insert(json!("smollm2"));
    }
    b
}

/// The prompt ids the server renders for one user message (with the generation prompt).
pub fn chat_prompt(state: &ServerState, content: &str) -> anyhow::Result<Vec<u32>> {
    let t = state
        .template()
        .ok_or_else(|| anyhow::anyhow!("no template"))?;
    let text = t.render(
        &[json!({"role": "user", "content": content})],
        None,
        true,
        None,
    )?;
    Ok(state.tokenizer().encode(&text, false)?)
}

/// A JSON array of numbers (or nulls) as `Option<f64>`s.
pub fn f64s(v: &Value) -> Vec<Option<f64>> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(Value::as_f64)
        .collect()
}
