//! `samewise probes run --config FILE [--once]`: the drift-probe scheduler on its own, and
//! the pieces `samewise serve` uses to run it beside the gateway ([`start`]).
//!
//! The probes configuration lives in the gateway's file (`[probes]`, `[models.NAME.probes]`);
//! endpoints are called exactly as the proxy calls them: the provider's `base_url`, the key
//! from its `api_key_env`, the provider's model id, labelled `provider/model` as the proxy
//! records them. With `--rounds N` (`--once` is `--rounds 1`), N rounds of every enabled kind
//! on every endpoint run back to back (the database lock is still required), one line per
//! stored run and a summary of the open alerts are printed, and the command exits; otherwise
//! the scheduler runs on its schedule until SIGINT/SIGTERM, with the `[retention]` task
//! `samewise serve` runs (so a scheduler without a gateway does not grow its store for ever).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use samewise_probes::ProbesConfig;
use samewise_probes::detect::Detectors;
use samewise_probes::kinds::Target;
use samewise_probes::runner::{RoundResult, Scheduler};
use samewise_proxy::Config;
use samewise_store::Store;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Arguments of `samewise probes`.
#[derive(Debug, Args)]
pub struct ProbesArgs {
    #[command(subcommand)]
    pub command: ProbesCommand,
}

/// `samewise probes` subcommands.
#[derive(Debug, Subcommand)]
pub enum ProbesCommand {
    /// Run the probe scheduler (without the gateway).
    Run {
        /// The gateway configuration file (TOML) with `[probes]`.
        #[arg(long, short)]
        config: PathBuf,
        /// One round of every enabled kind on every endpoint, print a summary, exit
        /// (the same as `--rounds 1`).
        #[arg(long, conflicts_with = "rounds")]
        once: bool,
        /// Run this many rounds back to back (round numbers 0..N, so prompt windows rotate
        /// and noise-floor pairs fall as on the schedule), print a summary, exit.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: Option<u64>,
    },
}

/// The typed probes configuration of a gateway config, None without `[probes]`.
pub fn probes_config(config: &Config) -> anyhow::Result<Option<ProbesConfig>> {
    let Some(probes) = &config.probes else {
        anyhow::ensure!(
            config.models.values().all(|m| m.probes.is_none()),
            "models have `probes` tables but there is no [probes] section (the reference backend)"
        );
        return Ok(None);
    };
    let models = config
        .models
        .iter()
        .filter_map(|(name, m)| m.probes.clone().map(|p| (name.clone(), p)))
        .collect();
    Ok(Some(ProbesConfig::parse(probes, &models)?))
}

/// How the reference backend reads in a summary line.
pub fn reference_label(p: &ProbesConfig) -> String {
    use samewise_probes::ReferenceConfig;
    match &p.reference {
        None if p.models.is_empty() => "none (passive detectors and alerts only)".to_owned(),
        None => "none (fingerprint probes, passive detectors and alerts)".to_owned(),
        Some(ReferenceConfig::InProcess { model, .. }) => {
            format!("in-process ({})", model.display())
        }
        Some(ReferenceConfig::Remote { url, .. }) => format!("remote ({url})"),
        Some(ReferenceConfig::External { url, flavour, .. }) => {
            format!("external {flavour:?} ({url})")
        }
    }
}

/// The endpoints of every probed model, as the proxy calls them.
pub fn targets(config: &Config, probes: &ProbesConfig) -> anyhow::Result<Vec<Target>> {
    if let Some(name) = probes
        .models
        .keys()
        .find(|n| !config.models.contains_key(*n))
    {
        anyhow::bail!("models.{name}.probes: no such model");
    }
    Ok(config
        .endpoint_targets(|m| probes.models.contains_key(m))?
        .into_iter()
        .map(|t| Target {
            model: t.model,
            endpoint: t.endpoint.into_string(),
            base_url: t.base_url,
            provider_model: t.provider_model,
            api_key: t.api_key,
        })
        .collect())
}

/// The scheduler running beside the gateway: stop it with [`ProbesHandle::shutdown`].
#[derive(Debug)]
pub struct ProbesHandle {
    stop: CancellationToken,
    tasks: TaskTracker,
    detectors: Arc<Detectors>,
}

impl ProbesHandle {
    /// Stops the scheduler, waits for its tasks and pending webhook deliveries.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        self.detectors.shutdown().await;
    }
}

async fn build(
    config: &Config,
    probes: ProbesConfig,
    store: Store,
) -> anyhow::Result<(Arc<Scheduler>, Arc<Detectors>)> {
    let targets = targets(config, &probes)?;
    let detectors = Arc::new(Detectors::from_config(&probes)?);
    let reference = match &probes.reference {
        Some(r) => Some(
            samewise_probes::reference::connect(r)
                .await
                .context("starting the probes' reference")?,
        ),
        None => None,
    };
    let scheduler = Scheduler::new(
        Arc::new(probes),
        store,
        reference,
        Some(detectors.clone()),
        targets,
    )?;
    Ok((Arc::new(scheduler), detectors))
}

/// Starts the scheduler in the background when `[probes]` is configured (inside `samewise
/// serve`). It never touches the request path.
pub async fn start(config: &Config, store: Store) -> anyhow::Result<Option<ProbesHandle>> {
    let Some(probes) = probes_config(config)? else {
        return Ok(None);
    };
    let (scheduler, detectors) = build(config, probes, store).await?;
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    tasks.spawn(scheduler.run(stop.clone()));
    Ok(Some(ProbesHandle {
        stop,
        tasks,
        detectors,
    }))
}

/// Runs `samewise probes ...`.
pub fn run(args: ProbesArgs) -> anyhow::Result<()> {
    match args.command {
        ProbesCommand::Run {
            config,
            once,
            rounds,
        } => {
            let config = Config::load(&config)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let rounds = if once { Some(1) } else { rounds };
            runtime.block_on(run_probes(config, rounds))
        }
    }
}

async fn run_probes(config: Config, rounds: Option<u64>) -> anyhow::Result<()> {
    let probes = probes_config(&config)?.context("the configuration has no [probes] section")?;
    let store = Store::connect_from_env(&config.server.data_dir).await?;
    let result = async {
        let (scheduler, detectors) = build(&config, probes, store.clone()).await?;
        let r = match rounds {
            Some(n) => run_rounds(&store, &scheduler, &config, n).await,
            None => run_forever(scheduler, &store, &config).await,
        };
        detectors.shutdown().await;
        r
    }
    .await;
    store.close().await;
    result
}

/// `--rounds N`: N rounds back to back under the scheduler lock, one line per stored run,
/// then one line per open alert of the probed endpoints (of every endpoint of `config` when
/// none is probed: the passive detectors' sweep watches them all).
async fn run_rounds(
    store: &Store,
    scheduler: &Scheduler,
    config: &Config,
    rounds: u64,
) -> anyhow::Result<()> {
    let lock = store
        .try_scheduler_lock()
        .await?
        .context("another process holds the probe scheduler lock of this database")?;
    let mut stored = 0usize;
    for round in 0..rounds {
        for r in scheduler.run_once(round).await? {
            match r {
                RoundResult::OverBudget { spent } => {
                    outln!("round {round}: skipped: hourly token budget spent ({spent} tokens)")
                }
                RoundResult::Stored(runs) => {
                    for run in runs {
                        stored += 1;
                        let verdict = if run.ok { "ok" } else { "failed" };
                        let pair = run
                            .repeat_of
                            .map(|id| format!(" (repeat of #{id})"))
                            .unwrap_or_default();
                        outln!(
                            "#{} {} {} {verdict}{pair} tokens={} {}",
                            run.id,
                            run.endpoint,
                            run.kind,
                            run.tokens,
                            run.error.as_deref().unwrap_or(&run.stats.to_string())
                        );
                    }
                }
            }
        }
    }
    lock.release().await?;
    let endpoints: std::collections::BTreeSet<String> = if scheduler.targets().is_empty() {
        let all = config.models.values().flat_map(|m| &m.endpoints);
        all.map(|e| e.id().into_string()).collect()
    } else {
        let probed = scheduler.targets().iter();
        probed.map(|t| t.endpoint.clone()).collect()
    };
    let open: Vec<_> = store
        .alerts(&samewise_store::AlertQuery {
            state: Some(samewise_store::AlertState::Open),
            active_only: false,
            model: None,
            endpoint: None,
            limit: 1000,
        })
        .await?
        .into_iter()
        .filter(|a| endpoints.contains(&a.endpoint))
        .collect();
    outln!(
        "{rounds} round(s): {stored} run(s) stored, {} open alert(s)",
        open.len()
    );
    for a in open {
        outln!("alert #{} {} {}: {}", a.id, a.endpoint, a.kind, a.summary);
    }
    Ok(())
}

/// The scheduler on its schedule until SIGINT/SIGTERM, with the configured retention (as
/// `samewise serve` keeps it): a scheduler running without a gateway still deletes its old
/// probe runs and clears their raw data.
async fn run_forever(
    scheduler: Arc<Scheduler>,
    store: &Store,
    config: &Config,
) -> anyhow::Result<()> {
    let shutdown = super::shutdown_signal();
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let retention = samewise_store::RetentionTask::spawn(store.clone(), config.retention.clone());
    tracing::info!(
        endpoints = scheduler.targets().len(),
        "probe scheduler starting"
    );
    tasks.spawn(scheduler.run(stop.clone()));
    tasks.close();
    shutdown.await;
    stop.cancel();
    tasks.wait().await;
    if let Some(r) = retention {
        r.shutdown().await;
    }
    tracing::info!("probe scheduler stopped");
    Ok(())
}
