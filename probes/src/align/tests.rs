//! Tests of `align` with a small in-test vocabulary (greedy longest-match byte tokenizer):
//! direct mapping by text and by bytes, vLLM's `bytes:` spelling, the re-tokenization
//! fallback with its unmappable count, and top-k mapping.

use std::collections::HashMap;

use super::*;

/// A tiny byte-level vocabulary: id = index in `tokens`; `encode` is greedy longest match
/// (every single byte of the test texts is in the vocabulary, so encoding never fails).
struct TestVocab {
    tokens: Vec<Vec<u8>>,
    by_bytes: HashMap<Vec<u8>, u32>,
}

impl TestVocab {
    fn new(extra: &[&[u8]]) -> Self {
        let mut tokens: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        tokens.extend(extra.iter().map(|t| t.to_vec()));
        let by_bytes = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        Self { tokens, by_bytes }
    }
}

impl ReferenceVocab for TestVocab {
    fn id_of_text(&self, t: &str) -> Option<u32> {
        self.by_bytes.get(t.as_bytes()).copied()
    }
    fn id_of_bytes(&self, b: &[u8]) -> Option<u32> {
        self.by_bytes.get(b).copied()
    }
    fn encode(&self, text: &str) -> Vec<u32> {
        let b = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let mut best = (1, u32::from(b[i]));
            for len in 2..=(b.len() - i).min(16) {
                if let Some(&id) = self.by_bytes.get(&b[i..i + len]) {
                    best = (len, id);
                }
            }
            out.push(best.1);
            i += best.0;
        }
        out
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokens.get(id as usize).cloned().unwrap_or_default()
    }
}

fn vocab() -> TestVocab {
    TestVocab::new(&[b"Hel", b"lo", b" world", b"Hello", "é".as_bytes(), b" the"])
}

fn toks(t: &[&str]) -> Vec<EndpointToken> {
    t.iter().map(|s| EndpointToken::text(*s)).collect()
}

#[test]
fn direct_mapping_by_text() {
    let v = vocab();
    let a = align(&toks(&["Hel", "lo", " world"]), &v);
    assert_eq!(a.method, AlignMethod::Direct);
    assert_eq!(a.reference_ids, vec![256, 257, 258]);
    assert_eq!(a.unmappable, 0);
    assert_eq!(a.mismatch_rate, 0.0);
    assert_eq!(a.id_at(2), Some(258));
    assert_eq!(a.id_at(3), None);
    // a non-canonical split that still exists in the vocabulary stays direct
    assert_eq!(align(&toks(&["Hel", "lo"]), &v).method, AlignMethod::Direct);
    let empty = align(&[], &v);
    assert_eq!(
        (empty.method, empty.mismatch_rate),
        (AlignMethod::Direct, 0.0)
    );
}

#[test]
fn partial_characters_map_by_bytes() {
    let v = vocab();
    let e = "é".as_bytes();
    let tokens = vec![
        EndpointToken {
            text: "\u{FFFD}".into(),
            bytes: Some(vec![e[0]]),
        },
        EndpointToken {
            text: "\u{FFFD}".into(),
            bytes: Some(vec![e[1]]),
        },
        EndpointToken::text(format!("bytes:\\x{:02x}", b'a')),
    ];
    let a = align(&tokens, &v);
    assert_eq!(a.method, AlignMethod::Direct);
    assert_eq!(
        a.reference_ids,
        vec![u32::from(e[0]), u32::from(e[1]), u32::from(b'a')]
    );
    assert_eq!(
        EndpointToken::text("bytes:\\xc3\\xa9").resolved_bytes(),
        Some(e.to_vec())
    );
    assert_eq!(EndpointToken::text("bytes:\\xzz").resolved_bytes(), None);
    assert_eq!(EndpointToken::text("bytes:\\x+f").resolved_bytes(), None);
    assert_eq!(EndpointToken::text("bytes:").resolved_bytes(), None);
    assert_eq!(EndpointToken::text("a\u{FFFD}").resolved_bytes(), None);
}

#[test]
fn different_boundaries_fall_back_to_byte_offsets() {
    let v = vocab();
    // "Hell" is not a reference token. Reference encodes "Hello world" as [Hello][ world]:
    // endpoint spans [0,4) [4,5) [5,11); reference spans [0,5) [5,11) → only " world" maps.
    let a = align(&toks(&["Hell", "o", " world"]), &v);
    assert_eq!(a.method, AlignMethod::Retokenized);
    assert_eq!(a.reference_ids, vec![259, 258]);
    assert_eq!(a.ref_index, vec![None, None, Some(1)]);
    assert_eq!(a.unmappable, 2);
    assert!((a.mismatch_rate - 2.0 / 3.0).abs() < 1e-15);
    assert_eq!(a.id_at(2), Some(258));
}

#[test]
fn a_foreign_tokenizer_is_mostly_unmappable() {
    let v = vocab();
    // a tokenizer that splits "Hello world the" as "He" "llo w" "orld" " th" "e"
    let a = align(&toks(&["He", "llo w", "orld", " th", "e"]), &v);
    assert_eq!(a.method, AlignMethod::Retokenized);
    assert_eq!(a.unmappable, 5);
    assert_eq!(a.mismatch_rate, 1.0);
    // an unknown partial character without bytes cannot be resolved but keeps offsets sane
    let b = align(
        &[
            EndpointToken::text("\u{FFFD}"),
            EndpointToken::text(" world"),
        ],
        &v,
    );
    assert_eq!(b.method, AlignMethod::Retokenized);
    assert_eq!(b.unmappable, 1);
    assert_eq!(b.id_at(1), Some(258));
}

#[test]
fn top_alternatives_map_or_are_counted() {
    let v = vocab();
    let alts = vec![
        (EndpointToken::text(" world"), -0.1),
        (EndpointToken::text(" wor"), -2.0),
        (
            EndpointToken {
                text: "\u{FFFD}".into(),
                bytes: Some(vec![0xc3]),
            },
            -3.0,
        ),
    ];
    let (top, dropped) = map_top(&alts, &v);
    assert_eq!(dropped, 1);
    assert_eq!(
        top,
        vec![
            TopEntry {
                id: 258,
                logprob: -0.1
            },
            TopEntry {
                id: 0xc3,
                logprob: -3.0
            }
        ]
    );
}

#[test]
fn wire_tokens_convert() {
    let t = TokenLogprob {
        token: "lo".into(),
        logprob: -0.5,
        bytes: Some(b"lo".to_vec()),
        top_logprobs: vec![],
    };
    let e = EndpointToken::from(&t);
    assert_eq!(e.resolved_bytes(), Some(b"lo".to_vec()));
    let top = TopLogprob {
        token: "x".into(),
        logprob: -1.0,
        bytes: None,
    };
    assert_eq!(EndpointToken::from(&top), EndpointToken::text("x"));
}

#[test]
fn lossy_partial_characters_resolve_through_the_known_text() {
    // no "é" token: the reference spells it as its two bytes, both shown as U+FFFD
    let v = TestVocab::new(&[b"Hel", b"lo"]);
    let e = "é".as_bytes();
    let lossy = || EndpointToken::text("\u{FFFD}");
    let tokens = vec![EndpointToken::text("Hel"), lossy(), lossy()];
    // on their own the lossy tokens are ambiguous: the span fallback cannot recover them
    let blind = align(&tokens, &v);
    assert_eq!(blind.method, AlignMethod::Retokenized);
    assert!(blind.unmappable >= 1, "{blind:?}");
    // knowing the text they spell, they resolve to the reference's own tokenization
    let a = align_to_text(&tokens, "Helé", &v);
    assert_eq!(a.method, AlignMethod::Direct);
    assert_eq!(a.reference_ids, vec![256, u32::from(e[0]), u32::from(e[1])]);
    assert_eq!((a.unmappable, a.mismatch_rate), (0, 0.0));
    // a leading token the text does not hold (a BOS) maps on its own
    let with_bos = [vec![EndpointToken::text("lo")], tokens.clone()].concat();
    let b = align_to_text(&with_bos, "Helé", &v);
    assert_eq!(b.method, AlignMethod::Direct);
    assert_eq!(
        b.reference_ids,
        vec![257, 256, u32::from(e[0]), u32::from(e[1])]
    );
    // a text the tokens do not spell is no licence: back to the span fallback
    assert_eq!(
        align_to_text(&tokens, "Hello", &v).method,
        AlignMethod::Retokenized
    );
    assert_eq!(
        align_to_text(&tokens, "Helé!", &v).method,
        AlignMethod::Retokenized
    );
    // bytes, where sent, must agree too
    let wrong = vec![
        EndpointToken::text("Hel"),
        EndpointToken {
            text: "\u{FFFD}".into(),
            bytes: Some(vec![e[1]]),
        },
        lossy(),
    ];
    assert_eq!(
        align_to_text(&wrong, "Helé", &v).method,
        AlignMethod::Retokenized
    );
    // tokens that all map stay direct whatever the text
    let plain = toks(&["Hel", "lo"]);
    assert_eq!(
        align_to_text(&plain, "unrelated", &v).reference_ids,
        vec![256, 257]
    );
}
