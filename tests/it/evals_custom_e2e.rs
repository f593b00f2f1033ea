//! Customer suites end to end (issue #10): JSONL files run by the real `samewise evals`
//! CLI against real `samewise engine serve --profile P` processes on the test model.
//!
//! - A one-off `--suite-file` on a `tool-corrupt` endpoint: "degraded", its failures in the
//!   `tool_call` bucket (both answers kept per item), the text and JSON-schema items — which
//!   the corruption does not touch — concordant; its twin, the same suite configured by name
//!   (`[evals.suites.NAME]`) on the reference's own endpoint: "equivalent".
//! - A suite with no items ends "n/a"; a malformed file is refused with its line and field,
//!   by `samewise evals run` and by `samewise config check`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::common::probes::engine;
use crate::common::{BIN, run_ok};
use crate::evals_e2e::{config, evals_run_args, evals_run_suite};

/// Forced calls of a tool without parameters: the engine's constrained decoding answers
/// `{}`, which passes; every corruption (cut JSON, an undeclared name; nothing required to
/// drop, so cut JSON again) fails.
const CALL_ITEMS: usize = 20;

/// The suite: [`CALL_ITEMS`] tool-call items, then one item of each other kind.
fn suite() -> String {
    let tool = json!([{"type": "function", "function": {
        "name": "get_time", "description": "The current time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": false}
    }}]);
    let cities = ["Paris", "Oslo", "Lima", "Kyoto", "Cairo"];
    let mut lines: Vec<Value> = (0..CALL_ITEMS)
        .map(|i| {
            json!({
                "id": format!("time-{i}"),
                "request": {
                    "messages": [{"role": "user", "content": format!("What time is it in {}? (#{i})", cities[i % cities.len()])}],
                    "tools": tool, "tool_choice": "required", "max_tokens": 32
                },
                "check": {"kind": "tool_call", "calls": [{"name": "get_time"}]}
            })
        })
        .collect();
    let ask = |q: &str| json!({"messages": [{"role": "user", "content": q}], "max_tokens": 24});
    lines.push(
        json!({"id": "capital", "request": ask("What is the capital of France?"),
        "check": {"kind": "contains", "value": "paris", "ignore_case": true}}),
    );
    lines.push(
        json!({"id": "digits", "request": ask("Write the number four as a digit."),
        "check": {"kind": "regex", "pattern": "\\b4\\b"}}),
    );
    lines.push(
        json!({"id": "echo", "request": ask("Reply with exactly: yes"),
        "check": {"kind": "exact", "value": "yes"}}),
    );
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
        "required": ["city"], "additionalProperties": false});
    lines.push(json!({"id": "json", "request": {
            "messages": [{"role": "user", "content": "Name a city as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
            "max_tokens": 32},
        "check": {"kind": "json_schema", "schema": schema}}));
    let mut text = String::new();
    for l in lines {
        text += &l.to_string();
        text += "\n";
    }
    text
}

#[test]
fn a_customer_suite_finds_tool_corrupt_degraded_and_the_reference_equivalent() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_good, good_url) = engine("reference", dir.path())?;
    let (_bad, bad_url) = engine("tool-corrupt", dir.path())?;
    let file = dir.path().join("calls.jsonl");
    std::fs::write(&file, suite())?;
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n")?;
    // one look: the whole suite is judged at once
    let cfg = config(
        dir.path(),
        &[("good", &good_url), ("bad", &bad_url)],
        &format!(
            "concurrency = 4\nlooks = 1\n[evals.suites.calls]\npath = {:?}\n[evals.suites.nothing]\npath = {:?}",
            file.display().to_string(),
            empty.display().to_string()
        ),
    )?;
    let file_arg = file.to_str().context("path")?;

    // the one-off file on the corrupting endpoint
    let job = evals_run_args(&cfg, &["--suite-file", file_arg, "--endpoint", "bad/smol"])?;
    ensure!(job["suite"] == "file:calls.jsonl", "{}", job["suite"]);
    let v = &job["verdict"];
    ensure!(
        v["verdict"] == "degraded",
        "tool-corrupt not degraded: {v:#}"
    );
    ensure!(v["items"] == CALL_ITEMS + 4, "{v:#}");
    let by = &v["extras"]["by_check"];
    ensure!(
        by["tool_call"]["baseline_passed"] == CALL_ITEMS && by["tool_call"]["suspect_passed"] == 0,
        "{by:#}"
    );
    // the corruption touches tool calls only: the other kinds agree item by item
    for kind in ["contains", "regex", "exact", "json_schema"] {
        ensure!(
            by[kind]["items"] == 1 && by[kind]["suspect_passed"] == by[kind]["baseline_passed"],
            "{kind}: {by:#}"
        );
    }
    // the constrained JSON answer passes its schema on both sides
    ensure!(by["json_schema"]["baseline_passed"] == 1, "{by:#}");
    let fails = &v["suspect"]["failures"];
    ensure!(fails["tool_call"] == CALL_ITEMS, "{fails}");
    ensure!(
        v["baseline"]["failures"].get("tool_call").is_none(),
        "{}",
        v["baseline"]["failures"]
    );

    // both answers kept per item, the check's reason within its kind
    let id = job["id"].as_i64().context("no job id")?;
    let export = dir.path().join("items.jsonl");
    let out = Command::new(BIN)
        .args(["evals", "--config"])
        .arg(&cfg)
        .args(["show", &id.to_string(), "--export"])
        .arg(&export)
        .env_remove("DATABASE_URL")
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = std::fs::read_to_string(&export)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(rows.len() == 2 * (CALL_ITEMS + 4), "{} rows", rows.len());
    // reading a job needs the store alone, as `alerts` does: no config
    let out = Command::new(BIN)
        .args(["evals", "--json", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["show", &id.to_string()])
        .env_remove("DATABASE_URL")
        .output()?;
    let shown: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    ensure!(
        shown["id"] == id && shown["verdict"] == job["verdict"],
        "{shown:#}"
    );
    let side = |item: &str, target: &str| {
        rows.iter()
            .find(|r| r["item"] == item && r["target"] == target)
            .cloned()
            .unwrap_or_default()
    };
    let (s, b) = (side("time-0", "suspect"), side("time-0", "baseline"));
    ensure!(
        s["error_type"] == "tool_call" && b["passed"] == true,
        "{s}\n{b}"
    );
    ensure!(s["record"]["check"]["kind"] == "tool_call");
    ensure!(
        ["invalid_json", "wrong_name"]
            .contains(&s["record"]["check"]["reason"].as_str().unwrap_or("")),
        "{s}"
    );
    ensure!(
        b["record"]["calls"][0]["name"] == "get_time"
            && b["record"]["calls"][0]["arguments"] == "{}"
    );
    ensure!(s["record"]["answer"]["tool_calls"].is_array(), "{s}");

    // the twin: the same suite, configured by name, on the reference's own endpoint
    let job = evals_run_suite(
        &cfg,
        "calls",
        &["--endpoint", "good/smol", "--delta", "0.10"],
    )?;
    let v = &job["verdict"];
    ensure!(
        v["verdict"] == "equivalent",
        "reference not equivalent: {v:#}"
    );
    ensure!(
        v["paired"]["suspect_only"] == 0 && v["paired"]["baseline_only"] == 0,
        "{v:#}"
    );

    // no items: "n/a", not "equivalent"
    let job = evals_run_suite(&cfg, "nothing", &["--endpoint", "bad/smol"])?;
    ensure!(job["verdict"]["verdict"] == "n/a", "{:#}", job["verdict"]);
    ensure!(job["verdict"]["items"] == 0);

    // the three jobs listed, newest first, from the store alone
    let data = dir.path().join("data");
    let list = evals_list(&data, &[])?;
    let rows: Vec<Vec<&str>> = list
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    ensure!(
        rows.len() == 4 && rows[0][..3] == ["ID", "STATE", "SUITE"],
        "{list}"
    );
    let seen: Vec<(&str, &str, &str, &str)> =
        rows[1..].iter().map(|r| (r[2], r[3], r[4], r[5])).collect();
    ensure!(
        seen == [
            ("nothing", "bad/smol", "reference", "n/a"),
            ("calls", "good/smol", "reference", "equivalent"),
            ("file:calls.jsonl", "bad/smol", "reference", "degraded"),
        ] && rows[1..].iter().all(|r| r[1] == "succeeded" && r[8] == "-"),
        "{list}"
    );
    let ids: Vec<i64> = rows[1..]
        .iter()
        .map(|r| r[0].parse())
        .collect::<Result<_, _>>()?;
    ensure!(ids.windows(2).all(|w| w[0] > w[1]), "{list}");
    let listed: Value = serde_json::from_str(&evals_list(
        &data,
        &["--json", "--endpoint", "bad/smol", "--limit", "1"],
    )?)?;
    ensure!(
        listed.as_array().map(Vec::len) == Some(1) && listed[0]["id"] == ids[0],
        "{listed:#}"
    );
    ensure!(listed[0]["verdict"]["verdict"] == "n/a", "{listed:#}");
    ensure!(evals_list(&data, &["--alert", "1"])? == "no eval jobs\n");
    Ok(())
}

/// `samewise evals --data-dir DATA list ARGS`'s stdout (it must succeed).
fn evals_list(data: &Path, args: &[&str]) -> Result<String> {
    let data = data.to_str().context("path")?;
    let head = ["evals", "--data-dir", data, "list"];
    run_ok(&[&head[..], args].concat(), Path::new("."))
}

/// `samewise evals ARGS` (SQLite); its stderr, failing unless the command fails.
fn evals_fails(cfg: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(BIN)
        .args(["evals", "--config"])
        .arg(cfg)
        .args(args)
        .env_remove("DATABASE_URL")
        .output()?;
    ensure!(!out.status.success(), "evals {args:?} succeeded");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn malformed_suites_are_refused_with_their_line_and_field() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("bad.jsonl");
    let good_line = r#"{"request": {"messages": [{"role": "user", "content": "hi"}]}, "check": {"kind": "exact", "value": "x"}}"#;
    std::fs::write(
        &bad,
        format!(
            "{good_line}\n\n{}\n",
            r#"{"request": {"messages": [{"role": "user", "content": "hi"}]}, "check": {"kind": "regex", "pattern": "(unclosed"}}"#
        ),
    )?;
    let bad_arg = bad.to_str().context("path")?;
    // no engine is needed: nothing is opened
    let cfg = config(dir.path(), &[("p", "http://127.0.0.1:9")], "")?;
    let stderr = evals_fails(
        &cfg,
        &["run", "--suite-file", bad_arg, "--endpoint", "p/smol"],
    )?;
    ensure!(
        stderr.contains(&format!("{bad_arg}:3: check.pattern: invalid regex")),
        "{stderr}"
    );
    let stderr = evals_fails(&cfg, &["run", "--suite", "nope", "--endpoint", "p/smol"])?;
    ensure!(
        stderr.contains("unknown suite \"nope\" (known: tool_calls, long_context, regression)"),
        "{stderr}"
    );
    let stderr = evals_fails(
        &cfg,
        &["run", "--suite", "tool_calls", "--endpoint", "q/smol"],
    )?;
    ensure!(stderr.contains("unknown endpoint \"q/smol\""), "{stderr}");
    let stderr = evals_fails(&cfg, &["run", "--endpoint", "p/smol"])?;
    ensure!(stderr.contains("--suite"), "{stderr}");

    // configured by name: the config itself is refused, naming the key, the line and field
    let cfg = config(
        dir.path(),
        &[("p", "http://127.0.0.1:9")],
        &format!("[evals.suites.mine]\npath = {bad_arg:?}"),
    )?;
    let out = Command::new(BIN)
        .args(["config", "check"])
        .arg(&cfg)
        .env_remove("DATABASE_URL")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && stderr.contains("evals.suites.mine.path")
            && stderr.contains(":3: check.pattern: invalid regex"),
        "{stderr}"
    );
    // no refused run opened a job
    let cfg = config(dir.path(), &[("p", "http://127.0.0.1:9")], "")?;
    let stderr = evals_fails(&cfg, &["show", "1"])?;
    ensure!(stderr.contains("no eval job 1"), "{stderr}");
    // running a job needs the endpoints: without --config, a clear refusal
    let out = Command::new(BIN)
        .args(["evals", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["run", "--endpoint", "p/smol", "--suite", "tool_calls"])
        .env_remove("DATABASE_URL")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("need --config FILE"),
        "{stderr}"
    );
    Ok(())
}
