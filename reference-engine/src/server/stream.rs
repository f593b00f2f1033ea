//! Server-Sent Events responses over choice streams, and the request checks and logprob
//! shapes the completions and chat routes share.
//!
//! Choices are streamed interleaved, each event as soon as its choice has it (each chunk
//! names its `index`), as OpenAI and vLLM stream them: choice 1 does not wait for choice 0 to
//! finish. A failure in the middle of a stream becomes one `data:` event holding OpenAI's
//! error JSON, then the stream ends.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use futures_util::stream::{BoxStream, SelectAll};
use samewise_wire::sse::{encode_data, encode_json};
use samewise_wire::{TokenLogprob, TopLogprob};
use serde_json::Value;

use crate::engine::{GenerateParams, GeneratedToken, MAX_TOP_K};
use crate::sample::{SamplingParams, TokenLogprob as EngineLogprob};

use super::text::{ChoiceEvent, StopStrings, TextStream};
use super::{ApiError, ServerState, extra_bool};

/// Most choices (`n`) one request may ask for.
pub(crate) const MAX_N: u32 = 16;

/// Turns one choice event into the SSE chunks to send (as JSON values); `usage_out`
/// accumulates completion tokens.
pub(crate) type Render =
    Box<dyn FnMut(u32, ChoiceEvent, &mut u64) -> Vec<serde_json::Value> + Send>;
/// Builds the final usage chunk from the completion-token total.
pub(crate) type Tail = Box<dyn FnOnce(u64) -> Option<serde_json::Value> + Send>;

/// An SSE response: `head` chunks first, then the choices' chunks as they come, then `tail`,
/// then `data: [DONE]`.
pub(crate) fn sse_response(
    head: Vec<serde_json::Value>,
    choices: Vec<(u32, TextStream)>,
    render: Render,
    tail: Tail,
) -> Response {
    type Choices = SelectAll<BoxStream<'static, (u32, ChoiceEvent)>>;
    struct St {
        out: VecDeque<Bytes>,
        /// Every choice's events, merged as they arrive; empty once all have ended.
        choices: Choices,
        render: Render,
        tail: Option<Tail>,
        completion_tokens: u64,
        failed: bool,
        done: bool,
    }
    let mut out = VecDeque::new();
    for v in &head {
        out.push_back(json_event(v));
    }
    let st = St {
        out,
        choices: futures_util::stream::select_all(choices.into_iter().map(|(index, choice)| {
            futures_util::stream::unfold(choice, move |mut c| async move {
                c.next().await.map(|ev| ((index, ev), c))
            })
            .boxed()
        })),
        render,
        tail: Some(tail),
        completion_tokens: 0,
        failed: false,
        done: false,
    };
    let stream = futures_util::stream::unfold(st, |mut s| async move {
        loop {
            if let Some(b) = s.out.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.done {
                return None;
            }
            if !s.failed && !s.choices.is_empty() {
                match s.choices.next().await {
                    Some((_, ChoiceEvent::Failed(e))) => {
                        s.failed = true;
                        // dropping the others cancels their generations
                        s.choices = Choices::default();
                        s.out
                            .push_back(Bytes::from(encode_data(&e.body().to_json())));
                    }
                    Some((index, ev)) => {
                        for v in (s.render)(index, ev, &mut s.completion_tokens) {
                            s.out.push_back(json_event(&v));
                        }
                    }
                    None => {} // all ended: `is_empty` now
                }
                continue;
            }
            if !s.failed
                && let Some(tail) = s.tail.take()
                && let Some(v) = tail(s.completion_tokens)
            {
                s.out.push_back(json_event(&v));
            }
            s.out.push_back(Bytes::from(encode_data("[DONE]")));
            s.done = true;
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

fn json_event(v: &serde_json::Value) -> Bytes {
    Bytes::from(encode_json(v).unwrap_or_else(|_| encode_data("{}")))
}

/// Validated sampling and length parameters shared by both routes.
#[derive(Debug, Clone)]
pub(crate) struct GenRequest {
    /// Every choice's sampling (choice j's seed is `seed + j`).
    pub sampling: SamplingParams,
    pub n: u32,
    pub stops: StopStrings,
    pub top_logprobs: usize,
    /// vLLM's `stop_token_ids`: stop tokens besides the model's own.
    pub stop_token_ids: Vec<u32>,
    /// vLLM's `ignore_eos`: the model's own stop tokens do not end the answer.
    pub ignore_eos: bool,
    /// vLLM's `min_tokens`: no stop token or stop string ends the answer before this many.
    pub min_tokens: usize,
}

impl GenRequest {
    /// Checks OpenAI's ranges; `None`s take OpenAI's defaults.
    pub(crate) fn new(
        temperature: Option<f64>,
        top_p: Option<f64>,
        seed: Option<u64>,
        n: Option<u32>,
        stops: Vec<String>,
        top_logprobs: usize,
    ) -> Result<Self, ApiError> {
        let temperature = temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::bad_request(
                "temperature must be between 0 and 2",
                Some("temperature"),
            ));
        }
        let top_p = top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad_request(
                "top_p must be in (0, 1]",
                Some("top_p"),
            ));
        }
        let n = n.unwrap_or(1);
        if n == 0 || n > MAX_N {
            return Err(ApiError::bad_request(
                format!("n must be between 1 and {MAX_N}"),
                Some("n"),
            ));
        }
        if stops.len() > 16 {
            return Err(ApiError::bad_request(
                "at most 16 stop sequences",
                Some("stop"),
            ));
        }
        if top_logprobs > MAX_TOP_K {
            return Err(ApiError::bad_request(
                format!("at most {MAX_TOP_K} logprobs per position"),
                Some("logprobs"),
            ));
        }
        Ok(Self {
            sampling: SamplingParams {
                temperature: temperature as f32,
                top_p: top_p as f32,
                seed,
                ..SamplingParams::default()
            },
            n,
            stops: StopStrings {
                strings: stops,
                ..StopStrings::default()
            },
            top_logprobs,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
        })
    }

    /// Takes the logit adjustments and vLLM's sampling extensions from the request's other
    /// fields, checked: `presence_penalty` and `frequency_penalty` in [-2, 2], `logit_bias`
    /// an object from token ids (as strings) in the vocabulary to biases in [-100, 100],
    /// `repetition_penalty` > 0 (at most 100), `min_p` in [0, 1], `top_k` an integer >= -1
    /// (-1 and 0: off). `null` is absent.
    pub(crate) fn with_adjustments(
        mut self,
        extra: &samewise_wire::Extra,
        vocab_size: usize,
    ) -> Result<Self, ApiError> {
        // types here; ranges in `SamplingParams::invalid`, the library's own check, below
        let number = |name: &'static str| match extra.get(name).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| {
                ApiError::bad_request(format!("{name} must be a number"), Some(name))
            }),
        };
        let sampling = &mut self.sampling;
        for (name, field) in [
            ("presence_penalty", &mut sampling.presence_penalty),
            ("frequency_penalty", &mut sampling.frequency_penalty),
            ("repetition_penalty", &mut sampling.repetition_penalty),
            ("min_p", &mut sampling.min_p),
        ] {
            if let Some(x) = number(name)? {
                *field = x;
            }
        }
        match extra.get("top_k").filter(|v| !v.is_null()) {
            None => {}
            Some(v) => match v.as_i64() {
                Some(k) if k >= -1 => self.sampling.top_k = usize::try_from(k).unwrap_or(0),
                _ => {
                    return Err(ApiError::bad_request(
                        "top_k must be an integer, -1 (or 0) for all tokens",
                        Some("top_k"),
                    ));
                }
            },
        }
        let bad = |m: String| ApiError::bad_request(m, Some("logit_bias"));
        match extra.get("logit_bias").filter(|v| !v.is_null()) {
            None => {}
            Some(serde_json::Value::Object(map)) => {
                for (key, value) in map {
                    // the id as written in decimal ("07" would name 7 a second time)
                    let token = key
                        .parse::<u32>()
                        .ok()
                        .filter(|&t| (t as usize) < vocab_size && t.to_string() == *key)
                        .ok_or_else(|| {
                            bad(format!(
                                "logit_bias key {key:?} is not a token id of this model (0 to {})",
                                vocab_size.saturating_sub(1)
                            ))
                        })?;
                    let bias = value.as_f64().ok_or_else(|| {
                        bad(format!(
                            "logit_bias value for token {token} must be a number"
                        ))
                    })?;
                    self.sampling.logit_bias.push((token, bias as f32));
                }
                self.sampling.logit_bias.sort_by_key(|&(t, _)| t);
            }
            Some(_) => {
                return Err(bad(
                    "logit_bias must be an object from token ids to biases".into()
                ));
            }
        }
        if let Some((param, why)) = self.sampling.invalid() {
            return Err(ApiError::bad_request(why, Some(param)));
        }
        self.with_stopping(extra, vocab_size)
    }

    /// vLLM's stopping extensions, checked: `stop_token_ids` (ids in the vocabulary),
    /// `ignore_eos`, `min_tokens` (a whole number; [`GenRequest::check_max_tokens`] bounds it
    /// by `max_tokens`) and `include_stop_str_in_output`. `null` is absent.
    fn with_stopping(
        mut self,
        extra: &samewise_wire::Extra,
        vocab_size: usize,
    ) -> Result<Self, ApiError> {
        match extra.get("stop_token_ids").filter(|v| !v.is_null()) {
            None => {}
            Some(Value::Array(ids)) => {
                for id in ids {
                    let t = id
                        .as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .filter(|&t| (t as usize) < vocab_size)
                        .ok_or_else(|| {
                            ApiError::bad_request(
                                format!(
                                    "stop_token_ids: {id} is not a token id of this model (0 to {})",
                                    vocab_size.saturating_sub(1)
                                ),
                                Some("stop_token_ids"),
                            )
                        })?;
                    self.stop_token_ids.push(t);
                }
                // at most one per vocabulary entry, however long the list sent
                self.stop_token_ids.sort_unstable();
                self.stop_token_ids.dedup();
            }
            Some(_) => {
                return Err(ApiError::bad_request(
                    "stop_token_ids must be an array of token ids",
                    Some("stop_token_ids"),
                ));
            }
        }
        self.ignore_eos = extra_bool(extra, "ignore_eos")?.unwrap_or(false);
        self.stops.include = extra_bool(extra, "include_stop_str_in_output")?.unwrap_or(false);
        match extra.get("min_tokens").filter(|v| !v.is_null()) {
            None => {}
            Some(v) => {
                self.min_tokens = v
                    .as_u64()
                    .and_then(|m| usize::try_from(m).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "min_tokens must be a whole number",
                            Some("min_tokens"),
                        )
                    })?;
                self.stops.after_tokens = self.min_tokens;
            }
        }
        Ok(self)
    }

    /// `min_tokens` cannot exceed the request's `max_tokens` (vLLM's rule).
    pub(crate) fn check_max_tokens(&self, max_tokens: usize) -> Result<(), ApiError> {
        if self.min_tokens > max_tokens {
            return Err(ApiError::bad_request(
                format!(
                    "min_tokens ({}) must be at most max_tokens ({max_tokens})",
                    self.min_tokens
                ),
                Some("min_tokens"),
            ));
        }
        Ok(())
    }

    /// Engine parameters for choice `j` (seeded choices get seeds `seed + j`, so `n`
    /// samples differ but repeat exactly).
    pub(crate) fn params(&self, state: &ServerState, max_tokens: usize, j: u32) -> GenerateParams {
        GenerateParams {
            sampling: SamplingParams {
                seed: self.sampling.seed.map(|s| s.wrapping_add(u64::from(j))),
                ..self.sampling.clone()
            },
            max_tokens,
            stop_token_ids: (state.tokenizer().stop_ids().iter())
                .filter(|_| !self.ignore_eos)
                .chain(&self.stop_token_ids)
                .copied()
                .collect(),
            min_tokens: self.min_tokens,
            top_logprobs: self.top_logprobs,
        }
    }
}

/// Request fields that would change what the answer means, which this engine does not do
/// (OpenAI's `suffix` and `best_of`, vLLM's beam search, guided decoding, prompt truncation,
/// token filters, per-request templates): each with whether a value is the default (absent and
/// `null` always are) and what to ask instead.
const UNSUPPORTED: [(&str, IsDefault, &str); 15] = [
    ("suffix", |v| v == "", ""),
    ("best_of", |v| v == 1, "; ask for n choices instead"),
    ("use_beam_search", |v| v == false, ""),
    (
        "length_penalty",
        |v| v.as_f64() == Some(1.0),
        " (it applies to beam search)",
    ),
    (
        "prompt_logprobs",
        |_| false,
        "; ask /v1/completions with echo and logprobs, or /v1/score",
    ),
    (
        "guided_json",
        |_| false,
        "; use response_format json_schema",
    ),
    ("guided_regex", |_| false, ""),
    (
        "guided_choice",
        |_| false,
        "; use response_format json_schema with an enum",
    ),
    ("guided_grammar", |_| false, ""),
    (
        "structured_outputs",
        |_| false,
        "; use response_format json_schema",
    ),
    ("truncate_prompt_tokens", |_| false, ""),
    ("allowed_token_ids", |_| false, "; use logit_bias"),
    (
        "bad_words",
        |v| v.as_array().is_some_and(Vec::is_empty),
        "; use logit_bias",
    ),
    (
        "chat_template",
        |_| false,
        " (the model's own template is used)",
    ),
    // vLLM's chat echo (a completion's `echo` is its own field, never here)
    ("echo", |v| v == false, " on chat completions"),
];

/// Whether a field's value is its default.
type IsDefault = fn(&Value) -> bool;

/// Refuses a field of [`UNSUPPORTED`] with a value other than its default (a 400 naming it),
/// as vLLM refuses what it cannot do, rather than answering a different question.
pub(crate) fn refuse_unsupported(extra: &samewise_wire::Extra) -> Result<(), ApiError> {
    for (name, is_default, instead) in UNSUPPORTED {
        match extra.get(name) {
            None | Some(Value::Null) => {}
            Some(v) if is_default(v) => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    format!("{name} is not supported by this engine{instead}"),
                    Some(name),
                ));
            }
        }
    }
    Ok(())
}

/// Refuses `stream_options` on a request that does not stream, as OpenAI and vLLM do (it
/// would otherwise be ignored: a client asking for usage chunks gets none and is not told).
pub(crate) fn check_stream_options(
    stream: Option<bool>,
    has_options: bool,
) -> Result<(), ApiError> {
    if has_options && stream != Some(true) {
        return Err(ApiError::bad_request(
            "stream_options is only allowed when stream is true",
            Some("stream_options"),
        ));
    }
    Ok(())
}

/// Rejects prompts (plus the tokens to generate) longer than the context, and ids outside
/// the vocabulary, before any work starts.
pub(crate) fn check_prompt(
    state: &ServerState,
    prompt: &[u32],
    max_tokens: usize,
) -> Result<(), ApiError> {
    let n_ctx = state.inner.n_ctx;
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty", Some("prompt")));
    }
    if let Some(&t) = prompt
        .iter()
        .find(|&&t| t as usize >= state.inner.vocab_size)
    {
        return Err(crate::error::EngineError::TokenOutOfVocab {
            token: t,
            vocab_size: state.inner.vocab_size,
        }
        .into());
    }
    if prompt.len() + max_tokens > n_ctx {
        let mut e = ApiError::bad_request(
            format!(
                "this model's maximum context length is {n_ctx} tokens; the request has {} prompt tokens \
                 and asks for {max_tokens} more",
                prompt.len()
            ),
            Some("messages"),
        );
        e.body.error.code = Some("context_length_exceeded".into());
        return Err(e);
    }
    Ok(())
}

/// A chat-style logprob entry for one generated token.
pub(crate) fn chat_logprob(state: &ServerState, t: &GeneratedToken) -> TokenLogprob {
    let tok = state.tokenizer();
    TokenLogprob {
        token: tok.token_str(t.token).unwrap_or_default().to_owned(),
        logprob: f64::from(t.logprob),
        bytes: Some(tok.token_bytes(t.token).unwrap_or_default().to_vec()),
        top_logprobs: t.top.iter().map(|a| top_entry(state, a)).collect(),
    }
}

fn top_entry(state: &ServerState, a: &EngineLogprob) -> TopLogprob {
    let tok = state.tokenizer();
    TopLogprob {
        token: tok.token_str(a.token).unwrap_or_default().to_owned(),
        logprob: f64::from(a.logprob),
        bytes: Some(tok.token_bytes(a.token).unwrap_or_default().to_vec()),
    }
}
