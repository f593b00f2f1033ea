//! The probe path end to end over real processes: `samewise engine serve` endpoints on the
//! test model under serving profiles (unmodified, 4-bit weights, logprobs refused,
//! echo logprobs shifted), probed by `samewise probes run --once` and by the scheduler inside
//! `samewise serve`, against the in-process reference; the stored runs are read back from
//! the SQLite database.
//!
//! The test model is `$SAMEWISE_MODEL` if set, else
//! `~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf`; a missing model fails.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_store::{ProbeRun, Store};

use crate::common;
use common::probes::{alerts, config, engine, probes_run, runs, stat};
use common::{BIN, create_key, spawn_listening};

/// An unmodified endpoint: every actual-token logprob and every top-1 identical to the
/// reference's; KL ~0 (compare's KL of identical inputs is 0 up to exp/ln rounding, and
/// up to ~1e-6 where the actual token's probability is under TAIL_EPSILON, at which the
/// endpoint side alone is clamped).
fn exact_stats(r: &ProbeRun) -> Result<()> {
    ensure!(
        stat(r, "dlogprob_mean")? == 0.0
            && stat(r, "top1_same")? == 1.0
            && stat(r, "topk_overlap")? == 1.0,
        "{}",
        r.stats
    );
    ensure!(
        stat(r, "kl_mean")? == 0.0 && stat(r, "kl_p99")? == 0.0 && stat(r, "mismatch_rate")? == 0.0,
        "{}",
        r.stats
    );
    Ok(())
}

fn first<'a>(runs: &'a [ProbeRun], endpoint: &str) -> Result<&'a ProbeRun> {
    runs.iter()
        .filter(|r| r.endpoint == endpoint && r.repeat_of.is_none())
        .min_by_key(|r| r.id)
        .with_context(|| format!("no run of {endpoint}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_run_once_tells_the_profiles_apart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (e_ref, u_ref) = engine("reference", dir.path())?;
    let (e_w4, u_w4) = engine("w4", dir.path())?;
    let (e_nolp, u_nolp) = engine("no-logprobs", dir.path())?;
    let (e_shift, u_shift) = engine("shifted-echo", dir.path())?;
    let data = dir.path().join("data");
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(
        &cfg,
        config(
            &data,
            &[
                ("exact", &u_ref),
                ("w4", &u_w4),
                ("nolp", &u_nolp),
                ("shift", &u_shift),
            ],
            "",
        )?,
    )?;

    let stdout = probes_run(&["--once"], &cfg, dir.path())?;
    ensure!(
        stdout.lines().filter(|l| l.starts_with('#')).count() == 7,
        "one line per stored run (3 noise pairs + 1 refusal):\n{stdout}"
    );
    ensure!(
        stdout.contains("1 round(s): 7 run(s) stored, ")
            && stdout
                .lines()
                .any(|l| l.starts_with("alert #") && l.contains("shift/smol unfaithful")),
        "summary and open alerts:\n{stdout}"
    );

    let all = runs(&data).await?;
    ensure!(all.len() == 7, "{} runs", all.len());
    let exact = first(&all, "exact/smol")?;
    ensure!(
        exact.ok && exact.kind == "prompt_logprobs" && exact.tokens > 100 && exact.raw.is_some(),
        "{:?} {}",
        exact.error,
        exact.stats
    );
    exact_stats(exact)?;
    ensure!(
        all.iter().any(|r| r.repeat_of == Some(exact.id)),
        "noise-floor pair of the first round"
    );

    // 4-bit re-quantized weights: far from the exact endpoint on every statistic
    let w4 = first(&all, "w4/smol")?;
    ensure!(w4.ok, "{:?}", w4.error);
    let (kl_w4, kl_exact) = (stat(w4, "kl_mean")?, stat(exact, "kl_mean")?);
    ensure!(
        kl_w4 > 1e-3 && kl_w4 > 1e4 * kl_exact,
        "4-bit weights must stand out: {kl_w4} vs {kl_exact}"
    );
    ensure!(
        stat(w4, "top1_same")? < 1.0 && stat(w4, "dlogprob_mean")? > 0.01,
        "{}",
        w4.stats
    );

    let nolp = first(&all, "nolp/smol")?;
    ensure!(
        !nolp.ok
            && nolp
                .error
                .as_deref()
                .is_some_and(|e| e.contains("logprobs")),
        "a refusal is a finding: {:?}",
        nolp.error
    );

    let shift = first(&all, "shift/smol")?;
    ensure!(
        shift.ok && stat(shift, "kl_mean")? > 0.1 && stat(shift, "top1_same")? < 0.9,
        "shifted echo logprobs: {:?} {}",
        shift.error,
        shift.stats
    );

    // the detectors ran after every stored run: the shifted endpoint is flagged unfaithful,
    // the exact one is not
    let open = alerts(&data).await?;
    ensure!(
        open.iter()
            .any(|a| a.endpoint == "shift/smol" && a.kind == "unfaithful"),
        "no alert for shifted echo logprobs: {open:?}"
    );
    ensure!(
        !open.iter().any(|a| a.endpoint == "exact/smol"),
        "the exact endpoint was flagged: {open:?}"
    );

    for p in [e_ref, e_w4, e_nolp, e_shift] {
        p.stop()?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_the_scheduler_and_drains_it_on_sigterm() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (e_ref, u_ref) = engine("reference", dir.path())?;
    let data = dir.path().join("data");
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(
        &cfg,
        config(
            &data,
            &[("exact", &u_ref)],
            "interval_ms = 500\njitter = 0.0",
        )?,
    )?;
    let cfg = cfg.to_str().context("path")?.to_owned();
    let (gw, _url) = spawn_listening(
        &["serve", "--config", &cfg, "--listen", "127.0.0.1:0"],
        dir.path(),
    )?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let n = runs(&data).await?.iter().filter(|r| r.ok).count();
        if n >= 3 {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the scheduler inside serve stored {n} runs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = gw.stop()?;
    ensure!(status.success(), "serve exited with {status}");
    let all = runs(&data).await?;
    for r in &all {
        ensure!(
            r.endpoint == "exact/smol" && r.ok,
            "{:?} {}",
            r.error,
            r.stats
        );
        exact_stats(r)?;
    }
    e_ref.stop()?;
    Ok(())
}

#[test]
fn config_check_validates_the_probes_tables() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let good = config(
        &dir.path().join("data"),
        &[("exact", "http://127.0.0.1:9")],
        "",
    )?;
    let cfg = dir.path().join("good.toml");
    std::fs::write(&cfg, &good)?;
    let out = Command::new(BIN)
        .args(["config", "check"])
        .arg(&cfg)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.contains("probes: 1 model(s), reference in-process"),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // the model's probes without the reference they score against
    let (head, rest) = good
        .split_once("[probes.reference]")
        .context("no reference")?;
    let detectors = rest.find("[probes.detectors]").context("no detectors")?;
    let unreferenced = format!("{head}{}", &rest[detectors..]);
    for (bad, key) in [
        (
            good.replace("backend = \"in_process\"", "backend = \"gpu\""),
            "probes.reference.backend",
        ),
        (
            unreferenced,
            "probes.reference: missing (the reference backend the prompt_logprobs probes of models.smol score against",
        ),
        (
            good.replace("items_per_round = 1", "items_per_round = 1\ncadence = 3"),
            "models.smol.probes: unknown field `cadence`",
        ),
        (
            good.replace("top_k = 5", "top_k = 99"),
            "models.smol.probes.top_k",
        ),
    ] {
        let cfg = dir.path().join("bad.toml");
        std::fs::write(&cfg, &bad)?;
        let out = Command::new(BIN)
            .args(["config", "check"])
            .arg(&cfg)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains(key),
            "{key}: {stderr}"
        );
    }
    Ok(())
}

/// The whole loop: the scheduler inside `samewise serve` flags the shifted endpoint, the
/// alert poller excludes it (`on_drift = "exclude"`), and client traffic stops reaching it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flagged_endpoint_stops_receiving_traffic_with_on_drift_exclude() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (e_ref, u_ref) = engine("reference", dir.path())?;
    let (e_shift, u_shift) = engine("shifted-echo", dir.path())?;
    let data = dir.path().join("data");
    let cfg = dir.path().join("samewise.toml");
    let text = config(
        &data,
        &[("exact", &u_ref), ("shift", &u_shift)],
        "interval_ms = 1000\njitter = 0.0",
    )?
    .replace("[server]\n", "[server]\nalert_poll_ms = 200\n")
    .replace(
        "policy = \"weighted\"\n",
        "policy = \"weighted\"\non_drift = \"exclude\"\n",
    );
    std::fs::write(&cfg, text)?;
    let key = create_key(&cfg, dir.path(), "me", false)?;
    let cfg = cfg.to_str().context("path")?.to_owned();
    let (gw, url) = spawn_listening(
        &["serve", "--config", &cfg, "--listen", "127.0.0.1:0"],
        dir.path(),
    )?;

    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if alerts(&data)
            .await?
            .iter()
            .any(|a| a.endpoint == "shift/smol" && a.kind == "unfaithful")
        {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no alert for the shifted endpoint"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // the poller runs every 200 ms
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let client = reqwest::Client::new();
    for i in 0..12 {
        let body = serde_json::json!({"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": format!("Say {i}.")}]});
        let r = client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?;
        ensure!(r.status().is_success(), "request {i}: {}", r.status());
    }
    ensure!(gw.stop()?.success(), "serve did not exit cleanly");
    let store = Store::connect(None, &data).await?;
    let records = store
        .request_records(&samewise_store::RecordQuery {
            since_ms: Some(since),
            limit: 1000,
            ..Default::default()
        })
        .await;
    store.close().await;
    let records = records?;
    let served: Vec<Option<String>> = records.iter().map(|r| r.endpoint.clone()).collect();
    ensure!(served.len() >= 12, "{served:?}");
    ensure!(
        served.iter().all(|e| e.as_deref() == Some("exact/smol")),
        "traffic reached the excluded endpoint: {served:?}"
    );
    for p in [e_ref, e_shift] {
        p.stop()?;
    }
    Ok(())
}

/// With the test model's measured calibration ladder: 4-bit weights are flagged unfaithful in
/// the first round and reported as ≈4-bit or worse; the exact and the 8-bit-activation
/// endpoints are not flagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ladder_flags_4bit_weights_as_about_4_bit_or_worse() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (e_ref, u_ref) = engine("reference", dir.path())?;
    let (e_w4, u_w4) = engine("w4", dir.path())?;
    let (e_a8, u_a8) = engine("a8", dir.path())?;
    let data = dir.path().join("data");
    let cfg = dir.path().join("samewise.toml");
    let ladder = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/probes/data/ladders/smollm2-135m-instruct-q4_1.json"
    );
    let text = config(
        &data,
        &[("exact", &u_ref), ("w4", &u_w4), ("a8", &u_a8)],
        "",
    )?
    .replace("kl_threshold = 0.01\n", "")
    .replace("[probes]\n", &format!("[probes]\nladder = \"{ladder}\"\n"));
    std::fs::write(&cfg, text)?;
    probes_run(&["--once"], &cfg, dir.path())?;
    let open = alerts(&data).await?;
    let w4 = open
        .iter()
        .find(|a| a.endpoint == "w4/smol" && a.kind == "unfaithful")
        .with_context(|| format!("4-bit weights not flagged: {open:?}"))?;
    // "≈ 4.0-bit (between 5 and 4 bits)" or "worse than 2-bit"
    let text = w4.evidence["equivalent_text"].as_str().unwrap_or_default();
    let approx_bits = text
        .strip_prefix("≈")
        .and_then(|t| t.trim().split("-bit").next())
        .and_then(|b| b.trim().parse::<f64>().ok());
    let bits_ok = text.starts_with("worse than") || approx_bits.is_some_and(|b| b <= 4.5);
    ensure!(
        bits_ok,
        "4-bit weights reported as {} ({})",
        w4.evidence["equivalent_text"],
        w4.summary
    );
    ensure!(
        !open.iter().any(|a| a.endpoint == "exact/smol"),
        "exact flagged: {open:?}"
    );
    ensure!(
        !open.iter().any(|a| a.endpoint == "a8/smol"),
        "8-bit activations flagged: {open:?}"
    );
    for p in [e_ref, e_w4, e_a8] {
        p.stop()?;
    }
    Ok(())
}
