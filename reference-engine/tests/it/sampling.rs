//! The sampling parameters over the API against the real test model: OpenAI's `logit_bias`,
//! `presence_penalty` and `frequency_penalty` and vLLM's `top_k`, `min_p` and
//! `repetition_penalty` change which token is chosen, by their definitions, and never the
//! logprobs reported; bad values are a 400 naming the parameter.

use samewise_engine::GenerateParams;
use samewise_engine::sample::SamplingParams;
use samewise_engine::server::ServerState;
use serde_json::{Value, json};

use crate::common::server::{TestServer, chat_prompt};

const PROMPT: &str = "The capital of France is Paris. The capital of Italy is";

/// A greedy chat request for `content`.
fn chat_body(content: &str, max_tokens: u32) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "temperature": 0,
           "max_tokens": max_tokens})
}

fn f32_of(v: &Value) -> Option<f32> {
    v.as_f64().map(|x| x as f32)
}

/// Library generation with `sampling`, keeping the top 20 of each position.
fn library_generation(
    state: &ServerState,
    prompt: &[u32],
    max_tokens: usize,
    sampling: SamplingParams,
) -> anyhow::Result<Vec<samewise_engine::GeneratedToken>> {
    let params = GenerateParams {
        sampling,
        max_tokens,
        stop_token_ids: state.tokenizer().stop_ids().iter().copied().collect(),
        top_logprobs: 20,
    };
    Ok(state
        .engine()
        .generate(prompt, &params, &mut |_| true)?
        .tokens)
}

/// The ids of a generation's tokens.
fn ids(g: &[samewise_engine::GeneratedToken]) -> Vec<u32> {
    g.iter().map(|t| t.token).collect()
}

/// A generation as a chat answer lists it: (token, logprob) per generated token.
fn as_listed(
    state: &ServerState,
    g: &[samewise_engine::GeneratedToken],
) -> anyhow::Result<Vec<(String, f32)>> {
    let tok = state.tokenizer();
    g.iter()
        .map(|t| Ok((tok.token_str(t.token)?.to_owned(), t.logprob)))
        .collect()
}

/// A chat answer's (token, logprob) per generated token, from its `logprobs.content`.
fn answer_tokens(v: &Value) -> anyhow::Result<Vec<(String, f32)>> {
    v["choices"][0]["logprobs"]["content"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no logprobs: {v}"))?
        .iter()
        .map(|c| {
            Ok((
                c["token"].as_str().unwrap_or_default().to_owned(),
                f32_of(&c["logprob"]).ok_or_else(|| anyhow::anyhow!("no logprob: {c}"))?,
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_penalties_and_vllm_sampling_steer_the_choice_not_the_logprobs()
-> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let tok = srv.state.tokenizer();
    let q = "List the days of the week, then list them again.";
    let prompt = chat_prompt(&srv.state, q)?;
    let plain = library_generation(&srv.state, &prompt, 40, SamplingParams::default())?;
    let request = |extra: Value| {
        let mut b = chat_body(q, 40);
        b["logprobs"] = json!(true);
        b["top_logprobs"] = json!(20);
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        b
    };

    // -100 on the greedy first token: the first token is the model's second choice, and its
    // logprob is the model's own (not shifted by the bias)
    let first = plain[0].token;
    let second = plain[0].top[1];
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(json!({"logit_bias": {first.to_string(): -100}})),
        )
        .await?;
    let got = answer_tokens(&v)?;
    assert_eq!(got[0].0, tok.token_str(second.token)?, "{v}");
    assert_eq!(got[0].1.to_bits(), second.logprob.to_bits());

    // +100 on one token: nothing else is ever chosen, on both routes
    let forced = tok.encode(" sea", false)?[0];
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(json!({"logit_bias": {forced.to_string(): 100}, "max_tokens": 6})),
        )
        .await?;
    let got = answer_tokens(&v)?;
    assert_eq!(got.len(), 6, "{v}");
    let sea = tok.token_str(forced)?;
    assert!(got.iter().all(|(t, _)| t == sea), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let v = srv
        .ok(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                       "logit_bias": {forced.to_string(): 100}}),
        )
        .await?;
    assert_eq!(v["choices"][0]["text"], " sea sea sea sea", "{v}");

    // penalties: OpenAI's formula on the model's own logits at every step, which the
    // server's answer follows token for token with the model's own logprobs
    let sampling = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 1.0,
        ..SamplingParams::default()
    };
    let lib = library_generation(&srv.state, &prompt, 40, sampling.clone())?;
    let mut counts = std::collections::BTreeMap::<u32, u32>::new();
    let mut steered = 0;
    for (i, g) in lib.iter().enumerate() {
        let penalty = |t: u32| {
            counts.get(&t).map_or(0.0, |&c| {
                c as f32 * sampling.frequency_penalty + sampling.presence_penalty
            })
        };
        // the chosen token's logprob is the model's: as listed among its top 20, if there
        if let Some(listed) = g.top.iter().find(|a| a.token == g.token) {
            assert_eq!(
                listed.logprob.to_bits(),
                g.logprob.to_bits(),
                "position {i}"
            );
        }
        // no listed token beats the chosen one once penalised (logprobs and logits differ
        // by one constant per row; the margin covers its rounding)
        let chosen = g.logprob - penalty(g.token);
        for a in &g.top {
            assert!(
                a.logprob - penalty(a.token) <= chosen + 1e-4,
                "position {i}: {} ({}) beats the chosen {} ({chosen}) once penalised",
                a.token,
                a.logprob - penalty(a.token),
                g.token
            );
        }
        if g.token != g.top[0].token {
            steered += 1;
        }
        *counts.entry(g.token).or_insert(0) += 1;
    }
    assert!(
        steered > 0,
        "the penalties never changed a choice: this proves nothing"
    );
    assert_ne!(ids(&lib), ids(&plain));
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(json!({"presence_penalty": 0.5, "frequency_penalty": 1.0})),
        )
        .await?;
    assert_eq!(answer_tokens(&v)?, as_listed(&srv.state, &lib)?);

    // vLLM's repetition penalty (prompt and answer tokens): the server's answer is the
    // library's, and not the plain one
    let repeated = SamplingParams {
        repetition_penalty: 1.3,
        ..SamplingParams::default()
    };
    let lib = library_generation(&srv.state, &prompt, 40, repeated)?;
    assert_ne!(ids(&lib), ids(&plain));
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(json!({"repetition_penalty": 1.3})),
        )
        .await?;
    assert_eq!(answer_tokens(&v)?, as_listed(&srv.state, &lib)?);
    // top_k 1 and min_p 1 leave only the most likely token: greedy, however hot
    let greedy = as_listed(&srv.state, &plain)?;
    for extra in [json!({"top_k": 1}), json!({"min_p": 1.0})] {
        let mut e = extra.clone();
        e["temperature"] = json!(1.8);
        e["seed"] = json!(3);
        let v = srv.ok("/v1/chat/completions", &request(e)).await?;
        assert_eq!(answer_tokens(&v)?, greedy, "{extra}");
    }
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(json!({"top_k": -1, "min_p": 0})),
        )
        .await?;
    assert_eq!(answer_tokens(&v)?, greedy);

    // out-of-range and malformed values are the caller's error, naming the parameter
    for (extra, param) in [
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"frequency_penalty": "high"}), "frequency_penalty"),
        (json!({"logit_bias": [1, 2]}), "logit_bias"),
        (json!({"logit_bias": {"sea": 1}}), "logit_bias"),
        (json!({"logit_bias": {"07": 1}}), "logit_bias"),
        (json!({"logit_bias": {"49152": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias"),
        (json!({"logit_bias": {"5": "up"}}), "logit_bias"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"repetition_penalty": -1.2}), "repetition_penalty"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"top_k": -2}), "top_k"),
        (json!({"top_k": 2.5}), "top_k"),
        (json!({"top_k": "all"}), "top_k"),
    ] {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let body = if path == "/v1/completions" {
                let mut b = json!({"prompt": PROMPT, "max_tokens": 2});
                for (k, v) in extra.as_object().into_iter().flatten() {
                    b[k] = v.clone();
                }
                b
            } else {
                request(extra.clone())
            };
            let (status, v) = srv.post(path, &body).await?;
            assert_eq!(status, 400, "{path} {extra}: {v}");
            assert_eq!(v["error"]["param"], param, "{path} {extra}: {v}");
            assert_eq!(v["error"]["type"], "invalid_request_error");
        }
    }
    Ok(())
}
