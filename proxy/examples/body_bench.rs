//! The request body's check and per-endpoint rewrite (`ClientRequest::parse` then `body_for`),
//! timed on three bodies: the proxy benchmark's chat request, a streamed request with tools,
//! and a 40-message conversation; then the request with tools again as the gateway parses it,
//! with a [`ToolsCache`] that holds its tools from the second request on. Not a test: it prints
//! nanoseconds per body.
//!
//! `cargo run --release -p samewise-proxy --example body_bench [ITERATIONS]`

use std::hint::black_box;
use std::time::Instant;

use samewise_proxy::{ClientRequest, Route, ToolsCache};

fn main() {
    let iterations: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let bench = br#"{"model":"bench","messages":[{"role":"user","content":"Benchmark request: reply with a short greeting."}],"max_tokens":32}"#.to_vec();
    let tools = br#"{"model":"bench","stream":true,"temperature":0.2,"messages":[{"role":"system","content":"You call tools."},{"role":"user","content":"What is the weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}}}],"tool_choice":"auto","provider":{"order":["a","b"]}}"#.to_vec();
    let turn = r#"{"role":"user","content":"Tell me more about the history of the city, its rivers and its bridges, in a few sentences."},{"role":"assistant","content":"The city grew along the river; its bridges date from several centuries, each rebuilt after floods."}"#;
    let long = format!(
        r#"{{"model":"bench","messages":[{}],"max_tokens":256,"seed":7}}"#,
        vec![turn; 20].join(",")
    )
    .into_bytes();
    let cache = ToolsCache::default();
    for (name, body, cache) in [
        ("bench chat", &bench, None),
        ("tools, stream", &tools, None),
        ("40 messages", &long, None),
        ("tools, held", &tools, Some(&cache)),
    ] {
        // warm up, then time
        for _ in 0..iterations / 10 {
            run(body, cache);
        }
        let t = Instant::now();
        for _ in 0..iterations {
            run(body, cache);
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(iterations);
        println!("{name:14} {:6} bytes  {ns:8.0} ns per body", body.len());
    }
}

fn run(body: &[u8], cache: Option<&ToolsCache>) {
    let body = bytes::Bytes::copy_from_slice(black_box(body));
    let req = ClientRequest::parse_cached(Route::Chat, body, cache)
        .unwrap_or_else(|e| panic!("{}", e.body().to_json()));
    let out = req
        .body_for("upstream/model-1")
        .unwrap_or_else(|e| panic!("{}", e.body().to_json()));
    black_box(out);
}
