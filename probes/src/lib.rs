//! samewise-probes: the statistics behind samewise's drift probes and detectors.
//!
//! This crate owns everything that turns probe answers and passive traffic into a verdict:
//! per-position comparison of an endpoint against the reference weights (KL over the top-k
//! support with a tail bucket, Δ logprob, same-top-1, top-k overlap), token alignment between
//! an endpoint's tokens and the reference vocabulary, the samples two-sample test of Model
//! Equality Testing (MMD with a Hamming kernel, permutation p-value), the "changed?" CUSUM
//! detector with a documented in-control run length, the passive cross-endpoint tests
//! (two-proportion z, Mann–Whitney U, chi-square, Benjamini–Hochberg), the calibration ladder
//! that turns a statistic into "≈ N-bit equivalent", and the noise-floor rule.
//!
//! The statistics modules are pure: functions over numbers and token lists, no IO, no HTTP,
//! no database, no clocks. The probe scheduler, reference client, probe kinds and alerts
//! built on top of them do IO; they run beside the proxy and must never block the request
//! path; nothing in this crate is called from the proxy's request handling. Bad input (NaN, empty samples, mismatched
//! lengths) is answered with a [`ProbesError`], never a panic.
//!
//! # Layout
//! - [`compare`]: per-position endpoint-vs-reference metrics, run aggregates, full-vocabulary
//!   KL, and the compact binary encoding of raw per-position data.
//! - `align`: mapping an endpoint's token strings/bytes onto reference ids
//!   (`align::ReferenceVocab`), with re-tokenization by byte offsets as the fallback.
//! - [`mmd`]: the samples probe's tests: MMD² with a Hamming kernel over the first 1,000
//!   characters with a within-prompt permutation p-value, and the reference-log-likelihood
//!   rank test.
//! - [`sequential`]: CUSUM on a standardized per-round statistic, with Siegmund's ARL
//!   approximation to choose the threshold, or the e-detector threshold with a
//!   distribution-free ARL0 floor.
//! - [`passive`]: two-proportion z-test, Mann–Whitney U (tie-corrected), chi-square on
//!   counts, Benjamini–Hochberg.
//! - [`ladder`]: the calibration-ladder JSON (`samewise calibrate`) and "≈ N-bit" lookup.
//! - [`calibrate`]: measuring a model's ladder with the reference engine over the shipped
//!   corpus (`probes/data/calibration/`).
//! - [`noise`]: the repeat-noise floor and the faithful/unfaithful decision rule.
//! - [`detect`]: the detectors over stored probe runs and request records (faithful? against
//!   the ladder with the noise floor, changed? by CUSUM, passive with Benjamini–Hochberg).
//! - `alerting`: the alert lifecycle (open, acknowledged, resolved, auto-resolve) with
//!   webhook notification; `webhook`: generic JSON / Slack delivery with bounded retries.
//! - `prompts`: the built-in prompt sets of `probes/data/` and parsers for users' own.
//! - `config`: the typed probes configuration (reference backend, per-model kinds,
//!   schedule, budgets, prompt sets) parsed from the gateway config's raw tables.
//! - [`mod@reference`]: the reference client — one trait, three backends (in-process engine,
//!   remote `samewise engine serve`, external vLLM/SGLang); `vocab`: the engine tokenizer
//!   as `align::ReferenceVocab`.
//! - [`kinds`]: the probe kinds (prompt_logprobs, completion_logprobs, samples, tool_calls,
//!   long_context), each calling an endpoint over HTTP as the proxy does.
//! - [`runner`]: the scheduler (interval with seeded jitter, hourly token budget, noise-floor
//!   pairs, one active scheduler per database, detectors after every run).
//!
//! Prompt-set data files for the probes live in `probes/data/` (see its README).

//!
//! The API is the namespaces below (each says why it is one) and what this root re-exports;
//! every other module is private.

mod alerting;
mod align;
/// A namespace of the API (ARCHITECTURE.md): the ladder, `samewise calibrate`'s steps.
pub mod calibrate;
/// A namespace of the API (a statistic): per-position metrics, run summaries, encodings.
pub mod compare;
mod config;
/// A namespace of the API: the detectors, and the chart functions the detection-power
/// benchmark replays (`detect::changed_chart`, `detect::stat`).
pub mod detect;
/// A namespace of the API: one probe of a kind (`kinds::run`, its `Target`, context and
/// `Outcome`), which the benchmark and the tests run without the scheduler.
pub mod kinds;
/// A namespace of the API (a statistic): the calibration ladder and "≈ N-bit".
pub mod ladder;
/// A namespace of the API (a statistic): the samples probe's MMD and rank tests.
pub mod mmd;
/// A namespace of the API (a statistic): the noise floor and the faithful rule.
pub mod noise;
/// A namespace of the API (a statistic): the passive cross-endpoint tests.
pub mod passive;
mod prompts;
/// A namespace of the API: the `Reference` trait and its backends (`reference::InProcess`,
/// `reference::Remote`, `reference::External`, `reference::Cached`, `reference::connect`).
pub mod reference;
/// A namespace of the API (ARCHITECTURE.md): the scheduler `samewise serve` and `samewise
/// probes run` start.
pub mod runner;
/// A namespace of the API (a statistic): CUSUM and its thresholds.
pub mod sequential;
mod vocab;
mod webhook;

pub use alerting::{Alerting, AlertsConfig};
pub use align::ReferenceVocab;
pub use config::{
    ExternalFlavour, ModelProbes, ProbeKind, ProbesConfig, PromptSetPaths, ReferenceConfig,
};
pub use detect::{DetectorConfig, Detectors, Judgement};
pub use prompts::{
    CompletionPrompt, LogprobText, ToolCallPrompt, ToolDefinitions, ToolExpectation,
};
pub use webhook::{WebhookConfig, WebhookFormat, WebhookStats};

/// Everything that can go wrong in this crate: all of it is bad input.
#[derive(Debug, thiserror::Error)]
pub enum ProbesError {
    /// An argument is outside what the function accepts (empty sample, NaN, bad level...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Two inputs that must have the same length do not.
    #[error("length mismatch: {what} ({left} vs {right})")]
    LengthMismatch {
        /// Which inputs.
        what: &'static str,
        /// Length of the first.
        left: usize,
        /// Length of the second.
        right: usize,
    },
    /// Encoded per-position data could not be decoded.
    #[error("cannot decode per-position data: {0}")]
    Decode(String),
    /// A prompt-set data file is malformed.
    #[error("prompt data: {0}")]
    Data(String),
    /// A prompt set (a file or a built-in one) is not the JSON it should be.
    #[error("prompt data: {context}: {source}")]
    DataJson {
        /// Which set, line or value.
        context: String,
        /// serde_json's reason.
        #[source]
        source: serde_json::Error,
    },
    /// A long-context haystack is malformed.
    #[error("prompt data: {0}")]
    Haystack(#[from] samewise_longctx::LongctxError),
    /// A prompt-set file is malformed: the file, then what is wrong in it.
    #[error("prompt data: {}: {source}", path.display())]
    InFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong in it.
        #[source]
        source: Box<ProbesError>,
    },
    /// A calibration ladder is malformed or lacks what was asked of it.
    #[error("calibration ladder: {0}")]
    Ladder(String),
    /// The probes configuration is invalid (the message names the key).
    #[error("probes config: {0}")]
    Config(String),
    /// The reference backend answered something unusable or cannot do what was asked.
    #[error("reference: {0}")]
    Reference(String),
    /// The reference engine (in process, or a tokenizer loaded from the model) failed.
    #[error("reference: {context}: {source}")]
    Engine {
        /// What was being done (loading which file, tokenizing what).
        context: String,
        /// The engine's error.
        #[source]
        source: samewise_engine::EngineError,
    },
    /// An HTTP reference could not be called, or answered an error status or no JSON.
    #[error("reference: {message}")]
    ReferenceHttp {
        /// The URL and what happened (timeouts say "timed out").
        message: String,
        /// reqwest's error, when the exchange itself failed.
        #[source]
        source: Option<reqwest::Error>,
    },
    /// The database refused a read or write.
    #[error("store: {0}")]
    Store(#[from] samewise_store::StoreError),
    /// A file could not be read.
    #[error("{context}: {source}")]
    Io {
        /// What was being read (names the file).
        context: String,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// An input directory has none of the files it must hold.
    #[error("{0}")]
    NoFiles(String),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, ProbesError>;

pub(crate) fn invalid(msg: impl Into<String>) -> ProbesError {
    ProbesError::InvalidInput(msg.into())
}

#[cfg(test)]
mod sim;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// A failure keeps what caused it as its `source()`, and its message still says it all
    /// (the scheduler stores and logs `to_string()`).
    #[test]
    fn errors_keep_their_sources_and_their_messages() {
        let dir = std::path::Path::new("/nonexistent/samewise-corpus");
        let Err(e) = calibrate::read_corpus(dir) else {
            panic!("a missing corpus was read")
        };
        assert!(
            e.to_string()
                .starts_with("calibration corpus /nonexistent/samewise-corpus: ")
        );
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );

        let Err(e) = prompts::parse_jsonl::<serde_json::Value>("{}\n{") else {
            panic!("bad JSON lines parsed")
        };
        assert!(e.to_string().starts_with("prompt data: line 2: "), "{e}");
        assert!(e.source().is_some_and(|s| s.is::<serde_json::Error>()));

        let Err(e) = samewise_longctx::Haystack::from_json("[]").map_err(ProbesError::from) else {
            panic!("a bad haystack parsed")
        };
        assert!(
            e.source()
                .is_some_and(|s| s.is::<samewise_longctx::LongctxError>())
        );
    }
}
