//! The long_context probe and its detector end to end over real engine servers on
//! 127.0.0.1 under serving profiles — the unmodified engine, a truncation at 300 tokens
//! (keeps the last 300 prompt tokens, silently; `truncate-512` at a smaller size, to keep the
//! test short) and `a8` (8-bit activations: faithful, not identical) — run by the scheduler
//! against the in-process reference over a 512-token window, with the detectors writing
//! alerts to a real SQLite store: only the truncating endpoint is flagged, its effective
//! context one doubling below the window and the cut diagnosed. An endpoint refusing
//! logprobs is judged by generation on both sides.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use samewise_engine::Profile;
use samewise_engine::{Engine, LoadOptions};
use samewise_store::testing::TestDb;
use samewise_store::{AlertQuery, Backend, ProbeRunQuery};
use tokio_util::sync::CancellationToken;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_is_flagged_and_faithful_endpoints_are_not() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let exact = engine_server(&stop, &tasks).await?;
    let truncate = Profile::from_toml(
        "[truncation]\nmax_prompt_tokens = 300\ndrop = \"start\"\n",
        "truncate-300",
    )?;
    let trunc = profiled_server(engine()?, truncate, &stop, &tasks).await?;
    let a8 = Arc::new(Engine::load(
        &model_path()?,
        LoadOptions {
            threads: 2,
            profile: Profile::builtin("a8").context("no a8 profile")?,
            ..LoadOptions::default()
        },
    )?);
    let a8 = profiled_server(a8.clone(), a8.profile().clone(), &stop, &tasks).await?;

    let db = TestDb::new(Backend::Sqlite).await?;
    let s = scheduler(
        probes_config("kinds = [\"long_context\"]\ncontext_window = 512\n")?,
        &db,
        Some(reference()?),
        Some(detectors("")?),
        vec![
            target(&exact, "exact/smol"),
            target(&trunc, "trunc/smol"),
            target(&a8, "a8/smol"),
        ],
    )?;
    s.run_once(0).await?;

    let runs = db
        .store
        .probe_runs(&ProbeRunQuery {
            model: None,
            endpoint: None,
            kind: Some("long_context".into()),
            since_ms: None,
            limit: 10,
        })
        .await?;
    ensure!(
        runs.len() == 3,
        "one run per endpoint (no noise-floor repeat): {runs:?}"
    );
    let run = |ep: &str| {
        runs.iter()
            .find(|r| r.endpoint == ep)
            .with_context(|| format!("no run of {ep}"))
    };
    for ep in ["exact/smol", "a8/smol"] {
        let r = run(ep)?;
        ensure!(r.ok, "{ep}: {:?}", r.error);
        ensure!(
            r.stats["effective_context"] == 512 && r.stats["reference_effective_context"] == 512,
            "{ep}: {}",
            r.stats
        );
    }
    let t = run("trunc/smol")?;
    ensure!(t.ok, "{:?}", t.error);
    let eff = t.stats["effective_context"]
        .as_u64()
        .context("effective_context")?;
    ensure!(eff == 256, "truncate-300: {}", t.stats);
    let lengths = t.stats["lengths"].as_array().context("lengths")?;
    let last = lengths.last().context("no lengths")?;
    // the echo shows what the endpoint kept: 300 tokens of the longest prompt
    ensure!(
        last["truncated"] == true
            && last["kept_tokens"] == 300
            && last["below"] == true
            && last["dropped_at"] == 0,
        "{last}"
    );
    // diagnosed: the beginning of every prompt over 300 tokens goes
    let d = &t.stats["diagnosis"];
    ensure!(
        d["signature"] == "prompt_truncated"
            && d["kept_tokens_max"] == 300
            && d["dropped_at"] == 0
            && d["text"]
                .as_str()
                .is_some_and(|t| t.contains("its beginning dropped")),
        "{d}"
    );
    for ep in ["exact/smol", "a8/smol"] {
        ensure!(run(ep)?.stats.get("diagnosis").is_none(), "{ep}");
    }

    let alerts = db
        .store
        .alerts(&AlertQuery {
            state: None,
            active_only: true,
            model: None,
            endpoint: None,
            limit: 10,
        })
        .await?;
    ensure!(
        alerts.len() == 1 && alerts[0].endpoint == "trunc/smol" && alerts[0].kind == "unfaithful",
        "only the truncating endpoint is flagged: {alerts:?}"
    );
    let a = &alerts[0];
    ensure!(
        a.evidence["statistic"] == "effective_context"
            && a.evidence["value"] == eff
            && a.evidence["reference_value"] == 512,
        "{}",
        a.evidence
    );
    ensure!(
        a.summary.contains(&format!(
            "effective context {eff} tokens, reference 512: prompts are silently truncated"
        )) && a.evidence["diagnosis"]["signature"] == "prompt_truncated",
        "{}",
        a.summary
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_refusing_logprobs_is_judged_by_generation_on_both_sides() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let nolp = Profile::builtin("no-logprobs").context("no no-logprobs profile")?;
    let url = profiled_server(engine()?, nolp, &stop, &tasks).await?;
    let reference = in_process()?;
    let h = Harness::new("context_window = 256")?;
    let o = h
        .probe(
            &reference,
            samewise_probes::ProbeKind::LongContext,
            &target(&url, "nolp/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    ensure!(o.stats["scoring"] == "generation", "{}", o.stats);
    let l = &o.stats["lengths"][0];
    // the same engine greedily answers the same prompts on both sides
    ensure!(
        l["queries"] == 4 && l["passed"] == l["reference_passed"] && l["below"] == false,
        "{l}"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}
