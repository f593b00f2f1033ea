//! Serving profiles: a reference engine that behaves like a drifting provider on purpose.
//!
//! A profile (TOML, or one of the built-in names) composes numerical faults, applied inside
//! the forward pass (weight re-quantization at load, 8-bit activations, KV-cache storage),
//! with behavioural faults applied by the server (silent context truncation, tool-call
//! corruption, a repeat-token bug, chat-template variants, API differences, latency and
//! errors). All randomness is drawn from generators seeded by `seed`, so a profile replays.
//!
//! The unmodified profile (`reference`) is the plain engine, bit for bit.
//!
//! # Layout
//! - `requant`: the number-format functions (weights, activations, KV cache).
//! - `numerics`: [`Numerics`], the numeric knobs as the forward pass applies them.
//! - this module: [`Profile`] and its sections, parsing, validation, the built-in set.
//!
//! [`Numerics`]: crate::profile::Numerics

pub(crate) mod numerics;
pub(crate) mod requant;

use serde::{Deserialize, Serialize};

use crate::error::EngineError;

pub use numerics::Numerics;
pub use requant::{Codes, KvDtype, WeightQuant};

/// One serving profile. The default is the unmodified `reference` profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Shown in `/v1/models` (the model object's `profile` field) and logs.
    #[serde(default = "reference_name")]
    pub name: String,
    /// Seed of every random choice the profile makes.
    #[serde(default)]
    pub seed: u64,
    /// Re-quantize weights at load.
    #[serde(default)]
    pub weights: Option<WeightsSection>,
    /// Quantize every matmul input to 8 bits per 32-value block.
    #[serde(default)]
    pub activations: Option<ActivationsSection>,
    /// KV-cache storage format.
    #[serde(default)]
    pub kv_cache: Option<KvCacheSection>,
    /// Silently drop part of long prompts.
    #[serde(default)]
    pub truncation: Option<TruncationSection>,
    /// Corrupt a fraction of tool calls.
    #[serde(default)]
    pub tool_calls: Option<ToolCallsSection>,
    /// Sometimes start repeating one token.
    #[serde(default)]
    pub repeat_bug: Option<RepeatBugSection>,
    /// Render chats with a faulty template.
    #[serde(default)]
    pub chat_template: Option<ChatTemplateSection>,
    /// API differences.
    #[serde(default)]
    pub api: Option<ApiSection>,
    /// Added latency.
    #[serde(default)]
    pub latency: Option<LatencySection>,
    /// Injected errors.
    #[serde(default)]
    pub errors: Option<ErrorsSection>,
    /// A different model behind the name.
    #[serde(default)]
    pub substitute: Option<SubstituteSection>,
}

fn reference_name() -> String {
    "reference".to_owned()
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            name: reference_name(),
            seed: 0,
            weights: None,
            activations: None,
            kv_cache: None,
            truncation: None,
            tool_calls: None,
            repeat_bug: None,
            chat_template: None,
            api: None,
            latency: None,
            errors: None,
            substitute: None,
        }
    }
}

/// `[weights]`: re-quantization of chosen tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsSection {
    /// The number format.
    #[serde(flatten)]
    pub quant: WeightQuant,
    /// Which tensors: `attention` (q, k, v, o), `mlp` (gate, up, down), `embeddings`
    /// (token embeddings and the output head).
    #[serde(default = "all_tensor_sets")]
    pub tensors: Vec<TensorSet>,
}

/// A set of tensors a weight re-quantization applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorSet {
    /// q, k, v and output projections.
    Attention,
    /// gate, up and down projections.
    Mlp,
    /// Token embeddings and the output head.
    Embeddings,
}

fn all_tensor_sets() -> Vec<TensorSet> {
    vec![TensorSet::Attention, TensorSet::Mlp, TensorSet::Embeddings]
}

/// `[activations]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivationsSection {
    /// Only 8 is supported (what llama.cpp's CPU kernels do).
    pub bits: u8,
}

/// `[kv_cache]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvCacheSection {
    /// Storage format.
    pub dtype: KvDtype,
}

/// `[truncation]`: prompts over `max_prompt_tokens` lose tokens with no error, and usage
/// reports the kept count as if nothing happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TruncationSection {
    /// The longest prompt served whole.
    pub max_prompt_tokens: usize,
    /// Which part goes.
    #[serde(default)]
    pub drop: TruncateDrop,
}

/// Which part of a long prompt a truncating provider drops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TruncateDrop {
    /// The beginning (the most common silent truncation).
    #[default]
    Start,
    /// The middle (keeps the system prompt and the question).
    Middle,
}

/// `[tool_calls]`: corruption of returned tool calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallsSection {
    /// Fraction of calls corrupted, 0..=1.
    pub corrupt_fraction: f64,
    /// Corruptions chosen among (uniformly, seeded).
    #[serde(default = "all_corruptions")]
    pub modes: Vec<ToolCorruption>,
}

/// How a tool call is corrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCorruption {
    /// Arguments are no longer JSON.
    InvalidJson,
    /// The function name is one the request did not declare.
    UnknownName,
    /// A required argument is removed.
    MissingRequired,
}

fn all_corruptions() -> Vec<ToolCorruption> {
    vec![
        ToolCorruption::InvalidJson,
        ToolCorruption::UnknownName,
        ToolCorruption::MissingRequired,
    ]
}

/// `[repeat_bug]`: with probability `probability` per generation, from a seeded random
/// point on, the last token is emitted again and again until the generation ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepeatBugSection {
    /// Chance per generation, 0..=1.
    pub probability: f64,
}

/// `[chat_template]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatTemplateSection {
    /// The fault.
    pub variant: TemplateVariant,
    /// With `default_system`: the system prompt used when the request has none.
    #[serde(default)]
    pub system_prompt: Option<String>,
}

/// A faulty chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateVariant {
    /// System messages are dropped.
    DropSystem,
    /// A different default system prompt is injected when the request has none.
    DefaultSystem,
    /// Role tags are wrong (`user` rendered as `human`, `assistant` as `bot`).
    WrongRoleTags,
}

/// `[api]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    /// Refuse `logprobs` (400), as providers without logprob support do.
    #[serde(default)]
    pub refuse_logprobs: bool,
    /// Refuse `echo` on `/v1/completions` (400), as chat-only providers and OpenAI's newer
    /// models do; chat logprobs still work.
    #[serde(default)]
    pub refuse_echo: bool,
    /// Cap `top_logprobs` at this many silently.
    #[serde(default)]
    pub max_top_logprobs: Option<u32>,
    /// Shift prompt (echo) logprobs by this many positions (1 reproduces a real server bug:
    /// entry i holds the logprob of token i+1).
    #[serde(default)]
    pub echo_shift: u32,
    /// Sample at this temperature whatever the request asks (0..=2), as a provider that
    /// ignores sampling parameters does; a request's seed is still used.
    #[serde(default)]
    pub fixed_temperature: Option<f64>,
    /// Logit noise on prompt (echo) logprobs, this standard deviation (nats; 0 = off): at
    /// each position the listed tokens' logits get a seeded normal draw each (one per request,
    /// position and token) and the position is renormalized, so the same request answered
    /// twice gives slightly different numbers, as batch-dependent kernels of real servers do.
    /// A token's logprob and its entry among the alternatives agree; alternatives are
    /// re-sorted. Tokens and generation are untouched.
    #[serde(default)]
    pub echo_jitter: f64,
}

/// `[latency]`: added before the first byte of each response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencySection {
    /// Median added latency.
    pub median_ms: f64,
    /// 99th percentile; equal to the median for a fixed delay. Drawn from a log-normal.
    #[serde(default)]
    pub p99_ms: Option<f64>,
}

/// `[errors]`: per-request fault rates, each 0..=1.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorsSection {
    /// Answer 500.
    #[serde(default)]
    pub rate_500: f64,
    /// Answer 429 with Retry-After.
    #[serde(default)]
    pub rate_429: f64,
    /// Close the connection in the middle of a stream.
    #[serde(default)]
    pub disconnect_rate: f64,
}

/// `[substitute]`: a different model served under the name, on the same tokenizer — these
/// weights conditioned on a fixed hidden `context`, which is how a prompt-tuned or otherwise
/// re-trained variant of the model looks from outside: a competent model whose distribution
/// is not the reference's. The context's tokens come before every sequence the engine sees
/// (scored prompts, generations, `/v1/score`) and show nowhere: not in echo, logprobs or
/// usage, and the served context window is shorter by them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubstituteSection {
    /// The hidden context (tokenized with the model's special tokens).
    pub context: String,
}

/// The built-in `substitute` profile's hidden context: a neutral preamble, not tied to any
/// probe text. Over the prompt-logprobs probe's 16 texts it moves the test model's
/// distribution by a mean top-5 KL of 0.037 nats (between the ladder's 6- and 5-bit levels)
/// while the texts' actual tokens become slightly *more* likely (+0.030 nats each on
/// average); 5-bit weights move it by 0.056 and cost the actual tokens 0.109.
pub const SUBSTITUTE_CONTEXT: &str = "The following pages are excerpts from a mixed collection \
of documents: essays on history and science, source code in Python and Rust, JSON data, \
recipes, dialogues, poems, worked math problems, news reports, legal clauses, tables and \
notes.\n\n";

/// The `noisy-echo` profile's `api.echo_jitter` (nats).
pub const NOISY_ECHO_SD: f64 = 0.01;

/// Names accepted by [`Profile::builtin`].
pub const BUILTIN_NAMES: &[&str] = &[
    "reference",
    "w8",
    "w6",
    "w5",
    "w4",
    "w3",
    "w2",
    "a8",
    "kv-f16",
    "kv-q8",
    "truncate-512",
    "truncate-1024",
    "truncate-2048",
    "tool-corrupt",
    "repeat-bug",
    "drop-system",
    "no-logprobs",
    "no-echo",
    "shifted-echo",
    "noisy-echo",
    "flaky",
    "substitute",
];

impl Profile {
    /// Parses and validates a profile from TOML text; `source_name` appears in errors.
    pub fn from_toml(text: &str, source_name: &str) -> Result<Profile, EngineError> {
        let p: Profile = toml::from_str(text).map_err(|e| EngineError::ProfileParse {
            source_name: source_name.to_owned(),
            message: e.to_string(),
        })?;
        p.validate()
            .map_err(|message| EngineError::ProfileInvalid {
                source_name: source_name.to_owned(),
                message,
            })?;
        Ok(p)
    }

    /// A built-in profile by name, or a TOML file by path.
    pub fn resolve(name_or_path: &str) -> Result<Profile, EngineError> {
        if let Some(p) = Profile::builtin(name_or_path) {
            return Ok(p);
        }
        match std::fs::read_to_string(name_or_path) {
            Ok(text) => Profile::from_toml(&text, name_or_path),
            Err(_) => Err(EngineError::UnknownProfile(name_or_path.to_owned())),
        }
    }

    /// The built-in profiles: `reference` (unmodified); `w8`..`w2`, symmetric round-to-nearest
    /// weight re-quantization, group 32, of every tensor set (the calibration ladder's levels);
    /// `a8`; `kv-f16`, `kv-q8`; one per behavioural fault.
    pub fn builtin(name: &str) -> Option<Profile> {
        let mut p = Profile {
            name: name.to_owned(),
            seed: 0,
            ..Profile::default()
        };
        match name {
            "reference" => {}
            "w8" | "w6" | "w5" | "w4" | "w3" | "w2" => {
                let bits = name[1..].parse().ok()?;
                p.weights = Some(WeightsSection {
                    quant: WeightQuant {
                        bits,
                        group_size: 32,
                        symmetric: true,
                    },
                    tensors: all_tensor_sets(),
                });
            }
            "a8" => p.activations = Some(ActivationsSection { bits: 8 }),
            "kv-f16" => {
                p.kv_cache = Some(KvCacheSection {
                    dtype: KvDtype::F16,
                })
            }
            "kv-q8" => p.kv_cache = Some(KvCacheSection { dtype: KvDtype::Q8 }),
            "truncate-512" | "truncate-1024" | "truncate-2048" => {
                p.truncation = Some(TruncationSection {
                    max_prompt_tokens: match name {
                        "truncate-1024" => 1024,
                        "truncate-2048" => 2048,
                        _ => 512,
                    },
                    drop: TruncateDrop::Start,
                })
            }
            "tool-corrupt" => {
                p.tool_calls = Some(ToolCallsSection {
                    corrupt_fraction: 1.0,
                    modes: all_corruptions(),
                })
            }
            "repeat-bug" => p.repeat_bug = Some(RepeatBugSection { probability: 1.0 }),
            "drop-system" => {
                p.chat_template = Some(ChatTemplateSection {
                    variant: TemplateVariant::DropSystem,
                    system_prompt: None,
                })
            }
            "no-logprobs" => {
                p.api = Some(ApiSection {
                    refuse_logprobs: true,
                    ..ApiSection::default()
                })
            }
            "no-echo" => {
                p.api = Some(ApiSection {
                    refuse_echo: true,
                    ..ApiSection::default()
                })
            }
            "shifted-echo" => {
                p.api = Some(ApiSection {
                    echo_shift: 1,
                    ..ApiSection::default()
                })
            }
            "noisy-echo" => {
                p.api = Some(ApiSection {
                    echo_jitter: NOISY_ECHO_SD,
                    ..ApiSection::default()
                })
            }
            "substitute" => {
                p.substitute = Some(SubstituteSection {
                    context: SUBSTITUTE_CONTEXT.to_owned(),
                })
            }
            "flaky" => {
                p.errors = Some(ErrorsSection {
                    rate_500: 0.1,
                    rate_429: 0.1,
                    disconnect_rate: 0.05,
                });
                p.latency = Some(LatencySection {
                    median_ms: 20.0,
                    p99_ms: Some(200.0),
                });
            }
            _ => return None,
        }
        Some(p)
    }

    /// Whether the profile changes nothing (the plain engine).
    pub fn is_reference(&self) -> bool {
        Profile {
            name: self.name.clone(),
            seed: self.seed,
            ..Profile::default()
        } == *self
    }

    /// Whether the engine computes differently under this profile (re-quantized weights,
    /// 8-bit activations, another KV-cache format). A profile without numeric knobs only
    /// changes what the server does around the engine, so several servers with such
    /// profiles can share one loaded reference engine (`samewise demo` does).
    pub fn changes_numerics(&self) -> bool {
        self.weights.is_some() || self.activations.is_some() || self.kv_cache.is_some()
    }

    /// Checks every range; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(w) = &self.weights {
            w.quant.validate()?;
            if w.tensors.is_empty() {
                return Err(
                    "weights.tensors must name at least one of attention, mlp, embeddings".into(),
                );
            }
        }
        if let Some(a) = &self.activations
            && a.bits != 8
        {
            return Err(format!("activations.bits must be 8, not {}", a.bits));
        }
        if let Some(t) = &self.truncation
            && t.max_prompt_tokens == 0
        {
            return Err("truncation.max_prompt_tokens must be at least 1".into());
        }
        let fraction = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be within 0..=1, not {v}"))
            }
        };
        if let Some(t) = &self.tool_calls {
            fraction("tool_calls.corrupt_fraction", t.corrupt_fraction)?;
            if t.modes.is_empty() {
                return Err("tool_calls.modes must name at least one corruption".into());
            }
        }
        if let Some(r) = &self.repeat_bug {
            fraction("repeat_bug.probability", r.probability)?;
        }
        if let Some(c) = &self.chat_template
            && c.variant == TemplateVariant::DefaultSystem
            && c.system_prompt.is_none()
        {
            return Err(
                "chat_template.system_prompt is required with variant = \"default_system\"".into(),
            );
        }
        if let Some(l) = &self.latency {
            if !(l.median_ms >= 0.0 && l.median_ms.is_finite()) {
                return Err(format!(
                    "latency.median_ms must be a non-negative number, not {}",
                    l.median_ms
                ));
            }
            if let Some(p99) = l.p99_ms
                && !(p99 >= l.median_ms && p99.is_finite())
            {
                return Err(format!(
                    "latency.p99_ms ({p99}) must be at least latency.median_ms"
                ));
            }
        }
        if let Some(j) = self.api.as_ref().map(|a| a.echo_jitter)
            && !(j >= 0.0 && j.is_finite())
        {
            return Err(format!(
                "api.echo_jitter must be a non-negative number of nats, not {j}"
            ));
        }
        if let Some(t) = self.api.as_ref().and_then(|a| a.fixed_temperature)
            && !(0.0..=2.0).contains(&t)
        {
            return Err(format!(
                "api.fixed_temperature must be within 0..=2, not {t}"
            ));
        }
        if let Some(e) = &self.errors {
            fraction("errors.rate_500", e.rate_500)?;
            fraction("errors.rate_429", e.rate_429)?;
            fraction("errors.disconnect_rate", e.disconnect_rate)?;
            if e.rate_500 + e.rate_429 > 1.0 {
                return Err("errors.rate_500 + errors.rate_429 must not exceed 1".into());
            }
        }
        if let Some(s) = &self.substitute
            && s.context.is_empty()
        {
            return Err("substitute.context must not be empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_resolves_and_validates() {
        for name in BUILTIN_NAMES {
            let p = Profile::resolve(name).unwrap();
            p.validate().unwrap();
            assert_eq!(p.is_reference(), *name == "reference", "{name}");
        }
    }

    #[test]
    fn full_toml_profile_parses() {
        let p = Profile::from_toml(
            r#"
            name = "bad-provider"
            seed = 9
            [weights]
            bits = 4
            group_size = 64
            symmetric = false
            tensors = ["attention", "mlp"]
            [activations]
            bits = 8
            [kv_cache]
            dtype = "bf16"
            [truncation]
            max_prompt_tokens = 256
            drop = "middle"
            [tool_calls]
            corrupt_fraction = 0.1
            modes = ["invalid_json"]
            [repeat_bug]
            probability = 0.05
            [chat_template]
            variant = "default_system"
            system_prompt = "You are a pirate."
            [api]
            max_top_logprobs = 5
            echo_shift = 1
            fixed_temperature = 1.0
            [latency]
            median_ms = 30
            p99_ms = 300
            [errors]
            rate_500 = 0.01
            rate_429 = 0.02
            disconnect_rate = 0.01
            "#,
            "test.toml",
        )
        .unwrap();
        assert_eq!(
            p.weights.as_ref().unwrap().quant,
            WeightQuant {
                bits: 4,
                group_size: 64,
                symmetric: false
            }
        );
        assert_eq!(p.kv_cache.unwrap().dtype, KvDtype::Bf16);
        assert_eq!(p.truncation.unwrap().drop, TruncateDrop::Middle);
        let api = p.api.unwrap();
        assert_eq!((api.echo_shift, api.fixed_temperature), (1, Some(1.0)));
        let hot = Profile::from_toml("[api]\nfixed_temperature = 2.5\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(hot.contains("api.fixed_temperature"), "{hot}");
        for bad in ["-0.01", "nan", "inf"] {
            let e = Profile::from_toml(&format!("[api]\necho_jitter = {bad}\n"), "p.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains("api.echo_jitter"), "{bad}: {e}");
        }
        let noisy = Profile::builtin("noisy-echo").unwrap();
        assert_eq!(noisy.api.unwrap().echo_jitter, NOISY_ECHO_SD);
    }

    #[test]
    fn errors_name_the_key() {
        let unknown = Profile::from_toml("[weights]\nbits = 4\nfoo = 1\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("foo") && unknown.contains("p.toml"),
            "{unknown}"
        );
        let range = Profile::from_toml("[errors]\nrate_500 = 1.5\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(range.contains("errors.rate_500"), "{range}");
        let bits = Profile::from_toml("[weights]\nbits = 7\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(bits.contains("weights.bits"), "{bits}");
        let empty = Profile::from_toml("[substitute]\ncontext = \"\"\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(empty.contains("substitute.context"), "{empty}");
        let sub = Profile::from_toml("[substitute]\ncontext = \"You are a pirate.\"\n", "p.toml")
            .unwrap();
        assert!(!sub.is_reference() && !sub.changes_numerics());
        assert_eq!(sub.substitute.unwrap().context, "You are a pirate.");
        assert!(matches!(
            Profile::resolve("/nonexistent/x.toml"),
            Err(EngineError::UnknownProfile(_))
        ));
    }
}
