//! ggml block quantization, the inverse of `quant`'s dequantization: f32 values to the bytes
//! of an F32, F16, BF16, Q8_0, Q4_0 or Q4_1 tensor, computed as ggml's reference quantizers
//! (`quantize_row_*_ref`) compute them, so a file written here holds what llama.cpp's own
//! quantizer would write from the same values.
//!
//! Per block of 32: Q8_0 stores `d = amax / 127` (f16) and `round(x / d)`; Q4_0 stores
//! `d = max / -8` (the signed value of largest magnitude) and `min(15, trunc(x / d + 8.5))`;
//! Q4_1 stores `d = (max - min) / 15` and `m = min` (both f16) and
//! `min(15, trunc((x - min) / d + 0.5))`. The codes are computed from the f32 `d` and `min`,
//! before their rounding to f16, as ggml does.

use half::{bf16, f16};

use crate::error::{EngineError, Result};
use crate::gguf::GgmlType;

/// Quantizes one row (or any run of whole blocks) of `values` to `ty`'s bytes.
/// Non-finite values and types without a quantizer here are errors.
pub fn quantize_row(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>> {
    let bs = ty.block_size();
    let mut out = vec![0u8; values.len() / bs * ty.type_size()];
    quantize_into(ty, values, &mut out)?;
    Ok(out)
}

/// [`quantize_row`] into `out`, which must be exactly the bytes of `values`.
pub(crate) fn quantize_into(ty: GgmlType, values: &[f32], out: &mut [u8]) -> Result<()> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if !values.len().is_multiple_of(bs) || out.len() != values.len() / bs * ts {
        return Err(EngineError::InvalidRequest(format!(
            "{} values are not whole {} blocks of {bs} filling {} bytes",
            values.len(),
            ty.name(),
            out.len()
        )));
    }
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(EngineError::InvalidRequest(format!(
            "value {i} to quantize is {}",
            values[i]
        )));
    }
    let blocks = values.chunks_exact(bs).zip(out.chunks_exact_mut(ts));
    match ty {
        GgmlType::F32 => blocks.for_each(|(v, o)| o.copy_from_slice(&v[0].to_le_bytes())),
        GgmlType::F16 => {
            blocks.for_each(|(v, o)| o.copy_from_slice(&f16::from_f32(v[0]).to_le_bytes()))
        }
        GgmlType::BF16 => {
            blocks.for_each(|(v, o)| o.copy_from_slice(&bf16::from_f32(v[0]).to_le_bytes()))
        }
        GgmlType::Q8_0 => blocks.for_each(|(v, o)| q8_0(v, o)),
        GgmlType::Q4_0 => blocks.for_each(|(v, o)| q4_0(v, o)),
        GgmlType::Q4_1 => blocks.for_each(|(v, o)| q4_1(v, o)),
        other => {
            return Err(EngineError::UnsupportedTensorType {
                tensor: String::new(),
                type_name: format!(
                    "{} (no quantizer: use q4_0, q4_1, q8_0, f16, bf16 or f32)",
                    other.name()
                ),
            });
        }
    }
    Ok(())
}

/// The inverse of `d ? 1/d : 0`, as ggml writes it.
fn inv(d: f32) -> f32 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

/// The smallest and largest of a block's finite values, as a scan with `<` and `>` finds
/// them (eight lanes at a time, which gives the same values).
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([f32::MAX; 8], [-f32::MAX; 8]);
    for c in x.chunks_exact(8) {
        for i in 0..8 {
            lo[i] = if c[i] < lo[i] { c[i] } else { lo[i] };
            hi[i] = if c[i] > hi[i] { c[i] } else { hi[i] };
        }
    }
    let lo = lo.iter().fold(f32::MAX, |m, &v| if v < m { v } else { m });
    let hi = hi.iter().fold(-f32::MAX, |m, &v| if v > m { v } else { m });
    (lo, hi)
}

/// Packs 32 4-bit codes as ggml does: element j in the low nibble of byte j, element 16 + j
/// in its high nibble.
fn pack_nibbles(codes: &[u8; 32], out: &mut [u8]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = codes[j] | (codes[16 + j] << 4);
    }
}

fn q8_0(x: &[f32], out: &mut [u8]) {
    let (lo, hi) = min_max(x);
    let amax = (-lo).max(hi).max(0.0);
    let d = amax / 127.0;
    let id = inv(d);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    // |x * id| <= 127 (up to rounding, which `as` saturates), round half away from zero
    for (o, v) in out[2..].iter_mut().zip(x) {
        *o = ((v * id).round() as i8) as u8;
    }
}

fn q4_0(x: &[f32], out: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = inv(d);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let mut codes = [0u8; 32];
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = ((v * id + 8.5) as i32).min(15) as u8;
    }
    pack_nibbles(&codes, &mut out[2..]);
}

fn q4_1(x: &[f32], out: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    out[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
    let mut codes = [0u8; 32];
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = (((v - min) * id + 0.5) as i32).min(15) as u8;
    }
    pack_nibbles(&codes, &mut out[4..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    /// Values of several magnitudes and signs, with a constant block and a zero block.
    fn values() -> Vec<f32> {
        let mut s = 12345u64;
        let mut v: Vec<f32> = (0..32 * 30)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5;
                u * [0.01f32, 1.0, 300.0][i / 320] + [0.0f32, 0.3, -2.0][(i / 32) % 3]
            })
            .collect();
        v.extend([0.7f32; 32]);
        v.extend([0f32; 32]);
        v
    }

    #[test]
    fn quantized_values_dequantize_within_the_format_bound() -> Result<()> {
        let x = values();
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
        ] {
            let bytes = quantize_row(ty, &x)?;
            assert_eq!(bytes.len(), x.len() / ty.block_size() * ty.type_size());
            let y = dequantize_row(ty, &bytes, x.len())?;
            for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let (lo, hi) = xb
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
                let amax = lo.abs().max(hi.abs());
                for (i, (&a, &b2)) in xb.iter().zip(yb).enumerate() {
                    // the step of the block, plus the f16 rounding of its scale and offset
                    let bound = match ty {
                        GgmlType::F32 => 0.0,
                        GgmlType::F16 => a.abs() / 2048.0,
                        GgmlType::BF16 => a.abs() / 256.0,
                        GgmlType::Q8_0 => amax / 127.0 * (0.5 + 127.0 / 2048.0),
                        // the value opposite the largest one's sign clamps: a whole step
                        GgmlType::Q4_0 => amax / 8.0 * (1.0 + 16.0 / 2048.0),
                        _ => (hi - lo) / 15.0 * (0.5 + 15.0 / 2048.0) + lo.abs() / 2048.0,
                    };
                    assert!(
                        (a - b2).abs() <= bound * 1.0001 + 1e-30,
                        "{ty:?} block {b} element {i}: {a} came back {b2} (bound {bound})"
                    );
                }
            }
            // a zero block comes back exactly, a constant one to its f16 scale's rounding
            let n = x.len();
            assert!(y[n - 32..].iter().all(|&v| v == 0.0), "{ty:?} zero block");
            if ty != GgmlType::BF16 {
                let c = &y[n - 64..n - 32];
                assert!(
                    c.iter().all(|&v| (v - 0.7).abs() < 1e-3),
                    "{ty:?} constant block {c:?}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn q4_1_matches_ggml_on_a_hand_computed_block() -> Result<()> {
        // min -1, max 2: d = 0.2, codes (x + 1) / 0.2 rounded
        let x: Vec<f32> = (0..32).map(|j| -1.0 + (j % 16) as f32 * 0.2).collect();
        let b = quantize_row(GgmlType::Q4_1, &x)?;
        assert_eq!(&b[0..2], &f16::from_f32(0.2).to_le_bytes());
        assert_eq!(&b[2..4], &f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16u8 {
            assert_eq!(b[4 + usize::from(j)], j | (j << 4), "byte {j}");
        }
        Ok(())
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(quantize_row(GgmlType::Q4_1, &[0.0; 31]).is_err());
        assert!(quantize_row(GgmlType::Q8_0, &[f32::NAN; 32]).is_err());
        assert!(quantize_row(GgmlType::F16, &[f32::INFINITY]).is_err());
        assert!(quantize_row(GgmlType::Q4K, &[0.0; 256]).is_err());
    }
}
