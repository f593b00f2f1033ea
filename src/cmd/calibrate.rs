//! `samewise calibrate --model PATH [--out FILE] [--corpus DIR]`: measures the model's
//! calibration ladder — the reference engine under weights re-quantized to 8, 6, 5, 4, 3, 2
//! bits and under 8-bit activations, each scored against the unmodified engine over a fixed
//! corpus — and writes it as JSON (the format of `samewise_probes::ladder`). The built-in
//! corpus is `probes/data/calibration/` (compiled in); progress and the wall time go to stderr.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use samewise_probes::calibrate::{self, CalibrateOptions};

/// Arguments of `samewise calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The model: a GGUF file or an HF directory (config.json + safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Where to write the ladder JSON (default: standard output).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A directory of `.txt` files to score instead of the built-in corpus.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Kernel threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// k of the top-k statistics (the probes' `top_k`).
    #[arg(long, default_value_t = calibrate::DEFAULT_TOP_K)]
    pub top_k: usize,
    /// Levels to measure, comma-separated built-in profile names.
    #[arg(long, value_delimiter = ',', default_values_t = calibrate::DEFAULT_LEVELS.iter().map(|s| (*s).to_owned()))]
    pub levels: Vec<String>,
    /// Model name recorded in the ladder (default: the file or directory name without extension).
    #[arg(long)]
    pub model_name: Option<String>,
}

/// Runs `samewise calibrate`.
pub fn run(args: CalibrateArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.threads >= 1, "--threads must be at least 1");
    let start = Instant::now();
    let (corpus, corpus_name) = match &args.corpus {
        Some(dir) => (calibrate::read_corpus(dir)?, dir.display().to_string()),
        None => (
            calibrate::builtin_corpus(),
            calibrate::BUILTIN_CORPUS_NAME.to_owned(),
        ),
    };
    let seqs = calibrate::tokenize_corpus(&args.model, &corpus)?;
    let total: usize = seqs.iter().map(|s| s.len().saturating_sub(1)).sum();
    note!(
        "calibrate: {} texts, {total} positions, levels {}",
        corpus.len(),
        args.levels.join(", ")
    );
    let (name, sha) = calibrate::model_identity(&args.model, args.model_name.clone())?;
    let opts = CalibrateOptions {
        threads: args.threads,
        top_k: args.top_k,
        levels: args.levels.clone(),
        max_tokens_per_text: None,
    };
    let ladder = calibrate::calibrate(
        &args.model,
        &name,
        &sha,
        &corpus_name,
        &seqs,
        &opts,
        &mut |p| {
            note!(
                "calibrate: {}/{} texts, {} positions, {:.0} s",
                p.texts_done,
                p.texts,
                p.positions,
                start.elapsed().as_secs_f64()
            );
        },
    )?;
    let json = serde_json::to_string_pretty(&ladder)? + "\n";
    match &args.out {
        Some(path) => std::fs::write(path, json)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => out!("{json}"),
    }
    note!(
        "calibrate: done in {:.1} s wall",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
