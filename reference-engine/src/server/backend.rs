//! The server's view of the compute side: the engine's [`Batcher`], which batches every
//! concurrent request's work into shared forward passes.
//!
//! The batcher's worker thread is owned here and stopped (pending jobs failed with
//! `Shutdown`, the thread joined) when the last clone of the server state goes away. A
//! generation whose receiver is dropped (the client went away, or a stop string ended it)
//! is cancelled by the worker.
//!
//! A profile's hidden context (`[substitute]`) is applied here, below every route: its tokens
//! are put before each sequence scored or generated, and a scored sequence is handed back
//! without them, its first position unscored as usual — so no route can leak the context.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::batcher::{Batcher, BatcherHandle, GenEvent};
use crate::constrain::Constraint;
use crate::engine::{Engine, GenerateParams, ScoredSequence};
use crate::error::{EngineError, Result};

/// Shared handle to the batching worker.
#[derive(Debug, Clone)]
pub(crate) struct Backend {
    /// Keeps the worker alive; its drop stops and joins it.
    _batcher: Arc<Batcher>,
    /// Submits jobs.
    handle: BatcherHandle,
    /// Token ids put before every sequence (empty but for a `[substitute]` profile).
    hidden: Arc<[u32]>,
}

impl Backend {
    /// A backend whose sequences all follow `hidden` (empty: none).
    pub(crate) fn new(engine: Arc<Engine>, hidden: Vec<u32>) -> Self {
        let batcher = Batcher::start(engine);
        let handle = batcher.handle();
        Self {
            _batcher: Arc::new(batcher),
            handle,
            hidden: hidden.into(),
        }
    }

    /// `tokens` after the hidden context; an empty sequence stays empty, for the engine's own
    /// error.
    fn behind_hidden(&self, tokens: Vec<u32>) -> Vec<u32> {
        if self.hidden.is_empty() || tokens.is_empty() {
            return tokens;
        }
        let mut all = Vec::with_capacity(self.hidden.len() + tokens.len());
        all.extend_from_slice(&self.hidden);
        all.extend(tokens);
        all
    }

    pub(crate) fn engine(&self) -> &Engine {
        self.handle.engine()
    }

    /// Scores one sequence, batched with whatever else is in flight.
    pub(crate) async fn score(&self, tokens: Vec<u32>, top_k: usize) -> Result<ScoredSequence> {
        let mut out = self
            .handle
            .score(vec![self.behind_hidden(tokens)], top_k)
            .await?;
        let mut scored = out
            .pop()
            .ok_or_else(|| EngineError::EmptyInput("no sequence scored".into()))?;
        if !self.hidden.is_empty() {
            scored
                .positions
                .drain(..self.hidden.len().min(scored.positions.len()));
            if let Some(first) = scored.positions.first_mut() {
                first.logprob = None;
                first.top.clear();
            }
        }
        Ok(scored)
    }

    /// Starts a generation (held to `constraint`, if any); events arrive on the returned
    /// channel.
    pub(crate) fn generate(
        &self,
        prompt: Vec<u32>,
        params: GenerateParams,
        constraint: Option<Constraint>,
    ) -> Result<mpsc::UnboundedReceiver<GenEvent>> {
        self.handle
            .generate_constrained(self.behind_hidden(prompt), params, constraint)
    }
}
