//! The GPU check's binary (not a test; `scripts/gpu-check.sh` runs it on a machine with a
//! GPU, built and stripped here). Each stage prints one JSON object on stdout:
//!
//! - `serve --model F [--device cpu]`: the OpenAI API over the GPU engine against the same
//!   server over the CPU engine (both in process, on loopback): completions with echoed
//!   prompt logprobs, greedy and seeded sampling, chat, a forced tool call, and 8 requests
//!   at once; every body the same but for ids and timestamps.
//! - `gemm --model F [--m N] [--reps N]`: the GEMM kernels' timings alone (for a profiler).
//! - `synth --shape S [--layers N] [--seed N] --out F`: a synthetic model (as `samewise engine
//!   synth`), made on the GPU machine because the files do not travel.
//! - `smoke --model F`: CUDA loads, the kernels compile, one sequence scores on the GPU with
//!   the CPU backend's bits.
//! - `parity --model F [--max-len N] [--device cpu]`: GPU against CPU on the same file, every position's
//!   logprob bits and top-5 compared; batch invariance on the GPU (batch 1..64, each
//!   sequence alone against all together); each GEMM kernel forced against the default
//!   choice; prefill against decode (greedy generation's logprobs against scoring the
//!   generated text); greedy generation GPU against CPU; the serving profiles' numeric
//!   knobs (w4, w8, a8, kv-f16, kv-q8) GPU against CPU.
//! - `throughput --model F [--threads N] [--no-cpu]`: the engine's GEMM kernels against
//!   cuBLAS SGEMM (pedantic math: no TF32) shape by shape at 1, 64, 512 and 2,048 rows;
//!   scoring tokens/s (prompt logprobs, top-20) and decode tokens/s at batch 1, 8, 64 on
//!   the GPU, and on the CPU backend (scoring at batch 1, decoding at 1 and 8).

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
    load_profile(model, device, threads, "reference")
}

fn load_profile(
    model: &std::path::Path,
    device: Device,
    threads: usize,
    profile: &str,
) -> Res<Engine> {
    Ok(Engine::load(
        model,
        LoadOptions {
            threads,
            device,
            profile: samewise_engine::Profile::resolve(profile)?,
            ..LoadOptions::default()
        },
    )?)
}

/// Positions compared, identical, largest |Δ logprob| as JSON.
fn cmp_json(c: (usize, usize, f64)) -> Value {
    json!({"positions": c.0, "identical": c.1, "max_abs_diff": c.2})
}

/// Tokens compared and identical (token, logprob bits, top-k) between two generations.
fn compare_gens(a: &[Vec<GeneratedToken>], b: &[Vec<GeneratedToken>]) -> (usize, usize, f64) {
    let (mut n, mut same, mut max) = (0, 0, 0f64);
    for (x, y) in a.iter().zip(b) {
        n += x.len().max(y.len());
        for (p, q) in x.iter().zip(y) {
            if p.token == q.token && p.logprob.to_bits() == q.logprob.to_bits() && p.top == q.top {
                same += 1;
            }
            max = max.max((f64::from(p.logprob) - f64::from(q.logprob)).abs());
        }
    }
    (n, same, max)
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
    let threads = num(args, "--threads", 16)?;
    let t = Instant::now();
    let gpu = load(&model, Device::Cuda(0), threads)?;
    let load_s = t.elapsed().as_secs_f64();
    let cpu = load(&model, Device::Cpu, threads)?;
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
    let threads = num(args, "--threads", 16)?;
    // `--device cpu` runs the whole check with the CPU in the GPU's place: a self-test of
    // the check itself on a machine without a GPU
    let dev: Device = arg(args, "--device").as_deref().unwrap_or("cuda").parse()?;
    let gpu = load(&model, dev, threads)?;
    let cpu = load(&model, Device::Cpu, threads)?;
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
    // each GEMM kernel forced everywhere, against the default choice: the same fmaf
    // chains, so the same bits
    let mut kernels = Vec::new();
    for kind in ["simple", "tiled", "wide", "wide1", "skinny"] {
        // SAFETY: no other thread reads the environment while this one writes it (the
        // engines' kernel threads never do).
        unsafe { std::env::set_var("SAMEWISE_CUDA_GEMM", kind) };
        let forced = load(&model, dev, threads);
        // SAFETY: as above.
        unsafe { std::env::remove_var("SAMEWISE_CUDA_GEMM") };
        let c = compare(&forced?.score(&seqs, 5)?, &all_gpu);
        let mut j = cmp_json(c);
        j["kernel"] = json!(kind);
        kernels.push(j);
    }
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
    let gen_vs_cpu = compare_gens(&gens, &generate(&cpu, &prompts, &params)?);
    let (mut dn, mut dsame, mut dmax) = (0, 0, 0f64);
    for (p, g) in prompts.iter().zip(&gens) {
        let mut full = p.clone();
        full.extend(g.iter().map(|t| t.token));
        let scored = gpu.score(&[full], 5)?;
        for (k, t) in g.iter().enumerate() {
            // position i holds the logprob of token i (none at 0)
            let s = &scored[0].positions[p.len() + k];
            dn += 1;
            if s.logprob.map(f32::to_bits) == Some(t.logprob.to_bits()) && s.top == t.top {
                dsame += 1;
            }
            if let Some(l) = s.logprob {
                dmax = dmax.max((f64::from(l) - f64::from(t.logprob)).abs());
            }
        }
    }
    // the serving profiles' numeric knobs on the GPU against the CPU: re-quantized weights,
    // 8-bit activations, KV-cache formats
    let mut profiles = Vec::new();
    for name in ["w4", "w8", "a8", "kv-f16", "kv-q8"] {
        let g = load_profile(&model, dev, threads, name)?;
        let c = load_profile(&model, Device::Cpu, threads, name)?;
        let mut j = cmp_json(compare(
            &g.score(&seqs[..16], 5)?,
            &c.score(&seqs[..16], 5)?,
        ));
        j["profile"] = json!(name);
        profiles.push(j);
    }
    let all_same = |v: &[Value]| v.iter().all(|b| b["identical"] == b["positions"]);
    let batch_ok = all_same(&batches);
    Ok(json!({
        "stage": "parity", "device": gpu.device(),
        "ok": batch_ok && dsame == dn && max <= 1e-5 && all_same(&kernels)
            && gen_vs_cpu.1 == gen_vs_cpu.0 && all_same(&profiles),
        "gpu_vs_cpu": {"positions": n, "identical": same, "max_abs_diff": max,
                        "long_len": max_len, "long_identical": long.1, "long_max_abs_diff": long.2,
                        "gpu_s": gpu_s, "cpu_s": cpu_s},
        "batch_invariance": batches,
        "forced_kernels_vs_auto": kernels,
        "prefill_vs_decode": {"tokens": dn, "identical": dsame, "max_abs_diff": dmax},
        "generation_gpu_vs_cpu": {"tokens": gen_vs_cpu.0, "identical": gen_vs_cpu.1, "max_abs_diff": gen_vs_cpu.2},
        "profiles_gpu_vs_cpu": profiles,
    }))
}

fn throughput(args: &[String]) -> Res<Value> {
    let model = PathBuf::from(arg(args, "--model").ok_or("--model")?);
    let threads = num(args, "--threads", 16)?;
    let t = Instant::now();
    let gpu = load(&model, Device::Cuda(0), threads)?;
    let load_s = t.elapsed().as_secs_f64();
    let v = gpu.config().vocab_size;
    let flops_per_token = 2.0 * params(&gpu) as f64;
    // the kernels against cuBLAS, shape by shape, at a forward pass's rows
    let ms = [1usize, 64, 512, 2048];
    let mut ours = Vec::new();
    for m in ms {
        ours.push((m, gpu.gpu_gemm_timings(m, 10)?));
    }
    let mut blas = std::collections::HashMap::new();
    for t in &ours[0].1 {
        if let std::collections::hash_map::Entry::Vacant(e) = blas.entry((t.n, t.k)) {
            e.insert(cublas_sgemm_seconds(&ms, t.n, t.k, 10)?);
        }
    }
    let mut gemm = Vec::new();
    let (mut ours_s, mut blas_s, mut flops) = (0f64, 0f64, 0f64);
    for (mi, (m, timings)) in ours.iter().enumerate() {
        let m = *m;
        for t in timings {
            let cb = blas[&(t.n, t.k)][mi];
            let f = 2.0 * (m * t.n * t.k) as f64;
            if t.kernel.starts_with("auto") && m >= 512 {
                ours_s += t.seconds;
                blas_s += cb;
                flops += f;
            }
            gemm.push(json!({
                "m": m, "n": t.n, "k": t.k, "kernel": t.kernel,
                "s": t.seconds, "gflops": f / t.seconds / 1e9,
                "cublas_s": cb, "cublas_gflops": f / cb / 1e9,
                "vs_cublas": cb / t.seconds,
            }));
        }
    }
    eprintln!("gemm timings done");
    let cpu = if args.iter().any(|a| a == "--no-cpu") {
        None
    } else {
        Some(load(&model, Device::Cpu, threads)?)
    };
    let mut rows = Vec::new();
    for b in [1usize, 8, 64] {
        // 512-token sequences, at most 4,096 tokens a batch (64 x 64 at batch 64): the 8B
        // shape's batch must fit the stage's time
        let len = (4096 / b).clamp(64, 512);
        let seqs: Vec<Vec<u32>> = (0..b as u64).map(|i| tokens(i, len, v)).collect();
        let score = |e: &Engine, seqs: &[Vec<u32>]| -> Res<f64> {
            let t = Instant::now();
            e.score(seqs, 20)?;
            Ok(seqs.iter().map(Vec::len).sum::<usize>() as f64 / t.elapsed().as_secs_f64())
        };
        let prompts: Vec<Vec<u32>> = (0..b as u64).map(|i| tokens(50 + i, 16, v)).collect();
        let params = GenerateParams {
            max_tokens: 64,
            ..GenerateParams::default()
        };
        let decode = |e: &Engine, prompts: &[Vec<u32>]| -> Res<f64> {
            let t = Instant::now();
            let g = generate(e, prompts, &params)?;
            let n: usize = g.iter().map(Vec::len).sum();
            Ok(n as f64 / t.elapsed().as_secs_f64())
        };
        gpu.score(&seqs[..1], 20)?; // warm-up
        let before = gpu.step_seconds();
        let gs = score(&gpu, &seqs)?;
        let after = gpu.step_seconds();
        let gd = decode(&gpu, &prompts)?;
        // of the scoring time in steps: on the device (kernels, logits copied back), and
        // on the host (log-softmax, top-20)
        let (dev_s, all_s) = (after.0 - before.0, after.1 - before.1);
        // the CPU scores one sequence (its rate barely depends on the batch) and decodes at
        // batch 1 and 8: the large shapes' batches take it minutes
        let (cs, cd) = match (&cpu, b) {
            (Some(c), 1) => (Some(score(c, &seqs)?), Some(decode(c, &prompts)?)),
            (Some(c), 8) => (None, Some(decode(c, &prompts)?)),
            _ => (None, None),
        };
        eprintln!("batch {b} done");
        rows.push(json!({
            "batch": b, "tokens_per_sequence": len,
            "gpu_score_tok_s": gs, "gpu_decode_tok_s": gd,
            "gpu_score_gflops": gs * flops_per_token / 1e9,
            "gpu_score_device_s": dev_s, "gpu_score_host_s": all_s - dev_s,
            "cpu_score_tok_s": cs, "cpu_decode_tok_s": cd,
        }));
    }
    let best = rows
        .iter()
        .filter_map(|r| r["gpu_score_gflops"].as_f64())
        .fold(0f64, f64::max);
    let blas_gflops = flops / blas_s / 1e9;
    Ok(json!({
        "stage": "throughput", "device": gpu.device(), "params": params(&gpu), "load_s": load_s,
        "weight_bytes_device": gpu.device_weight_bytes(),
        "rows": rows, "gemm": gemm,
        "gemm_vs_cublas_m512_2048": blas_s / ours_s,
        "cublas_gflops_m512_2048": blas_gflops,
        "score_gflops_vs_cublas": best / blas_gflops,
    }))
}

/// cuBLAS SGEMM (pedantic math: exact f32, no TF32) of `m` rows (each of `ms`) by an
/// `n` x `k` weight: the median of `reps` products each, timed by CUDA events.
fn cublas_sgemm_seconds(ms: &[usize], n: usize, k: usize, reps: usize) -> Res<Vec<f64>> {
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys};
    use cudarc::driver::CudaContext;
    use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    let ctx = CudaContext::new(0)?;
    let s = ctx.default_stream();
    let blas = CudaBlas::new(s.clone())?;
    // SAFETY: a valid handle; pedantic math forbids TF32 and other reduced-precision paths.
    unsafe {
        sys::cublasSetMathMode(*blas.handle(), sys::cublasMath_t::CUBLAS_PEDANTIC_MATH).result()?;
    }
    let max_m = ms.iter().copied().max().unwrap_or(1);
    let a = s.clone_htod(&vec![0.5f32; max_m * k])?;
    let w = s.clone_htod(&vec![0.25f32; n * k])?;
    let mut y = s.alloc_zeros::<f32>(max_m * n)?;
    let mut out = Vec::with_capacity(ms.len());
    for &m in ms {
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
        // SAFETY: buffers at least the sizes the configuration reads and writes.
        unsafe { blas.gemm(cfg, &w, &a, &mut y)? };
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = s.record_event(Some(CU_EVENT_DEFAULT))?;
            // SAFETY: as above.
            unsafe { blas.gemm(cfg, &w, &a, &mut y)? };
            let end = s.record_event(Some(CU_EVENT_DEFAULT))?;
            times.push(f64::from(start.elapsed_ms(&end)?) / 1e3);
        }
        times.sort_by(f64::total_cmp);
        out.push(times[times.len() / 2]);
    }
    Ok(out)
}

/// One HTTP/1.1 POST of a JSON body to a loopback server, its JSON answer (200 only).
fn post(addr: std::net::SocketAddr, path: &str, body: &Value) -> Res<Value> {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw)?;
    let (head, rest) = text.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{path}: {head}: {rest}").into());
    }
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        // chunks: a hex length line, the bytes, CRLF; a zero length ends them
        let (mut out, mut at) = (String::new(), rest);
        loop {
            let (len, after) = at.split_once("\r\n").ok_or("bad chunk")?;
            let n = usize::from_str_radix(len.trim(), 16)?;
            if n == 0 {
                break;
            }
            out.push_str(after.get(..n).ok_or("short chunk")?);
            at = after.get(n + 2..).ok_or("short chunk")?;
        }
        out
    } else {
        rest.to_owned()
    };
    Ok(serde_json::from_str(&body)?)
}

/// An answer without what differs between two servers by design (ids, timestamps).
fn comparable(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        for k in ["id", "created", "system_fingerprint"] {
            o.remove(k);
        }
    }
    v
}

/// The OpenAI API over the GPU engine against the same server over the CPU engine, both
/// in this process on loopback: the same requests (prompt logprobs echoed, greedy and
/// seeded-sampled completions with top-5, a chat completion, a forced tool call), then 8
/// completions sent to the GPU server at once (batched together) against the CPU server's
/// answers one at a time. Every body must be the same but for ids and timestamps.
fn serve(args: &[String]) -> Res<Value> {
    let model = PathBuf::from(arg(args, "--model").ok_or("--model")?);
    let threads = num(args, "--threads", 16)?;
    let dev: Device = arg(args, "--device").as_deref().unwrap_or("cuda").parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    let mut stops = Vec::new();
    let mut start = |device: Device| -> Res<std::net::SocketAddr> {
        let state = samewise_engine::server::ServerState::load(
            &model,
            LoadOptions {
                threads,
                device,
                ..LoadOptions::default()
            },
            Some("m".into()),
        )?;
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(samewise_engine::server::serve(listener, state, async {
            let _ = rx.await;
        }));
        stops.push(tx);
        Ok(addr)
    };
    let (gpu, cpu) = (start(dev)?, start(Device::Cpu)?);
    let tool = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]);
    let requests = [
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "The quick brown fox jumps over the lazy dog because",
            "max_tokens": 1, "echo": true, "logprobs": 5, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "Once upon a time",
            "max_tokens": 32, "logprobs": 5, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "A list of fruits:",
            "max_tokens": 24, "logprobs": 2, "temperature": 0.8, "seed": 7}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m",
            "messages": [{"role": "user", "content": "Name three colors."}],
            "max_tokens": 24, "logprobs": true, "top_logprobs": 5, "temperature": 0}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": tool, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 40, "temperature": 0}),
        ),
    ];
    let mut results = Vec::new();
    for (path, body) in &requests {
        let (g, c) = (post(gpu, path, body)?, post(cpu, path, body)?);
        results.push(json!({"path": path, "same": comparable(g) == comparable(c)}));
    }
    let batch: Vec<Value> = (0..8)
        .map(|i| {
            json!({"model": "m", "prompt": format!("Story number {i}: the"),
                        "max_tokens": 16 + 2 * i, "logprobs": 5, "temperature": 0})
        })
        .collect();
    let together = std::thread::scope(|sc| {
        let hs: Vec<_> = batch
            .iter()
            .map(|b| sc.spawn(move || post(gpu, "/v1/completions", b).map_err(|e| e.to_string())))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "a client thread panicked".to_string())?
            })
            .collect::<Result<Vec<Value>, String>>()
    })?;
    let mut batched_same = 0;
    for (b, g) in batch.iter().zip(together) {
        if comparable(g) == comparable(post(cpu, "/v1/completions", b)?) {
            batched_same += 1;
        }
    }
    for tx in stops {
        let _ = tx.send(());
    }
    let same = results.iter().filter(|r| r["same"] == json!(true)).count();
    Ok(json!({
        "stage": "serve", "device": dev.to_string(),
        "ok": same == results.len() && batched_same == batch.len(),
        "requests": results, "batched": batch.len(), "batched_same": batched_same,
    }))
}

/// The GEMM kernels' timings at `--m` rows on the model's shapes (for a profiler run).
fn gemm(args: &[String]) -> Res<Value> {
    let model = PathBuf::from(arg(args, "--model").ok_or("--model")?);
    let gpu = load(&model, Device::Cuda(0), num(args, "--threads", 16)?)?;
    let m = num(args, "--m", 2048)?;
    let timings: Vec<Value> = gpu
        .gpu_gemm_timings(m, num(args, "--reps", 3)?)?
        .iter()
        .map(|t| {
            json!({"n": t.n, "k": t.k, "kernel": t.kernel, "s": t.seconds,
                        "gflops": 2.0 * (m * t.n * t.k) as f64 / t.seconds / 1e9})
        })
        .collect();
    Ok(json!({"stage": "gemm", "m": m, "timings": timings}))
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
        Some("gemm") => gemm(&args),
        Some("serve") => serve(&args),
        _ => Err("usage: gpu_check smoke|parity|serve|throughput|gemm|synth [--model F] …".into()),
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
