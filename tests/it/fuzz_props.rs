//! The properties of the fuzz targets `request_body`, `gguf`, `safetensors`, `chat_template`,
//! `config`, `profile` (issue 14, item 4) and `json_schema`, one function per target. This one
//! file is both a module of this test binary (the corpus replay, `fuzz_corpus.rs`) and the
//! library of the fuzz crate (`fuzz/Cargo.toml`'s `[lib]`, whose targets panic on an `Err`), so
//! libFuzzer and CI check exactly the same thing. Each function takes one input's raw bytes and
//! returns `Err(what broke)`; a panic inside is a finding too.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use samewise_engine::chat::{ChatTemplate, template_from_gguf};
use samewise_engine::{GgufFile, HfDir, ModelConfig, Profile, Tokenizer};
use samewise_proxy::config::MAX_DURATION_MS;
use samewise_proxy::{ClientRequest, Config, Route};
use serde_json::Value;
use serde_json::value::RawValue;

/// The model id a rewritten body must carry: quotes, a non-ASCII letter and a slash, so the
/// rewrite has to escape it.
const UPSTREAM_MODEL: &str = "up/model \"é\\";

/// The request-body rewriter (`samewise_proxy::ClientRequest`), on both routes. A body the
/// check accepts is rewritten into a JSON object that keeps every field the caller sent byte
/// for byte, except `model` (now the upstream's), `provider` (removed) and, on a stream,
/// `stream_options` (its other keys kept, `include_usage` true); and rewriting is idempotent:
/// the rewritten body passes the check again and rewrites to the same bytes.
pub fn request_body(data: &[u8]) -> Result<(), String> {
    for route in [Route::Chat, Route::Completions] {
        let Ok(req) = ClientRequest::parse(route, data) else {
            continue;
        };
        let body = req
            .body_for(UPSTREAM_MODEL)
            .map_err(|e| format!("{route:?}: an accepted body was not rewritten: {e:?}"))?;
        let sent: BTreeMap<String, Box<RawValue>> =
            serde_json::from_slice(data).map_err(|e| format!("accepted, not an object: {e}"))?;
        let out: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(&body)
            .map_err(|e| format!("{route:?}: the rewritten body is not a JSON object: {e}"))?;
        let model = out
            .get("model")
            .map(|m| serde_json::from_str::<String>(m.get()));
        if !matches!(&model, Some(Ok(m)) if m == UPSTREAM_MODEL) {
            return Err(format!("{route:?}: `model` is {model:?}"));
        }
        if out.contains_key("provider") {
            return Err(format!("{route:?}: `provider` went upstream"));
        }
        for (k, v) in &sent {
            match k.as_str() {
                "model" | "provider" => {}
                "stream_options" if req.stream => {}
                _ if out.get(k).map(|o| o.get()) != Some(v.get()) => {
                    return Err(format!("{route:?}: field {k:?} changed or lost"));
                }
                _ => {}
            }
        }
        for k in out.keys() {
            if !(sent.contains_key(k) || k == "model" || (k == "stream_options" && req.stream)) {
                return Err(format!("{route:?}: field {k:?} appeared"));
            }
        }
        if req.stream {
            let (sent_opts, out_opts) = (sent.get("stream_options"), out.get("stream_options"));
            stream_options_kept(sent_opts.map(|b| &**b), out_opts.map(|b| &**b))
                .map_err(|e| format!("{route:?}: {e}"))?;
        }
        let again = ClientRequest::parse(route, &body)
            .map_err(|e| format!("{route:?}: the rewritten body is refused: {e:?}"))?;
        let twice = again
            .body_for(UPSTREAM_MODEL)
            .map_err(|e| format!("{route:?}: the second rewrite failed: {e:?}"))?;
        if twice != body || again.stream != req.stream || again.prompt_chars != req.prompt_chars {
            return Err(format!("{route:?}: rewriting is not idempotent"));
        }
    }
    Ok(())
}

/// On a stream, the rewritten `stream_options` holds `include_usage: true` and every other key
/// the caller sent in it, unchanged.
fn stream_options_kept(sent: Option<&RawValue>, out: Option<&RawValue>) -> Result<(), String> {
    let out: BTreeMap<String, Box<RawValue>> = out
        .map(|o| serde_json::from_str(o.get()))
        .transpose()
        .map_err(|e| format!("stream_options upstream is not an object: {e}"))?
        .ok_or("a stream went upstream without stream_options")?;
    if out.get("include_usage").map(|v| v.get()) != Some("true") {
        return Err("include_usage is not true upstream".into());
    }
    let sent: BTreeMap<String, Box<RawValue>> = match sent.map(|s| s.get()) {
        None | Some("null") => BTreeMap::new(),
        Some(s) => serde_json::from_str(s).map_err(|e| format!("stream_options sent: {e}"))?,
    };
    for (k, v) in &sent {
        if k != "include_usage" && out.get(k).map(|o| o.get()) != Some(v.get()) {
            return Err(format!("stream_options.{k} changed or lost"));
        }
    }
    Ok(())
}

/// The GGUF reader (`GgufFile::from_bytes`) and what reads its metadata (the model config, the
/// tokenizer, the chat template). A file it accepts has every tensor's bytes inside the file and
/// findable by name, and nothing built from it panics; a tokenizer it yields encodes to ids
/// inside its vocabulary.
pub fn gguf(data: &[u8]) -> Result<(), String> {
    let Ok(g) = GgufFile::from_bytes(data) else {
        return Ok(());
    };
    for t in &g.tensors {
        if g.tensor_bytes(t).len() != t.size {
            return Err(format!(
                "tensor {}: {} bytes, not {}",
                t.name,
                g.tensor_bytes(t).len(),
                t.size
            ));
        }
        if g.tensor(&t.name).map(|i| i.offset) != Some(t.offset) {
            return Err(format!("tensor {} is not found by its name", t.name));
        }
        let _ = t.n_elements();
    }
    for k in g.metadata.keys() {
        let _ = (
            g.get_str(k),
            g.get_u32(k),
            g.get_usize(k),
            g.get_f32(k),
            g.get_bool(k),
        );
        let _ = g.get_str_array(k);
    }
    let _ = ModelConfig::from_gguf(&g);
    if let Ok(tok) = Tokenizer::from_gguf(&g)
        && let Ok(ids) = tok.encode("Hello, world! 123 \u{e9}\u{4e16} <|im_end|>", true)
    {
        if let Some(id) = ids.iter().find(|&&id| id as usize >= tok.vocab_size()) {
            return Err(format!(
                "encoded id {id} past the vocabulary ({})",
                tok.vocab_size()
            ));
        }
        let _ = tok.decode(&ids, false);
        let mut d = tok.detokenizer(true);
        for &id in &ids {
            let _ = d.push(id);
        }
        let _ = d.finish();
    }
    if let Some(src) = template_from_gguf(&g) {
        // compiled only: a template is code the model file brings, rendering it is the model's
        // business (and `chat_template` renders real ones)
        let _ = ChatTemplate::new(&src, "<s>", "</s>");
    }
    Ok(())
}

/// `config.json` of the tiny Llama fixture, the configuration every `safetensors` input is read
/// with.
const TINY_LLAMA_CONFIG: &[u8] =
    include_bytes!("../../reference-engine/tests/fixtures/tiny/llama3/config.json");

/// The safetensors reader (`HfDir::from_bytes`). A file it accepts has every tensor's data inside
/// the file; each tensor reads whole as f32 with as many values as its shape says, or is refused
/// with an error (an unsupported dtype).
pub fn safetensors(data: &[u8]) -> Result<(), String> {
    let Ok(h) = HfDir::from_bytes(TINY_LLAMA_CONFIG, data) else {
        return Ok(());
    };
    for name in h.names() {
        let shape = h
            .shape(name)
            .map_err(|e| format!("{name}: listed, no shape: {e}"))?;
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if let Ok(values) = h.tensor_f32(name)
            && Some(values.len()) != n
        {
            return Err(format!(
                "{name}: {} values for shape {shape:?}",
                values.len()
            ));
        }
    }
    Ok(())
}

/// The engine's three fixture templates (`chat_template_cases.json`: the test model's, a
/// Qwen-style one with tools, one using Python string methods), compiled once.
fn templates() -> &'static [(String, ChatTemplate)] {
    static T: OnceLock<Vec<(String, ChatTemplate)>> = OnceLock::new();
    T.get_or_init(|| {
        let cases: Value = serde_json::from_str(include_str!(
            "../../reference-engine/tests/fixtures/chat_template_cases.json"
        ))
        .unwrap_or_default();
        let bos = cases["bos_token"].as_str().unwrap_or_default();
        let eos = cases["eos_token"].as_str().unwrap_or_default();
        let mut out = Vec::new();
        for (name, src) in cases["templates"].as_object().into_iter().flatten() {
            if let Some(t) = src
                .as_str()
                .and_then(|s| ChatTemplate::new(s, bos, eos).ok())
            {
                out.push((name.clone(), t));
            }
        }
        out
    })
}

/// The chat-template renderer (`ChatTemplate::render`) over client-shaped input: a JSON document
/// `{"messages": [...], "tools": [...], "add_generation_prompt": bool, "extra": {...}}`, as a
/// chat request brings them, rendered with each fixture template. Nothing panics (a refusal is an
/// error), and the test model's template keeps every user message's text in the prompt.
pub fn chat_template(data: &[u8]) -> Result<(), String> {
    let templates = templates();
    if templates.len() != 3 {
        return Err(format!(
            "{} of the 3 fixture templates compiled",
            templates.len()
        ));
    }
    let Ok(doc) = serde_json::from_slice::<Value>(data) else {
        return Ok(());
    };
    let Some(messages) = doc["messages"].as_array() else {
        return Ok(());
    };
    let tools = doc["tools"].as_array().map(Vec::as_slice);
    let add_generation_prompt = doc["add_generation_prompt"].as_bool().unwrap_or(true);
    let extra = doc["extra"].as_object();
    for (name, t) in templates {
        let out = t.render(messages, tools, add_generation_prompt, extra);
        if let (Ok(text), "smollm2") = (&out, name.as_str()) {
            for (i, m) in messages.iter().enumerate() {
                if m["role"] == "user"
                    && let Some(content) = m["content"].as_str()
                    && !text.contains(content)
                {
                    return Err(format!(
                        "smollm2: messages[{i}]'s text is not in the prompt"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The gateway's TOML configuration (`Config::from_toml_str`). A configuration it accepts has
/// every endpoint naming a configured provider and every duration within `MAX_DURATION_MS` (so
/// `Instant + Duration` cannot overflow), and reads the same twice.
pub fn config(data: &[u8]) -> Result<(), String> {
    let Ok(text) = std::str::from_utf8(data) else {
        return Ok(());
    };
    let Ok(c) = Config::from_toml_str(text) else {
        return Ok(());
    };
    for (name, m) in &c.models {
        for e in &m.endpoints {
            if !c.providers.contains_key(&e.provider) {
                return Err(format!(
                    "model {name}: unknown provider {:?} accepted",
                    e.provider
                ));
            }
        }
    }
    let max = Duration::from_millis(MAX_DURATION_MS);
    let now = Instant::now();
    let mut durations = vec![
        ("server.alert_poll", c.server.alert_poll),
        ("server.drain_timeout", c.server.drain_timeout),
        ("limits.backoff_base", c.limits.backoff_base),
        ("limits.backoff_max", c.limits.backoff_max),
        ("limits.retry_after_max", c.limits.retry_after_max),
        ("limits.key_cache_ttl", c.limits.key_cache_ttl),
        ("limits.key_stale_grace", c.limits.key_stale_grace),
        ("breaker.window", c.breaker.window),
        ("breaker.cooldown", c.breaker.cooldown),
    ];
    for p in c.providers.values() {
        durations.push(("connect_timeout", p.connect_timeout));
        durations.push(("first_byte_timeout", p.first_byte_timeout));
        durations.push(("first_byte_floor", p.first_byte_floor));
        durations.push(("idle_timeout", p.idle_timeout));
    }
    for m in c.models.values() {
        durations.extend(m.hedge_after.map(|d| ("hedge_after", d)));
    }
    for (key, d) in durations {
        if d > max || now.checked_add(d).is_none() {
            return Err(format!("{key} = {d:?} accepted, past {max:?}"));
        }
    }
    let again = Config::from_toml_str(text).map_err(|e| format!("accepted once only: {e}"))?;
    if again.summary() != c.summary() {
        return Err("the same text read twice differs".into());
    }
    Ok(())
}

/// The serving-profile loader (`Profile::from_toml`). A profile it accepts validates, and its
/// serialized form reads back to the same profile (a profile is plain data: nothing accepted is
/// lost or changed on the way round, NaN included).
pub fn profile(data: &[u8]) -> Result<(), String> {
    let Ok(text) = std::str::from_utf8(data) else {
        return Ok(());
    };
    let Ok(p) = Profile::from_toml(text, "fuzz") else {
        return Ok(());
    };
    p.validate()
        .map_err(|e| format!("accepted, then invalid: {e}"))?;
    let v = serde_json::to_value(&p)
        .map_err(|e| format!("an accepted profile is not writable: {e}"))?;
    let again: Profile =
        serde_json::from_value(v).map_err(|e| format!("written back, refused: {e}"))?;
    if again != p {
        return Err(format!(
            "round trip changed the profile: {p:?} -> {again:?}"
        ));
    }
    Ok(())
}

/// Longest text [`json_schema`] writes through a grammar (each refused byte scans all 256).
const MAX_WALK: usize = 4096;

/// Constrained decoding (`samewise_engine::constrain`) under a client's JSON Schema: the input
/// is a schema (the first JSON value) and then bytes that steer a walk through the grammar
/// compiled from it, as `response_format` and as a tool's parameters. Compiling never panics;
/// each byte is taken when the grammar allows it, and a refused byte picks one of the allowed
/// bytes or the end instead, so every walk stays inside the grammar; a state that can neither
/// continue nor end is a dead end, an error (the engine would have no token to sample). A
/// finished walk is JSON, and an instance of the schema by an independent validator (the
/// `jsonschema` crate, as the gateway's tool-call checks build it) whenever that compiles it;
/// as a tool call, it is the engine's call format around such arguments.
pub fn json_schema(data: &[u8]) -> Result<(), String> {
    use samewise_engine::constrain::{CALL_MID, CALL_PREFIX, CALL_SUFFIX, Spec, compile};
    let Some((schema, walk)) = schema_and_walk(data) else {
        return Ok(());
    };
    let validator = samewise_toolcheck::schema::compile(&schema).ok();
    let specs = [
        (
            "response_format",
            Spec::Json {
                schema: Some(schema.clone()),
            },
        ),
        (
            "tool parameters",
            Spec::Tools {
                functions: vec![("f".into(), Some(schema.clone()))],
                parallel: false,
            },
        ),
    ];
    for (as_what, spec) in specs {
        let Ok(grammar) = compile(&spec) else {
            continue;
        };
        let Some(text) = walk_grammar(&grammar, walk).map_err(|e| format!("{as_what}: {e}"))?
        else {
            continue;
        };
        let shown = String::from_utf8_lossy(&text).into_owned();
        let json = match spec {
            Spec::Json { .. } => &text[..],
            Spec::Tools { .. } => {
                let head = format!("{CALL_PREFIX}f{CALL_MID}");
                text.strip_prefix(head.as_bytes())
                    .and_then(|t| t.strip_suffix(CALL_SUFFIX.as_bytes()))
                    .ok_or_else(|| format!("{as_what}: not a call of `f`: {shown:?}"))?
            }
        };
        let value: Value = serde_json::from_slice(json)
            .map_err(|e| format!("{as_what}: the grammar finished non-JSON {shown:?}: {e}"))?;
        if let Some(v) = &validator
            && !v.is_valid(&value)
        {
            return Err(format!(
                "{as_what}: the grammar finished {shown:?}, which the schema refuses"
            ));
        }
    }
    Ok(())
}

/// A `json_schema` input split into its schema (the first JSON value) and the steering bytes
/// after it; None when it does not start with JSON.
pub fn schema_and_walk(data: &[u8]) -> Option<(Value, &[u8])> {
    let mut values = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
    let schema = values.next()?.ok()?;
    Some((schema, &data[values.byte_offset()..]))
}

/// The text a walk steered by `walk` writes through `grammar`, None when the steering bytes
/// (at most [`MAX_WALK`]) run out before it ends; an error at a dead end.
fn walk_grammar(
    grammar: &samewise_engine::constrain::Grammar,
    walk: &[u8],
) -> Result<Option<Vec<u8>>, String> {
    let mut state = grammar.start();
    let mut text = Vec::new();
    for &b in walk.iter().take(MAX_WALK) {
        let mut next = state.clone();
        if next.advance(grammar, b) {
            state = next;
            text.push(b);
            continue;
        }
        let allowed: Vec<u8> = (0..=255u8)
            .filter(|&c| {
                let mut s = state.clone();
                s.advance(grammar, c)
            })
            .collect();
        let can_end = state.can_finish(grammar);
        if allowed.is_empty() && !can_end {
            return Err(format!(
                "dead end after {:?}: no byte allowed and the text cannot end",
                String::from_utf8_lossy(&text)
            ));
        }
        match allowed.get(usize::from(b) % (allowed.len() + usize::from(can_end))) {
            Some(&c) => {
                state.advance(grammar, c);
                text.push(c);
            }
            None => return Ok(Some(text)),
        }
    }
    Ok(state.can_finish(grammar).then_some(text))
}
