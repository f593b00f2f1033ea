//! Fuzz target: the GGUF reader (`samewise_engine::GgufFile`) and the model config, tokenizer and
//! chat template built from its metadata. The property is `samewise_fuzz::gguf`
//! (`tests/it/fuzz_props.rs`, this crate's library), which CI replays over the corpus
//! (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = samewise_fuzz::gguf(data) {
        panic!("{e}");
    }
});
