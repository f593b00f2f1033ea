//! Issue 2 item 1 and 5: the request body reaches the upstream byte for byte except `model`,
//! `provider` and (for streams) `stream_options.include_usage`; auth is the provider's key;
//! answers come back as sent, streams event by event; every attempt leaves a record with
//! timing, tokens, cost and finish reason.

use crate::common;

use std::time::Duration;

use anyhow::Result;
use common::*;
use samewise_testkit::{Behavior, MockUpstream, Reply};
use serde_json::json;

fn one_provider(mock: &MockUpstream, policy: &str) -> String {
    format!(
        "{FAST_LIMITS}{}{}",
        provider(
            "p1",
            &mock.base_url(),
            "price_input_per_mtok = 1.0\nprice_output_per_mtok = 2.0"
        ),
        model("smol", policy, &[("p1", "upstream-smol")])
    )
}

#[tokio::test]
async fn raw_body_reaches_upstream_untouched_but_model_and_provider() -> Result<()> {
    let mock = MockUpstream::builder().name("m1").start().await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    // Odd spacing and number forms inside values must survive; unknown fields too.
    let raw = r#"{"model":"smol","messages":[{"role":"user","content":"hi \u00e9"}],"logprobs":true,"top_logprobs":5,"n":1,"seed":7,"temperature":0.70,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto","response_format":{"type":"json_object"},"x_vendor":{"keep":[1.0,2e3]},"provider":{"allow_fallbacks":true}}"#;
    let resp = gw
        .http
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&gw.key)
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let upstream_answer = resp.bytes().await?;
    let reqs = mock.wait_for_requests(1, Duration::from_secs(2)).await?;
    let sent = std::str::from_utf8(&reqs[0].body)?;
    let expected = r#"{"model":"upstream-smol","messages":[{"role":"user","content":"hi \u00e9"}],"logprobs":true,"top_logprobs":5,"n":1,"seed":7,"temperature":0.70,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto","response_format":{"type":"json_object"},"x_vendor":{"keep":[1.0,2e3]}}"#;
    assert_eq!(sent, expected);
    // Upstream auth is the provider's key, never the client's.
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {PROVIDER_SECRET}").as_str())
    );
    assert!(
        !reqs
            .iter()
            .any(|r| r.headers.iter().any(|(_, v)| v.contains(&gw.key)))
    );
    // `Host` is the provider's authority, once (the gateway sets it, made once per provider)
    let authority = mock.base_url().replace("http://", "").replace("/v1", "");
    let hosts: Vec<&str> = reqs[0]
        .headers
        .iter()
        .filter(|(n, _)| n == "host")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(hosts, [authority.as_str()]);
    // The answer is the upstream's JSON (the mock names itself in it).
    let v: serde_json::Value = serde_json::from_slice(&upstream_answer)?;
    assert!(v["choices"][0]["message"].is_object(), "{v}");
    gw.stop().await
}

#[tokio::test]
async fn non_streamed_answer_is_recorded_with_usage_and_cost() -> Result<()> {
    let mock = MockUpstream::builder().name("m1").start().await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    let recs = gw.records(&id).await?;
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert!(r.final_attempt);
    assert_eq!((r.attempt, r.attempts), (1, 1));
    assert_eq!(r.endpoint.as_deref(), Some("p1/upstream-smol"));
    assert_eq!(r.provider.as_deref(), Some("p1"));
    assert_eq!(r.model, "smol");
    assert_eq!(r.route, "chat");
    assert_eq!(r.status, Some(200));
    assert_eq!(r.error_kind, None);
    assert!(r.key_id.is_some());
    let pt = v["usage"]["prompt_tokens"].as_i64();
    let ct = v["usage"]["completion_tokens"].as_i64();
    assert_eq!(r.prompt_tokens, pt);
    assert_eq!(r.completion_tokens, ct);
    assert!(!r.usage_counted);
    let expected_cost = pt.unwrap_or(0) as f64 * 1.0 / 1e6 + ct.unwrap_or(0) as f64 * 2.0 / 1e6;
    assert!((r.cost_usd.unwrap_or(-1.0) - expected_cost).abs() < 1e-12);
    assert_eq!(
        r.finish_reason.as_deref(),
        v["choices"][0]["finish_reason"].as_str()
    );
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(r.output_chars, content.chars().count() as i64);
    assert!(r.latency_ms > 0.0);
    gw.stop().await
}

#[tokio::test]
async fn stream_passes_events_and_strips_usage_chunk_when_not_asked() -> Result<()> {
    let mock = MockUpstream::builder().name("m1").start().await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let resp = gw.chat(&body).await?;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()?
            .starts_with("text/event-stream")
    );
    let id = request_id(&resp);
    let text = resp.text().await?;
    let reqs = mock.wait_for_requests(1, Duration::from_secs(2)).await?;
    let sent = reqs[0].json().unwrap_or_default();
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    let events = sse_data(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut content = String::new();
    for e in &events[..events.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(e)?;
        assert!(
            !v["choices"].as_array().is_some_and(Vec::is_empty),
            "usage-only chunk reached the client: {e}"
        );
        content.push_str(
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or_default(),
        );
    }
    assert!(!content.is_empty());
    let r = &gw.records(&id).await?[0];
    assert!(r.stream);
    assert!(
        !r.usage_counted,
        "usage was asked for upstream and recorded"
    );
    assert!(r.completion_tokens.unwrap_or(0) > 0);
    assert!(r.ttft_ms.is_some());
    assert_eq!(r.output_chars, content.chars().count() as i64);
    assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    gw.stop().await
}

#[tokio::test]
async fn stream_keeps_usage_chunk_when_client_asked() -> Result<()> {
    let mock = MockUpstream::builder().name("m1").start().await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = gw.chat(&body).await?;
    let text = resp.text().await?;
    let usage_chunks = sse_data(&text)
        .iter()
        .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
        .filter(|v| v["choices"].as_array().is_some_and(Vec::is_empty) && v["usage"].is_object())
        .count();
    assert_eq!(usage_chunks, 1);
    gw.stop().await
}

#[tokio::test]
async fn stream_reaches_client_before_upstream_finishes() -> Result<()> {
    let reply = Reply {
        chunk_delay: Duration::from_millis(150),
        ..Reply::text(["a", "b", "c", "d"])
    };
    let mock = MockUpstream::builder()
        .name("m1")
        .default_behavior(Behavior::Ok(reply))
        .start()
        .await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let started = tokio::time::Instant::now();
    let mut resp = gw.chat(&body).await?;
    let first = resp.chunk().await?.unwrap_or_default();
    let first_at = started.elapsed();
    let mut rest = Vec::new();
    while let Some(c) = resp.chunk().await? {
        rest.extend_from_slice(&c);
    }
    let all_at = started.elapsed();
    assert!(!first.is_empty());
    // At least three 150 ms pauses separate the first event from the end.
    assert!(
        all_at - first_at >= Duration::from_millis(400),
        "first {first_at:?}, all {all_at:?}"
    );
    gw.stop().await
}

#[tokio::test]
async fn split_events_are_reassembled_and_counted_without_usage() -> Result<()> {
    let mock = MockUpstream::builder()
        .name("m1")
        .behaviors([Behavior::SplitEvents, Behavior::NoUsage])
        .start()
        .await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    // split writes
    let resp = gw.chat(&body).await?;
    let id = request_id(&resp);
    let text = resp.text().await?;
    let events = sse_data(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    for e in &events[..events.len() - 1] {
        serde_json::from_str::<serde_json::Value>(e)?;
    }
    let r = &gw.records(&id).await?[0];
    assert_eq!(r.error_kind, None);
    // no usage from upstream: counted, one token per content delta
    let resp = gw.chat(&body).await?;
    let id = request_id(&resp);
    let text = resp.text().await?;
    let deltas = sse_data(&text)
        .iter()
        .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
        .filter(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .count();
    let r = &gw.records(&id).await?[0];
    assert!(r.usage_counted);
    assert_eq!(r.completion_tokens, Some(deltas as i64));
    // prompt "Say hi" = 6 chars -> ceil(6/4) = 2
    assert_eq!(r.prompt_tokens, Some(2));
    gw.stop().await
}

#[tokio::test]
async fn completions_route_and_models_list() -> Result<()> {
    let mock = MockUpstream::builder().name("m1").start().await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let resp = gw
        .post(
            "/v1/completions",
            &json!({"model": "smol", "prompt": "Once", "logprobs": 2, "echo": true}),
        )
        .await?;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    assert!(v["choices"][0]["text"].is_string(), "{v}");
    let reqs = mock.wait_for_requests(1, Duration::from_secs(2)).await?;
    assert_eq!(reqs[0].path, "/v1/completions");
    assert_eq!(reqs[0].json().unwrap_or_default()["echo"], json!(true));
    assert_eq!(gw.records(&id).await?[0].route, "completions");

    let resp = gw.get("/v1/models").await?;
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "smol");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(1));
    // OpenAI's `models.retrieve`: the list's entry, or a 404 naming the code
    let resp = gw.get("/v1/models/smol").await?;
    assert_eq!(resp.status(), 200);
    let one: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    assert_eq!(one, v["data"][0]);
    for other in ["/v1/models/gpt-4o", "/v1/models/org/smol", "/v1/models/"] {
        let resp = gw.get(other).await?;
        assert_eq!(resp.status(), 404, "{other}");
        let e: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
        assert!(e["error"]["message"].is_string(), "{other}: {e}");
    }
    // a name that is not UTF-8 once decoded: OpenAI-shaped JSON, not axum's plain text
    let resp = gw.get("/v1/models/%FF").await?;
    assert_eq!(resp.status(), 400);
    let e: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    assert_eq!(e["error"]["code"], "invalid_path", "{e}");
    gw.stop().await
}

#[tokio::test]
async fn records_go_to_postgres_too() -> Result<()> {
    let mock = MockUpstream::builder().name("m1").start().await?;
    let opts = Options {
        backend: samewise_store::Backend::Postgres,
        ..Options::default()
    };
    let gw = Gateway::start_with(&one_provider(&mock, "weighted"), opts).await?;
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let recs = gw.records(&id).await?;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].endpoint.as_deref(), Some("p1/upstream-smol"));
    gw.stop().await
}

/// The mock's answer to `body` sent straight to it (not through the gateway), as text.
async fn straight_to(
    gw: &Gateway,
    mock: &MockUpstream,
    body: &serde_json::Value,
) -> Result<String> {
    Ok(gw
        .http
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body)?)
        .send()
        .await?
        .text()
        .await?)
}

#[tokio::test]
async fn streamed_bytes_are_the_upstreams_bytes() -> Result<()> {
    let mock = MockUpstream::builder().name("m1").start().await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let body = |model: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": "Say hi"}], "stream": true,
               "stream_options": {"include_usage": true}})
    };
    // Directly at the mock first (its answer #1), then through the gateway (answer #2).
    let direct = straight_to(&gw, &mock, &body("upstream-smol")).await?;
    let via = gw.chat(&body("smol")).await?.text().await?;
    assert!(direct.contains("chatcmpl-m1-1"), "{direct}");
    assert_eq!(via, direct.replace("chatcmpl-m1-1", "chatcmpl-m1-2"));
    gw.stop().await
}

#[tokio::test]
async fn a_json_answer_read_in_pieces_is_the_upstreams_bytes() -> Result<()> {
    // the mock writes its answer in five pieces, pausing between them: the gateway reads
    // several chunks (and joins them) rather than the one most answers come in
    let mock = MockUpstream::builder()
        .name("m1")
        .default_behavior(Behavior::Ok(Reply {
            split_writes: true,
            ..Reply::text(vec!["alpha ".to_owned(), "beta".to_owned()])
        }))
        .start()
        .await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let direct = straight_to(&gw, &mock, &chat_body("upstream-smol")).await?;
    let resp = gw.chat(&chat_body("smol")).await?;
    assert_eq!(resp.status(), 200);
    let id = request_id(&resp);
    let via = resp.text().await?;
    assert!(direct.contains("chatcmpl-m1-1"), "{direct}");
    assert_eq!(via, direct.replace("chatcmpl-m1-1", "chatcmpl-m1-2"));
    let recs = gw.records(&id).await?;
    assert_eq!(recs[0].error_kind, None, "{recs:?}");
    assert_eq!(recs[0].output_chars, 10, "{recs:?}");
    gw.stop().await
}

#[tokio::test]
async fn a_burst_of_events_reaches_the_client_in_a_few_writes_byte_for_byte() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pieces: Vec<String> = (0..30).map(|i| format!("w{i} ")).collect();
    let mock = MockUpstream::builder()
        .name("m1")
        .default_behavior(Behavior::Ok(Reply {
            one_write: true,
            ..Reply::text(pieces.clone())
        }))
        .start()
        .await?;
    let gw = Gateway::start(&one_provider(&mock, "weighted")).await?;
    let mut body = chat_body("smol");
    body["stream"] = json!(true);
    let body = serde_json::to_vec(&body)?;
    // A raw client: the response's chunked framing shows how the gateway wrote it (each write
    // of the relay is one HTTP chunk).
    let mut sock = tokio::net::TcpStream::connect(gw.addr).await?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        gw.addr,
        gw.key,
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(&body).await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut raw)).await??;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no response head"))?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let (chunks, data) = dechunk(&raw[end + 4..])?;
    let text = String::from_utf8(data)?;
    let events = sse_data(&text);
    // the role chunk, one per piece, the finish chunk and [DONE] (usage was not asked for)
    assert_eq!(events.len(), pieces.len() + 3, "{text}");
    let said: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(said, pieces.concat());
    // The upstream sent the whole answer in one write; the gateway forwards what it has
    // ready together instead of one write per event.
    assert!(
        chunks * 4 <= events.len(),
        "{chunks} writes for {} events",
        events.len()
    );
    // and the bytes are the upstream's, as one event-by-event relay would send them
    let direct = gw
        .http
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(
            &json!({"model": "upstream-smol", "stream": true,
            "messages": [{"role": "user", "content": "Say hi"}]}),
        )?)
        .send()
        .await?
        .text()
        .await?;
    assert_eq!(text, direct.replace("chatcmpl-m1-2", "chatcmpl-m1-1"));
    gw.stop().await
}

/// The number of chunks of a chunked body and its data.
fn dechunk(mut body: &[u8]) -> Result<(usize, Vec<u8>)> {
    let mut chunks = 0;
    let mut data = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow::anyhow!("a chunk size line without its end"))?;
        let size_text = std::str::from_utf8(&body[..eol])?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok((chunks, data));
        }
        anyhow::ensure!(body.len() >= size + 2, "a chunk shorter than its size");
        data.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
        chunks += 1;
    }
}
