//! The tool_calls probe's faithful? finding: each case's pass/fail on both sides (a call exactly
//! where the case expects one, every call valid) paired over the endpoint's recent runs. Against
//! real engine servers through the scheduler: a provider that calls a tool on every chat (a
//! third-party double speaking OpenAI's protocol) is flagged "unfaithful" naming the cases it
//! lost, with no live traffic; the unmodified engine never is. Over stored runs: a case seen in
//! many rounds counts once, and an operator's resolution starts the pool over. In the config: an
//! alpha the cases cannot reach, and a repeated case id, are errors.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use axum::routing::post;
use samewise_probes::ProbeKind;
use samewise_probes::detect::{DetectorConfig, Detectors};
use samewise_probes::reference::Reference;
use samewise_probes::runner::Scheduler;
use samewise_store::testing::TestDb;
use samewise_store::{Backend, ProbeRun, Store};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::detectors::store_run;
use crate::scheduler::stored;

/// A provider that answers every chat completion with a call of the first tool offered, with
/// no arguments (every shipped tool has a required parameter, so the call is never valid).
fn always_calls() -> axum::Router {
    axum::Router::new().route(
        "/v1/chat/completions",
        post(|axum::Json(body): axum::Json<Value>| async move {
            let name = body["tools"][0]["function"]["name"].clone();
            axum::Json(json!({
                "id": "chatcmpl-double", "object": "chat.completion", "created": 0, "model": "smol",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": null,
                    "tool_calls": [{"id": "call_0", "type": "function",
                                    "function": {"name": name, "arguments": "{}"}}]}}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 8, "total_tokens": 48}
            }))
        }),
    )
}

fn detectors() -> Result<Arc<Detectors>> {
    Ok(Arc::new(Detectors::new(
        DetectorConfig::default(),
        None,
        &samewise_probes::AlertsConfig::default(),
    )?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_failing_cases_the_reference_passes_is_flagged() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let same = engine_server(&stop, &tasks).await?;
    let calls = serve(always_calls(), &stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    // every shipped case (20) in two rounds: the 10 that expect a call, then the 10 that do not
    let cfg = Arc::new(probes_config(
        "kinds = [\"tool_calls\"]\nitems_per_round = 10\n",
    )?);
    let reference: Arc<dyn Reference> = Arc::new(in_process()?);
    let s = Scheduler::new(
        cfg,
        db.store.clone(),
        Some(reference),
        Some(detectors()?),
        vec![target(&same, "same/smol"), target(&calls, "calls/smol")],
    )?;
    let mut runs = Vec::new();
    for round in 0..2 {
        for i in 0..2 {
            let mut r = stored(&s, i, ProbeKind::ToolCalls, round).await?;
            ensure!(r.len() == 1 && r[0].ok, "{r:?}");
            runs.push(r.remove(0));
        }
    }
    let passes = |r: &ProbeRun| -> Result<Vec<[bool; 2]>> {
        Ok(serde_json::from_value(r.stats["passes"].clone())?)
    };
    // the unmodified engine answers as the reference does, case by case
    for r in [&runs[0], &runs[2]] {
        ensure!(
            passes(r)?.iter().all(|[a, b]| a == b) && passes(r)?.len() == 10,
            "{}",
            r.stats
        );
    }
    ensure!(
        db.store
            .active_alert("smol", "same/smol", "unfaithful")
            .await?
            .is_none()
    );
    // the double fails every case: on the call cases the reference fails too (the 135M model
    // calls no tool unprompted), so round 0 shows nothing; round 1's 10 cases that expect no
    // call are the reference's and not the double's: 10 lost, 0 won, p = 2 · 0.5^10
    ensure!(
        passes(&runs[3])?.iter().all(|[a, b]| *a && !*b),
        "{}",
        runs[3].stats
    );
    let alert = db
        .store
        .active_alert("smol", "calls/smol", "unfaithful")
        .await?
        .context("the double was not flagged")?;
    let e = &alert.evidence;
    ensure!(
        e["statistic"] == "tool_calls_passes"
            && e["lost"].as_array().map(Vec::len) == Some(10)
            && e["lost"]
                .as_array()
                .is_some_and(|l| l.contains(&json!("chat-greeting")))
            && e["won"] == json!([])
            && e["cases"] == 20
            && e["p_value"].as_f64() == Some(2.0 * 0.5f64.powi(10))
            && e["probe_runs"] == json!([runs[1].id, runs[3].id])
            && e["schema_accuracy"] == 0.0,
        "{e:#}"
    );
    ensure!(
        alert
            .summary
            .starts_with("endpoint calls/smol: tool calls fail where the reference's pass — 10 of 20 cases lost, 0 won"),
        "{}",
        alert.summary
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
        stats: json!({
            "cases": outcomes.iter().map(|o| o.0).collect::<Vec<_>>(),
            "passes": outcomes.iter().map(|o| [o.1, o.2]).collect::<Vec<_>>(),
        }),
        raw: None,
        repeat_of: None,
    };
    store_run(store, &run).await
}

#[tokio::test]
async fn each_case_counts_once_and_a_resolution_starts_the_pool_over() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let d = detectors()?;
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
            && alert.evidence["probe_runs"].as_array().map(Vec::len) == Some(4),
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
