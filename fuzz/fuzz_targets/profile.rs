//! Fuzz target: the serving-profile loader (`samewise_engine::Profile::from_toml`): accepted
//! profiles round-trip through TOML. The property is `samewise_fuzz::profile`
//! (`tests/it/fuzz_props.rs`, this crate's library), which CI replays over the corpus
//! (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = samewise_fuzz::profile(data) {
        panic!("{e}");
    }
});
