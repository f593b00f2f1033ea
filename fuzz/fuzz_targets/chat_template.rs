//! Fuzz target: the chat-template renderer (`samewise_engine::chat::ChatTemplate`) over client-
//! shaped messages, tools and extra variables. The property is `samewise_fuzz::chat_template`
//! (`tests/it/fuzz_props.rs`, this crate's library), which CI replays over the corpus
//! (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = samewise_fuzz::chat_template(data) {
        panic!("{e}");
    }
});
