//! Weight matrices packed as column panels, and the GEMM `y[m][n] = Σ_k x[m][k] · w[n][k]`.
//!
//! A [`Linear`] stores `n` output columns in panels of [`NR`] = 16 columns laid out
//! `[k][16]`, either as f32 or as small integers with a per-group f32 scale and offset (the
//! exact ggml dequantization, see [`crate::quant::decompose_row`]). A thread dequantizes one
//! panel into scratch (`q * scale + offset`, multiply then add) and runs the microkernel
//! over every row tile: each output element is one fused-multiply-add chain over k = 0..K
//! in order, started from zero. Threads split panels; K is never split; so the result of
//! an element is independent of M, the tile, the thread count and the ISA.

use std::cell::RefCell;

use super::{Ctx, Isa, SyncPtr};
use crate::error::{EngineError, Result};
use crate::quant::Decomposed;

/// Columns per panel.
pub const NR: usize = 16;
/// Up to this many rows, AVX-512 dequantizes in registers instead of into scratch.
const FUSED_MAX_ROWS: usize = 8;

/// One output row of a weight matrix, as the loader produced it.
pub enum RowSource {
    /// Plain f32 values (from F32/F16/BF16).
    F32(Vec<f32>),
    /// Integers with per-group scale/offset (from a quantized type).
    Quant(Decomposed),
}

#[derive(Debug)]
enum Data {
    F32(Vec<f32>),
    Quant {
        /// Elements per group along k (16 or 32).
        group: usize,
        /// `[panel][k][16]` integers (empty when `q4` holds them).
        q: Vec<i8>,
        /// `[panel][k][8]` bytes of 4-bit values `u` (column c in the low nibble of byte c,
        /// column c + 8 in the high nibble), the integer being `u + lo`: half the memory
        /// traffic of `q`, for 4-bit types.
        q4: Option<Vec<u8>>,
        /// Offset of the 4-bit values (0 or -8).
        lo: i8,
        /// Every `q * scale` is exact in f32 (few significant bits in both), so a fused
        /// multiply-add gives the same bits as multiply-then-add; kernels may use it.
        exact: bool,
        /// `[panel][k/group][16]` scales.
        scale: Vec<f32>,
        /// `[panel][k/group][16]` offsets (zero where the type has none: every path adds
        /// it, so all paths compute the same `q * scale + offset`).
        offset: Vec<f32>,
    },
}

/// A [`Linear`]'s packed data, borrowed: panels of [`NR`] columns, `[panel][k][16]`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Parts<'a> {
    /// f32 weights.
    F32(&'a [f32]),
    /// Integers with a scale and an offset per group of `group` along k and column
    /// (`[panel][k / group][16]`); a weight is `q * scale + offset`.
    Quant {
        group: usize,
        /// `[panel][k][16]` integers (empty when `q4` holds them).
        q: &'a [i8],
        /// `[panel][k][8]` nibbles (column c low, c + 8 high), the integer being `u + lo`.
        q4: Option<&'a [u8]>,
        lo: i8,
        scale: &'a [f32],
        offset: &'a [f32],
    },
}

/// A weight matrix `[n][k]` in kernel layout.
#[derive(Debug)]
pub struct Linear {
    /// Output columns.
    pub n: usize,
    /// Input length.
    pub k: usize,
    data: Data,
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl Linear {
    /// Packs `n` rows of length `k`, asking `row(i)` for row `i`. `group` is None to store
    /// f32 (every row must then be [`RowSource::F32`]), or the quantization group size along
    /// k (every row then [`RowSource::Quant`] with a group that is a multiple of it).
    pub fn pack(
        n: usize,
        k: usize,
        group: Option<usize>,
        row: &mut dyn FnMut(usize) -> Result<RowSource>,
    ) -> Result<Self> {
        let panels = n.div_ceil(NR);
        let data = match group {
            None => Data::F32(vec![0.0; panels * k * NR]),
            Some(group) => {
                if group == 0 || !k.is_multiple_of(group) {
                    return Err(EngineError::corrupt(format!(
                        "row length {k} is not a multiple of {group}"
                    )));
                }
                Data::Quant {
                    group,
                    q: vec![0; panels * k * NR],
                    q4: None,
                    lo: 0,
                    exact: false,
                    scale: vec![0.0; panels * k / group * NR],
                    offset: vec![0.0; panels * k / group * NR],
                }
            }
        };
        let mut lin = Self { n, k, data };
        let mut rows: Vec<RowSource> = Vec::with_capacity(NR);
        for p in 0..panels {
            rows.clear();
            for c in 0..NR.min(n - p * NR) {
                rows.push(row(p * NR + c)?);
            }
            lin.put_panel(p, &rows)?;
        }
        lin.mark_exact();
        lin.pack_nibbles();
        Ok(lin)
    }

    /// Sets `exact` when, for every scale, its significant bits plus those of the largest
    /// |q| fit in f32's 24: then `q * scale` never rounds.
    fn mark_exact(&mut self) {
        let Data::Quant {
            q, scale, exact, ..
        } = &mut self.data
        else {
            return;
        };
        let max_q = q
            .iter()
            .map(|&v| i32::from(v).unsigned_abs())
            .max()
            .unwrap_or(0);
        let q_bits = 32 - max_q.leading_zeros();
        let sig_bits = |s: f32| -> u32 {
            let b = s.to_bits();
            if s == 0.0 {
                0
            } else if (b >> 23) & 0xFF == 0 || !s.is_finite() {
                24 // subnormal or not finite: never claim exactness
            } else {
                24 - ((b & 0x7F_FFFF) | 0x80_0000).trailing_zeros()
            }
        };
        *exact = scale.iter().all(|&s| sig_bits(s) + q_bits <= 24);
    }

    /// Stores the integers as 4-bit values when they all fit in [0, 15] or [-8, 7].
    fn pack_nibbles(&mut self) {
        let Data::Quant { q, q4, lo, .. } = &mut self.data else {
            return;
        };
        let (min, max) = q
            .iter()
            .fold((i8::MAX, i8::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let base = if min >= 0 && max <= 15 {
            0
        } else if min >= -8 && max <= 7 {
            -8
        } else {
            return;
        };
        let mut packed = vec![0u8; q.len() / 2];
        for (dst, src) in packed.chunks_exact_mut(8).zip(q.chunks_exact(NR)) {
            for b in 0..8 {
                let u0 = (src[b] - base) as u8;
                let u1 = (src[b + 8] - base) as u8;
                dst[b] = u0 | (u1 << 4);
            }
        }
        *q4 = Some(packed);
        *lo = base;
        *q = Vec::new();
    }

    fn put_panel(&mut self, p: usize, rows: &[RowSource]) -> Result<()> {
        let k = self.k;
        match &mut self.data {
            Data::F32(w) => {
                for (c, r) in rows.iter().enumerate() {
                    let RowSource::F32(v) = r else {
                        return Err(EngineError::corrupt(
                            "a weight matrix mixes float and quantized rows",
                        ));
                    };
                    if v.len() != k {
                        return Err(EngineError::corrupt("weight row has the wrong length"));
                    }
                    for (kk, &x) in v.iter().enumerate() {
                        w[(p * k + kk) * NR + c] = x;
                    }
                }
            }
            Data::Quant {
                group,
                q,
                scale,
                offset,
                ..
            } => {
                let ng = k / *group;
                for (c, r) in rows.iter().enumerate() {
                    let RowSource::Quant(d) = r else {
                        return Err(EngineError::corrupt(
                            "a weight matrix mixes float and quantized rows",
                        ));
                    };
                    if d.q.len() != k || (d.group != *group && d.group % *group != 0) {
                        return Err(EngineError::corrupt(
                            "quantized weight row does not match its matrix",
                        ));
                    }
                    for (kk, &x) in d.q.iter().enumerate() {
                        q[(p * k + kk) * NR + c] = x;
                    }
                    for g in 0..ng {
                        let src = g * *group / d.group;
                        scale[(p * ng + g) * NR + c] = d.scale[src];
                        if let Some(o) = &d.offset {
                            offset[(p * ng + g) * NR + c] = o[src];
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The packed data as it is laid out (for a backend that copies it elsewhere, such as
    /// the GPU's, and must compute exactly what [`Linear::matmul`] computes from it).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn parts(&self) -> Parts<'_> {
        match &self.data {
            Data::F32(w) => Parts::F32(w),
            Data::Quant {
                group,
                q,
                q4,
                lo,
                scale,
                offset,
                ..
            } => Parts::Quant {
                group: *group,
                q,
                q4: q4.as_deref(),
                lo: *lo,
                scale,
                offset,
            },
        }
    }

    /// Bytes held by the packed weights.
    pub fn bytes(&self) -> usize {
        match &self.data {
            Data::F32(w) => w.len() * 4,
            Data::Quant {
                q,
                q4,
                scale,
                offset,
                ..
            } => q.len() + q4.as_ref().map_or(0, Vec::len) + (scale.len() + offset.len()) * 4,
        }
    }

    /// Row `i` (output column `i`) dequantized: the embedding lookup for tied weights.
    pub fn row(&self, i: usize, out: &mut [f32]) {
        let (p, c) = (i / NR, i % NR);
        let k = self.k;
        match &self.data {
            Data::F32(w) => {
                for (kk, o) in out.iter_mut().enumerate().take(k) {
                    *o = w[(p * k + kk) * NR + c];
                }
            }
            Data::Quant {
                group,
                q,
                q4,
                lo,
                scale,
                offset,
                ..
            } => {
                let ng = k / group;
                for (kk, o) in out.iter_mut().enumerate().take(k) {
                    let g = (p * ng + kk / group) * NR + c;
                    let qv = q_at(q, q4.as_deref(), *lo, (p * k + kk) * NR, c);
                    *o = f32::from(qv) * scale[g] + offset[g];
                }
            }
        }
    }

    /// Writes panel `p` as f32 `[k][16]` into `out`, vectorized as wide as `isa` allows.
    fn dequant_panel(&self, isa: Isa, p: usize, out: &mut [f32]) {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA is only chosen when the CPU supports it.
            Isa::Avx512 => unsafe { self.dequant_panel_avx512(p, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx => unsafe { self.dequant_panel_avx(p, out) },
            _ => self.dequant_panel_body(p, out),
        }
    }

    /// [`Linear::dequant_panel`] compiled for AVX with FMA (the same multiply then add: Rust
    /// never contracts them into a fused multiply-add, so the same bits).
    ///
    /// # Safety
    /// The CPU must support AVX and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx,fma")]
    unsafe fn dequant_panel_avx(&self, p: usize, out: &mut [f32]) {
        self.dequant_panel_body(p, out);
    }

    /// [`Linear::dequant_panel`] compiled for AVX-512F (16 columns a vector; the same
    /// multiply then add, so the same bits).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn dequant_panel_avx512(&self, p: usize, out: &mut [f32]) {
        self.dequant_panel_body(p, out);
    }

    #[inline(always)]
    fn dequant_panel_body(&self, p: usize, out: &mut [f32]) {
        let k = self.k;
        match &self.data {
            Data::F32(w) => out[..k * NR].copy_from_slice(&w[p * k * NR..(p + 1) * k * NR]),
            Data::Quant {
                group,
                q,
                q4,
                lo,
                scale,
                offset,
                ..
            } => {
                let ng = k / group;
                let mut qq = [0i8; NR];
                for g in 0..ng {
                    let s: &[f32; NR] = slice16(&scale[(p * ng + g) * NR..]);
                    let o: &[f32; NR] = slice16(&offset[(p * ng + g) * NR..]);
                    for kk in g * group..(g + 1) * group {
                        let at = (p * k + kk) * NR;
                        match q4 {
                            Some(q4) => {
                                let b = &q4[at / 2..at / 2 + 8];
                                for c in 0..8 {
                                    qq[c] = (b[c] & 0xF) as i8 + lo;
                                    qq[c + 8] = (b[c] >> 4) as i8 + lo;
                                }
                            }
                            None => qq.copy_from_slice(&q[at..at + NR]),
                        }
                        let d = &mut out[kk * NR..(kk + 1) * NR];
                        for c in 0..NR {
                            d[c] = f32::from(qq[c]) * s[c] + o[c];
                        }
                    }
                }
            }
        }
    }

    /// `y[m][n] = Σ_k x[m][k] · w[n][k]` for `m` rows of `x` (`[m][k]`), into `y` (`[m][n]`).
    pub fn matmul(&self, ctx: &Ctx, x: &[f32], m: usize, y: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert!(
            x.len() >= m * k && y.len() >= m * n,
            "matmul buffers too small"
        );
        let panels = n.div_ceil(NR);
        let yp = SyncPtr(y.as_mut_ptr());
        let isa = ctx.isa;
        #[cfg(target_arch = "x86_64")]
        if let (
            Isa::Avx512 | Isa::Avx,
            Data::Quant {
                group,
                q,
                q4,
                lo,
                exact,
                scale,
                offset,
            },
            true,
        ) = (isa, &self.data, m <= FUSED_MAX_ROWS)
        {
            let group = *group;
            ctx.pool.for_chunks(panels, 4, &|panels_t| {
                // capture the whole Sync wrapper, not its raw-pointer field
                #[allow(clippy::redundant_locals)]
                let yp = yp;
                let mut r = 0;
                while r < m {
                    let rows = if m - r >= 8 {
                        8
                    } else if m - r >= 4 {
                        4
                    } else if m - r >= 2 {
                        2
                    } else {
                        1
                    };
                    let args = x86::Fused {
                        q,
                        q4: q4.as_deref().unwrap_or(&[]),
                        lo: *lo,
                        scale,
                        offset,
                        group,
                        k,
                        n,
                        x: &x[r * k..],
                        y: yp.0,
                        ldy: n,
                        row0: r,
                    };
                    let ps = panels_t.clone();
                    // SAFETY: the ISA was detected; thread t writes only its own panels' columns.
                    unsafe {
                        match (isa == Isa::Avx512, q4.is_some(), *exact) {
                            (true, true, true) => x86::fused_rows::<true, true>(&args, rows, ps),
                            (true, true, false) => x86::fused_rows::<true, false>(&args, rows, ps),
                            (true, false, true) => x86::fused_rows::<false, true>(&args, rows, ps),
                            (true, false, false) => {
                                x86::fused_rows::<false, false>(&args, rows, ps)
                            }
                            (false, true, true) => {
                                x86::fused_rows_avx::<true, true>(&args, rows, ps)
                            }
                            (false, true, false) => {
                                x86::fused_rows_avx::<true, false>(&args, rows, ps)
                            }
                            (false, false, true) => {
                                x86::fused_rows_avx::<false, true>(&args, rows, ps)
                            }
                            (false, false, false) => {
                                x86::fused_rows_avx::<false, false>(&args, rows, ps)
                            }
                        }
                    }
                    r += rows;
                }
            });
            return;
        }
        ctx.pool.for_chunks(panels, 4, &|mine| {
            // capture the whole Sync wrapper, not its raw-pointer field
            #[allow(clippy::redundant_locals)]
            let yp = yp;
            SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < 2 * k * NR {
                    s.resize(2 * k * NR, 0.0);
                }
                #[cfg(target_arch = "x86_64")]
                if isa == Isa::Avx512 {
                    // two panels at a time: 8 rows x 32 columns per microkernel call
                    let mut p = mine.start;
                    while p < mine.end {
                        let (w0, w1) = s.split_at_mut(k * NR);
                        self.dequant_panel(isa, p, w0);
                        if p + 1 < mine.end {
                            self.dequant_panel(isa, p + 1, w1);
                            let cols1 = NR.min(n - (p + 1) * NR);
                            // SAFETY: AVX-512 detected; thread t writes only its own panels.
                            unsafe {
                                x86::pair_rows(
                                    &w0[..k * NR],
                                    &w1[..k * NR],
                                    x,
                                    m,
                                    k,
                                    yp.0.add(p * NR),
                                    n,
                                    cols1,
                                )
                            };
                            p += 2;
                        } else {
                            let cols = NR.min(n - p * NR);
                            // SAFETY: as above.
                            unsafe {
                                panel_rows(isa, &w0[..k * NR], x, m, k, yp.0.add(p * NR), n, cols)
                            };
                            p += 1;
                        }
                    }
                    return;
                }
                for p in mine {
                    self.dequant_panel(isa, p, &mut s);
                    let cols = NR.min(n - p * NR);
                    // SAFETY: thread t writes only columns of its own panels; bounds
                    // were asserted above.
                    unsafe { panel_rows(isa, &s[..k * NR], x, m, k, yp.0.add(p * NR), n, cols) };
                }
            });
        });
    }
}

/// The integer at element `at + c` (`at` a multiple of 16) of either storage.
fn q_at(q: &[i8], q4: Option<&[u8]>, lo: i8, at: usize, c: usize) -> i8 {
    match q4 {
        Some(q4) => {
            let b = q4[at / 2 + c % 8];
            (if c < 8 { b & 0xF } else { b >> 4 }) as i8 + lo
        }
        None => q[at + c],
    }
}

fn slice16(s: &[f32]) -> &[f32; NR] {
    s[..NR].try_into().unwrap_or(&[0.0; NR])
}

/// Runs the microkernel over all rows for one dequantized panel `w` (`[k][16]`).
///
/// # Safety
/// `y` must be valid for writes at `y + r*ldy + c` for r < m, c < cols; `x` holds m*k.
#[allow(clippy::too_many_arguments)]
unsafe fn panel_rows(
    isa: Isa,
    w: &[f32],
    x: &[f32],
    m: usize,
    k: usize,
    y: *mut f32,
    ldy: usize,
    cols: usize,
) {
    let mut r = 0;
    while r < m {
        let left = m - r;
        let xr = &x[r * k..];
        // SAFETY: row offsets stay inside the caller's bounds.
        let yr = unsafe { y.add(r * ldy) };
        let done = match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Avx512 is only chosen when the CPU has it.
            Isa::Avx512 => unsafe { x86::tile_avx512(w, xr, left, k, yr, ldy, cols) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Avx is only chosen when the CPU has AVX and FMA.
            Isa::Avx => unsafe { x86::tile_avx(w, xr, left, k, yr, ldy, cols) },
            // SAFETY: as above.
            _ => unsafe { tile_scalar(w, xr, left, k, yr, ldy, cols) },
        };
        r += done;
    }
}

/// Scalar microkernel: up to 4 rows; returns rows done.
///
/// # Safety
/// As [`panel_rows`].
unsafe fn tile_scalar(
    w: &[f32],
    x: &[f32],
    m: usize,
    k: usize,
    y: *mut f32,
    ldy: usize,
    cols: usize,
) -> usize {
    let rows = m.min(4);
    for r in 0..rows {
        let mut acc = [0f32; NR];
        let xr = &x[r * k..r * k + k];
        for (kk, &xv) in xr.iter().enumerate() {
            let wk = &w[kk * NR..kk * NR + NR];
            for c in 0..NR {
                acc[c] = xv.mul_add(wk[c], acc[c]);
            }
        }
        for (c, &a) in acc.iter().enumerate().take(cols) {
            // SAFETY: caller guarantees the bounds.
            unsafe { *y.add(r * ldy + c) = a };
        }
    }
    rows
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Pool;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn quantized_gemm_paths_agree_bitwise() {
        // 8-bit integers, 4-bit unsigned (Q4_1/Q4_K) and 4-bit signed (Q4_0) storage
        // with f16 scales (as Q4_1/Q8_0 have) every q * scale is exact: the fused-FMA path
        for (scale_q, shift, packed, f16_scales) in [
            (31.99f32, 15i8, false, false),
            (15.99, 8, true, false),
            (15.99, 0, true, true),
            (31.99, 15, false, true),
        ] {
            quantized_case(scale_q, shift, packed, f16_scales);
        }
    }

    fn quantized_case(scale_q: f32, shift: i8, packed: bool, f16_scales: bool) {
        for k in [96, 416] {
            quantized_case_k(scale_q, shift, packed, f16_scales, k);
        }
    }

    fn quantized_case_k(scale_q: f32, shift: i8, packed: bool, f16_scales: bool, k: usize) {
        let round = |x: f32| {
            if f16_scales {
                half::f16::from_f32(x).to_f32()
            } else {
                x
            }
        };
        let n = 70;
        let mut seed = 11;
        let rows: Vec<Decomposed> = (0..n)
            .map(|_| Decomposed {
                group: 32,
                q: (0..k)
                    .map(|_| ((lcg(&mut seed) + 0.5) * scale_q) as i8 - shift)
                    .collect(),
                scale: (0..k / 32).map(|_| round(lcg(&mut seed) * 0.1)).collect(),
                offset: Some((0..k / 32).map(|_| lcg(&mut seed) * 0.05).collect()),
            })
            .collect();
        let lin = Linear::pack(n, k, Some(32), &mut |i| {
            Ok(RowSource::Quant(rows[i].clone()))
        })
        .unwrap();
        assert_eq!(
            matches!(&lin.data, Data::Quant { q4: Some(_), .. }),
            packed,
            "{scale_q} {shift}"
        );
        assert_eq!(
            matches!(&lin.data, Data::Quant { exact: true, .. }),
            f16_scales,
            "{scale_q} {shift}"
        );
        let m = 13;
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let mut want = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                let mut a = 0f32;
                for kk in 0..k {
                    a = x[r * k + kk].mul_add(rows[c].value(kk), a);
                }
                want[r * n + c] = a;
            }
        }
        let mut row = vec![0f32; k];
        lin.row(5, &mut row);
        assert!((0..k).all(|kk| row[kk] == rows[5].value(kk)));
        for isa in [Isa::Scalar, Isa::Avx, Isa::Avx512] {
            for threads in [1, 2] {
                let ctx = Ctx {
                    pool: Pool::new(threads),
                    isa: Isa::at_most(isa),
                };
                for rows in 1..=m {
                    let mut y = vec![0f32; rows * n];
                    lin.matmul(&ctx, &x, rows, &mut y);
                    for i in 0..rows * n {
                        assert_eq!(
                            y[i].to_bits(),
                            want[i].to_bits(),
                            "{isa:?} t={threads} rows={rows} i={i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn gemm_matches_reference_on_every_isa_and_thread_count() {
        for (n, k, m) in [(37, 64, 11), (45, 416, 19)] {
            gemm_case(n, k, m);
        }
    }

    fn gemm_case(n: usize, k: usize, m: usize) {
        let mut seed = 7;
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let lin = Linear::pack(n, k, None, &mut |i| {
            Ok(RowSource::F32(w[i * k..i * k + k].to_vec()))
        })
        .unwrap();
        let mut want = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                let mut a = 0f32;
                for kk in 0..k {
                    a = x[r * k + kk].mul_add(w[c * k + kk], a);
                }
                want[r * n + c] = a;
            }
        }
        for isa in [Isa::Scalar, Isa::Avx, Isa::Avx512] {
            for threads in [1, 2, 3] {
                let ctx = Ctx {
                    pool: Pool::new(threads),
                    isa: Isa::at_most(isa),
                };
                for rows in [1, 3, 9, m] {
                    let mut y = vec![0f32; rows * n];
                    lin.matmul(&ctx, &x, rows, &mut y);
                    for i in 0..rows * n {
                        assert_eq!(
                            y[i].to_bits(),
                            want[i].to_bits(),
                            "{isa:?} t={threads} rows={rows} i={i}"
                        );
                    }
                }
            }
        }
    }
}
