//! The degeneration guard through the real proxy: an answer that repeats the same token N
//! times in a row (default 4) over at least 128 characters is cut. A non-streamed one is retried
//! once on another endpoint; a streamed one ends with an OpenAI-style error event. Both are
//! recorded. Numbers written digit by digit, and other short runs, pass untouched.

use crate::checks;

use anyhow::Result;
use checks::{Proxy, chat, sse_data, sse_json, streamed_text};
use samewise_store::Backend;
use samewise_testkit::{Behavior, MockUpstream};
use serde_json::{Value, json};

fn repeat(token: &str, times: usize) -> Behavior {
    Behavior::RepeatToken {
        token: token.to_owned(),
        times,
    }
}

fn with_logprobs(stream: bool) -> Value {
    let mut body = chat(stream);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(1);
    body
}

#[tokio::test]
async fn non_streamed_degenerate_answer_is_retried_once_on_another_endpoint() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(repeat(" loop", 40))
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&a, &b], "").await?;
    let (status, body) = proxy
        .post_json("/chat/completions", &with_logprobs(false))
        .await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"], "Hello from b serving model-1.",
        "the retry's answer reaches the client"
    );
    assert_eq!((a.request_count(), b.request_count()), (1, 1));

    let attempts = proxy.request(0, 2).await?;
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    assert!(
        attempts[0].degenerate && !attempts[0].final_attempt,
        "{attempts:#?}"
    );
    assert_eq!(
        attempts[0].endpoint.as_deref().map(|e| e.contains("p0")),
        Some(true),
        "{attempts:#?}"
    );
    assert!(
        !attempts[1].degenerate && attempts[1].final_attempt,
        "{attempts:#?}"
    );
    assert_eq!(attempts[1].attempts, 2);
    proxy.stop().await?;
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn non_streamed_degenerate_text_without_logprobs_is_caught_by_words() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(repeat(" again", 40))
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&a, &b], "").await?;
    let (status, body) = proxy.post_json("/chat/completions", &chat(false)).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from b serving model-1."
    );
    let attempts = proxy.request(0, 2).await?;
    assert!(attempts[0].degenerate, "{attempts:#?}");
    assert!(
        attempts[1].final_attempt && !attempts[1].degenerate,
        "{attempts:#?}"
    );
    proxy.stop().await?;
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn degenerate_everywhere_is_retried_only_once() -> Result<()> {
    let mocks = [
        MockUpstream::builder()
            .name("a")
            .default_behavior(repeat(" x", 80))
            .start()
            .await?,
        MockUpstream::builder()
            .name("b")
            .default_behavior(repeat(" y", 80))
            .start()
            .await?,
        MockUpstream::builder()
            .name("c")
            .default_behavior(repeat(" z", 80))
            .start()
            .await?,
    ];
    let proxy = Proxy::start(
        Backend::Sqlite,
        &[&mocks[0], &mocks[1], &mocks[2]],
        "max_attempts = 3",
    )
    .await?;
    let (status, text) = proxy
        .post("/chat/completions", &with_logprobs(false))
        .await?;
    assert_eq!(
        mocks
            .iter()
            .map(MockUpstream::request_count)
            .collect::<Vec<_>>(),
        vec![1, 1, 0],
        "one retry, no more: {status} {text}"
    );
    let attempts = proxy.request(0, 2).await?;
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    assert!(attempts.iter().all(|r| r.degenerate), "{attempts:#?}");
    assert!(attempts[1].final_attempt);
    proxy.stop().await?;
    for m in mocks {
        m.shutdown().await;
    }
    Ok(())
}

#[tokio::test]
async fn streamed_degenerate_generation_is_cut_with_an_error_event() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(repeat(" again", 40))
        .start()
        .await?;
    let b = MockUpstream::builder().name("b").start().await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&a, &b], "").await?;
    let (status, text) = proxy.post("/chat/completions", &chat(true)).await?;
    assert_eq!(status, 200);
    let events = sse_json(&text)?;
    assert_eq!(
        streamed_text(&events),
        " again".repeat(21),
        "21 repeats (126 characters) pass, the 22nd (132) is cut: {text}"
    );
    let last = events.last().cloned().unwrap_or_default();
    assert_eq!(
        last["error"]["code"], "degenerate",
        "the stream ends with an error event: {text}"
    );
    assert!(
        !sse_data(&text).iter().any(|d| d == "[DONE]"),
        "a cut stream does not claim to be done: {text}"
    );
    assert_eq!(
        b.request_count(),
        0,
        "a stream is never retried after its first byte"
    );

    let records = proxy.records(1).await?;
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = &records[0];
    assert!(r.degenerate && r.final_attempt && r.stream, "{r:#?}");
    assert_eq!(r.error_kind.as_deref(), Some("degenerate"), "{r:#?}");
    proxy.stop().await?;
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn repetition_below_the_threshold_passes_untouched() -> Result<()> {
    // "1000000" as digit-by-digit tokenizers write it (SmolLM2, Llama 2, Mistral, Qwen): six
    // "0" deltas in a row, which the guard cut before it also asked for 128 characters
    let million = samewise_testkit::Reply {
        content: Some(
            ["The answer is ", "1"]
                .into_iter()
                .chain(["0"; 6])
                .map(String::from)
                .collect(),
        ),
        ..Default::default()
    };
    let a = MockUpstream::builder()
        .name("a")
        .behavior(repeat(" ha", 42))
        .behavior(repeat(" ha", 42))
        .behavior(Behavior::Ok(million.clone()))
        .behavior(Behavior::Ok(million))
        .start()
        .await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&a], "").await?;
    let (status, text) = proxy.post("/chat/completions", &chat(true)).await?;
    assert_eq!(status, 200);
    assert_eq!(
        streamed_text(&sse_json(&text)?),
        " ha".repeat(42),
        "126 characters"
    );
    assert_eq!(sse_data(&text).last().map(String::as_str), Some("[DONE]"));
    let (status, body) = proxy
        .post_json("/chat/completions", &with_logprobs(false))
        .await?;
    assert_eq!(status, 200);
    assert_eq!(body["choices"][0]["message"]["content"], " ha".repeat(42));
    for stream in [true, false] {
        let (status, text) = proxy
            .post("/chat/completions", &with_logprobs(stream))
            .await?;
        assert_eq!(status, 200);
        let got = if stream {
            assert_eq!(
                sse_data(&text).last().map(String::as_str),
                Some("[DONE]"),
                "{text}"
            );
            streamed_text(&sse_json(&text)?)
        } else {
            let v: Value = serde_json::from_str(&text)?;
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(got, "The answer is 1000000", "stream {stream}");
    }
    let records = proxy.records(4).await?;
    assert!(
        records
            .iter()
            .all(|r| !r.degenerate && r.error_kind.is_none()),
        "{records:#?}"
    );
    proxy.stop().await?;
    a.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn the_threshold_comes_from_the_config() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(repeat(" no", 2))
        .start()
        .await?;
    let proxy = Proxy::start(
        Backend::Sqlite,
        &[&a],
        "degenerate_repeat = 2\ndegenerate_min_chars = 0",
    )
    .await?;
    let (status, text) = proxy.post("/chat/completions", &chat(true)).await?;
    assert_eq!(status, 200);
    let events = sse_json(&text)?;
    assert_eq!(streamed_text(&events), " no");
    assert_eq!(
        events.last().map(|e| e["error"]["code"].clone()),
        Some(json!("degenerate")),
        "{text}"
    );
    let records = proxy.records(1).await?;
    assert!(records[0].degenerate, "{records:#?}");
    proxy.stop().await?;
    a.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn streamed_legacy_completions_are_guarded_too() -> Result<()> {
    let a = MockUpstream::builder()
        .name("a")
        .behavior(repeat(" na", 60))
        .start()
        .await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&a], "").await?;
    let body = json!({"model": checks::MODEL, "prompt": "Batman theme:", "stream": true, "max_tokens": 64});
    let (status, text) = proxy.post("/completions", &body).await?;
    assert_eq!(status, 200);
    let events = sse_json(&text)?;
    let got: String = events
        .iter()
        .filter_map(|e| e.pointer("/choices/0/text").and_then(Value::as_str))
        .collect();
    assert_eq!(
        got,
        " na".repeat(42),
        "the 43rd (129 characters) is cut: {text}"
    );
    assert_eq!(
        events.last().map(|e| e["error"]["code"].clone()),
        Some(json!("degenerate")),
        "{text}"
    );
    let records = proxy.records(1).await?;
    assert!(
        records[0].degenerate && records[0].route == "completions",
        "{records:#?}"
    );
    proxy.stop().await?;
    a.shutdown().await;
    Ok(())
}
