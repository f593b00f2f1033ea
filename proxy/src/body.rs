//! The client's request body, checked and rewritten for one upstream without retyping it.
//!
//! The body is parsed as a map of raw JSON values (`serde_json` with `raw_value` and
//! `preserve_order`): each value's bytes are kept as the client sent them. Only three things
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

use std::sync::Arc;

use bytes::Bytes;
use indexmap::IndexMap;
use samewise_toolcheck::ToolSet;
use samewise_toolcheck::schema::{self, MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES};
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::routing::{ProviderPrefs, fnv1a};

/// A JSON object as raw values, in the order they were sent.
type RawMap = IndexMap<String, Box<RawValue>>;

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
    /// Every field as sent, with `provider` removed and `stream_options` patched.
    fields: RawMap,
}

/// Bytes of the serialised prompt that make up the cache-affinity prefix.
const AFFINITY_PREFIX_BYTES: usize = 2048;

impl ClientRequest {
    /// Checks a body for `route`; bad input becomes a 400 that names the field.
    pub fn parse(route: Route, body: &[u8]) -> Result<ClientRequest, ApiError> {
        let mut fields: RawMap = serde_json::from_slice(body).map_err(|e| {
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
        let prompt_value: serde_json::Value =
            serde_json::from_str(prompt_raw.get()).map_err(|_| {
                ApiError::bad_request(
                    "invalid_type",
                    format!("`{prompt_key}` is not valid"),
                    Some(prompt_key),
                )
            })?;
        let prompt_chars = check_prompt(route, &prompt_value)?;
        let prefix = prompt_raw.get().as_bytes();
        let prefix_hash = fnv1a(&prefix[..prefix.len().min(AFFINITY_PREFIX_BYTES)], 0);

        check_types(&fields)?;

        let tools = match fields.get("tools") {
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
        check_schemas(tools.as_ref(), fields.get("response_format").map(|b| &**b))?;
        let tools = tools.map(|t| Arc::new(ToolSet::from_request_tools(&t)));

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
        if stream {
            let mut opts: RawMap = match fields.get("stream_options") {
                None => RawMap::new(),
                Some(raw) if raw.get() == "null" => RawMap::new(),
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
                let patched = serde_json::to_string(&opts).map_err(|_| internal())?;
                fields.insert("stream_options".to_owned(), raw_json(&patched)?);
            }
        }

        Ok(ClientRequest {
            route,
            model,
            stream,
            strip_usage_chunk,
            prefs,
            tools,
            prefix_hash,
            prompt_chars,
            fields,
        })
    }

    /// The body for one upstream: the client's fields with `model` set to `upstream_model`.
    pub fn body_for(&self, upstream_model: &str) -> Result<Bytes, ApiError> {
        let mut fields = self.fields.clone();
        let model = serde_json::to_string(upstream_model).map_err(|_| internal())?;
        fields.insert("model".to_owned(), raw_json(&model)?);
        serde_json::to_vec(&fields)
            .map(Bytes::from)
            .map_err(|_| internal())
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

/// Bounds every client-supplied schema of the request (see the module doc): the declared
/// tools' `parameters` and a `json_schema` response format's `schema`.
fn check_schemas(
    tools: Option<&serde_json::Value>,
    response_format: Option<&RawValue>,
) -> Result<(), ApiError> {
    let mut budget = MAX_SCHEMA_NODES;
    let mut check = |schema: &serde_json::Value, param: &str| -> Result<(), ApiError> {
        budget = schema::check_size(schema, MAX_SCHEMA_DEPTH, budget)
            .map_err(|e| ApiError::bad_request(e.code(), format!("`{param}`: {e}"), Some(param)))?;
        Ok(())
    };
    for (i, tool) in tools
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(p) = tool.pointer("/function/parameters") {
            check(p, &format!("tools[{i}].function.parameters"))?;
        }
    }
    if let Some(raw) = response_format
        && let Ok(rf) = serde_json::from_str::<serde_json::Value>(raw.get())
        && let Some(s) = rf.pointer("/json_schema/schema")
    {
        check(s, "response_format.json_schema.schema")?;
    }
    Ok(())
}

/// Checks `messages` / `prompt` and returns the characters of prompt text.
fn check_prompt(route: Route, v: &serde_json::Value) -> Result<usize, ApiError> {
    match route {
        Route::Chat => {
            let Some(msgs) = v.as_array() else {
                return Err(ApiError::bad_request(
                    "invalid_type",
                    "`messages` must be an array",
                    Some("messages"),
                ));
            };
            if msgs.is_empty() {
                return Err(ApiError::bad_request(
                    "invalid_value",
                    "`messages` must not be empty",
                    Some("messages"),
                ));
            }
            let mut chars = 0;
            for (i, m) in msgs.iter().enumerate() {
                let Some(obj) = m.as_object() else {
                    let p = format!("messages[{i}]");
                    return Err(ApiError::bad_request(
                        "invalid_type",
                        format!("`{p}` must be an object"),
                        Some(&p),
                    ));
                };
                if !obj.get("role").is_some_and(serde_json::Value::is_string) {
                    let p = format!("messages[{i}].role");
                    return Err(ApiError::bad_request(
                        "invalid_type",
                        format!("`{p}` must be a string"),
                        Some(&p),
                    ));
                }
                chars += text_chars(obj.get("content"));
            }
            Ok(chars)
        }
        Route::Completions => match v {
            serde_json::Value::String(s) => Ok(s.chars().count()),
            serde_json::Value::Array(items) if !items.is_empty() => {
                Ok(items.iter().map(|i| text_chars(Some(i))).sum())
            }
            _ => Err(ApiError::bad_request(
                "invalid_type",
                "`prompt` must be a string or a non-empty array",
                Some("prompt"),
            )),
        },
    }
}

/// Characters of text in a message content (string, or parts with `text`) or prompt item;
/// token-id prompts count one "character" per token id times four (so /4 gives the ids).
fn text_chars(v: Option<&serde_json::Value>) -> usize {
    match v {
        Some(serde_json::Value::String(s)) => s.chars().count(),
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .map(|p| match p {
                serde_json::Value::Object(o) => text_chars(o.get("text")),
                serde_json::Value::Number(_) => 4,
                other => text_chars(Some(other)),
            })
            .sum(),
        _ => 0,
    }
}

/// Type checks on the common sampling fields; other fields are the upstream's business.
fn check_types(fields: &RawMap) -> Result<(), ApiError> {
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
}
