//! ggml block dequantization, exactly as ggml's `dequantize_row_*` define it.
//!
//! Two views of a quantized row: [`dequantize_row`] gives the f32 values, and
//! [`decompose_row`] gives the same values as small integers with a per-group f32 scale
//! and offset (`value = q * scale + offset`, a separate multiply then add, as ggml does),
//! which is how the kernels keep weights compact and dequantize on the fly. Both views
//! produce bit-identical values; the tests check that against hand-computed blocks.

#![allow(clippy::needless_range_loop)] // index loops mirror the reference C code and the lanes

use half::{bf16, f16};

use crate::error::{EngineError, Result};
use crate::gguf::GgmlType;

/// A row as integers plus per-group scale and offset.
#[derive(Debug, Clone, PartialEq)]
pub struct Decomposed {
    /// Elements per group (16 or 32).
    pub group: usize,
    /// One integer per element.
    pub q: Vec<i8>,
    /// One scale per group.
    pub scale: Vec<f32>,
    /// One offset per group; None when every offset is exactly zero (no add is done).
    pub offset: Option<Vec<f32>>,
}

impl Decomposed {
    /// The f32 value of element `i` (what [`dequantize_row`] computes a group at a time).
    #[cfg(test)]
    pub fn value(&self, i: usize) -> f32 {
        let g = i / self.group;
        let v = f32::from(self.q[i]) * self.scale[g];
        match &self.offset {
            Some(o) => v + o[g],
            None => v,
        }
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn check(ty: GgmlType, bytes: &[u8], n: usize) -> Result<usize> {
    let bs = ty.block_size();
    if !n.is_multiple_of(bs) || bytes.len() != n / bs * ty.type_size() {
        return Err(EngineError::corrupt(format!(
            "{} row of {n} elements needs {} bytes, got {}",
            ty.name(),
            n / bs * ty.type_size(),
            bytes.len()
        )));
    }
    Ok(n / bs)
}

fn unsupported(ty: GgmlType) -> EngineError {
    EngineError::UnsupportedTensorType {
        tensor: String::new(),
        type_name: ty.name().into(),
    }
}

/// True if this engine can dequantize `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
    )
}

/// ggml's `get_scale_min_k4`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes `n` elements of type `ty` from `bytes` into f32, as ggml does.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    match ty {
        GgmlType::F32 => {
            check(ty, bytes, n)?;
            Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        }
        GgmlType::F16 => {
            check(ty, bytes, n)?;
            Ok(bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect())
        }
        GgmlType::BF16 => {
            check(ty, bytes, n)?;
            Ok(bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect())
        }
        _ => {
            // Decomposed::value of every element, a group at a time
            let d = decompose_row(ty, bytes, n)?;
            let mut out = Vec::with_capacity(n);
            for (g, q) in d.q.chunks(d.group).enumerate() {
                let s = d.scale[g];
                match &d.offset {
                    Some(o) => out.extend(q.iter().map(|&v| f32::from(v) * s + o[g])),
                    None => out.extend(q.iter().map(|&v| f32::from(v) * s)),
                }
            }
            Ok(out)
        }
    }
}

/// Splits a quantized row into integers and per-group scale/offset such that
/// `q * scale + offset` (or `q * scale` when there is no offset) is exactly ggml's value.
/// Float types are not decomposable and give an error.
pub fn decompose_row(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Decomposed> {
    let nb = check(ty, bytes, n)?;
    let ts = ty.type_size();
    let mut q = Vec::with_capacity(n);
    let mut scale = Vec::new();
    let mut offset = Vec::new();
    let mut has_offset = false;
    let group;
    match ty {
        GgmlType::Q8_0 => {
            group = 32;
            for b in bytes.chunks_exact(ts) {
                scale.push(f16_at(b, 0));
                offset.push(0.0);
                q.extend(b[2..34].iter().map(|&v| v as i8));
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            group = 32;
            let (hdr, bias) = if ty == GgmlType::Q4_0 {
                (2, 8i8)
            } else {
                (4, 0i8)
            };
            for b in bytes.chunks_exact(ts) {
                scale.push(f16_at(b, 0));
                if ty == GgmlType::Q4_1 {
                    offset.push(f16_at(b, 2));
                    has_offset = true;
                } else {
                    offset.push(0.0);
                }
                let qs = &b[hdr..hdr + 16];
                q.extend(qs.iter().map(|&v| (v & 0xF) as i8 - bias));
                q.extend(qs.iter().map(|&v| (v >> 4) as i8 - bias));
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            group = 32;
            has_offset = true;
            for b in bytes.chunks_exact(ts) {
                let d = f16_at(b, 0);
                let dmin = f16_at(b, 2);
                let scales = &b[4..16];
                let (qh, mut ql) = if ty == GgmlType::Q5K {
                    (Some(&b[16..48]), &b[48..176])
                } else {
                    (None, &b[16..144])
                };
                let (mut u1, mut u2) = (1u8, 2u8);
                for j in 0..4 {
                    for half in 0..2 {
                        let (sc, m) = scale_min_k4(2 * j + half, scales);
                        scale.push(d * f32::from(sc));
                        // ggml computes `d1 * q - m1`; `+ (-m1)` is the same operation
                        offset.push(-(dmin * f32::from(m)));
                        let u = if half == 0 { u1 } else { u2 };
                        for l in 0..32 {
                            let lo = if half == 0 { ql[l] & 0xF } else { ql[l] >> 4 };
                            let hi = match qh {
                                Some(h) if h[l] & u != 0 => 16,
                                _ => 0,
                            };
                            q.push((lo + hi) as i8);
                        }
                    }
                    ql = &ql[32..];
                    u1 <<= 2;
                    u2 <<= 2;
                }
            }
        }
        GgmlType::Q6K => {
            group = 16;
            for b in bytes.chunks_exact(ts) {
                let d = f16_at(b, 208);
                let mut base = q.len();
                q.resize(base + 256, 0);
                for n128 in 0..2 {
                    let ql = &b[n128 * 64..n128 * 64 + 64];
                    let qh = &b[128 + n128 * 32..128 + n128 * 32 + 32];
                    let sc = &b[192 + n128 * 8..192 + n128 * 8 + 8];
                    for l in 0..32 {
                        q[base + l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                        q[base + l + 32] =
                            ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                        q[base + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                        q[base + l + 96] =
                            ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                    }
                    for &s in sc {
                        scale.push(d * f32::from(s as i8));
                        offset.push(0.0);
                    }
                    base += 128;
                }
            }
        }
        _ => return Err(unsupported(ty)),
    }
    debug_assert_eq!(q.len(), n);
    debug_assert_eq!(scale.len(), nb * ty.block_size() / group);
    Ok(Decomposed {
        group,
        q,
        scale,
        offset: has_offset.then_some(offset),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q4_1_is_q_times_d_plus_m() {
        let (d, m) = (0.1f32, -0.7f32);
        let mut b = Vec::new();
        b.extend(h(d));
        b.extend(h(m));
        b.extend((0..16u8).map(|j| (j & 0xF) | ((15 - j) << 4)));
        let y = dequantize_row(GgmlType::Q4_1, &b, 32).unwrap();
        let (d, m) = (f16::from_f32(d).to_f32(), f16::from_f32(m).to_f32());
        for j in 0..16 {
            assert_eq!(y[j].to_bits(), (j as f32 * d + m).to_bits());
            assert_eq!(y[j + 16].to_bits(), ((15 - j) as f32 * d + m).to_bits());
        }
    }

    #[test]
    fn q4_0_subtracts_eight() {
        let mut b = Vec::new();
        b.extend(h(0.25));
        b.extend((0..16u8).map(|j| j | (3 << 4)));
        let y = dequantize_row(GgmlType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.25);
            assert_eq!(y[j + 16], -5.0 * 0.25);
        }
    }

    #[test]
    fn q8_0_is_q_times_d() {
        let mut b = Vec::new();
        b.extend(h(0.5));
        b.extend((0..32i8).map(|j| (j - 16) as u8));
        let y = dequantize_row(GgmlType::Q8_0, &b, 32).unwrap();
        for j in 0..32 {
            assert_eq!(y[j], (j as f32 - 16.0) * 0.5);
        }
    }

    fn k_scales() -> [u8; 12] {
        // sub-block scales 1..8 and mins 9..16, packed as get_scale_min_k4 reads them
        let sc: [u8; 8] = [1, 2, 3, 4, 50, 60, 7, 8];
        let mn: [u8; 8] = [9, 10, 11, 12, 33, 14, 63, 16];
        let mut s = [0u8; 12];
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
        }
        s
    }

    #[test]
    fn q4_k_and_q5_k_follow_ggml() {
        let sc: [u8; 8] = [1, 2, 3, 4, 50, 60, 7, 8];
        let mn: [u8; 8] = [9, 10, 11, 12, 33, 14, 63, 16];
        for five in [false, true] {
            let (d, dmin) = (f16::from_f32(0.01).to_f32(), f16::from_f32(0.02).to_f32());
            let mut b = Vec::new();
            b.extend(h(d));
            b.extend(h(dmin));
            b.extend(k_scales());
            let qh: Vec<u8> = (0..32u8).map(|l| l.wrapping_mul(37)).collect();
            if five {
                b.extend(&qh);
            }
            let qs: Vec<u8> = (0..128u32).map(|i| (i * 7 + 3) as u8).collect();
            b.extend(&qs);
            let ty = if five { GgmlType::Q5K } else { GgmlType::Q4K };
            let y = dequantize_row(ty, &b, 256).unwrap();
            for i in 0..256 {
                let sub = i / 32; // sub-block 0..8
                let chunk = sub / 2;
                let l = i % 32;
                let byte = qs[chunk * 32 + l];
                let mut qv = if sub % 2 == 0 { byte & 0xF } else { byte >> 4 } as u32;
                if five && qh[l] & (1 << sub) != 0 {
                    qv += 16;
                }
                let d1 = d * sc[sub] as f32;
                let m1 = dmin * mn[sub] as f32;
                assert_eq!(
                    y[i].to_bits(),
                    (d1 * qv as f32 - m1).to_bits(),
                    "{ty:?} element {i}"
                );
            }
        }
    }

    #[test]
    fn q6_k_follows_ggml() {
        let ql: Vec<u8> = (0..128u32).map(|i| (i * 13 + 5) as u8).collect();
        let qh: Vec<u8> = (0..64u32).map(|i| (i * 29 + 1) as u8).collect();
        let sc: Vec<i8> = (0..16).map(|i| i as i8 * 3 - 20).collect();
        let d = f16::from_f32(0.003).to_f32();
        let mut b = Vec::new();
        b.extend(&ql);
        b.extend(&qh);
        b.extend(sc.iter().map(|&s| s as u8));
        b.extend(h(d));
        let y = dequantize_row(GgmlType::Q6K, &b, 256).unwrap();
        for i in 0..256 {
            // element i: half n = i/128, r = i%128, quarter k = r/32, l = r%32
            let (n, r) = (i / 128, i % 128);
            let (k, l) = (r / 32, r % 32);
            let qlb = ql[n * 64 + l + if k % 2 == 1 { 32 } else { 0 }];
            let low = if k < 2 { qlb & 0xF } else { qlb >> 4 };
            let high = (qh[n * 32 + l] >> (2 * k)) & 3;
            let q = (low | (high << 4)) as i32 - 32;
            let s = sc[n * 8 + r / 16] as f32;
            assert_eq!(y[i].to_bits(), (d * s * q as f32).to_bits(), "element {i}");
        }
    }

    #[test]
    fn dequantize_row_is_every_decomposed_value() {
        let types = [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
        ];
        let mut seed = 9u64;
        for ty in types {
            let n = 2 * ty.block_size();
            let bytes: Vec<u8> = (0..2 * ty.type_size())
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // scales stay finite: no f16 exponent of all ones
                    ((seed >> 33) as u8) & 0x7B
                })
                .collect();
            let d = decompose_row(ty, &bytes, n).unwrap();
            let want: Vec<u32> = (0..n).map(|i| d.value(i).to_bits()).collect();
            let got: Vec<u32> = dequantize_row(ty, &bytes, n)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            assert_eq!(got, want, "{ty:?}");
        }
    }

    #[test]
    fn float_types_and_bad_lengths() {
        let b: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            dequantize_row(GgmlType::F32, &b, 2).unwrap(),
            vec![1.5, -2.0]
        );
        let b: Vec<u8> = [h(0.5), h(-3.0)].concat();
        assert_eq!(
            dequantize_row(GgmlType::F16, &b, 2).unwrap(),
            vec![0.5, -3.0]
        );
        let b: Vec<u8> = [
            bf16::from_f32(1.25).to_le_bytes(),
            bf16::from_f32(-4.0).to_le_bytes(),
        ]
        .concat();
        assert_eq!(
            dequantize_row(GgmlType::BF16, &b, 2).unwrap(),
            vec![1.25, -4.0]
        );
        assert!(dequantize_row(GgmlType::Q4_1, &[0u8; 19], 32).is_err());
        assert!(dequantize_row(GgmlType::Q2K, &[0u8; 84], 256).is_err());
    }
}
