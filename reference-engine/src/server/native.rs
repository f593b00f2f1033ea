//! The engine's own routes: `POST /v1/score` (per position logprob and top-k for token ids,
//! text or chat messages), `POST /tokenize` and `POST /detokenize` (vLLM's shapes),
//! `GET /v1/models`, `GET /v1/models/{model}` and `GET /healthz`.

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use samewise_wire::{ModelList, ModelObject};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine::MAX_TOP_K;

use super::chat_api::{prompt_end, render_prompt, template_kwargs};
use super::{ApiError, ServerState, json_response, parse_body};
use crate::chat::PromptEnd;

/// `POST /v1/score` body: exactly one of `tokens`, `text`, `messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScoreRequest {
    /// Optional; when given, the served name.
    #[serde(default)]
    model: Option<String>,
    /// Token ids to score.
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    /// Text to tokenize and score.
    #[serde(default)]
    text: Option<String>,
    /// Chat messages rendered with the chat template.
    #[serde(default)]
    messages: Option<Vec<Value>>,
    /// Tools for the chat template.
    #[serde(default)]
    tools: Option<Vec<Value>>,
    /// With `messages`: end with the assistant header (default false: score the whole chat).
    #[serde(default)]
    add_generation_prompt: bool,
    /// With `text`: add the tokenizer's special tokens (default true).
    #[serde(default)]
    add_special_tokens: Option<bool>,
    /// With `messages`: the template's own variables, as a chat request sends them.
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    /// Alternatives per position, 0..=20.
    #[serde(default)]
    top_k: usize,
}

pub(crate) async fn score(State(state): State<ServerState>, body: Bytes) -> Response {
    match run_score(&state, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run_score(state: &ServerState, body: &[u8]) -> Result<Response, ApiError> {
    let req: ScoreRequest = parse_body(body)?;
    if let Some(m) = &req.model {
        state.check_model(m)?;
    }
    if req.top_k > MAX_TOP_K {
        return Err(ApiError::bad_request(
            format!("top_k must be at most {MAX_TOP_K}"),
            Some("top_k"),
        ));
    }
    let tok = state.tokenizer();
    let ids = match (req.tokens, req.text, req.messages) {
        (Some(ids), None, None) => ids,
        (None, Some(text), None) => tok.encode(&text, req.add_special_tokens.unwrap_or(true))?,
        (None, None, Some(messages)) => render_prompt(
            state,
            &messages,
            req.tools.as_deref(),
            if req.add_generation_prompt {
                PromptEnd::NewTurn
            } else {
                PromptEnd::Closed
            },
            template_kwargs(req.chat_template_kwargs.as_ref())?,
        )?,
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of tokens, text, messages",
                None,
            ));
        }
    };
    let scored = state.inner.backend.score(ids.clone(), req.top_k).await?;
    let positions: Vec<Value> = scored
        .positions
        .iter()
        .map(|p| {
            json!({
                "token": p.token,
                "text": tok.token_str(p.token).unwrap_or_default(),
                "logprob": p.logprob,
                "top": p.top.iter().map(|a| json!({"token": a.token, "text": tok.token_str(a.token).unwrap_or_default(),
                                                    "logprob": a.logprob})).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json_response(&json!({
        "object": "score",
        "model": state.model_name(),
        "tokens": ids,
        "positions": positions,
        "usage": {"prompt_tokens": ids.len(), "completion_tokens": 0, "total_tokens": ids.len()},
    })))
}

/// `POST /tokenize` body (vLLM's): `prompt` or `messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Value>>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    /// With `messages`: end inside the last message, as a chat request with it would.
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    /// With `messages`: the template's own variables, as a chat request sends them.
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
}

pub(crate) async fn tokenize(State(state): State<ServerState>, body: Bytes) -> Response {
    let run = || -> Result<Response, ApiError> {
        let req: TokenizeRequest = parse_body(&body)?;
        if let Some(m) = &req.model {
            state.check_model(m)?;
        }
        let ids = match (req.prompt, req.messages) {
            (Some(p), None) => state
                .tokenizer()
                .encode(&p, req.add_special_tokens.unwrap_or(true))?,
            (None, Some(m)) => render_prompt(
                &state,
                &m,
                req.tools.as_deref(),
                prompt_end(req.add_generation_prompt, req.continue_final_message)?,
                template_kwargs(req.chat_template_kwargs.as_ref())?,
            )?,
            _ => {
                return Err(ApiError::bad_request(
                    "give exactly one of prompt, messages",
                    None,
                ));
            }
        };
        Ok(json_response(
            &json!({"tokens": ids, "count": ids.len(), "max_model_len": state.inner.n_ctx}),
        ))
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `POST /detokenize` body: `tokens`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u32>,
}

pub(crate) async fn detokenize(State(state): State<ServerState>, body: Bytes) -> Response {
    let run = || -> Result<Response, ApiError> {
        let req: DetokenizeRequest = parse_body(&body)?;
        if let Some(m) = &req.model {
            state.check_model(m)?;
        }
        let text = state.tokenizer().decode(&req.tokens, false)?;
        Ok(json_response(&json!({"prompt": text})))
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn models(State(state): State<ServerState>) -> Response {
    json_response(&ModelList {
        object: "list".into(),
        data: vec![model_object(&state)],
    })
}

/// `GET /v1/models/{model}`: the served model's entry of `/v1/models`, or an OpenAI-shaped 404
/// (`model_not_found`) for any other name (a 400 `invalid_path` for one that is not UTF-8 once
/// percent-decoded).
pub(crate) async fn model(
    State(state): State<ServerState>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let id = match id {
        Ok(Path(id)) => id,
        Err(e) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                e.body_text(),
                "invalid_request_error",
                Some("invalid_path"),
            )
            .into_response();
        }
    };
    match state.check_model(&id) {
        Ok(()) => json_response(&model_object(&state)),
        Err(e) => e.into_response(),
    }
}

/// The served model as `/v1/models` lists it, with `max_model_len` and the serving profile.
fn model_object(state: &ServerState) -> ModelObject {
    let mut model = ModelObject::new(
        state.model_name().to_owned(),
        "samewise",
        state.inner.created,
    );
    model
        .extra
        .insert("max_model_len".into(), json!(state.inner.n_ctx));
    model
        .extra
        .insert("profile".into(), json!(state.profile().name));
    model
}

pub(crate) async fn health() -> Response {
    json_response(&json!({"status": "ok"}))
}
