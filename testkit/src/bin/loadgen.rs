//! `loadgen`: the proxy benchmark's load generator (driven by `bench/proxy/run.sh`).
//!
//! `loadgen rate ...` sends open-loop, constant-rate load: every 1/rate seconds a tick fires
//! one request straight to the mock upstream and one through the proxy at the same moment,
//! whatever the earlier requests are doing (open loop: a slow answer never delays the next
//! send). Latency is measured per request from its send to the last byte of the body; ticks
//! fired more than 2 ms late are counted (`late_ticks`) so a generator that falls behind is
//! visible, and `achieved_rps` says the rate actually sent. It prints one JSON object: per target p50/p90/p99/max, and the added latency
//! (through - direct) both as a difference of quantiles and as quantiles of the per-tick
//! paired difference.
//!
//! `loadgen slo ...` sends open-loop, constant-rate load through the proxy only, from the
//! first tick on (no warm-up: the first seconds are the point), and reports how many requests
//! sent after `--skip` seconds were answered (2xx, body read to its end) within `--within-ms`,
//! with latency quantiles; a request the client gave up on (30 s) counts as not answered. It
//! is the hung-provider harness (`bench/proxy/hung.sh`).
//!
//! `loadgen hold ...` opens N streams through the proxy (to a mock that never ends them),
//! waits until each has its first bytes, prints `ready N`, holds them for a while (the script
//! samples the proxy's memory then) and closes them.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::task::TaskTracker;

const USAGE: &str = "usage:
  loadgen rate --direct URL --proxy URL --key KEY --model LOGICAL --direct-model ID
               --rate RPS --duration SECS [--warmup SECS] [--stream] [--trace FILE]
  loadgen slo --proxy URL --key KEY --model LOGICAL --rate RPS --duration SECS
              [--skip SECS] [--within-ms MS] [--stream]
  loadgen hold --proxy URL --key KEY --model LOGICAL --streams N --hold SECS";

/// Parsed command line.
#[derive(Debug, Default)]
struct Args {
    mode: String,
    direct: String,
    proxy: String,
    key: String,
    model: String,
    direct_model: String,
    rate: f64,
    duration: f64,
    warmup: f64,
    stream: bool,
    streams: usize,
    hold: f64,
    skip: f64,
    within_ms: f64,
    /// `rate`: where to write one line per measured tick (see `write_trace`).
    trace: Option<String>,
}

/// A tick fired later than this counts as late (the timer's resolution is 1 ms).
const LATE: Duration = Duration::from_millis(2);

/// One finished request: latency in microseconds, or the failure.
type Outcome = Result<u64, String>;

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("loadgen: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match args.mode.as_str() {
            "rate" => rate(&args).await,
            "slo" => slo(&args).await,
            "hold" => hold(&args).await,
            other => Err(format!("unknown mode {other}")),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        mode: it.next().ok_or("no mode")?,
        warmup: 2.0,
        skip: 5.0,
        within_ms: 2000.0,
        ..Args::default()
    };
    while let Some(flag) = it.next() {
        if flag == "--stream" {
            a.stream = true;
            continue;
        }
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<f64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--direct" => a.direct = v,
            "--proxy" => a.proxy = v,
            "--key" => a.key = v,
            "--model" => a.model = v,
            "--direct-model" => a.direct_model = v,
            "--rate" => a.rate = num(&v)?,
            "--duration" => a.duration = num(&v)?,
            "--warmup" => a.warmup = num(&v)?,
            "--streams" => {
                a.streams = v
                    .parse()
                    .map_err(|_| format!("--streams: not a count: {v}"))?
            }
            "--hold" => a.hold = num(&v)?,
            "--skip" => a.skip = num(&v)?,
            "--within-ms" => a.within_ms = num(&v)?,
            "--trace" => a.trace = Some(v),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(4096)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| format!("http client: {e}"))
}

fn body(model: &str, stream: bool) -> String {
    let mut b = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Benchmark request: reply with a short greeting."}],
        "max_tokens": 16,
    });
    if stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b.to_string()
}

/// Sends one request and reads its body to the end; latency counted from the send.
async fn one(client: &reqwest::Client, url: &str, key: &str, body: String) -> Outcome {
    let started = Instant::now();
    let resp = client
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = resp.status();
    let mut resp = resp;
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("body: {e}"))? {
        drop(chunk);
    }
    if !status.is_success() {
        return Err(format!("status {status}"));
    }
    Ok(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX))
}

async fn rate(a: &Args) -> Result<(), String> {
    if a.rate <= 0.0 || a.duration <= 0.0 {
        return Err("--rate and --duration must be positive".into());
    }
    let client = client()?;
    let direct_url = format!("{}/chat/completions", a.direct.trim_end_matches('/'));
    let proxy_url = format!("{}/chat/completions", a.proxy.trim_end_matches('/'));
    let period = Duration::from_secs_f64(1.0 / a.rate);
    let warmup_ticks = (a.warmup * a.rate).round() as usize;
    let ticks = (a.duration * a.rate).round() as usize;
    let results: Arc<std::sync::Mutex<Vec<(usize, Outcome, Outcome)>>> =
        Arc::new(std::sync::Mutex::new(Vec::with_capacity(ticks)));
    let tracker = TaskTracker::new();
    let mut interval = tokio::time::interval(period);
    // open loop: a late tick is fired at once (burst), never skipped
    interval.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut late_ticks = 0usize;
    for i in 0..warmup_ticks + ticks {
        let scheduled = interval.tick().await;
        if scheduled.elapsed() > LATE {
            late_ticks += 1;
        }
        let (client, direct_url, proxy_url, results) = (
            client.clone(),
            direct_url.clone(),
            proxy_url.clone(),
            results.clone(),
        );
        let (key, direct_body, proxy_body) = (
            a.key.clone(),
            body(&a.direct_model, a.stream),
            body(&a.model, a.stream),
        );
        let measured = i >= warmup_ticks;
        tracker.spawn(async move {
            let (d, p) = tokio::join!(
                one(&client, &direct_url, &key, direct_body),
                one(&client, &proxy_url, &key, proxy_body),
            );
            if measured {
                results
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((i - warmup_ticks, d, p));
            }
        });
    }
    let send_secs = started.elapsed().as_secs_f64();
    tracker.close();
    tracker.wait().await;
    let results = std::mem::take(
        &mut *results
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );

    let mut direct = Vec::new();
    let mut through = Vec::new();
    let mut paired = Vec::new();
    let mut errors: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    if let Some(path) = &a.trace {
        write_trace(path, &results, period)?;
    }
    for (_, d, p) in &results {
        match d {
            Ok(us) => direct.push(*us),
            Err(e) => *errors.entry(format!("direct: {e}")).or_default() += 1,
        }
        match p {
            Ok(us) => through.push(*us),
            Err(e) => *errors.entry(format!("proxy: {e}")).or_default() += 1,
        }
        if let (Ok(d), Ok(p)) = (d, p) {
            paired.push(i128::from(*p) - i128::from(*d));
        }
    }
    direct.sort_unstable();
    through.sort_unstable();
    paired.sort_unstable();
    let q = |v: &[u64], f: f64| quantile(v, f).map(|x| x as f64 / 1000.0);
    let qp = |f: f64| quantile(&paired, f).map(|x| x as f64 / 1000.0);
    let diff = |f: f64| match (q(&through, f), q(&direct, f)) {
        (Some(t), Some(d)) => Some(t - d),
        _ => None,
    };
    let report = json!({
        "mode": if a.stream { "stream" } else { "json" },
        "rate_rps": a.rate,
        "duration_s": a.duration,
        "ticks": results.len(),
        "achieved_rps": (warmup_ticks + ticks) as f64 / send_secs,
        "late_ticks": late_ticks,
        "errors": errors,
        "direct_ms": {"p50": q(&direct, 0.5), "p90": q(&direct, 0.9), "p99": q(&direct, 0.99), "max": q(&direct, 1.0), "n": direct.len()},
        "proxy_ms": {"p50": q(&through, 0.5), "p90": q(&through, 0.9), "p99": q(&through, 0.99), "max": q(&through, 1.0), "n": through.len()},
        "added_ms": {"p50": diff(0.5), "p99": diff(0.99)},
        "added_paired_ms": {"p50": qp(0.5), "p99": qp(0.99)},
    });
    println!("{report}");
    Ok(())
}

/// Writes one line per measured tick, in tick order: the tick's scheduled time after the first
/// measured tick (ms), then the direct and the proxied request's latency (µs, empty when it
/// failed). Where a tail comes from shows in when its slow ticks happened (periodic work in the
/// proxy makes slow ticks at its period).
fn write_trace(
    path: &str,
    results: &[(usize, Outcome, Outcome)],
    period: Duration,
) -> Result<(), String> {
    use std::fmt::Write as _;
    let mut rows: Vec<_> = results.iter().collect();
    rows.sort_unstable_by_key(|r| r.0);
    let mut out = String::from("tick_ms\tdirect_us\tproxy_us\n");
    let us = |o: &Outcome| o.as_ref().map(u64::to_string).unwrap_or_default();
    for (i, d, p) in rows {
        let at = period.as_secs_f64() * 1000.0 * *i as f64;
        let _ = writeln!(out, "{at:.3}\t{}\t{}", us(d), us(p));
    }
    std::fs::write(path, out).map_err(|e| format!("--trace {path}: {e}"))
}

async fn slo(a: &Args) -> Result<(), String> {
    if a.rate <= 0.0 || a.duration <= 0.0 {
        return Err("--rate and --duration must be positive".into());
    }
    let client = client()?;
    let url = format!("{}/chat/completions", a.proxy.trim_end_matches('/'));
    let ticks = (a.duration * a.rate).round() as usize;
    // (seconds after the start the request was sent, its outcome)
    let results: Arc<std::sync::Mutex<Vec<(f64, Outcome)>>> =
        Arc::new(std::sync::Mutex::new(Vec::with_capacity(ticks)));
    let tracker = TaskTracker::new();
    let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / a.rate));
    interval.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let started = Instant::now();
    for _ in 0..ticks {
        interval.tick().await;
        let sent_at = started.elapsed().as_secs_f64();
        let (client, url, key, body, results) = (
            client.clone(),
            url.clone(),
            a.key.clone(),
            body(&a.model, a.stream),
            results.clone(),
        );
        tracker.spawn(async move {
            let r = one(&client, &url, &key, body).await;
            results
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((sent_at, r));
        });
    }
    tracker.close();
    tracker.wait().await;
    let results = std::mem::take(
        &mut *results
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let within_us = (a.within_ms * 1e3) as u64;
    let mut all = Vec::new();
    let mut after = Vec::new();
    let (mut after_n, mut after_within) = (0usize, 0usize);
    let mut errors: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for (sent_at, r) in &results {
        let late = *sent_at >= a.skip;
        after_n += usize::from(late);
        match r {
            Ok(us) => {
                all.push(*us);
                if late {
                    after.push(*us);
                    after_within += usize::from(*us <= within_us);
                }
            }
            Err(e) => *errors.entry(e.clone()).or_default() += 1,
        }
    }
    all.sort_unstable();
    after.sort_unstable();
    let q = |v: &[u64], f: f64| quantile(v, f).map(|x| x as f64 / 1000.0);
    let report = json!({
        "mode": if a.stream { "stream" } else { "json" },
        "rate_rps": a.rate,
        "duration_s": a.duration,
        "sent": results.len(),
        "answered": all.len(),
        "errors": errors,
        "skip_s": a.skip,
        "within_ms": a.within_ms,
        "after_skip": {
            "sent": after_n,
            "answered_within": after_within,
            "share_within": if after_n == 0 { 0.0 } else { after_within as f64 / after_n as f64 },
            "p50_ms": q(&after, 0.5), "p99_ms": q(&after, 0.99), "max_ms": q(&after, 1.0),
        },
        "all_ms": {"p50": q(&all, 0.5), "p99": q(&all, 0.99), "max": q(&all, 1.0)},
    });
    println!("{report}");
    Ok(())
}

/// Nearest-rank quantile of sorted values.
fn quantile<T: Copy>(sorted: &[T], f: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((f * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

async fn hold(a: &Args) -> Result<(), String> {
    if a.streams == 0 {
        return Err("--streams must be positive".into());
    }
    let client = client()?;
    let url = format!("{}/chat/completions", a.proxy.trim_end_matches('/'));
    let ready = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let release = tokio_util::sync::CancellationToken::new();
    let tracker = TaskTracker::new();
    for _ in 0..a.streams {
        let (client, url, key, body) = (
            client.clone(),
            url.clone(),
            a.key.clone(),
            body(&a.model, true),
        );
        let (ready, failed, release) = (ready.clone(), failed.clone(), release.clone());
        tracker.spawn(async move {
            let resp = client
                .post(&url)
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            let mut resp = match resp {
                Ok(r) if r.status().is_success() => r,
                _ => {
                    failed.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            };
            match resp.chunk().await {
                Ok(Some(_)) => ready.fetch_add(1, Ordering::SeqCst),
                _ => failed.fetch_add(1, Ordering::SeqCst),
            };
            // hold the stream open until released (or it ends)
            tokio::select! {
                () = release.cancelled() => {}
                _ = async { while let Ok(Some(_)) = resp.chunk().await {} } => {}
            }
        });
        // pace the opening a little so the accept queues do not overflow
        tokio::task::yield_now().await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready.load(Ordering::SeqCst) + failed.load(Ordering::SeqCst) < a.streams
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "ready {} failed {}",
        ready.load(Ordering::SeqCst),
        failed.load(Ordering::SeqCst)
    );
    tokio::time::sleep(Duration::from_secs_f64(a.hold.max(0.0))).await;
    release.cancel();
    tracker.close();
    tracker.wait().await;
    if failed.load(Ordering::SeqCst) > 0 {
        return Err(format!(
            "{} of {} streams failed",
            failed.load(Ordering::SeqCst),
            a.streams
        ));
    }
    Ok(())
}
