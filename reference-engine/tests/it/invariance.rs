//! Batch invariance, bit for bit (f32 bits compared): a sequence's logprobs and top-k are the
//! same scored alone or inside batches of 1..16 mixed-length sequences, with 1 or 2 threads,
//! on every instruction set, whether scored whole or decoded token by token with the KV
//! cache, and through the batcher under concurrent submissions.

use crate::common;

use std::sync::Arc;

use samewise_engine::{Batcher, GenEvent};
use samewise_engine::{
    Engine, GenerateParams, GeneratedToken, Isa, LoadOptions, SamplingParams, ScoredSequence,
    TokenLogprob,
};

fn engine(threads: usize, isa: Option<Isa>) -> anyhow::Result<Engine> {
    Ok(Engine::load(
        &common::model_path()?,
        LoadOptions {
            threads,
            isa,
            ..LoadOptions::default()
        },
    )?)
}

/// Token ids of the golden texts (real text: chat, code, numbers, non-English, long).
fn texts() -> anyhow::Result<Vec<Vec<u32>>> {
    let g = common::fixture_json("golden_smollm2.json")?;
    let texts = g["texts"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("golden has no texts"))?;
    texts
        .iter()
        .map(|t| {
            t["token_ids"]
                .as_array()
                .ok_or_else(|| anyhow::anyhow!("no token_ids"))?
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|x| x as u32)
                        .ok_or_else(|| anyhow::anyhow!("bad id"))
                })
                .collect()
        })
        .collect()
}

/// 16 sequences of mixed lengths (1 to 61 tokens) cut from different texts and offsets.
fn mixed() -> anyhow::Result<Vec<Vec<u32>>> {
    let t = texts()?;
    Ok((0..16)
        .map(|i| {
            let src = &t[i % t.len()];
            let len = 1 + (i * 37) % 61;
            let start = (i * 13) % (src.len() - len);
            src[start..start + len].to_vec()
        })
        .collect())
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

#[test]
fn batch_composition_does_not_change_a_single_bit() -> anyhow::Result<()> {
    let e = engine(2, None)?;
    let seqs = mixed()?;
    let alone: Vec<ScoredSequence> = seqs
        .iter()
        .map(|s| e.score(std::slice::from_ref(s), 5).map(|mut v| v.remove(0)))
        .collect::<Result<_, _>>()?;
    // batches of 16, 9 (reversed), 4, 2 and 1 with varied members and order
    let batches: Vec<Vec<usize>> = vec![
        (0..16).collect(),
        (0..9).rev().collect(),
        vec![15, 3, 7, 0],
        vec![11, 12],
        vec![6],
    ];
    for b in batches {
        let batch: Vec<Vec<u32>> = b.iter().map(|&i| seqs[i].clone()).collect();
        let out = e.score(&batch, 5)?;
        for (j, &i) in b.iter().enumerate() {
            assert_same(&alone[i], &out[j], &format!("sequence {i} in batch {b:?}"));
        }
    }
    Ok(())
}

#[test]
fn long_sequence_chunking_does_not_change_bits() -> anyhow::Result<()> {
    // 600 tokens are fed in several chunks; next to other sequences the chunk boundaries move
    let e = engine(2, None)?;
    let t = texts()?;
    let long = t
        .iter()
        .max_by_key(|s| s.len())
        .ok_or_else(|| anyhow::anyhow!("no texts"))?;
    let long = long[..600.min(long.len())].to_vec();
    let alone = e.score(std::slice::from_ref(&long), 3)?.remove(0);
    let others = vec![
        t[0][..80.min(t[0].len())].to_vec(),
        long.clone(),
        t[1][..37.min(t[1].len())].to_vec(),
    ];
    let out = e.score(&others, 3)?;
    assert_same(&alone, &out[1], "long sequence inside a batch");
    Ok(())
}

/// Sequences sharing prefixes (a long one over several chunks, one cut mid key block, an
/// exact duplicate, a sequence that is another's prefix, the shortest prefix shared, and an
/// unrelated one), each scored alone and all in one job, directly and through the batcher.
#[test]
fn shared_prefixes_are_computed_once_without_changing_a_bit() -> anyhow::Result<()> {
    let e = Arc::new(engine(2, None)?);
    let t = texts()?;
    let p = &t[4][..700];
    let cat = |head: &[u32], tail: &[u32]| [head, tail].concat();
    let seqs = vec![
        cat(p, &t[1][..40]),
        cat(&p[..333], &t[3][..25]),
        cat(p, &t[2][..30]),
        t[1][..50].to_vec(),
        cat(p, &t[1][..40]),
        p.to_vec(),
        cat(&p[..16], &t[0][..1]),
    ];
    let alone = seqs
        .iter()
        .map(|s| Ok(e.score(std::slice::from_ref(s), 4)?.remove(0)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    assert_eq!(
        e.shared_prefix_positions(),
        0,
        "single sequences share nothing"
    );
    // the steps' time is accounted: the forward passes and heads are part of it
    let (forward_s, all_s) = e.step_seconds();
    assert!(
        forward_s > 0.0 && forward_s <= all_s,
        "step time: {forward_s} s of {all_s} s in forward passes and heads"
    );
    let together = e.score(&seqs, 4)?;
    // P then its three extensions are adjacent in token order: 699 + 699 + 739 positions at
    // least (each follower recomputes the last shared position)
    let shared = e.shared_prefix_positions();
    assert!(shared >= 699 + 699 + 739, "shared positions: {shared}");
    let batcher = Batcher::start(Arc::clone(&e));
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let batched = rt.block_on(batcher.handle().score(seqs.clone(), 4))?;
    batcher.shutdown();
    assert_eq!(
        e.shared_prefix_positions(),
        2 * shared,
        "the batcher shares the same"
    );
    for (i, a) in alone.iter().enumerate() {
        assert_same(a, &together[i], &format!("sequence {i}, in one job"));
        assert_same(
            a,
            &batched[i],
            &format!("sequence {i}, through the batcher"),
        );
    }
    Ok(())
}

#[test]
fn threads_and_instruction_sets_agree() -> anyhow::Result<()> {
    let seqs: Vec<Vec<u32>> = mixed()?.into_iter().take(4).collect();
    let two = engine(2, None)?.score(&seqs, 5)?;
    let one = engine(1, None)?.score(&seqs, 5)?;
    for (i, (a, b)) in two.iter().zip(&one).enumerate() {
        assert_same(a, b, &format!("sequence {i}, 2 vs 1 threads"));
    }
    // AVX+FMA and the scalar fallback (slow: a short sequence)
    let short = vec![seqs[3][..seqs[3].len().min(6)].to_vec()];
    let best = engine(2, None)?.score(&short, 5)?;
    for isa in [Isa::Avx, Isa::Scalar] {
        let other = engine(2, Some(isa))?.score(&short, 5)?;
        assert_same(&best[0], &other[0], &format!("{isa:?} vs best ISA"));
    }
    Ok(())
}

fn greedy(max_tokens: usize, top: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        top_logprobs: top,
        ..GenerateParams::default()
    }
}

#[test]
fn token_by_token_decode_equals_whole_sequence_scoring() -> anyhow::Result<()> {
    let e = engine(2, None)?;
    let t = texts()?;
    for prompt in [t[0][..12].to_vec(), vec![t[2][0]]] {
        let g = e.generate(&prompt, &greedy(20, 5), &mut |_| true)?;
        anyhow::ensure!(g.tokens.len() == 20, "generated {} tokens", g.tokens.len());
        let mut whole = prompt.clone();
        whole.extend(g.tokens.iter().map(|x| x.token));
        let scored = e.score(&[whole], 5)?.remove(0);
        for (j, tok) in g.tokens.iter().enumerate() {
            let p = &scored.positions[prompt.len() + j];
            assert_eq!(p.token, tok.token);
            assert_eq!(
                p.logprob.map(f32::to_bits),
                Some(tok.logprob.to_bits()),
                "decode step {j} logprob bits"
            );
            assert_eq!(bits(&p.top), bits(&tok.top), "decode step {j} top-k bits");
            // greedy picks the top-1
            assert_eq!(p.top[0].token, tok.token);
        }
    }
    Ok(())
}

/// Generations whose prompts start alike: the engine keeps each read prompt's keys and values
/// and a later prompt copies its longest kept start instead of reading it again
/// (`LoadOptions::prefix_cache_bytes`). Every token, logprob and top-k entry is the same bits
/// as on an engine that keeps nothing, and the copied positions are counted.
#[test]
fn kept_prompts_are_reused_without_changing_a_bit() -> anyhow::Result<()> {
    let keeps = engine(2, None)?;
    let none = Engine::load(
        &common::model_path()?,
        LoadOptions {
            prefix_cache_bytes: 0,
            ..LoadOptions::default()
        },
    )?;
    let t = texts()?;
    let p = &t[4][..300];
    let cat = |head: &[u32], tail: &[u32]| [head, tail].concat();
    let a = cat(p, &t[1][..20]);
    let prompts = [
        a.clone(),
        cat(&p[..200], &t[2][..15]),
        a.clone(),
        t[0][..10].to_vec(),
        cat(&a, &t[3][..30]),
    ];
    for (i, prompt) in prompts.iter().enumerate() {
        let x = keeps.generate(prompt, &greedy(12, 5), &mut |_| true)?;
        let y = none.generate(prompt, &greedy(12, 5), &mut |_| true)?;
        assert_eq!(x.finish, y.finish, "prompt {i}");
        let all = |g: &samewise_engine::Generation| -> Vec<_> {
            g.tokens
                .iter()
                .map(|u| (u.token, u.logprob.to_bits(), bits(&u.top)))
                .collect()
        };
        assert_eq!(
            all(&x),
            all(&y),
            "prompt {i}: tokens, logprob and top-k bits"
        );
    }
    // nothing kept before the first; the second shares its first 200 tokens; the first again
    // copies all but its last token; the short one (under 16 tokens) nothing; the last
    // extends the first, all 320 of whose positions it copies
    let common = |x: &[u32], y: &[u32]| x.iter().zip(y).take_while(|(u, v)| u == v).count();
    let second = common(&prompts[0], &prompts[1]);
    assert!(second >= 200, "{second}");
    assert_eq!(keeps.reused_prompt_positions(), (second + 319 + 320) as u64);
    assert_eq!(
        (none.reused_prompt_positions(), none.prefix_cache_bytes()),
        (0, 0)
    );
    // kept now: the second prompt and the last (which replaced the first it extends); a
    // position's keys in blocks of 16, its values in rows, of every layer
    let c = keeps.config();
    let bytes = |n: usize| c.n_layer * c.n_head_kv * c.head_dim * 4 * (n.div_ceil(16) * 16 + n);
    assert_eq!(
        keeps.prefix_cache_bytes(),
        bytes(prompts[1].len()) + bytes(prompts[4].len())
    );
    Ok(())
}

#[test]
fn batcher_under_concurrent_load_equals_direct_calls() -> anyhow::Result<()> {
    let e = Arc::new(engine(2, None)?);
    let seqs = mixed()?;
    let t = texts()?;
    let prompts: Vec<Vec<u32>> = vec![
        t[0][..20].to_vec(),
        t[3][..9].to_vec(),
        t[4][..31].to_vec(),
        t[1][..15].to_vec(),
    ];
    let params: Vec<GenerateParams> = vec![
        greedy(12, 3),
        GenerateParams {
            sampling: SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                top_k: 40,
                seed: Some(7),
                ..SamplingParams::default()
            },
            ..greedy(12, 3)
        },
        GenerateParams {
            sampling: SamplingParams {
                temperature: 1.2,
                top_p: 1.0,
                top_k: 0,
                seed: Some(99),
                ..SamplingParams::default()
            },
            ..greedy(10, 2)
        },
        // the logit adjustments and min-p: per sequence, whatever shares its passes
        GenerateParams {
            sampling: SamplingParams {
                temperature: 0.9,
                seed: Some(5),
                logit_bias: vec![(28, 4.0), (30, -100.0)],
                presence_penalty: 0.8,
                frequency_penalty: 0.5,
                repetition_penalty: 1.2,
                min_p: 0.05,
                ..SamplingParams::default()
            },
            ..greedy(14, 3)
        },
    ];
    // direct, one at a time
    let direct_scores: Vec<ScoredSequence> = seqs
        .iter()
        .map(|s| e.score(std::slice::from_ref(s), 4).map(|mut v| v.remove(0)))
        .collect::<Result<_, _>>()?;
    let direct_gens: Vec<Vec<GeneratedToken>> = prompts
        .iter()
        .zip(&params)
        .map(|(p, g)| e.generate(p, g, &mut |_| true).map(|x| x.tokens))
        .collect::<Result<_, _>>()?;
    let batcher = Batcher::start(Arc::clone(&e));
    let handle = batcher.handle();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (scores, gens) = rt.block_on(async {
        let score_futs = seqs.iter().map(|s| {
            let h = handle.clone();
            let s = s.clone();
            async move { h.score(vec![s], 4).await.map(|mut v| v.remove(0)) }
        });
        let gen_futs = prompts.iter().zip(&params).map(|(p, g)| {
            let h = handle.clone();
            let (p, g) = (p.clone(), g.clone());
            async move {
                let mut rx = h.generate(p, g)?;
                let mut out = Vec::new();
                while let Some(ev) = rx.recv().await {
                    match ev {
                        GenEvent::Token(t) => out.push(t),
                        GenEvent::Done(_) => break,
                        GenEvent::Error(e) => return Err(e),
                    }
                }
                Ok(out)
            }
        });
        let (a, b) = futures_util::future::join(
            futures_util::future::join_all(score_futs),
            futures_util::future::join_all(gen_futs),
        )
        .await;
        (a, b)
    });
    for (i, (d, b)) in direct_scores.iter().zip(scores).enumerate() {
        assert_same(d, &b?, &format!("batcher score {i}"));
    }
    for (i, (d, b)) in direct_gens.iter().zip(gens).enumerate() {
        let b = b?;
        assert_eq!(d.len(), b.len(), "generation {i} length");
        for (x, y) in d.iter().zip(&b) {
            assert_eq!(
                (x.token, x.logprob.to_bits()),
                (y.token, y.logprob.to_bits()),
                "generation {i}"
            );
            assert_eq!(bits(&x.top), bits(&y.top), "generation {i} top");
        }
    }
    // a dropped receiver cancels; the batcher keeps serving
    let rx = handle.generate(prompts[0].clone(), greedy(500, 0))?;
    drop(rx);
    let again = rt.block_on(handle.score(vec![seqs[5].clone()], 4))?;
    assert_same(
        &direct_scores[5],
        &again[0],
        "score after a cancelled generation",
    );
    batcher.shutdown();
    let after = rt.block_on(handle.score(vec![seqs[5].clone()], 4));
    assert!(
        matches!(after, Err(samewise_engine::EngineError::Shutdown)),
        "after shutdown: {after:?}"
    );
    Ok(())
}

/// A short generation submitted behind long scoring jobs is not queued behind their prefill:
/// prefill goes shortest-remaining first, so the generation ends while the scoring (16 passes'
/// worth of rows) is still running; the scoring is then cancelled. Its results are the same
/// either way (batch invariance, above); only the order of completion changes.
#[test]
fn a_short_generation_is_not_queued_behind_long_scoring_jobs() -> anyhow::Result<()> {
    let e = Arc::new(engine(2, None)?);
    let t = texts()?;
    // 4 × 2,048 tokens of real text: 16 passes of the 512-row budget
    let long: Vec<u32> = t.iter().flatten().copied().cycle().take(2048).collect();
    let batcher = Batcher::start(Arc::clone(&e));
    let handle = batcher.handle();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let scoring_still_running = rt.block_on(async {
        let h = handle.clone();
        let scoring = tokio::spawn(async move { h.score(vec![long; 4], 1).await });
        // the scoring job is in the batcher before the generation is submitted
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut rx = handle.generate(t[0][..16].to_vec(), greedy(3, 0))?;
        let mut tokens = 0;
        while let Some(ev) = rx.recv().await {
            match ev {
                GenEvent::Token(_) => tokens += 1,
                GenEvent::Done(_) => break,
                GenEvent::Error(e) => return Err(anyhow::anyhow!("generation failed: {e}")),
            }
        }
        anyhow::ensure!(tokens == 3, "{tokens} tokens");
        let running = !scoring.is_finished();
        scoring.abort(); // drops the reply: the batcher cancels the job
        Ok(running)
    })?;
    anyhow::ensure!(
        scoring_still_running,
        "the generation waited for the whole scoring prefill"
    );
    batcher.shutdown();
    Ok(())
}
