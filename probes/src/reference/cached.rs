//! A bounded memo of reference scores. Probes send the same token sequences again and again
//! (the fixed prompt_logprobs texts every rotation of the window, the same needle prompts,
//! a temperature-0 completion re-scored under teacher forcing, the same text on every endpoint
//! of a model), and the reference's score of a sequence never changes: the in-process and
//! remote engines are deterministic, bit for bit, whatever else they run beside it. So each
//! (sequence, top-k) is scored once and served from memory after that, which roughly halves
//! the CPU a probe round costs.
//!
//! `score` is memoized, and so are greedy tool-call answers (`tool_calls`: the same cases are
//! asked on every endpoint of a model, every rotation of the window; a greedy answer is a
//! function of the chat, the tools, whether calls are forced and the token limit, whatever
//! the seed). Tokenizing and rendering are cheap, and sampling is seeded per call. The memo
//! holds at most `capacity` scored positions and evicts the least recently used sequences
//! beyond that; a sequence longer than the whole capacity is never kept. At most
//! [`ANSWERS`] tool-call answers are kept, the least recently used evicted first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use samewise_toolcheck::ToolCall;
use serde_json::{Value, json};

use super::{RefPosition, RefSample, Reference, SampleRequest, ToolCallRequest};
use crate::Result;
use crate::align::ReferenceVocab;

/// Hits and misses of a [`Cached`] reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Scores served from memory.
    pub hits: u64,
    /// Scores computed by the backend.
    pub misses: u64,
    /// Positions held now.
    pub positions: usize,
    /// Sequences held now.
    pub sequences: usize,
    /// Tool-call answers served from memory.
    pub answer_hits: u64,
    /// Tool-call answers computed by the backend.
    pub answer_misses: u64,
}

/// Most greedy tool-call answers kept.
const ANSWERS: usize = 1024;

/// Values by key, each with a weight; once the weights held would pass the capacity the least
/// recently used go first, and a value heavier than the whole capacity is never kept. Both
/// memos of [`Cached`] are one of these: scores weighed by positions, answers one each.
struct Lru<K, V> {
    /// Each value with its weight and last use.
    entries: HashMap<K, (Arc<V>, usize, u64)>,
    /// The weights held.
    held: usize,
    clock: u64,
}

impl<K, V> Default for Lru<K, V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            held: 0,
            clock: 0,
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone, V> Lru<K, V> {
    fn get<Q>(&mut self, key: &Q) -> Option<Arc<V>>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.clock += 1;
        let now = self.clock;
        self.entries.get_mut(key).map(|(v, _, used)| {
            *used = now;
            Arc::clone(v)
        })
    }

    fn put(&mut self, key: K, value: V, weight: usize, capacity: usize) {
        // too heavy, or a concurrent miss stored it first
        if weight > capacity || self.entries.contains_key(&key) {
            return;
        }
        while self.held + weight > capacity {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((_, w, _)) = self.entries.remove(&oldest) {
                self.held -= w;
            }
        }
        self.clock += 1;
        self.held += weight;
        self.entries
            .insert(key, (Arc::new(value), weight, self.clock));
    }
}

#[derive(Default)]
struct Memo {
    /// Scores by (sequence, top-k), weighed by positions.
    scores: Lru<(Vec<u32>, usize), Vec<RefPosition>>,
    /// Greedy tool-call answers by their request's key.
    answers: Lru<String, Vec<ToolCall>>,
    stats: CacheStats,
}

/// What a greedy tool-call answer depends on (not the seed).
fn answer_key(req: &ToolCallRequest) -> String {
    json!([req.messages, req.tools, req.forced, req.max_tokens]).to_string()
}

/// A reference backend whose scores are memoized.
pub struct Cached {
    inner: Arc<dyn Reference>,
    capacity: usize,
    memo: Mutex<Memo>,
}

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("backend", &self.inner.backend())
            .field("capacity", &self.capacity)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Cached {
    /// Memoizes `inner`'s scores, holding at most `capacity` positions (must be positive).
    pub fn new(inner: Arc<dyn Reference>, capacity: usize) -> Self {
        Self {
            inner,
            capacity: capacity.max(1),
            memo: Mutex::new(Memo::default()),
        }
    }

    /// Hits, misses and what is held now.
    pub fn stats(&self) -> CacheStats {
        self.memo.lock().map(|m| m.stats).unwrap_or_default()
    }

    fn lookup(&self, ids: &[u32], top_k: usize) -> Option<Arc<Vec<RefPosition>>> {
        let mut memo = self.memo.lock().ok()?;
        let hit = memo.scores.get(&(ids.to_vec(), top_k));
        if hit.is_some() {
            memo.stats.hits += 1;
        } else {
            memo.stats.misses += 1;
        }
        hit
    }

    fn keep(&self, ids: &[u32], top_k: usize, scored: &[RefPosition]) {
        let Ok(mut memo) = self.memo.lock() else {
            return;
        };
        let memo = &mut *memo;
        memo.scores.put(
            (ids.to_vec(), top_k),
            scored.to_vec(),
            scored.len(),
            self.capacity,
        );
        memo.stats.positions = memo.scores.held;
        memo.stats.sequences = memo.scores.entries.len();
    }

    fn answer(&self, key: &str) -> Option<Arc<Vec<ToolCall>>> {
        let mut memo = self.memo.lock().ok()?;
        let hit = memo.answers.get(key);
        if hit.is_some() {
            memo.stats.answer_hits += 1;
        } else {
            memo.stats.answer_misses += 1;
        }
        hit
    }

    fn keep_answer(&self, key: String, calls: &[ToolCall]) {
        if let Ok(mut memo) = self.memo.lock() {
            memo.answers.put(key, calls.to_vec(), 1, ANSWERS);
        }
    }
}

impl Reference for Cached {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn vocab(&self) -> Arc<dyn ReferenceVocab + Send + Sync> {
        self.inner.vocab()
    }

    fn context_window(&self) -> Option<usize> {
        self.inner.context_window()
    }

    fn tokenize<'a>(
        &'a self,
        text: &'a str,
        add_special_tokens: bool,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        self.inner.tokenize(text, add_special_tokens)
    }

    fn render_chat<'a>(
        &'a self,
        messages: &'a [Value],
        tools: Option<&'a [Value]>,
    ) -> BoxFuture<'a, Result<Vec<u32>>> {
        self.inner.render_chat(messages, tools)
    }

    fn score<'a>(
        &'a self,
        ids: &'a [u32],
        top_k: usize,
    ) -> BoxFuture<'a, Result<Vec<RefPosition>>> {
        Box::pin(async move {
            if let Some(hit) = self.lookup(ids, top_k) {
                return Ok(hit.as_ref().clone());
            }
            let scored = self.inner.score(ids, top_k).await?;
            self.keep(ids, top_k, &scored);
            Ok(scored)
        })
    }

    fn score_many<'a>(
        &'a self,
        seqs: &'a [Vec<u32>],
        top_k: usize,
    ) -> BoxFuture<'a, Result<Vec<Vec<RefPosition>>>> {
        Box::pin(async move {
            let mut out: Vec<Option<Vec<RefPosition>>> = seqs
                .iter()
                .map(|ids| self.lookup(ids, top_k).map(|hit| hit.as_ref().clone()))
                .collect();
            // the misses go to the backend together (one job: shared prefixes computed once)
            let missing: Vec<usize> = (0..seqs.len()).filter(|&i| out[i].is_none()).collect();
            if !missing.is_empty() {
                let asked: Vec<Vec<u32>> = missing.iter().map(|&i| seqs[i].clone()).collect();
                let scored = self.inner.score_many(&asked, top_k).await?;
                for (&i, scored) in missing.iter().zip(scored) {
                    self.keep(&seqs[i], top_k, &scored);
                    out[i] = Some(scored);
                }
            }
            out.into_iter()
                .map(|s| {
                    s.ok_or_else(|| {
                        crate::ProbesError::Reference(
                            "the backend returned too few sequences".into(),
                        )
                    })
                })
                .collect()
        })
    }

    fn sample<'a>(&'a self, req: &'a SampleRequest) -> BoxFuture<'a, Result<Vec<RefSample>>> {
        self.inner.sample(req)
    }

    fn tool_calls<'a>(&'a self, req: &'a ToolCallRequest) -> BoxFuture<'a, Result<Vec<ToolCall>>> {
        Box::pin(async move {
            let key = answer_key(req);
            if let Some(hit) = self.answer(&key) {
                return Ok(hit.as_ref().clone());
            }
            let calls = self.inner.tool_calls(req).await?;
            self.keep_answer(key, &calls);
            Ok(calls)
        })
    }
}
