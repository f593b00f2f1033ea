//! `POST /v1/completions`: text or token-id prompts (one or a list), generation, and
//! `echo` + `logprobs` prompt logprobs in vLLM's alignment (entry i is the logprob of prompt
//! token i given the tokens before it; the first is null). `max_tokens: 0` with `echo`
//! scores the prompt without generating. The top-logprobs map of each position holds the
//! `logprobs` most likely tokens and the actual one, as OpenAI and vLLM send it.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use samewise_wire::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, Extra, Prompt,
    Usage,
};
use serde_json::{Map, Value, json};

use crate::engine::{GeneratedToken, ScoredSequence};
use crate::sample::TokenLogprob as EngineLogprob;

use super::faults::RequestFaults;
use super::stream::{
    GenRequest, check_prompt, check_stream_options, refuse_unsupported, sse_response,
};
use super::text::{ChoiceEvent, Collected, TextStream};
use super::{ApiError, ServerState, json_response, now_secs, parse_body};

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

pub(crate) async fn handle(
    State(state): State<ServerState>,
    Extension(faults): Extension<RequestFaults>,
    body: Bytes,
) -> Response {
    match run(&state, &faults, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// One prompt: its ids and the text `echo` returns.
struct PromptIn {
    ids: Vec<u32>,
    text: String,
}

/// A request's prompts and what every choice of it shares, ready to answer (whole or
/// streamed).
struct Prepared {
    id: String,
    created: u64,
    prompts: Vec<PromptIn>,
    /// Per prompt, its scored tokens when `echo` asks for prompt logprobs.
    scored: Vec<Option<ScoredSequence>>,
    /// Choices per prompt.
    n: u32,
    echo: bool,
    /// `logprobs`: how many top tokens per position (capped by the faults), if asked.
    k: Option<usize>,
    /// Prompt tokens counted once per choice, as OpenAI counts them.
    prompt_tokens: u64,
}

async fn run(
    state: &ServerState,
    faults: &RequestFaults,
    body: &[u8],
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(body)?;
    state.check_model(&req.model)?;
    refuse_unsupported(&req.extra)?;
    check_stream_options(req.stream, req.stream_options.is_some())?;
    faults.check_logprobs(req.logprobs.is_some())?;
    faults.check_echo(req.echo == Some(true))?;
    let mut prompts = read_prompts(state, &req.prompt)?;
    let max_tokens = req.max_tokens.map_or(DEFAULT_MAX_TOKENS, |m| m as usize);
    let echo = req.echo.unwrap_or(false);
    let k = req.logprobs.map(|k| faults.cap_top(k as usize));
    let stops = req
        .stop
        .as_ref()
        .map(samewise_wire::Stop::to_vec)
        .unwrap_or_default();
    let gen_req = GenRequest::new(
        req.temperature,
        req.top_p,
        req.seed,
        req.n,
        stops,
        k.unwrap_or(0),
    )?
    .with_adjustments(&req.extra, state.inner.vocab_size)?;
    let gen_req = faults.sampling(gen_req);
    gen_req.check_max_tokens(max_tokens)?;
    let tok = state.tokenizer();
    for p in &mut prompts {
        if state.inner.faults.truncate(&mut p.ids) {
            p.text.clear(); // echo shows what was kept
        }
        check_prompt(state, &p.ids, max_tokens)?;
        if p.text.is_empty() {
            // token-id prompts echo their decoded text
            p.text = tok.decode(&p.ids, false)?;
        }
    }
    let id = state.next_id("cmpl");
    let created = now_secs();
    let prompt_tokens: u64 =
        prompts.iter().map(|p| p.ids.len() as u64).sum::<u64>() * u64::from(gen_req.n);
    let scored = score_prompts(state, faults, &prompts, echo, k).await?;
    let prepared = Prepared {
        id,
        created,
        prompts,
        scored,
        n: gen_req.n,
        echo,
        k,
        prompt_tokens,
    };
    let streams = start_generations(state, faults, &prepared.prompts, &gen_req, max_tokens)?;
    if req.stream.unwrap_or(false) {
        return Ok(stream(state, &req, prepared, streams));
    }
    let mut collected = Vec::new();
    for r in futures_util::future::join_all(
        streams
            .into_iter()
            .map(|(i, s)| async move { (i, s.collect().await) }),
    )
    .await
    {
        collected.push((r.0, r.1?));
    }
    Ok(json_response(&whole_response(state, prepared, collected)))
}

/// The request's prompts as ids, within the server's limits on their number and tokens.
fn read_prompts(state: &ServerState, prompt: &Prompt) -> Result<Vec<PromptIn>, ApiError> {
    let tok = state.tokenizer();
    let limits = state.limits();
    let count = match prompt {
        Prompt::Texts(ts) => ts.len(),
        Prompt::TokenBatches(b) => b.len(),
        Prompt::Text(_) | Prompt::Tokens(_) => 1,
    };
    if count > limits.max_prompts {
        return Err(ApiError::bad_request_code(
            format!(
                "at most {} prompts per request, not {count}",
                limits.max_prompts
            ),
            "prompt",
            "too_many_prompts",
        ));
    }
    let prompts: Vec<PromptIn> = match prompt {
        Prompt::Text(t) => vec![PromptIn {
            ids: tok.encode(t, true)?,
            text: t.clone(),
        }],
        Prompt::Texts(ts) => ts
            .iter()
            .map(|t| {
                Ok(PromptIn {
                    ids: tok.encode(t, true)?,
                    text: t.clone(),
                })
            })
            .collect::<Result<_, ApiError>>()?,
        Prompt::Tokens(ids) => vec![PromptIn {
            ids: ids.clone(),
            text: String::new(),
        }],
        Prompt::TokenBatches(b) => b
            .iter()
            .map(|ids| PromptIn {
                ids: ids.clone(),
                text: String::new(),
            })
            .collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request("prompt is empty", Some("prompt")));
    }
    let total: usize = prompts.iter().map(|p| p.ids.len()).sum();
    if total > limits.max_prompt_tokens {
        return Err(ApiError::bad_request_code(
            format!(
                "at most {} prompt tokens per request (all prompts together), not {total}",
                limits.max_prompt_tokens
            ),
            "prompt",
            "too_many_tokens",
        ));
    }
    Ok(prompts)
}

/// Prompt logprobs (`echo` with `logprobs`): one scoring per prompt, run concurrently; `None`
/// per prompt otherwise.
async fn score_prompts(
    state: &ServerState,
    faults: &RequestFaults,
    prompts: &[PromptIn],
    echo: bool,
    k: Option<usize>,
) -> Result<Vec<Option<ScoredSequence>>, ApiError> {
    let mut scored: Vec<Option<ScoredSequence>> = Vec::with_capacity(prompts.len());
    if echo && k.is_some() {
        let futs = prompts
            .iter()
            .map(|p| state.inner.backend.score(p.ids.clone(), k.unwrap_or(0)));
        for (i, r) in futures_util::future::join_all(futs)
            .await
            .into_iter()
            .enumerate()
        {
            let mut s = r?;
            faults.shift_echo(&mut s);
            faults.jitter_echo(i, &mut s);
            scored.push(Some(s));
        }
    } else {
        scored.resize_with(prompts.len(), || None);
    }
    Ok(scored)
}

/// Starts every choice's generation before any is waited on (they run concurrently); none
/// for `max_tokens: 0`. Each stream carries its choice index.
fn start_generations(
    state: &ServerState,
    faults: &RequestFaults,
    prompts: &[PromptIn],
    gen_req: &GenRequest,
    max_tokens: usize,
) -> Result<Vec<(u32, TextStream)>, ApiError> {
    let mut streams = Vec::new();
    if max_tokens > 0 {
        for (pi, p) in prompts.iter().enumerate() {
            for j in 0..gen_req.n {
                let index = pi as u32 * gen_req.n + j;
                let repeat = faults.repeat_from(index, max_tokens);
                let ts = TextStream::start(
                    state,
                    p.ids.clone(),
                    gen_req.params(state, max_tokens, j),
                    None,
                    gen_req.stops.clone(),
                    repeat,
                )?;
                streams.push((index, ts));
            }
        }
    }
    Ok(streams)
}

/// The non-streamed answer: every choice (echo, then the generated text) with its logprobs,
/// and the usage.
fn whole_response(
    state: &ServerState,
    p: Prepared,
    mut collected: Vec<(u32, Collected)>,
) -> CompletionResponse {
    let (n, k, echo) = (p.n, p.k, p.echo);
    let mut choices = Vec::new();
    let mut completion_tokens = 0u64;
    for (pi, prompt) in p.prompts.iter().enumerate() {
        for j in 0..n {
            let index = pi as u32 * n + j;
            let generated = collected
                .iter_mut()
                .find(|(i, _)| *i == index)
                .map(|(_, c)| std::mem::take(c));
            let mut text = if echo {
                prompt.text.clone()
            } else {
                String::new()
            };
            let mut lp = k.map(|_| Lp::default());
            if let (Some(lp), Some(s)) = (lp.as_mut(), p.scored[pi].as_ref().filter(|_| echo)) {
                lp.push_scored(state, s, k.unwrap_or(0));
            }
            let reason = match generated {
                Some(g) => {
                    completion_tokens += g.completion_tokens as u64;
                    if let Some(lp) = lp.as_mut() {
                        lp.push_generated(state, &g.tokens, k.unwrap_or(0));
                    }
                    text.push_str(&g.text);
                    g.reason
                }
                None => "length",
            };
            choices.push(CompletionChoice {
                index,
                text,
                logprobs: lp.map(Lp::finish),
                finish_reason: Some(reason.to_owned()),
                extra: Extra::new(),
            });
        }
    }
    CompletionResponse {
        id: p.id,
        object: "text_completion".into(),
        created: p.created,
        model: state.model_name().to_owned(),
        choices,
        usage: Some(Usage {
            prompt_tokens: p.prompt_tokens,
            completion_tokens,
            total_tokens: p.prompt_tokens + completion_tokens,
            extra: Extra::new(),
        }),
        extra: Extra::new(),
    }
}

/// The legacy parallel-array logprobs, built position by position.
#[derive(Default)]
struct Lp {
    tokens: Vec<String>,
    token_logprobs: Vec<Option<f64>>,
    top: Vec<Option<Map<String, Value>>>,
    offsets: Vec<u32>,
    /// Characters of the text so far (complete characters only: a token holding part of one
    /// adds nothing until the token completing it), so `text_offset` indexes the decoded text.
    chars: u32,
    utf8: crate::tokenizer::Utf8Stream,
}

impl Lp {
    fn push(
        &mut self,
        state: &ServerState,
        token: u32,
        logprob: Option<f32>,
        top: Option<&[EngineLogprob]>,
        k: usize,
    ) {
        let text = state.tokenizer().token_str(token).unwrap_or_default();
        self.tokens.push(text.to_owned());
        self.token_logprobs.push(logprob.map(f64::from));
        self.top.push(top.map(|alts| {
            let mut m = Map::new();
            for a in alts.iter().take(k) {
                let t = state.tokenizer().token_str(a.token).unwrap_or_default();
                m.entry(t.to_owned()).or_insert(json!(f64::from(a.logprob)));
            }
            if let Some(lp) = logprob {
                m.entry(text.to_owned()).or_insert(json!(f64::from(lp)));
            }
            m
        }));
        self.offsets.push(self.chars);
        let bytes = state.tokenizer().token_bytes(token).unwrap_or_default();
        self.chars += self.utf8.push(bytes).chars().count() as u32;
    }

    fn push_scored(&mut self, state: &ServerState, s: &ScoredSequence, k: usize) {
        for p in &s.positions {
            let top = p.logprob.map(|_| p.top.as_slice());
            self.push(state, p.token, p.logprob, top, k);
        }
    }

    fn push_generated(&mut self, state: &ServerState, toks: &[GeneratedToken], k: usize) {
        for t in toks {
            self.push(state, t.token, Some(t.logprob), Some(&t.top), k);
        }
    }

    fn finish(mut self) -> CompletionLogprobs {
        self.take()
    }

    /// The positions pushed since the last take; the text's length carries on, so a stream's
    /// `text_offset`s index the choice's whole text, as the unstreamed answer's do.
    fn take(&mut self) -> CompletionLogprobs {
        CompletionLogprobs {
            tokens: std::mem::take(&mut self.tokens),
            token_logprobs: std::mem::take(&mut self.token_logprobs),
            top_logprobs: Some(std::mem::take(&mut self.top)),
            text_offset: std::mem::take(&mut self.offsets),
            extra: Extra::new(),
        }
    }
}

/// The streamed answer: the echo chunks first (or every choice's end, for `max_tokens: 0`),
/// then each choice's pieces as they are generated, then the usage when asked.
fn stream(
    state: &ServerState,
    req: &CompletionRequest,
    p: Prepared,
    streams: Vec<(u32, TextStream)>,
) -> Response {
    let Prepared {
        id,
        created,
        prompts,
        scored,
        n,
        k,
        prompt_tokens,
        ..
    } = p;
    let model = state.model_name().to_owned();
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |index: u32,
              text: String,
              logprobs: Option<CompletionLogprobs>,
              finish: Option<&str>| {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]})
        }
    };
    let mut head = Vec::new();
    // each choice's logprobs so far (its text's length), by index
    let mut running: Vec<Lp> = (0..prompts.len() * n as usize)
        .map(|_| Lp::default())
        .collect();
    if req.echo.unwrap_or(false) {
        for (pi, p) in prompts.iter().enumerate() {
            for j in 0..n {
                let index = pi as u32 * n + j;
                let lp = match (scored[pi].as_ref(), running.get_mut(index as usize)) {
                    (Some(s), Some(lp)) => {
                        lp.push_scored(state, s, k.unwrap_or(0));
                        Some(lp.take())
                    }
                    _ => None,
                };
                head.push(chunk(index, p.text.clone(), lp, None));
            }
        }
    }
    if streams.is_empty() {
        // max_tokens 0: nothing is generated, every choice ends at once
        for index in 0..prompts.len() as u32 * n {
            head.push(chunk(index, String::new(), None, Some("length")));
        }
    }
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let st = state.clone();
    let render_chunk = chunk.clone();
    let render = Box::new(
        move |index: u32, ev: ChoiceEvent, total: &mut u64| match ev {
            ChoiceEvent::Piece(p) => {
                let lp = k.zip(running.get_mut(index as usize)).map(|(k, lp)| {
                    lp.push_generated(&st, &p.tokens, k);
                    lp.take()
                });
                vec![render_chunk(index, p.text, lp, None)]
            }
            ChoiceEvent::End {
                reason,
                completion_tokens,
            } => {
                *total += completion_tokens as u64;
                vec![render_chunk(index, String::new(), None, Some(reason))]
            }
            ChoiceEvent::Failed(_) => Vec::new(),
        },
    );
    let tail = Box::new(move |completion_tokens: u64| {
        include_usage.then(|| {
            json!({"id": id, "object": "text_completion", "created": created, "model": model, "choices": [],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}})
        })
    });
    sse_response(head, streams, render, tail)
}
