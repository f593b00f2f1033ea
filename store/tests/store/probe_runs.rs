//! Probe runs: round trip of every field (and of the raw data alone), filters and newest-first order, the hourly token
//! sum, retention (raw data cleared, then runs deleted), the changed? detector's baselines
//! and the first runs they come from, and the scheduler lock (one holder per PostgreSQL
//! database).

use super::*;
use anyhow::Context;
use samewise_store::{ProbeRun, ProbeRunQuery};

both!(
    probe_run_round_trip,
    probe_run_filters_and_tokens,
    retention_clears_old_raw_data_then_deletes_old_runs,
    baselines_round_trip_replace_and_outlive_their_runs,
    first_series_runs_are_the_oldest_that_ran_and_are_no_repeats,
    scheduler_lock_one_holder
);

fn run(endpoint: &str, kind: &str, started_ms: i64, tokens: i64) -> ProbeRun {
    ProbeRun {
        id: 0,
        model: "smollm2".to_owned(),
        endpoint: endpoint.to_owned(),
        kind: kind.to_owned(),
        started_ms,
        finished_ms: started_ms + 250,
        ok: true,
        error: None,
        tokens,
        stats: serde_json::json!({"kl_mean": 0.0123, "positions": 512, "top1_same": 0.99}),
        raw: Some(vec![0, 1, 2, 255, 0]),
        repeat_of: None,
    }
}

async fn probe_run_round_trip(db: TestDb) -> Result<()> {
    let first = run("p/a", "prompt_logprobs", 1_000, 700);
    let id1 = db.store.insert_probe_run(&first).await?;
    let mut second = run("p/a", "prompt_logprobs", 2_000, 650);
    second.repeat_of = Some(id1);
    second.raw = None;
    second.stats = serde_json::json!({"nested": {"list": [1, 2.5, null, "x"]}, "p_value": 1e-12});
    let id2 = db.store.insert_probe_run(&second).await?;
    let mut failed = run("p/a", "samples", 3_000, 0);
    failed.ok = false;
    failed.error = Some("logprobs refused\0 by upstream".to_owned());
    failed.stats = serde_json::json!({});
    let id3 = db.store.insert_probe_run(&failed).await?;
    ensure!(id1 != id2 && id2 != id3, "ids {id1} {id2} {id3}");
    let got = db
        .store
        .probe_runs(&ProbeRunQuery {
            endpoint: Some("p/a".to_owned()),
            limit: 10,
            ..ProbeRunQuery::default()
        })
        .await?;
    ensure!(got.len() == 3, "{got:?}");
    // newest first, every field back as written (id assigned; NUL stored as U+FFFD)
    let expect = [
        ProbeRun {
            id: id3,
            error: Some("logprobs refused\u{FFFD} by upstream".to_owned()),
            ..failed
        },
        ProbeRun { id: id2, ..second },
        ProbeRun { id: id1, ..first },
    ];
    for (g, e) in got.iter().zip(expect.iter()) {
        ensure!(g == e, "read back {g:?}, wrote {e:?}");
    }
    // the raw data of the runs asked for that have it (the second has none; no run 999999)
    let mut raw = db.store.probe_run_raw(&[id3, id2, id1, 999_999]).await?;
    raw.sort();
    let want = vec![(id1, vec![0, 1, 2, 255, 0]), (id3, vec![0, 1, 2, 255, 0])];
    ensure!(raw == want, "{raw:?}");
    ensure!(db.store.probe_run_raw(&[]).await?.is_empty());
    // a run needs its identity
    let bad = db.store.insert_probe_run(&run("", "samples", 1, 1)).await;
    ensure!(matches!(bad, Err(StoreError::InvalidInput(_))), "{bad:?}");
    Ok(())
}

async fn probe_run_filters_and_tokens(db: TestDb) -> Result<()> {
    for (i, (ep, kind)) in [
        ("p/a", "prompt_logprobs"),
        ("p/b", "prompt_logprobs"),
        ("p/a", "samples"),
        ("p/b", "samples"),
        ("p/a", "prompt_logprobs"),
    ]
    .iter()
    .enumerate()
    {
        let i = i as i64;
        let mut r = run(ep, kind, 10_000 + i * 1_000, 100 + i);
        if i == 3 {
            r.model = "other".to_owned();
        }
        db.store.insert_probe_run(&r).await?;
    }
    let q = |endpoint: Option<&str>,
             kind: Option<&str>,
             model: Option<&str>,
             since: Option<i64>,
             limit| ProbeRunQuery {
        model: model.map(str::to_owned),
        endpoint: endpoint.map(str::to_owned),
        kind: kind.map(str::to_owned),
        since_ms: since,
        limit,
    };
    let starts = |v: Vec<ProbeRun>| v.iter().map(|r| r.started_ms).collect::<Vec<_>>();
    ensure!(
        starts(db.store.probe_runs(&q(None, None, None, None, 100)).await?)
            == [14_000, 13_000, 12_000, 11_000, 10_000]
    );
    ensure!(
        starts(
            db.store
                .probe_runs(&q(Some("p/a"), None, None, None, 100))
                .await?
        ) == [14_000, 12_000, 10_000]
    );
    ensure!(
        starts(
            db.store
                .probe_runs(&q(Some("p/a"), Some("prompt_logprobs"), None, None, 100))
                .await?
        ) == [14_000, 10_000]
    );
    ensure!(
        starts(
            db.store
                .probe_runs(&q(None, None, Some("other"), None, 100))
                .await?
        ) == [13_000]
    );
    ensure!(
        starts(
            db.store
                .probe_runs(&q(None, None, None, Some(12_000), 100))
                .await?
        ) == [14_000, 13_000, 12_000]
    );
    ensure!(starts(db.store.probe_runs(&q(None, None, None, None, 2)).await?) == [14_000, 13_000]);
    ensure!(
        db.store
            .probe_runs(&q(Some("nobody"), None, None, None, 100))
            .await?
            .is_empty()
    );
    // tokens: p/a has runs 0 (100), 2 (102), 4 (104)
    ensure!(db.store.probe_tokens_since("p/a", 0).await? == 306);
    ensure!(db.store.probe_tokens_since("p/a", 11_000).await? == 206);
    ensure!(db.store.probe_tokens_since("p/a", 14_001).await? == 0);
    ensure!(db.store.probe_tokens_since("nobody", 0).await? == 0);
    Ok(())
}

async fn scheduler_lock_one_holder(db: TestDb) -> Result<()> {
    let other = Store::connect(Some(db.url()), db.data_dir()).await?;
    let mut held = db
        .store
        .try_scheduler_lock()
        .await?
        .context("first store could not take a free lock")?;
    held.check().await?;
    match db.backend() {
        Backend::Sqlite => {
            // one process per SQLite file: always granted
            ensure!(other.try_scheduler_lock().await?.is_some());
        }
        Backend::Postgres => {
            ensure!(
                other.try_scheduler_lock().await?.is_none(),
                "second store took the lock while the first held it"
            );
            // still refused on a second try (the refused attempt leaves nothing behind)
            ensure!(other.try_scheduler_lock().await?.is_none());
            // dropped: the session closes and the server frees the lock
            drop(held);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let taken = loop {
                if let Some(lock) = other.try_scheduler_lock().await? {
                    break Some(lock);
                }
                if tokio::time::Instant::now() >= deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let second = taken.context("lock not taken")?;
            ensure!(db.store.try_scheduler_lock().await?.is_none());
            // released explicitly: free at once
            second.release().await?;
            let again = db.store.try_scheduler_lock().await?;
            ensure!(again.is_some(), "lock not free after release");
        }
    }
    other.close().await;
    Ok(())
}

/// Retention on probe runs: a run older than `probe_raw` (whole days) loses its raw data and
/// keeps its statistics; one older than `rollups` is deleted, and a kept run that repeated it
/// keeps its data with `repeat_of` cleared; both in steps of `chunk_runs`, oldest first; the
/// all-time counts stay; a pass asked to stop changes nothing.
async fn retention_clears_old_raw_data_then_deletes_old_runs(db: TestDb) -> Result<()> {
    use samewise_store::{DAY_MS, RetentionConfig, RetentionPass};
    let day = 20_100i64;
    let now = day * DAY_MS + 15 * 3_600_000;
    let at = |days_back: i64, i: i64| (day - days_back) * DAY_MS + i * 60_000;
    // 5 runs 40 days back, 4 ten days back (one repeating the last of the 40-day ones, one a
    // run without raw data), 3 today
    let mut ids = std::collections::BTreeMap::new();
    for i in 0..5 {
        ids.insert(
            ("d40", i),
            db.store
                .insert_probe_run(&run("p/a", "prompt_logprobs", at(40, i), 10))
                .await?,
        );
    }
    for i in 0..4 {
        let mut r = run(
            if i % 2 == 0 { "p/a" } else { "p/b" },
            "prompt_logprobs",
            at(10, i),
            10,
        );
        if i == 0 {
            r.repeat_of = Some(ids[&("d40", 4)]);
        }
        if i == 3 {
            r.raw = None;
        }
        ids.insert(("d10", i), db.store.insert_probe_run(&r).await?);
    }
    for i in 0..3 {
        ids.insert(
            ("d0", i),
            db.store
                .insert_probe_run(&run("p/b", "samples", now - 60_000 * (3 - i), 10))
                .await?,
        );
    }
    let counts_before = db.store.probe_run_counts().await?;
    let cfg = RetentionConfig {
        records: None,
        rollups: Some(Duration::from_secs(20 * 86_400)),
        probe_raw: Some(Duration::from_secs(5 * 86_400)),
        chunk_runs: 2,
        pause: Duration::from_millis(1),
        ..RetentionConfig::default()
    };
    let everything = || {
        let store = db.store.clone();
        async move {
            let mut all = store
                .probe_runs(&ProbeRunQuery {
                    limit: 100,
                    ..ProbeRunQuery::default()
                })
                .await?;
            all.reverse();
            Ok::<Vec<ProbeRun>, anyhow::Error>(all)
        }
    };
    let before = everything().await?;
    ensure!(before.len() == 12);
    let (stop, stopped) = tokio::sync::watch::channel(true);
    let pass = db.store.retention_pass(&cfg, now, &stopped).await?;
    ensure!(pass == RetentionPass::default(), "{pass:?}");
    ensure!(everything().await? == before);
    stop.send(false)?;
    let pass = db.store.retention_pass(&cfg, now, &stopped).await?;
    // the 5 runs of 40 days back deleted in steps of 2 (2, 2, 1), then the raw data of the 3
    // of 10 days back that had it cleared (2, 1)
    ensure!(
        (pass.probe_runs, pass.probe_raw, pass.steps) == (5, 3, 5) && pass.records == 0,
        "{pass:?}"
    );
    let after = everything().await?;
    let kept: Vec<i64> = after.iter().map(|r| r.id).collect();
    let want: Vec<i64> = before.iter().skip(5).map(|r| r.id).collect();
    ensure!(kept == want, "kept {kept:?}, want {want:?}");
    for (a, b) in after.iter().zip(before.iter().skip(5)) {
        let today = a.started_ms >= day * DAY_MS;
        // statistics, tokens and times kept; raw only today's; the repeat of a deleted run
        // cut loose
        let expect = ProbeRun {
            raw: if today { b.raw.clone() } else { None },
            repeat_of: None,
            ..b.clone()
        };
        ensure!(*a == expect, "after {a:?}\nwant {expect:?}");
    }
    ensure!(after.iter().filter(|r| r.raw.is_some()).count() == 3);
    ensure!(db.store.probe_run_counts().await? == counts_before);
    // nothing left: one step of each finds nothing
    let pass = db.store.retention_pass(&cfg, now, &stopped).await?;
    ensure!(
        (pass.probe_raw, pass.probe_runs, pass.steps) == (0, 0, 2),
        "{pass:?}"
    );
    ensure!(everything().await? == after);
    Ok(())
}

async fn baselines_round_trip_replace_and_outlive_their_runs(db: TestDb) -> Result<()> {
    use samewise_store::{BaselineRun, ProbeBaseline, RetentionConfig, StoreError};
    let base = |statistic: &str, after_ms: Option<i64>, values: &[f64]| ProbeBaseline {
        model: "smollm2".to_owned(),
        endpoint: "p/a".to_owned(),
        kind: "prompt_logprobs".to_owned(),
        statistic: statistic.to_owned(),
        after_ms,
        runs: values
            .iter()
            .enumerate()
            .map(|(i, &value)| BaselineRun {
                id: 10 + i as i64,
                started_ms: 1_000 * i as i64,
                value,
            })
            .collect(),
        created_ms: 77,
    };
    let get = |kind: &'static str| {
        let store = db.store.clone();
        async move { store.probe_baselines("smollm2", "p/a", kind).await }
    };
    ensure!(get("prompt_logprobs").await?.is_empty());
    let kl = base("kl_mean", None, &[0.0123, 1e-12, 0.5, 0.0]);
    db.store.put_probe_baseline(&kl).await?;
    let top1 = base("top1_same", None, &[0.98, 0.97]);
    db.store.put_probe_baseline(&top1).await?;
    // every field back as written, by statistic; other kinds and endpoints have none
    ensure!(get("prompt_logprobs").await? == vec![kl.clone(), top1.clone()]);
    ensure!(get("samples").await?.is_empty());
    ensure!(
        db.store
            .probe_baselines("smollm2", "p/b", "prompt_logprobs")
            .await?
            .is_empty()
    );
    // a new baseline (after an accepted change) replaces the statistic's old one
    let kl2 = ProbeBaseline {
        created_ms: 99,
        ..base("kl_mean", Some(5_000), &[0.1, 0.104])
    };
    db.store.put_probe_baseline(&kl2).await?;
    ensure!(get("prompt_logprobs").await? == vec![kl2.clone(), top1.clone()]);
    // refused, nothing stored
    for bad in [
        base("", None, &[0.1]),
        base("kl_p99", None, &[0.1, f64::NAN]),
        base("kl_p99", None, &[f64::INFINITY]),
    ] {
        match db.store.put_probe_baseline(&bad).await {
            Err(StoreError::InvalidInput(msg)) => ensure!(!msg.is_empty()),
            other => anyhow::bail!("{bad:?} gave {other:?}"),
        }
    }
    ensure!(get("prompt_logprobs").await?.len() == 2);
    // retention deletes the runs a baseline came from, never the baseline
    for i in 0..3 {
        db.store
            .insert_probe_run(&run("p/a", "prompt_logprobs", 1_000 * i, 10))
            .await?;
    }
    let cfg = RetentionConfig {
        records: None,
        rollups: Some(Duration::from_secs(86_400)),
        ..RetentionConfig::default()
    };
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let pass = db
        .store
        .retention_pass(&cfg, 10 * samewise_store::DAY_MS, &stopped)
        .await?;
    ensure!(pass.probe_runs == 3, "{pass:?}");
    ensure!(get("prompt_logprobs").await? == vec![kl2, top1]);
    Ok(())
}

async fn first_series_runs_are_the_oldest_that_ran_and_are_no_repeats(db: TestDb) -> Result<()> {
    let mut ids = Vec::new();
    // inserted newest first: the order comes from the start times, then the ids
    for t in [5_000, 3_000, 3_000, 1_000] {
        ids.push(
            db.store
                .insert_probe_run(&run("p/a", "prompt_logprobs", t, 10))
                .await?,
        );
    }
    let mut failed = run("p/a", "prompt_logprobs", 500, 0);
    failed.ok = false;
    db.store.insert_probe_run(&failed).await?;
    let mut repeat = run("p/a", "prompt_logprobs", 1_500, 10);
    repeat.repeat_of = Some(ids[3]);
    db.store.insert_probe_run(&repeat).await?;
    db.store
        .insert_probe_run(&run("p/b", "prompt_logprobs", 100, 10))
        .await?;
    db.store
        .insert_probe_run(&run("p/a", "samples", 100, 10))
        .await?;
    let first = |after: Option<i64>, limit: u32| {
        let store = db.store.clone();
        async move {
            let runs = store
                .first_series_runs("smollm2", "p/a", "prompt_logprobs", after, limit)
                .await?;
            ensure!(runs.iter().all(|r| r.raw.is_none() && r.ok), "{runs:?}");
            Ok::<Vec<i64>, anyhow::Error>(runs.iter().map(|r| r.id).collect())
        }
    };
    // 1,000, then the two of 3,000 by id, then 5,000
    ensure!(first(None, 10).await? == vec![ids[3], ids[1], ids[2], ids[0]]);
    ensure!(first(None, 2).await? == vec![ids[3], ids[1]]);
    // after: strictly later starts
    ensure!(first(Some(1_000), 10).await? == vec![ids[1], ids[2], ids[0]]);
    ensure!(first(Some(5_000), 10).await?.is_empty());
    let one = db
        .store
        .first_series_runs("smollm2", "p/a", "prompt_logprobs", None, 1)
        .await?;
    ensure!(
        one.len() == 1 && one[0].stats == run("p/a", "prompt_logprobs", 0, 0).stats,
        "{one:?}"
    );
    Ok(())
}
