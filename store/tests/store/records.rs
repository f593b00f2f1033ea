//! Request records: every field round-trips (Some and None), batches, query filters and
//! order, duplicates, retention (stepped passes, the task's counts) and day partitions.

use super::*;

both!(
    round_trip_every_field,
    round_trip_none_values,
    nul_characters_do_not_fail_a_batch,
    batch_of_a_thousand,
    query_filters_and_order,
    duplicate_attempts_are_skipped,
    retention_deletes_old_records,
    retention_drops_day_partitions,
    retention_pass_goes_in_steps_keeps_whole_days_and_stops_when_asked,
    retention_task_counts_its_passes_and_failures,
);

async fn round_trip_every_field(db: TestDb) -> Result<()> {
    let rows = vec![
        full_record("req-a", 1, 1_700_000_000_000),
        full_record("req-a", 2, 1_700_000_000_001),
    ];
    db.store.insert_request_records(&rows).await?;
    let mut got = db.store.request_records(&by_id("req-a")).await?;
    got.reverse(); // newest first -> oldest first
    ensure!(
        got == rows,
        "round trip differs:\n got {got:#?}\nwant {rows:#?}"
    );
    Ok(())
}

async fn round_trip_none_values(db: TestDb) -> Result<()> {
    // None and Some values of the same column in one batch
    let row = bare_record("rejected", 7);
    let full = full_record("served", 1, 6);
    db.store
        .insert_request_records(&[row.clone(), full.clone()])
        .await?;
    let got = db.store.request_records(&by_id("rejected")).await?;
    ensure!(
        got == vec![row.clone()],
        "round trip differs: {got:#?} vs {row:#?}"
    );
    let got = db.store.request_records(&by_id("served")).await?;
    ensure!(
        got == vec![full.clone()],
        "round trip differs: {got:#?} vs {full:#?}"
    );
    Ok(())
}

async fn nul_characters_do_not_fail_a_batch(db: TestDb) -> Result<()> {
    let mut odd = full_record("nul\0id", 1, 3);
    odd.model = "m\0".into();
    odd.finish_reason = Some("\0".into());
    let ok = full_record("fine", 1, 4);
    db.store.insert_request_records(&[odd, ok.clone()]).await?;
    ensure!(db.store.request_records(&by_id("fine")).await? == vec![ok]);
    // stored with U+FFFD in place of NUL; a query naming the NUL form finds it too
    let got = db.store.request_records(&by_id("nul\0id")).await?;
    ensure!(got.len() == 1, "{got:?}");
    ensure!(got[0].request_id == "nul\u{FFFD}id" && got[0].model == "m\u{FFFD}");
    ensure!(got[0].finish_reason.as_deref() == Some("\u{FFFD}"));
    Ok(())
}

async fn batch_of_a_thousand(db: TestDb) -> Result<()> {
    let rows: Vec<RequestRecord> = (0..1000)
        .map(|i| full_record(&format!("bulk-{i:04}"), 1, 10_000 + i64::from(i)))
        .collect();
    db.store.insert_request_records(&rows).await?;
    let got = db.store.request_records(&all(5000)).await?;
    ensure!(got.len() == 1000, "got {} rows", got.len());
    ensure!(got[0].request_id == "bulk-0999" && got[999].request_id == "bulk-0000");
    ensure!(
        got.iter().rev().eq(rows.iter()),
        "rows differ after the bulk insert"
    );
    Ok(())
}

async fn query_filters_and_order(db: TestDb) -> Result<()> {
    let mut rows = Vec::new();
    for i in 0..10i64 {
        let mut r = full_record(&format!("q{i}"), 1, 100 + i);
        r.model = if i % 2 == 0 {
            "even".into()
        } else {
            "odd".into()
        };
        r.endpoint = Some(format!("ep{}", i % 3));
        rows.push(r);
    }
    db.store.insert_request_records(&rows).await?;
    let ids = |v: Vec<RequestRecord>| v.into_iter().map(|r| r.request_id).collect::<Vec<_>>();
    let q = RecordQuery {
        model: Some("even".into()),
        limit: 100,
        ..RecordQuery::default()
    };
    ensure!(ids(db.store.request_records(&q).await?) == ["q8", "q6", "q4", "q2", "q0"]);
    let q = RecordQuery {
        endpoint: Some("ep1".into()),
        limit: 100,
        ..RecordQuery::default()
    };
    ensure!(ids(db.store.request_records(&q).await?) == ["q7", "q4", "q1"]);
    let q = RecordQuery {
        since_ms: Some(107),
        limit: 100,
        ..RecordQuery::default()
    };
    ensure!(ids(db.store.request_records(&q).await?) == ["q9", "q8", "q7"]);
    let q = RecordQuery {
        model: Some("odd".into()),
        endpoint: Some("ep0".into()),
        since_ms: Some(100),
        limit: 100,
        request_id: None,
    };
    ensure!(ids(db.store.request_records(&q).await?) == ["q9", "q3"]);
    ensure!(ids(db.store.request_records(&all(2)).await?) == ["q9", "q8"]);
    ensure!(db.store.request_records(&all(0)).await?.is_empty());
    ensure!(db.store.request_records(&by_id("nope")).await?.is_empty());
    // attempts of one request come back newest (highest attempt) first at equal ts
    db.store
        .insert_request_records(&[full_record("multi", 1, 500), full_record("multi", 2, 500)])
        .await?;
    let got = db.store.request_records(&by_id("multi")).await?;
    ensure!(got.iter().map(|r| r.attempt).collect::<Vec<_>>() == [2, 1]);
    Ok(())
}

async fn duplicate_attempts_are_skipped(db: TestDb) -> Result<()> {
    let r = full_record("dup", 1, 1);
    db.store
        .insert_request_records(std::slice::from_ref(&r))
        .await?;
    let mut changed = r.clone();
    changed.latency_ms = 999.0;
    // a retried batch that partly reached the database must not fail or double-count
    db.store
        .insert_request_records(&[changed, full_record("dup", 2, 2)])
        .await?;
    let got = db.store.request_records(&by_id("dup")).await?;
    ensure!(got.len() == 2);
    ensure!(got[1] == r, "the first stored attempt was overwritten");
    Ok(())
}

async fn retention_deletes_old_records(db: TestDb) -> Result<()> {
    let rows: Vec<_> = (0..10)
        .map(|i| full_record(&format!("t{i}"), 1, i64::from(i) * 100))
        .collect();
    db.store.insert_request_records(&rows).await?;
    ensure!(db.store.delete_request_records_before(500).await? == 5);
    ensure!(db.store.delete_request_records_before(500).await? == 0);
    let left = db.store.request_records(&all(100)).await?;
    ensure!(left.len() == 5 && left.iter().all(|r| r.ts_ms >= 500));
    Ok(())
}

async fn retention_drops_day_partitions(db: TestDb) -> Result<()> {
    use samewise_store::{DAY_MS, partition_name};
    let d = 20_000i64; // 2024-10-04, long before "today"
    let created = db.store.ensure_record_partitions(d * DAY_MS + 5, 2).await?;
    let expected: Vec<String> = (d..=d + 2).map(partition_name).collect();
    match db.backend() {
        Backend::Postgres => ensure!(created == expected, "created {created:?}"),
        Backend::Sqlite => ensure!(created.is_empty()),
    }
    // asking again creates nothing
    ensure!(
        db.store
            .ensure_record_partitions(d * DAY_MS, 2)
            .await?
            .is_empty()
    );
    let mut rows = Vec::new();
    for day in d..=d + 2 {
        for i in 0..3 {
            rows.push(full_record(
                &format!("p{day}-{i}"),
                1,
                day * DAY_MS + i * 1000,
            ));
        }
    }
    rows.push(full_record("old", 1, 1)); // 1970: the default partition
    db.store.insert_request_records(&rows).await?;
    ensure!(db.store.request_records(&all(100)).await?.len() == 10);
    let partitions = db.store.record_partitions().await?;
    if db.backend() == Backend::Postgres {
        ensure!(
            expected.iter().all(|p| partitions.contains(p)),
            "{partitions:?}"
        );
    }
    // cut in the middle of day d+2: days d and d+1 go whole, plus "old" and one row of d+2;
    // two at once (gateways sharing the database), each row counted by one of them
    let cut = (d + 2) * DAY_MS + 500;
    let (a, b) = tokio::join!(
        db.store.delete_request_records_before(cut),
        db.store.delete_request_records_before(cut)
    );
    let deleted = a? + b?;
    ensure!(deleted == 3 + 3 + 1 + 1, "deleted {deleted}");
    let left = db.store.request_records(&all(100)).await?;
    ensure!(left.len() == 2 && left.iter().all(|r| r.ts_ms >= (d + 2) * DAY_MS + 500));
    let partitions = db.store.record_partitions().await?;
    ensure!(
        !partitions.contains(&partition_name(d)) && !partitions.contains(&partition_name(d + 1))
    );
    if db.backend() == Backend::Postgres {
        ensure!(partitions.contains(&partition_name(d + 2)));
        // today's partition (made at connect) is untouched
        ensure!(partitions.contains(&partition_name(samewise_store::now_ms().div_euclid(DAY_MS))));
    }
    // a day whose rows already sit in the default partition is skipped, not an error
    let late = d - 10;
    db.store
        .insert_request_records(&[full_record("late", 1, late * DAY_MS)])
        .await?;
    ensure!(
        db.store
            .ensure_record_partitions(late * DAY_MS, 0)
            .await?
            .is_empty()
    );
    ensure!(db.store.request_records(&by_id("late")).await?.len() == 1);
    Ok(())
}

/// A retention pass deletes the records before the start of the UTC day that holds `now - keep`
/// (so at least `keep` is kept), in steps of `chunk_rows` on SQLite, and the rollups of the
/// days before their own cut; a pass asked to stop deletes nothing more.
async fn retention_pass_goes_in_steps_keeps_whole_days_and_stops_when_asked(
    db: TestDb,
) -> Result<()> {
    use samewise_store::{DAY_MS, RetentionConfig, RetentionPass, RollupQuery, retention_cut};
    let day = 20_100i64; // "today" of this test: 2025-01-12
    let now = day * DAY_MS + 15 * 3_600_000; // 15:00
    // 7 records 3 days back (one at 00:00:00.000, the rest later that day), 5 two days back at
    // 14:00 (an hour short of two whole days), 2 today
    let mut rows = Vec::new();
    for i in 0..7 {
        rows.push(full_record(
            &format!("d3-{i}"),
            1,
            (day - 3) * DAY_MS + i * 60_000,
        ));
    }
    for i in 0..5 {
        rows.push(full_record(
            &format!("d2-{i}"),
            1,
            (day - 2) * DAY_MS + 14 * 3_600_000 + i,
        ));
    }
    rows.push(full_record("d0-0", 1, now - 1000));
    rows.push(full_record("d0-1", 1, now));
    db.store.insert_request_records(&rows).await?;
    // keep 2 days: now - 2 d falls on day - 2 at 15:00, so that whole day stays
    let keep = Duration::from_secs(2 * 86_400);
    ensure!(retention_cut(now, keep) == (day - 2) * DAY_MS);
    let cfg = RetentionConfig {
        records: Some(keep),
        rollups: Some(Duration::from_secs(3 * 86_400)),
        probe_raw: None,
        chunk_rows: 3,
        pause: Duration::from_millis(1),
        ..RetentionConfig::default()
    };
    // with the rollups' cut, one step finds the probe runs to delete (none here)
    let probe_step = 1;
    let (stop, stopped) = tokio::sync::watch::channel(true);
    let deleted = |p: RetentionPass| (p.records, p.rollup_minutes);
    // asked to stop before it began: nothing goes
    let pass = db.store.retention_pass(&cfg, now, &stopped).await?;
    ensure!(deleted(pass) == (0, 0) && pass.steps == 0, "{pass:?}");
    ensure!(db.store.request_records(&all(100)).await?.len() == 14);
    stop.send(false)?;
    let pass = db.store.retention_pass(&cfg, now, &stopped).await?;
    // steps of 3: 3, 3, 1 (PostgreSQL: everything in the first, then none)
    let steps = if db.backend() == Backend::Sqlite {
        3
    } else {
        2
    };
    ensure!(
        pass.records == 7 && pass.steps == steps + probe_step,
        "{pass:?}"
    );
    let left = db.store.request_records(&all(100)).await?;
    ensure!(
        left.len() == 7 && left.iter().all(|r| !r.request_id.starts_with("d3-")),
        "{:?}",
        left.iter().map(|r| &r.request_id).collect::<Vec<_>>()
    );
    // rollups keep 3 days: now - 3 d is day - 3 at 15:00, so day - 3 stays and nothing goes
    ensure!(pass.rollup_minutes == 0, "{pass:?}");
    let requests = |since: i64, until: i64| {
        let store = db.store.clone();
        async move {
            let q = RollupQuery {
                model: None,
                endpoint: None,
                since_ms: since,
                until_ms: until,
            };
            Ok::<i64, anyhow::Error>(
                store
                    .endpoint_rollups(&q)
                    .await?
                    .iter()
                    .map(|e| e.totals.requests)
                    .sum(),
            )
        }
    };
    ensure!(requests((day - 3) * DAY_MS, (day - 2) * DAY_MS).await? == 7);
    // a day later the rollups of day - 3 go (its minutes: 7, one a minute), the records of
    // day - 2 too
    let pass = db
        .store
        .retention_pass(&cfg, now + DAY_MS, &stopped)
        .await?;
    ensure!(deleted(pass) == (5, 7), "{pass:?}");
    ensure!(requests((day - 3) * DAY_MS, (day - 2) * DAY_MS).await? == 0);
    ensure!(requests((day - 2) * DAY_MS, (day + 1) * DAY_MS).await? == 7);
    ensure!(db.store.request_records(&all(100)).await?.len() == 2);
    // nothing left to delete: a pass deletes nothing
    let pass = db
        .store
        .retention_pass(&cfg, now + DAY_MS, &stopped)
        .await?;
    ensure!(
        deleted(pass) == (0, 0) && pass.steps == 1 + probe_step,
        "{pass:?}"
    );
    Ok(())
}

/// SQLite's records go in through its C API on the connection sqlx holds, the work handed
/// off the runtime's thread (`block_in_place`) on a multi-threaded runtime, as the gateway's
/// is: rows, duplicates and a refused batch behave there as on the tests' current-thread one,
/// and the connection is usable after the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_inserts_on_a_multi_threaded_runtime() -> Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let rows: Vec<RequestRecord> = (0..300)
        .map(|i| full_record(&format!("mt{i:03}"), 1, 1_700_000_000_000 + i))
        .collect();
    // the batch and, concurrently from another task, its first half again: each row once
    let (a, b) = tokio::join!(
        db.store.insert_request_records(&rows),
        db.store.insert_request_records(&rows[..150])
    );
    a?;
    b?;
    let got = db.store.request_records(&all(1000)).await?;
    ensure!(got.len() == 300, "{} rows", got.len());
    // stored and new rows interleaved, one new row twice: the rollups count each new row once
    let mut mixed = Vec::new();
    for i in 0..100 {
        mixed.push(rows[i * 3].clone());
        mixed.push(full_record(
            &format!("mx{i:03}"),
            1,
            1_700_000_000_500 + i as i64,
        ));
    }
    mixed.insert(7, mixed[5].clone());
    db.store.insert_request_records(&mixed).await?;
    let rolled = db
        .store
        .endpoint_rollups(&samewise_store::RollupQuery {
            since_ms: 1_699_999_000_000,
            until_ms: 1_700_001_000_000,
            ..samewise_store::RollupQuery::default()
        })
        .await?;
    let requests: i64 = rolled.iter().map(|e| e.totals.requests).sum();
    ensure!(
        requests == 400,
        "rollups count {requests} requests, not 400"
    );
    let mut bad = full_record("mt-bad", 1, 1_700_000_001_000);
    bad.latency_ms = f64::NAN; // bound as NULL, refused by NOT NULL
    let refused = db
        .store
        .insert_request_records(&[full_record("mt-ok", 1, 1_700_000_001_000), bad])
        .await;
    let Err(e) = refused else {
        anyhow::bail!("a NULL latency was stored");
    };
    ensure!(!e.is_unavailable(), "{e}");
    ensure!(
        e.to_string().contains("NOT NULL"),
        "the error names the constraint: {e}"
    );
    // the whole batch was rolled back, and the next one goes in
    ensure!(db.store.request_records(&by_id("mt-ok")).await?.is_empty());
    db.store
        .insert_request_records(&[full_record("mt-next", 1, 1_700_000_002_000)])
        .await?;
    ensure!(db.store.request_records(&all(1000)).await?.len() == 401);
    Ok(())
}

/// The retention task counts what its passes did and when the last ended ([`RetentionStats`],
/// what `/metrics` shows), and a pass that fails (the store closed under it) as failed.
async fn retention_task_counts_its_passes_and_failures(db: TestDb) -> Result<()> {
    use anyhow::Context;
    use samewise_store::{RetentionConfig, RetentionTask};
    let now = samewise_store::now_ms();
    let rows: Vec<RequestRecord> = (0..4)
        .map(|i| full_record(&format!("old-{i}"), 1, now - 50 * 86_400_000 + i))
        .collect();
    db.store.insert_request_records(&rows).await?;
    let cfg = RetentionConfig {
        every: Duration::from_millis(50),
        ..RetentionConfig::default()
    };
    let task = RetentionTask::spawn(db.store.clone(), cfg.clone()).context("a task")?;
    let stats = task.stats();
    eventually(Duration::from_secs(10), "two passes", || {
        let stats = stats.clone();
        async move { Ok(stats.passes().0 >= 2) }
    })
    .await?;
    task.shutdown().await;
    ensure!(stats.passes().1 == 0, "{stats:?}");
    // the first pass deleted the 4 records (their rollups are kept 400 days), the next nothing
    let rows = stats.rows();
    let want = [
        ("records", 4),
        ("probe_runs", 0),
        ("probe_raw", 0),
        ("rollup_minutes", 0),
    ];
    ensure!(rows == want, "{rows:?}");
    let (ended, _) = stats.last_pass().context("a finished pass")?;
    ensure!(
        ended >= now && ended <= samewise_store::now_ms(),
        "{ended} vs {now}"
    );
    ensure!(db.store.request_records(&all(10)).await?.is_empty());

    // a store closed under the task: its passes fail and are counted, none finishes
    let closed = Store::connect(Some(db.url()), db.data_dir()).await?;
    closed.close().await;
    let task = RetentionTask::spawn(closed, cfg).context("a task")?;
    let stats = task.stats();
    eventually(Duration::from_secs(10), "a failed pass", || {
        let stats = stats.clone();
        async move { Ok(stats.passes().1 >= 1) }
    })
    .await?;
    task.shutdown().await;
    ensure!(
        stats.passes().0 == 0 && stats.last_pass().is_none(),
        "{stats:?}"
    );
    Ok(())
}
