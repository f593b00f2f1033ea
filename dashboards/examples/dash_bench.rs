//! The dashboards' latency benchmark: ENDPOINTS endpoints (10 per model) with DAYS days of
//! traffic (RPM attempts per endpoint per minute) loaded through the real record writer and
//! its rollup upserts, one logprob probe run per endpoint per hour, a few alerts; then the
//! real router on 127.0.0.1 answers the overview (`/?range=24h`, `/?range=30d`, and the same
//! data as JSON under `/api/v1/overview`) and an endpoint page (`/endpoint?e=…&range=24h`).
//! "warm" is the p50/p95 of REPEAT requests on one running server. "cold" is a first request,
//! COLD times per page, each from a new HTTP client to a new server with a new connection pool
//! (as after a gateway restart), without and with the server's warm-up
//! (`Dashboards::warm_up`, which `samewise serve` runs as it starts); on PostgreSQL — a private cluster started for the run, so
//! the shared server is never touched — also each after the database server itself was
//! restarted (its buffer cache empty; with DROP_CACHES=1, run as root, the kernel's page cache
//! is dropped too). Not a test: it prints numbers.
//!
//! Run: `cargo run --release -p samewise-dashboards --example dash_bench -- [sqlite|postgres]`
//! with ENDPOINTS (50), DAYS (2), RPM (1), REPEAT (40), COLD (10) in the environment; with
//! WAIT_FOR=FILE it loads, then waits for FILE to exist before it measures.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use samewise_dashboards::{Dashboards, DashboardsConfig, LiveState, ModelSpec, Routing, Slo};
use samewise_store::testing::TestDb;
use samewise_store::testing::cluster::PgCluster;
use samewise_store::{
    Backend, NewAlert, ProbeRun, RecordWriter, RecordWriterConfig, RequestRecord, Store,
};

/// The pages timed, in order.
const PAGES: [&str; 6] = [
    "/?range=24h",
    "/?range=30d",
    "/api/v1/overview?range=24h",
    "/api/v1/overview?range=30d",
    "/endpoint?e=p7%2Fmodel-0&range=24h",
    "/endpoint?e=p7%2Fmodel-0&range=30d",
];

#[derive(Debug)]
struct AllActive;

impl LiveState for AllActive {
    fn routing(&self, _: &str, _: &str) -> Option<Routing> {
        Some(Routing {
            state: "active",
            why: None,
        })
    }
}

fn env(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let backend = match std::env::args().nth(1).as_deref() {
        None | Some("postgres") => Backend::Postgres,
        Some("sqlite") => Backend::Sqlite,
        Some(o) => anyhow::bail!("unknown backend {o:?}"),
    };
    let (endpoints, days, rpm, repeat, cold_n) = (
        env("ENDPOINTS", 50),
        env("DAYS", 2),
        env("RPM", 1),
        env("REPEAT", 40),
        env("COLD", 10),
    );
    let cluster = match backend {
        Backend::Postgres => Some(PgCluster::start().await.context("private PostgreSQL")?),
        Backend::Sqlite => None,
    };
    let db = match &cluster {
        Some(c) => c.test_db(&c.admin_url()).await?,
        None => TestDb::new(backend).await?,
    };
    let now = samewise_store::now_ms();
    let start = now - days * 86_400_000;
    let mut specs: HashMap<String, Vec<String>> = HashMap::new();
    let names: Vec<(String, String)> = (0..endpoints)
        .map(|i| {
            (
                format!("model-{}", i / 10),
                format!("p{i}/model-{}", i / 10),
            )
        })
        .collect();
    for (m, e) in &names {
        specs.entry(m.clone()).or_default().push(e.clone());
    }

    // traffic through the real writer (and its rollup upserts)
    let load = Instant::now();
    let (tx, writer) = RecordWriter::spawn(
        db.store.clone(),
        RecordWriterConfig {
            capacity: 100_000,
            max_batch: 5_000,
            ..RecordWriterConfig::default()
        },
    );
    let minutes = days * 1440;
    let mut n = 0u64;
    for minute in 0..minutes {
        for (i, (m, e)) in names.iter().enumerate() {
            for k in 0..rpm {
                let ts = start + minute * 60_000 + (i as i64 * 997 + k * 7_919) % 60_000;
                let r = RequestRecord {
                    request_id: format!("{minute}-{i}-{k}"),
                    attempt: 1,
                    final_attempt: true,
                    ts_ms: ts,
                    model: m.clone(),
                    provider: Some(format!("p{i}")),
                    endpoint: Some(e.clone()),
                    route: "chat".to_owned(),
                    status: Some(200),
                    attempts: 1,
                    ttft_ms: Some(50.0 + ((minute + k) % 400) as f64),
                    latency_ms: 900.0,
                    tpot_ms: Some(8.0 + (minute % 30) as f64),
                    prompt_tokens: Some(200),
                    completion_tokens: Some(100),
                    finish_reason: Some(
                        if minute % 10 == 0 { "length" } else { "stop" }.to_owned(),
                    ),
                    error_kind: (minute % 97 == 0).then(|| "upstream_5xx".to_owned()),
                    tool_calls: u32::from(minute % 3 == 0),
                    tool_errored: minute % 31 == 0,
                    ..RequestRecord::default()
                };
                while !tx.try_send(r.clone()) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                n += 1;
            }
        }
    }
    writer.shutdown().await;
    ensure_written(&tx, n)?;
    let load_s = load.elapsed().as_secs_f64();
    for (m, e) in &names {
        for h in 0..days * 24 {
            db.store
                .insert_probe_run(&ProbeRun {
                    model: m.clone(),
                    endpoint: e.clone(),
                    kind: "prompt_logprobs".to_owned(),
                    started_ms: start + h * 3_600_000,
                    finished_ms: start + h * 3_600_000 + 2_000,
                    ok: true,
                    tokens: 500,
                    stats: serde_json::json!({ "kl_mean": 0.001 * (1 + h % 5) as f64, "top1_same": 0.97 }),
                    ..ProbeRun::default()
                })
                .await?;
        }
    }
    for (m, e) in names.iter().step_by(7) {
        db.store
            .upsert_alert(&NewAlert {
                model: m.clone(),
                endpoint: e.clone(),
                kind: "unfaithful".to_owned(),
                summary: "bench".to_owned(),
                evidence: serde_json::json!({ "equivalent": { "relation": "approx", "bits": 4.1 } }),
                now_ms: now,
            })
            .await?;
    }
    let mut models: Vec<ModelSpec> = specs
        .into_iter()
        .map(|(name, endpoints)| ModelSpec {
            name,
            endpoints,
            slo: Some(Slo {
                ttft_ms: 300.0,
                tpot_ms: 30.0,
            }),
            ladder: Vec::new(),
        })
        .collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    let (_, key) = db
        .store
        .create_api_key_with(
            "bench",
            samewise_store::KeyOptions {
                rpm_limit: None,
                admin: true,
            },
        )
        .await?;
    println!(
        "backend {}: {endpoints} endpoints, {days} days, {n} request records loaded through the writer in {load_s:.1} s ({:.0}/s)",
        backend.name(),
        n as f64 / load_s
    );
    // WAIT_FOR=FILE: measure only once FILE exists (load beside other work, time alone)
    if let Ok(file) = std::env::var("WAIT_FOR") {
        eprintln!("loaded; waiting for {file} to measure");
        while !std::path::Path::new(&file).exists() {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    let (server, _) = Server::start(db.store.clone(), &models, false).await?;
    let http = reqwest::Client::new();
    let mut warm = Vec::new();
    for path in PAGES {
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..=repeat {
            let (ms, b) = get(&http, &server.url, path, &key).await?;
            times.push(ms);
            bytes = b;
        }
        times.remove(0); // the first is neither cold (see below) nor warm
        warm.push((times, bytes));
    }
    // cold: first requests to a new server and pool, with and without the warm-up `serve`
    // runs as it starts; on PostgreSQL also after the database restarted
    let mut cold = Vec::new();
    let mut warm_ups = Vec::new();
    for path in PAGES {
        let mut kinds: [Vec<f64>; 4] = Default::default();
        for _ in 0..cold_n {
            for (k, warmed) in [(0, false), (1, true)] {
                let (ms, w) = cold_request(&db, &models, path, &key, warmed).await?;
                kinds[k].push(ms);
                warm_ups.extend(w);
            }
        }
        if let Some(c) = &cluster {
            for _ in 0..cold_n {
                for (k, warmed) in [(2, false), (3, true)] {
                    c.stop().await?;
                    if std::env::var("DROP_CACHES").as_deref() == Ok("1") {
                        drop_page_cache()?;
                    }
                    c.restart().await?;
                    let (ms, w) = cold_request(&db, &models, path, &key, warmed).await?;
                    kinds[k].push(ms);
                    warm_ups.extend(w);
                }
            }
        }
        cold.push(kinds);
    }
    println!(
        "| page | warm p50 (ms) | warm p95 (ms) | cold, new server: no warm-up | cold, new server: warmed up | cold, PostgreSQL restarted: no warm-up | cold, PostgreSQL restarted: warmed up | bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let cell = |xs: &[f64]| {
        if xs.is_empty() {
            "n/a".to_owned()
        } else {
            format!("{:.1} / {:.1}", quantile(xs, 0.5), quantile(xs, 1.0))
        }
    };
    for ((path, (warm, bytes)), kinds) in PAGES.iter().zip(warm).zip(cold) {
        println!(
            "| `{path}` | {:.1} | {:.1} | {} | {} | {} | {} | {bytes} |",
            quantile(&warm, 0.5),
            quantile(&warm, 0.95),
            cell(&kinds[0]),
            cell(&kinds[1]),
            cell(&kinds[2]),
            cell(&kinds[3]),
        );
    }
    println!(
        "(cold: median / max of {cold_n} samples per page and kind; the warm-up itself took median {:.0} ms, max {:.0} ms)",
        quantile(&warm_ups, 0.5),
        quantile(&warm_ups, 1.0)
    );
    // where the overview's time goes: the store queries alone (warm, median of REPEAT)
    for (name, range_ms) in [("24h", 86_400_000i64), ("30d", 30 * 86_400_000)] {
        let mut t_roll = Vec::new();
        let mut t_runs = Vec::new();
        for _ in 0..repeat {
            let now = samewise_store::now_ms();
            let t = Instant::now();
            db.store
                .endpoint_rollups(&samewise_store::RollupQuery {
                    since_ms: now - range_ms,
                    until_ms: now + 1,
                    ..Default::default()
                })
                .await?;
            t_roll.push(t.elapsed().as_secs_f64() * 1000.0);
            // what the overview reads: 24 h of runs, and the newest per endpoint, kind and
            // outcome when the range is longer
            let t = Instant::now();
            for m in 0..(endpoints + 9) / 10 {
                let model = format!("model-{m}");
                db.store
                    .probe_run_stats(&samewise_store::ProbeRunQuery {
                        model: Some(model.clone()),
                        since_ms: Some(now - 86_400_000),
                        limit: 50_000,
                        ..Default::default()
                    })
                    .await?;
                if range_ms > 86_400_000 {
                    db.store
                        .latest_probe_runs(Some(&model), now - range_ms)
                        .await?;
                }
            }
            t_runs.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        t_roll.sort_by(f64::total_cmp);
        t_runs.sort_by(f64::total_cmp);
        println!(
            "store only, {name}: endpoint_rollups (all endpoints) median {:.1} ms; probe runs (every model) median {:.1} ms",
            t_roll[t_roll.len() / 2],
            t_runs[t_runs.len() / 2]
        );
    }
    server.stop().await?;
    Ok(())
}

/// The dashboards on 127.0.0.1 over one store, until [`Server::stop`].
struct Server {
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Serves the pages over `store`; with `warm`, after [`Dashboards::warm_up`] (as `samewise
    /// serve` runs it as it starts), returning how long that took.
    async fn start(
        store: Store,
        models: &[ModelSpec],
        warm: bool,
    ) -> Result<(Server, Option<f64>)> {
        let dash = Dashboards::new(
            store,
            models.to_vec(),
            Arc::new(AllActive),
            DashboardsConfig::default(),
            None,
        );
        let warmed = if warm {
            Some(dash.warm_up().await?.as_secs_f64() * 1000.0)
        } else {
            None
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, samewise_dashboards::router(dash))
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        Ok((Server { url, stop, task }, warmed))
    }

    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("server task")??;
        Ok(())
    }
}

/// One GET: its time in ms and the body's size.
async fn get(http: &reqwest::Client, url: &str, path: &str, key: &str) -> Result<(f64, usize)> {
    let t = Instant::now();
    let res = http
        .get(format!("{url}{path}"))
        .bearer_auth(key)
        .send()
        .await?;
    anyhow::ensure!(res.status() == 200, "{path}: {}", res.status());
    let bytes = res.bytes().await?.len();
    Ok((t.elapsed().as_secs_f64() * 1000.0, bytes))
}

/// The time of `path`'s first request from a new client to a new server over a new pool, as
/// after a gateway restart (the pool connects and migrates before the clock starts, as `serve`
/// does before it listens), with or without the server's warm-up first; and the warm-up's.
async fn cold_request(
    db: &TestDb,
    models: &[ModelSpec],
    path: &str,
    key: &str,
    warm: bool,
) -> Result<(f64, Option<f64>)> {
    let store = Store::connect(Some(db.url()), db.data_dir()).await?;
    let (server, warmed) = Server::start(store.clone(), models, warm).await?;
    let (ms, _) = get(&reqwest::Client::new(), &server.url, path, key).await?;
    server.stop().await?;
    store.close().await;
    Ok((ms, warmed))
}

/// The `q` quantile (nearest rank) of `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// Drops the kernel's page cache (root only), so a restarted PostgreSQL reads from disk.
fn drop_page_cache() -> Result<()> {
    std::process::Command::new("sync").status()?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping the page cache (root?)")?;
    Ok(())
}

fn ensure_written(tx: &samewise_store::RecordSender, n: u64) -> Result<()> {
    anyhow::ensure!(
        tx.written() == n && tx.write_errors() == 0,
        "written {} of {n}, {} errors",
        tx.written(),
        tx.write_errors()
    );
    Ok(())
}
