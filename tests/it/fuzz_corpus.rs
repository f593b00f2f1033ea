//! The fuzz corpora, replayed (issue 14, item 4): every input kept under `fuzz/corpus/TARGET/`
//! (the seeds taken from real engine streams, and what `scripts/fuzz.sh` runs found and
//! minimised) and under `fuzz/artifacts/TARGET/` (crashes, once fixed) goes through the same
//! property its cargo-fuzz target checks (`fuzz/fuzz_targets/`), in an ordinary test, so CI
//! keeps every input that ever mattered without libFuzzer.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use samewise_toolcheck::{ToolCallAssembler, ToolSet, check_calls};
use samewise_wire::sse::{SseDecoder, SseEvent};

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
