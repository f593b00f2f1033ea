//! The probe kinds. Each takes one endpoint (called over HTTP exactly as the proxy calls it:
//! the provider's `base_url`, its API key, the provider's model id), the reference (every
//! kind but `fingerprint`), and the model's probe settings, and returns an [`Outcome`]: ok or the reason it could not run
//! (an endpoint that refuses logprobs is a finding, not a crash), the probe tokens spent,
//! aggregate statistics, and compact per-position data where there is any.
//!
//! # Layout
//! - `prompt_logprobs`: `/v1/completions` with `echo` + `logprobs` on fixed texts.
//! - `completion_logprobs`: greedy chat completion with `logprobs`, re-scored by the
//!   reference under teacher forcing.
//! - `samples`: n samples at temperature 1 from both sides; MMD and log-likelihood tests.
//! - `tool_calls`: trigger F1 and schema accuracy against the reference's own answers.
//! - `long_context`: multi-query needle retrieval at doubling lengths, scored by answer
//!   likelihood on the endpoint and the reference; the effective context.
//! - `fingerprint`: the endpoint's own logprobs on fixed inputs (echo, or greedy chat where
//!   echo is refused, and remembered as refused for an hour: [`EchoRefusals`]), for changed?
//!   without a reference (the one kind that needs none).
//! - `diagnose`: fault signatures (shifted logprobs, prompt token counts) the logprob kinds
//!   write into their statistics as `diagnosis`.
//!
//! [`Outcome`]: crate::kinds::Outcome

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::align::{EndpointToken, ReferenceVocab, map_top};
use crate::compare::{self, PositionInput, Side, TopEntry};
use crate::config::{ModelProbes, ProbeKind, PromptSetPaths};
use crate::prompts::{self, CompletionPrompt, LogprobText, ToolCallPrompt, ToolDefinitions};
use crate::reference::http::{HttpFailure, post_json};
use crate::reference::{RefPosition, Reference, norm};
use crate::{ProbesError, Result};

mod completion_logprobs;
mod diagnose;
mod fingerprint;
mod long_context;
mod prompt_logprobs;
mod samples;
mod tool_calls;

pub use diagnose::{different_model, different_model_of};
pub use fingerprint::{ECHO_RETRY_MS, EchoRefusals};

/// One endpoint to probe.
#[derive(Clone, PartialEq)]
pub struct Target {
    /// The gateway's model name.
    pub model: String,
    /// The endpoint label as the proxy records it (`provider/model-id`).
    pub endpoint: String,
    /// The provider's OpenAI-compatible base URL, including `/v1`.
    pub base_url: String,
    /// The model id the provider knows the model by.
    pub provider_model: String,
    /// The provider's API key (from its environment variable), if any.
    pub api_key: Option<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the key
        f.debug_struct("Target")
            .field("model", &self.model)
            .field("endpoint", &self.endpoint)
            .field("base_url", &self.base_url)
            .field("provider_model", &self.provider_model)
            .finish_non_exhaustive()
    }
}

/// A model's prompt sets, loaded once (built-in unless a path is configured).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSets {
    /// prompt_logprobs texts.
    pub logprob_texts: Vec<LogprobText>,
    /// completion_logprobs and samples prompts.
    pub completion_prompts: Vec<CompletionPrompt>,
    /// tool_calls cases.
    pub tool_call_prompts: Vec<ToolCallPrompt>,
    /// Tool definitions the cases name.
    pub tools: ToolDefinitions,
    /// long_context haystack (filler and needle keys).
    pub haystack: samewise_longctx::Haystack,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ProbesError::Io {
        context: format!("cannot read {}", path.display()),
        source,
    })
}

fn in_file<T>(path: &Path, r: Result<T>) -> Result<T> {
    r.map_err(|e| ProbesError::InFile {
        path: path.to_owned(),
        source: Box::new(e),
    })
}

impl PromptSets {
    /// Loads the configured sets (built-in where no path is given) and checks them.
    pub fn load(paths: &PromptSetPaths) -> Result<Self> {
        let logprob_texts = match &paths.logprob_texts {
            Some(p) => in_file(p, prompts::parse_jsonl(&read(p)?))?,
            None => prompts::builtin_logprob_texts()?,
        };
        let completion_prompts = match &paths.completion_prompts {
            Some(p) => in_file(p, prompts::parse_jsonl(&read(p)?))?,
            None => prompts::builtin_completion_prompts()?,
        };
        let tool_call_prompts = match &paths.tool_call_prompts {
            Some(p) => in_file(p, prompts::parse_jsonl(&read(p)?))?,
            None => prompts::builtin_tool_call_prompts()?,
        };
        let tools = match &paths.tools {
            Some(p) => in_file(
                p,
                serde_json::from_str(&read(p)?).map_err(|source| ProbesError::DataJson {
                    context: "tool definitions".into(),
                    source,
                }),
            )?,
            None => prompts::builtin_tools()?,
        };
        let haystack = match &paths.needle {
            Some(p) => in_file(
                p,
                samewise_longctx::Haystack::from_json(&read(p)?).map_err(ProbesError::from),
            )?,
            None => samewise_longctx::Haystack::builtin()?,
        };
        if logprob_texts.is_empty() || completion_prompts.is_empty() || tool_call_prompts.is_empty()
        {
            return Err(ProbesError::Data("a prompt set is empty".into()));
        }
        let mut ids = std::collections::BTreeSet::new();
        for c in &tool_call_prompts {
            tools
                .select(&c.tools)
                .map_err(|e| ProbesError::Data(format!("tool-call case {}: {e}", c.id)))?;
            // faithful? pools the cases' outcomes by id
            if !ids.insert(c.id.as_str()) {
                return Err(ProbesError::Data(format!(
                    "tool-call case id {} appears twice",
                    c.id
                )));
            }
        }
        Ok(Self {
            logprob_texts,
            completion_prompts,
            tool_call_prompts,
            tools,
            haystack,
        })
    }
}

/// Everything a probe needs besides its target.
pub struct ProbeCtx<'a> {
    /// The reference backend; None where none is configured (only the kinds that need none,
    /// [`ProbeKind::needs_reference`], run then).
    pub reference: Option<&'a dyn Reference>,
    /// The model's settings.
    pub cfg: &'a ModelProbes,
    /// The model's prompt sets.
    pub sets: &'a PromptSets,
    /// HTTP client for endpoints.
    pub http: &'a reqwest::Client,
    /// Round number of this kind on this endpoint (rotates the prompt window).
    pub round: u64,
    /// Seed for endpoint and reference sampling and permutation tests.
    pub seed: u64,
    /// Endpoints that refused echo, remembered across rounds (the scheduler's); None: every
    /// fingerprint round asks echo first.
    pub echo_refusals: Option<&'a EchoRefusals>,
}

/// What one probe run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Whether the probe ran to a statistic.
    pub ok: bool,
    /// Why not, when it did not.
    pub error: Option<String>,
    /// Probe tokens spent (prompt + completion, as reported by the endpoint).
    pub tokens: i64,
    /// Aggregates.
    pub stats: Value,
    /// Compact per-position data ([`compare::encode_positions`]).
    pub raw: Option<Vec<u8>>,
}

impl Outcome {
    /// A probe that could not run, with the tokens it already spent.
    pub fn failed(reason: impl Into<String>, tokens: i64) -> Self {
        Self {
            ok: false,
            error: Some(reason.into()),
            tokens,
            stats: json!({}),
            raw: None,
        }
    }

    /// A probe that ran, with its statistics and no per-position data.
    pub fn done(tokens: i64, stats: serde_json::Map<String, Value>) -> Self {
        Self {
            ok: true,
            error: None,
            tokens,
            stats: Value::Object(stats),
            raw: None,
        }
    }
}

/// Adds the token-alignment statistics of a logprob probe: how many endpoint tokens, how many
/// did not map onto the reference vocabulary, and their share (`mismatch_rate`).
pub(crate) fn insert_alignment_stats(
    stats: &mut serde_json::Map<String, Value>,
    endpoint_tokens: usize,
    unmappable: usize,
) {
    stats.insert("endpoint_tokens".into(), json!(endpoint_tokens));
    stats.insert("unmappable".into(), json!(unmappable));
    stats.insert(
        "mismatch_rate".into(),
        json!(if endpoint_tokens == 0 {
            0.0
        } else {
            unmappable as f64 / endpoint_tokens as f64
        }),
    );
}

/// Runs one probe of `kind` against `target`.
pub async fn run(kind: ProbeKind, ctx: &ProbeCtx<'_>, target: &Target) -> Outcome {
    match (kind, ctx.reference) {
        (ProbeKind::Fingerprint, _) => fingerprint::run(ctx, target).await,
        (_, None) => Outcome::failed(
            format!(
                "the {} probe needs a reference backend ([probes.reference])",
                kind.name()
            ),
            0,
        ),
        (ProbeKind::PromptLogprobs, Some(r)) => prompt_logprobs::run(ctx, r, target).await,
        (ProbeKind::CompletionLogprobs, Some(r)) => completion_logprobs::run(ctx, r, target).await,
        (ProbeKind::Samples, Some(r)) => samples::run(ctx, r, target).await,
        (ProbeKind::ToolCalls, Some(r)) => tool_calls::run(ctx, r, target).await,
        (ProbeKind::LongContext, Some(r)) => long_context::run(ctx, r, target).await,
    }
}

/// A client for calling endpoints, each request bounded by `timeout` (connect to last byte).
pub fn endpoint_client(timeout: Duration) -> reqwest::Client {
    crate::reference::http::client(timeout)
}

/// POSTs to `target`'s `path` (relative to its base URL, e.g. `/completions`).
pub(crate) async fn call(
    ctx: &ProbeCtx<'_>,
    target: &Target,
    path: &str,
    body: &Value,
) -> std::result::Result<Value, HttpFailure> {
    let url = format!("{}{path}", target.base_url.trim_end_matches('/'));
    post_json(ctx.http, &url, target.api_key.as_deref(), body).await
}

/// `usage.total_tokens` of an answer (prompt + completion), 0 if absent.
pub(crate) fn usage_tokens(v: &Value) -> i64 {
    let u = v.get("usage");
    u.and_then(|u| u.get("total_tokens"))
        .and_then(Value::as_i64)
        .unwrap_or_else(|| {
            u.map_or(0, |u| {
                u.get("prompt_tokens").and_then(Value::as_i64).unwrap_or(0)
                    + u.get("completion_tokens")
                        .and_then(Value::as_i64)
                        .unwrap_or(0)
            })
        })
}

/// The `count` items of `items` starting at `round * count` (wrapping): a rotating window
/// (the scheduler's choice of a round's items; the detection benchmark draws rounds with it).
pub fn window<T: Clone>(items: &[T], round: u64, count: usize) -> Vec<T> {
    if items.is_empty() {
        return Vec::new();
    }
    let n = items.len();
    let start = (round as usize).wrapping_mul(count) % n;
    (0..count.min(n))
        .map(|i| items[(start + i) % n].clone())
        .collect()
}

/// One endpoint position: its token, logprob and alternatives.
#[derive(Clone)]
pub(crate) struct EpPosition {
    pub token: EndpointToken,
    pub logprob: f64,
    pub top: Vec<(EndpointToken, f64)>,
}

/// Per-position inputs for the endpoint positions that map to a scored reference position.
/// `ref_offset` is where the aligned sequence starts in `scored`; `map(i)` the index of
/// endpoint position i in the aligned sequence. Returns the inputs and how many top-k
/// alternatives did not map.
pub(crate) fn positions(
    ep: &[EpPosition],
    scored: &[RefPosition],
    ref_offset: usize,
    map: impl Fn(usize) -> Option<usize>,
    vocab: &dyn ReferenceVocab,
) -> (Vec<PositionInput>, usize) {
    let mut out = Vec::with_capacity(ep.len());
    let mut dropped = 0;
    for (i, p) in ep.iter().enumerate() {
        let Some(j) = map(i) else { continue };
        let Some(r) = scored.get(ref_offset + j) else {
            continue;
        };
        let Some(r_lp) = r.logprob else { continue };
        let (top, d) = map_top_disambiguated(&p.top, &r.top, vocab);
        dropped += d;
        if top.is_empty() || r.top.is_empty() {
            continue;
        }
        out.push(PositionInput {
            actual_id: r.token,
            reference: Side {
                actual_logprob: r_lp,
                top: r.top.clone(),
            },
            endpoint: Side {
                actual_logprob: p.logprob,
                top,
            },
        });
    }
    (out, dropped)
}

/// Maps an endpoint's alternatives to reference ids. Display texts are ambiguous (several
/// byte-level tokens can render as the same lossy text, e.g. partial UTF-8 as U+FFFD, and
/// such a text maps to no id on its own): an alternative that does not map, or whose mapping
/// is not among the reference's top-k at this position, but whose text is the display text
/// of one that is, takes that one's id.
fn map_top_disambiguated(
    alts: &[(EndpointToken, f64)],
    reference_top: &[TopEntry],
    vocab: &dyn ReferenceVocab,
) -> (Vec<TopEntry>, usize) {
    let mut out = Vec::with_capacity(alts.len());
    let mut dropped = 0;
    for alt in alts {
        let (mut mapped, _) = map_top(std::slice::from_ref(alt), vocab);
        let first = mapped.pop().map(|e| e.id);
        let id = match first {
            Some(id) if reference_top.iter().any(|r| r.id == id) => Some(id),
            _ => reference_top
                .iter()
                .find(|r| {
                    let b = vocab.token_bytes(r.id);
                    let same = match alt.0.resolved_bytes() {
                        Some(ab) if alt.0.bytes.is_some() => b == ab,
                        _ => String::from_utf8_lossy(&b) == alt.0.text,
                    };
                    same && !out.iter().any(|o: &TopEntry| o.id == r.id)
                })
                .map(|r| r.id)
                .or(first),
        };
        match id {
            Some(id) => out.push(TopEntry { id, logprob: alt.1 }),
            None => dropped += 1,
        }
    }
    (out, dropped)
}

/// Compares positions and builds the outcome statistics shared by the logprob probes.
pub(crate) fn logprob_outcome(
    inputs: &[PositionInput],
    tokens: i64,
    mut extra: serde_json::Map<String, Value>,
) -> Outcome {
    if inputs.is_empty() {
        return Outcome::failed(
            "no position could be compared (nothing aligned to the reference)",
            tokens,
        );
    }
    let metrics = match compare::compare_run(inputs) {
        Ok(m) => m,
        Err(e) => return Outcome::failed(format!("endpoint logprobs are not usable: {e}"), tokens),
    };
    let s = match compare::summarize(&metrics) {
        Ok(s) => s,
        Err(e) => return Outcome::failed(format!("cannot summarize: {e}"), tokens),
    };
    let dlogprob_mean = metrics.iter().map(|m| m.dlogprob).sum::<f64>() / metrics.len() as f64;
    extra.insert("positions".into(), json!(s.count));
    extra.insert("kl_mean".into(), json!(s.kl_mean));
    extra.insert("kl_p99".into(), json!(s.kl_p99));
    // `dlogprob_mean` is the mean |Δ logprob| (the ladder's dlogprob_mean); the signed mean
    // shows the direction of a shift
    extra.insert("dlogprob_mean".into(), json!(s.abs_dlogprob_mean));
    extra.insert("abs_dlogprob_mean".into(), json!(s.abs_dlogprob_mean));
    extra.insert("dlogprob_signed_mean".into(), json!(dlogprob_mean));
    extra.insert("top1_same".into(), json!(s.top1_same));
    extra.insert("topk_overlap".into(), json!(s.topk_overlap));
    let raw = compare::encode_positions(inputs).ok();
    Outcome {
        ok: true,
        error: None,
        tokens,
        stats: Value::Object(extra),
        raw,
    }
}

/// Parses an OpenAI chat `logprobs.content` entry list. Logprobs are read at f32 precision,
/// the precision engines compute in (JSON float parsing is only best-effort to the last bit
/// of an f64, and an exact endpoint must compare exactly).
pub(crate) fn chat_positions(content: &[Value]) -> Option<Vec<EpPosition>> {
    content
        .iter()
        .map(|c| {
            let tok = endpoint_token(c)?;
            let logprob = norm(c.get("logprob").and_then(Value::as_f64)?);
            let top = c
                .get("top_logprobs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|t| {
                            Some((
                                endpoint_token(t)?,
                                norm(t.get("logprob").and_then(Value::as_f64)?),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(EpPosition {
                token: tok,
                logprob,
                top,
            })
        })
        .collect()
}

fn endpoint_token(v: &Value) -> Option<EndpointToken> {
    let text = v.get("token").and_then(Value::as_str)?.to_owned();
    let bytes = v.get("bytes").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect()
    });
    Some(EndpointToken { text, bytes })
}
