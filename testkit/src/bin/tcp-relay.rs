//! `tcp-relay`: the proxy benchmark's floor (driven by `bench/proxy/compare.sh`, target
//! `relay`). It forwards bytes between each client connection and a connection of its own to
//! `--to`, and does nothing else: no HTTP parsing, no routing, no records. It serves the way
//! the gateway does (one single-threaded tokio runtime per serving thread, each accepting on a
//! duplicate of one listener, TCP_NODELAY on both sockets), so its CPU per request and its added
//! latency are what any proxy on this runtime and this machine pays before doing any work of
//! its own. It prints `listening on http://ADDR` once it accepts.

use std::net::SocketAddr;
use std::process::ExitCode;

const USAGE: &str = "usage: tcp-relay --to ADDR [--listen ADDR] [--threads N]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcp-relay: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let mut to: Option<SocketAddr> = None;
    let mut listen: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut threads = std::thread::available_parallelism().map_or(1, usize::from);
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--to" => to = Some(value.parse().map_err(|e| bad(&e))?),
            "--listen" => listen = value.parse().map_err(|e| bad(&e))?,
            "--threads" => threads = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let to = to.ok_or("--to is required")?;
    let listener =
        std::net::TcpListener::bind(listen).map_err(|e| format!("bind {listen}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut serving = Vec::new();
    for i in 0..threads.max(1) {
        let accepting = listener.try_clone().map_err(|e| e.to_string())?;
        serving.push(
            std::thread::Builder::new()
                .name(format!("relay-{i}"))
                .spawn(move || serve(accepting, to))
                .map_err(|e| e.to_string())?,
        );
    }
    println!("listening on http://{addr}");
    for t in serving {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a serving thread panicked".into()),
        }
    }
    Ok(())
}

/// One serving thread: accept on `listener` and relay each connection to `to`, forever.
fn serve(listener: std::net::TcpListener, to: SocketAddr) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        loop {
            let (mut client, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // out of descriptors, say: pause rather than spin on the error
                    eprintln!("tcp-relay: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            tokio::spawn(async move {
                let mut upstream = match tokio::net::TcpStream::connect(to).await {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("tcp-relay: connect {to}: {e}");
                        return;
                    }
                };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                // either side closing ends the pair; the error says only which one went first
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    })
}
