//! The demo's scenario: five endpoints of the test model, each served by the reference engine
//! under a serving profile that does what a real provider has been caught doing (or does
//! nothing), the sizes that let samewise find every fault within five minutes on two cores,
//! and the gateway configuration that wires them together.
//!
//! The configuration is ordinary `samewise serve` TOML (written to the data directory as
//! `demo.toml`, so a user can read it and re-run the same setup by hand).

use std::fmt::Write as _;
use std::path::Path;

/// The logical model clients ask for.
pub const MODEL: &str = "smollm2";
/// The model id every engine serves (so endpoint ids read `exact/smol`, `w4/smol`, ...).
pub const SERVED_AS: &str = "smol";

/// What the demo expects samewise to find on an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Never flagged.
    Faithful,
    /// Flagged unfaithful by the logprob probes, "≈ 4-bit" on the ladder.
    Unfaithful,
    /// Caught by the passive tool-call check, its `tool_calls` eval "degraded".
    BrokenTools,
    /// Given an effective context length shorter than the window.
    Truncated,
}

/// One endpoint of the demo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The provider name in the config (the endpoint id is `provider/smol`).
    pub provider: &'static str,
    /// The engine's serving profile (`samewise engine serve --profile`).
    pub profile: &'static str,
    /// One line: what this provider does.
    pub story: &'static str,
    /// What samewise should find.
    pub expect: Expect,
}

impl Endpoint {
    /// `provider/smol`, the endpoint id the gateway, store and dashboards use.
    pub fn id(&self) -> String {
        format!("{}/{SERVED_AS}", self.provider)
    }
}

/// The five endpoints, in the order the summary lists them.
pub const ENDPOINTS: [Endpoint; 5] = [
    Endpoint {
        provider: "exact",
        profile: "reference",
        story: "serves the weights exactly",
        expect: Expect::Faithful,
    },
    Endpoint {
        provider: "a8",
        profile: "a8",
        story: "faithful, different kernels (8-bit activations)",
        expect: Expect::Faithful,
    },
    Endpoint {
        provider: "w4",
        profile: "w4",
        story: "silently serves 4-bit re-quantized weights",
        expect: Expect::Unfaithful,
    },
    Endpoint {
        provider: "toolbug",
        profile: "tool-corrupt",
        story: "corrupts tool-call arguments and names",
        expect: Expect::BrokenTools,
    },
    Endpoint {
        provider: "trunc",
        profile: "truncate-512",
        story: "silently keeps only the last 512 prompt tokens",
        expect: Expect::Truncated,
    },
];

/// The sizes that decide how fast the demo finds each fault, and what it costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Sizes {
    /// Time between probe rounds of one kind on one endpoint, ms (the first round starts
    /// within a tenth of it).
    pub probe_interval_ms: u64,
    /// Time between long-context probe rounds on one endpoint, ms (the costly kind).
    pub long_context_interval_ms: u64,
    /// Texts / prompts per logprob probe round.
    pub probe_items: usize,
    /// The long-context probe's window (tokens): the truncation point (512) is inside it.
    pub context_window: u32,
    /// How often the passive detectors sweep the request records, ms.
    pub sweep_interval_ms: u64,
    /// Requests an endpoint must have in the window before the passive tests judge it.
    pub passive_min_requests: u64,
    /// Items of an eval job opened by an alert.
    pub eval_items: u64,
    /// Items of a job in flight at once.
    pub eval_concurrency: usize,
    /// Eval workers (jobs run at once: the passive finding's job need not wait for the
    /// probe alert's).
    pub eval_workers: u32,
    /// Concurrent clients of the traffic generator.
    pub clients: usize,
}

impl Default for Sizes {
    /// The five-minute run.
    fn default() -> Self {
        Sizes {
            probe_interval_ms: 60_000,
            long_context_interval_ms: 600_000,
            probe_items: 2,
            context_window: 1024,
            sweep_interval_ms: 10_000,
            passive_min_requests: 10,
            eval_items: 24,
            eval_concurrency: 8,
            eval_workers: 2,
            clients: 4,
        }
    }
}

/// Where each engine listens (base URLs without `/v1`), and the rest of the run's setup.
#[derive(Debug, Clone)]
pub struct Setup<'a> {
    /// `(provider, base URL)` per endpoint, in [`ENDPOINTS`] order.
    pub engines: Vec<(&'static str, String)>,
    /// The reference engine's base URL (the evals' baseline).
    pub reference_url: &'a str,
    /// The weights (the probes' in-process reference loads them).
    pub model_path: &'a Path,
    /// The calibration ladder file.
    pub ladder_path: &'a Path,
    /// The data directory (SQLite file, logs).
    pub data_dir: &'a Path,
    /// The gateway's listen address.
    pub listen: std::net::SocketAddr,
}

/// A TOML basic string.
fn q(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The gateway configuration of the demo.
pub fn config_toml(setup: &Setup<'_>, sizes: &Sizes) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# samewise demo configuration, written by `samewise demo` (re-written on every run).\n\
         # Five endpoints of one model behind the gateway, each a reference engine under a\n\
         # serving profile; probes, passive checks, evals and dashboards on.\n"
    );
    let _ = writeln!(
        s,
        "[server]\nlisten = {}\ndata_dir = {}\nalert_poll_ms = 1000\n",
        q(&setup.listen.to_string()),
        q(&setup.data_dir.display().to_string())
    );
    let _ = writeln!(
        s,
        "[limits]\nmax_attempts = 3\nbackoff_base_ms = 25\nbackoff_max_ms = 500\n"
    );
    for (provider, url) in &setup.engines {
        let profile = ENDPOINTS
            .iter()
            .find(|e| e.provider == *provider)
            .map_or("?", |e| e.profile);
        // six engines share this machine's cores with the probes and evals, so an endpoint's
        // first byte can come ten times later than usual for a while: the 30 s floor keeps
        // the adaptive deadline from cutting a healthy endpoint's answers (a run once saw
        // the faithful a8 excluded for three such timeouts in its first eleven requests)
        let _ = writeln!(
            s,
            "# profile {profile}\n[providers.{provider}]\nbase_url = {}\nfirst_byte_timeout_ms = 120000\n\
             first_byte_floor_ms = 30000\nidle_timeout_ms = 120000\nprice_input_per_mtok = 0.0\n\
             price_output_per_mtok = 0.0\nregion = \"local\"\n",
            q(&format!("{url}/v1"))
        );
    }
    let _ = writeln!(
        s,
        "[models.{MODEL}]\npolicy = \"weighted\"\n\
         # an endpoint with an active alert gets no traffic while a clean one is left\n\
         on_drift = \"exclude\"\n"
    );
    for (provider, _) in &setup.engines {
        let _ = writeln!(
            s,
            "[[models.{MODEL}.endpoints]]\nprovider = \"{provider}\"\nmodel = \"{SERVED_AS}\"\nweight = 1\n"
        );
    }
    let _ = writeln!(
        s,
        "[models.{MODEL}.slo]\nttft_ms = 2000\ntpot_ms = 200\n\n\
         [models.{MODEL}.probes]\nkinds = [\"prompt_logprobs\", \"completion_logprobs\", \"long_context\"]\n\
         interval_ms = {}\n# the long-context probe costs ~5,400 prompt tokens per endpoint: once per run\n\
         intervals_ms = {{ long_context = {} }}\njitter = 0.1\nitems_per_round = {}\ntop_k = 5\nmax_tokens = 32\n\
         context_window = {}\ntoken_budget_per_hour = 400000\n",
        sizes.probe_interval_ms,
        sizes.long_context_interval_ms,
        sizes.probe_items,
        sizes.context_window
    );
    let _ = writeln!(
        s,
        "[probes]\nladder = {}\nnoise_pair_every = 10\nsweep_interval_ms = {}\nlock_retry_ms = 2000\n\n\
         [probes.reference]\nbackend = \"in_process\"\nmodel = {}\nthreads = 2\n\n\
         [probes.detectors]\nlevel = \"w6\"\npassive_q = 0.01\npassive_window_ms = 600000\n\
         passive_min_requests = {}\n",
        q(&setup.ladder_path.display().to_string()),
        sizes.sweep_interval_ms,
        q(&setup.model_path.display().to_string()),
        sizes.passive_min_requests
    );
    let _ = writeln!(
        s,
        "[evals]\nworkers = {}\npoll_ms = 1000\nlease_ms = 30000\nreference_url = {}\n\
         reference_model = \"{SERVED_AS}\"\nmax_items = {}\nconcurrency = {}\nlooks = 2\n\n\
         [evals.long_context]\nwindow = {}\ntasks = [\"multi_query\"]\ndistractors = 2\n\n\
         # which alert opens which suite: a tool-call error finding -> tool calls, a\n\
         # long-context finding -> long context. A logprob finding is already quantified by the\n\
         # ladder (\"≈ 4-bit\"); its tool-call eval (the default rule) is inconclusive on this\n\
         # model and would take two minutes of the two cores the demo shares\n\
         [[evals.rules]]\nkind = \"passive\"\nsignal = \"tool\"\nsuites = [\"tool_calls\"]\n\n\
         [[evals.rules]]\nkind = \"unfaithful\"\nsignal = \"effective_context\"\nsuites = [\"long_context\"]\n",
        sizes.eval_workers,
        q(setup.reference_url),
        sizes.eval_items,
        sizes.eval_concurrency,
        sizes.context_window
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_ids_are_provider_slash_served_name() {
        let ids: Vec<String> = ENDPOINTS.iter().map(Endpoint::id).collect();
        assert_eq!(
            ids,
            [
                "exact/smol",
                "a8/smol",
                "w4/smol",
                "toolbug/smol",
                "trunc/smol"
            ]
        );
    }

    #[test]
    fn paths_with_quotes_stay_one_toml_string() {
        assert_eq!(q(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(q("x\ny"), "\"x\\u000ay\"");
    }
}
