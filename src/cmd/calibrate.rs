//! `samewise calibrate --model PATH [--out FILE] [--corpus DIR]`: measures the model's
//! calibration ladder — the reference engine under weights re-quantized to 8, 6, 5, 4, 3, 2
//! bits and under 8-bit activations, each scored against the unmodified engine over a fixed
//! corpus — and writes it as JSON (the format of `samewise_probes::ladder`). The built-in
//! corpus is `probes/data/calibration/` (compiled in); progress and the wall time go to stderr.

use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use samewise_probes::calibrate::{self, CalibrateOptions};
use sha2::{Digest, Sha256};

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
    eprintln!(
        "calibrate: {} texts, {total} positions, levels {}",
        corpus.len(),
        args.levels.join(", ")
    );
    let sha = model_sha256(&args.model)?;
    let name = args.model_name.clone().unwrap_or_else(|| {
        args.model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
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
            eprintln!(
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
        None => print!("{json}"),
    }
    eprintln!(
        "calibrate: done in {:.1} s wall",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// sha256 of the weights: the GGUF file, or every file of an HF directory in name order.
fn model_sha256(path: &std::path::Path) -> anyhow::Result<String> {
    let mut files = Vec::new();
    if path.is_dir() {
        for e in
            std::fs::read_dir(path).with_context(|| format!("cannot read {}", path.display()))?
        {
            let p = e?.path();
            if p.is_file() && p.extension().is_some_and(|x| x == "safetensors") {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let mut file =
            std::fs::File::open(&f).with_context(|| format!("cannot open {}", f.display()))?;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    Ok(format!("{:x}", h.finalize()))
}
