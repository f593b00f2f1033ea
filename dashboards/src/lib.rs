//! samewise-dashboards owns the admin web UI at `/` and its JSON API under `/api/v1/`: the
//! overview (one row per endpoint of each model, with its verdicts and evidence), the
//! endpoint page (time series with the calibration ladder drawn as bands), the comparison of
//! two endpoints, and the alerts (acknowledge, resolve). Pages are rendered on the server as
//! HTML with SVG charts; the only script is the refresh helper served from our own route, and
//! every response carries a `default-src 'self'` Content-Security-Policy.
//!
//! It reads the store's per-minute rollups, probe runs and alerts, never raw request rows,
//! and writes nothing but alert state and the eval jobs an admin opens (`POST
//! /api/v1/evals`, checked and built by `samewise_evals::Opener`, as `samewise evals run`
//! does). It must not write SQL (queries are
//! `samewise-store` methods), call providers or the reference engine, or render a provider
//! key, a samewise key or a hash. Every route needs an admin key (Bearer) or the session
//! cookie a login with one set; POSTs under a session carry its CSRF token.
//!
//! Entry points: [`Dashboards::new`] (built at composition from the store, the
//! [`ModelSpec`]s and a [`LiveState`] view of the gateway's routing) and [`router`], which
//! `samewise serve` merges with the gateway's router. [`DashboardsConfig`] parses the
//! `[dashboards]` section and each model's `slo` table.
//!
//! # Layout
//! - `config`: `[dashboards]` and `[models.NAME.slo]`.
//! - `error`: [`DashError`] and the OpenAI-shaped error responses; `extract`: query, path and
//!   form extractors whose rejections are [`DashError`]s (never axum's plain-text 400s).
//! - `auth`: admin keys, sessions, CSRF tokens, security headers.
//! - `view`: what a page shows, computed from the store (shared by pages and the API).
//! - `metrics`: the dashboards' Prometheus families (probe statistics, probe runs,
//!   active alerts, routing state, goodput) and the task that refreshes them.
//! - `stats`: Wilson intervals, N-step compounding, histogram read-outs.
//! - `html`: escaping and the page shell; `svg`: charts; `pages`: the HTML routes; `api`:
//!   the JSON routes.
//!
//! The API is what this root defines and re-exports; the modules are private.

mod auth;
mod config;
mod error;
mod extract;
mod metrics;
mod stats;
mod view;

mod api;
mod html;
mod pages;
mod svg;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use samewise_store::Store;

pub use config::{DashboardsConfig, Slo};
pub use error::DashError;
pub use metrics::{DashMetrics, Refresher};

/// The routing state of one endpoint as the gateway sees it now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Routing {
    /// "active" | "demoted" | "excluded".
    pub state: &'static str,
    /// Why, when not simply active ("circuit breaker open", "drift alert: unfaithful", ...).
    pub why: Option<String>,
}

/// What the dashboards need to know about the running gateway, read at each request.
pub trait LiveState: Send + Sync + std::fmt::Debug {
    /// The routing state of `endpoint` of `model`, None when the gateway does not route it.
    fn routing(&self, model: &str, endpoint: &str) -> Option<Routing>;
}

/// One ladder level drawn as a band on the probe-statistics charts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Band {
    /// The level's name ("w8", "w4", ...).
    pub name: String,
    /// Bits of the level.
    pub bits: u32,
    /// The level's value of the charted statistic (`kl_mean` of a logprob probe).
    pub kl_mean: f64,
}

/// One configured logical model.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelSpec {
    /// The name clients send.
    pub name: String,
    /// Its endpoint labels (`provider/model`), in configuration order.
    pub endpoints: Vec<String>,
    /// TTFT and TPOT targets, when configured.
    pub slo: Option<Slo>,
    /// The calibration ladder's weight levels, most bits first (empty without a ladder).
    pub ladder: Vec<Band>,
}

/// The dashboards' state: cheap to clone.
#[derive(Debug, Clone)]
pub struct Dashboards {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) models: Vec<ModelSpec>,
    pub(crate) live: Arc<dyn LiveState>,
    pub(crate) sessions: auth::Sessions,
    pub(crate) config: DashboardsConfig,
    pub(crate) evals: Option<samewise_evals::Opener>,
}

impl Dashboards {
    /// The state over `store`, the configured `models` and the gateway's `live` view;
    /// `evals` opens the jobs `POST /api/v1/evals` asks for (None: that route answers 404).
    pub fn new(
        store: Store,
        models: Vec<ModelSpec>,
        live: Arc<dyn LiveState>,
        config: DashboardsConfig,
        evals: Option<samewise_evals::Opener>,
    ) -> Dashboards {
        Dashboards {
            inner: Arc::new(Inner {
                store,
                models,
                live,
                sessions: auth::Sessions::new(config.session_ttl_ms),
                config,
                evals,
            }),
        }
    }

    pub(crate) fn model(&self, name: &str) -> Option<&ModelSpec> {
        self.inner.models.iter().find(|m| m.name == name)
    }

    /// The model an endpoint label belongs to (first configured), if any.
    pub(crate) fn model_of(&self, endpoint: &str) -> Option<&ModelSpec> {
        self.inner
            .models
            .iter()
            .find(|m| m.endpoints.iter().any(|e| e == endpoint))
    }

    /// Reads, once, what the overview and each model's first endpoint page read over 24 hours
    /// and over 30 days, and returns how long that took. After a restart of the gateway (a
    /// new connection pool) or of the database (empty buffers), the first pages read
    /// connect the pool, have PostgreSQL plan every statement on its new connections and
    /// bring the rollups' pages into its buffers; `samewise serve` runs this in the
    /// background as it starts, so the first person to open a page is served like the next.
    pub async fn warm_up(&self) -> Result<std::time::Duration, DashError> {
        let started = std::time::Instant::now();
        for range in ["24h", "30d"] {
            let range = view::Range::parse(Some(range))?;
            view::overview(self, None, range).await?;
            for m in &self.inner.models {
                if let Some(e) = m.endpoints.first() {
                    view::endpoint(self, e, range, None).await?;
                }
            }
        }
        Ok(started.elapsed())
    }
}

/// The dashboards' routes, without a fallback (so that it merges with the gateway's router,
/// which owns the fallback): pages at `/`, `/endpoint`, `/compare`, `/alerts`, `/login`;
/// assets under `/assets/`; the JSON API under `/api/v1/`. A route asked with a method it does
/// not take is a JSON 405 (`method_not_allowed`). Every response gets the security headers
/// (`auth::security_headers`).
pub fn router(state: Dashboards) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/endpoint", get(pages::endpoint))
        .route("/compare", get(pages::compare))
        .route("/alerts", get(pages::alerts))
        .route("/alerts/{id}", get(pages::alert))
        .route("/alerts/{id}/ack", post(pages::ack))
        .route("/alerts/{id}/resolve", post(pages::resolve))
        .route("/evals/{id}", get(pages::job_page))
        .route("/login", get(pages::login_form).post(pages::login))
        .route("/logout", post(pages::logout))
        .route("/assets/refresh.js", get(pages::refresh_js))
        .route("/assets/style.css", get(pages::style_css))
        .route("/api/v1/models", get(api::models))
        .route("/api/v1/overview", get(api::overview))
        .route("/api/v1/endpoint", get(api::endpoint))
        .route("/api/v1/series", get(api::series))
        .route("/api/v1/probe-series", get(api::probe_series))
        .route("/api/v1/alerts", get(api::alerts))
        .route("/api/v1/alerts/{id}", get(api::alert))
        .route("/api/v1/alerts/{id}/ack", post(api::ack))
        .route("/api/v1/alerts/{id}/resolve", post(api::resolve))
        .route("/api/v1/evals", get(api::eval_jobs).post(api::open_eval))
        .route("/api/v1/evals/{id}", get(api::eval_job))
        .method_not_allowed_fallback(|| async { DashError::MethodNotAllowed })
        .layer(axum::middleware::map_response(auth::security_headers))
        .with_state(state)
}
