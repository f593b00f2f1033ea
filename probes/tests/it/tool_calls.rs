//! The tool_calls probe's faithful? finding: each case's pass/fail on both sides (a call exactly
//! where the case expects one, every call valid) paired over the endpoint's recent runs. Cases
//! that expect a call are forced (`tool_choice: "required"`) on both sides, so the reference's
//! calls are constrained to the tools' schemas and a provider's broken calls stand out even on a
//! model that never calls a tool unprompted. Against real engine servers through the scheduler:
//! the `tool-corrupt` engine, a provider that calls a tool on every chat and one that never
//! does (third-party doubles speaking OpenAI's protocol) are flagged "unfaithful" naming the
//! cases they lost and how they failed them, with no live traffic; the unmodified engine never is. Every reference backend forces the same
//! calls. Over stored runs: a case seen in many rounds counts once, and an operator's
//! resolution starts the pool over. In the config: an alpha the cases cannot reach, and a
//! repeated case id, are errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, ensure};
use axum::body::Bytes;
use axum::routing::post;
use samewise_engine::Profile;
use samewise_probes::detect::Detectors;
use samewise_probes::reference::{Cached, External, Reference, Remote, ToolCallRequest};
use samewise_probes::{ExternalFlavour, ProbeKind, ToolExpectation};
use samewise_store::testing::TestDb;
use samewise_store::{Backend, ProbeRun, Store};
use samewise_toolcheck::{CallVerdict, ToolCall, ToolSet};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::detectors::store_run;
use crate::scheduler::stored;

/// A provider that answers every chat completion with a call of the first tool offered, with
/// no arguments (every shipped tool has a required parameter, so the call is never valid), or,
/// `calls` false, one that answers every chat in text whatever `tool_choice` says.
fn double(calls: bool) -> axum::Router {
    axum::Router::new().route(
        "/v1/chat/completions",
        post(move |axum::Json(body): axum::Json<Value>| async move {
            let name = body["tools"][0]["function"]["name"].clone();
            let (finish, message) = if calls {
                let call = json!({"id": "call_0", "type": "function",
                                  "function": {"name": name, "arguments": "{}"}});
                (
                    "tool_calls",
                    json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                )
            } else {
                (
                    "stop",
                    json!({"role": "assistant", "content": "I can help with that."}),
                )
            };
            axum::Json(json!({
                "id": "chatcmpl-double", "object": "chat.completion", "created": 0, "model": "smol",
                "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 8, "total_tokens": 48}
            }))
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_failing_cases_the_reference_passes_are_flagged() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let same = engine_server(&stop, &tasks).await?;
    let corrupt_profile = Profile::builtin("tool-corrupt").context("tool-corrupt")?;
    let corrupt = profiled_server(engine()?, corrupt_profile, &stop, &tasks).await?;
    let calls = serve(double(true), &stop, &tasks).await?;
    let text = serve(double(false), &stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    // every shipped case (20) in two rounds: the 10 that expect a call (forced), then the 10
    // that do not; 64 tokens a generation, the probes' default
    let s = scheduler(
        probes_config("kinds = [\"tool_calls\"]\nitems_per_round = 10\nmax_tokens = 64\n")?,
        &db,
        Some(reference()?),
        Some(detectors("")?),
        vec![
            target(&same, "same/smol"),
            target(&corrupt, "corrupt/smol"),
            target(&calls, "calls/smol"),
            target(&text, "text/smol"),
        ],
    )?;
    let passes = |r: &ProbeRun| -> Result<Vec<[bool; 2]>> {
        Ok(serde_json::from_value(r.stats["passes"].clone())?)
    };
    let alert = async |endpoint: &str| {
        db.store
            .active_alert("smol", endpoint, "unfaithful")
            .await
            .map_err(anyhow::Error::from)
    };
    let mut runs: Vec<Vec<ProbeRun>> = Vec::new();
    let mut first_alerts = Vec::new();
    for round in 0..2 {
        let mut this = Vec::new();
        for i in 0..4 {
            let mut r = stored(&s, i, ProbeKind::ToolCalls, round).await?;
            ensure!(r.len() == 1 && r[0].ok, "{r:?}");
            this.push(r.remove(0));
        }
        runs.push(this);
        if round == 0 {
            for endpoint in ["corrupt/smol", "calls/smol", "text/smol"] {
                let a = alert(endpoint).await?;
                first_alerts.push(a.with_context(|| format!("{endpoint}: not flagged"))?);
            }
        }
    }
    // the unmodified engine answers as the reference does, case by case, forced or not
    for r in [&runs[0][0], &runs[1][0]] {
        let faults: Vec<[Option<String>; 2]> = serde_json::from_value(r.stats["faults"].clone())?;
        ensure!(
            passes(r)?.iter().all(|[a, b]| a == b)
                && passes(r)?.len() == 10
                && faults.iter().all(|[a, b]| a == b),
            "{}",
            r.stats
        );
    }
    ensure!(alert("same/smol").await?.is_none());
    // forced, the reference's calls are constrained to the schemas: every call it completes
    // within 64 tokens is valid. It passes 8 of the 10 call cases; on the calendar cases the
    // 135M model writes the title on and on (`"Wedding Wedding ..."`) until the limit cuts
    // the call (read, as the engine's server reads it, as a call with partial arguments: 8 of
    // its 10 calls valid), and the unmodified engine's calls are cut alike (above)
    let call_round = &runs[0][0].stats;
    let reference_passed: Vec<&str> = passes(&runs[0][0])?
        .iter()
        .zip(call_round["cases"].as_array().context("cases")?)
        .filter(|(p, _)| p[0])
        .filter_map(|(_, id)| id.as_str())
        .collect();
    let k = reference_passed.len();
    ensure!(
        k == 8
            && !reference_passed.contains(&"calendar-dentist")
            && call_round["forced_calls"] == true
            && call_round["reference_calls"] == 10
            && call_round["reference_schema_accuracy"] == 0.8
            && call_round["trigger_f1"] == 1.0,
        "{call_round}"
    );
    // tool-corrupt breaks every call: the 8 call cases the reference passes are lost, none
    // won, flagged after its first round (p = 2 · 0.5^8 = 0.0078); the 10 no-call cases it
    // answers as the reference does (the model calls no tool unprompted: nothing to corrupt)
    ensure!(
        passes(&runs[0][1])?.iter().all(|[_, b]| !*b),
        "{}",
        runs[0][1].stats
    );
    ensure!(
        passes(&runs[1][1])?.iter().all(|[a, b]| *a && *b),
        "{}",
        runs[1][1].stats
    );
    let mut sorted = reference_passed.clone();
    sorted.sort_unstable();
    let a = &first_alerts[0];
    let e = &a.evidence;
    ensure!(
        e["statistic"] == "tool_calls_passes"
            && e["lost"] == json!(sorted)
            && e["won"] == json!([])
            && e["p_value"]
                .as_f64()
                .is_some_and(|p| (p - 2.0 * 0.5f64.powi(8)).abs() < 1e-12)
            && e["probe_runs"] == json!([runs[0][1].id])
            && e["schema_accuracy"] == 0.0,
        "{e:#}"
    );
    // and says how: each lost case by the endpoint's fault, tool-corrupt's three ways of
    // breaking a call (a removed required argument is a schema mismatch)
    let faults = e["lost_faults"].as_object().context("lost_faults")?;
    ensure!(
        faults.values().filter_map(Value::as_u64).sum::<u64>() == 8
            && faults.keys().all(|k| {
                ["invalid_json", "unknown_name", "schema_mismatch"].contains(&k.as_str())
            })
            && faults.len() >= 2,
        "{e:#}"
    );
    ensure!(
        a.summary.starts_with(
            "endpoint corrupt/smol: tool calls fail where the reference's pass — 8 of 10 cases lost, 0 won"
        ),
        "{}",
        a.summary
    );
    // its no-call round adds 10 cases both pass: the alert stays, its evidence over both runs
    let now = alert("corrupt/smol").await?.context("resolved")?;
    ensure!(
        now.id == a.id
            && now.evidence["cases"] == 20
            && now.evidence["probe_runs"] == json!([runs[0][1].id, runs[1][1].id]),
        "{}",
        now.evidence
    );
    // the double fails every case, forced or not: flagged on its call round too, and its
    // no-call round is the reference's and not the double's
    ensure!(
        passes(&runs[0][2])?.iter().all(|[_, b]| !*b)
            && passes(&runs[1][2])?.iter().all(|[a, b]| *a && !*b),
        "{} {}",
        runs[0][2].stats,
        runs[1][2].stats
    );
    let e = &first_alerts[1].evidence;
    ensure!(
        e["lost"] == json!(sorted)
            && e["probe_runs"] == json!([runs[0][2].id])
            && e["lost_faults"] == json!({"schema_mismatch": 8}),
        "{e}"
    );
    let a = alert("calls/smol").await?.context("resolved")?;
    ensure!(
        a.evidence["lost"].as_array().map(Vec::len) == Some(18)
            && a.evidence["lost_faults"] == json!({"schema_mismatch": 8, "unexpected_call": 10})
            && a.summary
                .ends_with("the endpoint's faults: unexpected_call 10, schema_mismatch 8"),
        "{}: {}",
        a.summary,
        a.evidence
    );
    // a provider that ignores tool_choice and answers in text: the call cases lost as no_call
    // (tool_choice ignored, not calls broken), the no-call cases passed
    ensure!(
        passes(&runs[1][3])?.iter().all(|[a, b]| *a && *b),
        "{}",
        runs[1][3].stats
    );
    let e = &first_alerts[2].evidence;
    ensure!(
        e["lost"] == json!(sorted) && e["lost_faults"] == json!({"no_call": 8}),
        "{e}"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A third-party double speaking vLLM's protocol, whose guided decoding and tool parser are
/// the engine server's at `engine`: its chat completions refuse a request without the served
/// model's name, take `tool_choice: "required"` for one call and, with `auto`, `"auto"` (as
/// vLLM started with `--enable-auto-tool-choice`; without, a 400 in vLLM's words), counting
/// those in `asked_auto`; `/tokenize` and `/v1/completions` pass through.
fn vllm_chat(engine: String, auto: bool, asked_auto: Arc<AtomicUsize>) -> axum::Router {
    let chat_engine = engine.clone();
    let pass = move |path: &'static str| {
        let engine = engine.clone();
        post(move |body: Bytes| {
            let engine = engine.clone();
            async move { axum::Json(forward(&engine, path, body).await.unwrap_or_default()) }
        })
    };
    axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(move |axum::Json(body): axum::Json<Value>| {
                let url = format!("{chat_engine}/v1/chat/completions");
                let asked_auto = asked_auto.clone();
                async move {
                    let refuse = |m: &str| {
                        (
                            axum::http::StatusCode::BAD_REQUEST,
                            axum::Json(json!({"error": {"message": m, "type": "BadRequestError"}})),
                        )
                    };
                    let forced = body["tool_choice"] == "required" && body["parallel_tool_calls"] == false;
                    if body["model"] != "smol" || !(forced || body["tool_choice"] == "auto") {
                        return refuse("expected model smol, and tool_choice required (one call) or auto");
                    }
                    if body["tool_choice"] == "auto" {
                        asked_auto.fetch_add(1, Ordering::Relaxed);
                        if body["max_tokens"] == 0 {
                            return refuse("max_tokens must be at least 1, got 0.");
                        }
                        if !auto {
                            return refuse("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
                        }
                    }
                    match forward(&url, "", Bytes::from(body.to_string())).await {
                        Some(v) => (axum::http::StatusCode::OK, axum::Json(v)),
                        None => refuse("the engine cannot be reached"),
                    }
                }
            }),
        )
        .route("/tokenize", pass("/tokenize"))
        .route("/v1/completions", pass("/v1/completions"))
}

/// The in-process engine, a remote engine server and an external (vLLM-protocol) server force
/// the same calls on the shipped call cases, each valid for its tools; unforced, the model
/// calls nothing here, asked by the external server's chat API with `tool_choice: "auto"`, or
/// rendered and sampled where the server refuses that (asked once, remembered). The memo in front of a backend answers a repeated case from memory,
/// whatever the seed, and asks again when the token limit differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reference_backend_forces_the_same_valid_calls() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let local = reference()?;
    let remote = Remote::new(&url, &model_path()?)?;
    let (asked_auto, asked_refusing) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let vllm = serve(
        vllm_chat(url.clone(), true, asked_auto.clone()),
        &stop,
        &tasks,
    )
    .await?;
    let external = External::new(&vllm, ExternalFlavour::Vllm, "smol", &model_path()?, None)?;
    let refusing = serve(
        vllm_chat(url.clone(), false, asked_refusing.clone()),
        &stop,
        &tasks,
    )
    .await?;
    let no_auto = External::new(
        &refusing,
        ExternalFlavour::Vllm,
        "smol",
        &model_path()?,
        None,
    )?;
    let h = Harness::new("")?;
    let tools = &h.sets.tools;
    let call_cases: Vec<_> = h
        .sets
        .tool_call_prompts
        .iter()
        .filter(|c| c.expect == ToolExpectation::Call)
        .take(3)
        .collect();
    ensure!(call_cases.len() == 3);
    let memo = Cached::new(local.clone(), 1_000);
    for c in call_cases {
        let defs = serde_json::to_value(tools.select(&c.tools)?)?;
        let req = ToolCallRequest {
            messages: c
                .messages
                .iter()
                .map(serde_json::to_value)
                .collect::<serde_json::Result<_>>()?,
            tools: defs.as_array().context("tools")?.clone(),
            forced: true,
            max_tokens: 64,
            seed: 7,
        };
        // what a call is, whoever answered (an engine server also gives each call an id)
        let shape = |calls: Vec<ToolCall>| -> Vec<(Option<String>, String)> {
            calls.into_iter().map(|c| (c.name, c.arguments)).collect()
        };
        let mine = local.tool_calls(&req).await?;
        let set = ToolSet::from_request_tools(&defs);
        ensure!(
            !mine.is_empty()
                && mine
                    .iter()
                    .all(|call| set.classify(call) == CallVerdict::Ok),
            "{}: {mine:?}",
            c.id
        );
        ensure!(mine.len() == 1, "{}: one call, not {mine:?}", c.id);
        let remote_calls = shape(remote.tool_calls(&req).await?);
        ensure!(
            remote_calls == shape(mine.clone()),
            "{}: remote {remote_calls:?}, in-process {mine:?}",
            c.id
        );
        let external_calls = shape(external.tool_calls(&req).await?);
        ensure!(
            external_calls == shape(mine.clone()),
            "{}: external {external_calls:?}",
            c.id
        );
        let auto = ToolCallRequest {
            forced: false,
            ..req.clone()
        };
        let unforced = local.tool_calls(&auto).await?;
        ensure!(unforced.is_empty(), "{}: {unforced:?}", c.id);
        ensure!(remote.tool_calls(&auto).await? == unforced);
        // the external server answers "auto" itself (its tool parser reads the calls); one
        // that refuses "auto" is rendered and sampled instead
        ensure!(external.tool_calls(&auto).await? == unforced);
        ensure!(no_auto.tool_calls(&auto).await? == unforced);
        // a 400 about the chat, not the tool choice, is that chat's error, and not remembered
        let zero = ToolCallRequest {
            max_tokens: 0,
            ..auto.clone()
        };
        let e = external.tool_calls(&zero).await;
        ensure!(
            e.as_ref()
                .is_err_and(|e| e.to_string().contains("max_tokens must be at least 1")),
            "{e:?}"
        );
        // the memo: the first answer computed, the same case with another seed from memory
        ensure!(memo.tool_calls(&req).await? == mine);
        let reseeded = ToolCallRequest {
            seed: 8,
            ..req.clone()
        };
        ensure!(memo.tool_calls(&reseeded).await? == mine);
    }
    let s = memo.stats();
    ensure!((s.answer_hits, s.answer_misses) == (3, 3), "{s:?}");
    // "auto" asked of the external server twice a case (the second refused, and asked again
    // next case); of the refusing one once, remembered
    ensure!(
        (
            asked_auto.load(Ordering::Relaxed),
            asked_refusing.load(Ordering::Relaxed)
        ) == (6, 1),
        "{asked_auto:?} {asked_refusing:?}"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A stored tool_calls run of `endpoint` with `outcomes` (case id, reference passed, endpoint
/// passed).
async fn outcome_run(
    store: &Store,
    endpoint: &str,
    t: i64,
    outcomes: &[(&str, bool, bool)],
) -> Result<ProbeRun> {
    asked_run(store, endpoint, t, outcomes, None).await
}

/// [`outcome_run`], its cases asked with `tool_choice: "required"` where they expect a call
/// (`Some(true)`), with `"auto"` (`Some(false)`), or before runs said which (`None`).
async fn asked_run(
    store: &Store,
    endpoint: &str,
    t: i64,
    outcomes: &[(&str, bool, bool)],
    forced: Option<bool>,
) -> Result<ProbeRun> {
    let mut stats = json!({
        "cases": outcomes.iter().map(|o| o.0).collect::<Vec<_>>(),
        "passes": outcomes.iter().map(|o| [o.1, o.2]).collect::<Vec<_>>(),
    });
    if let Some(f) = forced {
        stats["forced_calls"] = json!(f);
    }
    let run = ProbeRun {
        id: 0,
        model: "smol".into(),
        endpoint: endpoint.into(),
        kind: "tool_calls".into(),
        started_ms: t,
        finished_ms: t + 100,
        ok: true,
        error: None,
        tokens: 100,
        stats,
        raw: None,
        repeat_of: None,
    };
    store_run(store, &run).await
}

#[tokio::test]
async fn each_case_counts_once_and_a_resolution_starts_the_pool_over() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors("")?;
    // one case lost in every one of 12 rounds: one piece of evidence, never flagged
    for i in 0..12 {
        let r = outcome_run(
            &db.store,
            "p/one",
            1_000 * i,
            &[("a", true, false), ("b", true, true)],
        )
        .await?;
        ensure!(d.after_run(&db.store, &r).await?.is_empty(), "round {i}");
    }
    // eight distinct cases lost and none won (two a run): flagged on the fourth run, where the
    // two-sided p reaches 2 · 0.5^8 < 0.01 (2 · 0.5^6 = 0.031 before), over the runs that hold them
    let lost: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    let mut last = Vec::new();
    for (i, pair) in lost.chunks(2).enumerate() {
        let outcomes: Vec<(&str, bool, bool)> =
            pair.iter().map(|c| (c.as_str(), true, false)).collect();
        let r = outcome_run(&db.store, "p/seven", 1_000 * i as i64, &outcomes).await?;
        last = d.after_run(&db.store, &r).await?;
        ensure!((i < 3) == last.is_empty(), "run {i}: {last:?}");
    }
    let alert = last.pop().context("no alert")?;
    ensure!(
        alert.evidence["lost"].as_array().map(Vec::len) == Some(8)
            && alert.evidence["probe_runs"].as_array().map(Vec::len) == Some(4)
            // these runs say nothing of why (as runs stored before `faults` was kept)
            && alert.evidence["lost_faults"] == json!({"unrecorded": 8}),
        "{}",
        alert.evidence
    );
    // a case the endpoint later passes is judged by its newest outcome: seven lost, p = 0.016
    let r = outcome_run(&db.store, "p/seven", 10_000, &[("c0", true, true)]).await?;
    ensure!(d.after_run(&db.store, &r).await?.is_empty());
    let r = outcome_run(&db.store, "p/seven", 11_000, &[("c0", true, false)]).await?;
    ensure!(d.after_run(&db.store, &r).await?.len() == 1);
    // an operator resolves the alert: the pool starts over from the runs after it
    db.store.resolve_alert(alert.id).await?.context("resolve")?;
    let r = outcome_run(
        &db.store,
        "p/seven",
        samewise_store::now_ms() + 1_000,
        &[("c1", true, false)],
    )
    .await?;
    ensure!(d.after_run(&db.store, &r).await?.is_empty());
    Ok(())
}

/// Outcomes asked under `tool_choice: "required"` and under `"auto"` are not pooled: after the
/// operator flips `force_tool_calls`, the pool starts over with the new way of asking, and a
/// case counts again once it has been asked that way.
#[tokio::test]
async fn flipping_force_tool_calls_starts_the_pool_over() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors("")?;
    let lost: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    let losing = |cases: &[String]| -> Vec<(String, bool, bool)> {
        cases.iter().map(|c| (c.clone(), true, false)).collect()
    };
    let run = |t: i64, cases: &[String], forced: Option<bool>| {
        let outcomes = losing(cases);
        let store = db.store.clone();
        async move {
            let o: Vec<(&str, bool, bool)> = outcomes
                .iter()
                .map(|(c, r, e)| (c.as_str(), *r, *e))
                .collect();
            asked_run(&store, "p/flip", t, &o, forced).await
        }
    };
    // six cases lost while forced (p = 0.031: not flagged), and runs from before the key
    // (unforced) are not pooled with them either
    ensure!(
        d.after_run(&db.store, &run(0, &lost[..2], None).await?)
            .await?
            .is_empty()
    );
    for (i, pair) in lost[..6].chunks(2).enumerate() {
        let r = run(1_000 * (i as i64 + 1), pair, Some(true)).await?;
        ensure!(
            d.after_run(&db.store, &r).await?.is_empty(),
            "forced run {i}"
        );
    }
    // the operator flips to "auto": two more lost cases are two, not eight
    let r = run(10_000, &lost[6..], Some(false)).await?;
    ensure!(
        d.after_run(&db.store, &r).await?.is_empty(),
        "pooled across the flip"
    );
    // asked again the new way, the other six are lost too: eight, flagged (2 · 0.5^8)
    let mut last = Vec::new();
    for (i, pair) in lost[..6].chunks(2).enumerate() {
        let r = run(11_000 + 1_000 * i as i64, pair, Some(false)).await?;
        last = d.after_run(&db.store, &r).await?;
        ensure!((i < 2) == last.is_empty(), "auto run {i}: {last:?}");
    }
    ensure!(
        last[0].evidence["lost"].as_array().map(Vec::len) == Some(8),
        "{}",
        last[0].evidence
    );
    Ok(())
}

/// `samewise config check`: a tool_calls_alpha that the configured cases can never reach (every
/// case lost gives McNemar's smallest p, 2·0.5^n) is an error naming how many cases it needs,
/// and two cases with one id (pooled by id) are refused.
#[test]
fn an_alpha_the_cases_cannot_reach_and_a_repeated_case_id_are_config_errors() -> Result<()> {
    use samewise_probes::ProbesConfig;
    let dir = tempfile::tempdir()?;
    let cases = dir.path().join("cases.jsonl");
    let case = |id: &str| {
        format!(
            "{{\"id\": \"{id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hi\"}}], \"tools\": [\"get_weather\"], \"expect\": \"no_call\"}}\n"
        )
    };
    let cfg = |alpha: &str, file: Option<&std::path::Path>| {
        let sets = file.map_or(String::new(), |f| {
            format!(
                "[models.smol.probes.prompt_sets]\ntool_call_prompts = {:?}\n",
                f.display().to_string()
            )
        });
        ProbesConfig::from_gateway_toml(&format!(
            "[probes]\n[probes.reference]\nbackend = \"in_process\"\nmodel = \"unused\"\n[probes.detectors]\n{alpha}\n[models.smol.probes]\nkinds = [\"tool_calls\"]\n{sets}"
        ))
    };
    // the 20 shipped cases reach 0.01 (2·0.5^20), not 1e-7
    Detectors::check_config(&cfg("", None)?)?;
    let e = Detectors::check_config(&cfg("tool_calls_alpha = 1e-7", None)?)
        .err()
        .context("20 cases cannot reach 1e-7")?
        .to_string();
    ensure!(
        e.contains("probes.detectors.tool_calls_alpha = 0.0000001")
            && e.contains("the 20 tool_calls cases of models.smol")
            && e.contains("use at least 25 cases"),
        "{e}"
    );
    // six cases cannot reach 0.01 (2·0.5^6 = 0.031); eight can
    std::fs::write(
        &cases,
        (0..6).map(|i| case(&format!("c{i}"))).collect::<String>(),
    )?;
    let e = Detectors::check_config(&cfg("", Some(&cases))?)
        .err()
        .context("6 cases cannot reach 0.01")?
        .to_string();
    ensure!(
        e.contains("the 6 tool_calls cases") && e.contains("use at least 8 cases"),
        "{e}"
    );
    std::fs::write(
        &cases,
        (0..8).map(|i| case(&format!("c{i}"))).collect::<String>(),
    )?;
    Detectors::check_config(&cfg("", Some(&cases))?)?;
    std::fs::write(
        &cases,
        (0..8)
            .map(|i| case(&format!("c{}", i % 7)))
            .collect::<String>(),
    )?;
    let e = Detectors::check_config(&cfg("", Some(&cases))?)
        .err()
        .context("a repeated id")?
        .to_string();
    ensure!(e.contains("tool-call case id c0 appears twice"), "{e}");
    Ok(())
}
