//! The GPU check's binary (not a test; `scripts/gpu-check.sh` runs it on a machine with a
//! GPU, built and stripped here). Each stage prints one JSON object on stdout:
//!
//! - `synth --shape S [--layers N] [--seed N] --out F`: a synthetic model (as `samewise engine
//!   synth`), made on the GPU machine because the files do not travel.
//! - `smoke --model F`: CUDA loads, the kernels compile, one sequence scores on the GPU with
//!   the CPU backend's bits.
//! - `parity --model F [--max-len N]`: GPU against CPU on the same file, every position's
//!   logprob bits and top-5 compared; batch invariance on the GPU (batch 1..64, each
//!   sequence alone against all together); prefill against decode (greedy generation's
//!   logprobs against scoring the generated text).
//! - `throughput --model F [--threads N]`: scoring tokens/s (prompt logprobs, top-20) and
//!   decode tokens/s at batch 1, 8, 64 on the GPU and on the CPU backend, and the model's
//!   matmul rate against cuBLAS SGEMM (pedantic math: no TF32) on the same shapes.

use std::path::PathBuf;
use std::time::Instant;

use samewise_engine::{
    Device, Engine, GenerateParams, GeneratedToken, LoadOptions, ScoredSequence, Seq,
};
use serde_json::{Value, json};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn num(args: &[String], name: &str, default: usize) -> Res<usize> {
    Ok(match arg(args, name) {
        Some(v) => v.parse()?,
        None => default,
    })
}

fn load(model: &std::path::Path, device: Device, threads: usize) -> Res<Engine> {
    Ok(Engine::load(
        model,
        LoadOptions {
            threads,
            device,
            ..LoadOptions::default()
        },
    )?)
}

/// Seeded token ids in `0..vocab` (an LCG: the check needs no quality, only repeatability).
fn tokens(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Positions compared, positions whose logprob bits and top-k are identical, and the largest
/// |Δ logprob|.
fn compare(a: &[ScoredSequence], b: &[ScoredSequence]) -> (usize, usize, f64) {
    let (mut n, mut same, mut max) = (0, 0, 0f64);
    for (x, y) in a.iter().zip(b) {
        for (p, q) in x.positions.iter().zip(&y.positions) {
            n += 1;
            if p == q {
                same += 1;
            }
            if let (Some(l), Some(r)) = (p.logprob, q.logprob) {
                max = max.max((f64::from(l) - f64::from(r)).abs());
            }
        }
    }
    (n, same, max)
}

/// Greedy generation of every prompt together (one batch through [`Engine::step`]).
fn generate(
    e: &Engine,
    prompts: &[Vec<u32>],
    params: &GenerateParams,
) -> Res<Vec<Vec<GeneratedToken>>> {
    let mut seqs = prompts
        .iter()
        .map(|p| e.generate_seq(p.clone(), params.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = vec![Vec::new(); seqs.len()];
    while seqs.iter().any(|s| !s.is_done()) {
        let mut live: Vec<&mut Seq> = seqs.iter_mut().filter(|s| !s.is_done()).collect();
        e.step(&mut live)?;
        for (o, s) in out.iter_mut().zip(seqs.iter_mut()) {
            o.extend(s.take_new_tokens());
        }
    }
    Ok(out)
}

fn smoke(args: &[String]) -> Res<Value> {
    let model = PathBuf::from(arg(args, "--model").ok_or("--model")?);
    if let Some(why) = samewise_engine::cuda_unavailable() {
        return Ok(json!({"stage": "smoke", "ok": false, "error": why}));
    }
    let t = Instant::now();
    let gpu = load(&model, Device::Cuda(0), 1)?;
    let load_s = t.elapsed().as_secs_f64();
    let cpu = load(&model, Device::Cpu, num(args, "--threads", 16)?)?;
    let seqs = vec![tokens(1, 64, gpu.config().vocab_size)];
    let (g, c) = (gpu.score(&seqs, 5)?, cpu.score(&seqs, 5)?);
    let (n, same, max) = compare(&g, &c);
    Ok(json!({
        "stage": "smoke", "ok": n > 0 && max <= 1e-5,
        "device": gpu.device(), "load_s": load_s,
        "weight_bytes_device": gpu.device_weight_bytes(),
        "params": params(&gpu),
        "positions": n, "identical": same, "max_abs_diff": max,
    }))
}

/// Parameters in the matmuls (the embedding counted once, as the head).
fn params(e: &Engine) -> usize {
    let c = e.config();
    let per_layer =
        c.n_embd * c.qkv_dim() + c.n_head * c.head_dim * c.n_embd + 3 * c.n_embd * c.n_ff;
    c.n_layer * per_layer + c.vocab_size * c.n_embd
}

fn parity(args: &[String]) -> Res<Value> {
    let model = PathBuf::from(arg(args, "--model").ok_or("--model")?);
    let max_len = num(args, "--max-len", 4096)?;
    let gpu = load(&model, Device::Cuda(0), 1)?;
    let cpu = load(&model, Device::Cpu, num(args, "--threads", 16)?)?;
    let v = gpu.config().vocab_size;
    let max_len = max_len.min(gpu.config().n_ctx);
    // 64 sequences of mixed lengths, and one long one
    let mut seqs: Vec<Vec<u32>> = (0..64u64)
        .map(|i| tokens(100 + i, 8 + (i as usize * 37) % 300, v))
        .collect();
    seqs.push(tokens(7, max_len, v));
    let t = Instant::now();
    let all_gpu = gpu.score(&seqs, 5)?;
    let gpu_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let all_cpu = cpu.score(&seqs, 5)?;
    let cpu_s = t.elapsed().as_secs_f64();
    let (n, same, max) = compare(&all_gpu, &all_cpu);
    let long = compare(&all_gpu[64..], &all_cpu[64..]);
    // the one-output-per-thread GEMM everywhere, against the default (register-tiled from
    // 32 rows): the same fmaf chains, so the same bits
    // SAFETY: no other thread reads the environment while this one writes it (the engines'
    // kernel threads never do).
    unsafe { std::env::set_var("SAMEWISE_CUDA_GEMM", "simple") };
    let simple = load(&model, Device::Cuda(0), 1)?;
    // SAFETY: as above.
    unsafe { std::env::remove_var("SAMEWISE_CUDA_GEMM") };
    let kernels = compare(&simple.score(&seqs, 5)?, &all_gpu);
    drop(simple);
    // batch invariance on the GPU: batches of 1, 2, 4, …, 64 against all at once
    let mut batches = Vec::new();
    for b in [1usize, 2, 4, 8, 16, 32, 64] {
        let mut out = Vec::new();
        for chunk in seqs[..64].chunks(b) {
            out.extend(gpu.score(chunk, 5)?);
        }
        let (bn, bsame, bmax) = compare(&out, &all_gpu[..64]);
        batches
            .push(json!({"batch": b, "positions": bn, "identical": bsame, "max_abs_diff": bmax}));
    }
    // prefill against decode: greedy generation's logprobs against scoring its text
    let prompts: Vec<Vec<u32>> = (0..8u64).map(|i| tokens(900 + i, 24, v)).collect();
    let params = GenerateParams {
        max_tokens: 48,
        top_logprobs: 5,
        ..GenerateParams::default()
    };
    let gens = generate(&gpu, &prompts, &params)?;
    let (mut dn, mut dsame, mut dmax) = (0, 0, 0f64);
    for (p, g) in prompts.iter().zip(&gens) {
        let mut full = p.clone();
        full.extend(g.iter().map(|t| t.token));
        let scored = gpu.score(&[full], 5)?;
        for (k, t) in g.iter().enumerate() {
            let s = &scored[0].positions[p.len() - 1 + k];
            dn += 1;
            if s.logprob.map(f32::to_bits) == Some(t.logprob.to_bits()) && s.top == t.top {
                dsame += 1;
            }
            if let Some(l) = s.logprob {
                dmax = dmax.max((f64::from(l) - f64::from(t.logprob)).abs());
            }
        }
    }
    let batch_ok = batches.iter().all(|b| b["identical"] == b["positions"]);
    Ok(json!({
        "stage": "parity", "device": gpu.device(),
        "ok": batch_ok && dsame == dn && max <= 1e-5 && kernels.1 == kernels.0,
        "gpu_vs_cpu": {"positions": n, "identical": same, "max_abs_diff": max,
                        "long_len": max_len, "long_identical": long.1, "long_max_abs_diff": long.2,
                        "gpu_s": gpu_s, "cpu_s": cpu_s},
        "batch_invariance": batches,
        "simple_vs_tiled_gemm": {"positions": kernels.0, "identical": kernels.1, "max_abs_diff": kernels.2},
        "prefill_vs_decode": {"tokens": dn, "identical": dsame, "max_abs_diff": dmax},
    }))
}

fn throughput(args: &[String]) -> Res<Value> {
    let model = PathBuf::from(arg(args, "--model").ok_or("--model")?);
    let threads = num(args, "--threads", 16)?;
    let gpu = load(&model, Device::Cuda(0), 1)?;
    let v = gpu.config().vocab_size;
    let flops_per_token = 2.0 * params(&gpu) as f64;
    let mut rows = Vec::new();
    let cpu = if args.iter().any(|a| a == "--no-cpu") {
        None
    } else {
        Some(load(&model, Device::Cpu, threads)?)
    };
    for b in [1usize, 8, 64] {
        // 512-token sequences, at most 4,096 tokens a batch (64 x 64 at batch 64): the 8B
        // shape's batch must fit the stage's time
        let len = (4096 / b).clamp(64, 512);
        let seqs: Vec<Vec<u32>> = (0..b as u64).map(|i| tokens(i, len, v)).collect();
        let score = |e: &Engine| -> Res<f64> {
            let t = Instant::now();
            e.score(&seqs, 20)?;
            Ok((b * len) as f64 / t.elapsed().as_secs_f64())
        };
        let prompts: Vec<Vec<u32>> = (0..b as u64).map(|i| tokens(50 + i, 16, v)).collect();
        let params = GenerateParams {
            max_tokens: 64,
            ..GenerateParams::default()
        };
        let decode = |e: &Engine| -> Res<f64> {
            let t = Instant::now();
            let g = generate(e, &prompts, &params)?;
            let n: usize = g.iter().map(Vec::len).sum();
            Ok(n as f64 / t.elapsed().as_secs_f64())
        };
        gpu.score(&seqs[..1], 20)?; // warm-up
        let (gs, gd) = (score(&gpu)?, decode(&gpu)?);
        let (cs, cd) = match (&cpu, b) {
            // the CPU at batch 64 takes minutes on the large shapes: measured at 1 and 8
            (Some(c), 1 | 8) => (Some(score(c)?), Some(decode(c)?)),
            _ => (None, None),
        };
        rows.push(json!({
            "batch": b, "tokens_per_sequence": len,
            "gpu_score_tok_s": gs, "gpu_decode_tok_s": gd,
            "gpu_score_gflops": gs * flops_per_token / 1e9,
            "cpu_score_tok_s": cs, "cpu_decode_tok_s": cd,
        }));
    }
    let sgemm = cublas_sgemm_gflops(&gpu, 512)?;
    let best = rows
        .iter()
        .filter_map(|r| r["gpu_score_gflops"].as_f64())
        .fold(0f64, f64::max);
    Ok(json!({
        "stage": "throughput", "device": gpu.device(), "params": params(&gpu),
        "rows": rows, "cublas_sgemm_gflops_m512": sgemm,
        "score_vs_cublas": best / sgemm,
    }))
}

/// cuBLAS SGEMM (pedantic math: exact f32, no TF32) over the model's matmul shapes at
/// `m` rows, as one rate: total flops over total time.
fn cublas_sgemm_gflops(e: &Engine, m: usize) -> Res<f64> {
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys};
    use cudarc::driver::CudaContext;
    let c = e.config();
    let shapes = [
        (c.qkv_dim(), c.n_embd),
        (c.n_embd, c.n_head * c.head_dim),
        (2 * c.n_ff, c.n_embd),
        (c.n_embd, c.n_ff),
        (c.vocab_size, c.n_embd),
    ];
    let ctx = CudaContext::new(0)?;
    let s = ctx.default_stream();
    let blas = CudaBlas::new(s.clone())?;
    // SAFETY: a valid handle; pedantic math forbids TF32 and other reduced-precision paths.
    unsafe {
        sys::cublasSetMathMode(*blas.handle(), sys::cublasMath_t::CUBLAS_PEDANTIC_MATH).result()?;
    }
    let (mut flops, mut secs) = (0f64, 0f64);
    for (n, k) in shapes {
        let a = s.alloc_zeros::<f32>(m * k)?;
        let w = s.alloc_zeros::<f32>(n * k)?;
        let mut y = s.alloc_zeros::<f32>(m * n)?;
        let cfg = GemmConfig {
            transa: sys::cublasOperation_t::CUBLAS_OP_T,
            transb: sys::cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: 1.0f32,
            lda: k as i32,
            ldb: k as i32,
            beta: 0.0f32,
            ldc: n as i32,
        };
        // SAFETY: buffers of the sizes the configuration reads and writes.
        unsafe { blas.gemm(cfg, &w, &a, &mut y)? };
        s.synchronize()?;
        let reps = 20;
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: as above.
            unsafe { blas.gemm(cfg, &w, &a, &mut y)? };
        }
        s.synchronize()?;
        secs += t.elapsed().as_secs_f64();
        flops += reps as f64 * 2.0 * (m * n * k) as f64;
    }
    Ok(flops / secs / 1e9)
}

fn synth(args: &[String]) -> Res<Value> {
    let out = PathBuf::from(arg(args, "--out").ok_or("--out")?);
    let t = Instant::now();
    let mut opts = samewise_engine::SynthOptions::new(samewise_engine::SynthShape::parse(
        &arg(args, "--shape").ok_or("--shape")?,
    )?);
    opts.seed = num(args, "--seed", 1)? as u64;
    if let Some(l) = arg(args, "--layers") {
        opts.layers = Some(l.parse()?);
    }
    let report = samewise_engine::synthesize(&opts, &out)?;
    Ok(
        json!({"stage": "synth", "path": report.path, "bytes": report.bytes, "s": t.elapsed().as_secs_f64()}),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("smoke") => smoke(&args),
        Some("parity") => parity(&args),
        Some("throughput") => throughput(&args),
        Some("synth") => synth(&args),
        _ => Err("usage: gpu_check smoke|parity|throughput|synth [--model F] …".into()),
    };
    match result {
        Ok(v) => {
            println!("{v}");
            // a stage that ran but failed its check exits non-zero too, for the script
            if v["ok"] == json!(false) {
                std::process::exit(1);
            }
        }
        Err(e) => {
            println!("{}", json!({"ok": false, "error": e.to_string()}));
            std::process::exit(1);
        }
    }
}
