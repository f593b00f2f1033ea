//! Quality-aware routing: a tracked background task of `samewise serve` that re-reads the
//! store's active alerts (open or acknowledged) every `server.alert_poll_ms` (default 2 s)
//! and sets each endpoint's [`Quality`] from its model's `on_drift`:
//! `demote` → [`Quality::Demoted`] (tried after every endpoint without an alert, still a
//! fallback), `exclude` → [`Quality::Excluded`] (never chosen while the model has an
//! endpoint without an alert; when every endpoint of a model has one, they are all demoted
//! rather than leaving the model unservable), `ignore` → [`Quality::Ok`].
//! An endpoint whose alerts are all resolved goes back to [`Quality::Ok`] at the next poll.
//!
//! This runs beside the request path, never on it: the router only reads the flag. A failed
//! read of the alerts keeps the flags as they were (logged), so a database hiccup neither
//! restores a drifting endpoint nor excludes a healthy one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use samewise_store::{Alert, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::config::{Config, OnDrift};
use crate::health::Quality;

/// The quality a model's `on_drift` gives an endpoint with (`alerted`) or without alerts.
pub fn quality_for(on_drift: OnDrift, alerted: bool) -> Quality {
    match (alerted, on_drift) {
        (true, OnDrift::Demote) => Quality::Demoted,
        (true, OnDrift::Exclude) => Quality::Excluded,
        _ => Quality::Ok,
    }
}

/// Sets every endpoint's quality from `alerts` (the active ones); returns how many flags
/// changed. Alerts name the model and the endpoint as the proxy does (`provider/model-id`).
pub fn apply_alerts(
    state: &AppState,
    on_drift: &HashMap<String, OnDrift>,
    alerts: &[Alert],
) -> usize {
    let alerted: HashSet<(&str, &str)> = alerts
        .iter()
        .map(|a| (a.model.as_str(), a.endpoint.as_str()))
        .collect();
    let mut changed = 0;
    for (model, route) in &state.inner.models {
        let mut policy = on_drift.get(model).copied().unwrap_or_default();
        let is_alerted = |id: &str| alerted.contains(&(model.as_str(), id));
        if policy == OnDrift::Exclude && route.endpoints.iter().all(|e| is_alerted(&e.id)) {
            // excluding every endpoint would leave the model unservable: demote them all
            // instead, so they are still tried (excluded = never chosen while another exists)
            policy = OnDrift::Demote;
        }
        for ep in &route.endpoints {
            let want = quality_for(policy, is_alerted(&ep.id));
            let was = ep.health.quality();
            if was != want {
                ep.health.set_quality(want);
                changed += 1;
                tracing::warn!(model = %model, endpoint = %ep.id, from = ?was, to = ?want, "endpoint routing quality changed by drift alerts");
            }
        }
    }
    changed
}

/// The running alert poller; [`QualityWatcher::shutdown`] stops it and waits for it.
#[derive(Debug)]
pub struct QualityWatcher {
    cancel: CancellationToken,
    task: JoinHandle<()>,
    /// Polls completed (alerts read and applied); a test waits for it to advance instead of
    /// sleeping before asserting that nothing changed.
    polls: Arc<AtomicU64>,
}

impl QualityWatcher {
    /// Starts polling `store` for `state`'s endpoints every `config.server.alert_poll`; the
    /// first poll is immediate.
    pub fn spawn(config: &Config, state: AppState, store: Store) -> QualityWatcher {
        let on_drift: HashMap<String, OnDrift> = config
            .models
            .iter()
            .map(|(name, m)| (name.clone(), m.on_drift))
            .collect();
        let cancel = CancellationToken::new();
        let polls = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(poll(
            state,
            store,
            on_drift,
            config.server.alert_poll,
            cancel.clone(),
            polls.clone(),
        ));
        QualityWatcher {
            cancel,
            task,
            polls,
        }
    }

    /// Polls completed so far: alerts read from the store and applied to routing.
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Acquire)
    }

    /// Stops polling and waits for the task to end.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "alert poller panicked");
        }
    }
}

async fn poll(
    state: AppState,
    store: Store,
    on_drift: HashMap<String, OnDrift>,
    every: Duration,
    cancel: CancellationToken,
    polls: Arc<AtomicU64>,
) {
    // interval() panics on zero; the config refuses 0, but a hand-built Config might not
    let mut ticks = tokio::time::interval(every.max(Duration::from_millis(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let read = tokio::select! {
            () = cancel.cancelled() => return,
            r = store.active_alerts() => r,
        };
        match read {
            Ok(alerts) => {
                if failing {
                    tracing::info!("reading active alerts works again");
                    failing = false;
                }
                apply_alerts(&state, &on_drift, &alerts);
                polls.fetch_add(1, Ordering::Release);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read active alerts; endpoint quality flags kept as they are");
                }
                failing = true;
            }
        }
    }
}
