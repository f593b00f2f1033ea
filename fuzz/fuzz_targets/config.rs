//! Fuzz target: the gateway's TOML configuration loader (`samewise_proxy::Config`): accepted
//! configs are usable (providers named, durations bounded). The property is `samewise_fuzz::config`
//! (`tests/it/fuzz_props.rs`, this crate's library), which CI replays over the corpus
//! (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = samewise_fuzz::config(data) {
        panic!("{e}");
    }
});
