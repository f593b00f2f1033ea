//! The serving profiles' numeric knobs on the real test model: the reference profile (and
//! any profile with only behavioural faults) is the plain engine bit for bit; 8-bit
//! activations and the f16 / 8-bit KV caches drift a little, never zero; re-quantized
//! weights drift; every knob keeps the engine batch-invariant (a sequence scored alone and
//! inside a mixed batch, and decoded token by token against scored whole, agree bit for bit);
//! the streamed full-logit rows give exactly the scored logprobs.
//!
//! Monotone drift as bits fall (8 < 6 < 5 < 4 < 3 < 2 on every statistic) is tested where the
//! statistics live: `probes/tests/calibrate.rs`.

use crate::common;

use samewise_engine::Profile;
use samewise_engine::sample;
use samewise_engine::{
    Engine, GenerateParams, LoadOptions, SamplingParams, ScoredSequence, TokenLogprob,
};

fn engine(profile: &str) -> anyhow::Result<Engine> {
    let profile = Profile::resolve(profile)?;
    Ok(Engine::load(
        &common::model_path()?,
        LoadOptions {
            threads: 2,
            profile,
            ..LoadOptions::default()
        },
    )?)
}

/// Token ids of the golden texts (chat, code, numbers, non-English, long), each cut to `max`.
fn texts(max: usize) -> anyhow::Result<Vec<Vec<u32>>> {
    let g = common::fixture_json("golden_smollm2.json")?;
    let texts = g["texts"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("golden has no texts"))?;
    texts
        .iter()
        .map(|t| {
            let ids: Vec<u32> = t["token_ids"]
                .as_array()
                .ok_or_else(|| anyhow::anyhow!("no token_ids"))?
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|x| x as u32)
                        .ok_or_else(|| anyhow::anyhow!("bad id"))
                })
                .collect::<anyhow::Result<_>>()?;
            Ok(ids[..ids.len().min(max)].to_vec())
        })
        .collect()
}

fn bits(t: &[TokenLogprob]) -> Vec<(u32, u32)> {
    t.iter().map(|x| (x.token, x.logprob.to_bits())).collect()
}

fn assert_same(a: &ScoredSequence, b: &ScoredSequence, what: &str) {
    assert_eq!(a.positions.len(), b.positions.len(), "{what}: lengths");
    for (i, (x, y)) in a.positions.iter().zip(&b.positions).enumerate() {
        assert_eq!(x.token, y.token, "{what}: token at {i}");
        assert_eq!(
            x.logprob.map(f32::to_bits),
            y.logprob.map(f32::to_bits),
            "{what}: logprob bits at {i}"
        );
        assert_eq!(bits(&x.top), bits(&y.top), "{what}: top-k bits at {i}");
    }
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::default(),
        max_tokens,
        top_logprobs: 5,
        ..GenerateParams::default()
    }
}

/// Per position (from 1): |Δ logprob| of the actual token and whether the top-1 agrees.
fn drift(a: &[ScoredSequence], b: &[ScoredSequence]) -> (f64, f64, f64) {
    let (mut sum, mut max, mut same, mut n) = (0f64, 0f64, 0usize, 0usize);
    for (x, y) in a.iter().zip(b) {
        for (p, q) in x.positions.iter().zip(&y.positions).skip(1) {
            let d = f64::from((p.logprob.unwrap_or(0.0) - q.logprob.unwrap_or(0.0)).abs());
            sum += d;
            max = max.max(d);
            same += usize::from(p.top[0].token == q.top[0].token);
            n += 1;
        }
    }
    (sum / n as f64, max, same as f64 / n as f64)
}

#[test]
fn reference_and_behaviour_only_profiles_are_the_plain_engine_bit_for_bit() -> anyhow::Result<()> {
    let plain = Engine::load(
        &common::model_path()?,
        LoadOptions {
            threads: 2,
            ..LoadOptions::default()
        },
    )?;
    assert_eq!(plain.profile().name, "reference");
    let seqs = texts(120)?;
    let base = plain.score(&seqs, 5)?;
    let prompt = &seqs[0][..40];
    let base_gen = plain.generate(prompt, &greedy(24), &mut |_| true)?;
    for name in [
        "reference",
        "flaky",
        "truncate-512",
        "shifted-echo",
        "noisy-echo",
    ] {
        let e = engine(name)?;
        assert_eq!(e.profile().name, name);
        for (a, b) in base.iter().zip(&e.score(&seqs, 5)?) {
            assert_same(a, b, name);
        }
        let g = e.generate(prompt, &greedy(24), &mut |_| true)?;
        assert_eq!(g.tokens.len(), base_gen.tokens.len(), "{name}");
        for (x, y) in g.tokens.iter().zip(&base_gen.tokens) {
            assert_eq!(
                (x.token, x.logprob.to_bits(), bits(&x.top)),
                (y.token, y.logprob.to_bits(), bits(&y.top)),
                "{name}"
            );
        }
        assert_eq!(g.finish, base_gen.finish, "{name}");
    }
    Ok(())
}

#[test]
fn activation_and_kv_cache_knobs_drift_a_little_but_not_zero() -> anyhow::Result<()> {
    let seqs = texts(160)?;
    let base = engine("reference")?.score(&seqs, 5)?;
    for name in ["a8", "kv-f16", "kv-q8", "w8"] {
        let out = engine(name)?.score(&seqs, 5)?;
        let (mean, max, same) = drift(&base, &out);
        eprintln!("{name}: mean |Δ logprob| {mean:.5}, max {max:.4}, same top-1 {same:.4}");
        assert!(max > 0.0, "{name}: no drift at all");
        assert!(mean < 0.15, "{name}: mean |Δ logprob| {mean} is not small");
        assert!(same > 0.9, "{name}: same top-1 only {same}");
    }
    // 2-bit weights are a different model: large drift
    let w2 = engine("w2")?.score(&seqs, 5)?;
    let (mean, _, same) = drift(&base, &w2);
    eprintln!("w2: mean |Δ logprob| {mean:.5}, same top-1 {same:.4}");
    assert!(
        mean > 0.3 && same < 0.9,
        "w2: mean |Δ| {mean}, same top-1 {same}"
    );
    Ok(())
}

#[test]
fn every_numeric_knob_keeps_batch_invariance_and_decode_equals_scoring() -> anyhow::Result<()> {
    let seqs = texts(90)?;
    let mixed: Vec<Vec<u32>> = (0..8)
        .map(|i| {
            let src = &seqs[i % seqs.len()];
            let len = 3 + (i * 29) % (src.len() - 3);
            src[..len].to_vec()
        })
        .collect();
    for name in ["w4", "a8", "kv-f16", "kv-q8"] {
        let e = engine(name)?;
        let alone: Vec<ScoredSequence> = mixed
            .iter()
            .map(|s| e.score(std::slice::from_ref(s), 5).map(|mut v| v.remove(0)))
            .collect::<Result<_, _>>()?;
        let batched = e.score(&mixed, 5)?;
        let reversed: Vec<Vec<u32>> = mixed.iter().rev().cloned().collect();
        let rev = e.score(&reversed, 5)?;
        for i in 0..mixed.len() {
            assert_same(
                &alone[i],
                &batched[i],
                &format!("{name}: sequence {i} in a batch"),
            );
            assert_same(
                &alone[i],
                &rev[mixed.len() - 1 - i],
                &format!("{name}: sequence {i} in a reversed batch"),
            );
        }
        // decode (KV cache written one token at a time) equals scoring the whole sequence
        let prompt = &seqs[1][..30];
        let g = e.generate(prompt, &greedy(16), &mut |_| true)?;
        let mut full = prompt.to_vec();
        full.extend(g.tokens.iter().map(|t| t.token));
        let scored = e.score(&[full], 5)?.remove(0);
        for (j, t) in g.tokens.iter().enumerate() {
            let p = &scored.positions[prompt.len() + j];
            assert_eq!(
                p.logprob.map(f32::to_bits),
                Some(t.logprob.to_bits()),
                "{name}: decode step {j}"
            );
            assert_eq!(bits(&p.top), bits(&t.top), "{name}: decode step {j} top-k");
        }
    }
    Ok(())
}

#[test]
fn streamed_logit_rows_give_exactly_the_scored_logprobs() -> anyhow::Result<()> {
    let seqs = texts(300)?;
    for name in ["reference", "a8"] {
        let e = engine(name)?;
        let seq = seqs
            .iter()
            .max_by_key(|s| s.len())
            .cloned()
            .unwrap_or_default();
        let scored = e.score(std::slice::from_ref(&seq), 3)?.remove(0);
        let mut seen = 0;
        let mut mismatches = Vec::new();
        // every row at once (the head over whole forward chunks) is the streamed rows' bits
        let mut all = vec![1f32; 3];
        e.score_logits_into(&seq, &mut all)?;
        let vocab = e.config().vocab_size;
        assert_eq!(all.len(), (seq.len() - 1) * vocab, "{name}");
        e.score_logits(&seq, &mut |p, row| {
            assert_eq!(p, seen, "rows come in order");
            seen += 1;
            if row
                .iter()
                .map(|x| x.to_bits())
                .ne(all[p * vocab..(p + 1) * vocab].iter().map(|x| x.to_bits()))
            {
                mismatches.push(p);
            }
            let lse = sample::log_sum_exp(row);
            let want = &scored.positions[p + 1];
            if Some(sample::logprob(row, lse, seq[p + 1]).to_bits())
                != want.logprob.map(f32::to_bits)
                || bits(&sample::top_k(row, lse, 3)) != bits(&want.top)
            {
                mismatches.push(p);
            }
        })?;
        assert_eq!(
            seen,
            seq.len() - 1,
            "{name}: one row per predicted position"
        );
        assert!(
            mismatches.is_empty(),
            "{name}: positions differ: {mismatches:?}"
        );
    }
    Ok(())
}

#[test]
fn invalid_numeric_profiles_are_refused_at_load() -> anyhow::Result<()> {
    let mut profile = Profile::builtin("w4").ok_or_else(|| anyhow::anyhow!("no w4"))?;
    if let Some(w) = profile.weights.as_mut() {
        w.quant.bits = 7;
    }
    let err = Engine::load(
        &common::model_path()?,
        LoadOptions {
            profile,
            ..LoadOptions::default()
        },
    )
    .err()
    .ok_or_else(|| anyhow::anyhow!("a 7-bit profile loaded"))?;
    assert!(err.to_string().contains("weights.bits"), "{err}");
    Ok(())
}

#[test]
fn f32_stored_requantization_asymmetric_and_partial_sets_work_and_stay_invariant()
-> anyhow::Result<()> {
    // asymmetric 8-bit codes do not fit an i8 and 128 does not divide 576: these rows are kept
    // as re-quantized f32 values; only the MLP set is touched
    let profile = Profile::from_toml(
        "name = \"mlp-a8-g128\"\n[weights]\nbits = 8\ngroup_size = 128\nsymmetric = false\ntensors = [\"mlp\"]\n",
        "inline",
    )?;
    let e = Engine::load(
        &common::model_path()?,
        LoadOptions {
            threads: 2,
            profile,
            ..LoadOptions::default()
        },
    )?;
    let plain = engine("reference")?;
    assert!(
        e.weight_bytes() > plain.weight_bytes(),
        "f32 storage is larger"
    );
    let seqs = texts(60)?;
    let base = plain.score(&seqs, 5)?;
    let out = e.score(&seqs, 5)?;
    let (mean, max, _) = drift(&base, &out);
    assert!(max > 0.0 && mean < 0.05, "mean {mean}, max {max}");
    for (i, s) in seqs.iter().enumerate() {
        assert_same(
            &e.score(std::slice::from_ref(s), 5)?.remove(0),
            &out[i],
            &format!("sequence {i}"),
        );
    }
    Ok(())
}
