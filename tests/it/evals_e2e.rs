//! Evals end to end (issue #10): real `samewise engine serve --profile P` processes on the
//! test model, the real `samewise evals` CLI, real SQLite and PostgreSQL.
//!
//! - `tool_calls`: a `tool-corrupt` endpoint (every returned call corrupted) is "degraded"
//!   against the reference, its failures in the corruption's buckets, trigger F1 and schema
//!   accuracy reported; its twin, the reference's own endpoint, is "equivalent".
//! - alert → job → verdict: inside `samewise serve`, the probes flag a `w4` endpoint, the
//!   alert watcher opens the mapped `tool_calls` job, a worker runs it, and the verdict
//!   arrives in the alert's evidence and at a webhook receiver.
//! - `long_context`: a `truncate-512` endpoint is "degraded" with its effective context
//!   within one doubling of 512; the reference's own endpoint "equivalent", `a8` never
//!   "degraded".
//! - SIGKILL take-over: a worker process killed mid-job (k of n items done, the lease held
//!   by it) is replaced by another that finishes the job; no item has two results (both
//!   stores).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, JobState, NewAlert, NewEvalJob, Resolver};
use serde_json::Value;

use crate::common::probes::{alerts, engine};
use crate::common::{BIN, spawn_listening};

/// A config with one provider per engine (model id "smol") and `[evals]` with the first
/// engine as the reference.
pub(crate) fn config(
    dir: &Path,
    engines: &[(&str, &str)],
    evals: &str,
) -> Result<std::path::PathBuf> {
    let mut s = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n",
        dir.join("data").display()
    );
    for (name, url) in engines {
        s += &format!(
            "[providers.{name}]\nbase_url = \"{url}/v1\"\nprice_input_per_mtok = 0.0\nprice_output_per_mtok = 0.0\n\n"
        );
    }
    s += "[models.smol]\npolicy = \"weighted\"\n";
    for (name, _) in engines {
        s += &format!("[[models.smol.endpoints]]\nprovider = \"{name}\"\nmodel = \"smol\"\n");
    }
    let reference = engines.first().map(|e| e.1).unwrap_or_default();
    s += &format!(
        "\n[evals]\nreference_url = \"{reference}\"\nreference_model = \"smol\"\n{evals}\n"
    );
    let path = dir.join("samewise.toml");
    std::fs::write(&path, s)?;
    Ok(path)
}

/// `samewise evals run --suite tool_calls ... --json` on SQLite in the config's data
/// directory; the job.
fn evals_run(cfg: &Path, args: &[&str]) -> Result<Value> {
    evals_run_suite(cfg, "tool_calls", args)
}

/// `samewise evals run --suite SUITE ... --json` on SQLite; the job.
pub(crate) fn evals_run_suite(cfg: &Path, suite: &str, args: &[&str]) -> Result<Value> {
    let mut all = vec!["--suite", suite];
    all.extend_from_slice(args);
    evals_run_args(cfg, &all)
}

/// `samewise evals run ARGS --json` on SQLite; the job.
pub(crate) fn evals_run_args(cfg: &Path, args: &[&str]) -> Result<Value> {
    let out = Command::new(BIN)
        .args(["evals", "--config"])
        .arg(cfg)
        .args(["--json", "run"])
        .args(args)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "evals run {args:?} failed:\n{stderr}\n{stdout}"
    );
    ensure!(
        stderr.contains("results of"),
        "no progress on stderr: {stderr}"
    );
    serde_json::from_str(&stdout).with_context(|| format!("not JSON: {stdout}"))
}

/// The degraded verdict's `eval_degraded` alert is told to the alert webhooks
/// (`[[probes.webhooks]]`, here in a `[probes]` without a reference) like any other opening.
#[tokio::test]
async fn tool_calls_corrupt_is_degraded_and_the_reference_equivalent() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_good, good_url) = engine("reference", dir.path())?;
    let (_bad, bad_url) = engine("tool-corrupt", dir.path())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook = format!("http://{}/hook", listener.local_addr()?);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let hooks = tokio::spawn(receiver(listener, tx));
    let cfg = config(
        dir.path(),
        &[("good", &good_url), ("bad", &bad_url)],
        &format!("concurrency = 4\n[probes]\n[[probes.webhooks]]\nurl = \"{hook}\"\n"),
    )?;
    let run = |args: &'static [&'static str]| {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || evals_run(&cfg, args))
    };

    let job = run(&["--endpoint", "bad/smol"]).await??;
    let v = &job["verdict"];
    ensure!(job["state"] == "succeeded", "{job:#}");
    ensure!(
        v["verdict"] == "degraded",
        "tool-corrupt not degraded: {v:#}"
    );
    // decided by the co-primary rule at the deciding look's α: both tables below it, or
    // either below half of it (Hochberg)
    let level = v["params"]["alpha_at_look"].as_f64().unwrap_or(0.0);
    let ps = [
        v["p_value"].as_f64().unwrap_or(1.0),
        v["schema_validity"]["p_value"].as_f64().unwrap_or(1.0),
    ];
    ensure!(
        level > 0.0 && (ps.iter().all(|p| *p < level) || ps.iter().any(|p| *p < level / 2.0)),
        "p-values {ps:?} at α {level}: {v:#}"
    );
    ensure!(
        v["looks_done"].as_u64().unwrap_or(0) < v["params"]["looks"].as_u64().unwrap_or(0),
        "the gross fault did not stop early: {v:#}"
    );
    // failures in the corruption's buckets (unknown_name → wrong_name, cut arguments →
    // invalid_json, a required argument removed → missing_required), never elsewhere
    let fails = v["suspect"]["failures"]
        .as_object()
        .context("no failure buckets")?;
    let corrupt: u64 = ["invalid_json", "wrong_name", "missing_required"]
        .iter()
        .map(|k| fails.get(*k).and_then(Value::as_u64).unwrap_or(0))
        .sum();
    ensure!(
        corrupt >= 8,
        "too few failures in the corruption buckets: {fails:?}"
    );
    let base_fails = v["baseline"]["failures"]
        .as_object()
        .context("no baseline buckets")?;
    ensure!(
        ["invalid_json", "missing_required"]
            .iter()
            .all(|k| !base_fails.contains_key(*k)),
        "the reference has corruption failures: {base_fails:?}"
    );
    // vendor-verifier numbers: both sides call tools, so trigger F1 is a number
    let f1 = v["extras"]["trigger_f1"]
        .as_f64()
        .context("trigger F1 not a number")?;
    ensure!((0.0..=1.0).contains(&f1));
    let sa = v["extras"]["schema_accuracy"]["suspect"]
        .as_f64()
        .context("no schema accuracy")?;
    let sa_base = v["extras"]["schema_accuracy"]["baseline"]
        .as_f64()
        .context("no baseline schema accuracy")?;
    ensure!(
        sa < sa_base,
        "schema accuracy {sa} not below the reference's {sa_base}"
    );
    // its alert's opening was delivered to the webhook before `evals run` exited
    let body = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .context("no alert webhook")?
        .context("receiver stopped")?;
    let event: Value = serde_json::from_str(&body)?;
    ensure!(
        event["event"] == "opened"
            && event["alert"]["kind"] == "eval_degraded"
            && event["alert"]["endpoint"] == "bad/smol",
        "{event:#}"
    );

    // the twin: the reference's own endpoint (δ = 10 points: 32 items cannot show ±5)
    let job = run(&["--endpoint", "good/smol", "--delta", "0.10"]).await??;
    let v = &job["verdict"];
    ensure!(
        v["verdict"] == "equivalent",
        "reference not equivalent: {v:#}"
    );
    ensure!(v["paired"]["suspect_only"] == 0 && v["paired"]["baseline_only"] == 0);
    ensure!(
        rx.try_recv().is_err(),
        "an equivalent verdict raised an alert"
    );
    hooks.abort();
    Ok(())
}

/// The corruption's own buckets: what a corrupted call fails as (a cut JSON text, an
/// undeclared name, a required argument dropped).
const CORRUPTION_BUCKETS: [&str; 3] = ["invalid_json", "wrong_name", "missing_required"];

fn bucket_sum(failures: &Value) -> u64 {
    CORRUPTION_BUCKETS
        .iter()
        .map(|k| failures[*k].as_u64().unwrap_or(0))
        .sum()
}

/// `tool-corrupt` at `corrupt_fraction = 0.1` (a profile file; the engine draws each call's
/// corruption from the profile's seed and the request's arrival number, and one item in
/// flight per side keeps the arrivals in item order, so the same calls break on every run).
/// Measured on the whole 32-item suite (README): never "degraded" — 1 to 4 of 29 calls break,
/// 0 to 2 of them on items the reference passes, and "degraded" needs the suspect worse by
/// more than δ with p < α/looks (≥ 10 discordant items at 4 looks). So this asserts what is
/// true at this size, on the first 17 items (seed 0 breaks a call of item 16, which the
/// reference passes, and one of item 10, which it fails otherwise): the broken calls in the
/// corruption's buckets beyond the reference's own, an item the reference passes lost,
/// schema accuracy below the reference's, trigger F1 reported, and the verdict not
/// "equivalent" at δ = 15 points — under which 17 items without a discordant one (the
/// reference's own endpoint) are "equivalent": the 98.75% interval is then ±13.2 points.
#[test]
fn tool_calls_at_a_tenth_corrupted_are_bucketed_and_not_equivalent() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let profile = dir.path().join("tool-corrupt-0.1.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"tool-corrupt-0.1\"\nseed = {SEED_0_1}\n[tool_calls]\ncorrupt_fraction = 0.1\n"
        ),
    )?;
    let (_good, good_url) = engine("reference", dir.path())?;
    let (_bad, bad_url) = engine(profile.to_str().context("path")?, dir.path())?;
    let cfg = config(
        dir.path(),
        &[("good", &good_url), ("bad", &bad_url)],
        "concurrency = 1",
    )?;
    let job = evals_run(
        &cfg,
        &[
            "--endpoint",
            "bad/smol",
            "--max-items",
            "17",
            "--delta",
            "0.15",
        ],
    )?;
    let v = &job["verdict"];
    ensure!(job["state"] == "succeeded", "{job:#}");
    ensure!(v["items"] == 17, "{v:#}");
    ensure!(
        v["verdict"] != "equivalent",
        "a tenth corrupted judged equivalent: {v:#}"
    );
    // it is not "equivalent" because of what broke: the interval reaches past -δ
    ensure!(
        v["diff_interval"][0].as_f64().unwrap_or(0.0) < -0.15,
        "{v:#}"
    );
    // the broken calls: in the corruption's buckets, on items the reference passes
    let extra = bucket_sum(&v["suspect"]["failures"])
        .saturating_sub(bucket_sum(&v["baseline"]["failures"]));
    ensure!(
        extra >= 1,
        "no corruption-bucket failures beyond the reference's: {v:#}"
    );
    let p = &v["paired"];
    ensure!(
        p["baseline_only"].as_u64().unwrap_or(0) >= 1 && p["suspect_only"] == 0,
        "{p}"
    );
    let sa = &v["extras"]["schema_accuracy"];
    let (s, b) = (
        sa["suspect"].as_f64().context("no schema accuracy")?,
        sa["baseline"]
            .as_f64()
            .context("no baseline schema accuracy")?,
    );
    ensure!(s < b, "schema accuracy {s} not below the reference's {b}");
    let f1 = v["extras"]["trigger_f1"]
        .as_f64()
        .context("trigger F1 not a number")?;
    ensure!((0.0..=1.0).contains(&f1));
    Ok(())
}

/// The profile seed of the 0.1 test (see its doc).
const SEED_0_1: u64 = 0;

/// `long_context` (multi-query needles at 256, 512 and 1024 tokens, two distractors, scored
/// by likelihood): `truncate-512` keeps only the last 512 prompt tokens, so it loses the
/// needles in the first half of the 1024-token haystack — "degraded", its effective context
/// 512, its failures `truncated`; the twins in the same setup: the reference's own endpoint
/// is "equivalent" with the window's effective context, and `a8` is never "degraded"; an
/// endpoint refusing logprobs makes both sides answer by generation.
#[test]
fn long_context_truncate_512_is_degraded_and_the_reference_and_a8_are_not() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_good, good_url) = engine("reference", dir.path())?;
    let (_trunc, trunc_url) = engine("truncate-512", dir.path())?;
    let (_a8, a8_url) = engine("a8", dir.path())?;
    let (_nolp, nolp_url) = engine("no-logprobs", dir.path())?;
    let cfg = config(
        dir.path(),
        &[
            ("good", &good_url),
            ("trunc", &trunc_url),
            ("a8", &a8_url),
            ("nolp", &nolp_url),
        ],
        "[evals.long_context]\nwindow = 1024\ntasks = [\"multi_query\"]\ndistractors = 2",
    )?;
    let lc = |v: &Value| {
        v["extras"]["effective_context"]
            .as_u64()
            .unwrap_or(u64::MAX)
    };

    let job = evals_run_suite(&cfg, "long_context", &["--endpoint", "trunc/smol"])?;
    let v = &job["verdict"];
    ensure!(job["state"] == "succeeded", "{job:#}");
    ensure!(
        v["verdict"] == "degraded",
        "truncate-512 not degraded: {v:#}"
    );
    ensure!(
        v["extras"]["scoring"] == "likelihood" && v["extras"]["window"] == 1024,
        "{v:#}"
    );
    // within one doubling of the truncation point, and below the window
    ensure!((256..=512).contains(&lc(v)), "effective context: {v:#}");
    let per = v["extras"]["per_length"].as_array().context("per_length")?;
    ensure!(
        per.iter()
            .map(|l| l["length"].as_u64().unwrap_or(0))
            .collect::<Vec<_>>()
            == [256, 512, 1024],
        "{per:?}"
    );
    ensure!(
        per[2]["below"] == true && per[2]["baseline_only"].as_u64().unwrap_or(0) >= 8,
        "{per:?}"
    );
    let fails = v["suspect"]["failures"].as_object().context("buckets")?;
    ensure!(
        fails.get("truncated").and_then(Value::as_u64).unwrap_or(0) >= 8
            && !v["baseline"]["failures"]
                .as_object()
                .is_some_and(|b| b.contains_key("truncated")),
        "failures: {fails:?} / {}",
        v["baseline"]["failures"]
    );
    ensure!(v["tokens"].as_i64().unwrap_or(0) > 0, "{v:#}");

    // the twin: the reference's own endpoint (δ = 10 points: 28 items cannot show ±5)
    let job = evals_run_suite(
        &cfg,
        "long_context",
        &["--endpoint", "good/smol", "--delta", "0.10"],
    )?;
    let v = &job["verdict"];
    ensure!(
        v["verdict"] == "equivalent",
        "reference not equivalent: {v:#}"
    );
    ensure!(lc(v) == 1024, "{v:#}");
    ensure!(
        v["paired"]["suspect_only"] == 0 && v["paired"]["baseline_only"] == 0,
        "{v:#}"
    );

    // a8: faithful, not bit-identical; never degraded, nothing lost
    let job = evals_run_suite(
        &cfg,
        "long_context",
        &["--endpoint", "a8/smol", "--delta", "0.10"],
    )?;
    let v = &job["verdict"];
    ensure!(
        job["state"] == "succeeded" && v["verdict"] != "degraded",
        "a8 degraded: {v:#}"
    );
    ensure!(lc(v) == 1024, "{v:#}");

    // an endpoint refusing logprobs: both sides answer by generation (one short length)
    let job = evals_run_suite(
        &cfg,
        "long_context",
        &["--endpoint", "nolp/smol", "--window", "256"],
    )?;
    let v = &job["verdict"];
    ensure!(job["state"] == "succeeded", "{job:#}");
    ensure!(
        v["extras"]["scoring"] == "generation" && v["items"] == 4,
        "{v:#}"
    );
    Ok(())
}

fn spawn_worker(cfg: &Path, db_url: &str) -> Result<Child> {
    Ok(Command::new(BIN)
        .args(["evals", "--config"])
        .arg(cfg)
        .args(["worker", "--workers", "1"])
        .env("DATABASE_URL", db_url)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

async fn sigkill_takeover(backend: Backend) -> Result<()> {
    let db = TestDb::new(backend).await?;
    let dir = tempfile::tempdir()?;
    let (_eng, url) = engine("reference", dir.path())?;
    let cfg = config(
        dir.path(),
        &[("good", &url)],
        "lease_ms = 3000\npoll_ms = 200\nconcurrency = 1\nworkers = 1",
    )?;
    let job = db
        .store
        .enqueue_eval_job(
            &NewEvalJob {
                model: "smol".into(),
                endpoint: "good/smol".into(),
                suite: "tool_calls".into(),
                baseline: "reference".into(),
                alert_id: None,
                params: serde_json::json!({"max_items": 8, "looks": 1}),
                max_attempts: 3,
                now_ms: samewise_store::now_ms(),
            },
            0,
        )
        .await?
        .context("job not opened")?;
    let mut a = spawn_worker(&cfg, db.url())?;
    let a_id = format!("-{}-0", a.id());
    // wait until some (not all) items are done under A's lease
    let deadline = Instant::now() + Duration::from_secs(300);
    let k = loop {
        let p = db.store.eval_progress(job.id).await?;
        let j = db.store.eval_job(job.id).await?.context("job gone")?;
        if p.results >= 3 {
            ensure!(j.state == JobState::Running, "{j:?}");
            ensure!(
                j.worker.as_deref().is_some_and(|w| w.ends_with(&a_id)),
                "lease not held by A: {j:?}"
            );
            ensure!(j.lease_until_ms.unwrap_or(0) > samewise_store::now_ms() - 1_000);
            break p.results;
        }
        ensure!(Instant::now() < deadline, "worker A wrote no results");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    a.kill()?;
    a.wait()?;
    let after_kill = db.store.eval_progress(job.id).await?.results;
    ensure!(
        after_kill < 16,
        "job finished before the kill ({after_kill} of 16)"
    );
    let mut b = spawn_worker(&cfg, db.url())?;
    let b_id = format!("-{}-0", b.id());
    let deadline = Instant::now() + Duration::from_secs(400);
    let done = loop {
        let j = db.store.eval_job(job.id).await?.context("job gone")?;
        if j.state.is_final() {
            break j;
        }
        ensure!(Instant::now() < deadline, "worker B did not finish: {j:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    b.kill()?;
    b.wait()?;
    ensure!(done.state == JobState::Succeeded, "{done:?}");
    ensure!(
        done.attempts == 2 && done.worker.as_deref().is_some_and(|w| w.ends_with(&b_id)),
        "{done:?}"
    );
    let results = db.store.eval_results(job.id).await?;
    let mut keys: Vec<(String, String)> = results
        .iter()
        .map(|r| (r.item.clone(), r.target.clone()))
        .collect();
    keys.sort();
    keys.dedup();
    ensure!(keys.len() == results.len(), "duplicate item results");
    ensure!(
        results.len() == 16,
        "{} results for 8 items × 2 (k = {k})",
        results.len()
    );
    ensure!(
        done.verdict.as_ref().is_some_and(|v| v["items"] == 8),
        "{:?}",
        done.verdict
    );
    // `evals show --export`: one JSONL record per item and target, with the check
    let export = dir.path().join("items.jsonl");
    let out = Command::new(BIN)
        .args(["evals", "--config"])
        .arg(&cfg)
        .args(["show", &job.id.to_string(), "--export"])
        .arg(&export)
        .env("DATABASE_URL", db.url())
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(String::from_utf8_lossy(&out.stdout).contains("verdict:"));
    let lines: Vec<Value> = std::fs::read_to_string(&export)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(lines.len() == 16, "{} exported records", lines.len());
    ensure!(
        lines
            .iter()
            .all(|l| l["record"]["check"]["passed"] == l["passed"]
                && l["record"]["request"]["messages"].is_array())
    );
    Ok(())
}

#[tokio::test]
async fn sigkilled_worker_is_taken_over_sqlite() -> Result<()> {
    sigkill_takeover(Backend::Sqlite).await
}

#[tokio::test]
async fn sigkilled_worker_is_taken_over_postgres() -> Result<()> {
    sigkill_takeover(Backend::Postgres).await
}

/// Without `[probes]` there is no probe scheduler to resolve quiet alerts: the process that
/// runs the alert watcher (here `samewise evals worker`, as `samewise serve`) sweeps them, so a
/// hand-run verdict's alert last seen two hours ago (past the default hour) is resolved as
/// quiet, and an alert seen just now stays.
#[tokio::test]
async fn without_probes_the_watchers_process_resolves_quiet_alerts() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let dir = tempfile::tempdir()?;
    // no engine answers there: nothing here opens a job
    let cfg = config(
        dir.path(),
        &[("good", "http://127.0.0.1:9")],
        "poll_ms = 200",
    )?;
    let now = samewise_store::now_ms();
    let alert = |kind: &str, at: i64| NewAlert {
        model: "smol".into(),
        endpoint: "good/smol".into(),
        kind: kind.into(),
        summary: format!("{kind} on good/smol"),
        evidence: serde_json::json!({"signal": "eval"}),
        now_ms: at,
    };
    let (quiet, _) = db
        .store
        .upsert_alert(&alert("eval_degraded", now - 2 * 3_600_000))
        .await?;
    let (fresh, _) = db.store.upsert_alert(&alert("operator_note", now)).await?;
    let mut worker = spawn_worker(&cfg, db.url())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let resolved = loop {
        let a = db.store.alert(quiet.id).await?.context("alert gone")?;
        if a.resolved_ms.is_some() {
            break a;
        }
        if Instant::now() > deadline {
            worker.kill()?;
            anyhow::bail!("the quiet alert was not resolved: {a:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    worker.kill()?;
    worker.wait()?;
    ensure!(
        resolved.resolved_by == Some(Resolver::Quiet),
        "{resolved:?}"
    );
    let fresh = db.store.alert(fresh.id).await?.context("alert gone")?;
    ensure!(
        fresh.resolved_ms.is_none(),
        "a fresh alert was resolved: {fresh:?}"
    );
    Ok(())
}

/// A webhook receiver: every POST body, answered 200.
async fn receiver(
    listener: tokio::net::TcpListener,
    tx: tokio::sync::mpsc::UnboundedSender<String>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    while let Ok((mut sock, _)) = listener.accept().await {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let body = loop {
            let Ok(n) = sock.read(&mut chunk).await else {
                break None;
            };
            if n == 0 {
                break None;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    break Some(String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned());
                }
            }
        };
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
        if let Some(b) = body {
            let _ = tx.send(b);
        }
    }
}

#[tokio::test]
async fn a_probe_alert_opens_a_job_whose_verdict_reaches_the_alert_and_the_webhook() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_r, u_ref) = engine("reference", dir.path())?;
    let (_w, u_w4) = engine("w4", dir.path())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook = format!("http://{}/hook", listener.local_addr()?);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let hooks = tokio::spawn(receiver(listener, tx));
    let data = dir.path().join("data");
    let cfg = dir.path().join("samewise.toml");
    let text = crate::common::probes::config(
        &data,
        &[("exact", &u_ref), ("w4", &u_w4)],
        "interval_ms = 1000\njitter = 0.0",
    )? + &format!(
        "\n[evals]\nreference_url = \"{u_ref}\"\nreference_model = \"smol\"\nworkers = 1\n\
         poll_ms = 300\nmax_items = 4\nlooks = 1\nwebhooks = [\"{hook}\"]\ncooldown_ms = 500\n"
    );
    std::fs::write(&cfg, text)?;
    let cfg_s = cfg.to_str().context("path")?.to_owned();
    let (gw, _url) = spawn_listening(
        &["serve", "--config", &cfg_s, "--listen", "127.0.0.1:0"],
        dir.path(),
    )?;
    // the webhook: the eval verdict of a job opened by the w4 alert
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let event: Value = loop {
        let body = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .context("no eval webhook within 600 s")?
            .context("receiver stopped")?;
        let v: Value = serde_json::from_str(&body)?;
        if v["event"] == "eval_verdict" {
            break v;
        }
    };
    ensure!(
        event["endpoint"] == "w4/smol" && event["suite"] == "tool_calls",
        "{event:#}"
    );
    let verdict = event["verdict"]["verdict"].as_str().context("no verdict")?;
    ensure!(
        ["degraded", "equivalent", "inconclusive"].contains(&verdict),
        "{event:#}"
    );
    ensure!(event["verdict"]["items"] == 4, "{event:#}");
    let alert_id = event["alert_id"]
        .as_i64()
        .context("job not opened by an alert")?;
    let job_id = event["job_id"].as_i64().context("no job id")?;
    // the verdict is in the alert's evidence (kept across the probes' refreshes)
    let all = alerts(&data).await?;
    let a = all
        .iter()
        .find(|a| a.id == alert_id)
        .context("alert gone")?;
    ensure!(a.kind == "unfaithful" && a.endpoint == "w4/smol", "{a:?}");
    ensure!(
        a.evidence["evals"][job_id.to_string()]["verdict"] == verdict,
        "{:?}",
        a.evidence
    );
    // the alert stays active for many polls past the 500 ms cooldown and still has one
    // tool_calls job: an alert opens each suite once
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        alerts(&data)
            .await?
            .iter()
            .any(|a| a.id == alert_id && a.resolved_ms.is_none()),
        "the w4 alert was resolved"
    );
    // `samewise alerts show ID` lists the job and its verdict
    let out = Command::new(BIN)
        .args([
            "alerts",
            "--config",
            &cfg_s,
            "--json",
            "show",
            &alert_id.to_string(),
        ])
        .env_remove("DATABASE_URL")
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout)?;
    let jobs = shown["eval_jobs"].as_array().context("no eval_jobs")?;
    ensure!(
        jobs.iter().any(|j| j["job"] == job_id
            && j["verdict"]["verdict"] == verdict
            && j["opened_by_alert"] == alert_id),
        "{shown:#}"
    );
    ensure!(
        jobs.iter().filter(|j| j["suite"] == "tool_calls").count() == 1,
        "the active alert reopened its suite: {shown:#}"
    );
    gw.stop()?;
    hooks.abort();
    Ok(())
}

#[test]
fn config_check_validates_the_evals_section() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let check = |evals: &str| -> Result<std::process::Output> {
        let cfg = config(dir.path(), &[("p", "http://127.0.0.1:9")], evals)?;
        Ok(Command::new(BIN)
            .args(["config", "check"])
            .arg(&cfg)
            .env_remove("DATABASE_URL")
            .output()?)
    };
    let ok = check("workers = 2")?;
    let stdout = String::from_utf8_lossy(&ok.stdout);
    ensure!(
        ok.status.success() && stdout.contains("evals: 2 worker(s)"),
        "{stdout}"
    );
    for (bad, key) in [("delta = 2.0", "evals.delta"), ("nope = 1", "nope")] {
        let out = check(bad)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains(key),
            "{bad}: {stderr}"
        );
    }
    Ok(())
}
