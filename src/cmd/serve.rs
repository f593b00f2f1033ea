//! `samewise serve --config FILE`: runs the gateway, with the dashboards (`/`, `/api/v1/`)
//! merged into its router on the same listener. The store is PostgreSQL when
//! `DATABASE_URL` is set, else SQLite in the configured data directory. SIGINT or SIGTERM stops
//! accepting connections, lets in-flight requests (streams included) finish, drains the
//! request-record queue into the store, then exits.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use samewise_proxy::{AppState, Config};
use samewise_store::{RecordWriter, RecordWriterConfig, Store};

/// Arguments of `samewise serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The configuration file (TOML).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Listen here instead of `server.listen` (e.g. `127.0.0.1:0` for any free port).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
}

/// Runs the gateway until a shutdown signal.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let store = Store::connect_from_env(&config.server.data_dir).await?;
        tracing::info!(backend = store.backend().name(), "store ready");
        let addr = args.listen.unwrap_or(config.server.listen);
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                store.close().await;
                return Err(anyhow::Error::new(e).context(format!("cannot listen on {addr}")));
            }
        };
        // before the line below: a SIGTERM sent on reading it drains the gateway
        let shutdown = super::shutdown_signal();
        // One line on stdout for scripts and tests that start the gateway on port 0.
        outln!("listening on http://{}", listener.local_addr()?);
        serve_on(&config, store, listener, shutdown).await
    })
}

/// Runs the gateway, its probe scheduler, eval workers, dashboards and retention on `listener`
/// over `store` until `shutdown` resolves; then drains everything in order and closes the store
/// (also when start-up fails). `samewise serve` and `samewise demo` both run this.
pub async fn serve_on(
    config: &Config,
    store: Store,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let writer_cfg = RecordWriterConfig {
        capacity: config.limits.record_queue_capacity,
        max_queued_record_bytes: config.limits.record_queue_bytes,
        ..RecordWriterConfig::default()
    };
    let (records, writer) = RecordWriter::spawn(store.clone(), writer_cfg);
    // the process's one Prometheus registry: each crate registers its own families
    let registry = samewise_proxy::new_registry();
    let state = match AppState::new_in(config, store.clone(), records, registry.clone()) {
        Ok(s) => s,
        Err(e) => {
            writer.shutdown().await;
            store.close().await;
            return Err(e.into());
        }
    };
    // the drift-probe scheduler, beside the gateway (never on the request path)
    let probes = match super::probes::start(config, store.clone()).await {
        Ok(p) => p,
        Err(e) => {
            writer.shutdown().await;
            store.close().await;
            return Err(e);
        }
    };
    // eval job workers and the alert watcher that opens jobs ([evals] workers; 0: none)
    let evals_cfg =
        samewise_evals::EvalsConfig::parse(config.evals.as_ref(), config.probes.as_ref());
    let evals = match evals_cfg.map_err(anyhow::Error::from).and_then(|c| {
        (c.workers > 0)
            .then(|| super::evals::start(config, &c, store.clone(), c.workers, true))
            .transpose()
    }) {
        Ok(e) => e,
        Err(e) => {
            if let Some(p) = probes {
                p.shutdown().await;
            }
            writer.shutdown().await;
            store.close().await;
            return Err(e);
        }
    };
    // the dashboards (`/`, `/api/v1/`) beside the gateway's routes, on the same listener
    let dashboards = match super::dashboards::build(config, store.clone(), state.clone()) {
        Ok(d) => d,
        Err(e) => {
            if let Some(p) = probes {
                p.shutdown().await;
            }
            if let Some(e) = evals {
                e.shutdown().await;
            }
            writer.shutdown().await;
            store.close().await;
            return Err(e);
        }
    };
    let dash_metrics = {
        let mut r = registry.write().unwrap_or_else(|p| p.into_inner());
        samewise_dashboards::DashMetrics::register(&mut r)
    };
    let refresher = samewise_dashboards::Refresher::spawn(
        dashboards.clone(),
        dash_metrics,
        std::time::Duration::from_secs(15),
    );
    // the dashboards' first reads after a restart, done before anyone asks (in the background:
    // the gateway serves meanwhile)
    let warming = dashboards.clone();
    tokio::spawn(async move {
        match warming.warm_up().await {
            Ok(took) => tracing::info!(ms = took.as_millis(), "dashboards warmed up"),
            Err(e) => tracing::warn!(error = %e, "dashboards warm-up failed"),
        }
    });
    // the dashboards' handlers run here, on the main runtime, not on the serving threads
    let dash = samewise_proxy::on_runtime(
        samewise_dashboards::router(dashboards),
        tokio::runtime::Handle::current(),
    );
    let app = || Ok(samewise_proxy::router(state.for_shard()?).merge(dash.clone()));
    if let Ok(local) = listener.local_addr() {
        tracing::info!(addr = %local, models = config.models.len(), "samewise gateway listening");
    }
    // drift alerts demote or exclude endpoints (each model's on_drift), re-read every poll
    let quality = samewise_proxy::QualityWatcher::spawn(config, state.clone(), store.clone());
    // deletes the records, probe runs and rollups older than [retention] keeps: now, then every
    // hour; /metrics shows what it did
    let retention = samewise_store::RetentionTask::spawn(store.clone(), config.retention.clone());
    if let Some(r) = &retention {
        samewise_proxy::register_retention(&registry, r.stats());
    }
    let serving = samewise_proxy::Serving::of(config);
    let served = samewise_proxy::serve_router_with(listener, app, shutdown, serving).await;
    if let Some(r) = retention {
        r.shutdown().await;
    }
    if let Some(p) = probes {
        tracing::info!("stopping the probe scheduler");
        p.shutdown().await;
    }
    if let Some(e) = evals {
        tracing::info!("stopping the eval workers");
        e.shutdown().await;
    }
    quality.shutdown().await;
    refresher.shutdown().await;
    tracing::info!("draining request records");
    writer.shutdown().await;
    store.close().await;
    served?;
    tracing::info!("stopped");
    Ok(())
}
