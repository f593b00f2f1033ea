//! The `[evals]` section, parsed here from the raw table the proxy's config keeps
//! (`deny_unknown_fields`; errors name the key).
//!
//! ```toml
//! [evals]
//! workers = 1                  # job workers inside `samewise serve` (0: none)
//! lease_ms = 30000             # a claimed job's lease; heartbeats renew it every lease/3
//! poll_ms = 2000               # idle workers and the alert watcher look this often
//! max_attempts = 3             # claims per job before it is failed
//! cooldown_ms = 3600000        # per endpoint and suite, kept in the database (an alert
//!                              # opens each suite once; alerts on an endpoint share it)
//! budget_tokens = 200000       # per job, both targets together
//! concurrency = 4              # items in flight per job
//! delta = 0.05                 # verdict margin δ (5 points)
//! alpha = 0.01                 # verdict significance α (whole job)
//! looks = 4                    # sequential looks (Bonferroni split of α)
//! reference_url = "http://127.0.0.1:8081"  # default: probes.reference.url
//! reference_model = "smollm2"  # the model name the reference serves
//! webhooks = ["http://..."]    # verdicts are POSTed here
//! max_items = 32               # items per job opened by an alert (default: the whole suite)
//! [evals.long_context]         # the long_context suite (a job's params override each key)
//! window = 8192                # longest length (default: the model's, from /tokenize)
//! start_tokens = 256           # shortest length; lengths double up to the window
//! tasks = ["single_needle", "multi_key", "multi_value", "multi_query", "variable_tracking"]
//! distractors = 3              # K distractor answers per item
//! margin = 2.9957              # nats the true answer must beat every distractor by (ln 20)
//! [evals.suites.smoke]         # a customer suite (JSONL, see `custom`), by name
//! path = "suites/smoke.jsonl"  # relative to the working directory; read and checked here
//! [[evals.rules]]              # alert → suites (default: the rules below)
//! kind = "unfaithful"
//! suites = ["tool_calls"]
//! [[evals.rules]]
//! kind = "passive"
//! signal = "tool"              # a substring of the alert's evidence (JSON text)
//! suites = ["tool_calls"]
//! [[evals.rules]]              # a long-context probe finding (unfaithful or changed)
//! kind = "unfaithful"
//! signal = "effective_context"
//! suites = ["long_context"]
//! [[evals.rules]]              # a fingerprint probe's change (no reference needed)
//! kind = "changed"
//! signal = '"probe_kind":"fingerprint"'
//! suites = ["tool_calls"]
//! ```

use std::time::Duration;

use samewise_longctx::TaskKind;
use serde::Deserialize;

use crate::EvalsError;
use crate::stats::VerdictParams;

/// `[evals] cooldown_ms` when unset: an hour.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(3_600);

/// The built-in suites.
pub const KNOWN_SUITES: &[&str] = &["tool_calls", "long_context", "regression"];

/// Whether `name` is a regression suite: `regression`, or `regression-NAME` (a named set of
/// cases, `samewise evals capture --suite regression-NAME`). Its items are the model's stored
/// cases.
pub fn is_regression(name: &str) -> bool {
    name == "regression"
        || name.strip_prefix("regression-").is_some_and(|rest| {
            !rest.is_empty()
                && rest.len() <= 53
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        })
}

/// A customer suite named in `[evals.suites.NAME]`: its file, checked when the config loads.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteFile {
    /// The file as configured.
    pub path: std::path::PathBuf,
    /// Its items as a job stores them (validated, ids filled in).
    pub items: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSuite {
    path: std::path::PathBuf,
}

/// Whether `name` may name a customer suite: 1–64 of `[a-z0-9_-]`, not a built-in's name.
fn valid_suite_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && !KNOWN_SUITES.contains(&name)
        && !name.starts_with("regression")
}

/// `[evals.long_context]`: how the `long_context` suite builds its items.
#[derive(Debug, Clone, PartialEq)]
pub struct LongContextConfig {
    /// The longest length in tokens (None: the model's, as its `/tokenize` reports it).
    pub window: Option<u32>,
    /// The shortest length; lengths double up to the window.
    pub start_tokens: u32,
    /// The tasks, one haystack per task and length.
    pub tasks: Vec<TaskKind>,
    /// Distractor answers per item (K).
    pub distractors: usize,
    /// Nats by which a true answer must beat every distractor.
    pub margin: f64,
}

impl Default for LongContextConfig {
    fn default() -> Self {
        LongContextConfig {
            window: None,
            start_tokens: 256,
            tasks: TaskKind::ALL.to_vec(),
            distractors: 3,
            margin: samewise_longctx::score::DEFAULT_MARGIN,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLongContext {
    window: Option<u32>,
    start_tokens: Option<u32>,
    tasks: Option<Vec<String>>,
    distractors: Option<usize>,
    margin: Option<f64>,
}

impl LongContextConfig {
    /// Checks and fills `raw`; `key` prefixes the names in errors (`evals.long_context`, or
    /// `params` for a job's overrides).
    fn from_raw(
        raw: RawLongContext,
        base: &LongContextConfig,
        key: &str,
    ) -> Result<Self, EvalsError> {
        let bad = |k: &str, m: &str| EvalsError::Config {
            key: format!("{key}.{k}"),
            message: m.to_owned(),
        };
        let start_tokens = raw.start_tokens.unwrap_or(base.start_tokens);
        if start_tokens < 16 {
            return Err(bad("start_tokens", "must be at least 16"));
        }
        let window = raw.window.or(base.window);
        if window.is_some_and(|w| w < start_tokens) {
            return Err(bad("window", "must be at least start_tokens"));
        }
        let tasks = match raw.tasks {
            None => base.tasks.clone(),
            Some(names) => {
                let mut out = Vec::new();
                for n in &names {
                    let t = TaskKind::parse(n).ok_or_else(|| {
                        let known: Vec<&str> = TaskKind::ALL.iter().map(|t| t.as_str()).collect();
                        bad(
                            "tasks",
                            &format!("unknown task {n:?} (known: {})", known.join(", ")),
                        )
                    })?;
                    if !out.contains(&t) {
                        out.push(t);
                    }
                }
                if out.is_empty() {
                    return Err(bad("tasks", "name at least one task"));
                }
                out
            }
        };
        let distractors = raw.distractors.unwrap_or(base.distractors);
        if !(1..=16).contains(&distractors) {
            return Err(bad("distractors", "must be in 1..=16"));
        }
        let margin = raw.margin.unwrap_or(base.margin);
        if !(margin.is_finite() && margin >= 0.0) {
            return Err(bad("margin", "must be a finite number ≥ 0"));
        }
        Ok(LongContextConfig {
            window,
            start_tokens,
            tasks,
            distractors,
            margin,
        })
    }

    /// This config with a job's `params` (window, start_tokens, tasks, distractors, margin)
    /// applied.
    pub fn with_params(&self, params: &serde_json::Value) -> Result<Self, EvalsError> {
        let pick = |k: &str| params.get(k).cloned().unwrap_or(serde_json::Value::Null);
        let raw = RawLongContext {
            window: serde_json::from_value(pick("window")).ok().flatten(),
            start_tokens: serde_json::from_value(pick("start_tokens")).ok().flatten(),
            tasks: serde_json::from_value(pick("tasks")).ok().flatten(),
            distractors: serde_json::from_value(pick("distractors")).ok().flatten(),
            margin: serde_json::from_value(pick("margin")).ok().flatten(),
        };
        LongContextConfig::from_raw(raw, self, "params")
    }
}

/// One mapping from an alert to suites.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The alert's kind ("unfaithful", "changed", "passive").
    pub kind: String,
    /// When set, the rule applies only if the alert's evidence (as JSON text) contains it.
    #[serde(default)]
    pub signal: Option<String>,
    /// The suites to open.
    pub suites: Vec<String>,
}

impl Rule {
    /// Whether the rule applies to an alert of `kind` with `evidence`.
    pub fn matches(&self, kind: &str, evidence: &serde_json::Value) -> bool {
        self.kind == kind
            && self
                .signal
                .as_deref()
                .is_none_or(|s| evidence.to_string().contains(s))
    }
}

/// The checked `[evals]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalsConfig {
    /// Workers inside `samewise serve`.
    pub workers: u32,
    /// Lease of a claimed job.
    pub lease: Duration,
    /// Idle poll period.
    pub poll: Duration,
    /// Claims per job.
    pub max_attempts: u32,
    /// Cooldown per endpoint and suite.
    pub cooldown: Duration,
    /// Token budget per job.
    pub budget_tokens: i64,
    /// Items in flight per job.
    pub concurrency: usize,
    /// Verdict parameters.
    pub verdict: VerdictParams,
    /// The reference engine's base URL (the baseline "reference").
    pub reference_url: Option<String>,
    /// The model name the reference serves.
    pub reference_model: Option<String>,
    /// Verdicts are POSTed here.
    pub webhooks: Vec<String>,
    /// Alert → suites.
    pub rules: Vec<Rule>,
    /// Jobs opened by alerts run at most this many items of their suite (None: all).
    pub max_items: Option<u64>,
    /// The `long_context` suite's items.
    pub long_context: LongContextConfig,
    /// Customer suites by name.
    pub suites: std::collections::BTreeMap<String, SuiteFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    workers: Option<u32>,
    lease_ms: Option<u64>,
    poll_ms: Option<u64>,
    max_attempts: Option<u32>,
    cooldown_ms: Option<u64>,
    budget_tokens: Option<i64>,
    concurrency: Option<usize>,
    delta: Option<f64>,
    alpha: Option<f64>,
    looks: Option<u32>,
    reference_url: Option<String>,
    reference_model: Option<String>,
    webhooks: Option<Vec<String>>,
    rules: Option<Vec<Rule>>,
    max_items: Option<u64>,
    long_context: Option<RawLongContext>,
    suites: Option<std::collections::BTreeMap<String, RawSuite>>,
}

fn bad(key: &str, msg: impl Into<String>) -> EvalsError {
    EvalsError::Config {
        key: format!("evals.{key}"),
        message: msg.into(),
    }
}

fn suite_list(suites: &std::collections::BTreeMap<String, SuiteFile>) -> String {
    KNOWN_SUITES
        .iter()
        .copied()
        .chain(suites.keys().map(String::as_str))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The default alert → suite rules.
pub fn default_rules() -> Vec<Rule> {
    vec![
        Rule {
            kind: "unfaithful".into(),
            signal: None,
            suites: vec!["tool_calls".into()],
        },
        Rule {
            kind: "passive".into(),
            signal: Some("tool".into()),
            suites: vec!["tool_calls".into()],
        },
        // the long_context probe's findings name their statistic in the evidence
        Rule {
            kind: "unfaithful".into(),
            signal: Some("effective_context".into()),
            suites: vec!["long_context".into()],
        },
        Rule {
            kind: "changed".into(),
            signal: Some("effective_context".into()),
            suites: vec!["long_context".into()],
        },
        // without the weights a fingerprint's change is the first sign: does it still work?
        Rule {
            kind: "changed".into(),
            signal: Some("\"probe_kind\":\"fingerprint\"".into()),
            suites: vec!["tool_calls".into()],
        },
    ]
}

impl EvalsConfig {
    /// Parses `[evals]` (None: every default). `probes` is the raw `[probes]` table, whose
    /// `reference.url` is the default reference.
    pub fn parse(
        evals: Option<&toml::Table>,
        probes: Option<&toml::Table>,
    ) -> Result<EvalsConfig, EvalsError> {
        let raw: Raw = match evals {
            None => Raw::default(),
            Some(t) => t
                .clone()
                .try_into()
                .map_err(|e: toml::de::Error| bad("", e.message().to_owned()))?,
        };
        let ms = |v: Option<u64>, d: u64| Duration::from_millis(v.unwrap_or(d));
        let lease = ms(raw.lease_ms, 30_000);
        if lease < Duration::from_millis(300) {
            return Err(bad("lease_ms", "must be at least 300"));
        }
        let delta = raw.delta.unwrap_or(0.05);
        if !(delta > 0.0 && delta < 1.0) {
            return Err(bad("delta", "must be in (0, 1)"));
        }
        let alpha = raw.alpha.unwrap_or(0.01);
        if !(alpha > 0.0 && alpha < 0.5) {
            return Err(bad("alpha", "must be in (0, 0.5)"));
        }
        let looks = raw.looks.unwrap_or(4);
        if looks == 0 {
            return Err(bad("looks", "must be at least 1"));
        }
        let concurrency = raw.concurrency.unwrap_or(4);
        if concurrency == 0 {
            return Err(bad("concurrency", "must be at least 1"));
        }
        let mut suites = std::collections::BTreeMap::new();
        for (name, s) in raw.suites.unwrap_or_default() {
            let key = format!("suites.{name}");
            if !valid_suite_name(&name) {
                return Err(bad(
                    &key,
                    "a suite name is 1-64 of a-z, 0-9, '_', '-' and not a built-in suite's",
                ));
            }
            let suite = crate::custom::load(&s.path)
                .map_err(|e| bad(&format!("{key}.path"), e.to_string()))?;
            suites.insert(
                name,
                SuiteFile {
                    path: s.path,
                    items: suite.sources(),
                },
            );
        }
        let rules = raw.rules.unwrap_or_else(default_rules);
        for (i, r) in rules.iter().enumerate() {
            for s in &r.suites {
                if !KNOWN_SUITES.contains(&s.as_str())
                    && !is_regression(s)
                    && !suites.contains_key(s)
                {
                    return Err(bad(
                        &format!("rules[{i}].suites"),
                        format!("unknown suite {s:?} (known: {})", suite_list(&suites)),
                    ));
                }
            }
        }
        let reference_url = raw.reference_url.or_else(|| {
            probes
                .and_then(|p| p.get("reference"))
                .and_then(|r| r.get("url"))
                .and_then(|u| u.as_str())
                .map(str::to_owned)
        });
        let long_context = LongContextConfig::from_raw(
            raw.long_context.unwrap_or_default(),
            &LongContextConfig::default(),
            "evals.long_context",
        )?;
        Ok(EvalsConfig {
            long_context,
            workers: raw.workers.unwrap_or(1),
            lease,
            poll: ms(raw.poll_ms, 2_000),
            max_attempts: raw.max_attempts.unwrap_or(3).max(1),
            cooldown: raw
                .cooldown_ms
                .map_or(DEFAULT_COOLDOWN, Duration::from_millis),
            budget_tokens: raw.budget_tokens.unwrap_or(200_000),
            concurrency,
            verdict: VerdictParams {
                delta,
                alpha,
                looks,
            },
            reference_url,
            reference_model: raw.reference_model,
            webhooks: raw.webhooks.unwrap_or_default(),
            rules,
            max_items: raw.max_items,
            suites,
        })
    }

    /// Every suite name a job may name: the built-ins, then the customer suites.
    pub fn suite_names(&self) -> Vec<&str> {
        KNOWN_SUITES
            .iter()
            .copied()
            .chain(self.suites.keys().map(String::as_str))
            .collect()
    }

    /// The suites the rules map an alert to, deduplicated in rule order.
    pub fn suites_for(&self, kind: &str, evidence: &serde_json::Value) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self.rules.iter().filter(|r| r.matches(kind, evidence)) {
            for s in &r.suites {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_context_keys_and_job_params() {
        let t = table("[long_context]\nwindow = 1024\ntasks = [\"multi_query\"]\ndistractors = 2");
        let c = EvalsConfig::parse(Some(&t), None).map_err(|e| e.to_string());
        let c = c.unwrap_or_else(|e| panic!("{e}")).long_context;
        assert_eq!(c.window, Some(1024));
        assert_eq!(c.tasks, vec![TaskKind::MultiQuery]);
        assert_eq!(c.distractors, 2);
        let p = c
            .with_params(
                &serde_json::json!({"window": 512, "tasks": ["single_needle", "single_needle"]}),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (p.window, p.tasks.clone(), p.distractors),
            (Some(512), vec![TaskKind::SingleNeedle], 2)
        );
        let e = c
            .with_params(&serde_json::json!({"window": 8}))
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("params.window")));
    }

    fn table(s: &str) -> toml::Table {
        s.parse().unwrap_or_default()
    }

    #[test]
    fn defaults_and_reference_from_probes() {
        let probes = table("[reference]\nbackend = \"remote\"\nurl = \"http://r:1\"");
        let c = EvalsConfig::parse(None, Some(&probes)).map_err(|e| e.to_string());
        let c = c.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.reference_url.as_deref(), Some("http://r:1"));
        assert_eq!(c.verdict, VerdictParams::default());
        assert_eq!(c.workers, 1);
        let ev = serde_json::json!({"signal": "tool_errors"});
        assert_eq!(c.suites_for("passive", &ev), vec!["tool_calls"]);
        assert!(
            c.suites_for("passive", &serde_json::json!({"signal": "degenerate"}))
                .is_empty()
        );
        assert_eq!(c.suites_for("unfaithful", &ev), vec!["tool_calls"]);
        assert!(c.suites_for("changed", &ev).is_empty());
        let lc =
            serde_json::json!({"probe_kind": "long_context", "statistic": "effective_context"});
        assert_eq!(
            c.suites_for("unfaithful", &lc),
            vec!["tool_calls", "long_context"]
        );
        assert_eq!(c.suites_for("changed", &lc), vec!["long_context"]);
        let fp = serde_json::json!({"detector": "changed", "probe_kind": "fingerprint", "statistic": "own_logprob_mean"});
        assert_eq!(c.suites_for("changed", &fp), vec!["tool_calls"]);
        assert!(c.suites_for("unfaithful", &fp) == vec!["tool_calls"]);
        let kl = serde_json::json!({"detector": "changed", "probe_kind": "prompt_logprobs", "statistic": "kl_mean"});
        assert!(c.suites_for("changed", &kl).is_empty());
        assert_eq!(c.long_context, LongContextConfig::default());
    }

    #[test]
    fn customer_suites_load_at_parse_and_rules_may_name_them() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let good = dir.path().join("good.jsonl");
        let bad = dir.path().join("bad.jsonl");
        let line = r#"{"request": {"messages": [{"role": "user", "content": "hi"}]}, "check": {"kind": "contains", "value": "x"}}"#;
        std::fs::write(&good, format!("{line}\n{line}\n")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&bad, format!("{line}\n{{\"check\": 1}}\n"))
            .unwrap_or_else(|e| panic!("{e}"));
        let src = format!(
            "[suites.mine]\npath = {:?}\n[[rules]]\nkind = \"passive\"\nsuites = [\"mine\"]",
            good.display().to_string()
        );
        let c = EvalsConfig::parse(Some(&table(&src)), None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.suites["mine"].items.len(), 2);
        assert_eq!(c.suites["mine"].items[1]["id"], "line-2");
        assert_eq!(
            c.suite_names(),
            ["tool_calls", "long_context", "regression", "mine"]
        );
        assert_eq!(c.suites_for("passive", &serde_json::json!({})), ["mine"]);
        for (src, want) in [
            (
                format!("[suites.mine]\npath = {:?}", bad.display().to_string()),
                "evals.suites.mine.path: suite: ".to_owned(),
            ),
            (
                format!("[suites.mine]\npath = {:?}", bad.display().to_string()),
                "bad.jsonl:2: request: missing".to_owned(),
            ),
            (
                format!(
                    "[suites.tool_calls]\npath = {:?}",
                    good.display().to_string()
                ),
                "evals.suites.tool_calls: a suite name".to_owned(),
            ),
            (
                format!(
                    "[suites.\"Big Name\"]\npath = {:?}",
                    good.display().to_string()
                ),
                "evals.suites.Big Name: a suite name".to_owned(),
            ),
            (
                "[suites.x]\npath = \"/nonexistent.jsonl\"".to_owned(),
                "evals.suites.x.path: suite: /nonexistent.jsonl: cannot open".to_owned(),
            ),
            ("[suites.x]\nfile = \"a\"".to_owned(), "file".to_owned()),
            (
                "[[rules]]\nkind = \"x\"\nsuites = [\"mine\"]".to_owned(),
                "unknown suite \"mine\" (known: tool_calls, long_context, regression)".to_owned(),
            ),
        ] {
            let e = EvalsConfig::parse(Some(&table(&src)), None)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(&want), "{src}: {e}");
        }
    }

    #[test]
    fn errors_name_the_key() {
        for (src, key) in [
            ("nope = 1", "nope"),
            ("delta = 2.0", "evals.delta"),
            ("looks = 0", "evals.looks"),
            (
                "[[rules]]\nkind = \"x\"\nsuites = [\"bogus\"]",
                "evals.rules[0].suites",
            ),
            ("[[rules]]\nkind = \"x\"\nsuites = []\nwhat = 1", "what"),
            (
                "[long_context]\ntasks = [\"nope\"]",
                "evals.long_context.tasks",
            ),
            (
                "[long_context]\nstart_tokens = 512\nwindow = 256",
                "evals.long_context.window",
            ),
            (
                "[long_context]\ndistractors = 0",
                "evals.long_context.distractors",
            ),
            ("[long_context]\nwhat = 1", "what"),
        ] {
            let e = EvalsConfig::parse(Some(&table(src)), None)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(key), "{src}: {e}");
        }
    }
}
