//! samewise-proxy: the gateway. It owns the OpenAI-compatible HTTP surface samewise serves to
//! applications, routing over the endpoints of each logical model, failover and circuit
//! breaking, streaming pass-through with side inspection, per-attempt telemetry records,
//! tool-call checks (with `samewise-toolcheck`), the degeneration guard, samewise API keys and the Prometheus metrics.
//!
//! It must not call the reference engine or run drift statistics (that is the probe path), and
//! it must not wait on the database on the request path: records go through the store's
//! bounded queue, key lookups through a short-lived cache. It never forwards a client's key
//! upstream and never shows a provider key.
//!
//! Entry points: [`Config`] (TOML, validated), [`AppState::new`], [`router`] and [`serve`];
//! [`QualityWatcher`] (drift alerts → [`Quality`] per endpoint); [`ClientRequest`], the body
//! check and per-endpoint rewrite (public for the `request_body` fuzz target and its replay).
//! Only `config` is a public module (its types are the configuration other crates read);
//! everything else is private.
//!
//! # Layout
//! - [`config`]: the TOML configuration and its validation.
//! - `error`: [`ProxyError`] (set-up) and [`ApiError`] (OpenAI-shaped client errors).
//! - `state`: [`AppState`], built once: routes, provider clients, auth, records, metrics.
//! - `server`: [`router`] and [`serve`]; thin handlers.
//! - `forward`: the completion path — auth, body checks, plan, attempts and failover.
//! - `head`: one attempt up to a usable response head, under adaptive first-byte deadlines
//!   (overdue attempts count against their endpoint while in flight).
//! - `hedge`: the optional second attempt on another endpoint; the first head wins.
//! - `body`: the client's body as raw JSON values; per-endpoint rewriting.
//! - `routing`: endpoints, policies, the `provider` preferences, plans.
//! - `health`: circuit breaker, peak-EWMA latency, first-byte estimates and deadlines,
//!   Retry-After and quality flags.
//! - `relay`: the streaming body with side reading and error events.
//! - `frames`: byte-exact SSE event blocks for the relay.
//! - `inspect`: the side reader (usage, timing, finish reason, tool calls, degeneration).
//! - `quality`: the alert poller that demotes or excludes endpoints with drift alerts.
//! - `record`: request records and request metrics.
//! - `auth`: key lookup cache and per-key rate limits.
//! - `metrics`: the gateway's metric families, registered in the process's one
//!   [`SharedRegistry`] (created at composition; `/metrics` renders it).
//! - `degen`: the repeated-output guard.
//! - `capture`: captured bodies of flagged requests (opt-in per model), redacted, riding
//!   the record queue.
//! - `cors`: cross-origin calls from browser pages to the OpenAI routes (opt-in per origin).

mod auth;
mod body;
mod capture;
/// A namespace of the API (ARCHITECTURE.md): the configuration other crates read.
pub mod config;
mod cors;
mod degen;
mod error;
mod forward;
mod frames;
mod head;
mod health;
mod hedge;
mod inspect;
mod metrics;
mod quality;
mod record;
mod relay;
mod routing;
mod server;
mod state;
mod streams;

pub use body::{ClientRequest, Route, ToolsCache};
pub use config::{Config, EndpointTarget, OnDrift};
pub use cors::Cors;
pub use error::{ApiError, ProxyError};
pub use health::Quality;
pub use metrics::{SharedRegistry, new_registry, register_retention};
pub use quality::QualityWatcher;
pub use server::{DEFAULT_DRAIN_TIMEOUT, Serving, on_runtime, router, serve, serve_router_with};
pub use state::AppState;
