//! Composition of the dashboards for `samewise serve`: the [`ModelSpec`]s from the gateway's
//! configuration (endpoint labels, each model's `slo` table, the calibration ladder's weight
//! levels from `[probes] ladder`) and a [`LiveState`] view of the gateway's routing (drift
//! quality flags and circuit breakers), so that the dashboards crate knows the gateway only
//! through them; and the evals' job [`samewise_evals::Opener`] (the one `samewise evals run`
//! uses) for `POST /api/v1/evals`.

use std::sync::Arc;

use anyhow::Context;
use samewise_dashboards::{Band, Dashboards, DashboardsConfig, LiveState, ModelSpec, Routing, Slo};
use samewise_probes::ladder::{Ladder, LevelKind};
use samewise_proxy::{AppState, Config, Quality};
use samewise_store::Store;

/// The gateway's routing, as the dashboards read it.
#[derive(Debug)]
struct Gateway(AppState);

impl LiveState for Gateway {
    fn routing(&self, model: &str, endpoint: &str) -> Option<Routing> {
        let route = self.0.model(model)?;
        let e = route.endpoints.iter().find(|e| e.id == endpoint)?;
        if e.health.is_open() {
            return Some(Routing {
                state: "excluded",
                why: Some("circuit breaker open".to_owned()),
            });
        }
        Some(match e.health.quality() {
            Quality::Ok => Routing {
                state: "active",
                why: None,
            },
            Quality::Demoted => Routing {
                state: "demoted",
                why: Some("active drift alert (on_drift = \"demote\")".to_owned()),
            },
            Quality::Excluded => Routing {
                state: "excluded",
                why: Some("active drift alert (on_drift = \"exclude\")".to_owned()),
            },
        })
    }
}

/// The dashboards' state for a running gateway.
pub fn build(config: &Config, store: Store, gateway: AppState) -> anyhow::Result<Dashboards> {
    let dash = DashboardsConfig::parse(config.dashboards.as_ref())?;
    let ladder = match super::probes::probes_config(config)?.and_then(|p| p.ladder) {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading the calibration ladder {}", path.display()))?;
            let l = Ladder::from_json(&text)?;
            bands(&l)
        }
        None => Vec::new(),
    };
    let mut models = Vec::new();
    for (name, m) in &config.models {
        models.push(ModelSpec {
            name: name.clone(),
            endpoints: m.endpoints.iter().map(|e| e.id().into_string()).collect(),
            slo: Slo::parse(name, m.slo.as_ref())?,
            ladder: ladder.clone(),
        });
    }
    let evals = samewise_evals::EvalsConfig::parse(config.evals.as_ref(), config.probes.as_ref())?;
    Ok(Dashboards::new(
        store,
        models,
        Arc::new(Gateway(gateway)),
        dash,
        Some(super::evals::opener(config, &evals)),
    ))
}

/// The ladder's weight levels, most bits first, at the statistic logprob probes report as
/// `kl_mean` (the top-k + tail KL).
fn bands(l: &Ladder) -> Vec<Band> {
    let mut out: Vec<Band> = l
        .levels
        .iter()
        .filter(|v| v.kind == LevelKind::Weights)
        .map(|v| Band {
            name: v.name.clone(),
            bits: v.bits,
            kl_mean: v.kl_topk_mean,
        })
        .collect();
    out.sort_by_key(|b| std::cmp::Reverse(b.bits));
    out
}
