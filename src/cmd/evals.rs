//! `samewise evals run|list|show|worker|capture|cases`: targeted eval jobs (composition only;
//! the product logic is in `samewise-evals`). The store is PostgreSQL when `DATABASE_URL` is
//! set, else SQLite in the data directory of `--config` (or `--data-dir`; `list`, `show` and
//! `cases` need no config, `run`, `capture` and `worker` do). Targets come from the proxy config: each model's
//! endpoints (`provider/model-id`, the provider's base URL and API key from its
//! `api_key_env`), and "reference" = `[evals] reference_url` (default: the probes' remote
//! reference URL).
//!
//! - `run --endpoint E (--suite S | --suite-file FILE.jsonl) [--baseline reference|ENDPOINT]`:
//!   opens a job (no cooldown; checked by [`samewise_evals::Opener`], as `POST /api/v1/evals`
//!   is), runs it with an in-process worker (other queued jobs may run first), prints
//!   progress on stderr and the verdict on stdout.
//! - `list [--endpoint E] [--alert ID] [--limit N]`: jobs, newest first, with their verdicts.
//! - `show JOB [--json] [--export FILE]`: the job and its verdict; `--export` writes the
//!   per-item records as JSONL.
//! - `worker [--workers N]`: job workers and the alert watcher until SIGINT/SIGTERM.
//! - `capture (--request ID | --alert ID) [--suite regression[-NAME]] [--baseline B]`:
//!   captured bodies of flagged traffic → regression cases ([`samewise_evals::Capturer`]).
//! - `cases list [--model M] [--suite S]` and `cases delete (ID… | --model M | --suite S |
//!   --all)`: the regression suites' cases.
//!
//! [`start`] runs the same workers and watcher inside `samewise serve`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use samewise_evals::{
    AlertWatcher, CaptureSource, Capturer, EvalsConfig, OpenRequest, Opener, SuiteRef, Target,
    Targets, Worker, WorkerSettings,
};
use samewise_probes::Alerting;
use samewise_proxy::Config;
use samewise_store::{CaseQuery, EvalJob, Store};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Arguments of `samewise evals`.
#[derive(Debug, Args)]
pub struct EvalsArgs {
    /// Where the store is; `run`, `capture` and `worker` also need the config (endpoints,
    /// `[evals]`).
    #[command(flatten)]
    pub store: super::StoreArgs,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: EvalsCommand,
}

/// `samewise evals` subcommands.
#[derive(Debug, Subcommand)]
pub enum EvalsCommand {
    /// Open a job and run it here until its verdict.
    Run {
        /// The suspect endpoint (`provider/model-id`).
        #[arg(long)]
        endpoint: String,
        /// The suite: tool_calls, long_context, regression (or regression-NAME: the model's
        /// captured cases), or a customer suite named in `[evals.suites]`.
        #[arg(
            long,
            required_unless_present = "suite_file",
            conflicts_with = "suite_file"
        )]
        suite: Option<String>,
        /// A one-off customer suite (JSONL), checked and stored with the job.
        #[arg(long)]
        suite_file: Option<PathBuf>,
        /// "reference" or a peer endpoint.
        #[arg(long, default_value = "reference")]
        baseline: String,
        /// Run at most this many items.
        #[arg(long)]
        max_items: Option<u64>,
        /// Verdict margin δ (fraction), instead of the config's.
        #[arg(long)]
        delta: Option<f64>,
        /// long_context: the longest length in tokens, instead of `[evals.long_context]
        /// window` (default: the model's).
        #[arg(long)]
        window: Option<u32>,
    },
    /// List jobs, newest first: id, state, suite, endpoint, baseline, verdict, when opened,
    /// and the alert that opened it.
    List {
        /// Only this endpoint's (`provider/model-id`).
        #[arg(long)]
        endpoint: Option<String>,
        /// Only the jobs this alert opened.
        #[arg(long)]
        alert: Option<i64>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show a job and its verdict.
    Show {
        /// The job's id.
        job: i64,
        /// Write the per-item records to this JSONL file.
        #[arg(long)]
        export: Option<PathBuf>,
    },
    /// Turn captured requests (flagged traffic) into regression cases: replayed on the
    /// baseline, whose answer is the expectation.
    Capture {
        /// One captured request, by its id (the `x-request-id` header of its answer).
        #[arg(long, required_unless_present = "alert", conflicts_with = "alert")]
        request: Option<String>,
        /// The captured requests of an alert's endpoint around the alert.
        #[arg(long)]
        alert: Option<i64>,
        /// Minutes before the alert opened and after it was last seen.
        #[arg(long, default_value_t = 30)]
        window_minutes: i64,
        /// The suite the cases join: regression, or regression-NAME.
        #[arg(long, default_value = "regression")]
        suite: String,
        /// "reference" or a healthy endpoint: its answer is each case's expectation.
        #[arg(long, default_value = "reference")]
        baseline: String,
    },
    /// The regression suites' cases (made by `capture`): list or delete them.
    Cases {
        #[command(subcommand)]
        command: CasesCommand,
    },
    /// Run job workers (and the alert watcher) until SIGINT or SIGTERM.
    Worker {
        /// Workers (default: `[evals] workers`, at least 1).
        #[arg(long)]
        workers: Option<u32>,
    },
}

/// `samewise evals cases` subcommands.
#[derive(Debug, Subcommand)]
pub enum CasesCommand {
    /// List cases, oldest first: id, model, suite, check, source request, endpoint, alert.
    List {
        /// Only this model's.
        #[arg(long)]
        model: Option<String>,
        /// Only this suite's (regression, regression-NAME).
        #[arg(long)]
        suite: Option<String>,
    },
    /// Delete cases: the ones named by id, or every case of a model and/or suite.
    Delete {
        /// The cases' ids.
        #[arg(conflicts_with_all = ["model", "suite", "all"])]
        ids: Vec<i64>,
        /// Every case of this model (of `--suite` too, when given).
        #[arg(long)]
        model: Option<String>,
        /// Every case of this suite (of `--model` too, when given).
        #[arg(long)]
        suite: Option<String>,
        /// Every case of every suite.
        #[arg(long, conflicts_with_all = ["model", "suite"])]
        all: bool,
    },
}

/// The eval targets of `config`: every endpoint of every model, and "reference".
pub fn targets(config: &Config, evals: &EvalsConfig) -> anyhow::Result<Targets> {
    let mut out: Vec<Target> = config
        .endpoint_targets(|_| true)?
        .into_iter()
        .map(|t| Target {
            label: t.endpoint.into_string(),
            base_url: t.base_url,
            api_key: t.api_key,
            model: t.provider_model,
        })
        .collect();
    if let Some(url) = &evals.reference_url {
        let model = evals
            .reference_model
            .clone()
            .or_else(|| config.models.keys().next().cloned())
            .unwrap_or_default();
        out.push(Target {
            label: samewise_evals::REFERENCE.to_owned(),
            base_url: url.clone(),
            api_key: None,
            model,
        });
    }
    Ok(Targets::new(out, Duration::from_secs(300))?)
}

/// The opener of jobs for `config`: its endpoints (label → model) and `[evals]`. The CLI,
/// the alert watcher and the dashboards' `POST /api/v1/evals` all open jobs through it.
pub fn opener(config: &Config, evals: &EvalsConfig) -> Opener {
    let endpoints = config.models.iter().flat_map(|(name, m)| {
        m.endpoints
            .iter()
            .map(|e| (e.id().into_string(), name.clone()))
    });
    Opener::new(evals.clone(), endpoints.collect::<Vec<_>>())
}

/// Workers and the alert watcher of a running process, drained by [`Running::shutdown`].
pub struct Running {
    cancel: CancellationToken,
    tracker: TaskTracker,
    alerting: Arc<Alerting>,
}

impl Running {
    /// Stops the workers (a job in progress keeps its lease until it expires, then another
    /// worker resumes it), waits for them and for the alert webhooks they queued.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        self.alerting.shutdown().await;
    }
}

/// The workers' way of raising a degraded verdict's alert: the alerting of `[probes.alerts]`,
/// so the alert webhooks hear of its opening as of every other alert's.
#[derive(Debug)]
struct VerdictAlerts {
    alerting: Arc<Alerting>,
    store: Store,
}

impl samewise_evals::RaiseAlert for VerdictAlerts {
    fn raise<'a>(
        &'a self,
        alert: &'a samewise_store::NewAlert,
    ) -> samewise_evals::BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let raised = self.alerting.raise(&self.store, alert).await;
            raised.map(drop).map_err(|e| e.to_string())
        })
    }
}

/// Starts `workers` job workers and, when `watch_alerts`, the alert watcher.
pub fn start(
    config: &Config,
    evals: &EvalsConfig,
    store: Store,
    workers: u32,
    watch_alerts: bool,
) -> anyhow::Result<Running> {
    let targets = Arc::new(targets(config, evals)?);
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let alerts = super::alerts::alerts_config(Some(config))?;
    let alerting = Arc::new(Alerting::start(&alerts)?);
    let raiser = Arc::new(VerdictAlerts {
        alerting: alerting.clone(),
        store: store.clone(),
    });
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".to_owned());
    for i in 0..workers {
        let id = format!("{host}-{}-{i}", std::process::id());
        let w = Worker::new(
            store.clone(),
            targets.clone(),
            WorkerSettings::from_config(evals, id),
        )
        .raising_through(raiser.clone());
        let c = cancel.clone();
        tracker.spawn(async move { w.run(c).await });
    }
    if watch_alerts {
        // a held verdict's alert is confirmed four times per quiet period, which resolves
        // alerts nobody confirmed
        let quiet = alerts.quiet_period;
        let watcher = AlertWatcher::new(store.clone(), opener(config, evals)).hold_every(quiet / 4);
        let c = cancel.clone();
        tracker.spawn(async move { watcher.run(c).await });
        // the probe scheduler sweeps quiet alerts; without [probes] there is none, and a
        // verdict's alert (from a job opened by hand) would stay until an operator resolved it
        if config.probes.is_none() {
            let every = quiet.min(Duration::from_secs(60));
            let sweep = sweep_quiet_alerts(alerting.clone(), store, every, cancel.clone());
            tracker.spawn(sweep);
        }
    }
    Ok(Running {
        cancel,
        tracker,
        alerting,
    })
}

/// Resolves the alerts nobody confirmed within the quiet period every `every` until
/// `cancel`, as the probe scheduler's sweep does.
async fn sweep_quiet_alerts(
    alerting: Arc<Alerting>,
    store: Store,
    every: Duration,
    cancel: CancellationToken,
) {
    loop {
        if let Err(e) = alerting
            .auto_resolve(&store, samewise_store::now_ms())
            .await
        {
            tracing::warn!(error = %e, "quiet alert sweep");
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Runs `samewise evals ...`.
pub fn run(args: EvalsArgs) -> anyhow::Result<()> {
    let (config, data_dir) = args.store.resolve()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let store = match args.command {
            // a job of its own, or workers beside a gateway yet to start
            EvalsCommand::Run { .. } | EvalsCommand::Worker { .. } => {
                Store::connect_from_env(&data_dir).await?
            }
            EvalsCommand::List { .. }
            | EvalsCommand::Show { .. }
            | EvalsCommand::Capture { .. }
            | EvalsCommand::Cases { .. } => super::open_existing_store(&data_dir).await?,
        };
        let result = evals(config.as_ref(), &store, args.command, args.json).await;
        store.close().await;
        result
    })
}

async fn evals(
    config: Option<&Config>,
    store: &Store,
    command: EvalsCommand,
    json: bool,
) -> anyhow::Result<()> {
    // list, show and cases read the store alone
    let config = || {
        config.context(
            "samewise evals run, capture and worker need --config FILE (endpoints and [evals])",
        )
    };
    match command {
        EvalsCommand::Run {
            endpoint,
            suite,
            suite_file,
            baseline,
            max_items,
            delta,
            window,
        } => {
            let config = config()?;
            let evals = EvalsConfig::parse(config.evals.as_ref(), config.probes.as_ref())?;
            let mut params = serde_json::Map::new();
            params.insert("opened_by".to_owned(), "cli".into());
            if let Some(n) = max_items {
                params.insert("max_items".to_owned(), n.into());
            }
            if let Some(d) = delta {
                params.insert("delta".to_owned(), d.into());
            }
            if let Some(w) = window {
                params.insert("window".to_owned(), w.into());
            }
            let suite = match (suite, suite_file) {
                (_, Some(path)) => SuiteRef::File(path),
                (Some(name), None) => SuiteRef::Named(name),
                (None, None) => anyhow::bail!("name --suite NAME or --suite-file FILE"),
            };
            let req = OpenRequest {
                endpoint,
                suite,
                baseline: Some(baseline),
                params,
                alert_id: None,
            };
            let job = opener(config, &evals)
                .open(store, &req, 0)
                .await?
                .context("the job was not opened")?;
            note!("eval job {} opened", job.id);
            let running = start(config, &evals, store.clone(), 1, false)?;
            let done = loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let j = store.eval_job(job.id).await?.context("the job vanished")?;
                let p = store.eval_progress(job.id).await?;
                note!(
                    "job {}: {} — {} results of {} items × 2, {} tokens",
                    j.id,
                    j.state,
                    p.results,
                    j.items_total.map_or("?".to_owned(), |n| n.to_string()),
                    p.tokens
                );
                if j.state.is_final() {
                    break j;
                }
            };
            running.shutdown().await;
            print_job(&done, json)?;
            anyhow::ensure!(
                done.state == samewise_store::JobState::Succeeded,
                "job {} {}: {}",
                done.id,
                done.state,
                done.error.as_deref().unwrap_or("")
            );
            Ok(())
        }
        EvalsCommand::List {
            endpoint,
            alert,
            limit,
        } => {
            let jobs = store.eval_jobs(alert, endpoint.as_deref(), limit).await?;
            if json {
                let v: Vec<serde_json::Value> = jobs.iter().map(job_json).collect();
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else if jobs.is_empty() {
                outln!("no eval jobs");
            } else {
                out!("{}", jobs_table(&jobs));
            }
            Ok(())
        }
        EvalsCommand::Show { job, export } => {
            let j = store
                .eval_job(job)
                .await?
                .with_context(|| format!("no eval job {job}"))?;
            if let Some(path) = export {
                let mut f = std::fs::File::create(&path)
                    .with_context(|| format!("creating {}", path.display()))?;
                for r in store.eval_results(job).await? {
                    let line = serde_json::json!({
                        "job": job,
                        "item": r.item,
                        "target": r.target,
                        "passed": r.passed,
                        "error_type": r.error_type,
                        "tokens": r.tokens,
                        "record": r.record,
                    });
                    writeln!(f, "{line}")?;
                }
            }
            print_job(&j, json)
        }
        EvalsCommand::Capture {
            request,
            alert,
            window_minutes,
            suite,
            baseline,
        } => {
            let config = config()?;
            let evals = EvalsConfig::parse(config.evals.as_ref(), config.probes.as_ref())?;
            let source = match (request, alert) {
                (Some(id), _) => CaptureSource::Request(id),
                (None, Some(id)) => CaptureSource::Alert {
                    id,
                    window_ms: window_minutes.max(0).saturating_mul(60_000),
                },
                (None, None) => anyhow::bail!("name --request ID or --alert ID"),
            };
            let capturer = Capturer::new(store.clone(), Arc::new(targets(config, &evals)?));
            let report = capturer.capture(&source, &suite, Some(&baseline)).await?;
            if json {
                let doc = serde_json::json!({
                    "suite": suite,
                    "made": report.made.iter().map(|(id, req, kind)| serde_json::json!({"case": id, "request_id": req, "check": kind})).collect::<Vec<_>>(),
                    "skipped": report.skipped.iter().map(|(req, why)| serde_json::json!({"request_id": req, "why": why})).collect::<Vec<_>>(),
                });
                outln!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                for (id, req, kind) in &report.made {
                    outln!("case {id}: request {req}, check {kind}");
                }
                for (req, why) in &report.skipped {
                    outln!("skipped {req}: {why}");
                }
                if report.made.is_empty() && report.skipped.is_empty() {
                    outln!(
                        "no captured requests there: is [models.NAME.capture] enabled for the \
                         model, and was its traffic flagged (or sampled) in that window?"
                    );
                }
                outln!(
                    "{} cases made for suite {suite}, {} requests skipped",
                    report.made.len(),
                    report.skipped.len()
                );
            }
            Ok(())
        }
        EvalsCommand::Cases { command } => cases(store, command, json).await,
        EvalsCommand::Worker { workers } => {
            let config = config()?;
            let evals = EvalsConfig::parse(config.evals.as_ref(), config.probes.as_ref())?;
            let n = workers.unwrap_or(evals.workers).max(1);
            let running = start(config, &evals, store.clone(), n, true)?;
            let shutdown = super::shutdown_signal();
            outln!("eval workers running: {n}");
            shutdown.await;
            running.shutdown().await;
            Ok(())
        }
    }
}

async fn cases(store: &Store, command: CasesCommand, json: bool) -> anyhow::Result<()> {
    match command {
        CasesCommand::List { model, suite } => {
            let q = CaseQuery {
                model,
                suite,
                id: None,
            };
            let cases = store.regression_cases_matching(&q).await?;
            if json {
                let doc: Vec<_> = cases
                    .iter()
                    .map(|c| {
                        serde_json::json!({
                            "id": c.id,
                            "model": c.model,
                            "suite": c.suite,
                            "source_request_id": c.source_request_id,
                            "endpoint": c.endpoint,
                            "alert_id": c.alert_id,
                            "created_ms": c.created_ms,
                            "item": c.item,
                        })
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&doc)?);
                return Ok(());
            }
            for c in &cases {
                outln!(
                    "{}  {}  {}  check {}  request {}  endpoint {}  alert {}  {}",
                    c.id,
                    c.model,
                    c.suite,
                    c.item["check"]["kind"].as_str().unwrap_or("?"),
                    c.source_request_id,
                    c.endpoint.as_deref().unwrap_or("-"),
                    c.alert_id.map_or("-".to_owned(), |a| a.to_string()),
                    samewise_store::utc_text(c.created_ms),
                );
            }
            outln!("{} cases", cases.len());
            Ok(())
        }
        CasesCommand::Delete {
            ids,
            model,
            suite,
            all,
        } => {
            let queries: Vec<CaseQuery> = if !ids.is_empty() {
                ids.iter()
                    .map(|&id| CaseQuery {
                        id: Some(id),
                        ..CaseQuery::default()
                    })
                    .collect()
            } else if model.is_some() || suite.is_some() || all {
                vec![CaseQuery {
                    model,
                    suite,
                    id: None,
                }]
            } else {
                anyhow::bail!("name the cases to delete: IDs, --model M, --suite S, or --all")
            };
            let mut deleted = 0;
            for q in &queries {
                deleted += store.delete_regression_cases(q).await?;
            }
            if json {
                outln!("{}", serde_json::json!({ "deleted": deleted }));
            } else {
                outln!("{deleted} cases deleted");
            }
            Ok(())
        }
    }
}

/// A job as `--json` prints it.
fn job_json(j: &EvalJob) -> serde_json::Value {
    serde_json::json!({
        "id": j.id,
        "model": j.model,
        "endpoint": j.endpoint,
        "suite": j.suite,
        "baseline": j.baseline,
        "alert_id": j.alert_id,
        "state": j.state.as_str(),
        "attempts": j.attempts,
        "worker": j.worker,
        "items_total": j.items_total,
        "tokens": j.tokens,
        "created_ms": j.created_ms,
        "started_ms": j.started_ms,
        "finished_ms": j.finished_ms,
        "params": j.params,
        "verdict": j.verdict,
        "error": j.error,
    })
}

/// Jobs as `evals list` prints them: one aligned row each.
fn jobs_table(jobs: &[EvalJob]) -> String {
    let rows = jobs
        .iter()
        .map(|j| {
            let verdict = j.verdict.as_ref().and_then(|v| v["verdict"].as_str());
            vec![
                j.id.to_string(),
                j.state.to_string(),
                j.suite.clone(),
                j.endpoint.clone(),
                j.baseline.clone(),
                verdict.unwrap_or("-").to_owned(),
                samewise_store::utc_text(j.created_ms),
                j.alert_id.map_or("-".to_owned(), |a| a.to_string()),
            ]
        })
        .collect();
    let header = [
        "ID",
        "STATE",
        "SUITE",
        "ENDPOINT",
        "BASELINE",
        "VERDICT",
        "OPENED (UTC)",
        "ALERT",
    ];
    super::text_table(&header, rows)
}

fn print_job(j: &EvalJob, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(&job_json(j))?);
        return Ok(());
    }
    outln!(
        "job {}  {}  suite {}  endpoint {}  baseline {}  attempts {}  tokens {}",
        j.id,
        j.state,
        j.suite,
        j.endpoint,
        j.baseline,
        j.attempts,
        j.tokens
    );
    if let Some(e) = &j.error {
        outln!("error: {e}");
    }
    if let Some(v) = &j.verdict {
        let f = |x: &serde_json::Value| {
            x.as_f64()
                .map_or("n/a".to_owned(), |v| format!("{:.1}%", v * 100.0))
        };
        let ci = |x: &serde_json::Value| match (x[0].as_f64(), x[1].as_f64()) {
            (Some(a), Some(b)) => format!("[{:.1}%, {:.1}%]", a * 100.0, b * 100.0),
            _ => "n/a".to_owned(),
        };
        outln!(
            "verdict: {}  (items {} of {}, stopped: {})",
            v["verdict"].as_str().unwrap_or("?"),
            v["items"],
            v["items_total"],
            v["stopped"].as_str().unwrap_or("?")
        );
        outln!(
            "suspect : {} {}  failures {}",
            f(&v["suspect"]["rate"]),
            ci(&v["suspect"]["wilson95"]),
            v["suspect"]["failures"]
        );
        outln!(
            "baseline: {} {}  failures {}",
            f(&v["baseline"]["rate"]),
            ci(&v["baseline"]["wilson95"]),
            v["baseline"]["failures"]
        );
        outln!(
            "paired: diff {} {} at {:.2}%, McNemar exact p = {:.3e}; δ = {}, α = {}, looks = {}",
            f(&v["diff"]),
            ci(&v["diff_interval"]),
            v["diff_interval_level"].as_f64().unwrap_or(0.0) * 100.0,
            v["p_value"].as_f64().unwrap_or(1.0),
            v["params"]["delta"],
            v["params"]["alpha"],
            v["params"]["looks"]
        );
        let sv = &v["schema_validity"];
        if !sv.is_null() {
            outln!(
                "schema validity ({} items both sides called on): suspect {}, baseline {}, diff {} {}, McNemar exact p = {:.3e} ({})",
                sv["items"],
                f(&sv["suspect"]["rate"]),
                f(&sv["baseline"]["rate"]),
                f(&sv["diff"]),
                ci(&sv["diff_interval"]),
                sv["p_value"].as_f64().unwrap_or(1.0),
                sv["verdict"].as_str().unwrap_or("?")
            );
        }
        if !v["extras"].is_null() {
            outln!("extras: {}", v["extras"]);
        }
    }
    Ok(())
}
