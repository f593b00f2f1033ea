//! The fingerprint kind against the real engine on the test model, with no reference: it
//! sends the same texts every round, so an unmodified endpoint's statistics are the same in
//! any round, and its own mean logprob is the engine's own score of those tokens; a provider
//! whose logprobs are scaled moves it by the factor and keeps its token count; one whose echo
//! logprobs are a position off their tokens keeps every mean but not the top-1 agreement; a
//! chat-only provider is fingerprinted by greedy chat completions instead; a refusal of both is a
//! finding; without a reference, every other kind fails naming what it lacks.
//!
//! The test model is `$SAMEWISE_MODEL` if set, else
//! `~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf`; a missing model fails.

use anyhow::{Context, Result, ensure};
use samewise_probes::ProbeKind;
use samewise_probes::reference::Reference;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common;
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
