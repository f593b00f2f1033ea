//! Helpers shared by the end-to-end tests that start the real `samewise` binary: where the
//! test model is, the store a gateway on either backend uses, and child processes that print "listening on URL" and are stopped with
//! SIGTERM (or killed when dropped, so a failing test leaves none behind).

#![allow(dead_code)]

pub mod probes;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, Store};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_samewise");

/// The store a `samewise serve` on `backend` with `data_dir = data` uses, opened by the test: on
/// PostgreSQL a fresh database on the shared server (dropped with the [`TestDb`]; its URL is the
/// gateway's `DATABASE_URL`), on SQLite the file in `data`, as the gateway opens it without one.
pub async fn gateway_store(backend: Backend, data: &Path) -> Result<(Store, Option<TestDb>)> {
    let pg = match backend {
        Backend::Postgres => Some(TestDb::postgres().await?),
        Backend::Sqlite => None,
    };
    let store = Store::connect(pg.as_ref().map(TestDb::url), data).await?;
    Ok((store, pg))
}

/// The text of the gateway at `url`'s `/metrics` (Prometheus' text format).
pub async fn scrape(client: &reqwest::Client, url: &str) -> Result<String> {
    Ok(client
        .get(format!("{url}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// The test model: `$SAMEWISE_MODEL`, else where `scripts/fetch-model.sh` puts it. Missing is
/// an error (a test that needs the model fails without it; it never skips).
pub fn test_model() -> Result<PathBuf> {
    Ok(samewise_testkit::fixtures::test_model()?)
}

/// A child process killed (SIGTERM, then SIGKILL) when dropped, so a failing test leaves none.
pub struct Proc(Option<Child>);

impl Proc {
    /// Sends SIGTERM and waits up to 30 s for the exit status (then kills it and errs).
    pub fn stop(mut self) -> Result<ExitStatus> {
        let mut child = self.0.take().context("already stopped")?;
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = child.try_wait()? {
                return Ok(s);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                anyhow::bail!("did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Proc {
    /// The process id (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }

    /// Sends SIGKILL (no drain, no flush: a crash) and waits for the exit status.
    pub fn kill(mut self) -> Result<ExitStatus> {
        let mut child = self.0.take().context("already stopped")?;
        child.kill()?;
        Ok(child.wait()?)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `samewise ARGS` to its end in `cwd` (no `DATABASE_URL`, so SQLite): its stdout, or an
/// error with its stderr when it fails.
pub fn run_ok<S: AsRef<OsStr> + std::fmt::Debug>(args: &[S], cwd: &Path) -> Result<String> {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("DATABASE_URL")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "samewise {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// `samewise keys create NAME --config CFG [--admin]` in `cwd`: the new key.
pub fn create_key(cfg: &Path, cwd: &Path, name: &str, admin: bool) -> Result<String> {
    let mut args = vec![
        "keys".as_ref(),
        "create".as_ref(),
        name.as_ref(),
        "--config".as_ref(),
    ];
    args.push(cfg.as_os_str());
    if admin {
        args.push("--admin".as_ref());
    }
    Ok(run_ok::<&OsStr>(&args, cwd)?.trim().to_owned())
}

/// Spawns `samewise ARGS` in `cwd` (no `DATABASE_URL`, so SQLite) and returns it with the URL
/// of its first line, "listening on URL" (waited for up to 120 s: an engine loads its model
/// first). Its stdout keeps being drained so it never blocks on a full pipe.
pub fn spawn_listening<S: AsRef<OsStr> + std::fmt::Debug>(
    args: &[S],
    cwd: &Path,
) -> Result<(Proc, String)> {
    spawn_listening_with(args, cwd, &Spawn::default())
}

/// Starts `samewise ARGS` in `cwd` (no `DATABASE_URL`, so SQLite; `RUST_LOG=info`), its
/// stdout and stderr appended to `log`, for a command that prints no listening line.
pub fn spawn_logged<S: AsRef<OsStr> + std::fmt::Debug>(
    args: &[S],
    cwd: &Path,
    log: &Path,
) -> Result<Proc> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let child = Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "info")
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting samewise {args:?}"))?;
    Ok(Proc(Some(child)))
}

/// What [`spawn_listening_with`] adds to a plain spawn.
#[derive(Debug, Default)]
pub struct Spawn<'a> {
    /// Environment variables set for the child (`DATABASE_URL` among them, else it is unset).
    pub env: Vec<(&'a str, String)>,
    /// `RUST_LOG` (default `warn`).
    pub log_level: Option<&'a str>,
    /// Where stdout (after the first line) and stderr are appended; discarded when `None`.
    pub log: Option<PathBuf>,
}

/// As [`spawn_listening`], with environment variables and the output kept in a file.
pub fn spawn_listening_with<S: AsRef<OsStr> + std::fmt::Debug>(
    args: &[S],
    cwd: &Path,
    opts: &Spawn<'_>,
) -> Result<(Proc, String)> {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", opts.log_level.unwrap_or("warn"))
        .stdout(Stdio::piped());
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    let mut log = match &opts.log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        ),
        None => None,
    };
    match &log {
        Some(f) => cmd.stderr(f.try_clone()?),
        None => cmd.stderr(Stdio::null()),
    };
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let proc = Proc(Some(child));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            if let Some(f) = log.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            let _ = tx.send(line);
        }
        for line in lines.map_while(Result::ok) {
            if let Some(f) = log.as_mut() {
                let _ = writeln!(f, "{line}");
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|_| anyhow::anyhow!("samewise {args:?} printed no 'listening on' line"))?;
    let url = line
        .strip_prefix("listening on ")
        .context("unexpected first line")?
        .to_owned();
    Ok((proc, url))
}
