//! The reference client and the probe kinds against the real engine on the test model,
//! over real HTTP on 127.0.0.1: the in-process, remote and external (a vLLM-protocol double
//! backed by the engine) backends agree bit for bit; an unmodified engine endpoint probed
//! against the in-process reference scores KL exactly 0; an endpoint whose logprobs are
//! shifted (a third-party double in front of the engine) scores a large statistic; a
//! refusal is a finding; the scheduler stores runs, noise pairs and honours the budget.
//!
//! The test model is `$SAMEWISE_MODEL` if set, else
//! `~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf`; a missing model fails.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use axum::body::Bytes;
use axum::routing::post;
use samewise_engine::chat::{self, ChatTemplate};
use samewise_engine::gguf::GgufFile;
use samewise_engine::server::{self, ServerState};
use samewise_engine::tokenizer::Tokenizer;
use samewise_engine::{Engine, LoadOptions};
use samewise_probes::config::{ExternalFlavour, ProbeKind, ProbesConfig};
use samewise_probes::kinds::{self, ProbeCtx, PromptSets, Target};
use samewise_probes::reference::{External, InProcess, Reference, Remote, SampleRequest};
use samewise_probes::runner::{RoundResult, Scheduler};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, ProbeRunQuery};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

fn model_path() -> Result<PathBuf> {
    let path = match std::env::var_os("SAMEWISE_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
            .join(".cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    ensure!(
        path.is_file(),
        "test model missing at {} (run scripts/fetch-model.sh or set SAMEWISE_MODEL)",
        path.display()
    );
    Ok(path)
}

/// One engine for the whole test binary (loading dequantizes the weights).
fn engine() -> Result<Arc<Engine>> {
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

fn tokenizer_and_template() -> Result<(Tokenizer, Option<ChatTemplate>)> {
    let gguf = GgufFile::open(&model_path()?)?;
    let tok = Tokenizer::from_gguf(&gguf)?;
    let template = match chat::template_from_gguf(&gguf) {
        Some(src) => Some(ChatTemplate::new(
            &src,
            tok.bos_token().unwrap_or_default(),
            tok.eos_token().unwrap_or_default(),
        )?),
        None => None,
    };
    Ok((tok, template))
}

fn in_process() -> Result<InProcess> {
    let (tok, template) = tokenizer_and_template()?;
    Ok(InProcess::from_parts(engine()?, Arc::new(tok), template))
}

/// Serves `router` on 127.0.0.1:0 until the token fires; returns `http://addr`.
async fn serve(
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
async fn engine_server(
    stop: &CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<String> {
    let (tok, template) = tokenizer_and_template()?;
    let state = ServerState::new(engine()?, tok, template, "smol".into());
    serve(server::router(state), stop, tasks).await
}

fn target(base: &str, label: &str) -> Target {
    Target {
        model: "smol".into(),
        endpoint: label.into(),
        base_url: format!("{base}/v1"),
        provider_model: "smol".into(),
        api_key: None,
    }
}

fn probes_config(extra: &str) -> Result<ProbesConfig> {
    let src = format!(
        "[probes]\nnoise_pair_every = 3\nlock_retry_ms = 200\nsweep_interval_ms = 60000\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"unused\"\n[models.smol.probes]\nitems_per_round = 1\nmax_tokens = 24\ntop_k = 5\nsamples_per_prompt = 3\npermutations = 99\n{extra}"
    );
    Ok(ProbesConfig::from_gateway_toml(&src)?)
}

struct Harness {
    cfg: ProbesConfig,
    sets: PromptSets,
    http: reqwest::Client,
}

impl Harness {
    fn new(extra: &str) -> Result<Self> {
        let cfg = probes_config(extra)?;
        let sets = PromptSets::load(&cfg.models["smol"].prompt_sets)?;
        Ok(Self {
            cfg,
            sets,
            http: kinds::endpoint_client(),
        })
    }

    async fn probe(
        &self,
        reference: &dyn Reference,
        kind: ProbeKind,
        t: &Target,
    ) -> kinds::Outcome {
        let ctx = ProbeCtx {
            reference,
            cfg: &self.cfg.models["smol"],
            sets: &self.sets,
            http: &self.http,
            round: 0,
            seed: 7,
        };
        kinds::run(kind, &ctx, t).await
    }
}

/// The positions with the largest KL, for failure messages.
fn worst_positions(o: &kinds::Outcome) -> Result<String> {
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

fn stat(o: &kinds::Outcome, key: &str) -> Result<f64> {
    o.stats
        .get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("stat {key} missing in {}", o.stats))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_remote_and_external_vllm_agree_exactly() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let local = in_process()?;
    let remote = Remote::new(&url, &model_path()?)?;
    let vllm_url = serve(vllm_double(engine()?)?, &stop, &tasks).await?;
    let external = External::new(
        &vllm_url,
        ExternalFlavour::Vllm,
        "smol",
        &model_path()?,
        None,
    )?;

    let text = "The quick brown fox jumps over the lazy dog. Überraschung: 東京 is large.";
    let ids = local.tokenize(text, true).await?;
    ensure!(ids.len() > 10, "tokenized to {ids:?}");
    ensure!(
        remote.tokenize(text, true).await? == ids,
        "remote tokenization differs"
    );
    ensure!(
        external.tokenize(text, true).await? == ids,
        "external tokenization differs"
    );

    let a = local.score(&ids, 5).await?;
    let b = remote.score(&ids, 5).await?;
    let c = external.score(&ids, 5).await?;
    ensure!(a.len() == ids.len() && a[0].logprob.is_none() && a[1].top.len() == 5);
    ensure!(a == b, "in-process and remote scores differ");
    ensure!(a == c, "in-process and external (vLLM) scores differ");

    let messages = vec![json!({"role": "user", "content": "Say hi."})];
    let chat_a = local.render_chat(&messages, None).await?;
    ensure!(
        chat_a == remote.render_chat(&messages, None).await?,
        "chat rendering differs"
    );

    let req = SampleRequest {
        prompt: chat_a,
        n: 1,
        max_tokens: 12,
        temperature: 0.0,
        seed: 1,
    };
    let ga = local.sample(&req).await?;
    let gb = remote.sample(&req).await?;
    ensure!(ga.len() == 1 && !ga[0].text.is_empty(), "{ga:?}");
    ensure!(
        ga[0].text == gb[0].text,
        "greedy samples differ: {:?} vs {:?}",
        ga[0].text,
        gb[0].text
    );
    ensure!(
        ga[0].logprobs == gb[0].logprobs,
        "greedy sample logprobs differ"
    );

    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A third-party double speaking vLLM's protocol (`prompt_logprobs` on token ids,
/// `/tokenize`), computing with the engine.
fn vllm_double(engine: Arc<Engine>) -> Result<axum::Router> {
    let (tok, _) = tokenizer_and_template()?;
    let tok = Arc::new(tok);
    let t2 = tok.clone();
    Ok(axum::Router::new()
        .route(
            "/v1/completions",
            post(move |body: Bytes| {
                let engine = engine.clone();
                let tok = tok.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                    let ids: Vec<u32> = v["prompt"].as_array().map(|a| a.iter().filter_map(|x| x.as_u64().map(|n| n as u32)).collect()).unwrap_or_default();
                    let k = v["prompt_logprobs"].as_u64().unwrap_or(0) as usize;
                    let scored = tokio::task::spawn_blocking(move || engine.score(&[ids], k)).await;
                    let Ok(Ok(mut scored)) = scored else { return axum::Json(json!({"error": {"message": "scoring failed"}})) };
                    let seq = scored.pop().map(|s| s.positions).unwrap_or_default();
                    let lps: Vec<Value> = seq
                        .iter()
                        .map(|p| match p.logprob {
                            None => Value::Null,
                            Some(lp) => {
                                let mut m = serde_json::Map::new();
                                for (r, t) in p.top.iter().enumerate() {
                                    m.insert(t.token.to_string(), json!({"logprob": f64::from(t.logprob), "rank": r + 1,
                                        "decoded_token": tok.token_str(t.token).unwrap_or_default()}));
                                }
                                m.entry(p.token.to_string()).or_insert(json!({"logprob": f64::from(lp), "rank": k + 1, "decoded_token": ""}));
                                Value::Object(m)
                            }
                        })
                        .collect();
                    axum::Json(json!({"id": "cmpl-x", "object": "text_completion", "model": "smol",
                        "choices": [{"index": 0, "text": "", "logprobs": null, "finish_reason": "length", "prompt_logprobs": lps}]}))
                }
            }),
        )
        .route(
            "/tokenize",
            post(move |body: Bytes| {
                let tok = t2.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                    let ids = tok.encode(v["prompt"].as_str().unwrap_or_default(), v["add_special_tokens"].as_bool().unwrap_or(true)).unwrap_or_default();
                    axum::Json(json!({"tokens": ids, "count": ids.len()}))
                }
            }),
        ))
}

/// A third-party double speaking SGLang's `/generate` protocol for scoring
/// (`return_logprob`, `logprob_start_len: 0`, `top_logprobs_num`), computing with the engine.
fn sglang_double(engine: Arc<Engine>) -> axum::Router {
    axum::Router::new().route(
        "/generate",
        post(move |body: Bytes| {
            let engine = engine.clone();
            async move {
                let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                let ids: Vec<u32> = v["input_ids"].as_array().map(|a| a.iter().filter_map(|x| x.as_u64().map(|n| n as u32)).collect()).unwrap_or_default();
                let k = v["top_logprobs_num"].as_u64().unwrap_or(0) as usize;
                let scored = tokio::task::spawn_blocking(move || engine.score(&[ids], k)).await;
                let Ok(Ok(mut scored)) = scored else { return axum::Json(json!({"error": {"message": "scoring failed"}})) };
                let seq = scored.pop().map(|s| s.positions).unwrap_or_default();
                let input: Vec<Value> = seq.iter().map(|p| json!([p.logprob.map(f64::from), p.token, null])).collect();
                let tops: Vec<Value> = seq
                    .iter()
                    .map(|p| match p.logprob {
                        None => Value::Null,
                        Some(_) => Value::Array(p.top.iter().map(|t| json!([f64::from(t.logprob), t.token, null])).collect()),
                    })
                    .collect();
                axum::Json(json!({"text": "", "meta_info": {"input_token_logprobs": input, "input_top_logprobs": tops,
                                                           "prompt_tokens": seq.len(), "completion_tokens": 0}}))
            }
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_sglang_scores_agree_with_in_process() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = serve(sglang_double(engine()?), &stop, &tasks).await?;
    let sglang = External::new(&url, ExternalFlavour::Sglang, "smol", &model_path()?, None)?;
    let local = in_process()?;
    let ids = local
        .tokenize("Photosynthesis turns light into chemical energy.", true)
        .await?;
    ensure!(
        sglang
            .tokenize("Photosynthesis turns light into chemical energy.", true)
            .await?
            == ids
    );
    ensure!(
        sglang.score(&ids, 4).await? == local.score(&ids, 4).await?,
        "SGLang scores differ"
    );
    // SGLang has no chat-tokenize route: a clear error, not a wrong answer
    let e = sglang
        .render_chat(&[json!({"role": "user", "content": "hi"})], None)
        .await;
    ensure!(
        e.as_ref().is_err_and(|e| e.to_string().contains("SGLang")),
        "{e:?}"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_context_reports_the_longest_passing_length() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let reference = in_process()?;
    let h = Harness::new("context_window = 1024")?;
    let o = h
        .probe(
            &reference,
            ProbeKind::LongContext,
            &target(&url, "engine/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    let lengths = o.stats["lengths"].as_array().context("lengths")?;
    ensure!(!lengths.is_empty() && o.tokens > 0, "{}", o.stats);
    let effective = stat(&o, "effective_context")?;
    let passed: Vec<f64> = lengths
        .iter()
        .filter(|l| l["passed"] == json!(true))
        .filter_map(|l| l["length"].as_f64())
        .collect();
    // lengths are tried in doubling order and the ladder stops at the first failure
    ensure!(
        effective == passed.last().copied().unwrap_or(0.0),
        "{}",
        o.stats
    );
    ensure!(
        passed.len() == lengths.len() || passed.len() + 1 == lengths.len(),
        "{}",
        o.stats
    );
    ensure!(
        passed.len() == lengths.len() || !o.stats["failed_at"].is_null(),
        "{}",
        o.stats
    );
    ensure!(stat(&o, "window")? <= 1024.0, "{}", o.stats);
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A double in front of the engine that scales every logprob it returns by `factor` (a
/// provider whose distribution is sharper than the weights'), or refuses logprobs (400).
fn shifting_double(upstream: String, factor: f64, refuse: bool) -> axum::Router {
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
                let resp = reqwest::Client::new()
                    .post(format!("{upstream}{path}"))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let Ok(resp) = resp else {
                    return (axum::http::StatusCode::BAD_GATEWAY, axum::Json(json!({})));
                };
                let bytes = resp.bytes().await.unwrap_or_default();
                let mut v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
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

/// Scales every number under a `logprob`-ish key.
fn scale(v: &mut Value, factor: f64) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_of_the_unmodified_engine_are_exact_and_shifted_logprobs_are_caught() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let shifted = serve(shifting_double(url.clone(), 1.3, false), &stop, &tasks).await?;
    let refusing = serve(shifting_double(url.clone(), 1.0, true), &stop, &tasks).await?;
    let reference = in_process()?;
    let h = Harness::new("")?;
    let same = target(&url, "engine/smol");

    let o = h.probe(&reference, ProbeKind::PromptLogprobs, &same).await;
    ensure!(o.ok, "{:?}", o.error);
    // bit-exact at the input level: at every position the endpoint reports exactly the
    // reference's logprob and top-k (its list also holds the actual token, OpenAI style)
    let raw = o.raw.as_deref().context("raw per-position data")?;
    for p in samewise_probes::compare::decode_positions(raw)? {
        ensure!(
            p.endpoint.actual_logprob == p.reference.actual_logprob,
            "{p:?}"
        );
        ensure!(
            p.endpoint.top.get(..p.reference.top.len()) == Some(&p.reference.top[..]),
            "{p:?}"
        );
    }
    // identical inputs give exactly zero KL (compare clamps both sides alike, in log space)
    let worst = worst_positions(&o)?;
    ensure!(
        stat(&o, "kl_p99")? == 0.0 && stat(&o, "kl_mean")? == 0.0,
        "unmodified KL not 0: {} worst: {worst}",
        o.stats
    );
    ensure!(
        stat(&o, "top1_same")? == 1.0
            && stat(&o, "topk_overlap")? == 1.0
            && stat(&o, "dlogprob_mean")? == 0.0,
        "{}",
        o.stats
    );
    ensure!(
        stat(&o, "positions")? > 100.0 && stat(&o, "mismatch_rate")? == 0.0 && o.tokens > 100,
        "{} tokens {}",
        o.stats,
        o.tokens
    );
    ensure!(
        samewise_probes::compare::decode_positions(raw)?.len() as f64 == stat(&o, "positions")?
    );

    let o = h
        .probe(&reference, ProbeKind::CompletionLogprobs, &same)
        .await;
    ensure!(o.ok, "{:?}", o.error);
    ensure!(
        stat(&o, "kl_p99")? == 0.0
            && stat(&o, "dlogprob_mean")? == 0.0
            && stat(&o, "top1_same")? == 1.0
            && stat(&o, "topk_overlap")? == 1.0,
        "completion logprobs not exact: {}",
        o.stats
    );
    ensure!(stat(&o, "positions")? >= 1.0 && o.tokens > 0);

    let o = h.probe(&reference, ProbeKind::ToolCalls, &same).await;
    ensure!(o.ok, "{:?}", o.error);
    ensure!(
        stat(&o, "trigger_f1")? == 1.0,
        "same weights, same greedy answers: {}",
        o.stats
    );

    let o = h.probe(&reference, ProbeKind::Samples, &same).await;
    ensure!(o.ok, "{:?}", o.error);
    let p = stat(&o, "p_value")?;
    ensure!(
        (0.0..=1.0).contains(&p) && stat(&o, "loglik_p_value").is_ok(),
        "{}",
        o.stats
    );

    let o = h
        .probe(
            &reference,
            ProbeKind::PromptLogprobs,
            &target(&shifted, "shifted/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    ensure!(
        stat(&o, "kl_mean")? > 0.01 && stat(&o, "dlogprob_mean")? > 0.1,
        "shifted logprobs not caught: {}",
        o.stats
    );

    let o = h
        .probe(
            &reference,
            ProbeKind::PromptLogprobs,
            &target(&refusing, "refusing/smol"),
        )
        .await;
    ensure!(
        !o.ok && o.error.as_deref().is_some_and(|e| e.contains("logprobs")),
        "refusal must be a finding: {o:?}"
    );
    let o = h
        .probe(
            &reference,
            ProbeKind::CompletionLogprobs,
            &target(&refusing, "refusing/smol"),
        )
        .await;
    ensure!(
        !o.ok && o.error.as_deref().is_some_and(|e| e.contains("logprobs")),
        "refusal must be a finding: {o:?}"
    );

    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_stores_runs_with_noise_pairs_and_respects_the_budget() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let cfg = Arc::new(probes_config(
        "kinds = [\"prompt_logprobs\"]\ntoken_budget_per_hour = 400\n",
    )?);
    let reference: Arc<dyn Reference> = Arc::new(in_process()?);
    let s = Scheduler::new(
        cfg,
        db.store.clone(),
        reference,
        None,
        vec![target(&url, "engine/smol")],
    )?;

    // round 0 is a noise-floor pair
    let RoundResult::Stored(runs) = s
        .run_round(&s.targets()[0], ProbeKind::PromptLogprobs, 0)
        .await?
    else {
        anyhow::bail!("first round over budget")
    };
    ensure!(runs.len() == 2, "noise pair expected, got {}", runs.len());
    ensure!(runs[1].repeat_of == Some(runs[0].id) && runs[0].repeat_of.is_none());
    let stored = db
        .store
        .probe_runs(&ProbeRunQuery {
            model: Some("smol".into()),
            endpoint: None,
            kind: None,
            since_ms: None,
            limit: 10,
        })
        .await?;
    ensure!(stored.len() == 2, "{stored:?}");
    for r in &stored {
        ensure!(
            r.ok && r.kind == "prompt_logprobs" && r.endpoint == "engine/smol" && r.tokens > 0,
            "{r:?}"
        );
        ensure!(
            r.finished_ms >= r.started_ms && r.raw.is_some() && r.stats.get("kl_mean").is_some(),
            "{r:?}"
        );
    }
    // the two runs spent more than the 400-token budget: the next round is skipped
    let spent: i64 = stored.iter().map(|r| r.tokens).sum();
    ensure!(spent >= 400, "spent {spent}");
    match s
        .run_round(&s.targets()[0], ProbeKind::PromptLogprobs, 1)
        .await?
    {
        RoundResult::OverBudget { spent: reported } => ensure!(reported == spent),
        RoundResult::Stored(r) => anyhow::bail!("ran over budget: {r:?}"),
    }
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// The backend pid holding an advisory lock in this test's (private) database.
async fn advisory_lock_pid(url: &str) -> Result<Option<i32>> {
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(url).await?;
    let pid: Option<i32> = sqlx::query_scalar(
        "SELECT l.pid FROM pg_locks l JOIN pg_database d ON l.database = d.oid \
         WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()",
    )
    .fetch_optional(&mut c)
    .await?;
    Ok(pid)
}

/// On PostgreSQL the scheduler stands by while another session holds the lock, takes over
/// once it is released, survives the loss of its own lock session, and drains on shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_scheduler_takes_over_when_the_lock_is_freed() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let db = TestDb::new(Backend::Postgres).await?;
    let cfg = Arc::new(probes_config(
        "kinds = [\"prompt_logprobs\"]\ninterval_ms = 300\njitter = 0.0\n",
    )?);
    let reference: Arc<dyn Reference> = Arc::new(in_process()?);
    let s = Arc::new(Scheduler::new(
        cfg,
        db.store.clone(),
        reference,
        None,
        vec![target(&url, "engine/smol")],
    )?);
    let holder = db
        .store
        .try_scheduler_lock()
        .await?
        .context("lock free at start")?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(Arc::clone(&s).run(shutdown.clone()));
    let q = ProbeRunQuery {
        model: None,
        endpoint: None,
        kind: None,
        since_ms: None,
        limit: 100,
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    ensure!(
        db.store.probe_runs(&q).await?.is_empty(),
        "a standby scheduler probed"
    );
    holder.release().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let n = db.store.probe_runs(&q).await?.len();
        if n >= 3 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "scheduler did not take over ({n} runs)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the lock's session dies (as when a holder crashes or its connection drops): the
    // scheduler notices, stands down, takes the free lock again on a new session, and goes on
    let lock_pid = advisory_lock_pid(db.url())
        .await?
        .context("no session holds the lock")?;
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(db.url()).await?;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(lock_pid)
        .execute(&mut admin)
        .await?;
    let before = db.store.probe_runs(&q).await?.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let holder = advisory_lock_pid(db.url()).await?;
        let n = db.store.probe_runs(&q).await?.len();
        if holder.is_some_and(|p| p != lock_pid) && n >= before + 2 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no takeover after the lock's session died (holder {holder:?}, {n} runs)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .context("scheduler did not drain")??;
    // after shutdown the lock is free again
    ensure!(
        db.store.try_scheduler_lock().await?.is_some(),
        "lock not released on shutdown"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A provider that changes what it serves mid-run: the first `after` completions requests
/// pass through to the engine unchanged, later ones get logprobs scaled by 1.3.
fn switching_double(upstream: String, after: usize) -> axum::Router {
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    axum::Router::new().route(
        "/v1/completions",
        post(move |body: Bytes| {
            let upstream = upstream.clone();
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let resp = reqwest::Client::new()
                    .post(format!("{upstream}/v1/completions"))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let Ok(resp) = resp else {
                    return axum::Json(json!({}));
                };
                let bytes = resp.bytes().await.unwrap_or_default();
                let mut v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
                if n >= after {
                    scale(&mut v, 1.3);
                }
                axum::Json(v)
            }
        }),
    )
}

/// An endpoint switched mid-run raises a "changed" alert through the scheduler's rounds and
/// the detectors it calls after each stored run; before the switch, nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mid_run_switch_raises_a_changed_alert() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    // rounds 0 and 3 are noise pairs (noise_pair_every = 3): rounds 0..=4 make 7 requests,
    // all answered exactly; from round 5 on the provider has switched
    let switching = serve(switching_double(url.clone(), 7), &stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let cfg = Arc::new(probes_config("kinds = [\"prompt_logprobs\"]\n")?);
    let det: toml::Table =
        "cusum_baseline_rounds = 3\nhistory_runs = 30\nkl_threshold = 100.0\n".parse()?;
    let detectors = samewise_probes::detect::Detectors::new(
        samewise_probes::detect::DetectorConfig::parse(&det)?,
        None,
        &samewise_probes::alerting::AlertsConfig::default(),
    )?;
    let detectors = Arc::new(detectors);
    let reference: Arc<dyn Reference> = Arc::new(in_process()?);
    let s = Scheduler::new(
        cfg,
        db.store.clone(),
        reference,
        Some(detectors.clone()),
        vec![target(&switching, "switching/smol")],
    )?;
    let q = samewise_store::AlertQuery {
        state: None,
        model: None,
        endpoint: None,
        limit: 10,
    };
    for round in 0..5 {
        s.run_round(&s.targets()[0], ProbeKind::PromptLogprobs, round)
            .await?;
    }
    ensure!(
        db.store.alerts(&q).await?.is_empty(),
        "alert before the switch: {:?}",
        db.store.alerts(&q).await?
    );
    let mut raised = false;
    for round in 5..8 {
        s.run_round(&s.targets()[0], ProbeKind::PromptLogprobs, round)
            .await?;
        if db
            .store
            .alerts(&q)
            .await?
            .iter()
            .any(|a| a.kind == "changed" && a.endpoint == "switching/smol")
        {
            raised = true;
            break;
        }
    }
    ensure!(
        raised,
        "no changed alert within 3 rounds of the switch: {:?}",
        db.store.alerts(&q).await?
    );
    detectors.shutdown().await;
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}
