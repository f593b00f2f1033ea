//! Issue 2 items 8, 9 (client side) and 11: samewise keys (401, per-key rpm -> 429 with
//! Retry-After, revocation within the cache TTL), bad input answered with OpenAI-shaped 4xx
//! and recorded, `/metrics` and `/healthz`. Issue 14 item 6: a key's concurrent streams are
//! bounded (429 `too_many_streams`), and so are request heads (431).

use crate::common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use samewise_testkit::{Behavior, MockUpstream, Reply};
use serde_json::json;

fn cfg(mock: &MockUpstream, server: &str) -> String {
    format!(
        "{server}{FAST_LIMITS}{}{}",
        provider("p1", &mock.base_url(), ""),
        model("smol", "weighted", &[("p1", "up")])
    )
}

async fn error_json(resp: reqwest::Response) -> Result<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    Ok(v)
}

#[tokio::test]
async fn missing_or_wrong_key_is_401_and_recorded() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start(&cfg(&mock, "")).await?;
    let body = serde_json::to_vec(&chat_body("smol"))?;
    for auth in [None, Some("Bearer sw-0000"), Some("Basic abc")] {
        let mut rb = gw
            .http
            .post(gw.url("/v1/chat/completions"))
            .body(body.clone());
        if let Some(a) = auth {
            rb = rb.header("authorization", a);
        }
        let resp = rb.send().await?;
        assert_eq!(resp.status(), 401, "{auth:?}");
        let id = request_id(&resp);
        let v = error_json(resp).await?;
        assert_eq!(v["error"]["type"], "authentication_error");
        assert_eq!(v["error"]["code"], "invalid_api_key");
        let recs = gw.records(&id).await?;
        assert_eq!(recs.len(), 1);
        assert_eq!(
            (recs[0].attempt, recs[0].endpoint.clone(), recs[0].status),
            (0, None, Some(401))
        );
        assert_eq!(recs[0].error_kind.as_deref(), Some("invalid_api_key"));
    }
    for path in ["/v1/models", "/v1/models/smol", "/v1/models/nope"] {
        let resp = gw.http.get(gw.url(path)).send().await?;
        assert_eq!(resp.status(), 401, "{path}");
    }
    assert_eq!(mock.request_count(), 0);
    gw.stop().await
}

#[tokio::test]
async fn per_key_rpm_limit_gives_429_with_retry_after() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start_with(
        &cfg(&mock, ""),
        Options {
            rpm: Some(2),
            ..Options::default()
        },
    )
    .await?;
    for _ in 0..2 {
        assert_eq!(gw.chat(&chat_body("smol")).await?.status(), 200);
    }
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 429);
    let wait: u64 = resp.headers()["retry-after"].to_str()?.parse()?;
    assert!((1..=30).contains(&wait), "{wait}");
    let id = request_id(&resp);
    let v = error_json(resp).await?;
    assert_eq!(v["error"]["type"], "rate_limit_error");
    let recs = gw.records(&id).await?;
    assert_eq!(recs[0].status, Some(429));
    assert!(
        recs[0].key_id.is_some(),
        "a rate-limited request is attributed to its key"
    );
    assert_eq!(mock.request_count(), 2);
    gw.stop().await
}

#[tokio::test]
async fn revoked_key_stops_working_within_the_cache_ttl() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start(&cfg(&mock, "")).await?;
    assert_eq!(gw.chat(&chat_body("smol")).await?.status(), 200);
    assert!(gw.db.store.revoke_api_key("test").await?);
    // key_cache_ttl_ms = 200 in FAST_LIMITS: within a bounded time the key is refused
    let revoked_at = tokio::time::Instant::now();
    loop {
        let status = gw.chat(&chat_body("smol")).await?.status();
        if status == 401 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            revoked_at.elapsed() < Duration::from_secs(5),
            "revocation not seen after 5 s (TTL 200 ms)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.stop().await
}

#[tokio::test]
async fn bad_input_gets_openai_4xx_and_is_recorded() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start(&cfg(&mock, "[server]\nbody_limit_bytes = 2048\n")).await?;
    let big = format!(
        r#"{{"model":"smol","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(4096)
    );
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "/v1/chat/completions",
            "{not json".into(),
            400,
            "invalid_json",
        ),
        (
            "/v1/chat/completions",
            "[1,2]".into(),
            400,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"smol"}"#.into(),
            400,
            "missing_field",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"smol","messages":"hi"}"#.into(),
            400,
            "invalid_type",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"smol","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#
                .into(),
            400,
            "invalid_type",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":["smol"],"messages":[]}"#.into(),
            400,
            "invalid_type",
        ),
        (
            "/v1/completions",
            r#"{"model":"smol"}"#.into(),
            400,
            "missing_field",
        ),
        (
            "/v1/completions",
            r#"{"model":"smol","prompt":7}"#.into(),
            400,
            "invalid_type",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#.into(),
            404,
            "model_not_found",
        ),
        ("/v1/chat/completions", big, 413, "request_too_large"),
    ];
    for (path, body, status, code) in cases {
        let resp = gw
            .http
            .post(gw.url(path))
            .bearer_auth(&gw.key)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await?;
        assert_eq!(resp.status().as_u16(), status, "{code}: {body:.80}");
        let id = request_id(&resp);
        let v = error_json(resp).await?;
        assert_eq!(v["error"]["code"], code, "{v}");
        let recs = gw.records(&id).await?;
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].status, Some(status));
        assert_eq!(recs[0].error_kind.as_deref(), Some(code));
        assert_eq!(recs[0].endpoint, None);
        assert!(recs[0].key_id.is_some());
    }
    // the unknown model is attributed to the name sent, and labelled `unknown` in metrics
    let m = gw.metrics().await?;
    assert!(
        m.contains(
            r#"samewise_requests_total{model="unknown",endpoint="none",status_class="4xx"}"#
        ),
        "{m}"
    );
    assert!(!m.contains("nope"));
    assert_eq!(mock.request_count(), 0);
    // a compressed body is named as such (it would read as "not valid JSON"); identity is fine
    let chat = br#"{"model":"smol","messages":[{"role":"user","content":"x"}]}"#;
    for (encoding, status) in [("gzip", 400), ("br", 400), ("Identity", 200)] {
        let resp = gw
            .http
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&gw.key)
            .header("content-encoding", encoding)
            .body(chat.to_vec())
            .send()
            .await?;
        assert_eq!(resp.status().as_u16(), status, "{encoding}");
        if status == 400 {
            let v = error_json(resp).await?;
            assert_eq!(v["error"]["code"], "unsupported_content_encoding", "{v}");
            let message = v["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(encoding), "{v}");
        }
    }
    assert_eq!(mock.request_count(), 1);
    gw.stop().await
}

#[tokio::test]
async fn provider_preferences_that_match_nothing_are_a_404() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start(&cfg(&mock, "")).await?;
    let mut body = chat_body("smol");
    body["provider"] = json!({"only": ["elsewhere"]});
    let resp = gw.chat(&body).await?;
    assert_eq!(resp.status(), 404);
    assert_eq!(
        error_json(resp).await?["error"]["code"],
        "no_endpoints_match"
    );
    body["provider"] = json!({"sort": "fastest"});
    let resp = gw.chat(&body).await?;
    assert_eq!(resp.status(), 400);
    assert_eq!(error_json(resp).await?["error"]["param"], "provider");
    gw.stop().await
}

#[tokio::test]
async fn health_metrics_and_unknown_routes() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start(&cfg(&mock, "")).await?;
    let resp = gw.http.get(gw.url("/healthz")).send().await?;
    assert_eq!(resp.status(), 200);
    let resp = gw.get("/v1/nothing").await?;
    assert_eq!(resp.status(), 404);
    error_json(resp).await?;
    let resp = gw.get("/v1/chat/completions").await?;
    assert_eq!(resp.status(), 405);
    error_json(resp).await?;
    let resp = gw.chat(&chat_body("smol")).await?;
    gw.records(&request_id(&resp)).await?;
    let m = gw.metrics().await?;
    for needle in [
        "samewise_requests_total{model=\"smol\",endpoint=\"p1/up\",status_class=\"2xx\"} 1",
        "samewise_record_queue_dropped_total 0",
        "samewise_records_written_total",
        "samewise_record_write_errors_total 0",
        "samewise_breaker_state{endpoint=\"p1/up\"} 0",
        "samewise_request_duration_seconds_bucket",
    ] {
        assert!(m.contains(needle), "{needle} missing from\n{m}");
    }
    assert!(metric_value(&m, "samewise_records_written_total", "").unwrap_or(0.0) >= 1.0);
    // a series appears once something is counted in it (none made ahead at zero), and the
    // handles kept after the first request count in the same series
    assert!(!m.contains("status_class=\"5xx\""), "{m}");
    assert!(!m.contains("samewise_degenerate_cuts_total{"), "{m}");
    let resp = gw.chat(&chat_body("smol")).await?;
    gw.records(&request_id(&resp)).await?;
    let m = gw.metrics().await?;
    for needle in [
        "samewise_requests_total{model=\"smol\",endpoint=\"p1/up\",status_class=\"2xx\"} 2",
        "samewise_request_duration_seconds_count{model=\"smol\"} 2",
        "samewise_ttft_seconds_count{model=\"smol\",endpoint=\"p1/up\"} 2",
    ] {
        assert!(m.contains(needle), "{needle} missing from\n{m}");
    }
    gw.stop().await
}

#[tokio::test]
async fn client_schemas_too_deep_or_too_large_are_a_clear_400() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start(&cfg(&mock, "")).await?;
    // 90 levels of `items` (the body stays within the JSON parser's own nesting limit)
    let mut deep = json!({"type": "string"});
    for _ in 0..90 {
        deep = json!({"type": "array", "items": deep});
    }
    // 6000 properties: 12k schema nodes
    let props: serde_json::Map<String, serde_json::Value> = (0..6000)
        .map(|i| (format!("p{i}"), json!({"type": "string"})))
        .collect();
    let wide = json!({"type": "object", "properties": props});
    let tool = |params: &serde_json::Value| json!([{"type": "function", "function": {"name": "f", "parameters": params}}]);
    let cases = [
        (
            "tools",
            tool(&deep),
            "schema_too_deep",
            "tools[0].function.parameters",
        ),
        (
            "tools",
            tool(&wide),
            "schema_too_large",
            "tools[0].function.parameters",
        ),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}),
            "schema_too_deep",
            "response_format.json_schema.schema",
        ),
    ];
    for (field, value, code, param) in cases {
        let mut body = chat_body("smol");
        body[field] = value;
        let resp = gw.chat(&body).await?;
        assert_eq!(resp.status(), 400, "{code}");
        let v = error_json(resp).await?;
        assert_eq!(v["error"]["code"], code, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    assert_eq!(mock.request_count(), 0, "nothing reached the provider");
    // an ordinary schema goes through
    let mut body = chat_body("smol");
    body["tools"] = tool(&json!({"type": "object", "properties": {"city": {"type": "string"}}}));
    assert_eq!(gw.chat(&body).await?.status(), 200);
    gw.stop().await
}

#[tokio::test]
async fn a_keys_streams_are_bounded_and_a_finished_one_frees_its_slot() -> Result<()> {
    let pieces: Vec<String> = (0..40).map(|i| format!("w{i} ")).collect();
    let mock = MockUpstream::builder()
        .default_behavior(Behavior::Ok(Reply {
            chunk_delay: Duration::from_millis(50),
            ..Reply::text(pieces)
        }))
        .start()
        .await?;
    let toml = cfg(&mock, "").replace("[limits]\n", "[limits]\nmax_streams_per_key = 2\n");
    let gw = Gateway::start(&toml).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let mut a = gw.chat(&body).await?;
    let b = gw.chat(&body).await?;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    // a third stream of the same key is refused before reaching a provider
    let third = gw.chat(&body).await?;
    assert_eq!(third.status(), 429);
    assert!(third.headers().contains_key("retry-after"));
    let id = request_id(&third);
    let v = error_json(third).await?;
    assert_eq!(v["error"]["code"], "too_many_streams");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(gw.records(&id).await?[0].status, Some(429));
    // the key's other requests are not bounded by it
    let plain = gw.chat(&chat_body("smol")).await?;
    assert_eq!(plain.status(), 200);
    plain.bytes().await?;
    // a stream its client leaves frees its slot (b, dropped), as does one read to its end (a)
    drop(b);
    let mut c = None;
    for _ in 0..100 {
        let r = gw.chat(&body).await?;
        if r.status() == 200 {
            c = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = c.expect("a slot was not freed by the dropped stream");
    while a.chunk().await?.is_some() {}
    let d = gw.chat(&body).await?;
    assert_eq!(d.status(), 200, "a finished stream did not free its slot");
    drop((c, d));
    gw.stop().await
}

#[tokio::test]
async fn an_oversized_request_head_is_refused() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let gw = Gateway::start(&cfg(&mock, "")).await?;
    // 1 MiB of headers: the HTTP server refuses the head (hyper's bound, about 400 KiB) with a
    // 431 before any handler runs; nothing reaches a provider
    let resp = gw
        .http
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&gw.key)
        .header("content-type", "application/json")
        .header("x-padding", "p".repeat(1 << 20))
        .body(serde_json::to_vec(&chat_body("smol"))?)
        .send()
        .await;
    match resp {
        Ok(r) => assert_eq!(r.status(), 431),
        // the server may close the connection while the client still sends its head
        Err(e) => assert!(e.is_request() || e.is_connect() || e.is_body(), "{e}"),
    }
    assert_eq!(mock.request_count(), 0);
    // the gateway goes on serving
    assert_eq!(gw.chat(&chat_body("smol")).await?.status(), 200);
    gw.stop().await
}
