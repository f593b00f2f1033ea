//! The official `openai` Python package, pointed at samewise, gets a streamed chat, a tool call
//! and a logprobs answer back intact (the script `tests/python/openai_client.py` asserts with
//! the SDK's own parsing and prints what it got), and each request leaves its record.
//!
//! The package is installed by `.ci/run` (`tests/python/requirements.txt`); when it is not
//! importable this test fails with a message saying so — it never skips.

use crate::checks;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use checks::{MODEL, Proxy};
use samewise_store::Backend;
use samewise_testkit::{Behavior, MockUpstream, ToolCall};
use serde_json::{Value, json};

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py")
}

/// Fails (never skips) when the SDK is missing.
fn require_openai() -> Result<()> {
    let out = Command::new(python())
        .args(["-c", "import openai; print(openai.__version__)"])
        .output()
        .with_context(|| format!("cannot run {}", python()))?;
    if !out.status.success() {
        bail!(
            "the official `openai` Python package is not importable by {}: install it with \
             `python3 -m pip install -r proxy/tests/python/requirements.txt` (.ci/run does). {}",
            python(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[tokio::test]
async fn openai_python_sdk_gets_stream_tool_call_and_logprobs_intact() -> Result<()> {
    require_openai()?;
    let mock = MockUpstream::builder()
        .name("up")
        .behavior(Behavior::Ok(Default::default()))
        .behavior(Behavior::tool_calls(
            vec![ToolCall::new("get_weather", r#"{"city": "Oslo"}"#)],
            "tool_calls",
        ))
        .behavior(Behavior::Ok(Default::default()))
        .start()
        .await?;
    let proxy = Proxy::start(Backend::Sqlite, &[&mock], "").await?;

    let (base_url, key) = (proxy.base_url.clone(), proxy.key.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script())
            .args([&base_url, &key, MODEL])
            .output()
    })
    .await??;
    if !out.status.success() {
        bail!(
            "openai_client.py failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let got: Value =
        serde_json::from_slice(&out.stdout).context("the script's summary is not JSON")?;

    // 1. the stream, reassembled by the SDK, is the upstream's text, usage included
    assert_eq!(
        got["stream"]["text"], "Hello from up serving model-0.",
        "{got:#}"
    );
    assert_eq!(got["stream"]["completion_tokens"], 6, "{got:#}");
    assert_eq!(got["stream"]["prompt_tokens"], 5, "{got:#}");
    // 2. the tool call's arguments are byte-for-byte what the upstream sent
    assert_eq!(got["tool_call"]["name"], "get_weather");
    assert_eq!(got["tool_call"]["arguments"], r#"{"city": "Oslo"}"#);
    assert_eq!(got["tool_call"]["id"], "call_0");
    // 3. logprobs: the upstream's tokens, values and alternatives
    let pieces = ["Hello", " from", " up", " serving", " model-0", "."];
    assert_eq!(got["logprobs"]["tokens"], json!(pieces), "{got:#}");
    let expected_lp: Vec<f64> = (0..pieces.len())
        .map(|i| -0.0625 * ((i % 7) as f64 + 1.0))
        .collect();
    assert_eq!(got["logprobs"]["logprobs"], json!(expected_lp));
    assert_eq!(got["logprobs"]["top"][0], json!(["Hello", "alt1"]));
    // 4. the model routes, through the SDK's own types
    assert_eq!(
        got["models"],
        json!({"listed": [MODEL], "retrieved": MODEL,
               "missing": {"status": 404, "code": "model_not_found"}}),
        "{got:#}"
    );

    // the fields the app sent reached the upstream untouched (only `model` changed)
    let seen = mock.requests();
    assert_eq!(seen.len(), 3);
    let bodies: Vec<Value> = seen.iter().map(|r| r.json().unwrap_or_default()).collect();
    assert_eq!(bodies[0]["stream_options"], json!({"include_usage": true}));
    assert_eq!(bodies[1]["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(bodies[1]["tool_choice"], "auto");
    assert_eq!(
        (
            bodies[2]["logprobs"].clone(),
            bodies[2]["top_logprobs"].clone()
        ),
        (json!(true), json!(2))
    );
    assert!(
        bodies.iter().all(|b| b["model"] == "model-0"),
        "{bodies:#?}"
    );

    // and each request has its record
    let records = proxy.records(3).await?;
    assert_eq!(records.len(), 3, "{records:#?}");
    assert!(
        records.iter().all(|r| r.final_attempt
            && r.status == Some(200)
            && r.route == "chat"
            && r.key_id.is_some()),
        "{records:#?}"
    );
    assert!(
        records[0].stream && !records[0].usage_counted,
        "{records:#?}"
    );
    assert_eq!(
        (records[0].prompt_tokens, records[0].completion_tokens),
        (Some(5), Some(6))
    );
    assert_eq!(records[0].finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        (records[1].tool_calls, records[1].tool_errored),
        (1, false),
        "{records:#?}"
    );
    assert_eq!(records[1].finish_reason.as_deref(), Some("tool_calls"));
    assert!(
        !records[2].stream && records[2].finish_reason.as_deref() == Some("stop"),
        "{records:#?}"
    );

    proxy.stop().await?;
    mock.shutdown().await;
    Ok(())
}
