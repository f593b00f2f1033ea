//! The numeric part of a serving profile as the forward pass sees it: which tensor sets are
//! re-quantized at load, whether every matmul input is quantized to 8 bits, and how the KV
//! cache stores keys and values.
//!
//! Every knob acts per row and per value (a weight row along its input dimension, an
//! activation row in 32-value blocks, one key/value head vector), never across rows of a
//! batch, so a profiled engine stays deterministic and batch-invariant. The default
//! (`Numerics::is_exact`) changes nothing and costs nothing: the forward pass checks one
//! flag and runs the plain kernels.

use super::requant::{KvDtype, WeightQuant, quantize_activations_q8};
use super::{Profile, TensorSet, WeightsSection};

/// The numeric knobs the engine applies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Numerics {
    /// Weight re-quantization at load (None: the reference weights).
    pub weights: Option<WeightsSection>,
    /// Quantize every matmul input to 8 bits per 32-value block along the input dimension.
    pub activations_q8: bool,
    /// KV-cache storage format (each key/value head vector is rounded when written).
    pub kv: KvDtype,
}

impl Numerics {
    /// The numeric knobs of `profile` (its behavioural sections are the server's business).
    pub fn from_profile(profile: &Profile) -> Self {
        Self {
            weights: profile.weights.clone(),
            activations_q8: profile.activations.is_some(),
            kv: profile.kv_cache.as_ref().map_or(KvDtype::F32, |k| k.dtype),
        }
    }

    /// True when nothing is changed: the plain engine (what the tests below hold the
    /// default to).
    #[cfg(test)]
    pub fn is_exact(&self) -> bool {
        self.weights.is_none() && !self.activations_q8 && self.kv == KvDtype::F32
    }

    /// The re-quantization of tensor set `set`, if the profile re-quantizes it.
    pub fn weight_quant(&self, set: TensorSet) -> Option<WeightQuant> {
        self.weights
            .as_ref()
            .filter(|w| w.tensors.contains(&set))
            .map(|w| w.quant)
    }

    /// Applies the activation knob to the input of a matmul: `m` rows of `k` values, each
    /// row quantized on its own in 32-value blocks. A no-op without the knob.
    pub fn quantize_inputs(&self, x: &mut [f32], m: usize, k: usize) {
        if !self.activations_q8 || k == 0 {
            return;
        }
        for row in x.chunks_mut(k).take(m) {
            quantize_activations_q8(row);
        }
    }

    /// Whether keys and values are rounded when written to the cache.
    pub fn rounds_kv(&self) -> bool {
        self.kv != KvDtype::F32
    }

    /// Rounds a row of concatenated head vectors (each `head_dim` long) as the cache would
    /// store them, each head on its own.
    pub fn round_kv(&self, heads: &mut [f32], head_dim: usize) {
        if !self.rounds_kv() || head_dim == 0 {
            return;
        }
        for head in heads.chunks_mut(head_dim) {
            self.kv.apply(head);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_profile_is_exact_and_others_are_not() {
        assert!(Numerics::from_profile(&Profile::default()).is_exact());
        for name in ["reference", "truncate-512", "flaky", "shifted-echo"] {
            assert!(
                Numerics::from_profile(&Profile::builtin(name).unwrap()).is_exact(),
                "{name}"
            );
        }
        for name in ["w8", "w4", "w2", "a8", "kv-f16", "kv-q8"] {
            assert!(
                !Numerics::from_profile(&Profile::builtin(name).unwrap()).is_exact(),
                "{name}"
            );
        }
        let w4 = Numerics::from_profile(&Profile::builtin("w4").unwrap());
        assert_eq!(w4.weight_quant(TensorSet::Mlp).map(|q| q.bits), Some(4));
    }

    #[test]
    fn activation_rows_are_quantized_independently() {
        let k = 64;
        let rows: Vec<f32> = (0..3 * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 * (1 + i / k) as f32)
            .collect();
        let n = Numerics {
            activations_q8: true,
            ..Numerics::default()
        };
        let mut all = rows.clone();
        n.quantize_inputs(&mut all, 3, k);
        for r in 0..3 {
            let mut one = rows[r * k..(r + 1) * k].to_vec();
            n.quantize_inputs(&mut one, 1, k);
            assert_eq!(one, all[r * k..(r + 1) * k]);
        }
        assert_ne!(all, rows);
    }

    #[test]
    fn kv_heads_are_rounded_independently() {
        let hd = 64;
        let row: Vec<f32> = (0..3 * hd)
            .map(|i| (i as f32 * 0.37).sin() * (1 + i / hd) as f32)
            .collect();
        let n = Numerics {
            kv: KvDtype::Q8,
            ..Numerics::default()
        };
        let mut all = row.clone();
        n.round_kv(&mut all, hd);
        let mut second = row[hd..2 * hd].to_vec();
        KvDtype::Q8.apply(&mut second);
        assert_eq!(second, all[hd..2 * hd]);
        let mut same = row.clone();
        Numerics::default().round_kv(&mut same, hd);
        assert_eq!(same, row);
    }
}
