//! Full next-token logits of a sequence: what the calibration ladder needs to compare two
//! engines over the whole vocabulary. [`Engine::score_logits`] streams them (2,000 positions ×
//! 49,152 logits would be 400 MB at once; it hands out a bounded chunk of rows at a time);
//! [`Engine::score_logits_into`] writes them all into a caller's buffer, running the output
//! head once per forward chunk (fewer passes over the head's weights) with no copy, for a
//! caller that holds a sequence's rows anyway and reuses the buffer.
//!
//! The rows are the ones [`Engine::score`] turns into logprobs (same forward pass, same
//! output head, the profile's activation knob applied to the head input as there), so a
//! log-softmax of a row gives the scored logprobs. Both functions give the same bits: a row's
//! logits do not depend on how many rows share a head matmul (batch invariance).

use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::forward::{BatchItem, forward};
use crate::kv::KvCache;

/// New tokens fed per forward pass.
const CHUNK: usize = 256;
/// Rows of logits held at once when streaming.
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
        let (e, v) = (self.config().n_embd, self.config().vocab_size);
        let head = self.weights.head();
        let mut x = vec![0f32; ROWS * e];
        let mut logits = vec![0f32; ROWS * v];
        self.hidden_chunks(tokens, &mut |first, hidden| {
            let wanted = hidden.len() / e;
            let mut r = 0;
            while r < wanted {
                let rows = (wanted - r).min(ROWS);
                x[..rows * e].copy_from_slice(&hidden[r * e..(r + rows) * e]);
                self.weights
                    .numerics
                    .quantize_inputs(&mut x[..rows * e], rows, e);
                head.matmul(&self.ctx, &x[..rows * e], rows, &mut logits[..rows * v]);
                for j in 0..rows {
                    on_row(first + r + j, &logits[j * v..(j + 1) * v]);
                }
                r += rows;
            }
        })
    }

    /// The rows of [`Engine::score_logits`], all of them, into `out` (cleared, then
    /// `[tokens.len() - 1][vocab_size]`; its allocation is reused).
    pub fn score_logits_into(&self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let (e, v) = (self.config().n_embd, self.config().vocab_size);
        let head = self.weights.head();
        out.clear();
        out.resize(tokens.len().saturating_sub(1) * v, 0.0);
        self.hidden_chunks(tokens, &mut |first, hidden| {
            let rows = hidden.len() / e;
            self.weights.numerics.quantize_inputs(hidden, rows, e);
            head.matmul(
                &self.ctx,
                hidden,
                rows,
                &mut out[first * v..(first + rows) * v],
            );
        })
    }

    /// Runs the forward pass over `tokens` in chunks of [`CHUNK`] and calls
    /// `on_hidden(first, hidden)` per chunk with the final-normed hidden states of the
    /// positions `first..` that have a next token to predict (`[rows][n_embd]`, rows ≥ 1).
    fn hidden_chunks(
        &self,
        tokens: &[u32],
        on_hidden: &mut dyn FnMut(usize, &mut [f32]),
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
        let e = c.n_embd;
        let mut cache = KvCache::new(c.n_layer);
        let mut fed = 0;
        while fed < tokens.len() {
            let n = (tokens.len() - fed).min(CHUNK);
            let mut hidden = forward(
                &self.weights,
                &self.ctx,
                &mut [BatchItem {
                    cache: &mut cache,
                    tokens: &tokens[fed..fed + n],
                }],
            )?;
            // positions with a next token to predict
            let wanted = n.min(tokens.len() - 1 - fed);
            if wanted > 0 {
                on_hidden(fed, &mut hidden[..wanted * e]);
            }
            fed += n;
        }
        Ok(())
    }
}
