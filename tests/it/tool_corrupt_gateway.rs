//! Real tool calls through the real gateway: the test model, forced to call a tool by the
//! engine's constrained decoding (`tool_choice: "required"`), served once faithfully and once
//! under the `tool-corrupt` profile (every call corrupted: cut JSON, an undeclared name, or a
//! required argument dropped). The gateway's tool-call tracking must record each corruption
//! in its class (`invalid_json`, `unknown_name`, `schema_mismatch`) on streamed and
//! non-streamed answers, and the faithful endpoint's calls as valid.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use samewise_store::{RecordQuery, RequestRecord, Store};
use serde_json::{Value, json};

use crate::common::probes::engine;
use crate::common::{create_key, spawn_listening};

/// Requests per endpoint: the corruption mode is drawn per request from the profile's seed
/// and the request's arrival number, so the classes seen are the same on every run.
const REQUESTS: usize = 12;

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
        }, "required": ["city", "unit"], "additionalProperties": false}
    }}])
}

fn config(data: &Path, good: &str, bad: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
         [providers.good]\nbase_url = \"{good}/v1\"\n[providers.bad]\nbase_url = \"{bad}/v1\"\n\n\
         [models.good]\n[[models.good.endpoints]]\nprovider = \"good\"\nmodel = \"smol\"\n\
         [models.bad]\n[[models.bad.endpoints]]\nprovider = \"bad\"\nmodel = \"smol\"\n",
        data.display()
    )
}

/// Sends one forced tool call request for `model`; streamed when `stream`.
async fn call(client: &reqwest::Client, url: &str, key: &str, model: &str, i: usize) -> Result<()> {
    let cities = ["Paris", "Oslo", "Lima", "Kyoto"];
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": format!("What is the weather in {}?", cities[i % cities.len()])}],
        "tools": tools(),
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "temperature": 0.0,
        "max_tokens": 96,
        "stream": i % 2 == 1,
    });
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    ensure!(r.status().is_success(), "{model} #{i}: {}", r.status());
    let text = r.text().await?;
    ensure!(
        text.contains("get_weather"),
        "{model} #{i}: no call in {text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_classifies_real_corrupted_tool_calls() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let (good_engine, good) = engine("reference", dir.path())?;
    let (bad_engine, bad) = engine("tool-corrupt", dir.path())?;
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(&cfg, config(&data, &good, &bad))?;
    let key = create_key(&cfg, dir.path(), "tools", false)?;
    let cfg_arg = cfg.to_str().context("config path is not UTF-8")?;
    let (gateway, url) = spawn_listening(&["serve", "--config", cfg_arg], dir.path())?;

    let client = reqwest::Client::new();
    for i in 0..REQUESTS {
        call(&client, &url, &key, "bad", i).await?;
        call(&client, &url, &key, "good", i).await?;
    }
    // SIGTERM drains the record queue into the store before exiting
    gateway.stop()?;
    drop((good_engine, bad_engine));

    let store = Store::connect(None, &data).await?;
    let records = store
        .request_records(&RecordQuery {
            limit: 1000,
            ..RecordQuery::default()
        })
        .await;
    store.close().await;
    let records = records?;
    let of = |m: &str| -> Vec<&RequestRecord> { records.iter().filter(|r| r.model == m).collect() };
    let (good, bad) = (of("good"), of("bad"));
    ensure!(
        good.len() == REQUESTS && bad.len() == REQUESTS,
        "{} good, {} bad records",
        good.len(),
        bad.len()
    );

    // the faithful endpoint: one real call each (parallel_tool_calls false), valid, finish
    // reason tool_calls
    for r in &good {
        ensure!(
            r.tool_calls >= 1
                && !r.tool_errored
                && r.finish_reason.as_deref() == Some("tool_calls"),
            "faithful call misjudged: {r:?}"
        );
    }
    // the corrupting endpoint: every answer errored, and each corruption in its class
    for r in &bad {
        ensure!(
            r.tool_calls >= 1 && r.tool_errored,
            "corrupted call not flagged: {r:?}"
        );
    }
    let sum = |f: fn(&RequestRecord) -> u32| bad.iter().map(|r| f(r)).sum::<u32>();
    let (invalid, unknown, mismatch) = (
        sum(|r| r.tool_invalid_json),
        sum(|r| r.tool_unknown_name),
        sum(|r| r.tool_schema_mismatch),
    );
    ensure!(
        invalid > 0 && unknown > 0 && mismatch > 0,
        "classes over {REQUESTS} corrupted answers: invalid_json {invalid}, unknown_name {unknown}, schema_mismatch {mismatch}"
    );
    ensure!(
        bad.iter().any(|r| r.stream) && bad.iter().any(|r| !r.stream),
        "both streamed and non-streamed answers were checked"
    );
    Ok(())
}
