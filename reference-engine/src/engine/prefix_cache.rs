//! Prompts' keys and values kept across generation requests.
//!
//! Requests to one engine often start alike: the same system prompt and tool definitions,
//! the same few-shot preamble, the same document asked about again. Once a generation has
//! read its prompt, the prompt's keys and values are kept here (within a byte budget, the
//! least recently used dropped first); a later generation whose prompt starts with at least
//! [`MIN_SHARED`] of the same tokens copies those positions' keys and values and reads only
//! the rest. A position's keys and values depend only on the tokens up to it, and the engine
//! gives them the same bits however the tokens were chunked or batched (what
//! [`super::ScoreJob`]'s forks rely on too), so a generation that reuses a prefix gives the
//! bits it gives without one. The last prompt token is always read again: its logits choose
//! the first new token. On the GPU backend nothing is kept (the caches live on the device).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Engine, Kind, Seq};
use crate::kv::KvCache;

/// Fewest leading prompt tokens worth copying.
const MIN_SHARED: usize = 16;

/// The kept prompts of one engine.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    /// Most bytes of keys and values kept (0: nothing is kept).
    budget: usize,
    held: Mutex<Held>,
    /// Prompt positions copied instead of computed, since the engine was loaded.
    reused: AtomicU64,
}

#[derive(Debug, Default)]
struct Held {
    entries: Vec<Entry>,
    bytes: usize,
    /// Advances on every use: an entry's `used` orders eviction.
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    tokens: Vec<u32>,
    cache: KvCache,
    bytes: usize,
    used: u64,
}

impl PrefixCache {
    /// A cache keeping at most `budget` bytes of keys and values.
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            budget,
            held: Mutex::new(Held::default()),
            reused: AtomicU64::new(0),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Prompt positions copied instead of computed so far.
    pub(crate) fn reused_positions(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// Bytes of keys and values kept now.
    pub(crate) fn bytes(&self) -> usize {
        self.held().bytes
    }

    /// The keys and values of the longest kept start of `prompt` (at least [`MIN_SHARED`]
    /// positions, never its last token), copied.
    fn lookup(&self, prompt: &[u32]) -> Option<KvCache> {
        if self.budget == 0 || prompt.len() <= MIN_SHARED {
            return None;
        }
        let mut held = self.held();
        let (best, common) = held
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_start(&e.tokens, prompt)))
            .max_by_key(|&(i, c)| (c, std::cmp::Reverse(i)))?;
        let n = common.min(prompt.len() - 1);
        if n < MIN_SHARED {
            return None;
        }
        held.clock += 1;
        let now = held.clock;
        let entry = &mut held.entries[best];
        entry.used = now;
        let cache = entry.cache.prefix(n)?;
        self.reused.fetch_add(n as u64, Ordering::Relaxed);
        Some(cache)
    }

    /// Keeps `prompt`'s keys and values (the first `prompt.len()` positions of `cache`),
    /// unless a kept entry already starts with the whole of it; kept entries that `prompt`
    /// extends are dropped, then the least recently used until the budget holds it.
    fn keep(&self, prompt: &[u32], cache: &KvCache) {
        if self.budget == 0 || prompt.len() <= MIN_SHARED {
            return;
        }
        let mut held = self.held();
        held.clock += 1;
        let now = held.clock;
        if let Some(e) = held
            .entries
            .iter_mut()
            .find(|e| e.tokens.starts_with(prompt))
        {
            e.used = now;
            return;
        }
        // the cache holds just the prompt (it has only been read): no copy past the budget
        if cache.len != prompt.len() || cache.bytes() > self.budget {
            return;
        }
        let Some(copy) = cache.prefix(prompt.len()) else {
            return;
        };
        let bytes = copy.bytes();
        held.entries.retain(|e| !prompt.starts_with(&e.tokens));
        held.bytes = held.entries.iter().map(|e| e.bytes).sum();
        while held.bytes + bytes > self.budget {
            let Some(oldest) = (0..held.entries.len()).min_by_key(|&i| held.entries[i].used) else {
                break;
            };
            let gone = held.entries.swap_remove(oldest);
            held.bytes -= gone.bytes;
        }
        held.bytes += bytes;
        held.entries.push(Entry {
            tokens: prompt.to_vec(),
            cache: copy,
            bytes,
            used: now,
        });
    }
}

/// How many leading tokens `a` and `b` share.
pub(super) fn common_start(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Engine {
    /// Before a step: each generation that has read nothing yet starts from the longest kept
    /// start of its prompt.
    pub(super) fn reuse_prompts(&self, seqs: &mut [&mut Seq]) {
        for s in seqs.iter_mut() {
            let Kind::Gen { prompt_len, .. } = s.kind else {
                continue;
            };
            if s.fed != 0 || s.is_done() {
                continue;
            }
            if let Some(cache) = self.prefixes.lookup(&s.tokens[..prompt_len]) {
                s.fed = cache.len;
                s.cache = cache;
            }
        }
    }

    /// After a step's forward pass: each generation that has just read its whole prompt
    /// (`take` tokens this step) keeps it for later ones.
    pub(super) fn keep_prompts(&self, seqs: &[&mut Seq], take: &[usize]) {
        for (s, &n) in seqs.iter().zip(take) {
            if let Kind::Gen { prompt_len, .. } = s.kind
                && n > 0
                && s.fed == prompt_len
            {
                self.prefixes.keep(&s.tokens[..prompt_len], &s.cache);
            }
        }
    }

    /// Prompt positions of generations copied from a kept earlier prompt instead of computed
    /// (see [`LoadOptions::prefix_cache_bytes`](super::LoadOptions::prefix_cache_bytes)),
    /// since the engine was loaded.
    pub fn reused_prompt_positions(&self) -> u64 {
        self.prefixes.reused_positions()
    }

    /// Bytes of kept prompts' keys and values now.
    pub fn prefix_cache_bytes(&self) -> usize {
        self.prefixes.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host cache of `n` positions, one layer, 2 floats a position, position p's values
    /// `[p, p]` and its keys in 16-position blocks.
    fn cache(n: usize) -> KvCache {
        let kvd = 2;
        let blocks = n.div_ceil(16);
        let mut k = vec![0f32; blocks * kvd * 16];
        for p in 0..n {
            for d in 0..kvd {
                k[(p / 16) * kvd * 16 + d * 16 + p % 16] = p as f32;
            }
        }
        let v: Vec<f32> = (0..n).flat_map(|p| [p as f32; 2]).collect();
        let mut c = KvCache::new(1);
        c.layers[0] = (k, v);
        c.len = n;
        c
    }

    #[test]
    fn the_longest_start_is_reused_never_the_last_token() {
        let pc = PrefixCache::new(1 << 20);
        let a: Vec<u32> = (0..40).collect();
        pc.keep(&a, &cache(40));
        // a prompt sharing 30 tokens reuses 30 positions
        let mut b: Vec<u32> = (0..30).collect();
        b.extend([900, 901, 902]);
        let got = pc.lookup(&b).expect("hit");
        assert_eq!(got.len, 30);
        assert_eq!(got.layers[0].1, cache(30).layers[0].1);
        assert_eq!(got.layers[0].0, cache(30).layers[0].0);
        // the same prompt again reuses all but its last token
        assert_eq!(pc.lookup(&a).map(|c| c.len), Some(39));
        // fewer than MIN_SHARED shared tokens is a miss
        let mut c: Vec<u32> = (0..15).collect();
        c.extend(1000..1030);
        assert!(pc.lookup(&c).is_none());
        assert_eq!(pc.reused_positions(), 69);
    }

    #[test]
    fn the_budget_holds_and_the_least_recently_used_goes_first() {
        let one = cache(32).bytes();
        let pc = PrefixCache::new(2 * one);
        let p = |base: u32| -> Vec<u32> { (base..base + 32).collect() };
        pc.keep(&p(0), &cache(32));
        pc.keep(&p(100), &cache(32));
        assert_eq!(pc.bytes(), 2 * one);
        // using the first makes the second the oldest
        assert!(pc.lookup(&p(0)).is_some());
        pc.keep(&p(200), &cache(32));
        assert_eq!(pc.bytes(), 2 * one);
        assert!(pc.lookup(&p(0)).is_some());
        assert!(pc.lookup(&p(100)).is_none());
        assert!(pc.lookup(&p(200)).is_some());
        // a prompt held whole inside a longer one is not kept twice; one that extends a kept
        // one replaces it
        let big = PrefixCache::new(1 << 20);
        big.keep(&p(0), &cache(32));
        big.keep(&p(0)[..20], &cache(20));
        assert_eq!(big.bytes(), one);
        let mut longer = p(0);
        longer.extend(500..516);
        big.keep(&longer, &cache(48));
        let kept = big.held().entries.len();
        assert_eq!((kept, big.bytes()), (1, cache(48).bytes()));
        assert_eq!(big.lookup(&longer).map(|c| c.len), Some(47));
        // nothing kept with a zero budget, nor a prompt larger than the budget
        let off = PrefixCache::new(0);
        off.keep(&p(0), &cache(32));
        assert_eq!((off.bytes(), off.lookup(&p(0)).is_none()), (0, true));
        let small = PrefixCache::new(one - 1);
        small.keep(&p(0), &cache(32));
        assert_eq!(small.bytes(), 0);
    }
}
