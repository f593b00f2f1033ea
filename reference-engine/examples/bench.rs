//! Throughput benchmark (not a test): prompt tokens/s scoring 512-token sequences at batch
//! 1 and 8, generation tokens/s, the RSS after loading, and a long-context probe's job (one
//! `--len`-token haystack, 3 candidates with distinct 24-token tails) scored as one job,
//! where the shared prefix is computed once, against one job per candidate, and 8
//! generations whose prompts share their first `--len` tokens, on an engine keeping read
//! prompts' keys and values against one keeping none.
//!
//! `cargo run --release -p samewise-engine --example bench -- --model PATH --threads 2`
//! (`--isa scalar|avx|avx512` caps the instruction set, for comparing kernel paths side by side)

use std::path::PathBuf;
use std::time::Instant;

use samewise_engine::{Engine, GenerateParams, Isa, LoadOptions};

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// CPU seconds used by this process so far (user + system), from /proc/self/stat.
fn cpu_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let u: f64 = f.get(11)?.parse().ok()?;
            let k: f64 = f.get(12)?.parse().ok()?;
            Some((u + k) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

fn main() -> anyhow::Result<()> {
    let mut model = None;
    let mut threads = 2;
    let mut len = 512;
    let mut gen_tokens = 128;
    let mut batches = vec![1usize, 8];
    let mut isa = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--model" => model = args.next().map(PathBuf::from),
            "--threads" => threads = args.next().and_then(|v| v.parse().ok()).unwrap_or(2),
            "--len" => len = args.next().and_then(|v| v.parse().ok()).unwrap_or(512),
            "--gen" => gen_tokens = args.next().and_then(|v| v.parse().ok()).unwrap_or(128),
            "--isa" => {
                isa = Some(match args.next().as_deref() {
                    Some("scalar") => Isa::Scalar,
                    Some("avx") => Isa::Avx,
                    Some("avx512") => Isa::Avx512,
                    other => anyhow::bail!("--isa takes scalar, avx or avx512, not {other:?}"),
                });
            }
            "--batches" => {
                batches = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|v| v.parse().ok())
                    .collect();
            }
            other => anyhow::bail!(
                "unknown argument {other} (use --model PATH --threads N [--len N] [--gen N] [--batches 1,8] [--isa I])"
            ),
        }
    }
    let model = model.ok_or_else(|| anyhow::anyhow!("--model PATH is required"))?;
    let t0 = Instant::now();
    let engine = Engine::load(
        &model,
        LoadOptions {
            threads,
            isa,
            ..LoadOptions::default()
        },
    )?;
    println!(
        "loaded {} in {:.2}s: isa {:?}, threads {}, packed weights {:.1} MiB, RSS {:.1} MiB",
        model.display(),
        t0.elapsed().as_secs_f64(),
        engine.isa(),
        engine.threads(),
        engine.weight_bytes() as f64 / (1 << 20) as f64,
        rss_mib()
    );
    let vocab = engine.config().vocab_size as u64;
    let mut state = 12345u64;
    let mut seq = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % vocab) as u32
            })
            .collect()
    };
    for &batch in &batches {
        let seqs: Vec<Vec<u32>> = (0..batch).map(|_| seq(len)).collect();
        let (t, c) = (Instant::now(), cpu_s());
        let before = engine.step_seconds();
        let out = engine.score(&seqs, 20)?;
        let after = engine.step_seconds();
        let (dt, dc) = (t.elapsed().as_secs_f64(), cpu_s() - c);
        let n: usize = out.iter().map(|s| s.positions.len()).sum();
        println!(
            "score: batch {batch} x {len} tokens: {:.1} prompt tokens/s ({dt:.2}s wall, {dc:.2} CPU-s; \
             {:.2}s in forward passes and heads, {:.2}s in log-softmax, top-20 and the rest of the steps)",
            n as f64 / dt,
            after.0 - before.0,
            (after.1 - before.1) - (after.0 - before.0)
        );
    }
    // a row's log-softmax and top-20 alone, one thread, at this vocabulary and Llama 3's
    for v in [vocab as usize, 128_256] {
        let rows: Vec<Vec<f32>> = (0..32)
            .map(|_| {
                seq(v)
                    .into_iter()
                    .map(|t| (t as f32 / vocab as f32) * 12.0 - 6.0)
                    .collect()
            })
            .collect();
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            for r in &rows {
                let lse = samewise_engine::sample::log_sum_exp(r);
                std::hint::black_box(samewise_engine::sample::top_k(r, lse, 20));
            }
            best = best.min(t.elapsed().as_secs_f64() / rows.len() as f64);
        }
        println!(
            "log-softmax and top-20 of one {v}-logit row: {:.1} us ({:.2} ns a logit, best of 3)",
            best * 1e6,
            best * 1e9 / v as f64
        );
    }
    let prompt = seq(16);
    let params = GenerateParams {
        max_tokens: gen_tokens,
        ..GenerateParams::default()
    };
    let (t, c) = (Instant::now(), cpu_s());
    let g = engine.generate(&prompt, &params, &mut |_| true)?;
    let (dt, dc) = (t.elapsed().as_secs_f64(), cpu_s() - c);
    println!(
        "generate: {} tokens: {:.1} tokens/s ({dt:.2}s wall, {dc:.2} CPU-s)",
        g.tokens.len(),
        g.tokens.len() as f64 / dt
    );
    let haystack = seq(len);
    let candidates: Vec<Vec<u32>> = (0..3).map(|_| [&haystack[..], &seq(24)].concat()).collect();
    let t = Instant::now();
    for c in &candidates {
        engine.score(std::slice::from_ref(c), 20)?;
    }
    let apart = t.elapsed().as_secs_f64();
    let before = engine.shared_prefix_positions();
    let t = Instant::now();
    engine.score(&candidates, 20)?;
    let together = t.elapsed().as_secs_f64();
    println!(
        "shared prefix: 3 candidates x ({len} + 24) tokens: {apart:.2}s one job each, {together:.2}s \
         as one job ({:.2}x; {} positions forked)",
        apart / together,
        engine.shared_prefix_positions() - before
    );
    // generations whose prompts start alike (one system prompt and tool list, many
    // questions): 8 prompts of the same `len` tokens and distinct 24-token tails, 16 new tokens
    // each, on an engine keeping read prompts and on one keeping none
    let none = Engine::load(
        &model,
        LoadOptions {
            threads,
            isa,
            prefix_cache_bytes: 0,
            ..LoadOptions::default()
        },
    )?;
    let preamble = seq(len);
    let prompts: Vec<Vec<u32>> = (0..8).map(|_| [&preamble[..], &seq(24)].concat()).collect();
    let params = GenerateParams {
        max_tokens: 16,
        ..GenerateParams::default()
    };
    let mut took = [0f64; 2];
    for (e, took) in [&none, &engine].into_iter().zip(&mut took) {
        let t = Instant::now();
        for p in &prompts {
            e.generate(p, &params, &mut |_| true)?;
        }
        *took = t.elapsed().as_secs_f64();
    }
    println!(
        "kept prompts: 8 generations of ({len} + 24) prompt tokens, 16 new each: {:.2}s keeping none, \
         {:.2}s keeping read prompts ({:.2}x; {} prompt positions copied, {:.1} MiB kept)",
        took[0],
        took[1],
        took[0] / took[1],
        engine.reused_prompt_positions(),
        engine.prefix_cache_bytes() as f64 / (1 << 20) as f64
    );
    println!("RSS after run {:.1} MiB", rss_mib());
    Ok(())
}
