//! From generated tokens to response text: incremental detokenisation that never splits a
//! UTF-8 character, stop strings (the text ends before the first match, or after it when
//! asked; text that could be the start of a match is held back until it cannot), and the
//! tokens behind each piece of text (for logprobs).

use std::collections::VecDeque;

use crate::batcher::GenEvent;
use crate::constrain::Constraint;
use crate::engine::{FinishReason, GenerateParams, GeneratedToken};
use crate::tokenizer::Utf8Stream;

use super::faults::GenSource;
use super::{ApiError, ServerState};

/// Where a choice's text ends at a stop string.
#[derive(Debug, Clone, Default)]
pub(crate) struct StopStrings {
    /// The stop strings as asked (empty ones are ignored).
    pub strings: Vec<String>,
    /// The match stays at the end of the text (vLLM's `include_stop_str_in_output`).
    pub include: bool,
    /// Not looked for until more than this many tokens are generated (vLLM's `min_tokens`).
    pub after_tokens: usize,
}

/// A piece of one choice's output.
#[derive(Debug, Default)]
pub(crate) struct Piece {
    /// Text released by these tokens (may be empty while a character or a possible stop
    /// string is incomplete).
    pub text: String,
    /// The tokens behind it, in order.
    pub tokens: Vec<GeneratedToken>,
}

/// What a choice's stream yields.
#[derive(Debug)]
pub(crate) enum ChoiceEvent {
    /// More output.
    Piece(Piece),
    /// The choice ended: OpenAI's finish reason and the tokens generated.
    End {
        reason: &'static str,
        completion_tokens: usize,
    },
    /// The generation failed.
    Failed(ApiError),
}

/// One choice's output as it is generated.
pub(crate) struct TextStream {
    /// For token bytes and special-token checks.
    state: ServerState,
    /// Events from the backend (through the profile's repeat bug); dropped to cancel the
    /// generation.
    rx: Option<GenSource>,
    /// Bytes to text.
    utf8: Utf8Stream,
    /// Stop strings (non-empty ones).
    stops: Vec<String>,
    /// A match stays in the text.
    include_stop: bool,
    /// Stop strings are looked for once more tokens than this are generated.
    stops_after: usize,
    /// Chars held back so a stop string split across tokens is still found.
    hold_chars: usize,
    /// Text not yet released.
    held: String,
    /// Tokens not yet released.
    tokens: Vec<GeneratedToken>,
    /// Tokens received.
    count: usize,
    /// Events ready to hand out.
    queue: VecDeque<ChoiceEvent>,
}

/// A finished choice, collected.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub text: String,
    pub tokens: Vec<GeneratedToken>,
    pub reason: &'static str,
    pub completion_tokens: usize,
}

impl TextStream {
    /// Starts generating `prompt` with `params` (held to `constraint`, if any); `stops` are
    /// stop strings; `repeat_at`: the profile's repeat bug strikes at this generated token
    /// ([`GenSource`]).
    pub(crate) fn start(
        state: &ServerState,
        prompt: Vec<u32>,
        params: GenerateParams,
        constraint: Option<Constraint>,
        stops: StopStrings,
        repeat_at: Option<usize>,
    ) -> Result<Self, ApiError> {
        let (max_tokens, prompt_tokens) = (params.max_tokens, prompt.len());
        let rx = GenSource::new(
            state.inner.backend.generate(prompt, params, constraint)?,
            repeat_at,
            max_tokens,
            prompt_tokens,
        );
        let StopStrings {
            strings,
            include: include_stop,
            after_tokens: stops_after,
        } = stops;
        let stops: Vec<String> = strings.into_iter().filter(|s| !s.is_empty()).collect();
        let hold_chars = stops
            .iter()
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        Ok(Self {
            state: state.clone(),
            rx: Some(rx),
            utf8: Utf8Stream::default(),
            stops,
            include_stop,
            stops_after,
            hold_chars,
            held: String::new(),
            tokens: Vec::new(),
            count: 0,
            queue: VecDeque::new(),
        })
    }

    /// The next event; None after the end.
    pub(crate) async fn next(&mut self) -> Option<ChoiceEvent> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Some(ev);
            }
            let rx = self.rx.as_mut()?;
            match rx.recv().await {
                Some(GenEvent::Token(t)) => {
                    self.count += 1;
                    let tok = &self.state.inner.tokenizer;
                    if !tok.is_special(t.token) {
                        let bytes = tok.token_bytes(t.token).unwrap_or_default();
                        let text = self.utf8.push(bytes);
                        self.held.push_str(&text);
                    }
                    self.tokens.push(t);
                    if let Some(at) = self.find_stop() {
                        self.held.truncate(at);
                        self.end("stop");
                        continue;
                    }
                    let release = self.releasable();
                    if release > 0 {
                        let text: String = self.held.drain(..release).collect();
                        return Some(ChoiceEvent::Piece(Piece {
                            text,
                            tokens: std::mem::take(&mut self.tokens),
                        }));
                    }
                }
                Some(GenEvent::Done(finish)) => {
                    let rest = self.utf8.finish();
                    self.held.push_str(&rest);
                    if let Some(at) = self.find_stop() {
                        self.held.truncate(at);
                        self.end("stop");
                        continue;
                    }
                    let reason = match finish.reason {
                        FinishReason::Length => "length",
                        FinishReason::Stop | FinishReason::Cancelled => "stop",
                    };
                    self.end(reason);
                }
                Some(GenEvent::Error(e)) => {
                    self.rx = None;
                    return Some(ChoiceEvent::Failed(e.into()));
                }
                None => {
                    self.rx = None;
                    return Some(ChoiceEvent::Failed(ApiError::new(
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        "generation ended unexpectedly",
                        "server_error",
                        None,
                    )));
                }
            }
        }
    }

    /// Runs the choice to its end and returns everything.
    pub(crate) async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut out = Collected::default();
        while let Some(ev) = self.next().await {
            match ev {
                ChoiceEvent::Piece(p) => {
                    out.text.push_str(&p.text);
                    out.tokens.extend(p.tokens);
                }
                ChoiceEvent::End {
                    reason,
                    completion_tokens,
                } => {
                    out.reason = reason;
                    out.completion_tokens = completion_tokens;
                }
                ChoiceEvent::Failed(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Queues the last piece and the end; drops the receiver (cancelling the generation).
    fn end(&mut self, reason: &'static str) {
        self.rx = None;
        let text = std::mem::take(&mut self.held);
        let tokens = std::mem::take(&mut self.tokens);
        if !text.is_empty() || !tokens.is_empty() {
            self.queue
                .push_back(ChoiceEvent::Piece(Piece { text, tokens }));
        }
        self.queue.push_back(ChoiceEvent::End {
            reason,
            completion_tokens: self.count,
        });
    }

    /// Where the held text ends at its earliest stop-string match (before the match, or after
    /// it with `include_stop`); none before `stops_after` tokens.
    fn find_stop(&self) -> Option<usize> {
        if self.count <= self.stops_after {
            return None;
        }
        self.stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s.len())))
            .min()
            .map(|(at, len)| if self.include_stop { at + len } else { at })
    }

    /// Bytes of held text that can be released: all but the last `hold_chars` chars.
    fn releasable(&self) -> usize {
        if self.hold_chars == 0 {
            return self.held.len();
        }
        let n = self.held.chars().count();
        if n <= self.hold_chars {
            return 0;
        }
        self.held
            .char_indices()
            .nth(n - self.hold_chars)
            .map_or(self.held.len(), |(i, _)| i)
    }
}
