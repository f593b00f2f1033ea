//! samewise-evals: targeted eval jobs (issue #10). When a cheap signal fires (a probe alert,
//! a passive finding), or an operator asks, a job runs a suite of items against the suspect
//! endpoint and a baseline (the reference engine or a healthy peer), and its verdict —
//! pass rates with Wilson intervals, McNemar's exact paired test, "degraded" /
//! "equivalent" / "inconclusive" / "n/a" with stated parameters — lands on the job, on the
//! alert's evidence and at the webhooks.
//!
//! API boundary: the queue (claims, leases, results written once) lives in `samewise-store`;
//! the tool-call rules in `samewise-toolcheck`; the long-context tasks and their likelihood
//! scoring in `samewise-longctx`. This crate owns the suites and their data,
//! the statistics, the worker loop and the alert → job rules; it knows neither the proxy
//! nor the probes (the binary composes targets from the proxy's config, and alerts are read
//! from the store).
//!
//! # Layout
//! - `config`: the `[evals]` section ([`EvalsConfig`]).
//! - `stats`: Wilson, McNemar exact, the paired-difference interval, the verdict rule and
//!   its sequential looks.
//! - `target`: [`Target`]s (OpenAI-compatible endpoints) and the HTTP client.
//! - `tool_calls`: the `tool_calls` suite (data in `data/tool_calls.json`).
//! - `custom`: customer suites (JSONL: a chat request and an exact / contains / regex /
//!   json_schema / tool_call check per line), validated on load.
//! - `open`: [`Opener`], the one check and builder of a new job, shared by the CLI, the
//!   HTTP API and the alert watcher.
//! - `capture`: [`Capturer`], captured bodies of flagged traffic → regression cases (the
//!   baseline's answer as the expectation, a check chosen per case).
//! - `long_context`: the `long_context` suite (tasks from `samewise-longctx`, shared with
//!   the probes), per-length pass rates and effective context lengths.
//! - `report`: the verdict document from a job's stored results.
//! - `worker`: [`Worker`] (claim, run items on both targets, heartbeat, stop early,
//!   finish, publish the verdict).
//! - `watcher`: [`AlertWatcher`], which opens each suite an active alert maps to once, and
//!   holds the `eval_degraded` alert of a degraded verdict while an alert it answers stays
//!   active; [`jobs_answering`], which jobs answer an alert.

//!
//! The API is what this root re-exports; the modules are private.

mod capture;
mod config;
mod custom;
mod long_context;
mod open;
mod report;
mod stats;
mod target;
mod tool_calls;
mod watcher;
mod worker;

pub use capture::{CaptureReport, CaptureSource, Capturer, DEFAULT_WINDOW_MS};
pub use config::{
    DEFAULT_COOLDOWN, EvalsConfig, LongContextConfig, Rule, SuiteFile, is_regression,
};
pub use futures_util::future::BoxFuture;
pub use open::{OpenRequest, Opener, SuiteRef};
pub use stats::{
    Decision, Paired, Verdict, VerdictParams, decide, decide_all, look_alpha, look_points,
    plan_looks, stop_reason,
};
pub use target::{Answer, REFERENCE, Target, Targets};
pub use tool_calls::schema_valid;
pub use watcher::{AlertWatcher, KIND_EVAL_DEGRADED, holders, jobs_answering};
pub use worker::{RaiseAlert, Worker, WorkerSettings};

/// Everything that can go wrong in an eval.
#[derive(Debug, thiserror::Error)]
pub enum EvalsError {
    /// A bad `[evals]` key.
    #[error("config key {key}: {message}")]
    Config {
        /// The key, e.g. `evals.delta`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A suite's data or name.
    #[error("suite: {0}")]
    Suite(String),
    /// A job to open names an endpoint that is not configured.
    #[error("unknown endpoint {name:?} (configured: {known})")]
    UnknownEndpoint {
        /// As given.
        name: String,
        /// The configured labels.
        known: String,
    },
    /// A job to open names no known suite.
    #[error("unknown suite {name:?} (known: {known})")]
    UnknownSuite {
        /// As given.
        name: String,
        /// The suites known.
        known: String,
    },
    /// A job's baseline is neither "reference" (with a reference URL) nor a configured
    /// endpoint, or is the suspect itself.
    #[error("{0}")]
    UnknownBaseline(String),
    /// A job names an endpoint the worker does not know.
    #[error(
        "unknown endpoint {0:?} (not in the config, and not \"reference\" with a reference URL)"
    )]
    UnknownTarget(String),
    /// An HTTP exchange with a target failed.
    #[error("HTTP: {context}: {source}")]
    Http {
        /// The target's label and what was being done.
        context: String,
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
    /// A request to a target could not be encoded, or its answer is not JSON.
    #[error("HTTP: {context}: {source}")]
    Json {
        /// The target's label and what was being done.
        context: String,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// A target's answer lacks what the suite reads from it.
    #[error("HTTP: {0}")]
    BadAnswer(String),
    /// A long-context answer could not be read (its echo logprobs do not fit the prompts).
    #[error("HTTP: {label}: {source}")]
    LongContext {
        /// The target's label.
        label: String,
        /// Why.
        #[source]
        source: samewise_longctx::LongctxError,
    },
    /// A target answered with an error status (a 4xx is a refusal, e.g. of logprobs).
    #[error("HTTP: {message}")]
    Status {
        /// The status code.
        status: u16,
        /// Label, status and the start of the body.
        message: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] samewise_store::StoreError),
    /// The job's lease was lost (taken over after expiry, or the job was cancelled).
    #[error("lost the lease of job {0}")]
    LeaseLost(i64),
}
