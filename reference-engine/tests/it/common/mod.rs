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

/// Path of the test GGUF; fails (with how to fix it) if it is not there.
pub fn model_path() -> anyhow::Result<PathBuf> {
    Ok(samewise_testkit::fixtures::test_model()?)
}

/// Path of the HF directory derived from the test GGUF; fails if it is not there.
pub fn hf_fixture_dir() -> anyhow::Result<PathBuf> {
    Ok(samewise_testkit::fixtures::hf_fixture_dir()?)
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
