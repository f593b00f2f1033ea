//! Fuzz target: tool-call assembly and classification (`samewise_toolcheck`). The input is a
//! JSON document `{"tools": [...], "deltas": [...], "finish_reason": ...}`, as a streamed
//! answer's tool-call deltas and the request's tools would be; the tools are compiled
//! (`ToolSet`, client schemas bounded), the deltas assembled by index, every call classified,
//! the report built. Nothing may panic, and the report's classes add up. Replayed over the corpus
//! in CI (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use samewise_toolcheck::{ToolCallAssembler, ToolSet, check_calls};

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
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
    assert!(classes as usize <= calls.len(), "{report:?} over {} calls", calls.len());
});
