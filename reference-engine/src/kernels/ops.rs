//! Row-wise kernels with a fixed reduction order: dot products (16 lanes, then a fixed
//! pairwise tree), RMSNorm, rotate-half RoPE, causal attention for one query row over the
//! KV cache, and an `exp` built from plain IEEE operations so that every ISA (and the
//! compiler's auto-vectorization) gives the same bits.
//!
//! Attention for a query row reads only that row and its sequence's cache, so it is the same
//! computation in prefill and in decode.

#![allow(clippy::needless_range_loop)] // index loops mirror the reference C code and the lanes

use super::Isa;

/// `Σ a[i]·b[i]` accumulated in 16 lanes (element i in lane i % 16, fused multiply-add in
/// index order), then lanes summed as `l[i] + l[i+8]`, `+ l[i+4]`, `+ l[i+2]`, `+ l[i+1]`.
pub fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only when the CPU supports it.
        Isa::Avx512 => unsafe { x86::dot_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only when the CPU supports it.
        Isa::Avx => unsafe { x86::dot_avx(a, b) },
        _ => dot_scalar(a, b),
    }
}

fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut l = [0f32; 16];
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        l[i % 16] = x.mul_add(y, l[i % 16]);
    }
    reduce16(&mut l)
}

fn reduce16(l: &mut [f32; 16]) -> f32 {
    for h in [8, 4, 2, 1] {
        for i in 0..h {
            l[i] += l[i + h];
        }
    }
    l[0]
}

/// `acc[i] = fma(p, v[i], acc[i])` for every i.
pub fn axpy(isa: Isa, p: f32, v: &[f32], acc: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only when the CPU supports it.
        Isa::Avx512 => unsafe { x86::axpy_avx512(p, v, acc) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only when the CPU supports it.
        Isa::Avx => unsafe { x86::axpy_avx(p, v, acc) },
        _ => {
            for (a, &x) in acc.iter_mut().zip(v) {
                *a = p.mul_add(x, *a);
            }
        }
    }
}

/// `out[i] = w[i] * (x[i] * r)` with `r = 1 / sqrt(mean(x²) + eps)` (the HF order).
pub fn rms_norm(isa: Isa, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot(isa, x, x);
    let r = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, &xv), &wv) in out.iter_mut().zip(x).zip(w) {
        *o = wv * (xv * r);
    }
}

/// Rotate-half RoPE on one head vector `x` (length 2·half) with this position's tables.
pub fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for i in 0..half {
        let (x0, x1) = (x[i], x[i + half]);
        x[i] = x0 * cos[i] - x1 * sin[i];
        x[i + half] = x1 * cos[i] + x0 * sin[i];
    }
}

/// `e^x` from plain f32 operations (Cody–Waite reduction, Cephes polynomial): about 1 ulp,
/// bit-identical whatever vectorizes it. Inputs are clamped to [-87.3, 88].
#[inline]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.336_54, 88.0);
    let n = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
    let r = x - n * 0.693_359_4;
    let r = r - n * -2.121_944_4e-4;
    let z = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * z + r + 1.0;
    #[allow(clippy::cast_possible_truncation)]
    let bits = ((n as i32 + 127) as u32) << 23;
    y * f32::from_bits(bits)
}

/// `x · sigmoid(x)` = `x * (1 / (1 + e^-x))`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * (1.0 / (1.0 + exp(-x)))
}

/// `out[i] = silu(gate[i]) * up[i]`, vectorized as wide as `isa` allows (the same bits: plain
/// f32 operations, no fused multiply-add).
pub fn silu_mul(isa: Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only when the CPU supports it.
        Isa::Avx512 => unsafe { x86::silu_mul_avx512(gate, up, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx => unsafe { x86::silu_mul_avx(gate, up, out) },
        _ => silu_mul_body(gate, up, out),
    }
}

#[inline(always)]
fn silu_mul_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// The attention softmax of `scores` in place: each score times `scale`, then
/// `exp(s - max)`, then each divided by their sum, the sum taken in order.
///
/// The maximum is taken lane-wise (16 lanes, then across them) so that it vectorizes: a
/// maximum does not depend on the order it is taken in (NaN is ignored as `f32::max` ignores
/// it), except for the sign of a zero maximum, and that changes no `exp(s - max)`: `s - ±0`
/// is `s` for `s` ≠ 0, and `exp(±0)` is exactly 1. Everything else is element-wise or the
/// in-order sum, so the result is bit for bit the sequential one
/// (`softmax_is_the_sequential_one`).
pub fn softmax(isa: Isa, scores: &mut [f32], scale: f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only when the CPU supports it.
        Isa::Avx512 => unsafe { x86::softmax_avx512(scores, scale) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx => unsafe { x86::softmax_avx(scores, scale) },
        _ => softmax_body(scores, scale),
    }
}

#[inline(always)]
fn softmax_body(sc: &mut [f32], scale: f32) {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut blocks = sc.chunks_exact_mut(16);
    for b in &mut blocks {
        for (l, s) in lanes.iter_mut().zip(b.iter_mut()) {
            *s *= scale;
            *l = l.max(*s);
        }
    }
    for s in blocks.into_remainder() {
        *s *= scale;
        lanes[0] = lanes[0].max(*s);
    }
    let max = lanes.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    for s in sc.iter_mut() {
        *s = exp(*s - max);
    }
    let mut sum = 0f32;
    for &s in sc.iter() {
        sum += s;
    }
    for s in sc.iter_mut() {
        *s /= sum;
    }
}

/// One key/value head of a sequence's cache, as attention reads it: `keys` in blocks of 16
/// positions (`[block][stride][16]`), `values` as rows (`[pos][stride]`), this head's slice
/// starting at `off` of each, over the first `n_keys` positions.
#[derive(Debug, Clone, Copy)]
pub struct KvHead<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub stride: usize,
    pub off: usize,
    pub n_keys: usize,
}

/// Causal attention for one query head vector `q` over the `kv.n_keys` cached positions of
/// `kv`. Score j is `(Σ_d q[d]·k_j[d]) · scale`, one FMA chain over d in order; the softmax
/// uses [`exp`]; output element d is one FMA chain over j in order. `scores` is scratch
/// (≥ n_keys rounded up to 16); the result goes to `out` (head_dim).
pub fn attend(
    isa: Isa,
    q: &[f32],
    kv: KvHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let KvHead {
        keys,
        values,
        stride,
        off,
        n_keys,
    } = kv;
    let hd = q.len();
    let blocks = n_keys.div_ceil(16);
    if scores.len() < blocks * 16 {
        scores.resize(blocks * 16, 0.0);
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only when the CPU supports it.
        Isa::Avx512 => unsafe { x86::scores_avx512(q, keys, stride, off, blocks, scores) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx => unsafe { x86::scores_avx(q, keys, stride, off, blocks, scores) },
        _ => {
            for b in 0..blocks {
                let base = b * stride * 16 + off * 16;
                for lane in 0..16 {
                    let mut acc = 0f32;
                    for d in 0..hd {
                        acc = q[d].mul_add(keys[base + d * 16 + lane], acc);
                    }
                    scores[b * 16 + lane] = acc;
                }
            }
        }
    }
    let sc = &mut scores[..n_keys];
    softmax(isa, sc, scale);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only when the CPU supports it.
        Isa::Avx512 if hd.is_multiple_of(16) && hd <= 128 => unsafe {
            x86::pv_avx512(sc, values, stride, off, out)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx if hd.is_multiple_of(8) => unsafe { x86::pv_avx(sc, values, stride, off, out) },
        _ => {
            out.fill(0.0);
            for (j, &p) in sc.iter().enumerate() {
                axpy(
                    isa,
                    p,
                    &values[j * stride + off..j * stride + off + hd],
                    out,
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::silu_mul`] compiled for AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn silu_mul_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) {
        super::silu_mul_body(gate, up, out);
    }

    /// [`super::silu_mul`] compiled for AVX with FMA.
    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn silu_mul_avx(gate: &[f32], up: &[f32], out: &mut [f32]) {
        super::silu_mul_body(gate, up, out);
    }

    /// [`super::softmax`] compiled for AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax_avx512(scores: &mut [f32], scale: f32) {
        super::softmax_body(scores, scale);
    }

    /// [`super::softmax`] compiled for AVX with FMA.
    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn softmax_avx(scores: &mut [f32], scale: f32) {
        super::softmax_body(scores, scale);
    }

    /// 16 scores per block: lane l of block b is the FMA chain over d of q[d]·k[b][d][l].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores_avx512(
        q: &[f32],
        keys: &[f32],
        stride: usize,
        off: usize,
        blocks: usize,
        scores: &mut [f32],
    ) {
        let hd = q.len();
        assert!(blocks == 0 || (blocks - 1) * stride * 16 + (off + hd) * 16 <= keys.len());
        assert!(scores.len() >= blocks * 16);
        let kp = keys.as_ptr();
        let mut b = 0;
        // four blocks at a time: four independent chains in flight
        while b + 4 <= blocks {
            let mut acc = [_mm512_setzero_ps(); 4];
            for d in 0..hd {
                let qv = _mm512_set1_ps(q[d]);
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: bounds asserted above.
                    let kv =
                        unsafe { _mm512_loadu_ps(kp.add((b + i) * stride * 16 + (off + d) * 16)) };
                    *a = _mm512_fmadd_ps(qv, kv, *a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                // SAFETY: scores holds blocks * 16.
                unsafe { _mm512_storeu_ps(scores.as_mut_ptr().add((b + i) * 16), *a) };
            }
            b += 4;
        }
        while b < blocks {
            let mut acc = _mm512_setzero_ps();
            for d in 0..hd {
                // SAFETY: bounds asserted above.
                let kv = unsafe { _mm512_loadu_ps(kp.add(b * stride * 16 + (off + d) * 16)) };
                acc = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), kv, acc);
            }
            // SAFETY: scores holds blocks * 16.
            unsafe { _mm512_storeu_ps(scores.as_mut_ptr().add(b * 16), acc) };
            b += 1;
        }
    }

    /// [`scores_avx512`] in 256-bit halves: lanes 0–7 and 8–15 of a block are two vectors,
    /// each lane the same FMA chain over d.
    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn scores_avx(
        q: &[f32],
        keys: &[f32],
        stride: usize,
        off: usize,
        blocks: usize,
        scores: &mut [f32],
    ) {
        let hd = q.len();
        assert!(blocks == 0 || (blocks - 1) * stride * 16 + (off + hd) * 16 <= keys.len());
        assert!(scores.len() >= blocks * 16);
        let kp = keys.as_ptr();
        let mut b = 0;
        while b < blocks {
            // two blocks at a time where there are two: four independent chains in flight
            let n = if b + 2 <= blocks { 2 } else { 1 };
            let mut acc = [_mm256_setzero_ps(); 4];
            for d in 0..hd {
                let qv = _mm256_set1_ps(q[d]);
                for i in 0..n {
                    let at = (b + i) * stride * 16 + (off + d) * 16;
                    // SAFETY: bounds asserted above.
                    let (lo, hi) =
                        unsafe { (_mm256_loadu_ps(kp.add(at)), _mm256_loadu_ps(kp.add(at + 8))) };
                    acc[2 * i] = _mm256_fmadd_ps(qv, lo, acc[2 * i]);
                    acc[2 * i + 1] = _mm256_fmadd_ps(qv, hi, acc[2 * i + 1]);
                }
            }
            for i in 0..n {
                // SAFETY: scores holds blocks * 16.
                unsafe {
                    let out = scores.as_mut_ptr().add((b + i) * 16);
                    _mm256_storeu_ps(out, acc[2 * i]);
                    _mm256_storeu_ps(out.add(8), acc[2 * i + 1]);
                }
            }
            b += n;
        }
    }

    /// `out[d] = Σ_j p[j]·v[j][off + d]`, one FMA chain per d over j in order, accumulators in
    /// registers (head_dim a multiple of 16, at most 128).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pv_avx512(
        p: &[f32],
        values: &[f32],
        stride: usize,
        off: usize,
        out: &mut [f32],
    ) {
        let hd = out.len();
        let chunks = hd / 16;
        assert!(hd.is_multiple_of(16) && chunks <= 8);
        assert!(p.is_empty() || (p.len() - 1) * stride + off + hd <= values.len());
        let mut acc = [_mm512_setzero_ps(); 8];
        let vp = values.as_ptr();
        for (j, &pj) in p.iter().enumerate() {
            let pv = _mm512_set1_ps(pj);
            for (c, a) in acc.iter_mut().enumerate().take(chunks) {
                // SAFETY: bounds asserted above.
                let v = unsafe { _mm512_loadu_ps(vp.add(j * stride + off + c * 16)) };
                *a = _mm512_fmadd_ps(pv, v, *a);
            }
        }
        for (c, a) in acc.iter().enumerate().take(chunks) {
            // SAFETY: out holds hd = chunks * 16.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(c * 16), *a) };
        }
    }

    /// [`pv_avx512`] for AVX+FMA, any head_dim a multiple of 8: 64 columns at a time in eight
    /// register accumulators, each the same FMA chain over j in order.
    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn pv_avx(
        p: &[f32],
        values: &[f32],
        stride: usize,
        off: usize,
        out: &mut [f32],
    ) {
        let hd = out.len();
        assert!(hd.is_multiple_of(8));
        assert!(p.is_empty() || (p.len() - 1) * stride + off + hd <= values.len());
        let vp = values.as_ptr();
        for c0 in (0..hd).step_by(64) {
            let chunks = (hd - c0).min(64) / 8;
            let mut acc = [_mm256_setzero_ps(); 8];
            for (j, &pj) in p.iter().enumerate() {
                let pv = _mm256_set1_ps(pj);
                for (c, a) in acc.iter_mut().enumerate().take(chunks) {
                    // SAFETY: bounds asserted above.
                    let v = unsafe { _mm256_loadu_ps(vp.add(j * stride + off + c0 + c * 8)) };
                    *a = _mm256_fmadd_ps(pv, v, *a);
                }
            }
            for (c, a) in acc.iter().enumerate().take(chunks) {
                // SAFETY: out holds hd ≥ c0 + chunks * 8.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c0 + c * 8), *a) };
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n for both slices.
            unsafe {
                acc = _mm512_fmadd_ps(
                    _mm512_loadu_ps(a.as_ptr().add(i)),
                    _mm512_loadu_ps(b.as_ptr().add(i)),
                    acc,
                )
            };
            i += 16;
        }
        let mut l = [0f32; 16];
        // SAFETY: l holds 16 floats.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr(), acc) };
        for j in i..n {
            l[j - i] = a[j].mul_add(b[j], l[j - i]);
        }
        super::reduce16(&mut l)
    }

    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn dot_avx(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n for both slices.
            unsafe {
                lo = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    lo,
                );
                hi = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                    hi,
                );
            }
            i += 16;
        }
        let mut l = [0f32; 16];
        // SAFETY: l holds 16 floats.
        unsafe {
            _mm256_storeu_ps(l.as_mut_ptr(), lo);
            _mm256_storeu_ps(l.as_mut_ptr().add(8), hi);
        }
        for j in i..n {
            l[j - i] = a[j].mul_add(b[j], l[j - i]);
        }
        super::reduce16(&mut l)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn axpy_avx512(p: f32, v: &[f32], acc: &mut [f32]) {
        let n = v.len().min(acc.len());
        let pv = _mm512_set1_ps(p);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n for both slices.
            unsafe {
                let a = _mm512_loadu_ps(acc.as_ptr().add(i));
                _mm512_storeu_ps(
                    acc.as_mut_ptr().add(i),
                    _mm512_fmadd_ps(pv, _mm512_loadu_ps(v.as_ptr().add(i)), a),
                );
            }
            i += 16;
        }
        for j in i..n {
            acc[j] = p.mul_add(v[j], acc[j]);
        }
    }

    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn axpy_avx(p: f32, v: &[f32], acc: &mut [f32]) {
        let n = v.len().min(acc.len());
        let pv = _mm256_set1_ps(p);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n for both slices.
            unsafe {
                let a = _mm256_loadu_ps(acc.as_ptr().add(i));
                _mm256_storeu_ps(
                    acc.as_mut_ptr().add(i),
                    _mm256_fmadd_ps(pv, _mm256_loadu_ps(v.as_ptr().add(i)), a),
                );
            }
            i += 8;
        }
        for j in i..n {
            acc[j] = p.mul_add(v[j], acc[j]);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_agree_across_isas() {
        let a: Vec<f32> = (0..77).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..77).map(|i| (i as f32 * 0.11).cos()).collect();
        let want = dot(Isa::Scalar, &a, &b);
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        assert!((f64::from(want) - exact).abs() < 1e-5);
        for isa in [Isa::Avx, Isa::Avx512] {
            let isa = Isa::at_most(isa);
            assert_eq!(dot(isa, &a, &b).to_bits(), want.to_bits(), "{isa:?}");
            let mut x = b.clone();
            let mut y = b.clone();
            axpy(Isa::Scalar, 0.3, &a, &mut x);
            axpy(isa, 0.3, &a, &mut y);
            assert_eq!(x, y);
        }
    }

    #[test]
    fn attention_agrees_across_isas() {
        // head_dim 64 (the test model), 128 (two register blocks in the AVX path) and 24 (a
        // partial block; AVX-512 falls back to axpy)
        for (hd, n) in [(64, 37), (128, 21), (24, 40)] {
            attention_case(hd, n);
        }
    }

    /// A cache of `nkv` key/value heads of `hd` over `n` positions, seeded, laid out as
    /// [`KvHead`] reads it: (keys, values, stride).
    pub(in crate::kernels) fn test_cache(
        hd: usize,
        nkv: usize,
        n: usize,
        seed: u32,
    ) -> (Vec<f32>, Vec<f32>, usize) {
        let stride = nkv * hd;
        let mut keys = vec![0f32; n.div_ceil(16) * stride * 16];
        let mut values = vec![0f32; n * stride];
        let s = seed as f32 * 0.37;
        for j in 0..n {
            for i in 0..stride {
                keys[(j / 16) * stride * 16 + i * 16 + j % 16] =
                    ((j * 31 + i * 7) as f32 * 0.013 + s).sin();
                values[j * stride + i] = ((j * 17 + i * 3) as f32 * 0.021 - s).cos();
            }
        }
        (keys, values, stride)
    }

    fn attention_case(hd: usize, n: usize) {
        let (keys, values, stride) = test_cache(hd, 3, n, 0);
        let q: Vec<f32> = (0..hd).map(|d| (d as f32 * 0.3).sin()).collect();
        let run = |isa| {
            let mut scores = Vec::new();
            let mut out = vec![0f32; hd];
            let kv = KvHead {
                keys: &keys,
                values: &values,
                stride,
                off: hd,
                n_keys: n,
            };
            attend(isa, &q, kv, 0.125, &mut scores, &mut out);
            out
        };
        let want = run(Isa::Scalar);
        // against a plain f64 reference
        let s: Vec<f64> = (0..n)
            .map(|j| {
                (0..hd)
                    .map(|d| {
                        f64::from(q[d])
                            * f64::from(keys[(j / 16) * stride * 16 + (hd + d) * 16 + j % 16])
                    })
                    .sum::<f64>()
                    * 0.125
            })
            .collect();
        let m = s.iter().copied().fold(f64::MIN, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for d in 0..hd {
            let r: f64 = (0..n)
                .map(|j| (s[j] - m).exp() / z * f64::from(values[j * stride + hd + d]))
                .sum();
            assert!(
                (r - f64::from(want[d])).abs() < 1e-5,
                "d={d}: {r} vs {}",
                want[d]
            );
        }
        for isa in [Isa::Avx, Isa::Avx512] {
            let got = run(Isa::at_most(isa));
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{isa:?}"
            );
        }
    }

    /// The attention softmax as it was written before it vectorized: the maximum in order.
    fn softmax_sequential(sc: &mut [f32], scale: f32) {
        let mut max = f32::NEG_INFINITY;
        for s in sc.iter_mut() {
            *s *= scale;
            max = max.max(*s);
        }
        for s in sc.iter_mut() {
            *s = exp(*s - max);
        }
        let mut sum = 0f32;
        for &s in sc.iter() {
            sum += s;
        }
        for s in sc.iter_mut() {
            *s /= sum;
        }
    }

    fn isas() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx, Isa::Avx512]
            .into_iter()
            .filter(|&i| Isa::at_most(i) == i)
            .collect()
    }

    #[test]
    fn softmax_is_the_sequential_one() {
        let mut seed = 5u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0
        };
        let mut cases: Vec<Vec<f32>> = [1, 2, 15, 16, 17, 31, 100, 257]
            .iter()
            .map(|&n| (0..n).map(|_| next()).collect())
            .collect();
        // zero maxima of either sign, ties, a NaN, infinities, all equal
        cases.push(vec![-0.0, -3.0, 0.0, -1.0, -0.0, -2.5]);
        cases.push(vec![-0.0; 20]);
        cases.push(
            (0..40)
                .map(|i| if i % 7 == 0 { 0.0 } else { -0.5 })
                .collect(),
        );
        cases.push(vec![1.0, f32::NAN, 2.0, -1.0]);
        cases.push(vec![f32::NEG_INFINITY, -1.0, 3.0]);
        cases.push(vec![2.0; 33]);
        for isa in isas() {
            for case in &cases {
                for scale in [0.125f32, 1.0] {
                    let (mut want, mut got) = (case.clone(), case.clone());
                    softmax_sequential(&mut want, scale);
                    softmax(isa, &mut got, scale);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{isa:?} {case:?}");
                }
            }
        }
    }

    #[test]
    fn silu_mul_is_the_same_on_every_isa() {
        let gate: Vec<f32> = (0..203).map(|i| (i as f32 - 101.0) * 0.37).collect();
        let up: Vec<f32> = (0..203).map(|i| (i as f32 * 0.11).sin()).collect();
        let want: Vec<u32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| (silu(g) * u).to_bits())
            .collect();
        for isa in isas() {
            let mut out = vec![0f32; gate.len()];
            silu_mul(isa, &gate, &up, &mut out);
            let got: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "{isa:?}");
        }
    }

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = f64::from(exp(x));
            let want = f64::from(x).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
    }
}
