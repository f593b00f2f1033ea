//! What the detectors cost after one probe run (`Detectors::after_run`) with a full history:
//! `RUNS` (500, the default `history_runs`) prompt_logprobs runs of one endpoint in a real
//! store, each with raw per-position data of `POSITIONS` (497, the demo's average) positions at
//! top-5, every 10th round a noise-floor pair, then `SAMPLES` (21) more healthy runs, each
//! stored and judged; prints the median and the slowest `after_run` per backend. `PAIR_STATS=0`
//! stores the pairs without `stats.noise_pair`, as a store written before the scheduler kept
//! it. Not a test: it prints numbers.
//!
//!   cargo run --release -p samewise-probes --example detector_bench
//!   PAIR_STATS=0 BACKENDS=sqlite cargo run --release -p samewise-probes --example detector_bench

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use samewise_probes::AlertsConfig;
use samewise_probes::compare::{PositionInput, Side, TopEntry, encode_positions};
use samewise_probes::detect::{DetectorConfig, Detectors};
use samewise_probes::noise::repeat_summary;
use samewise_store::testing::TestDb;
use samewise_store::{Backend, ProbeRun};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v} does not parse")),
        Err(_) => Ok(default),
    }
}

/// `n` top-5 positions, the endpoint's logprobs the reference's moved by a small seeded
/// wobble (`phase` picks the wobble), so that a pair's two runs differ a little.
fn positions(n: usize, phase: u64) -> Vec<PositionInput> {
    (0..n)
        .map(|i| {
            let wobble = ((i as u64 * 2_654_435_761 + phase * 40_503) % 1_000) as f64 / 50_000.0;
            let side = |shift: f64| Side {
                actual_logprob: -0.7 + shift,
                top: (0..5u32)
                    .map(|j| TopEntry {
                        id: (i as u32 * 7 + j * 131) % 49_152,
                        logprob: -0.7 - f64::from(j) * 1.1 + shift,
                    })
                    .collect(),
            };
            PositionInput {
                actual_id: (i as u32 * 7) % 49_152,
                reference: side(0.0),
                endpoint: side(wobble),
            }
        })
        .collect()
}

fn run(t: i64, raw: Vec<u8>, kl: f64) -> ProbeRun {
    ProbeRun {
        id: 0,
        model: "smol".to_owned(),
        endpoint: "bench/smol".to_owned(),
        kind: "prompt_logprobs".to_owned(),
        started_ms: t,
        finished_ms: t + 100,
        ok: true,
        error: None,
        tokens: 600,
        stats: serde_json::json!({"kl_mean": kl, "kl_p99": kl * 5.0, "dlogprob_mean": kl,
            "top1_same": 0.98, "topk_overlap": 0.97, "positions": 497}),
        raw: Some(raw),
        repeat_of: None,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let runs: i64 = env_or("RUNS", 500)?;
    let n: usize = env_or("POSITIONS", 497)?;
    let samples: usize = env_or("SAMPLES", 21)?;
    let pair_stats = env_or("PAIR_STATS", 1u8)? != 0;
    let backends: String = env_or("BACKENDS", "sqlite,postgres".to_owned())?;
    let raw_a = encode_positions(&positions(n, 1))?;
    let raw_b = encode_positions(&positions(n, 2))?;
    let pair = {
        let s = repeat_summary(&positions(n, 1), &positions(n, 2))?;
        serde_json::json!({"kl_mean": s.kl_mean, "kl_p99": s.kl_p99,
            "dlogprob_mean": s.abs_dlogprob_mean, "top1_same": s.top1_same,
            "topk_overlap": s.topk_overlap})
    };
    println!(
        "{runs} runs of {} bytes of raw data each, a pair every 10th round, pair statistics stored: {pair_stats}",
        raw_a.len()
    );
    for name in backends.split(',') {
        let backend = match name {
            "sqlite" => Backend::Sqlite,
            "postgres" => Backend::Postgres,
            other => anyhow::bail!("unknown backend {other}"),
        };
        let db = TestDb::new(backend).await?;
        let d = Detectors::new(DetectorConfig::default(), None, &AlertsConfig::default())?;
        let kl = |i: i64| 0.002 + (i % 7) as f64 * 1e-4;
        let mut t = 0;
        let mut i = 0;
        while i < runs {
            t += 1_000;
            let first = db
                .store
                .insert_probe_run(&run(t, raw_a.clone(), kl(i)))
                .await?;
            i += 1;
            if i % 10 == 1 && i < runs {
                t += 1_000;
                let mut repeat = run(t, raw_b.clone(), kl(i));
                repeat.repeat_of = Some(first);
                if pair_stats {
                    repeat.stats["noise_pair"] = pair.clone();
                }
                db.store.insert_probe_run(&repeat).await?;
                i += 1;
            }
        }
        let mut took = Vec::with_capacity(samples);
        for s in 0..samples {
            t += 1_000;
            let mut r = run(t, raw_a.clone(), kl(s as i64));
            r.id = db.store.insert_probe_run(&r).await?;
            let start = Instant::now();
            let alerts = d.after_run(&db.store, &r).await?;
            took.push(start.elapsed());
            anyhow::ensure!(alerts.is_empty(), "a healthy run raised {alerts:?}");
        }
        took.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{name}: after_run median {:.1} ms, slowest {:.1} ms ({samples} runs)",
            ms(took[samples / 2]),
            ms(*took.last().context("no samples")?)
        );
    }
    Ok(())
}
