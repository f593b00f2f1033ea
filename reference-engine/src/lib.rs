//! samewise-engine: the reference engine. It loads Llama-family decoder weights (GGUF or a
//! Hugging Face safetensors directory) and computes exact, deterministic logprobs from
//! them on the CPU: scoring, generation, and continuous batching of concurrent requests.
//!
//! It owns the numerical contract of samewise: f32 arithmetic on the exactly dequantized
//! weights, with results that are bit-identical whatever the batch composition, the
//! thread count, or whether a sequence is scored whole or decoded token by token. It must
//! not approximate (no activation quantization, no split-K reductions that depend on batch
//! shape), must not panic on any input, and must not reach the network.
//!
//! # Layout
//! - `error`: the crate's [`EngineError`].
//! - `gguf`: bounds-checked GGUF reader (metadata API used by the tokenizer).
//! - `gguf_write`: streaming GGUF v3 writer ([`GgufWriter`]), the reader's inverse.
//! - `quant`: ggml block dequantization (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K).
//! - `hf`: Hugging Face `config.json` + safetensors (single file or sharded).
//! - `config`: the model hyper-parameters, from either source.
//! - `kernels`: thread pool, packed-panel GEMM, attention and norm kernels.
//! - `model`: weights in kernel layout, loaded from either source.
//! - `forward`: the batched forward pass.
//! - `device`: where the forward pass runs ([`Device`]: auto, cpu, cuda:N).
//! - `cuda` (feature `cuda`, default): the CUDA backend, kernels compiled by NVRTC at load,
//!   the CPU's arithmetic in the CPU's order.
//! - `kv`: the per-sequence KV cache.
//! - `logits`: full next-token logits of a sequence, streamed (the calibration ladder).
//! - [`sample`]: log-softmax, top-k, greedy and seeded sampling.
//! - [`constrain`]: constrained decoding (JSON Schema / tool calls → grammar → token masks).
//! - `engine`: the library API ([`Engine`]): load, score, generate.
//! - `batcher`: a worker thread that batches concurrent jobs (continuous batching).
//! - [`chat`]: chat templates rendered as Hugging Face does, the tools convention, tool-call
//!   parsing.
//! - `profile`: serving profiles that emulate provider faults (re-quantized weights,
//!   8-bit activations, KV-cache formats, truncation, tool-call corruption, ...).
//! - [`server`]: the OpenAI-compatible HTTP API (axum): `router`, `serve`.
//! - `synth`: synthetic models of a real shape with seeded random weights, real models cut
//!   to their first layers, and the ggml quantizers that write them.
//! - `tokenizer`: text <-> ids (tokenizer.json or GGUF metadata), token bytes, streaming
//!   detokenisation.
//!
//! The API is what this root re-exports and five namespaces (`chat`, `constrain`, `profile`,
//! `sample`, `server`); every other module is private.

mod batcher;
/// A namespace of the API: chat templates, the tools convention and tool-call parsing
/// (`chat::load_tokenizer_and_template`, `chat::parse_tool_calls`).
pub mod chat;
mod config;
/// A namespace of the API: constrained decoding (schema → grammar → matcher over a token
/// trie), driven directly by its example and tests.
pub mod constrain;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod engine;
mod error;
mod forward;
mod gguf;
mod gguf_write;
mod hf;
mod kernels;
mod kv;
mod logits;
mod model;
/// A namespace of the API: serving profiles, `Profile` and the sections and knobs its fields
/// hold (the demo and the probes build engines under them).
pub mod profile;
mod quant;
/// A namespace of the API: the log-softmax, top-k and sampling primitives whose bits the
/// numerics tests compare.
pub mod sample;
/// A namespace of the API (ARCHITECTURE.md): the OpenAI-compatible HTTP server.
pub mod server;
mod synth;
mod tokenizer;

pub use batcher::{Batcher, BatcherHandle, GenEvent};
pub use config::{Arch, ModelConfig, RopeScaling};
pub use device::{Device, GemmTiming, cuda_unavailable};
pub use engine::{
    Engine, Finish, FinishReason, GenerateParams, GeneratedToken, Generation, LoadOptions,
    MAX_TOP_K, ScoredPosition, ScoredSequence, Seq,
};
pub use error::{EngineError, Result};
pub use gguf::{GgmlType, GgufFile, GgufValue, TensorInfo};
pub use gguf_write::{GgufWriter, TensorSpec};
pub use hf::HfDir;
pub use kernels::Isa;
pub use profile::Profile;
pub use sample::{SamplingParams, TokenLogprob};
pub use synth::{
    MAX_CONTEXT, SynthOptions, SynthReport, SynthShape, WEIGHT_TYPES, cut_layers,
    parse_weight_type, quantize_row, synthesize,
};
pub use tokenizer::{Detokenizer, Tokenizer};
