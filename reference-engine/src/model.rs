//! Model weights in kernel layout, loaded from a GGUF file or an HF directory.
//!
//! Internally RoPE is rotate-half (the HF convention). GGUF files of the llama family store
//! Q/K rows permuted for ggml's interleaved RoPE, so those rows are un-permuted at load:
//! both forms of the same weights then give the same numbers. q/k/v are packed as one
//! fused matrix and gate/up as another; fusing changes no result (each output column is
//! its own dot product).

use crate::config::{Arch, ModelConfig};
use crate::error::{EngineError, Result};
use crate::gguf::{GgmlType, GgufFile};
use crate::hf::HfDir;
use crate::kernels::{Linear, RowSource};
use crate::profile::{Numerics, TensorSet, WeightQuant};
use crate::quant;

/// One decoder layer.
#[derive(Debug)]
pub struct Layer {
    /// RMSNorm weight before attention.
    pub attn_norm: Vec<f32>,
    /// Fused `[q; k; v]` projection, rows in rotate-half order.
    pub qkv: Linear,
    /// Fused q/k/v bias (qwen2).
    pub qkv_bias: Option<Vec<f32>>,
    /// Per-head RMSNorm weights for q and k (qwen3).
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// Attention output projection.
    pub wo: Linear,
    /// RMSNorm weight before the MLP.
    pub ffn_norm: Vec<f32>,
    /// Fused `[gate; up]` projection.
    pub gate_up: Linear,
    /// MLP down projection.
    pub down: Linear,
}

/// All weights.
#[derive(Debug)]
pub struct Weights {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Token embeddings, `[vocab][n_embd]` (also the output head when tied).
    pub embed: Linear,
    /// Output head; None when tied to `embed`.
    pub output: Option<Linear>,
    /// Final RMSNorm weight.
    pub output_norm: Vec<f32>,
    /// Decoder layers.
    pub layers: Vec<Layer>,
    /// RoPE inverse frequency per pair.
    pub inv_freq: Vec<f32>,
    /// The serving profile's numeric knobs (weights were re-quantized at load with them;
    /// the forward pass applies the activation and KV-cache ones).
    pub numerics: Numerics,
}

impl Weights {
    /// The output head.
    pub fn head(&self) -> &Linear {
        self.output.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes held by the packed weights.
    pub fn bytes(&self) -> usize {
        let mut b = self.embed.bytes() + self.output.as_ref().map_or(0, Linear::bytes);
        for l in &self.layers {
            b += l.qkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes();
        }
        b
    }
}

/// Which tensor, independent of the file format.
#[derive(Clone, Copy)]
enum T {
    Embed,
    Output,
    OutputNorm,
    AttnNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    O,
    FfnNorm,
    Gate,
    Up,
    Down,
}

/// Maps a row index of the rotate-half layout to the interleaved (GGUF llama) layout.
fn unpermute(r: usize, head_dim: usize) -> usize {
    let (h, rr) = (r / head_dim, r % head_dim);
    let half = head_dim / 2;
    h * head_dim + 2 * (rr % half) + rr / half
}

/// A weight source: GGUF or HF.
enum Src<'a> {
    Gguf(&'a GgufFile),
    Hf(&'a HfDir),
}

/// A loaded 2-D tensor ready to hand rows out.
enum Mat<'a> {
    Gguf {
        bytes: &'a [u8],
        ty: GgmlType,
        row_bytes: usize,
    },
    F32(Vec<f32>),
}

impl Src<'_> {
    fn name(&self, t: T, layer: usize) -> String {
        match self {
            Src::Gguf(_) => {
                let s = match t {
                    T::Embed => return "token_embd.weight".into(),
                    T::Output => return "output.weight".into(),
                    T::OutputNorm => return "output_norm.weight".into(),
                    T::AttnNorm => "attn_norm.weight",
                    T::Q => "attn_q.weight",
                    T::K => "attn_k.weight",
                    T::V => "attn_v.weight",
                    T::QBias => "attn_q.bias",
                    T::KBias => "attn_k.bias",
                    T::VBias => "attn_v.bias",
                    T::QNorm => "attn_q_norm.weight",
                    T::KNorm => "attn_k_norm.weight",
                    T::O => "attn_output.weight",
                    T::FfnNorm => "ffn_norm.weight",
                    T::Gate => "ffn_gate.weight",
                    T::Up => "ffn_up.weight",
                    T::Down => "ffn_down.weight",
                };
                format!("blk.{layer}.{s}")
            }
            Src::Hf(_) => {
                let s = match t {
                    T::Embed => return "model.embed_tokens.weight".into(),
                    T::Output => return "lm_head.weight".into(),
                    T::OutputNorm => return "model.norm.weight".into(),
                    T::AttnNorm => "input_layernorm.weight",
                    T::Q => "self_attn.q_proj.weight",
                    T::K => "self_attn.k_proj.weight",
                    T::V => "self_attn.v_proj.weight",
                    T::QBias => "self_attn.q_proj.bias",
                    T::KBias => "self_attn.k_proj.bias",
                    T::VBias => "self_attn.v_proj.bias",
                    T::QNorm => "self_attn.q_norm.weight",
                    T::KNorm => "self_attn.k_norm.weight",
                    T::O => "self_attn.o_proj.weight",
                    T::FfnNorm => "post_attention_layernorm.weight",
                    T::Gate => "mlp.gate_proj.weight",
                    T::Up => "mlp.up_proj.weight",
                    T::Down => "mlp.down_proj.weight",
                };
                format!("model.layers.{layer}.{s}")
            }
        }
    }

    fn has(&self, t: T, layer: usize) -> bool {
        let n = self.name(t, layer);
        match self {
            Src::Gguf(g) => g.tensor(&n).is_some(),
            Src::Hf(h) => h.has(&n),
        }
    }

    /// A 1-D tensor of `len` values.
    fn vector(&self, t: T, layer: usize, len: usize) -> Result<Vec<f32>> {
        let name = self.name(t, layer);
        let v = match self {
            Src::Gguf(g) => {
                let info = g
                    .tensor(&name)
                    .ok_or_else(|| EngineError::MissingTensor(name.clone()))?;
                check_type(&name, info.ggml_type)?;
                quant::dequantize_row(info.ggml_type, g.tensor_bytes(info), info.n_elements())?
            }
            Src::Hf(h) => h.tensor_f32(&name)?,
        };
        if v.len() != len {
            return Err(EngineError::ShapeMismatch {
                tensor: name,
                actual: vec![v.len()],
                expected: vec![len],
            });
        }
        Ok(v)
    }

    /// A 2-D tensor `[n][k]` (rows of k).
    fn matrix(&self, t: T, layer: usize, n: usize, k: usize) -> Result<(Mat<'_>, Option<usize>)> {
        let name = self.name(t, layer);
        match self {
            Src::Gguf(g) => {
                let info = g
                    .tensor(&name)
                    .ok_or_else(|| EngineError::MissingTensor(name.clone()))?;
                if info.dims != [k, n] {
                    return Err(EngineError::ShapeMismatch {
                        tensor: name,
                        actual: info.dims.clone(),
                        expected: vec![k, n],
                    });
                }
                check_type(&name, info.ggml_type)?;
                let ty = info.ggml_type;
                let group = match ty {
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => None,
                    GgmlType::Q6K => Some(16),
                    _ => Some(32),
                };
                let row_bytes = k / ty.block_size() * ty.type_size();
                Ok((
                    Mat::Gguf {
                        bytes: g.tensor_bytes(info),
                        ty,
                        row_bytes,
                    },
                    group,
                ))
            }
            Src::Hf(h) => {
                let shape = h.shape(&name)?;
                if shape != [n, k] {
                    return Err(EngineError::ShapeMismatch {
                        tensor: name,
                        actual: shape.to_vec(),
                        expected: vec![n, k],
                    });
                }
                Ok((Mat::F32(h.tensor_f32(&name)?), None))
            }
        }
    }
}

fn check_type(name: &str, ty: GgmlType) -> Result<()> {
    if quant::is_supported(ty) {
        Ok(())
    } else {
        Err(EngineError::UnsupportedTensorType {
            tensor: name.into(),
            type_name: ty.name().into(),
        })
    }
}

impl Mat<'_> {
    /// Row `i` (length k), as f32 when `as_f32`, else decomposed.
    fn row(&self, i: usize, k: usize, as_f32: bool) -> Result<RowSource> {
        match self {
            Mat::F32(v) => Ok(RowSource::F32(v[i * k..(i + 1) * k].to_vec())),
            Mat::Gguf {
                bytes,
                ty,
                row_bytes,
            } => {
                let b = &bytes[i * row_bytes..(i + 1) * row_bytes];
                if as_f32 || matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                    Ok(RowSource::F32(quant::dequantize_row(*ty, b, k)?))
                } else {
                    Ok(RowSource::Quant(quant::decompose_row(*ty, b, k)?))
                }
            }
        }
    }
}

/// Common storage for several stacked matrices: f32 if any is float, else the finest group.
fn common_group(groups: &[Option<usize>]) -> Option<usize> {
    let mut g = usize::MAX;
    for x in groups {
        g = g.min((*x)?);
    }
    Some(g)
}

/// Packs matrices stacked along n. `perm[j]` = Some(head_dim) un-permutes part j's rows.
/// With `requant`, every row is re-quantized along k (the input dimension, which the row
/// permutation does not mix) and stored as its integer codes, or as f32 when they do not fit.
fn stack(
    parts: &[(Mat<'_>, Option<usize>, usize, Option<usize>)],
    k: usize,
    requant: Option<WeightQuant>,
) -> Result<Linear> {
    if let Some(q) = requant {
        return stack_requantized(parts, k, q);
    }
    let n: usize = parts.iter().map(|p| p.2).sum();
    let groups: Vec<Option<usize>> = parts.iter().map(|p| p.1).collect();
    let group = common_group(&groups);
    Linear::pack(n, k, group, &mut |mut i| {
        for (mat, _, rows, perm) in parts {
            if i < *rows {
                let src = perm.map_or(i, |hd| unpermute(i, hd));
                return mat.row(src, k, group.is_none());
            }
            i -= rows;
        }
        Err(EngineError::corrupt("row index past the stacked matrix"))
    })
}

/// [`stack`] with every row re-quantized by `q`.
fn stack_requantized(
    parts: &[(Mat<'_>, Option<usize>, usize, Option<usize>)],
    k: usize,
    q: WeightQuant,
) -> Result<Linear> {
    let n: usize = parts.iter().map(|p| p.2).sum();
    let as_codes = q.codes(&vec![0f32; k]).is_some();
    // the kernels store scales per 32 values; a coarser group repeats its scale
    let group = as_codes.then_some(32);
    Linear::pack(n, k, group, &mut |mut i| {
        for (mat, _, rows, perm) in parts {
            if i < *rows {
                let src = perm.map_or(i, |hd| unpermute(i, hd));
                let RowSource::F32(mut v) = mat.row(src, k, true)? else {
                    return Err(EngineError::corrupt("expected an f32 row"));
                };
                return Ok(match q.codes(&v) {
                    Some(c) if as_codes => RowSource::Quant(quant::Decomposed {
                        group: q.group_size,
                        q: c.q,
                        scale: c.scale,
                        offset: c.offset,
                    }),
                    _ => {
                        q.apply(&mut v);
                        RowSource::F32(v)
                    }
                });
            }
            i -= rows;
        }
        Err(EngineError::corrupt("row index past the stacked matrix"))
    })
}

impl Weights {
    /// Loads from an open GGUF file.
    pub fn from_gguf(g: &GgufFile, numerics: &Numerics) -> Result<Self> {
        let config = ModelConfig::from_gguf(g)?;
        let mut w = Self::load(&Src::Gguf(g), config, numerics)?;
        if let Some(info) = g.tensor("rope_freqs.weight") {
            let f = quant::dequantize_row(info.ggml_type, g.tensor_bytes(info), info.n_elements())?;
            if f.len() != w.inv_freq.len() {
                return Err(EngineError::corrupt(
                    "rope_freqs.weight has the wrong length",
                ));
            }
            for (x, d) in w.inv_freq.iter_mut().zip(f) {
                *x /= d;
            }
        }
        Ok(w)
    }

    /// Loads from an open HF directory.
    pub fn from_hf(h: &HfDir, numerics: &Numerics) -> Result<Self> {
        let config = ModelConfig::from_hf(&h.config)?;
        Self::load(&Src::Hf(h), config, numerics)
    }

    fn load(src: &Src<'_>, config: ModelConfig, numerics: &Numerics) -> Result<Self> {
        let (qa, qm, qe) = (
            numerics.weight_quant(TensorSet::Attention),
            numerics.weight_quant(TensorSet::Mlp),
            numerics.weight_quant(TensorSet::Embeddings),
        );
        let c = &config;
        let (e, hd) = (c.n_embd, c.head_dim);
        let permute = matches!(src, Src::Gguf(_)) && c.arch.gguf_qk_permuted();
        let perm = permute.then_some(hd);
        let (qd, kvd) = (c.n_head * hd, c.n_head_kv * hd);
        let (emb, eg) = src.matrix(T::Embed, 0, c.vocab_size, e)?;
        let embed = stack(&[(emb, eg, c.vocab_size, None)], e, qe)?;
        let output = if src.has(T::Output, 0) {
            let (m, g) = src.matrix(T::Output, 0, c.vocab_size, e)?;
            Some(stack(&[(m, g, c.vocab_size, None)], e, qe)?)
        } else {
            None
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for l in 0..c.n_layer {
            let (q, qg) = src.matrix(T::Q, l, qd, e)?;
            let (k, kg) = src.matrix(T::K, l, kvd, e)?;
            let (v, vg) = src.matrix(T::V, l, kvd, e)?;
            let qkv = stack(
                &[(q, qg, qd, perm), (k, kg, kvd, perm), (v, vg, kvd, None)],
                e,
                qa,
            )?;
            let qkv_bias = if src.has(T::QBias, l) {
                let q = src.vector(T::QBias, l, qd)?;
                let k = src.vector(T::KBias, l, kvd)?;
                let v = src.vector(T::VBias, l, kvd)?;
                let un = |b: Vec<f32>| -> Vec<f32> {
                    match perm {
                        Some(hd) => (0..b.len()).map(|i| b[unpermute(i, hd)]).collect(),
                        None => b,
                    }
                };
                Some([un(q), un(k), v].concat())
            } else if c.arch == Arch::Qwen2 {
                return Err(EngineError::MissingTensor(src.name(T::QBias, l)));
            } else {
                None
            };
            let qk_norm = if c.arch == Arch::Qwen3 {
                Some((src.vector(T::QNorm, l, hd)?, src.vector(T::KNorm, l, hd)?))
            } else {
                None
            };
            let (o, og) = src.matrix(T::O, l, e, qd)?;
            let (gm, gg) = src.matrix(T::Gate, l, c.n_ff, e)?;
            let (um, ug) = src.matrix(T::Up, l, c.n_ff, e)?;
            let (dm, dg) = src.matrix(T::Down, l, e, c.n_ff)?;
            layers.push(Layer {
                attn_norm: src.vector(T::AttnNorm, l, e)?,
                qkv,
                qkv_bias,
                qk_norm,
                wo: stack(&[(o, og, e, None)], qd, qa)?,
                ffn_norm: src.vector(T::FfnNorm, l, e)?,
                gate_up: stack(&[(gm, gg, c.n_ff, None), (um, ug, c.n_ff, None)], e, qm)?,
                down: stack(&[(dm, dg, e, None)], c.n_ff, qm)?,
            });
        }
        let output_norm = src.vector(T::OutputNorm, 0, e)?;
        let inv_freq = config.inv_freq();
        Ok(Self {
            config,
            embed,
            output,
            output_norm,
            layers,
            inv_freq,
            numerics: numerics.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::unpermute;

    #[test]
    fn unpermute_inverts_the_gguf_permutation() {
        // the converter's permute: HF row (h, j, i) goes to GGUF row (h, i, j)
        let hd = 8;
        let half = hd / 2;
        for h in 0..3 {
            for j in 0..2 {
                for i in 0..half {
                    let hf = h * hd + j * half + i;
                    let gguf = h * hd + 2 * i + j;
                    assert_eq!(unpermute(hf, hd), gguf);
                }
            }
        }
    }
}
