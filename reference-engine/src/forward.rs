//! The batched forward pass: any number of sequences, each with any number of new tokens
//! appended to its KV cache, computed as one stack of row-wise operations and GEMMs.
//!
//! Rows never interact except through attention, which reads only the row's own sequence
//! cache; with the kernels' fixed reduction orders this makes every row's result
//! independent of what else is in the batch and of how its sequence was chunked.

use crate::error::{EngineError, Result};
use crate::kernels::{Ctx, SyncPtr, attention, ops};
use crate::kv::KvCache;
use crate::model::Weights;

/// One sequence's part of a batch.
pub struct BatchItem<'a> {
    /// Its cache (extended by `tokens`).
    pub cache: &'a mut KvCache,
    /// New tokens, at positions `cache.len()..`.
    pub tokens: &'a [u32],
}

/// Runs the decoder over all new tokens; returns the final-normed hidden states `[M][n_embd]`
/// in item order.
pub fn forward(w: &Weights, ctx: &Ctx, items: &mut [BatchItem<'_>]) -> Result<Vec<f32>> {
    let c = &w.config;
    let (e, hd) = (c.n_embd, c.head_dim);
    let (nh, nkv) = (c.n_head, c.n_head_kv);
    let (qd, kvd) = (nh * hd, nkv * hd);
    let qkvd = c.qkv_dim();
    let half = hd / 2;
    let rows = batch_rows(c, items)?;
    let m = rows.len();
    if m == 0 {
        return Ok(Vec::new());
    }
    let mut x = embeddings(w, items, m);
    let (cos, sin) = rope_tables(w, &rows);
    let mut h = vec![0f32; m * e];
    let mut qkv = vec![0f32; m * qkvd];
    let mut att = vec![0f32; m * qd];
    let mut o = vec![0f32; m * e];
    let mut gu = vec![0f32; m * 2 * c.n_ff];
    let mut act = vec![0f32; m * c.n_ff];
    let isa = ctx.isa;
    let scale = 1.0 / (hd as f32).sqrt();
    for (li, layer) in w.layers.iter().enumerate() {
        for r in 0..m {
            ops::rms_norm(
                isa,
                &x[r * e..(r + 1) * e],
                &layer.attn_norm,
                c.rms_eps,
                &mut h[r * e..(r + 1) * e],
            );
        }
        w.numerics.quantize_inputs(&mut h, m, e);
        layer.qkv.matmul(ctx, &h, m, &mut qkv);
        for r in 0..m {
            let row = &mut qkv[r * qkvd..(r + 1) * qkvd];
            if let Some(b) = &layer.qkv_bias {
                for (v, &bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            }
            let (cs, sn) = (
                &cos[r * half..(r + 1) * half],
                &sin[r * half..(r + 1) * half],
            );
            let mut tmp = vec![0f32; hd];
            for head in 0..nh + nkv {
                let v = &mut row[head * hd..(head + 1) * hd];
                if let Some((qn, kn)) = &layer.qk_norm {
                    ops::rms_norm(isa, v, if head < nh { qn } else { kn }, c.rms_eps, &mut tmp);
                    v.copy_from_slice(&tmp);
                }
                ops::rope(v, cs, sn);
            }
            // the profile's KV-cache format: each key/value head rounded as stored
            w.numerics.round_kv(&mut row[qd..qd + 2 * kvd], hd);
        }
        // append k, v to the caches
        let mut r = 0;
        for it in items.iter_mut() {
            let start = it.cache.len;
            let (kc, vc) = &mut it.cache.layers[li];
            for j in 0..it.tokens.len() {
                let row = &qkv[r * qkvd..(r + 1) * qkvd];
                // keys in blocks of 16 positions, `[block][kv_head][d][16]`
                let (pos, block, lane) = (start + j, (start + j) / 16, (start + j) % 16);
                if kc.len() < (block + 1) * kvd * 16 {
                    kc.resize((block + 1) * kvd * 16, 0.0);
                }
                for (i, &kv) in row[qd..qd + kvd].iter().enumerate() {
                    kc[block * kvd * 16 + i * 16 + lane] = kv;
                }
                debug_assert_eq!(vc.len(), pos * kvd);
                vc.extend_from_slice(&row[qd + kvd..qd + 2 * kvd]);
                r += 1;
            }
        }
        // attention: one work item per (row, key/value head), for the query heads sharing it
        {
            let caches: Vec<&KvCache> = items.iter().map(|it| &*it.cache).collect();
            let ap = SyncPtr(att.as_mut_ptr());
            let qkv = &qkv;
            let rows = &rows;
            let group = nh / nkv;
            let gd = group * hd;
            ctx.pool.for_chunks(m * nkv, (8 / group).max(1), &|items| {
                // capture the whole Sync wrapper, not its raw-pointer field
                #[allow(clippy::redundant_locals)]
                let ap = ap;
                let mut scores = Vec::new();
                for wi in items {
                    let (r, kvh) = (wi / nkv, wi % nkv);
                    let (item, pos) = rows[r];
                    let (kc, vc) = &caches[item].layers[li];
                    let qs = &qkv[r * qkvd + kvh * gd..r * qkvd + (kvh + 1) * gd];
                    // SAFETY: each (row, key/value head) slice of `att` — its group's query
                    // heads — is written by exactly one thread.
                    let out =
                        unsafe { std::slice::from_raw_parts_mut(ap.0.add(r * qd + kvh * gd), gd) };
                    let kv = ops::KvHead {
                        keys: kc,
                        values: vc,
                        stride: kvd,
                        off: kvh * hd,
                        n_keys: pos + 1,
                    };
                    attention::attend_group(isa, hd, qs, kv, scale, &mut scores, out);
                }
            });
        }
        w.numerics.quantize_inputs(&mut att, m, qd);
        layer.wo.matmul(ctx, &att, m, &mut o);
        for (xv, &ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }
        for r in 0..m {
            ops::rms_norm(
                isa,
                &x[r * e..(r + 1) * e],
                &layer.ffn_norm,
                c.rms_eps,
                &mut h[r * e..(r + 1) * e],
            );
        }
        w.numerics.quantize_inputs(&mut h, m, e);
        layer.gate_up.matmul(ctx, &h, m, &mut gu);
        let f = c.n_ff;
        {
            let actp = SyncPtr(act.as_mut_ptr());
            let gu = &gu;
            ctx.pool.for_chunks(m, 4, &|rows| {
                // capture the whole Sync wrapper, not its raw-pointer field
                #[allow(clippy::redundant_locals)]
                let actp = actp;
                for r in rows {
                    let g = &gu[r * 2 * f..(r + 1) * 2 * f];
                    // SAFETY: each row of `act` is written by exactly one thread.
                    let a = unsafe { std::slice::from_raw_parts_mut(actp.0.add(r * f), f) };
                    ops::silu_mul(isa, &g[..f], &g[f..], a);
                }
            });
        }
        w.numerics.quantize_inputs(&mut act, m, c.n_ff);
        layer.down.matmul(ctx, &act, m, &mut o);
        for (xv, &ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }
    }
    for it in items.iter_mut() {
        it.cache.len += it.tokens.len();
    }
    for r in 0..m {
        ops::rms_norm(
            isa,
            &x[r * e..(r + 1) * e],
            &w.output_norm,
            c.rms_eps,
            &mut h[r * e..(r + 1) * e],
        );
    }
    Ok(h)
}

/// The batch's rows as (item, position), after checking every item against the model: its
/// length within the context window, its cache this model's, its tokens in the vocabulary.
pub(crate) fn batch_rows(
    c: &crate::config::ModelConfig,
    items: &[BatchItem<'_>],
) -> Result<Vec<(usize, usize)>> {
    let mut rows = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let start = it.cache.len;
        if start + it.tokens.len() > c.n_ctx {
            return Err(EngineError::SequenceTooLong {
                len: start + it.tokens.len(),
                n_ctx: c.n_ctx,
            });
        }
        if it.cache.layers.len() != c.n_layer {
            return Err(EngineError::InvalidRequest(
                "KV cache belongs to another model".into(),
            ));
        }
        for (j, &t) in it.tokens.iter().enumerate() {
            if t as usize >= c.vocab_size {
                return Err(EngineError::TokenOutOfVocab {
                    token: t,
                    vocab_size: c.vocab_size,
                });
            }
            rows.push((i, start + j));
        }
    }
    Ok(rows)
}

/// The input embeddings of the batch's `m` new tokens, `[m][n_embd]`.
pub(crate) fn embeddings(w: &Weights, items: &[BatchItem<'_>], m: usize) -> Vec<f32> {
    let e = w.config.n_embd;
    let mut x = vec![0f32; m * e];
    let mut r = 0;
    for it in items {
        for &t in it.tokens {
            w.embed.row(t as usize, &mut x[r * e..(r + 1) * e]);
            r += 1;
        }
    }
    x
}

/// The RoPE tables of each row's position, `[m][head_dim / 2]` cosines and sines, computed
/// once on the host in f64 and rounded to f32 (every backend uses these same tables).
pub(crate) fn rope_tables(w: &Weights, rows: &[(usize, usize)]) -> (Vec<f32>, Vec<f32>) {
    let half = w.config.head_dim / 2;
    let mut cos = vec![0f32; rows.len() * half];
    let mut sin = vec![0f32; rows.len() * half];
    for (r, &(_, pos)) in rows.iter().enumerate() {
        for (i, &f) in w.inv_freq.iter().enumerate() {
            let a = f64::from(f * pos as f32);
            cos[r * half + i] = a.cos() as f32;
            sin[r * half + i] = a.sin() as f32;
        }
    }
    (cos, sin)
}
