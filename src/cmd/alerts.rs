//! `samewise alerts list|show ID|ack ID|resolve ID`: the drift alerts in the store (PostgreSQL when
//! `DATABASE_URL` is set, else SQLite in the data directory of `--config`, or `--data-dir`),
//! as a table or, with `--json`, as JSON. `list` shows active alerts (open and acknowledged)
//! unless `--state` says otherwise; `show` adds the eval jobs that answer the alert (those
//! it opened, and its endpoint's of the same incident: `samewise_evals::jobs_answering`),
//! with their verdicts. `resolve` notifies the webhooks of `[[probes.webhooks]]`
//! when `--config` names a file that has them; acknowledging notifies nobody.

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use samewise_evals::EvalsConfig;
use samewise_probes::{Alerting, AlertsConfig};
use samewise_store::utc_text as utc;
use samewise_store::{Alert, AlertQuery, AlertState, Resolver, Store};

/// Arguments of `samewise alerts`.
#[derive(Debug, Args)]
pub struct AlertsArgs {
    /// Where the store is (and, in the config, the webhooks).
    #[command(flatten)]
    pub store: super::StoreArgs,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: AlertsCommand,
}

/// Which alerts `list` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateFilter {
    /// Open and acknowledged.
    Active,
    /// Open only.
    Open,
    /// Acknowledged only.
    Acknowledged,
    /// Resolved only.
    Resolved,
    /// Every alert.
    All,
}

/// `samewise alerts` subcommands.
#[derive(Debug, Subcommand)]
pub enum AlertsCommand {
    /// List alerts, newest first.
    List {
        /// Which alerts.
        #[arg(long, value_enum, default_value_t = StateFilter::Active)]
        state: StateFilter,
        /// Only this model's.
        #[arg(long)]
        model: Option<String>,
        /// Only this endpoint's (`provider/model-id`).
        #[arg(long)]
        endpoint: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show one alert with its evidence and the verdicts of the eval jobs that answer it.
    Show {
        /// The alert's id.
        id: i64,
    },
    /// Acknowledge an open alert (it stays active for routing until resolved).
    Ack {
        /// The alert's id.
        id: i64,
    },
    /// Resolve an alert (routing returns to normal within the poll interval).
    Resolve {
        /// The alert's id.
        id: i64,
    },
}

/// The alerts' settings in `config`'s `[probes]` (the defaults without one).
pub(crate) fn alerts_config(
    config: Option<&samewise_proxy::Config>,
) -> anyhow::Result<AlertsConfig> {
    Ok(match config.and_then(|c| c.probes.as_ref()) {
        None => AlertsConfig::default(),
        Some(probes) => AlertsConfig::parse(probes)?,
    })
}

/// Runs `samewise alerts ...`.
pub fn run(args: AlertsArgs) -> anyhow::Result<()> {
    let (config, data_dir) = args.store.resolve()?;
    let alerts_cfg = alerts_config(config.as_ref())?;
    // which eval jobs answer an alert depends on the evals' cooldown (`show` alone reads
    // the section, whose customer suites are files)
    let cooldown = match args.command {
        AlertsCommand::Show { .. } => config
            .as_ref()
            .and_then(|c| EvalsConfig::parse(c.evals.as_ref(), c.probes.as_ref()).ok())
            .map_or(samewise_evals::DEFAULT_COOLDOWN, |e| e.cooldown),
        _ => samewise_evals::DEFAULT_COOLDOWN,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let store = super::open_existing_store(&data_dir).await?;
        let alerting = Alerting::start(&alerts_cfg)?;
        let result = alerts(&store, &alerting, cooldown, args.command, args.json).await;
        // deliver the resolution's webhooks before exiting
        alerting.shutdown().await;
        store.close().await;
        result
    })
}

async fn alerts(
    store: &Store,
    alerting: &Alerting,
    cooldown: std::time::Duration,
    command: AlertsCommand,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        AlertsCommand::List {
            state,
            model,
            endpoint,
            limit,
        } => {
            let q = AlertQuery {
                state: match state {
                    StateFilter::Open => Some(AlertState::Open),
                    StateFilter::Acknowledged => Some(AlertState::Acknowledged),
                    StateFilter::Resolved => Some(AlertState::Resolved),
                    StateFilter::Active | StateFilter::All => None,
                },
                active_only: state == StateFilter::Active,
                model,
                endpoint,
                limit,
            };
            let list = store.alerts(&q).await?;
            if json {
                let v: Vec<serde_json::Value> = list.iter().map(Alert::to_json).collect();
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else if list.is_empty() {
                outln!("no alerts");
            } else {
                out!("{}", alerts_table(&list));
            }
        }
        AlertsCommand::Show { id } => {
            let a = store
                .alert(id)
                .await?
                .with_context(|| format!("no alert with id {id}"))?;
            let jobs = samewise_evals::jobs_answering(store, &a, cooldown).await?;
            // an active verdict's alert: the active alerts that keep it from going quiet
            let held_by = samewise_evals::holders(store, &a, cooldown).await?;
            let evals: Vec<serde_json::Value> = jobs
                .iter()
                .map(|j| {
                    serde_json::json!({
                        "job": j.id,
                        "suite": j.suite,
                        "baseline": j.baseline,
                        "state": j.state.as_str(),
                        "verdict": j.verdict,
                        "opened_by_alert": j.alert_id,
                    })
                })
                .collect();
            if json {
                let mut v = a.to_json();
                v["eval_jobs"] = serde_json::Value::Array(evals);
                if let Some(held_by) = &held_by {
                    v["held_by"] = held_by.iter().map(|h| h.id).collect();
                }
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                outln!(
                    "alert {}  {}  {} on {} ({})  opened {}  last seen {}",
                    a.id,
                    a.state,
                    a.kind,
                    a.endpoint,
                    a.model,
                    utc(a.opened_ms),
                    utc(a.last_seen_ms)
                );
                if let Some(ms) = a.resolved_ms {
                    let by = a.resolved_by.map_or("", |r| match r {
                        Resolver::Operator => " by an operator",
                        Resolver::Quiet => " automatically, after its quiet period",
                    });
                    outln!("resolved {}{by}", utc(ms));
                }
                outln!("summary: {}", a.summary);
                outln!("evidence: {}", a.evidence);
                if let Some(held_by) = &held_by {
                    let list: Vec<String> = held_by
                        .iter()
                        .map(|h| format!("alert {} ({})", h.id, h.kind))
                        .collect();
                    if list.is_empty() {
                        outln!(
                            "held by: no active alert (resolved after its quiet period unless a verdict raises it again)"
                        );
                    } else {
                        outln!("held by: {}", list.join(", "));
                    }
                }
                for j in &jobs {
                    let verdict = j
                        .verdict
                        .as_ref()
                        .and_then(|v| v["verdict"].as_str())
                        .unwrap_or("-");
                    let by = match j.alert_id {
                        Some(x) if x == id => String::new(),
                        Some(x) => format!("  (opened by alert {x})"),
                        None => "  (opened by hand)".to_owned(),
                    };
                    outln!(
                        "eval job {}: {} vs {}  {}  verdict {}{by}",
                        j.id,
                        j.suite,
                        j.baseline,
                        j.state,
                        verdict
                    );
                }
            }
        }
        AlertsCommand::Ack { id } => {
            let a = alerting
                .acknowledge(store, id)
                .await?
                .with_context(|| format!("no alert with id {id}"))?;
            show_one(&a, json, "acknowledged")?;
        }
        AlertsCommand::Resolve { id } => {
            let a = alerting
                .resolve(store, id)
                .await?
                .with_context(|| format!("no alert with id {id}"))?;
            show_one(&a, json, "resolved")?;
        }
    }
    Ok(())
}

fn show_one(a: &Alert, json: bool, verb: &str) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(&a.to_json())?);
    } else if a.state.as_str() == verb {
        outln!(
            "alert {} {verb}: {} on {} ({})",
            a.id,
            a.kind,
            a.endpoint,
            a.summary
        );
    } else {
        outln!("alert {} is {}; left as it is", a.id, a.state);
    }
    Ok(())
}

/// The alerts as `alerts list` prints them: one aligned row each.
fn alerts_table(list: &[Alert]) -> String {
    let header = [
        "ID",
        "STATE",
        "KIND",
        "MODEL",
        "ENDPOINT",
        "OPENED (UTC)",
        "LAST SEEN (UTC)",
        "SUMMARY",
    ];
    let rows = list
        .iter()
        .map(|a| {
            vec![
                a.id.to_string(),
                a.state.to_string(),
                a.kind.clone(),
                a.model.clone(),
                a.endpoint.clone(),
                utc(a.opened_ms),
                utc(a.last_seen_ms),
                a.summary.clone(),
            ]
        })
        .collect();
    super::text_table(&header, rows)
}
