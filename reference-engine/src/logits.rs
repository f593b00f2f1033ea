//! Full next-token logits of a sequence, streamed: what the calibration ladder needs to
//! compare two engines over the whole vocabulary (2,000 positions × 49,152 logits would be
//! 400 MB at once; this hands out a bounded chunk of rows at a time).
//!
//! The rows are the ones [`Engine::score`] turns into logprobs (same forward pass, same
//! output head, the profile's activation knob applied to the head input as there), so a
//! log-softmax of a row gives the scored logprobs.

use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::forward::{BatchItem, forward};
use crate::kv::KvCache;

/// New tokens fed per forward pass.
const CHUNK: usize = 256;
/// Rows of logits held at once.
const ROWS: usize = 64;

impl Engine {
    /// Scores `tokens` and calls `on_row(p, logits)` for every position `p` in
    /// `0..tokens.len() - 1`, in order, with the raw logits (length `vocab_size`) of the
    /// token at `p + 1` given tokens `0..=p`.
    pub fn score_logits(
        &self,
        tokens: &[u32],
        on_row: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        let c = self.config();
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput("a sequence has no tokens".into()));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(EngineError::TokenOutOfVocab {
                token: t,
                vocab_size: c.vocab_size,
            });
        }
        if tokens.len() > c.n_ctx {
            return Err(EngineError::SequenceTooLong {
                len: tokens.len(),
                n_ctx: c.n_ctx,
            });
        }
        let (e, v) = (c.n_embd, c.vocab_size);
        let head = self.weights.head();
        let mut cache = KvCache::new(c.n_layer);
        let mut x = vec![0f32; ROWS * e];
        let mut logits = vec![0f32; ROWS * v];
        let mut fed = 0;
        while fed < tokens.len() {
            let n = (tokens.len() - fed).min(CHUNK);
            let hidden = forward(
                &self.weights,
                &self.ctx,
                &mut [BatchItem {
                    cache: &mut cache,
                    tokens: &tokens[fed..fed + n],
                }],
            )?;
            // positions with a next token to predict
            let wanted = n.min(tokens.len() - 1 - fed);
            let mut r = 0;
            while r < wanted {
                let rows = (wanted - r).min(ROWS);
                x[..rows * e].copy_from_slice(&hidden[r * e..(r + rows) * e]);
                self.weights
                    .numerics
                    .quantize_inputs(&mut x[..rows * e], rows, e);
                head.matmul(&self.ctx, &x[..rows * e], rows, &mut logits[..rows * v]);
                for j in 0..rows {
                    on_row(fed + r + j, &logits[j * v..(j + 1) * v]);
                }
                r += rows;
            }
            fed += n;
        }
        Ok(())
    }
}
