//! The gateway's configuration: TOML read with `deny_unknown_fields` into raw structs, then
//! validated into [`Config`], whose values are known to be usable (addresses parse, every
//! endpoint names a configured provider, timeouts are positive). Every error names the key at
//! fault and, where the TOML parser or a span tells us, its line.
//!
//! Secrets are never in the file: a provider names the environment variable that holds its API
//! key (`api_key_env`), and the value is read by [`crate::AppState`] at start-up.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::ProxyError;

mod capture;
mod retention;
mod server;
mod targets;

/// The longest duration any `*_ms` key may set (7 days): beyond it a timeout means "never", and
/// a value near `u64::MAX` would overflow `Instant + Duration`.
pub const MAX_DURATION_MS: u64 = 7 * 24 * 3600 * 1000;

/// The smallest `limits.record_queue_bytes`: room for a few records.
const MIN_RECORD_QUEUE_BYTES: u64 = 4096;

use capture::RawCapture;
pub use capture::{
    CAPTURE_AGE_LIMIT_HOURS, CAPTURE_MAX_AGE_HOURS, CAPTURE_MAX_BODY_BYTES, CAPTURE_MAX_BYTES,
    CaptureConfig,
};
pub use retention::MAX_RETENTION_DAYS;
use retention::RawRetention;
use server::RawServer;
pub use server::ServerConfig;
pub use targets::EndpointTarget;

/// Everything `samewise serve` needs to run the gateway.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listener, body limit, data directory.
    pub server: ServerConfig,
    /// Attempt budget, backoff and other request-path limits.
    pub limits: Limits,
    /// Circuit-breaker tuning, shared by every endpoint.
    pub breaker: BreakerConfig,
    /// `[retention]`: how long the store keeps request records, rollups and probe runs.
    pub retention: samewise_store::RetentionConfig,
    /// Providers by name.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Logical models by the name clients send in `model`.
    pub models: BTreeMap<String, ModelConfig>,
    /// `[probes]`, raw: parsed and validated by the probes crate.
    pub probes: Option<toml::Table>,
    /// `[evals]`, raw: parsed and validated by the evals crate.
    pub evals: Option<toml::Table>,
    /// `[dashboards]`, raw: parsed and validated by the dashboards crate.
    pub dashboards: Option<toml::Table>,
}

/// `[limits]`.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most upstream attempts for one client request (failover included).
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles for each further one, with jitter.
    pub backoff_base: Duration,
    /// Cap on one backoff wait.
    pub backoff_max: Duration,
    /// Longest `Retry-After` the gateway will wait out before giving up on a request.
    pub retry_after_max: Duration,
    /// How long a key lookup is cached; a revoked key stops working within this time.
    pub key_cache_ttl: Duration,
    /// How long past its TTL a cached valid key keeps working while the database cannot be
    /// asked (`key_stale_grace_ms`, default 15 min; 0: never).
    pub key_stale_grace: Duration,
    /// Capacity of the request-record queue; a full queue drops (and counts) records.
    pub record_queue_capacity: usize,
    /// The request-record queue's bound in bytes (`record_queue_bytes`, default 32 MiB): a
    /// record past it is dropped and counted as when the queue is full.
    pub record_queue_bytes: usize,
    /// Streamed requests one key may have open at once in this gateway; one more gets a 429
    /// `too_many_streams` (`max_streams_per_key`, default 256).
    pub max_streams_per_key: u32,
    /// The same token or text delta this many times in a row ends a generation...
    pub degenerate_repeat: usize,
    /// ...once the run also spans this many characters (`degenerate_min_chars`, default 128;
    /// 0: the count alone).
    pub degenerate_min_chars: usize,
}

/// `[breaker]`: per-endpoint circuit breaker.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Opens after this many consecutive failures.
    pub consecutive_failures: u32,
    /// Or when the error rate over `window` is at least this (0..=1)...
    pub error_rate: f64,
    /// ...and at least `min_requests` outcomes were seen in the window.
    pub min_requests: u32,
    /// The error-rate window.
    pub window: Duration,
    /// How long an open breaker waits before letting trial requests through.
    pub cooldown: Duration,
    /// Trial requests allowed at once while half-open.
    pub half_open_trials: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            error_rate: 0.5,
            min_requests: 20,
            window: Duration::from_secs(30),
            cooldown: Duration::from_secs(10),
            half_open_trials: 1,
        }
    }
}

/// `[providers.NAME]`.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// OpenAI-compatible base URL including `/v1`, without a trailing slash.
    pub base_url: String,
    /// Environment variable holding the provider's API key; none for keyless servers.
    pub api_key_env: Option<String>,
    /// TCP/TLS connect timeout.
    pub connect_timeout: Duration,
    /// The cap of the adaptive time from sending the request to the response head
    /// (`first_byte_timeout_ms`, default 60 s): an attempt times out at three times the
    /// endpoint's expected first-byte time, within `first_byte_floor` and this.
    pub first_byte_timeout: Duration,
    /// The floor of the adaptive first-byte deadlines (`first_byte_floor_ms`, default 1 s, at
    /// most the cap): no attempt is overdue or timed out sooner.
    pub first_byte_floor: Duration,
    /// Longest silence while reading a response body.
    pub idle_timeout: Duration,
    /// US dollars per million prompt tokens.
    pub price_input_per_mtok: f64,
    /// US dollars per million completion tokens.
    pub price_output_per_mtok: f64,
    /// Where the provider serves from (free text, for filters and dashboards).
    pub region: Option<String>,
    /// Whether the provider may keep or train on request data.
    pub data_collection: DataCollection,
    /// The quantization the provider says it serves ("bf16", "fp8", "int4", ...).
    pub quantization: Option<String>,
}

/// A provider's data policy, and a request's demand on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataCollection {
    /// The provider may store or train on requests.
    Allow,
    /// The provider keeps no request data.
    Deny,
}

/// `[models.NAME]`.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// How endpoints are ordered for a request.
    pub policy: Policy,
    /// Where the model is served.
    pub endpoints: Vec<EndpointConfig>,
    /// What an active drift alert on one of its endpoints does to routing.
    pub on_drift: OnDrift,
    /// `[models.NAME.probes]`, raw: parsed and validated by the probes crate.
    pub probes: Option<toml::Table>,
    /// `[models.NAME.slo]` (TTFT and TPOT targets), raw: parsed and validated by the
    /// dashboards crate.
    pub slo: Option<toml::Table>,
    /// Hedging (`hedge_after_ms`; off when unset): an attempt with no response head after
    /// this long gets one second attempt on another endpoint; the first head wins.
    pub hedge_after: Option<Duration>,
    /// `[models.NAME.capture]` when `enabled`: flagged requests' bodies are kept for
    /// regression cases. None (the default): no body is ever kept.
    pub capture: Option<CaptureConfig>,
}

/// What an active alert (open or acknowledged) on an endpoint does to its routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDrift {
    /// Lowest priority: tried only after every endpoint without an alert (still a fallback).
    #[default]
    Demote,
    /// Never chosen.
    Exclude,
    /// Routed as if there were no alert.
    Ignore,
}

/// Routing policy of one logical model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Random, proportional to `weight`.
    Weighted,
    /// Peak-EWMA latency with power-of-two-choices.
    LowestLatency,
    /// Lowest configured price (input + output per 1M tokens).
    Cheapest,
    /// Same session or prompt prefix -> same healthy endpoint (rendezvous hashing).
    CacheAffinity,
}

impl Policy {
    /// The name used in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Weighted => "weighted",
            Policy::LowestLatency => "lowest_latency",
            Policy::Cheapest => "cheapest",
            Policy::CacheAffinity => "cache_affinity",
        }
    }
}

/// `[[models.NAME.endpoints]]`.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// A key of `[providers]`.
    pub provider: String,
    /// The model id the provider knows the model by.
    pub model: String,
    /// Relative share under the weighted policy (and the rendezvous weight).
    pub weight: f64,
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ProxyError> {
        let src = std::fs::read_to_string(path).map_err(|source| ProxyError::ConfigRead {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml_str(&src)
    }

    /// Parses and validates TOML text.
    pub fn from_toml_str(src: &str) -> Result<Config, ProxyError> {
        let raw: RawConfig = toml::from_str(src).map_err(|e| {
            let line = e.span().map(|s| line_of(src, &s));
            ProxyError::ConfigParse {
                line,
                text: line.and_then(|l| line_in_table(src, l)),
                message: e.message().to_owned(),
            }
        })?;
        Validator { src }.config(raw)
    }

    /// A few lines describing what the configuration sets up, for `samewise config check`.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "listen {}; {} provider(s), {} model(s); at most {} attempt(s) per request\n",
            self.server.listen,
            self.providers.len(),
            self.models.len(),
            self.limits.max_attempts
        );
        for (name, model) in &self.models {
            let eps: Vec<String> = model
                .endpoints
                .iter()
                .map(|e| e.id().into_string())
                .collect();
            out.push_str(&format!(
                "  model {name}: {} over {}\n",
                model.policy.name(),
                eps.join(", ")
            ));
        }
        let days = |d: Option<Duration>| {
            d.map_or("for ever".to_owned(), |d| {
                format!("{} days", d.as_secs() / 86_400)
            })
        };
        out.push_str(&format!(
            "retention: records {}, rollups and probe runs {}, probe runs' raw data {}\n",
            days(self.retention.records),
            days(self.retention.rollups),
            days(self.retention.probe_raw)
        ));
        out
    }
}

/// Line `line` (1-based) of `src` as an error quotes it: trimmed, cut at 100 characters, with
/// the header of the table it is in (`[server] body_limit_bytes = "lots"`): the parser's type
/// errors name neither the key nor the table. None for a blank line.
fn line_in_table(src: &str, line: usize) -> Option<String> {
    const MOST: usize = 100;
    let lines: Vec<&str> = src.lines().collect();
    let text = lines.get(line.checked_sub(1)?)?.trim();
    if text.is_empty() {
        return None;
    }
    let mut out = String::new();
    if !text.starts_with('[') {
        let header = lines[..line - 1]
            .iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| l.starts_with('['));
        if let Some(h) = header {
            out.push_str(h);
            out.push(' ');
        }
    }
    out.push_str(text);
    if let Some((cut, _)) = out.char_indices().nth(MOST) {
        out.truncate(cut);
        out.push('…');
    }
    Some(out)
}

/// The 1-based line of a byte offset range's start.
fn line_of(src: &str, span: &Range<usize>) -> usize {
    let end = span.start.min(src.len());
    src.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    breaker: RawBreaker,
    #[serde(default)]
    retention: RawRetention,
    #[serde(default)]
    providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    models: BTreeMap<String, RawModel>,
    probes: Option<toml::Table>,
    evals: Option<toml::Table>,
    dashboards: Option<toml::Table>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_attempts: Option<Spanned<u32>>,
    backoff_base_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    retry_after_max_ms: Option<u64>,
    key_cache_ttl_ms: Option<Spanned<u64>>,
    key_stale_grace_ms: Option<u64>,
    record_queue_capacity: Option<Spanned<u64>>,
    record_queue_bytes: Option<Spanned<u64>>,
    max_streams_per_key: Option<Spanned<u32>>,
    degenerate_repeat: Option<Spanned<u64>>,
    degenerate_min_chars: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    consecutive_failures: Option<Spanned<u32>>,
    error_rate: Option<Spanned<f64>>,
    min_requests: Option<u32>,
    window_ms: Option<Spanned<u64>>,
    cooldown_ms: Option<u64>,
    half_open_trials: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    base_url: Spanned<String>,
    api_key_env: Option<Spanned<String>>,
    connect_timeout_ms: Option<Spanned<u64>>,
    first_byte_timeout_ms: Option<Spanned<u64>>,
    first_byte_floor_ms: Option<Spanned<u64>>,
    idle_timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    price_input_per_mtok: Option<Spanned<f64>>,
    #[serde(default)]
    price_output_per_mtok: Option<Spanned<f64>>,
    region: Option<String>,
    data_collection: Option<DataCollection>,
    quantization: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    #[serde(default)]
    policy: Option<Policy>,
    endpoints: Option<Spanned<Vec<RawEndpoint>>>,
    on_drift: Option<OnDrift>,
    probes: Option<toml::Table>,
    slo: Option<toml::Table>,
    hedge_after_ms: Option<Spanned<u64>>,
    capture: Option<Spanned<RawCapture>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    provider: Spanned<String>,
    model: Spanned<String>,
    weight: Option<Spanned<f64>>,
}

/// Turns raw values into checked ones, pointing errors at lines of `src`.
struct Validator<'a> {
    src: &'a str,
}

impl Validator<'_> {
    fn err<T>(
        &self,
        key: impl Into<String>,
        span: Option<Range<usize>>,
        message: impl Into<String>,
    ) -> Result<T, ProxyError> {
        Err(ProxyError::ConfigInvalid {
            key: key.into(),
            line: span.map(|s| line_of(self.src, &s)),
            message: message.into(),
        })
    }

    fn positive_ms(
        &self,
        key: &str,
        v: Option<Spanned<u64>>,
        default_ms: u64,
    ) -> Result<Duration, ProxyError> {
        match v {
            None => Ok(Duration::from_millis(default_ms)),
            Some(s) if *s.get_ref() == 0 => self.err(key, Some(s.span()), "must be greater than 0"),
            Some(s) if *s.get_ref() > MAX_DURATION_MS => self.err(
                key,
                Some(s.span()),
                format!(
                    "must be at most {MAX_DURATION_MS} (7 days), not {}",
                    s.get_ref()
                ),
            ),
            Some(s) => Ok(Duration::from_millis(*s.get_ref())),
        }
    }

    /// A duration in milliseconds (0 allowed) of at most [`MAX_DURATION_MS`].
    fn bounded_ms(
        &self,
        key: &str,
        v: Option<u64>,
        default_ms: u64,
    ) -> Result<Duration, ProxyError> {
        match v {
            Some(ms) if ms > MAX_DURATION_MS => self.err(
                key,
                None,
                format!("must be at most {MAX_DURATION_MS} (7 days), not {ms}"),
            ),
            v => Ok(Duration::from_millis(v.unwrap_or(default_ms))),
        }
    }

    fn price(&self, key: String, v: Option<Spanned<f64>>) -> Result<f64, ProxyError> {
        match v {
            None => Ok(0.0),
            Some(s) if !s.get_ref().is_finite() || *s.get_ref() < 0.0 => {
                self.err(key, Some(s.span()), "must be a finite number >= 0")
            }
            Some(s) => Ok(*s.get_ref()),
        }
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ProxyError> {
        let server = self.server(raw.server)?;
        let limits = self.limits(raw.limits)?;
        let breaker = self.breaker(raw.breaker)?;
        let retention = self.retention(raw.retention)?;
        let mut providers = BTreeMap::new();
        for (name, p) in raw.providers {
            let checked = self.provider(&name, p)?;
            providers.insert(name, checked);
        }
        let mut models = BTreeMap::new();
        for (name, m) in raw.models {
            let checked = self.model(&name, m, &providers)?;
            models.insert(name, checked);
        }
        if models.is_empty() {
            return self.err("models", None, "at least one [models.NAME] table is needed");
        }
        Ok(Config {
            server,
            limits,
            breaker,
            retention,
            providers,
            models,
            probes: raw.probes,
            evals: raw.evals,
            dashboards: raw.dashboards,
        })
    }

    fn limits(&self, raw: RawLimits) -> Result<Limits, ProxyError> {
        let max_attempts = match raw.max_attempts {
            None => 3,
            Some(s) if *s.get_ref() == 0 => {
                return self.err("limits.max_attempts", Some(s.span()), "must be at least 1");
            }
            Some(s) => *s.get_ref(),
        };
        let record_queue_capacity = match raw.record_queue_capacity {
            None => 10_000,
            Some(s) if *s.get_ref() == 0 => {
                return self.err(
                    "limits.record_queue_capacity",
                    Some(s.span()),
                    "must be at least 1",
                );
            }
            Some(s) => usize::try_from(*s.get_ref()).unwrap_or(usize::MAX),
        };
        let record_queue_bytes = match raw.record_queue_bytes {
            None => samewise_store::DEFAULT_MAX_QUEUED_RECORD_BYTES,
            Some(s) if *s.get_ref() < MIN_RECORD_QUEUE_BYTES => {
                return self.err(
                    "limits.record_queue_bytes",
                    Some(s.span()),
                    format!("must be at least {MIN_RECORD_QUEUE_BYTES} (a few records)"),
                );
            }
            Some(s) => usize::try_from(*s.get_ref()).unwrap_or(usize::MAX),
        };
        let max_streams_per_key = match raw.max_streams_per_key {
            None => 256,
            Some(s) if *s.get_ref() == 0 => {
                return self.err(
                    "limits.max_streams_per_key",
                    Some(s.span()),
                    "must be at least 1",
                );
            }
            Some(s) => *s.get_ref(),
        };
        let degenerate_repeat = match raw.degenerate_repeat {
            None => 4,
            Some(s) if *s.get_ref() < 2 => {
                return self.err(
                    "limits.degenerate_repeat",
                    Some(s.span()),
                    "must be at least 2",
                );
            }
            Some(s) => usize::try_from(*s.get_ref()).unwrap_or(usize::MAX),
        };
        let backoff_base = self.bounded_ms("limits.backoff_base_ms", raw.backoff_base_ms, 25)?;
        let backoff_max = self.bounded_ms("limits.backoff_max_ms", raw.backoff_max_ms, 1_000)?;
        Ok(Limits {
            max_attempts,
            backoff_base,
            backoff_max: backoff_max.max(backoff_base),
            retry_after_max: self.bounded_ms(
                "limits.retry_after_max_ms",
                raw.retry_after_max_ms,
                5_000,
            )?,
            key_cache_ttl: self.positive_ms(
                "limits.key_cache_ttl_ms",
                raw.key_cache_ttl_ms,
                10_000,
            )?,
            key_stale_grace: self.bounded_ms(
                "limits.key_stale_grace_ms",
                raw.key_stale_grace_ms,
                900_000,
            )?,
            record_queue_capacity,
            record_queue_bytes,
            max_streams_per_key,
            degenerate_repeat,
            degenerate_min_chars: raw
                .degenerate_min_chars
                .map_or(crate::degen::DEFAULT_MIN_CHARS, |c| {
                    usize::try_from(c).unwrap_or(usize::MAX)
                }),
        })
    }

    fn breaker(&self, raw: RawBreaker) -> Result<BreakerConfig, ProxyError> {
        let d = BreakerConfig::default();
        let consecutive_failures = match raw.consecutive_failures {
            None => d.consecutive_failures,
            Some(s) if *s.get_ref() == 0 => {
                return self.err(
                    "breaker.consecutive_failures",
                    Some(s.span()),
                    "must be at least 1",
                );
            }
            Some(s) => *s.get_ref(),
        };
        let error_rate = match raw.error_rate {
            None => d.error_rate,
            Some(s) if !(*s.get_ref() > 0.0 && *s.get_ref() <= 1.0) => {
                return self.err("breaker.error_rate", Some(s.span()), "must be in (0, 1]");
            }
            Some(s) => *s.get_ref(),
        };
        let half_open_trials = match raw.half_open_trials {
            None => d.half_open_trials,
            Some(s) if *s.get_ref() == 0 => {
                return self.err(
                    "breaker.half_open_trials",
                    Some(s.span()),
                    "must be at least 1",
                );
            }
            Some(s) => *s.get_ref(),
        };
        Ok(BreakerConfig {
            consecutive_failures,
            error_rate,
            min_requests: raw.min_requests.unwrap_or(d.min_requests).max(1),
            window: self.positive_ms("breaker.window_ms", raw.window_ms, 30_000)?,
            cooldown: self.bounded_ms("breaker.cooldown_ms", raw.cooldown_ms, 10_000)?,
            half_open_trials,
        })
    }

    fn provider(&self, name: &str, raw: RawProvider) -> Result<ProviderConfig, ProxyError> {
        let key = |k: &str| format!("providers.{name}.{k}");
        let url = raw.base_url.get_ref().trim();
        if !(url.starts_with("http://") || url.starts_with("https://"))
            || url.len() <= "https://".len()
        {
            return self.err(
                key("base_url"),
                Some(raw.base_url.span()),
                "must be an http:// or https:// URL",
            );
        }
        if let Some(env) = &raw.api_key_env {
            let ok = !env.get_ref().is_empty()
                && env
                    .get_ref()
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return self.err(
                    key("api_key_env"),
                    Some(env.span()),
                    "must be an environment variable name (A-Z, 0-9, _)",
                );
            }
        }
        let first_byte_timeout = self.positive_ms(
            &key("first_byte_timeout_ms"),
            raw.first_byte_timeout_ms,
            60_000,
        )?;
        let first_byte_floor = match raw.first_byte_floor_ms {
            // The default floor never exceeds a smaller configured cap.
            None => Duration::from_millis(1_000).min(first_byte_timeout),
            Some(s) if Duration::from_millis(*s.get_ref()) > first_byte_timeout => {
                return self.err(
                    key("first_byte_floor_ms"),
                    Some(s.span()),
                    format!(
                        "must be at most first_byte_timeout_ms ({} ms)",
                        first_byte_timeout.as_millis()
                    ),
                );
            }
            v => self.positive_ms(&key("first_byte_floor_ms"), v, 1_000)?,
        };
        Ok(ProviderConfig {
            base_url: url.trim_end_matches('/').to_owned(),
            api_key_env: raw.api_key_env.map(Spanned::into_inner),
            connect_timeout: self.positive_ms(
                &key("connect_timeout_ms"),
                raw.connect_timeout_ms,
                5_000,
            )?,
            first_byte_timeout,
            first_byte_floor,
            idle_timeout: self.positive_ms(&key("idle_timeout_ms"), raw.idle_timeout_ms, 60_000)?,
            price_input_per_mtok: self
                .price(key("price_input_per_mtok"), raw.price_input_per_mtok)?,
            price_output_per_mtok: self
                .price(key("price_output_per_mtok"), raw.price_output_per_mtok)?,
            region: raw.region,
            data_collection: raw.data_collection.unwrap_or(DataCollection::Allow),
            quantization: raw.quantization,
        })
    }

    fn model(
        &self,
        name: &str,
        raw: RawModel,
        providers: &BTreeMap<String, ProviderConfig>,
    ) -> Result<ModelConfig, ProxyError> {
        let (span, raw_endpoints) = match raw.endpoints {
            Some(e) => (Some(e.span()), e.into_inner()),
            None => (None, Vec::new()),
        };
        if raw_endpoints.is_empty() {
            return self.err(
                format!("models.{name}.endpoints"),
                span,
                "a model needs at least one endpoint",
            );
        }
        let mut endpoints = Vec::with_capacity(raw_endpoints.len());
        let mut seen = std::collections::HashSet::new();
        for (i, e) in raw_endpoints.into_iter().enumerate() {
            let key = |k: &str| format!("models.{name}.endpoints[{i}].{k}");
            if !providers.contains_key(e.provider.get_ref()) {
                let msg = format!(
                    "names provider \"{}\", which is not in [providers]",
                    e.provider.get_ref()
                );
                return self.err(key("provider"), Some(e.provider.span()), msg);
            }
            if e.model.get_ref().is_empty() {
                return self.err(key("model"), Some(e.model.span()), "must not be empty");
            }
            let weight = match e.weight {
                None => 1.0,
                Some(w) if !(w.get_ref().is_finite() && *w.get_ref() > 0.0) => {
                    return self.err(key("weight"), Some(w.span()), "must be a number > 0");
                }
                Some(w) => *w.get_ref(),
            };
            if !seen.insert((e.provider.get_ref().clone(), e.model.get_ref().clone())) {
                let msg = "the same provider and model are listed twice";
                return self.err(key("model"), Some(e.model.span()), msg);
            }
            endpoints.push(EndpointConfig {
                provider: e.provider.into_inner(),
                model: e.model.into_inner(),
                weight,
            });
        }
        Ok(ModelConfig {
            policy: raw.policy.unwrap_or(Policy::Weighted),
            endpoints,
            on_drift: raw.on_drift.unwrap_or_default(),
            probes: raw.probes,
            slo: raw.slo,
            hedge_after: match raw.hedge_after_ms {
                None => None,
                v => Some(self.positive_ms(&format!("models.{name}.hedge_after_ms"), v, 0)?),
            },
            capture: match raw.capture {
                None => None,
                Some(c) => self.capture(name, c)?,
            },
        })
    }
}

#[cfg(test)]
mod tests;
