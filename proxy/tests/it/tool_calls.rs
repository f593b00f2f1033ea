//! Tool-call tracking through the real proxy: for requests with `tools`, every call the
//! upstream returns (non-streamed, or streamed as deltas) reaches the client untouched and is
//! classified ok / invalid_json / unknown_name / schema_mismatch in the request's record, with
//! finish-reason mismatches recorded and the request marked errored when anything erred.

use crate::checks;

use anyhow::Result;
use checks::{Proxy, chat, sse_json};
use samewise_store::{Backend, RequestRecord};
use samewise_testkit::{Behavior, MockUpstream, ToolCall};
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "weather in a city", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time"}},
    ])
}

fn with_tools(stream: bool) -> Value {
    let mut body = chat(stream);
    body["tools"] = tools();
    body["tool_choice"] = json!("auto");
    body
}

/// One call of each class (and a schemaless one), in this order:
/// ok, invalid_json, unknown_name, schema_mismatch, ok.
fn every_class() -> Vec<ToolCall> {
    vec![
        ToolCall::new("get_weather", r#"{"city": "Oslo", "unit": "c"}"#),
        ToolCall::new("get_weather", r#"{"city": "Oslo""#),
        ToolCall::new("get_wether", r#"{"city": "Oslo"}"#),
        ToolCall::new("get_weather", r#"{"city": "Oslo", "unit": "kelvin"}"#),
        ToolCall::new("get_time", r#"{"tz": "Europe/Oslo"}"#),
    ]
}

/// The calls a client got: (name, arguments), from a JSON answer or assembled from a stream.
fn client_calls(stream: bool, text: &str) -> Result<Vec<(String, String)>> {
    let mut calls: Vec<(String, String)> = Vec::new();
    if stream {
        for event in sse_json(text)? {
            for delta in event
                .pointer("/choices/0/delta/tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let i = usize::try_from(delta["index"].as_u64().unwrap_or(u64::MAX))?;
                if calls.len() <= i {
                    calls.resize(i + 1, (String::new(), String::new()));
                }
                if let Some(n) = delta.pointer("/function/name").and_then(Value::as_str) {
                    calls[i].0.push_str(n);
                }
                if let Some(a) = delta.pointer("/function/arguments").and_then(Value::as_str) {
                    calls[i].1.push_str(a);
                }
            }
        }
    } else {
        let v: Value = serde_json::from_str(text)?;
        for c in v
            .pointer("/choices/0/message/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let args = c
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            calls.push((name, args));
        }
    }
    Ok(calls)
}

fn as_pairs(calls: &[ToolCall]) -> Vec<(String, String)> {
    calls
        .iter()
        .map(|c| (c.name.clone(), c.arguments.clone()))
        .collect()
}

/// Sends one tool request answered with `calls` and `finish`; checks the client got the calls
/// untouched and returns the request's single record.
async fn one_request(
    backend: Backend,
    stream: bool,
    calls: Vec<ToolCall>,
    finish: &str,
) -> Result<RequestRecord> {
    let mock = MockUpstream::builder()
        .name("tools")
        .behavior(Behavior::tool_calls(calls.clone(), finish))
        .start()
        .await?;
    let proxy = Proxy::start(backend, &[&mock], "").await?;
    let (status, text) = proxy.post("/chat/completions", &with_tools(stream)).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        client_calls(stream, &text)?,
        as_pairs(&calls),
        "the client must get the calls exactly as sent"
    );
    // the tools reached the upstream untouched
    let seen = mock.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].json().map(|b| b["tools"].clone()), Some(tools()));
    let records = proxy.records(1).await?;
    assert_eq!(records.len(), 1, "{records:#?}");
    proxy.stop().await?;
    mock.shutdown().await;
    Ok(records.into_iter().next().unwrap_or_default())
}

fn assert_every_class_counted(r: &RequestRecord) {
    assert_eq!(r.tool_calls, 5, "{r:#?}");
    assert_eq!(r.tool_invalid_json, 1, "{r:#?}");
    assert_eq!(r.tool_unknown_name, 1, "{r:#?}");
    assert_eq!(r.tool_schema_mismatch, 1, "{r:#?}");
    assert_eq!(r.tool_finish_mismatch, None, "{r:#?}");
    assert!(r.tool_errored, "{r:#?}");
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(r.status, Some(200));
}

#[tokio::test]
async fn non_streamed_calls_of_every_class_are_counted_sqlite() -> Result<()> {
    let r = one_request(Backend::Sqlite, false, every_class(), "tool_calls").await?;
    assert_every_class_counted(&r);
    assert!(!r.stream);
    Ok(())
}

#[tokio::test]
async fn non_streamed_calls_of_every_class_are_counted_postgres() -> Result<()> {
    let r = one_request(Backend::Postgres, false, every_class(), "tool_calls").await?;
    assert_every_class_counted(&r);
    Ok(())
}

#[tokio::test]
async fn streamed_calls_are_assembled_by_index_and_counted_sqlite() -> Result<()> {
    let r = one_request(Backend::Sqlite, true, every_class(), "tool_calls").await?;
    assert_every_class_counted(&r);
    assert!(r.stream);
    Ok(())
}

#[tokio::test]
async fn streamed_calls_are_assembled_by_index_and_counted_postgres() -> Result<()> {
    let r = one_request(Backend::Postgres, true, every_class(), "tool_calls").await?;
    assert_every_class_counted(&r);
    Ok(())
}

#[tokio::test]
async fn valid_calls_leave_the_request_unerrored() -> Result<()> {
    for stream in [false, true] {
        let calls = vec![
            ToolCall::new("get_weather", r#"{"city": "Bergen"}"#),
            ToolCall::new("get_time", "{}"),
        ];
        let r = one_request(Backend::Sqlite, stream, calls, "tool_calls").await?;
        assert_eq!(
            (
                r.tool_calls,
                r.tool_invalid_json,
                r.tool_unknown_name,
                r.tool_schema_mismatch
            ),
            (2, 0, 0, 0),
            "{r:#?}"
        );
        assert_eq!(r.tool_finish_mismatch, None);
        assert!(!r.tool_errored, "stream={stream}: {r:#?}");
    }
    Ok(())
}

#[tokio::test]
async fn finish_tool_calls_without_calls_is_a_mismatch() -> Result<()> {
    for stream in [false, true] {
        let r = one_request(Backend::Sqlite, stream, Vec::new(), "tool_calls").await?;
        assert_eq!(r.tool_calls, 0);
        assert_eq!(
            r.tool_finish_mismatch.as_deref(),
            Some("finish_without_calls"),
            "stream={stream}: {r:#?}"
        );
        assert!(r.tool_errored);
    }
    Ok(())
}

#[tokio::test]
async fn calls_with_another_finish_reason_are_a_mismatch() -> Result<()> {
    for stream in [false, true] {
        let r = one_request(
            Backend::Sqlite,
            stream,
            vec![ToolCall::new("get_time", "{}")],
            "stop",
        )
        .await?;
        assert_eq!(r.tool_calls, 1);
        assert_eq!(
            r.tool_finish_mismatch.as_deref(),
            Some("calls_without_finish"),
            "stream={stream}: {r:#?}"
        );
        assert!(r.tool_errored);
        assert_eq!(r.finish_reason.as_deref(), Some("stop"));
    }
    Ok(())
}

#[tokio::test]
async fn requests_without_tools_record_no_tool_activity() -> Result<()> {
    let mock = MockUpstream::builder().start().await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&mock], "").await?;
    let (status, body) = proxy.post_json("/chat/completions", &chat(false)).await?;
    assert_eq!(status, 200);
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from mock serving model-0."
    );
    let r = proxy.records(1).await?;
    assert_eq!(
        (
            r[0].tool_calls,
            r[0].tool_errored,
            r[0].tool_finish_mismatch.clone()
        ),
        (0, false, None)
    );
    proxy.stop().await?;
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_tool_schema_that_does_not_compile_is_not_the_endpoints_fault() -> Result<()> {
    let calls = vec![
        ToolCall::new("odd", r#"{"a": 1}"#),
        ToolCall::new("odd", "{oops"),
    ];
    let mock = MockUpstream::builder()
        .behavior(Behavior::tool_calls(calls, "tool_calls"))
        .start()
        .await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&mock], "").await?;
    let mut body = chat(false);
    body["tools"] = json!([{"type": "function", "function": {"name": "odd", "parameters": {"type": "no-such-type"}}}]);
    let (status, text) = proxy.post("/chat/completions", &body).await?;
    assert_eq!(status, 200, "the answer still reaches the client: {text}");
    let r = proxy.records(1).await?;
    // only JSON-ness can be checked against an unusable schema
    assert_eq!(
        (
            r[0].tool_calls,
            r[0].tool_invalid_json,
            r[0].tool_schema_mismatch
        ),
        (2, 1, 0),
        "{r:#?}"
    );
    proxy.stop().await?;
    mock.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn streamed_calls_split_across_reads_are_still_assembled() -> Result<()> {
    use samewise_testkit::Reply;
    let reply = Reply {
        content: Some(Vec::new()),
        split_writes: true,
        ..Reply::default()
    }
    .with_tool_calls(every_class())
    .finish("tool_calls");
    let mock = MockUpstream::builder()
        .behavior(Behavior::Ok(reply))
        .start()
        .await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&mock], "").await?;
    let (status, text) = proxy.post("/chat/completions", &with_tools(true)).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(client_calls(true, &text)?, as_pairs(&every_class()));
    let r = proxy.records(1).await?;
    assert_every_class_counted(&r[0]);
    proxy.stop().await?;
    mock.shutdown().await;
    Ok(())
}
