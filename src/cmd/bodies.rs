//! `samewise bodies list|purge`: the captured request bodies (opt-in per model,
//! `[models.NAME.capture]`) in the store — PostgreSQL when `DATABASE_URL` is set, else SQLite
//! in the data directory of `--config` (or `--data-dir`). `list` shows who was kept and why,
//! never the bodies' text (`--json` adds it, redacted as stored); `purge` deletes them.

use anyhow::Context;
use clap::{Args, Subcommand};
use samewise_store::utc_text as utc;
use samewise_store::{BodyQuery, Store};

/// Arguments of `samewise bodies`.
#[derive(Debug, Args)]
pub struct BodiesArgs {
    /// Where the store is.
    #[command(flatten)]
    pub store: super::StoreArgs,
    /// Print JSON (with the redacted bodies) instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: BodiesCommand,
}

/// `samewise bodies` subcommands.
#[derive(Debug, Subcommand)]
pub enum BodiesCommand {
    /// List captured bodies, newest first.
    List {
        /// Only this model's.
        #[arg(long)]
        model: Option<String>,
        /// Only this endpoint's (`provider/model-id`).
        #[arg(long)]
        endpoint: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Delete captured bodies (all of them unless filtered).
    Purge {
        /// Only this model's.
        #[arg(long)]
        model: Option<String>,
        /// Only those captured before this time: unix milliseconds, or an age such as `30m`,
        /// `12h`, `7d` (older than that).
        #[arg(long)]
        before: Option<String>,
    },
}

/// `--before`: unix milliseconds, or `N` followed by `m`, `h` or `d` (that long ago).
fn before_ms(s: &str, now_ms: i64) -> anyhow::Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let unit: i64 = match s.chars().last() {
        Some('m') => 60_000,
        Some('h') => 3_600_000,
        Some('d') => 86_400_000,
        _ => anyhow::bail!("--before {s:?}: unix milliseconds, or an age such as 30m, 12h, 7d"),
    };
    let n: i64 = s[..s.len() - 1]
        .parse()
        .ok()
        .filter(|n| *n >= 0)
        .with_context(|| format!("--before {s:?}: the age is not a whole number"))?;
    Ok(now_ms.saturating_sub(n.saturating_mul(unit)))
}

/// Runs `samewise bodies ...`.
pub fn run(args: BodiesArgs) -> anyhow::Result<()> {
    let (_, data_dir) = args.store.resolve()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let store = super::open_existing_store(&data_dir).await?;
        let result = bodies(&store, args.command, args.json).await;
        store.close().await;
        result
    })
}

async fn bodies(store: &Store, command: BodiesCommand, json: bool) -> anyhow::Result<()> {
    let now = samewise_store::now_ms();
    match command {
        BodiesCommand::List {
            model,
            endpoint,
            limit,
        } => {
            let q = BodyQuery {
                model,
                endpoint,
                since_ms: None,
                until_ms: None,
                limit,
            };
            let rows = store.captured_bodies(&q, now).await?;
            if json {
                let docs: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|b| {
                        serde_json::json!({
                            "request_id": b.request_id, "ts_ms": b.ts_ms, "expires_ms": b.expires_ms,
                            "model": b.model, "endpoint": b.endpoint, "route": b.route,
                            "flags": b.flags, "bytes": b.bytes,
                            "request": b.request, "response": b.response,
                        })
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&docs)?);
                return Ok(());
            }
            outln!(
                "{:<30} {:<19} {:<12} {:<28} {:>8}  flags",
                "request",
                "captured (UTC)",
                "model",
                "endpoint",
                "bytes"
            );
            for b in rows {
                outln!(
                    "{:<30} {:<19} {:<12} {:<28} {:>8}  {}",
                    b.request_id,
                    utc(b.ts_ms),
                    b.model,
                    b.endpoint.as_deref().unwrap_or("-"),
                    b.bytes,
                    b.flags.join(",")
                );
            }
            Ok(())
        }
        BodiesCommand::Purge { model, before } => {
            let before = before.as_deref().map(|b| before_ms(b, now)).transpose()?;
            let n = store
                .purge_captured_bodies(model.as_deref(), before)
                .await?;
            outln!("{n} captured bodies deleted");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_takes_milliseconds_or_an_age() {
        let now = 10 * 86_400_000;
        assert_eq!(before_ms("1234", now).ok(), Some(1234));
        assert_eq!(before_ms("2d", now).ok(), Some(8 * 86_400_000));
        assert_eq!(before_ms("30m", now).ok(), Some(now - 1_800_000));
        assert!(before_ms("yesterday", now).is_err());
        assert!(before_ms("-3h", now).is_err());
    }
}
