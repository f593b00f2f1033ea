//! Synthetic models for throughput measurements: a GGUF of a real model's shape with seeded
//! random weights ([`synthesize`]), or a real model cut to its first layers ([`cut_layers`]),
//! so a backend is measured at realistic sizes without downloading weights.
//!
//! **Shapes** ([`SynthShape`]): SmolLM2-135M (`smol`), Llama-3.2-1B (`1b`) and Llama-3.1-8B
//! (`8b`), with a synthetic byte-level BPE tokenizer (`vocab`) and chat template filling the
//! real vocabulary size, so `samewise engine serve` loads the model and answers with text.
//! The written context length is capped at [`MAX_CONTEXT`] (Llama 3's 131072 would only
//! size caches nobody fills in a throughput run), and Llama 3's RoPE frequency scaling is not
//! written (the engine's GGUF path does not read it).
//!
//! **Scales.** Flat logits would hide numeric differences in a parity check, so every tensor
//! kind gets the scale measured on the test model (SmolLM2-135M-Instruct, Q4_1, dequantized,
//! averaged over its 30 layers): a weight matrix's standard deviation is its measured
//! `std * sqrt(fan_in)` divided by `sqrt(fan_in)` of the shape written, and a norm weight is
//! its measured mean plus noise of its measured spread. A synthetic model's logits then
//! spread with a standard deviation of about 6 whatever its shape (final norm gain × embedding
//! gain), and the smol shape's next-token entropy on random ids is about 2.3 nats: peaked, far
//! from flat (ln 49152 = 10.8), if more so than the test model's (about 7 nats on random ids,
//! 4 on prose). The values are Irwin–Hall approximations of a normal (kurtosis 2.76, cut at 3.9
//! sigma), lighter-tailed than real weights (whose kurtosis is 4 to 8).
//!
//! **Determinism and speed.** A tensor's values are generated in chunks of [`CHUNK`]
//! elements; each chunk's generator is seeded from (seed, tensor name, chunk index), so the
//! file is the same bytes whatever the thread count. Chunks are generated and quantized on
//! `threads` scoped threads a window at a time, while the previous window is written: memory
//! stays at two windows plus each thread's chunk buffers (about 3 MiB per thread), never a
//! whole tensor.

mod cut;
mod quantize;
mod vocab;

use std::fs::File;
use std::io::BufWriter;
use std::ops::Range;
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{EngineError, Result};
use crate::gguf::{GgmlType, GgufValue};
use crate::gguf_write::{GgufWriter, TensorSpec};

pub use cut::cut_layers;
use quantize::quantize_into;
pub use quantize::quantize_row;

/// Largest context length written (Llama 3.x's own is 131072).
pub const MAX_CONTEXT: usize = 8192;
/// Elements per independently seeded chunk (a multiple of every block size).
const CHUNK: usize = 1 << 18;
/// Chunks each thread generates per window.
const CHUNKS_PER_THREAD: usize = 4;

/// `std * sqrt(fan_in)` of each weight matrix kind, measured on SmolLM2-135M-Instruct
/// (Q4_1 dequantized; mean over its 30 layers; fan_in is n_embd except for ffn_down's n_ff).
/// token_embd: 0.1356 * sqrt(576); its use as the tied output head is what sets the logits'
/// spread, so an untied `output.weight` gets the same.
const EMBED_GAIN: f32 = 3.25;
/// attn_q: rms 0.200 at fan_in 576.
const Q_GAIN: f32 = 4.80;
/// attn_k: rms 0.206.
const K_GAIN: f32 = 4.94;
/// attn_v: rms 0.189.
const V_GAIN: f32 = 4.54;
/// attn_output: rms 0.175.
const O_GAIN: f32 = 4.20;
/// ffn_gate: rms 0.188.
const GATE_GAIN: f32 = 4.50;
/// ffn_up: rms 0.199.
const UP_GAIN: f32 = 4.78;
/// ffn_down: rms 0.192 at fan_in 1536.
const DOWN_GAIN: f32 = 7.52;
/// attn_norm weights: mean and standard deviation (over elements, mean over layers).
const ATTN_NORM: (f32, f32) = (0.30, 0.085);
/// ffn_norm weights.
const FFN_NORM: (f32, f32) = (0.23, 0.056);
/// output_norm weights: the final norm's gain is what keeps the logits peaked.
const OUTPUT_NORM: (f32, f32) = (1.80, 0.29);

/// A real model's shape, written with random weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthShape {
    /// SmolLM2-135M: the test model's shape.
    Smol,
    /// Llama-3.2-1B.
    Llama1B,
    /// Llama-3.1-8B.
    Llama8B,
}

/// The hyper-parameters of a shape.
#[derive(Debug, Clone, Copy)]
struct Dims {
    /// The real model's name (written as `general.basename`).
    model: &'static str,
    /// Decoder layers.
    n_layer: usize,
    /// Hidden size.
    n_embd: usize,
    /// Query heads.
    n_head: usize,
    /// Key/value heads.
    n_head_kv: usize,
    /// Per-head dimension.
    head_dim: usize,
    /// Feed-forward hidden size.
    n_ff: usize,
    /// Vocabulary size.
    vocab: usize,
    /// Whether the output head is the embedding (no `output.weight`).
    tied: bool,
    /// RoPE base.
    rope_theta: f32,
    /// The real context length (capped at [`MAX_CONTEXT`] when written).
    n_ctx: usize,
}

impl SynthShape {
    /// The names [`SynthShape::parse`] accepts.
    pub const NAMES: [&'static str; 3] = ["smol", "1b", "8b"];

    /// Parses a shape name (`smol`, `1b`, `8b`).
    pub fn parse(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "smol" => Ok(Self::Smol),
            "1b" => Ok(Self::Llama1B),
            "8b" => Ok(Self::Llama8B),
            _ => Err(EngineError::InvalidRequest(format!(
                "unknown shape {name:?} (known: {})",
                Self::NAMES.join(", ")
            ))),
        }
    }

    /// The shape's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Smol => "smol",
            Self::Llama1B => "1b",
            Self::Llama8B => "8b",
        }
    }

    /// Layers of the real model.
    pub fn n_layer(self) -> usize {
        self.dims().n_layer
    }

    fn dims(self) -> Dims {
        match self {
            Self::Smol => Dims {
                model: "SmolLM2-135M",
                n_layer: 30,
                n_embd: 576,
                n_head: 9,
                n_head_kv: 3,
                head_dim: 64,
                n_ff: 1536,
                vocab: 49152,
                tied: true,
                rope_theta: 100_000.0,
                n_ctx: 8192,
            },
            Self::Llama1B => Dims {
                model: "Llama-3.2-1B",
                n_layer: 16,
                n_embd: 2048,
                n_head: 32,
                n_head_kv: 8,
                head_dim: 64,
                n_ff: 8192,
                vocab: 128_256,
                tied: true,
                rope_theta: 500_000.0,
                n_ctx: 131_072,
            },
            Self::Llama8B => Dims {
                model: "Llama-3.1-8B",
                n_layer: 32,
                n_embd: 4096,
                n_head: 32,
                n_head_kv: 8,
                head_dim: 128,
                n_ff: 14336,
                vocab: 128_256,
                tied: false,
                rope_theta: 500_000.0,
                n_ctx: 131_072,
            },
        }
    }
}

/// What [`synthesize`] writes.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Architecture (`general.architecture`): only `llama` is written.
    pub arch: String,
    /// The real model whose shape is written.
    pub shape: SynthShape,
    /// Seed of every random value.
    pub seed: u64,
    /// Type of the weight matrices (norm weights are always F32, as in real files).
    pub ggml_type: GgmlType,
    /// Write only the first this many layers (None: all of the shape's).
    pub layers: Option<usize>,
    /// Generator threads (0: one per CPU). The bytes do not depend on it.
    pub threads: usize,
}

impl SynthOptions {
    /// Llama weights of `shape` at Q4_1, seed 0, every layer, one thread per CPU.
    pub fn new(shape: SynthShape) -> Self {
        Self {
            arch: "llama".into(),
            shape,
            seed: 0,
            ggml_type: GgmlType::Q4_1,
            layers: None,
            threads: 0,
        }
    }

    /// The size in bytes of the file [`synthesize`] writes with these options.
    pub fn file_size(&self) -> Result<u64> {
        let (meta, plan) = self.plan()?;
        let specs: Vec<TensorSpec> = plan.into_iter().map(|p| p.spec).collect();
        let mut data = 0u64;
        for s in &specs {
            data += s.data_size()?.next_multiple_of(32) as u64;
        }
        let header = GgufWriter::new(std::io::sink(), Path::new("<memory>"), &meta, specs)?;
        Ok(header.position() + data)
    }

    /// The metadata and the tensors with their distributions.
    fn plan(&self) -> Result<(Metadata, Vec<Planned>)> {
        if self.arch != "llama" {
            return Err(EngineError::InvalidRequest(format!(
                "cannot synthesize architecture {:?}: only llama is written for now",
                self.arch
            )));
        }
        let file_type = match self.ggml_type {
            GgmlType::F32 => 0u32,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 7,
            GgmlType::BF16 => 32,
            other => {
                return Err(EngineError::InvalidRequest(format!(
                    "cannot write weights of type {} (known: {})",
                    other.name(),
                    WEIGHT_TYPES.join(", ")
                )));
            }
        };
        let d = self.shape.dims();
        let n_layer = match self.layers {
            None => d.n_layer,
            Some(n) if (1..=d.n_layer).contains(&n) => n,
            Some(n) => {
                return Err(EngineError::InvalidRequest(format!(
                    "--layers {n}: the {} shape has 1 to {} layers",
                    self.shape.name(),
                    d.n_layer
                )));
            }
        };
        let u = |v: usize| GgufValue::U32(v as u32);
        let s = |v: &str| GgufValue::String(v.to_owned());
        let mut meta: Metadata = [
            ("general.architecture", s("llama")),
            (
                "general.name",
                s(&format!(
                    "samewise synthetic {} seed {}",
                    d.model, self.seed
                )),
            ),
            ("general.basename", s(d.model)),
            ("general.file_type", GgufValue::U32(file_type)),
            ("general.quantization_version", u(2)),
            ("general.alignment", u(32)),
            ("samewise.synth.shape", s(self.shape.name())),
            ("samewise.synth.seed", GgufValue::U64(self.seed)),
            ("llama.block_count", u(n_layer)),
            ("llama.context_length", u(d.n_ctx.min(MAX_CONTEXT))),
            ("llama.embedding_length", u(d.n_embd)),
            ("llama.feed_forward_length", u(d.n_ff)),
            ("llama.attention.head_count", u(d.n_head)),
            ("llama.attention.head_count_kv", u(d.n_head_kv)),
            ("llama.attention.key_length", u(d.head_dim)),
            ("llama.attention.value_length", u(d.head_dim)),
            (
                "llama.attention.layer_norm_rms_epsilon",
                GgufValue::F32(1e-5),
            ),
            ("llama.rope.dimension_count", u(d.head_dim)),
            ("llama.rope.freq_base", GgufValue::F32(d.rope_theta)),
            ("llama.vocab_size", u(d.vocab)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        meta.extend(vocab::tokenizer_metadata(d.vocab)?);

        let ty = self.ggml_type;
        let matrix = |name: String, n_in: usize, n_out: usize, gain: f32| Planned {
            spec: TensorSpec::new(name, &[n_in, n_out], ty),
            mean: 0.0,
            std: gain / (n_in as f32).sqrt(),
        };
        let norm = |name: String, (mean, std): (f32, f32)| Planned {
            spec: TensorSpec::new(name, &[d.n_embd], GgmlType::F32),
            mean,
            std,
        };
        let (q_dim, kv_dim) = (d.n_head * d.head_dim, d.n_head_kv * d.head_dim);
        let mut plan = vec![matrix(
            "token_embd.weight".into(),
            d.n_embd,
            d.vocab,
            EMBED_GAIN,
        )];
        for i in 0..n_layer {
            let b = |t: &str| format!("blk.{i}.{t}.weight");
            plan.push(norm(b("attn_norm"), ATTN_NORM));
            plan.push(matrix(b("attn_q"), d.n_embd, q_dim, Q_GAIN));
            plan.push(matrix(b("attn_k"), d.n_embd, kv_dim, K_GAIN));
            plan.push(matrix(b("attn_v"), d.n_embd, kv_dim, V_GAIN));
            plan.push(matrix(b("attn_output"), q_dim, d.n_embd, O_GAIN));
            plan.push(norm(b("ffn_norm"), FFN_NORM));
            plan.push(matrix(b("ffn_gate"), d.n_embd, d.n_ff, GATE_GAIN));
            plan.push(matrix(b("ffn_up"), d.n_embd, d.n_ff, UP_GAIN));
            plan.push(matrix(b("ffn_down"), d.n_ff, d.n_embd, DOWN_GAIN));
        }
        plan.push(norm("output_norm.weight".into(), OUTPUT_NORM));
        if !d.tied {
            plan.push(matrix(
                "output.weight".into(),
                d.n_embd,
                d.vocab,
                EMBED_GAIN,
            ));
        }
        Ok((meta, plan))
    }
}

/// The weight types [`parse_weight_type`] accepts.
pub const WEIGHT_TYPES: [&str; 6] = ["q4_1", "q8_0", "q4_0", "f16", "bf16", "f32"];

/// Parses a weight type name (`q4_1`, `q8_0`, `q4_0`, `f16`, `bf16`, `f32`).
pub fn parse_weight_type(name: &str) -> Result<GgmlType> {
    match name.to_ascii_lowercase().as_str() {
        "q4_1" => Ok(GgmlType::Q4_1),
        "q8_0" => Ok(GgmlType::Q8_0),
        "q4_0" => Ok(GgmlType::Q4_0),
        "f16" => Ok(GgmlType::F16),
        "bf16" => Ok(GgmlType::BF16),
        "f32" => Ok(GgmlType::F32),
        _ => Err(EngineError::InvalidRequest(format!(
            "unknown weight type {name:?} (known: {})",
            WEIGHT_TYPES.join(", ")
        ))),
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct SynthReport {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Tensors written.
    pub tensors: usize,
    /// Decoder layers written (`<arch>.block_count`).
    pub n_layer: usize,
}

/// Metadata key/value pairs in file order.
type Metadata = Vec<(String, GgufValue)>;

/// One tensor to generate: values `mean + std * z`, z standard normal.
struct Planned {
    /// Name, shape and type.
    spec: TensorSpec,
    /// Mean of the values.
    mean: f32,
    /// Standard deviation of the values.
    std: f32,
}

/// Writes a synthetic model to `out` (through `out.partial`, renamed when complete, so an
/// interrupted run never leaves a file that looks whole).
pub fn synthesize(opts: &SynthOptions, out: &Path) -> Result<SynthReport> {
    let (meta, plan) = opts.plan()?;
    let n_layer = opts.layers.unwrap_or(opts.shape.n_layer());
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let specs: Vec<TensorSpec> = plan.iter().map(|p| p.spec.clone()).collect();
    let bytes = write_atomically(out, |file| {
        let mut w = GgufWriter::new(file, out, &meta, specs)?;
        let windows = plan.iter().flat_map(|p| {
            let n_chunks = p.spec.n_elements().div_ceil(CHUNK);
            let per = threads * CHUNKS_PER_THREAD;
            (0..n_chunks)
                .step_by(per)
                .map(move |c| (p, c..(c + per).min(n_chunks)))
        });
        // each window is generated while the one before it is written
        let mut pending: Option<Vec<u8>> = None;
        for (p, chunks) in windows {
            let w = &mut w;
            pending = Some(std::thread::scope(|s| {
                let writing = pending.take().map(|b| s.spawn(move || w.write_data(&b)));
                let generated = generate(p, opts.seed, chunks, threads);
                if let Some(h) = writing {
                    h.join().map_err(|_| panicked())??;
                }
                generated
            })?);
        }
        if let Some(b) = pending {
            w.write_data(&b)?;
        }
        w.finish().map(drop)
    })?;
    Ok(SynthReport {
        path: out.to_path_buf(),
        bytes,
        tensors: plan.len(),
        n_layer,
    })
}

/// The bytes of chunks `chunks` of a tensor, generated and quantized on `threads` threads.
fn generate(p: &Planned, seed: u64, chunks: Range<usize>, threads: usize) -> Result<Vec<u8>> {
    let ty = p.spec.ggml_type;
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let n = p.spec.n_elements();
    let start = chunks.start * CHUNK;
    let end = (chunks.end * CHUNK).min(n);
    let mut buf = vec![0u8; (end - start) / bs * ts];
    let mut jobs: Vec<(usize, &mut [u8])> = chunks.zip(buf.chunks_mut(CHUNK / bs * ts)).collect();
    let per_thread = jobs.len().div_ceil(threads.max(1));
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .chunks_mut(per_thread)
            .map(|part| {
                s.spawn(move || -> Result<()> {
                    let (mut raw, mut values) = (vec![0u64; CHUNK], vec![0f32; CHUNK]);
                    for (chunk, out) in part.iter_mut() {
                        let len = out.len() / ts * bs;
                        let (raw, values) = (&mut raw[..len], &mut values[..len]);
                        StdRng::seed_from_u64(chunk_seed(seed, &p.spec.name, *chunk)).fill(raw);
                        for (v, &x) in values.iter_mut().zip(raw.iter()) {
                            *v = p.mean + p.std * normal(x);
                        }
                        quantize_into(ty, values, out)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| panicked())??;
        }
        Ok::<_, EngineError>(())
    })?;
    Ok(buf)
}

/// The seed of one chunk's generator: (seed, tensor name, chunk index) mixed by FNV-1a and
/// SplitMix64's finaliser.
fn chunk_seed(seed: u64, name: &str, chunk: usize) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let name_hash = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    });
    mix(mix(mix(seed) ^ name_hash) ^ chunk as u64)
}

/// An approximately standard normal value from 64 random bits: the Irwin–Hall sum of five
/// 12-bit uniforms, centred and scaled. Integer arithmetic and one f32 multiply, so the same
/// on every platform (no libm); tails are cut at sqrt(15), about 3.9 sigma.
fn normal(x: u64) -> f32 {
    /// Twice the mean of the sum of five uniforms on 0..=4095 (the mean is a half).
    const TWICE_MEAN: i32 = 5 * 4095;
    /// 1 / twice its standard deviation, 2 * sqrt(5 * (4096^2 - 1) / 12).
    const INV_TWICE_SD: f32 = 1.0 / 5_287.914;
    let lane = |i: u32| (x >> (12 * i)) as i32 & 0xFFF;
    // twice the centred sum is an integer below 2^15: exact in f32
    let twice = 2 * (lane(0) + lane(1) + lane(2) + lane(3) + lane(4)) - TWICE_MEAN;
    twice as f32 * INV_TWICE_SD
}

fn panicked() -> EngineError {
    EngineError::InvalidRequest("a synthesis thread panicked".into())
}

/// Runs `write` on a fresh `out.partial`, then renames it to `out`; removes it on failure.
/// Returns the file's size. Errors name `out`.
fn write_atomically(out: &Path, write: impl FnOnce(BufWriter<File>) -> Result<()>) -> Result<u64> {
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let file = File::create(&partial).map_err(|source| EngineError::Write {
        path: out.to_path_buf(),
        source,
    })?;
    let result = write(BufWriter::with_capacity(1 << 20, file)).and_then(|()| {
        std::fs::rename(&partial, out).map_err(|source| EngineError::Write {
            path: out.to_path_buf(),
            source,
        })?;
        std::fs::metadata(out)
            .map(|m| m.len())
            .map_err(|source| EngineError::Write {
                path: out.to_path_buf(),
                source,
            })
    });
    if result.is_err() {
        // best effort: the error that matters is the one being returned
        let _ = std::fs::remove_file(&partial);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    #[test]
    fn normal_values_have_unit_spread() {
        let mut rng = StdRng::seed_from_u64(1);
        let v: Vec<f64> = (0..200_000)
            .map(|_| f64::from(normal(rng.next_u64())))
            .collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var.sqrt() - 1.0).abs() < 0.01, "sd {}", var.sqrt());
    }

    #[test]
    fn chunk_seeds_differ_by_every_input() {
        let s = chunk_seed(1, "a", 0);
        assert_ne!(s, chunk_seed(2, "a", 0));
        assert_ne!(s, chunk_seed(1, "b", 0));
        assert_ne!(s, chunk_seed(1, "a", 1));
        assert_eq!(s, chunk_seed(1, "a", 0));
    }
}
