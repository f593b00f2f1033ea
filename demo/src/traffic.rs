//! The demo's traffic generator: a few concurrent clients sending a realistic mix of the
//! official OpenAI request shapes through the gateway, as an application would — chat,
//! streamed chat (with `stream_options.include_usage`), tool calls (`tools` with
//! `tool_choice` "required" or a named function), long prompts (a ~700-token document and a
//! question about it) and logprobs (`logprobs` + `top_logprobs`).
//!
//! It is a closed loop (each client sends its next request when the previous one finished),
//! so on a busy machine it slows down instead of piling up. It counts what it sent and what
//! came back per shape; which endpoint served what is the gateway's business (request
//! records), not the client's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The request shapes, with their share of the mix (weights out of [`Shape::TOTAL_WEIGHT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A short chat completion.
    Chat,
    /// The same, streamed.
    Stream,
    /// A request with tools that must be called.
    Tools,
    /// A long document and a question about it.
    Long,
    /// A chat completion with per-token logprobs.
    Logprobs,
}

impl Shape {
    /// Every shape with its weight in the mix.
    pub const MIX: [(Shape, u32); 5] = [
        (Shape::Chat, 3),
        (Shape::Stream, 2),
        (Shape::Tools, 5),
        (Shape::Long, 1),
        (Shape::Logprobs, 1),
    ];
    /// Sum of the weights.
    pub const TOTAL_WEIGHT: u32 = 12;

    /// Its name in the summary.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Chat => "chat",
            Shape::Stream => "stream",
            Shape::Tools => "tools",
            Shape::Long => "long",
            Shape::Logprobs => "logprobs",
        }
    }

    fn index(self) -> usize {
        Shape::MIX.iter().position(|(s, _)| *s == self).unwrap_or(0)
    }

    fn pick(rng: &mut StdRng) -> Shape {
        let mut r = rng.random_range(0..Shape::TOTAL_WEIGHT);
        for (s, w) in Shape::MIX {
            if r < w {
                return s;
            }
            r -= w;
        }
        Shape::Chat
    }
}

/// Counters per shape.
#[derive(Debug, Default)]
pub struct Counts {
    /// Requests sent.
    pub sent: AtomicU64,
    /// Answered 2xx with a complete body.
    pub ok: AtomicU64,
    /// Answered with an error status, or the body broke off.
    pub failed: AtomicU64,
}

/// What the generator has done so far.
#[derive(Debug, Default)]
pub struct Stats {
    /// Per shape, in [`Shape::MIX`] order.
    pub shapes: [Counts; 5],
}

impl Stats {
    /// `(name, sent, ok, failed)` per shape.
    pub fn snapshot(&self) -> Vec<(&'static str, u64, u64, u64)> {
        Shape::MIX
            .iter()
            .zip(&self.shapes)
            .map(|((s, _), c)| {
                (
                    s.name(),
                    c.sent.load(Ordering::Relaxed),
                    c.ok.load(Ordering::Relaxed),
                    c.failed.load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}

/// Where and how to send.
#[derive(Debug, Clone)]
pub struct TrafficConfig {
    /// The gateway's base URL (`http://127.0.0.1:8080`).
    pub base_url: String,
    /// A samewise API key.
    pub key: String,
    /// The logical model.
    pub model: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Seed of the mix and the prompts.
    pub seed: u64,
}

/// The running generator.
#[derive(Debug)]
pub struct Traffic {
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Its counters.
    pub stats: Arc<Stats>,
}

impl Traffic {
    /// Starts `cfg.clients` clients.
    pub fn spawn(cfg: TrafficConfig) -> Traffic {
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let stats = Arc::new(Stats::default());
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap_or_default();
        for i in 0..cfg.clients {
            let cfg = cfg.clone();
            let (stop, stats, http) = (stop.clone(), stats.clone(), http.clone());
            tasks.spawn(async move {
                let mut rng = StdRng::seed_from_u64(cfg.seed ^ ((i as u64 + 1) * 0x9e37_79b9));
                while !stop.is_cancelled() {
                    let shape = Shape::pick(&mut rng);
                    let body = request(shape, &cfg.model, &mut rng);
                    let counts = &stats.shapes[shape.index()];
                    counts.sent.fetch_add(1, Ordering::Relaxed);
                    let sent = tokio::select! {
                        () = stop.cancelled() => break,
                        r = send(&http, &cfg, &body) => r,
                    };
                    match sent {
                        Ok(()) => counts.ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            tracing::debug!(shape = shape.name(), error = %e, "demo request failed");
                            counts.failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            });
        }
        tasks.close();
        Traffic { stop, tasks, stats }
    }

    /// Stops every client (an in-flight request is abandoned) and waits for them.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

/// Sends one request and reads its whole answer (a stream to its end).
async fn send(http: &reqwest::Client, cfg: &TrafficConfig, body: &Value) -> Result<(), String> {
    let mut res = http
        .post(format!("{}/v1/chat/completions", cfg.base_url))
        .bearer_auth(&cfg.key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = res.status();
    let mut text: Vec<u8> = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(|e| e.to_string())? {
        text.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&text)));
    }
    if body["stream"] == json!(true) {
        let t = String::from_utf8_lossy(&text);
        if !t.contains("data: [DONE]") || t.contains("\"error\"") {
            return Err("the stream ended without [DONE] or with an error event".to_owned());
        }
    }
    Ok(())
}

const SYSTEM: &str = "You are a helpful assistant. Answer briefly.";

const QUESTIONS: [&str; 10] = [
    "What is the capital of France?",
    "Give me three tips for writing clear emails.",
    "Explain what a hash table is in one paragraph.",
    "Why is the sky blue?",
    "Write a haiku about autumn rain.",
    "What does HTTP status 429 mean?",
    "How do I boil an egg?",
    "Name two differences between TCP and UDP.",
    "What is photosynthesis?",
    "Suggest a name for a small bakery.",
];

const CITIES: [&str; 6] = ["Paris", "Tokyo", "Lima", "Oslo", "Nairobi", "Toronto"];

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "book_table",
            "description": "Book a restaurant table.",
            "parameters": {"type": "object", "properties": {
                "restaurant": {"type": "string"},
                "people": {"type": "integer", "minimum": 1},
                "time": {"type": "string", "description": "HH:MM"}},
                "required": ["restaurant", "people"], "additionalProperties": false}}}
    ])
}

/// Sentences of the long document, assembled in a seeded order.
const DOC: [&str; 16] = [
    "The Harbor Street library opened its new reading room in the spring, after two years of repairs to the roof and the old brick walls.",
    "Visitors may borrow up to twelve books at a time, and the loan period for most items is three weeks, with one renewal allowed online.",
    "The children's corner hosts a story hour every Saturday morning at ten, led by volunteers from the neighbourhood association.",
    "Study rooms can be reserved for two hours per day; groups larger than six people should ask the front desk for the seminar room instead.",
    "The library's archive holds maps of the harbor drawn between 1820 and 1910, which researchers may consult by appointment only.",
    "Late fees were abolished last year, but lost items must still be replaced or paid for at the listed price.",
    "Wireless internet is free for everyone; the network name is posted at the entrance and changes every month.",
    "The café on the ground floor is run by a local cooperative and closes one hour before the library itself.",
    "Printing costs ten cents per black-and-white page and fifty cents per colour page, payable by card at the machine.",
    "A new collection of audiobooks is available through the library's app, with up to five titles on loan per member.",
    "Volunteers repaired more than four hundred damaged books during the winter, using a bookbinding workshop in the basement.",
    "On public holidays the library is closed, except for the book return slot, which stays open day and night.",
    "The monthly film club shows classic movies on the first Friday of each month in the lecture hall on the second floor.",
    "Members can suggest purchases through a form at the front desk; the acquisitions team reviews suggestions every two weeks.",
    "The garden behind the building was planted by students from the nearby school and is open to readers in good weather.",
    "Accessibility improvements include a new lift, wider aisles and large-print editions of the most requested novels.",
];

const DOC_QUESTIONS: [&str; 4] = [
    "According to the document, how many books can a visitor borrow at a time?",
    "According to the document, when is the children's story hour?",
    "According to the document, how much does a colour page cost to print?",
    "According to the document, what happens on public holidays?",
];

/// The body of one request of `shape`.
pub fn request(shape: Shape, model: &str, rng: &mut StdRng) -> Value {
    let q = QUESTIONS[rng.random_range(0..QUESTIONS.len())];
    let seed = rng.random_range(0..1_000_000u32);
    match shape {
        Shape::Chat => json!({
            "model": model,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            "max_tokens": 24, "temperature": 0.7, "seed": seed,
        }),
        Shape::Stream => json!({
            "model": model,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            "max_tokens": 24, "temperature": 0.7, "seed": seed, "stream": true,
            "stream_options": {"include_usage": true},
        }),
        Shape::Tools => {
            let city = CITIES[rng.random_range(0..CITIES.len())];
            let (content, choice) = if rng.random_bool(0.5) {
                (
                    format!("What's the weather like in {city} right now?"),
                    json!({"type": "function", "function": {"name": "get_weather"}}),
                )
            } else {
                (
                    format!(
                        "Book a table for {} at Chez Lune in {city} at 19:30.",
                        rng.random_range(2..7)
                    ),
                    json!("required"),
                )
            };
            json!({
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "tools": tools(), "tool_choice": choice, "parallel_tool_calls": false,
                "max_tokens": 64, "temperature": 0.0,
            })
        }
        Shape::Long => {
            let mut sentences: Vec<&str> = Vec::with_capacity(40);
            for _ in 0..36 {
                sentences.push(DOC[rng.random_range(0..DOC.len())]);
            }
            let question = DOC_QUESTIONS[rng.random_range(0..DOC_QUESTIONS.len())];
            json!({
                "model": model,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": format!("{}\n\n{question}", sentences.join(" "))}
                ],
                "max_tokens": 16, "temperature": 0.0,
            })
        }
        Shape::Logprobs => json!({
            "model": model,
            "messages": [{"role": "user", "content": q}],
            "max_tokens": 12, "temperature": 0.0, "logprobs": true, "top_logprobs": 3,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_weights_add_up_and_every_shape_is_drawn() {
        assert_eq!(
            Shape::MIX.iter().map(|(_, w)| w).sum::<u32>(),
            Shape::TOTAL_WEIGHT
        );
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen = [0u32; 5];
        for _ in 0..2000 {
            seen[Shape::pick(&mut rng).index()] += 1;
        }
        for ((s, w), n) in Shape::MIX.iter().zip(seen) {
            let want = 2000.0 * f64::from(*w) / f64::from(Shape::TOTAL_WEIGHT);
            assert!(
                (f64::from(n) - want).abs() < want * 0.25 + 10.0,
                "{s:?}: {n} vs {want}"
            );
        }
    }

    #[test]
    fn request_shapes_are_the_official_ones() {
        let mut rng = StdRng::seed_from_u64(1);
        let t = request(Shape::Tools, "m", &mut rng);
        assert_eq!(t["tools"].as_array().map(Vec::len), Some(2));
        assert!(t["tool_choice"] == json!("required") || t["tool_choice"]["type"] == "function");
        let s = request(Shape::Stream, "m", &mut rng);
        assert_eq!(s["stream_options"]["include_usage"], json!(true));
        let l = request(Shape::Long, "m", &mut rng);
        let words = l["messages"][1]["content"]
            .as_str()
            .map_or(0, |c| c.split_whitespace().count());
        assert!(words > 500, "{words} words is not a long prompt");
        let p = request(Shape::Logprobs, "m", &mut rng);
        assert_eq!(p["top_logprobs"], json!(3));
    }
}
