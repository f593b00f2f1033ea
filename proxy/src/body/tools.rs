//! The declared tools, compiled once per distinct `tools` value rather than once per request.
//!
//! A client sends the same `tools` array with every request of a conversation, byte for byte.
//! Checking it (JSON parse, schema bounds) and compiling its parameter schemas into a
//! [`ToolSet`] took about 10.5 µs of the 13 µs a one-tool request's body costs
//! (`proxy/examples/body_bench.rs`), so [`ToolsCache`] keeps the result per exact `tools`
//! bytes: a later request whose `tools` are the same bytes gets the same `Arc<ToolSet>` and the
//! schema-node budget the tools used, and skips all of it. What a hit returns is what the miss
//! computed from the same bytes, so a request is accepted, refused and checked exactly as
//! without the cache. Only `tools` values that pass their own checks are kept (a refusal is
//! recomputed, and costs the client a 400 anyway); values over [`MAX_ENTRY_BYTES`] are not kept; the whole is bounded in
//! entries and in bytes, least recently used out first.

use std::sync::{Arc, Mutex};

use hashlink::LruCache;
use samewise_toolcheck::ToolSet;

/// Most distinct `tools` values kept.
pub(crate) const MAX_ENTRIES: usize = 512;
/// Most bytes of `tools` text kept in all: a compiled set is about 20 times its text (README),
/// so about 6 MB of memory.
pub(crate) const MAX_BYTES: usize = 256 << 10;
/// A `tools` value longer than this is compiled for its request and not kept.
pub(crate) const MAX_ENTRY_BYTES: usize = 64 << 10;

/// What a `tools` value compiled to.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    /// None for `"tools": null`.
    pub(crate) set: Option<Arc<ToolSet>>,
    /// The request's schema-node budget left after the tools' parameter schemas (what
    /// `response_format`'s schema may still use).
    pub(crate) budget_left: usize,
}

/// Compiled `tools`, by their exact bytes. Shared by the serving threads.
#[derive(Debug)]
pub struct ToolsCache {
    inner: Mutex<Entries>,
}

#[derive(Debug)]
struct Entries {
    map: LruCache<Box<[u8]>, Compiled>,
    /// Bytes of the keys held.
    bytes: usize,
}

impl Default for ToolsCache {
    fn default() -> Self {
        ToolsCache {
            inner: Mutex::new(Entries {
                map: LruCache::new(MAX_ENTRIES),
                bytes: 0,
            }),
        }
    }
}

impl ToolsCache {
    /// What `raw` (a `tools` value's text) compiled to, if it is held.
    pub(crate) fn get(&self, raw: &[u8]) -> Option<Compiled> {
        let mut e = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        e.map.get(raw).cloned()
    }

    /// Keeps what `raw` compiled to (not when `raw` is over [`MAX_ENTRY_BYTES`]), evicting the
    /// least recently used values past either bound.
    pub(crate) fn put(&self, raw: &[u8], compiled: Compiled) {
        if raw.len() > MAX_ENTRY_BYTES {
            return;
        }
        let mut e = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if e.map.contains_key(raw) {
            return;
        }
        while e.bytes + raw.len() > MAX_BYTES || e.map.len() >= MAX_ENTRIES {
            match e.map.remove_lru() {
                Some((k, _)) => e.bytes -= k.len(),
                None => break,
            }
        }
        e.bytes += raw.len();
        e.map.insert(raw.into(), compiled);
    }

    /// Values held and their bytes.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        let e = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (e.map.len(), e.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiled() -> Compiled {
        Compiled {
            set: None,
            budget_left: 1,
        }
    }

    #[test]
    fn held_values_stay_within_their_count_and_bytes() {
        let cache = ToolsCache::default();
        for i in 0..MAX_ENTRIES + 10 {
            cache.put(format!("[{i}]").as_bytes(), compiled());
        }
        assert_eq!(cache.held().0, MAX_ENTRIES);
        // the least recently used went first: the first ten are gone, the last is held
        assert!(cache.get(b"[0]").is_none() && cache.get(b"[9]").is_none());
        assert!(
            cache
                .get(format!("[{}]", MAX_ENTRIES + 9).as_bytes())
                .is_some()
        );

        let cache = ToolsCache::default();
        // `MAX_ENTRY_BYTES` bytes each, distinct
        let big = |i: usize| {
            let n = i.to_string();
            format!("[{}{n}]", "0".repeat(MAX_ENTRY_BYTES - 2 - n.len()))
        };
        for i in 0..MAX_BYTES / MAX_ENTRY_BYTES + 3 {
            cache.put(big(i).as_bytes(), compiled());
            assert!(cache.held().1 <= MAX_BYTES, "{:?} after {i}", cache.held());
        }
        assert_eq!(cache.held(), (MAX_BYTES / MAX_ENTRY_BYTES, MAX_BYTES));
        // a value over the entry bound is not kept
        let over = format!("[{}]", "0".repeat(MAX_ENTRY_BYTES));
        cache.put(over.as_bytes(), compiled());
        assert!(cache.get(over.as_bytes()).is_none());
    }
}
