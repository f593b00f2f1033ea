//! The probes' integration tests, one test binary: the probe kinds against real engine servers and
//! the in-process reference, the scheduler, the detectors, the calibration ladder and webhooks,
//! over real PostgreSQL and SQLite.
//!
//! Layout: `common` has the shared engine, servers, configs and the probe harness; every other
//! module is one area.

mod common;

mod calibrate;
mod changed;
mod detectors;
mod diagnoses;
mod fingerprint;
mod long_context;
mod pipeline;
mod probes_engine;
mod scheduler;
mod tool_calls;
mod webhooks;
