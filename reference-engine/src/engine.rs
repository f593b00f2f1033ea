//! The library API: [`Engine::load`], [`Engine::score`], [`Engine::generate`].
//!
//! Both calls (and the [`crate::batcher`]) run on one step machine: a [`Seq`] holds a
//! sequence's tokens, its KV cache and what it is for (scoring or generating); [`Engine::step`]
//! advances any set of sequences by one batched forward pass (a prefill chunk for some, one
//! decode token for others). Because rows are batch-invariant, a sequence's numbers do not
//! depend on the company it keeps or on how it was chunked.

use std::path::Path;

use serde::Serialize;

use crate::config::ModelConfig;
use crate::constrain::{Constraint, Matcher};
use crate::device::{Device, GemmTiming};
use crate::error::{EngineError, Result};
use crate::forward::{BatchItem, forward};
use crate::gguf::GgufFile;
use crate::hf::HfDir;
use crate::kernels::{Ctx, Isa, Pool};
use crate::kv::KvCache;
use crate::model::Weights;
use crate::profile::{Numerics, Profile};
use crate::sample::{self, Sampler, SamplingParams, TokenLogprob};

mod backend;
mod prefix_cache;
mod score_job;
use backend::{Backend, Hidden};
use prefix_cache::PrefixCache;
pub(crate) use score_job::ScoreJob;

/// Most top-k entries a request may ask for.
pub const MAX_TOP_K: usize = 20;

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Kernel threads (the caller's thread included). Default 2.
    pub threads: usize,
    /// Cap the instruction set (for tests and comparisons); None uses the best available.
    pub isa: Option<Isa>,
    /// Serving profile whose numeric knobs (weight re-quantization, 8-bit activations,
    /// KV-cache format) the engine applies; the default `reference` changes nothing.
    pub profile: Profile,
    /// Where the forward pass runs (default: the CPU).
    pub device: Device,
    /// Most bytes of generation prompts' keys and values kept for later prompts that start
    /// alike ([`Engine::reused_prompt_positions`]); 0 keeps none. Default 64 MiB.
    pub prefix_cache_bytes: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            threads: 2,
            isa: None,
            profile: Profile::default(),
            device: Device::Cpu,
            prefix_cache_bytes: 64 << 20,
        }
    }
}

/// A loaded model and its kernel threads.
#[derive(Debug)]
pub struct Engine {
    pub(crate) weights: Weights,
    pub(crate) ctx: Ctx,
    /// The serving profile it was loaded with (only its numeric knobs act here).
    profile: Profile,
    /// Where the forward pass and the output head run.
    backend: Backend,
    /// Scored positions taken from another sequence of the same job instead of computed.
    shared_positions: std::sync::atomic::AtomicU64,
    /// Generation prompts kept for later prompts that start alike.
    prefixes: PrefixCache,
    /// Nanoseconds in [`Engine::step`]: in the backend's forward passes and output heads
    /// (the logits copied back included), and in all.
    step_ns: [std::sync::atomic::AtomicU64; 2],
}

/// One position of a scored sequence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoredPosition {
    /// The token at this position.
    pub token: u32,
    /// `log p(token | tokens before it)`; None at position 0 (vLLM's alignment).
    pub logprob: Option<f32>,
    /// The `top_k` most likely tokens at this position (empty at position 0), by logprob
    /// descending then id ascending.
    pub top: Vec<TokenLogprob>,
}

/// A scored sequence: one entry per input token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScoredSequence {
    /// Per position, in order.
    pub positions: Vec<ScoredPosition>,
}

/// Generation request parameters (stop *strings* are the caller's business).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// Greedy / sampling parameters.
    pub sampling: SamplingParams,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Generation stops when one of these is sampled (it is not part of the output).
    pub stop_token_ids: Vec<u32>,
    /// None of `stop_token_ids` is chosen before this many tokens are generated (vLLM's
    /// `min_tokens`): they are masked from the choice, not from the reported logprobs.
    pub min_tokens: usize,
    /// Alternatives to report per generated token (at most [`MAX_TOP_K`]).
    pub top_logprobs: usize,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::default(),
            max_tokens: 16,
            stop_token_ids: Vec::new(),
            min_tokens: 0,
            top_logprobs: 0,
        }
    }
}

/// One generated token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GeneratedToken {
    /// The token.
    pub token: u32,
    /// Its logprob under the model (temperature 1, unfiltered).
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens at this step.
    pub top: Vec<TokenLogprob>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was sampled.
    Stop,
    /// `max_tokens` reached or the context is full.
    Length,
    /// The caller stopped it.
    Cancelled,
}

/// How a generation ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finish {
    /// Why.
    pub reason: FinishReason,
    /// The stop token sampled, for [`FinishReason::Stop`].
    pub stop_token: Option<u32>,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Tokens generated (the stop token not counted).
    pub completion_tokens: usize,
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Generation {
    /// The generated tokens.
    pub tokens: Vec<GeneratedToken>,
    /// How it ended.
    pub finish: Finish,
}

/// A sequence in flight: tokens, cache, purpose.
#[derive(Debug)]
pub struct Seq {
    cache: KvCache,
    tokens: Vec<u32>,
    /// Tokens already in the cache.
    fed: usize,
    kind: Kind,
    /// Keep the cache once scored: another sequence of the job still forks from it.
    pinned: bool,
}

#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per sequence; boxing buys nothing
enum Kind {
    Score {
        top_k: usize,
        out: Vec<ScoredPosition>,
    },
    Gen {
        params: GenerateParams,
        sampler: Sampler,
        prompt_len: usize,
        new: Vec<GeneratedToken>,
        count: usize,
        finish: Option<Finish>,
        /// The constraint's walk, for a constrained generation.
        matcher: Option<Box<Matcher>>,
    },
}

impl Seq {
    /// True when nothing is left to compute.
    pub fn is_done(&self) -> bool {
        match &self.kind {
            Kind::Score { .. } => self.fed == self.tokens.len(),
            Kind::Gen { finish, .. } => finish.is_some(),
        }
    }

    /// For a finished score sequence, its result.
    pub fn take_scored(&mut self) -> Option<ScoredSequence> {
        match &mut self.kind {
            Kind::Score { out, .. } if self.fed == self.tokens.len() => Some(ScoredSequence {
                positions: std::mem::take(out),
            }),
            _ => None,
        }
    }

    /// For a generation, the tokens produced since the last call.
    pub fn take_new_tokens(&mut self) -> Vec<GeneratedToken> {
        match &mut self.kind {
            Kind::Gen { new, .. } => std::mem::take(new),
            Kind::Score { .. } => Vec::new(),
        }
    }

    /// For a generation, how it ended (once it has).
    pub fn finish(&self) -> Option<&Finish> {
        match &self.kind {
            Kind::Gen { finish, .. } => finish.as_ref(),
            Kind::Score { .. } => None,
        }
    }

    /// Ends a generation early (the caller went away).
    pub fn cancel(&mut self) {
        let done = self.tokens.len();
        if let Kind::Gen {
            finish,
            prompt_len,
            count,
            ..
        } = &mut self.kind
        {
            finish.get_or_insert(Finish {
                reason: FinishReason::Cancelled,
                stop_token: None,
                prompt_tokens: *prompt_len,
                completion_tokens: (*count).min(done),
            });
        }
    }
}

impl Engine {
    /// Loads a GGUF file, or an HF directory (config.json + safetensors).
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Self> {
        opts.profile.validate().map_err(|m| {
            EngineError::InvalidRequest(format!("profile {}: {m}", opts.profile.name))
        })?;
        let numerics = Numerics::from_profile(&opts.profile);
        let weights = if path.is_dir() {
            Weights::from_hf(&HfDir::open(path)?, &numerics)?
        } else {
            Weights::from_gguf(&GgufFile::open(path)?, &numerics)?
        };
        let isa = opts.isa.map_or_else(Isa::detect, Isa::at_most);
        let backend = Backend::choose(opts.device, &weights)?;
        Ok(Self {
            weights,
            ctx: Ctx {
                pool: Pool::new(opts.threads),
                isa,
            },
            profile: opts.profile,
            backend,
            shared_positions: std::sync::atomic::AtomicU64::new(0),
            prefixes: PrefixCache::new(opts.prefix_cache_bytes),
            step_ns: Default::default(),
        })
    }

    /// Where the forward pass runs, in words: `cpu`, or `cuda:N (GPU name, …)`.
    pub fn device(&self) -> String {
        match &self.backend {
            Backend::Cpu => "cpu".into(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => g.label().into(),
        }
    }

    /// Bytes of weights the GPU holds (0 on the CPU backend).
    pub fn device_weight_bytes(&self) -> usize {
        match &self.backend {
            Backend::Cpu => 0,
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => g.bytes(),
        }
    }

    /// Times the GPU's matmul kernels on this model's shapes at `m` rows (`reps` products
    /// each, medians): each kernel that can run a shape, and which one the forward pass
    /// picks. An error on the CPU backend. For the GPU check's comparison with cuBLAS.
    pub fn gpu_gemm_timings(&self, m: usize, reps: usize) -> Result<Vec<GemmTiming>> {
        match &self.backend {
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => g.gemm_timings(m, reps),
            _ => {
                let _ = (m, reps);
                Err(EngineError::Device("the engine runs on the CPU".into()))
            }
        }
    }

    /// The batch's forward pass on this engine's backend.
    fn run_forward(&self, items: &mut [BatchItem<'_>]) -> Result<Hidden> {
        match &self.backend {
            Backend::Cpu => Ok(Hidden::Host(forward(&self.weights, &self.ctx, items)?)),
            #[cfg(feature = "cuda")]
            Backend::Cuda(g) => Ok(Hidden::Device(g.forward(&self.weights, items)?)),
        }
    }

    /// The output head's logits of `rows` of `hidden` into `logits` (`[rows][vocab]`), with
    /// the profile's activation knob on the head's input; `x` is host scratch.
    fn head_logits(
        &self,
        hidden: &Hidden,
        rows: &[usize],
        x: &mut [f32],
        logits: &mut [f32],
    ) -> Result<()> {
        let e = self.weights.config.n_embd;
        match hidden {
            Hidden::Host(h) => {
                for (j, &r) in rows.iter().enumerate() {
                    x[j * e..(j + 1) * e].copy_from_slice(&h[r * e..(r + 1) * e]);
                }
                self.weights.numerics.quantize_inputs(x, rows.len(), e);
                self.weights.head().matmul(&self.ctx, x, rows.len(), logits);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Hidden::Device(d) => match &self.backend {
                Backend::Cuda(g) => g.logits(&self.weights, d, rows, logits),
                Backend::Cpu => Err(EngineError::Device(
                    "hidden states on a GPU for a CPU engine".into(),
                )),
            },
        }
    }

    /// The serving profile the engine runs (`reference` unless loaded with another).
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.weights.config
    }

    /// Kernel threads in use.
    pub fn threads(&self) -> usize {
        self.ctx.pool.threads()
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.ctx.isa
    }

    /// Scored positions this engine took from another sequence of the same scoring job (a
    /// shared prefix, see [`Engine::score`]) instead of computing them, since it was loaded.
    pub fn shared_prefix_positions(&self) -> u64 {
        self.shared_positions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Seconds spent in [`Engine::step`] since the engine was loaded: in the backend's
    /// forward passes and output heads (on a GPU, its kernels and the logits' copy back),
    /// and in all (the rest being the host's log-softmax, top-k, sampling and bookkeeping).
    pub fn step_seconds(&self) -> (f64, f64) {
        let get =
            |i: usize| self.step_ns[i].load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9;
        (get(0), get(1))
    }

    fn add_step_ns(&self, i: usize, since: std::time::Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.step_ns[i].fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts a finished job's shared positions.
    pub(crate) fn count_shared(&self, job: &ScoreJob) {
        self.shared_positions.fetch_add(
            job.shared_positions() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Bytes held by the packed weights.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes()
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let c = self.config();
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput("a sequence has no tokens".into()));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(EngineError::TokenOutOfVocab {
                token: t,
                vocab_size: c.vocab_size,
            });
        }
        Ok(())
    }

    /// A sequence to score: validates the ids, the length and `top_k`.
    pub fn score_seq(&self, tokens: Vec<u32>, top_k: usize) -> Result<Seq> {
        self.check_tokens(&tokens)?;
        let n_ctx = self.config().n_ctx;
        if tokens.len() > n_ctx {
            return Err(EngineError::SequenceTooLong {
                len: tokens.len(),
                n_ctx,
            });
        }
        if top_k > MAX_TOP_K {
            return Err(EngineError::InvalidRequest(format!(
                "top_k {top_k} exceeds {MAX_TOP_K}"
            )));
        }
        let first = ScoredPosition {
            token: tokens[0],
            logprob: None,
            top: Vec::new(),
        };
        Ok(Seq {
            cache: KvCache::new(self.config().n_layer),
            tokens,
            fed: 0,
            pinned: false,
            kind: Kind::Score {
                top_k,
                out: vec![first],
            },
        })
    }

    /// A sequence to generate from `prompt`: validates ids, length and parameters.
    pub fn generate_seq(&self, prompt: Vec<u32>, params: GenerateParams) -> Result<Seq> {
        self.generate_seq_constrained(prompt, params, None)
    }

    /// [`Engine::generate_seq`] whose output is held to `constraint` ([`crate::constrain`]):
    /// each token is chosen among those the constraint allows (greedy: the most likely
    /// allowed token; sampling: the allowed tokens' renormalised distribution), stop tokens
    /// only once the output is whole, and the generation ends as soon as nothing can follow.
    /// Reported logprobs stay the model's own, before masking.
    pub fn generate_seq_constrained(
        &self,
        prompt: Vec<u32>,
        params: GenerateParams,
        constraint: Option<Constraint>,
    ) -> Result<Seq> {
        self.check_tokens(&prompt)?;
        let c = self.config();
        if prompt.len() >= c.n_ctx {
            return Err(EngineError::SequenceTooLong {
                len: prompt.len() + 1,
                n_ctx: c.n_ctx,
            });
        }
        if params.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        if params.top_logprobs > MAX_TOP_K {
            return Err(EngineError::InvalidRequest(format!(
                "top_logprobs {} exceeds {MAX_TOP_K}",
                params.top_logprobs
            )));
        }
        if let Some((_, why)) = params.sampling.invalid() {
            return Err(EngineError::InvalidRequest(why));
        }
        let mut sampler = Sampler::new(params.sampling.clone());
        sampler.observe_prompt(&prompt);
        let prompt_len = prompt.len();
        Ok(Seq {
            cache: KvCache::new(c.n_layer),
            tokens: prompt,
            fed: 0,
            pinned: false,
            kind: Kind::Gen {
                params,
                sampler,
                prompt_len,
                new: Vec::new(),
                count: 0,
                finish: None,
                matcher: constraint.map(|c| Box::new(Matcher::new(c))),
            },
        })
    }

    /// Scores sequences: for each, per position the logprob of the token given those before
    /// it (None at position 0) and the `top_k` alternatives (k ≤ 20). Sequences are batched,
    /// and a sequence sharing a prefix with another is computed only past it
    /// (`ScoreJob`).
    pub fn score(&self, seqs: &[Vec<u32>], top_k: usize) -> Result<Vec<ScoredSequence>> {
        if seqs.is_empty() {
            return Err(EngineError::EmptyInput("no sequences".into()));
        }
        let work = seqs
            .iter()
            .map(|s| self.score_seq(s.clone(), top_k))
            .collect::<Result<Vec<_>>>()?;
        let mut job = ScoreJob::new(work);
        loop {
            let mut live = job.live();
            if live.is_empty() {
                break;
            }
            self.step(&mut live)?;
        }
        self.count_shared(&job);
        Ok(job.take_scored())
    }

    /// Generates from `prompt`. `on_token` sees every token as it is produced and returns
    /// false to stop (finish reason [`FinishReason::Cancelled`]).
    pub fn generate(
        &self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: &mut dyn FnMut(&GeneratedToken) -> bool,
    ) -> Result<Generation> {
        self.generate_constrained(prompt, params, None, on_token)
    }

    /// [`Engine::generate`] held to `constraint` (see [`Engine::generate_seq_constrained`]).
    pub fn generate_constrained(
        &self,
        prompt: &[u32],
        params: &GenerateParams,
        constraint: Option<Constraint>,
        on_token: &mut dyn FnMut(&GeneratedToken) -> bool,
    ) -> Result<Generation> {
        let mut seq = self.generate_seq_constrained(prompt.to_vec(), params.clone(), constraint)?;
        let mut all = Vec::new();
        while !seq.is_done() {
            self.step(&mut [&mut seq])?;
            for t in seq.take_new_tokens() {
                if !on_token(&t) {
                    seq.cancel();
                }
                all.push(t);
            }
        }
        let finish = seq
            .finish()
            .cloned()
            .ok_or_else(|| EngineError::InvalidRequest("generation did not finish".into()))?;
        Ok(Generation {
            tokens: all,
            finish,
        })
    }

    /// Advances every sequence by one forward pass: the next prefill chunk of those still
    /// reading their input, one token for those generating. Finished ones are skipped.
    pub fn step(&self, seqs: &mut [&mut Seq]) -> Result<()> {
        let started = std::time::Instant::now();
        let result = self.step_inner(seqs);
        self.add_step_ns(1, started);
        result
    }

    fn step_inner(&self, seqs: &mut [&mut Seq]) -> Result<()> {
        let c = &self.weights.config;
        self.reuse_prompts(seqs);
        // choose each sequence's slice of new tokens
        let limits = self.backend.pass_limits();
        let mut budget = limits.rows;
        let mut take = vec![0usize; seqs.len()];
        // decode rows first (one each), then prefill chunks, the shortest remaining prefill
        // first: a short interactive prompt is not queued behind long scoring jobs (which
        // still get the rest of the budget every step). Which rows share a pass never
        // changes a result (batch invariance), only when each sequence is done.
        for (i, s) in seqs.iter().enumerate() {
            if !s.is_done() && s.tokens.len() - s.fed == 1 && budget > 0 {
                take[i] = 1;
                budget -= 1;
            }
        }
        let mut prefills: Vec<usize> = (0..seqs.len())
            .filter(|&i| !seqs[i].is_done() && take[i] == 0)
            .collect();
        prefills.sort_by_key(|&i| seqs[i].tokens.len() - seqs[i].fed); // stable: ties in order
        for i in prefills {
            if budget == 0 {
                break;
            }
            let n = (seqs[i].tokens.len() - seqs[i].fed)
                .min(limits.chunk)
                .min(budget);
            take[i] = n;
            budget -= n;
        }
        // logits wanted: (row in batch, seq index, position of the row)
        let mut want = Vec::new();
        let mut row = 0;
        for (i, s) in seqs.iter().enumerate() {
            let n = take[i];
            for p in s.fed..s.fed + n {
                let needed = match s.kind {
                    Kind::Score { .. } => p + 1 < s.tokens.len(),
                    Kind::Gen { .. } => p + 1 == s.tokens.len(),
                };
                if needed {
                    want.push((row, i, p));
                }
                row += 1;
            }
        }
        let forward_started = std::time::Instant::now();
        let hidden = {
            let mut items: Vec<BatchItem<'_>> = seqs
                .iter_mut()
                .zip(&take)
                .filter(|(_, n)| **n > 0)
                .map(|(s, &n)| {
                    let s: &mut Seq = s;
                    BatchItem {
                        cache: &mut s.cache,
                        tokens: &s.tokens[s.fed..s.fed + n],
                    }
                })
                .collect();
            self.run_forward(&mut items)?
        };
        self.add_step_ns(0, forward_started);
        for (i, s) in seqs.iter_mut().enumerate() {
            s.fed += take[i];
            if matches!(s.kind, Kind::Score { .. }) && s.fed == s.tokens.len() && !s.pinned {
                // a scored sequence needs its cache no more: free it now, not when the job ends
                s.cache = KvCache::default();
            }
        }
        self.keep_prompts(seqs, &take);
        let logit_rows = (limits.logit_floats / c.vocab_size).clamp(8, 256);
        let e = c.n_embd;
        let v = c.vocab_size;
        let mut x = vec![0f32; logit_rows.min(want.len()) * e];
        let mut logits = vec![0f32; logit_rows.min(want.len()) * v];
        for chunk in want.chunks(logit_rows) {
            let rows: Vec<usize> = chunk.iter().map(|&(r, _, _)| r).collect();
            let head_started = std::time::Instant::now();
            self.head_logits(&hidden, &rows, &mut x, &mut logits)?;
            self.add_step_ns(0, head_started);
            // log-sum-exp and top-k per row, rows split over the threads
            let ks: Vec<usize> = chunk
                .iter()
                .map(|&(_, i, _)| match &seqs[i].kind {
                    Kind::Score { top_k, .. } => *top_k,
                    Kind::Gen { params, .. } => params.top_logprobs,
                })
                .collect();
            let stats: std::sync::Mutex<Vec<(usize, f64, Vec<TokenLogprob>)>> =
                std::sync::Mutex::new(Vec::new());
            let logits_ref = &logits;
            self.ctx.pool.for_chunks(chunk.len(), 4, &|rows| {
                let mine: Vec<(usize, f64, Vec<TokenLogprob>)> = rows
                    .map(|j| {
                        let l = &logits_ref[j * v..(j + 1) * v];
                        let lse = sample::log_sum_exp(l);
                        (j, lse, sample::top_k(l, lse, ks[j]))
                    })
                    .collect();
                stats
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend(mine);
            });
            let mut stats = stats
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            stats.sort_by_key(|s| s.0);
            for ((j, lse, top), &(_, i, p)) in stats.into_iter().zip(chunk) {
                let l = &logits[j * v..(j + 1) * v];
                self.consume(seqs[i], p, l, lse, top);
            }
        }
        Ok(())
    }

    /// Uses the logits of position `p` of `s`.
    fn consume(&self, s: &mut Seq, p: usize, l: &[f32], lse: f64, top: Vec<TokenLogprob>) {
        let n_ctx = self.weights.config.n_ctx;
        match &mut s.kind {
            Kind::Score { out, .. } => {
                let t = s.tokens[p + 1];
                out.push(ScoredPosition {
                    token: t,
                    logprob: Some(sample::logprob(l, lse, t)),
                    top,
                });
            }
            Kind::Gen {
                params,
                sampler,
                prompt_len,
                new,
                count,
                finish,
                matcher,
            } => {
                let end = |reason, stop_token, count: usize| Finish {
                    reason,
                    stop_token,
                    prompt_tokens: *prompt_len,
                    completion_tokens: count,
                };
                // the stop tokens masked from the choice until `min_tokens` (the logprobs are
                // still `l`'s, the model's own)
                let banned =
                    (*count < params.min_tokens).then(|| sample::masked(l, &params.stop_token_ids));
                let row = banned.as_deref().unwrap_or(l);
                let t = match matcher {
                    None => sampler.pick(row),
                    Some(m) => {
                        let allowed = m.allowed();
                        if allowed.is_empty() {
                            // cannot happen for a compiled grammar; end rather than emit an invalid token
                            tracing::warn!("constrained generation: no token allowed");
                            *finish = Some(end(FinishReason::Stop, None, *count));
                            return;
                        }
                        let masked: Vec<f32> = row
                            .iter()
                            .enumerate()
                            .map(|(i, &x)| {
                                if allowed.contains(i as u32) {
                                    x
                                } else {
                                    f32::NEG_INFINITY
                                }
                            })
                            .collect();
                        let t = sampler.pick(&masked);
                        let t = if allowed.contains(t) {
                            t
                        } else {
                            sample::argmax(&masked)
                        };
                        if !m.accept(t) {
                            tracing::warn!(
                                token = t,
                                "constrained generation: allowed token refused"
                            );
                            *finish = Some(end(FinishReason::Stop, None, *count));
                            return;
                        }
                        t
                    }
                };
                if params.stop_token_ids.contains(&t) {
                    *finish = Some(end(FinishReason::Stop, Some(t), *count));
                    return;
                }
                new.push(GeneratedToken {
                    token: t,
                    logprob: sample::logprob(l, lse, t),
                    top,
                });
                s.tokens.push(t);
                sampler.observe(t);
                *count += 1;
                if matcher.as_ref().is_some_and(|m| m.is_complete()) {
                    *finish = Some(end(FinishReason::Stop, None, *count));
                } else if *count >= params.max_tokens || s.tokens.len() >= n_ctx {
                    *finish = Some(end(FinishReason::Length, None, *count));
                }
            }
        }
    }
}
