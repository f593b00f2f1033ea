//! The fuzz corpora, replayed (issue 14, item 4): every input kept under `fuzz/corpus/TARGET/`
//! (the seeds taken from real engine streams, and what `scripts/fuzz.sh` runs found and
//! minimised) and under `fuzz/artifacts/TARGET/` (crashes, once fixed) goes through the same
//! property its cargo-fuzz target checks (`fuzz/fuzz_targets/`), in an ordinary test, so CI
//! keeps every input that ever mattered without libFuzzer. The seven targets added last
//! (`request_body`, `gguf`, `safetensors`, `chat_template`, `config`, `profile`, `json_schema`)
//! keep their properties in `fuzz_props.rs`, a module here and the fuzz crate's library there.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use samewise_toolcheck::{ToolCallAssembler, ToolSet, check_calls};
use samewise_wire::sse::{SseDecoder, SseEvent};

use crate::fuzz_props as props;

/// Every file of `fuzz/corpus/TARGET` and `fuzz/artifacts/TARGET`.
fn inputs(target: &str) -> Result<Vec<PathBuf>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "artifacts"] {
        let d = root.join(dir).join(target);
        if !d.exists() {
            continue;
        }
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_file() {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Everything a decoder makes of `pieces`, or its first error (as `fuzz_targets/sse_decoder.rs`).
fn decode(pieces: &[&[u8]]) -> Result<Vec<SseEvent>, String> {
    let mut d = SseDecoder::with_max_event_bytes(4096);
    let mut out = Vec::new();
    for p in pieces {
        out.extend(d.feed(p).map_err(|e| e.to_string())?);
    }
    out.extend(d.finish().map_err(|e| e.to_string())?);
    Ok(out)
}

#[test]
fn sse_decoder_corpus() -> Result<()> {
    let files = inputs("sse_decoder")?;
    ensure!(files.len() >= 3, "the sse_decoder corpus is missing");
    for f in &files {
        let data = std::fs::read(f)?;
        // the fuzz target's cut, and others: every one of a short input, 64 of a long one
        let whole = decode(&[&data]);
        let target_cut = data
            .first()
            .map_or(0, |b| usize::from(*b) % (data.len() + 1));
        let step = (data.len() / 64).max(1);
        let cuts = (0..=data.len()).step_by(step).chain([target_cut]);
        for at in cuts {
            let split = decode(&[&data[..at], &data[at..]]);
            let same = match (&whole, &split) {
                (Ok(a), Ok(b)) => a == b,
                (a, b) => a.is_ok() == b.is_ok(),
            };
            ensure!(same, "{}: cut at {at}: {whole:?} vs {split:?}", f.display());
        }
    }
    Ok(())
}

#[test]
fn tool_calls_corpus() -> Result<()> {
    let files = inputs("tool_calls")?;
    ensure!(files.len() >= 3, "the tool_calls corpus is missing");
    for f in &files {
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(f)?) else {
            continue;
        };
        let tools = ToolSet::from_request_tools(&doc["tools"]);
        let mut asm = ToolCallAssembler::new();
        if let Some(deltas) = doc["deltas"].as_array() {
            for d in deltas {
                asm.push(d);
            }
        }
        let calls = asm.finish();
        for c in &calls {
            let _ = tools.classify(c);
        }
        let report = check_calls(&tools, &calls, doc["finish_reason"].as_str());
        let classes = report.invalid_json + report.unknown_name + report.schema_mismatch;
        ensure!(
            classes as usize <= calls.len(),
            "{}: {report:?} over {} calls",
            f.display(),
            calls.len()
        );
    }
    Ok(())
}

/// Replays `target`'s corpus and crash files through `property`; every failing input is named.
fn replay(target: &str, property: fn(&[u8]) -> Result<(), String>) -> Result<()> {
    let files = inputs(target)?;
    ensure!(files.len() >= 3, "the {target} corpus is missing");
    let mut failed = Vec::new();
    for f in &files {
        if let Err(e) = property(&std::fs::read(f)?) {
            failed.push(format!("{}: {e}", f.display()));
        }
    }
    ensure!(
        failed.is_empty(),
        "{} of {} {target} inputs fail:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
    Ok(())
}

/// How many of `target`'s inputs `accepts` takes (a corpus whose inputs are all refused
/// exercises only the refusals).
fn accepted(target: &str, accepts: impl Fn(&[u8]) -> bool) -> Result<usize> {
    let mut n = 0;
    for f in inputs(target)? {
        n += usize::from(accepts(&std::fs::read(f)?));
    }
    Ok(n)
}

#[test]
fn request_body_corpus() -> Result<()> {
    replay("request_body", props::request_body)?;
    let n = accepted("request_body", |d| {
        samewise_proxy::ClientRequest::parse(samewise_proxy::Route::Chat, d).is_ok()
    })?;
    ensure!(
        n >= 3,
        "only {n} request_body inputs are accepted chat bodies"
    );
    Ok(())
}

#[test]
fn gguf_corpus() -> Result<()> {
    replay("gguf", props::gguf)?;
    let n = accepted("gguf", |d| {
        samewise_engine::GgufFile::from_bytes(d).is_ok_and(|g| {
            !g.tensors.is_empty() && samewise_engine::Tokenizer::from_gguf(&g).is_ok()
        })
    })?;
    ensure!(n >= 1, "no gguf input has tensors and a tokenizer");
    Ok(())
}

#[test]
fn safetensors_corpus() -> Result<()> {
    replay("safetensors", props::safetensors)?;
    let config = include_bytes!("../../reference-engine/tests/fixtures/tiny/llama3/config.json");
    let n = accepted("safetensors", |d| {
        samewise_engine::HfDir::from_bytes(config, d).is_ok_and(|h| h.names().count() > 0)
    })?;
    ensure!(n >= 1, "no safetensors input is read");
    Ok(())
}

#[test]
fn chat_template_corpus() -> Result<()> {
    replay("chat_template", props::chat_template)
}

#[test]
fn config_corpus() -> Result<()> {
    replay("config", props::config)?;
    let n = accepted("config", |d| {
        std::str::from_utf8(d).is_ok_and(|t| samewise_proxy::Config::from_toml_str(t).is_ok())
    })?;
    ensure!(n >= 1, "no config input is accepted");
    Ok(())
}

#[test]
fn profile_corpus() -> Result<()> {
    replay("profile", props::profile)?;
    let n = accepted("profile", |d| {
        std::str::from_utf8(d)
            .is_ok_and(|t| samewise_engine::Profile::from_toml(t, "corpus").is_ok())
    })?;
    ensure!(n >= 1, "no profile input is accepted");
    Ok(())
}

#[test]
fn json_schema_corpus() -> Result<()> {
    replay("json_schema", props::json_schema)?;
    let n = accepted("json_schema", |d| {
        props::schema_and_walk(d).is_some_and(|(schema, _)| {
            let spec = samewise_engine::constrain::Spec::Json {
                schema: Some(schema),
            };
            samewise_engine::constrain::compile(&spec).is_ok()
        })
    })?;
    ensure!(
        n >= 3,
        "only {n} json_schema inputs hold a schema the engine compiles"
    );
    Ok(())
}
