//! Subcommands of the `samewise` binary, one module each; `run` dispatches.
//!
//! Adding a subcommand: a module here with its clap `Args` struct and a `run(args)` function,
//! one variant in `Command`, one arm in `run`.

use clap::Subcommand;

/// Every subcommand of the binary.
#[derive(Debug, Subcommand)]
pub enum Command {}

/// Runs one subcommand to completion on a fresh tokio runtime where it needs one.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {}
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
