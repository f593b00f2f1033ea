//! Tokenizer conformance: the tokenizer the engine builds from GGUF metadata gives the same
//! ids as the `tokenizers` crate loading the model's tokenizer.json, on varied text; decode
//! round-trips; token bytes and the streaming detokenizer agree with decode.

use crate::common;

use samewise_engine::Tokenizer;
use samewise_engine::{GgufFile, GgufValue, GgufWriter};

fn texts() -> Vec<String> {
    let mut v: Vec<String> = [
        "",
        " ",
        "Hello, world!",
        "   leading spaces and    runs of    spaces   ",
        "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
        "digits 0 12 345 6789 3.14159 1,000,000 2^10=1024 -7e-3",
        "unicode: naïve café Straße Œuvre 東京 北京 Москва Ελλάδα עברית العربية हिन्दी",
        "emoji 🚀🌍👩‍👩‍👧‍👦 🇫🇷 ✅",
        "code: fn main() { let x: Vec<u8> = vec![1, 2, 3]; println!(\"{x:?}\"); }",
        "def f(x):\n    return x ** 2  # square\n\n\tif x != None: pass",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "special inside<|endoftext|>text <file_sep> <filename>",
        "contractions: don't won't it's we're I'm they'll she'd DON'T",
        "punctuation!!! ??? ... --- *** ((nested)) [[x]] {{y}} <<<>>>",
        "\u{0}\u{1}\u{7f} control bytes and \u{a0} nbsp \u{200b} zero-width",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for entry in std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/golden/texts"
    ))
    .into_iter()
    .flatten()
    .flatten()
    {
        if let Ok(t) = std::fs::read_to_string(entry.path()) {
            v.push(t);
        }
    }
    v
}

fn reference() -> anyhow::Result<tokenizers::Tokenizer> {
    tokenizers::Tokenizer::from_file(common::fixtures_dir().join("smollm2/tokenizer.json"))
        .map_err(|e| anyhow::anyhow!("{e}"))
}

fn from_gguf() -> anyhow::Result<Tokenizer> {
    let gguf = GgufFile::open(&common::model_path()?)?;
    Ok(Tokenizer::from_gguf(&gguf)?)
}

#[test]
fn gguf_tokenizer_matches_tokenizer_json() -> anyhow::Result<()> {
    let ours = from_gguf()?;
    let reference = reference()?;
    assert_eq!(ours.vocab_size(), reference.get_vocab_size(true));
    for text in texts() {
        let want = reference
            .encode(text.as_str(), false)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .get_ids()
            .to_vec();
        let got = ours.encode(&text, false)?;
        assert_eq!(got, want, "ids differ for {text:?}");
        // the GGUF says add_bos_token = false: with special tokens added nothing changes
        assert_eq!(
            ours.encode(&text, true)?,
            want,
            "add_special_tokens changed ids for {text:?}"
        );
    }
    Ok(())
}

#[test]
fn tokenizer_json_loader_matches_the_tokenizers_crate() -> anyhow::Result<()> {
    let ours = Tokenizer::from_hf_dir(&common::fixtures_dir().join("smollm2"))?;
    let reference = reference()?;
    for text in texts() {
        let want = reference
            .encode(text.as_str(), false)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .get_ids()
            .to_vec();
        assert_eq!(ours.encode(&text, false)?, want, "ids differ for {text:?}");
    }
    assert_eq!(ours.bos_id(), Some(1));
    assert_eq!(ours.eos_id(), Some(2));
    Ok(())
}

#[test]
fn golden_fixture_ids_are_what_we_encode() -> anyhow::Result<()> {
    let ours = from_gguf()?;
    let golden = common::fixture_json("golden_smollm2.json")?;
    let texts = golden["texts"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no texts"))?;
    assert!(texts.len() >= 5);
    for t in texts {
        let text = t["text"].as_str().unwrap_or_default();
        let want: Vec<u32> = serde_json::from_value(t["token_ids"].clone())?;
        assert_eq!(ours.encode(text, false)?, want, "golden text {}", t["name"]);
    }
    Ok(())
}

#[test]
fn decode_round_trips_and_matches_reference_decode() -> anyhow::Result<()> {
    let ours = from_gguf()?;
    let reference = reference()?;
    for text in texts() {
        let ids = ours.encode(&text, false)?;
        assert_eq!(ours.decode(&ids, false)?, text, "round trip of {text:?}");
        let want = reference
            .decode(&ids, false)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        assert_eq!(
            ours.decode(&ids, false)?,
            want,
            "decode differs from tokenizers for {text:?}"
        );
    }
    Ok(())
}

#[test]
fn special_tokens_are_single_ids_and_can_be_skipped() -> anyhow::Result<()> {
    let ours = from_gguf()?;
    let ids = ours.encode("<|im_start|>user\nHi<|im_end|>", false)?;
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert!(ours.is_special(1) && ours.is_special(2) && !ours.is_special(ids[1]));
    assert_eq!(ours.decode(&ids, true)?, "user\nHi");
    assert_eq!(ours.bos_token(), Some("<|im_start|>"));
    assert_eq!(ours.eos_token(), Some("<|im_end|>"));
    assert!(ours.stop_ids().contains(&2));
    Ok(())
}

#[test]
fn token_bytes_concatenate_to_the_text_and_streaming_never_splits_chars() -> anyhow::Result<()> {
    let ours = from_gguf()?;
    let mut saw_partial_token = false;
    for text in texts() {
        let ids = ours.encode(&text, false)?;
        let mut bytes = Vec::new();
        for &id in &ids {
            let b = ours.token_bytes(id)?;
            saw_partial_token |= std::str::from_utf8(b).is_err();
            bytes.extend_from_slice(b);
        }
        assert_eq!(bytes, text.as_bytes());

        let mut detok = ours.detokenizer(false);
        let mut streamed = String::new();
        for &id in &ids {
            let piece = detok.push(id)?;
            // every piece is valid UTF-8 by type; none may contain a replacement char that
            // the text itself does not have
            assert!(
                !piece.contains('\u{FFFD}') || text.contains('\u{FFFD}'),
                "split char in {text:?}"
            );
            streamed.push_str(&piece);
        }
        streamed.push_str(&detok.finish());
        assert_eq!(streamed, text);
    }
    // the emoji and CJK texts must exercise tokens that are partial UTF-8 sequences
    assert!(
        saw_partial_token,
        "no token split a multi-byte character: the streaming test proved nothing"
    );
    Ok(())
}

#[test]
fn out_of_vocab_ids_are_errors_not_panics() -> anyhow::Result<()> {
    let ours = from_gguf()?;
    let n = ours.vocab_size() as u32;
    assert!(ours.decode(&[5, n], false).is_err());
    assert!(ours.token_bytes(u32::MAX).is_err());
    assert!(ours.detokenizer(false).push(n + 7).is_err());
    Ok(())
}

#[test]
fn unknown_gguf_pre_tokenizer_is_a_clear_error() -> anyhow::Result<()> {
    // a copy of the test model with tokenizer.ggml.pre renamed in place (same length)
    let path = common::model_path()?;
    let mut bytes = std::fs::read(&path)?;
    let key = b"tokenizer.ggml.pre";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .ok_or_else(|| anyhow::anyhow!("no pre key"))?;
    // the value follows: u32 type (8 = string), u64 length, then the bytes "smollm"
    let value_at = at + key.len() + 4 + 8;
    anyhow::ensure!(
        &bytes[value_at..value_at + 6] == b"smollm",
        "unexpected layout"
    );
    bytes[value_at..value_at + 6].copy_from_slice(b"zzzzzz");
    let dir = std::env::temp_dir().join(format!("samewise-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let copy = dir.join("renamed-pre.gguf");
    std::fs::write(&copy, &bytes)?;
    let result = GgufFile::open(&copy)
        .map_err(anyhow::Error::from)
        .and_then(|g| Ok(Tokenizer::from_gguf(&g)?));
    std::fs::remove_dir_all(&dir)?;
    let err = result
        .err()
        .ok_or_else(|| anyhow::anyhow!("an unknown pre-tokenizer was accepted"))?;
    assert!(
        err.to_string().contains("zzzzzz"),
        "error does not name the pre-tokenizer: {err}"
    );
    Ok(())
}

/// Writes a GGUF v3 file holding only tokenizer metadata: the test model's vocabulary,
/// merges and token types with `tokenizer.ggml.pre` (and optionally the model) replaced.
fn write_tokenizer_gguf(path: &std::path::Path, pre: &str, model: &str) -> anyhow::Result<()> {
    let src = GgufFile::open(&common::model_path()?)?;
    let mut meta = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            GgufValue::String(model.into()),
        ),
        (
            "tokenizer.ggml.pre".to_owned(),
            GgufValue::String(pre.into()),
        ),
    ];
    for key in [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
    ] {
        let v = src.get(key).ok_or_else(|| anyhow::anyhow!("no {key}"))?;
        meta.push((key.to_owned(), v.clone()));
    }
    meta.push(("tokenizer.ggml.eos_token_id".to_owned(), GgufValue::U32(2)));
    GgufWriter::create(path, &meta, Vec::new())?.finish()?;
    Ok(())
}

#[test]
fn llama3_and_qwen2_pre_tokenizers_build_and_behave() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("samewise-pre-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let load = |pre: &str, model: &str| -> anyhow::Result<Tokenizer> {
        let path = dir.join(format!("{pre}-{model}.gguf"));
        write_tokenizer_gguf(&path, pre, model)?;
        Ok(Tokenizer::from_gguf(&GgufFile::open(&path)?)?)
    };
    let result = (|| -> anyhow::Result<()> {
        let gpt2 = load("gpt2", "gpt2")?;
        let llama3 = load("llama-bpe", "gpt2")?;
        let qwen2 = load("qwen2", "gpt2")?;
        for t in [&gpt2, &llama3, &qwen2] {
            for text in texts() {
                assert_eq!(
                    t.decode(&t.encode(&text, false)?, false)?,
                    text,
                    "round trip of {text:?}"
                );
            }
        }
        // the families split whitespace differently: llama-3 and qwen2 keep a newline run
        // ("\s*[\r\n]+") apart, gpt2 splits "\s+(?!\S)" runs before the next word
        for t in ["x\n\n\ny", "  \n  foo"] {
            assert_ne!(gpt2.encode(t, false)?, llama3.encode(t, false)?, "{t:?}");
            assert_eq!(llama3.encode(t, false)?, qwen2.encode(t, false)?, "{t:?}");
        }
        // qwen2 normalises to NFC: a decomposed é encodes like the composed one
        assert_eq!(
            qwen2.encode("caf\u{65}\u{301}", false)?,
            qwen2.encode("caf\u{e9}", false)?
        );
        assert_ne!(
            gpt2.encode("caf\u{65}\u{301}", false)?,
            gpt2.encode("caf\u{e9}", false)?
        );
        // a non-BPE GGUF tokenizer is a clear error
        let err = load("default", "llama")
            .err()
            .ok_or_else(|| anyhow::anyhow!("a llama (SPM) GGUF tokenizer was accepted"))?;
        assert!(err.to_string().contains("llama"), "{err}");
        Ok(())
    })();
    std::fs::remove_dir_all(&dir)?;
    result
}
