//! A reference-engine server on 127.0.0.1:0 over the test model, for integration tests:
//! JSON posts, SSE streams read whole, stopped when dropped.

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
    client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    /// The serving task (ends once `stop` fires).
    _task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    /// A server over the test model with serving profile `profile` (`reference`: none).
    pub async fn start(profile: &str) -> anyhow::Result<Self> {
        let state = ServerState::load_with_profile(
            &super::model_path()?,
            LoadOptions {
                threads: 2,
                ..LoadOptions::default()
            },
            Some("smollm2".into()),
            Profile::resolve(profile)?,
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
            _task: task,
        })
    }

    /// POSTs JSON (with `model` set); returns (status, body as JSON).
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let mut b = body.clone();
        b["model"] = json!("smollm2");
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(b.to_string())
            .send()
            .await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let v = serde_json::from_slice(&bytes)
            .map_err(|e| anyhow::anyhow!("{e}: {}", String::from_utf8_lossy(&bytes)))?;
        Ok((status, v))
    }

    /// POSTs JSON and requires a 200.
    pub async fn ok(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let (status, v) = self.post(path, body).await?;
        anyhow::ensure!(status == 200, "{path} answered {status}: {v}");
        Ok(v)
    }

    /// POSTs a streaming request; returns the parsed chunks (`[DONE]` left out).
    pub async fn stream(&self, path: &str, body: &Value) -> anyhow::Result<Vec<Value>> {
        let mut b = body.clone();
        b["model"] = json!("smollm2");
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
        let mut dec = SseDecoder::new();
        let mut data = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            data.extend(dec.feed(&chunk)?.into_iter().map(|e| e.data));
        }
        data.extend(dec.finish()?.map(|e| e.data));
        data.iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| Ok(serde_json::from_str(d)?))
            .collect()
    }
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

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}
