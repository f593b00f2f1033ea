//! Retention through the gateway: `samewise serve` with `[retention]` deletes the request
//! records, rollups and probe runs older than it keeps, and clears the probe runs' raw data,
//! when it starts (and every hour after), on SQLite and on PostgreSQL, and leaves the younger
//! ones and what it records meanwhile alone; `samewise probes run` on its own (no gateway)
//! keeps the same retention of its probe runs.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use samewise_store::{
    Backend, DAY_MS, ProbeRun, ProbeRunQuery, RecordQuery, RequestRecord, RollupQuery, Store,
    now_ms, retention_cut,
};
use samewise_testkit::MockUpstream;
use serde_json::json;

use crate::common::{Spawn, gateway_store, scrape, spawn_listening_with, spawn_logged};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_deletes_what_is_older_than_it_keeps_on_sqlite() -> Result<()> {
    retention(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_deletes_what_is_older_than_it_keeps_on_postgres() -> Result<()> {
    retention(Backend::Postgres).await
}

/// A served request's record at `ts_ms` (its rollup minute comes with it).
fn record(id: &str, ts_ms: i64) -> RequestRecord {
    RequestRecord {
        request_id: id.to_owned(),
        attempt: 1,
        final_attempt: true,
        ts_ms,
        model: "m".to_owned(),
        provider: Some("up".to_owned()),
        endpoint: Some("up/m".to_owned()),
        route: "chat".to_owned(),
        status: Some(200),
        attempts: 1,
        latency_ms: 10.0,
        usage_counted: true,
        ..RequestRecord::default()
    }
}

/// A probe run of `endpoint` started `age` days before `now_ms`, with 4 kB of raw data and
/// its age in its statistics.
fn aged_run(model: &str, endpoint: &str, now_ms: i64, age: i64) -> ProbeRun {
    ProbeRun {
        model: model.to_owned(),
        endpoint: endpoint.to_owned(),
        kind: "prompt_logprobs".to_owned(),
        started_ms: now_ms - age * DAY_MS,
        finished_ms: now_ms - age * DAY_MS + 500,
        ok: true,
        tokens: 100,
        stats: json!({"kl_mean": 0.01, "age_days": age}),
        raw: Some(vec![age as u8; 4096]),
        ..ProbeRun::default()
    }
}

fn config(data: &Path, upstream: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
         [retention]\nrecords_days = 5\nrollups_days = 20\nprobe_raw_days = 1\n\n\
         [providers.up]\nbase_url = \"{upstream}\"\n\n\
         [models.m]\n[[models.m.endpoints]]\nprovider = \"up\"\nmodel = \"m\"\n",
        data.display()
    )
}

/// The requests each rollup day holds, by the day's start.
async fn rollup_requests(store: &Store, day_ms: i64) -> Result<i64> {
    let q = RollupQuery {
        model: Some("m".to_owned()),
        endpoint: None,
        since_ms: day_ms,
        until_ms: day_ms + DAY_MS,
    };
    Ok(store
        .endpoint_rollups(&q)
        .await?
        .iter()
        .map(|e| e.totals.requests)
        .sum())
}

async fn retention(backend: Backend) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let (store, pg) = gateway_store(backend, &data).await?;
    let db_url = pg.as_ref().map(|db| db.url().to_owned());
    let (_, key) = store.create_api_key("retention", None).await?;

    // records 40, 10 and 2 days old (5 each): the gateway keeps 5 days of records and 20 of
    // rollups, so the first go with their rollups, the second lose their records only; probe
    // runs 40, 10, 2 and 0 days old (2 each) under `probe_raw_days = 1`: the first go, the
    // next two lose their raw data only (the default, 7 days, would keep the 2-day-old ones'),
    // today's keep theirs
    let now = now_ms();
    let days = [40i64, 10, 2];
    let mut old = Vec::new();
    for age in days {
        for i in 0..5 {
            old.push(record(
                &format!("age{age}-{i}"),
                now - age * DAY_MS + i * 1000,
            ));
        }
    }
    for age in [40i64, 10, 2, 0] {
        for i in 0..2 {
            store
                .insert_probe_run(&aged_run("m", "up/m", now + i * 1000, age))
                .await?;
        }
    }
    store.insert_request_records(&old).await?;
    let day_of = |age: i64| (now - age * DAY_MS).div_euclid(DAY_MS) * DAY_MS;
    for age in days {
        ensure!(
            rollup_requests(&store, day_of(age)).await? == 5,
            "day {age} before"
        );
    }

    let upstream = MockUpstream::builder().record(false).start().await?;
    let cfg = dir.path().join("samewise.toml");
    std::fs::write(&cfg, config(&data, &upstream.base_url()))?;
    let cfg_arg = cfg.to_str().context("config path is not UTF-8")?;
    let log = dir.path().join("gateway.log");
    let spawn = Spawn {
        env: db_url.iter().map(|u| ("DATABASE_URL", u.clone())).collect(),
        log_level: Some("info"),
        log: Some(log.clone()),
    };
    let (gateway, url) = spawn_listening_with(&["serve", "--config", cfg_arg], dir.path(), &spawn)?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    for _ in 0..3 {
        let r = client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            )
            .send()
            .await?;
        ensure!(r.status() == 200, "{}", r.status());
        r.bytes().await?;
    }

    // the first pass runs at start; the three new records reach the store within a second
    let all = RecordQuery {
        limit: 1000,
        ..RecordQuery::default()
    };
    let runs = ProbeRunQuery {
        limit: 100,
        ..ProbeRunQuery::default()
    };
    let records_cut = retention_cut(now, Duration::from_secs(5 * 86_400));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    // the pass is over once /metrics counts it
    let pass_done = "samewise_retention_passes_total{outcome=\"ok\"} 1\n";
    let (left, runs_left, metrics) = loop {
        let left = store.request_records(&all).await?;
        let runs_left = store.probe_runs(&runs).await?;
        let with_raw = runs_left.iter().filter(|r| r.raw.is_some()).count();
        let metrics = scrape(&client, &url).await?;
        if left.len() == 5 + 3
            && left.iter().all(|r| r.ts_ms >= records_cut)
            && runs_left.len() == 6
            && with_raw == 2
            && metrics.contains(pass_done)
        {
            break (left, runs_left, metrics);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "after 30 s: {} records, {} before the cut; {} probe runs, {with_raw} with raw data; \
             the pass counted: {}; log:\n{}",
            left.len(),
            left.iter().filter(|r| r.ts_ms < records_cut).count(),
            runs_left.len(),
            metrics.contains(pass_done),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // what the pass did, on /metrics: 10 records, 2 probe runs deleted and 4 cleared, the
    // 40-day-old records' rollup minutes (4 s of them: 1, or 2 across a minute's end); no
    // failed pass; its end within the test's time
    let value = |series: &str| {
        metrics.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
    };
    for (series, want) in [
        (
            "samewise_retention_passes_total{outcome=\"failed\"}",
            0.0..=0.0,
        ),
        (
            "samewise_retention_rows_total{what=\"records\"}",
            10.0..=10.0,
        ),
        (
            "samewise_retention_rows_total{what=\"probe_runs\"}",
            2.0..=2.0,
        ),
        (
            "samewise_retention_rows_total{what=\"probe_raw\"}",
            4.0..=4.0,
        ),
        (
            "samewise_retention_rows_total{what=\"rollup_minutes\"}",
            1.0..=2.0,
        ),
    ] {
        let got = value(series);
        ensure!(
            got.is_some_and(|v| want.contains(&v)),
            "{series} is {got:?}, not {want:?}, in\n{metrics}"
        );
    }
    let ended = value("samewise_retention_last_pass_timestamp_seconds");
    ensure!(
        ended.is_some_and(|t| t * 1e3 >= now as f64 && t * 1e3 <= now_ms() as f64),
        "last pass at {ended:?}, the test began at {now} ms"
    );
    let longest = value("samewise_retention_last_pass_longest_step_seconds");
    ensure!(
        longest.is_some_and(|s| (0.0..30.0).contains(&s)),
        "{longest:?}"
    );
    // the 40-day-old runs went; the 10- and 2-day-old ones kept their statistics, not their raw
    // data; today's kept both
    for r in &runs_left {
        let age = r.stats["age_days"].as_i64();
        let kept_raw = r.raw.as_ref().map(|b| (b.len(), b[0]));
        match age {
            Some(10 | 2) => ensure!(kept_raw.is_none(), "{r:?}"),
            Some(0) => ensure!(kept_raw == Some((4096, 0)), "{r:?}"),
            _ => anyhow::bail!("a run of {age:?} days kept: {r:?}"),
        }
        ensure!(r.stats["kl_mean"] == 0.01 && r.tokens == 100, "{r:?}");
    }
    ensure!(
        left.iter()
            .filter(|r| r.request_id.starts_with("age2-"))
            .count()
            == 5,
        "a record younger than the cut went"
    );
    // rollups: the 40-day-old day went, the 10-day-old day is kept (20 days), and the minutes
    // since the start hold the three new requests
    ensure!(
        rollup_requests(&store, day_of(40)).await? == 0,
        "day 40 kept"
    );
    ensure!(
        rollup_requests(&store, day_of(10)).await? == 5,
        "day 10 lost"
    );
    ensure!(rollup_requests(&store, day_of(2)).await? == 5, "day 2 lost");
    let since_start = RollupQuery {
        model: Some("m".to_owned()),
        endpoint: None,
        since_ms: now.div_euclid(60_000) * 60_000,
        until_ms: now_ms() + 60_000,
    };
    let new: i64 = store
        .endpoint_rollups(&since_start)
        .await?
        .iter()
        .map(|e| e.totals.requests)
        .sum();
    ensure!(new == 3, "{new} requests rolled up since the start");
    // the pass's line, in plain text (stderr is a file, not a terminal: no colour codes)
    let logged = std::fs::read_to_string(&log)?;
    ensure!(
        logged
            .lines()
            .any(|l| l.contains("retention deleted old rows")
                && l.contains(" records=10 ")
                && l.contains(" probe_raw=4 ")
                && l.contains(" probe_runs=2 ")
                && l.contains(" steps=")),
        "{logged:?}"
    );
    ensure!(!logged.contains('\x1b'), "{logged:?}");
    drop(gateway);
    store.close().await;
    Ok(())
}

/// The probe scheduler without a gateway (`samewise probes run`, on its schedule) runs the
/// configured retention: probe runs 40 days old are deleted, 2 days old lose their raw data,
/// today's keep it; SIGTERM stops it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_run_alone_keeps_the_retention_of_its_probe_runs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let store = Store::connect(None, &data).await?;
    let now = now_ms();
    for age in [40i64, 2, 0] {
        store
            .insert_probe_run(&aged_run("smol", "down/smol", now, age))
            .await?;
    }
    // an endpoint nothing listens on: its probes fail, which does not matter here
    let cfg = dir.path().join("samewise.toml");
    let config = crate::common::probes::config(&data, &[("down", "http://127.0.0.1:9")], "")?
        + "\n[retention]\nrollups_days = 20\nprobe_raw_days = 1\n";
    std::fs::write(&cfg, config)?;
    let cfg_arg = cfg.to_str().context("config path is not UTF-8")?;
    let log = dir.path().join("probes.log");
    let probes = spawn_logged(&["probes", "run", "--config", cfg_arg], dir.path(), &log)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let ages = |runs: &[ProbeRun], raw: bool| -> Vec<i64> {
        let mut v: Vec<i64> = runs
            .iter()
            .filter(|r| r.raw.is_some() == raw)
            .filter_map(|r| r.stats["age_days"].as_i64())
            .collect();
        v.sort_unstable();
        v
    };
    loop {
        let runs = store
            .probe_runs(&ProbeRunQuery {
                endpoint: Some("down/smol".to_owned()),
                limit: 100,
                ..ProbeRunQuery::default()
            })
            .await?;
        // the scheduler's own failed runs carry no age
        if ages(&runs, true) == [0] && ages(&runs, false) == [2] {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "after 60 s: with raw data {:?}, without {:?}; log:\n{}",
            ages(&runs, true),
            ages(&runs, false),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    store.close().await;
    let status = probes.stop()?;
    ensure!(
        status.success(),
        "probes run exited {status}; log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    Ok(())
}
