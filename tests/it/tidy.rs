//! Tidy: ordinary tests that fail when the codebase drifts from the rules ARCHITECTURE.md
//! states (rust-analyzer's `xtask/src/tidy.rs` habit), so the codemap stays true because a
//! test reads the code:
//! - the crate graph: each workspace crate depends (normal dependencies) only on the samewise
//!   crates ARCHITECTURE.md allows it, read from `cargo metadata`; a new crate must be added
//!   to [`ALLOWED`] (and to the codemap) before it builds green;
//! - no SQL outside `store/` (no `sqlx` in any other crate, code or manifest);
//! - no `#[path]` attribute: a file's path is its module path;
//! - every `.rs` file opens with a `//!` paragraph;
//! - no file over 800 lines unless it says why in a `tidy: long-file` comment;
//! - a library crate's API is what its `lib.rs` re-exports: a `pub mod` there must be in
//!   [`PUBLIC_MODULES`] with the reason it is a namespace of the API, and no `pub use` of a
//!   glob re-exports a module wholesale.

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

/// The modules a library crate's `lib.rs` may declare `pub mod` (crate directory, module,
/// why it is a namespace of the API rather than re-exported items). Every other module is
/// private, and the crate's API is what its root re-exports; a new public module is a new
/// API boundary and is argued here first (and in ARCHITECTURE.md's "API Boundary" line).
const PUBLIC_MODULES: &[(&str, &str, &str)] = &[
    (
        "wire",
        "sse",
        "the SSE codec, called by module (`sse::SseDecoder`)",
    ),
    (
        "toolcheck",
        "bfcl",
        "BFCL's checker, called by module by the evals' suites",
    ),
    (
        "toolcheck",
        "schema",
        "client schema bounds and compile, by module (proxy, evals)",
    ),
    (
        "toolcheck",
        "vendor",
        "the vendor-verifier metrics (ARCHITECTURE.md)",
    ),
    (
        "longctx",
        "task",
        "ARCHITECTURE.md: items are built by module (`task::lengths`)",
    ),
    (
        "longctx",
        "score",
        "ARCHITECTURE.md: request bodies and answer sums by module",
    ),
    (
        "longctx",
        "context",
        "ARCHITECTURE.md: effective-context rules by module",
    ),
    (
        "store",
        "testing",
        "feature `testing`: fresh databases for every crate's tests",
    ),
    (
        "proxy",
        "config",
        "ARCHITECTURE.md: the configuration other crates read",
    ),
    (
        "reference-engine",
        "server",
        "ARCHITECTURE.md: the engine's HTTP server",
    ),
    (
        "reference-engine",
        "chat",
        "templates and tool-call parsing, called by module",
    ),
    (
        "reference-engine",
        "constrain",
        "constrained decoding, driven by its example and tests",
    ),
    (
        "reference-engine",
        "sample",
        "the numeric primitives whose bits the tests compare",
    ),
    (
        "reference-engine",
        "profile",
        "`Profile` and the sections its public fields hold",
    ),
    (
        "probes",
        "calibrate",
        "ARCHITECTURE.md: the ladder's steps (`samewise calibrate`)",
    ),
    (
        "probes",
        "runner",
        "ARCHITECTURE.md: the scheduler the binary starts",
    ),
    (
        "probes",
        "detect",
        "the detectors and the charts the detection benchmark replays",
    ),
    (
        "probes",
        "kinds",
        "one probe of a kind, run without the scheduler by the benchmark",
    ),
    (
        "probes",
        "reference",
        "the `Reference` trait and its backends, by module",
    ),
    (
        "probes",
        "compare",
        "a statistic (ARCHITECTURE.md: the statistic functions)",
    ),
    (
        "probes",
        "ladder",
        "a statistic (ARCHITECTURE.md: the statistic functions)",
    ),
    (
        "probes",
        "mmd",
        "a statistic (ARCHITECTURE.md: the statistic functions)",
    ),
    (
        "probes",
        "noise",
        "a statistic (ARCHITECTURE.md: the statistic functions)",
    ),
    (
        "probes",
        "passive",
        "a statistic (ARCHITECTURE.md: the statistic functions)",
    ),
    (
        "probes",
        "sequential",
        "a statistic (ARCHITECTURE.md: the statistic functions)",
    ),
    (
        "demo",
        "model",
        "ARCHITECTURE.md: the demo's API is its four modules",
    ),
    (
        "demo",
        "scenario",
        "ARCHITECTURE.md: the demo's API is its four modules",
    ),
    (
        "demo",
        "summary",
        "ARCHITECTURE.md: the demo's API is its four modules",
    ),
    (
        "demo",
        "traffic",
        "ARCHITECTURE.md: the demo's API is its four modules",
    ),
    (
        "testkit",
        "fixtures",
        "where the test model is, by module (`fixtures::test_model`)",
    ),
    (
        "testkit",
        "webdriver",
        "the WebDriver client, by module (`webdriver::Browser`)",
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

#[test]
fn public_modules_are_only_the_listed_namespaces() -> Result<()> {
    let mut libs = Vec::new();
    for entry in std::fs::read_dir(root())? {
        let dir = entry?.path();
        let lib = dir.join("src/lib.rs");
        if lib.is_file() {
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            libs.push((name.to_owned(), lib));
        }
    }
    ensure!(
        libs.len() >= 10,
        "found only {} library crates under {}",
        libs.len(),
        root().display()
    );
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for (krate, lib) in &libs {
        let text = std::fs::read_to_string(lib)?;
        for (i, line) in text.lines().enumerate() {
            let code = line.trim();
            if let Some(rest) = code.strip_prefix("pub mod ") {
                let module = rest.trim_end_matches(';').trim_end_matches('{').trim();
                if PUBLIC_MODULES
                    .iter()
                    .any(|(c, m, _)| c == krate && *m == module)
                {
                    seen.insert((krate.clone(), module.to_owned()));
                } else {
                    wrong.push(format!(
                        "{krate}/src/lib.rs:{}: `pub mod {module}` (make it private and \
                         re-export what callers use, or add it to PUBLIC_MODULES with the reason)",
                        i + 1
                    ));
                }
            }
            if code.starts_with("pub use") && code.contains("::*") {
                wrong.push(format!(
                    "{krate}/src/lib.rs:{}: a glob re-export (name what callers use)",
                    i + 1
                ));
            }
        }
    }
    for (krate, module, _) in PUBLIC_MODULES {
        if !seen.contains(&((*krate).to_owned(), (*module).to_owned())) {
            wrong.push(format!(
                "PUBLIC_MODULES lists {krate}::{module}, which is no `pub mod` in its lib.rs"
            ));
        }
    }
    if !wrong.is_empty() {
        bail!("API boundaries against tidy's list:\n{}", wrong.join("\n"));
    }
    Ok(())
}
