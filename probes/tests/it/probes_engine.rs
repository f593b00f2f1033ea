//! The reference client and the probe kinds against the real engine on the test model,
//! over real HTTP on 127.0.0.1: the in-process, remote and external (vLLM- and
//! SGLang-protocol doubles backed by the engine; SGLang's chats rendered locally with the
//! model's template) backends agree bit for bit; an unmodified engine endpoint probed
//! against the in-process reference scores KL exactly 0; an endpoint whose logprobs are
//! shifted (a third-party double in front of the engine) scores a large statistic; a
//! refusal is a finding (the scheduler is in `scheduler.rs`).
//!
//! The test model is `$SAMEWISE_MODEL` if set, else
//! `~/.cache/samewise/models/SmolLM2-135M-Instruct.Q4_1.gguf`; a missing model fails.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use axum::body::Bytes;
use axum::routing::post;
use samewise_engine::Engine;
use samewise_probes::reference::{External, Reference, Remote, SampleRequest};
use samewise_probes::{ExternalFlavour, ProbeKind};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common;
use common::*;

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

/// A third-party double speaking SGLang's `/generate` protocol, computing with the engine:
/// scoring (`return_logprob`, `logprob_start_len: 0`, `top_logprobs_num`, `max_new_tokens`
/// 0) and sampling (`sampling_params`: `max_new_tokens`, `temperature`, `sampling_seed`; the
/// generated tokens' logprobs in `meta_info.output_token_logprobs`), stopping where the
/// model's tokenizer says a turn ends, as SGLang does.
fn sglang_double(engine: Arc<Engine>, tokenizer: Arc<samewise_engine::Tokenizer>) -> axum::Router {
    axum::Router::new().route(
        "/generate",
        post(move |body: Bytes| {
            let (engine, tokenizer) = (engine.clone(), tokenizer.clone());
            async move {
                let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                let ids: Vec<u32> = v["input_ids"].as_array().map(|a| a.iter().filter_map(|x| x.as_u64().map(|n| n as u32)).collect()).unwrap_or_default();
                let sp = &v["sampling_params"];
                let new = sp["max_new_tokens"].as_u64().unwrap_or(0) as usize;
                if new > 0 {
                    let params = samewise_engine::GenerateParams {
                        sampling: samewise_engine::SamplingParams {
                            temperature: sp["temperature"].as_f64().unwrap_or(1.0) as f32,
                            top_p: 1.0,
                            top_k: 0,
                            seed: sp["sampling_seed"].as_u64(),
                            ..samewise_engine::SamplingParams::default()
                        },
                        max_tokens: new,
                        stop_token_ids: tokenizer.stop_ids().iter().copied().collect(),
                        ..samewise_engine::GenerateParams::default()
                    };
                    let generated = tokio::task::spawn_blocking(move || {
                        let mut out = Vec::new();
                        engine
                            .generate(&ids, &params, &mut |t| {
                                out.push((t.token, t.logprob));
                                true
                            })
                            .map(|_| (tokenizer.decode(&out.iter().map(|t| t.0).collect::<Vec<_>>(), true), out))
                    })
                    .await;
                    let Ok(Ok((Ok(text), out))) = generated else { return axum::Json(json!({"error": {"message": "generation failed"}})) };
                    let lps: Vec<Value> = out.iter().map(|(id, lp)| json!([f64::from(*lp), id, null])).collect();
                    return axum::Json(json!({"text": text, "meta_info": {"output_token_logprobs": lps, "completion_tokens": out.len()}}));
                }
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
    let url = serve(
        sglang_double(engine()?, Arc::new(tokenizer_and_template()?.0)),
        &stop,
        &tasks,
    )
    .await?;
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
    // SGLang has no chat-tokenize route: chats are rendered with the model's own template, as
    // the in-process reference renders them, from the GGUF or from the Hugging Face files
    // beside a tokenizer.json
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../reference-engine/tests/fixtures/smollm2/tokenizer.json");
    let hf = External::new(&url, ExternalFlavour::Sglang, "smol", &fixture, None)?;
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
    ];
    let chats = [
        vec![json!({"role": "user", "content": "hi"})],
        vec![
            json!({"role": "system", "content": "Answer in one word."}),
            json!({"role": "user", "content": "Weather in Oslo?"}),
        ],
    ];
    for chat in &chats {
        for t in [None, Some(&tools[..])] {
            let want = local.render_chat(chat, t).await?;
            ensure!(sglang.render_chat(chat, t).await? == want, "{chat:?} {t:?}");
            ensure!(hf.render_chat(chat, t).await? == want, "{chat:?} {t:?}");
        }
    }
    // so a chat-only endpoint is judged against SGLang as against the in-process engine
    let same = target(&engine_server(&stop, &tasks).await?, "engine/smol");
    let h = Harness::new("")?;
    let by_sglang = h.probe(&sglang, ProbeKind::CompletionLogprobs, &same).await;
    let by_engine = h.probe(&local, ProbeKind::CompletionLogprobs, &same).await;
    ensure!(by_sglang.ok, "{:?}", by_sglang.error);
    ensure!(
        by_sglang.stats == by_engine.stats && stat(&by_sglang, "kl_p99")? == 0.0,
        "{} vs {}",
        by_sglang.stats,
        by_engine.stats
    );
    // and sampled on SGLang as in this process: the same texts and logprobs, seed by seed
    let prompt = local.render_chat(&chats[1], None).await?;
    let req = SampleRequest {
        prompt,
        n: 2,
        max_tokens: 12,
        temperature: 0.8,
        seed: 5,
    };
    let (there, here) = (sglang.sample(&req).await?, local.sample(&req).await?);
    ensure!(
        there == here && here.len() == 2 && here.iter().all(|s| s.logprobs.len() == 12),
        "{there:?} vs {here:?}"
    );
    // a tokenizer.json with no template beside it: refused, saying why
    let bare = tempfile::tempdir()?;
    std::fs::copy(&fixture, bare.path().join("tokenizer.json"))?;
    let lone = External::new(
        &url,
        ExternalFlavour::Sglang,
        "smol",
        &bare.path().join("tokenizer.json"),
        None,
    )?;
    let e = lone.render_chat(&chats[0], None).await;
    ensure!(
        e.as_ref()
            .is_err_and(|e| e.to_string().contains("holds no chat template")),
        "{e:?}"
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_context_scores_an_unmodified_endpoint_like_the_reference() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let reference = in_process()?;
    let h = Harness::new("context_window = 512")?;
    let o = h
        .probe(
            &reference,
            ProbeKind::LongContext,
            &target(&url, "engine/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    ensure!(o.stats["scoring"] == "likelihood", "{}", o.stats);
    let lengths = o.stats["lengths"].as_array().context("lengths")?;
    ensure!(lengths.len() == 2 && o.tokens > 0, "{}", o.stats);
    // the engine computes what the in-process reference computes: the same passes at every
    // length, nothing truncated, the effective context the window's
    for l in lengths {
        ensure!(
            l["passed"] == l["reference_passed"]
                && l["below"] == false
                && l["truncated"] == false
                && l["queries"].as_u64().unwrap_or(0) >= 4,
            "{l}"
        );
    }
    ensure!(stat(&o, "effective_context")? == 512.0, "{}", o.stats);
    ensure!(stat(&o, "window")? == 512.0, "{}", o.stats);
    // the 135M model retrieves by likelihood at every length tried
    ensure!(
        stat(&o, "reference_effective_context")? == 512.0,
        "{}",
        o.stats
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
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
    ensure!(o.stats.get("diagnosis").is_none(), "{}", o.stats);
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
    ensure!(o.stats.get("diagnosis").is_none(), "{}", o.stats);
    ensure!(stat(&o, "positions")? >= 1.0 && o.tokens > 0);

    let o = h.probe(&reference, ProbeKind::ToolCalls, &same).await;
    ensure!(o.ok, "{:?}", o.error);
    // same weights, same greedy answers: the same call/no-call decisions; trigger F1 is
    // 1.0 when a side called, and null (undefined, never a vacuous 1.0) when none did
    ensure!(
        stat(&o, "endpoint_triggers")? == stat(&o, "reference_triggers")?
            && match o.stats.get("trigger_f1") {
                Some(Value::Null) => stat(&o, "reference_triggers")? == 0.0,
                _ => stat(&o, "trigger_f1")? == 1.0,
            },
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
    // a sharper distribution is a real difference: moving it does not explain it away
    ensure!(o.stats.get("diagnosis").is_none(), "{}", o.stats);

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

/// The scheduler's memo of reference scores: a repeated sequence is served from memory with
/// the very same answer, least recently used sequences are evicted past the capacity, and a
/// sequence longer than the whole capacity is scored but never kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_reference_answers_exactly_as_the_engine_and_evicts_by_recency() -> Result<()> {
    use samewise_probes::reference::Cached;
    let engine: Arc<dyn Reference> = Arc::new(in_process()?);
    let texts = [
        "The quick brown fox jumps over the lazy dog.",
        "Rust's ownership rules are checked at compile time.",
        "Water boils at one hundred degrees Celsius at sea level.",
    ];
    let mut ids = Vec::new();
    for t in texts {
        ids.push(engine.tokenize(t, false).await?);
    }
    let longest = ids.iter().map(Vec::len).max().context("ids")?;
    // room for two of the three sequences, not three
    let capacity = ids.iter().map(Vec::len).sum::<usize>() - 1;
    let cached = Cached::new(engine.clone(), capacity);

    let direct = engine.score(&ids[0], 5).await?;
    ensure!(
        cached.score(&ids[0], 5).await? == direct,
        "first answer differs"
    );
    ensure!(
        cached.score(&ids[0], 5).await? == direct,
        "memoized answer differs"
    );
    let s = cached.stats();
    ensure!(
        (s.hits, s.misses, s.sequences, s.positions) == (1, 1, 1, ids[0].len()),
        "{s:?}"
    );
    // another top-k is another question
    ensure!(cached.score(&ids[0], 2).await? == engine.score(&ids[0], 2).await?);
    ensure!(cached.stats().misses == 2);

    // fill up: the least recently used sequences go first
    let cached = Cached::new(engine.clone(), capacity);
    cached.score(&ids[0], 5).await?;
    cached.score(&ids[1], 5).await?;
    cached.score(&ids[0], 5).await?; // ids[1] is now the least recently used
    cached.score(&ids[2], 5).await?; // evicts ids[1]
    let before = cached.stats();
    ensure!(
        before.positions <= capacity && before.sequences == 2,
        "{before:?}"
    );
    cached.score(&ids[0], 5).await?;
    ensure!(cached.stats().hits == before.hits + 1, "ids[0] was evicted");
    ensure!(cached.score(&ids[1], 5).await? == engine.score(&ids[1], 5).await?);
    ensure!(
        cached.stats().misses == before.misses + 1,
        "ids[1] was kept"
    );

    // longer than the capacity: answered, never kept
    let tiny = Cached::new(engine.clone(), longest - 1);
    let long = ids.iter().find(|v| v.len() == longest).context("longest")?;
    ensure!(tiny.score(long, 5).await? == engine.score(long, 5).await?);
    ensure!(tiny.score(long, 5).await? == engine.score(long, 5).await?);
    let s = tiny.stats();
    ensure!((s.hits, s.misses, s.sequences) == (0, 2, 0), "{s:?}");
    Ok(())
}

/// Several sequences scored in one call (as the long-context probe's candidates are): the
/// in-process engine computes the prefix they share once, the answers equal one `score` each
/// bit for bit, in order; through the memo, the sequences already held are hits and only the
/// others go to the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_many_shares_prefixes_and_answers_as_score_does() -> Result<()> {
    use samewise_probes::reference::Cached;
    let engine: Arc<dyn Reference> = Arc::new(in_process()?);
    let haystack = "The archive kept every letter the lighthouse keeper wrote. ".repeat(12);
    let mut seqs = Vec::new();
    for end in [
        "The code is 4471.",
        "The code is 9023.",
        "Nothing was found.",
    ] {
        seqs.push(engine.tokenize(&format!("{haystack}{end}"), true).await?);
    }
    ensure!(seqs[0].len() > 100 && seqs[0][..100] == seqs[1][..100]);
    let many = engine.score_many(&seqs, 3).await?;
    ensure!(many.len() == seqs.len(), "{} answers", many.len());
    for (i, ids) in seqs.iter().enumerate() {
        ensure!(
            many[i] == engine.score(ids, 3).await?,
            "sequence {i} differs"
        );
    }
    let cached = Cached::new(engine.clone(), 100_000);
    cached.score(&seqs[1], 3).await?;
    ensure!(
        cached.score_many(&seqs, 3).await? == many,
        "memoized answers differ"
    );
    let s = cached.stats();
    ensure!(
        (s.hits, s.misses, s.sequences) == (1, 3, 3),
        "one held, two scored: {s:?}"
    );
    ensure!(cached.score_many(&seqs, 3).await? == many);
    ensure!(cached.stats().hits == 4, "{:?}", cached.stats());
    Ok(())
}

/// Every shipped prompt_logprobs text, the multilingual one's partial characters included,
/// probed against the unmodified engine is exact: every echoed token aligns directly, KL is
/// exactly 0 and no fault signature is diagnosed (`diagnoses` shows the same 16 texts diagnosing
/// a different model behind the name). (Lossy U+FFFD token texts once mapped to an arbitrary
/// token and shifted the scored sequence.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shipped_text_of_the_unmodified_engine_is_exact() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let reference = in_process()?;
    let mut h = Harness::new("")?;
    let n = h.sets.logprob_texts.len();
    h.cfg
        .models
        .get_mut("smol")
        .context("model")?
        .items_per_round = n;
    let o = h
        .probe(
            &reference,
            ProbeKind::PromptLogprobs,
            &target(&url, "engine/smol"),
        )
        .await;
    ensure!(o.ok, "{:?}", o.error);
    let worst = worst_positions(&o)?;
    ensure!(
        stat(&o, "kl_mean")? == 0.0
            && stat(&o, "kl_p99")? == 0.0
            && stat(&o, "top1_same")? == 1.0
            && stat(&o, "mismatch_rate")? == 0.0
            && o.stats["align"] == "direct"
            && o.stats.get("diagnosis").is_none(),
        "{} worst: {worst}",
        o.stats
    );
    // every echoed token of every text was compared (position 0 of each has no logprob)
    let endpoint_tokens = stat(&o, "endpoint_tokens")?;
    ensure!(
        stat(&o, "positions")? == endpoint_tokens - n as f64 && endpoint_tokens as i64 == o.tokens,
        "{}",
        o.stats
    );
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// The engine server takes at most 16 samples per request and answers more with a 400: the
/// samples probe halves its `n` and asks again until it has all it wants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_probe_asks_again_with_a_smaller_n_when_n_is_refused() -> Result<()> {
    let stop = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let url = engine_server(&stop, &tasks).await?;
    let reference = in_process()?;
    let mut h = Harness::new("")?;
    let m = h.cfg.models.get_mut("smol").context("model")?;
    m.samples_per_prompt = 20;
    m.max_tokens = 8;
    let o = h
        .probe(&reference, ProbeKind::Samples, &target(&url, "engine/smol"))
        .await;
    ensure!(o.ok, "{:?}", o.error);
    ensure!(o.stats["samples_per_prompt"] == 20, "{}", o.stats);
    let p = stat(&o, "p_value")?;
    ensure!(p > 0.0 && p <= 1.0, "{}", o.stats);
    stop.cancel();
    tasks.close();
    tasks.wait().await;
    Ok(())
}
