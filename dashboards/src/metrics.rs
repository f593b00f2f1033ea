//! The dashboards' Prometheus families, registered in the process's one registry: the latest
//! probe statistics per endpoint and kind, probe runs and failures, active alerts by kind,
//! routing state and goodput. Labels are bounded (configured models and endpoints, probe
//! kinds, the charted statistics, alert kinds and states); names carry units.
//!
//! The values come from the store, which a scrape (synchronous) cannot wait on: a
//! [`Refresher`] task reads them every `every` into a snapshot that [`DashMetrics`] encodes
//! at each scrape. The refresher is stopped and awaited by [`Refresher::shutdown`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use samewise_store::{ProbeRunQuery, RollupQuery};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::view::CHARTED_STATS;
use crate::{DashError, Dashboards, stats};

/// The window goodput is exported over.
const GOODPUT_WINDOW_MS: i64 = 3_600_000;

/// What the last refresh read.
#[derive(Debug, Default, Clone)]
struct Snapshot {
    /// (model, endpoint, kind, stat, value).
    stats: Vec<(String, String, String, String, f64)>,
    /// (model, endpoint, kind, outcome, runs).
    runs: Vec<(String, String, String, &'static str, u64)>,
    /// (model, kind, state, count).
    alerts: Vec<(String, String, String, i64)>,
    /// (model, endpoint, state, 0/1).
    routing: Vec<(String, String, &'static str, i64)>,
    /// (model, endpoint, goodput lower bound).
    goodput: Vec<(String, String, f64)>,
}

/// The collector registered in the registry; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct DashMetrics {
    snapshot: Arc<Mutex<Snapshot>>,
}

/// The task that keeps [`DashMetrics`] fresh.
#[derive(Debug)]
pub struct Refresher {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl DashMetrics {
    /// Registers the dashboards' families in `registry`.
    pub fn register(registry: &mut Registry) -> DashMetrics {
        let m = DashMetrics::default();
        registry.register_collector(Box::new(m.clone()));
        m
    }

    /// Reads every value from the store and the gateway's routing.
    pub async fn refresh(&self, d: &Dashboards) -> Result<(), DashError> {
        let store = &d.inner.store;
        let mut s = Snapshot::default();
        for m in &d.inner.models {
            for e in &m.endpoints {
                let runs = store
                    .probe_run_stats(&ProbeRunQuery {
                        endpoint: Some(e.clone()),
                        limit: 200,
                        ..ProbeRunQuery::default()
                    })
                    .await?;
                let mut seen: Vec<&str> = Vec::new();
                for r in runs.iter().filter(|r| r.ok) {
                    if seen.contains(&r.kind.as_str()) {
                        continue;
                    }
                    seen.push(&r.kind);
                    for stat in CHARTED_STATS {
                        if let Some(v) = r.stats.get(stat).and_then(serde_json::Value::as_f64) {
                            s.stats.push((
                                m.name.clone(),
                                e.clone(),
                                r.kind.clone(),
                                stat.to_owned(),
                                v,
                            ));
                        }
                    }
                }
                if let Some(rt) = d.inner.live.routing(&m.name, e) {
                    for state in ["active", "demoted", "excluded"] {
                        s.routing.push((
                            m.name.clone(),
                            e.clone(),
                            state,
                            i64::from(rt.state == state),
                        ));
                    }
                }
            }
            if let Some(slo) = m.slo {
                let now = samewise_store::now_ms();
                let rollups = store
                    .endpoint_rollups(&RollupQuery {
                        model: Some(m.name.clone()),
                        endpoint: None,
                        since_ms: now - GOODPUT_WINDOW_MS,
                        until_ms: now + 1,
                    })
                    .await?;
                for r in rollups {
                    if let Some(g) = stats::goodput(&r.totals, &slo) {
                        s.goodput
                            .push((m.name.clone(), r.endpoint.clone(), g.at_least));
                    }
                }
            }
        }
        let configured = |model: &str, endpoint: &str| {
            d.model(model)
                .is_some_and(|m| m.endpoints.iter().any(|e| e == endpoint))
        };
        for c in store.probe_run_counts().await? {
            if configured(&c.model, &c.endpoint) {
                let outcome = if c.ok { "ok" } else { "failed" };
                s.runs.push((
                    c.model,
                    c.endpoint,
                    c.kind,
                    outcome,
                    u64::try_from(c.runs).unwrap_or(0),
                ));
            }
        }
        for a in store.active_alerts().await? {
            if d.model(&a.model).is_none() {
                continue;
            }
            let state = a.state.as_str().to_owned();
            match s
                .alerts
                .iter_mut()
                .find(|x| x.0 == a.model && x.1 == a.kind && x.2 == state)
            {
                Some(x) => x.3 += 1,
                None => s.alerts.push((a.model.clone(), a.kind.clone(), state, 1)),
            }
        }
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = s;
        Ok(())
    }
}

impl Collector for DashMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self
            .snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut f = encoder.encode_descriptor(
            "probe_statistic",
            "Latest value of a probe statistic per endpoint and probe kind (unitless: nats for KL, ratios otherwise)",
            None,
            MetricType::Gauge,
        )?;
        for (model, endpoint, kind, stat, v) in &s.stats {
            let labels = [
                ("model", model.as_str()),
                ("endpoint", endpoint),
                ("kind", kind),
                ("stat", stat),
            ];
            ConstGauge::new(*v).encode(f.encode_family(&labels)?)?;
        }
        let mut f = encoder.encode_descriptor(
            "probe_runs",
            "Probe runs stored per endpoint and kind, by outcome (ok or failed)",
            None,
            MetricType::Counter,
        )?;
        for (model, endpoint, kind, outcome, n) in &s.runs {
            let labels = [
                ("model", model.as_str()),
                ("endpoint", endpoint),
                ("kind", kind),
                ("outcome", outcome),
            ];
            ConstCounter::new(*n).encode(f.encode_family(&labels)?)?;
        }
        let mut f = encoder.encode_descriptor(
            "alerts_active",
            "Active (open or acknowledged) alerts by model, kind and state",
            None,
            MetricType::Gauge,
        )?;
        for (model, kind, state, n) in &s.alerts {
            let labels = [("model", model.as_str()), ("kind", kind), ("state", state)];
            ConstGauge::new(*n).encode(f.encode_family(&labels)?)?;
        }
        let mut f = encoder.encode_descriptor(
            "endpoint_routing_state",
            "Routing state per endpoint: 1 for its current state (active, demoted, excluded), else 0",
            None,
            MetricType::Gauge,
        )?;
        for (model, endpoint, state, v) in &s.routing {
            let labels = [
                ("model", model.as_str()),
                ("endpoint", endpoint),
                ("state", state),
            ];
            ConstGauge::new(*v).encode(f.encode_family(&labels)?)?;
        }
        let mut f = encoder.encode_descriptor(
            "goodput_ratio",
            "Lower bound of the share of the last hour's attempts that succeeded within the model's TTFT and TPOT targets",
            None,
            MetricType::Gauge,
        )?;
        for (model, endpoint, v) in &s.goodput {
            let labels = [("model", model.as_str()), ("endpoint", endpoint)];
            ConstGauge::new(*v).encode(f.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Refresher {
    /// Refreshes `metrics` from `d` now and then every `every`, until shut down.
    pub fn spawn(d: Dashboards, metrics: DashMetrics, every: Duration) -> Refresher {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = metrics.refresh(&d).await {
                    tracing::warn!(error = %e, "refreshing the dashboards' metrics failed");
                }
                tokio::select! {
                    _ = stopped.changed() => break,
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
        Refresher { task, stop }
    }

    /// Stops the task and waits for it.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the dashboards' metrics task failed");
        }
    }
}
