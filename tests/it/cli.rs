//! The real `samewise` binary, spawned as a process: `config check` (exit codes, errors that
//! name the key and line), `keys create`, and `serve` end to end — a request through the
//! gateway to a mock provider with the provider key from the environment, then SIGTERM: the
//! process exits 0 after draining, and the request's record is in the SQLite store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_testkit::MockUpstream;
use serde_json::json;

use crate::common;
use common::{BIN, spawn_listening, test_model};

fn write(dir: &std::path::Path, name: &str, text: &str) -> Result<std::path::PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text)?;
    Ok(p)
}

fn config(base_url: &str, data_dir: &std::path::Path) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
         [providers.mock]\nbase_url = \"{base_url}\"\napi_key_env = \"CLI_TEST_PROVIDER_KEY\"\n\
         price_input_per_mtok = 1.0\nprice_output_per_mtok = 1.0\n\n\
         [models.smol]\npolicy = \"weighted\"\n[[models.smol.endpoints]]\nprovider = \"mock\"\nmodel = \"up-smol\"\n",
        data_dir.display()
    )
}

/// `samewise ... | head -1`: stdout's reader is gone before the first line. Before, `println!`
/// panicked ("failed printing to stdout: Broken pipe") with a backtrace on stderr, and
/// `eprintln!` likewise when stderr was gone.
#[test]
fn a_closed_stdout_is_left_quietly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_str().context("path")?;
    // `args` run with a stdout nobody reads: every write fails with EPIPE
    let closed_stdout = |args: &[&str]| -> Result<std::process::Output> {
        let (reader, writer) = std::io::pipe()?;
        drop(reader);
        Ok(Command::new(BIN)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("DATABASE_URL")
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()?)
    };
    // a new key that could not be shown is revoked, and the command fails: nobody holds it
    // (and the database it made is there for the readers below)
    let out = closed_stdout(&["keys", "--data-dir", data, "create", "unseen"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1) && stderr.contains("\"unseen\" was revoked"),
        "{:?} {stderr}",
        out.status
    );
    for args in [
        vec!["config", "check", "examples/samewise.toml"],
        vec!["keys", "--data-dir", data, "list"],
        vec!["alerts", "--data-dir", data, "list"],
    ] {
        let out = closed_stdout(&args)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked") && !stderr.contains("error"),
            "{args:?}: {:?} {stderr}",
            out.status
        );
    }
    let out = Command::new(BIN)
        .args(["keys", "--data-dir", data, "list"])
        .env_remove("DATABASE_URL")
        .output()?;
    let listed = String::from_utf8(out.stdout)?;
    assert!(
        listed
            .lines()
            .any(|l| l.contains("\tunseen\t") && l.contains("\trevoked\t")),
        "{listed}"
    );
    // stderr gone too (`2>&1 | head`): the error still exits 1, not a panic's 101
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let status = Command::new(BIN)
        .args(["config", "check", "/nonexistent/samewise.toml"])
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .status()?;
    assert_eq!(status.code(), Some(1), "{status:?}");
    Ok(())
}

/// The commands that read or change what a gateway stored, pointed at a directory the gateway
/// never used (a typo, or the default `samewise-data` in the wrong working directory), say so
/// and exit 1. Before, each made a new empty database there and answered "no alerts".
#[test]
fn readers_of_the_store_refuse_a_directory_without_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("typo");
    let data = missing.to_str().context("path")?;
    for args in [
        vec!["alerts", "--data-dir", data, "list"],
        vec!["alerts", "--data-dir", data, "resolve", "1"],
        vec!["keys", "--data-dir", data, "list"],
        vec!["keys", "--data-dir", data, "revoke", "me"],
        vec!["keys", "--data-dir", data, "usage"],
        vec!["bodies", "--data-dir", data, "list"],
        vec!["bodies", "--data-dir", data, "purge"],
        vec!["evals", "--data-dir", data, "list"],
        vec!["evals", "--data-dir", data, "show", "1"],
        vec!["evals", "--data-dir", data, "cases", "list"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("DATABASE_URL")
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected = format!("no samewise database at {data}/samewise.db");
        assert!(
            out.status.code() == Some(1)
                && stderr.contains(&expected)
                && stderr.contains("--data-dir")
                && out.stdout.is_empty(),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        assert!(!missing.exists(), "{args:?} made {data}");
    }
    // a key may still be made before the gateway's first start, and then the readers read
    let out = Command::new(BIN)
        .args(["keys", "--data-dir", data, "create", "first"])
        .env_remove("DATABASE_URL")
        .output()?;
    assert!(out.status.success(), "{out:?}");
    let out = Command::new(BIN)
        .args(["alerts", "--data-dir", data, "list"])
        .env_remove("DATABASE_URL")
        .output()?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no alerts\n",
        "{out:?}"
    );
    let out = Command::new(BIN)
        .args(["evals", "--data-dir", data, "list"])
        .env_remove("DATABASE_URL")
        .output()?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no eval jobs\n",
        "{out:?}"
    );
    Ok(())
}

#[test]
fn config_check_accepts_the_example_and_names_bad_keys_with_lines() -> Result<()> {
    let out = Command::new(BIN)
        .args(["config", "check", "examples/samewise.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout)?;
    assert!(
        stdout.contains("ok") && stdout.contains("model smollm2"),
        "{stdout}"
    );
    // the probes example: its ladder exists and its `~/` model path is the model cache's
    let out = Command::new(BIN)
        .args(["config", "check", "examples/probes.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    let stdout = String::from_utf8(out.stdout)?;
    assert!(
        out.status.success() && stdout.contains("probes: 1 model(s), reference in-process"),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stdout.contains("~/") && stdout.contains(".cache/samewise/models/"),
        "{stdout}"
    );
    // the example without reference weights: passive detectors, evals against a peer
    let out = Command::new(BIN)
        .args(["config", "check", "examples/passive.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    let stdout = String::from_utf8(out.stdout)?;
    assert!(
        out.status.success()
            && stdout
                .contains("probes: 1 model(s), reference none (fingerprint probes, passive detectors and alerts)")
            && stdout.contains("evals: 1 worker(s), reference none"),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::tempdir()?;
    let bad = config("http://127.0.0.1:9/v1", dir.path()).replace(
        "price_output_per_mtok = 1.0",
        "price_output_per_mtok = 1.0\nprice_per_token = 3",
    );
    let path = write(dir.path(), "bad.toml", &bad)?;
    let out = Command::new(BIN)
        .args(["config", "check"])
        .arg(&path)
        .output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr)?;
    assert!(
        stderr.contains("price_per_token") && stderr.contains("line 10"),
        "{stderr}"
    );

    let bad = config("http://127.0.0.1:9/v1", dir.path())
        .replace("provider = \"mock\"", "provider = \"absent\"");
    let path = write(dir.path(), "bad2.toml", &bad)?;
    let out = Command::new(BIN)
        .args(["config", "check"])
        .arg(&path)
        .output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr)?;
    assert!(
        stderr.contains("models.smol.endpoints[0].provider") && stderr.contains("line 14"),
        "{stderr}"
    );
    Ok(())
}

/// keys create, serve (on SQLite in the data dir, or on `database_url`), one request, SIGTERM,
/// and the record read back from the same store.
async fn serve_end_to_end(database_url: Option<&str>) -> Result<()> {
    let mock = MockUpstream::builder().name("cli").start().await?;
    let dir = tempfile::tempdir()?;
    let cfg = write(
        dir.path(),
        "samewise.toml",
        &config(&mock.base_url(), &dir.path().join("data")),
    )?;

    let out = Command::new(BIN)
        .args(["keys", "create", "cli-test", "--config"])
        .arg(&cfg)
        .env_remove("DATABASE_URL")
        .envs(database_url.map(|u| ("DATABASE_URL", u)))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout)?.trim().to_owned();
    assert!(key.starts_with("sw-"), "{key}");

    // Without the provider key in the environment, serve refuses to start and names the variable.
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove("CLI_TEST_PROVIDER_KEY")
        .env_remove("DATABASE_URL")
        .envs(database_url.map(|u| ("DATABASE_URL", u)))
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CLI_TEST_PROVIDER_KEY"));

    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("CLI_TEST_PROVIDER_KEY", "sk-cli-secret")
        .env_remove("DATABASE_URL")
        .envs(database_url.map(|u| ("DATABASE_URL", u)))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .context("no 'listening on' line from samewise serve")?;
    let url = line
        .strip_prefix("listening on ")
        .context("unexpected first line")?
        .to_owned();

    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(r#"{"model":"smol","messages":[{"role":"user","content":"hi"}],"seed":3}"#)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let request_id = resp.headers()["x-request-id"].to_str()?.to_owned();
    let body = resp.text().await?;
    assert!(body.contains("up-smol"), "{body}");
    let reqs = mock.wait_for_requests(1, Duration::from_secs(2)).await?;
    assert_eq!(
        reqs[0].header("authorization"),
        Some("Bearer sk-cli-secret")
    );

    let resp = http
        .post(format!("{url}/v1/chat/completions"))
        .body("{}")
        .send()
        .await?;
    assert_eq!(resp.status(), 401);

    // SIGTERM: graceful exit with status 0, records drained to SQLite.
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "samewise serve did not stop after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr)?;
    }
    assert!(exit.success(), "exit {exit:?}: {stderr}");
    assert!(!stderr.contains("sk-cli-secret"));
    let _ = reader.join();

    let sqlite_file = dir.path().join("data").join("samewise.db");
    assert_eq!(
        sqlite_file.exists(),
        database_url.is_none(),
        "SQLite is used exactly when DATABASE_URL is unset"
    );
    let store = samewise_store::Store::connect(database_url, &dir.path().join("data")).await?;
    let q = samewise_store::RecordQuery {
        request_id: Some(request_id),
        ..Default::default()
    };
    let recs = store.request_records(&q).await?;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].endpoint.as_deref(), Some("mock/up-smol"));
    assert!(recs[0].final_attempt);
    store.close().await;

    // the key's usage: the one request it made (the keyless 401 is no key's)
    let usage = |json: bool| -> Result<String> {
        let out = Command::new(BIN)
            .args(["keys", "--config"])
            .arg(&cfg)
            .args(["usage", "--hours", "1"])
            .args(json.then_some("--json"))
            .env_remove("DATABASE_URL")
            .envs(database_url.map(|u| ("DATABASE_URL", u)))
            .output()?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    };
    let v: serde_json::Value = serde_json::from_str(&usage(true)?)?;
    let k = &v["keys"][0];
    assert_eq!(v["keys"].as_array().map(Vec::len), Some(1), "{v:#}");
    assert_eq!(
        (&k["key"], &k["requests"], &k["failed"], &k["attempts"]),
        (&json!("cli-test"), &json!(1), &json!(0), &json!(1)),
        "{v:#}"
    );
    assert_eq!(
        k["prompt_tokens"],
        json!(recs[0].prompt_tokens.unwrap_or(0))
    );
    assert_eq!(
        k["completion_tokens"],
        json!(recs[0].completion_tokens.unwrap_or(0))
    );
    assert_eq!(k["last_ms"], json!(recs[0].ts_ms), "{v:#}");
    let text = usage(false)?;
    let row: Vec<&str> = text
        .lines()
        .nth(2)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..6],
        ["cli-test", "1", "active", "1", "0", "1"],
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_create_then_serve_on_sqlite_forward_and_drain_on_sigterm() -> Result<()> {
    serve_end_to_end(None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_uses_postgres_when_database_url_is_set() -> Result<()> {
    let pg = samewise_store::testing::PgTestDatabase::create().await?;
    serve_end_to_end(Some(pg.url())).await
}

/// The README's run command: the example config starts in an empty directory (SQLite in its
/// relative data dir) and, in front of the reference engine on the test model, answers a chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_config_serves_the_engine_from_a_fresh_directory() -> Result<()> {
    let model = test_model()?;
    let fresh = tempfile::tempdir()?;
    let (engine, engine_url) = spawn_listening(
        &[
            "engine".as_ref(),
            "serve".as_ref(),
            "--model".as_ref(),
            model.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ],
        fresh.path(),
    )?;
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/samewise.toml"
    ))?;
    assert!(example.contains("http://127.0.0.1:8081/v1"));
    let cfg = write(
        fresh.path(),
        "samewise.toml",
        &example.replace("http://127.0.0.1:8081", &engine_url),
    )?;

    let out = Command::new(BIN)
        .args(["keys", "create", "me", "--config"])
        .arg(&cfg)
        .current_dir(fresh.path())
        .env_remove("DATABASE_URL")
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout)?.trim().to_owned();

    let (serve, url) = spawn_listening(
        &[
            "serve".as_ref(),
            "--config".as_ref(),
            cfg.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ],
        fresh.path(),
    )?;
    assert!(
        fresh.path().join(".samewise/samewise.db").exists(),
        "SQLite under the example's data_dir"
    );
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(r#"{"model":"smollm2","messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"temperature":0}"#)
        .send()
        .await?;
    let status = resp.status();
    let text = resp.text().await?;
    let serve_exit = serve.stop()?;
    let engine_exit = engine.stop()?;
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text)?;
    assert!(
        !v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{v}"
    );
    assert!(serve_exit.success() && engine_exit.success());
    Ok(())
}

/// `engine serve --device`: a bad name is a usage error naming the choices; `cuda` on a
/// machine without a usable GPU exits non-zero saying why (cudarc panics on a missing
/// library; the engine checks first), and never panics.
#[test]
fn engine_serve_device_errors_are_clear() -> Result<()> {
    let out = Command::new(BIN)
        .args(["engine", "serve", "--model", "x.gguf", "--device", "gpu"])
        .output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr)?;
    assert!(
        stderr.contains("expected auto, cpu, cuda or cuda:N"),
        "{stderr}"
    );
    let Some(why) = samewise_engine::cuda_unavailable() else {
        // a GPU here: the engine's own device test covers `cuda`; no error to check
        return Ok(());
    };
    let out = Command::new(BIN)
        .args([
            "engine",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--device",
            "cuda:1",
        ])
        .arg("--model")
        .arg(test_model()?)
        .output()?;
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr)?;
    assert!(stderr.contains(&why), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    Ok(())
}

/// `config check` with an SGLang reference, which renders chats with the chat template beside
/// its tokenizer: where there is none, a note says which probes will fail (not an error: the
/// kinds that score token ids still run); with one, no note.
#[test]
fn config_check_says_when_an_sglang_reference_cannot_render_chats() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("reference-engine/tests/fixtures/smollm2/tokenizer.json");
    let lone = dir.path().join("lone");
    std::fs::create_dir(&lone)?;
    std::fs::copy(&fixture, lone.join("tokenizer.json"))?;
    let check = |tokenizer: &std::path::Path| -> Result<String> {
        let cfg = format!(
            "{}[probes]\n[probes.reference]\nbackend = \"external\"\nurl = \"http://127.0.0.1:9\"\n\
             flavour = \"sglang\"\nmodel_name = \"smol\"\ntokenizer = {:?}\n\
             [models.smol.probes]\nkinds = [\"prompt_logprobs\", \"completion_logprobs\"]\n",
            config("http://127.0.0.1:9/v1", dir.path()),
            tokenizer.display().to_string()
        );
        let path = write(dir.path(), "sglang.toml", &cfg)?;
        let out = Command::new(BIN)
            .args(["config", "check"])
            .arg(&path)
            .output()?;
        let stdout = String::from_utf8(out.stdout)?;
        ensure!(
            out.status.success() && stdout.contains("reference external Sglang"),
            "{stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(stdout)
    };
    let without = check(&lone.join("tokenizer.json"))?;
    ensure!(
        without.contains(
            "note: the SGLang reference renders chats with the model's template, and cannot: "
        ) && without.contains("holds no chat template")
            && without.contains("these probes will fail: smol: completion_logprobs"),
        "{without}"
    );
    let with = check(&fixture)?;
    ensure!(!with.contains("note: the SGLang reference"), "{with}");
    Ok(())
}
