//! `samewise alerts list|show|ack|resolve` as a real process over a real store (the SQLite file of
//! a data directory, and PostgreSQL through `DATABASE_URL`): table and `--json` output, state
//! filters, unknown ids, and a resolution notifying `[[probes.webhooks]]` of `--config` (a
//! local HTTP receiver stands in for the third-party webhook).

use std::process::{Command, Output};

use anyhow::{Context, Result, ensure};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, NewAlert, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_samewise");

fn finding(endpoint: &str, kind: &str) -> NewAlert {
    NewAlert {
        model: "smol".to_owned(),
        endpoint: endpoint.to_owned(),
        kind: kind.to_owned(),
        summary: format!("endpoint {endpoint} behaves like ≈3.4-bit weights"),
        evidence: serde_json::json!({"statistic": "kl_mean", "value": 0.3, "probe_runs": [7]}),
        now_ms: 1_764_460_800_000, // 2025-11-30 00:00:00 UTC
    }
}

/// Runs the binary on the test database (SQLite: its data dir; PostgreSQL: DATABASE_URL).
async fn cli(db: &TestDb, args: &[&str]) -> Result<Output> {
    let mut cmd = Command::new(BIN);
    cmd.arg("alerts").args(args).env_remove("DATABASE_URL");
    match db.backend() {
        Backend::Sqlite => cmd.arg("--data-dir").arg(db.data_dir()),
        Backend::Postgres => cmd.env("DATABASE_URL", db.url()),
    };
    Ok(tokio::task::spawn_blocking(move || cmd.output()).await??)
}

fn stdout(out: &Output) -> Result<String> {
    ensure!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout.clone())?)
}

async fn list_ack_resolve(backend: Backend) -> Result<()> {
    let db = TestDb::new(backend).await?;
    let (a, _) = db.store.upsert_alert(&finding("p/a", "unfaithful")).await?;
    let (b, _) = db.store.upsert_alert(&finding("p/b", "changed")).await?;
    // table: header, one line per active alert, newest first
    let table = stdout(&cli(&db, &["list"]).await?)?;
    let lines: Vec<&str> = table.lines().collect();
    ensure!(lines.len() == 3, "{table}");
    ensure!(
        lines[0].starts_with("ID") && lines[0].contains("ENDPOINT") && lines[0].contains("SUMMARY")
    );
    ensure!(
        lines[1].starts_with(&b.id.to_string())
            && lines[1].contains("changed")
            && lines[1].contains("p/b")
    );
    ensure!(
        lines[2].contains("2025-11-30 00:00:00") && lines[2].contains("≈3.4-bit"),
        "{table}"
    );
    // ack
    let out = stdout(&cli(&db, &["ack", &a.id.to_string()]).await?)?;
    ensure!(
        out.contains(&format!("alert {} acknowledged", a.id)),
        "{out}"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(
        &cli(&db, &["--json", "list", "--state", "acknowledged"]).await?,
    )?)?;
    ensure!(
        v.as_array().map(Vec::len) == Some(1)
            && v[0]["id"] == a.id
            && v[0]["evidence"]["probe_runs"][0] == 7,
        "{v}"
    );
    // resolve with --json
    let v: serde_json::Value = serde_json::from_str(&stdout(
        &cli(&db, &["resolve", &b.id.to_string(), "--json"]).await?,
    )?)?;
    ensure!(
        v["state"] == "resolved" && v["resolved_ms"].is_i64() && v["resolved_by"] == "operator",
        "{v}"
    );
    let shown = stdout(&cli(&db, &["show", &b.id.to_string()]).await?)?;
    ensure!(
        shown
            .lines()
            .any(|l| l.starts_with("resolved ") && l.ends_with(" by an operator")),
        "{shown}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&cli(&db, &["list", "--json"]).await?)?)?;
    ensure!(
        v.as_array().map(Vec::len) == Some(1) && v[0]["id"] == a.id,
        "active: {v}"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(
        &cli(
            &db,
            &["list", "--json", "--state", "all", "--endpoint", "p/b"],
        )
        .await?,
    )?)?;
    ensure!(
        v.as_array().map(Vec::len) == Some(1) && v[0]["state"] == "resolved",
        "{v}"
    );
    // unknown id: non-zero exit naming it
    let out = cli(&db, &["resolve", "987654"]).await?;
    ensure!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("no alert with id 987654")
    );
    let out = cli(&db, &["ack", "not-a-number"]).await?;
    ensure!(!out.status.success());
    // a degraded verdict's alert names the active alert that holds it, until it is resolved
    let d = degraded_verdict(&db.store, &a).await?;
    let shown = stdout(&cli(&db, &["show", &d.to_string()]).await?)?;
    let by = format!("held by: alert {} (unfaithful)", a.id);
    ensure!(shown.lines().any(|l| l == by), "{shown}");
    let v: serde_json::Value = serde_json::from_str(&stdout(
        &cli(&db, &["show", &d.to_string(), "--json"]).await?,
    )?)?;
    ensure!(v["held_by"] == serde_json::json!([a.id]), "{v}");
    let v: serde_json::Value = serde_json::from_str(&stdout(
        &cli(&db, &["show", &a.id.to_string(), "--json"]).await?,
    )?)?;
    ensure!(v.get("held_by").is_none(), "not a verdict's alert: {v}");
    // nothing active after resolving the rest
    stdout(&cli(&db, &["resolve", &a.id.to_string()]).await?)?;
    let shown = stdout(&cli(&db, &["show", &d.to_string()]).await?)?;
    ensure!(shown.contains("held by: no active alert"), "{shown}");
    stdout(&cli(&db, &["resolve", &d.to_string()]).await?)?;
    ensure!(stdout(&cli(&db, &["list"]).await?)?.trim() == "no alerts");
    Ok(())
}

/// A `tool_calls` job opened by alert `a` and finished "degraded", and the `eval_degraded`
/// alert its verdict raises on `a`'s endpoint (as the eval worker writes them); its id.
async fn degraded_verdict(store: &Store, a: &samewise_store::Alert) -> Result<i64> {
    let now = samewise_store::now_ms();
    let job = samewise_store::NewEvalJob {
        model: a.model.clone(),
        endpoint: a.endpoint.clone(),
        suite: "tool_calls".to_owned(),
        baseline: "reference".to_owned(),
        alert_id: Some(a.id),
        params: serde_json::json!({}),
        max_attempts: 1,
        now_ms: now,
    };
    let job = store
        .enqueue_eval_job(&job, 0)
        .await?
        .context("not opened")?;
    let (_, lease) = store
        .claim_eval_job("w", now, 60_000)
        .await?
        .context("not claimed")?;
    let verdict = serde_json::json!({"verdict": "degraded", "items": 24});
    let state = samewise_store::JobState::Succeeded;
    ensure!(
        store
            .finish_eval_job(&lease, state, Some(&verdict), None, now)
            .await?
    );
    let evidence = serde_json::json!({"signal": "eval", "job_id": job.id, "suite": "tool_calls"});
    let d = NewAlert {
        kind: "eval_degraded".to_owned(),
        summary: "tool_calls degraded".to_owned(),
        evidence,
        now_ms: now,
        ..finding(&a.endpoint, "eval_degraded")
    };
    Ok(store.upsert_alert(&d).await?.0.id)
}

#[tokio::test]
async fn alerts_cli_on_sqlite() -> Result<()> {
    list_ack_resolve(Backend::Sqlite).await
}

#[tokio::test]
async fn alerts_cli_on_postgres() -> Result<()> {
    list_ack_resolve(Backend::Postgres).await
}

/// Accepts one HTTP request, answers 200, returns its body.
async fn one_request(listener: tokio::net::TcpListener) -> Result<String> {
    let (mut sock, _) = listener.accept().await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = sock.read(&mut chunk).await?;
        ensure!(n > 0, "connection closed early");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let len: usize = text[..head_end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .context("no content-length")?
                .parse()?;
            if buf.len() >= head_end + 4 + len {
                sock.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await?;
                return Ok(String::from_utf8(
                    buf[head_end + 4..head_end + 4 + len].to_vec(),
                )?);
            }
        }
    }
}

#[tokio::test]
async fn resolve_notifies_the_configured_webhooks() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Store::connect(None, dir.path()).await?;
    let (a, _) = store.upsert_alert(&finding("p/a", "unfaithful")).await?;
    store.close().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook = format!("http://{}/hook", listener.local_addr()?);
    let receiver = tokio::spawn(one_request(listener));
    let config = format!(
        "[server]\ndata_dir = \"{}\"\n[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         [models.smol]\n[[models.smol.endpoints]]\nprovider = \"p\"\nmodel = \"a\"\n\
         [probes]\n[[probes.webhooks]]\nurl = \"{hook}\"\nformat = \"slack\"\n",
        dir.path().display()
    );
    let path = dir.path().join("samewise.toml");
    std::fs::write(&path, config)?;
    let path_s = path.display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .env_remove("DATABASE_URL")
            .args(["alerts", "--config", &path_s, "resolve", &a.id.to_string()])
            .output()
    })
    .await??;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body: serde_json::Value = serde_json::from_str(&receiver.await??)?;
    let text = body["text"].as_str().context("slack text")?;
    ensure!(
        text.contains(&format!("#{}", a.id)) && text.contains("resolved") && text.contains("p/a"),
        "{text}"
    );
    Ok(())
}
