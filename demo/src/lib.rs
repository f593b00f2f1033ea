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

// Each module is a namespace of the API (ARCHITECTURE.md: "the four modules"): the binary and
// testkit call them by module (`model::ensure`, `scenario::Setup`, `traffic::Traffic`, ...).
/// A namespace of the API: where the test model is, and its fetch.
pub mod model;
/// A namespace of the API: the five endpoints, sizes and the generated gateway TOML.
pub mod scenario;
/// A namespace of the API: the terminal table and event lines.
pub mod summary;
/// A namespace of the API: the closed-loop traffic generator.
pub mod traffic;
