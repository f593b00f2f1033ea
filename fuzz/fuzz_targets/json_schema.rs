//! Fuzz target: constrained decoding under a client's JSON Schema (`samewise_engine::constrain`):
//! a schema, then bytes steering a walk through the grammar compiled from it. The property is
//! `samewise_fuzz::json_schema` (`tests/it/fuzz_props.rs`, this crate's library), which CI replays
//! over the corpus (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = samewise_fuzz::json_schema(data) {
        panic!("{e}");
    }
});
