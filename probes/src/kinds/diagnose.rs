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
//! - `different_model` (prompt_logprobs): the distribution moved, yet the endpoint predicts
//!   the probe texts' actual tokens as well as the reference or better. Drift in weights or
//!   kernels is noise the text knows nothing of: it makes the actual tokens less likely by
//!   about the full KL (on the test model's ladder the mean Δ logprob of the actual token is
//!   −1.6 to −2.2× the probe's top-k KL over the corpus, and never above −0.93× on one
//!   text). A competent model that is not the reference's — other weights on the same
//!   tokenizer, a fine-tune, the weights behind a hidden context — moves the distribution
//!   without that cost. Named when the per-position `Δ logprob + ½·KL` is above 0 by
//!   [`SUBSTITUTE_Z`] standard errors, so drift is not named by chance.
//! - `prompt_tokens_differ`: the endpoint counts a different number of prompt tokens for a
//!   chat than the reference's template renders (`usage.prompt_tokens`), on every prompt of
//!   the round: a different chat template, an injected or dropped system prompt, or a
//!   truncated prompt — the answers are then conditioned on another context.
//! - `prompt_truncated` (long_context): the echo of a long prompt lacks part of it — the
//!   endpoint kept K of the N tokens sent, and where the cut was (its beginning, or a middle
//!   part from a given character). Needles in the dropped part cannot be found, whatever the
//!   weights.
//! - `top_logprobs_capped`: no position carries more than c alternatives where k were
//!   asked; the statistic then compares a shorter head of the distribution.
//! - `sampling_ignored` (completion_logprobs, sent at temperature 0): generated tokens that
//!   are not the endpoint's own most likely token at their position — by the endpoint's own
//!   logprobs, so neither weights nor kernels explain it: the endpoint samples whatever the
//!   request says. A fault by itself: the detector raises it even under the threshold.
//!
//! Pure functions over what the probe already holds: no extra request to either side.

use serde_json::{Value, json};

use super::{EpPosition, positions};
use crate::align::ReferenceVocab;
use crate::compare::{self, PositionInput, PositionMetrics};
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

/// `different_model`: the line between drift and a different model, as a multiple of the
/// position's KL: drift costs the actual token about the KL or more (−0.93× at the least on
/// one text of the ladder, −1.6× over the corpus), a competent different model about 0.
const SUBSTITUTE_RATIO: f64 = 0.5;
/// ... and how many standard errors above that line the run's mean must be (one-sided 1%).
pub(crate) const SUBSTITUTE_Z: f64 = 2.326;

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

/// The `different_model` diagnosis of prompt_logprobs positions (one run's, or several
/// runs' pooled by the faithful detector).
pub fn different_model(inputs: &[PositionInput]) -> Option<Value> {
    different_model_of(&compare::compare_run(inputs).ok()?)
}

/// The `different_model` diagnosis from a run's per-position metrics (the detection-power
/// benchmark judges resampled rounds with it).
pub fn different_model_of(metrics: &[PositionMetrics]) -> Option<Value> {
    let n = metrics.len();
    if n < 2 {
        return None;
    }
    let nf = n as f64;
    let kl = metrics.iter().map(|m| m.kl).sum::<f64>() / nf;
    if kl < MIN_KL {
        return None;
    }
    let d = metrics.iter().map(|m| m.dlogprob).sum::<f64>() / nf;
    // per position: how far the actual token's Δ logprob is above the drift line
    let above: Vec<f64> = metrics
        .iter()
        .map(|m| m.dlogprob + SUBSTITUTE_RATIO * m.kl)
        .collect();
    let mean = above.iter().sum::<f64>() / nf;
    let var = above.iter().map(|u| (u - mean).powi(2)).sum::<f64>() / (nf - 1.0);
    let z = mean / (var / nf).sqrt().max(1e-12);
    if z < SUBSTITUTE_Z {
        return None;
    }
    let how = if d >= 0.0 {
        "at least as well as"
    } else {
        "almost as well as"
    };
    Some(json!({
        "signature": "different_model",
        "text": format!(
            "a different model behind the name (other weights on the same tokenizer, or these weights \
             behind a hidden context): the distribution moved by a mean KL of {}, yet the endpoint \
             predicts the probe texts {how} the reference (mean Δ logprob of the actual tokens {:+.3} \
             nats), where drift in weights or kernels of that size costs about the KL or more \
             (z = {z:.1} over {n} positions)",
            fmt(kl),
            d
        ),
        "kl_mean": kl,
        "dlogprob_mean": d,
        "drift_line": -SUBSTITUTE_RATIO * kl,
        "z": z,
        "positions": n,
    }))
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
    let by = if counts.len() == 1 {
        format!("{:+}", deltas[0])
    } else if deltas.iter().all(|&d| d == deltas[0]) {
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

/// One length of a long_context round where the endpoint's echo lacked part of the prompt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cut {
    /// The length tried (tokens).
    pub length: u32,
    /// The prompt's tokens by the reference's count.
    pub prompt_tokens: usize,
    /// The tokens the endpoint echoed for it.
    pub kept_tokens: usize,
    /// Where the dropped part began (characters of the prompt), when one part was dropped.
    pub dropped_at: Option<usize>,
}

/// The `prompt_truncated` diagnosis from the lengths whose echo lacked part of the prompt.
pub(crate) fn prompt_truncated(cuts: &[Cut]) -> Option<Value> {
    let first = cuts.first()?;
    // the most any cut prompt kept: the endpoint's limit, near enough
    let limit = cuts.iter().map(|c| c.kept_tokens).max()?;
    let place = match first.dropped_at {
        Some(0) => "its beginning dropped".to_owned(),
        Some(at) => format!("a part dropped from character {at} on"),
        None => "part of it dropped".to_owned(),
    };
    Some(json!({
        "signature": "prompt_truncated",
        "text": format!(
            "prompts are silently truncated: at length {} the endpoint kept {} of the {} prompt \
             tokens sent ({place}); no cut prompt kept more than {limit} tokens",
            first.length, first.kept_tokens, first.prompt_tokens
        ),
        "first_cut_length": first.length,
        "kept_tokens": cuts.iter().map(|c| c.kept_tokens).collect::<Vec<_>>(),
        "prompt_tokens": cuts.iter().map(|c| c.prompt_tokens).collect::<Vec<_>>(),
        "lengths": cuts.iter().map(|c| c.length).collect::<Vec<_>>(),
        "dropped_at": first.dropped_at,
        "kept_tokens_max": limit,
    }))
}

/// How many of the most likely tokens `p` carries as alternatives. A legacy completions
/// answer adds the actual token when it is not among them (OpenAI, vLLM, this engine): an
/// actual token that is the least likely entry may be that addition, so it is not counted;
/// one above another entry is within the top.
pub(crate) fn top_returned(p: &EpPosition) -> usize {
    let actual = p.top.iter().find(|(t, _)| t.text == p.token.text);
    match actual {
        Some((_, lp)) if p.top.iter().all(|(_, o)| o >= lp) => p.top.len() - 1,
        _ => p.top.len(),
    }
}

/// The `top_logprobs_capped` diagnosis: `most` is the largest number of alternatives any
/// position carried ([`top_returned`]), `asked` the number asked for, `positions` how many
/// carried any.
pub(crate) fn top_logprobs_capped(most: usize, asked: usize, positions: usize) -> Option<Value> {
    if positions == 0 || most >= asked {
        return None;
    }
    Some(json!({
        "signature": "top_logprobs_capped",
        "text": format!(
            "top_logprobs are capped: no position of {positions} carried more than {most} \
             alternatives where {asked} were asked"
        ),
        "asked": asked,
        "most_returned": most,
        "positions": positions,
    }))
}

/// Generated tokens whose own logprob trails the endpoint's best alternative by more than
/// this (nats) are not greedy choices (float ties stay well under it).
const NOT_GREEDY_MARGIN: f64 = 1e-3;
/// `sampling_ignored` needs at least this many non-greedy tokens ...
const NOT_GREEDY_MIN: usize = 3;
/// ... and this fraction of the generated positions that carry alternatives.
const NOT_GREEDY_MIN_FRACTION: f64 = 0.05;

/// The `sampling_ignored` diagnosis for tokens generated at temperature 0: `generated` are
/// the endpoint's positions (its token's logprob and its alternatives).
pub(crate) fn sampling_ignored(generated: &[EpPosition]) -> Option<Value> {
    let with_top: Vec<&EpPosition> = generated.iter().filter(|p| !p.top.is_empty()).collect();
    // per non-greedy token, how far it trails the endpoint's best alternative
    let not_greedy: Vec<f64> = with_top
        .iter()
        .filter_map(|p| {
            let best = p
                .top
                .iter()
                .map(|(_, lp)| *lp)
                .fold(f64::NEG_INFINITY, f64::max);
            (best - p.logprob > NOT_GREEDY_MARGIN).then_some(best - p.logprob)
        })
        .collect();
    let n = with_top.len();
    if not_greedy.len() < NOT_GREEDY_MIN
        || (not_greedy.len() as f64) < NOT_GREEDY_MIN_FRACTION * n as f64
    {
        return None;
    }
    let worst = not_greedy.iter().copied().fold(0.0, f64::max);
    Some(json!({
        "signature": "sampling_ignored",
        "text": format!(
            "temperature 0 is not honoured: {} of {n} generated tokens were not the endpoint's own \
             most likely token (by its own logprobs, up to {} nats less likely): it samples \
             whatever the request asks",
            not_greedy.len(),
            fmt(worst)
        ),
        "not_greedy": not_greedy.len(),
        "positions": n,
        "largest_gap": worst,
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
    use crate::align::EndpointToken;

    fn at(token: &str, logprob: f64, top: &[(&str, f64)]) -> EpPosition {
        EpPosition {
            token: EndpointToken::text(token.to_owned()),
            logprob,
            top: top
                .iter()
                .map(|(t, lp)| (EndpointToken::text((*t).to_owned()), *lp))
                .collect(),
        }
    }

    /// A position where the reference puts `p_ref` on token 1 (the actual one) and the rest
    /// on token 2, and the endpoint `p_ep`.
    fn two_way(p_ref: f64, p_ep: f64, actual: u32) -> PositionInput {
        let side = |p1: f64| compare::Side {
            actual_logprob: if actual == 1 {
                p1.ln()
            } else {
                (1.0 - p1).ln()
            },
            top: vec![
                compare::TopEntry {
                    id: 1,
                    logprob: p1.ln(),
                },
                compare::TopEntry {
                    id: 2,
                    logprob: (1.0 - p1).ln(),
                },
            ],
        };
        PositionInput {
            actual_id: actual,
            reference: side(p_ref),
            endpoint: side(p_ep),
        }
    }

    #[test]
    fn a_different_model_is_named_only_when_the_text_does_not_pay_for_the_kl() {
        // the reference at 0.7 on the token that occurs 7 times in 10: an endpoint at 0.5
        // (noise the text knows nothing of) is worse on the text by about its KL
        let run = |p_ep: f64, reps: usize| -> Vec<PositionInput> {
            (0..reps)
                .flat_map(|_| (0..10).map(move |i| two_way(0.7, p_ep, if i < 7 { 1 } else { 2 })))
                .collect()
        };
        assert!(different_model(&run(0.5, 50)).is_none(), "drift");
        // a text with token 1 nine times in ten, and an endpoint at 0.9 where the reference
        // says 0.7: it moved the way the text did, and predicts it better
        let better: Vec<PositionInput> = (0..50)
            .flat_map(|_| (0..10).map(|i| two_way(0.7, 0.9, if i < 9 { 1 } else { 2 })))
            .collect();
        let d = different_model(&better).expect("a signature");
        assert_eq!(d["signature"], "different_model");
        assert!(d["dlogprob_mean"].as_f64().unwrap_or(-1.0) > 0.0, "{d}");
        let text = d["text"].as_str().unwrap_or_default();
        assert!(text.contains("at least as well as"), "{text}");
        // the same story on a handful of positions is not significant
        assert!(different_model(&better[..10]).is_none());
        // identical sides: nothing to explain
        assert!(different_model(&run(0.7, 50)).is_none());
    }

    #[test]
    fn the_top_counted_leaves_out_an_appended_actual_token() {
        // the actual token above another entry: within the top
        assert_eq!(top_returned(&at("a", -0.1, &[("a", -0.1), ("b", -2.0)])), 2);
        // the least likely entry may be the one appended: not counted
        assert_eq!(
            top_returned(&at("c", -5.0, &[("a", -0.1), ("b", -2.0), ("c", -5.0)])),
            2
        );
        assert_eq!(top_returned(&at("z", -5.0, &[("a", -0.1), ("b", -2.0)])), 2);
        assert!(top_logprobs_capped(5, 5, 10).is_none());
        assert!(top_logprobs_capped(2, 5, 0).is_none());
        let d = top_logprobs_capped(2, 5, 10).expect("a signature");
        assert_eq!(
            (d["asked"].clone(), d["most_returned"].clone()),
            (5.into(), 2.into())
        );
    }

    #[test]
    fn sampling_ignored_needs_several_tokens_off_the_endpoints_own_argmax() {
        let greedy = at("a", -0.1, &[("a", -0.1), ("b", -2.0)]);
        // a float tie is greedy
        let tie = at("b", -0.7, &[("a", -0.6999), ("b", -0.7)]);
        let off = at("b", -2.0, &[("a", -0.1), ("b", -2.0)]);
        let mut run = vec![greedy.clone(); 40];
        run.push(tie);
        run.extend(vec![off.clone(); 2]);
        assert!(sampling_ignored(&run).is_none(), "two are too few");
        run.push(off);
        let d = sampling_ignored(&run).expect("a signature");
        assert_eq!(d["not_greedy"], 3);
        assert_eq!(d["positions"], 44);
        // three of a hundred is under 5%
        run.extend(vec![greedy; 60]);
        assert!(sampling_ignored(&run).is_none());
    }

    #[test]
    fn a_truncation_names_the_first_cut_and_where() {
        assert!(prompt_truncated(&[]).is_none());
        let cut = |length, kept, dropped_at| Cut {
            length,
            prompt_tokens: length as usize,
            kept_tokens: kept,
            dropped_at,
        };
        let d = prompt_truncated(&[cut(1024, 512, Some(0)), cut(2048, 511, Some(0))])
            .expect("a signature");
        let text = d["text"].as_str().unwrap_or_default();
        assert!(
            text.contains("at length 1024 the endpoint kept 512 of the 1024")
                && text.contains("its beginning dropped")
                && text.contains("more than 512 tokens"),
            "{text}"
        );
        let middle = prompt_truncated(&[cut(1024, 512, Some(700))]).expect("a signature");
        assert!(
            middle["text"]
                .as_str()
                .unwrap_or_default()
                .contains("from character 700 on")
        );
    }

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
        assert!(fewer["text"].as_str().unwrap_or_default().contains("(-20)"));
        assert!(
            fewer["text"]
                .as_str()
                .unwrap_or_default()
                .contains("dropped")
        );
    }
}
