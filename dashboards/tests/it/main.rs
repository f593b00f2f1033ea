//! The dashboards' HTTP-level suite: the real router served on 127.0.0.1 port 0 over a real
//! store (SQLite, and PostgreSQL where a test says so) filled through the store's real insert
//! path (rollups included), driven by a real HTTP client.
//!
//! Layout: `common` (the server and the data it holds), `auth` (no key, a non-admin key,
//! sessions, CSRF), `api` (every `/api/v1/` route against what the store holds), `metrics`
//! (the Prometheus families), `evals_api` (opening and listing eval jobs over HTTP), `pages` (pages show the API's values; XSS payloads render as text; security headers).

mod api;
mod auth;
mod common;
mod evals_api;
mod metrics;
mod pages;
