//! Measures how fast the [`RecordWriter`] moves request records into each backend: N
//! records are queued (capacity N, so nothing is dropped) and the clock stops when
//! `shutdown` returns, i.e. when every record is committed. Also reports the cost of one
//! `try_send` on the request path. Uses a fresh SQLite file and a fresh PostgreSQL
//! database (`$SAMEWISE_TEST_PG_URL`, default postgres://postgres@127.0.0.1:5432/postgres).
//!
//! Request ids are the gateway's (`new_request_id`: time first, then random bits), or with
//! `random` the fully random ids the gateway gave before (`req-` and 24 random hex digits),
//! which scatter the primary key's index inserts over its leaves.
//!
//! With `retention` (the gateway's ids) the ROWS records, all older than the default retention,
//! are then deleted by one [`Store::retention_pass`] with the default steps while a second
//! writer stores new records at 1,000 a second, as a gateway under load would: it reports the
//! pass (rows a second, steps, the longest step) and the new records' writes: the longest time
//! between two commits (a batch a second, later when a write waits for the database) in the
//! pass against the same time before it, and that none was dropped.
//!
//! With `usage` the ROWS records are spread over the last 24 hours among 20 keys, and `keys
//! usage`'s read for those 24 hours ([`Store::key_usage`]: whole hours from `key_hours`, the
//! partial one from the records) is timed beside the scan of every record in the window that it
//! replaced, three times each; both must give the same sums.
//!
//! With `probes` ROWS is a number of probe runs, each with `RAW_BYTES` (default 55,000) of raw
//! data, spread over 8 to 500 days back: one default pass (records kept) deletes those before
//! the rollups' 400 days and clears the raw data of the rest, while new records are written at
//! 1,000 a second as with `retention` — the first pass of a gateway upgraded over a year of
//! probe runs.
//!
//! Run: `cargo run -p samewise-store --example writer_bench -- [ROWS] [sqlite|postgres|both] [timed|random|retention|usage|probes] [BATCH]`
//! (BATCH: the writer's `max_batch`, default the writer's default). The CPU reported is the
//! whole process's (the writer's task and sqlx's SQLite worker thread) from the first record
//! queued to the last committed, over the rows: what a record costs the gateway's process.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use samewise_store::testing::TestDb;
use samewise_store::{
    Backend, DAY_MS, ProbeRun, RecordQuery, RecordWriter, RecordWriterConfig, RequestRecord,
    RetentionConfig, RetentionPass, Store, retention_cut,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let rows: usize = match args.next() {
        Some(n) => n.parse().context("ROWS must be a number")?,
        None => 100_000,
    };
    let which = args.next().unwrap_or_else(|| "both".to_owned());
    let backends: &[Backend] = match which.as_str() {
        "sqlite" => &[Backend::Sqlite],
        "postgres" => &[Backend::Postgres],
        "both" => &[Backend::Sqlite, Backend::Postgres],
        other => anyhow::bail!("unknown backend {other:?}: sqlite, postgres or both"),
    };
    let ids = args.next().unwrap_or_else(|| "timed".to_owned());
    anyhow::ensure!(
        ["timed", "random", "retention", "usage", "probes"].contains(&ids.as_str()),
        "unknown mode {ids:?}: timed, random, retention, usage or probes"
    );
    let max_batch = match args.next() {
        Some(n) => n.parse().context("BATCH must be a number")?,
        None => RecordWriterConfig::default().max_batch,
    };
    for &backend in backends {
        let db = TestDb::new(backend)
            .await
            .with_context(|| format!("opening {backend}"))?;
        if ids == "probes" {
            probe_retention(&db.store, rows).await?;
            continue;
        }
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let day_ago = samewise_store::now_ms() - 86_400_000;
        let records: Vec<RequestRecord> = (0..rows)
            .map(|i| {
                let ts_ms = if ids == "usage" {
                    day_ago + (i as i64 * 86_400_000) / rows as i64
                } else {
                    1_700_000_000_000 + i as i64
                };
                let id = if ids != "random" {
                    samewise_store::new_request_id(ts_ms, &mut rng)
                } else {
                    format!(
                        "req-{:016x}{:08x}",
                        rng.random::<u64>(),
                        rng.random::<u32>()
                    )
                };
                let mut r = record(i, ts_ms, id);
                if ids == "usage" {
                    r.key_id = Some(1 + (i % 20) as i64);
                }
                r
            })
            .collect();
        let cfg = RecordWriterConfig {
            capacity: rows,
            max_queued_record_bytes: usize::MAX,
            max_batch,
            ..RecordWriterConfig::default()
        };
        let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg.clone());
        let cpu0 = process_cpu_s()?;
        let start = Instant::now();
        for r in records {
            anyhow::ensure!(tx.try_send(r), "queue full: capacity is {rows}");
        }
        let enqueue = start.elapsed();
        writer.shutdown().await;
        let total = start.elapsed();
        let cpu = process_cpu_s()? - cpu0;
        anyhow::ensure!(
            tx.written() == rows as u64,
            "written {} of {rows}",
            tx.written()
        );
        anyhow::ensure!(tx.write_errors() == 0 && tx.dropped() == 0);
        let stored = db
            .store
            .request_records(&RecordQuery {
                limit: 1,
                ..RecordQuery::default()
            })
            .await?;
        anyhow::ensure!(stored.len() == 1);
        println!(
            "{backend:>10}: {rows} records ({ids} ids), batches of {}, in {:.3} s = {:.0} rows/s, {:.2} µs of the process's CPU a row; try_send {:.0} ns each",
            cfg.max_batch,
            total.as_secs_f64(),
            rows as f64 / total.as_secs_f64(),
            cpu * 1e6 / rows as f64,
            enqueue.as_nanos() as f64 / rows as f64,
        );
        if ids == "retention" {
            retention(&db.store, rows).await?;
        }
        if ids == "usage" {
            usage(&db, day_ago).await?;
        }
    }
    Ok(())
}

/// Deletes the `rows` old records with the default retention while new ones are written at
/// 1,000 a second, and reports both.
async fn retention(store: &Store, rows: usize) -> Result<()> {
    let cfg = RetentionConfig::default();
    let load = under_load(store, &cfg).await?;
    anyhow::ensure!(
        load.pass.records == rows as u64,
        "deleted {} of {rows}",
        load.pass.records
    );
    println!(
        "{:>10}: retention deleted {} records in {:.3} s = {:.0} rows/s, {} steps of {} (longest {:.1} ms); {}",
        store.backend(),
        load.pass.records,
        load.took.as_secs_f64(),
        load.pass.records as f64 / load.took.as_secs_f64(),
        load.pass.steps,
        cfg.chunk_rows,
        load.pass.longest_step.as_secs_f64() * 1e3,
        load.meanwhile(),
    );
    Ok(())
}

/// A retention pass run while a second writer stores new records at 1,000 a second.
struct UnderLoad {
    pass: RetentionPass,
    took: Duration,
    /// New records sent (all written, none dropped).
    sent: usize,
    /// The longest time between two of the writer's commits in the pass, and in 5 s before it.
    in_pass: Duration,
    usual: Duration,
}

impl UnderLoad {
    fn meanwhile(&self) -> String {
        format!(
            "meanwhile {} new records at 1,000/s, none dropped, the longest time between two commits {:.1} ms in the pass against {:.1} ms in 5 s before it",
            self.sent,
            self.in_pass.as_secs_f64() * 1e3,
            self.usual.as_secs_f64() * 1e3,
        )
    }
}

/// Runs one [`Store::retention_pass`] with `cfg` while new records are written at 1,000 a
/// second, as a gateway under load would, after 5 s of the same load alone.
async fn under_load(store: &Store, cfg: &RetentionConfig) -> Result<UnderLoad> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (tx, writer) = RecordWriter::spawn(store.clone(), RecordWriterConfig::default());
    let on = Arc::new(AtomicBool::new(true));
    // the longest time between two of the writer's commits (µs): a batch a second, later when
    // a write waited for the database
    let gap = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (tx, on, gap) = (tx.clone(), on.clone(), gap.clone());
        tokio::spawn(async move {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(2);
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            let mut sent = 0usize;
            let (mut written, mut since) = (0, None::<Instant>);
            while on.load(Ordering::Relaxed) {
                tick.tick().await;
                let ts_ms = samewise_store::now_ms();
                let id = samewise_store::new_request_id(ts_ms, &mut rng);
                tx.try_send(record(sent, ts_ms, id));
                sent += 1;
                if tx.written() != written {
                    written = tx.written();
                    if let Some(t) = since {
                        let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                        gap.fetch_max(us, Ordering::Relaxed);
                    }
                    since = Some(Instant::now());
                }
            }
            sent
        })
    };
    // the same time without a pass, for the usual gap between commits (a second)
    tokio::time::sleep(Duration::from_secs(5)).await;
    let usual = gap.swap(0, Ordering::Relaxed);
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let start = Instant::now();
    let pass = store
        .retention_pass(cfg, samewise_store::now_ms(), &stopped)
        .await?;
    let took = start.elapsed();
    // one more commit after the pass ends the gap it was in
    let written = tx.written();
    while tx.written() == written {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let in_pass = gap.swap(0, Ordering::Relaxed);
    on.store(false, Ordering::Relaxed);
    let sent = feeder.await?;
    writer.shutdown().await;
    anyhow::ensure!(
        tx.dropped() == 0 && tx.written() == sent as u64,
        "new records: {} written, {} dropped of {sent}",
        tx.written(),
        tx.dropped()
    );
    Ok(UnderLoad {
        pass,
        took,
        sent,
        in_pass: Duration::from_micros(in_pass),
        usual: Duration::from_micros(usual),
    })
}

/// `runs` probe runs of `RAW_BYTES` (default 55,000, a prompt-logprobs run's at the default
/// top-5) random bytes of raw data each, spread over 8 to 500 days back: the default retention deletes those before 400 days and clears
/// the raw data of the rest (the first pass after an upgrade) while new records are written at
/// 1,000 a second.
async fn probe_retention(store: &Store, runs: usize) -> Result<()> {
    let raw_bytes: usize = match std::env::var("RAW_BYTES") {
        Ok(v) => v.parse().context("RAW_BYTES must be a number")?,
        Err(_) => 55_000,
    };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let now = samewise_store::now_ms();
    let cfg = RetentionConfig {
        records: None,
        ..RetentionConfig::default()
    };
    let (runs_cut, raw_cut) = (
        retention_cut(now, cfg.rollups.context("rollups kept for ever")?),
        retention_cut(now, cfg.probe_raw.context("raw kept for ever")?),
    );
    let (mut to_delete, mut to_clear) = (0u64, 0u64);
    let start = Instant::now();
    for i in 0..runs {
        let started_ms = now - 8 * DAY_MS - (i as i64 * 492 * DAY_MS) / runs as i64;
        let mut raw = vec![0u8; raw_bytes];
        rng.fill(&mut raw[..]);
        store
            .insert_probe_run(&ProbeRun {
                model: "smollm2-135m".to_owned(),
                endpoint: format!("provider-{}/smollm2", i % 4),
                kind: "prompt_logprobs".to_owned(),
                started_ms,
                finished_ms: started_ms + 2_000,
                ok: true,
                tokens: 1_000,
                stats: serde_json::json!({"kl_mean": 0.01, "top1_same": 0.99, "positions": 1000}),
                raw: Some(raw),
                ..ProbeRun::default()
            })
            .await?;
        if started_ms < runs_cut {
            to_delete += 1;
        } else if started_ms < raw_cut {
            to_clear += 1;
        }
    }
    println!(
        "{:>10}: {runs} probe runs of {raw_bytes} bytes of raw data stored in {:.1} s",
        store.backend(),
        start.elapsed().as_secs_f64()
    );
    let load = under_load(store, &cfg).await?;
    let p = load.pass;
    anyhow::ensure!(
        (p.probe_runs, p.probe_raw) == (to_delete, to_clear),
        "deleted {} of {to_delete} runs, cleared {} of {to_clear}",
        p.probe_runs,
        p.probe_raw
    );
    println!(
        "{:>10}: retention deleted {} probe runs and cleared the raw data of {} ({:.1} MB) in {:.3} s = {:.0} runs/s, {} steps of {} (longest {:.1} ms); {}",
        store.backend(),
        p.probe_runs,
        p.probe_raw,
        ((p.probe_runs + p.probe_raw) * raw_bytes as u64) as f64 / 1e6,
        load.took.as_secs_f64(),
        (p.probe_runs + p.probe_raw) as f64 / load.took.as_secs_f64(),
        p.steps,
        cfg.chunk_runs,
        p.longest_step.as_secs_f64() * 1e3,
        load.meanwhile(),
    );
    Ok(())
}

/// User + system CPU seconds of this process (every thread, sqlx's SQLite worker included) so
/// far, from `/proc/self/stat` (Linux; USER_HZ, 100 ticks a second).
fn process_cpu_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    // fields 14 and 15 (utime, stime): the 12th and 13th after the ")" ending the command name
    let after = stat
        .rsplit_once(") ")
        .context("no command name in /proc/self/stat")?
        .1;
    let mut f = after.split_whitespace().skip(11);
    let mut tick =
        || -> Result<f64> { Ok(f.next().context("short /proc/self/stat")?.parse::<f64>()?) };
    Ok((tick()? + tick()?) / 100.0)
}

/// A realistic record: a streamed chat attempt with usage, cost and tool-call counts.
fn record(i: usize, ts_ms: i64, request_id: String) -> RequestRecord {
    RequestRecord {
        request_id,
        attempt: 1,
        final_attempt: true,
        ts_ms,
        key_id: Some(1),
        model: "smollm2-135m".to_owned(),
        provider: Some(format!("provider-{}", i % 4)),
        endpoint: Some(format!("provider-{}/smollm2", i % 4)),
        route: "chat".to_owned(),
        stream: i.is_multiple_of(2),
        status: Some(200),
        error_kind: None,
        attempts: 1,
        ttft_ms: Some(35.5),
        latency_ms: 812.25,
        tpot_ms: Some(9.75),
        prompt_tokens: Some(412),
        completion_tokens: Some(80),
        usage_counted: false,
        finish_reason: Some("stop".to_owned()),
        output_chars: 350,
        cost_usd: Some(0.000_042),
        tool_calls: 0,
        tool_invalid_json: 0,
        tool_unknown_name: 0,
        tool_schema_mismatch: 0,
        tool_finish_mismatch: None,
        tool_errored: false,
        degenerate: false,
    }
}

/// What `keys usage` read before `key_hours`: every record of the window, summed per key.
const SCAN: &str = "SELECT key_id, \
     CAST(COALESCE(SUM(CASE WHEN final_attempt THEN 1 ELSE 0 END), 0) AS BIGINT), \
     CAST(COALESCE(SUM(CASE WHEN final_attempt AND (error_kind IS NOT NULL \
         OR status IS NULL OR status >= 400) THEN 1 ELSE 0 END), 0) AS BIGINT), \
     CAST(COALESCE(SUM(CASE WHEN attempt > 0 THEN 1 ELSE 0 END), 0) AS BIGINT), \
     CAST(COALESCE(SUM(prompt_tokens), 0) AS BIGINT), \
     CAST(COALESCE(SUM(completion_tokens), 0) AS BIGINT), \
     CAST(COALESCE(SUM(cost_usd), 0) AS DOUBLE PRECISION), MAX(ts_ms) \
     FROM request_records WHERE ts_ms >= $1 AND key_id IS NOT NULL \
     GROUP BY key_id ORDER BY key_id";

/// Times `keys usage`'s read of the last 24 hours against the scan it replaced.
async fn usage(db: &TestDb, since_ms: i64) -> Result<()> {
    type Row = (i64, i64, i64, i64, i64, i64, f64, i64);
    let (mut now, mut before) = (Vec::new(), Vec::new());
    let mut scanned: Vec<Row> = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let got = db.store.key_usage(since_ms).await?;
        now.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        scanned = match db.backend() {
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(db.url()).await?;
                let rows = sqlx::query_as(SCAN).bind(since_ms).fetch_all(&pool).await?;
                pool.close().await;
                rows
            }
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(db.url()).await?;
                let rows = sqlx::query_as(&SCAN.replace('$', "?"))
                    .bind(since_ms)
                    .fetch_all(&pool)
                    .await?;
                pool.close().await;
                rows
            }
        };
        before.push(t.elapsed().as_secs_f64() * 1e3);
        let same = got.len() == scanned.len()
            && got.iter().zip(&scanned).all(|(u, r)| {
                (u.key_id, u.requests, u.failed, u.attempts, u.prompt_tokens)
                    == (r.0, r.1, r.2, r.3, r.4)
                    && (u.completion_tokens, u.last_ms) == (r.5, r.7)
                    && (u.cost_usd - r.6).abs() < 1e-6
            });
        anyhow::ensure!(same, "key_usage {got:?}\nscan {scanned:?}");
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{:>10}: keys usage over 24 h of {} records, 20 keys: {:.1} ms (median of 3) against {:.1} ms for the scan of the window, {:.0}x",
        db.backend(),
        scanned.iter().map(|r| r.3).sum::<i64>(),
        median(&mut now),
        median(&mut before),
        median(&mut before) / median(&mut now),
    );
    Ok(())
}
