//! The x86-64 microkernels of the GEMM (AVX-512F and AVX+FMA): row tiles over one or two
//! dequantized panels, and the AVX-512 kernel that dequantizes 8-bit or 4-bit panels in
//! registers for small batches. Every output element is one FMA chain over k in order.

#![allow(clippy::needless_range_loop)] // index loops mirror the reference C code and the lanes

use std::arch::x86_64::*;

use super::NR;

macro_rules! tile512 {
    ($name:ident, $r:expr) => {
        #[target_feature(enable = "avx512f")]
        unsafe fn $name(w: &[f32], x: &[f32], k: usize, y: *mut f32, ldy: usize, mask: u16) {
            let mut acc = [_mm512_setzero_ps(); $r];
            let wp = w.as_ptr();
            let xp = x.as_ptr();
            for kk in 0..k {
                // SAFETY: w holds k*16, x holds rows*k (checked by the caller).
                let wv = unsafe { _mm512_loadu_ps(wp.add(kk * NR)) };
                for r in 0..$r {
                    let xv = unsafe { _mm512_set1_ps(*xp.add(r * k + kk)) };
                    acc[r] = _mm512_fmadd_ps(xv, wv, acc[r]);
                }
            }
            for r in 0..$r {
                // SAFETY: the mask limits the store to the valid columns.
                unsafe { _mm512_mask_storeu_ps(y.add(r * ldy), mask, acc[r]) };
            }
        }
    };
}
/// Arguments of the fused (dequantize-in-registers) kernel.
pub(super) struct Fused<'a> {
    pub q: &'a [i8],
    pub q4: &'a [u8],
    pub lo: i8,
    pub scale: &'a [f32],
    pub offset: &'a [f32],
    pub group: usize,
    pub k: usize,
    pub n: usize,
    /// Rows of x starting at `row0`.
    pub x: &'a [f32],
    /// Output base (row 0).
    pub y: *mut f32,
    pub ldy: usize,
    pub row0: usize,
}

/// Rows `row0..row0+rows` (rows in {1, 2, 4, 8}) times the panels in `panels`.
///
/// # Safety
/// AVX-512F must be available; `y` valid for those rows and panels' columns.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn fused_rows<const NIB: bool, const EXACT: bool>(
    a: &Fused<'_>,
    rows: usize,
    panels: std::ops::Range<usize>,
) {
    let mut p = panels.start;
    // SAFETY: forwarded.
    unsafe {
        while p < panels.end {
            let left = panels.end - p;
            let step = match rows {
                8 if left >= 2 => {
                    fused::<8, 2, NIB, EXACT>(a, p);
                    2
                }
                8 => {
                    fused::<8, 1, NIB, EXACT>(a, p);
                    1
                }
                4 if left >= 4 => {
                    fused::<4, 4, NIB, EXACT>(a, p);
                    4
                }
                4 => {
                    fused::<4, 1, NIB, EXACT>(a, p);
                    1
                }
                2 if left >= 4 => {
                    fused::<2, 4, NIB, EXACT>(a, p);
                    4
                }
                2 => {
                    fused::<2, 1, NIB, EXACT>(a, p);
                    1
                }
                _ if left >= 4 => {
                    fused::<1, 4, NIB, EXACT>(a, p);
                    4
                }
                _ => {
                    fused::<1, 1, NIB, EXACT>(a, p);
                    1
                }
            };
            p += step;
        }
    }
}

/// R rows × P panels starting at panel `p0`: `w = q * scale + offset` in registers, then
/// one FMA chain per output element over k in order (the same arithmetic as the
/// scratch path).
#[target_feature(enable = "avx512f")]
unsafe fn fused<const R: usize, const P: usize, const NIB: bool, const EXACT: bool>(
    a: &Fused<'_>,
    p0: usize,
) {
    let (k, group) = (a.k, a.group);
    let ng = k / group;
    let q_len = if NIB { a.q4.len() * 2 } else { a.q.len() };
    assert!(
        a.x.len() >= R * k && (p0 + P) * k * NR <= q_len && (p0 + P) * ng * NR <= a.scale.len()
    );
    let q4p = a.q4.as_ptr();
    let nib_mask = _mm_set1_epi8(0x0F);
    let lo8 = _mm_set1_epi8(a.lo);
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    let qp = a.q.as_ptr();
    let xp = a.x.as_ptr();
    for g in 0..ng {
        let mut s = [_mm512_setzero_ps(); P];
        let mut o = [_mm512_setzero_ps(); P];
        for j in 0..P {
            // SAFETY: bounds asserted above.
            unsafe {
                s[j] = _mm512_loadu_ps(a.scale.as_ptr().add(((p0 + j) * ng + g) * NR));
                o[j] = _mm512_loadu_ps(a.offset.as_ptr().add(((p0 + j) * ng + g) * NR));
            }
        }
        for kk in g * group..(g + 1) * group {
            let mut w = [_mm512_setzero_ps(); P];
            for j in 0..P {
                let qv = if NIB {
                    // SAFETY: bounds asserted above (8 bytes per 16 values).
                    let v = unsafe { _mm_loadl_epi64(q4p.add(((p0 + j) * k + kk) * 8).cast()) };
                    let low = _mm_and_si128(v, nib_mask);
                    let high = _mm_and_si128(_mm_srli_epi16::<4>(v), nib_mask);
                    _mm_add_epi8(_mm_unpacklo_epi64(low, high), lo8)
                } else {
                    // SAFETY: bounds asserted above.
                    unsafe { _mm_loadu_si128(qp.add(((p0 + j) * k + kk) * NR).cast()) }
                };
                let wf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qv));
                // EXACT: every q * scale of this matrix is exact in f32, so the fused
                // multiply-add rounds once, exactly like the multiply-then-add
                w[j] = if EXACT {
                    _mm512_fmadd_ps(wf, s[j], o[j])
                } else {
                    _mm512_add_ps(_mm512_mul_ps(wf, s[j]), o[j])
                };
            }
            for r in 0..R {
                // SAFETY: bounds asserted above.
                let xb = unsafe { _mm512_set1_ps(*xp.add(r * k + kk)) };
                for j in 0..P {
                    acc[r][j] = _mm512_fmadd_ps(xb, w[j], acc[r][j]);
                }
            }
        }
    }
    for j in 0..P {
        let col = (p0 + j) * NR;
        let cols = NR.min(a.n - col);
        let mask: u16 = if cols >= 16 {
            0xFFFF
        } else {
            (1u16 << cols) - 1
        };
        for r in 0..R {
            // SAFETY: the caller guarantees y for these rows and columns.
            unsafe { _mm512_mask_storeu_ps(a.y.add((a.row0 + r) * a.ldy + col), mask, acc[r][j]) };
        }
    }
}

macro_rules! tile512x2 {
    ($name:ident, $r:expr) => {
        #[target_feature(enable = "avx512f")]
        unsafe fn $name(
            w0: &[f32],
            w1: &[f32],
            x: &[f32],
            k: usize,
            y: *mut f32,
            ldy: usize,
            mask1: u16,
        ) {
            let mut a0 = [_mm512_setzero_ps(); $r];
            let mut a1 = [_mm512_setzero_ps(); $r];
            let (p0, p1, xp) = (w0.as_ptr(), w1.as_ptr(), x.as_ptr());
            for kk in 0..k {
                // SAFETY: w0/w1 hold k*16, x holds rows*k (checked by the caller).
                let (v0, v1) = unsafe {
                    (
                        _mm512_loadu_ps(p0.add(kk * NR)),
                        _mm512_loadu_ps(p1.add(kk * NR)),
                    )
                };
                for r in 0..$r {
                    let xv = unsafe { _mm512_set1_ps(*xp.add(r * k + kk)) };
                    a0[r] = _mm512_fmadd_ps(xv, v0, a0[r]);
                    a1[r] = _mm512_fmadd_ps(xv, v1, a1[r]);
                }
            }
            for r in 0..$r {
                // SAFETY: the first panel is whole; the mask limits the second.
                unsafe {
                    _mm512_storeu_ps(y.add(r * ldy), a0[r]);
                    _mm512_mask_storeu_ps(y.add(r * ldy + NR), mask1, a1[r]);
                }
            }
        }
    };
}
tile512x2!(t512x2_1, 1);
tile512x2!(t512x2_2, 2);
tile512x2!(t512x2_4, 4);
tile512x2!(t512x2_8, 8);

/// All rows times two dequantized panels (`w0` whole, `w1` with `cols1` valid columns).
///
/// # Safety
/// AVX-512F available; `y` valid for m rows of 16 + cols1 columns at stride `ldy`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pair_rows(
    w0: &[f32],
    w1: &[f32],
    x: &[f32],
    m: usize,
    k: usize,
    y: *mut f32,
    ldy: usize,
    cols1: usize,
) {
    assert!(w0.len() >= k * NR && w1.len() >= k * NR && x.len() >= m * k);
    let mask1: u16 = if cols1 >= 16 {
        0xFFFF
    } else {
        (1u16 << cols1) - 1
    };
    let mut r = 0;
    while r < m {
        let (xr, yr) = (&x[r * k..], unsafe { y.add(r * ldy) });
        // SAFETY: bounds asserted above; rows r.. exist.
        let done = unsafe {
            match m - r {
                8.. => {
                    t512x2_8(w0, w1, xr, k, yr, ldy, mask1);
                    8
                }
                4..=7 => {
                    t512x2_4(w0, w1, xr, k, yr, ldy, mask1);
                    4
                }
                2..=3 => {
                    t512x2_2(w0, w1, xr, k, yr, ldy, mask1);
                    2
                }
                _ => {
                    t512x2_1(w0, w1, xr, k, yr, ldy, mask1);
                    1
                }
            }
        };
        r += done;
    }
}

tile512!(t512_1, 1);
tile512!(t512_2, 2);
tile512!(t512_4, 4);
tile512!(t512_8, 8);

/// AVX-512 microkernel; returns rows done.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile_avx512(
    w: &[f32],
    x: &[f32],
    m: usize,
    k: usize,
    y: *mut f32,
    ldy: usize,
    cols: usize,
) -> usize {
    assert!(w.len() >= k * NR && x.len() >= m.min(8) * k);
    let mask: u16 = if cols >= 16 {
        0xFFFF
    } else {
        (1u16 << cols) - 1
    };
    // SAFETY: bounds asserted above and guaranteed for y by the caller.
    unsafe {
        if m >= 8 {
            t512_8(w, x, k, y, ldy, mask);
            8
        } else if m >= 4 {
            t512_4(w, x, k, y, ldy, mask);
            4
        } else if m >= 2 {
            t512_2(w, x, k, y, ldy, mask);
            2
        } else {
            t512_1(w, x, k, y, ldy, mask);
            1
        }
    }
}

macro_rules! tile256 {
    ($name:ident, $r:expr) => {
        #[target_feature(enable = "avx,fma")]
        unsafe fn $name(w: &[f32], x: &[f32], k: usize, out: &mut [[f32; NR]]) {
            let mut lo = [_mm256_setzero_ps(); $r];
            let mut hi = [_mm256_setzero_ps(); $r];
            let wp = w.as_ptr();
            let xp = x.as_ptr();
            for kk in 0..k {
                // SAFETY: bounds checked by the caller.
                let (w0, w1) = unsafe {
                    (
                        _mm256_loadu_ps(wp.add(kk * NR)),
                        _mm256_loadu_ps(wp.add(kk * NR + 8)),
                    )
                };
                for r in 0..$r {
                    let xv = unsafe { _mm256_set1_ps(*xp.add(r * k + kk)) };
                    lo[r] = _mm256_fmadd_ps(xv, w0, lo[r]);
                    hi[r] = _mm256_fmadd_ps(xv, w1, hi[r]);
                }
            }
            for r in 0..$r {
                // SAFETY: out rows hold 16 floats.
                unsafe {
                    _mm256_storeu_ps(out[r].as_mut_ptr(), lo[r]);
                    _mm256_storeu_ps(out[r].as_mut_ptr().add(8), hi[r]);
                }
            }
        }
    };
}
tile256!(t256_1, 1);
tile256!(t256_2, 2);
tile256!(t256_4, 4);
tile256!(t256_6, 6);

/// AVX+FMA microkernel (256-bit); returns rows done.
#[target_feature(enable = "avx,fma")]
pub(super) unsafe fn tile_avx(
    w: &[f32],
    x: &[f32],
    m: usize,
    k: usize,
    y: *mut f32,
    ldy: usize,
    cols: usize,
) -> usize {
    assert!(w.len() >= k * NR && x.len() >= m.min(6) * k);
    // six rows keep twelve independent FMA chains in flight (enough to cover the FMA latency
    // on two ports) in 15 of the 16 vector registers
    let mut out = [[0f32; NR]; 6];
    let rows = if m >= 6 {
        6
    } else if m >= 4 {
        4
    } else if m >= 2 {
        2
    } else {
        1
    };
    // SAFETY: bounds asserted above.
    unsafe {
        match rows {
            6 => t256_6(w, x, k, &mut out),
            4 => t256_4(w, x, k, &mut out),
            2 => t256_2(w, x, k, &mut out),
            _ => t256_1(w, x, k, &mut out),
        }
    }
    for (r, o) in out.iter().enumerate().take(rows) {
        for (c, &v) in o.iter().enumerate().take(cols) {
            // SAFETY: caller guarantees the bounds.
            unsafe { *y.add(r * ldy + c) = v };
        }
    }
    rows
}

/// [`fused_rows`] for AVX+FMA: the same arithmetic in 256-bit halves of each 16-column panel
/// (rows in {1, 2, 4, 8}; eight rows are two runs of four).
///
/// # Safety
/// AVX and FMA must be available; `y` valid for those rows and panels' columns.
#[target_feature(enable = "avx,fma")]
pub(super) unsafe fn fused_rows_avx<const NIB: bool, const EXACT: bool>(
    a: &Fused<'_>,
    rows: usize,
    panels: std::ops::Range<usize>,
) {
    let mut p = panels.start;
    // SAFETY: forwarded.
    unsafe {
        while p < panels.end {
            let two = panels.end - p >= 2;
            let step = match rows {
                8 => {
                    fused_avx::<4, 1, NIB, EXACT>(a, p, 0);
                    fused_avx::<4, 1, NIB, EXACT>(a, p, 4);
                    1
                }
                4 => {
                    fused_avx::<4, 1, NIB, EXACT>(a, p, 0);
                    1
                }
                2 if two => {
                    fused_avx::<2, 2, NIB, EXACT>(a, p, 0);
                    2
                }
                2 => {
                    fused_avx::<2, 1, NIB, EXACT>(a, p, 0);
                    1
                }
                _ if two => {
                    fused_avx::<1, 2, NIB, EXACT>(a, p, 0);
                    2
                }
                _ => {
                    fused_avx::<1, 1, NIB, EXACT>(a, p, 0);
                    1
                }
            };
            p += step;
        }
    }
}

/// R rows (from row `r0` of `a.x`) × P panels from `p0`, AVX+FMA: [`fused`]'s arithmetic,
/// columns 0–7 and 8–15 of a panel in two vectors.
#[target_feature(enable = "avx,fma")]
unsafe fn fused_avx<const R: usize, const P: usize, const NIB: bool, const EXACT: bool>(
    a: &Fused<'_>,
    p0: usize,
    r0: usize,
) {
    let (k, group) = (a.k, a.group);
    let ng = k / group;
    let q_len = if NIB { a.q4.len() * 2 } else { a.q.len() };
    assert!(
        a.x.len() >= (r0 + R) * k
            && (p0 + P) * k * NR <= q_len
            && (p0 + P) * ng * NR <= a.scale.len()
            && (p0 + P) * ng * NR <= a.offset.len()
    );
    let nib_mask = _mm_set1_epi8(0x0F);
    let lo8 = _mm_set1_epi8(a.lo);
    let mut acc = [[[_mm256_setzero_ps(); 2]; P]; R];
    let (qp, q4p, xp) = (a.q.as_ptr(), a.q4.as_ptr(), a.x.as_ptr());
    for g in 0..ng {
        let (mut s, mut o) = ([[_mm256_setzero_ps(); 2]; P], [[_mm256_setzero_ps(); 2]; P]);
        for j in 0..P {
            let at = ((p0 + j) * ng + g) * NR;
            // SAFETY: bounds asserted above.
            unsafe {
                s[j] = [
                    _mm256_loadu_ps(a.scale.as_ptr().add(at)),
                    _mm256_loadu_ps(a.scale.as_ptr().add(at + 8)),
                ];
                o[j] = [
                    _mm256_loadu_ps(a.offset.as_ptr().add(at)),
                    _mm256_loadu_ps(a.offset.as_ptr().add(at + 8)),
                ];
            }
        }
        for kk in g * group..(g + 1) * group {
            let mut w = [[_mm256_setzero_ps(); 2]; P];
            for j in 0..P {
                let qv = if NIB {
                    // SAFETY: bounds asserted above (8 bytes per 16 values).
                    let v = unsafe { _mm_loadl_epi64(q4p.add(((p0 + j) * k + kk) * 8).cast()) };
                    let low = _mm_and_si128(v, nib_mask);
                    let high = _mm_and_si128(_mm_srli_epi16::<4>(v), nib_mask);
                    _mm_add_epi8(_mm_unpacklo_epi64(low, high), lo8)
                } else {
                    // SAFETY: bounds asserted above.
                    unsafe { _mm_loadu_si128(qp.add(((p0 + j) * k + kk) * NR).cast()) }
                };
                let c0 = _mm_cvtepi8_epi32(qv);
                let c1 = _mm_cvtepi8_epi32(_mm_srli_si128::<4>(qv));
                let c2 = _mm_cvtepi8_epi32(_mm_srli_si128::<8>(qv));
                let c3 = _mm_cvtepi8_epi32(_mm_srli_si128::<12>(qv));
                let wf = [
                    _mm256_cvtepi32_ps(_mm256_set_m128i(c1, c0)),
                    _mm256_cvtepi32_ps(_mm256_set_m128i(c3, c2)),
                ];
                for h in 0..2 {
                    // EXACT: as in `fused`, the fused multiply-add rounds once, like the
                    // multiply-then-add of an exact product
                    w[j][h] = if EXACT {
                        _mm256_fmadd_ps(wf[h], s[j][h], o[j][h])
                    } else {
                        _mm256_add_ps(_mm256_mul_ps(wf[h], s[j][h]), o[j][h])
                    };
                }
            }
            for r in 0..R {
                // SAFETY: bounds asserted above.
                let xb = unsafe { _mm256_set1_ps(*xp.add((r0 + r) * k + kk)) };
                for j in 0..P {
                    for h in 0..2 {
                        acc[r][j][h] = _mm256_fmadd_ps(xb, w[j][h], acc[r][j][h]);
                    }
                }
            }
        }
    }
    for j in 0..P {
        let col = (p0 + j) * NR;
        let cols = NR.min(a.n - col);
        for r in 0..R {
            let yr = a.row0 + r0 + r;
            if cols == NR {
                // SAFETY: the caller guarantees y for these rows and columns.
                unsafe {
                    _mm256_storeu_ps(a.y.add(yr * a.ldy + col), acc[r][j][0]);
                    _mm256_storeu_ps(a.y.add(yr * a.ldy + col + 8), acc[r][j][1]);
                }
            } else {
                let mut out = [0f32; NR];
                // SAFETY: out holds 16 floats.
                unsafe {
                    _mm256_storeu_ps(out.as_mut_ptr(), acc[r][j][0]);
                    _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[r][j][1]);
                }
                for (c, &v) in out.iter().enumerate().take(cols) {
                    // SAFETY: c < cols, inside the caller's bounds.
                    unsafe { *a.y.add(yr * a.ldy + col + c) = v };
                }
            }
        }
    }
}
