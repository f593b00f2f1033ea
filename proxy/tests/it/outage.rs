//! The store going away under load (issue 14, item 1), on both backends: PostgreSQL stopped
//! (a private cluster the test starts on its own port and stops; the shared server is never
//! touched) and SQLite on a full disk (`PRAGMA max_page_count` at the file's size). Open-loop
//! load runs through the gateway before, during and after the outage, with a key that was
//! valid before it and whose cache entry expires during it. Every request is answered 200;
//! records wait in the queue up to its bound and the rest are counted as dropped on
//! `/metrics`; the writer says it is waiting (`record_writer_stalled`); writes resume when
//! the database returns; and stored + dropped = served, with no write error. The long run (30 s
//! away at 500 rps, release build) is `bench/store/outage.sh`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::*;
use samewise_store::RecordQuery;
use samewise_store::testing::{PgCluster, TestDb, sqlite_limit_pages};
use samewise_testkit::MockUpstream;
use tokio::time::{Instant, MissedTickBehavior};

/// Requests per second during the test.
const RATE: f64 = 100.0;
/// Queue capacity: the outage (`AWAY` at `RATE`) produces more records than this.
const QUEUE: usize = 150;
/// How long the database is away.
const AWAY: Duration = Duration::from_secs(4);
/// Load before the outage starts.
const BEFORE: Duration = Duration::from_millis(1500);
/// Load after the database returned.
const AFTER: Duration = Duration::from_millis(2500);

fn config(mock: &MockUpstream) -> String {
    // the key's cache entry expires 200 ms into the outage: its lookups then fail, and it keeps
    // working on the stale entry (limits.key_stale_grace_ms, default 15 min)
    format!(
        "{FAST_LIMITS}{}{}",
        provider("p1", &mock.base_url(), ""),
        model("smol", "weighted", &[("p1", "up")])
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_under_load_loses_no_request_and_no_record_uncounted() -> Result<()> {
    let cluster = PgCluster::start()
        .await
        .context("starting a private cluster")?;
    let db = TestDb::postgres_on(&cluster.admin_url()).await?;
    let result = run(db, Fault::Stopped(&cluster)).await;
    if result.is_err() {
        eprintln!("--- the private cluster's log ---\n{}", cluster.log());
    }
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk_under_load_loses_no_request_and_no_record_uncounted() -> Result<()> {
    let db = TestDb::sqlite().await?;
    let store = db.store.clone();
    run(db, Fault::DiskFull(store)).await
}

/// How the test takes the database away.
enum Fault<'a> {
    /// The private cluster is stopped, then started again.
    Stopped(&'a PgCluster),
    /// The SQLite file may not grow, then may again.
    DiskFull(samewise_store::Store),
}

impl Fault<'_> {
    async fn start(&self) -> Result<()> {
        match self {
            Fault::Stopped(c) => c.stop().await?,
            Fault::DiskFull(store) => {
                sqlite_limit_pages(store, Some(0)).await?;
            }
        }
        Ok(())
    }

    async fn end(&self) -> Result<()> {
        match self {
            Fault::Stopped(c) => c.restart().await?,
            Fault::DiskFull(store) => {
                sqlite_limit_pages(store, None).await?;
            }
        }
        Ok(())
    }
}

async fn run(db: TestDb, outage: Fault<'_>) -> Result<()> {
    let mock = MockUpstream::builder().record(false).start().await?;
    let gw = Gateway::start_on(
        &config(&mock),
        Options {
            queue: QUEUE,
            ..Options::default()
        },
        db,
    )
    .await?;
    // the key is valid and cached before the outage
    ensure!(gw.chat(&chat_body("smol")).await?.status() == 200);

    let total = BEFORE + AWAY + AFTER;
    let load = tokio::spawn(drive(gw.url("/v1/chat/completions"), gw.key.clone(), total));
    tokio::time::sleep(BEFORE).await;
    outage.start().await.context("taking the database away")?;
    let away_since = Instant::now();

    // meanwhile: the writer says it waits, and a key never seen cannot be checked (503)
    let mut saw_waiting = false;
    while away_since.elapsed() < AWAY {
        let m = gw.metrics().await?;
        saw_waiting |= metric_value(&m, "samewise_record_writer_stalled", "") == Some(1.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stranger = gw
        .http
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sw-00000000000000000000000000000000")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body("smol"))?)
        .send()
        .await?;
    let stranger_status = stranger.status().as_u16();
    let during = gw.metrics().await?;
    outage.end().await.context("bringing the database back")?;

    let statuses = load.await??;
    // the warm-up request, the load, and the unknown key's rejection: one record each
    let served = statuses.len() as u64 + 2;
    let not_ok: Vec<&String> = statuses.iter().filter(|s| *s != "200").collect();
    ensure!(
        not_ok.is_empty(),
        "{} of {} requests were not answered 200 (first: {:?})",
        not_ok.len(),
        statuses.len(),
        not_ok.first()
    );
    ensure!(
        saw_waiting,
        "record_writer_stalled never showed 1 during the outage"
    );
    // a stopped database cannot check a key; a full disk still can (reads need no room)
    let unknown_key = match outage {
        Fault::Stopped(_) => 503,
        Fault::DiskFull(_) => 401,
    };
    ensure!(
        stranger_status == unknown_key,
        "an unknown key got {stranger_status}, not {unknown_key}"
    );
    let dropped_during = metric_value(&during, "samewise_record_queue_dropped_total", "")
        .context("no dropped counter")?;
    ensure!(
        dropped_during > 0.0,
        "the outage should overflow the queue of {QUEUE}"
    );

    // the writes resume: the queue empties and every served request is stored or dropped
    let deadline = Instant::now() + Duration::from_secs(30);
    let (written, dropped, errors) = loop {
        let m = gw.metrics().await?;
        let v = |name: &str| metric_value(&m, name, "").unwrap_or(-1.0) as i64;
        let (written, dropped, errors, depth, waiting) = (
            v("samewise_records_written_total"),
            v("samewise_record_queue_dropped_total"),
            v("samewise_record_write_errors_total"),
            v("samewise_record_queue_depth"),
            v("samewise_record_writer_stalled"),
        );
        if depth == 0 && waiting == 0 && (written + dropped + errors) as u64 == served {
            break (written, dropped, errors);
        }
        ensure!(
            Instant::now() < deadline,
            "writes did not resume: written {written}, dropped {dropped}, errors {errors}, \
             queued {depth}, waiting {waiting}, served {served}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(errors == 0, "{errors} records lost to write errors");
    let stored = gw
        .db
        .store
        .request_records(&RecordQuery {
            limit: 100_000,
            ..RecordQuery::default()
        })
        .await?
        .len() as u64;
    ensure!(
        stored == written as u64 && stored + dropped as u64 == served,
        "stored {stored} + dropped {dropped} != served {served} (written {written})"
    );
    ensure!(gw.db.store.integrity_check().await?.is_empty());
    eprintln!(
        "served {served}: stored {stored}, dropped {dropped} (queue {QUEUE}, {} s away at {RATE} rps)",
        AWAY.as_secs_f64()
    );
    gw.stop().await
}

/// Open-loop load: one request every 1/RATE s for `total`, whatever the earlier ones do; each
/// request's status (or the client's error) in the order sent.
async fn drive(url: String, key: String, total: Duration) -> Result<Vec<String>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let body = Arc::new(serde_json::to_vec(&chat_body("smol"))?);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / RATE));
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let n = (total.as_secs_f64() * RATE) as usize;
    let mut sent = Vec::with_capacity(n);
    for _ in 0..n {
        tick.tick().await;
        let (client, url, key, body) = (client.clone(), url.clone(), key.clone(), body.clone());
        sent.push(tokio::spawn(async move {
            match client
                .post(url)
                .bearer_auth(key)
                .header("content-type", "application/json")
                .body(body.to_vec())
                .send()
                .await
            {
                Ok(r) => {
                    let status = r.status().as_u16().to_string();
                    // the body read to its end: an answer, not just a head
                    match r.bytes().await {
                        Ok(_) => status,
                        Err(e) => format!("{status} with a broken body: {e}"),
                    }
                }
                Err(e) => format!("client error: {e}"),
            }
        }));
    }
    let mut out = Vec::with_capacity(n);
    for h in sent {
        out.push(h.await?);
    }
    Ok(out)
}
