//! `samewise engine serve --model PATH --listen ADDR [--threads N] [--profile NAME|FILE]`:
//! runs the reference engine's OpenAI-compatible server on one model (a GGUF file or a
//! Hugging Face directory), optionally behaving like a drifting provider (a serving
//! profile: a built-in name or a TOML file; see the README's "Serving profiles").
//! SIGINT or SIGTERM stops accepting connections and lets open requests finish.
//!
//! The test model is fetched with `scripts/fetch-model.sh`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use samewise_engine::LoadOptions;
use samewise_engine::Profile;
use samewise_engine::server::{self, ServerState};

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
}

/// Runs an engine subcommand.
pub fn run(args: EngineArgs) -> anyhow::Result<()> {
    match args.command {
        EngineCommand::Serve(a) => serve(a),
    }
}

fn serve(args: EngineServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.threads >= 1, "--threads must be at least 1");
    let profile = Profile::resolve(&args.profile)?;
    let profile_name = profile.name.clone();
    let opts = LoadOptions {
        threads: args.threads,
        profile,
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
        tracing::info!(addr = %local, model = state.model_name(), threads = args.threads, profile = %profile_name, "engine listening");
        // One line on stdout for scripts and tests that start the engine on port 0.
        println!("listening on http://{local}");
        server::serve(listener, state, super::shutdown_signal()).await?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}
