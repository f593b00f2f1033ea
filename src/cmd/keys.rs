//! `samewise keys create NAME [--rpm N] [--admin]`, `keys list`, `keys revoke NAME`: samewise API keys
//! in the store (an `--admin` key also opens the dashboards and their API) (PostgreSQL when `DATABASE_URL` is set, else SQLite in the data directory of
//! `--config`, or `--data-dir`). A new key is printed once; only its hash is stored. A revoked
//! key stops working on running gateways within `limits.key_cache_ttl_ms` (default 10 s).

use clap::{Args, Subcommand};
use samewise_store::{KeyOptions, Store};

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
            KeysCommand::List | KeysCommand::Revoke { .. } => {
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
    }
    Ok(())
}
