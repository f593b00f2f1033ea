//! Tests of the scoring: span sums, echo reading (plain, cut at the start, with a
//! completion appended), ranking, string_match_all; no input panics.

#![allow(clippy::single_range_in_vec_init)] // spans are one-element slices of ranges here

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::task::{Draft, Haystack, Settings, TaskKind};

/// A group of each task, sized with one token per 4 bytes.
fn groups() -> Vec<Group> {
    let h = Haystack::builtin().unwrap_or_else(|e| panic!("{e}"));
    let s = Settings {
        window: 512,
        ..Settings::default()
    };
    let d = Draft::new(&h, &s).unwrap_or_else(|e| panic!("{e}"));
    d.build(|t| Some(t.len().div_ceil(4)))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// An echo of `text` cut into 3-character tokens, the last `keep` characters kept, token i's
/// logprob `lp(i_global)`, then `extra` appended as generated tokens.
fn echo(text: &str, keep: usize, extra: &str, lp: impl Fn(usize) -> f64) -> Value {
    let chars: Vec<char> = text.chars().collect();
    let kept: String = chars[chars.len() - keep..].iter().collect();
    let first = chars.len() - keep;
    let mut offsets = Vec::new();
    let mut lps = Vec::new();
    let mut tokens = Vec::new();
    let all: Vec<char> = format!("{kept}{extra}").chars().collect();
    let mut i = 0;
    while i < all.len() {
        let j = (i + 3).min(all.len());
        offsets.push(i);
        tokens.push(all[i..j].iter().collect::<String>());
        lps.push(if i == 0 { None } else { Some(lp(first + i)) });
        i = j;
    }
    json!({"index": 0, "text": format!("{kept}{extra}"),
           "logprobs": {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets}})
}

#[test]
fn span_sums_cover_overlapping_tokens_and_shift_by_the_cut() {
    // tokens at 0,3,6,9 over 12 units; span 4..7 overlaps tokens 1 and 2
    let off = [0, 3, 6, 9];
    let lp = [None, Some(-1.0), Some(-2.0), Some(-4.0)];
    assert_eq!(span_sums(&off, &lp, 12, 12, &[4..7]), vec![Some(-3.0)]);
    assert_eq!(span_sums(&off, &lp, 12, 12, &[0..2]), vec![None]);
    // the same text with its first 10 units cut: span 14..17 of the 22 sent
    assert_eq!(span_sums(&off, &lp, 12, 22, &[14..17]), vec![Some(-3.0)]);
    assert_eq!(span_sums(&off, &lp, 12, 22, &[5..9]), vec![None]);
    assert_eq!(
        span_sums(&off, &lp, 12, 12, &[9..12, 7..7]),
        vec![Some(-4.0), None]
    );
}

#[test]
fn echo_reading_finds_every_answer_whole_cut_or_followed_by_a_completion() {
    for g in groups() {
        let (p, spans) = g.candidate_prompt(0);
        let n = p.chars().count();
        // logprob of a token = −(global char index of its start) / 1000
        let lp = |i: usize| -(i as f64) / 1000.0;
        let whole = read_echo(&echo(&p, n, "", lp), &p, &spans).unwrap_or_else(|e| panic!("{e}"));
        assert!(!whole.truncated() && whole.kept_chars == n);
        assert!(
            whole.answers.iter().all(Option::is_some),
            "{}: {whole:?}",
            g.id
        );
        let cut = read_echo(&echo(&p, n / 2, "", lp), &p, &spans).unwrap_or_else(|e| panic!("{e}"));
        assert!(cut.truncated() && cut.kept_chars == n / 2 && cut.kept_tokens < whole.kept_tokens);
        assert_eq!((whole.dropped_at, cut.dropped_at), (None, Some(0)));
        let appended =
            read_echo(&echo(&p, n, " 42", lp), &p, &spans).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(appended.answers, whole.answers, "{}", g.id);
        // answers in the kept half score as in the whole prompt when token boundaries agree
        for (i, s) in spans.iter().enumerate() {
            let start = p[..s.start].chars().count();
            if start >= n - n / 2 && (n - n / 2) % 3 == 0 {
                assert_eq!(cut.answers[i], whole.answers[i], "{}", g.id);
            }
            if start < n - n / 2 {
                assert_eq!(cut.answers[i], None);
            }
        }
    }
}

#[test]
fn the_dropped_part_is_placed_at_the_beginning_the_middle_or_nowhere() {
    let p = "héllo wörld, the key is 12345.";
    assert_eq!(dropped_at(p, p), None);
    assert_eq!(dropped_at(p, "the key is 12345."), Some(0));
    // "héllo " kept, "wörld, " dropped: the cut starts at character 6
    assert_eq!(dropped_at(p, "héllo the key is 12345."), Some(6));
    // the end dropped: the cut starts where the kept head ends
    assert_eq!(dropped_at(p, "héllo wörld"), Some(11));
    // not one contiguous cut
    assert_eq!(dropped_at(p, "héllo key 12345."), None);
}

#[test]
fn a_likelihood_response_ranks_true_answers_first() {
    let g = groups()
        .into_iter()
        .find(|g| g.task == TaskKind::MultiQuery)
        .unwrap_or_else(|| panic!("no multi_query group"));
    let body = likelihood_body(&g);
    assert_eq!(
        body["prompt"].as_array().map(Vec::len),
        Some(g.candidates())
    );
    assert_eq!(body["echo"], true);
    assert_eq!(body["max_tokens"], 0);
    // the true prompt's tokens score −0.1 each, the distractors' −5
    let choices: Vec<Value> = (0..g.candidates())
        .rev()
        .map(|c| {
            let (p, _) = g.candidate_prompt(c);
            let n = p.chars().count();
            let mut v = echo(&p, n, "", |_| if c == 0 { -0.1 } else { -5.0 });
            v["index"] = json!(c);
            v
        })
        .collect();
    let scored =
        read_likelihood(&g, &json!({"choices": choices})).unwrap_or_else(|e| panic!("{e}"));
    let per: Vec<Vec<Option<f64>>> = scored.into_iter().map(|e| e.answers).collect();
    let ranked = rank_group(&per, g.queries.len(), DEFAULT_MARGIN);
    assert!(ranked.iter().all(|r| r.passed && r.rank == 0), "{ranked:?}");
    assert!(read_likelihood(&g, &json!({"choices": []})).is_err());
    assert!(read_likelihood(&g, &json!({})).is_err());
    let gen_body = generation_body(&g);
    assert_eq!(
        gen_body["prompt"].as_array().map(Vec::len),
        Some(g.queries.len())
    );
    let answers = read_generation(
        &g,
        &json!({"choices": g.queries.iter().enumerate().map(|(i, q)| json!({"index": i, "text": q.answer})).collect::<Vec<_>>()}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        g.queries
            .iter()
            .zip(&answers)
            .all(|(q, a)| string_match_all(a, &q.expected))
    );
}

#[test]
fn rank_needs_the_margin_and_a_score() {
    let r = rank(Some(-1.0), &[Some(-5.0), Some(-9.0)], 3.0);
    assert!(r.passed && r.rank == 0 && r.margin == Some(4.0));
    let r = rank(Some(-1.0), &[Some(-3.0)], 3.0);
    assert!(!r.passed && r.rank == 0);
    let r = rank(Some(-4.0), &[Some(-3.0), Some(-2.0)], 0.0);
    assert!(!r.passed && r.rank == 2);
    let r = rank(None, &[Some(-3.0)], 0.0);
    assert!(!r.passed && r.margin.is_none());
    let r = rank(Some(f64::NAN), &[], 0.0);
    assert!(!r.passed);
    let r = rank(Some(-1.0), &[None], 3.0);
    assert!(r.passed && r.margin == Some(f64::INFINITY));
    assert!(string_match_all(
        "It is 12345 and ABCDE",
        &["abcde".into(), "12345".into()]
    ));
    assert!(!string_match_all("12345", &["12345".into(), "678".into()]));
    assert!(!string_match_all("anything", &[]));
}

#[test]
fn missing_logprobs_or_a_foreign_echo_are_errors() {
    let g = &groups()[0];
    let (p, spans) = g.candidate_prompt(0);
    assert!(read_echo(&json!({"text": p, "logprobs": null}), &p, &spans).is_err());
    let other = echo(
        "something else entirely, not the prompt at all .....",
        20,
        "",
        |_| -1.0,
    );
    assert!(read_echo(&other, &p, &spans).is_err());
    let no_offsets = json!({"text": "ab", "logprobs": {"token_logprobs": [null, -1.0]}});
    assert!(read_echo(&no_offsets, "ab", &[1..2]).is_err());
    let from_tokens =
        json!({"text": "ab", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [null, -1.0]}});
    let e = read_echo(&from_tokens, "ab", &[1..2]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(e.answers, vec![Some(-1.0)]);
}

proptest! {
    #[test]
    fn span_sums_and_echo_reading_never_panic(
        offsets in proptest::collection::vec(0usize..64, 0..12),
        lps in proptest::collection::vec(proptest::option::of(-50.0f64..0.0), 0..12),
        end in 0usize..80,
        sent in 0usize..80,
        spans in proptest::collection::vec((0usize..80, 0usize..80), 0..4),
        text in "\\PC{0,40}",
        prompt in "\\PC{0,40}",
    ) {
        let spans: Vec<Range<usize>> = spans.into_iter().map(|(a, b)| a..b).collect();
        let _ = span_sums(&offsets, &lps, end, sent, &spans);
        let choice = json!({"text": text, "logprobs": {"token_logprobs": lps, "text_offset": offsets}});
        let _ = read_echo(&choice, &prompt, &spans);
    }
}
