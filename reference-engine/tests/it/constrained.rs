//! Constrained decoding against the real test model: forced tool calls (`tool_choice`
//! `"required"` and named) and `response_format` outputs validate against their schemas by
//! two independent validators (the `jsonschema` crate, and Python's `jsonschema`); sampled
//! calls vary across seeds and repeat for one seed; streamed calls arrive name first and
//! arguments in pieces, and reassemble to the non-streamed call; logprobs are the model's
//! own; the `tool-corrupt` profile corrupts real constrained calls in each of its ways;
//! unsupported schema keywords get an OpenAI 400 naming them; `"auto"` stays free.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::server::TestServer;
use samewise_engine::GgufFile;
use samewise_engine::Tokenizer;
use samewise_engine::constrain::{self, Constraint, Spec, TokenTrie};
use samewise_engine::sample::SamplingParams;
use samewise_engine::{Engine, GenerateParams, LoadOptions};
use serde_json::{Value, json};

/// Tools like the tool-call suite's and BFCL's: flat, enums, nested objects, arrays of
/// objects, integers vs numbers, optional fields, anyOf with null.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city",
         "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
          "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "book_flight", "description": "Book a flight",
         "parameters": {"type": "object", "properties": {
            "from": {"type": "string", "minLength": 3, "maxLength": 3},
            "to": {"type": "string", "minLength": 3, "maxLength": 3},
            "passengers": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "seat": {"anyOf": [{"type": "string", "enum": ["aisle", "window"]}, {"type": "null"}]}},
              "required": ["name", "age", "seat"], "additionalProperties": false}},
            "budget": {"type": "number", "minimum": 0, "maximum": 5000},
            "options": {"type": "object", "properties": {
                "refundable": {"type": "boolean"}, "class": {"enum": ["economy", "business"]}},
              "required": ["refundable"], "additionalProperties": false}},
          "required": ["from", "to", "passengers", "options"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm",
         "parameters": {"$defs": {"time": {"type": "object", "properties": {
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                "minute": {"type": "integer", "minimum": 0, "maximum": 59}},
              "required": ["hour", "minute"], "additionalProperties": false}},
          "type": "object", "properties": {"at": {"$ref": "#/$defs/time"},
            "label": {"type": ["string", "null"], "maxLength": 16},
            "repeat": {"type": "array", "items": {"enum": ["mon", "tue", "wed", "thu", "fri"]}, "maxItems": 5}},
          "required": ["at", "label"], "additionalProperties": false}}}
    ])
}

/// A chat request offering `only` (a function name) or, with "", every tool.
fn chat(only: &str, tool_choice: Value, n: u32, temperature: f64, seed: u64) -> Value {
    let offered: Vec<Value> = tools()
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| only.is_empty() || t["function"]["name"] == only)
        .cloned()
        .collect();
    json!({
        "messages": [{"role": "user", "content": "Help me plan my trip to Oslo next week."}],
        "tools": offered, "tool_choice": tool_choice, "n": n, "temperature": temperature, "seed": seed,
        "max_tokens": 400, "parallel_tool_calls": false,
    })
}

fn named(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name}})
}

fn schema_of(name: &str) -> Option<Value> {
    tools()
        .as_array()?
        .iter()
        .find(|t| t["function"]["name"] == name)
        .map(|t| t["function"]["parameters"].clone())
}

/// Every call of a response: (choice finish reason, name, parsed arguments). The last call
/// of a choice cut by `max_tokens` (finish reason `length`, returned as it stood) is left out.
fn calls(v: &Value) -> anyhow::Result<Vec<(String, String, Value)>> {
    let mut out = Vec::new();
    for ch in v["choices"].as_array().into_iter().flatten() {
        let reason = ch["finish_reason"].as_str().unwrap_or_default().to_owned();
        let tcs = ch["message"]["tool_calls"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("no tool_calls: {ch}"))?;
        anyhow::ensure!(!tcs.is_empty(), "empty tool_calls: {ch}");
        let whole = if reason == "length" {
            tcs.len() - 1
        } else {
            tcs.len()
        };
        for c in &tcs[..whole] {
            let name = c["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let args: Value =
                serde_json::from_str(c["function"]["arguments"].as_str().unwrap_or_default())
                    .map_err(|e| anyhow::anyhow!("arguments are not JSON ({e}): {c}"))?;
            out.push((reason.clone(), name, args));
        }
    }
    Ok(out)
}

fn validate(name: &str, args: &Value) -> anyhow::Result<()> {
    let schema =
        schema_of(name).ok_or_else(|| anyhow::anyhow!("call of an undeclared function {name}"))?;
    let v = jsonschema::validator_for(&schema).map_err(|e| anyhow::anyhow!("{e}"))?;
    let errors: Vec<String> = v.iter_errors(args).map(|e| e.to_string()).collect();
    anyhow::ensure!(
        errors.is_empty(),
        "{name}({args}) violates its schema: {errors:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_calls_validate_by_two_validators_and_vary_across_seeds() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let mut seen: Vec<(String, Value)> = Vec::new();
    for name in ["get_weather", "book_flight", "set_alarm"] {
        let v = srv
            .ok("/v1/chat/completions", &chat(name, named(name), 2, 1.0, 7))
            .await?;
        for (reason, n, args) in calls(&v)? {
            assert_eq!(reason, "tool_calls", "{v}");
            assert_eq!(n, name, "a named tool_choice calls that function");
            validate(&n, &args)?;
            seen.push((n, args));
        }
    }
    // "required" with parallel calls: any declared function, one or more calls each
    let mut body = chat("", json!("required"), 2, 0.8, 3);
    body["parallel_tool_calls"] = json!(true);
    let v = srv.ok("/v1/chat/completions", &body).await?;
    let req = calls(&v)?;
    for (reason, n, args) in &req {
        assert!(reason == "tool_calls" || reason == "length", "{reason}");
        validate(n, args)?;
        seen.push((n.clone(), args.clone()));
    }
    let most = v["choices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["message"]["tool_calls"].as_array().map_or(0, Vec::len))
        .max();
    assert!(most > Some(1), "parallel calls never came: {v}");
    // without parallel calls, exactly one
    let v = srv
        .ok(
            "/v1/chat/completions",
            &chat("", json!("required"), 2, 0.8, 3),
        )
        .await?;
    for ch in v["choices"].as_array().into_iter().flatten() {
        assert_eq!(
            ch["message"]["tool_calls"].as_array().map(Vec::len),
            Some(1),
            "{ch}"
        );
    }
    // sampled calls vary across seeds: distinct arguments, and both enum values and the
    // optional fields' presence are not collapsed to one
    let v = srv
        .ok(
            "/v1/chat/completions",
            &chat("get_weather", named("get_weather"), 10, 1.0, 100),
        )
        .await?;
    let weather = calls(&v)?;
    let distinct: BTreeSet<String> = weather.iter().map(|c| c.2.to_string()).collect();
    assert!(
        distinct.len() >= 5,
        "10 seeds gave only {} distinct calls: {distinct:?}",
        distinct.len()
    );
    let units: BTreeSet<String> = weather
        .iter()
        .map(|c| c.2.get("unit").map_or("-".into(), Value::to_string))
        .collect();
    assert!(units.len() >= 2, "unit never varies: {units:?}");
    let days: BTreeSet<bool> = weather.iter().map(|c| c.2.get("days").is_some()).collect();
    assert_eq!(days.len(), 2, "optional `days` always or never present");
    seen.extend(weather.into_iter().map(|c| (c.1, c.2)));
    // one seed, same bytes (choice j samples with seed + j)
    let again = srv
        .ok(
            "/v1/chat/completions",
            &chat("get_weather", named("get_weather"), 2, 1.0, 100),
        )
        .await?;
    let args = |v: &Value, j: usize| {
        v["choices"][j]["message"]["tool_calls"][0]["function"]["arguments"].clone()
    };
    for j in 0..2 {
        assert_eq!(
            args(&v, j),
            args(&again, j),
            "same request and seed, different output"
        );
    }

    // the independent Python validator agrees on every call
    let cases: Vec<Value> = seen
        .iter()
        .map(|(n, a)| json!({"schema": schema_of(n), "instance": a}))
        .collect();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("calls.json");
    std::fs::write(&path, serde_json::to_vec(&cases)?)?;
    let out = std::process::Command::new("python3")
        .args(["-c", "import json,sys,jsonschema\nfor c in json.load(open(sys.argv[1])): jsonschema.validate(c['instance'], c['schema'])\nprint('ok')"])
        .arg(&path)
        .output()
        .map_err(|e| anyhow::anyhow!("python3 is needed (with jsonschema, scripts/requirements-fixtures.txt): {e}"))?;
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "Python jsonschema refused a call: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(seen.len() >= 18, "{} calls checked", seen.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_forced_calls_come_name_first_then_arguments_in_pieces() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let mut body = chat("", json!("required"), 1, 0.0, 1);
    body["logprobs"] = json!(true);
    let whole = srv.ok("/v1/chat/completions", &body).await?;
    let chunks = srv.stream("/v1/chat/completions", &body).await?;
    // reassemble by index, as clients (and the gateway) do
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut args: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut finish = None;
    let mut logprob_tokens = 0;
    for ch in &chunks {
        let c = &ch["choices"][0];
        logprob_tokens += c["logprobs"]["content"].as_array().map_or(0, Vec::len);
        if let Some(r) = c["finish_reason"].as_str() {
            finish = Some(r.to_owned());
        }
        for d in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap_or(u64::MAX);
            if let Some(n) = d["function"]["name"].as_str() {
                assert!(!names.contains_key(&i), "name sent twice for call {i}");
                assert!(d["id"].is_string() && d["type"] == "function", "{d}");
                names.insert(i, n.to_owned());
            } else {
                assert!(
                    names.contains_key(&i),
                    "arguments before the name of call {i}"
                );
            }
            let a = d["function"]["arguments"].as_str().unwrap_or_default();
            if !a.is_empty() {
                args.entry(i).or_default().push(a.to_owned());
            }
        }
    }
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let expected = whole["choices"][0]["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!expected.is_empty(), "{whole}");
    assert_eq!(names.len(), expected.len());
    for (i, e) in expected.iter().enumerate() {
        let i = i as u64;
        assert_eq!(
            names.get(&i).map(String::as_str),
            e["function"]["name"].as_str()
        );
        let pieces = args.get(&i).cloned().unwrap_or_default();
        assert!(
            pieces.len() >= 2,
            "arguments of call {i} came in one piece: {pieces:?}"
        );
        assert_eq!(
            Some(pieces.concat().as_str()),
            e["function"]["arguments"].as_str(),
            "streamed and whole calls differ"
        );
    }
    let whole_tokens = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(
        logprob_tokens, whole_tokens,
        "every token's logprob is streamed once"
    );
    assert_eq!(
        whole_tokens as u64,
        whole["usage"]["completion_tokens"].as_u64().unwrap_or(0)
    );
    // without logprobs, no chunk but the last is empty: each says something
    body["logprobs"] = json!(false);
    let chunks = srv.stream("/v1/chat/completions", &body).await?;
    if let Some((last, before)) = chunks.split_last() {
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{last}");
        for ch in before {
            let delta = &ch["choices"][0]["delta"];
            assert!(
                delta.as_object().is_some_and(|d| !d.is_empty()),
                "an empty chunk: {ch}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_constrains_content_and_auto_stays_free() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let schema = json!({"type": "object", "properties": {
        "answer": {"type": "string", "maxLength": 40}, "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "sources": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 2}},
        "required": ["answer", "confidence", "sources"], "additionalProperties": false});
    let body = |rf: Value| {
        json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
               "response_format": rf, "temperature": 0.7, "seed": 5, "n": 3, "max_tokens": 300})
    };
    let v = srv
        .ok("/v1/chat/completions", &body(json!({"type": "json_schema", "json_schema": {"name": "qa", "schema": schema, "strict": true}})))
        .await?;
    let validator = jsonschema::validator_for(&schema).map_err(|e| anyhow::anyhow!("{e}"))?;
    for ch in v["choices"].as_array().into_iter().flatten() {
        assert_eq!(ch["finish_reason"], "stop", "{ch}");
        let content: Value =
            serde_json::from_str(ch["message"]["content"].as_str().unwrap_or_default())?;
        assert!(validator.is_valid(&content), "{content}");
    }
    let v = srv
        .ok(
            "/v1/chat/completions",
            &body(json!({"type": "json_object"})),
        )
        .await?;
    for ch in v["choices"].as_array().into_iter().flatten() {
        let content: Value =
            serde_json::from_str(ch["message"]["content"].as_str().unwrap_or_default())?;
        assert!(content.is_object(), "{content}");
    }
    // "auto" (and no tool_choice) stay free: a greeting is not forced into a call
    for choice in [json!("auto"), Value::Null] {
        let mut b = json!({"messages": [{"role": "user", "content": "Say hello to me."}], "tools": tools(),
                           "temperature": 0, "max_tokens": 24});
        if !choice.is_null() {
            b["tool_choice"] = choice;
        }
        let v = srv.ok("/v1/chat/completions", &b).await?;
        assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");
        assert!(
            !v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .starts_with("<tool_call>"),
            "{v}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_constraints_get_openai_400s_naming_the_problem() -> anyhow::Result<()> {
    let srv = TestServer::start("reference").await?;
    let bad_tool = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}}}]);
    let cases = [
        (
            json!({"tools": bad_tool, "tool_choice": "required"}),
            "pattern",
            "tools",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 1}}}}),
            "minProperties",
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"oneOf": [{"type": "string"}]}}}}),
            "oneOf",
            "response_format",
        ),
        (
            json!({"tools": tools(), "tool_choice": named("nope")}),
            "nope",
            "tool_choice",
        ),
        (
            json!({"tool_choice": "required"}),
            "required",
            "tool_choice",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
            "response_format",
        ),
    ];
    for (extra, needle, param) in cases {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8});
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        let (status, v) = srv.post("/v1/chat/completions", &b).await?;
        assert_eq!(status, 400, "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{msg:?} should name {needle}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    Ok(())
}

/// Why a call is invalid against the declared tools, or None.
fn fault(call: &Value) -> Option<&'static str> {
    let name = call["function"]["name"].as_str().unwrap_or_default();
    let Some(schema) = schema_of(name) else {
        return Some("unknown_name");
    };
    let Ok(args) =
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap_or_default())
    else {
        return Some("invalid_json");
    };
    let v = jsonschema::validator_for(&schema).ok()?;
    (!v.is_valid(&args)).then_some("schema_mismatch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_corrupt_profile_corrupts_real_constrained_calls_every_way() -> anyhow::Result<()> {
    let srv = TestServer::start("tool-corrupt").await?;
    let mut body = chat("get_weather", named("get_weather"), 16, 0.7, 11);
    body["max_tokens"] = json!(120);
    let v = srv.ok("/v1/chat/completions", &body).await?;
    let mut kinds = BTreeSet::new();
    for ch in v["choices"].as_array().into_iter().flatten() {
        assert_eq!(ch["finish_reason"], "tool_calls", "{ch}");
        for c in ch["message"]["tool_calls"].as_array().into_iter().flatten() {
            let f = fault(c);
            assert!(
                f.is_some(),
                "a 100%-corrupting profile returned a valid call: {c}"
            );
            kinds.extend(f);
        }
    }
    assert_eq!(kinds.len(), 3, "every corruption class appears: {kinds:?}");
    // streamed: the whole (corrupted) call in one delta
    body["n"] = json!(1);
    let chunks = srv.stream("/v1/chat/completions", &body).await?;
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(deltas.len(), 1, "{deltas:?}");
    assert!(fault(deltas[0]).is_some(), "{}", deltas[0]);
    Ok(())
}

#[test]
fn constrained_logprobs_are_the_models_own_and_seeded_sampling_repeats() -> anyhow::Result<()> {
    let path = common::model_path()?;
    let engine = Engine::load(
        &path,
        LoadOptions {
            threads: 2,
            ..LoadOptions::default()
        },
    )?;
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path)?)?;
    let entries: Vec<(&[u8], bool)> = (0..tok.vocab_size() as u32)
        .map(|t| Ok((tok.token_bytes(t)?, tok.is_special(t))))
        .collect::<anyhow::Result<_>>()?;
    let stops: Vec<u32> = tok.stop_ids().iter().copied().collect();
    let trie = Arc::new(TokenTrie::new(&entries, &stops));
    let schema = schema_of("get_weather");
    let grammar =
        Arc::new(constrain::compile(&Spec::Json { schema }).map_err(|e| anyhow::anyhow!("{e:?}"))?);
    let c = Constraint { grammar, trie };
    let prompt = tok.encode("The weather today is", false)?;
    let params = GenerateParams {
        max_tokens: 60,
        top_logprobs: 5,
        stop_token_ids: stops.clone(),
        ..GenerateParams::default()
    };
    let g = engine.generate_constrained(&prompt, &params, Some(c.clone()), &mut |_| true)?;
    let text = tok.decode(&g.tokens.iter().map(|t| t.token).collect::<Vec<_>>(), true)?;
    let args: Value = serde_json::from_str(&text)?;
    validate("get_weather", &args)?;
    // the reported logprobs are the unconstrained model's: scoring the same tokens agrees
    let mut seq = prompt.clone();
    seq.extend(g.tokens.iter().map(|t| t.token));
    let scored = engine.score(&[seq], 5)?;
    let mut overridden = 0;
    for (i, t) in g.tokens.iter().enumerate() {
        let p = &scored[0].positions[prompt.len() + i];
        assert_eq!(p.logprob, Some(t.logprob), "token {i}");
        assert_eq!(p.top, t.top, "top logprobs of token {i}");
        if t.top
            .first()
            .is_some_and(|a| a.token != t.token && a.logprob > t.logprob)
        {
            overridden += 1;
        }
    }
    assert!(
        overridden > 0,
        "the constraint never overrode the model's choice, so this proves nothing"
    );
    // seeded sampling over the masked distribution repeats exactly and varies with the seed
    let sampled = |seed| -> anyhow::Result<Vec<u32>> {
        let p = GenerateParams {
            sampling: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                top_k: 0,
                seed: Some(seed),
                ..SamplingParams::default()
            },
            ..params.clone()
        };
        Ok(engine
            .generate_constrained(&prompt, &p, Some(c.clone()), &mut |_| true)?
            .tokens
            .iter()
            .map(|t| t.token)
            .collect())
    };
    assert_eq!(sampled(1)?, sampled(1)?);
    let outs: BTreeSet<Vec<u32>> = (1..5).map(sampled).collect::<anyhow::Result<_>>()?;
    assert!(outs.len() >= 3, "4 seeds gave {} outputs", outs.len());
    Ok(())
}

#[test]
fn non_canonical_tokenizations_of_a_valid_call_are_allowed() -> anyhow::Result<()> {
    let path = common::model_path()?;
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path)?)?;
    let entries: Vec<(&[u8], bool)> = (0..tok.vocab_size() as u32)
        .map(|t| Ok((tok.token_bytes(t)?, tok.is_special(t))))
        .collect::<anyhow::Result<_>>()?;
    let trie = Arc::new(TokenTrie::new(&entries, &[]));
    let grammar = Arc::new(
        constrain::compile(&Spec::Json {
            schema: schema_of("book_flight"),
        })
        .map_err(|e| anyhow::anyhow!("{e:?}"))?,
    );
    let text = r#"{"from":"OSL","to":"ROM","passengers":[{"name":"Ada Lovelace","age":36,"seat":null}],"options":{"refundable":true}}"#;
    let canonical = tok.encode(text, false)?;
    // single bytes: the least canonical tokenization there is
    let bytes: Vec<u32> = text
        .bytes()
        .map(|b| {
            (0..tok.vocab_size() as u32)
                .find(|&t| !tok.is_special(t) && tok.token_bytes(t).is_ok_and(|x| x == [b]))
        })
        .collect::<Option<_>>()
        .ok_or_else(|| anyhow::anyhow!("a byte has no token"))?;
    for ids in [canonical, bytes] {
        let mut m = constrain::Matcher::new(Constraint {
            grammar: Arc::clone(&grammar),
            trie: Arc::clone(&trie),
        });
        for &t in &ids {
            assert!(
                m.allowed().contains(t),
                "token {t} ({:?}) refused",
                tok.token_str(t)?
            );
            assert!(m.accept(t));
        }
        assert!(m.is_complete());
    }
    Ok(())
}
