//! The client's request body, checked and rewritten for one upstream without retyping it.
//!
//! The body is read as an object of raw JSON values (`serde_json`'s `RawValue`, borrowed): the
//! request keeps the client's bytes and where each top-level field lies in them, so a value
//! passes upstream as the very bytes the client sent, copied once. Only three things
//! change on the way upstream: `model` becomes the provider's model id, the `provider` routing
//! object is removed, and a stream gets `stream_options.include_usage = true` (so the gateway
//! can record usage; the extra usage chunk is stripped again when the client did not ask for
//! it). Fields samewise does not know — `logprobs`, `top_logprobs`, `n`, `tools`, `seed`,
//! provider-specific ones — pass through byte for byte.
//!
//! JSON Schemas the client sends (`tools[].function.parameters`,
//! `response_format.json_schema.schema`) are bounded here, before anything compiles them
//! (`samewise_toolcheck::schema`: nesting depth, values per request; past either, a 400
//! naming the field), and the declared tools are compiled once per request into a shared
//! `ToolSet`, whatever the number of attempts.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use indexmap::IndexMap;
use samewise_toolcheck::ToolSet;
use samewise_toolcheck::schema::{self, MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES};
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::routing::{ProviderPrefs, stable_hash};

mod prompt;
use prompt::check_prompt;
mod tools;
use tools::Compiled;
pub use tools::ToolsCache;

/// A JSON object as raw values borrowed from the body, in the order they were sent (a key sent
/// twice keeps its first place and its last value, as serde_json's maps do).
type RawMap<'a> = IndexMap<Cow<'a, str>, &'a RawValue, foldhash::fast::RandomState>;

/// Text of the rewritten body: bytes of the client's body, or samewise's own.
#[derive(Debug, Clone)]
enum Piece {
    /// `body[range]`.
    Sent(Range<usize>),
    /// Text samewise wrote (a key that had escapes, decoded; a patched value).
    Own(String),
}

impl Piece {
    fn bytes<'a>(&'a self, body: &'a [u8]) -> &'a [u8] {
        match self {
            Piece::Sent(r) => body.get(r.clone()).unwrap_or_default(),
            Piece::Own(s) => s.as_bytes(),
        }
    }
}

/// A top-level field of the body: its key (unquoted) and its value (raw JSON).
#[derive(Debug, Clone)]
struct Field {
    /// The key's text, unquoted: as sent when it had no escapes, else decoded.
    key: Piece,
    value: Piece,
}

/// Which OpenAI route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl Route {
    /// The label used in records.
    pub fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
        }
    }

    /// The path appended to a provider's base URL.
    pub fn upstream_path(self) -> &'static str {
        match self {
            Route::Chat => "/chat/completions",
            Route::Completions => "/completions",
        }
    }
}

/// A checked request body, ready to be rewritten per endpoint.
#[derive(Debug)]
pub struct ClientRequest {
    /// The route.
    pub route: Route,
    /// The logical model asked for.
    pub model: String,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The client did not ask for usage in the stream: strip the usage-only chunk.
    pub strip_usage_chunk: bool,
    /// Routing preferences from the `provider` object.
    pub prefs: ProviderPrefs,
    /// The declared tools, compiled once for every attempt's tool-call checks.
    pub tools: Option<Arc<ToolSet>>,
    /// Hash of the leading prompt bytes, the cache-affinity key when no session id is sent.
    pub prefix_hash: u64,
    /// Characters of prompt text, for counting tokens when the upstream reports no usage.
    pub prompt_chars: usize,
    /// The body as the client sent it.
    body: Bytes,
    /// Every field as sent, with `provider` removed and `stream_options` patched.
    fields: Vec<Field>,
}

/// Bytes of the serialised prompt that make up the cache-affinity prefix.
const AFFINITY_PREFIX_BYTES: usize = 2048;

impl ClientRequest {
    /// Checks a body for `route`; bad input becomes a 400 that names the field.
    pub fn parse(route: Route, body: &[u8]) -> Result<ClientRequest, ApiError> {
        Self::parse_bytes(route, Bytes::copy_from_slice(body))
    }

    /// [`ClientRequest::parse`], keeping `body` itself (no copy).
    pub fn parse_bytes(route: Route, body: Bytes) -> Result<ClientRequest, ApiError> {
        Self::parse_cached(route, body, None)
    }

    /// [`ClientRequest::parse_bytes`], taking the compiled `tools` from `tools_cache` when the
    /// same bytes were compiled before, and keeping them there when not (the gateway's path:
    /// one cache for all its requests). The result is the same with or without the cache.
    pub fn parse_cached(
        route: Route,
        body: Bytes,
        tools_cache: Option<&ToolsCache>,
    ) -> Result<ClientRequest, ApiError> {
        let mut fields = serde_json::from_slice::<Object<RawMap<'_>>>(&body)
            .map(|o| o.0)
            .map_err(|e| {
                if e.is_data() {
                    ApiError::bad_request(
                        "invalid_request",
                        "the request body must be a JSON object",
                        None,
                    )
                } else {
                    ApiError::bad_request(
                        "invalid_json",
                        format!("the request body is not valid JSON: {e}"),
                        None,
                    )
                }
            })?;

        let model = match fields.get("model") {
            None => {
                return Err(ApiError::bad_request(
                    "missing_field",
                    "you must provide a `model`",
                    Some("model"),
                ));
            }
            Some(raw) => serde_json::from_str::<String>(raw.get()).map_err(|_| {
                ApiError::bad_request("invalid_type", "`model` must be a string", Some("model"))
            })?,
        };

        let stream = match fields.get("stream") {
            None => false,
            Some(raw) if raw.get() == "null" => false,
            Some(raw) => serde_json::from_str::<bool>(raw.get()).map_err(|_| {
                ApiError::bad_request("invalid_type", "`stream` must be a boolean", Some("stream"))
            })?,
        };

        let (prompt_key, prompt_raw) = match route {
            Route::Chat => ("messages", fields.get("messages")),
            Route::Completions => ("prompt", fields.get("prompt")),
        };
        let Some(prompt_raw) = prompt_raw else {
            return Err(ApiError::bad_request(
                "missing_field",
                format!("you must provide `{prompt_key}`"),
                Some(prompt_key),
            ));
        };
        let prompt_chars = check_prompt(route, prompt_raw).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_type",
                format!("`{prompt_key}` is not valid"),
                Some(prompt_key),
            )
        })??;
        let prefix = prompt_raw.get().as_bytes();
        let prefix_hash = stable_hash(&prefix[..prefix.len().min(AFFINITY_PREFIX_BYTES)], 0);

        check_types(&fields)?;

        let tools_raw = fields.get("tools").map(|b| &**b);
        let raw_tools = tools_raw.map(|raw| raw.get().as_bytes());
        let held = tools_cache.zip(raw_tools).and_then(|(c, raw)| c.get(raw));
        let Compiled {
            set: tools,
            budget_left,
        } = match held {
            Some(c) => c,
            None => {
                let compiled = compile_tools(tools_raw)?;
                if let Some((c, raw)) = tools_cache.zip(raw_tools) {
                    c.put(raw, compiled.clone());
                }
                compiled
            }
        };
        check_response_format(fields.get("response_format").map(|b| &**b), budget_left)?;

        let prefs = match fields.shift_remove("provider") {
            None => ProviderPrefs::default(),
            Some(raw) => serde_json::from_str(raw.get()).map_err(|e| {
                ApiError::bad_request(
                    "invalid_provider",
                    format!("the `provider` object is not valid: {e}"),
                    Some("provider"),
                )
            })?,
        };

        let mut strip_usage_chunk = false;
        let mut patched_options = None;
        if stream {
            let mut opts: IndexMap<String, Box<RawValue>> = match fields.get("stream_options") {
                None => IndexMap::new(),
                Some(raw) if raw.get() == "null" => IndexMap::new(),
                Some(raw) => serde_json::from_str(raw.get()).map_err(|_| {
                    ApiError::bad_request(
                        "invalid_type",
                        "`stream_options` must be an object",
                        Some("stream_options"),
                    )
                })?,
            };
            let asked = match opts.get("include_usage") {
                None => false,
                Some(raw) => serde_json::from_str::<Option<bool>>(raw.get())
                    .map_err(|_| {
                        ApiError::bad_request(
                            "invalid_type",
                            "`stream_options.include_usage` must be a boolean",
                            Some("stream_options.include_usage"),
                        )
                    })?
                    .unwrap_or(false),
            };
            if !asked {
                strip_usage_chunk = true;
                opts.insert("include_usage".to_owned(), raw_json("true")?);
                patched_options = Some(serde_json::to_string(&opts).map_err(|_| internal())?);
            }
        }
        // where each field lies in the body; a patched `stream_options` goes last if it was not sent
        let at = |text: &str| {
            let start = (text.as_ptr() as usize).checked_sub(body.as_ptr() as usize);
            match start {
                Some(start) if start + text.len() <= body.len() => {
                    Piece::Sent(start..start + text.len())
                }
                _ => Piece::Own(text.to_owned()),
            }
        };
        let mut kept: Vec<Field> = fields
            .iter()
            .map(|(key, value)| Field {
                key: match key {
                    Cow::Borrowed(k) => at(k),
                    Cow::Owned(k) => Piece::Own(k.clone()),
                },
                value: at(value.get()),
            })
            .collect();
        if let Some(patched) = patched_options {
            let value = Piece::Own(patched);
            match fields.get_index_of("stream_options") {
                Some(i) => kept[i].value = value,
                None => kept.push(Field {
                    key: Piece::Own("stream_options".to_owned()),
                    value,
                }),
            }
        }
        drop(fields);

        Ok(ClientRequest {
            route,
            model,
            stream,
            strip_usage_chunk,
            prefs,
            tools,
            prefix_hash,
            prompt_chars,
            body,
            fields: kept,
        })
    }

    /// The body for one upstream: the client's fields with `model` set to `upstream_model`,
    /// as one compact object (each value's bytes as sent).
    pub fn body_for(&self, upstream_model: &str) -> Result<Bytes, ApiError> {
        let body = &self.body[..];
        let mut out = Vec::with_capacity(body.len() + upstream_model.len() + 64);
        out.push(b'{');
        for (i, f) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match &f.key {
                // a key without escapes: its text is valid inside quotes as it is
                Piece::Sent(_) => {
                    out.push(b'"');
                    out.extend_from_slice(f.key.bytes(body));
                    out.push(b'"');
                }
                Piece::Own(k) => serde_json::to_writer(&mut out, k).map_err(|_| internal())?,
            }
            out.push(b':');
            if f.key.bytes(body) == b"model" {
                serde_json::to_writer(&mut out, upstream_model).map_err(|_| internal())?;
            } else {
                out.extend_from_slice(f.value.bytes(body));
            }
        }
        out.push(b'}');
        Ok(Bytes::from(out))
    }
}

fn internal() -> ApiError {
    ApiError::Internal {
        what: "the request could not be re-encoded",
    }
}

fn raw_json(s: &str) -> Result<Box<RawValue>, ApiError> {
    RawValue::from_string(s.to_owned()).map_err(|_| internal())
}

/// A JSON object's entries, borrowed from the text, collected into `C` in the order sent: the
/// body's top-level object (a [`RawMap`]) and, in `prompt`, a message's or a part's fields.
struct Object<C>(C);

impl<'de, C> serde::Deserialize<'de> for Object<C>
where
    C: Default + Extend<(Cow<'de, str>, &'de RawValue)>,
{
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<C>(std::marker::PhantomData<C>);
        impl<'de, C> serde::de::Visitor<'de> for V<C>
        where
            C: Default + Extend<(Cow<'de, str>, &'de RawValue)>,
        {
            type Value = Object<C>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = C::default();
                while let Some((Key(k), v)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
                    entries.extend([(k, v)]);
                }
                Ok(Object(entries))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A key of the body's object: borrowed from the body unless it had escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Checks the declared `tools` (an array or null), bounds their `parameters` schemas (see the
/// module doc) and compiles them for the tool-call checks.
fn compile_tools(raw: Option<&RawValue>) -> Result<Compiled, ApiError> {
    let tools = match raw {
        None => None,
        Some(raw) => {
            let v: serde_json::Value = serde_json::from_str(raw.get()).map_err(|_| {
                ApiError::bad_request("invalid_type", "`tools` is not valid", Some("tools"))
            })?;
            if !(v.is_array() || v.is_null()) {
                return Err(ApiError::bad_request(
                    "invalid_type",
                    "`tools` must be an array",
                    Some("tools"),
                ));
            }
            Some(v).filter(|v| !v.is_null())
        }
    };
    let mut budget = MAX_SCHEMA_NODES;
    for (i, tool) in tools
        .as_ref()
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(p) = tool.pointer("/function/parameters") {
            budget = check_schema(p, &format!("tools[{i}].function.parameters"), budget)?;
        }
    }
    Ok(Compiled {
        set: tools.map(|t| Arc::new(ToolSet::from_request_tools(&t))),
        budget_left: budget,
    })
}

/// Bounds `response_format.json_schema.schema` within the schema-node budget the tools left.
fn check_response_format(raw: Option<&RawValue>, budget: usize) -> Result<(), ApiError> {
    if let Some(raw) = raw
        && let Ok(rf) = serde_json::from_str::<serde_json::Value>(raw.get())
        && let Some(s) = rf.pointer("/json_schema/schema")
    {
        check_schema(s, "response_format.json_schema.schema", budget)?;
    }
    Ok(())
}

/// Bounds one schema's nesting and its values within `budget`; returns the budget left.
fn check_schema(schema: &serde_json::Value, param: &str, budget: usize) -> Result<usize, ApiError> {
    schema::check_size(schema, MAX_SCHEMA_DEPTH, budget)
        .map_err(|e| ApiError::bad_request(e.code(), format!("`{param}`: {e}"), Some(param)))
}

/// Type checks on the common sampling fields; other fields are the upstream's business.
fn check_types(fields: &RawMap<'_>) -> Result<(), ApiError> {
    const INTEGERS: [&str; 5] = [
        "n",
        "max_tokens",
        "max_completion_tokens",
        "top_logprobs",
        "seed",
    ];
    const NUMBERS: [&str; 4] = [
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
    ];
    for key in INTEGERS {
        if let Some(raw) = fields.get(key)
            && raw.get() != "null"
            && serde_json::from_str::<i64>(raw.get()).is_err()
        {
            return Err(ApiError::bad_request(
                "invalid_type",
                format!("`{key}` must be an integer"),
                Some(key),
            ));
        }
    }
    for key in NUMBERS {
        if let Some(raw) = fields.get(key)
            && raw.get() != "null"
            && serde_json::from_str::<f64>(raw.get()).is_err()
        {
            return Err(ApiError::bad_request(
                "invalid_type",
                format!("`{key}` must be a number"),
                Some(key),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_model_provider_and_stream_options_change() {
        let body = br#"{"model":"m", "messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":3,"n":2,"x_vendor":{"a":[1,2.50,"z"]},"provider":{"only":["a"]},"seed":  42}"#;
        let req = ClientRequest::parse(Route::Chat, body).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(req.model, "m");
        assert!(!req.stream);
        assert_eq!(req.prefs.only.as_deref(), Some(&["a".to_owned()][..]));
        let out = req
            .body_for("up/model-1")
            .unwrap_or_else(|e| panic!("{e:?}"));
        let s = std::str::from_utf8(&out).unwrap_or_default();
        assert_eq!(
            s,
            r#"{"model":"up/model-1","messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":3,"n":2,"x_vendor":{"a":[1,2.50,"z"]},"seed":42}"#
        );
    }

    #[test]
    fn streams_ask_for_usage() {
        let body = br#"{"model":"m","prompt":"hi","stream":true,"stream_options":{"foo":1}}"#;
        let req =
            ClientRequest::parse(Route::Completions, body).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(req.stream && req.strip_usage_chunk);
        let out = req.body_for("x").unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(
            v["stream_options"],
            serde_json::json!({"foo": 1, "include_usage": true})
        );

        let body =
            br#"{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}"#;
        let req =
            ClientRequest::parse(Route::Completions, body).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(!req.strip_usage_chunk);
    }

    #[test]
    fn bad_input_names_the_field() {
        let cases: [(&[u8], &str); 9] = [
            (b"{not json", "invalid_json"),
            (b"[1,2]", "invalid_request"),
            (br#"{"messages":[]}"#, "model"),
            (br#"{"model":1,"messages":[]}"#, "model"),
            (br#"{"model":"m"}"#, "messages"),
            (br#"{"model":"m","messages":"hi"}"#, "messages"),
            (br#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#, "stream"),
            (br#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":"2"}"#, "n"),
            (br#"{"model":"m","messages":[{"role":"user","content":"x"}],"provider":{"onlyy":[]}}"#, "provider"),
        ];
        for (body, what) in cases {
            let err = ClientRequest::parse(Route::Chat, body)
                .err()
                .unwrap_or_else(|| panic!("accepted {what}"));
            assert_eq!(err.status_code(), http::StatusCode::BAD_REQUEST);
            let j = err.body().to_json();
            assert!(j.contains(what), "{what}: {j}");
        }
    }

    #[test]
    fn prefix_hash_depends_on_prompt_only() {
        let a = ClientRequest::parse(
            Route::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":1}"#,
        );
        let b = ClientRequest::parse(
            Route::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":2}"#,
        );
        let c = ClientRequest::parse(
            Route::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"ho"}]}"#,
        );
        let (a, b, c) = (
            a.map(|r| r.prefix_hash).ok(),
            b.map(|r| r.prefix_hash).ok(),
            c.map(|r| r.prefix_hash).ok(),
        );
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn escaped_and_repeated_keys_are_rewritten_as_json_reads_them() {
        // an escaped key is its decoded self ("model" here), a repeated key keeps its first
        // place and its last value, whitespace between fields goes, values stay as sent
        let body = br#" { "mo\u0064el" : "m" , "messages":[ {"role":"user","content":"hi"} ],"a":1,"x\"y":[1, 2],"a":{"b": 2} } "#;
        let req = ClientRequest::parse(Route::Chat, body).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(req.model, "m");
        let out = req.body_for("up \"1\"").unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            std::str::from_utf8(&out).unwrap_or_default(),
            r#"{"model":"up \"1\"","messages":[ {"role":"user","content":"hi"} ],"a":{"b": 2},"x\"y":[1, 2]}"#
        );
    }

    /// The prompt's characters as a walk over `serde_json::Value` counts them: the reference
    /// for the raw walk.
    fn chars_by_value(route: Route, body: &[u8]) -> usize {
        fn text(v: Option<&serde_json::Value>) -> usize {
            match v {
                Some(serde_json::Value::String(s)) => s.chars().count(),
                Some(serde_json::Value::Array(parts)) => parts
                    .iter()
                    .map(|p| match p {
                        serde_json::Value::Object(o) => text(o.get("text")),
                        serde_json::Value::Number(_) => 4,
                        other => text(Some(other)),
                    })
                    .sum(),
                _ => 0,
            }
        }
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        match route {
            Route::Chat => v["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| text(m.get("content")))
                .sum(),
            Route::Completions => match &v["prompt"] {
                serde_json::Value::Array(items) => items.iter().map(|i| text(Some(i))).sum(),
                other => text(Some(other)),
            },
        }
    }

    #[test]
    fn prompt_characters_are_counted_as_a_value_walk_counts_them() {
        let chat = [
            r#""héllo \"wörld\" \u00e9\ud83d\ude00""#,
            r#"[{"type":"text","text":"ab"},{"type":"image_url","image_url":{"url":"x"}},{"text":["c",{"text":"dé"}]}]"#,
            r#"[1,2,-3,"four",null,true,[5,"six"]]"#,
            r#"{"text":"an object content counts nothing"}"#,
            r#"null"#,
            r#"[]"#,
        ];
        for content in chat {
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"sys"}},{{"role":"user","content":{content},"content":{content}}}]}}"#
            );
            let req = ClientRequest::parse(Route::Chat, body.as_bytes())
                .unwrap_or_else(|e| panic!("{content}: {e:?}"));
            assert_eq!(
                req.prompt_chars,
                chars_by_value(Route::Chat, body.as_bytes()),
                "{content}"
            );
        }
        let prompts = [
            r#""plain \n text""#,
            r#"["one","twö"]"#,
            r#"[[1,2,3],[4]]"#,
            r#"[1,2,3]"#,
            r#"[{"text":"x"},"y",null]"#,
        ];
        for prompt in prompts {
            let body = format!(r#"{{"model":"m","prompt":{prompt}}}"#);
            let req = ClientRequest::parse(Route::Completions, body.as_bytes())
                .unwrap_or_else(|e| panic!("{prompt}: {e:?}"));
            assert_eq!(
                req.prompt_chars,
                chars_by_value(Route::Completions, body.as_bytes()),
                "{prompt}"
            );
        }
    }

    #[test]
    fn a_prompt_nested_past_the_parser_limit_is_refused() {
        for depth in [130, 200_000] {
            let content = format!("{}\"x\"{}", "[".repeat(depth), "]".repeat(depth));
            let body =
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":{content}}}]}}"#);
            let err = ClientRequest::parse(Route::Chat, body.as_bytes())
                .err()
                .unwrap_or_else(|| panic!("{depth} levels accepted"));
            assert!(err.body().to_json().contains("`messages` is not valid"));
        }
        // within the limit it is text like any other
        let content = format!("{}\"xyz\"{}", "[".repeat(100), "]".repeat(100));
        let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":{content}}}]}}"#);
        let req = ClientRequest::parse(Route::Chat, body.as_bytes());
        assert_eq!(req.map(|r| r.prompt_chars).ok(), Some(3));
    }

    /// A chat body with `tools` (and `extra` fields) as given.
    fn with_tools(tools: &str, extra: &str) -> Bytes {
        Bytes::from(format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tools":{tools}{extra}}}"#
        ))
    }

    fn parse_with(body: Bytes, cache: &ToolsCache) -> Result<ClientRequest, ApiError> {
        ClientRequest::parse_cached(Route::Chat, body, Some(cache))
    }

    const WEATHER: &str = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]"#;

    #[test]
    fn the_same_tools_bytes_are_compiled_once_and_check_alike() {
        let cache = ToolsCache::default();
        let first = parse_with(with_tools(WEATHER, ""), &cache).unwrap_or_else(|e| panic!("{e:?}"));
        let again = parse_with(with_tools(WEATHER, r#","seed":1"#), &cache)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let (a, b) = (
            first.tools.unwrap_or_default(),
            again.tools.unwrap_or_default(),
        );
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second request compiled its tools again"
        );
        assert_eq!(cache.held(), (1, WEATHER.len()));
        // what the cache returns is what a request compiles without it
        let cold = ClientRequest::parse_bytes(Route::Chat, with_tools(WEATHER, ""))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            format!("{b:?}"),
            format!("{:?}", cold.tools.unwrap_or_default())
        );
        // other bytes (the same JSON spaced out) are another value
        let spaced = WEATHER.replace(',', ", ");
        let other = parse_with(with_tools(&spaced, ""), &cache).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(!Arc::ptr_eq(&b, &other.tools.unwrap_or_default()));
        assert_eq!(cache.held().0, 2);
        // `"tools": null` is held too, as no tools
        let none = parse_with(with_tools("null", ""), &cache).unwrap_or_else(|e| panic!("{e:?}"));
        let none_again =
            parse_with(with_tools("null", ""), &cache).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(none.tools.is_none() && none_again.tools.is_none());
        assert_eq!(cache.held().0, 3);
    }

    #[test]
    fn held_tools_still_spend_the_schema_budget_response_format_shares() {
        // 3,001 nodes of tools and 7,001 of response_format: each fits alone, not both
        let props = |n: usize| {
            (0..n)
                .map(|i| format!(r#""p{i}":{{"type":"string"}}"#))
                .collect::<Vec<_>>()
                .join(",")
        };
        let tools = format!(
            r#"[{{"type":"function","function":{{"name":"f","parameters":{{"type":"object","properties":{{{}}}}}}}}}]"#,
            props(1500)
        );
        let rf = format!(
            r#","response_format":{{"type":"json_schema","json_schema":{{"name":"x","schema":{{"type":"object","properties":{{{}}}}}}}}}"#,
            props(3500)
        );
        let cache = ToolsCache::default();
        for round in ["cold", "held"] {
            let err = parse_with(with_tools(&tools, &rf), &cache)
                .err()
                .unwrap_or_else(|| panic!("{round}: both schemas together were accepted"));
            assert_eq!(err.code(), "schema_too_large", "{round}");
            // the tools alone pass (and are held from the first round on)
            parse_with(with_tools(&tools, ""), &cache).unwrap_or_else(|e| panic!("{round}: {e:?}"));
            assert_eq!(cache.held().0, 1, "{round}");
        }
    }

    #[test]
    fn refused_tools_are_refused_every_time_and_never_held() {
        let cache = ToolsCache::default();
        for _ in 0..2 {
            let err = parse_with(with_tools(r#"{"a":1}"#, ""), &cache)
                .err()
                .unwrap_or_else(|| panic!("an object as tools was accepted"));
            assert_eq!(err.code(), "invalid_type");
        }
        assert_eq!(cache.held(), (0, 0));
    }
}
