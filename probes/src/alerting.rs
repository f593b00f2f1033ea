//! The alert lifecycle on top of the store: open (or refresh) an alert for a detector's
//! finding, acknowledge, resolve by hand, auto-resolve after a quiet period, and tell the
//! webhooks about every opening and every resolution. The store keeps at most one active
//! alert per model, endpoint and kind, so a finding seen every round refreshes one alert and
//! notifies once; a finding after a resolution opens a new alert and notifies again.

use std::time::Duration;

use samewise_store::{Alert, AlertState, NewAlert, Store};
use serde::Deserialize;

use crate::webhook::{AlertEvent, Notifier, WebhookConfig, WebhookStats};
use crate::{ProbesError, Result};

/// `[probes.alerts]` and `[[probes.webhooks]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertsConfig {
    /// An active alert no detector has confirmed for this long is resolved automatically.
    pub quiet_period: Duration,
    /// Where alert events are sent.
    pub webhooks: Vec<WebhookConfig>,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            quiet_period: Duration::from_secs(3_600),
            webhooks: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlerts {
    quiet_period_ms: Option<u64>,
}

impl AlertsConfig {
    /// Parses the `alerts` table and the `webhooks` array out of the detectors' part of the
    /// probes config (see `ProbesConfig::detectors`).
    pub fn parse(detectors: &toml::Table) -> Result<AlertsConfig> {
        let mut cfg = AlertsConfig::default();
        if let Some(v) = detectors.get("alerts") {
            let raw = RawAlerts::deserialize(v.clone())
                .map_err(|e| ProbesError::Config(format!("probes.alerts: {}", e.message())))?;
            if let Some(ms) = raw.quiet_period_ms {
                if ms == 0 {
                    return Err(ProbesError::Config(
                        "probes.alerts.quiet_period_ms: must be positive".to_owned(),
                    ));
                }
                cfg.quiet_period = Duration::from_millis(ms);
            }
        }
        if let Some(v) = detectors.get("webhooks") {
            cfg.webhooks = WebhookConfig::parse_list(v, "probes.webhooks")?;
        }
        Ok(cfg)
    }
}

/// Alert operations that notify the webhooks.
#[derive(Debug)]
pub struct Alerting {
    quiet_period: Duration,
    notifier: Notifier,
}

fn store_err(e: samewise_store::StoreError) -> ProbesError {
    ProbesError::Store(e)
}

impl Alerting {
    /// Starts the webhook worker (when hooks are configured; needs a tokio runtime).
    pub fn start(cfg: &AlertsConfig) -> Result<Alerting> {
        Ok(Alerting {
            quiet_period: cfg.quiet_period,
            notifier: Notifier::start(cfg.webhooks.clone())?,
        })
    }

    /// Opens an alert for `finding` or refreshes the active one; notifies on opening.
    /// Returns the alert and whether it was newly opened.
    pub async fn raise(&self, store: &Store, finding: &NewAlert) -> Result<(Alert, bool)> {
        let (alert, opened) = store.upsert_alert(finding).await.map_err(store_err)?;
        if opened {
            tracing::warn!(
                alert = alert.id,
                model = %alert.model,
                endpoint = %alert.endpoint,
                kind = %alert.kind,
                summary = %alert.summary,
                "alert opened"
            );
            self.notifier.notify(AlertEvent::Opened, &alert);
        }
        Ok((alert, opened))
    }

    /// Confirms the active alert of `finding`'s endpoint and kind with it (its evidence and
    /// `last_seen_ms`, so its quiet period starts over); opens none, notifies nobody. None
    /// when no such alert is active.
    pub async fn confirm(&self, store: &Store, finding: &NewAlert) -> Result<Option<Alert>> {
        store.refresh_alert(finding).await.map_err(store_err)
    }

    /// Acknowledges alert `id` (no notification).
    pub async fn acknowledge(&self, store: &Store, id: i64) -> Result<Option<Alert>> {
        store.ack_alert(id).await.map_err(store_err)
    }

    /// Resolves alert `id`; notifies when it was active.
    pub async fn resolve(&self, store: &Store, id: i64) -> Result<Option<Alert>> {
        let before = store.alert(id).await.map_err(store_err)?;
        let after = store.resolve_alert(id).await.map_err(store_err)?;
        if let (Some(b), Some(a)) = (&before, &after)
            && b.state != AlertState::Resolved
            && a.state == AlertState::Resolved
        {
            self.notifier.notify(AlertEvent::Resolved, a);
        }
        Ok(after)
    }

    /// Resolves every active alert not confirmed within the quiet period before `now_ms`;
    /// notifies for each.
    pub async fn auto_resolve(&self, store: &Store, now_ms: i64) -> Result<Vec<Alert>> {
        let quiet_ms = i64::try_from(self.quiet_period.as_millis()).unwrap_or(i64::MAX);
        let resolved = store
            .resolve_quiet_alerts(now_ms.saturating_sub(quiet_ms))
            .await
            .map_err(store_err)?;
        for a in &resolved {
            tracing::info!(alert = a.id, endpoint = %a.endpoint, kind = %a.kind, "alert auto-resolved after its quiet period");
            self.notifier.notify(AlertEvent::Resolved, a);
        }
        Ok(resolved)
    }

    /// Webhook delivery counters.
    pub fn webhook_stats(&self) -> WebhookStats {
        self.notifier.stats()
    }

    /// Waits for queued webhook deliveries to finish; call on shutdown.
    pub async fn shutdown(&self) {
        self.notifier.shutdown().await;
    }
}
