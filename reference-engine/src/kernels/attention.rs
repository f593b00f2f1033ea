//! Attention for the query heads that share one key/value head (grouped-query attention):
//! [`attend_group`] gives each of them exactly what [`super::ops::attend`] gives it alone,
//! bit for bit, but reads every key and value once for the whole group.
//!
//! Why: one query head at a time, the AVX-512 score and value loops keep four FMA chains in
//! flight, half of what two FMA pipes with a four-cycle latency need, and load one key or
//! value vector per FMA. Interleaving the group's heads (3 in the test model, 4 in Llama 3's
//! 1B and 8B shapes) fills the pipes and reuses each load across the group. Every score lane is
//! still one FMA chain over d in order, every output element one FMA chain over j in order,
//! and the softmax is the same call per head, so nothing a head gets depends on its group.

use super::Isa;
use super::ops::{KvHead, attend, softmax};

/// Causal attention for the query heads `qs` (`g` heads of `head_dim` values each, laid out
/// one after another) that share the key/value head `kv`; head i's result goes to
/// `out[i * head_dim..(i + 1) * head_dim]`. `scores` is scratch. Bit-identical to calling
/// [`attend`] once per head.
pub fn attend_group(
    isa: Isa,
    head_dim: usize,
    qs: &[f32],
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
    let hd = head_dim;
    assert!(hd > 0 && qs.len() == out.len() && qs.len().is_multiple_of(hd));
    let g = qs.len() / hd;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && hd.is_multiple_of(16) && hd <= 128 {
        let blocks = n_keys.div_ceil(16);
        let padded = blocks * 16;
        if scores.len() < g * padded {
            scores.resize(g * padded, 0.0);
        }
        // scores: up to four heads per pass (4 blocks x 4 heads = 16 accumulators)
        let mut h = 0;
        while h < g {
            let n = (g - h).min(4);
            let q = &qs[h * hd..(h + n) * hd];
            let sc = &mut scores[h * padded..(h + n) * padded];
            // SAFETY: chosen only when the CPU supports AVX-512F (Isa::Avx512).
            unsafe {
                match n {
                    1 => x86::scores::<1>(q, keys, stride, off, blocks, sc),
                    2 => x86::scores::<2>(q, keys, stride, off, blocks, sc),
                    3 => x86::scores::<3>(q, keys, stride, off, blocks, sc),
                    _ => x86::scores::<4>(q, keys, stride, off, blocks, sc),
                }
            }
            h += n;
        }
        for i in 0..g {
            softmax(isa, &mut scores[i * padded..i * padded + n_keys], scale);
        }
        // values: heads per pass so that their accumulators (hd / 16 each) stay at most 16
        let chunks = hd / 16;
        let per = (16 / chunks).clamp(1, 4);
        let mut h = 0;
        while h < g {
            let n = (g - h).min(per);
            let p = &scores[h * padded..(h + n) * padded];
            let o = &mut out[h * hd..(h + n) * hd];
            macro_rules! pv {
                ($c:literal) => {
                    // SAFETY: as above.
                    unsafe {
                        match n {
                            1 => x86::pv::<1, $c>(p, padded, n_keys, values, stride, off, o),
                            2 => x86::pv::<2, $c>(p, padded, n_keys, values, stride, off, o),
                            3 => x86::pv::<3, $c>(p, padded, n_keys, values, stride, off, o),
                            _ => x86::pv::<4, $c>(p, padded, n_keys, values, stride, off, o),
                        }
                    }
                };
            }
            match chunks {
                1 => pv!(1),
                2 => pv!(2),
                3 => pv!(3),
                4 => pv!(4),
                5 => pv!(5),
                6 => pv!(6),
                7 => pv!(7),
                _ => pv!(8),
            }
            h += n;
        }
        return;
    }
    for (q, o) in qs.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        attend(isa, q, kv, scale, scores, o);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The scores of `G` heads (`q`: G x hd) against `blocks` key blocks of 16 positions:
    /// lane l of block b of head i is the FMA chain over d of q_i[d]·k[b][d][l], as in
    /// `ops::x86::scores_avx512`; head i's scores go to `scores[i * blocks * 16..]`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores<const G: usize>(
        q: &[f32],
        keys: &[f32],
        stride: usize,
        off: usize,
        blocks: usize,
        scores: &mut [f32],
    ) {
        let hd = q.len() / G;
        let padded = blocks * 16;
        assert!(q.len() == G * hd && scores.len() >= G * padded);
        assert!(blocks == 0 || (blocks - 1) * stride * 16 + (off + hd) * 16 <= keys.len());
        let kp = keys.as_ptr();
        let sp = scores.as_mut_ptr();
        let mut b = 0;
        while b + 4 <= blocks {
            let mut acc = [[_mm512_setzero_ps(); G]; 4];
            for d in 0..hd {
                // SAFETY: bounds asserted above.
                let kv: [__m512; 4] = std::array::from_fn(|i| unsafe {
                    _mm512_loadu_ps(kp.add((b + i) * stride * 16 + (off + d) * 16))
                });
                for h in 0..G {
                    let qv = _mm512_set1_ps(q[h * hd + d]);
                    for i in 0..4 {
                        acc[i][h] = _mm512_fmadd_ps(qv, kv[i], acc[i][h]);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (h, a) in row.iter().enumerate() {
                    // SAFETY: scores holds G * padded.
                    unsafe { _mm512_storeu_ps(sp.add(h * padded + (b + i) * 16), *a) };
                }
            }
            b += 4;
        }
        while b < blocks {
            let mut acc = [_mm512_setzero_ps(); G];
            for d in 0..hd {
                // SAFETY: bounds asserted above.
                let kv = unsafe { _mm512_loadu_ps(kp.add(b * stride * 16 + (off + d) * 16)) };
                for (h, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(q[h * hd + d]), kv, *a);
                }
            }
            for (h, a) in acc.iter().enumerate() {
                // SAFETY: scores holds G * padded.
                unsafe { _mm512_storeu_ps(sp.add(h * padded + b * 16), *a) };
            }
            b += 1;
        }
    }

    /// `out_i[d] = Σ_j p_i[j]·v[j][off + d]` for `G` heads of `C` · 16 values each (`p`: head
    /// i's probabilities at `p[i * padded..][..n_keys]`), one FMA chain per (i, d) over j in
    /// order, as in `ops::x86::pv_avx512`; the G · C accumulators stay in registers.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pv<const G: usize, const C: usize>(
        p: &[f32],
        padded: usize,
        n_keys: usize,
        values: &[f32],
        stride: usize,
        off: usize,
        out: &mut [f32],
    ) {
        let hd = C * 16;
        assert!(out.len() == G * hd);
        assert!(n_keys <= padded && p.len() >= (G - 1) * padded + n_keys);
        assert!(n_keys == 0 || (n_keys - 1) * stride + off + hd <= values.len());
        let vp = values.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); C]; G];
        for j in 0..n_keys {
            // SAFETY: bounds asserted above.
            let v: [__m512; C] = std::array::from_fn(|c| unsafe {
                _mm512_loadu_ps(vp.add(j * stride + off + c * 16))
            });
            for (h, row) in acc.iter_mut().enumerate() {
                let pv = _mm512_set1_ps(p[h * padded + j]);
                for (a, vc) in row.iter_mut().zip(v) {
                    *a = _mm512_fmadd_ps(pv, vc, *a);
                }
            }
        }
        for (h, row) in acc.iter().enumerate() {
            for (c, a) in row.iter().enumerate() {
                // SAFETY: out holds G * hd.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * hd + c * 16), *a) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ops::tests::test_cache;
    use super::*;

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// A group of `g` heads of `hd` against `n` positions of the second of two key/value
    /// heads: each head alone through `attend` on the scalar path, then the group through
    /// `attend_group` on every path this CPU runs, from scratch left dirty.
    fn check(hd: usize, g: usize, n: usize, seed: u32) {
        let (keys, values, stride) = test_cache(hd, 2, n, seed);
        let kv = KvHead {
            keys: &keys,
            values: &values,
            stride,
            off: hd,
            n_keys: n,
        };
        let qs: Vec<f32> = (0..g * hd)
            .map(|d| ((d as u32 * 13 + seed) as f32 * 0.29).sin())
            .collect();
        let mut want = vec![0f32; qs.len()];
        let mut scores = Vec::new();
        for (q, o) in qs.chunks_exact(hd).zip(want.chunks_exact_mut(hd)) {
            attend(Isa::Scalar, q, kv, 0.125, &mut scores, o);
        }
        for isa in [Isa::Scalar, Isa::Avx, Isa::Avx512] {
            let isa = Isa::at_most(isa);
            let mut scores = vec![f32::NAN; 7];
            let mut out = vec![f32::NAN; g * hd];
            attend_group(isa, hd, &qs, kv, 0.125, &mut scores, &mut out);
            assert_eq!(
                bits(&out),
                bits(&want),
                "{isa:?} hd {hd} g {g} n {n} seed {seed}"
            );
        }
    }

    #[test]
    fn a_group_gets_what_each_head_gets_alone() {
        // the test model (hd 64, 3 heads a group), Llama 3 8B's (128, 4), a 1-head group, 5
        // heads (a pass of 4 and one of 1), head_dim 24 (no AVX-512 path: one by one); key
        // counts below, at and past a block, and past four blocks with a partial one
        for (hd, g) in [(64, 3), (128, 4), (64, 1), (64, 5), (32, 2), (24, 3)] {
            for n in [1, 15, 16, 17, 64, 75] {
                check(hd, g, n, 1);
            }
        }
    }

    #[test]
    fn every_group_shape_matches_its_heads() {
        // every head_dim multiple of 16 up to 128 the AVX-512 path takes, groups of 1 to 6
        // heads (passes of 4 and the rest), key counts around block edges and past 4 blocks
        for hd in [16, 32, 48, 64, 80, 96, 112, 128] {
            for g in 1..=6 {
                for (k, n) in [1, 2, 15, 16, 33, 63, 64, 65, 129].into_iter().enumerate() {
                    check(hd, g, n, (hd * 7 + g * 3 + k) as u32);
                }
            }
        }
    }
}
