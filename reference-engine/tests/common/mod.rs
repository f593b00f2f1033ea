//! Helpers shared by the engine's integration tests: where the test model and the
//! committed fixtures are; [`server::TestServer`] runs the HTTP API over the test model.
//!
//! The test model is `$SAMEWISE_MODEL` if set, else
//! `~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf` (`scripts/fetch-model.sh`
//! puts it there). A missing model is a test failure with a message saying how to fetch
//! it, never a skip. The HF-directory form of the same weights is `$SAMEWISE_HF_FIXTURE`,
//! else `~/.cache/samewise/models/smollm2-hf` (`scripts/make-hf-fixture.py`).

#![allow(dead_code)]

pub mod server;

use std::path::PathBuf;

/// File name of the test model.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// Path of the test GGUF; fails (with how to fix it) if it is not there.
pub fn model_path() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("SAMEWISE_MODEL") {
        Some(p) => PathBuf::from(p),
        None => home().join(".cache/samewise/models").join(MODEL_FILE),
    };
    anyhow::ensure!(
        path.is_file(),
        "test model not found at {} (run scripts/fetch-model.sh, or set SAMEWISE_MODEL)",
        path.display()
    );
    Ok(path)
}

/// Path of the HF directory derived from the test GGUF; fails if it is not there.
pub fn hf_fixture_dir() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("SAMEWISE_HF_FIXTURE") {
        Some(p) => PathBuf::from(p),
        None => home().join(".cache/samewise/models/smollm2-hf"),
    };
    anyhow::ensure!(
        path.join("config.json").is_file() && path.join("model.safetensors").is_file(),
        "HF fixture not found at {} (run scripts/make-hf-fixture.py with the venv of \
         scripts/requirements-fixtures.txt, or set SAMEWISE_HF_FIXTURE)",
        path.display()
    );
    Ok(path)
}

/// The committed fixtures directory (`reference-engine/tests/fixtures`).
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Reads and parses a JSON fixture.
pub fn fixture_json(name: &str) -> anyhow::Result<serde_json::Value> {
    let path = fixtures_dir().join(name);
    let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(serde_json::from_slice(&bytes)?)
}
