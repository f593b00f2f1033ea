//! The server's view of the compute side: the engine's [`Batcher`], which batches every
//! concurrent request's work into shared forward passes.
//!
//! The batcher's worker thread is owned here and stopped (pending jobs failed with
//! `Shutdown`, the thread joined) when the last clone of the server state goes away. A
//! generation whose receiver is dropped (the client went away, or a stop string ended it)
//! is cancelled by the worker.

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
}

impl Backend {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        let batcher = Batcher::start(engine);
        let handle = batcher.handle();
        Self {
            _batcher: Arc::new(batcher),
            handle,
        }
    }

    pub(crate) fn engine(&self) -> &Engine {
        self.handle.engine()
    }

    /// Scores one sequence, batched with whatever else is in flight.
    pub(crate) async fn score(&self, tokens: Vec<u32>, top_k: usize) -> Result<ScoredSequence> {
        let mut out = self.handle.score(vec![tokens], top_k).await?;
        out.pop()
            .ok_or_else(|| EngineError::EmptyInput("no sequence scored".into()))
    }

    /// Starts a generation (held to `constraint`, if any); events arrive on the returned
    /// channel.
    pub(crate) fn generate(
        &self,
        prompt: Vec<u32>,
        params: GenerateParams,
        constraint: Option<Constraint>,
    ) -> Result<mpsc::UnboundedReceiver<GenEvent>> {
        self.handle.generate_constrained(prompt, params, constraint)
    }
}
