//! samewise-demo: what `samewise demo` needs beyond the product's own crates — the test
//! model's location and fetch from PyPI ([`model`]), the scenario of five endpoints under
//! serving profiles and its gateway configuration ([`scenario`]), a traffic generator that
//! speaks the official OpenAI request shapes over HTTP ([`traffic`]), and the live terminal
//! summary read from the dashboards' JSON API ([`summary`]).
//!
//! It depends on none of samewise's crates: it talks to the gateway over HTTP like any
//! client, and the binary composes the engines, gateway, probes, evals and dashboards
//! (`src/cmd/demo.rs`). `samewise-testkit` uses [`model`] so that tests, benchmarks and the
//! demo look for the model in one place.

pub mod model;
pub mod scenario;
pub mod summary;
pub mod traffic;
