//! `samewise demo`: the whole loop on one machine, in one process. It fetches the test model
//! if it is missing, serves it as five endpoints under serving profiles (faithful, `a8`,
//! 4-bit weights, tool-call corruption, silent truncation: `samewise_demo::scenario`) plus
//! the reference the evals compare against, starts the gateway in front of them with the
//! probes, eval workers and dashboards (`serve::serve_on`, exactly what `samewise serve`
//! runs, on the configuration written to `<data-dir>/demo.toml`), sends a realistic traffic
//! mix through it, and prints a live summary read from the dashboards' API.
//!
//! Ctrl-C (or `--minutes`) stops the traffic, then the gateway (which drains in-flight
//! requests, the probe scheduler, the eval workers and the record queue), then the engines;
//! the store is checked (`Store::integrity_check`) and the demo's keys are revoked. Each run
//! starts clean on SQLite (the previous run's database in the data directory is deleted)
//! unless `--resume`; with `DATABASE_URL` it always resumes (it never deletes a server's
//! data).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use samewise_demo::scenario::{self, ENDPOINTS, Setup, Sizes};
use samewise_demo::summary::{self, Overview};
use samewise_demo::traffic::{Traffic, TrafficConfig};
use samewise_engine::Profile;
use samewise_engine::server::{self, ServerState};
use samewise_engine::{Engine, LoadOptions};
use samewise_proxy::Config;
use samewise_store::{KeyOptions, Store};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Arguments of `samewise demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Stop after this many minutes (default: run until Ctrl-C).
    #[arg(long)]
    pub minutes: Option<f64>,
    /// The gateway and dashboard address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Where the demo keeps its SQLite database, configuration and log.
    #[arg(long, default_value = ".samewise-demo")]
    pub data_dir: PathBuf,
    /// Keep the previous run's SQLite database instead of starting clean.
    #[arg(long)]
    pub resume: bool,
    /// Seconds between summary tables (events print as they happen).
    #[arg(long, default_value_t = 30)]
    pub refresh_s: u64,
    /// Concurrent clients of the traffic generator.
    #[arg(long)]
    pub clients: Option<usize>,
    /// Seconds between probe rounds of one kind on one endpoint.
    #[arg(long)]
    pub probe_interval_s: Option<u64>,
    /// Items per eval job opened by an alert.
    #[arg(long)]
    pub eval_items: Option<u64>,
    /// Kernel threads of each loaded engine.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// Runs the demo until Ctrl-C, SIGTERM or `--minutes`.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=64).contains(&args.threads),
        "--threads must be within 1..=64"
    );
    // bounded so that no deadline, interval or client count can overflow or exhaust anything
    if let Some(m) = args.minutes {
        anyhow::ensure!(
            m.is_finite() && m > 0.0 && m <= 10_080.0,
            "--minutes must be a positive number of at most 10080 (7 days)"
        );
    }
    anyhow::ensure!(
        (1..=3_600).contains(&args.refresh_s),
        "--refresh-s must be within 1..=3600"
    );
    if let Some(c) = args.clients {
        anyhow::ensure!((1..=64).contains(&c), "--clients must be within 1..=64");
    }
    if let Some(s) = args.probe_interval_s {
        anyhow::ensure!(
            (5..=86_400).contains(&s),
            "--probe-interval-s must be within 5..=86400"
        );
    }
    if let Some(n) = args.eval_items {
        anyhow::ensure!(
            (1..=10_000).contains(&n),
            "--eval-items must be within 1..=10000"
        );
    }
    let started = Instant::now();
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = args
        .data_dir
        .canonicalize()
        .with_context(|| format!("resolving {}", args.data_dir.display()))?;
    let log = init_log(&data_dir)?;
    let postgres = std::env::var("DATABASE_URL").is_ok_and(|u| !u.trim().is_empty());
    if postgres {
        say!("store: PostgreSQL from DATABASE_URL (resuming what it holds)");
    } else if args.resume {
        say!(
            "store: SQLite in {} (resuming the previous run)",
            data_dir.display()
        );
    } else {
        clean_sqlite(&data_dir)?;
        say!("store: SQLite in {} (started clean)", data_dir.display());
    }
    let model = samewise_demo::model::ensure()?;
    let ladder = data_dir.join("ladder.json");
    std::fs::write(&ladder, samewise_probes::ladder::SMOLLM2_135M_INSTRUCT_Q4_1)
        .with_context(|| format!("writing {}", ladder.display()))?;
    let mut sizes = Sizes::default();
    if let Some(c) = args.clients {
        sizes.clients = c;
    }
    if let Some(s) = args.probe_interval_s {
        sizes.probe_interval_ms = s * 1000;
    }
    if let Some(n) = args.eval_items {
        sizes.eval_items = n;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(demo(&args, &data_dir, &model, &ladder, &sizes, started));
    say!("log: {}", log.display());
    result
}

/// Logs go to `<data-dir>/demo.log` (the terminal is the summary's), filtered by `RUST_LOG`
/// (default `info`).
fn init_log(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let path = data_dir.join("demo.log");
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(Arc::new(file))
        .try_init();
    Ok(path)
}

/// Deletes the demo's SQLite database (and its WAL files) from the data directory.
fn clean_sqlite(data_dir: &Path) -> anyhow::Result<()> {
    let db = samewise_store::DEFAULT_SQLITE_FILE;
    for suffix in ["", "-wal", "-shm"] {
        let p = data_dir.join(format!("{db}{suffix}"));
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("deleting {}", p.display())));
            }
        }
    }
    Ok(())
}

/// One engine server: `(provider, base URL)`.
struct Served {
    provider: &'static str,
    url: String,
}

/// Loads the engines (one per distinct set of numeric knobs: the behavioural faults share
/// the reference's weights and kernels) and serves every endpoint and the evals' reference
/// on its own loopback port.
async fn start_engines(
    model: &Path,
    threads: usize,
    stop: &CancellationToken,
    tasks: &TaskTracker,
) -> anyhow::Result<(Vec<Served>, String)> {
    let load = |profile: &str| -> anyhow::Result<Arc<Engine>> {
        let profile = Profile::resolve(profile)?;
        let opts = LoadOptions {
            threads,
            profile,
            ..LoadOptions::default()
        };
        Ok(Arc::new(Engine::load(model, opts).with_context(|| {
            format!("loading {} for the demo", model.display())
        })?))
    };
    let reference = load("reference")?;
    let mut served = Vec::new();
    let mut reference_url = String::new();
    // the evals' reference first, then the endpoints in scenario order
    let plan = std::iter::once(("reference", "reference"))
        .chain(ENDPOINTS.iter().map(|e| (e.provider, e.profile)));
    let mut numeric: Vec<(&str, Arc<Engine>)> = vec![("reference", reference)];
    for (provider, profile_name) in plan {
        let profile = Profile::resolve(profile_name)?;
        // a profile with numeric knobs (weights, activations, KV cache) needs its own engine
        let numeric_name = if profile.changes_numerics() {
            profile_name
        } else {
            "reference"
        };
        let engine = match numeric.iter().find(|(n, _)| *n == numeric_name) {
            Some((_, e)) => e.clone(),
            None => {
                let e = load(numeric_name)?;
                numeric.push((numeric_name, e.clone()));
                e
            }
        };
        let (tokenizer, template) = samewise_engine::chat::load_tokenizer_and_template(model)?;
        let state = ServerState::with_profile(
            engine,
            tokenizer,
            template,
            scenario::SERVED_AS.to_owned(),
            profile,
        )?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let s = stop.clone();
        tasks.spawn(async move {
            if let Err(e) = server::serve(listener, state, s.cancelled_owned()).await {
                tracing::error!(provider, error = %e, "demo engine stopped");
            }
        });
        tracing::info!(provider, profile = profile_name, url = %url, "demo endpoint serving");
        if provider == "reference" {
            reference_url = url;
        } else {
            served.push(Served { provider, url });
        }
    }
    Ok((served, reference_url))
}

async fn demo(
    args: &DemoArgs,
    data_dir: &Path,
    model: &Path,
    ladder: &Path,
    sizes: &Sizes,
    started: Instant,
) -> anyhow::Result<()> {
    // the user's address first: a taken port fails before minutes of loading
    let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| {
        format!(
            "cannot listen on {} (is another samewise running? pick another address with --listen)",
            args.listen
        )
    })?;
    say!(
        "loading the test model as 5 endpoints + the reference ({})",
        model.display()
    );
    let engines_stop = CancellationToken::new();
    let engines = TaskTracker::new();
    let (served, reference_url) =
        start_engines(model, args.threads, &engines_stop, &engines).await?;
    let stop_engines = || async {
        engines_stop.cancel();
        engines.close();
        engines.wait().await;
    };
    let setup = Setup {
        engines: served.iter().map(|s| (s.provider, s.url.clone())).collect(),
        reference_url: &reference_url,
        model_path: model,
        ladder_path: ladder,
        data_dir,
        listen: args.listen,
    };
    let config_path = data_dir.join("demo.toml");
    std::fs::write(&config_path, scenario::config_toml(&setup, sizes))
        .with_context(|| format!("writing {}", config_path.display()))?;
    let config = match Config::load(&config_path) {
        Ok(c) => c,
        Err(e) => {
            stop_engines().await;
            return Err(e.into());
        }
    };
    let store = match Store::connect_from_env(data_dir).await {
        Ok(s) => s,
        Err(e) => {
            stop_engines().await;
            return Err(e.into());
        }
    };
    let stamp = samewise_store::now_ms();
    let keys = async {
        let (admin, admin_key) = store
            .create_api_key_with(
                &format!("demo-admin-{stamp}"),
                KeyOptions {
                    admin: true,
                    rpm_limit: None,
                },
            )
            .await?;
        let (user, user_key) = store
            .create_api_key(&format!("demo-traffic-{stamp}"), None)
            .await?;
        anyhow::Ok(((admin.name, admin_key), (user.name, user_key)))
    };
    let ((admin_name, admin_key), (user_name, user_key)) = match keys.await {
        Ok(k) => k,
        Err(e) => {
            store.close().await;
            stop_engines().await;
            return Err(e);
        }
    };
    let local = listener.local_addr()?;
    let base = format!("http://{local}");
    let gateway_stop = CancellationToken::new();
    let gateway = {
        let (config, store, stop) = (config.clone(), store.clone(), gateway_stop.clone());
        tokio::spawn(async move {
            super::serve::serve_on(&config, store, listener, stop.cancelled_owned()).await
        })
    };
    // from the line below on, Ctrl-C stops the demo in order (a signal before it still ends
    // the process at once: loading the engines is not worth waiting for)
    let interrupted = super::shutdown_signal();
    say!("listening on {base}");
    say!();
    say!("  dashboard  {base}/   (admin key: {admin_key})");
    say!(
        "  gateway    {base}/v1/chat/completions   (model \"{}\", key: {user_key})",
        scenario::MODEL
    );
    say!("  config     {}", config_path.display());
    say!();
    for e in &ENDPOINTS {
        say!("  {:<13} {}", e.id(), e.story);
    }
    say!();
    let traffic = Traffic::spawn(TrafficConfig {
        base_url: base.clone(),
        key: user_key,
        model: scenario::MODEL.to_owned(),
        clients: sizes.clients,
        seed: stamp as u64,
    });
    let overview = Overview::new(&base, &admin_key, scenario::MODEL);
    let deadline = args
        .minutes
        .map(|m| started + Duration::from_secs_f64(m * 60.0));
    let watched = watch(
        &overview,
        &traffic,
        started,
        deadline,
        Duration::from_secs(args.refresh_s),
    );
    tokio::select! {
        () = watched => say!("\n{} — time is up, stopping", clock(started)),
        () = interrupted => say!("\n{} — stopping", clock(started)),
    }
    // the final picture, while the gateway still answers
    if let Ok(rows) = overview.rows().await {
        say_raw!("{}", summary::table(&rows));
    }
    traffic.shutdown().await;
    print_traffic(&traffic);
    gateway_stop.cancel();
    let served = gateway.await;
    stop_engines().await;
    // the gateway closed its store; check what it left and revoke the demo's keys
    let store = Store::connect_from_env(data_dir).await?;
    let problems = store.integrity_check().await?;
    for name in [&admin_name, &user_name] {
        store.revoke_api_key(name).await?;
    }
    store.close().await;
    if problems.is_empty() {
        say!(
            "store: consistent ({} integrity check passed); the demo's keys are revoked",
            store.backend()
        );
    } else {
        say!(
            "store: {} problem(s): {}",
            problems.len(),
            problems.join("; ")
        );
    }
    match served {
        Ok(r) => r?,
        Err(e) => anyhow::bail!("the gateway task failed: {e}"),
    }
    anyhow::ensure!(problems.is_empty(), "the store failed its integrity check");
    say!("stopped after {}", clock(started));
    Ok(())
}

/// `mm:ss` since the start.
fn clock(started: Instant) -> String {
    let s = started.elapsed().as_secs();
    format!("{:02}:{:02}", s / 60, s % 60)
}

fn print_traffic(traffic: &Traffic) {
    let snap = traffic.stats.snapshot();
    let (sent, ok, failed) = snap
        .iter()
        .fold((0, 0, 0), |(a, b, c), s| (a + s.1, b + s.2, c + s.3));
    let parts: Vec<String> = snap
        .iter()
        .map(|(n, s, _, f)| match f {
            0 => format!("{n} {s}"),
            f => format!("{n} {s} ({f} failed)"),
        })
        .collect();
    say!(
        "traffic: {sent} requests ({}): {ok} answered, {failed} failed, {} in flight at the stop",
        parts.join(", "),
        sent - ok - failed
    );
}

/// Prints events as they happen and the table every `every`, until `deadline` (forever
/// without one).
async fn watch(
    overview: &Overview,
    traffic: &Traffic,
    started: Instant,
    deadline: Option<Instant>,
    every: Duration,
) {
    let mut before: Vec<summary::Row> = Vec::new();
    let mut next_table = Instant::now() + Duration::from_secs(5);
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rows = match overview.rows().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "demo summary: the overview API failed");
                continue;
            }
        };
        for line in summary::events(&before, &rows) {
            say!("{} {line}", clock(started));
        }
        if Instant::now() >= next_table {
            say!(
                "\n{} · traffic {} requests",
                clock(started),
                traffic.stats.snapshot().iter().map(|s| s.1).sum::<u64>()
            );
            say_raw!("{}", summary::table(&rows));
            next_table = Instant::now() + every;
        }
        before = rows;
    }
}
