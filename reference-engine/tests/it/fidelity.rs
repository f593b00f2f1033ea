//! Fidelity: the engine's logprobs on the test model against golden logprobs computed by
//! Hugging Face transformers in f32 from the same GGUF (`tests/fixtures/golden_smollm2.json`).
//! Max |Δ logprob| of the actual token ≤ 1e-3, mean ≤ 1e-4, the same top-1 token at every
//! position, over at least 1,500 positions.

use crate::common;

use samewise_engine::{Engine, LoadOptions};

struct Text {
    name: String,
    ids: Vec<u32>,
    logprobs: Vec<Option<f64>>,
    top1: Vec<Option<u32>>,
}

fn golden() -> anyhow::Result<Vec<Text>> {
    let g = common::fixture_json("golden_smollm2.json")?;
    let texts = g["texts"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("golden has no texts"))?;
    let mut out = Vec::new();
    for t in texts {
        let ids = t["token_ids"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no token_ids"))?
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|x| x as u32)
                    .ok_or_else(|| anyhow::anyhow!("bad id"))
            })
            .collect::<anyhow::Result<Vec<u32>>>()?;
        let logprobs = t["logprobs"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no logprobs"))?
            .iter()
            .map(|v| v.as_f64())
            .collect();
        let top1 = t["top"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no top"))?
            .iter()
            .map(|v| {
                v.get(0)
                    .and_then(|e| e.get(0))
                    .and_then(|x| x.as_u64())
                    .map(|x| x as u32)
            })
            .collect();
        out.push(Text {
            name: t["name"].as_str().unwrap_or("?").to_string(),
            ids,
            logprobs,
            top1,
        });
    }
    Ok(out)
}

#[test]
fn logprobs_match_transformers_f32() -> anyhow::Result<()> {
    let texts = golden()?;
    let engine = Engine::load(&common::model_path()?, LoadOptions::default())?;
    let seqs: Vec<Vec<u32>> = texts.iter().map(|t| t.ids.clone()).collect();
    let scored = engine.score(&seqs, 1)?;
    let (mut n, mut sum, mut max) = (0usize, 0f64, 0f64);
    let mut top1_mismatch = Vec::new();
    for (t, s) in texts.iter().zip(&scored) {
        anyhow::ensure!(
            s.positions.len() == t.ids.len(),
            "{}: {} positions for {} tokens",
            t.name,
            s.positions.len(),
            t.ids.len()
        );
        anyhow::ensure!(
            s.positions[0].logprob.is_none() && t.logprobs[0].is_none(),
            "position 0 has no logprob"
        );
        for i in 1..t.ids.len() {
            let want = t.logprobs[i]
                .ok_or_else(|| anyhow::anyhow!("{}: golden position {i} is null", t.name))?;
            let got = f64::from(
                s.positions[i]
                    .logprob
                    .ok_or_else(|| anyhow::anyhow!("engine position {i} is null"))?,
            );
            let d = (got - want).abs();
            sum += d;
            max = max.max(d);
            n += 1;
            let top = s.positions[i].top.first().map(|x| x.token);
            if top != t.top1[i] {
                top1_mismatch.push(format!(
                    "{} pos {i}: engine {top:?}, golden {:?}",
                    t.name, t.top1[i]
                ));
            }
        }
    }
    let mean = sum / n as f64;
    eprintln!("fidelity: {n} positions, max |Δ| {max:.3e}, mean |Δ| {mean:.3e}");
    assert!(n >= 1500, "only {n} positions");
    assert!(max <= 1e-3, "max |Δ logprob| {max:.3e} > 1e-3");
    assert!(mean <= 1e-4, "mean |Δ logprob| {mean:.3e} > 1e-4");
    assert!(top1_mismatch.is_empty(), "top-1 differs: {top1_mismatch:?}");
    Ok(())
}

/// The other architectures' code paths, on tiny random-weight HF models committed under
/// `tests/fixtures/tiny/` with their transformers-f32 golden logprobs (`make_tiny.py`):
/// llama with Llama-3 RoPE scaling (F16), qwen2 with q/k/v bias, tied head and a sharded
/// index (BF16), qwen3 with per-head q/k RMSNorm and head_dim != hidden/heads (F32).
#[test]
fn tiny_models_of_every_architecture_match_transformers() -> anyhow::Result<()> {
    let dir = common::fixtures_dir().join("tiny");
    let g = common::fixture_json("tiny/golden.json")?;
    let tokens: Vec<u32> = g["tokens"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no tokens"))?
        .iter()
        .filter_map(|v| v.as_u64().map(|x| x as u32))
        .collect();
    let models = g["models"]
        .as_object()
        .ok_or_else(|| anyhow::anyhow!("no models"))?;
    anyhow::ensure!(models.len() == 3, "expected 3 tiny models");
    let mut worst = Vec::new();
    for (name, m) in models {
        let engine = Engine::load(&dir.join(name), LoadOptions::default())?;
        let scored = engine.score(std::slice::from_ref(&tokens), 1)?.remove(0);
        let want = m["logprobs"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no logprobs"))?;
        let top1 = m["top1"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no top1"))?;
        let mut max = 0f64;
        for i in 1..tokens.len() {
            let w = want[i]
                .as_f64()
                .ok_or_else(|| anyhow::anyhow!("{name}: null golden at {i}"))?;
            let got = f64::from(
                scored.positions[i]
                    .logprob
                    .ok_or_else(|| anyhow::anyhow!("null logprob"))?,
            );
            max = max.max((got - w).abs());
            assert_eq!(
                scored.positions[i].top[0].token as u64,
                top1[i].as_u64().unwrap_or(u64::MAX),
                "{name}: top-1 at position {i}"
            );
        }
        eprintln!("tiny {name}: max |Δ logprob| {max:.3e}");
        worst.push((name.clone(), max));
    }
    for (name, max) in worst {
        assert!(max <= 5e-5, "{name}: max |Δ logprob| {max:.3e}");
    }
    Ok(())
}
