//! The `regression` suite end to end (issue #10, item 3): real engine processes under serving
//! profiles, the real gateway with body capture, `samewise evals capture` and `evals run`.
//!
//! - Capture is off by default: traffic to a model without `[models.NAME.capture]` leaves no
//!   body. On, a flagged request (a real corrupted tool call from the `tool-corrupt` profile)
//!   is stored with its auth-looking fields redacted, an unflagged one is not, the model's
//!   bytes stay within `max_bytes` with the oldest evicted, and `samewise bodies purge`
//!   deletes them. (The age bound is SQL tested on both stores in `store/tests/store/bodies.rs`.)
//! - Captured tool-call requests become cases by request and by alert (replayed on the
//!   reference engine, a `tool_call` check each); a regression job with no cases ends "n/a";
//!   the job on the `tool-corrupt` endpoint ends "degraded", its twin on a faithful endpoint
//!   (the `reference` profile) does not. `samewise evals cases` lists the cases and deletes
//!   them by id and by suite (a delete naming nothing is refused); the emptied suite's job
//!   ends "n/a" again.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use samewise_store::{BodyQuery, NewAlert, Store};
use serde_json::{Value, json};

use crate::common::probes::engine;
use crate::common::{run_ok, spawn_listening};

/// One forced tool call per city; 8 cases all lost by the corrupting endpoint give McNemar's
/// exact p = 2/2^8 = 0.0078 < α = 0.01 (one look).
const CITIES: [&str; 8] = [
    "Paris", "Oslo", "Lima", "Kyoto", "Cairo", "Quito", "Rome", "Bern",
];

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

/// `samewise ARGS --config CFG` on SQLite; fails unless it succeeds; its stdout.
fn samewise(args: &[&str], cfg: &Path) -> Result<String> {
    let cfg = cfg.to_str().context("path")?;
    run_ok(&[args, &["--config", cfg]].concat(), Path::new("."))
}

/// A client key for the gateway of `cfg`.
fn client_key(cfg: &Path) -> Result<String> {
    Ok(samewise(&["keys", "create", "regression"], cfg)?
        .trim()
        .to_owned())
}

/// POSTs one chat request through the gateway; returns the request id and the status.
async fn chat(url: &str, key: &str, body: &Value) -> Result<(String, u16)> {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let id = r
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .context("no x-request-id")?
        .to_owned();
    let status = r.status().as_u16();
    let _ = r.text().await?;
    Ok((id, status))
}

/// A forced tool call about `city`, carrying auth-looking fields that capture must redact.
fn tool_request(model: &str, city: &str, stream: bool, only: Option<&str>) -> Value {
    let mut b = json!({
        "model": model,
        "messages": [{"role": "user", "content": format!("What is the weather in {city}?")}],
        "tools": tools(),
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "temperature": 0.0,
        "max_tokens": 48,
        "stream": stream,
        "api_key": "sk-body-SECRET-1",
        "metadata": {"authorization": "Bearer sk-body-SECRET-2"},
    });
    if let Some(p) = only {
        b["provider"] = json!({"only": [p]});
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_is_opt_in_redacted_bounded_and_purged() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let (_bad_engine, bad) = engine("tool-corrupt", dir.path())?;
    let cfg = dir.path().join("samewise.toml");
    // two models on the same corrupting engine; only "on" captures, within 4 KiB
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
             [providers.a]\nbase_url = \"{bad}/v1\"\n[providers.b]\nbase_url = \"{bad}/v1\"\n\n\
             [models.off]\n[[models.off.endpoints]]\nprovider = \"a\"\nmodel = \"smol\"\n\
             [models.on]\n[[models.on.endpoints]]\nprovider = \"b\"\nmodel = \"smol\"\n\
             [models.on.capture]\nenabled = true\nmax_bytes = 4096\nmax_body_bytes = 2048\n",
            data.display()
        ),
    )?;
    let key = client_key(&cfg)?;
    let cfg_arg = cfg.to_str().context("config path is not UTF-8")?;
    let (gateway, url) = spawn_listening(&["serve", "--config", cfg_arg], dir.path())?;
    let mut flagged = Vec::new();
    for (i, city) in CITIES.iter().take(6).enumerate() {
        if i < 2 {
            // the same flagged traffic on the model that does not capture
            chat(&url, &key, &tool_request("off", city, false, None)).await?;
        }
        let (id, status) = chat(&url, &key, &tool_request("on", city, i % 2 == 1, None)).await?;
        ensure!(status == 200, "{id}: {status}");
        flagged.push(id);
    }
    // not flagged: a plain answer on the capturing model
    let plain =
        json!({"model": "on", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
    let (plain_id, _) = chat(&url, &key, &plain).await?;
    ensure!(gateway.stop()?.success());

    let store = Store::connect(None, &data).await?;
    let now = samewise_store::now_ms();
    let all = |model: &str| BodyQuery {
        model: Some(model.to_owned()),
        ..BodyQuery::default()
    };
    let off = store.captured_bodies(&all("off"), now).await?;
    let on = store.captured_bodies(&all("on"), now).await?;
    ensure!(off.is_empty(), "capture is off by default: {off:?}");
    ensure!(
        store.captured_body(&plain_id, now).await?.is_none(),
        "an unflagged request was kept"
    );
    // bounded: within 4 KiB, the newest kept and the oldest evicted
    let bytes: i64 = on.iter().map(|b| b.bytes).sum();
    ensure!(
        !on.is_empty() && on.len() < flagged.len() && bytes <= 4096,
        "{} of {} flagged bodies kept, {bytes} bytes",
        on.len(),
        flagged.len()
    );
    ensure!(
        on[0].request_id == flagged[flagged.len() - 1],
        "newest not kept"
    );
    ensure!(
        store.captured_body(&flagged[0], now).await?.is_none(),
        "oldest not evicted"
    );
    for b in &on {
        let text = format!("{} {}", b.request, b.response);
        ensure!(!text.contains("SECRET"), "a secret kept: {text}");
        ensure!(b.request["api_key"] == "[redacted]", "{}", b.request);
        ensure!(b.flags.contains(&"tool_error".to_owned()), "{:?}", b.flags);
        ensure!(b.endpoint.as_deref() == Some("b/smol"), "{:?}", b.endpoint);
        // the assembled answer (streams too): the corrupted call as the client got it
        let calls = b.response["answer"]["tool_calls"]
            .as_array()
            .map_or(0, Vec::len);
        ensure!(calls >= 1, "no assembled call: {}", b.response);
    }
    store.close().await;
    let out = samewise(&["bodies", "purge", "--model", "on"], &cfg)?;
    ensure!(
        out.contains(&format!("{} captured bodies deleted", on.len())),
        "{out}"
    );
    let store = Store::connect(None, &data).await?;
    let left = store.captured_bodies(&BodyQuery::default(), now).await?;
    store.close().await;
    ensure!(left.is_empty(), "purge left {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_tool_calls_become_cases_and_find_the_corrupting_endpoint() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let (_ref_engine, reference) = engine("reference", dir.path())?;
    let (_bad_engine, bad) = engine("tool-corrupt", dir.path())?;
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
             [providers.bad]\nbase_url = \"{bad}/v1\"\n[providers.good]\nbase_url = \"{reference}/v1\"\n\n\
             [models.smol]\n[[models.smol.endpoints]]\nprovider = \"bad\"\nmodel = \"smol\"\n\
             [[models.smol.endpoints]]\nprovider = \"good\"\nmodel = \"smol\"\n\
             [models.smol.capture]\nenabled = true\n\n\
             [evals]\nreference_url = \"{reference}\"\nreference_model = \"smol\"\nlooks = 1\nworkers = 0\n",
            data.display()
        ),
    )?;
    // no cases yet: the suite has nothing to compare
    let empty: Value = serde_json::from_str(&samewise(
        &[
            "evals",
            "run",
            "--endpoint",
            "bad/smol",
            "--suite",
            "regression",
            "--json",
        ],
        &cfg,
    )?)?;
    ensure!(empty["verdict"]["verdict"] == "n/a", "{empty}");

    let key = client_key(&cfg)?;
    let cfg_arg = cfg.to_str().context("config path is not UTF-8")?;
    let (gateway, url) = spawn_listening(&["serve", "--config", cfg_arg], dir.path())?;
    let mut ids = Vec::new();
    for (i, city) in CITIES.iter().enumerate() {
        let (id, status) = chat(
            &url,
            &key,
            &tool_request("smol", city, i % 2 == 0, Some("bad")),
        )
        .await?;
        ensure!(status == 200, "{id}: {status}");
        ids.push(id);
    }
    ensure!(gateway.stop()?.success());

    // one case by request, the rest by an alert on the endpoint
    let out = samewise(&["evals", "capture", "--request", &ids[0]], &cfg)?;
    ensure!(out.contains("1 cases made"), "{out}");
    let store = Store::connect(None, &data).await?;
    let (alert, _) = store
        .upsert_alert(&NewAlert {
            model: "smol".into(),
            endpoint: "bad/smol".into(),
            kind: "passive".into(),
            summary: "tool-call errors".into(),
            evidence: json!({"signal": "tool_errors"}),
            now_ms: samewise_store::now_ms(),
        })
        .await?;
    store.close().await;
    let out = samewise(
        &[
            "evals",
            "capture",
            "--alert",
            &alert.id.to_string(),
            "--json",
        ],
        &cfg,
    )?;
    let report: Value = serde_json::from_str(&out)?;
    let made = report["made"].as_array().map_or(0, Vec::len);
    ensure!(made == CITIES.len() - 1, "{report}");
    ensure!(
        report["made"]
            .as_array()
            .is_some_and(|m| m.iter().all(|c| c["check"] == "tool_call")),
        "{report}"
    );
    let skipped = &report["skipped"];
    ensure!(
        skipped.as_array().map_or(0, Vec::len) == 1 && skipped[0]["request_id"] == ids[0].as_str(),
        "the case by request is not made twice: {report}"
    );

    let run = |endpoint: &str| -> Result<Value> {
        let out = samewise(
            &[
                "evals",
                "run",
                "--endpoint",
                endpoint,
                "--suite",
                "regression",
                "--json",
            ],
            &cfg,
        )?;
        Ok(serde_json::from_str(&out)?)
    };
    let corrupt = run("bad/smol")?;
    let v = &corrupt["verdict"];
    ensure!(v["verdict"] == "degraded", "tool-corrupt: {v}");
    ensure!(
        v["items"] == CITIES.len() && v["baseline"]["passed"] == CITIES.len(),
        "{v}"
    );
    let faithful = run("good/smol")?;
    let v = &faithful["verdict"];
    ensure!(
        v["verdict"] == "equivalent" || v["verdict"] == "inconclusive",
        "faithful: {v}"
    );
    ensure!(v["suspect"]["passed"] == CITIES.len(), "faithful: {v}");

    let listed: Value =
        serde_json::from_str(&samewise(&["evals", "cases", "list", "--json"], &cfg)?)?;
    let cases = listed.as_array().context("a JSON list of cases")?;
    ensure!(
        cases.len() == CITIES.len()
            && cases.iter().all(|c| c["model"] == "smol"
                && c["suite"] == "regression"
                && c["item"]["check"]["kind"] == "tool_call"),
        "{listed}"
    );
    ensure!(
        cases[0]["source_request_id"] == ids[0].as_str(),
        "oldest first: {listed}"
    );
    let first = cases[0]["id"].as_i64().context("a case id")?.to_string();
    let out = samewise(&["evals", "cases", "delete", &first], &cfg)?;
    ensure!(out.contains("1 cases deleted"), "{out}");
    let out = samewise(&["evals", "cases", "list", "--suite", "regression"], &cfg)?;
    ensure!(
        out.contains(&format!("\n{} cases", CITIES.len() - 1)) && !out.contains(&ids[0]),
        "{out}"
    );
    let none = samewise(&["evals", "cases", "delete"], &cfg);
    ensure!(
        none.as_ref()
            .is_err_and(|e| e.to_string().contains("name the cases to delete")),
        "a delete naming nothing: {none:?}"
    );
    let out = samewise(
        &[
            "evals",
            "cases",
            "delete",
            "--model",
            "smol",
            "--suite",
            "regression",
        ],
        &cfg,
    )?;
    ensure!(
        out.contains(&format!("{} cases deleted", CITIES.len() - 1)),
        "{out}"
    );
    let emptied = run("bad/smol")?;
    ensure!(emptied["verdict"]["verdict"] == "n/a", "{emptied}");
    Ok(())
}
