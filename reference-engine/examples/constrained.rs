//! Constrained-decoding benchmark (not a test): for named schemas, decode tokens/s with the
//! constraint against free decoding of the same number of tokens from the same prompt
//! (greedy, batch 1; constrained and free runs alternate), the schema compile time, and the per-token mask cost (replaying the
//! constrained output through a fresh matcher, with and without its mask cache).
//!
//! `cargo run -p samewise-engine --example constrained -- --model PATH [--threads 2] [--runs 3]`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use samewise_engine::GgufFile;
use samewise_engine::Tokenizer;
use samewise_engine::constrain::{self, Constraint, Grammar, Matcher, Spec, TokenTrie};
use samewise_engine::{Engine, GenerateParams, LoadOptions};
use serde_json::{Value, json};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn schemas() -> Vec<(&'static str, Option<Value>, &'static str)> {
    let person = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
        "required": ["name", "age", "city", "tags"], "additionalProperties": false});
    vec![
        (
            "people (array of 6 objects)",
            Some(
                json!({"type": "object", "properties": {"people": {"type": "array", "items": person, "minItems": 6, "maxItems": 6}},
                        "required": ["people"], "additionalProperties": false}),
            ),
            "List six famous scientists with their age and city as JSON.",
        ),
        (
            "flight (nested, anyOf null, $ref)",
            Some(json!({"$defs": {"leg": {"type": "object", "properties": {
                    "from": {"type": "string", "minLength": 3, "maxLength": 3}, "to": {"type": "string", "minLength": 3, "maxLength": 3},
                    "date": {"type": "string", "maxLength": 10}, "seat": {"anyOf": [{"enum": ["aisle", "window"]}, {"type": "null"}]},
                    "price": {"type": "number", "minimum": 0, "maximum": 5000}},
                  "required": ["from", "to", "date", "seat", "price"], "additionalProperties": false}},
                "type": "object", "properties": {"legs": {"type": "array", "items": {"$ref": "#/$defs/leg"}, "minItems": 4, "maxItems": 4},
                  "notes": {"type": "string", "maxLength": 60}}, "required": ["legs", "notes"], "additionalProperties": false})),
            "Plan a four-leg flight itinerary around Europe as JSON.",
        ),
        (
            "regions (300-value enum, 5 picks)",
            Some(
                json!({"type": "object", "properties": {"regions": {"type": "array",
                    "items": {"enum": (0..300).map(|i| format!("eu-region-{i:03}")).collect::<Vec<_>>()},
                    "minItems": 5, "maxItems": 5}},
                "required": ["regions"], "additionalProperties": false}),
            ),
            "Pick five data-centre regions for a European deployment as JSON.",
        ),
        (
            "json_object (free JSON)",
            None,
            "Describe the solar system's planets as a JSON object.",
        ),
    ]
}

fn main() -> anyhow::Result<()> {
    let mut model = None;
    let mut threads = 2;
    let mut runs = 3;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--model" => model = args.next().map(PathBuf::from),
            "--threads" => threads = args.next().and_then(|v| v.parse().ok()).unwrap_or(2),
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).unwrap_or(3),
            other => anyhow::bail!(
                "unknown argument {other} (use --model PATH [--threads N] [--runs N])"
            ),
        }
    }
    let model = model.ok_or_else(|| anyhow::anyhow!("--model PATH is required"))?;
    let engine = Engine::load(
        &model,
        LoadOptions {
            threads,
            ..LoadOptions::default()
        },
    )?;
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model)?)?;
    let t0 = Instant::now();
    let entries: Vec<(&[u8], bool)> = (0..tok.vocab_size() as u32)
        .map(|t| Ok((tok.token_bytes(t)?, tok.is_special(t))))
        .collect::<anyhow::Result<_>>()?;
    let stops: Vec<u32> = tok.stop_ids().iter().copied().collect();
    let trie = Arc::new(TokenTrie::new(&entries, &stops));
    println!(
        "vocabulary trie: {} tokens, {} nodes, built in {:.1} ms; threads {threads}, runs {runs} (medians)",
        tok.vocab_size(),
        trie.node_count(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    println!();
    println!(
        "| schema | compile ms | tokens | free tok/s | constrained tok/s | ratio | mask µs/token (cached) | mask µs/token (uncached) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, schema, instruction) in schemas() {
        let spec = Spec::Json { schema };
        let compile_ms = median(
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    let g = constrain::compile(&spec);
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    g.map(|_| ms).map_err(|e| anyhow::anyhow!("{e:?}"))
                })
                .collect::<anyhow::Result<_>>()?,
        );
        let grammar: Arc<Grammar> =
            Arc::new(constrain::compile(&spec).map_err(|e| anyhow::anyhow!("{e:?}"))?);
        let c = Constraint {
            grammar,
            trie: Arc::clone(&trie),
        };
        let prompt_text =
            format!("<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n");
        let prompt = tok.encode(&prompt_text, false)?;
        let cp = GenerateParams {
            max_tokens: 400,
            stop_token_ids: stops.clone(),
            ..GenerateParams::default()
        };
        // constrained and free runs alternate, so load from elsewhere on the machine hits both
        let g = engine.generate_constrained(&prompt, &cp, Some(c.clone()), &mut |_| true)?;
        let out: Vec<u32> = g.tokens.iter().map(|t| t.token).collect();
        let n = out.len();
        // free decoding of as many tokens, stop tokens ignored so it runs the same length
        let fp = GenerateParams {
            max_tokens: n.max(1),
            stop_token_ids: Vec::new(),
            ..GenerateParams::default()
        };
        let (mut con, mut free) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            let g = engine.generate_constrained(&prompt, &cp, Some(c.clone()), &mut |_| true)?;
            con.push(g.tokens.len() as f64 / t.elapsed().as_secs_f64());
            let t = Instant::now();
            let g = engine.generate(&prompt, &fp, &mut |_| true)?;
            free.push(g.tokens.len() as f64 / t.elapsed().as_secs_f64());
        }
        // mask cost, replaying the constrained output through a matcher (its cache on)
        let mut per = Vec::new();
        for _ in 0..runs {
            let mut m = Matcher::new(c.clone());
            let t = Instant::now();
            for &id in &out {
                let _ = m.allowed();
                m.accept(id);
            }
            per.push(t.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64);
        }
        let cached = median(per);
        let (f, k) = (median(free), median(con));
        println!(
            "| {name} | {compile_ms:.2} | {n} | {f:.1} | {k:.1} | {:.2} | {:.0} | {:.0} |",
            k / f,
            cached,
            mask_uncached(&c, &out, runs)
        );
        let text = tok.decode(&out, true)?;
        println!(
            "<!-- {name}: {} -->",
            text.chars().take(160).collect::<String>()
        );
    }
    Ok(())
}

/// Per-token mask cost without the matcher's mask cache: each state's mask computed by a
/// fresh walk of the trie.
fn mask_uncached(c: &Constraint, out: &[u32], runs: usize) -> f64 {
    let mut per = Vec::new();
    for _ in 0..runs {
        let mut state = c.grammar.start();
        let mut mask = constrain::TokenSet::new(c.trie.vocab());
        let mut scratch = Vec::new();
        let mut spent = 0.0;
        for &id in out {
            let t = Instant::now();
            c.trie
                .fill_mask(&c.grammar, &state, &mut mask, &mut scratch);
            spent += t.elapsed().as_secs_f64();
            state.advance_all(&c.grammar, c.trie.token_bytes(id));
        }
        per.push(spent * 1e6 / out.len().max(1) as f64);
    }
    median(per)
}
