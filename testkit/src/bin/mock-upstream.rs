//! `mock-upstream`: the testkit's [`MockUpstream`] as a process, for the proxy benchmark
//! (`bench/proxy/run.sh`) and for trying a proxy config by hand.
//!
//! It prints `listening on http://ADDR` on stdout once bound and serves until SIGINT/SIGTERM.
//! Requests are counted but not recorded (a load test would pile them up).

use std::process::ExitCode;

use samewise_testkit::{Behavior, MockUpstream};

const USAGE: &str =
    "usage: mock-upstream [--listen ADDR] [--name NAME] [--model ID]... [--never-ends | --hang]";

fn main() -> ExitCode {
    let mut builder = MockUpstream::builder().record(false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        let step = match arg.as_str() {
            "--listen" => value("--listen").map(|v| builder.clone().bind(&v)),
            "--name" => value("--name").map(|v| builder.clone().name(&v)),
            "--model" => value("--model").map(|v| builder.clone().model(&v)),
            "--never-ends" => Ok(builder.clone().default_behavior(Behavior::NeverEnds)),
            "--hang" => Ok(builder.clone().default_behavior(Behavior::Hang)),
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
        eprintln!("mock-upstream: served {} requests", mock.request_count());
        mock.shutdown().await;
        ExitCode::SUCCESS
    })
}
