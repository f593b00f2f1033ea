//! Token alignment: mapping the tokens an endpoint returns (strings, sometimes with byte
//! arrays) onto reference-vocabulary ids, so the reference can score the same positions.
//!
//! OpenAI-compatible servers return each token as its decoded text, and often as `bytes`
//! too (needed when a token is part of a UTF-8 character: its text is then `"\u{FFFD}"` or,
//! in vLLM's spelling, `"bytes:\xe2\x80"`). [`align`] first maps every token directly
//! through [`ReferenceVocab`] (bytes when known, else text; a display text several tokens
//! share, such as a lone U+FFFD, maps to none of them). If every token maps, the
//! endpoint's token sequence *is* a reference sequence and the reference scores exactly it
//! ([`AlignMethod::Direct`]). When the text the tokens spell is known (an echoed prompt),
//! [`align_to_text`] resolves the ambiguous ones through the reference's tokenization of it.
//!
//! Otherwise the tokenizers' boundaries differ. The fallback re-tokenizes the concatenated
//! text with the reference and aligns by byte offsets ([`AlignMethod::Retokenized`]): an
//! endpoint token maps to the reference token covering exactly the same byte span; the
//! reference scores its own tokenization, and only positions whose spans coincide are
//! compared. Tokens with no matching span are counted as `unmappable`, and `mismatch_rate =
//! unmappable / tokens` is reported: a high rate is itself a finding (a different tokenizer
//! is a different model).

use samewise_wire::{TokenLogprob, TopLogprob};

use crate::compare::TopEntry;

/// What the probes need from the reference tokenizer (the engine's tokenizer implements it).
pub trait ReferenceVocab {
    /// The id of the token whose decoded text is exactly `t`, if any.
    fn id_of_text(&self, t: &str) -> Option<u32>;
    /// The id of the token whose bytes are exactly `b`, if any.
    fn id_of_bytes(&self, b: &[u8]) -> Option<u32>;
    /// The reference's own tokenization of `text` (no special tokens added).
    fn encode(&self, text: &str) -> Vec<u32>;
    /// The bytes a token decodes to (empty for an unknown id).
    fn token_bytes(&self, id: u32) -> Vec<u8>;
}

/// One token as an endpoint reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointToken {
    /// The token's text.
    pub text: String,
    /// Its UTF-8 bytes, when the endpoint sent them.
    pub bytes: Option<Vec<u8>>,
}

impl EndpointToken {
    /// A token known only by its text.
    pub fn text(t: impl Into<String>) -> Self {
        Self {
            text: t.into(),
            bytes: None,
        }
    }

    /// The token's bytes: the `bytes` field if present; else vLLM's `"bytes:\xNN..."`
    /// spelling decoded; else the text's UTF-8, unless the text contains U+FFFD (a lossy
    /// rendering of a partial character, whose bytes are unknown).
    pub fn resolved_bytes(&self) -> Option<Vec<u8>> {
        if let Some(b) = &self.bytes {
            return Some(b.clone());
        }
        if let Some(rest) = self.text.strip_prefix("bytes:") {
            return parse_hex_escapes(rest);
        }
        if self.text.contains('\u{FFFD}') {
            return None;
        }
        Some(self.text.as_bytes().to_vec())
    }
}

impl From<&TokenLogprob> for EndpointToken {
    fn from(t: &TokenLogprob) -> Self {
        Self {
            text: t.token.clone(),
            bytes: t.bytes.clone(),
        }
    }
}

impl From<&TopLogprob> for EndpointToken {
    fn from(t: &TopLogprob) -> Self {
        Self {
            text: t.token.clone(),
            bytes: t.bytes.clone(),
        }
    }
}

/// Decodes `\xNN\xNN...` (nothing else allowed).
fn parse_hex_escapes(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return None;
    }
    b.chunks(4)
        .map(|c| {
            if c[0] != b'\\' || c[1] != b'x' || !c[2..].iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(&c[2..]).ok()?;
            u8::from_str_radix(hex, 16).ok()
        })
        .collect()
}

/// How the endpoint's tokens were mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlignMethod {
    /// Every token mapped on its own; the reference scores the endpoint's sequence.
    Direct,
    /// Boundaries differ; the reference scores its own tokenization, aligned by bytes.
    Retokenized,
}

/// The outcome of [`align`].
#[derive(Debug, Clone, PartialEq)]
pub struct Alignment {
    /// How the mapping was made.
    pub method: AlignMethod,
    /// The sequence the reference should score.
    pub reference_ids: Vec<u32>,
    /// Per endpoint token: the index into `reference_ids` of the same token, if it maps.
    pub ref_index: Vec<Option<usize>>,
    /// Endpoint tokens that map to no reference token.
    pub unmappable: usize,
    /// `unmappable / endpoint tokens` (0 for no tokens).
    pub mismatch_rate: f64,
}

impl Alignment {
    /// The reference id of endpoint token `i`, if it maps (what the tests read).
    #[cfg(test)]
    pub fn id_at(&self, i: usize) -> Option<u32> {
        self.ref_index
            .get(i)
            .copied()
            .flatten()
            .and_then(|j| self.reference_ids.get(j).copied())
    }
}

fn direct_id(t: &EndpointToken, vocab: &dyn ReferenceVocab) -> Option<u32> {
    match t.resolved_bytes() {
        Some(b) => vocab.id_of_bytes(&b).or_else(|| vocab.id_of_text(&t.text)),
        None => vocab.id_of_text(&t.text),
    }
}

fn direct_alignment(reference_ids: Vec<u32>) -> Alignment {
    Alignment {
        method: AlignMethod::Direct,
        ref_index: (0..reference_ids.len()).map(Some).collect(),
        reference_ids,
        unmappable: 0,
        mismatch_rate: 0.0,
    }
}

/// Every token's own id, if every token maps on its own.
fn direct_ids(tokens: &[EndpointToken], vocab: &dyn ReferenceVocab) -> Option<Vec<u32>> {
    tokens.iter().map(|t| direct_id(t, vocab)).collect()
}

/// Maps an endpoint's token sequence onto reference ids (see the module doc).
pub fn align(tokens: &[EndpointToken], vocab: &dyn ReferenceVocab) -> Alignment {
    match direct_ids(tokens, vocab) {
        Some(ids) => direct_alignment(ids),
        None => retokenized(tokens, vocab),
    }
}

/// [`align`] for tokens known to spell `text` (an echoed prompt), optionally after up to two
/// leading special tokens (a BOS the text does not hold). Where a token cannot map on its own
/// because its text is a lossy rendering of part of a character (U+FFFD, no bytes sent), the
/// reference's tokenization of `text` resolves it: if it has the same number of tokens and
/// agrees with every endpoint token (by bytes where known, else by display text), the endpoint
/// sequence is that one ([`AlignMethod::Direct`]). Otherwise as [`align`].
pub fn align_to_text(
    tokens: &[EndpointToken],
    text: &str,
    vocab: &dyn ReferenceVocab,
) -> Alignment {
    if let Some(ids) = direct_ids(tokens, vocab) {
        return direct_alignment(ids);
    }
    match resolve_with_text(tokens, text, vocab) {
        Some(ids) => direct_alignment(ids),
        None => retokenized(tokens, vocab),
    }
}

fn resolve_with_text(
    tokens: &[EndpointToken],
    text: &str,
    vocab: &dyn ReferenceVocab,
) -> Option<Vec<u32>> {
    let encoded = vocab.encode(text);
    let lead = tokens.len().checked_sub(encoded.len())?;
    if lead > 2 {
        return None;
    }
    let mut ids = Vec::with_capacity(tokens.len());
    for t in &tokens[..lead] {
        ids.push(direct_id(t, vocab)?);
    }
    for (t, &id) in tokens[lead..].iter().zip(&encoded) {
        let b = vocab.token_bytes(id);
        let agrees = match t.resolved_bytes() {
            Some(tb) => tb == b,
            None => String::from_utf8_lossy(&b) == t.text,
        };
        if !agrees {
            return None;
        }
        ids.push(id);
    }
    Some(ids)
}

/// The re-tokenization fallback: the reference's tokenization of the concatenated text,
/// aligned by byte spans.
fn retokenized(tokens: &[EndpointToken], vocab: &dyn ReferenceVocab) -> Alignment {
    // Byte spans of the endpoint's tokens (unknown bytes: the text's UTF-8, which keeps the
    // count of characters right even if that one token cannot match).
    let mut all = Vec::new();
    let mut ep_spans = Vec::with_capacity(tokens.len());
    for t in tokens {
        let b = t
            .resolved_bytes()
            .unwrap_or_else(|| t.text.as_bytes().to_vec());
        let start = all.len();
        all.extend_from_slice(&b);
        ep_spans.push((start, all.len()));
    }
    let text = String::from_utf8_lossy(&all);
    let reference_ids = vocab.encode(&text);
    let mut ref_spans = std::collections::HashMap::with_capacity(reference_ids.len());
    let mut at = 0usize;
    for (j, &id) in reference_ids.iter().enumerate() {
        let len = vocab.token_bytes(id).len();
        ref_spans.insert((at, at + len), j);
        at += len;
    }
    // If lossy decoding changed the bytes, offsets past the change cannot be trusted; the
    // spans then simply fail to match and count as unmappable.
    let ref_index: Vec<Option<usize>> =
        ep_spans.iter().map(|s| ref_spans.get(s).copied()).collect();
    let unmappable = ref_index.iter().filter(|x| x.is_none()).count();
    Alignment {
        method: AlignMethod::Retokenized,
        reference_ids,
        ref_index,
        unmappable,
        mismatch_rate: if tokens.is_empty() {
            0.0
        } else {
            unmappable as f64 / tokens.len() as f64
        },
    }
}

/// Maps an endpoint's top-k alternatives `(token, logprob)` to reference ids; alternatives
/// that do not map are dropped and counted (the second value).
pub fn map_top(
    alternatives: &[(EndpointToken, f64)],
    vocab: &dyn ReferenceVocab,
) -> (Vec<TopEntry>, usize) {
    let mut out = Vec::with_capacity(alternatives.len());
    let mut dropped = 0;
    for (t, logprob) in alternatives {
        match direct_id(t, vocab) {
            Some(id) => out.push(TopEntry {
                id,
                logprob: *logprob,
            }),
            None => dropped += 1,
        }
    }
    (out, dropped)
}

#[cfg(test)]
mod tests;
