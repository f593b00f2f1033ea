//! Issue 14, the hung provider: an endpoint that accepts connections and never answers. Its
//! attempts count against it while still in flight (outlier ejection), the first-byte deadlines
//! follow what the endpoint was seen to take (within floor and cap), an optional hedge races a
//! second endpoint and cancels the loser, and an ejected endpoint comes back once it answers.

use crate::common;

use std::time::Duration;

use anyhow::{Result, bail};
use common::*;
use futures_util::future::join_all;
use samewise_testkit::{Behavior, MockUpstream};
use serde_json::json;

/// Providers a (tried first) and b serving model `smol`; `extra_a` tunes a, `model_extra` goes
/// into the model's table, `more` adds tables (a `[breaker]`).
fn two(a: &str, b: &str, extra_a: &str, model_extra: &str, more: &str) -> String {
    let model = model("smol", "weighted", &[("a", "sa"), ("b", "sb")]).replacen(
        "policy = \"weighted\"\n",
        &format!("policy = \"weighted\"\n{model_extra}\n"),
        1,
    );
    format!(
        "{FAST_LIMITS}{more}{}{}{model}",
        provider("a", a, extra_a),
        provider("b", b, ""),
    )
}

/// A chat request that tries a first, then b.
fn a_first() -> serde_json::Value {
    let mut body = chat_body("smol");
    body["provider"] = json!({"order": ["a", "b"]});
    body
}

/// The breaker state of `endpoint` on /metrics (0 closed, 1 half-open, 2 open).
async fn breaker(gw: &Gateway, endpoint: &str) -> Result<Option<f64>> {
    let m = gw.metrics().await?;
    Ok(metric_value(
        &m,
        "samewise_breaker_state",
        &format!("endpoint=\"{endpoint}\""),
    ))
}

/// Polls `f` every 10 ms until it holds, failing after `secs` seconds.
async fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !f() {
        if tokio::time::Instant::now() > deadline {
            bail!("not within {secs} s: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// One request answered by b alone, so that a's attempts have a peer to be compared with.
async fn measure_b(gw: &Gateway) -> Result<()> {
    let mut body = chat_body("smol");
    body["provider"] = json!({"order": ["b"], "allow_fallbacks": false});
    assert_eq!(gw.chat(&body).await?.status(), 200);
    Ok(())
}

/// Sends `n` requests at once; every answer must be a 200 from b. Returns their request ids.
async fn wave(gw: &Gateway, n: usize) -> Result<Vec<String>> {
    let body = a_first();
    let resps = join_all((0..n).map(|_| gw.chat(&body))).await;
    let mut ids = Vec::new();
    for r in resps {
        let r = r?;
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        assert!(r.text().await?.contains("from b"));
        ids.push(id);
    }
    Ok(ids)
}

#[tokio::test]
async fn a_hung_endpoint_is_ejected_while_its_attempts_are_in_flight() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(Behavior::Hang)
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    // the cap (10 s) is far beyond the test's patience: only ejection can end a's attempts
    let gw = Gateway::start(&two(
        &a.base_url(),
        &b.base_url(),
        "first_byte_floor_ms = 100\nfirst_byte_timeout_ms = 10000",
        "",
        "",
    ))
    .await?;

    // 20 requests try a first: each is overdue past the floor (a has never answered, b answers
    // in milliseconds), the fifth overdue attempt opens a's breaker, and every overdue attempt
    // then fails over to b
    measure_b(&gw).await?;
    let ids = wave(&gw, 20).await?;
    assert_eq!(breaker(&gw, "a/sa").await?, Some(2.0), "a is ejected");
    for id in &ids {
        let recs = gw.records(id).await?;
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert_eq!(recs[0].endpoint.as_deref(), Some("a/sa"));
        assert_eq!(recs[0].error_kind.as_deref(), Some("timeout"));
        // given up on at the ejection (about 0.1 s), not at the 10 s timeout
        let waited = recs[0].latency_ms;
        assert!(waited < 5_000.0, "a's attempt waited {waited} ms");
        assert_eq!(recs[1].endpoint.as_deref(), Some("b/sb"));
        assert_eq!(recs[1].error_kind, None);
    }
    assert_eq!(a.request_count(), 20);

    // from now on a is skipped: every request goes straight to b, in one attempt
    let ids = wave(&gw, 20).await?;
    for id in &ids {
        let recs = gw.records(id).await?;
        assert_eq!(recs.len(), 1, "{recs:?}");
        assert_eq!(recs[0].endpoint.as_deref(), Some("b/sb"));
    }
    assert_eq!(
        a.request_count(),
        20,
        "no request reached a after its ejection"
    );
    // the abandoned attempts dropped their connections
    eventually(5, "a holds no request", || a.hanging() == 0).await?;
    gw.stop().await
}

#[tokio::test]
async fn a_slow_start_everywhere_is_not_an_outlier() -> Result<()> {
    let slow = Behavior::DelayHeaders(Duration::from_millis(600));
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(slow.clone())
        .start()
        .await?;
    let b = MockUpstream::builder()
        .name("b")
        .default_behavior(slow)
        .start()
        .await?;
    let gw = Gateway::start(&two(
        &a.base_url(),
        &b.base_url(),
        "first_byte_floor_ms = 100\nfirst_byte_timeout_ms = 10000",
        "",
        "",
    ))
    .await?;
    // past a's floor, but no other endpoint has answered faster: no attempt is overdue, none is
    // given up, and neither endpoint is ejected
    let body = a_first();
    let resps = join_all((0..10).map(|_| gw.chat(&body))).await;
    for r in resps {
        let r = r?;
        assert_eq!(r.status(), 200);
        let recs = gw.records(&request_id(&r)).await?;
        assert_eq!(recs.len(), 1, "{recs:?}");
        assert_eq!(recs[0].endpoint.as_deref(), Some("a/sa"));
    }
    assert_eq!(breaker(&gw, "a/sa").await?, Some(0.0));
    assert_eq!(b.request_count(), 0);
    gw.stop().await
}

#[tokio::test]
async fn an_ejected_endpoint_comes_back_once_it_answers() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(Behavior::Hang)
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let gw = Gateway::start(&two(
        &a.base_url(),
        &b.base_url(),
        "first_byte_floor_ms = 100\nfirst_byte_timeout_ms = 10000",
        "",
        "[breaker]\ncooldown_ms = 200\n",
    ))
    .await?;
    measure_b(&gw).await?;
    wave(&gw, 10).await?;
    assert_eq!(breaker(&gw, "a/sa").await?, Some(2.0));

    // a answers again: after the cool-down, a half-open trial reaches it and closes the breaker
    a.set_default(Behavior::text(["back"]));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let resp = gw.chat(&a_first()).await?;
        assert_eq!(resp.status(), 200);
        if resp.text().await?.contains("back") {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("a never came back");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(breaker(&gw, "a/sa").await?, Some(0.0), "closed again");
    // and it takes traffic in one attempt
    let resp = gw.chat(&a_first()).await?;
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].endpoint.as_deref(), Some("a/sa"));
    gw.stop().await
}

#[tokio::test]
async fn the_first_byte_timeout_follows_observed_times_within_floor_and_cap() -> Result<()> {
    let a = MockUpstream::builder().name("a").start().await?;
    let b = MockUpstream::builder().name("b").start().await?;
    // one overdue attempt must not eject a here: only timeouts are looked at
    let gw = Gateway::start(&two(
        &a.base_url(),
        &b.base_url(),
        "first_byte_floor_ms = 300\nfirst_byte_timeout_ms = 1500",
        "",
        "[breaker]\nconsecutive_failures = 100\n",
    ))
    .await?;
    // Never measured: a slow answer (2 s) is waited for up to the cap, not cut at the floor.
    a.push(Behavior::DelayHeaders(Duration::from_secs(2)));
    let resp = gw.chat(&a_first()).await?;
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs[0].error_kind.as_deref(), Some("timeout"));
    let waited = recs[0].latency_ms;
    assert!((1500.0..1990.0).contains(&waited), "waited {waited} ms");

    // Measured fast (a few ms) many times: the expected time falls under the floor, so the
    // timeout is the floor: a 2 s answer is cut after about 300 ms, not at the cap.
    for _ in 0..40 {
        let resp = gw.chat(&a_first()).await?;
        assert!(resp.text().await?.contains("from a"));
    }
    a.push(Behavior::DelayHeaders(Duration::from_secs(2)));
    let resp = gw.chat(&a_first()).await?;
    assert_eq!(resp.status(), 200);
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs[0].error_kind.as_deref(), Some("timeout"));
    assert_eq!(recs[1].endpoint.as_deref(), Some("b/sb"));
    let waited = recs[0].latency_ms;
    assert!((300.0..1400.0).contains(&waited), "waited {waited} ms");
    gw.stop().await
}

#[tokio::test]
async fn a_hedge_wins_on_the_healthy_endpoint_and_the_loser_is_cancelled() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(Behavior::Hang)
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    // a's own deadlines are long (floor 5 s): only the hedge can answer quickly
    let gw = Gateway::start(&two(
        &a.base_url(),
        &b.base_url(),
        "first_byte_floor_ms = 5000\nfirst_byte_timeout_ms = 10000",
        "hedge_after_ms = 100",
        "",
    ))
    .await?;
    for stream in [false, true] {
        let mut body = a_first();
        body["stream"] = json!(stream);
        let resp = gw.chat(&body).await?;
        assert_eq!(resp.status(), 200);
        let id = request_id(&resp);
        let text = resp.text().await?;
        assert!(text.contains("chatcmpl-b-"), "answered by b: {text}");
        let recs = gw.records(&id).await?;
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert_eq!(recs[0].attempt, 1);
        assert_eq!(recs[0].endpoint.as_deref(), Some("a/sa"));
        assert_eq!(recs[0].error_kind.as_deref(), Some("hedge_lost"));
        assert!(!recs[0].final_attempt);
        assert_eq!(recs[1].attempt, 2);
        assert_eq!(recs[1].endpoint.as_deref(), Some("b/sb"));
        assert_eq!(recs[1].error_kind, None);
        assert!(recs[1].final_attempt);
        assert!(recs.iter().all(|r| r.attempts == 2));
        // the loser's connection was dropped: a holds nothing
        eventually(5, "a's hung request is closed", || a.hanging() == 0).await?;
    }
    assert_eq!(a.request_count(), 2);
    assert_eq!(b.request_count(), 2);
    // losing a race is not an endpoint error on /metrics
    let m = gw.metrics().await?;
    assert!(!m.contains("hedge_lost"), "{m}");

    // but a primary beaten by its hedge counts against its endpoint: after five in a row
    // (the default breaker), a is ejected under hedging too and requests go straight to b
    for _ in 0..3 {
        assert_eq!(gw.chat(&a_first()).await?.status(), 200);
    }
    assert_eq!(breaker(&gw, "a/sa").await?, Some(2.0), "a is ejected");
    let resp = gw.chat(&a_first()).await?;
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0].endpoint.as_deref(), Some("b/sb"));
    assert_eq!(a.request_count(), 5);
    gw.stop().await
}

#[tokio::test]
async fn hedging_is_off_by_default_and_never_with_one_endpoint() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(Behavior::Hang)
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let gw = Gateway::start(&two(
        &a.base_url(),
        &b.base_url(),
        "first_byte_floor_ms = 100\nfirst_byte_timeout_ms = 300",
        "",
        "",
    ))
    .await?;
    let resp = gw.chat(&a_first()).await?;
    assert_eq!(resp.status(), 200);
    let recs = gw.records(&request_id(&resp)).await?;
    let kinds: Vec<Option<&str>> = recs.iter().map(|r| r.error_kind.as_deref()).collect();
    assert_eq!(
        kinds,
        [Some("timeout"), None],
        "no hedge: a timed out, then b"
    );
    gw.stop().await?;

    // hedging on, but the plan has one endpoint: nothing to hedge on
    let cfg = format!(
        "{FAST_LIMITS}{}{}",
        provider(
            "a",
            &a.base_url(),
            "first_byte_floor_ms = 100\nfirst_byte_timeout_ms = 300"
        ),
        model("smol", "weighted", &[("a", "sa")]).replacen(
            "policy = \"weighted\"\n",
            "policy = \"weighted\"\nhedge_after_ms = 20\n",
            1
        ),
    );
    let gw = Gateway::start(&cfg).await?;
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 504);
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs.len(), 3, "max_attempts, none of them a hedge");
    assert!(
        recs.iter()
            .all(|r| r.error_kind.as_deref() == Some("timeout")),
        "{recs:?}"
    );
    gw.stop().await
}

#[tokio::test]
async fn a_client_leaving_during_a_hedge_drops_both_attempts() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(Behavior::Hang)
        .start()
        .await?;
    let b = MockUpstream::builder()
        .name("b")
        .default_behavior(Behavior::Hang)
        .start()
        .await?;
    let gw = Gateway::start(&two(
        &a.base_url(),
        &b.base_url(),
        "first_byte_floor_ms = 5000\nfirst_byte_timeout_ms = 10000",
        "hedge_after_ms = 50",
        "",
    ))
    .await?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()?;
    let (a_wait, b_wait) = (
        a.wait_for_requests(1, Duration::from_secs(5)),
        b.wait_for_requests(1, Duration::from_secs(5)),
    );
    let sent = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&gw.key)
        .header("content-type", "application/json")
        .body(a_first().to_string())
        .send();
    let (sent, a_seen, b_seen) = tokio::join!(sent, a_wait, b_wait);
    assert!(sent.is_err(), "the client gave up");
    a_seen?;
    b_seen?;
    // both upstream connections are dropped with the request
    eventually(5, "a and b hold no request", || {
        a.hanging() == 0 && b.hanging() == 0
    })
    .await?;
    // the gateway goes on serving, and neither endpoint's breaker counted the abandoned race
    b.set_default(Behavior::text(["fine"]));
    let resp = gw
        .chat(&{
            let mut body = chat_body("smol");
            body["provider"] = json!({"order": ["b"]});
            body
        })
        .await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(breaker(&gw, "a/sa").await?, Some(0.0));
    assert_eq!(breaker(&gw, "b/sb").await?, Some(0.0));
    gw.stop().await
}
