//! Request lifecycles at the edges: a client that goes away mid-stream (recorded once, as
//! `client_disconnect`), graceful shutdown that lets an in-flight stream finish and drains its
//! record, a `Retry-After` short enough to be waited out on the same endpoint, records that
//! cannot be queued counted on `/metrics`, a breaker's half-open trial over real time, and a
//! trial whose client goes away before the answer (its slot is freed), and the serving threads
//! (`[server] threads` of them while serving, none after a stop or a dropped serve future).

use crate::common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use samewise_testkit::{Behavior, MockUpstream, Reply};
use serde_json::json;

fn single(mock: &MockUpstream, limits: &str) -> String {
    format!(
        "{limits}{}{}",
        provider("p1", &mock.base_url(), ""),
        model("smol", "weighted", &[("p1", "up")])
    )
}

fn slow_stream(pieces: usize, delay_ms: u64) -> Behavior {
    let text: Vec<String> = (0..pieces).map(|i| format!("w{i} ")).collect();
    Behavior::Ok(Reply {
        chunk_delay: Duration::from_millis(delay_ms),
        ..Reply::text(text)
    })
}

#[tokio::test]
async fn client_going_away_mid_stream_is_recorded_once() -> Result<()> {
    let mock = MockUpstream::builder()
        .default_behavior(slow_stream(50, 50))
        .start()
        .await?;
    let gw = Gateway::start(&single(&mock, FAST_LIMITS)).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let mut resp = gw.chat(&body).await?;
    let id = request_id(&resp);
    assert!(resp.chunk().await?.is_some());
    drop(resp);
    let recs = gw.records(&id).await?;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].error_kind.as_deref(), Some("client_disconnect"));
    assert!(recs[0].final_attempt);
    gw.stop().await
}

#[tokio::test]
async fn shutdown_lets_an_open_stream_finish_and_drains_its_record() -> Result<()> {
    let mock = MockUpstream::builder()
        .default_behavior(slow_stream(6, 40))
        .start()
        .await?;
    let gw = Gateway::start(&single(&mock, FAST_LIMITS)).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let mut resp = gw.chat(&body).await?;
    let id = request_id(&resp);
    let first = resp.chunk().await?.unwrap_or_default();
    let store = gw.db.store.clone();
    let reader = async move {
        let mut text = String::from_utf8_lossy(&first).into_owned();
        while let Some(c) = resp.chunk().await? {
            text.push_str(&String::from_utf8_lossy(&c));
        }
        anyhow::Ok(text)
    };
    let (text, stopped) = tokio::join!(reader, async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        gw.stop_keep_db().await
    });
    let (text, db) = (text?, stopped?);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // stop() drained the writer: the record is there without polling
    let q = samewise_store::RecordQuery {
        request_id: Some(id),
        ..Default::default()
    };
    let recs = store.request_records(&q).await?;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].error_kind, None);
    drop(db);
    Ok(())
}

#[tokio::test]
async fn short_retry_after_is_waited_out_on_the_same_endpoint() -> Result<()> {
    let mock = MockUpstream::builder()
        .behavior(Behavior::RateLimited {
            retry_after: Some(1),
        })
        .start()
        .await?;
    let limits = FAST_LIMITS.replace("retry_after_max_ms = 300", "retry_after_max_ms = 2000");
    let gw = Gateway::start(&single(&mock, &limits)).await?;
    let started = tokio::time::Instant::now();
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 200);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].status, Some(429));
    assert_eq!(recs[1].status, Some(200));
    gw.stop().await
}

#[tokio::test]
async fn records_that_cannot_be_queued_are_counted_on_metrics() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let mut gw = Gateway::start(&single(&mock, FAST_LIMITS)).await?;
    gw.stop_writer().await;
    for _ in 0..3 {
        assert_eq!(
            gw.chat(&chat_body("smol")).await?.status(),
            200,
            "the request path does not depend on the store"
        );
    }
    let m = gw.metrics().await?;
    assert_eq!(
        metric_value(&m, "samewise_record_queue_dropped_total", ""),
        Some(3.0),
        "{m}"
    );
    gw.stop().await
}

#[tokio::test]
async fn an_open_breaker_lets_a_trial_through_after_the_cooldown_and_closes() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behaviors([
            Behavior::Status(500, "{}".into()),
            Behavior::Status(500, "{}".into()),
        ])
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let cfg = format!(
        "{FAST_LIMITS}[breaker]\nconsecutive_failures = 2\ncooldown_ms = 150\n{}{}{}",
        provider("a", &a.base_url(), ""),
        provider("b", &b.base_url(), ""),
        model("smol", "weighted", &[("a", "sa"), ("b", "sb")])
    );
    let gw = Gateway::start(&cfg).await?;
    let mut body = chat_body("smol");
    body["provider"] = json!({"order": ["a", "b"]});
    for _ in 0..2 {
        assert_eq!(gw.chat(&body).await?.status(), 200);
    }
    // (that an open breaker is skipped is `failover::breaker_opens_and_the_endpoint_is_skipped`;
    // here the cool-down is short, so only what holds however slow this machine is, is checked)
    assert_eq!(a.request_count(), 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let m = gw.metrics().await?;
    assert_eq!(
        metric_value(&m, "samewise_breaker_state", "endpoint=\"a/sa\""),
        Some(1.0),
        "half-open after the cool-down"
    );
    // the trial goes to a (healthy again) and closes the breaker
    let resp = gw.chat(&body).await?;
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].endpoint.as_deref(), Some("a/sa"));
    assert_eq!(a.request_count(), 3);
    let m = gw.metrics().await?;
    assert_eq!(
        metric_value(&m, "samewise_breaker_state", "endpoint=\"a/sa\""),
        Some(0.0)
    );
    gw.stop().await
}

/// Polls `/metrics` until `endpoint`'s breaker gauge reads `want` (10 s deadline).
async fn wait_breaker(gw: &Gateway, endpoint: &str, want: f64) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = gw.metrics().await?;
        let label = format!("endpoint=\"{endpoint}\"");
        if metric_value(&m, "samewise_breaker_state", &label) == Some(want) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "breaker of {endpoint} never reached {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_client_leaving_during_the_half_open_trial_frees_the_trial() -> Result<()> {
    // two 500s open the breaker; the trial then hangs before its response head
    let a = MockUpstream::builder()
        .behaviors([
            Behavior::Status(500, "{}".into()),
            Behavior::Status(500, "{}".into()),
            Behavior::DelayHeaders(Duration::from_secs(60)),
        ])
        .start()
        .await?;
    let cfg = format!(
        "{FAST_LIMITS}[breaker]\nconsecutive_failures = 2\ncooldown_ms = 50\n{}{}",
        provider("a", &a.base_url(), "first_byte_timeout_ms = 120000"),
        model("smol", "weighted", &[("a", "sa")])
    );
    let gw = Gateway::start(&cfg).await?;
    assert_eq!(gw.chat(&chat_body("smol")).await?.status(), 502);
    wait_breaker(&gw, "a/sa", 1.0).await?;

    // the trial's client goes away while the endpoint has not answered
    let (url, key) = (gw.url("/v1/chat/completions"), gw.key.clone());
    let trial = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(chat_body("smol").to_string())
            .send()
            .await
    });
    a.wait_for_requests(3, Duration::from_secs(10)).await?;
    trial.abort();
    let _ = trial.await;

    // the endpoint gets a new trial (which succeeds): it is not refused until restart
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut last = 0;
    while tokio::time::Instant::now() < deadline {
        let resp = gw.chat(&chat_body("smol")).await?;
        last = resp.status().as_u16();
        if last == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last, 200, "the abandoned trial still holds the only slot");
    assert_eq!(a.request_count(), 4);
    wait_breaker(&gw, "a/sa", 0.0).await?;
    gw.stop().await
}

#[tokio::test]
async fn shutdown_cuts_a_trickling_stream_at_the_drain_deadline() -> Result<()> {
    // a stream that trickles for a minute: one event every 60 ms, 1000 of them
    let mock = MockUpstream::builder()
        .default_behavior(slow_stream(1000, 60))
        .start()
        .await?;
    let cfg = format!(
        "[server]\ndrain_timeout_ms = 300\n{}",
        single(&mock, FAST_LIMITS)
    );
    let gw = Gateway::start(&cfg).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let mut resp = gw.chat(&body).await?;
    let id = request_id(&resp);
    assert!(resp.chunk().await?.is_some());
    let reader = async move {
        loop {
            match resp.chunk().await {
                Ok(Some(_)) => continue,
                Ok(None) => return "ended",
                Err(_) => return "broken",
            }
        }
    };
    // stop() returns once the server has exited (and the writer drained): without a deadline
    // it would wait out the whole stream; 10 s is far past the 300 ms drain timeout
    let (outcome, stopped) = tokio::join!(
        reader,
        tokio::time::timeout(Duration::from_secs(10), gw.stop_keep_db())
    );
    let db = stopped.map_err(|_| anyhow::anyhow!("shutdown still waiting on the stream"))??;
    assert_eq!(
        outcome, "broken",
        "the client sees its stream cut, not completed"
    );
    // the cut stream's attempt is recorded once, and the writer drained it
    let q = samewise_store::RecordQuery {
        request_id: Some(id),
        ..Default::default()
    };
    let recs = db.store.request_records(&q).await?;
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert!(recs[0].final_attempt);
    Ok(())
}

/// The gateway's serving threads now: the threads of this process (nextest runs each test in
/// a process of its own) named `sw-serve-N`.
fn serving_threads() -> Result<usize> {
    let mut n = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        let comm = std::fs::read_to_string(task?.path().join("comm")).unwrap_or_default();
        n += usize::from(comm.starts_with("sw-serve-"));
    }
    Ok(n)
}

/// Polls until the serving threads number `want` (5 s deadline).
async fn wait_serving_threads(want: usize) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = serving_threads()?;
        if n == want {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{n} serving threads, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn serving_threads_are_as_configured_and_gone_after_a_stop_or_a_drop() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let toml = format!("[server]\nthreads = 3\n{}", single(&mock, FAST_LIMITS));
    let gw = Gateway::start(&toml).await?;
    wait_serving_threads(3).await?;
    // 40 requests at once, each on a connection of its own: every one answered and recorded
    let sends = (0..40).map(|_| async {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()?;
        let resp = http
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&gw.key)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&chat_body("smol"))?)
            .send()
            .await?;
        anyhow::Ok((resp.status().as_u16(), request_id(&resp)))
    });
    let answers = futures_util::future::try_join_all(sends).await?;
    for (status, id) in &answers {
        assert_eq!(*status, 200, "{id}");
    }
    for (_, id) in &answers {
        assert_eq!(gw.records(id).await?.len(), 1, "{id}");
    }
    gw.stop().await?;
    wait_serving_threads(0).await?;

    // a serve future dropped without a shutdown signal takes its threads with it
    let toml = format!("[server]\nthreads = 2\n{}", single(&mock, FAST_LIMITS));
    let mut gw = Gateway::start(&toml).await?;
    wait_serving_threads(2).await?;
    assert_eq!(gw.chat(&chat_body("smol")).await?.status().as_u16(), 200);
    gw.abort_serving();
    wait_serving_threads(0).await?;
    anyhow::ensure!(
        gw.chat(&chat_body("smol")).await.is_err(),
        "the listener still answers after its serve future was dropped"
    );
    gw.stop().await
}
