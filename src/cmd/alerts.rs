//! `samewise alerts list|show ID|ack ID|resolve ID`: the drift alerts in the store (PostgreSQL when
//! `DATABASE_URL` is set, else SQLite in the data directory of `--config`, or `--data-dir`),
//! as a table or, with `--json`, as JSON. `list` shows active alerts (open and acknowledged)
//! unless `--state` says otherwise; `show` adds the eval jobs the alert opened, with their
//! verdicts. `resolve` notifies the webhooks of `[[probes.webhooks]]`
//! when `--config` names a file that has them; acknowledging notifies nobody.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use samewise_probes::alerting::{Alerting, AlertsConfig};
use samewise_proxy::Config;
use samewise_store::{Alert, AlertQuery, AlertState, Store};

/// Arguments of `samewise alerts`.
#[derive(Debug, Args)]
pub struct AlertsArgs {
    /// Take the data directory (and webhooks) from this configuration file.
    #[arg(long, short, global = true)]
    pub config: Option<PathBuf>,
    /// The data directory (default: the config's `server.data_dir`, else `samewise-data`).
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
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
    /// Show one alert with its evidence and the verdicts of the eval jobs it opened.
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

/// Runs `samewise alerts ...`.
pub fn run(args: AlertsArgs) -> anyhow::Result<()> {
    let config = args.config.as_deref().map(Config::load).transpose()?;
    let data_dir = match (&args.data_dir, &config) {
        (Some(d), _) => d.clone(),
        (None, Some(c)) => c.server.data_dir.clone(),
        (None, None) => PathBuf::from("samewise-data"),
    };
    let alerts_cfg = match config.as_ref().and_then(|c| c.probes.as_ref()) {
        None => AlertsConfig::default(),
        Some(probes) => {
            let mut t = toml::Table::new();
            for key in ["alerts", "webhooks"] {
                if let Some(v) = probes.get(key) {
                    t.insert(key.to_owned(), v.clone());
                }
            }
            AlertsConfig::parse(&t)?
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let database_url = std::env::var("DATABASE_URL")
            .ok()
            .filter(|u| !u.trim().is_empty());
        let store = Store::connect(database_url.as_deref(), &data_dir).await?;
        let alerting = Alerting::start(&alerts_cfg)?;
        let result = alerts(&store, &alerting, args.command, args.json).await;
        // deliver the resolution's webhooks before exiting
        alerting.shutdown().await;
        store.close().await;
        result
    })
}

async fn alerts(
    store: &Store,
    alerting: &Alerting,
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
            let mut q = AlertQuery {
                state: None,
                model,
                endpoint,
                limit,
            };
            let mut list = match state {
                StateFilter::Active => {
                    let mut all: Vec<Alert> = store.active_alerts().await?;
                    all.retain(|a| {
                        q.model.as_ref().is_none_or(|m| &a.model == m)
                            && q.endpoint.as_ref().is_none_or(|e| &a.endpoint == e)
                    });
                    all.sort_by_key(|a| std::cmp::Reverse(a.id));
                    all.truncate(limit as usize);
                    all
                }
                StateFilter::All => store.alerts(&q).await?,
                one => {
                    q.state = Some(match one {
                        StateFilter::Open => AlertState::Open,
                        StateFilter::Acknowledged => AlertState::Acknowledged,
                        _ => AlertState::Resolved,
                    });
                    store.alerts(&q).await?
                }
            };
            if json {
                let v: Vec<serde_json::Value> = list.iter().map(alert_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if list.is_empty() {
                println!("no alerts");
            } else {
                print!("{}", table(&mut list));
            }
        }
        AlertsCommand::Show { id } => {
            let a = store
                .alert(id)
                .await?
                .with_context(|| format!("no alert with id {id}"))?;
            let jobs = store.eval_jobs(Some(id), 100).await?;
            let evals: Vec<serde_json::Value> = jobs
                .iter()
                .map(|j| {
                    serde_json::json!({
                        "job": j.id,
                        "suite": j.suite,
                        "baseline": j.baseline,
                        "state": j.state.as_str(),
                        "verdict": j.verdict,
                    })
                })
                .collect();
            if json {
                let mut v = alert_json(&a);
                v["eval_jobs"] = serde_json::Value::Array(evals);
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "alert {}  {}  {} on {} ({})  opened {}  last seen {}",
                    a.id,
                    a.state,
                    a.kind,
                    a.endpoint,
                    a.model,
                    utc(a.opened_ms),
                    utc(a.last_seen_ms)
                );
                println!("summary: {}", a.summary);
                println!("evidence: {}", a.evidence);
                for j in &jobs {
                    let verdict = j
                        .verdict
                        .as_ref()
                        .and_then(|v| v["verdict"].as_str())
                        .unwrap_or("-");
                    println!(
                        "eval job {}: {} vs {}  {}  verdict {}",
                        j.id, j.suite, j.baseline, j.state, verdict
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
        println!("{}", serde_json::to_string_pretty(&alert_json(a))?);
    } else if a.state.as_str() == verb {
        println!(
            "alert {} {verb}: {} on {} ({})",
            a.id, a.kind, a.endpoint, a.summary
        );
    } else {
        println!("alert {} is {}; left as it is", a.id, a.state);
    }
    Ok(())
}

/// An alert as JSON (the same shape the generic webhook sends).
pub fn alert_json(a: &Alert) -> serde_json::Value {
    serde_json::json!({
        "id": a.id,
        "model": a.model,
        "endpoint": a.endpoint,
        "kind": a.kind,
        "state": a.state.as_str(),
        "opened_ms": a.opened_ms,
        "updated_ms": a.updated_ms,
        "resolved_ms": a.resolved_ms,
        "last_seen_ms": a.last_seen_ms,
        "summary": a.summary,
        "evidence": a.evidence,
    })
}

/// The alerts as an aligned text table.
fn table(list: &mut [Alert]) -> String {
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
    let rows: Vec<[String; 8]> = list
        .iter()
        .map(|a| {
            [
                a.id.to_string(),
                a.state.to_string(),
                a.kind.clone(),
                a.model.clone(),
                a.endpoint.clone(),
                utc(a.opened_ms),
                utc(a.last_seen_ms),
                a.summary.replace(['\n', '\r', '\t'], " "),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(c);
                s.push_str(&" ".repeat(w - c.chars().count() + 2));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // civil_from_days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_798_761_599_999), "2026-12-31 23:59:59");
        assert_eq!(utc(-1_000), "1969-12-31 23:59:59");
    }
}
