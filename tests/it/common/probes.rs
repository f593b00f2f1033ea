//! Helpers of the end-to-end probe tests: `samewise engine serve` processes under a serving
//! profile, a gateway config with one provider per engine and the probes on, and reading the
//! stored alerts and probe runs back from the SQLite database.

use std::path::Path;

use anyhow::{Context, Result};
use samewise_store::{ProbeRun, ProbeRunQuery, Store};

use super::{Proc, spawn_listening, test_model};

/// `samewise engine serve` on the test model under `profile`, listening on `listen`
/// (`127.0.0.1:0` for any port).
pub fn engine_on(profile: &str, listen: &str, cwd: &Path) -> Result<(Proc, String)> {
    let model = test_model()?;
    let model = model.to_str().context("model path is not UTF-8")?;
    spawn_listening(
        &[
            "engine",
            "serve",
            "--model",
            model,
            "--listen",
            listen,
            "--model-name",
            "smol",
            "--profile",
            profile,
        ],
        cwd,
    )
}

/// `samewise probes run ARGS --config CFG` in `cwd` on SQLite (no `DATABASE_URL`); fails unless
/// it succeeds; returns its stdout.
pub fn probes_run(args: &[&str], cfg: &Path, cwd: &Path) -> Result<String> {
    let mut all: Vec<&std::ffi::OsStr> = vec!["probes".as_ref(), "run".as_ref()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    all.extend(["--config".as_ref(), cfg.as_os_str()]);
    super::run_ok(&all, cwd)
}

/// `samewise engine serve` on the test model under `profile`, on any free port.
pub fn engine(profile: &str, cwd: &Path) -> Result<(Proc, String)> {
    engine_on(profile, "127.0.0.1:0", cwd)
}

/// A gateway config with one provider per engine and the probes on.
pub fn config(data_dir: &Path, engines: &[(&str, &str)], probes: &str) -> Result<String> {
    let model = test_model()?;
    let mut s = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n",
        data_dir.display()
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
    s += &format!(
        "[models.smol.probes]\nkinds = [\"prompt_logprobs\"]\nitems_per_round = 1\ntop_k = 5\n{probes}\n\n\
         [probes]\nnoise_pair_every = 5\nlock_retry_ms = 500\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"{}\"\n\
         [probes.detectors]\nkl_threshold = 0.01\n",
        model.display()
    );
    Ok(s)
}

pub async fn alerts(data_dir: &Path) -> Result<Vec<samewise_store::Alert>> {
    let store = Store::connect(None, data_dir).await?;
    let r = store
        .alerts(&samewise_store::AlertQuery {
            state: None,
            active_only: false,
            model: None,
            endpoint: None,
            limit: 100,
        })
        .await;
    store.close().await;
    Ok(r?)
}

pub async fn runs(data_dir: &Path) -> Result<Vec<ProbeRun>> {
    let store = Store::connect(None, data_dir).await?;
    let r = store
        .probe_runs(&ProbeRunQuery {
            model: None,
            endpoint: None,
            kind: None,
            since_ms: None,
            limit: 1000,
        })
        .await;
    store.close().await;
    Ok(r?)
}

pub fn stat(r: &ProbeRun, key: &str) -> Result<f64> {
    r.stats
        .get(key)
        .and_then(serde_json::Value::as_f64)
        .with_context(|| format!("{key} missing: {r:?}"))
}
