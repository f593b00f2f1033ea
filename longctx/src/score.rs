//! Judging answers. **Likelihood**: every candidate prompt of a group (the true answers, then
//! each distractor in every slot) goes in one `/v1/completions` request with `echo` and
//! `logprobs` and `max_tokens: 0`; each answer's score is the sum of the logprobs of the
//! tokens overlapping its characters; a query passes when its true answer beats every
//! distractor by more than the margin ([`rank`]). Spans are located from the *end* of the
//! echoed text, so an endpoint that silently drops the prompt's start (the echo shows what
//! it kept) is scored on what it kept, and the cut is reported. **Generation** (endpoints
//! that refuse logprobs): greedy answers to [`Group::generation_prompts`], passing when they
//! contain every expected string (RULER's `string_match_all`, case-insensitive).
//!
//! Why a margin: when a needle is lost, the true number is just another number to the
//! model and outranks K distractors by chance one time in K + 1. Measured on the 135M test
//! model, a kept needle puts its number 5 to 19 nats above random numbers of the same form,
//! while lost ones land within about 2 nats of them; [`DEFAULT_MARGIN`] = ln 20 keeps every
//! kept needle passing and makes a lost one pass by chance rarely.
//!
//! [`DEFAULT_MARGIN`]: crate::score::DEFAULT_MARGIN

use std::ops::Range;

use serde_json::{Value, json};

use crate::task::Group;
use crate::{LongctxError, Result};

/// The default margin (nats): the true answer must be at least 20 times as likely as the
/// likeliest distractor.
pub const DEFAULT_MARGIN: f64 = 2.995_732_273_553_991; // ln 20

/// The body (without `model`) of the likelihood request of `group`: every candidate prompt
/// in one prompt array, echoed with logprobs, nothing generated.
pub fn likelihood_body(group: &Group) -> Value {
    let prompts: Vec<String> = (0..group.candidates())
        .map(|c| group.candidate_prompt(c).0)
        .collect();
    json!({"prompt": prompts, "echo": true, "logprobs": 1, "max_tokens": 0, "temperature": 0})
}

/// The body (without `model`) of the generation request of `group`: one greedy answer per
/// query.
pub fn generation_body(group: &Group) -> Value {
    json!({"prompt": group.generation_prompts(), "max_tokens": group.generation_max_tokens(),
           "temperature": 0})
}

/// Scores of one candidate prompt as an endpoint echoed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Echoed {
    /// Per query, the answer's summed logprob (None when the answer was cut or unscored).
    pub answers: Vec<Option<f64>>,
    /// Characters of the prompt the endpoint kept (the echo's).
    pub kept_chars: usize,
    /// Characters of the prompt sent.
    pub sent_chars: usize,
    /// Tokens the endpoint echoed for the prompt.
    pub kept_tokens: usize,
    /// Where the part the endpoint dropped began in the prompt sent (characters): 0 when
    /// its beginning went, more when a middle part went. None when nothing was dropped, or
    /// when the echo is not the prompt less one contiguous part.
    pub dropped_at: Option<usize>,
}

impl Echoed {
    /// Whether the endpoint dropped part of the prompt.
    pub fn truncated(&self) -> bool {
        self.kept_chars < self.sent_chars
    }
}

/// Per-answer sums over the tokens overlapping each span. `offsets[i]` is where token i
/// starts in the text the endpoint kept, `end` where the prompt ends in it, `sent` the
/// length of the prompt sent, all in one unit (characters or bytes); `spans` are ranges of
/// the prompt sent. The kept text is the sent prompt's last `end` units, so spans shift by
/// `sent − end`. A span that was cut, that no token covers, or that covers a token without
/// a finite logprob has no score.
pub fn span_sums(
    offsets: &[usize],
    logprobs: &[Option<f64>],
    end: usize,
    sent: usize,
    spans: &[Range<usize>],
) -> Vec<Option<f64>> {
    let cut = sent.saturating_sub(end);
    let n = offsets.len().min(logprobs.len());
    spans
        .iter()
        .map(|s| {
            if s.start < cut || s.end > sent || s.start >= s.end {
                return None;
            }
            let (a, b) = (s.start - cut, s.end - cut);
            let mut sum = 0.0;
            let mut any = false;
            for i in 0..n {
                let start = offsets[i];
                let stop = offsets.get(i + 1).copied().unwrap_or(end).max(start);
                if start >= end || stop <= a || start >= b {
                    continue;
                }
                let lp = logprobs[i].filter(|v| v.is_finite())?;
                sum += lp;
                any = true;
            }
            any.then_some(sum)
        })
        .collect()
}

fn char_range(text: &str, r: &Range<usize>) -> Range<usize> {
    let chars_before = |b: usize| text.get(..b).map_or(0, |s| s.chars().count());
    chars_before(r.start)..chars_before(r.end)
}

/// Reads one echoed choice of a likelihood request for candidate prompt `prompt` (byte
/// `spans`). The prompt's end in the echo is found by its last characters, so a completion
/// appended after it (an endpoint that insists on `max_tokens ≥ 1`) is ignored.
pub fn read_echo(choice: &Value, prompt: &str, spans: &[Range<usize>]) -> Result<Echoed> {
    let bad = |m: &str| LongctxError::Response(m.to_owned());
    let text = choice
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("a choice has no text"))?;
    let lp = choice
        .get("logprobs")
        .filter(|v| !v.is_null())
        .ok_or_else(|| bad("a choice has no logprobs (echo with logprobs refused?)"))?;
    let logprobs: Vec<Option<f64>> = lp
        .get("token_logprobs")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("logprobs.token_logprobs missing"))?
        .iter()
        .map(Value::as_f64)
        .collect();
    let offsets: Vec<usize> = match lp.get("text_offset").and_then(Value::as_array) {
        Some(a) => a
            .iter()
            .map(|v| v.as_u64().and_then(|u| usize::try_from(u).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| bad("text_offset holds a non-integer"))?,
        None => {
            // from the tokens' own texts
            let toks = lp
                .get("tokens")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("neither text_offset nor tokens in logprobs"))?;
            let mut at = 0usize;
            toks.iter()
                .map(|t| {
                    let here = at;
                    at += t.as_str().map_or(0, |s| s.chars().count());
                    here
                })
                .collect()
        }
    };
    if offsets.len() != logprobs.len() {
        return Err(bad("text_offset and token_logprobs differ in length"));
    }
    let sent_chars = prompt.chars().count();
    let text_chars = text.chars().count();
    // the prompt's last characters (they hold the last answer) locate its end in the echo
    let tail_chars = sent_chars.min(48);
    let tail: String = prompt.chars().skip(sent_chars - tail_chars).collect();
    let end = match text.rfind(&tail) {
        Some(b) => text.get(..b).map_or(0, |s| s.chars().count()) + tail_chars,
        None => return Err(bad("the echo does not end with the prompt sent")),
    };
    if end > text_chars {
        return Err(bad("the echo is shorter than its own prompt"));
    }
    let char_spans: Vec<Range<usize>> = spans.iter().map(|s| char_range(prompt, s)).collect();
    let answers = span_sums(&offsets, &logprobs, end, sent_chars, &char_spans);
    let kept_tokens = offsets.iter().filter(|&&o| o < end).count();
    let kept: String = text.chars().take(end).collect();
    Ok(Echoed {
        answers,
        kept_chars: end.min(sent_chars),
        sent_chars,
        kept_tokens,
        dropped_at: dropped_at(prompt, &kept),
    })
}

/// Where `kept` (the prompt as an endpoint echoed it) lost one contiguous part of `prompt`,
/// in characters: 0 when it is the prompt's tail; the kept head's length when it is a head
/// and a tail. None when nothing was lost or no single cut explains it.
fn dropped_at(prompt: &str, kept: &str) -> Option<usize> {
    if kept.len() >= prompt.len() {
        return None;
    }
    if prompt.ends_with(kept) {
        return Some(0);
    }
    let head = prompt
        .char_indices()
        .zip(kept.chars())
        .take_while(|((_, a), b)| a == b)
        .map(|((i, a), _)| i + a.len_utf8())
        .last()?;
    prompt
        .ends_with(&kept[head..])
        .then(|| prompt[..head].chars().count())
}

/// Reads a likelihood response of `group`: per candidate (true answers first), its
/// [`Echoed`] scores.
pub fn read_likelihood(group: &Group, response: &Value) -> Result<Vec<Echoed>> {
    let choices = choices_by_index(response)?;
    let n = group.candidates();
    if choices.len() < n {
        return Err(LongctxError::Response(format!(
            "{} choices for {n} prompts",
            choices.len()
        )));
    }
    (0..n)
        .map(|c| {
            let (prompt, spans) = group.candidate_prompt(c);
            read_echo(choices[c], &prompt, &spans)
        })
        .collect()
}

/// A response's choices, ordered by their `index`.
fn choices_by_index(response: &Value) -> Result<Vec<&Value>> {
    let mut choices: Vec<&Value> = response
        .get("choices")
        .and_then(Value::as_array)
        .ok_or_else(|| LongctxError::Response("no choices".into()))?
        .iter()
        .collect();
    choices.sort_by_key(|c| c.get("index").and_then(Value::as_u64).unwrap_or(u64::MAX));
    Ok(choices)
}

/// Reads a generation response of `group`: per query, the generated text.
pub fn read_generation(group: &Group, response: &Value) -> Result<Vec<String>> {
    let choices = choices_by_index(response)?;
    if choices.len() < group.queries.len() {
        return Err(LongctxError::Response(format!(
            "{} choices for {} prompts",
            choices.len(),
            group.queries.len()
        )));
    }
    Ok(choices
        .iter()
        .take(group.queries.len())
        .map(|c| {
            c.get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        })
        .collect())
}

/// How a true answer ranked against its distractors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked {
    /// It beat every distractor by more than the margin.
    pub passed: bool,
    /// Its score minus the best distractor's (None when it has no score; +∞ when no
    /// distractor has one).
    pub margin: Option<f64>,
    /// Distractors scoring at least as high.
    pub rank: usize,
}

/// Ranks a true answer's score against its distractors' with `margin` (nats). A true
/// answer without a score fails; a distractor without one counts as −∞.
pub fn rank(truth: Option<f64>, distractors: &[Option<f64>], margin: f64) -> Ranked {
    let Some(t) = truth.filter(|v| v.is_finite()) else {
        return Ranked {
            passed: false,
            margin: None,
            rank: distractors.len(),
        };
    };
    let scores: Vec<f64> = distractors
        .iter()
        .map(|d| d.filter(|v| v.is_finite()).unwrap_or(f64::NEG_INFINITY))
        .collect();
    let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let gap = t - best;
    Ranked {
        passed: gap > margin,
        margin: Some(gap),
        rank: scores.iter().filter(|&&d| d >= t).count(),
    }
}

/// Ranks every query of a group from its candidates' scores (`scores[c][q]`, candidate 0
/// true).
pub fn rank_group(scores: &[Vec<Option<f64>>], queries: usize, margin: f64) -> Vec<Ranked> {
    (0..queries)
        .map(|q| {
            let truth = scores.first().and_then(|s| s.get(q).copied().flatten());
            let ds: Vec<Option<f64>> = scores
                .iter()
                .skip(1)
                .map(|s| s.get(q).copied().flatten())
                .collect();
            rank(truth, &ds, margin)
        })
        .collect()
}

/// RULER's `string_match_all`: every expected string in the answer, case-insensitively.
pub fn string_match_all(answer: &str, expected: &[String]) -> bool {
    let a = answer.to_lowercase();
    !expected.is_empty() && expected.iter().all(|e| a.contains(&e.to_lowercase()))
}

#[cfg(test)]
mod tests;
