//! samewise-longctx: the long-context tasks, in one place for the `long_context` probe
//! (samewise-probes) and the `long_context` eval suite (samewise-evals), which may not
//! depend on each other. It owns what a long-context item *is* — RULER-style tasks (single
//! needle, multi-key, multi-value, multi-query, variable tracking) in haystacks sized with
//! the model's own tokenizer at doubling lengths, needles at seeded depths, seeded
//! distractor answers of the same form — and how an answer is judged: by likelihood (the
//! true answer's teacher-forced logprob, read from an OpenAI `/v1/completions` echo or from
//! the reference's own scores, must beat every distractor's by a margin) or, where an
//! endpoint refuses logprobs, by generation (RULER's `string_match_all`).
//!
//! API boundary: pure and a leaf — no IO, no clock, no samewise dependency, no panic on any
//! input. The caller tokenizes (the texts a [`task::Draft`] asks to count), sends the request
//! bodies this crate builds, and hands the responses back.
//!
//! # Layout
//! - [`task`]: [`Haystack`] (filler and keys, `data/haystack.json`), [`Settings`],
//!   [`task::Draft`] → [`Group`]s of [`Query`]s; the candidate and generation prompts.
//! - [`score`]: request bodies, reading an echo's per-token logprobs into per-answer sums,
//!   [`score::rank`], RULER's `string_match_all`.
//! - [`context`]: effective context lengths (relative to a reference, and RULER's fixed
//!   85.6% rule).
//! - `rng`: the seeded generator (SplitMix64), so items never change with a dependency.

// The three modules are namespaces of the API (ARCHITECTURE.md): the probe and the eval suite
// call `task::lengths`, `score::…` and `context::…` by module.
/// A namespace of the API: effective context lengths.
pub mod context;
mod rng;
/// A namespace of the API: request bodies, answer sums, ranking.
pub mod score;
/// A namespace of the API: haystacks, settings, drafts and groups.
pub mod task;

pub use score::{Ranked, rank};
pub use task::{Group, Haystack, Query, Settings, TaskKind};

/// Everything that can go wrong here.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LongctxError {
    /// Bad task data or settings.
    #[error("long-context data: {0}")]
    Data(String),
    /// A text the sizing needs was not counted by the caller.
    #[error("no token count for a text the sizing needs ({0} characters)")]
    Uncounted(usize),
    /// An endpoint's response cannot be read as the scores asked for.
    #[error("long-context response: {0}")]
    Response(String),
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, LongctxError>;
