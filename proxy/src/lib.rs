//! samewise-proxy: the gateway. It owns the OpenAI-compatible HTTP surface samewise serves to
//! applications, routing over the endpoints of each logical model, failover and circuit
//! breaking, streaming pass-through with side inspection, per-attempt telemetry records,
//! tool-call checks, the degeneration guard, samewise API keys and the Prometheus metrics.
//!
//! It must not call the reference engine or run drift statistics (that is the probe path), and
//! it must not wait on the database on the request path: records go through the store's
//! bounded queue, key lookups through a short-lived cache. It never forwards a client's key
//! upstream and never shows a provider key.
//!
//! Entry points: [`Config`] (TOML, validated), [`AppState::new`], [`router`] and [`serve`].
//!
//! # Layout
//! - [`config`]: the TOML configuration and its validation.
//! - [`error`]: [`ProxyError`] (set-up) and [`ApiError`] (OpenAI-shaped client errors).
//! - [`state`]: [`AppState`], built once: routes, provider clients, auth, records, metrics.
//! - [`server`]: [`router`] and [`serve`]; thin handlers.
//! - [`forward`]: the completion path — auth, body checks, plan, attempts and failover.
//! - [`body`]: the client's body as raw JSON values; per-endpoint rewriting.
//! - [`routing`]: endpoints, policies, the `provider` preferences, plans.
//! - [`health`]: circuit breaker, peak-EWMA latency, Retry-After and quality flags.
//! - [`relay`]: the streaming body with side reading and error events.
//! - [`frames`]: byte-exact SSE event blocks for the relay.
//! - [`inspect`]: the side reader (usage, timing, finish reason, tool calls, degeneration).
//! - [`quality`]: the alert poller that demotes or excludes endpoints with drift alerts.
//! - [`record`]: request records and request metrics.
//! - [`auth`]: key lookup cache and per-key rate limits.
//! - [`metrics`]: the Prometheus registry.
//! - [`toolcheck`]: tool-call assembly and classification.
//! - [`degen`]: the repeated-output guard.

pub mod auth;
pub mod body;
pub mod config;
pub mod degen;
pub mod error;
pub mod forward;
pub mod frames;
pub mod health;
pub mod inspect;
pub mod quality;
pub mod metrics;
mod record;
mod relay;
pub mod routing;
pub mod server;
pub mod state;
pub mod toolcheck;

pub use config::Config;
pub use error::{ApiError, ProxyError};
pub use server::{router, serve};
pub use state::AppState;

