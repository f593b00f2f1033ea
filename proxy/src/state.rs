//! [`AppState`]: everything a handler needs, built once from the configuration — the routes
//! per model, each provider's (secret) auth header and upstream URLs, the authenticator, the
//! record queue and the metrics — plus one HTTP client per provider. The clients are the only
//! part a serving thread does not share: [`AppState::for_shard`] gives each its own, so an
//! upstream connection is driven by the thread whose requests use it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use samewise_store::{RecordSender, Store};

use crate::ProxyError;
use crate::auth::{Authenticator, KeyCacheConfig};
use crate::body::Route;
use crate::config::{Config, Limits};
use crate::health::{EndpointHealth, FirstByteBounds};
use crate::metrics::{Metrics, SharedRegistry};
use crate::routing::{Endpoint, ModelRoute};
use crate::streams::OpenStreams;

/// The HTTP client of one provider: hyper's pooled client over TCP or TLS (rustls, the Mozilla
/// roots), HTTP/1.1 or HTTP/2 as ALPN settles; request bodies are whole (`Full`).
pub(crate) type UpstreamClient = hyper_util::client::legacy::Client<
    SharedConnector<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    >,
    http_body_util::Full<bytes::Bytes>,
>;

/// A connector behind one `Arc`. hyper's pooled client clones its connector for every request
/// (ready to connect should no idle connection come first) and drops it when the pool answers;
/// the TLS connector's clone is three reference counts and its drop three more. This one's
/// clone is one count; the connector itself is cloned only when a connection is opened.
#[derive(Debug)]
pub(crate) struct SharedConnector<C> {
    shared: Arc<C>,
    /// The copy that was asked to be ready and makes the next connection.
    ready: Option<C>,
}

impl<C> Clone for SharedConnector<C> {
    /// One reference count: a clone is made ready (its own copy) only when it connects.
    fn clone(&self) -> Self {
        SharedConnector {
            shared: Arc::clone(&self.shared),
            ready: None,
        }
    }
}

impl<C> SharedConnector<C> {
    fn new(connector: C) -> Self {
        SharedConnector {
            shared: Arc::new(connector),
            ready: None,
        }
    }
}

impl<C: tower_service::Service<http::Uri> + Clone> tower_service::Service<http::Uri>
    for SharedConnector<C>
{
    type Response = C::Response;
    type Error = C::Error;
    type Future = C::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        let shared = &self.shared;
        self.ready
            .get_or_insert_with(|| C::clone(shared))
            .poll_ready(cx)
    }

    fn call(&mut self, dst: http::Uri) -> Self::Future {
        let shared = &self.shared;
        self.ready
            .take()
            .unwrap_or_else(|| C::clone(shared))
            .call(dst)
    }
}

/// Shared state of the gateway; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
    /// One HTTP client (a connection pool) per provider, by name: this serving thread's.
    clients: Arc<HashMap<String, UpstreamClient>>,
}

/// The one copy of the state.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) limits: Limits,
    pub(crate) body_limit: usize,
    /// How [`crate::serve`] serves.
    pub(crate) serving: crate::Serving,
    pub(crate) models: HashMap<String, Arc<ModelRoute>>,
    pub(crate) upstreams: HashMap<String, Upstream>,
    pub(crate) auth: Authenticator,
    pub(crate) records: RecordSender,
    /// Streams open per key (`limits.max_streams_per_key`).
    pub(crate) streams: Arc<OpenStreams>,
    pub(crate) metrics: Metrics,
    /// Compiled `tools`, by their bytes, for every request.
    pub(crate) tools: crate::ToolsCache,
}

/// How to reach one provider.
#[derive(Debug)]
pub(crate) struct Upstream {
    /// Where chat completions go: the base URL (including `/v1`) + `/chat/completions`,
    /// parsed once.
    pub(crate) chat_url: http::Uri,
    /// Where legacy completions go.
    pub(crate) completions_url: http::Uri,
    /// `Bearer <provider key>`, marked sensitive so it is never printed.
    pub(crate) auth: Option<HeaderValue>,
    /// The `Host` header of a plain-HTTP provider (always HTTP/1.1), made once: hyper's
    /// client would format it for every request. None over TLS, where ALPN may settle on
    /// HTTP/2 and the client decides.
    pub(crate) host: Option<HeaderValue>,
    /// The connect timeout of this provider's clients.
    connect_timeout: Duration,
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
            let url = |route: Route| {
                let url = format!("{}{}", p.base_url, route.upstream_path());
                let unusable = |e: &dyn std::fmt::Display| ProxyError::HttpClient {
                    provider: name.clone(),
                    message: format!("{url} is not a usable URL: {e}"),
                };
                let uri = url.parse::<http::Uri>().map_err(|e| unusable(&e))?;
                if !matches!(uri.scheme_str(), Some("http" | "https")) {
                    return Err(unusable(&"the scheme must be http or https"));
                }
                if uri.host().is_none_or(str::is_empty) {
                    return Err(unusable(&"it names no host"));
                }
                Ok(uri)
            };
            let chat_url = url(Route::Chat)?;
            upstreams.insert(
                name.clone(),
                Upstream {
                    host: host_header(&chat_url),
                    chat_url,
                    completions_url: url(Route::Completions)?,
                    auth,
                    connect_timeout: p.connect_timeout,
                    first_byte: FirstByteBounds {
                        floor: p.first_byte_floor,
                        cap: p.first_byte_timeout,
                    },
                    idle_timeout: p.idle_timeout,
                },
            );
        }

        let mut models = HashMap::new();
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
                let id = e.id().into_string();
                let ep = Arc::new(Endpoint {
                    id_header: http::HeaderValue::from_str(&id).ok(),
                    id,
                    provider: e.provider.clone(),
                    upstream_model: e.model.clone(),
                    weight: e.weight,
                    price_input_per_mtok: p.price_input_per_mtok,
                    price_output_per_mtok: p.price_output_per_mtok,
                    data_collection: p.data_collection,
                    quantization: p.quantization.clone(),
                    health: Arc::new(EndpointHealth::new(config.breaker.clone())),
                });
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

        let metrics = Metrics::new(records.clone(), &models, registry);
        let clients = Arc::new(clients(&upstreams)?);
        Ok(AppState {
            clients,
            inner: Arc::new(Inner {
                limits: config.limits.clone(),
                body_limit: config.server.body_limit_bytes,
                serving: crate::Serving::of(config),
                models,
                upstreams,
                auth: Authenticator::new(
                    store,
                    KeyCacheConfig::new(config.limits.key_cache_ttl, config.limits.key_stale_grace),
                ),
                records,
                streams: Arc::new(OpenStreams::default()),
                metrics,
                tools: crate::ToolsCache::default(),
            }),
        })
    }

    /// The same state with HTTP clients of its own (fresh connection pools), for one serving
    /// thread: a connection's I/O is then driven by the thread that sends on it, and outlives
    /// no other thread's runtime.
    pub fn for_shard(&self) -> Result<AppState, ProxyError> {
        Ok(AppState {
            inner: Arc::clone(&self.inner),
            clients: Arc::new(clients(&self.inner.upstreams)?),
        })
    }

    /// This thread's HTTP client for `provider`.
    pub(crate) fn client(&self, provider: &str) -> Option<&UpstreamClient> {
        self.clients.get(provider)
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

    /// A per-request random generator, seeded from this thread's (no lock shared between the
    /// serving threads).
    pub(crate) fn rng(&self) -> SmallRng {
        thread_local! {
            static SEEDS: std::cell::RefCell<SmallRng> =
                std::cell::RefCell::new(SmallRng::from_os_rng());
        }
        SEEDS.with(|seeds| SmallRng::from_rng(&mut *seeds.borrow_mut()))
    }
}

/// What hyper's client sends as `Host` to `uri` over HTTP/1.1 (its host, and its port when
/// not the scheme's default); None for an `https` URI.
fn host_header(uri: &http::Uri) -> Option<HeaderValue> {
    if uri.scheme() != Some(&http::uri::Scheme::HTTP) {
        return None;
    }
    let host = uri.host()?;
    let value = match uri.port_u16() {
        Some(port) if port != 80 => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::from_str(&value).ok()
}

impl Upstream {
    /// Where requests of `route` go.
    pub(crate) fn url(&self, route: Route) -> &http::Uri {
        match route {
            Route::Chat => &self.chat_url,
            Route::Completions => &self.completions_url,
        }
    }
}

/// One HTTP client per provider: its own connection pool (idle connections closed after 60 s),
/// with the provider's connect timeout, `TCP_NODELAY`, and no redirects followed (a 3xx is
/// passed to the client like any other answer).
fn clients(
    upstreams: &HashMap<String, Upstream>,
) -> Result<HashMap<String, UpstreamClient>, ProxyError> {
    use hyper_util::client::legacy::{Client, connect::HttpConnector};
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    upstreams
        .iter()
        .map(|(name, up)| {
            let mut http = HttpConnector::new();
            http.set_nodelay(true);
            http.set_connect_timeout(Some(up.connect_timeout));
            http.enforce_http(false);
            // the ring provider named, not the process default (none may be installed)
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
                .map_err(|e| ProxyError::HttpClient {
                    provider: name.clone(),
                    message: format!("TLS set-up failed: {e}"),
                })?
                .https_or_http()
                .enable_http1()
                .enable_http2()
                .wrap_connector(http);
            let client = Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .timer(TokioTimer::new())
                .build(SharedConnector::new(https));
            Ok((name.clone(), client))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::host_header;

    #[test]
    fn the_host_header_is_the_authority_without_a_default_port() {
        let host = |uri: &str| {
            let uri: http::Uri = uri.parse().expect("a test URI");
            host_header(&uri).map(|v| v.to_str().unwrap_or("not text").to_owned())
        };
        assert_eq!(
            host("http://127.0.0.1:8080/v1/chat/completions").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            host("http://example.com/v1/completions").as_deref(),
            Some("example.com")
        );
        assert_eq!(
            host("http://example.com:80/v1").as_deref(),
            Some("example.com")
        );
        assert_eq!(host("http://[::1]:9000/v1").as_deref(), Some("[::1]:9000"));
        // over TLS the client decides (HTTP/2 sends `:authority` instead)
        assert_eq!(host("https://example.com/v1"), None);
    }
}
