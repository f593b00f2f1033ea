//! Helpers shared by the probe tests that run the real engine on the test model: the model,
//! one engine per test binary, the in-process reference, engine servers on 127.0.0.1:0,
//! probe targets and configs, schedulers and detectors, and reading a probe outcome's
//! statistics.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::routing::post;
use samewise_engine::Tokenizer;
use samewise_engine::chat::{self, ChatTemplate};
use samewise_engine::server::{self, ServerState};
use samewise_engine::{Engine, LoadOptions, Profile};
use samewise_probes::detect::{DetectorConfig, Detectors};
use samewise_probes::kinds::{self, ProbeCtx, PromptSets, Target};
use samewise_probes::reference::{Cached, InProcess, Reference};
use samewise_probes::runner::Scheduler;
use samewise_probes::{AlertsConfig, ProbeKind, ProbesConfig};
use samewise_store::testing::TestDb;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub fn model_path() -> Result<PathBuf> {
    Ok(samewise_testkit::fixtures::test_model()?)
}

/// One engine for the whole test binary (loading dequantizes the weights).
pub fn engine() -> Result<Arc<Engine>> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    if let Some(e) = ENGINE.get() {
        return Ok(e.clone());
    }
    let e = Arc::new(Engine::load(
        &model_path()?,
        LoadOptions {
            threads: 2,
            ..LoadOptions::default()
        },
    )?);
    Ok(ENGINE.get_or_init(|| e).clone())
}

pub fn tokenizer_and_template() -> Result<(Tokenizer, Option<ChatTemplate>)> {
    Ok(chat::load_tokenizer_and_template(&model_path()?)?)
}

pub fn in_process() -> Result<InProcess> {
    let (tok, template) = tokenizer_and_template()?;
    Ok(InProcess::from_parts(engine()?, Arc::new(tok), template))
}

/// The in-process reference behind the memo the probe scheduler puts in front of it (of the
/// configured default size): for tests that probe several endpoints with the same texts, each
/// text is scored by the reference once.
pub fn cached_reference() -> Result<Cached> {
    let positions = probes_config("")?.reference_cache_positions;
    Ok(Cached::new(Arc::new(in_process()?), positions))
}

/// Serves `router` on 127.0.0.1:0 until the token fires; returns `http://addr`.
pub async fn serve(
    router: axum::Router,
    stop: &CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stop = stop.clone();
    tasks.spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok(format!("http://{addr}"))
}

/// The real engine server (the unmodified endpoint).
pub async fn engine_server(
    stop: &CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<String> {
    profiled_server(engine()?, Profile::default(), stop, tasks).await
}

/// The real engine server over `engine` with `profile`'s behavioural faults (the numeric ones
/// are those `engine` was loaded with), until the token fires; returns `http://addr`.
pub async fn profiled_server(
    engine: Arc<Engine>,
    profile: Profile,
    stop: &CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<String> {
    let (tok, template) = tokenizer_and_template()?;
    let state = ServerState::with_profile(engine, tok, template, "smol".into(), profile)?;
    serve(server::router(state), stop, tasks).await
}

pub fn target(base: &str, label: &str) -> Target {
    Target {
        model: "smol".into(),
        endpoint: label.into(),
        base_url: format!("{base}/v1"),
        provider_model: "smol".into(),
        api_key: None,
    }
}

/// The probes config of these tests, one text or case a round and 24 tokens a generation
/// unless `extra` says otherwise.
pub fn probes_config(extra: &str) -> Result<ProbesConfig> {
    let default = |key: &str, line: &'static str| if extra.contains(key) { "" } else { line };
    let items = default("items_per_round", "items_per_round = 1\n");
    let max_tokens = default("max_tokens", "max_tokens = 24\n");
    let src = format!(
        "[probes]\nnoise_pair_every = 3\nlock_retry_ms = 200\nsweep_interval_ms = 60000\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"unused\"\n[models.smol.probes]\n{items}{max_tokens}top_k = 5\nsamples_per_prompt = 3\nsamples_prompts_per_round = 1\npermutations = 99\n{extra}"
    );
    Ok(ProbesConfig::from_gateway_toml(&src)?)
}

/// The in-process reference, as a scheduler takes it.
pub fn reference() -> Result<Arc<dyn Reference>> {
    Ok(Arc::new(in_process()?))
}

/// Detectors from `[probes.detectors]` keys (`""`: the defaults), with no ladder and the
/// default alerts.
pub fn detectors(keys: &str) -> Result<Arc<Detectors>> {
    let table: toml::Table = keys.parse()?;
    Ok(Arc::new(Detectors::new(
        DetectorConfig::parse(&table)?,
        None,
        &AlertsConfig::default(),
    )?))
}

/// A scheduler over `targets` storing in `db`, as `samewise serve` makes one.
pub fn scheduler(
    cfg: ProbesConfig,
    db: &TestDb,
    reference: Option<Arc<dyn Reference>>,
    detectors: Option<Arc<Detectors>>,
    targets: Vec<Target>,
) -> Result<Scheduler> {
    Ok(Scheduler::new(
        Arc::new(cfg),
        db.store.clone(),
        reference,
        detectors,
        targets,
    )?)
}

pub struct Harness {
    pub cfg: ProbesConfig,
    pub sets: PromptSets,
    pub http: reqwest::Client,
}

impl Harness {
    pub fn new(extra: &str) -> Result<Self> {
        let cfg = probes_config(extra)?;
        let sets = PromptSets::load(&cfg.models["smol"].prompt_sets)?;
        Ok(Self {
            http: kinds::endpoint_client(cfg.request_timeout),
            cfg,
            sets,
        })
    }

    pub async fn probe(
        &self,
        reference: &dyn Reference,
        kind: ProbeKind,
        t: &Target,
    ) -> kinds::Outcome {
        self.probe_round(Some(reference), kind, t, 0).await
    }

    /// Round `round` of `kind` on `t`, with or without a reference.
    pub async fn probe_round(
        &self,
        reference: Option<&dyn Reference>,
        kind: ProbeKind,
        t: &Target,
        round: u64,
    ) -> kinds::Outcome {
        self.probe_round_remembering(reference, None, kind, t, round)
            .await
    }

    /// [`Self::probe_round`] with a memory of endpoints that refused echo, as the scheduler
    /// keeps one.
    pub async fn probe_round_remembering(
        &self,
        reference: Option<&dyn Reference>,
        echo_refusals: Option<&kinds::EchoRefusals>,
        kind: ProbeKind,
        t: &Target,
        round: u64,
    ) -> kinds::Outcome {
        let ctx = ProbeCtx {
            reference,
            cfg: &self.cfg.models["smol"],
            sets: &self.sets,
            http: &self.http,
            round,
            seed: 7,
            echo_refusals,
        };
        kinds::run(kind, &ctx, t).await
    }
}

/// The positions with the largest KL, for failure messages.
pub fn worst_positions(o: &kinds::Outcome) -> Result<String> {
    let raw = o.raw.as_deref().context("raw")?;
    let pos = samewise_probes::compare::decode_positions(raw)?;
    let mut scored: Vec<(f64, String)> = pos
        .iter()
        .map(|p| {
            let kl = samewise_probes::compare::compare_position(p)
                .map(|m| m.kl)
                .unwrap_or(f64::NAN);
            (kl, format!("{p:?}"))
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    Ok(scored
        .iter()
        .take(2)
        .map(|(k, p)| format!("kl={k:e} {p}"))
        .collect::<Vec<_>>()
        .join("\n"))
}

pub fn stat(o: &kinds::Outcome, key: &str) -> Result<f64> {
    o.stats
        .get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("stat {key} missing in {}", o.stats))
}

pub fn scale(v: &mut Value, factor: f64) {
    match v {
        Value::Object(m) => {
            let in_top_map = m.values().all(Value::is_number)
                && !m.is_empty()
                && !m.contains_key("prompt_tokens");
            for (k, x) in m.iter_mut() {
                if k == "text_offset" || k == "bytes" || k == "usage" {
                    continue;
                }
                if let Some(n) = x.as_f64()
                    && (k == "logprob" || in_top_map)
                {
                    *x = json!(n * factor);
                } else {
                    scale(x, factor);
                }
            }
        }
        Value::Array(a) => {
            let numeric = a.iter().all(|x| x.is_number() || x.is_null());
            for x in a {
                match x.as_f64() {
                    Some(n) if numeric => *x = json!(n * factor),
                    _ => scale(x, factor),
                }
            }
        }
        _ => {}
    }
}

/// A double in front of the engine that scales every logprob it returns by `factor` (a
/// provider whose distribution is sharper than the weights'), or refuses logprobs (400).
pub fn shifting_double(upstream: String, factor: f64, refuse: bool) -> axum::Router {
    let handler = move |path: &'static str| {
        let upstream = upstream.clone();
        move |body: Bytes| {
            let upstream = upstream.clone();
            async move {
                if refuse {
                    return (
                        axum::http::StatusCode::BAD_REQUEST,
                        axum::Json(
                            json!({"error": {"message": "logprobs are not supported by this provider", "type": "invalid_request_error", "param": "logprobs", "code": null}}),
                        ),
                    );
                }
                let Some(mut v) = forward(&upstream, path, body).await else {
                    return (axum::http::StatusCode::BAD_GATEWAY, axum::Json(json!({})));
                };
                scale(&mut v, factor);
                (axum::http::StatusCode::OK, axum::Json(v))
            }
        }
    };
    axum::Router::new()
        .route("/v1/completions", post(handler("/v1/completions")))
        .route(
            "/v1/chat/completions",
            post(handler("/v1/chat/completions")),
        )
}

/// A double's pass-through: `body` POSTed to `upstream`'s `path`, the answer read as JSON (null
/// when it is not); None when the upstream cannot be reached.
pub async fn forward(upstream: &str, path: &str, body: Bytes) -> Option<Value> {
    let resp = reqwest::Client::new()
        .post(format!("{upstream}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .ok()?;
    let bytes = resp.bytes().await.unwrap_or_default();
    Some(serde_json::from_slice(&bytes).unwrap_or_default())
}
