//! Continuous batching: one worker thread owns the compute; async callers submit score and
//! generate jobs through a channel and await replies.
//!
//! Each worker iteration takes every queued job, drops the ones whose caller went away,
//! and runs one [`Engine::step`] over all live sequences: prefill chunks of new ones and one
//! decode token for every active generation, in a single batched forward pass. Tokens are
//! streamed back as they come. Batch invariance makes every result equal to the unbatched
//! one.
//!
//! ```no_run
//! # async fn demo(engine: samewise_engine::Engine) -> samewise_engine::Result<()> {
//! use samewise_engine::{Batcher, GenEvent};
//! let batcher = Batcher::start(std::sync::Arc::new(engine));
//! let handle = batcher.handle();
//! let scored = handle.score(vec![vec![1, 2, 3]], 5).await?;
//! let mut events = handle.generate(vec![1, 2, 3], Default::default())?;
//! while let Some(ev) = events.recv().await {
//!     if let GenEvent::Done(finish) = ev { println!("{:?}", finish.reason); }
//! }
//! batcher.shutdown();
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

use crate::constrain::Constraint;
use crate::engine::{
    Engine, Finish, GenerateParams, GeneratedToken, ScoreJob, ScoredSequence, Seq,
};
use crate::error::{EngineError, Result};

/// What a generation stream carries.
#[derive(Debug)]
pub enum GenEvent {
    /// A generated token.
    Token(GeneratedToken),
    /// The generation ended (last event).
    Done(Finish),
    /// The generation failed (last event).
    Error(EngineError),
}

enum Job {
    Score {
        seqs: Vec<Vec<u32>>,
        top_k: usize,
        reply: oneshot::Sender<Result<Vec<ScoredSequence>>>,
    },
    Generate {
        seq: Box<Seq>,
        events: mpsc::UnboundedSender<GenEvent>,
    },
    Stop,
}

/// The worker. Dropping it (or [`Batcher::shutdown`]) fails pending jobs with
/// [`EngineError::Shutdown`] and joins the thread.
#[derive(Debug)]
pub struct Batcher {
    handle: BatcherHandle,
    worker: Option<JoinHandle<()>>,
}

/// A cheap, cloneable handle for submitting jobs.
#[derive(Clone)]
pub struct BatcherHandle {
    tx: std_mpsc::Sender<Job>,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for BatcherHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatcherHandle").finish_non_exhaustive()
    }
}

impl Batcher {
    /// Starts the worker thread.
    pub fn start(engine: Arc<Engine>) -> Self {
        let (tx, rx) = std_mpsc::channel();
        let e = Arc::clone(&engine);
        let worker = std::thread::Builder::new()
            .name("samewise-batcher".into())
            .spawn(move || run(&e, &rx))
            .ok();
        Self {
            handle: BatcherHandle { tx, engine },
            worker,
        }
    }

    /// A handle for submitting jobs.
    pub fn handle(&self) -> BatcherHandle {
        self.handle.clone()
    }

    /// Stops the worker (pending jobs get [`EngineError::Shutdown`]) and waits for it.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.handle.tx.send(Job::Stop);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.stop();
    }
}

impl BatcherHandle {
    /// The engine behind this batcher (for its config).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Scores sequences (as [`Engine::score`]), batched with whatever else is in flight.
    /// Dropping the future cancels the job.
    pub async fn score(&self, seqs: Vec<Vec<u32>>, top_k: usize) -> Result<Vec<ScoredSequence>> {
        if seqs.is_empty() {
            return Err(EngineError::EmptyInput("no sequences".into()));
        }
        // validate here so bad input fails fast, before it reaches the worker
        for s in &seqs {
            drop(self.engine.score_seq(s.clone(), top_k)?);
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Score { seqs, top_k, reply })
            .map_err(|_| EngineError::Shutdown)?;
        rx.await.map_err(|_| EngineError::Shutdown)?
    }

    /// Starts a generation; tokens stream on the returned receiver, ending with
    /// [`GenEvent::Done`] or [`GenEvent::Error`]. Dropping the receiver cancels it.
    pub fn generate(
        &self,
        prompt: Vec<u32>,
        params: GenerateParams,
    ) -> Result<mpsc::UnboundedReceiver<GenEvent>> {
        self.generate_constrained(prompt, params, None)
    }

    /// [`BatcherHandle::generate`] held to a constraint ([`Engine::generate_seq_constrained`]).
    pub fn generate_constrained(
        &self,
        prompt: Vec<u32>,
        params: GenerateParams,
        constraint: Option<Constraint>,
    ) -> Result<mpsc::UnboundedReceiver<GenEvent>> {
        let seq = Box::new(
            self.engine
                .generate_seq_constrained(prompt, params, constraint)?,
        );
        let (events, rx) = mpsc::unbounded_channel();
        self.tx
            .send(Job::Generate { seq, events })
            .map_err(|_| EngineError::Shutdown)?;
        Ok(rx)
    }
}

/// A job being worked on.
enum Active {
    Score {
        job: ScoreJob,
        reply: oneshot::Sender<Result<Vec<ScoredSequence>>>,
    },
    Generate {
        seq: Box<Seq>,
        events: mpsc::UnboundedSender<GenEvent>,
    },
}

impl Active {
    fn cancelled(&self) -> bool {
        match self {
            Active::Score { reply, .. } => reply.is_closed(),
            Active::Generate { events, .. } => events.is_closed(),
        }
    }

    fn fail(self, e: EngineError) {
        match self {
            Active::Score { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Active::Generate { events, .. } => {
                let _ = events.send(GenEvent::Error(e));
            }
        }
    }
}

fn run(engine: &Engine, rx: &std_mpsc::Receiver<Job>) {
    let mut active: Vec<Active> = Vec::new();
    let mut stopping = false;
    loop {
        // take every queued job; block only when idle
        let mut next = if active.is_empty() {
            rx.recv().ok()
        } else {
            rx.try_recv().ok()
        };
        if next.is_none() && active.is_empty() {
            return; // every handle is gone
        }
        while let Some(job) = next.take() {
            match job {
                Job::Stop => stopping = true,
                Job::Score { seqs, top_k, reply } => {
                    match seqs
                        .into_iter()
                        .map(|s| engine.score_seq(s, top_k))
                        .collect::<Result<Vec<_>>>()
                    {
                        Ok(seqs) => active.push(Active::Score {
                            job: ScoreJob::new(seqs),
                            reply,
                        }),
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                Job::Generate { seq, events } => active.push(Active::Generate { seq, events }),
            }
            next = rx.try_recv().ok();
        }
        if stopping {
            for a in active.drain(..) {
                a.fail(EngineError::Shutdown);
            }
            return;
        }
        active.retain(|a| !a.cancelled());
        if active.is_empty() {
            continue;
        }
        let result = {
            let mut live: Vec<&mut Seq> = Vec::new();
            for a in &mut active {
                match a {
                    Active::Score { job, .. } => live.extend(job.live()),
                    Active::Generate { seq, .. } => {
                        if !seq.is_done() {
                            live.push(seq);
                        }
                    }
                }
            }
            engine.step(&mut live)
        };
        if let Err(e) = result {
            let msg = e.to_string();
            for a in active.drain(..) {
                a.fail(EngineError::InvalidRequest(format!(
                    "batched step failed: {msg}"
                )));
            }
            continue;
        }
        // deliver
        let mut still = Vec::with_capacity(active.len());
        for a in active.drain(..) {
            match a {
                Active::Score { job, reply } => {
                    if job.is_done() {
                        engine.count_shared(&job);
                        let _ = reply.send(Ok(job.take_scored()));
                    } else {
                        still.push(Active::Score { job, reply });
                    }
                }
                Active::Generate { mut seq, events } => {
                    for t in seq.take_new_tokens() {
                        let _ = events.send(GenEvent::Token(t));
                    }
                    match seq.finish() {
                        Some(f) => {
                            let _ = events.send(GenEvent::Done(f.clone()));
                        }
                        None => still.push(Active::Generate { seq, events }),
                    }
                }
            }
        }
        active = still;
    }
}
