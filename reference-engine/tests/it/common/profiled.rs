//! [`TestServer`]: the engine's HTTP API over the test model under a serving profile, on
//! 127.0.0.1:0, stopped when dropped — what the profile tests talk to.

use samewise_engine::LoadOptions;
use samewise_engine::Profile;
use samewise_engine::server::{self, ServerState};
use samewise_wire::sse::SseDecoder;
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// A server on 127.0.0.1:0 serving a profile, stopped when dropped.
pub(crate) struct TestServer {
    pub(crate) base: String,
    pub(crate) client: reqwest::Client,
    pub(crate) stop: Option<oneshot::Sender<()>>,
    pub(crate) task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub(crate) async fn start(profile: Profile) -> anyhow::Result<Self> {
        let state = ServerState::load_with_profile(
            &super::model_path()?,
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
        let task = tokio::spawn(server::serve(listener, state, async move {
            let _ = rx.await;
        }));
        Ok(Self {
            base,
            client: reqwest::Client::new(),
            stop: Some(tx),
            task: Some(task),
        })
    }

    pub(crate) async fn builtin(name: &str) -> anyhow::Result<Self> {
        Self::start(Profile::resolve(name)?).await
    }

    pub(crate) async fn toml(text: &str) -> anyhow::Result<Self> {
        Self::start(Profile::from_toml(text, "test.toml")?).await
    }

    /// POSTs JSON; returns (status, headers, body as JSON).
    pub(crate) async fn post_full(
        &self,
        path: &str,
        body: &Value,
    ) -> anyhow::Result<(u16, reqwest::header::HeaderMap, Value)> {
        let mut b = body.clone();
        if let Some(o) = b.as_object_mut() {
            o.entry("model").or_insert(json!("smollm2"));
        }
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(b.to_string())
            .send()
            .await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await?;
        let v = serde_json::from_slice(&bytes)
            .map_err(|e| anyhow::anyhow!("{e}: {}", String::from_utf8_lossy(&bytes)))?;
        Ok((status, headers, v))
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let (s, _, v) = self.post_full(path, body).await?;
        Ok((s, v))
    }

    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await?;
        anyhow::ensure!(resp.status() == 200, "{path} answered {}", resp.status());
        Ok(serde_json::from_slice(&resp.bytes().await?)?)
    }

    pub(crate) async fn ok(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let (status, v) = self.post(path, body).await?;
        anyhow::ensure!(status == 200, "{path} answered {status}: {v}");
        Ok(v)
    }

    /// POSTs a streaming request; returns the `data:` payloads received and whether the
    /// body ended in an error (the connection dropped) rather than cleanly.
    pub(crate) async fn stream(
        &self,
        path: &str,
        body: &Value,
    ) -> anyhow::Result<(Vec<String>, bool)> {
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

    pub(crate) async fn shutdown(mut self) -> anyhow::Result<()> {
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

pub(crate) fn f64s(v: &Value) -> Vec<Option<f64>> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(Value::as_f64)
        .collect()
}
