//! The rig shared by the tool-call, degeneration and openai-client tests: mock upstreams
//! (samewise-testkit) behind a real samewise proxy on a loopback port, a real store (SQLite or
//! PostgreSQL) fed by the real record writer, and a real HTTP client.
//!
//! Endpoints are routed with the `cheapest` policy and distinct prices, so the order of
//! attempts is known: the first mock given is tried first, then the next.

#![allow(dead_code, reason = "each test file uses a different part of the rig")]

use std::time::Duration;

use anyhow::{Context, Result, bail};
use samewise_proxy::{AppState, Config};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, RecordQuery, RecordWriter, RecordWriterConfig, RequestRecord};
use samewise_testkit::MockUpstream;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The logical model every test asks for.
pub const MODEL: &str = "test-model";

/// A running proxy with its store.
pub struct Proxy {
    /// The store the records land in.
    pub db: TestDb,
    /// `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    /// A valid samewise key.
    pub key: String,
    /// The record writer, drained on stop.
    writer: Option<RecordWriter>,
    /// Ends the server's graceful shutdown.
    stop: Option<oneshot::Sender<()>>,
    /// The server task, awaited on stop.
    server: Option<JoinHandle<Result<(), samewise_proxy::ProxyError>>>,
    /// HTTP client for the helpers.
    client: reqwest::Client,
}

/// The proxy's TOML for these mocks, in attempt order: provider `pN` serves model `model-N`
/// at price N. `limits` lines go under `[limits]`.
pub fn config(mocks: &[&MockUpstream], limits: &str) -> String {
    let mut toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[limits]\nbackoff_base_ms = 1\nbackoff_max_ms = 5\n{limits}\n\n"
    );
    for (i, mock) in mocks.iter().enumerate() {
        toml.push_str(&format!(
            "[providers.p{i}]\nbase_url = \"{}\"\nprice_input_per_mtok = {i}.5\nprice_output_per_mtok = {i}.5\n\n",
            mock.base_url()
        ));
    }
    toml.push_str(&format!("[models.\"{MODEL}\"]\npolicy = \"cheapest\"\n\n"));
    for i in 0..mocks.len() {
        toml.push_str(&format!(
            "[[models.\"{MODEL}\".endpoints]]\nprovider = \"p{i}\"\nmodel = \"model-{i}\"\n\n"
        ));
    }
    toml
}

impl Proxy {
    /// Starts a proxy in front of `mocks` (in attempt order) on a fresh database.
    pub async fn start(backend: Backend, mocks: &[&MockUpstream], limits: &str) -> Result<Proxy> {
        let db = TestDb::new(backend).await.context("test database")?;
        let config = Config::from_toml_str(&config(mocks, limits)).context("proxy config")?;
        let writer_cfg = RecordWriterConfig {
            flush_interval: Duration::from_millis(20),
            ..RecordWriterConfig::default()
        };
        let (sender, writer) = RecordWriter::spawn(db.store.clone(), writer_cfg);
        let state = AppState::with_env(&config, db.store.clone(), sender, |_| None)
            .context("proxy state")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(samewise_proxy::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        let (_, key) = db
            .store
            .create_api_key("checks", None)
            .await
            .context("api key")?;
        Ok(Proxy {
            db,
            base_url: format!("http://{addr}/v1"),
            key,
            writer: Some(writer),
            stop: Some(stop),
            server: Some(server),
            client: reqwest::Client::new(),
        })
    }

    /// POSTs a JSON body to `path` (under `/v1`); returns the status and the body text.
    pub async fn post(&self, path: &str, body: &Value) -> Result<(u16, String)> {
        let resp = self
            .client
            .post(format!("{}{path}", self.base_url))
            .bearer_auth(&self.key)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    }

    /// POSTs and parses the answer as JSON.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        let (status, text) = self.post(path, body).await?;
        let value =
            serde_json::from_str(&text).with_context(|| format!("answer is not JSON: {text}"))?;
        Ok((status, value))
    }

    /// Waits until the store holds at least `n` records and returns them all, oldest first
    /// (by request, then attempt).
    pub async fn records(&self, n: usize) -> Result<Vec<RequestRecord>> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut rows = self
                .db
                .store
                .request_records(&RecordQuery {
                    limit: 10_000,
                    ..RecordQuery::default()
                })
                .await?;
            if rows.len() >= n {
                rows.sort_by(|a, b| {
                    (a.ts_ms, &a.request_id, a.attempt).cmp(&(b.ts_ms, &b.request_id, b.attempt))
                });
                return Ok(rows);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "waited 10 s for {n} request records; the store has {}: {rows:#?}",
                    rows.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The records of the one client request whose final attempt is the `k`-th final record
    /// (0-based, oldest first), attempts in order.
    pub async fn request(&self, k: usize, total_records: usize) -> Result<Vec<RequestRecord>> {
        let rows = self.records(total_records).await?;
        let finals: Vec<&RequestRecord> = rows.iter().filter(|r| r.final_attempt).collect();
        let id = finals
            .get(k)
            .map(|r| r.request_id.clone())
            .context("no such request")?;
        let mut attempts: Vec<RequestRecord> =
            rows.into_iter().filter(|r| r.request_id == id).collect();
        attempts.sort_by_key(|r| r.attempt);
        Ok(attempts)
    }

    /// Stops the server (draining in-flight requests) and the record writer.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.await??;
        }
        if let Some(writer) = self.writer.take() {
            writer.shutdown().await;
        }
        Ok(())
    }
}

/// The `data:` payloads of an SSE body, in order (`[DONE]` included as a string).
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .flat_map(|event| {
            event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.trim_start().to_owned())
        })
        .collect()
}

/// The JSON events of an SSE body (everything but `[DONE]`); fails on a non-JSON event.
pub fn sse_json(body: &str) -> Result<Vec<Value>> {
    sse_data(body)
        .into_iter()
        .filter(|d| d != "[DONE]")
        .map(|d| serde_json::from_str(&d).with_context(|| format!("event is not JSON: {d}")))
        .collect()
}

/// Concatenated `delta.content` of a streamed chat answer.
pub fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| {
            e.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
        })
        .collect()
}

/// A chat request for [`MODEL`].
pub fn chat(stream: bool) -> Value {
    let mut body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
    });
    if stream {
        body["stream"] = Value::Bool(true);
    }
    body
}
