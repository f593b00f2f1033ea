//! End-to-end tests of the `samewise` binary, one test binary: real gateway, engine and probe
//! processes on loopback, real stores, the CLI as a user runs it.
//!
//! Layout: `common` starts processes and finds the test model (`common::probes`: engines under
//! serving profiles, probes configs, stored runs); `tidy` enforces the codemap's rules; every
//! other module is one area.

mod common;

mod alerts_cli;
mod chaos;
mod cli;
mod crash;
mod dashboards_browser;
mod demo_e2e;
mod evals_custom_e2e;
mod evals_e2e;
mod fuzz_corpus;
mod fuzz_props;
mod gateway_browser;
mod passive_drift_e2e;
mod probes_e2e;
mod probes_rounds;
mod regression_e2e;
mod retention;
mod secrets;
mod tidy;
mod tool_corrupt_gateway;
