//! `samewise config check FILE`: validates a configuration without starting anything. Prints a
//! summary and exits 0, or prints the error (naming the key and its line) and exits non-zero.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use samewise_proxy::Config;

/// Arguments of `samewise config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// `samewise config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a configuration file.
    Check {
        /// The configuration file (TOML).
        file: PathBuf,
    },
}

/// Runs `samewise config ...`.
pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    match args.command {
        ConfigCommand::Check { file } => {
            let config = Config::load(&file)?;
            // the probes tables are raw in the gateway config: the probes crate validates them
            let probes = super::probes::probes_config(&config)?;
            if let Some(p) = &probes {
                // detector thresholds, alert policy, webhooks and the ladder file
                samewise_probes::detect::Detectors::check_config(p)?;
            }
            // [evals] is raw too: the evals crate validates it
            let evals =
                samewise_evals::EvalsConfig::parse(config.evals.as_ref(), config.probes.as_ref())?;
            // `[dashboards]` and each model's `slo` table: the dashboards crate validates them
            samewise_dashboards::DashboardsConfig::parse(config.dashboards.as_ref())?;
            for (name, m) in &config.models {
                samewise_dashboards::Slo::parse(name, m.slo.as_ref())?;
            }
            out!("{}: ok\n{}", file.display(), config.summary());
            if config.evals.is_some() {
                outln!(
                    "evals: {} worker(s), reference {}",
                    evals.workers,
                    evals.reference_url.as_deref().unwrap_or("none")
                );
            }
            if let Some(p) = &probes {
                outln!(
                    "probes: {} model(s), reference {}",
                    p.models.len(),
                    super::probes::reference_label(p)
                );
                if let Some(problem) = samewise_probes::reference::chat_rendering_problem(p) {
                    outln!("  note: {problem}");
                }
            }
            for (name, p) in &config.providers {
                if let Some(var) = &p.api_key_env
                    && std::env::var_os(var).is_none()
                {
                    outln!(
                        "  note: provider {name} reads its key from ${var}, which is not set here"
                    );
                }
            }
            Ok(())
        }
    }
}
