//! `mock-upstream`: the testkit's [`MockUpstream`] as a process, for the proxy benchmark
//! (`bench/proxy/run.sh`) and for trying a proxy config by hand.
//!
//! It prints `listening on http://ADDR` on stdout once bound and serves until SIGINT/SIGTERM.
//! Requests are counted but not recorded (a load test would pile them up). With `--chaos SEED`
//! every completion is answered from a seeded fault stream (`samewise_testkit::Chaos`; its
//! slow-loris gap and slow head set by `--loris-gap-ms` and `--slow-head-ms`, default 300 and
//! 200), for the chaos harness (`bench/proxy/chaos.sh`). With `--pieces N` the answer's text is N
//! pieces (one streamed delta each: a chat stream is then N + 4 events with the role, finish,
//! usage and `[DONE]` events) instead of the default six.

use std::process::ExitCode;

use std::time::Duration;

use samewise_testkit::{Behavior, Chaos, ChaosTimes, MockUpstream, Reply};

const USAGE: &str =
    "usage: mock-upstream [--listen ADDR] [--name NAME] [--model ID]... [--never-ends | --hang]
                     [--pieces N] [--chaos SEED [--loris-gap-ms MS] [--slow-head-ms MS]]";

fn main() -> ExitCode {
    let mut builder = MockUpstream::builder().record(false);
    let mut args = std::env::args().skip(1);
    let (mut chaos_seed, mut loris_ms, mut head_ms) = (None::<u64>, 300u64, 200u64);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        let step = match arg.as_str() {
            "--listen" => value("--listen").map(|v| builder.clone().bind(&v)),
            "--name" => value("--name").map(|v| builder.clone().name(&v)),
            "--model" => value("--model").map(|v| builder.clone().model(&v)),
            "--never-ends" => Ok(builder.clone().default_behavior(Behavior::NeverEnds)),
            "--hang" => Ok(builder.clone().default_behavior(Behavior::Hang)),
            "--pieces" => value("--pieces").and_then(|v| {
                let n = v
                    .parse::<usize>()
                    .map_err(|_| format!("--pieces: not a count: {v}"))?;
                let content = (0..n).map(|i| format!(" piece{i}")).collect();
                Ok(builder.clone().default_behavior(Behavior::Ok(Reply {
                    content: Some(content),
                    ..Reply::default()
                })))
            }),
            "--chaos" | "--loris-gap-ms" | "--slow-head-ms" => {
                let flag = arg.clone();
                value(&flag).and_then(|v| {
                    let n = v
                        .parse::<u64>()
                        .map_err(|_| format!("{flag}: not a number: {v}"))?;
                    match flag.as_str() {
                        "--chaos" => chaos_seed = Some(n),
                        "--loris-gap-ms" => loris_ms = n,
                        _ => head_ms = n,
                    }
                    Ok(builder.clone())
                })
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => Err(format!("unknown argument {other}")),
        };
        match step {
            Ok(b) => builder = b,
            Err(e) => {
                eprintln!("mock-upstream: {e}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(seed) = chaos_seed {
        builder = builder.chaos(Chaos::new(
            seed,
            ChaosTimes {
                loris_gap: Duration::from_millis(loris_ms),
                slow_head: Duration::from_millis(head_ms),
            },
        ));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mock-upstream: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let mock = match builder.start().await {
            Ok(m) => m,
            Err(e) => {
                eprintln!("mock-upstream: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("listening on {}", mock.url());
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("mock-upstream: cannot watch SIGTERM: {e}");
                    return ExitCode::FAILURE;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!(
            "mock-upstream: served {} requests ({} completions)",
            mock.request_count(),
            mock.completion_count()
        );
        mock.shutdown().await;
        ExitCode::SUCCESS
    })
}
