//! The serving profiles' behavioural faults, observed from outside over real loopback HTTP
//! against the real test model: each knob does what it says (truncation, tool-call
//! corruption checked with a real JSON-schema validator, shifted echo logprobs, refused and
//! capped logprobs, the repeat bug, template variants, injected errors at their rates and
//! replayed, cut streams, added latency, a hidden context behind the name), compared with the
//! plain engine where it matters.

use crate::common::server::{TestServer, f64s};

use std::time::{Duration, Instant};

use samewise_engine::Profile;
use serde_json::{Value, json};

/// A long prompt whose answer sits at its very start.
fn needle_prompt() -> String {
    let mut s = String::from("The secret code is 7391. Remember it well.\n\n");
    let topics = [
        "rivers",
        "mountains",
        "bread",
        "trains",
        "clocks",
        "bees",
        "glass",
        "maps",
        "salt",
        "violins",
    ];
    for i in 0..40 {
        let t = topics[i % topics.len()];
        s.push_str(&format!("Paragraph {i}: people have written about {t} for a long time, and the {t} of each region differ. "));
    }
    s.push_str("\n\nQuestion: what is the secret code? Answer: the secret code is");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncating_profile_loses_the_start_of_long_prompts() -> anyhow::Result<()> {
    let plain = TestServer::start("reference").await?;
    let cut = TestServer::start("truncate-512").await?;
    let prompt = needle_prompt();
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0});
    let a = plain.ok("/v1/completions", &body).await?;
    let b = cut.ok("/v1/completions", &body).await?;
    let full = a["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(full > 600, "the prompt should be long: {full} tokens");
    assert_eq!(
        b["usage"]["prompt_tokens"], 512,
        "usage reports the kept count: {b}"
    );
    assert_ne!(
        a["choices"][0]["text"], b["choices"][0]["text"],
        "truncation must change the answer"
    );
    // echo shows what was kept: the end of the prompt, without the code at its start
    let e = cut
        .ok(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 0}),
        )
        .await?;
    let kept = e["choices"][0]["text"].as_str().unwrap_or_default();
    assert!(
        prompt.ends_with(kept) && !kept.contains("7391"),
        "kept text: {kept:?}"
    );
    assert_eq!(
        e["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .map(Vec::len),
        Some(512)
    );
    // chat prompts are truncated the same way, silently
    let chat = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "temperature": 0});
    let c = cut.ok("/v1/chat/completions", &chat).await?;
    assert_eq!(c["usage"]["prompt_tokens"], 512);
    let p = plain.ok("/v1/chat/completions", &chat).await?;
    assert!(p["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 512);
    // short prompts are untouched
    let short = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    assert_eq!(
        plain.ok("/v1/completions", &short).await?["choices"],
        cut.ok("/v1/completions", &short).await?["choices"]
    );
    plain.shutdown().await?;
    cut.shutdown().await
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                           "additionalProperties": false}}}])
}

/// A conversation after which SmolLM2-135M calls `get_weather` (it follows the tools
/// convention when the history shows it twice).
fn tool_chat(n: u32) -> Value {
    let call = |id: &str, city: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
        "function": {"name": "get_weather", "arguments": json!({"city": city}).to_string()}}]})
    };
    json!({
        "messages": [
            {"role": "user", "content": "What is the weather in Oslo?"}, call("c1", "Oslo"),
            {"role": "user", "content": "What is the weather in Rome?"}, call("c2", "Rome"),
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        "tools": weather_tools(), "temperature": 0, "max_tokens": 40, "n": n,
    })
}

/// Why a tool call is invalid against the declared tools, or None if it is valid.
fn tool_call_fault(call: &Value, tools: &Value) -> anyhow::Result<Option<&'static str>> {
    let name = call["function"]["name"].as_str().unwrap_or_default();
    let Some(tool) = tools
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["function"]["name"] == name)
    else {
        return Ok(Some("unknown function"));
    };
    let Ok(args) =
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap_or_default())
    else {
        return Ok(Some("invalid json"));
    };
    let validator = jsonschema::validator_for(&tool["function"]["parameters"])
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((!validator.is_valid(&args)).then_some("schema violation"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupting_profile_tool_calls_all_fail_validation() -> anyhow::Result<()> {
    let tools = weather_tools();
    // control: the plain engine's calls are valid
    let plain = TestServer::start("reference").await?;
    let v = plain.ok("/v1/chat/completions", &tool_chat(1)).await?;
    let calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !calls.is_empty(),
        "the plain engine should call the tool: {v}"
    );
    for c in &calls {
        assert_eq!(tool_call_fault(c, &tools)?, None, "{c}");
    }
    plain.shutdown().await?;

    let bad = TestServer::start("tool-corrupt").await?;
    let v = bad.ok("/v1/chat/completions", &tool_chat(8)).await?;
    let mut kinds = std::collections::BTreeSet::new();
    let mut n = 0;
    for choice in v["choices"].as_array().into_iter().flatten() {
        assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
        for c in choice["message"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let fault = tool_call_fault(c, &tools)?;
            assert!(
                fault.is_some(),
                "a 100%-corrupting profile returned a valid call: {c}"
            );
            kinds.extend(fault);
            n += 1;
        }
    }
    assert!(n >= 8, "every choice calls the tool: {v}");
    assert!(kinds.len() >= 2, "corruptions vary: {kinds:?}");
    // streamed calls are corrupted too
    let mut streamed = 0;
    for chunk in bad.stream("/v1/chat/completions", &tool_chat(1)).await? {
        for c in chunk["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert!(tool_call_fault(c, &tools)?.is_some(), "{c}");
            streamed += 1;
        }
    }
    assert!(streamed >= 1);
    bad.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shifted_echo_logprobs_are_the_plain_ones_shifted_by_one() -> anyhow::Result<()> {
    let plain = TestServer::start("reference").await?;
    let shifted = TestServer::start("shifted-echo").await?;
    let body = json!({"prompt": "def add(a, b):\n    return a + b\n\nprint(add(2, 3))", "echo": true, "logprobs": 2, "max_tokens": 0});
    let a = plain.ok("/v1/completions", &body).await?;
    let b = shifted.ok("/v1/completions", &body).await?;
    let (la, lb) = (&a["choices"][0]["logprobs"], &b["choices"][0]["logprobs"]);
    assert_eq!(la["tokens"], lb["tokens"], "tokens stay in place");
    let (pa, pb) = (f64s(&la["token_logprobs"]), f64s(&lb["token_logprobs"]));
    let n = pa.len();
    assert!(n > 10 && pb.len() == n);
    assert_eq!(pa[0], None);
    assert_eq!(
        &pb[..n - 1],
        &pa[1..],
        "entry i holds the logprob of token i+1"
    );
    assert_eq!(pb[n - 1], None);
    assert_ne!(pa, pb);
    // generation itself is unaffected
    let generate = json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 1});
    assert_eq!(
        plain.ok("/v1/completions", &generate).await?["choices"],
        shifted.ok("/v1/completions", &generate).await?["choices"]
    );
    plain.shutdown().await?;
    shifted.shutdown().await
}

/// `noisy-echo` (`api.echo_jitter` = 0.01 nats): the same echo request answered twice keeps
/// its tokens and changes its logprobs, each off the plain engine's by a draw of about the
/// configured sd and mean 0; a token's logprob is its entry among the alternatives; a fresh
/// server replays the same numbers (seeded by arrival); generation is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noisy_echo_answers_identical_requests_with_seeded_noise() -> anyhow::Result<()> {
    let plain = TestServer::start("reference").await?;
    let noisy = TestServer::start("noisy-echo").await?;
    let text = "The river runs past the old mill, where the miller kept his accounts in a \
                book bound in red leather. Every autumn the farmers brought their grain, and \
                every spring the ledger showed who still owed him a sack or two. He counted them \
                aloud: one, two, three, four, five, six, seven, eight, nine, ten.";
    let body = json!({"prompt": text, "echo": true, "logprobs": 3, "max_tokens": 0});
    let p = plain.ok("/v1/completions", &body).await?;
    let a = noisy.ok("/v1/completions", &body).await?;
    let b = noisy.ok("/v1/completions", &body).await?;
    let lp = |v: &Value| v["choices"][0]["logprobs"].clone();
    assert_eq!(lp(&p)["tokens"], lp(&a)["tokens"]);
    assert_eq!(lp(&a)["tokens"], lp(&b)["tokens"]);
    let (pp, pa, pb) = (
        f64s(&lp(&p)["token_logprobs"]),
        f64s(&lp(&a)["token_logprobs"]),
        f64s(&lp(&b)["token_logprobs"]),
    );
    assert_ne!(pa, pb, "identical requests, identical numbers");
    // off the plain engine's: on unlikely tokens (renormalizing barely moves them) mean about
    // 0, sd about 0.01; a likely token (p > 0.74) moves a fraction of that, as renormalizing
    // logit noise leaves it; no logprob above 0
    let pairs: Vec<(f64, f64)> = pp
        .iter()
        .zip(&pa)
        .filter_map(|(x, y)| Some((*x.as_ref()?, *y.as_ref()?)))
        .collect();
    let d: Vec<f64> = pairs
        .iter()
        .filter(|(x, _)| *x < -1.0)
        .map(|(x, y)| y - x)
        .collect();
    let n = d.len() as f64;
    assert!(n >= 15.0, "{n} positions");
    let mean = d.iter().sum::<f64>() / n;
    let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    assert!((0.005..0.015).contains(&sd), "sd {sd} over {n}");
    assert!(mean.abs() < 4.0 * 0.01 / n.sqrt(), "mean {mean} over {n}");
    assert!(pairs.iter().all(|(_, y)| *y <= 0.0));
    let moved = |keep: &dyn Fn(f64) -> bool| {
        let d: Vec<f64> = pairs
            .iter()
            .filter(|(x, _)| keep(*x))
            .map(|(x, y)| (y - x).abs())
            .collect();
        (d.iter().sum::<f64>() / d.len().max(1) as f64, d.len())
    };
    let ((likely, n_likely), (unlikely, _)) = (moved(&|x| x > -0.3), moved(&|x| x < -1.0));
    assert!(n_likely >= 3, "{n_likely} likely tokens in the text");
    assert!(
        likely < 0.5 * unlikely,
        "likely tokens moved {likely}, unlikely {unlikely}"
    );
    // the token's own logprob is its entry among the alternatives, when it is one
    let tokens = lp(&a)["tokens"].as_array().cloned().unwrap_or_default();
    let tops = lp(&a)["top_logprobs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut listed = 0;
    for (i, top) in tops.iter().enumerate().skip(1) {
        let own = tokens[i]
            .as_str()
            .and_then(|t| top.get(t))
            .and_then(Value::as_f64);
        if let Some(own) = own {
            assert_eq!(Some(own), pa[i], "position {i}");
            listed += 1;
        }
    }
    assert!(listed > 10, "{listed} tokens among their alternatives");
    noisy.shutdown().await?;
    let replay = TestServer::start("noisy-echo").await?;
    assert_eq!(
        replay.ok("/v1/completions", &body).await?["choices"],
        a["choices"],
        "a fresh server's first answer"
    );
    let generate = json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 1});
    assert_eq!(
        plain.ok("/v1/completions", &generate).await?["choices"],
        replay.ok("/v1/completions", &generate).await?["choices"]
    );
    plain.shutdown().await?;
    replay.shutdown().await
}

/// The `substitute` profile serves these weights behind a hidden context: its echo has the
/// plain echo's tokens, an unscored first position and the same usage, and every other
/// logprob is bit for bit what the plain engine gives the prompt's tokens after the context's;
/// the context takes its tokens off the served window, and no answer, `/v1/score` or
/// generation included, shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn substitute_profile_hides_its_context_everywhere_but_in_the_numbers() -> anyhow::Result<()>
{
    let plain = TestServer::start("reference").await?;
    let sub = TestServer::start("substitute").await?;
    let prompt = "The river rose through the night, and by morning the old mill was an island.";
    let body = json!({"prompt": prompt, "echo": true, "logprobs": 3, "max_tokens": 0});
    let a = plain.ok("/v1/completions", &body).await?;
    let b = sub.ok("/v1/completions", &body).await?;
    let (la, lb) = (&a["choices"][0]["logprobs"], &b["choices"][0]["logprobs"]);
    assert_eq!(la["tokens"], lb["tokens"]);
    assert_eq!(a["usage"], b["usage"], "the context is not counted");
    assert_eq!(b["choices"][0]["text"], prompt, "nor echoed");
    let (pa, pb) = (f64s(&la["token_logprobs"]), f64s(&lb["token_logprobs"]));
    assert!(pa.len() > 10 && pb.len() == pa.len());
    assert_eq!((pa[0], pb[0]), (None, None));
    assert_eq!(lb["top_logprobs"][0], Value::Null);
    assert!(
        pa.iter().zip(&pb).skip(1).all(|(x, y)| x != y),
        "{pa:?} {pb:?}"
    );

    // exactly the plain engine on the context's tokens followed by the prompt's
    let ids = |v: &Value| -> Vec<u64> {
        v["tokens"]
            .as_array()
            .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_u64).collect())
    };
    let context = ids(&plain
        .ok(
            "/tokenize",
            &json!({"prompt": samewise_engine::profile::SUBSTITUTE_CONTEXT}),
        )
        .await?);
    let own = ids(&plain.ok("/tokenize", &json!({"prompt": prompt})).await?);
    assert!(context.len() > 20 && own.len() == pa.len());
    let joined: Vec<u64> = context.iter().chain(&own).copied().collect();
    let c = plain
        .ok(
            "/v1/completions",
            &json!({"prompt": joined, "echo": true, "logprobs": 3, "max_tokens": 0}),
        )
        .await?;
    let lc = &c["choices"][0]["logprobs"];
    let pc = f64s(&lc["token_logprobs"]);
    assert_eq!(&pc[context.len() + 1..], &pb[1..]);
    assert_eq!(
        lc["top_logprobs"]
            .as_array()
            .map(|t| t[context.len() + 1..].to_vec()),
        lb["top_logprobs"].as_array().map(|t| t[1..].to_vec())
    );
    // /v1/score hides it the same way
    let score = json!({"text": prompt, "top_k": 2});
    let sb = sub.ok("/v1/score", &score).await?;
    assert_eq!(sb["tokens"], json!(own));
    assert_eq!(sb["positions"][0]["logprob"], Value::Null);
    assert_eq!(
        sb["positions"][1]["logprob"].as_f64(),
        pc[context.len() + 1]
    );

    // the window served is what the context leaves
    let window = |v: &Value| v["data"][0]["max_model_len"].as_u64().unwrap_or(0);
    let (wa, wb) = (
        window(&plain.get_ok("/v1/models").await?),
        window(&sub.get_ok("/v1/models").await?),
    );
    assert_eq!(wa - wb, context.len() as u64);
    let too_long = json!({"prompt": vec![17u32; wb as usize], "max_tokens": 1});
    let (status, e) = sub.post("/v1/completions", &too_long).await?;
    assert_eq!(status, 400, "{e}");

    // generation runs behind the context too: the same greedy text as the plain engine's
    // continuation of context + prompt, and usage without the context
    let gen_body = |p: Value| json!({"prompt": p, "max_tokens": 8, "temperature": 0});
    let g = sub.ok("/v1/completions", &gen_body(json!(prompt))).await?;
    let gc = plain
        .ok("/v1/completions", &gen_body(json!(joined)))
        .await?;
    assert_eq!(g["choices"][0]["text"], gc["choices"][0]["text"]);
    assert_eq!(g["usage"]["prompt_tokens"], json!(own.len()));
    plain.shutdown().await?;
    sub.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_logprobs_and_no_echo_profiles_answer_an_openai_400_and_caps_apply() -> anyhow::Result<()>
{
    let srv = TestServer::start("no-logprobs").await?;
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0, "logprobs": true});
    let (status, v) = srv.post("/v1/chat/completions", &chat).await?;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["param"], "logprobs");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("logprobs"))
    );
    let (status, v) = srv
        .post(
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 3, "logprobs": 1}),
        )
        .await?;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "logprobs");
    // without logprobs the same requests are served
    let mut plain_chat = chat.clone();
    plain_chat["logprobs"] = json!(false);
    srv.ok("/v1/chat/completions", &plain_chat).await?;
    srv.ok("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 3}))
        .await?;
    srv.shutdown().await?;

    // a chat-only provider: echo refused, chat logprobs and plain completions served
    let srv = TestServer::start("no-echo").await?;
    let echo = json!({"prompt": "Hi there", "max_tokens": 0, "echo": true, "logprobs": 1});
    let (status, v) = srv.post("/v1/completions", &echo).await?;
    assert_eq!(status, 400, "{v}");
    assert_eq!(
        (v["error"]["type"].as_str(), v["error"]["param"].as_str()),
        (Some("invalid_request_error"), Some("echo"))
    );
    let v = srv.ok("/v1/chat/completions", &chat).await?;
    assert!(v["choices"][0]["logprobs"]["content"].is_array(), "{v}");
    srv.ok(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3, "logprobs": 1}),
    )
    .await?;
    srv.shutdown().await?;

    // top_logprobs capped silently
    let capped = TestServer::toml("name = \"cap-2\"\n[api]\nmax_top_logprobs = 2\n").await?;
    let mut c = chat.clone();
    c["top_logprobs"] = json!(5);
    let v = capped.ok("/v1/chat/completions", &c).await?;
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!content.is_empty());
    for t in &content {
        assert_eq!(t["top_logprobs"].as_array().map(Vec::len), Some(2), "{t}");
    }
    let v = capped
        .ok(
            "/v1/completions",
            &json!({"prompt": "Hi there", "max_tokens": 3, "logprobs": 5, "temperature": 0}),
        )
        .await?;
    for top in v["choices"][0]["logprobs"]["top_logprobs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        // the two alternatives, plus the actual token when it is not among them
        assert!(
            top.as_object().is_some_and(|m| (2..=3).contains(&m.len())),
            "{top}"
        );
    }
    capped.shutdown().await
}

/// Generated token strings of a completion with `logprobs`.
fn completion_tokens(v: &Value) -> Vec<String> {
    v["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// Index from which every token equals the last one.
fn repeat_start(tokens: &[String]) -> usize {
    let Some(last) = tokens.last() else { return 0 };
    tokens.iter().rposition(|t| t != last).map_or(0, |i| i + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_bug_repeats_one_token_until_max_tokens() -> anyhow::Result<()> {
    let plain = TestServer::start("reference").await?;
    let bug = TestServer::start("repeat-bug").await?;
    let max = 40;
    let body = json!({"prompt": "Once upon a time, in a small village,", "max_tokens": max, "temperature": 0, "logprobs": 0});
    let a = plain.ok("/v1/completions", &body).await?;
    let b = bug.ok("/v1/completions", &body).await?;
    let (ta, tb) = (completion_tokens(&a), completion_tokens(&b));
    assert_eq!(tb.len(), max, "{b}");
    assert_eq!(b["usage"]["completion_tokens"], max);
    assert_eq!(b["choices"][0]["finish_reason"], "length");
    let start = repeat_start(&tb);
    assert!(start < 16, "the repeat starts early: at {start} of {tb:?}");
    assert!(max - start >= 24, "one token repeated to the end: {tb:?}");
    assert_eq!(
        tb[..=start],
        ta[..=start],
        "tokens before the repeat are the engine's"
    );
    assert_ne!(ta, tb);

    // streamed chat: the same shape
    let chat = json!({"messages": [{"role": "user", "content": "Tell me a story about a dragon."}], "max_tokens": max,
                      "temperature": 0, "logprobs": true});
    let mut tokens = Vec::new();
    let mut finish = None;
    for c in bug.stream("/v1/chat/completions", &chat).await? {
        for t in c["choices"][0]["logprobs"]["content"]
            .as_array()
            .into_iter()
            .flatten()
        {
            tokens.push(t["token"].as_str().unwrap_or_default().to_owned());
        }
        if !c["choices"][0]["finish_reason"].is_null() {
            finish = Some(c["choices"][0]["finish_reason"].clone());
        }
    }
    assert_eq!(tokens.len(), max);
    assert_eq!(finish, Some(json!("length")));
    assert!(max - repeat_start(&tokens) >= 24, "{tokens:?}");
    plain.shutdown().await?;
    bug.shutdown().await
}

/// `/tokenize` of chat messages.
async fn tok(srv: &TestServer, messages: Value) -> anyhow::Result<Value> {
    Ok(srv.ok("/tokenize", &json!({"messages": messages})).await?["tokens"].clone())
}

/// The rendered prompt of chat messages, through `/tokenize` and `/detokenize`.
async fn text_of(srv: &TestServer, messages: Value) -> anyhow::Result<String> {
    let ids = tok(srv, messages).await?;
    let v = srv.ok("/detokenize", &json!({"tokens": ids})).await?;
    Ok(v["prompt"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_variants_change_the_rendered_prompt_and_the_answer() -> anyhow::Result<()> {
    let plain = TestServer::start("reference").await?;
    let drop = TestServer::start("drop-system").await?;
    let system = json!({"role": "system", "content": "Your name is Zorblax. Begin every answer with 'Zorblax says:' and speak like a pirate."});
    let user = json!({"role": "user", "content": "What is your name?"});
    let with_sys = tok(&plain, json!([system, user])).await?;
    let without = tok(&plain, json!([user])).await?;
    let dropped = tok(&drop, json!([system, user])).await?;
    assert_ne!(with_sys, without);
    assert_eq!(
        dropped, without,
        "the system message is dropped before rendering"
    );
    let chat = json!({"messages": [system, user], "max_tokens": 24, "temperature": 0});
    let a = plain.ok("/v1/chat/completions", &chat).await?;
    let b = drop.ok("/v1/chat/completions", &chat).await?;
    assert_eq!(
        a["usage"]["prompt_tokens"].as_u64(),
        with_sys.as_array().map(|t| t.len() as u64)
    );
    assert_eq!(
        b["usage"]["prompt_tokens"].as_u64(),
        without.as_array().map(|t| t.len() as u64)
    );
    assert_ne!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
    plain.shutdown().await?;
    drop.shutdown().await?;

    // a different default system prompt, and wrong role tags, seen through /detokenize
    let pirate = TestServer::toml(
        "[chat_template]\nvariant = \"default_system\"\nsystem_prompt = \"You are a pirate.\"\n",
    )
    .await?;
    assert!(
        text_of(&pirate, json!([user]))
            .await?
            .contains("You are a pirate.")
    );
    assert!(
        text_of(&pirate, json!([system, user]))
            .await?
            .contains("Zorblax")
    );
    let models = pirate.get_ok("/v1/models").await?;
    assert_eq!(
        models["data"][0]["profile"], "reference",
        "an unnamed TOML profile keeps the default name"
    );
    pirate.shutdown().await?;
    let roles =
        TestServer::toml("name = \"roles\"\n[chat_template]\nvariant = \"wrong_role_tags\"\n")
            .await?;
    let text = text_of(&roles, json!([user])).await?;
    assert!(
        text.contains("human\nWhat is your name?") && !text.contains("user\nWhat"),
        "{text:?}"
    );
    roles.shutdown().await
}

/// Statuses of `n` small completion requests sent one after the other (`max_tokens: 0`:
/// served without computing anything, so the test measures the faults, not the model).
async fn statuses(srv: &TestServer, n: usize) -> anyhow::Result<Vec<u16>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (status, headers, v) = srv
            .post_raw(
                "/v1/completions",
                json!({"model": "smollm2", "prompt": format!("Count: {i}"), "max_tokens": 0})
                    .to_string(),
            )
            .await?;
        match status {
            200 => {}
            500 => assert_eq!(v["error"]["type"], "server_error", "{v}"),
            429 => {
                assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
                let retry = headers
                    .get("retry-after")
                    .and_then(|h| h.to_str().ok())
                    .and_then(|s| s.parse::<u64>().ok());
                assert!(retry.is_some_and(|s| s >= 1), "429 without Retry-After");
            }
            other => anyhow::bail!("unexpected status {other}: {v}"),
        }
        out.push(status);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_profile_errors_at_its_rates_and_replays() -> anyhow::Result<()> {
    let profile = Profile::resolve("flaky")?;
    let rates = profile
        .errors
        .clone()
        .ok_or_else(|| anyhow::anyhow!("flaky has no errors section"))?;
    let n = 200;
    let srv = TestServer::with_profile(profile.clone()).await?;
    let first = statuses(&srv, n).await?;
    srv.shutdown().await?;
    let rate = |code: u16| first.iter().filter(|&&s| s == code).count() as f64 / n as f64;
    assert!(
        (rate(500) - rates.rate_500).abs() < 0.05,
        "500 rate {} vs {}",
        rate(500),
        rates.rate_500
    );
    assert!(
        (rate(429) - rates.rate_429).abs() < 0.05,
        "429 rate {} vs {}",
        rate(429),
        rates.rate_429
    );
    // a fresh server with the same profile answers the same sequence the same way
    let again = TestServer::with_profile(profile.clone()).await?;
    assert_eq!(statuses(&again, n).await?, first);
    again.shutdown().await?;
    // another seed, another sequence
    let reseeded = TestServer::with_profile(Profile { seed: 1, ..profile }).await?;
    assert_ne!(statuses(&reseeded, 50).await?, first[..50]);
    reseeded.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnecting_profile_cuts_streams() -> anyhow::Result<()> {
    let srv = TestServer::toml("name = \"cutter\"\n[errors]\ndisconnect_rate = 1.0\n").await?;
    let chat = json!({"messages": [{"role": "user", "content": "Write a long story about the sea."}], "max_tokens": 60, "temperature": 0});
    for _ in 0..3 {
        let (events, dropped) = srv.events("/v1/chat/completions", &chat).await?;
        assert!(dropped, "the connection should drop mid-stream: {events:?}");
        assert!(
            !events.is_empty() && events.len() <= 8,
            "{} events before the cut",
            events.len()
        );
        assert!(!events.iter().any(|e| e == "[DONE]"));
    }
    // unstreamed answers are whole, and the server is fine
    let v = srv.ok("/v1/chat/completions", &chat).await?;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_profile_delays_the_first_byte() -> anyhow::Result<()> {
    let median = 400u64;
    let srv = TestServer::toml(&format!(
        "name = \"slow\"\n[latency]\nmedian_ms = {median}\n"
    ))
    .await?;
    let body = json!({"prompt": "Hi", "max_tokens": 1, "temperature": 0});
    srv.ok("/v1/completions", &body).await?;
    for _ in 0..2 {
        let t0 = Instant::now();
        srv.ok("/v1/completions", &body).await?;
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(median),
            "answered in {took:?}, under the {median} ms added"
        );
    }
    // streams wait too: the first event comes after the delay
    let t0 = Instant::now();
    let (events, _) = srv.events("/v1/completions", &body).await?;
    assert!(!events.is_empty() && t0.elapsed() >= Duration::from_millis(median));
    srv.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numeric_knobs_of_a_served_profile_reach_the_engine() -> anyhow::Result<()> {
    let plain = TestServer::start("reference").await?;
    let w4 = TestServer::toml(
        "name = \"w4-flaky-api\"\n[weights]\nbits = 4\n[api]\nmax_top_logprobs = 1\n",
    )
    .await?;
    let body = json!({"prompt": "The quick brown fox jumps over the lazy dog.", "echo": true,
                      "logprobs": 3, "max_tokens": 0});
    let a = plain.ok("/v1/completions", &body).await?;
    let b = w4.ok("/v1/completions", &body).await?;
    let (la, lb) = (&a["choices"][0]["logprobs"], &b["choices"][0]["logprobs"]);
    assert_eq!(la["tokens"], lb["tokens"]);
    let (pa, pb) = (f64s(&la["token_logprobs"]), f64s(&lb["token_logprobs"]));
    assert_eq!(pa.len(), pb.len());
    let drift: f64 = pa
        .iter()
        .zip(&pb)
        .filter_map(|(x, y)| Some((x.as_ref()? - y.as_ref()?).abs()))
        .sum();
    assert!(drift > 0.0, "4-bit weights must change the logprobs");
    // the behavioural knob of the same profile applies too (cap 1: one alternative, plus
    // the actual token when it is not it)
    for top in lb["top_logprobs"].as_array().into_iter().flatten().skip(1) {
        assert!(
            top.as_object().is_some_and(|m| (1..=2).contains(&m.len())),
            "{top}"
        );
    }
    let models = w4.get_ok("/v1/models").await?;
    assert_eq!(models["data"][0]["profile"], "w4-flaky-api");
    plain.shutdown().await?;
    w4.shutdown().await
}
