//! Webhook delivery of alert events (opened, resolved): a generic JSON body or a
//! Slack-compatible `{"text": ...}`, POSTed to each configured URL by one tracked background
//! worker, with bounded retries and exponential backoff. A delivery that still fails after
//! its last attempt is logged and counted, never retried forever; a full queue drops the
//! event (counted, logged) rather than blocking a detector.
//!
//! Webhook URLs often carry a secret (Slack's do): they may be given through an environment
//! variable (`url_env`), and they are never logged — log lines name the hook by its index
//! and host only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use samewise_store::{Alert, Resolver};
use serde::Deserialize;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

use crate::{ProbesError, Result};

/// The body a hook receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    /// `{"event": "opened"|"resolved", "alert": {...}}`.
    #[default]
    Generic,
    /// `{"text": "..."}` (Slack incoming webhooks, Mattermost, Discord's /slack endpoint).
    Slack,
}

/// What happened to an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertEvent {
    /// A new alert was opened.
    Opened,
    /// An alert was resolved (by an operator or after its quiet period).
    Resolved,
}

/// One webhook.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookConfig {
    /// Where to POST (http or https).
    pub url: String,
    /// Body format.
    pub format: WebhookFormat,
    /// Attempts per event, the first included (≥ 1).
    pub max_attempts: u32,
    /// Wait before the first retry; doubled for each further retry.
    pub backoff: Duration,
    /// Longest wait between two attempts.
    pub max_backoff: Duration,
    /// Timeout of one attempt.
    pub timeout: Duration,
}

/// `[[probes.webhooks]]` as written in the config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    url: Option<String>,
    url_env: Option<String>,
    format: Option<WebhookFormat>,
    max_attempts: Option<u32>,
    backoff_ms: Option<u64>,
    max_backoff_ms: Option<u64>,
    timeout_ms: Option<u64>,
}

impl WebhookConfig {
    /// Parses the `webhooks` value (an array of tables); `key` names it in errors.
    /// `url_env` is read from the environment now.
    pub fn parse_list(value: &toml::Value, key: &str) -> Result<Vec<WebhookConfig>> {
        let toml::Value::Array(items) = value else {
            return Err(ProbesError::Config(format!(
                "{key}: must be an array of tables ([[probes.webhooks]])"
            )));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let k = format!("{key}[{i}]");
                let raw = RawWebhook::deserialize(item.clone())
                    .map_err(|e| ProbesError::Config(format!("{k}: {}", e.message())))?;
                let url = match (raw.url, raw.url_env) {
                    (Some(u), None) => u,
                    (None, Some(var)) => std::env::var(&var).map_err(|_| {
                        ProbesError::Config(format!(
                            "{k}.url_env: environment variable {var} is not set"
                        ))
                    })?,
                    _ => {
                        return Err(ProbesError::Config(format!(
                            "{k}: give exactly one of url and url_env"
                        )));
                    }
                };
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(ProbesError::Config(format!("{k}: the URL is not http(s)")));
                }
                let max_attempts = raw.max_attempts.unwrap_or(5);
                if !(1..=20).contains(&max_attempts) {
                    return Err(ProbesError::Config(format!(
                        "{k}.max_attempts: must be in 1..=20"
                    )));
                }
                let timeout_ms = raw.timeout_ms.unwrap_or(5_000);
                if timeout_ms == 0 {
                    return Err(ProbesError::Config(format!(
                        "{k}.timeout_ms: must be positive"
                    )));
                }
                Ok(WebhookConfig {
                    url,
                    format: raw.format.unwrap_or_default(),
                    max_attempts,
                    backoff: Duration::from_millis(raw.backoff_ms.unwrap_or(500)),
                    max_backoff: Duration::from_millis(raw.max_backoff_ms.unwrap_or(30_000)),
                    timeout: Duration::from_millis(timeout_ms),
                })
            })
            .collect()
    }

    /// The wait before attempt `attempt` (2, 3, ...): `backoff · 2^(attempt−2)`, at most
    /// `max_backoff`.
    pub fn delay_before(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(2).min(30);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }

    /// The hook as logs name it: its host, never its path or query (they may hold a secret).
    fn shown(&self, index: usize) -> String {
        let host = reqwest::Url::parse(&self.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned());
        format!("webhook #{index} ({host})")
    }
}

/// The body POSTed for `event` on `alert` in `format`.
pub fn payload(format: WebhookFormat, event: AlertEvent, alert: &Alert) -> serde_json::Value {
    match format {
        WebhookFormat::Generic => serde_json::json!({
            "event": event,
            "alert": alert.to_json(),
        }),
        WebhookFormat::Slack => {
            let verb = match (event, alert.resolved_by) {
                (AlertEvent::Opened, _) => "opened",
                (AlertEvent::Resolved, Some(Resolver::Operator)) => "resolved by an operator",
                (AlertEvent::Resolved, Some(Resolver::Quiet)) => {
                    "auto-resolved after its quiet period"
                }
                (AlertEvent::Resolved, None) => "resolved",
            };
            serde_json::json!({
                "text": format!(
                    "samewise alert #{} {verb}: {} on {} (model {}): {}",
                    alert.id, alert.kind, alert.endpoint, alert.model, alert.summary
                )
            })
        }
    }
}

/// Delivery counters, shared with the worker.
#[derive(Debug, Default)]
pub struct WebhookCounters {
    delivered: AtomicU64,
    failed: AtomicU64,
    retries: AtomicU64,
    dropped: AtomicU64,
}

/// A snapshot of the delivery counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WebhookStats {
    /// Deliveries a hook accepted (2xx).
    pub delivered: u64,
    /// Deliveries given up after their last attempt.
    pub failed: u64,
    /// Attempts after the first (each retry counts once).
    pub retries: u64,
    /// Events dropped because the queue was full or the notifier shut down.
    pub dropped: u64,
}

impl WebhookCounters {
    fn snapshot(&self) -> WebhookStats {
        WebhookStats {
            delivered: self.delivered.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// Events waiting for delivery at most.
pub const QUEUE_CAPACITY: usize = 1024;

/// Sends alert events to the configured webhooks from one tracked background task.
#[derive(Debug)]
pub struct Notifier {
    tx: std::sync::Mutex<Option<mpsc::Sender<(AlertEvent, Alert)>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    counters: Arc<WebhookCounters>,
    hooks: usize,
}

impl Notifier {
    /// Starts the delivery worker (needs a tokio runtime). With no hooks nothing is spawned.
    pub fn start(hooks: Vec<WebhookConfig>) -> Result<Notifier> {
        let counters = Arc::new(WebhookCounters::default());
        let n = hooks.len();
        if hooks.is_empty() {
            return Ok(Notifier {
                tx: std::sync::Mutex::new(None),
                worker: Mutex::new(None),
                counters,
                hooks: 0,
            });
        }
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| ProbesError::Config(format!("webhook HTTP client: {e}")))?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let worker = tokio::spawn(deliver_all(rx, hooks, client, Arc::clone(&counters)));
        Ok(Notifier {
            tx: std::sync::Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
            counters,
            hooks: n,
        })
    }

    /// Queues `event` on `alert` for every hook; never waits. Dropped (and counted) when the
    /// queue is full or the notifier is shut down.
    pub fn notify(&self, event: AlertEvent, alert: &Alert) {
        if self.hooks == 0 {
            return;
        }
        let guard = match self.tx.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let sent = guard
            .as_ref()
            .map(|tx| tx.try_send((event, alert.clone())).is_ok())
            .unwrap_or(false);
        if !sent {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                alert = alert.id,
                ?event,
                "webhook queue full or closed: event dropped"
            );
        }
    }

    /// The delivery counters now.
    pub fn stats(&self) -> WebhookStats {
        self.counters.snapshot()
    }

    /// Stops taking events and waits for the queued ones to be delivered (or to fail).
    pub async fn shutdown(&self) {
        let tx = match self.tx.lock() {
            Ok(mut g) => g.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        drop(tx);
        if let Some(worker) = self.worker.lock().await.take() {
            if let Err(e) = worker.await {
                tracing::error!(error = %e, "webhook worker panicked");
            }
            let s = self.stats();
            tracing::info!(
                delivered = s.delivered,
                failed = s.failed,
                retries = s.retries,
                dropped = s.dropped,
                "webhook worker stopped"
            );
        }
    }
}

async fn deliver_all(
    mut rx: mpsc::Receiver<(AlertEvent, Alert)>,
    hooks: Vec<WebhookConfig>,
    client: reqwest::Client,
    counters: Arc<WebhookCounters>,
) {
    while let Some((event, alert)) = rx.recv().await {
        for (i, hook) in hooks.iter().enumerate() {
            deliver(&client, i, hook, event, &alert, &counters).await;
        }
    }
}

async fn deliver(
    client: &reqwest::Client,
    index: usize,
    hook: &WebhookConfig,
    event: AlertEvent,
    alert: &Alert,
    counters: &WebhookCounters,
) {
    let body = match serde_json::to_vec(&payload(hook.format, event, alert)) {
        Ok(b) => b,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(alert = alert.id, error = %e, "webhook payload could not be encoded");
            return;
        }
    };
    let mut last_error = String::new();
    for attempt in 1..=hook.max_attempts {
        if attempt > 1 {
            counters.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(hook.delay_before(attempt)).await;
        }
        let sent = client
            .post(&hook.url)
            .timeout(hook.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(resp) if resp.status().is_success() => {
                counters.delivered.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(resp) => last_error = format!("HTTP {}", resp.status().as_u16()),
            // reqwest's message may quote the URL: keep only the error's class
            Err(e) if e.is_timeout() => last_error = "timed out".to_owned(),
            Err(e) if e.is_connect() => last_error = "connection failed".to_owned(),
            Err(_) => last_error = "request failed".to_owned(),
        }
        tracing::debug!(hook = %hook.shown(index), attempt, error = %last_error, "webhook attempt failed");
    }
    counters.failed.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        hook = %hook.shown(index),
        alert = alert.id,
        ?event,
        attempts = hook.max_attempts,
        error = %last_error,
        "webhook delivery failed after its last attempt"
    );
}
