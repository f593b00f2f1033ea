//! The sampling parameters over the API against the real test model: OpenAI's `logit_bias`,
//! `presence_penalty` and `frequency_penalty` and vLLM's `top_k`, `min_p` and
//! `repetition_penalty` change which token is chosen, by their definitions, and never the
//! logprobs reported; vLLM's `ignore_eos`, `stop_token_ids`, `min_tokens` and
//! `include_stop_str_in_output` end the answer where they say; bad values are a 400 naming the
//! parameter.

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
        ..GenerateParams::default()
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

/// vLLM's stopping extensions over the API: `ignore_eos` generates past the model's stop
/// token, `stop_token_ids` ends at a token of the caller's, `min_tokens` masks the stop
/// tokens and holds back stop strings until that many tokens (the reported logprobs stay the
/// model's own: the stop token it wanted still tops the list), and
/// `include_stop_str_in_output` keeps the matched stop string. Before, all four were ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_stopping_extensions_end_the_answer_where_they_say() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let tok = srv.state.tokenizer();
    let q = "Hi";
    let prompt = chat_prompt(&srv.state, q)?;
    let plain = library_generation(&srv.state, &prompt, 60, SamplingParams::default())?;
    let natural = plain.len();
    assert!((4..40).contains(&natural), "{natural} tokens");
    let text: String = plain
        .iter()
        .map(|t| tok.token_str(t.token).map(str::to_owned))
        .collect::<Result<_, _>>()?;
    let request = |max_tokens: u32, extra: Value| {
        let mut b = chat_body(q, max_tokens);
        b["logprobs"] = json!(true);
        b["top_logprobs"] = json!(3);
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        b
    };
    let answer = |v: &Value| {
        (
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            v["choices"][0]["finish_reason"].clone(),
            v["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize,
        )
    };
    let eos = tok
        .token_str(*tok.stop_ids().first().unwrap_or(&0))?
        .to_owned();

    // the plain answer stops by itself; ignore_eos runs to max_tokens through the same start
    let v = srv
        .ok("/v1/chat/completions", &request(60, json!({})))
        .await?;
    assert_eq!(answer(&v), (text.clone(), json!("stop"), natural), "{v}");
    let long = (natural + 8) as u32;
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(long, json!({"ignore_eos": true})),
        )
        .await?;
    let (t, finish, n) = answer(&v);
    assert_eq!((&finish, n), (&json!("length"), natural + 8), "{v}");
    assert!(t.starts_with(&text), "{t:?}");
    // the completions route too
    let completion = |extra: Value| {
        let mut b = json!({"prompt": prompt, "max_tokens": long, "temperature": 0});
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        b
    };
    let v = srv
        .ok("/v1/completions", &completion(json!({"ignore_eos": true})))
        .await?;
    assert_eq!(v["usage"]["completion_tokens"], natural + 8, "{v}");
    let v = srv.ok("/v1/completions", &completion(json!({}))).await?;
    assert_eq!(v["usage"]["completion_tokens"], natural, "{v}");

    // stop_token_ids: the answer ends before the first generated token that is one of them
    let at = (1..natural)
        .find(|&i| plain[..i].iter().all(|t| t.token != plain[i].token))
        .ok_or_else(|| anyhow::anyhow!("no token new at its place"))?;
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(60, json!({"stop_token_ids": [plain[at].token]})),
        )
        .await?;
    let before: String = plain[..at]
        .iter()
        .map(|t| tok.token_str(t.token).map(str::to_owned))
        .collect::<Result<_, _>>()?;
    assert_eq!(answer(&v), (before, json!("stop"), at), "{v}");

    // min_tokens: the model's stop token is not chosen before it, though it is still reported
    // as the model's first choice where the plain answer ended
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(60, json!({"min_tokens": natural + 4})),
        )
        .await?;
    let (t, _, n) = answer(&v);
    assert!(n >= natural + 4 && t.starts_with(&text), "{v}");
    let top = &v["choices"][0]["logprobs"]["content"][natural]["top_logprobs"][0];
    assert_eq!(top["token"], json!(eos), "{v}");
    // ... and a stop string is looked for only after it
    let first_word = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(60, json!({"stop": [first_word]})),
        )
        .await?;
    assert_eq!(answer(&v).0, "", "{v}");
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(60, json!({"stop": [first_word], "min_tokens": 2})),
        )
        .await?;
    assert!(answer(&v).0.starts_with(&first_word), "{v}");

    // include_stop_str_in_output keeps the match
    let last_word = text
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .to_owned();
    let cut = text.rfind(&last_word).unwrap_or_default();
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(
                60,
                json!({"stop": [last_word], "include_stop_str_in_output": true}),
            ),
        )
        .await?;
    assert_eq!(answer(&v).0, text[..cut + last_word.len()], "{v}");
    let v = srv
        .ok(
            "/v1/chat/completions",
            &request(60, json!({"stop": [last_word]})),
        )
        .await?;
    assert_eq!(answer(&v).0, text[..cut], "{v}");

    // bad values: a 400 naming the parameter, on both routes
    for (extra, param) in [
        (json!({"min_tokens": 61}), "min_tokens"),
        (json!({"min_tokens": -1}), "min_tokens"),
        (json!({"min_tokens": 1.5}), "min_tokens"),
        (json!({"stop_token_ids": [49152]}), "stop_token_ids"),
        (json!({"stop_token_ids": [-1]}), "stop_token_ids"),
        (json!({"stop_token_ids": 2}), "stop_token_ids"),
        (json!({"ignore_eos": "yes"}), "ignore_eos"),
        (
            json!({"include_stop_str_in_output": 1}),
            "include_stop_str_in_output",
        ),
    ] {
        for (path, body) in [
            ("/v1/chat/completions", request(60, extra.clone())),
            ("/v1/completions", {
                let mut b = completion(extra.clone());
                b["max_tokens"] = json!(60);
                b
            }),
        ] {
            let (status, v) = srv.post(path, &body).await?;
            assert_eq!(
                (status, &v["error"]["param"]),
                (400, &json!(param)),
                "{path} {extra}: {v}"
            );
        }
    }
    Ok(())
}
