//! A synthetic but valid byte-level BPE tokenizer (llama.cpp's `gpt2` model, Llama 3's
//! `llama-bpe` pre-tokenizer) that fills a vocabulary of any size from 261 up, and a Llama 3
//! style chat template over its special tokens: enough for `samewise engine serve` to load a
//! synthetic model and answer with text.
//!
//! Layout of the ids: the 256 byte tokens first, in byte order (GPT-2's byte-to-unicode
//! strings); then one token per merge, in merge order; then the special tokens
//! ([`SPECIALS`]), control tokens at the very end. Every merge appends one letter to a token
//! of one of two families: words (a space, `Ġ`, then letters) and word insides (letters
//! only). A family grows a level at a time, all its tokens times all 26 letters, in order:
//! words of 2, 3 and 4 bytes, insides of 2 and 3, then longer words and insides in turn until
//! the vocabulary is full. So every result is a distinct string whose parts are already in
//! the vocabulary, and since the word merges rank first, English text encodes to tokens of a
//! few letters (a word's start, then its rest), as with a real vocabulary.

use crate::error::{EngineError, Result};
use crate::gguf::GgufValue;

/// The special tokens, in id order at the end of the vocabulary (Llama 3's names).
pub const SPECIALS: [&str; 5] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];

/// GGUF token type of an ordinary token.
const TOKEN_TYPE_NORMAL: i32 = 1;
/// GGUF token type of a control token.
const TOKEN_TYPE_CONTROL: i32 = 3;

/// Llama 3's chat template, less its tools and date handling (the engine's tools convention
/// applies, as for any template that does not render tools).
const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] or '') + '<|eot_id|>' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/// The tokenizer and chat template metadata (`tokenizer.*`) for a vocabulary of `vocab`
/// tokens.
pub fn tokenizer_metadata(vocab: usize) -> Result<Vec<(String, GgufValue)>> {
    let n_merges = vocab.checked_sub(256 + SPECIALS.len()).ok_or_else(|| {
        EngineError::InvalidRequest(format!(
            "a vocabulary of {vocab} cannot hold the 256 byte tokens and {} special tokens",
            SPECIALS.len()
        ))
    })?;
    let byte_str: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut tokens = byte_str.clone();
    let mut merges = Vec::with_capacity(n_merges);
    let letters: Vec<&str> = (b'a'..=b'z')
        .map(|b| byte_str[usize::from(b)].as_str())
        .collect();
    // the two families' current levels: words (a space, `Ġ`, then letters) and word insides
    let mut word = vec![byte_str[usize::from(b' ')].clone()];
    let mut inner: Vec<String> = letters.iter().map(|s| (*s).to_owned()).collect();
    // words up to 4 bytes, insides up to 3, then a longer word, a longer inside, ...
    let mut step = 0;
    while merges.len() < n_merges {
        let family = if step < 3 || (step > 4 && step % 2 == 1) {
            &mut word
        } else {
            &mut inner
        };
        let mut next = Vec::with_capacity(family.len() * letters.len());
        'extend: for left in family.iter() {
            for right in &letters {
                if merges.len() == n_merges {
                    break 'extend;
                }
                merges.push(format!("{left} {right}"));
                next.push(format!("{left}{right}"));
            }
        }
        tokens.extend(next.iter().cloned());
        *family = next;
        step += 1;
    }
    let first_special = tokens.len();
    tokens.extend(SPECIALS.iter().map(|s| (*s).to_owned()));
    let types: Vec<GgufValue> = (0..tokens.len())
        .map(|i| {
            GgufValue::I32(if i >= first_special {
                TOKEN_TYPE_CONTROL
            } else {
                TOKEN_TYPE_NORMAL
            })
        })
        .collect();
    let id = |name: &str| {
        let i = SPECIALS.iter().position(|s| *s == name).unwrap_or(0);
        GgufValue::U32((first_special + i) as u32)
    };
    let strings = |v: Vec<String>| GgufValue::Array(v.into_iter().map(GgufValue::String).collect());
    let kv = |k: &str, v: GgufValue| (k.to_owned(), v);
    Ok(vec![
        kv("tokenizer.ggml.model", GgufValue::String("gpt2".into())),
        kv("tokenizer.ggml.pre", GgufValue::String("llama-bpe".into())),
        kv("tokenizer.ggml.tokens", strings(tokens)),
        kv("tokenizer.ggml.token_type", GgufValue::Array(types)),
        kv("tokenizer.ggml.merges", strings(merges)),
        kv("tokenizer.ggml.bos_token_id", id("<|begin_of_text|>")),
        kv("tokenizer.ggml.eos_token_id", id("<|end_of_text|>")),
        kv("tokenizer.ggml.eot_token_id", id("<|eot_id|>")),
        kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(true)),
        kv(
            "tokenizer.chat_template",
            GgufValue::String(CHAT_TEMPLATE.into()),
        ),
    ])
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the others are
/// numbered from U+0100 in byte order (a space is `Ġ`, U+0120).
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
    if printable(b) {
        return char::from(b);
    }
    let k = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + k).unwrap_or(char::REPLACEMENT_CHARACTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_is_exactly_full_and_its_strings_distinct() -> Result<()> {
        for vocab in [261, 300, 49152] {
            let meta = tokenizer_metadata(vocab)?;
            let get = |k: &str| {
                meta.iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
            };
            let Some(GgufValue::Array(tokens)) = get("tokenizer.ggml.tokens") else {
                panic!("no tokens");
            };
            let Some(GgufValue::Array(merges)) = get("tokenizer.ggml.merges") else {
                panic!("no merges");
            };
            assert_eq!(tokens.len(), vocab);
            assert_eq!(merges.len(), vocab - 261);
            let distinct: std::collections::BTreeSet<_> =
                tokens.iter().filter_map(GgufValue::as_str).collect();
            assert_eq!(distinct.len(), vocab);
            assert_eq!(
                get("tokenizer.ggml.eot_token_id"),
                Some(GgufValue::U32(vocab as u32 - 1))
            );
        }
        assert_eq!(byte_char(b' '), '\u{120}');
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(0), '\u{100}');
        assert!(tokenizer_metadata(260).is_err());
        Ok(())
    }
}
