//! fingerprint: the endpoint's own logprobs on fixed inputs, for changed? without the
//! weights. Every round sends the same inputs (the model's first `items_per_round` texts or
//! prompts, never a rotating window, so that any two rounds are comparable) and reduces what
//! comes back to statistics that the changed? charts follow from the endpoint's own first
//! runs. Two ways of asking, the first that the endpoint answers (`stats.mode`):
//!
//! - **echo**: the logprob texts as prompt_logprobs sends them ([`super::prompt_logprobs::echo`]:
//!   `/v1/completions` with `echo`, `logprobs: k`, `max_tokens` 0, or 1 where 0 is refused):
//!   - `own_logprob_mean`: the mean logprob of the texts' tokens (the positions that have one);
//!   - `own_top1_logprob_mean`: the mean logprob of each position's most likely alternative
//!     (its confidence; the positions with alternatives);
//!   - `own_top1_agreement`: the share of those positions whose echoed token is the most
//!     likely alternative (order-sensitive: logprobs shifted against their tokens keep every
//!     mean above and collapse this);
//!   - `own_tokens`: how many prompt tokens the endpoint echoed (a different tokenizer or a
//!     cut prompt moves it by whole tokens).
//! - **chat**, where echo is refused (400, 404, 422, or an answer without prompt logprobs, as
//!   most chat-only providers answer): the completion prompts, each a greedy
//!   `/v1/chat/completions` (temperature 0, a fixed seed, `logprobs`, `top_logprobs: k`,
//!   `max_tokens` the prompt's, at most the model's), and the same reductions over the
//!   generated tokens: `own_chat_logprob_mean`, `own_chat_top1_agreement` (1 for an endpoint
//!   that decodes greedily as asked) and `own_chat_tokens` (tokens generated: a changed model
//!   says something else). The names differ from echo's, so an endpoint that starts or stops
//!   refusing echo starts new charts instead of mixing the two.
//!
//! An endpoint that refused echo is remembered ([`EchoRefusals`], the scheduler's, keyed by
//! endpoint): for an hour ([`ECHO_RETRY_MS`]) its rounds ask by chat at once instead of
//! spending two refused requests each (`max_tokens` 0, then 1) on the way there; the first round
//! after it asks echo again, so a provider that starts serving echo is fingerprinted by it.
//! Chat-mode stats say which (`echo_asked`) and keep the refusal's words (`echo_refused`).
//! The memory outlives the process: a scheduler's first fingerprint round of an endpoint
//! recalls the refusal from its stored runs ([`EchoRefusals::recall`]), so a restarted gateway
//! does not ask every chat-only provider for echo again.
//!
//! `stats.inputs` is a digest of what was sent (the way of asking, `top_k`, each text or prompt
//! and its `max_tokens`): the changed? charts follow runs with the same inputs only, so
//! changing `items_per_round` or a prompt set starts new charts instead of raising "changed".
//!
//! Nothing is compared with a reference, so the kind runs where `[probes.reference]` is not
//! configured, faithful? never judges it, and it keeps no per-position data. Its noise-floor
//! pairs (the same inputs asked twice) store how far each statistic moved
//! ([`crate::detect::fingerprint_pair_stats`]): the charts' σ is at least the largest recent
//! distance, and at least `fingerprint_min_sd`.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use serde_json::{Map, Value, json};

use super::prompt_logprobs::{echo, parse_echo};
use super::{EpPosition, Outcome, ProbeCtx, Target, call, chat_positions, usage_tokens};

/// How long an endpoint's refusal of echo is remembered before echo is asked again.
pub const ECHO_RETRY_MS: i64 = 3_600_000;

/// Endpoints that refused echo: when, and in what words.
#[derive(Debug, Default)]
pub struct EchoRefusals {
    refused: Mutex<HashMap<String, (i64, String)>>,
    /// Endpoints whose stored runs have been read for a refusal (once each).
    recalled: Mutex<HashSet<String>>,
}

impl EchoRefusals {
    /// Whether `endpoint`'s stored runs are still to be read for a refusal: true the first
    /// time an endpoint is asked about, false after.
    pub fn first_recall(&self, endpoint: &str) -> bool {
        lock(&self.recalled).insert(endpoint.to_owned())
    }

    /// Recalls `endpoint`'s refusal from its stored fingerprint runs (`runs`, in any order):
    /// the newest run that asked echo decides. A chat-mode run that asked
    /// echo was refused then, in its `echo_refused` words; an echo-mode run means echo was
    /// answered since. Runs that did not ask (the memory sent them to chat) say nothing.
    /// Returns whether a refusal was remembered.
    pub fn recall(&self, endpoint: &str, runs: &[samewise_store::ProbeRun]) -> bool {
        let mut asked: Vec<&samewise_store::ProbeRun> = runs
            .iter()
            .filter(|r| {
                r.endpoint == endpoint
                    && r.kind == "fingerprint"
                    && (r.stats["mode"] == "echo"
                        || (r.stats["mode"] == "chat" && r.stats["echo_asked"] == true))
            })
            .collect();
        asked.sort_by_key(|r| std::cmp::Reverse((r.started_ms, r.id)));
        let Some(newest) = asked.first() else {
            return false;
        };
        match newest.stats["echo_refused"].as_str() {
            Some(reason) if newest.stats["mode"] == "chat" => {
                self.record(endpoint, reason, newest.started_ms);
                true
            }
            _ => false,
        }
    }

    /// The refusal's words when `endpoint` refused echo less than [`ECHO_RETRY_MS`] before
    /// `now_ms`.
    pub fn remembered(&self, endpoint: &str, now_ms: i64) -> Option<String> {
        lock(&self.refused)
            .get(endpoint)
            .filter(|(at, _)| now_ms - at < ECHO_RETRY_MS)
            .map(|(_, reason)| reason.clone())
    }

    /// Remembers that `endpoint` refused echo at `now_ms`.
    pub fn record(&self, endpoint: &str, reason: &str, now_ms: i64) {
        lock(&self.refused).insert(endpoint.to_owned(), (now_ms, reason.to_owned()));
    }

    /// Forgets `endpoint`'s refusal (it answered echo).
    pub fn forget(&self, endpoint: &str) {
        lock(&self.refused).remove(endpoint);
    }
}

/// The lock's guard, poisoned or not (the maps stay whole: each change is one insert or
/// remove).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs one fingerprint probe: echo, or chat where echo is refused (at once where the
/// endpoint's refusal is remembered in `ctx.echo_refusals`).
pub async fn run(ctx: &ProbeCtx<'_>, target: &Target) -> Outcome {
    let now = crate::runner::now_ms();
    let memory = ctx.echo_refusals;
    if let Some(reason) = memory.and_then(|m| m.remembered(&target.endpoint, now)) {
        return chat_round(ctx, target, &reason, 0, false).await;
    }
    match echo_round(ctx, target).await {
        Round::Done(o) => {
            if let (Some(m), true) = (memory, o.ok) {
                m.forget(&target.endpoint);
            }
            o
        }
        Round::Refused { reason, tokens } => {
            if let Some(m) = memory {
                m.record(&target.endpoint, &reason, now);
            }
            chat_round(ctx, target, &reason, tokens, true).await
        }
    }
}

/// The end of an echo round.
enum Round {
    Done(Outcome),
    /// Echo logprobs are refused: ask by chat instead.
    Refused {
        reason: String,
        tokens: i64,
    },
}

/// Sums of one side's positions.
#[derive(Default)]
struct Sums {
    logprob: f64,
    /// Positions with a logprob.
    n: usize,
    top1: f64,
    /// Positions with alternatives.
    with_top: usize,
    /// Of those, how many have their own token as the most likely alternative.
    agree: usize,
}

impl Sums {
    /// Adds positions (each with whether it has a logprob); the mean logprob of those added.
    fn add<'a>(&mut self, positions: impl Iterator<Item = (&'a EpPosition, bool)>) -> Option<f64> {
        let (mut sum, mut n) = (0.0f64, 0usize);
        for (p, has) in positions {
            if has {
                sum += p.logprob;
                n += 1;
            }
            // the first of equally likely alternatives, as the endpoint listed them
            if let Some((best, lp)) = p.top.iter().reduce(|a, b| if b.1 > a.1 { b } else { a }) {
                self.top1 += lp;
                self.with_top += 1;
                self.agree += usize::from(best.text == p.token.text);
            }
        }
        self.logprob += sum;
        self.n += n;
        (n > 0).then(|| sum / n as f64)
    }

    /// The mean logprob, the mean top-1 logprob and the top-1 agreement (None without
    /// positions of each).
    fn means(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        let mean = |x: f64, n: usize| (n > 0).then(|| x / n as f64);
        (
            mean(self.logprob, self.n),
            mean(self.top1, self.with_top),
            mean(self.agree as f64, self.with_top),
        )
    }
}

async fn echo_round(ctx: &ProbeCtx<'_>, target: &Target) -> Round {
    let texts = super::window(&ctx.sets.logprob_texts, 0, ctx.cfg.items_per_round);
    let k = ctx.cfg.top_k as usize;
    let mut tokens = 0i64;
    let mut sums = Sums::default();
    let mut echoed = 0usize;
    let mut per_text = Vec::with_capacity(texts.len());
    for t in &texts {
        let answer = match echo(ctx, target, &t.text, k).await {
            Ok(v) => v,
            Err(f) if f.refused => {
                return Round::Refused {
                    reason: f.message,
                    tokens,
                };
            }
            Err(f) => return Round::Done(Outcome::failed(f.message, tokens)),
        };
        tokens += usage_tokens(&answer);
        let Some(ep) = parse_echo(&answer, &t.text, k) else {
            return Round::Refused {
                reason: "the endpoint returned no prompt logprobs for echo + logprobs".into(),
                tokens,
            };
        };
        if ep.is_empty() {
            return Round::Done(Outcome::failed(
                "the endpoint echoed no prompt tokens",
                tokens,
            ));
        }
        echoed += ep.len();
        let mean = sums.add(ep.iter().map(|(p, has)| (p, *has)));
        per_text.push(json!({"id": t.id, "tokens": ep.len(), "logprob_mean": mean}));
    }
    let mut stats = Map::new();
    stats.insert("mode".into(), json!("echo"));
    let sent = texts.iter().map(|t| t.text.as_str());
    stats.insert("inputs".into(), json!(digest("echo", k, sent)));
    stats.insert("texts".into(), json!(per_text));
    stats.insert("own_tokens".into(), json!(echoed));
    Round::Done(finish(stats, &sums, "own", k, tokens))
}

/// The chat round; `asked`: whether echo was asked (and refused) this round, not remembered.
async fn chat_round(
    ctx: &ProbeCtx<'_>,
    target: &Target,
    refused: &str,
    spent: i64,
    asked: bool,
) -> Outcome {
    let prompts = super::window(&ctx.sets.completion_prompts, 0, ctx.cfg.items_per_round);
    let k = ctx.cfg.top_k as usize;
    let mut tokens = spent;
    let mut sums = Sums::default();
    let mut generated = 0usize;
    let mut per_prompt = Vec::with_capacity(prompts.len());
    for p in &prompts {
        let body = json!({"model": target.provider_model, "messages": [{"role": "user", "content": p.prompt}],
                          "temperature": 0.0, "max_tokens": p.max_tokens.min(ctx.cfg.max_tokens), "logprobs": true,
                          "top_logprobs": k, "frequency_penalty": 0.0, "presence_penalty": 0.0, "seed": 0});
        let answer = match call(ctx, target, "/chat/completions", &body).await {
            Ok(v) => v,
            Err(e) => return Outcome::failed(format!("{refused}; by chat: {e}"), tokens),
        };
        tokens += usage_tokens(&answer);
        let content = answer
            .pointer("/choices/0/logprobs/content")
            .and_then(Value::as_array);
        let Some(ep) = content.and_then(|c| chat_positions(c)) else {
            return Outcome::failed(
                format!("{refused}; by chat: no completion logprobs (refused or unsupported)"),
                tokens,
            );
        };
        generated += ep.len();
        let mean = sums.add(ep.iter().map(|p| (p, true)));
        per_prompt.push(json!({"id": p.id, "tokens": ep.len(), "logprob_mean": mean}));
    }
    let mut stats = Map::new();
    stats.insert("mode".into(), json!("chat"));
    let sent: Vec<String> = prompts
        .iter()
        .map(|p| format!("{}\n{}", p.max_tokens.min(ctx.cfg.max_tokens), p.prompt))
        .collect();
    stats.insert(
        "inputs".into(),
        json!(digest("chat", k, sent.iter().map(String::as_str))),
    );
    stats.insert("echo_refused".into(), json!(refused));
    stats.insert("echo_asked".into(), json!(asked));
    stats.insert("prompts".into(), json!(per_prompt));
    stats.insert("own_chat_tokens".into(), json!(generated));
    finish(stats, &sums, "own_chat", k, tokens)
}

/// 16 hex digits of the SHA-256 of the way of asking, `k` and each input in order.
fn digest<'a>(mode: &str, k: usize, inputs: impl Iterator<Item = &'a str>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(format!("{mode} top_k={k}").as_bytes());
    for i in inputs {
        // length-prefixed, so that no two lists of inputs hash alike by their joins
        h.update((i.len() as u64).to_le_bytes());
        h.update(i.as_bytes());
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The outcome with the means of `sums` under `prefix` (`own` or `own_chat`); a failure when
/// no position had a logprob.
fn finish(
    mut stats: Map<String, Value>,
    sums: &Sums,
    prefix: &str,
    k: usize,
    tokens: i64,
) -> Outcome {
    let (mean, top1, agreement) = sums.means();
    let Some(mean) = mean else {
        return Outcome::failed(
            "the endpoint returned no token with a logprob (refused or unsupported)",
            tokens,
        );
    };
    stats.insert("top_k".into(), json!(k));
    stats.insert("positions".into(), json!(sums.n));
    stats.insert(format!("{prefix}_logprob_mean"), json!(mean));
    // the chat mode's top-1 logprob is its logprob where it decodes greedily: not charted
    if let (Some(top1), "own") = (top1, prefix) {
        stats.insert("own_top1_logprob_mean".into(), json!(top1));
    }
    if let Some(a) = agreement {
        stats.insert(format!("{prefix}_top1_agreement"), json!(a));
    }
    Outcome::done(tokens, stats)
}
