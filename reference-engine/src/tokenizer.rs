//! Text <-> token ids: a [`Tokenizer`] over the `tokenizers` crate, built from a
//! `tokenizer.json` (with its `tokenizer_config.json`) or from GGUF metadata.
//!
//! From GGUF only byte-level BPE (`tokenizer.ggml.model = gpt2`) is supported: the vocabulary
//! (`tokenizer.ggml.tokens`), the merges, the token types (control tokens become special
//! added tokens, user-defined ones plain added tokens), the bos/eos/pad ids, and the
//! pre-tokenizer that `tokenizer.ggml.pre` names, mapped as llama.cpp maps those names (the
//! gpt2, smollm/starcoder, llama-3 and qwen2 families; any other name is an error, never a
//! silent fallback to a regex that would give different ids).
//!
//! Besides encode/decode it gives each token's raw bytes (what OpenAI's logprob `bytes`
//! field reports) and a [`Detokenizer`] that turns a stream of ids into text without ever
//! splitting a UTF-8 character, and whose concatenated output equals [`Tokenizer::decode`].

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};

use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;

/// GGUF token type of a control token (llama.cpp's `LLAMA_TOKEN_TYPE_CONTROL`).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of a user-defined token (`LLAMA_TOKEN_TYPE_USER_DEFINED`).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The GPT-2 / llama.cpp pre-tokenizer regex (`LLAMA_VOCAB_PRE_TYPE_GPT2` and, after a
/// per-digit split, the starcoder/smollm family).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// The Llama 3 pre-tokenizer regex (`LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen2 pre-tokenizer regex (`LLAMA_VOCAB_PRE_TYPE_QWEN2`): Llama 3's with single digits.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A model's tokenizer plus the per-token facts the engine's API needs.
pub struct Tokenizer {
    /// The `tokenizers` pipeline that encodes and decodes.
    inner: tokenizers::Tokenizer,
    /// Raw bytes of every token id (index = id), for logprob `bytes` and streaming.
    token_bytes: Vec<Vec<u8>>,
    /// Display string of every token id (its bytes, lossily decoded), OpenAI's `token`.
    token_strings: Vec<String>,
    /// Ids that are special (control) tokens: skipped by `decode(.., skip_special = true)`.
    special: BTreeSet<u32>,
    /// Beginning-of-sequence token, if the model has one.
    bos: Option<u32>,
    /// End-of-sequence token, if the model has one.
    eos: Option<u32>,
    /// Ids that end a generation (eos, end-of-turn, and any the config lists).
    stop_ids: BTreeSet<u32>,
    /// The bos token's text (for chat templates' `bos_token`).
    bos_text: Option<String>,
    /// The eos token's text (for chat templates' `eos_token`).
    eos_text: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata (byte-level BPE only).
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let model = gguf
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| missing("tokenizer.ggml.model"))?;
        if model != "gpt2" {
            return Err(tok_err(format!(
                "GGUF tokenizer model {model:?} is not supported (only byte-level BPE, \"gpt2\"); \
                 load the model's tokenizer.json instead"
            )));
        }
        let tokens = gguf
            .get_str_array("tokenizer.ggml.tokens")
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
        let merges = gguf
            .get_str_array("tokenizer.ggml.merges")
            .ok_or_else(|| missing("tokenizer.ggml.merges"))?;
        let types: Vec<i64> = match gguf.get_array("tokenizer.ggml.token_type") {
            Some(a) => a.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(tok_err(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let pre = gguf.get_str("tokenizer.ggml.pre").unwrap_or("default");
        let bos = gguf.get_u32("tokenizer.ggml.bos_token_id");
        let eos = gguf.get_u32("tokenizer.ggml.eos_token_id");
        let eot = gguf.get_u32("tokenizer.ggml.eot_token_id");
        let add_bos = gguf
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(false);
        for (name, id) in [("bos", bos), ("eos", eos), ("eot", eot)] {
            if let Some(id) = id
                && id as usize >= tokens.len()
            {
                return Err(tok_err(format!(
                    "{name} token id {id} is outside the vocabulary of {}",
                    tokens.len()
                )));
            }
        }

        let mut vocab = serde_json::Map::with_capacity(tokens.len());
        let mut added = Vec::new();
        for (id, (tok, ty)) in tokens.iter().zip(&types).enumerate() {
            vocab.insert((*tok).to_owned(), json!(id));
            if *ty == TOKEN_TYPE_CONTROL || *ty == TOKEN_TYPE_USER_DEFINED {
                added.push(json!({
                    "id": id, "content": tok, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": *ty == TOKEN_TYPE_CONTROL,
                }));
            }
        }
        let (normalizer, pre_tokenizer) = pre_tokenizer_for(pre)?;
        let post_processor = match (add_bos, bos) {
            (true, Some(b)) => {
                let text = tokens.get(b as usize).copied().unwrap_or_default();
                json!({
                    "type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": text, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {text: {"id": text, "ids": [b], "tokens": [text]}},
                })
            }
            _ => Value::Null,
        };
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": merges,
            },
        });
        let inner = tokenizers::Tokenizer::from_bytes(spec.to_string().as_bytes())
            .map_err(|e| tok_err(format!("building the tokenizer from GGUF metadata: {e}")))?;
        let mut stop_ids: BTreeSet<u32> = eos.into_iter().chain(eot).collect();
        if let Some(id) = tokens
            .iter()
            .position(|t| *t == "<|eot_id|>" || *t == "<|im_end|>")
        {
            // chat end-of-turn markers end a generation even where the GGUF names only eos
            stop_ids.insert(id as u32);
        }
        Self::assemble(inner, bos, eos, stop_ids)
    }

    /// Loads `tokenizer.json` from a Hugging Face model directory, with the bos/eos tokens
    /// from its `tokenizer_config.json` and the stop ids from `generation_config.json` /
    /// `config.json` where present.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| tok_err(format!("{}: {e}", dir.join("tokenizer.json").display())))?;
        let config = read_json_opt(&dir.join("tokenizer_config.json"))?;
        let token_id = |key: &str| -> Option<u32> {
            let v = config.as_ref()?.get(key)?;
            let text = v
                .as_str()
                .or_else(|| v.get("content").and_then(Value::as_str))?;
            inner.token_to_id(text)
        };
        let bos = token_id("bos_token");
        let eos = token_id("eos_token");
        let mut stop_ids: BTreeSet<u32> = eos.into_iter().collect();
        for file in ["generation_config.json", "config.json"] {
            if let Some(cfg) = read_json_opt(&dir.join(file))? {
                match cfg.get("eos_token_id") {
                    Some(Value::Number(n)) => {
                        stop_ids.extend(n.as_u64().and_then(|v| u32::try_from(v).ok()))
                    }
                    Some(Value::Array(a)) => stop_ids.extend(
                        a.iter()
                            .filter_map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok())),
                    ),
                    _ => {}
                }
            }
        }
        Self::assemble(inner, bos, eos, stop_ids)
    }

    /// Loads a standalone `tokenizer.json` (no config: no bos/eos known).
    pub fn from_json_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        Self::assemble(inner, None, None, BTreeSet::new())
    }

    fn assemble(
        inner: tokenizers::Tokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
        stop_ids: BTreeSet<u32>,
    ) -> Result<Self> {
        let n = inner.get_vocab_size(true);
        let added = inner.get_added_tokens_decoder();
        let special: BTreeSet<u32> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let byte_level = is_byte_level(&inner);
        let mut token_bytes = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let bytes = match (added.get(&id), inner.id_to_token(id)) {
                // added tokens are matched as literal text, not byte-level encoded
                (Some(t), _) => t.content.as_bytes().to_vec(),
                (None, Some(tok)) if byte_level => byte_level_decode(&tok),
                (None, Some(tok)) => sentencepiece_bytes(&tok),
                (None, None) => Vec::new(),
            };
            token_bytes.push(bytes);
        }
        let token_strings = token_bytes
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect();
        let text_of = |id: Option<u32>| id.and_then(|i| inner.id_to_token(i));
        Ok(Self {
            bos_text: text_of(bos),
            eos_text: text_of(eos),
            inner,
            token_bytes,
            token_strings,
            special,
            bos,
            eos,
            stop_ids,
        })
    }

    /// Encodes text. Special-token strings in the text (`<|im_start|>`) become their ids,
    /// as Hugging Face does by default; `add_special_tokens` adds what the model's
    /// post-processor adds (e.g. bos).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| tok_err(format!("encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text: the concatenation of the tokens' bytes, invalid UTF-8 replaced
    /// by U+FFFD. Ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            if skip_special_tokens && self.special.contains(&id) {
                continue;
            }
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The raw bytes of one token.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.token_bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or(EngineError::TokenOutOfVocab {
                token: id,
                vocab_size: self.token_bytes.len(),
            })
    }

    /// One token as display text (its bytes, lossily decoded): OpenAI's logprob `token`.
    pub fn token_str(&self, id: u32) -> Result<&str> {
        self.token_strings
            .get(id as usize)
            .map(String::as_str)
            .ok_or(EngineError::TokenOutOfVocab {
                token: id,
                vocab_size: self.token_strings.len(),
            })
    }

    /// The id of a token given its vocabulary string (e.g. `<|im_end|>`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// Whether an id is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// Beginning-of-sequence id.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Beginning-of-sequence text (for chat templates).
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_text.as_deref()
    }

    /// End-of-sequence text (for chat templates).
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_text.as_deref()
    }

    /// Ids that end a generation.
    pub fn stop_ids(&self) -> &BTreeSet<u32> {
        &self.stop_ids
    }

    /// A streaming detokenizer over this tokenizer.
    pub fn detokenizer(&self, skip_special_tokens: bool) -> Detokenizer<'_> {
        Detokenizer {
            tokenizer: self,
            skip_special_tokens,
            utf8: Utf8Stream::default(),
        }
    }
}

/// Incremental detokenisation: feed ids one at a time, get text that never ends inside a
/// UTF-8 character. `push`es followed by `finish` concatenate to `Tokenizer::decode`.
pub struct Detokenizer<'t> {
    /// The tokenizer whose byte table is used.
    tokenizer: &'t Tokenizer,
    /// Whether special tokens are dropped from the text.
    skip_special_tokens: bool,
    /// The byte stream being decoded.
    utf8: Utf8Stream,
}

impl Detokenizer<'_> {
    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        if self.skip_special_tokens && self.tokenizer.is_special(id) {
            return Ok(String::new());
        }
        Ok(self.utf8.push(self.tokenizer.token_bytes(id)?))
    }

    /// Flushes what is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        self.utf8.finish()
    }
}

/// Bytes in, complete UTF-8 text out: the owned core of [`Detokenizer`], for callers that
/// cannot hold a borrow of the tokenizer (a streaming response). Invalid sequences become
/// U+FFFD exactly as `String::from_utf8_lossy` over the whole stream would.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    /// Bytes of an incomplete UTF-8 character carried over to the next push.
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // an invalid sequence: lossy decoding replaces it, as decode does
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        // an incomplete character at the end: wait for more bytes
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// The normalizer and pre-tokenizer JSON for a `tokenizer.ggml.pre` name, as llama.cpp
/// maps the names to regexes.
fn pre_tokenizer_for(pre: &str) -> Result<(Value, Value)> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
    let gpt2 =
        || json!({"type": "Sequence", "pretokenizers": [split(GPT2_REGEX), byte_level(false)]});
    Ok(match pre {
        "default" | "gpt2" | "gpt-2" => (Value::Null, gpt2()),
        "smollm" | "starcoder" | "refact" | "codeshell" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, split(GPT2_REGEX), byte_level(false)]}),
        ),
        "llama3" | "llama-v3" | "llama-bpe" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]}),
        ),
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]}),
        ),
        other => {
            return Err(tok_err(format!(
                "unknown pre-tokenizer {other:?} (tokenizer.ggml.pre); supported: default, gpt2, smollm, \
                 starcoder, llama3, llama-bpe, qwen2 — or load the model's tokenizer.json"
            )));
        }
    })
}

/// Whether the pipeline is byte-level (GPT-2 style) rather than sentencepiece style.
fn is_byte_level(t: &tokenizers::Tokenizer) -> bool {
    serde_json::to_value(t.get_decoder())
        .map(|v| v.to_string().contains("ByteLevel"))
        .unwrap_or(false)
        || serde_json::to_value(t.get_pre_tokenizer())
            .map(|v| v.to_string().contains("ByteLevel"))
            .unwrap_or(false)
}

/// GPT-2's byte-to-unicode table inverted: maps a byte-level token string to its bytes.
fn byte_level_decode(token: &str) -> Vec<u8> {
    token
        .chars()
        .flat_map(|c| match unicode_to_byte(c) {
            Some(b) => vec![b],
            // not in the table (should not happen in a byte-level vocab): keep its UTF-8
            None => c.to_string().into_bytes(),
        })
        .collect()
}

/// The inverse of GPT-2's `bytes_to_unicode`.
fn unicode_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if printable(cp) {
        return u8::try_from(cp).ok();
    }
    // the others are numbered 256.. in byte order
    let k = cp.checked_sub(256)?;
    (0u32..=255)
        .filter(|b| !printable(*b))
        .nth(k as usize)
        .and_then(|b| u8::try_from(b).ok())
}

/// Sentencepiece-style token bytes: `<0xAB>` is one byte, `▁` is a space.
fn sentencepiece_bytes(token: &str) -> Vec<u8> {
    if let Some(hex) = token.strip_prefix("<0x").and_then(|s| s.strip_suffix('>'))
        && hex.len() == 2
        && let Ok(b) = u8::from_str_radix(hex, 16)
    {
        return vec![b];
    }
    token.replace('\u{2581}', " ").into_bytes()
}

fn read_json_opt(path: &Path) -> Result<Option<Value>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| tok_err(format!("{}: invalid JSON: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EngineError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn missing(key: &str) -> EngineError {
    EngineError::MissingMetadata(key.to_owned())
}

fn tok_err(msg: impl Into<String>) -> EngineError {
    EngineError::Tokenizer(msg.into())
}
