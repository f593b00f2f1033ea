//! The fingerprint kind against the real engine on the test model, with no reference: it
//! sends the same texts every round, so an unmodified endpoint's statistics are the same in
//! any round, and its own mean logprob is the engine's own score of those tokens; a provider
//! whose logprobs are scaled moves it by the factor and keeps its token count; one whose echo
//! logprobs are a position off their tokens keeps every mean but not the top-1 agreement; a
//! chat-only provider is fingerprinted by greedy chat completions instead; a refusal of both is a
//! finding; without a reference, every other kind fails naming what it lacks. The scheduler's
//! memory of a refusal sends the next rounds to chat at once, until it is an hour old, and a
//! restarted scheduler recalls it from the stored runs.
//!
//! The test model is `$SAMEWISE_MODEL` if set, else
//! `~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf`; a missing model fails.

use anyhow::{Context, Result, ensure};
use samewise_probes::ProbeKind;
use samewise_probes::reference::Reference;
use samewise_store::Backend;
use samewise_store::testing::TestDb;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common;
use crate::scheduler::stored;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_is_the_endpoints_own_logprobs_on_fixed_texts() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let shifted = serve(shifting_double(url.clone(), 1.3, false), &stop, &tasks).await?;
    let refusing = serve(shifting_double(url.clone(), 1.0, true), &stop, &tasks).await?;
    let h = Harness::new("kinds = [\"fingerprint\"]\nitems_per_round = 3\n")?;
    let t = target(&url, "engine/smol");

    let a = h.probe_round(None, ProbeKind::Fingerprint, &t, 0).await;
    ensure!(a.ok && a.raw.is_none(), "{:?} {}", a.error, a.stats);
    ensure!(a.tokens > 0, "no probe tokens counted");
    // any round: the same three texts, the same numbers
    let later = h.probe_round(None, ProbeKind::Fingerprint, &t, 7).await;
    ensure!(
        later.stats == a.stats,
        "round 7 differs: {} vs {}",
        later.stats,
        a.stats
    );
    let texts: Vec<&str> = a.stats["texts"]
        .as_array()
        .context("texts")?
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    let first: Vec<&str> = h.sets.logprob_texts[..3]
        .iter()
        .map(|t| t.id.as_str())
        .collect();
    ensure!(texts == first, "{texts:?} are not the set's first three");

    // the engine's own scores of the same tokens, read as the kind reads them
    let reference = in_process()?;
    let (mut sum, mut n, mut tokens) = (0.0f64, 0usize, 0usize);
    let (mut top1, mut top_n, mut agree) = (0.0f64, 0usize, 0usize);
    for text in &h.sets.logprob_texts[..3] {
        let ids = reference.tokenize(&text.text, true).await?;
        tokens += ids.len();
        for (p, id) in reference.score(&ids, 5).await?.iter().zip(&ids) {
            if let Some(lp) = p.logprob {
                sum += lp;
                n += 1;
            }
            if let Some(best) = p
                .top
                .iter()
                .reduce(|a, b| if b.logprob > a.logprob { b } else { a })
            {
                top1 += best.logprob;
                top_n += 1;
                agree += usize::from(best.id == *id);
            }
        }
    }
    ensure!(stat(&a, "own_tokens")? == tokens as f64, "{}", a.stats);
    ensure!(stat(&a, "positions")? == n as f64, "{}", a.stats);
    let own = stat(&a, "own_logprob_mean")?;
    ensure!(
        (own - sum / n as f64).abs() <= 1e-6 * own.abs(),
        "own_logprob_mean {own} vs the engine's {}",
        sum / n as f64
    );
    ensure!(own < -0.5, "{own}: natural text is not that likely");
    let own_top1 = stat(&a, "own_top1_logprob_mean")?;
    ensure!(
        own_top1 > own && (own_top1 - top1 / top_n as f64).abs() <= 1e-6 * own_top1.abs(),
        "own_top1_logprob_mean {own_top1} vs the engine's {}",
        top1 / top_n as f64
    );

    let agreement = stat(&a, "own_top1_agreement")?;
    ensure!(
        agreement == agree as f64 / top_n as f64 && agreement > 0.3 && agreement < 1.0,
        "own_top1_agreement {agreement} vs the engine's {agree} of {top_n}"
    );

    // a provider whose echo logprobs are one position off their tokens: every mean is the
    // same (the same values, moved), the agreement collapses
    let shifted_echo = profiled_server(
        engine()?,
        samewise_engine::Profile::builtin("shifted-echo").context("no shifted-echo profile")?,
        &stop,
        &tasks,
    )
    .await?;
    let off = h
        .probe_round(
            None,
            ProbeKind::Fingerprint,
            &target(&shifted_echo, "shifted-echo/smol"),
            0,
        )
        .await;
    ensure!(off.ok, "{:?}", off.error);
    ensure!(
        (stat(&off, "own_logprob_mean")? - own).abs() <= 1e-12 * own.abs(),
        "{}",
        off.stats
    );
    ensure!(
        stat(&off, "own_top1_agreement")? < agreement / 3.0,
        "shifted echo keeps agreement {}: {}",
        stat(&off, "own_top1_agreement")?,
        off.stats
    );

    // a provider serving a sharper distribution: the mean moves by the factor, the tokens stay
    let s = h
        .probe_round(
            None,
            ProbeKind::Fingerprint,
            &target(&shifted, "shifted/smol"),
            0,
        )
        .await;
    ensure!(s.ok, "{:?}", s.error);
    ensure!(
        (stat(&s, "own_logprob_mean")? - 1.3 * own).abs() <= 1e-5 * own.abs(),
        "scaled: {}",
        s.stats
    );
    ensure!(stat(&s, "own_tokens")? == tokens as f64);
    ensure!(stat(&s, "own_top1_agreement")? == agreement, "{}", s.stats);

    // a chat-only provider (echo refused): greedy chat completions instead
    let chat_only = profiled_server(
        engine()?,
        samewise_engine::Profile::builtin("no-echo").context("no no-echo profile")?,
        &stop,
        &tasks,
    )
    .await?;
    let c = h
        .probe_round(
            None,
            ProbeKind::Fingerprint,
            &target(&chat_only, "chat/smol"),
            0,
        )
        .await;
    ensure!(
        c.ok && c.stats["mode"] == "chat",
        "{:?} {}",
        c.error,
        c.stats
    );
    ensure!(
        c.stats["echo_refused"]
            .as_str()
            .is_some_and(|r| r.starts_with("echo logprobs refused")),
        "{}",
        c.stats
    );
    let prompts: Vec<&str> = c.stats["prompts"]
        .as_array()
        .context("prompts")?
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    let first: Vec<&str> = h.sets.completion_prompts[..3]
        .iter()
        .map(|p| p.id.as_str())
        .collect();
    ensure!(prompts == first, "{prompts:?}");
    // the engine decodes greedily as asked: every generated token is its most likely one
    ensure!(stat(&c, "own_chat_top1_agreement")? == 1.0, "{}", c.stats);
    ensure!(stat(&c, "own_chat_tokens")? > 0.0 && stat(&c, "own_chat_logprob_mean")? < 0.0);
    ensure!(
        c.stats.get("own_logprob_mean").is_none() && c.stats.get("own_top1_logprob_mean").is_none()
    );
    let again = h
        .probe_round(
            None,
            ProbeKind::Fingerprint,
            &target(&chat_only, "chat/smol"),
            4,
        )
        .await;
    ensure!(again.stats == c.stats, "{} vs {}", again.stats, c.stats);

    // a provider that refuses logprobs: a finding, not a crash
    let r = h
        .probe_round(
            None,
            ProbeKind::Fingerprint,
            &target(&refusing, "refusing/smol"),
            0,
        )
        .await;
    ensure!(
        !r.ok
            && r.error.as_deref().is_some_and(|e| {
                e.starts_with("echo logprobs refused") && e.contains("; by chat: ")
            }),
        "{:?}",
        r.error
    );

    // without a reference every other kind fails at once, naming what it lacks
    for kind in ProbeKind::ALL.into_iter().filter(|k| k.needs_reference()) {
        let o = h.probe_round(None, kind, &t, 0).await;
        let want = format!(
            "the {} probe needs a reference backend ([probes.reference])",
            kind.name()
        );
        ensure!(
            !o.ok && o.tokens == 0 && o.error.as_deref() == Some(want.as_str()),
            "{kind:?}: {:?}",
            o.error
        );
        ensure!(o.stats == Value::Object(Default::default()));
    }
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Requests a pass-through has forwarded: (legacy completions, chat completions).
#[derive(Default)]
struct Counts {
    completions: std::sync::atomic::AtomicUsize,
    chat: std::sync::atomic::AtomicUsize,
}

impl Counts {
    fn read(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.completions.load(Relaxed), self.chat.load(Relaxed))
    }
}

/// A pass-through to `upstream` that counts the requests by path and keeps each answer's
/// status and body.
fn counting_double(upstream: String, counts: std::sync::Arc<Counts>) -> axum::Router {
    let handler = move |uri: axum::http::Uri, body: axum::body::Bytes| {
        let (upstream, counts) = (upstream.clone(), counts.clone());
        async move {
            let counter = if uri.path().ends_with("/chat/completions") {
                &counts.chat
            } else {
                &counts.completions
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Ok(resp) = reqwest::Client::new()
                .post(format!("{upstream}{}", uri.path()))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
            else {
                return (axum::http::StatusCode::BAD_GATEWAY, Vec::new());
            };
            let status = axum::http::StatusCode::from_u16(resp.status().as_u16())
                .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
            (status, resp.bytes().await.unwrap_or_default().to_vec())
        }
    };
    axum::Router::new().fallback(axum::routing::post(handler))
}

/// A chat-only endpoint (the engine under the `no-echo` profile) behind [`counting_double`]:
/// its URL and its request counts.
async fn counted_chat_only(
    stop: &CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<(String, std::sync::Arc<Counts>)> {
    let counts = std::sync::Arc::new(Counts::default());
    let chat_only = profiled_server(
        engine()?,
        samewise_engine::Profile::builtin("no-echo").context("no no-echo profile")?,
        stop,
        tasks,
    )
    .await?;
    let counted = serve(counting_double(chat_only, counts.clone()), stop, tasks).await?;
    Ok((counted, counts))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_echo_is_remembered_for_an_hour() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let (counted, counts) = counted_chat_only(&stop, &tasks).await?;
    let h = Harness::new("kinds = [\"fingerprint\"]\nitems_per_round = 3\n")?;
    let memory = samewise_probes::kinds::EchoRefusals::default();
    let t = target(&counted, "chat/smol");
    let round = |n| h.probe_round_remembering(None, Some(&memory), ProbeKind::Fingerprint, &t, n);

    // the first round asks echo (max_tokens 0, then 1), is refused and asks by chat
    let first = round(0).await;
    ensure!(
        first.ok && first.stats["mode"] == "chat",
        "{:?} {}",
        first.error,
        first.stats
    );
    ensure!(first.stats["echo_asked"] == true, "{}", first.stats);
    ensure!(
        counts.read() == (2, 3),
        "requests (completions, chat): {:?}",
        counts.read()
    );
    let reason = first.stats["echo_refused"]
        .as_str()
        .context("echo_refused")?
        .to_owned();
    ensure!(reason.starts_with("echo logprobs refused"), "{reason}");

    // the next rounds go to chat at once, with the same charted numbers and the same words
    let second = round(1).await;
    ensure!(
        second.ok && second.stats["echo_asked"] == false,
        "{:?} {}",
        second.error,
        second.stats
    );
    ensure!(
        counts.read() == (2, 6),
        "requests (completions, chat): {:?}",
        counts.read()
    );
    ensure!(
        second.stats["echo_refused"] == reason.as_str(),
        "{}",
        second.stats
    );
    for key in [
        "inputs",
        "own_chat_logprob_mean",
        "own_chat_top1_agreement",
        "own_chat_tokens",
    ] {
        ensure!(
            second.stats[key] == first.stats[key],
            "{key}: {} vs {}",
            second.stats,
            first.stats
        );
    }
    ensure!(
        second.tokens == first.tokens,
        "{} vs {}",
        second.tokens,
        first.tokens
    );

    // an hour on, echo is asked again
    let now = samewise_probes::runner::now_ms();
    ensure!(
        memory
            .remembered("chat/smol", now + samewise_probes::kinds::ECHO_RETRY_MS)
            .is_none()
    );
    memory.record(
        "chat/smol",
        &reason,
        now - samewise_probes::kinds::ECHO_RETRY_MS,
    );
    let third = round(2).await;
    ensure!(
        third.ok && third.stats["echo_asked"] == true,
        "{:?} {}",
        third.error,
        third.stats
    );
    ensure!(
        counts.read() == (4, 9),
        "requests (completions, chat): {:?}",
        counts.read()
    );
    ensure!(
        memory.remembered("chat/smol", now).is_some(),
        "the new refusal is not remembered"
    );

    // an endpoint that answers echo when asked again is forgotten and fingerprinted by echo
    let url = engine_server(&stop, &tasks).await?;
    let echoing = target(&url, "engine/smol");
    let old = now - samewise_probes::kinds::ECHO_RETRY_MS;
    memory.record("engine/smol", "echo logprobs refused: 404", old);
    let e = h
        .probe_round_remembering(None, Some(&memory), ProbeKind::Fingerprint, &echoing, 0)
        .await;
    ensure!(
        e.ok && e.stats["mode"] == "echo",
        "{:?} {}",
        e.error,
        e.stats
    );
    ensure!(
        memory.remembered("engine/smol", old).is_none(),
        "an answered echo is still remembered as refused"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// A refusal of echo outlives the process: a scheduler started on the same database (a gateway
/// restarted) recalls it from the stored runs and asks by chat at once, in the stored words. A
/// stored refusal over an hour old, or one followed by an answered echo, is not recalled: echo
/// is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_recalls_a_stored_refusal_of_echo() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let (counted, counts) = counted_chat_only(&stop, &tasks).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let labels = ["chat/smol", "old/smol", "back/smol"];
    let start = || {
        scheduler(
            probes_config("kinds = [\"fingerprint\"]\n")?,
            &db,
            None,
            None,
            labels.iter().map(|l| target(&counted, l)).collect(),
        )
    };
    // round 1 has no noise pair: echo asked (max_tokens 0, then 1), refused, one chat
    let refused = stored(&start()?, 0, ProbeKind::Fingerprint, 1)
        .await?
        .remove(0);
    ensure!(
        refused.stats["mode"] == "chat" && refused.stats["echo_asked"] == true,
        "{}",
        refused.stats
    );
    ensure!(counts.read() == (2, 1), "requests: {:?}", counts.read());

    // a restart: the new scheduler's first round asks by chat at once
    let recalled = stored(&start()?, 0, ProbeKind::Fingerprint, 2)
        .await?
        .remove(0);
    ensure!(
        recalled.ok
            && recalled.stats["echo_asked"] == false
            && recalled.stats["echo_refused"] == refused.stats["echo_refused"],
        "{}",
        recalled.stats
    );
    ensure!(counts.read() == (2, 2), "requests: {:?}", counts.read());

    // two more histories: old/smol refused an hour and a minute ago; back/smol refused half an
    // hour ago and answered echo since (a real echo round, on the unmodified engine)
    let now = samewise_probes::runner::now_ms();
    let refused_at = |endpoint: &str, minutes_ago: i64| samewise_store::ProbeRun {
        endpoint: endpoint.into(),
        started_ms: now - minutes_ago * 60_000,
        finished_ms: now - minutes_ago * 60_000 + 1_000,
        ..refused.clone()
    };
    db.store
        .insert_probe_run(&refused_at("old/smol", 61))
        .await?;
    let echoing = engine_server(&stop, &tasks).await?;
    let echoed = scheduler(
        probes_config("kinds = [\"fingerprint\"]\n")?,
        &db,
        None,
        None,
        vec![target(&echoing, "back/smol")],
    )?;
    let answered = stored(&echoed, 0, ProbeKind::Fingerprint, 1)
        .await?
        .remove(0);
    ensure!(answered.stats["mode"] == "echo", "{}", answered.stats);
    // (stored after the echo round, dated before it)
    db.store
        .insert_probe_run(&refused_at("back/smol", 30))
        .await?;
    let s = start()?;
    for (i, label) in labels.iter().enumerate().skip(1) {
        let run = stored(&s, i, ProbeKind::Fingerprint, 2).await?.remove(0);
        ensure!(
            run.stats["echo_asked"] == true,
            "{label}: echo not asked: {}",
            run.stats
        );
    }
    ensure!(counts.read() == (6, 4), "requests: {:?}", counts.read());
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}
