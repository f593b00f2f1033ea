//! Shared rig of the proxy's integration tests: a real gateway ([`samewise_proxy::serve`] on
//! 127.0.0.1:0) over a real store (SQLite or PostgreSQL from `samewise_store::testing`), in
//! front of `samewise_testkit::MockUpstream`s, driven over HTTP with reqwest.
//!
//! `Gateway::start(toml)` takes a config whose providers are written with [`provider`] and
//! models with [`model`]; it creates one API key (optionally rate limited) and hands back a
//! client that sends it. Records are read back with [`Gateway::records`], which polls until
//! the request's final record is written (the writer flushes every few milliseconds).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use samewise_proxy::{AppState, Config};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, RecordQuery, RecordWriter, RecordWriterConfig, RequestRecord};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The provider key every test provider reads from its (test-local) environment.
pub const PROVIDER_SECRET: &str = "sk-provider-SECRET-value-0123456789";

/// A running gateway and its store.
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The samewise key the client sends.
    pub key: String,
    /// The gateway's state (health flags, metrics).
    pub state: AppState,
    /// The database (kept alive for the test's duration).
    pub db: TestDb,
    /// An HTTP client.
    pub http: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), samewise_proxy::ProxyError>>>,
    writer: Option<RecordWriter>,
}

/// Options for [`Gateway::start_with`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Store backend.
    pub backend: Backend,
    /// The key's requests-per-minute limit.
    pub rpm: Option<u32>,
    /// Record queue capacity.
    pub queue: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            backend: Backend::Sqlite,
            rpm: None,
            queue: 10_000,
        }
    }
}

/// A `[providers.NAME]` table for a mock (or any base URL), keyed by `TEST_PROVIDER_KEY`;
/// `extra` adds lines (and overrides the default timeouts it names).
pub fn provider(name: &str, base_url: &str, extra: &str) -> String {
    let mut s = format!(
        "[providers.{name}]\nbase_url = \"{base_url}\"\napi_key_env = \"TEST_PROVIDER_KEY\"\n"
    );
    for (key, default) in [
        ("connect_timeout_ms", 500),
        ("first_byte_timeout_ms", 2000),
        ("idle_timeout_ms", 2000),
    ] {
        if !extra.contains(key) {
            s.push_str(&format!("{key} = {default}\n"));
        }
    }
    s.push_str(extra);
    s.push('\n');
    s
}

/// A `[models.NAME]` table over `(provider, upstream model)` endpoints.
pub fn model(name: &str, policy: &str, endpoints: &[(&str, &str)]) -> String {
    let mut s = format!("[models.{name}]\npolicy = \"{policy}\"\n");
    for (p, m) in endpoints {
        s.push_str(&format!(
            "[[models.{name}.endpoints]]\nprovider = \"{p}\"\nmodel = \"{m}\"\n"
        ));
    }
    s
}

/// Fast test limits: small backoff, short key cache.
pub const FAST_LIMITS: &str = "[limits]\nmax_attempts = 3\nbackoff_base_ms = 5\nbackoff_max_ms = 20\nretry_after_max_ms = 300\nkey_cache_ttl_ms = 200\n";

impl Gateway {
    /// A gateway over SQLite with an unlimited key.
    pub async fn start(toml: &str) -> Result<Gateway> {
        Gateway::start_with(toml, Options::default()).await
    }

    /// A gateway with options.
    pub async fn start_with(toml: &str, opts: Options) -> Result<Gateway> {
        let db = TestDb::new(opts.backend).await?;
        Gateway::start_on(toml, opts, db).await
    }

    /// A gateway over `db` (a database the test made itself, e.g. on a private cluster it
    /// takes away); `opts.backend` is ignored.
    pub async fn start_on(toml: &str, opts: Options, db: TestDb) -> Result<Gateway> {
        let config = Config::from_toml_str(toml).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (key_row, key) = db.store.create_api_key("test", opts.rpm).await?;
        let _ = key_row;
        let (records, writer) = RecordWriter::spawn(
            db.store.clone(),
            RecordWriterConfig {
                capacity: opts.queue,
                flush_interval: Duration::from_millis(5),
                ..RecordWriterConfig::default()
            },
        );
        let state = AppState::with_env(&config, db.store.clone(), records, |name| {
            (name == "TEST_PROVIDER_KEY").then(|| PROVIDER_SECRET.to_owned())
        })?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(samewise_proxy::serve(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        Ok(Gateway {
            addr,
            key,
            state,
            db,
            http: reqwest::Client::new(),
            shutdown: Some(tx),
            task: Some(task),
            writer: Some(writer),
        })
    }

    /// `http://ADDR` + path.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POSTs JSON with the test key.
    pub async fn post(&self, path: &str, body: &serde_json::Value) -> Result<reqwest::Response> {
        Ok(self
            .http
            .post(self.url(path))
            .bearer_auth(&self.key)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body)?)
            .send()
            .await?)
    }

    /// POSTs a chat completion.
    pub async fn chat(&self, body: &serde_json::Value) -> Result<reqwest::Response> {
        self.post("/v1/chat/completions", body).await
    }

    /// GETs a path with the test key.
    pub async fn get(&self, path: &str) -> Result<reqwest::Response> {
        Ok(self
            .http
            .get(self.url(path))
            .bearer_auth(&self.key)
            .send()
            .await?)
    }

    /// Every record of `request_id`, once its final record is written (polls up to 10 s).
    pub async fn records(&self, request_id: &str) -> Result<Vec<RequestRecord>> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let q = RecordQuery {
                request_id: Some(request_id.to_owned()),
                ..RecordQuery::default()
            };
            let mut rows = self.db.store.request_records(&q).await?;
            if rows.iter().any(|r| r.final_attempt) {
                let expected = rows
                    .iter()
                    .find(|r| r.final_attempt)
                    .map(|r| r.attempts as usize)
                    .unwrap_or(1)
                    .max(1);
                if rows.len() >= expected {
                    rows.sort_by_key(|r| r.attempt);
                    return Ok(rows);
                }
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "no final record for {request_id} after 10 s (have {})",
                    rows.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        Ok(self
            .http
            .get(self.url("/metrics"))
            .send()
            .await?
            .text()
            .await?)
    }

    /// Stops the record writer only (the gateway keeps serving): later records are dropped,
    /// which must show on `/metrics`.
    pub async fn stop_writer(&mut self) {
        if let Some(w) = self.writer.take() {
            w.shutdown().await;
        }
    }

    /// Drops the serving future without a shutdown signal (as when its caller goes away).
    pub fn abort_serving(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Stops gracefully: shutdown signal, in-flight requests finish, writer drained.
    pub async fn stop(self) -> Result<()> {
        self.stop_keep_db().await.map(drop)
    }

    /// As [`Gateway::stop`], handing back the database for reading after the stop.
    pub async fn stop_keep_db(mut self) -> Result<TestDb> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.context("serve task")??;
        }
        if let Some(w) = self.writer.take() {
            w.shutdown().await;
        }
        Ok(self.db)
    }
}

/// The `x-request-id` of a response.
pub fn request_id(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A minimal chat body.
pub fn chat_body(model: &str) -> serde_json::Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Say hi"}]})
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|ev| {
            let lines: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect()
}

/// The value of metric line `name{labels}` (labels matched as a substring), if present.
pub fn metric_value(text: &str, name: &str, label_part: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label_part))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .next()
}
