//! [`AppState`]: everything a handler needs, built once from the configuration — the routes
//! per model, one HTTP client per provider with its (secret) auth header, the authenticator,
//! the record queue and the metrics. It is a `Clone` of one `Arc`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderValue;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use samewise_store::{RecordSender, Store};

use crate::ProxyError;
use crate::auth::{Authenticator, KeyCacheConfig};
use crate::config::{Config, Limits};
use crate::health::{EndpointHealth, FirstByteBounds};
use crate::metrics::{Metrics, SharedRegistry};
use crate::routing::{Endpoint, ModelRoute};
use crate::streams::OpenStreams;

/// Shared state of the gateway; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

/// The one copy of the state.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) limits: Limits,
    pub(crate) body_limit: usize,
    /// `[server] drain_timeout_ms`, for [`crate::serve`].
    pub(crate) drain_timeout: Duration,
    pub(crate) models: HashMap<String, Arc<ModelRoute>>,
    pub(crate) upstreams: HashMap<String, Upstream>,
    pub(crate) auth: Authenticator,
    pub(crate) records: RecordSender,
    /// Streams open per key (`limits.max_streams_per_key`).
    pub(crate) streams: Arc<OpenStreams>,
    pub(crate) metrics: Metrics,
    pub(crate) rng: Mutex<SmallRng>,
}

/// How to reach one provider.
#[derive(Debug)]
pub(crate) struct Upstream {
    /// Base URL including `/v1`.
    pub(crate) base_url: String,
    /// `Bearer <provider key>`, marked sensitive so it is never printed.
    pub(crate) auth: Option<HeaderValue>,
    /// Client with this provider's connect timeout.
    pub(crate) client: reqwest::Client,
    /// Floor and cap of the adaptive first-byte deadlines.
    pub(crate) first_byte: FirstByteBounds,
    /// Longest silence while reading a body.
    pub(crate) idle_timeout: Duration,
}

impl AppState {
    /// Builds the state. Provider keys are read from the environment here; a missing one is an
    /// error naming the variable (never its value).
    pub fn new(
        config: &Config,
        store: Store,
        records: RecordSender,
    ) -> Result<AppState, ProxyError> {
        Self::with_env(config, store, records, |name| std::env::var(name).ok())
    }

    /// As [`AppState::new`], registering the gateway's metric families in `registry` (the
    /// process's one registry, created at composition) instead of a registry of its own.
    pub fn new_in(
        config: &Config,
        store: Store,
        records: RecordSender,
        registry: SharedRegistry,
    ) -> Result<AppState, ProxyError> {
        Self::build(
            config,
            store,
            records,
            |name| std::env::var(name).ok(),
            registry,
        )
    }

    /// As [`AppState::new`], reading variables through `env` (tests pass their own).
    pub fn with_env(
        config: &Config,
        store: Store,
        records: RecordSender,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<AppState, ProxyError> {
        Self::build(config, store, records, env, crate::metrics::new_registry())
    }

    fn build(
        config: &Config,
        store: Store,
        records: RecordSender,
        env: impl Fn(&str) -> Option<String>,
        registry: SharedRegistry,
    ) -> Result<AppState, ProxyError> {
        let mut upstreams = HashMap::new();
        for (name, p) in &config.providers {
            let auth = match p.api_key(name, &env)? {
                None => None,
                Some(key) => {
                    let mut v = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                        ProxyError::HttpClient {
                            provider: name.clone(),
                            message: format!(
                                "${} holds characters not allowed in an HTTP header",
                                p.api_key_env.as_deref().unwrap_or_default()
                            ),
                        }
                    })?;
                    v.set_sensitive(true);
                    Some(v)
                }
            };
            let client = reqwest::Client::builder()
                .connect_timeout(p.connect_timeout)
                .tcp_nodelay(true)
                .pool_idle_timeout(Duration::from_secs(60))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| ProxyError::HttpClient {
                    provider: name.clone(),
                    message: e.to_string(),
                })?;
            upstreams.insert(
                name.clone(),
                Upstream {
                    base_url: p.base_url.clone(),
                    auth,
                    client,
                    first_byte: FirstByteBounds {
                        floor: p.first_byte_floor,
                        cap: p.first_byte_timeout,
                    },
                    idle_timeout: p.idle_timeout,
                },
            );
        }

        let mut models = HashMap::new();
        let mut all = Vec::new();
        for (name, m) in &config.models {
            let mut endpoints = Vec::new();
            for e in &m.endpoints {
                let Some(p) = config.providers.get(&e.provider) else {
                    return Err(ProxyError::ConfigInvalid {
                        key: format!("models.{name}.endpoints"),
                        line: None,
                        message: format!("names unknown provider \"{}\"", e.provider),
                    });
                };
                let ep = Arc::new(Endpoint {
                    id: e.id().into_string(),
                    provider: e.provider.clone(),
                    upstream_model: e.model.clone(),
                    weight: e.weight,
                    price_input_per_mtok: p.price_input_per_mtok,
                    price_output_per_mtok: p.price_output_per_mtok,
                    data_collection: p.data_collection,
                    quantization: p.quantization.clone(),
                    health: Arc::new(EndpointHealth::new(config.breaker.clone())),
                });
                all.push(Arc::clone(&ep));
                endpoints.push(ep);
            }
            models.insert(
                name.clone(),
                Arc::new(ModelRoute {
                    name: name.clone(),
                    policy: m.policy,
                    endpoints,
                    hedge_after: m.hedge_after,
                    capture: m.capture,
                }),
            );
        }

        let metrics = Metrics::new(records.clone(), all, registry);
        Ok(AppState {
            inner: Arc::new(Inner {
                limits: config.limits.clone(),
                body_limit: config.server.body_limit_bytes,
                drain_timeout: config.server.drain_timeout,
                models,
                upstreams,
                auth: Authenticator::new(
                    store,
                    KeyCacheConfig::new(config.limits.key_cache_ttl, config.limits.key_stale_grace),
                ),
                records,
                streams: Arc::new(OpenStreams::default()),
                metrics,
                rng: Mutex::new(SmallRng::from_os_rng()),
            }),
        })
    }

    /// The route of a logical model, for the probe path and tests (health flags live on its
    /// endpoints).
    pub fn model(&self, name: &str) -> Option<Arc<ModelRoute>> {
        self.inner.models.get(name).cloned()
    }

    /// The Prometheus text exposition.
    pub fn render_metrics(&self) -> String {
        self.inner.metrics.render()
    }

    /// A per-request random generator seeded from the shared one.
    pub(crate) fn rng(&self) -> SmallRng {
        match self.inner.rng.lock() {
            Ok(mut r) => SmallRng::from_rng(&mut *r),
            Err(_) => SmallRng::seed_from_u64(0x5eed),
        }
    }
}
