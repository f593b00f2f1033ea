//! Synthetic models and the GGUF writer: a written file reads back with every metadata type
//! and its tensor bytes; a synthetic model is the same bytes at any thread count, loads in the
//! engine with peaked (not flat) logits, and serves text through its synthetic tokenizer; the
//! weight types agree with each other as their precision says; a real model cut to its first
//! layers keeps its tensors byte for byte; and every bad option is a clear error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use samewise_engine::server::{self, ServerState};
use samewise_engine::{
    Engine, GgmlType, GgufFile, GgufValue, GgufWriter, LoadOptions, SynthOptions, SynthShape,
    TensorSpec, cut_layers, synthesize,
};
use serde_json::json;

use crate::common;

fn load(path: &Path) -> anyhow::Result<Engine> {
    Ok(Engine::load(
        path,
        LoadOptions {
            threads: 2,
            ..LoadOptions::default()
        },
    )?)
}

fn smol(seed: u64, layers: Option<usize>, ty: GgmlType, threads: usize) -> SynthOptions {
    SynthOptions {
        seed,
        layers,
        ggml_type: ty,
        threads,
        ..SynthOptions::new(SynthShape::Smol)
    }
}

/// Seeded token ids spread over the vocabulary (no special tokens).
fn ids(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % u64::from(vocab - 8)) as u32
        })
        .collect()
}

#[test]
fn synth_writer_round_trips_every_metadata_type_and_streamed_tensors() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("w.gguf");
    let s = |v: &str| GgufValue::String(v.into());
    let meta: Vec<(String, GgufValue)> = vec![
        ("u8".into(), GgufValue::U8(200)),
        ("i8".into(), GgufValue::I8(-100)),
        ("u16".into(), GgufValue::U16(60000)),
        ("i16".into(), GgufValue::I16(-30000)),
        ("u32".into(), GgufValue::U32(4_000_000_000)),
        ("i32".into(), GgufValue::I32(-2_000_000_000)),
        ("f32".into(), GgufValue::F32(-1.5e-7)),
        ("bool".into(), GgufValue::Bool(true)),
        ("string".into(), s("naïve 東京 \u{0}")),
        ("u64".into(), GgufValue::U64(u64::MAX)),
        ("i64".into(), GgufValue::I64(i64::MIN)),
        ("f64".into(), GgufValue::F64(std::f64::consts::PI)),
        (
            "strings".into(),
            GgufValue::Array(vec![s("a b"), s(""), s("Ġx")]),
        ),
        (
            "nested".into(),
            GgufValue::Array(vec![
                GgufValue::Array(vec![GgufValue::I32(1), GgufValue::I32(-2)]),
                GgufValue::Array(vec![GgufValue::I32(3)]),
            ]),
        ),
        ("empty".into(), GgufValue::Array(vec![])),
    ];
    let tensors = vec![
        TensorSpec::new("norm", &[5], GgmlType::F32),
        TensorSpec::new("q", &[64, 3], GgmlType::Q4_1),
        TensorSpec::new("h", &[7, 2, 3], GgmlType::F16),
        TensorSpec::new("e", &[32, 1, 1, 2], GgmlType::Q8_0),
    ];
    // each tensor's bytes: a pattern of its index, streamed in pieces of 7 bytes
    let data = |i: usize, n: usize| -> Vec<u8> { (0..n).map(|j| (i * 31 + j * 7) as u8).collect() };
    let mut w = GgufWriter::create(&path, &meta, tensors.clone())?;
    for (i, t) in tensors.iter().enumerate() {
        assert_eq!(w.next_tensor(), Some(t));
        for piece in data(i, t.data_size()?).chunks(7) {
            w.write_data(piece)?;
        }
    }
    assert_eq!(w.next_tensor(), None);
    w.finish()?;

    let g = GgufFile::open(&path)?;
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    let want: BTreeMap<String, GgufValue> = meta.into_iter().collect();
    assert_eq!(g.metadata, want);
    assert_eq!(g.tensors.len(), tensors.len());
    for (i, (got, t)) in g.tensors.iter().zip(&tensors).enumerate() {
        assert_eq!(
            (&got.name, &got.dims, got.ggml_type),
            (&t.name, &t.dims, t.ggml_type)
        );
        assert_eq!(got.offset % 32, 0, "{} is aligned", t.name);
        assert_eq!(g.tensor_bytes(got), data(i, t.data_size()?), "{}", t.name);
    }
    Ok(())
}

#[test]
fn synth_bytes_do_not_depend_on_the_thread_count() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut files = Vec::new();
    for (name, seed, threads) in [("a", 7, 1), ("b", 7, 3), ("c", 8, 2)] {
        let path = dir.path().join(format!("{name}.gguf"));
        let opts = smol(seed, Some(2), GgmlType::Q4_1, threads);
        let report = synthesize(&opts, &path)?;
        assert_eq!(report.bytes, std::fs::metadata(&path)?.len());
        assert_eq!(
            report.bytes,
            opts.file_size()?,
            "file_size predicts the file"
        );
        assert_eq!((report.n_layer, report.tensors), (2, 1 + 2 * 9 + 1));
        files.push(std::fs::read(&path)?);
    }
    assert!(
        files[0] == files[1],
        "1 and 3 threads wrote different bytes"
    );
    assert!(files[0] != files[2], "another seed wrote the same bytes");
    assert!(
        !dir.path()
            .read_dir()?
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "partial")),
        "no .partial file is left"
    );

    let path = dir.path().join("a.gguf");
    let g = GgufFile::open(&path)?;
    assert_eq!(g.get_usize("llama.block_count"), Some(2));
    assert_eq!(g.get_usize("llama.context_length"), Some(8192));
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    let e = load(&path)?;
    let c = e.config();
    assert_eq!(
        (
            c.n_layer,
            c.n_embd,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.n_ff,
            c.vocab_size
        ),
        (2, 576, 9, 3, 64, 1536, 49152)
    );
    Ok(())
}

#[test]
fn synth_smol_logits_are_peaked_not_flat() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("smol.gguf");
    synthesize(&smol(1, None, GgmlType::Q4_1, 0), &path)?;
    let e = load(&path)?;
    let vocab = e.config().vocab_size;
    let seq = ids(48, vocab as u32, 3);

    // entropy of the full next-token distribution at every position
    let mut entropies = Vec::new();
    let mut logprob_rows = Vec::new();
    e.score_logits(&seq, &mut |_, row| {
        let max = row.iter().fold(f32::MIN, |m, &x| m.max(x));
        let z: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
        let lp: Vec<f64> = row.iter().map(|&x| f64::from(x - max) - z.ln()).collect();
        entropies.push(-lp.iter().map(|&l| l.exp() * l).sum::<f64>());
        logprob_rows.push(lp);
    })?;
    let flat = (vocab as f64).ln();
    let mean = entropies.iter().sum::<f64>() / entropies.len() as f64;
    assert!(entropies.iter().all(|h| h.is_finite()), "{entropies:?}");
    assert!(
        mean < 0.5 * flat && mean > 0.5,
        "mean entropy {mean:.2} nats (flat: {flat:.2})"
    );

    // the scored logprobs, by token id, are finite and the same distribution
    let scored = e.score(std::slice::from_ref(&seq), 5)?;
    let mut top1 = 0.0;
    for (p, pos) in scored[0].positions.iter().enumerate().skip(1) {
        let lp = pos
            .logprob
            .ok_or_else(|| anyhow::anyhow!("no logprob at {p}"))?;
        assert!(lp.is_finite() && lp <= 0.0, "position {p}: {lp}");
        assert!((f64::from(lp) - logprob_rows[p - 1][seq[p] as usize]).abs() < 1e-3);
        assert_eq!(pos.top.len(), 5);
        top1 += f64::from(pos.top[0].logprob).exp();
    }
    let top1 = top1 / (seq.len() - 1) as f64;
    assert!(top1 > 100.0 / vocab as f64, "mean top-1 probability {top1}");
    println!(
        "synthetic smol: mean entropy {mean:.2} nats (flat {flat:.2}), mean top-1 p {top1:.3}"
    );
    Ok(())
}

#[test]
fn synth_weight_types_agree_as_their_precision_says() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let seq = ids(24, 49152, 5);
    let mut rows: Vec<(GgmlType, Vec<f32>)> = Vec::new();
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
    ] {
        let path = dir.path().join(format!("{}.gguf", ty.name()));
        synthesize(&smol(2, Some(1), ty, 0), &path)?;
        let g = GgufFile::open(&path)?;
        let info = g
            .tensor("blk.0.attn_q.weight")
            .ok_or_else(|| anyhow::anyhow!("no attn_q"))?;
        assert_eq!(
            (info.ggml_type, info.dims.as_slice()),
            (ty, &[576, 576][..])
        );
        assert_eq!(
            g.tensor("blk.0.attn_norm.weight").map(|t| t.ggml_type),
            Some(GgmlType::F32)
        );
        let mut out = Vec::new();
        load(&path)?.score_logits_into(&seq, &mut out)?;
        assert!(out.iter().all(|x| x.is_finite()), "{ty:?}");
        rows.push((ty, out));
    }
    // the same seeded values, stored at each precision: the logits move away from the f32
    // model's in the order of the types' precision
    let f32_rows = rows[0].1.clone();
    let dev = |v: &[f32]| -> f64 {
        v.iter()
            .zip(&f32_rows)
            .map(|(a, b)| f64::from((a - b).abs()))
            .sum::<f64>()
            / v.len() as f64
    };
    let d: BTreeMap<&str, f64> = rows.iter().map(|(t, v)| (t.name(), dev(v))).collect();
    let spread = f32_rows.iter().map(|x| f64::from(x.abs())).sum::<f64>() / f32_rows.len() as f64;
    println!("mean |logit - f32 logit| by type: {d:?}, mean |logit| {spread:.2}");
    assert!(d["F16"] < d["BF16"] && d["F16"] < d["Q8_0"], "{d:?}");
    assert!(d["Q8_0"] < d["Q4_1"] && d["Q8_0"] < d["Q4_0"], "{d:?}");
    assert!(
        d["F16"] < 0.01 * spread && d["Q4_1"] < 0.5 * spread,
        "{d:?} vs {spread}"
    );
    Ok(())
}

/// A server over `path` on 127.0.0.1:0; the sender stops it.
async fn serve(
    path: &Path,
) -> anyhow::Result<(String, ServerState, tokio::sync::oneshot::Sender<()>)> {
    let opts = LoadOptions {
        threads: 2,
        ..LoadOptions::default()
    };
    let state = ServerState::load(path, opts, Some("synth".into()))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(listener, state.clone(), async move {
        let _ = rx.await;
    }));
    Ok((base, state, tx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synth_model_serves_text_through_its_synthetic_tokenizer() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("serve.gguf");
    let p = path.clone();
    tokio::task::spawn_blocking(move || synthesize(&smol(4, Some(2), GgmlType::Q4_1, 0), &p))
        .await??;
    let (base, state, stop) = serve(&path).await?;

    let t = state.tokenizer();
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.bos_token(), Some("<|begin_of_text|>"));
    assert_eq!(t.eos_token(), Some("<|end_of_text|>"));
    let eot = t
        .token_to_id("<|eot_id|>")
        .ok_or_else(|| anyhow::anyhow!("no <|eot_id|>"))?;
    assert!(t.is_special(eot) && t.stop_ids().contains(&eot));
    for text in [
        "Hello, world! The quick brown fox jumps over the lazy dog.",
        "tabs\tand\nnewlines\r\n  digits 12345 unicode: naïve 東京 🚀",
        "",
    ] {
        let ids = t.encode(text, false)?;
        assert_eq!(t.decode(&ids, false)?, text);
        // word pieces merge: fewer tokens than bytes for English
        if text.starts_with("Hello") {
            assert!(
                ids.len() * 2 < text.len(),
                "{} tokens for {} bytes",
                ids.len(),
                text.len()
            );
        }
    }
    let ids = t.encode("<|start_header_id|>user<|end_header_id|>", false)?;
    assert_eq!(ids.first().copied(), t.token_to_id("<|start_header_id|>"));
    assert_eq!(t.encode("hi", true)?.first().copied(), t.bos_id());
    let template = state
        .template()
        .ok_or_else(|| anyhow::anyhow!("no chat template"))?;
    let prompt = template.render(
        &[json!({"role": "user", "content": "Hi"})],
        None,
        true,
        None,
    )?;
    assert_eq!(
        prompt,
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );

    let body = json!({"model": "synth", "prompt": "The quick brown fox", "echo": true, "logprobs": 3, "max_tokens": 2});
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 200);
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await?)?;
    let choice = &v["choices"][0];
    assert!(
        choice["text"]
            .as_str()
            .is_some_and(|s| s.starts_with("The quick brown fox")),
        "{v}"
    );
    let lps = choice["logprobs"]["token_logprobs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(lps.len() >= 3, "{v}");
    assert!(
        lps.iter()
            .skip(1)
            .all(|x| x.as_f64().is_some_and(f64::is_finite)),
        "{v}"
    );
    let _ = stop.send(());
    Ok(())
}

#[test]
fn synth_cut_keeps_the_first_layers_byte_for_byte() -> anyhow::Result<()> {
    let model = common::model_path()?;
    let dir = tempfile::tempdir()?;
    let src = GgufFile::open(&model)?;
    let n = src.get_usize("llama.block_count").unwrap_or(0);
    let path = dir.path().join("cut2.gguf");
    let report = cut_layers(&model, 2, &path)?;
    assert_eq!(report.n_layer, 2);
    let cut = GgufFile::open(&path)?;
    let mut want = src.metadata.clone();
    want.insert("llama.block_count".into(), GgufValue::U32(2));
    assert_eq!(cut.metadata, want);
    let kept: Vec<_> = src
        .tensors
        .iter()
        .filter(|t| !(2..n).any(|i| t.name.starts_with(&format!("blk.{i}."))))
        .collect();
    assert!(kept.len() < src.tensors.len() && kept.iter().any(|t| t.name.starts_with("blk.1.")));
    assert_eq!(cut.tensors.len(), kept.len());
    for (a, b) in kept.iter().zip(&cut.tensors) {
        assert_eq!(
            (&a.name, &a.dims, a.ggml_type),
            (&b.name, &b.dims, b.ggml_type)
        );
        assert!(
            src.tensor_bytes(a) == cut.tensor_bytes(b),
            "{} differs",
            a.name
        );
    }
    let e = load(&path)?;
    assert_eq!(e.config().n_layer, 2);
    let scored = e.score(&[ids(16, 49152, 9)], 1)?;
    assert!(
        scored[0].positions[1..]
            .iter()
            .all(|p| p.logprob.is_some_and(f32::is_finite))
    );

    // the 4-layer cut travels to a GPU machine beside a binary: it must stay small
    let four = cut_layers(&model, 4, &dir.path().join("cut4.gguf"))?;
    println!("4-layer cut of {}: {} bytes", model.display(), four.bytes);
    assert!(four.bytes < 64 << 20, "{} bytes", four.bytes);
    Ok(())
}

#[test]
fn synth_bad_options_are_clear_errors() -> anyhow::Result<()> {
    let model = common::model_path()?;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("x.gguf");
    let msg = |r: samewise_engine::Result<samewise_engine::SynthReport>| -> String {
        r.err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "no error".into())
    };
    let err =
        |s: samewise_engine::Result<SynthShape>| s.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(SynthShape::parse("70b")).contains("unknown shape \"70b\" (known: smol, 1b, 8b)"));
    let e = samewise_engine::parse_weight_type("q5_k")
        .err()
        .map(|e| e.to_string());
    assert!(
        e.unwrap_or_default()
            .contains("unknown weight type \"q5_k\"")
    );
    let cases: Vec<(SynthOptions, &str)> = vec![
        (
            SynthOptions {
                arch: "qwen2".into(),
                ..smol(0, None, GgmlType::Q4_1, 1)
            },
            "only llama",
        ),
        (
            smol(0, Some(0), GgmlType::Q4_1, 1),
            "--layers 0: the smol shape has 1 to 30 layers",
        ),
        (smol(0, Some(31), GgmlType::Q4_1, 1), "--layers 31"),
        (
            smol(0, Some(1), GgmlType::Q6K, 1),
            "cannot write weights of type Q6_K",
        ),
    ];
    for (opts, want) in cases {
        let m = msg(synthesize(&opts, &out));
        assert!(m.contains(want), "{want}: {m}");
    }
    let m = msg(cut_layers(&model, 0, &out));
    assert!(
        m.contains("--layers 0") && m.contains("has 30 layers"),
        "{m}"
    );
    assert!(msg(cut_layers(&model, 31, &out)).contains("--layers 31"));
    assert!(msg(cut_layers(&model, 1, &model)).contains("is the model being cut"));
    assert!(msg(cut_layers(&dir.path().join("none.gguf"), 1, &out)).contains("cannot read"));

    let nowhere: PathBuf = dir.path().join("missing-dir/x.gguf");
    let m = msg(synthesize(&smol(0, Some(1), GgmlType::Q4_1, 1), &nowhere));
    assert!(
        m.contains("cannot write") && m.contains("missing-dir/x.gguf"),
        "{m}"
    );
    let m = msg(cut_layers(&model, 1, &nowhere));
    assert!(m.contains("cannot write"), "{m}");
    // a failed write is its own error, not a bad request
    assert!(matches!(
        cut_layers(&model, 1, &nowhere),
        Err(samewise_engine::EngineError::Write { .. })
    ));
    assert!(!out.exists() && !dir.path().join("missing-dir").exists());
    Ok(())
}
