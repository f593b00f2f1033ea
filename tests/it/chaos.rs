//! Upstream chaos (issue 14, item 3): `samewise serve` in front of three mock providers that
//! answer from seeded fault streams (`samewise_testkit::Chaos`: resets before and inside the
//! response, heads that never come, bodies that stop, slow-loris bodies, 5xx and 429 storms
//! with `Retry-After` of a second or a day, malformed JSON, broken SSE) and the real engine
//! under the `flaky` serving profile (injected 500s, 429s, cut streams, log-normal latency),
//! with open-loop JSON and streaming traffic. Checked:
//! - no request hangs: every one is answered, the slowest within the bound its timeouts set
//!   (`max_attempts x (first-byte cap + longest Retry-After wait + longest body)` + 2 s);
//! - no leak: no mock still holds a hung request the gateway gave up on; once the clients'
//!   and the upstreams' connections are closed (the test's client dropped, the mocks and the
//!   engine's relay shut down), the gateway has no more sockets open than before the first
//!   request (a task stuck on a connection would keep its socket); threads at the end of the
//!   second half of the run are where the first half left them (the blocking pool fills up in
//!   the first), and so is resident memory, within 25%;
//! - every attempt recorded: records with an endpoint = completion requests the upstreams
//!   received (counted by the mocks, and for the engine by a counting TCP relay in front of it),
//!   one final record per client request, none dropped.
//!
//! The CI test is a short burst (`CHAOS_SECS`, default 10 s at `CHAOS_RATE` 16 rps); the
//! harness `bench/proxy/chaos.sh` runs the same test for minutes with other seeds and rates and
//! keeps the printed summary.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_store::{RecordQuery, Store};
use samewise_testkit::{Chaos, ChaosTimes, MockUpstream};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::common::{Spawn, scrape, spawn_listening_with, test_model};

/// The gateway's timeouts under chaos (the `[limits]` and provider keys below).
const FIRST_BYTE_CAP_MS: u64 = 1_500;
const IDLE_MS: u64 = 1_000;
const RETRY_AFTER_MAX_MS: u64 = 1_000;
const MAX_ATTEMPTS: u64 = 3;
/// A slow-loris body's gap between events (under the idle timeout: it trickles, never stalls).
const LORIS_GAP_MS: u64 = 300;
/// The longest body a healthy-but-slow answer takes: the mock's 6 pieces plus role, finish and
/// usage events at the slow-loris gap.
const LONGEST_BODY_MS: u64 = 9 * LORIS_GAP_MS;

/// One client request's outcome.
struct Outcome {
    latency: Duration,
    /// HTTP status, or None when the request failed at the transport.
    status: Option<u16>,
    /// The whole body was read (a stream may end in an error event; that counts as read).
    body_read: bool,
}

/// A process's resident memory (kB), threads and open file descriptors, from /proc.
#[derive(Debug, Clone, Copy)]
struct ProcStats {
    rss_kb: u64,
    threads: u64,
    fds: u64,
    /// The descriptors that are sockets.
    sockets: u64,
}

fn proc_stats(pid: u32) -> Result<ProcStats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |k: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {k} in /proc/{pid}/status"))
    };
    let (mut fds, mut sockets) = (0, 0);
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        fds += 1;
        // a descriptor closed between the listing and the read is skipped
        if let Ok(target) = std::fs::read_link(e?.path()) {
            sockets += u64::from(target.to_string_lossy().starts_with("socket:"));
        }
    }
    Ok(ProcStats {
        rss_kb: field("VmRSS:")?,
        threads: field("Threads:")?,
        fds,
        sockets,
    })
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_burst_no_hang_no_leak_every_attempt_recorded() -> Result<()> {
    let secs: f64 = env_or("CHAOS_SECS", 10.0);
    let rate: f64 = env_or("CHAOS_RATE", 16.0);
    let seed: u64 = env_or("CHAOS_SEED", 14);
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let store = Store::connect(None, &data).await?;
    let (_, key) = store.create_api_key("chaos", None).await?;

    let times = ChaosTimes {
        loris_gap: Duration::from_millis(LORIS_GAP_MS),
        slow_head: Duration::from_millis(200),
    };
    let mut mocks = Vec::new();
    for i in 0..3 {
        let m = MockUpstream::builder()
            .name(&format!("chaos{i}"))
            .record(false)
            .chaos(Chaos::new(seed.wrapping_mul(31).wrapping_add(i), times))
            .start()
            .await?;
        mocks.push(m);
    }
    let model = test_model()?;
    let model = model.to_str().context("model path is not UTF-8")?;
    let engine_args = [
        "engine",
        "serve",
        "--model",
        model,
        "--listen",
        "127.0.0.1:0",
        "--model-name",
        "mock-model",
        "--profile",
        "flaky",
    ];
    let (engine, engine_url) = spawn_listening_with(&engine_args, dir.path(), &Spawn::default())?;
    let relay = CountingRelay::start(&engine_url).await?;

    let cfg = dir.path().join("samewise.toml");
    std::fs::write(&cfg, config(&data, &mocks, &relay.url))?;
    let cfg_arg = cfg.to_str().context("config path is not UTF-8")?;
    let log = dir.path().join("gateway.log");
    let spawn = Spawn {
        log: Some(log.clone()),
        ..Spawn::default()
    };
    let (gateway, url) = spawn_listening_with(&["serve", "--config", cfg_arg], dir.path(), &spawn)?;
    let pid = gateway.pid().context("no gateway pid")?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;

    // the baseline once the gateway serves (its serving threads' runtimes hold descriptors of
    // their own), over a connection already closed again
    {
        let probe = reqwest::Client::new();
        probe
            .get(format!("{url}/healthz"))
            .send()
            .await?
            .error_for_status()?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = proc_stats(pid)?;
    let mut outcomes = load(&client, &url, &key, rate, secs / 2.0, 0).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let half = proc_stats(pid)?;
    let sent_first = outcomes.len();
    outcomes.extend(load(&client, &url, &key, rate, secs / 2.0, sent_first).await?);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let end = proc_stats(pid)?;
    let hanging: usize = mocks.iter().map(MockUpstream::hanging).sum();
    let metrics = scrape(&client, &url).await?;
    // close every connection the gateway has a peer for: what stays open is its own
    drop(client);
    let mock_attempts: u64 = mocks.iter().map(MockUpstream::completion_count).sum();
    for m in mocks {
        m.shutdown().await;
    }
    let engine_attempts = relay.count();
    drop(relay);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let drained = proc_stats(pid)?;
    let status = gateway.stop()?;
    ensure!(status.success(), "the gateway exited {status}");
    drop(engine);

    let attempts = mock_attempts + engine_attempts;
    let records = store
        .request_records(&RecordQuery {
            limit: samewise_store::MAX_QUERY_LIMIT,
            ..RecordQuery::default()
        })
        .await?;
    let with_endpoint = records.iter().filter(|r| r.endpoint.is_some()).count() as u64;
    let mut finals: HashMap<&str, u32> = HashMap::new();
    for r in &records {
        *finals.entry(r.request_id.as_str()).or_default() += u32::from(r.final_attempt);
    }
    let dropped = metric(&metrics, "samewise_record_queue_dropped_total");

    let bound_ms =
        MAX_ATTEMPTS * (FIRST_BYTE_CAP_MS + RETRY_AFTER_MAX_MS + LONGEST_BODY_MS) + 2_000;
    let max = outcomes.iter().map(|o| o.latency).max().unwrap_or_default();
    let mut statuses: HashMap<String, usize> = HashMap::new();
    for o in &outcomes {
        let k = o.status.map_or("transport".to_owned(), |s| s.to_string());
        *statuses.entry(k).or_default() += 1;
    }
    let summary = json!({
        "seed": seed, "rate": rate, "secs": secs, "requests": outcomes.len(),
        "statuses": statuses, "max_latency_ms": max.as_millis() as u64, "bound_ms": bound_ms,
        "attempts_upstream": attempts, "engine_attempts": engine_attempts,
        "records_with_endpoint": with_endpoint, "records": records.len(), "dropped": dropped,
        "failed_over": records.iter().filter(|r| r.final_attempt && r.attempt > 1).count(),
        "gateway": {"start": stats(started), "half": stats(half), "end": stats(end),
            "drained": stats(drained)},
        "hung_requests_held_at_end": hanging,
    });
    println!("chaos summary: {summary}");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    ensure!(
        outcomes.iter().all(|o| o.status.is_some() && o.body_read),
        "a request failed at the transport or its body did not end: {summary}"
    );
    ensure!(
        max <= Duration::from_millis(bound_ms),
        "a request took {max:?}, past the {bound_ms} ms its timeouts allow: {summary}"
    );
    ensure!(
        records.iter().any(|r| r.attempt > 1),
        "no request was failed over: {summary}"
    );
    ensure!(engine_attempts > 0, "the engine got no attempt: {summary}");
    ensure!(dropped == Some(0.0), "records dropped: {summary}");
    ensure!(
        with_endpoint == attempts,
        "{with_endpoint} attempt records for {attempts} attempts made: {summary}\n{}",
        log_text()
    );
    ensure!(
        finals.len() == outcomes.len() && finals.values().all(|&n| n == 1),
        "{} requests recorded for {} sent (each needs one final record): {summary}",
        finals.len(),
        outcomes.len()
    );
    ensure!(
        hanging == 0,
        "{hanging} hung upstream requests still held: {summary}"
    );
    ensure!(
        drained.sockets <= started.sockets,
        "sockets left open with every peer gone: {summary}"
    );
    ensure!(
        end.threads <= half.threads + 2,
        "threads grew over the second half: {summary}"
    );
    ensure!(
        end.rss_kb <= half.rss_kb + half.rss_kb / 4,
        "resident memory grew by more than 25% over the second half: {summary}"
    );
    Ok(())
}

fn stats(s: ProcStats) -> serde_json::Value {
    json!({"rss_kb": s.rss_kb, "threads": s.threads, "fds": s.fds, "sockets": s.sockets})
}

/// The value of an unlabelled metric in a Prometheus text page.
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn config(data: &Path, mocks: &[MockUpstream], engine: &str) -> String {
    let mut out = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
         [limits]\nmax_attempts = {MAX_ATTEMPTS}\nbackoff_max_ms = 200\n\
         retry_after_max_ms = {RETRY_AFTER_MAX_MS}\nrecord_queue_capacity = 100000\n\n\
         [breaker]\ncooldown_ms = 1000\n\n",
        data.display()
    );
    let provider = |name: &str, base: &str| {
        format!(
            "[providers.{name}]\nbase_url = \"{base}\"\nfirst_byte_timeout_ms = {FIRST_BYTE_CAP_MS}\n\
             first_byte_floor_ms = 500\nidle_timeout_ms = {IDLE_MS}\nconnect_timeout_ms = 500\n\n"
        )
    };
    for (i, m) in mocks.iter().enumerate() {
        out.push_str(&provider(&format!("chaos{i}"), &m.base_url()));
    }
    out.push_str(&provider("engine", &format!("{engine}/v1")));
    out.push_str("[models.chaos]\n");
    let names = (0..mocks.len()).map(|i| format!("chaos{i}"));
    for p in names.chain(["engine".to_owned()]) {
        out.push_str(&format!(
            "[[models.chaos.endpoints]]\nprovider = \"{p}\"\nmodel = \"mock-model\"\n"
        ));
    }
    out
}

/// Open-loop load for `secs` at `rate`: every tick one chat request (odd ones streamed),
/// whatever the earlier ones are doing; waits for all of them.
async fn load(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    rate: f64,
    secs: f64,
    first: usize,
) -> Result<Vec<Outcome>> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = Instant::now();
    let mut set = JoinSet::new();
    let mut i = first;
    while start.elapsed().as_secs_f64() < secs {
        tick.tick().await;
        let (client, url, key) = (client.clone(), url.to_owned(), key.to_owned());
        let stream = i % 2 == 1;
        set.spawn(async move { one(&client, &url, &key, stream, i).await });
        i += 1;
    }
    let mut out = Vec::new();
    while let Some(o) = set.join_next().await {
        out.push(o?);
    }
    Ok(out)
}

async fn one(client: &reqwest::Client, url: &str, key: &str, stream: bool, i: usize) -> Outcome {
    let body = json!({"model": "chaos", "stream": stream, "max_tokens": 8,
        "messages": [{"role": "user", "content": format!("Count to {i}.")}]});
    let t = Instant::now();
    let sent = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await;
    let Ok(mut r) = sent else {
        return Outcome {
            latency: t.elapsed(),
            status: None,
            body_read: false,
        };
    };
    let status = Some(r.status().as_u16());
    let body_read = loop {
        match r.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    Outcome {
        latency: t.elapsed(),
        status,
        body_read,
    }
}

/// A TCP relay in front of the engine that counts the completion requests passing through it
/// (request lines `POST /v1/...completions`), so the engine's attempts are counted outside the
/// gateway.
struct CountingRelay {
    url: String,
    count: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingRelay {
    async fn start(target: &str) -> Result<Self> {
        let target = target
            .strip_prefix("http://")
            .context("the engine URL is not http://")?
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let count = Arc::new(AtomicU64::new(0));
        let c = count.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (target, c) = (target.clone(), c.clone());
                conns.spawn(async move {
                    let Ok(upstream) = TcpStream::connect(&target).await else {
                        return;
                    };
                    relay(client, upstream, c).await;
                });
            }
        });
        Ok(CountingRelay { url, count, task })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }
}

impl Drop for CountingRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways until either side closes, counting completion request lines going up.
async fn relay(client: TcpStream, upstream: TcpStream, count: Arc<AtomicU64>) {
    const NEEDLE: &[u8] = b"POST /v1/chat/completions ";
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        // the last bytes of the previous read, so a request line split across reads is seen
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut window = std::mem::take(&mut tail);
            window.extend_from_slice(&buf[..n]);
            let hits = window
                .windows(NEEDLE.len())
                .filter(|w| *w == NEEDLE)
                .count();
            count.fetch_add(hits as u64, Ordering::SeqCst);
            let keep = window.len().min(NEEDLE.len() - 1);
            tail = window[window.len() - keep..].to_vec();
            if uw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = uw.shutdown().await;
    };
    let down = async move {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}
