//! The model's hyper-parameters, read from GGUF metadata (`<arch>.*` keys) or from a
//! Hugging Face `config.json`, validated once so the forward pass can trust them.

use serde::Serialize;

use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;

/// The decoder families this engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Llama 1/2/3, SmolLM2.
    Llama,
    /// Mistral (a Llama with its own name).
    Mistral,
    /// Qwen2 / Qwen2.5: biases on q/k/v.
    Qwen2,
    /// Qwen3: RMSNorm on q and k per head.
    Qwen3,
}

impl Arch {
    /// Parses a GGUF `general.architecture` or HF `model_type`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Self::Llama),
            "mistral" => Ok(Self::Mistral),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            other => Err(EngineError::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// The name as GGUF writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }

    /// Whether GGUF converters permute this family's Q/K rows for interleaved RoPE.
    pub fn gguf_qk_permuted(self) -> bool {
        matches!(self, Self::Llama | Self::Mistral)
    }
}

/// Llama-3 style RoPE frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RopeScaling {
    /// `factor`.
    pub factor: f32,
    /// `low_freq_factor`.
    pub low_freq_factor: f32,
    /// `high_freq_factor`.
    pub high_freq_factor: f32,
    /// `original_max_position_embeddings`.
    pub original_context: f32,
}

/// Model hyper-parameters and special tokens.
#[derive(Debug, Clone, Serialize)]
pub struct ModelConfig {
    /// Architecture family.
    pub arch: Arch,
    /// Decoder layers.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Feed-forward hidden size.
    pub n_ff: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Context window (maximum sequence length).
    pub n_ctx: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// Llama-3 RoPE scaling, if the model uses it.
    pub rope_scaling: Option<RopeScaling>,
    /// Beginning-of-sequence token, if the model names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens, if the model names them.
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Reads the configuration from GGUF metadata. `vocab_size` comes from the embedding.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch_name = g
            .get_str("general.architecture")
            .ok_or_else(|| EngineError::MissingMetadata("general.architecture".into()))?;
        let arch = Arch::parse(arch_name)?;
        let a = arch_name;
        let req = |key: &str| {
            g.get_usize(&format!("{a}.{key}"))
                .ok_or_else(|| EngineError::MissingMetadata(format!("{a}.{key}")))
        };
        let n_embd = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = g
            .get_usize(&format!("{a}.attention.head_count_kv"))
            .unwrap_or(n_head);
        let head_dim = match g.get_usize(&format!("{a}.attention.key_length")) {
            Some(d) => d,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        let vocab_size = g
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| EngineError::MissingTensor("token_embd.weight".into()))?;
        // end of sequence, plus Llama 3's end-of-turn / end-of-message when present
        let mut eos: Vec<u32> = [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ]
        .iter()
        .filter_map(|k| g.get_u32(k))
        .collect();
        eos.dedup();
        let cfg = Self {
            arch,
            n_layer: req("block_count")?,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: req("feed_forward_length")?,
            vocab_size,
            // sliding-window attention is not implemented: cap the context at the window, where
            // full attention is the same computation
            n_ctx: match g.get_usize(&format!("{a}.attention.sliding_window")) {
                Some(w) if w > 0 => req("context_length")?.min(w),
                _ => req("context_length")?,
            },
            rms_eps: g
                .get_f32(&format!("{a}.attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            rope_theta: g
                .get_f32(&format!("{a}.rope.freq_base"))
                .unwrap_or(10_000.0),
            rope_scaling: None,
            bos_token_id: g.get_u32("tokenizer.ggml.bos_token_id"),
            eos_token_ids: eos,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads the configuration from a Hugging Face `config.json` value.
    pub fn from_hf(v: &serde_json::Value) -> Result<Self> {
        let bad = |k: &str| EngineError::InvalidHf(format!("config.json: missing or invalid {k}"));
        let get = |k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_u64)
                .and_then(|x| usize::try_from(x).ok())
        };
        let req = |k: &str| get(k).ok_or_else(|| bad(k));
        let model_type = v
            .get("model_type")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| bad("model_type"))?;
        let arch = Arch::parse(model_type)?;
        let n_embd = req("hidden_size")?;
        let n_head = req("num_attention_heads")?;
        let head_dim = match get("head_dim") {
            Some(d) => d,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
        let ids = |k: &str| -> Vec<u32> {
            match v.get(k) {
                Some(serde_json::Value::Array(a)) => a
                    .iter()
                    .filter_map(serde_json::Value::as_u64)
                    .filter_map(|x| u32::try_from(x).ok())
                    .collect(),
                Some(x) => x
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .into_iter()
                    .collect(),
                None => Vec::new(),
            }
        };
        // transformers 4 writes rope_theta + rope_scaling; transformers 5 writes rope_parameters
        let rope = match v.get("rope_parameters") {
            Some(p) if p.is_object() => Some(p),
            _ => v.get("rope_scaling").filter(|s| s.is_object()),
        };
        let rope_type = rope
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(serde_json::Value::as_str);
        let rope_scaling = match (rope, rope_type) {
            (Some(s), Some("llama3")) => {
                let g = |k: &str| {
                    s.get(k)
                        .and_then(serde_json::Value::as_f64)
                        .map(|x| x as f32)
                        .ok_or_else(|| bad(k))
                };
                Some(RopeScaling {
                    factor: g("factor")?,
                    low_freq_factor: g("low_freq_factor")?,
                    high_freq_factor: g("high_freq_factor")?,
                    original_context: g("original_max_position_embeddings")?,
                })
            }
            (_, None | Some("default")) => None,
            (_, Some(other)) => {
                return Err(EngineError::InvalidHf(format!(
                    "unsupported rope type {other:?}"
                )));
            }
        };
        let rope_theta = f("rope_theta")
            .or_else(|| {
                rope.and_then(|r| r.get("rope_theta"))
                    .and_then(serde_json::Value::as_f64)
            })
            .map_or(10_000.0, |x| x as f32);
        let cfg = Self {
            arch,
            n_layer: req("num_hidden_layers")?,
            n_embd,
            n_head,
            n_head_kv: get("num_key_value_heads").unwrap_or(n_head),
            head_dim,
            n_ff: req("intermediate_size")?,
            vocab_size: req("vocab_size")?,
            // sliding-window attention is not implemented: cap the context at the window
            n_ctx: match (
                get("sliding_window"),
                v.get("use_sliding_window")
                    .and_then(serde_json::Value::as_bool),
            ) {
                (Some(w), None | Some(true)) if w > 0 => req("max_position_embeddings")?.min(w),
                _ => req("max_position_embeddings")?,
            },
            rms_eps: f("rms_norm_eps").map_or(1e-6, |x| x as f32),
            rope_theta,
            rope_scaling,
            bos_token_id: ids("bos_token_id").first().copied(),
            eos_token_ids: ids("eos_token_id"),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(EngineError::corrupt(what));
        if self.n_layer == 0 || self.n_layer > 1024 {
            return bad(format!("{} layers", self.n_layer));
        }
        if self.n_head == 0 || self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "{} heads with {} kv heads",
                self.n_head, self.n_head_kv
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > 1024 {
            return bad(format!("head dimension {}", self.head_dim));
        }
        if self.n_embd == 0 || self.n_embd > 1 << 16 || self.n_ff == 0 || self.n_ff > 1 << 18 {
            return bad(format!(
                "hidden size {} / ffn size {}",
                self.n_embd, self.n_ff
            ));
        }
        if self.vocab_size == 0 || self.vocab_size > 1 << 24 {
            return bad(format!("vocabulary of {}", self.vocab_size));
        }
        if self.n_ctx == 0 {
            return bad("context length 0".into());
        }
        if !(self.rms_eps.is_finite()
            && self.rms_eps > 0.0
            && self.rope_theta.is_finite()
            && self.rope_theta > 0.0)
        {
            return bad("rms epsilon / rope theta".into());
        }
        Ok(())
    }

    /// Width of the fused q/k/v projection.
    pub fn qkv_dim(&self) -> usize {
        (self.n_head + 2 * self.n_head_kv) * self.head_dim
    }

    /// RoPE inverse frequencies (one per pair), as HF computes them in f32, with Llama-3
    /// scaling applied when configured.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        (0..d / 2)
            .map(|i| {
                let e = (2 * i) as f32 / d as f32;
                let f = (1.0 / f64::from(self.rope_theta).powf(f64::from(e))) as f32;
                match self.rope_scaling {
                    None => f,
                    Some(s) => {
                        let low_wl = s.original_context / s.low_freq_factor;
                        let high_wl = s.original_context / s.high_freq_factor;
                        let wl = 2.0 * std::f32::consts::PI / f;
                        if wl < high_wl {
                            f
                        } else if wl > low_wl {
                            f / s.factor
                        } else {
                            let smooth = (s.original_context / wl - s.low_freq_factor)
                                / (s.high_freq_factor - s.low_freq_factor);
                            (1.0 - smooth) * f / s.factor + smooth * f
                        }
                    }
                }
            })
            .collect()
    }
}
