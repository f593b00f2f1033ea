//! The `samewise` binary: command-line parsing and composition only.
//!
//! Each subcommand lives in its own module under `src/cmd/` and builds the library parts it
//! needs from configuration; no product logic lives here.

mod cmd;

use std::io::Write as _;

use clap::Parser;

/// samewise keeps LLM endpoints honest: an OpenAI-compatible aggregation proxy that checks
/// every provider against the reference weights.
#[derive(Debug, Parser)]
#[command(name = "samewise", version, about)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cmd::init_tracing(&cli.command);
    match cmd::run(cli.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `samewise alerts list | head`: the reader has what it wanted
        Err(err) if cmd::is_closed_pipe(&err) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // not eprintln!, which panics when stderr is gone
            let _ = writeln!(std::io::stderr(), "error: {}", cmd::error_line(&err));
            std::process::ExitCode::FAILURE
        }
    }
}
