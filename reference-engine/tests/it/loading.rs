//! Loading: the GGUF and the HF safetensors directory derived from it give the same
//! logprobs; bad input (not a GGUF, truncated, corrupt counts and offsets, unsupported
//! architecture or tensor type, bad token ids, too long, empty) gives a typed error and
//! never a panic.

use crate::common;

use std::path::Path;

use samewise_engine::GgufFile;
use samewise_engine::{Engine, EngineError, LoadOptions};

fn load(path: &Path) -> Result<Engine, EngineError> {
    Engine::load(
        path,
        LoadOptions {
            threads: 2,
            isa: None,
            ..LoadOptions::default()
        },
    )
}

/// Byte positions inside a GGUF header, found by walking it.
struct Layout {
    /// Offset of the u64 metadata count.
    n_kv_at: usize,
    /// Offset of the value bytes of `general.architecture` (after its u64 length).
    arch_at: usize,
    /// Per tensor: (name, offset of its u32 type, offset of its u64 data offset).
    tensors: Vec<(String, usize, usize)>,
}

fn layout(b: &[u8]) -> anyhow::Result<Layout> {
    let u32_at =
        |p: usize| -> anyhow::Result<u32> { Ok(u32::from_le_bytes(b[p..p + 4].try_into()?)) };
    let u64_at = |p: usize| -> anyhow::Result<usize> {
        Ok(u64::from_le_bytes(b[p..p + 8].try_into()?) as usize)
    };
    let n_tensors = u64_at(8)?;
    let n_kv = u64_at(16)?;
    let mut p = 24;
    let mut arch_at = 0;
    fn skip(b: &[u8], p: &mut usize, ty: u32) -> anyhow::Result<()> {
        let u64_at = |p: usize| -> anyhow::Result<usize> {
            Ok(u64::from_le_bytes(b[p..p + 8].try_into()?) as usize)
        };
        match ty {
            0 | 1 | 7 => *p += 1,
            2 | 3 => *p += 2,
            4..=6 => *p += 4,
            10..=12 => *p += 8,
            8 => *p += 8 + u64_at(*p)?,
            9 => {
                let et = u32::from_le_bytes(b[*p..*p + 4].try_into()?);
                let n = u64_at(*p + 4)?;
                *p += 12;
                for _ in 0..n {
                    skip(b, p, et)?;
                }
            }
            t => anyhow::bail!("type {t}"),
        }
        Ok(())
    }
    for _ in 0..n_kv {
        let klen = u64_at(p)?;
        let key = std::str::from_utf8(&b[p + 8..p + 8 + klen])?.to_string();
        p += 8 + klen;
        let ty = u32_at(p)?;
        p += 4;
        if key == "general.architecture" {
            arch_at = p + 8;
        }
        skip(b, &mut p, ty)?;
    }
    let mut tensors = Vec::new();
    for _ in 0..n_tensors {
        let nlen = u64_at(p)?;
        let name = std::str::from_utf8(&b[p + 8..p + 8 + nlen])?.to_string();
        p += 8 + nlen;
        let nd = u32_at(p)? as usize;
        p += 4 + 8 * nd;
        tensors.push((name, p, p + 4));
        p += 12;
    }
    Ok(Layout {
        n_kv_at: 16,
        arch_at,
        tensors,
    })
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<std::path::PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, bytes)?;
    Ok(p)
}

#[test]
fn gguf_and_hf_directory_give_the_same_logprobs() -> anyhow::Result<()> {
    let gguf = load(&common::model_path()?)?;
    let hf = load(&common::hf_fixture_dir()?)?;
    assert_eq!(gguf.config().vocab_size, hf.config().vocab_size);
    assert_eq!(gguf.config().n_layer, hf.config().n_layer);
    let g = common::fixture_json("golden_smollm2.json")?;
    let seqs: Vec<Vec<u32>> = g["texts"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no texts"))?
        .iter()
        .take(3)
        .map(|t| {
            t["token_ids"].as_array().map(|a| {
                a.iter()
                    .take(120)
                    .filter_map(|v| v.as_u64())
                    .map(|v| v as u32)
                    .collect()
            })
        })
        .collect::<Option<_>>()
        .ok_or_else(|| anyhow::anyhow!("bad golden"))?;
    let a = gguf.score(&seqs, 5)?;
    let b = hf.score(&seqs, 5)?;
    let mut max = 0f32;
    for (x, y) in a.iter().zip(&b) {
        for (p, q) in x.positions.iter().zip(&y.positions) {
            if let (Some(u), Some(v)) = (p.logprob, q.logprob) {
                max = max.max((u - v).abs());
            }
            assert_eq!(
                p.top.first().map(|t| t.token),
                q.top.first().map(|t| t.token)
            );
        }
    }
    eprintln!("GGUF vs HF: max |Δ logprob| {max:e}");
    assert!(max <= 1e-5, "GGUF and HF logprobs differ by {max}");
    Ok(())
}

#[test]
fn not_a_gguf_and_truncated_files_are_typed_errors() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let p = write(dir.path(), "notes.txt", b"this is not a model file at all")?;
    assert!(matches!(load(&p), Err(EngineError::NotGguf(_))));
    let p = write(dir.path(), "tiny", b"GG")?;
    assert!(matches!(load(&p), Err(EngineError::NotGguf(_))));
    let missing = dir.path().join("nope.gguf");
    assert!(matches!(load(&missing), Err(EngineError::Io { .. })));
    let empty_dir = tempfile::tempdir()?;
    assert!(matches!(
        load(empty_dir.path()),
        Err(EngineError::Io { .. } | EngineError::InvalidHf(_))
    ));

    let model = std::fs::read(common::model_path()?)?;
    let l = layout(&model)?;
    let header_end = l.tensors.last().map_or(24, |t| t.2 + 8);
    let mut cuts = vec![
        4,
        8,
        12,
        20,
        24,
        30,
        1000,
        100_000,
        header_end - 3,
        header_end + 1,
        model.len() / 2,
        model.len() - 1,
    ];
    cuts.sort_unstable();
    for cut in cuts {
        let p = write(dir.path(), "cut.gguf", &model[..cut])?;
        match GgufFile::open(&p) {
            Err(EngineError::Truncated(_) | EngineError::NotGguf(_)) => {}
            other => panic!("truncated at {cut}: {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn corrupt_headers_are_typed_errors() -> anyhow::Result<()> {
    let model = std::fs::read(common::model_path()?)?;
    let l = layout(&model)?;
    let header_end = l.tensors.last().map_or(24, |t| t.2 + 8);
    let dir = tempfile::tempdir()?;
    // only the header matters for these: keep the file small but whole where needed
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut b = model[..header_end + 64].to_vec();
    b[4..8].copy_from_slice(&7u32.to_le_bytes());
    cases.push(("version 7", b));
    let mut b = model[..header_end + 64].to_vec();
    b[l.n_kv_at..l.n_kv_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push(("huge metadata count", b));
    let mut b = model[..header_end + 64].to_vec();
    b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    cases.push(("huge tensor count", b));
    let mut b = model.clone();
    let (_, _, off_at) = &l.tensors[3];
    b[*off_at..off_at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    cases.push(("tensor offset past the end", b));
    let mut b = model.clone();
    b[*off_at..off_at + 8].copy_from_slice(&33u64.to_le_bytes());
    cases.push(("misaligned tensor offset", b));
    let mut b = model.clone();
    let (_, ty_at, _) = &l.tensors[5];
    b[*ty_at..ty_at + 4].copy_from_slice(&99u32.to_le_bytes());
    cases.push(("unknown tensor type", b));
    // a string length that runs past the end: the first key's length
    let mut b = model[..header_end + 64].to_vec();
    b[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    cases.push(("huge string length", b));
    for (what, bytes) in cases {
        let p = write(dir.path(), "corrupt.gguf", &bytes)?;
        match load(&p) {
            Err(
                EngineError::Corrupt { .. }
                | EngineError::Truncated(_)
                | EngineError::UnsupportedVersion(_)
                | EngineError::UnsupportedTensorType { .. },
            ) => {}
            other => panic!("{what}: {:?}", other.map(|_| "loaded")),
        }
    }
    Ok(())
}

#[test]
fn unsupported_architecture_and_tensor_type_are_named() -> anyhow::Result<()> {
    let model = std::fs::read(common::model_path()?)?;
    let l = layout(&model)?;
    let dir = tempfile::tempdir()?;
    let mut b = model.clone();
    b[l.arch_at..l.arch_at + 5].copy_from_slice(b"gpt-j");
    let p = write(dir.path(), "arch.gguf", &b)?;
    match load(&p) {
        Err(EngineError::UnsupportedArchitecture(a)) => assert_eq!(a, "gpt-j"),
        other => panic!("arch: {:?}", other.map(|_| "loaded")),
    }
    // blk.0.ffn_down.weight has rows of 1536 = 6 x 256: re-label it Q2_K (a known type the
    // engine does not dequantize); its data then is smaller, so offsets stay valid
    let mut b = model;
    let (_, ty_at, _) = l
        .tensors
        .iter()
        .find(|t| t.0 == "blk.0.ffn_down.weight")
        .ok_or_else(|| anyhow::anyhow!("no ffn_down"))?;
    b[*ty_at..ty_at + 4].copy_from_slice(&10u32.to_le_bytes());
    let p = write(dir.path(), "q2k.gguf", &b)?;
    match load(&p) {
        Err(EngineError::UnsupportedTensorType { tensor, type_name }) => {
            assert_eq!(tensor, "blk.0.ffn_down.weight");
            assert_eq!(type_name, "Q2_K");
        }
        other => panic!("q2_k: {:?}", other.map(|_| "loaded")),
    }
    Ok(())
}

#[test]
fn bad_requests_are_typed_errors() -> anyhow::Result<()> {
    let e = load(&common::model_path()?)?;
    let vocab = e.config().vocab_size as u32;
    assert!(
        matches!(e.score(&[vec![1, vocab]], 0), Err(EngineError::TokenOutOfVocab { token, .. }) if token == vocab)
    );
    let n_ctx = e.config().n_ctx;
    assert!(matches!(
        e.score(&[vec![1; n_ctx + 1]], 0),
        Err(EngineError::SequenceTooLong { .. })
    ));
    assert!(matches!(
        e.score(&[vec![]], 0),
        Err(EngineError::EmptyInput(_))
    ));
    assert!(matches!(e.score(&[], 0), Err(EngineError::EmptyInput(_))));
    assert!(matches!(
        e.score(&[vec![1, 2]], 21),
        Err(EngineError::InvalidRequest(_))
    ));
    let params = samewise_engine::GenerateParams {
        max_tokens: 4,
        ..Default::default()
    };
    assert!(matches!(
        e.generate(&[u32::MAX], &params, &mut |_| true),
        Err(EngineError::TokenOutOfVocab { .. })
    ));
    assert!(matches!(
        e.generate(&vec![1; n_ctx], &params, &mut |_| true),
        Err(EngineError::SequenceTooLong { .. })
    ));
    let zero = samewise_engine::GenerateParams {
        max_tokens: 0,
        ..Default::default()
    };
    assert!(matches!(
        e.generate(&[1], &zero, &mut |_| true),
        Err(EngineError::InvalidRequest(_))
    ));
    // the engine still works after rejecting all that
    let ok = e.score(&[vec![1, 2, 3]], 2)?;
    assert_eq!(ok[0].positions.len(), 3);
    Ok(())
}

#[test]
fn config_comes_from_the_gguf() -> anyhow::Result<()> {
    let e = load(&common::model_path()?)?;
    let c = e.config();
    assert_eq!(c.arch, samewise_engine::Arch::Llama);
    assert_eq!(
        (
            c.n_layer,
            c.n_embd,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.n_ff
        ),
        (30, 576, 9, 3, 64, 1536)
    );
    assert_eq!((c.vocab_size, c.n_ctx), (49152, 8192));
    assert_eq!(c.rope_theta, 100_000.0);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.as_slice()),
        (Some(1), &[2][..])
    );
    Ok(())
}
