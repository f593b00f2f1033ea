//! `samewise engine serve --model PATH --listen ADDR [--threads N] [--profile NAME|FILE]`:
//! runs the reference engine's OpenAI-compatible server on one model (a GGUF file or a
//! Hugging Face directory), optionally behaving like a drifting provider (a serving
//! profile: a built-in name or a TOML file; see the README's "Serving profiles").
//! SIGINT or SIGTERM stops accepting connections and lets open requests finish.
//!
//! `samewise engine synth --shape smol|1b|8b [--arch llama] [--seed N] [--type q4_1|q8_0|…]
//! [--layers N] --out FILE.gguf` writes a model of a real shape with seeded random weights and
//! a synthetic tokenizer; `samewise engine synth --from MODEL.gguf --layers N --out FILE.gguf`
//! cuts a real model to its first N layers (see `samewise_engine::synthesize`).
//!
//! The test model is fetched with `scripts/fetch-model.sh`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use samewise_engine::Profile;
use samewise_engine::server::{self, ServerState};
use samewise_engine::{Device, LoadOptions};

/// Arguments of `samewise engine`.
#[derive(Debug, Args)]
pub struct EngineArgs {
    #[command(subcommand)]
    pub command: EngineCommand,
}

/// Subcommands of `samewise engine`.
#[derive(Debug, Subcommand)]
pub enum EngineCommand {
    /// Serve a model over an OpenAI-compatible HTTP API.
    Serve(EngineServeArgs),
    /// Write a synthetic model (a real model's shape, seeded random weights) or a real model
    /// cut to its first layers, for throughput measurements.
    Synth(EngineSynthArgs),
}

/// Arguments of `samewise engine synth`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["shape", "from"])))]
pub struct EngineSynthArgs {
    /// The real model whose shape is written: smol (SmolLM2-135M), 1b (Llama-3.2-1B),
    /// 8b (Llama-3.1-8B).
    #[arg(long)]
    pub shape: Option<String>,
    /// Cut this GGUF model to its first --layers layers instead (tensors copied byte for byte).
    #[arg(long, requires = "layers", conflicts_with_all = ["arch", "seed", "weight_type", "threads"])]
    pub from: Option<PathBuf>,
    /// Architecture of a --shape model (only llama).
    #[arg(long, default_value = "llama")]
    pub arch: String,
    /// Seed of the random weights (the file is the same bytes for the same seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Type of the weight matrices: q4_1, q8_0, q4_0, f16, bf16, f32.
    #[arg(
        long = "type",
        id = "weight_type",
        value_name = "TYPE",
        default_value = "q4_1"
    )]
    pub weight_type: String,
    /// Write only the first N layers.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Generator threads (default: one per CPU; the bytes do not depend on it).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The GGUF file to write.
    #[arg(long)]
    pub out: PathBuf,
}

/// Arguments of `samewise engine serve`.
#[derive(Debug, Args)]
pub struct EngineServeArgs {
    /// The model: a GGUF file, or a directory with config.json, safetensors and tokenizer.json.
    #[arg(long)]
    pub model: PathBuf,
    /// Address to listen on (`127.0.0.1:0` picks a free port, printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// Kernel threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Name served in `/v1/models` and responses (default: the file name without extension).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Serving profile: a built-in name (reference, w8..w2, a8, kv-f16, kv-q8, truncate-512,
    /// truncate-1024, truncate-2048, tool-corrupt, repeat-bug, drop-system, no-logprobs,
    /// shifted-echo, flaky, substitute) or a TOML file.
    #[arg(long, default_value = "reference")]
    pub profile: String,
    /// Most prompts in one `/v1/completions` request.
    #[arg(long, default_value_t = 64)]
    pub max_prompts: usize,
    /// Most prompt tokens in one request, all prompts together (default: four context
    /// windows).
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,
    /// Where the forward pass runs: auto (GPU 0 when CUDA is usable, else the CPU, said in
    /// the log), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: Device,
    /// MiB of generation prompts' keys and values kept for later prompts that start alike
    /// (a shared system prompt or tool list is then read once); 0 keeps none.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(0..=1 << 20))]
    pub prefix_cache_mib: u32,
}

/// Runs an engine subcommand.
pub fn run(args: EngineArgs) -> anyhow::Result<()> {
    match args.command {
        EngineCommand::Serve(a) => serve(a),
        EngineCommand::Synth(a) => synth(a),
    }
}

fn synth(args: EngineSynthArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let report = match (&args.from, &args.shape) {
        (Some(from), _) => {
            let layers = args.layers.context("--from needs --layers")?;
            samewise_engine::cut_layers(from, layers, &args.out)?
        }
        (None, Some(shape)) => {
            let opts = samewise_engine::SynthOptions {
                arch: args.arch.clone(),
                shape: samewise_engine::SynthShape::parse(shape)?,
                seed: args.seed,
                ggml_type: samewise_engine::parse_weight_type(&args.weight_type)?,
                layers: args.layers,
                threads: args.threads.unwrap_or(0),
            };
            let size = opts.file_size()?;
            note!(
                "writing {}: {size} bytes ({:.2} GiB)",
                args.out.display(),
                size as f64 / f64::from(1u32 << 30)
            );
            samewise_engine::synthesize(&opts, &args.out)?
        }
        (None, None) => anyhow::bail!("give --shape or --from"),
    };
    outln!(
        "wrote {}: {} bytes, {} tensors, {} layers, in {:.1} s",
        report.path.display(),
        report.bytes,
        report.tensors,
        report.n_layer,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn serve(args: EngineServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.threads >= 1, "--threads must be at least 1");
    let profile = Profile::resolve(&args.profile)?;
    let profile_name = profile.name.clone();
    let opts = LoadOptions {
        threads: args.threads,
        profile,
        device: args.device,
        prefix_cache_bytes: (args.prefix_cache_mib as usize) << 20,
        ..LoadOptions::default()
    };
    let state = ServerState::load(&args.model, opts, args.model_name)
        .with_context(|| format!("cannot load model {}", args.model.display()))?;
    anyhow::ensure!(args.max_prompts >= 1, "--max-prompts must be at least 1");
    let defaults = state.limits();
    state.set_limits(server::ServerLimits {
        max_prompts: args.max_prompts,
        max_prompt_tokens: args.max_prompt_tokens.unwrap_or(defaults.max_prompt_tokens),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
        let local = listener.local_addr()?;
        tracing::info!(addr = %local, model = state.model_name(), threads = args.threads, profile = %profile_name, device = %state.engine().device(), "engine listening");
        // before the line below: a SIGTERM sent on reading it stops the engine cleanly
        let shutdown = super::shutdown_signal();
        // One line on stdout for scripts and tests that start the engine on port 0.
        outln!("listening on http://{local}");
        server::serve(listener, state, shutdown).await?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}
