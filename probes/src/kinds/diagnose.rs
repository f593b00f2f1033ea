//! Fault signatures: what a logprob probe can say about *why* an endpoint differs from the
//! reference, beyond how much. A statistic alone maps every difference onto the calibration
//! ladder ("≈ 2-bit weights"), which misdiagnoses faults that are not in the weights or
//! kernels at all. The signatures recognised here are written into the run's statistics as
//! `diagnosis` (a JSON object with `signature`, a sentence in `text`, and the evidence), and
//! the faithful detector names them in the alert instead of a bit width:
//!
//! - `shifted_logprobs`: the echoed prompt logprobs belong to the position `shift` places
//!   later (or earlier; llama-cpp-python's echo is off by one). Found by moving the
//!   endpoint's reported data by ±1 and ±2 positions and re-comparing: when the mean KL
//!   collapses (to under a tenth, and under [`SHIFTED_MAX_KL`]), the weights may be fine and
//!   the API misreports them.
//! - `prompt_tokens_differ`: the endpoint counts a different number of prompt tokens for a
//!   chat than the reference's template renders (`usage.prompt_tokens`), on every prompt of
//!   the round: a different chat template, an injected or dropped system prompt, or a
//!   truncated prompt — the answers are then conditioned on another context.
//!
//! Pure functions over what the probe already holds: no extra request to either side.

use serde_json::{Value, json};

use super::{EpPosition, positions};
use crate::align::ReferenceVocab;
use crate::compare::{self, PositionInput};
use crate::reference::RefPosition;

/// Shifts tried: the endpoint's data at position i compared with the reference at i + s.
const SHIFTS: [isize; 4] = [-2, -1, 1, 2];
/// A realigned run must come this close to the reference to name a shift (mean KL, nats):
/// faithful weights behind a shifted API come within float noise; a real weight or kernel
/// difference does not get better when moved.
const SHIFTED_MAX_KL: f64 = 0.05;
/// ... and below this fraction of the unshifted KL.
const SHIFTED_MAX_RATIO: f64 = 0.1;
/// Below this unshifted mean KL there is nothing to explain.
const MIN_KL: f64 = 0.01;

/// The comparison inputs of one text under every shift in [`SHIFTS`].
#[derive(Debug, Default)]
pub(crate) struct ShiftSearch {
    inputs: [Vec<PositionInput>; SHIFTS.len()],
}

impl ShiftSearch {
    /// Adds one text: `ep` as the endpoint reported it, `scored` the reference's scores of the
    /// aligned sequence, `map` as for [`positions`].
    pub(crate) fn add(
        &mut self,
        ep: &[EpPosition],
        scored: &[RefPosition],
        map: impl Fn(usize) -> Option<usize> + Copy,
        vocab: &dyn ReferenceVocab,
    ) {
        for (slot, &s) in self.inputs.iter_mut().zip(SHIFTS.iter()) {
            // the data reported at position i belongs to position i + s: position j takes the
            // logprob and alternatives reported at j - s, and keeps its own token
            let moved: Vec<EpPosition> = ep
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let src = (j as isize)
                        .checked_sub(s)
                        .and_then(|i| usize::try_from(i).ok())
                        .and_then(|i| ep.get(i));
                    EpPosition {
                        token: p.token.clone(),
                        logprob: src.map_or(0.0, |q| q.logprob),
                        // no alternatives: `positions` skips the position
                        top: src.map(|q| q.top.clone()).unwrap_or_default(),
                    }
                })
                .collect();
            let (mut pos, _) = positions(&moved, scored, 0, map, vocab);
            slot.append(&mut pos);
        }
    }

    /// The `shifted_logprobs` diagnosis, if one shift explains the run: `unshifted` are the
    /// run's own inputs.
    pub(crate) fn diagnose(&self, unshifted: &[PositionInput]) -> Option<Value> {
        let kl0 = mean_kl(unshifted)?;
        if kl0 < MIN_KL {
            return None;
        }
        let (shift, kl, n) = SHIFTS
            .iter()
            .zip(&self.inputs)
            // a shift must still compare most positions (a text loses |s| at one end)
            .filter(|(_, inputs)| inputs.len() * 2 >= unshifted.len())
            .filter_map(|(&s, inputs)| Some((s, mean_kl(inputs)?, inputs.len())))
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        if kl > SHIFTED_MAX_KL || kl > SHIFTED_MAX_RATIO * kl0 {
            return None;
        }
        let dir = if shift > 0 { "later" } else { "earlier" };
        Some(json!({
            "signature": "shifted_logprobs",
            "text": format!(
                "prompt logprobs are reported {} position{} off (each belongs to the token {} {dir}): \
                 realigned, mean KL falls from {} to {}",
                shift.unsigned_abs(),
                if shift.unsigned_abs() == 1 { "" } else { "s" },
                shift.unsigned_abs(),
                fmt(kl0),
                fmt(kl)
            ),
            "shift": shift,
            "kl_mean": kl0,
            "kl_mean_realigned": kl,
            "positions_realigned": n,
        }))
    }
}

/// The `prompt_tokens_differ` diagnosis from `(endpoint usage.prompt_tokens, reference
/// rendered count)` per chat prompt: only when every prompt differs, by the same sign.
pub(crate) fn prompt_tokens_differ(counts: &[(i64, i64)]) -> Option<Value> {
    if counts.is_empty() {
        return None;
    }
    let deltas: Vec<i64> = counts.iter().map(|(e, r)| e - r).collect();
    let all_more = deltas.iter().all(|&d| d > 0);
    let all_fewer = deltas.iter().all(|&d| d < 0);
    if !all_more && !all_fewer {
        return None;
    }
    let (e, r) = counts[0];
    let by = if deltas.iter().all(|&d| d == deltas[0]) {
        format!("{:+} on each of {} prompts", deltas[0], counts.len())
    } else {
        format!(
            "{:+} on the first; the same sign on all {} prompts",
            deltas[0],
            counts.len()
        )
    };
    let what = if all_more {
        "an injected system prompt or a different chat template"
    } else {
        "a dropped system prompt, a different chat template or a truncated prompt"
    };
    Some(json!({
        "signature": "prompt_tokens_differ",
        "text": format!(
            "the endpoint counts {e} prompt tokens where the reference's chat template renders {r} \
             ({by}): {what}"
        ),
        "endpoint_prompt_tokens": counts.iter().map(|c| c.0).collect::<Vec<_>>(),
        "reference_prompt_tokens": counts.iter().map(|c| c.1).collect::<Vec<_>>(),
    }))
}

fn mean_kl(inputs: &[PositionInput]) -> Option<f64> {
    if inputs.is_empty() {
        return None;
    }
    let metrics = compare::compare_run(inputs).ok()?;
    compare::summarize(&metrics).ok().map(|s| s.kl_mean)
}

fn fmt(v: f64) -> String {
    if v != 0.0 && v.abs() < 1e-3 {
        format!("{v:.1e}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_token_counts_name_a_signature_only_when_every_prompt_agrees() {
        assert!(prompt_tokens_differ(&[]).is_none());
        assert!(prompt_tokens_differ(&[(10, 10), (12, 12)]).is_none());
        // mixed signs: no consistent story
        assert!(prompt_tokens_differ(&[(11, 10), (11, 12)]).is_none());
        let more = prompt_tokens_differ(&[(40, 20), (45, 25)]).expect("a signature");
        assert_eq!(more["signature"], "prompt_tokens_differ");
        let text = more["text"].as_str().unwrap_or_default();
        assert!(
            text.contains("+20 on each of 2") && text.contains("injected"),
            "{text}"
        );
        let unequal = prompt_tokens_differ(&[(40, 20), (46, 25)]).expect("a signature");
        let text = unequal["text"].as_str().unwrap_or_default();
        assert!(text.contains("+20 on the first"), "{text}");
        let fewer = prompt_tokens_differ(&[(5, 25)]).expect("a signature");
        assert!(
            fewer["text"]
                .as_str()
                .unwrap_or_default()
                .contains("dropped")
        );
    }
}
