//! samewise-toolcheck: the tool-call checks that the gateway (live traffic), the probes
//! (the tool-call probe) and the evals (the tool-call suite) must all agree on, in one pure
//! leaf crate that depends on no other samewise crate and does no IO.
//!
//! It owns what "a good tool call" means: the JSON Schema classes of one returned call, the
//! assembly of streamed calls from deltas, and the vendor-verifier metrics over many
//! answers. It must not know HTTP, the database or the engine; it never panics on any input.
//!
//! # Layout
//! - [`bfcl`]: BFCL's AST checker rules for the evals' `tool_calls` suite (one answer's
//!   calls against an item's ground truth, failures bucketed by [`bfcl::ErrorType`]).
//! - `classify`: [`ToolSet`] (a request's tools compiled once), [`ToolCallAssembler`]
//!   (streamed deltas → whole calls by `index`), [`check_calls`] → [`ToolReport`]
//!   (ok / invalid_json / unknown_name / schema_mismatch, finish-reason consistency).
//! - [`schema`]: client-supplied JSON Schemas bounded (depth, size) and compiled with
//!   linear-time regexes.
//! - [`vendor`]: K2-Vendor-Verifier's numbers over many answers: [`vendor::trigger_f1`]
//!   (call/no-call decisions against a baseline's; `None` when neither side has a positive),
//!   [`vendor::SchemaAccuracy`], and [`vendor::mcnemar_exact`], the paired test of pass/fail
//!   outcomes against a baseline's on the same items (the evals' verdicts, the tool_calls
//!   probe's finding).

//!
//! The API is the crate root's re-exports (from the private `classify`) and three namespaces.

/// A namespace of the API: the evals' tool-call suite scores with `bfcl::check`.
pub mod bfcl;
mod classify;
/// A namespace of the API: the proxy and the evals bound and compile client schemas with it.
pub mod schema;
/// A namespace of the API (ARCHITECTURE.md): the vendor-verifier metrics over many answers.
pub mod vendor;

pub use classify::{
    CallVerdict, FinishMismatch, ToolCall, ToolCallAssembler, ToolReport, ToolSet, check_calls,
};
