//! Issue 2 items 4 and 9 (upstream side): failover before the first byte (5xx, connect
//! errors, timeouts, resets, 429 with Retry-After), the circuit breaker, failures after the
//! first byte ending the stream with an error event, and upstream garbage — each recorded.

use crate::common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use samewise_testkit::{Behavior, MockUpstream};
use serde_json::json;

/// Two providers a and b serving model `smol`, tried in the order a, b.
fn two(a: &str, b: &str, extra_a: &str, more: &str) -> String {
    format!(
        "{FAST_LIMITS}{more}{}{}{}",
        provider("a", a, extra_a),
        provider("b", b, ""),
        model("smol", "weighted", &[("a", "sa"), ("b", "sb")])
    )
}

fn ordered(stream: bool) -> serde_json::Value {
    let mut body = chat_body("smol");
    body["provider"] = json!({"order": ["a", "b"]});
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// A loopback port nobody listens on.
async fn closed_port_url() -> Result<String> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    drop(l);
    Ok(format!("http://{addr}/v1"))
}

#[tokio::test]
async fn server_error_fails_over_to_the_next_endpoint() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(Behavior::Status(500, r#"{"error":"boom"}"#.into()))
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let gw = Gateway::start(&two(&a.base_url(), &b.base_url(), "", "")).await?;
    let resp = gw.chat(&ordered(false)).await?;
    assert_eq!(resp.status(), 200);
    // the answer names the endpoint that gave it, after the failover
    assert_eq!(endpoint_of(&resp), "b/sb");
    let id = request_id(&resp);
    let body = resp.text().await?;
    assert!(body.contains("from b"), "answered by b: {body}");
    let recs = gw.records(&id).await?;
    assert_eq!(recs.len(), 2);
    assert_eq!((recs[0].attempt, recs[0].final_attempt), (1, false));
    assert_eq!(recs[0].endpoint.as_deref(), Some("a/sa"));
    assert_eq!(recs[0].status, Some(500));
    assert_eq!(recs[0].error_kind.as_deref(), Some("upstream_5xx"));
    assert_eq!((recs[1].attempt, recs[1].final_attempt), (2, true));
    assert_eq!(recs[1].endpoint.as_deref(), Some("b/sb"));
    assert!(recs.iter().all(|r| r.attempts == 2));
    // a's one failure is spent: it answers the next request, a stream
    let resp = gw.chat(&ordered(true)).await?;
    assert_eq!(
        (resp.status().as_u16(), endpoint_of(&resp)),
        (200, "a/sa".to_owned())
    );
    assert!(resp.text().await?.contains("[DONE]"));
    gw.stop().await
}

/// The `x-samewise-endpoint` of a response.
fn endpoint_of(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-samewise-endpoint")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn connect_error_fails_over() -> Result<()> {
    let b = MockUpstream::builder().name("b").start().await?;
    let gw = Gateway::start(&two(&closed_port_url().await?, &b.base_url(), "", "")).await?;
    let resp = gw.chat(&ordered(false)).await?;
    assert_eq!(resp.status(), 200);
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs[0].error_kind.as_deref(), Some("connect"));
    assert_eq!(recs[0].status, None);
    assert_eq!(recs[1].endpoint.as_deref(), Some("b/sb"));
    gw.stop().await
}

/// An `https://` provider goes through the TLS connector (rustls, the Mozilla roots): a server
/// that answers the handshake with plain HTTP and hangs up fails it, a connect error that fails
/// over.
#[tokio::test]
async fn a_failed_tls_handshake_is_a_connect_error_and_fails_over() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let tls_url = format!("https://{}/v1", plain.local_addr()?);
    let handshakes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = std::sync::Arc::clone(&handshakes);
    let server = tokio::spawn(async move {
        while let Ok((mut sock, _)) = plain.accept().await {
            let mut hello = [0u8; 5];
            // a TLS record starts 0x16 (handshake), 0x03 (version major)
            if sock.read_exact(&mut hello).await.is_ok() && hello[..2] == [0x16, 0x03] {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            let _ = sock
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let b = MockUpstream::builder().name("b").start().await?;
    // a fresh gateway per mode: the first failure must not leave `a` ejected for the second
    for stream in [false, true] {
        let gw = Gateway::start(&two(&tls_url, &b.base_url(), "", "")).await?;
        let resp = gw.chat(&ordered(stream)).await?;
        assert_eq!(resp.status(), 200, "stream {stream}");
        let id = request_id(&resp);
        let body = resp.text().await?;
        assert!(body.contains("chatcmpl-b-"), "answered by b: {body}");
        let recs = gw.records(&id).await?;
        assert_eq!(recs.len(), 2, "stream {stream}: {recs:?}");
        assert_eq!(recs[0].endpoint.as_deref(), Some("a/sa"));
        assert_eq!(recs[0].error_kind.as_deref(), Some("connect"));
        assert_eq!(recs[0].status, None);
        assert_eq!(
            (recs[1].endpoint.as_deref(), recs[1].status),
            (Some("b/sb"), Some(200))
        );
        gw.stop().await?;
    }
    assert!(
        handshakes.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "each attempt on `a` opened with a TLS ClientHello"
    );
    server.abort();
    Ok(())
}

#[tokio::test]
async fn first_byte_timeout_fails_over() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(Behavior::DelayHeaders(Duration::from_secs(5)))
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let gw = Gateway::start(&two(
        &a.base_url(),
        &b.base_url(),
        "first_byte_timeout_ms = 150",
        "",
    ))
    .await?;
    let started = tokio::time::Instant::now();
    let resp = gw.chat(&ordered(false)).await?;
    assert_eq!(resp.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(2));
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs[0].error_kind.as_deref(), Some("timeout"));
    assert_eq!(recs[1].error_kind, None);
    gw.stop().await
}

#[tokio::test]
async fn reset_before_the_answer_is_retried() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behaviors([Behavior::ResetBeforeResponse, Behavior::ResetAfterBytes(20)])
        .start()
        .await?;
    let cfg = format!(
        "{FAST_LIMITS}{}{}",
        provider("a", &a.base_url(), ""),
        model("smol", "weighted", &[("a", "sa")])
    );
    let gw = Gateway::start(&cfg).await?;
    // a non-streamed answer is read whole before anything reaches the client, so a reset
    // inside its body is retried too
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 200);
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs.len(), 3);
    assert!(recs[0].error_kind.is_some());
    assert_eq!(recs[1].error_kind.as_deref(), Some("body_reset"));
    assert_eq!(recs[2].error_kind, None);
    gw.stop().await
}

#[tokio::test]
async fn rate_limit_moves_on_and_retry_after_is_honoured_for_later_requests() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(Behavior::RateLimited {
            retry_after: Some(30),
        })
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let gw = Gateway::start(&two(&a.base_url(), &b.base_url(), "", "")).await?;
    let resp = gw.chat(&ordered(false)).await?;
    assert_eq!(resp.status(), 200);
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs[0].status, Some(429));
    assert_eq!(recs[0].error_kind.as_deref(), Some("rate_limited"));
    // a asked for 30 s: the next request, though it prefers a, goes straight to b
    let resp = gw.chat(&ordered(false)).await?;
    assert_eq!(resp.status(), 200);
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].endpoint.as_deref(), Some("b/sb"));
    assert_eq!(a.request_count(), 1);
    gw.stop().await
}

#[tokio::test]
async fn rate_limit_beyond_the_wait_budget_reaches_the_client_as_429() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(Behavior::RateLimited {
            retry_after: Some(30),
        })
        .start()
        .await?;
    let cfg = format!(
        "{FAST_LIMITS}{}{}",
        provider("a", &a.base_url(), ""),
        model("smol", "weighted", &[("a", "sa")])
    );
    let gw = Gateway::start(&cfg).await?;
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 429);
    let retry_after: u64 = resp.headers()["retry-after"].to_str()?.parse()?;
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    let id = request_id(&resp);
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    assert_eq!(v["error"]["type"], "rate_limit_error");
    // only one attempt: the endpoint's Retry-After is beyond retry_after_max (300 ms)
    assert_eq!(a.request_count(), 1);
    let recs = gw.records(&id).await?;
    assert_eq!(recs.len(), 1);
    assert!(recs[0].final_attempt);
    assert_eq!(recs[0].status, Some(429));
    gw.stop().await
}

#[tokio::test]
async fn every_attempt_failing_gives_an_openai_error_and_a_record_each() -> Result<()> {
    let boom = Behavior::Status(503, r#"{"error":{"message":"overloaded"}}"#.into());
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(boom.clone())
        .start()
        .await?;
    let b = MockUpstream::builder()
        .name("b")
        .default_behavior(boom)
        .start()
        .await?;
    let gw = Gateway::start(&two(&a.base_url(), &b.base_url(), "", "")).await?;
    let resp = gw.chat(&ordered(false)).await?;
    assert_eq!(resp.status(), 502);
    // the gateway's own answer: no endpoint gave it
    assert_eq!(endpoint_of(&resp), "");
    let id = request_id(&resp);
    let text = resp.text().await?;
    assert!(!text.contains(PROVIDER_SECRET));
    let v: serde_json::Value = serde_json::from_str(&text)?;
    assert_eq!(v["error"]["type"], "server_error");
    assert_eq!(v["error"]["code"], "upstream_5xx");
    let recs = gw.records(&id).await?;
    assert_eq!(recs.len(), 3, "max_attempts = 3");
    let eps: Vec<_> = recs
        .iter()
        .map(|r| r.endpoint.clone().unwrap_or_default())
        .collect();
    assert_eq!(eps, ["a/sa", "b/sb", "a/sa"]);
    assert_eq!(recs.iter().filter(|r| r.final_attempt).count(), 1);
    assert!(recs[2].final_attempt);
    gw.stop().await
}

#[tokio::test]
async fn breaker_opens_and_the_endpoint_is_skipped() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .default_behavior(Behavior::Status(500, "{}".into()))
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let breaker = "[breaker]\nconsecutive_failures = 2\ncooldown_ms = 60000\n";
    let gw = Gateway::start(&two(&a.base_url(), &b.base_url(), "", breaker)).await?;
    for _ in 0..2 {
        assert_eq!(gw.chat(&ordered(false)).await?.status(), 200);
    }
    assert_eq!(a.request_count(), 2);
    let metrics = gw.metrics().await?;
    assert_eq!(
        metric_value(&metrics, "samewise_breaker_state", "endpoint=\"a/sa\""),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "samewise_breaker_state", "endpoint=\"b/sb\""),
        Some(0.0)
    );
    // open: a is not contacted although the request prefers it
    let resp = gw.chat(&ordered(false)).await?;
    assert_eq!(resp.status(), 200);
    let recs = gw.records(&request_id(&resp)).await?;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].endpoint.as_deref(), Some("b/sb"));
    assert_eq!(a.request_count(), 2);
    gw.stop().await
}

#[tokio::test]
async fn reset_mid_stream_ends_with_an_error_event() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(Behavior::ResetAfterBytes(400))
        .start()
        .await?;
    let cfg = format!(
        "{FAST_LIMITS}{}{}",
        provider("a", &a.base_url(), ""),
        model("smol", "weighted", &[("a", "sa")])
    );
    let gw = Gateway::start(&cfg).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let resp = gw.chat(&body).await?;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let text = resp.text().await?;
    let events = sse_data(&text);
    let last: serde_json::Value =
        serde_json::from_str(events.last().map(String::as_str).unwrap_or("{}"))?;
    assert_eq!(last["error"]["code"], "stream_reset", "{text}");
    assert!(!text.contains("[DONE]"));
    let recs = gw.records(&id).await?;
    assert_eq!(recs.len(), 1, "no failover after the first byte");
    assert_eq!(recs[0].error_kind.as_deref(), Some("stream_reset"));
    assert_eq!(recs[0].status, Some(200));
    gw.stop().await
}

#[tokio::test]
async fn never_ending_stream_hits_the_idle_timeout() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(Behavior::NeverEnds)
        .start()
        .await?;
    let cfg = format!(
        "{FAST_LIMITS}{}{}",
        provider("a", &a.base_url(), "idle_timeout_ms = 200"),
        model("smol", "weighted", &[("a", "sa")])
    );
    let gw = Gateway::start(&cfg).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let resp = gw.chat(&body).await?;
    let id = request_id(&resp);
    let text = tokio::time::timeout(Duration::from_secs(3), resp.text()).await??;
    let events = sse_data(&text);
    let last: serde_json::Value =
        serde_json::from_str(events.last().map(String::as_str).unwrap_or("{}"))?;
    assert_eq!(last["error"]["code"], "stream_idle_timeout", "{text}");
    assert_eq!(
        gw.records(&id).await?[0].error_kind.as_deref(),
        Some("stream_idle_timeout")
    );
    gw.stop().await
}

#[tokio::test]
async fn broken_sse_is_ended_and_recorded() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(Behavior::BrokenSse)
        .start()
        .await?;
    let cfg = format!(
        "{FAST_LIMITS}{}{}",
        provider("a", &a.base_url(), ""),
        model("smol", "weighted", &[("a", "sa")])
    );
    let gw = Gateway::start(&cfg).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let resp = gw.chat(&body).await?;
    let id = request_id(&resp);
    let text = resp.text().await?;
    let events = sse_data(&text);
    assert!(events.len() >= 3, "two good events, then the error: {text}");
    let last: serde_json::Value =
        serde_json::from_str(events.last().map(String::as_str).unwrap_or("{}"))?;
    assert_eq!(last["error"]["code"], "stream_truncated", "{text}");
    assert_eq!(
        gw.records(&id).await?[0].error_kind.as_deref(),
        Some("stream_truncated")
    );
    gw.stop().await
}

#[tokio::test]
async fn malformed_json_passes_through_and_is_recorded() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behaviors([Behavior::MalformedJson, Behavior::MalformedJson])
        .start()
        .await?;
    let cfg = format!(
        "{FAST_LIMITS}{}{}",
        provider("a", &a.base_url(), ""),
        model("smol", "weighted", &[("a", "sa")])
    );
    let gw = Gateway::start(&cfg).await?;
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let bytes = resp.bytes().await?;
    assert!(
        serde_json::from_slice::<serde_json::Value>(&bytes).is_err(),
        "the upstream's bytes, as sent"
    );
    assert!(!bytes.is_empty());
    assert_eq!(
        gw.records(&id).await?[0].error_kind.as_deref(),
        Some("invalid_json")
    );

    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let resp = gw.chat(&body).await?;
    let id = request_id(&resp);
    let text = resp.text().await?;
    assert!(text.contains("[DONE]"));
    assert_eq!(
        gw.records(&id).await?[0].error_kind.as_deref(),
        Some("invalid_json")
    );
    gw.stop().await
}

#[tokio::test]
async fn upstream_errors_show_on_metrics() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(Behavior::Status(500, "{}".into()))
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let gw = Gateway::start(&two(&a.base_url(), &b.base_url(), "", "")).await?;
    let resp = gw.chat(&ordered(false)).await?;
    gw.records(&request_id(&resp)).await?;
    let m = gw.metrics().await?;
    assert_eq!(
        metric_value(
            &m,
            "samewise_upstream_errors_total",
            "kind=\"upstream_5xx\""
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "samewise_requests_total",
            "endpoint=\"b/sb\",status_class=\"2xx\""
        ),
        Some(1.0),
        "{m}"
    );
    assert!(m.contains("samewise_ttft_seconds_bucket"), "{m}");
    assert!(
        m.contains("samewise_request_duration_seconds_count{model=\"smol\"} 1"),
        "{m}"
    );
    assert!(!m.contains(PROVIDER_SECRET));
    gw.stop().await
}

#[tokio::test]
async fn upstream_client_errors_pass_through_without_failover() -> Result<()> {
    let body = r#"{"error":{"message":"max_tokens is too large","type":"invalid_request_error","param":"max_tokens","code":null}}"#;
    let a = MockUpstream::builder()
        .name("a")
        .behavior(Behavior::Status(400, body.into()))
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let gw = Gateway::start(&two(&a.base_url(), &b.base_url(), "", "")).await?;
    let resp = gw.chat(&ordered(false)).await?;
    assert_eq!(
        (resp.status().as_u16(), endpoint_of(&resp)),
        (400, "a/sa".to_owned())
    );
    let id = request_id(&resp);
    assert_eq!(resp.text().await?, body);
    let recs = gw.records(&id).await?;
    assert_eq!(
        recs.len(),
        1,
        "a 4xx is the request's fault: no other endpoint is tried"
    );
    assert_eq!(recs[0].error_kind.as_deref(), Some("upstream_4xx"));
    assert_eq!(recs[0].status, Some(400));
    assert_eq!(b.request_count(), 0);
    gw.stop().await
}
