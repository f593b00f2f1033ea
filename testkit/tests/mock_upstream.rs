//! The mock upstream speaks OpenAI's protocol over a real socket: a real HTTP client (reqwest)
//! sees valid JSON and SSE from it, each scripted behavior in order, and every request recorded.

use std::time::Duration;

use anyhow::Result;
use samewise_testkit::{Behavior, MockUpstream, ToolCall};
use serde_json::{Value, json};

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "say hi"}], "stream": stream,
           "stream_options": {"include_usage": true}, "seed": 7})
}

/// The `data:` payloads of an SSE body, in order.
fn data_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// Concatenated content deltas of a streamed chat answer (every event must be JSON).
fn streamed_text(body: &str) -> Result<String> {
    let mut text = String::new();
    for data in data_events(body) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&data)?;
        if let Some(t) = v
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            text.push_str(t);
        }
    }
    Ok(text)
}

#[tokio::test]
async fn default_answer_echoes_model_and_records_the_request() -> Result<()> {
    let mock = MockUpstream::builder().name("alpha").start().await?;
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{}/chat/completions", mock.base_url()))
        .bearer_auth("sk-test")
        .header("content-type", "application/json")
        .body(chat("org/model-x", false).to_string())
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-mock-upstream"], "alpha");
    let body: Value = resp.text().await?.parse()?;
    assert_eq!(body["model"], "org/model-x");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from alpha serving org/model-x."
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["completion_tokens"], 6);

    let seen = mock.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].header("Authorization"), Some("Bearer sk-test"));
    assert_eq!(seen[0].json(), Some(chat("org/model-x", false)));
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn streams_role_deltas_finish_usage_and_done() -> Result<()> {
    let mock = MockUpstream::builder().name("beta").start().await?;
    let body = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(chat("m", true).to_string())
        .send()
        .await?
        .text()
        .await?;
    let events = data_events(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let first: Value = serde_json::from_str(&events[0])?;
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let usage: Value = serde_json::from_str(&events[events.len() - 2])?;
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    let finish: Value = serde_json::from_str(&events[events.len() - 3])?;
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(streamed_text(&body)?, "Hello from beta serving m.");
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn scripted_queue_is_consumed_in_order_then_default() -> Result<()> {
    let mock = MockUpstream::builder()
        .behavior(Behavior::Status(
            503,
            r#"{"error":{"message":"busy"}}"#.into(),
        ))
        .behavior(Behavior::RateLimited {
            retry_after: Some(2),
        })
        .start()
        .await?;
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", mock.base_url());
    let r1 = client
        .post(&url)
        .header("content-type", "application/json")
        .body(chat("m", false).to_string())
        .send()
        .await?;
    assert_eq!(r1.status(), 503);
    let r2 = client
        .post(&url)
        .header("content-type", "application/json")
        .body(chat("m", false).to_string())
        .send()
        .await?;
    assert_eq!(r2.status(), 429);
    assert_eq!(r2.headers()["retry-after"], "2");
    let r2: Value = r2.text().await?.parse()?;
    assert_eq!(r2["error"]["code"], "rate_limit_exceeded");
    let r3 = client
        .post(&url)
        .header("content-type", "application/json")
        .body(chat("m", false).to_string())
        .send()
        .await?;
    assert_eq!(r3.status(), 200);
    assert_eq!(mock.queued(), 0);
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn reset_before_response_is_a_transport_error() -> Result<()> {
    let mock = MockUpstream::builder()
        .behavior(Behavior::ResetBeforeResponse)
        .start()
        .await?;
    let err = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(chat("m", false).to_string())
        .send()
        .await;
    assert!(
        err.is_err(),
        "a reset must not look like an answer: {err:?}"
    );
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn reset_after_bytes_cuts_the_stream() -> Result<()> {
    let mock = MockUpstream::builder()
        .behavior(Behavior::ResetAfterBytes(40))
        .start()
        .await?;
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(chat("m", true).to_string())
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.text().await.is_err(),
        "the body must end in an error, not cleanly"
    );
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn split_events_reassemble_to_the_same_stream() -> Result<()> {
    let mock = MockUpstream::builder()
        .name("s")
        .behavior(Behavior::SplitEvents)
        .start()
        .await?;
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", mock.base_url());
    let mut resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body(chat("m", true).to_string())
        .send()
        .await?;
    let mut reads = 0;
    let mut body = Vec::new();
    while let Some(bytes) = resp.chunk().await? {
        reads += 1;
        body.extend_from_slice(&bytes);
    }
    assert!(
        reads > 10,
        "split writes should arrive as many reads, got {reads}"
    );
    let body = String::from_utf8(body)?;
    assert_eq!(streamed_text(&body)?, "Hello from s serving m.");
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn streamed_tool_calls_arrive_as_indexed_deltas() -> Result<()> {
    let calls = vec![
        ToolCall::new("get_weather", r#"{"city": "Zürich"}"#),
        ToolCall::new("nope", "{not json"),
    ];
    let mock = MockUpstream::builder()
        .behavior(Behavior::tool_calls(calls, "tool_calls"))
        .start()
        .await?;
    let body = reqwest::Client::new()
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(chat("m", true).to_string())
        .send()
        .await?
        .text()
        .await?;
    let mut args = [String::new(), String::new()];
    let mut names = [String::new(), String::new()];
    let mut finish = String::new();
    for data in data_events(&body).into_iter().filter(|d| d != "[DONE]") {
        let v: Value = serde_json::from_str(&data)?;
        for call in v
            .pointer("/choices/0/delta/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let i = usize::try_from(call["index"].as_u64().unwrap_or(9))?;
            if let Some(n) = call.pointer("/function/name").and_then(Value::as_str) {
                names[i].push_str(n);
            }
            if let Some(a) = call.pointer("/function/arguments").and_then(Value::as_str) {
                args[i].push_str(a);
            }
        }
        if let Some(f) = v
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
        {
            finish = f.to_owned();
        }
    }
    assert_eq!(names, ["get_weather".to_owned(), "nope".to_owned()]);
    assert_eq!(
        args,
        [r#"{"city": "Zürich"}"#.to_owned(), "{not json".to_owned()]
    );
    assert_eq!(finish, "tool_calls");
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn logprobs_on_chat_and_completions() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let client = reqwest::Client::new();
    let chat_body: Value = client
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json").body(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 3}).to_string())
        .send()
        .await?
        .text()
        .await?
        .parse()?;
    let content = chat_body
        .pointer("/choices/0/logprobs/content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert_eq!(content.len(), 6);
    assert_eq!(content[0]["top_logprobs"].as_array().map(Vec::len), Some(3));
    let cmpl: Value = client
        .post(format!("{}/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(
            json!({"model": "m", "prompt": "once upon", "logprobs": 2, "max_tokens": 5})
                .to_string(),
        )
        .send()
        .await?
        .text()
        .await?
        .parse()?;
    assert_eq!(cmpl["object"], "text_completion");
    assert_eq!(
        cmpl.pointer("/choices/0/logprobs/tokens")
            .and_then(Value::as_array)
            .map(Vec::len),
        Some(6)
    );
    assert_eq!(cmpl["usage"]["prompt_tokens"], 2);
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn never_ends_holds_until_shutdown_and_models_lists() -> Result<()> {
    let mock = MockUpstream::builder()
        .model("a")
        .model("b")
        .default_behavior(Behavior::NeverEnds)
        .start()
        .await?;
    let client = reqwest::Client::new();
    let models: Value = client
        .get(format!("{}/models", mock.base_url()))
        .send()
        .await?
        .text()
        .await?
        .parse()?;
    assert_eq!(models["data"][1]["id"], "b");
    let mut resp = client
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(chat("m", true).to_string())
        .send()
        .await?;
    assert!(resp.chunk().await?.is_some());
    let stalled = tokio::time::timeout(Duration::from_millis(200), async {
        while resp.chunk().await?.is_some() {}
        anyhow::Ok(())
    })
    .await;
    assert!(
        stalled.is_err(),
        "a NeverEnds body must not finish by itself"
    );
    mock.wait_for_requests(2, Duration::from_secs(1)).await?;
    mock.shutdown().await;
    Ok(())
}
