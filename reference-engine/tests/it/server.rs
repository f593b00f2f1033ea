//! The engine's HTTP API over real loopback HTTP against the real test model: results equal
//! the library's, streaming equals non-streaming, concurrent equals sequential, and every
//! kind of bad input gets an OpenAI-shaped 4xx.

use crate::common;
use crate::common::server::{TestServer, chat_prompt, with_model};

use samewise_engine::GenerateParams;
use samewise_engine::sample::SamplingParams;
use serde_json::{Value, json};

const PROMPT: &str = "The capital of France is Paris. The capital of Italy is";

fn chat_body(content: &str, max_tokens: u32) -> Value {
    json!({"model": "smollm2", "messages": [{"role": "user", "content": content}],
           "temperature": 0, "max_tokens": max_tokens})
}

fn f32_of(v: &Value) -> Option<f32> {
    v.as_f64().map(|x| x as f32)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_logprobs_equal_the_library_score() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let ids = srv.state.tokenizer().encode(PROMPT, true)?;
    let want = srv
        .state
        .engine()
        .score(std::slice::from_ref(&ids), 5)?
        .remove(0);
    for prompt in [json!(PROMPT), json!(ids)] {
        let v = srv
            .ok(
                "/v1/completions",
                &json!({"prompt": prompt, "echo": true, "logprobs": 5, "max_tokens": 0}),
            )
            .await?;
        let choice = &v["choices"][0];
        assert_eq!(choice["text"], PROMPT);
        let lp = &choice["logprobs"];
        let got: Vec<Option<f32>> = lp["token_logprobs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(f32_of)
            .collect();
        let expect: Vec<Option<f32>> = want.positions.iter().map(|p| p.logprob).collect();
        assert_eq!(got, expect, "prompt logprobs differ from the library");
        assert!(
            lp["top_logprobs"][0].is_null(),
            "first position has no alternatives (vLLM's alignment)"
        );
        for (i, p) in want.positions.iter().enumerate().skip(1) {
            let top = lp["top_logprobs"][i]
                .as_object()
                .ok_or_else(|| anyhow::anyhow!("no top at {i}"))?;
            for alt in &p.top {
                let key = srv.state.tokenizer().token_str(alt.token)?;
                assert_eq!(
                    top.get(key).and_then(f32_of),
                    Some(alt.logprob),
                    "top entry {key:?} at {i}"
                );
            }
            assert_eq!(lp["tokens"][i], srv.state.tokenizer().token_str(p.token)?);
        }
        assert_eq!(v["usage"]["prompt_tokens"], ids.len());
        assert_eq!(v["usage"]["completion_tokens"], 0);
    }
    // the native score route agrees too
    let v = srv
        .ok("/v1/score", &json!({"tokens": ids, "top_k": 3}))
        .await?;
    let got: Vec<Option<f32>> = v["positions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| f32_of(&p["logprob"]))
        .collect();
    assert_eq!(
        got,
        want.positions.iter().map(|p| p.logprob).collect::<Vec<_>>()
    );
    assert_eq!(v["positions"][1]["top"].as_array().map(Vec::len), Some(3));
    srv.shutdown().await
}

/// Greedy generation through the library, decoded.
fn library_greedy(
    srv: &TestServer,
    prompt: &[u32],
    max_tokens: usize,
    top: usize,
) -> anyhow::Result<(String, Vec<f32>, String)> {
    let params = GenerateParams {
        sampling: SamplingParams::default(),
        max_tokens,
        stop_token_ids: srv.state.tokenizer().stop_ids().iter().copied().collect(),
        top_logprobs: top,
        ..GenerateParams::default()
    };
    let g = srv
        .state
        .engine()
        .generate(prompt, &params, &mut |_| true)?;
    let ids: Vec<u32> = g.tokens.iter().map(|t| t.token).collect();
    let reason = match g.finish.reason {
        samewise_engine::FinishReason::Length => "length",
        _ => "stop",
    };
    Ok((
        srv.state.tokenizer().decode(&ids, true)?,
        g.tokens.iter().map(|t| t.logprob).collect(),
        reason.into(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_chat_equals_library_generation() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let q = "What is the capital of France?";
    let mut body = chat_body(q, 24);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let v = srv.ok("/v1/chat/completions", &body).await?;
    let (text, logprobs, reason) = library_greedy(&srv, &chat_prompt(&srv.state, q)?, 24, 2)?;
    assert!(!text.is_empty());
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], text.as_str());
    assert_eq!(choice["finish_reason"], reason.as_str());
    let content = choice["logprobs"]["content"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no logprobs"))?;
    let got: Vec<Option<f32>> = content.iter().map(|c| f32_of(&c["logprob"])).collect();
    assert_eq!(got, logprobs.iter().map(|l| Some(*l)).collect::<Vec<_>>());
    assert!(content.iter().all(|c| c["top_logprobs"].as_array().map(Vec::len) == Some(2) && c["bytes"].is_array()));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "smollm2");
    assert_eq!(v["usage"]["completion_tokens"], logprobs.len());
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chunks_reassemble_to_the_unstreamed_answer() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let mut body = chat_body("Write a haiku about the sea.", 40);
    body["logprobs"] = json!(true);
    let full = srv.ok("/v1/chat/completions", &body).await?;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = srv.stream("/v1/chat/completions", &body).await?;
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        for ch in c["choices"].as_array().into_iter().flatten() {
            text.push_str(ch["delta"]["content"].as_str().unwrap_or_default());
            logprobs.extend(
                ch["logprobs"]["content"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
            if !ch["finish_reason"].is_null() {
                finish = Some(ch["finish_reason"].clone());
            }
        }
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(
        text,
        full["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
    );
    assert_eq!(
        Some(&logprobs),
        full["choices"][0]["logprobs"]["content"].as_array()
    );
    assert_eq!(finish.as_ref(), Some(&full["choices"][0]["finish_reason"]));
    let usage = chunks
        .last()
        .map(|c| c["usage"].clone())
        .unwrap_or_default();
    assert_eq!(usage, full["usage"], "the last chunk carries the usage");

    // completions streaming reassembles too, with and without the echo: the text and every
    // logprobs array (a chunk's text_offsets index the whole text, as unstreamed; they
    // restarted at 0 in every chunk)
    for echo in [false, true] {
        let cbody = json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                           "logprobs": 2, "echo": echo});
        let cfull = srv.ok("/v1/completions", &cbody).await?;
        let mut sbody = cbody.clone();
        sbody["stream"] = json!(true);
        let mut ctext = String::new();
        let mut lp =
            json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
        for c in srv.stream("/v1/completions", &sbody).await? {
            let choice = &c["choices"][0];
            ctext.push_str(choice["text"].as_str().unwrap_or_default());
            for field in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                if let (Some(all), Some(more)) = (
                    lp[field].as_array_mut(),
                    choice["logprobs"][field].as_array(),
                ) {
                    all.extend(more.iter().cloned());
                }
            }
        }
        let whole = &cfull["choices"][0];
        assert_eq!(ctext, whole["text"].as_str().unwrap_or_default());
        assert_eq!(lp, whole["logprobs"], "echo {echo}");
    }

    // n choices stream interleaved, each event as its choice has it (choice 1 does not wait
    // for choice 0 to finish), and each reassembles to its unstreamed answer
    let nbody = json!({"messages": [{"role": "user", "content": "Tell me a story."}],
                       "max_tokens": 24, "temperature": 1.0, "seed": 9, "n": 3});
    let nfull = srv.ok("/v1/chat/completions", &nbody).await?;
    let mut sbody = nbody.clone();
    sbody["stream"] = json!(true);
    let chunks = srv.stream("/v1/chat/completions", &sbody).await?;
    let mut texts = vec![String::new(); 3];
    let mut first_content = [None; 3];
    let mut finished = [None; 3];
    for (at, c) in chunks.iter().enumerate() {
        for ch in c["choices"].as_array().into_iter().flatten() {
            let i = ch["index"].as_u64().unwrap_or(99) as usize;
            anyhow::ensure!(i < 3, "index {i} in {c}");
            if let Some(t) = ch["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
                texts[i].push_str(t);
                first_content[i].get_or_insert(at);
            }
            if !ch["finish_reason"].is_null() {
                finished[i] = Some(at);
            }
        }
    }
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(
            Some(text.as_str()),
            nfull["choices"][i]["message"]["content"].as_str()
        );
    }
    assert!(
        first_content[1] < finished[0] && first_content[2] < finished[0],
        "choices 1 and 2 began at chunks {:?}, after choice 0 finished at {:?}",
        &first_content[1..],
        finished[0]
    );

    // streamed echo with max_tokens 0: the prompt (with its logprobs), then the end
    let ebody =
        json!({"prompt": PROMPT, "max_tokens": 0, "echo": true, "logprobs": 2, "stream": true});
    let chunks = srv.stream("/v1/completions", &ebody).await?;
    assert_eq!(chunks.len(), 2, "{chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["text"], PROMPT);
    assert!(chunks[0]["choices"][0]["logprobs"]["token_logprobs"][0].is_null());
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], "length");
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_seeds_and_n() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let base = srv
        .ok(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0}),
        )
        .await?;
    let text = base["choices"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // cut at a stop string that the greedy text contains after its first char
    let cut = text
        .char_indices()
        .nth(3)
        .map(|(i, _)| i)
        .ok_or_else(|| anyhow::anyhow!("short output {text:?}"))?;
    let stop: String = text[cut..].chars().take(2).collect();
    let stopped = srv
        .ok(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": [stop.clone()]}),
        )
        .await?;
    let first = text.find(&stop).unwrap_or(cut);
    assert_eq!(stopped["choices"][0]["text"], &text[..first]);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    let sampled = json!({"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 16,
                         "temperature": 1.0, "seed": 42, "n": 2});
    let a = srv.ok("/v1/chat/completions", &sampled).await?;
    let b = srv.ok("/v1/chat/completions", &sampled).await?;
    assert_eq!(
        a["choices"], b["choices"],
        "the same seed gives the same samples"
    );
    assert_eq!(a["choices"].as_array().map(Vec::len), Some(2));
    assert_ne!(
        a["choices"][0]["message"], a["choices"][1]["message"],
        "choices of n use different seeds"
    );
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_equal_sequential_ones() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let requests: Vec<(&str, Value)> = vec![
        (
            "/v1/completions",
            json!({"prompt": PROMPT, "echo": true, "logprobs": 3, "max_tokens": 0}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "def fib(n):", "max_tokens": 20, "temperature": 0, "logprobs": 2}),
        ),
        ("/v1/chat/completions", chat_body("Name three colors.", 20)),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 12, "seed": 7}),
        ),
        (
            "/v1/score",
            json!({"text": "The quick brown fox jumps over the lazy dog.", "top_k": 4}),
        ),
        (
            "/v1/chat/completions",
            chat_body("Count from one to five.", 16),
        ),
    ];
    let mut sequential = Vec::new();
    for (path, body) in &requests {
        sequential.push(strip_volatile(srv.ok(path, body).await?));
    }
    let futs = requests.iter().map(|(path, body)| srv.ok(path, body));
    let concurrent: Vec<Value> = futures_util::future::join_all(futs)
        .await
        .into_iter()
        .map(|r| r.map(strip_volatile))
        .collect::<Result<_, _>>()?;
    assert_eq!(sequential, concurrent);
    srv.shutdown().await
}

/// Drops the fields that differ between two identical requests (ids, timestamps).
fn strip_volatile(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("id");
        o.remove("created");
    }
    v
}

/// `parallel_tool_calls: false` with free tools (`tool_choice` auto): at most one call, the
/// first the model wrote, whole and streamed (as vLLM keeps it). Before, both calls came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_parallel_tool_calls_keeps_the_first_free_call() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    // two turns of two calls each: SmolLM2-135M answers the third with two calls
    let call = |id: &str, city: &str| {
        json!({"id": id, "type": "function",
               "function": {"name": "get_weather", "arguments": json!({"city": city}).to_string()}})
    };
    let two = |a: &str, b: &str| format!("What is the weather in {a} and in {b}?");
    let mut body = json!({
        "messages": [
            {"role": "user", "content": two("Oslo", "Rome")},
            {"role": "assistant", "content": null, "tool_calls": [call("c1", "Oslo"), call("c2", "Rome")]},
            {"role": "user", "content": two("Lima", "Cairo")},
            {"role": "assistant", "content": null, "tool_calls": [call("c3", "Lima"), call("c4", "Cairo")]},
            {"role": "user", "content": two("Paris", "Madrid")},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "temperature": 0, "max_tokens": 60,
    });
    let args = |calls: &Value| -> Vec<String> {
        calls
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                c["function"]["arguments"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    let v = srv.ok("/v1/chat/completions", &body).await?;
    let both = args(&v["choices"][0]["message"]["tool_calls"]);
    assert_eq!(both.len(), 2, "{v}");
    body["parallel_tool_calls"] = json!(false);
    let v = srv.ok("/v1/chat/completions", &body).await?;
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert_eq!(
        args(&v["choices"][0]["message"]["tool_calls"]),
        both[..1],
        "{v}"
    );
    // streamed: one call delta, the same call
    body["stream"] = json!(true);
    let chunks = srv.stream("/v1/chat/completions", &body).await?;
    let streamed: Vec<String> = chunks
        .iter()
        .flat_map(|c| args(&c["choices"][0]["delta"]["tool_calls"]))
        .collect();
    assert_eq!(streamed, both[..1], "{chunks:?}");
    // a value that is not a boolean is refused with free tools too (it was ignored)
    body["stream"] = json!(false);
    body["parallel_tool_calls"] = json!("no");
    let (status, e) = srv.post("/v1/chat/completions", &body).await?;
    assert_eq!(
        (status, &e["error"]["param"]),
        (400, &json!("parallel_tool_calls")),
        "{e}"
    );
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_come_back_in_openai_shape() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    // SmolLM2-135M follows the tools convention when the conversation shows it twice
    let call = |id: &str, city: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
        "function": {"name": "get_weather", "arguments": json!({"city": city}).to_string()}}]})
    };
    let body = json!({
        "messages": [
            {"role": "user", "content": "What is the weather in Oslo?"}, call("c1", "Oslo"),
            {"role": "user", "content": "What is the weather in Rome?"}, call("c2", "Rome"),
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "temperature": 0, "max_tokens": 40,
    });
    let v = srv.ok("/v1/chat/completions", &body).await?;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no tool_calls: {v}"))?;
    assert!(!calls.is_empty());
    for c in calls {
        assert_eq!(c["type"], "function");
        assert!(c["id"].as_str().is_some_and(|s| s.starts_with("call_")));
        assert_eq!(c["function"]["name"], "get_weather");
        let args = c["function"]["arguments"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("arguments not a string"))?;
        assert_eq!(
            serde_json::from_str::<Value>(args)?,
            json!({"city": "Paris"})
        );
    }
    // streamed, the same call arrives as a tool_calls delta
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let mut streamed_calls = Vec::new();
    let mut finish = None;
    for c in srv.stream("/v1/chat/completions", &sbody).await? {
        let ch = &c["choices"][0];
        streamed_calls.extend(
            ch["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        if !ch["finish_reason"].is_null() {
            finish = Some(ch["finish_reason"].clone());
        }
    }
    assert_eq!(finish, Some(json!("tool_calls")));
    assert_eq!(streamed_calls.len(), calls.len());
    assert_eq!(streamed_calls[0]["function"], calls[0]["function"]);
    // with tools on, an answer in words streams as it comes (not in one delta at the end),
    // and reassembles, logprobs included, to the unstreamed one
    let mut words = body.clone();
    words["messages"] = json!([{"role": "user", "content": "Tell me a joke about cats."}]);
    words["logprobs"] = json!(true);
    let whole = srv.ok("/v1/chat/completions", &words).await?;
    let want = &whole["choices"][0];
    assert!(want["message"]["tool_calls"].is_null(), "{whole}");
    words["stream"] = json!(true);
    let chunks = srv.stream("/v1/chat/completions", &words).await?;
    let (mut text, mut logprobs, mut pieces) = (String::new(), Vec::new(), 0);
    for c in &chunks {
        let ch = &c["choices"][0];
        if let Some(t) = ch["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
            text.push_str(t);
            pieces += 1;
        }
        logprobs.extend(
            ch["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
    }
    assert_eq!(Some(text.as_str()), want["message"]["content"].as_str());
    assert_eq!(Some(&logprobs), want["logprobs"]["content"].as_array());
    assert!(pieces >= 3, "{pieces} content deltas for {text:?}"); // one delta before
    // tool_choice "none" turns tools off: plain content
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let v = srv.ok("/v1/chat/completions", &none).await?;
    assert!(v["choices"][0]["message"]["tool_calls"].is_null());
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_openai_shaped_4xx() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let too_long: Vec<u32> = vec![28; 8193];
    // one request's work is bounded: at most 64 prompts, and at most 4 contexts' worth of
    // prompt tokens in all (40 prompts of 1000 tokens each fit one context apiece)
    let many_prompts = vec!["hi"; 65];
    let many_tokens = vec![vec![28u32; 1000]; 40];
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/completions", "{not json".into(), 400, Some("invalid_json")),
        ("/v1/chat/completions", "[1, 2]".into(), 400, Some("invalid_type")),
        ("/v1/completions", json!({"prompt": [1, 2, 99999999]}).to_string(), 400, Some("token_out_of_vocab")),
        ("/v1/completions", json!({"prompt": [49152]}).to_string(), 400, Some("token_out_of_vocab")),
        ("/v1/completions", json!({"prompt": too_long, "echo": true, "logprobs": 1, "max_tokens": 0}).to_string(), 400, Some("context_length_exceeded")),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 9000}).to_string(), 400, Some("context_length_exceeded")),
        ("/v1/completions", json!({"prompt": "hi", "echo": true, "logprobs": 21, "max_tokens": 0}).to_string(), 400, None),
        ("/v1/completions", json!({"prompt": []}).to_string(), 400, None),
        ("/v1/completions", json!({"prompt": many_prompts, "max_tokens": 0}).to_string(), 400, Some("too_many_prompts")),
        ("/v1/completions", json!({"prompt": many_tokens, "max_tokens": 0}).to_string(), 400, Some("too_many_tokens")),
        ("/v1/completions", json!({"prompt": "hi", "n": 0}).to_string(), 400, None),
        // what the engine cannot honour is refused, not ignored
        ("/v1/completions", json!({"prompt": "def f(", "suffix": "\n    return x"}).to_string(), 400, None),
        ("/v1/completions", json!({"prompt": "hi", "best_of": 3}).to_string(), 400, None),
        ("/v1/completions", json!({"prompt": "hi", "best_of": 0}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": []}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "temperature": 3}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "top_p": 0}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}).to_string(), 400, None),
        ("/v1/score", json!({"tokens": [1, 2], "text": "both"}).to_string(), 400, None),
        ("/v1/score", json!({"tokens": [1, 2], "top_k": 21}).to_string(), 400, None),
        ("/v1/score", json!({"tokens": []}).to_string(), 400, None),
        ("/v1/score", json!({"tokens": [1], "surprise": true}).to_string(), 400, Some("invalid_type")),
        ("/detokenize", json!({"tokens": [1, 4000000]}).to_string(), 400, Some("token_out_of_vocab")),
        ("/v1/nowhere", "{}".into(), 404, None),
        ("/v1/models", "{}".into(), 405, Some("method_not_allowed")),
    ];
    for (path, body, status, code) in cases {
        let body = match serde_json::from_str::<Value>(&body) {
            Ok(v @ Value::Object(_)) => with_model(&v).to_string(),
            _ => body,
        };
        let (got, _, v) = srv.post_raw(path, body.clone()).await?;
        assert_eq!(got, status, "{path} {body}: {v}");
        let err = &v["error"];
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{path} {body}: {v}"
        );
        assert!(err["type"].is_string(), "{v}");
        if let Some(code) = code {
            assert_eq!(err["code"], code, "{path} {body}: {v}");
        }
    }
    // JSON of the wrong shape: an `invalid_type` naming the field at fault, as OpenAI does
    let user = json!([{"role": "user", "content": "x"}]);
    let wrong_types = [
        (
            "/v1/chat/completions",
            json!({"messages": user, "temperature": "hot"}),
            "temperature",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": -1}),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": 7, "content": "x"}]}),
            "messages[0].role",
        ),
        ("/v1/completions", json!({"prompt": "hi", "n": "two"}), "n"),
        (
            "/v1/completions",
            json!({"prompt": "hi", "echo": 1}),
            "echo",
        ),
        ("/v1/score", json!({"tokens": [1, -2]}), "tokens[1]"),
        (
            "/v1/chat/completions",
            json!({"messages": user, "tools": [{"type": "custom", "custom": {"name": "run"}}]}),
            "tools[0]",
        ),
    ];
    for (path, body, param) in wrong_types {
        let (got, v) = srv.post(path, &body).await?;
        assert_eq!(got, 400, "{path} {body}: {v}");
        let err = &v["error"];
        assert_eq!(
            (err["code"].as_str(), err["param"].as_str()),
            (Some("invalid_type"), Some(param)),
            "{path} {body}: {v}"
        );
        let message = err["message"].as_str().unwrap_or_default();
        assert!(message.contains(param), "{message}");
    }
    // what the engine does not do is refused by name on both routes (it was answered as if
    // not asked: a beam search, guided decoding, a truncated prompt, a template of the
    // client's), and the defaults pass
    let on = |path: &str, field: &str, value: &Value| {
        let mut body = if path == "/v1/completions" {
            json!({"prompt": PROMPT})
        } else {
            json!({"messages": [{"role": "user", "content": "Hi"}]})
        };
        body["max_tokens"] = json!(2);
        body["temperature"] = json!(0);
        body[field] = value.clone();
        body
    };
    for path in ["/v1/completions", "/v1/chat/completions"] {
        for (field, default) in [
            ("suffix", json!("")),
            ("best_of", json!(1)),
            ("suffix", Value::Null),
            ("use_beam_search", json!(false)),
            ("length_penalty", json!(1.0)),
            ("bad_words", json!([])),
            ("guided_json", Value::Null),
        ] {
            let v = srv.ok(path, &on(path, field, &default)).await?;
            assert_eq!(
                v["choices"][0]["finish_reason"], "length",
                "{path} {field}: {v}"
            );
        }
        for (field, value) in [
            ("suffix", json!("x")),
            ("best_of", json!(2)),
            ("best_of", json!(0)),
            ("use_beam_search", json!(true)),
            ("length_penalty", json!(0.5)),
            ("prompt_logprobs", json!(1)),
            ("guided_json", json!({"type": "object"})),
            ("guided_regex", json!("[a-z]+")),
            ("guided_choice", json!(["yes", "no"])),
            ("guided_grammar", json!("root ::= \"x\"")),
            ("structured_outputs", json!({"choice": ["a"]})),
            ("truncate_prompt_tokens", json!(10)),
            ("allowed_token_ids", json!([1, 2])),
            ("bad_words", json!(["the"])),
            ("chat_template", json!("{{ messages }}")),
        ] {
            let (got, v) = srv.post(path, &on(path, field, &value)).await?;
            assert_eq!(
                (got, v["error"]["param"].as_str()),
                (400, Some(field)),
                "{path} {field}: {v}"
            );
            let message = v["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("not supported"), "{message}");
        }
    }
    // vLLM's chat `echo` (a completion's own `echo` is answered)
    let chat = "/v1/chat/completions";
    srv.ok(chat, &on(chat, "echo", &json!(false))).await?;
    let (got, v) = srv.post(chat, &on(chat, "echo", &json!(true))).await?;
    assert_eq!(
        (got, v["error"]["param"].as_str()),
        (400, Some("echo")),
        "{v}"
    );
    // stream_options on a request that does not stream (it was ignored: no usage chunk came)
    for path in ["/v1/completions", chat] {
        for stream in [Value::Null, json!(false)] {
            let mut body = on(path, "stream_options", &json!({"include_usage": true}));
            body["stream"] = stream;
            let (got, v) = srv.post(path, &body).await?;
            let param = v["error"]["param"].as_str();
            assert_eq!((got, param), (400, Some("stream_options")), "{path}: {v}");
        }
        srv.ok(path, &on(path, "stream_options", &Value::Null))
            .await?;
    }
    // the server is still healthy after all that
    assert_eq!(srv.get("/healthz").await?.0, 200);
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_does_not_hang_the_server() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let body = json!({"messages": [{"role": "user", "content": "Write a long essay."}], "max_tokens": 2000,
                      "temperature": 0, "stream": true});
    let mut resp = srv
        .client
        .post(format!("{}/v1/chat/completions", srv.base))
        .header("content-type", "application/json")
        .body(with_model(&body).to_string())
        .send()
        .await?;
    let first = resp.chunk().await?;
    assert!(first.is_some());
    drop(resp);
    // the generation is cancelled; later requests are served promptly
    let v = srv
        .ok(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}),
        )
        .await?;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hf_directory_serves_the_same_answers_as_the_gguf() -> anyhow::Result<()> {
    // tokenizer.json + tokenizer_config.json (template, bos/eos) instead of GGUF metadata
    let gguf = TestServer::start("reference").await?;
    let hf = TestServer::start_on(&common::hf_fixture_dir()?).await?;
    let chat = json!({"messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Name a large city in Japan."}],
                      "temperature": 0, "max_tokens": 16, "logprobs": true, "top_logprobs": 3});
    let a = strip_volatile(gguf.ok("/v1/chat/completions", &chat).await?);
    let b = strip_volatile(hf.ok("/v1/chat/completions", &chat).await?);
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(a["usage"], b["usage"]);
    let echo = json!({"prompt": PROMPT, "echo": true, "logprobs": 5, "max_tokens": 0});
    let a = gguf.ok("/v1/completions", &echo).await?;
    let b = hf.ok("/v1/completions", &echo).await?;
    assert_eq!(a["choices"], b["choices"]);
    gguf.shutdown().await?;
    hf.shutdown().await
}
