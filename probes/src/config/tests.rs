//! Tests of the probes configuration parser: defaults, each backend, and errors that name
//! the key at fault.

use std::collections::BTreeMap;

use super::*;

fn parse(src: &str) -> Result<ProbesConfig> {
    ProbesConfig::from_gateway_toml(src)
}

#[test]
fn in_process_with_defaults() {
    let c = parse(
        r#"
[probes.reference]
backend = "in_process"
model = "/m/smol.gguf"
[models.smol.probes]
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.reference,
        Some(ReferenceConfig::InProcess {
            model: "/m/smol.gguf".into(),
            threads: 2
        })
    );
    let m = &c.models["smol"];
    assert_eq!(
        m.kinds,
        vec![ProbeKind::PromptLogprobs, ProbeKind::CompletionLogprobs]
    );
    assert_eq!(m.interval, Duration::from_secs(300));
    assert_eq!(m.top_k, 5);
    assert_eq!(m.token_budget_per_hour, 100_000);
    assert_eq!(
        (
            m.items_per_round,
            m.samples_prompts_per_round,
            m.samples_per_prompt,
            m.permutations
        ),
        (2, 6, 10, 999)
    );
    assert!(m.force_tool_calls);
    let auto = parse(
        "[probes.reference]\nbackend = \"in_process\"\nmodel = \"m\"\n[models.smol.probes]\nforce_tool_calls = false\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(!auto.models["smol"].force_tool_calls);
    assert_eq!(c.noise_pair_every, 10);
    assert_eq!(c.concurrency, 16);
    assert_eq!(c.request_timeout, Duration::from_secs(300));
    assert!(c.detectors.is_empty());
}

#[test]
fn concurrency_and_request_timeout_are_bounded() {
    let with = |extra: &str| {
        parse(&format!(
            "[probes]\n{extra}\n[probes.reference]\nbackend='in_process'\nmodel='m'\n"
        ))
    };
    let c = with("concurrency = 16\nrequest_timeout_ms = 2500").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (c.concurrency, c.request_timeout),
        (16, Duration::from_millis(2500))
    );
    for (extra, key) in [
        ("concurrency = 0", "probes.concurrency"),
        ("concurrency = 257", "probes.concurrency"),
        ("concurrency = -1", "probes"),
        ("request_timeout_ms = 0", "probes.request_timeout_ms"),
        (
            "request_timeout_ms = 9223372036854775807",
            "probes.request_timeout_ms",
        ),
    ] {
        let e = with(extra).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains(key), "{extra}: {e}");
    }
}

#[test]
fn remote_and_external_backends() {
    let c = parse(
        r#"
[probes]
ladder = "l.json"
[probes.reference]
backend = "remote"
url = "http://127.0.0.1:8081/"
tokenizer = "/m/smol.gguf"
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.reference,
        Some(ReferenceConfig::Remote {
            url: "http://127.0.0.1:8081".into(),
            tokenizer: "/m/smol.gguf".into()
        })
    );
    assert_eq!(c.ladder, Some("l.json".into()));
    let c = parse(
        r#"
[probes.reference]
backend = "external"
url = "http://127.0.0.1:8000"
flavour = "sglang"
model_name = "Qwen/Qwen3-8B"
tokenizer = "/m/tokenizer.json"
[models.q.probes]
kinds = ["samples", "long_context"]
interval_ms = 1000
jitter = 0.0
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        c.reference,
        Some(ReferenceConfig::External {
            flavour: ExternalFlavour::Sglang,
            ..
        })
    ));
    assert_eq!(
        c.models["q"].kinds,
        vec![ProbeKind::Samples, ProbeKind::LongContext]
    );
}

#[test]
fn errors_name_the_key() {
    let cases = [
        (
            "[probes]\nx = 1\n[probes.reference]\nbackend='in_process'\nmodel='m'",
            "probes: unknown field `x`",
        ),
        (
            "[probes.reference]\nbackend='gpu'",
            "probes.reference.backend",
        ),
        (
            "[probes.reference]\nbackend='remote'\ntokenizer='t'",
            "probes.reference.url",
        ),
        (
            "[probes.reference]\nbackend='in_process'",
            "probes.reference.model",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\nurl='http://x'",
            "probes.reference.url",
        ),
        (
            "[probes.reference]\nbackend='external'\nurl='http://x'\nmodel_name='m'\ntokenizer='t'",
            "probes.reference.flavour",
        ),
        (
            "[probes.reference]\nbackend='remote'\nurl='ftp://x'\ntokenizer='t'",
            "probes.reference.url",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\n[models.a.probes]\nkinds=['telepathy']",
            "models.a.probes",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\n[models.a.probes]\njitter=1.5",
            "models.a.probes.jitter",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\n[models.a.probes]\ninterval_ms=0",
            "models.a.probes.interval_ms",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\n[models.a.probes]\nkinds=[]",
            "models.a.probes.kinds",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\n[models.a.probes]\ntop_k=50",
            "models.a.probes.top_k",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\n[models.a.probes]\nsamples_prompts_per_round=0",
            "models.a.probes.samples_prompts_per_round: must be at least 1",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\n[models.a.probes]\nbogus=1",
            "models.a.probes: unknown field `bogus`",
        ),
        (
            "[probes.reference]\nbackend='in_process'\nmodel='m'\n[models.a.probes.prompt_sets]\nother='x'",
            "models.a.probes",
        ),
        ("[models.a.probes]\n", "probes"),
        (
            "[probes]\nsweep_interval_ms = 500\n[models.a.probes]\n",
            "probes.reference: missing (the reference backend the prompt_logprobs probes of models.a score against; without one only \"fingerprint\" probes run)",
        ),
        (
            "[probes]\n[models.a.probes]\nkinds = [\"fingerprint\"]\n[models.b.probes]\nkinds = [\"fingerprint\", \"tool_calls\"]\n",
            "the tool_calls probes of models.b score against",
        ),
    ];
    for (src, want) in cases {
        match parse(src) {
            Ok(c) => panic!("{src:?} parsed: {c:?}"),
            Err(e) => assert!(e.to_string().contains(want), "{src:?}: {e} lacks {want:?}"),
        }
    }
}

/// `[probes]` without a reference: no model is probed but by fingerprint probes; the sweep's
/// settings, the detectors' and the alerts' tables are kept.
#[test]
fn without_a_reference_only_the_sweeps_are_configured() {
    let c = parse(
        "[probes]\nsweep_interval_ms = 500\n[probes.alerts]\nquiet_period_ms = 600000\n\
         [probes.detectors]\npassive_min_requests = 20\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.reference, None);
    assert!(c.models.is_empty());
    assert_eq!(c.sweep_interval, Duration::from_millis(500));
    assert!(c.detectors.contains_key("alerts") && c.detectors.contains_key("passive_min_requests"));
    // an empty [probes] is the passive detectors with every default
    let c = parse("[probes]\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((c.reference, c.models.len()), (None, 0));
    // fingerprint probes compare an endpoint with its own past: they need no reference
    let c = parse("[probes]\n[models.a.probes]\nkinds = [\"fingerprint\"]\nitems_per_round = 4\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.reference, None);
    assert_eq!(c.models["a"].kinds, vec![ProbeKind::Fingerprint]);
    assert_eq!(c.models["a"].items_per_round, 4);
    assert!(!ProbeKind::Fingerprint.needs_reference());
    assert!(
        ProbeKind::ALL
            .iter()
            .filter(|k| k.needs_reference())
            .count()
            == 5
    );
}

#[test]
fn detector_tables_pass_through() {
    let mut probes = toml::Table::new();
    let mut reference = toml::Table::new();
    reference.insert("backend".into(), "in_process".into());
    reference.insert("model".into(), "m".into());
    probes.insert("reference".into(), toml::Value::Table(reference));
    let mut det = toml::Table::new();
    det.insert("level".into(), "q6".into());
    probes.insert("detectors".into(), toml::Value::Table(det));
    let c = ProbesConfig::parse(&probes, &BTreeMap::new()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.detectors.get("level").and_then(|v| v.as_str()),
        Some("q6")
    );
    assert!(c.models.is_empty());
}

#[test]
fn home_relative_paths_expand_and_others_stay() {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let c = parse(
        r#"
[probes]
ladder = "~/ladders/smol.json"
reference_cache_positions = 0
[probes.reference]
backend = "in_process"
model = "~/.cache/samewise/models/smol.gguf"
[models.smol.probes]
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    if let Some(home) = home {
        assert_eq!(
            c.reference,
            Some(ReferenceConfig::InProcess {
                model: home.join(".cache/samewise/models/smol.gguf"),
                threads: 2
            })
        );
        assert_eq!(c.ladder, Some(home.join("ladders/smol.json")));
    }
    assert_eq!(c.reference_cache_positions, 0);
    assert_eq!(expand_home("~user/x".into()), PathBuf::from("~user/x"));
    assert_eq!(expand_home("rel/~/x".into()), PathBuf::from("rel/~/x"));
    assert_eq!(
        parse("[probes.reference]\nbackend = \"in_process\"\nmodel = \"m\"\n")
            .map(|c| c.reference_cache_positions)
            .ok(),
        Some(100_000)
    );
}

#[test]
fn a_kind_may_have_its_own_interval_and_every_duration_is_bounded() {
    let base = "[probes.reference]\nbackend = \"in_process\"\nmodel = \"/m.gguf\"\n[models.smol.probes]\n\
                kinds = [\"prompt_logprobs\", \"long_context\"]\ninterval_ms = 60000\n";
    let c = parse(&format!(
        "{base}intervals_ms = {{ long_context = 600000 }}\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let m = &c.models["smol"];
    assert_eq!(
        m.interval_of(ProbeKind::LongContext),
        Duration::from_secs(600)
    );
    assert_eq!(
        m.interval_of(ProbeKind::PromptLogprobs),
        Duration::from_secs(60)
    );
    for (extra, key) in [
        (
            "intervals_ms = { long_context = 0 }\n",
            "models.smol.probes.intervals_ms.long_context",
        ),
        ("intervals_ms = { nope = 1000 }\n", "models.smol.probes"),
        (
            "intervals_ms = { samples = 9223372036854775807 }\n",
            "models.smol.probes.intervals_ms.samples",
        ),
    ] {
        let e = parse(&format!("{base}{extra}"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(key), "{extra}: {e}");
    }
    // the model's own interval is bounded too: a scheduler adds it to the clock
    let huge = base.replace("interval_ms = 60000", "interval_ms = 9223372036854775807");
    let e = parse(&huge)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("interval_ms") && e.contains("7 days"), "{e}");
}
