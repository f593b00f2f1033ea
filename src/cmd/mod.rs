//! Subcommands of the `samewise` binary, one module each; `run` dispatches.
//!
//! Adding a subcommand: a module here with its clap `Args` struct and a `run(args)` function,
//! one variant in `Command`, one arm in `run`.

use std::path::{Path, PathBuf};

/// `println!` that does not panic when stdout is gone (`samewise alerts list | head`): a write
/// error returns from the enclosing function, and `main` leaves quietly on a closed pipe.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($t)*)?
    }};
}

/// `print!`, as [`outln`] is `println!`.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($t)*)?
    }};
}

/// `println!` for a run that must go on (and clean up) when stdout is gone: the demo's live
/// summary. A write error is dropped.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// `eprintln!` that drops a write error (a closed stderr, `2>&1 | head`): progress and error
/// lines are worth nothing then, and `eprintln!` would panic.
macro_rules! note {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// `print!`, as [`say`] is `println!`.
macro_rules! say_raw {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($t)*);
    }};
}

/// Rows under a header as an aligned text table, as the list commands print them: columns
/// two spaces apart, the last one unpadded, line breaks and tabs in a cell made spaces (a
/// cell's text never breaks its row).
pub(crate) fn text_table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|c| c.replace(['\n', '\r', '\t'], " "))
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (c, w) in cells.zip(&widths) {
            s.push_str(c);
            s.push_str(&" ".repeat(w - c.chars().count() + 2));
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for r in &rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

use clap::{Args, Subcommand};
use samewise_proxy::Config;
use samewise_store::{Store, StoreError};

pub mod alerts;
pub mod bodies;
pub mod calibrate;
pub mod config;
pub mod dashboards;
pub mod demo;
pub mod engine;
pub mod evals;
pub mod keys;
pub mod probes;
pub mod serve;

/// `--config` and `--data-dir`: where a command finds its configuration and the store
/// (PostgreSQL when `DATABASE_URL` is set, else SQLite in the data directory).
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The configuration file (the data directory, and what else the command reads of it).
    #[arg(long, short, global = true)]
    pub config: Option<PathBuf>,
    /// The data directory (default: the config's `server.data_dir`, else `samewise-data`).
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
}

impl StoreArgs {
    /// The configuration (with `--config`) and the data directory.
    pub fn resolve(&self) -> anyhow::Result<(Option<Config>, PathBuf)> {
        let config = self.config.as_deref().map(Config::load).transpose()?;
        let data_dir = match (&self.data_dir, &config) {
            (Some(d), _) => d.clone(),
            (None, Some(c)) => c.server.data_dir.clone(),
            (None, None) => PathBuf::from("samewise-data"),
        };
        Ok((config, data_dir))
    }
}

/// Opens the store that a gateway wrote, for a command that reads or changes it (`alerts`,
/// `bodies`, `keys list`, `evals show`): with SQLite its file must exist in `data_dir`, so a
/// wrong directory is an error that says where the gateway's data is set, not an empty answer.
pub async fn open_existing_store(data_dir: &Path) -> anyhow::Result<Store> {
    match Store::open_from_env(data_dir).await {
        Err(e @ StoreError::NoDatabase { .. }) => Err(anyhow::anyhow!(
            "{e}: the gateway creates it when it first starts; pass the gateway's --config or \
             its data directory (--data-dir), or set DATABASE_URL as the gateway has it"
        )),
        other => Ok(other?),
    }
}

/// Every subcommand of the binary.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (OpenAI-compatible proxy) from a configuration file.
    Serve(serve::ServeArgs),
    /// Check a configuration file.
    Config(config::ConfigArgs),
    /// Manage samewise API keys.
    Keys(keys::KeysArgs),
    /// The reference engine (`samewise engine serve --model PATH`).
    Engine(engine::EngineArgs),
    /// Drift alerts: list, acknowledge, resolve.
    Alerts(alerts::AlertsArgs),
    /// Drift probes (`samewise probes run --config FILE [--once | --rounds N]`).
    Probes(probes::ProbesArgs),
    /// Measure a model's calibration ladder (`samewise calibrate --model PATH [--out FILE]`).
    Calibrate(calibrate::CalibrateArgs),
    /// Eval jobs (`samewise evals run|worker|capture --config FILE`, `evals list|show|cases`).
    Evals(evals::EvalsArgs),
    /// Captured request bodies (`[models.NAME.capture]`): list, purge.
    Bodies(bodies::BodiesArgs),
    /// The whole loop on this machine: five endpoints of the test model (one faithful, one
    /// faithful with other kernels, three faulty), the gateway, probes, evals, dashboards and
    /// traffic, with a live summary.
    Demo(demo::DemoArgs),
}

/// Runs one subcommand to completion on a fresh tokio runtime where it needs one.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => serve::run(args),
        Command::Config(args) => config::run(args),
        Command::Keys(args) => keys::run(args),
        Command::Engine(args) => engine::run(args),
        Command::Alerts(args) => alerts::run(args),
        Command::Probes(args) => probes::run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Evals(args) => evals::run(args),
        Command::Bodies(args) => bodies::run(args),
        Command::Demo(args) => demo::run(args),
    }
}

/// Whether `err` is stdout's reader having gone away (a closed pipe): not worth a word.
pub fn is_closed_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `err` and its causes as one line, outermost first, separated by ": " like anyhow's `{:#}`,
/// but leaving out a cause whose text the line already ends with: most of our error types
/// write their source into their own message, and the line said it twice ("cannot read
/// config file x: No such file (os error 2): No such file (os error 2)").
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`), in colour only on a terminal (a
/// log file, journald or `docker logs` gets plain text, not escape codes); `samewise demo` logs
/// to a file of its own instead (the terminal is its summary's).
pub fn init_tracing(command: &Command) {
    use std::io::IsTerminal;
    if matches!(command, Command::Demo(_)) {
        return;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled: callers call it before they say they are ready ("listening on …"),
/// or a SIGTERM sent as soon as they say so finds no handler and kills the process with the
/// default action instead of draining it (seen: a gateway restarted by the crash test on a busy
/// machine exited "signal: 15"). Needs the Tokio runtime it runs on.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let listen = |kind: SignalKind, name: &str| {
        signal(kind)
            .inspect_err(|e| tracing::error!(error = %e, "cannot listen for {name}"))
            .ok()
    };
    async fn on(s: Option<Signal>) {
        match s {
            Some(mut s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    let (int, term) = (
        listen(SignalKind::interrupt(), "SIGINT"),
        listen(SignalKind::terminate(), "SIGTERM"),
    );
    async move {
        tokio::select! {
            () = on(int) => {},
            () = on(term) => {},
        }
        tracing::info!("shutdown signal received; finishing in-flight work");
    }
}

#[cfg(test)]
mod tests {
    use super::error_line;
    use anyhow::Context;

    #[test]
    fn an_error_line_says_each_cause_once() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        // a source the message already ends with is not repeated
        let read = samewise_proxy::ProxyError::ConfigRead {
            path: "x.toml".into(),
            source: missing,
        };
        let err = Err::<(), _>(read)
            .context("loading the gateway")
            .unwrap_err();
        assert_eq!(
            error_line(&err),
            "loading the gateway: cannot read config file x.toml: no such file"
        );
        // a source the message does not carry is still said
        let plain = std::io::Error::other("disk full");
        let err = Err::<(), _>(plain)
            .context("writing the ladder")
            .unwrap_err();
        assert_eq!(error_line(&err), "writing the ladder: disk full");
    }
}
