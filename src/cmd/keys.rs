//! `samewise keys create NAME [--rpm N] [--admin]`, `keys list`, `keys revoke NAME`,
//! `keys usage [--hours N] [--json]` (each key's requests, failures, tokens and cost over the
//! last N hours, from each key's hourly sums and the records of the partial hour): samewise API keys
//! in the store (an `--admin` key also opens the dashboards and their API) (PostgreSQL when `DATABASE_URL` is set, else SQLite in the data directory of
//! `--config`, or `--data-dir`). A new key is printed once; only its hash is stored. A revoked
//! key stops working on running gateways within `limits.key_cache_ttl_ms` (default 10 s).

use clap::{Args, Subcommand};
use samewise_store::{KeyOptions, Store, utc_text};

/// Arguments of `samewise keys`.
#[derive(Debug, Args)]
pub struct KeysArgs {
    /// Where the store is.
    #[command(flatten)]
    pub store: super::StoreArgs,
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// `samewise keys` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key and print it (once).
    Create {
        /// A name for the key (unique among live keys).
        name: String,
        /// Requests per minute allowed with this key.
        #[arg(long)]
        rpm: Option<u32>,
        /// An admin key: it also opens the dashboards (`/`) and their API (`/api/v1/`).
        #[arg(long)]
        admin: bool,
    },
    /// List keys (never their secrets).
    List,
    /// Revoke a key by name.
    Revoke {
        /// The key's name.
        name: String,
    },
    /// What each key used over the last hours: client requests, failed ones, upstream attempts,
    /// prompt and completion tokens, cost at the configured prices, the last request (every live
    /// key, and revoked keys with requests in the window).
    Usage {
        /// The window, in hours back from now (each key's hourly sums are kept as long as the
        /// rollups, `[retention] rollups_days`, 400 days by default).
        #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..=24 * 366))]
        hours: u32,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `samewise keys ...`.
pub fn run(args: KeysArgs) -> anyhow::Result<()> {
    let (_, data_dir) = args.store.resolve()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let store = match args.command {
            // a key may be made before the gateway first starts
            KeysCommand::Create { .. } => Store::connect_from_env(&data_dir).await?,
            KeysCommand::List | KeysCommand::Revoke { .. } | KeysCommand::Usage { .. } => {
                super::open_existing_store(&data_dir).await?
            }
        };
        let result = keys(&store, args.command).await;
        store.close().await;
        result
    })
}

async fn keys(store: &Store, command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create { name, rpm, admin } => {
            let opts = KeyOptions {
                rpm_limit: rpm,
                admin,
            };
            let (key, plaintext) = store.create_api_key_with(&name, opts).await?;
            note!(
                "created {}key \"{}\" (id {}, {}); it is shown once, store it now:",
                if key.admin { "admin " } else { "" },
                key.name,
                key.id,
                key.rpm_limit
                    .map_or("no rate limit".to_owned(), |r| format!(
                        "{r} requests/minute"
                    ))
            );
            // a key nobody saw is a live secret nobody holds: revoke it and say so (not the
            // closed pipe's quiet exit 0)
            let shown = {
                use std::io::Write as _;
                let mut out = std::io::stdout().lock();
                writeln!(out, "{plaintext}").and_then(|()| out.flush())
            };
            if let Err(err) = shown {
                store.revoke_api_key(&key.name).await?;
                anyhow::bail!(
                    "could not print the new key ({err}); key \"{}\" was revoked, create it again",
                    key.name
                );
            }
        }
        KeysCommand::List => {
            for k in store.list_api_keys().await? {
                let rpm = k.rpm_limit.map_or("-".to_owned(), |r| r.to_string());
                let state = if k.revoked { "revoked" } else { "active" };
                let role = if k.admin { "admin" } else { "client" };
                outln!(
                    "{}\t{}\t{}...\trpm={}\t{}\t{}",
                    k.id,
                    k.name,
                    k.prefix,
                    rpm,
                    state,
                    role
                );
            }
        }
        KeysCommand::Revoke { name } => {
            if store.revoke_api_key(&name).await? {
                outln!("revoked \"{name}\"");
            } else {
                anyhow::bail!("no active key named \"{name}\"");
            }
        }
        KeysCommand::Usage { hours, json } => usage(store, hours, json).await?,
    }
    Ok(())
}

/// `keys usage`: the store's per-key sums beside the keys' names.
async fn usage(store: &Store, hours: u32, json: bool) -> anyhow::Result<()> {
    let since_ms = samewise_store::now_ms() - i64::from(hours) * 3_600_000;
    let used = store.key_usage(since_ms).await?;
    let rows: Vec<_> = store
        .list_api_keys()
        .await?
        .into_iter()
        .map(|k| {
            let u = used.iter().find(|u| u.key_id == k.id).cloned();
            (k, u)
        })
        .filter(|(k, u)| !k.revoked || u.is_some())
        .collect();
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(k, u)| {
                let last_ms = u.as_ref().map(|u| u.last_ms);
                let u = u.clone().unwrap_or_default();
                serde_json::json!({
                    "key": k.name, "id": k.id, "revoked": k.revoked,
                    "requests": u.requests, "failed": u.failed, "attempts": u.attempts,
                    "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                    "cost_usd": u.cost_usd, "last_ms": last_ms,
                })
            })
            .collect();
        let doc = serde_json::json!({"since_ms": since_ms, "hours": hours, "keys": v});
        outln!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    outln!(
        "usage since {} UTC (the last {hours} h)",
        utc_text(since_ms)
    );
    if rows.is_empty() {
        outln!("no keys");
        return Ok(());
    }
    let header = [
        "KEY",
        "ID",
        "STATE",
        "REQUESTS",
        "FAILED",
        "ATTEMPTS",
        "PROMPT TOKENS",
        "COMPLETION TOKENS",
        "COST (USD)",
        "LAST (UTC)",
    ];
    let table = rows
        .iter()
        .map(|(k, u)| {
            let last = u.as_ref().map_or("-".to_owned(), |u| utc_text(u.last_ms));
            let u = u.clone().unwrap_or_default();
            vec![
                k.name.clone(),
                k.id.to_string(),
                (if k.revoked { "revoked" } else { "active" }).to_owned(),
                u.requests.to_string(),
                u.failed.to_string(),
                u.attempts.to_string(),
                u.prompt_tokens.to_string(),
                u.completion_tokens.to_string(),
                format!("{:.6}", u.cost_usd),
                last,
            ]
        })
        .collect();
    out!("{}", super::text_table(&header, table));
    Ok(())
}
