//! A crash of the gateway (issue 14, item 2): `samewise serve` is killed with SIGKILL while
//! streams are open and requests are in flight, on SQLite and on PostgreSQL. Each open stream
//! ends broken at the client (an error, never a `[DONE]`); a new `samewise serve` on the same
//! store starts, answers the same key, and every record stored before the kill is still there;
//! the store's integrity check finds nothing. (The other crashes of item 2 are tested where they
//! live: the probe scheduler's standby in `probes/tests/it/scheduler.rs`
//! (`standby_scheduler_takes_over_when_the_lock_is_freed`), a SIGKILLed eval worker's lease
//! taken over in `evals_e2e::sigkilled_worker_is_taken_over_{sqlite,postgres}`.)

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_store::{Backend, RecordQuery};
use samewise_testkit::{Behavior, MockUpstream, Reply};
use serde_json::json;

use crate::common::{Spawn, gateway_store, spawn_listening_with};

/// Requests answered (and stored) before the kill.
const BEFORE: usize = 20;
/// Streams open at the kill.
const STREAMS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_on_sqlite_breaks_the_streams_and_a_restart_works() -> Result<()> {
    crash(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_on_postgres_breaks_the_streams_and_a_restart_works() -> Result<()> {
    crash(Backend::Postgres).await
}

fn config(data: &Path, fast: &str, slow: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
         [providers.fast]\nbase_url = \"{fast}\"\n[providers.slow]\nbase_url = \"{slow}\"\n\n\
         [models.fast]\n[[models.fast.endpoints]]\nprovider = \"fast\"\nmodel = \"m\"\n\
         [models.slow]\n[[models.slow.endpoints]]\nprovider = \"slow\"\nmodel = \"m\"\n",
        data.display()
    )
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    model: &str,
    stream: bool,
) -> Result<reqwest::Response> {
    let body = json!({"model": model, "stream": stream,
        "messages": [{"role": "user", "content": "Say hi"}]});
    Ok(client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?)
}

async fn crash(backend: Backend) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let (store, pg) = gateway_store(backend, &data).await?;
    let db_url = pg.as_ref().map(|db| db.url().to_owned());
    let (_, key) = store.create_api_key("crash", None).await?;

    let fast = MockUpstream::builder().record(false).start().await?;
    let pieces: Vec<String> = (0..400).map(|i| format!("w{i} ")).collect();
    let slow = MockUpstream::builder()
        .record(false)
        .default_behavior(Behavior::Ok(Reply {
            chunk_delay: Duration::from_millis(50),
            ..Reply::text(pieces)
        }))
        .start()
        .await?;
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(&cfg, config(&data, &fast.base_url(), &slow.base_url()))?;
    let cfg_arg = cfg.to_str().context("config path is not UTF-8")?;
    let log = dir.path().join("gateway.log");
    let spawn = Spawn {
        env: db_url.iter().map(|u| ("DATABASE_URL", u.clone())).collect(),
        log: Some(log.clone()),
        ..Spawn::default()
    };
    let (gateway, url) = spawn_listening_with(&["serve", "--config", cfg_arg], dir.path(), &spawn)?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;

    // answered and stored before the crash
    let mut ids = Vec::new();
    for _ in 0..BEFORE {
        let r = post(&client, &url, &key, "fast", false).await?;
        ensure!(r.status() == 200, "{}", r.status());
        ids.push(
            r.headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .context("no x-request-id")?
                .to_owned(),
        );
        r.bytes().await?;
    }
    let all = RecordQuery {
        limit: 10_000,
        ..RecordQuery::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.request_records(&all).await?.len() < BEFORE {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the {BEFORE} records were not written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // streams open, with their first bytes read, and more requests in flight: then SIGKILL
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let mut r = post(&client, &url, &key, "slow", true).await?;
        ensure!(r.status() == 200);
        let first = r.chunk().await?.context("no first chunk")?;
        streams.push((r, String::from_utf8_lossy(&first).into_owned()));
    }
    let traffic = Arc::new(AtomicBool::new(true));
    let busy = {
        let (client, url, key, on) = (client.clone(), url.clone(), key.clone(), traffic.clone());
        tokio::spawn(async move {
            while on.load(Ordering::Relaxed) {
                let _ = post(&client, &url, &key, "fast", false).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = gateway.kill()?;
    ensure!(!status.success(), "a SIGKILLed gateway exited {status}");
    traffic.store(false, Ordering::Relaxed);
    busy.await?;

    // each open stream ends broken: a body error, without [DONE]
    for (i, (mut r, mut text)) in streams.into_iter().enumerate() {
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match r.chunk().await {
                    Ok(Some(c)) => text.push_str(&String::from_utf8_lossy(&c)),
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        })
        .await
        .with_context(|| format!("stream {i} did not end within 10 s of the kill"))?;
        ensure!(
            ended.is_err(),
            "stream {i} ended cleanly after the kill: {text}"
        );
        ensure!(!text.contains("[DONE]"), "stream {i} got [DONE]: {text}");
    }

    // a new gateway on the same store: starts, answers the same key, keeps the old records
    let (gateway, url) = spawn_listening_with(&["serve", "--config", cfg_arg], dir.path(), &spawn)
        .with_context(|| {
            format!(
                "restarting after the kill; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
    let r = post(&client, &url, &key, "fast", false).await?;
    ensure!(r.status() == 200, "after the restart: {}", r.status());
    r.bytes().await?;
    let r = post(&client, &url, &key, "fast", true).await?;
    ensure!(r.status() == 200);
    let text = r.text().await?;
    ensure!(
        text.trim_end().ends_with("data: [DONE]"),
        "a stream after the restart did not finish"
    );
    let status = gateway.stop()?;
    ensure!(status.success(), "the restarted gateway exited {status}");

    let records = store.request_records(&all).await?;
    for id in &ids {
        ensure!(
            records.iter().any(|r| &r.request_id == id),
            "record {id}, stored before the kill, is gone"
        );
    }
    // the two requests after the restart were drained into the store at its SIGTERM
    ensure!(
        records.len() >= BEFORE + 2,
        "{} records after the restart",
        records.len()
    );
    let problems = store.integrity_check().await?;
    ensure!(problems.is_empty(), "integrity check: {problems:?}");
    store.close().await;
    drop(pg);
    Ok(())
}

/// A SIGTERM sent the moment `samewise serve` or `samewise engine serve` prints its "listening
/// on" line drains it and exits 0: the signal handlers are installed before the line. (They were
/// installed when the shutdown future was first polled, after the gateway's start-up, so a
/// signal in between killed it with the default action: the PostgreSQL crash test's restarted
/// gateway exited "signal: 15" on a busy machine, and this test in its first round.)
#[test]
fn sigterm_right_after_the_listening_line_drains_and_exits_0() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(
        &cfg,
        config(
            &dir.path().join("data"),
            "http://127.0.0.1:9",
            "http://127.0.0.1:9",
        ),
    )?;
    let cfg = cfg.to_str().context("path")?;
    for round in 0..3 {
        let (gateway, _) =
            spawn_listening_with(&["serve", "--config", cfg], dir.path(), &Spawn::default())?;
        let status = gateway.stop()?;
        ensure!(
            status.success(),
            "round {round}: samewise serve exited {status}"
        );
    }
    let (engine, _) = crate::common::probes::engine("reference", dir.path())?;
    let status = engine.stop()?;
    ensure!(status.success(), "samewise engine serve exited {status}");
    Ok(())
}
