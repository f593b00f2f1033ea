//! Fuzz target: the request-body rewriter (`samewise_proxy::ClientRequest`): an accepted body
//! rewrites to a JSON object keeping the caller's fields, idempotently. The property is
//! `samewise_fuzz::request_body` (`tests/it/fuzz_props.rs`, this crate's library), which CI replays
//! over the corpus (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = samewise_fuzz::request_body(data) {
        panic!("{e}");
    }
});
