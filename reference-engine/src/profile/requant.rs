//! The numerical faults a serving profile can inject, as pure functions over f32 rows:
//! weight re-quantization (round-to-nearest, group-wise, 2 to 8 bits), 8-bit activation
//! quantization per 32-value block, and KV-cache storage rounding (f16, bf16, 8-bit).
//!
//! Each function maps a row of reference values to the values a provider using that
//! number format would compute with ("fake quantization": quantize, then dequantize in
//! f32). The forward pass stays the exact f32 pass; only its inputs change, so a profile's
//! drift is the drift of the number format alone.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// How weights are re-quantized (round-to-nearest, one scale per group of consecutive
/// values along a row, i.e. along the reduction dimension, as GGUF blocks are).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightQuant {
    /// Bits per weight: 2, 3, 4, 5, 6 or 8.
    pub bits: u8,
    /// Values per group sharing one scale: 32, 64 or 128.
    #[serde(default = "default_group")]
    pub group_size: usize,
    /// Symmetric (ggml's `Q*_0` style: scale only, the value of largest magnitude maps to
    /// `-2^(bits-1)`) or asymmetric (`Q*_1` style: scale and minimum, `2^bits` levels from
    /// the group's minimum to its maximum).
    #[serde(default = "default_true")]
    pub symmetric: bool,
}

fn default_group() -> usize {
    32
}

fn default_true() -> bool {
    true
}

impl WeightQuant {
    /// Whether the parameters are in the supported ranges; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !matches!(self.bits, 2..=6 | 8) {
            return Err(format!(
                "weights.bits must be 2, 3, 4, 5, 6 or 8, not {}",
                self.bits
            ));
        }
        if !matches!(self.group_size, 32 | 64 | 128) {
            return Err(format!(
                "weights.group_size must be 32, 64 or 128, not {}",
                self.group_size
            ));
        }
        Ok(())
    }

    /// Re-quantizes one row in place. A trailing partial group gets its own scale.
    pub fn apply(&self, row: &mut [f32]) {
        for group in row.chunks_mut(self.group_size.max(1)) {
            if self.symmetric {
                quantize_symmetric(group, self.bits);
            } else {
                quantize_asymmetric(group, self.bits);
            }
        }
    }

    /// The same re-quantization as [`WeightQuant::apply`], as integer codes with one scale
    /// (and, asymmetric, one offset) per group: value `q * scale` (`+ offset`), bit for bit
    /// what `apply` writes. None when the codes do not fit in an `i8` (asymmetric 8-bit) or
    /// the row is not a whole number of groups; the caller then keeps f32 values.
    ///
    /// One pass per group and no allocation but the result's: the scale comes from the same
    /// `symmetric_params` / `asymmetric_params` as `apply`'s, and each code is
    /// `code`, the exact `clamp(round(v))` without a libm call (this runs once per weight
    /// and level when `samewise calibrate` loads its engines).
    pub fn codes(&self, row: &[f32]) -> Option<Codes> {
        let g = self.group_size.max(1);
        if (!self.symmetric && self.bits >= 8) || !row.len().is_multiple_of(g) {
            return None;
        }
        let groups = row.len() / g;
        let mut q = vec![0i8; row.len()];
        let mut scale = vec![0f32; groups];
        let mut offsets = vec![0f32; if self.symmetric { 0 } else { groups }];
        self.fill_codes_fastest(row, &mut q, &mut scale, &mut offsets);
        Some(Codes {
            q,
            scale,
            offset: (!self.symmetric).then_some(offsets),
        })
    }

    /// [`WeightQuant::fill_codes`] compiled for the widest vectors this CPU has.
    fn fill_codes_fastest(
        &self,
        row: &[f32],
        q: &mut [i8],
        scale: &mut [f32],
        offsets: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F.
                return unsafe { self.fill_codes_avx512(row, q, scale, offsets) };
            }
            if std::arch::is_x86_feature_detected!("avx") {
                // SAFETY: the CPU supports AVX.
                return unsafe { self.fill_codes_avx(row, q, scale, offsets) };
            }
        }
        self.fill_codes(row, q, scale, offsets);
    }

    /// [`WeightQuant::fill_codes`] compiled for AVX-512F (plain f32 operations: the same bits).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn fill_codes_avx512(
        &self,
        row: &[f32],
        q: &mut [i8],
        scale: &mut [f32],
        offsets: &mut [f32],
    ) {
        self.fill_codes(row, q, scale, offsets);
    }

    /// [`WeightQuant::fill_codes`] compiled for AVX (256-bit; plain f32 operations: the same
    /// bits).
    ///
    /// # Safety
    /// The CPU must support AVX.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    unsafe fn fill_codes_avx(
        &self,
        row: &[f32],
        q: &mut [i8],
        scale: &mut [f32],
        offsets: &mut [f32],
    ) {
        self.fill_codes(row, q, scale, offsets);
    }

    /// The body of [`WeightQuant::codes`]: a whole number of groups into zeroed outputs.
    #[inline(always)]
    fn fill_codes(&self, row: &[f32], q: &mut [i8], scale: &mut [f32], offsets: &mut [f32]) {
        let g = self.group_size.max(1);
        for (i, (group, out)) in row.chunks(g).zip(q.chunks_mut(g)).enumerate() {
            if self.symmetric {
                if let Some((d, qmin, qmax)) = symmetric_params(group, self.bits) {
                    let id = 1.0 / d;
                    for (o, &x) in out.iter_mut().zip(group) {
                        *o = code(x * id, qmin, qmax);
                    }
                    scale[i] = d;
                }
            } else {
                let (d, min) = asymmetric_params(group, self.bits);
                offsets[i] = min;
                if d != 0.0 && d.is_finite() {
                    let (id, levels) = (1.0 / d, ((1u32 << self.bits) - 1) as f32);
                    for (o, &x) in out.iter_mut().zip(group) {
                        *o = code((x - min) * id, 0.0, levels);
                    }
                    scale[i] = d;
                }
            }
        }
    }
}

/// One row re-quantized as integers: `value[i] = q[i] * scale[i / group]` (`+ offset[i / group]`
/// when `offset` is Some).
#[derive(Debug, Clone, PartialEq)]
pub struct Codes {
    /// One integer per value.
    pub q: Vec<i8>,
    /// One scale per group (0 for a degenerate group).
    pub scale: Vec<f32>,
    /// One offset per group (the group minimum), asymmetric only.
    pub offset: Option<Vec<f32>>,
}

/// `v.round().clamp(qmin, qmax) as i8` for integer bounds within the `i8` range, exactly (NaN
/// gives 0 as that does), without `round`, which is a libm call on baseline x86-64: clamping
/// first gives the same integer (the bounds are integers), and on the clamped value a
/// truncation and the exact fraction `c - trunc(c)` give round-half-away-from-zero.
#[inline]
fn code(v: f32, qmin: f32, qmax: f32) -> i8 {
    let c = v.clamp(qmin, qmax);
    let t = c as i32;
    let frac = c - t as f32;
    (t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)) as i8
}

/// The scale and code range of a symmetric group ([`quantize_symmetric`]); None for a
/// degenerate group (every value then 0).
#[inline(always)]
fn symmetric_params(group: &[f32], bits: u8) -> Option<(f32, f32, f32)> {
    let half_levels = (1i32 << (bits - 1)) as f32;
    let amax = abs_max(group);
    let (d, qmin, qmax) = if bits == 8 {
        (amax / 127.0, -127.0, 127.0)
    } else {
        // the first value of largest magnitude, sign kept (what
        // `fold(0, |m, x| if |x| > |m| { x } else { m })` gives: NaN never wins, +0 if none)
        let max = if amax == 0.0 {
            0.0
        } else {
            group
                .iter()
                .copied()
                .find(|x| x.abs() == amax)
                .unwrap_or(0.0)
        };
        (max / -half_levels, -half_levels, half_levels - 1.0)
    };
    (d != 0.0 && d.is_finite()).then_some((d, qmin, qmax))
}

/// The largest `|x|` of a group (NaN ignored, 0 when there is none), taken in 16 lanes so
/// that it vectorizes: a maximum of magnitudes does not depend on the order it is taken in.
#[inline(always)]
fn abs_max(group: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut blocks = group.chunks_exact(16);
    for b in &mut blocks {
        for (l, &x) in lanes.iter_mut().zip(b) {
            *l = l.max(x.abs());
        }
    }
    for &x in blocks.remainder() {
        lanes[0] = lanes[0].max(x.abs());
    }
    lanes.iter().fold(0f32, |m, &l| m.max(l))
}

/// The scale and minimum of an asymmetric group ([`quantize_asymmetric`]); the scale is 0 or
/// not finite for a degenerate group (every value then the minimum).
#[inline(always)]
fn asymmetric_params(group: &[f32], bits: u8) -> (f32, f32) {
    let levels = ((1u32 << bits) - 1) as f32;
    let (min, max) = group
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    ((max - min) / levels, min)
}

/// ggml's symmetric scheme generalised to `bits`: `d = max / -2^(bits-1)` where `max` is the
/// value of largest magnitude (sign kept), `q = clamp(round(x / d), -2^(bits-1), 2^(bits-1)-1)`,
/// value `q * d`. (For 4 bits this is exactly `Q4_0`'s rounding; 8 bits uses `Q8_0`'s
/// `d = amax / 127` instead, as ggml does.)
fn quantize_symmetric(group: &mut [f32], bits: u8) {
    let Some((d, qmin, qmax)) = symmetric_params(group, bits) else {
        group.iter_mut().for_each(|x| *x = 0.0);
        return;
    };
    let id = 1.0 / d;
    for x in group.iter_mut() {
        let q = (*x * id).round().clamp(qmin, qmax);
        *x = q * d;
    }
}

/// ggml's asymmetric scheme generalised to `bits`: `d = (max - min) / (2^bits - 1)`,
/// `q = clamp(round((x - min) / d), 0, 2^bits - 1)`, value `q * d + min`.
fn quantize_asymmetric(group: &mut [f32], bits: u8) {
    let levels = ((1u32 << bits) - 1) as f32;
    let (d, min) = asymmetric_params(group, bits);
    if d == 0.0 || !d.is_finite() {
        group.iter_mut().for_each(|x| *x = min);
        return;
    }
    let id = 1.0 / d;
    for x in group.iter_mut() {
        let q = ((*x - min) * id).round().clamp(0.0, levels);
        *x = q * d + min;
    }
}

/// Quantizes activations the way llama.cpp's CPU kernels do before a quantized matmul:
/// blocks of 32 values along the row, `d = amax / 127`, `q = round(x / d)`, value `q * d`
/// (`Q8_0`). Applied to every matmul input under the `activations` knob.
pub fn quantize_activations_q8(row: &mut [f32]) {
    for block in row.chunks_mut(32) {
        quantize_symmetric(block, 8);
    }
}

/// How the KV cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// Exact (the reference).
    #[default]
    F32,
    /// IEEE half precision, round to nearest even.
    F16,
    /// bfloat16, round to nearest even.
    Bf16,
    /// 8 bits per value with one f32 scale per 32 values along the head dimension (`Q8_0`).
    Q8,
}

impl KvDtype {
    /// Rounds one head vector (or any row) to what the cache would give back.
    pub fn apply(self, row: &mut [f32]) {
        match self {
            KvDtype::F32 => {}
            KvDtype::F16 => row.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
            KvDtype::Bf16 => row
                .iter_mut()
                .for_each(|x| *x = bf16::from_f32(*x).to_f32()),
            KvDtype::Q8 => quantize_activations_q8(row),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg_row(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    }

    fn rmse(a: &[f32], b: &[f32]) -> f64 {
        (a.iter()
            .zip(b)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum::<f64>()
            / a.len() as f64)
            .sqrt()
    }

    #[test]
    fn error_falls_as_bits_rise_for_both_schemes() {
        let orig = lcg_row(4096, 7);
        for symmetric in [true, false] {
            let errs: Vec<f64> = [2u8, 3, 4, 5, 6, 8]
                .iter()
                .map(|&bits| {
                    let mut r = orig.clone();
                    WeightQuant {
                        bits,
                        group_size: 32,
                        symmetric,
                    }
                    .apply(&mut r);
                    rmse(&orig, &r)
                })
                .collect();
            assert!(
                errs.windows(2).all(|w| w[0] > w[1]),
                "symmetric={symmetric}: {errs:?}"
            );
            assert!(errs[5] > 0.0);
        }
    }

    #[test]
    fn values_land_on_the_grid_and_error_is_at_most_half_a_step() {
        let orig = lcg_row(256, 3);
        let mut r = orig.clone();
        let q = WeightQuant {
            bits: 4,
            group_size: 64,
            symmetric: false,
        };
        q.apply(&mut r);
        for (g, gr) in orig.chunks(64).zip(r.chunks(64)) {
            let (lo, hi) = g
                .iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            let d = (hi - lo) / 15.0;
            let mut levels: Vec<i64> = gr.iter().map(|&x| ((x - lo) / d).round() as i64).collect();
            levels.sort_unstable();
            levels.dedup();
            assert!(levels.len() <= 16 && levels.iter().all(|l| (0..=15).contains(l)));
            for (x, y) in g.iter().zip(gr) {
                assert!((x - y).abs() <= d * 0.5 + 1e-6, "{x} -> {y}, step {d}");
            }
        }
    }

    #[test]
    fn symmetric_4_bit_matches_q4_0_rounding() {
        // ggml quantize_row_q4_0: d = max / -8, q = min(15, (int)(x/d + 8.5)) - 8.
        let orig = lcg_row(32, 11);
        let max = orig
            .iter()
            .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
        let d = max / -8.0;
        let expected: Vec<f32> = orig
            .iter()
            .map(|&x| (((x / d + 8.5) as i32).min(15) - 8) as f32 * d)
            .collect();
        let mut r = orig.clone();
        WeightQuant {
            bits: 4,
            group_size: 32,
            symmetric: true,
        }
        .apply(&mut r);
        for (a, b) in r.iter().zip(&expected) {
            assert!((a - b).abs() <= d.abs() * 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn degenerate_groups_do_not_produce_nan() {
        for symmetric in [true, false] {
            let mut zeros = vec![0f32; 40];
            WeightQuant {
                bits: 3,
                group_size: 32,
                symmetric,
            }
            .apply(&mut zeros);
            assert!(zeros.iter().all(|x| *x == 0.0));
            let mut flat = vec![0.25f32; 33];
            WeightQuant {
                bits: 2,
                group_size: 32,
                symmetric,
            }
            .apply(&mut flat);
            assert!(flat.iter().all(|x| x.is_finite()));
        }
    }

    #[test]
    fn activation_and_kv_rounding() {
        let orig = lcg_row(100, 5);
        let mut a = orig.clone();
        quantize_activations_q8(&mut a);
        for (blk, qb) in orig.chunks(32).zip(a.chunks(32)) {
            let d = blk.iter().fold(0f32, |m, &x| m.max(x.abs())) / 127.0;
            for (x, y) in blk.iter().zip(qb) {
                assert!((x - y).abs() <= d * 0.5 + 1e-7);
            }
        }
        assert_ne!(a, orig);
        let mut f = orig.clone();
        KvDtype::F32.apply(&mut f);
        assert_eq!(f, orig);
        for dt in [KvDtype::F16, KvDtype::Bf16, KvDtype::Q8] {
            let mut r = orig.clone();
            dt.apply(&mut r);
            assert_ne!(r, orig, "{dt:?}");
            assert!(rmse(&orig, &r) < 1e-2);
        }
    }

    /// Every setting the code tests sweep: both schemes, 2–8 bits, groups of 32, 64 and 128.
    fn every_quant() -> impl Iterator<Item = WeightQuant> {
        [true, false].into_iter().flat_map(|symmetric| {
            [2u8, 3, 4, 5, 6, 8].into_iter().flat_map(move |bits| {
                [32, 64, 128]
                    .into_iter()
                    .map(move |group_size| WeightQuant {
                        bits,
                        group_size,
                        symmetric,
                    })
            })
        })
    }

    #[test]
    fn codes_give_exactly_the_applied_values() {
        let orig = lcg_row(256, 13);
        for q in every_quant() {
            let (bits, symmetric) = (q.bits, q.symmetric);
            let mut applied = orig.clone();
            q.apply(&mut applied);
            let Some(c) = q.codes(&orig) else {
                assert!(!symmetric && bits == 8);
                continue;
            };
            for (i, &a) in applied.iter().enumerate() {
                let g = i / q.group_size;
                let mut v = f32::from(c.q[i]) * c.scale[g];
                if let Some(o) = &c.offset {
                    v += o[g];
                }
                assert_eq!(
                    v.to_bits() & 0x7fff_ffff,
                    a.to_bits() & 0x7fff_ffff,
                    "bits {bits} sym {symmetric} i {i}"
                );
            }
        }
        assert!(
            WeightQuant {
                bits: 4,
                group_size: 64,
                symmetric: true
            }
            .codes(&orig[..96])
            .is_none()
        );
    }

    /// The codes as they were computed before [`WeightQuant::codes`] became one pass: each
    /// group copied and re-quantized in place for its scale, then every code recomputed with
    /// `round` (kept here as the oracle of the fast path).
    fn codes_oracle(q: &WeightQuant, row: &[f32]) -> Option<Codes> {
        let g = q.group_size;
        if (!q.symmetric && q.bits >= 8) || !row.len().is_multiple_of(g) {
            return None;
        }
        let (mut codes, mut scale, mut offset) = (Vec::new(), Vec::new(), Vec::new());
        for group in row.chunks(g) {
            let (d, base) = if q.symmetric {
                let half = (1i32 << (q.bits - 1)) as f32;
                let d = if q.bits == 8 {
                    group.iter().fold(0f32, |m, &x| m.max(x.abs())) / 127.0
                } else {
                    let max = group
                        .iter()
                        .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
                    max / -half
                };
                (d, 0.0)
            } else {
                let levels = ((1u32 << q.bits) - 1) as f32;
                let (lo, hi) = group
                    .iter()
                    .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                        (a.min(x), b.max(x))
                    });
                ((hi - lo) / levels, lo)
            };
            let d = if d == 0.0 || !d.is_finite() { 0.0 } else { d };
            for &x in group {
                let c = if d == 0.0 {
                    0.0
                } else if q.symmetric {
                    let half = (1i32 << (q.bits - 1)) as f32;
                    let (qmin, qmax) = if q.bits == 8 {
                        (-127.0, 127.0)
                    } else {
                        (-half, half - 1.0)
                    };
                    (x * (1.0 / d)).round().clamp(qmin, qmax)
                } else {
                    let levels = ((1u32 << q.bits) - 1) as f32;
                    ((x - base) * (1.0 / d)).round().clamp(0.0, levels)
                };
                codes.push(c as i8);
            }
            scale.push(d);
            offset.push(base);
        }
        Some(Codes {
            q: codes,
            scale,
            offset: (!q.symmetric).then_some(offset),
        })
    }

    #[test]
    fn one_pass_codes_equal_the_oracle_bit_for_bit() {
        let mut row = lcg_row(4096, 17);
        // degenerate and awkward groups: zeros, a flat group, exact halves, a lone spike
        row[..32].fill(0.0);
        row[32..64].fill(0.25);
        for (i, x) in row[64..96].iter_mut().enumerate() {
            *x = (i as f32 - 16.0) * 0.5;
        }
        row[96..128].fill(1e-3);
        row[100] = -3.0;
        // equal magnitudes of both signs (the first wins), a NaN, signed zeros, an infinity
        row[130] = -0.7;
        row[131] = 0.7;
        row[170] = f32::NAN;
        for (i, x) in row[192..224].iter_mut().enumerate() {
            *x = if i % 2 == 0 { -0.0 } else { 0.0 };
        }
        row[250] = f32::INFINITY;
        let bits_of = |c: &Option<Codes>| {
            c.as_ref().map(|c| {
                let f = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                (c.q.clone(), f(&c.scale), c.offset.as_deref().map(f))
            })
        };
        for q in every_quant() {
            let (fast, oracle) = (q.codes(&row), codes_oracle(&q, &row));
            assert_eq!(bits_of(&fast), bits_of(&oracle), "{q:?}");
        }
    }

    #[test]
    fn code_is_round_then_clamp() {
        let bounds = [
            (-2.0, 1.0),
            (-128.0, 127.0),
            (-127.0, 127.0),
            (0.0, 63.0),
            (0.0, 3.0),
        ];
        // every f32 bit pattern in a stride (both signs, all exponents, NaN and infinities),
        // and every value within two ulps of each half-integer the codes can meet
        let mut values: Vec<f32> = (0..=u32::MAX).step_by(9973).map(f32::from_bits).collect();
        for h in -260..=260 {
            let half = h as f32 * 0.5;
            let mut v = half;
            for _ in 0..3 {
                values.extend([v, -v]);
                v = v.next_up();
            }
            v = half;
            for _ in 0..3 {
                v = v.next_down();
                values.push(v);
            }
        }
        values.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.49999997]);
        for (lo, hi) in bounds {
            for &v in &values {
                assert_eq!(
                    code(v, lo, hi),
                    v.round().clamp(lo, hi) as i8,
                    "{v} in {lo}..{hi}"
                );
            }
        }
    }

    #[test]
    fn validation_names_the_field() {
        assert!(
            WeightQuant {
                bits: 7,
                group_size: 32,
                symmetric: true
            }
            .validate()
            .unwrap_err()
            .contains("weights.bits")
        );
        assert!(
            WeightQuant {
                bits: 4,
                group_size: 48,
                symmetric: true
            }
            .validate()
            .unwrap_err()
            .contains("weights.group_size")
        );
    }
}
