//! The typed probes configuration, parsed from the raw TOML tables the gateway's config
//! keeps: the top-level `[probes]` table (reference backend, ladder, scheduler settings) and
//! each model's `[models.NAME.probes]` table (kinds, schedule, budgets, prompt sets).
//!
//! Without `[probes.reference]` a model's `probes` table may list only the kinds that need no
//! weights (`fingerprint`, [`ProbeKind::needs_reference`]); beside them the scheduler runs its
//! sweeps (the passive detectors over live traffic, which need no weights either, and the
//! alerts' quiet sweep), with `[probes.detectors]`, `[probes.alerts]` and the webhooks.
//!
//! Every table is read with `deny_unknown_fields`; an error names the key at fault
//! (`probes.reference.backend`, `models.smol.probes.interval_ms`, ...). Durations are
//! milliseconds (`*_ms`), as in the rest of the gateway's configuration.
//!
//! ```toml
//! [probes]
//! ladder = "ladders/smol.json"          # optional: "≈ N-bit" verdicts
//! noise_pair_every = 10                 # the same probe twice every K rounds
//! sweep_interval_ms = 60000
//! lock_retry_ms = 30000
//! reference_cache_positions = 100000    # scored positions memoized (0: off)
//! concurrency = 16                      # probe runs in flight at once, across endpoints
//! request_timeout_ms = 300000           # one HTTP request to an endpoint
//! [probes.reference]
//! backend = "in_process"                # | "remote" | "external"
//! model = "/models/smol.gguf"           # in_process: the weights (`~/` is the home directory)
//! threads = 2
//! # remote: url = "http://127.0.0.1:8081" (a `samewise engine serve`), tokenizer = PATH
//! # external: url, flavour = "vllm" | "sglang", model_name, tokenizer = PATH
//! #   (SGLang: chats are rendered with the chat template of PATH, a GGUF file or a Hugging
//! #   Face directory, or the directory of a tokenizer.json)
//!
//! [models.smol.probes]
//! kinds = ["prompt_logprobs", "completion_logprobs"]   # | "samples" | "tool_calls" | "long_context" | "fingerprint"
//! interval_ms = 300000
//! intervals_ms = { long_context = 1800000 }  # a kind's own interval (costly kinds less often)
//! jitter = 0.1                          # ± share of the interval, seeded
//! max_tokens = 64
//! token_budget_per_hour = 100000        # per endpoint
//! items_per_round = 2                   # texts, prompts or cases per round (a rotating window)
//! samples_prompts_per_round = 6         # the samples kind's own window
//! samples_per_prompt = 10               # per side and prompt
//! permutations = 999                    # of the samples kind's two permutation tests
//! force_tool_calls = true               # tool_calls: call cases sent tool_choice "required"
//! ```
//!
//! The samples defaults (6 prompts × 10 samples, `samples_alpha` 0.01) are the smallest
//! measured round with ≥ 80% power on 4-bit weights at ≤ 1% false flags with a margin
//! (README, detection benchmark part C): about 2,900 probe tokens a round, 35,000 an hour at
//! the default interval, which with the logprob kinds is why the hourly budget is 100,000.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::{ProbesError, Result};

/// The probe kinds, by their stored name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// `/v1/completions` with `echo` + `logprobs` on fixed texts.
    PromptLogprobs,
    /// Greedy completion with `logprobs`, re-scored by the reference under teacher forcing.
    CompletionLogprobs,
    /// n samples at temperature 1 from endpoint and reference; MMD two-sample test.
    Samples,
    /// Prompts that should and should not call a tool; trigger F1 and schema accuracy.
    ToolCalls,
    /// Needle retrieval at doubling lengths, by likelihood; the effective context.
    LongContext,
    /// The endpoint's own logprobs on fixed inputs (echo, or greedy chat where echo is
    /// refused), charted against its own first runs (changed? without the weights).
    Fingerprint,
}

impl ProbeKind {
    /// Every kind, in a fixed order.
    pub const ALL: [ProbeKind; 6] = [
        ProbeKind::PromptLogprobs,
        ProbeKind::CompletionLogprobs,
        ProbeKind::Samples,
        ProbeKind::ToolCalls,
        ProbeKind::LongContext,
        ProbeKind::Fingerprint,
    ];

    /// The name stored in `ProbeRun::kind`.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::PromptLogprobs => "prompt_logprobs",
            ProbeKind::CompletionLogprobs => "completion_logprobs",
            ProbeKind::Samples => "samples",
            ProbeKind::ToolCalls => "tool_calls",
            ProbeKind::LongContext => "long_context",
            ProbeKind::Fingerprint => "fingerprint",
        }
    }

    /// Whether the kind compares the endpoint with the reference (every kind but
    /// `fingerprint`, which compares it only with its own past).
    pub fn needs_reference(self) -> bool {
        self != ProbeKind::Fingerprint
    }

    /// Whether the kind has the reference render chats ([`Reference::render_chat`]: the
    /// completion prompts of completion_logprobs and samples).
    ///
    /// [`Reference::render_chat`]: crate::reference::Reference::render_chat
    pub fn renders_chats(self) -> bool {
        matches!(self, ProbeKind::CompletionLogprobs | ProbeKind::Samples)
    }
}

/// Which server speaks for an external reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExternalFlavour {
    /// vLLM: `/v1/completions` with `prompt_logprobs`.
    Vllm,
    /// SGLang: `/generate` with `return_logprob`.
    Sglang,
}

/// Where the reference logprobs come from.
#[derive(Debug, Clone, PartialEq)]
pub enum ReferenceConfig {
    /// The engine loaded in this process.
    InProcess {
        /// GGUF file or Hugging Face directory.
        model: PathBuf,
        /// Kernel threads.
        threads: usize,
    },
    /// A `samewise engine serve` reached over HTTP.
    Remote {
        /// Its base URL (`http://host:port`, no `/v1`).
        url: String,
        /// A local copy of the tokenizer (GGUF file, HF directory, or tokenizer.json) for
        /// token alignment.
        tokenizer: PathBuf,
    },
    /// A vLLM or SGLang server hosting the reference weights.
    External {
        /// Its base URL (`http://host:port`, no `/v1`).
        url: String,
        /// Which protocol it speaks.
        flavour: ExternalFlavour,
        /// The model name to send.
        model_name: String,
        /// A local copy of the tokenizer, as for `Remote`.
        tokenizer: PathBuf,
        /// Environment variable holding its API key, if it needs one.
        api_key_env: Option<String>,
    },
}

/// The whole probes configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbesConfig {
    /// The reference backend; None: no model is probed, and the scheduler runs only the
    /// passive detectors' sweep over live traffic and the alerts' quiet sweep.
    pub reference: Option<ReferenceConfig>,
    /// Calibration ladder JSON (`samewise calibrate`), if any.
    pub ladder: Option<PathBuf>,
    /// A noise-floor pair (the same probe twice) every this many rounds of a kind.
    pub noise_pair_every: u32,
    /// How often the passive detectors sweep.
    pub sweep_interval: Duration,
    /// How often a standby scheduler retries the database lock.
    pub lock_retry: Duration,
    /// Seed of the schedule jitter (and of sampling seeds).
    pub seed: u64,
    /// Most reference-scored positions the scheduler memoizes ([`crate::reference::Cached`]);
    /// 0 turns the memo off.
    pub reference_cache_positions: usize,
    /// Probe runs in flight at once across all endpoints (a slow endpoint holds one slot and
    /// stalls no other).
    pub concurrency: usize,
    /// The longest one HTTP request to an endpoint may take (connect to last byte).
    pub request_timeout: Duration,
    /// Per model (the gateway's model name): what to probe.
    pub models: BTreeMap<String, ModelProbes>,
    /// The `[probes]` keys this parser does not own (detectors, webhooks), left for
    /// `detect` to parse; empty if none.
    pub detectors: toml::Table,
}

/// `[models.NAME.probes]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelProbes {
    /// Kinds enabled.
    pub kinds: Vec<ProbeKind>,
    /// Time between rounds of one kind on one endpoint.
    pub interval: Duration,
    /// Kinds with their own interval (`intervals_ms`), e.g. a costly long-context probe
    /// less often than the logprob probes.
    pub intervals: BTreeMap<ProbeKind, Duration>,
    /// Share of the interval added or removed at random (0..1).
    pub jitter: f64,
    /// Generation budget per request (completion, samples, tools, long-context answers).
    pub max_tokens: u32,
    /// Probe tokens (prompt + completion) one endpoint may spend per hour.
    pub token_budget_per_hour: i64,
    /// Alternatives per position asked of endpoints (`logprobs`/`top_logprobs`).
    pub top_k: u32,
    /// Texts, prompts or cases used per round (a rotating window over the set), for every
    /// kind but samples (`samples_prompts_per_round`).
    pub items_per_round: usize,
    /// Samples per prompt for the samples probe.
    pub samples_per_prompt: usize,
    /// Prompts per round of the samples probe (its own rotating window: the default
    /// `items_per_round` of the logprob kinds is far too few for its tests).
    pub samples_prompts_per_round: usize,
    /// Permutations of the samples probe's test.
    pub permutations: usize,
    /// Longest context the long-context probe tries (tokens).
    pub context_window: u32,
    /// The tool_calls probe sends its cases that expect a call with `tool_choice:
    /// "required"` to endpoint and reference alike (`force_tool_calls`, default true), so
    /// both must answer with calls and the test is whether they are valid; false sends
    /// every case `"auto"`, for providers that refuse a required tool choice.
    pub force_tool_calls: bool,
    /// Users' prompt sets (None: the built-in set).
    pub prompt_sets: PromptSetPaths,
}

impl ModelProbes {
    /// Time between rounds of `kind` on one endpoint: its own interval, else the model's.
    pub fn interval_of(&self, kind: ProbeKind) -> Duration {
        self.intervals.get(&kind).copied().unwrap_or(self.interval)
    }
}

/// Paths of users' own prompt sets; None means the built-in set of `probes/data/`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptSetPaths {
    /// JSONL of `{id, text}` for prompt_logprobs.
    pub logprob_texts: Option<PathBuf>,
    /// JSONL of `{id, prompt, max_tokens}` for completion_logprobs and samples.
    pub completion_prompts: Option<PathBuf>,
    /// JSONL of tool-call cases.
    pub tool_call_prompts: Option<PathBuf>,
    /// JSON of tool definitions.
    pub tools: Option<PathBuf>,
    /// JSON of the long-context haystack (`samewise_longctx::Haystack`: filler, keys).
    pub needle: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbes {
    reference: Option<toml::Table>,
    ladder: Option<PathBuf>,
    noise_pair_every: Option<u32>,
    sweep_interval_ms: Option<u64>,
    lock_retry_ms: Option<u64>,
    seed: Option<u64>,
    reference_cache_positions: Option<usize>,
    concurrency: Option<usize>,
    request_timeout_ms: Option<u64>,
    /// Owned by the detectors (probes-alerts); passed through.
    detectors: Option<toml::Table>,
    /// Owned by the alerts (probes-alerts); passed through.
    webhooks: Option<toml::Value>,
    /// Owned by the alerts (probes-alerts); passed through.
    alerts: Option<toml::Table>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReference {
    backend: String,
    model: Option<PathBuf>,
    threads: Option<usize>,
    url: Option<String>,
    tokenizer: Option<PathBuf>,
    flavour: Option<ExternalFlavour>,
    model_name: Option<String>,
    api_key_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModelProbes {
    kinds: Option<Vec<ProbeKind>>,
    interval_ms: Option<u64>,
    intervals_ms: Option<BTreeMap<ProbeKind, u64>>,
    jitter: Option<f64>,
    max_tokens: Option<u32>,
    token_budget_per_hour: Option<i64>,
    top_k: Option<u32>,
    items_per_round: Option<usize>,
    samples_per_prompt: Option<usize>,
    samples_prompts_per_round: Option<usize>,
    permutations: Option<usize>,
    context_window: Option<u32>,
    force_tool_calls: Option<bool>,
    prompt_sets: Option<PromptSetPaths>,
}

/// The samples probe's default prompts per round (see `samples_prompts_per_round`).
const SAMPLES_PROMPTS_PER_ROUND: usize = 6;

fn cfg_err(key: &str, msg: impl std::fmt::Display) -> ProbesError {
    ProbesError::Config(format!("{key}: {msg}"))
}

/// Model `model` has a probe kind that needs the weights (`kind`) but `[probes]` names no
/// reference backend.
pub(crate) fn missing_reference(model: &str, kind: ProbeKind) -> ProbesError {
    cfg_err(
        "probes.reference",
        format!(
            "missing (the reference backend the {} probes of models.{model} score against; without one only \"fingerprint\" probes run)",
            kind.name()
        ),
    )
}

/// The first model and kind of `models` that needs a reference backend, if any.
pub(crate) fn first_needing_reference<'a>(
    models: impl IntoIterator<Item = (&'a String, &'a ModelProbes)>,
) -> Option<(&'a str, ProbeKind)> {
    models.into_iter().find_map(|(name, m)| {
        m.kinds
            .iter()
            .find(|k| k.needs_reference())
            .map(|&k| (name.as_str(), k))
    })
}

/// serde's message already names the unknown or mistyped field; prefix the table.
fn from_table<T: serde::de::DeserializeOwned>(table: &toml::Table, key: &str) -> Result<T> {
    T::deserialize(toml::Value::Table(table.clone())).map_err(|e| cfg_err(key, e.message()))
}

impl ProbesConfig {
    /// Parses `[probes]` and every model's `probes` table. `models` maps the gateway's model
    /// name to its raw `probes` table (models without one are not probed).
    pub fn parse(probes: &toml::Table, models: &BTreeMap<String, toml::Table>) -> Result<Self> {
        let raw: RawProbes = from_table(probes, "probes")?;
        let reference = raw.reference.as_ref().map(parse_reference).transpose()?;
        let noise_pair_every = raw.noise_pair_every.unwrap_or(10);
        if noise_pair_every == 0 {
            return Err(cfg_err("probes.noise_pair_every", "must be at least 1"));
        }
        let sweep_interval =
            positive_ms(raw.sweep_interval_ms, 60_000, "probes.sweep_interval_ms")?;
        let lock_retry = positive_ms(raw.lock_retry_ms, 30_000, "probes.lock_retry_ms")?;
        let request_timeout =
            positive_ms(raw.request_timeout_ms, 300_000, "probes.request_timeout_ms")?;
        let concurrency = match raw.concurrency {
            None => 16,
            Some(n @ 1..=MAX_CONCURRENCY) => n,
            Some(_) => {
                return Err(cfg_err(
                    "probes.concurrency",
                    format!("must be between 1 and {MAX_CONCURRENCY}"),
                ));
            }
        };
        let mut parsed = BTreeMap::new();
        for (name, table) in models {
            parsed.insert(name.clone(), parse_model(name, table)?);
        }
        // without the weights only the kinds that compare an endpoint with its own past run
        if reference.is_none()
            && let Some((model, kind)) = first_needing_reference(&parsed)
        {
            return Err(missing_reference(model, kind));
        }
        let mut detectors = raw.detectors.unwrap_or_default();
        if let Some(w) = raw.webhooks {
            detectors.insert("webhooks".into(), w);
        }
        if let Some(a) = raw.alerts {
            detectors.insert("alerts".into(), toml::Value::Table(a));
        }
        Ok(Self {
            reference,
            ladder: raw.ladder.map(expand_home),
            noise_pair_every,
            sweep_interval,
            lock_retry,
            seed: raw.seed.unwrap_or(0x5a3e_715e),
            reference_cache_positions: raw.reference_cache_positions.unwrap_or(100_000),
            concurrency,
            request_timeout,
            models: parsed,
            detectors,
        })
    }

    /// Parses a standalone TOML text holding `[probes]` and `[models.NAME.probes]` (the rest of
    /// a gateway config is ignored); for tests and `samewise probes run`.
    pub fn from_gateway_toml(src: &str) -> Result<Self> {
        let doc: toml::Table = src
            .parse()
            .map_err(|e: toml::de::Error| cfg_err("config", e.message()))?;
        let probes = match doc.get("probes") {
            Some(toml::Value::Table(t)) => t.clone(),
            Some(_) => return Err(cfg_err("probes", "must be a table")),
            None => return Err(cfg_err("probes", "missing")),
        };
        let mut models = BTreeMap::new();
        if let Some(toml::Value::Table(ms)) = doc.get("models") {
            for (name, m) in ms {
                if let Some(toml::Value::Table(p)) = m.get("probes") {
                    models.insert(name.clone(), p.clone());
                }
            }
        }
        Self::parse(&probes, &models)
    }
}

/// The most probe runs `probes.concurrency` may put in flight at once.
pub const MAX_CONCURRENCY: usize = 256;

/// The longest duration any `*_ms` key takes (7 days): a scheduler adds it to the clock,
/// which a value near `u64::MAX` would overflow.
pub const MAX_DURATION_MS: u64 = 7 * 24 * 3_600_000;

fn positive_ms(v: Option<u64>, default: u64, key: &str) -> Result<Duration> {
    match v {
        Some(0) => Err(cfg_err(key, "must be positive")),
        Some(ms) if ms > MAX_DURATION_MS => Err(cfg_err(
            key,
            format!("must be at most {MAX_DURATION_MS} (7 days)"),
        )),
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Ok(Duration::from_millis(default)),
    }
}

/// A path starting with `~/` is under the user's home directory (configs name the model cache
/// that way); any other path is taken as written.
fn expand_home(p: PathBuf) -> PathBuf {
    match (p.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) if p.starts_with("~/") || p.as_os_str() == "~" => {
            PathBuf::from(home).join(rest)
        }
        _ => p,
    }
}

fn parse_reference(t: &toml::Table) -> Result<ReferenceConfig> {
    const K: &str = "probes.reference";
    let r: RawReference = from_table(t, K)?;
    let need = |v: Option<String>, key: &str| {
        v.filter(|s| !s.trim().is_empty()).ok_or_else(|| {
            cfg_err(
                &format!("{K}.{key}"),
                format!("required for backend \"{}\"", r.backend),
            )
        })
    };
    let need_path = |v: Option<PathBuf>, key: &str| {
        v.map(expand_home).ok_or_else(|| {
            cfg_err(
                &format!("{K}.{key}"),
                format!("required for backend \"{}\"", r.backend),
            )
        })
    };
    let refuse = |present: bool, key: &str| {
        if present {
            Err(cfg_err(
                &format!("{K}.{key}"),
                format!("not used by backend \"{}\"", r.backend),
            ))
        } else {
            Ok(())
        }
    };
    let check_url = |u: &str| {
        if u.starts_with("http://") || u.starts_with("https://") {
            Ok(u.trim_end_matches('/').to_owned())
        } else {
            Err(cfg_err(
                &format!("{K}.url"),
                format!("{u:?} is not an http(s) URL"),
            ))
        }
    };
    match r.backend.as_str() {
        "in_process" => {
            refuse(r.url.is_some(), "url")?;
            refuse(r.flavour.is_some(), "flavour")?;
            refuse(r.tokenizer.is_some(), "tokenizer")?;
            let threads = r.threads.unwrap_or(2);
            if threads == 0 {
                return Err(cfg_err(&format!("{K}.threads"), "must be at least 1"));
            }
            Ok(ReferenceConfig::InProcess {
                model: need_path(r.model.clone(), "model")?,
                threads,
            })
        }
        "remote" => {
            refuse(r.model.is_some(), "model")?;
            refuse(r.flavour.is_some(), "flavour")?;
            refuse(r.threads.is_some(), "threads")?;
            let url = check_url(&need(r.url.clone(), "url")?)?;
            Ok(ReferenceConfig::Remote {
                url,
                tokenizer: need_path(r.tokenizer.clone(), "tokenizer")?,
            })
        }
        "external" => {
            refuse(r.model.is_some(), "model")?;
            refuse(r.threads.is_some(), "threads")?;
            let url = check_url(&need(r.url.clone(), "url")?)?;
            let flavour = r.flavour.ok_or_else(|| {
                cfg_err(
                    &format!("{K}.flavour"),
                    "required for backend \"external\" (\"vllm\" or \"sglang\")",
                )
            })?;
            Ok(ReferenceConfig::External {
                url,
                flavour,
                model_name: need(r.model_name.clone(), "model_name")?,
                tokenizer: need_path(r.tokenizer.clone(), "tokenizer")?,
                api_key_env: r.api_key_env.clone(),
            })
        }
        other => Err(cfg_err(
            &format!("{K}.backend"),
            format!("unknown backend {other:?} (in_process, remote, external)"),
        )),
    }
}

fn parse_model(name: &str, t: &toml::Table) -> Result<ModelProbes> {
    let key = format!("models.{name}.probes");
    let r: RawModelProbes = from_table(t, &key)?;
    let k = |f: &str| format!("{key}.{f}");
    let kinds = r
        .kinds
        .unwrap_or_else(|| vec![ProbeKind::PromptLogprobs, ProbeKind::CompletionLogprobs]);
    if kinds.is_empty() {
        return Err(cfg_err(
            &k("kinds"),
            "empty (remove the table to disable probes)",
        ));
    }
    let mut dedup = kinds.clone();
    dedup.sort();
    dedup.dedup();
    if dedup.len() != kinds.len() {
        return Err(cfg_err(&k("kinds"), "lists a kind twice"));
    }
    let jitter = r.jitter.unwrap_or(0.1);
    if !(0.0..1.0).contains(&jitter) {
        return Err(cfg_err(&k("jitter"), "must be in [0, 1)"));
    }
    let budget = r.token_budget_per_hour.unwrap_or(100_000);
    if budget <= 0 {
        return Err(cfg_err(&k("token_budget_per_hour"), "must be positive"));
    }
    let top_k = r.top_k.unwrap_or(5);
    if !(1..=20).contains(&top_k) {
        return Err(cfg_err(&k("top_k"), "must be in 1..=20"));
    }
    let positive = |v: Option<usize>, d: usize, f: &str| match v {
        Some(0) => Err(cfg_err(&k(f), "must be at least 1")),
        Some(x) => Ok(x),
        None => Ok(d),
    };
    let max_tokens = r.max_tokens.unwrap_or(64);
    if max_tokens == 0 {
        return Err(cfg_err(&k("max_tokens"), "must be at least 1"));
    }
    let context_window = r.context_window.unwrap_or(2048);
    if context_window < 64 {
        return Err(cfg_err(&k("context_window"), "must be at least 64"));
    }
    let interval = positive_ms(r.interval_ms, 300_000, &k("interval_ms"))?;
    let mut intervals = BTreeMap::new();
    for (kind, ms) in r.intervals_ms.unwrap_or_default() {
        let key = k(&format!("intervals_ms.{}", kind.name()));
        intervals.insert(kind, positive_ms(Some(ms), 0, &key)?);
    }
    Ok(ModelProbes {
        kinds,
        interval,
        intervals,
        jitter,
        max_tokens,
        token_budget_per_hour: budget,
        top_k,
        items_per_round: positive(r.items_per_round, 2, "items_per_round")?,
        samples_per_prompt: positive(r.samples_per_prompt, 10, "samples_per_prompt")?,
        samples_prompts_per_round: positive(
            r.samples_prompts_per_round,
            SAMPLES_PROMPTS_PER_ROUND,
            "samples_prompts_per_round",
        )?,
        permutations: positive(r.permutations, 999, "permutations")?,
        context_window,
        force_tool_calls: r.force_tool_calls.unwrap_or(true),
        prompt_sets: r.prompt_sets.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
