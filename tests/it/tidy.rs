//! Tidy: ordinary tests that fail when the codebase drifts from the rules ARCHITECTURE.md
//! states (rust-analyzer's `xtask/src/tidy.rs` habit), so the codemap stays true because a
//! test reads the code:
//! - the crate graph: each workspace crate depends (normal dependencies) only on the samewise
//!   crates ARCHITECTURE.md allows it, read from `cargo metadata`; a new crate must be added
//!   to [`ALLOWED`] (and to the codemap) before it builds green;
//! - no SQL outside `store/` (no `sqlx` in any other crate, code or manifest);
//! - no `#[path]` attribute: a file's path is its module path;
//! - every `.rs` file opens with a `//!` paragraph;
//! - no file over 800 lines unless it says why in a `tidy: long-file` comment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

/// Each workspace crate and the samewise crates it may depend on (normal dependencies; test
/// and build dependencies are free). `samewise` is the composition root: anything.
const ALLOWED: &[(&str, &[&str])] = &[
    ("samewise-wire", &[]),
    ("samewise-toolcheck", &[]),
    ("samewise-longctx", &[]),
    ("samewise-demo", &[]),
    ("samewise-testkit", &["samewise-demo"]),
    ("samewise-store", &["samewise-wire"]),
    ("samewise-engine", &["samewise-wire"]),
    (
        "samewise-proxy",
        &["samewise-wire", "samewise-store", "samewise-toolcheck"],
    ),
    (
        "samewise-probes",
        &[
            "samewise-wire",
            "samewise-store",
            "samewise-toolcheck",
            "samewise-longctx",
            "samewise-engine",
        ],
    ),
    (
        "samewise-evals",
        &[
            "samewise-wire",
            "samewise-store",
            "samewise-toolcheck",
            "samewise-longctx",
            "samewise-engine",
        ],
    ),
    (
        "samewise-dashboards",
        &[
            "samewise-wire",
            "samewise-store",
            "samewise-toolcheck",
            "samewise-evals",
        ],
    ),
];

/// The longest a file may be without a written reason.
const MAX_LINES: usize = 800;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every tracked-looking `.rs` file of the workspace (skipping `target/` and hidden dirs).
fn rust_files() -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                if name == "target" || name.starts_with('.') {
                    continue;
                }
                walk(&path, out)?;
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(&root(), &mut out)?;
    out.sort();
    ensure!(
        out.len() > 50,
        "found only {} .rs files under {}",
        out.len(),
        root().display()
    );
    Ok(out)
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn crates_depend_only_in_the_documented_direction() -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .context("running cargo metadata")?;
    ensure!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout)?;
    let packages = meta["packages"].as_array().context("no packages")?;
    let ours: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    ensure!(
        ours.contains("samewise-store") && ours.contains("samewise-proxy"),
        "cargo metadata lists no samewise crates: {ours:?}"
    );
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for p in packages {
        let name = p["name"].as_str().context("package without a name")?;
        if name == "samewise" {
            continue;
        }
        let Some(may) = allowed.get(name) else {
            wrong.push(format!(
                "{name}: not in tidy's crate graph (add it to ALLOWED and to ARCHITECTURE.md)"
            ));
            continue;
        };
        for d in p["dependencies"].as_array().context("no dependencies")? {
            let dep = d["name"].as_str().unwrap_or_default();
            let normal = d["kind"].is_null();
            if normal && ours.contains(dep) && !may.contains(&dep) {
                wrong.push(format!("{name} -> {dep}"));
            }
            if dep == "sqlx" && name != "samewise-store" && normal {
                wrong.push(format!("{name} -> sqlx (SQL lives in store)"));
            }
        }
        if name == "samewise-testkit" {
            // independent of every samewise crate, test dependencies included, but the demo
            // crate (no samewise dependency itself), whose `model` says where the test model is
            for d in p["dependencies"].as_array().into_iter().flatten() {
                let dep = d["name"].as_str().unwrap_or_default();
                if ours.contains(dep) && dep != "samewise-demo" {
                    wrong.push(format!("samewise-testkit -> {dep} (must stay independent)"));
                }
            }
        }
    }
    if !wrong.is_empty() {
        bail!("dependencies against the codemap:\n{}", wrong.join("\n"));
    }
    Ok(())
}

#[test]
fn no_sql_outside_store() -> Result<()> {
    let mut wrong = Vec::new();
    for f in rust_files()? {
        let r = rel(&f);
        if r.starts_with("store/") || r == "tests/it/tidy.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&f)?;
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            if code.contains("sqlx::") || code.contains("use sqlx") {
                wrong.push(format!("{r}:{}: {}", i + 1, code));
            }
        }
    }
    if !wrong.is_empty() {
        bail!(
            "SQL outside store (ask store for a method):\n{}",
            wrong.join("\n")
        );
    }
    Ok(())
}

#[test]
fn file_paths_are_module_paths() -> Result<()> {
    let needle = ["#[", "path"].concat();
    let mut wrong = Vec::new();
    for f in rust_files()? {
        let text = std::fs::read_to_string(&f)?;
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with(&needle) && code[needle.len()..].trim_start().starts_with('=') {
                wrong.push(format!("{}:{}", rel(&f), i + 1));
            }
        }
    }
    if !wrong.is_empty() {
        bail!(
            "#[path] attributes (move the file instead):\n{}",
            wrong.join("\n")
        );
    }
    Ok(())
}

#[test]
fn every_file_opens_with_a_doc_paragraph() -> Result<()> {
    let mut wrong = Vec::new();
    for f in rust_files()? {
        let text = std::fs::read_to_string(&f)?;
        if !text.starts_with("//!") {
            wrong.push(rel(&f));
        }
    }
    if !wrong.is_empty() {
        bail!("files that do not open with //!:\n{}", wrong.join("\n"));
    }
    Ok(())
}

#[test]
fn no_file_is_too_long_without_a_reason() -> Result<()> {
    let mut wrong = Vec::new();
    for f in rust_files()? {
        let text = std::fs::read_to_string(&f)?;
        let n = text.lines().count();
        if n > MAX_LINES && !text.contains("tidy: long-file") {
            wrong.push(format!("{} ({n} lines)", rel(&f)));
        }
    }
    if !wrong.is_empty() {
        bail!(
            "files over {MAX_LINES} lines (split them, or say why in a `tidy: long-file` comment):\n{}",
            wrong.join("\n")
        );
    }
    Ok(())
}
