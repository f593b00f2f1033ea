//! Fuzz target: the SSE decoder (`samewise_wire::sse::SseDecoder`). Any bytes, decoded whole
//! and decoded in two pieces cut where the first byte says, give the same events (or both an
//! error), and nothing panics. The same property is replayed over the corpus in CI
//! (`tests/it/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use samewise_wire::sse::{SseDecoder, SseEvent};

/// Everything a decoder makes of `pieces`, in order, or its first error (as text).
fn decode(pieces: &[&[u8]]) -> Result<Vec<SseEvent>, String> {
    let mut d = SseDecoder::with_max_event_bytes(4096);
    let mut out = Vec::new();
    for p in pieces {
        out.extend(d.feed(p).map_err(|e| e.to_string())?);
    }
    out.extend(d.finish().map_err(|e| e.to_string())?);
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let at = data.first().map_or(0, |b| usize::from(*b) % (data.len() + 1));
    let whole = decode(&[data]);
    let split = decode(&[&data[..at], &data[at..]]);
    assert_eq!(whole.is_ok(), split.is_ok(), "cut at {at}: {whole:?} vs {split:?}");
    if let (Ok(a), Ok(b)) = (&whole, &split) {
        assert_eq!(a, b, "cut at {at}");
    }
});
