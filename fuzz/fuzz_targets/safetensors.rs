//! Fuzz target: the safetensors reader (`samewise_engine::HfDir`): tensors inside the file, read
//! whole or refused. The property is `samewise_fuzz::safetensors` (`tests/it/fuzz_props.rs`, this
//! crate's library), which CI replays over the corpus (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = samewise_fuzz::safetensors(data) {
        panic!("{e}");
    }
});
