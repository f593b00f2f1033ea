//! Per-endpoint per-minute rollups: kept by the record insert (only new rows count, in the
//! same transaction), summed per endpoint over a range, as a series with a step, labelled
//! counts, retention; admin keys; probe statistics without raw data; table lookup.

use super::*;
use samewise_store::{DAY_MS, HOUR_MS, MINUTE_MS, hist_quantile, minute_of};
use samewise_store::{KeyOptions, ProbeRun, ProbeRunQuery, RollupQuery};

both!(
    rollups_follow_inserts,
    errors_are_the_endpoints_failures,
    strings_that_store_alike_roll_up_as_one,
    long_ranges_read_hours_and_minute_edges,
    day_hour_and_minute_covers_sum_like_the_minutes,
    series_steps_of_hours_and_days,
    rollup_series_steps,
    rollups_through_the_writer,
    rollup_retention,
    admin_keys,
    probe_stats_and_tables
);

/// An attempt on `endpoint` at `ts_ms` with the given TTFT, TPOT and outcome.
fn attempt(id: &str, endpoint: &str, ts_ms: i64, ttft: f64, error: Option<&str>) -> RequestRecord {
    RequestRecord {
        request_id: id.to_owned(),
        attempt: 1,
        final_attempt: true,
        ts_ms,
        model: "m".to_owned(),
        provider: Some("p".to_owned()),
        endpoint: Some(endpoint.to_owned()),
        route: "chat".to_owned(),
        status: Some(if error.is_some() { 502 } else { 200 }),
        error_kind: error.map(str::to_owned),
        attempts: 1,
        ttft_ms: Some(ttft),
        latency_ms: ttft * 2.0,
        tpot_ms: Some(12.0),
        prompt_tokens: Some(10),
        completion_tokens: Some(5),
        finish_reason: Some(
            if error.is_some() {
                "<script>x</script>"
            } else {
                "stop"
            }
            .to_owned(),
        ),
        ..RequestRecord::default()
    }
}

/// A fixed minute-aligned base time (2026-01-01T00:00Z).
const T0: i64 = 1_767_225_600_000;

/// Every endpoint's rollup over the minute from [`T0`].
async fn first_minute(db: &TestDb) -> Result<Vec<samewise_store::EndpointRollup>> {
    Ok(db
        .store
        .endpoint_rollups(&RollupQuery {
            since_ms: T0,
            until_ms: T0 + MINUTE_MS,
            ..RollupQuery::default()
        })
        .await?)
}

async fn rollups_follow_inserts(db: TestDb) -> Result<()> {
    let s = &db.store;
    let mut batch = vec![
        attempt("a", "p/e1", T0 + 1_000, 40.0, None),
        attempt("b", "p/e1", T0 + 59_999, 150.0, Some("upstream_5xx")),
        attempt("c", "p/e1", T0 + MINUTE_MS, 20_000.0, None),
        attempt("d", "p/e2", T0 + 5_000, 90.0, None),
    ];
    let mut tool = attempt("e", "p/e2", T0 + 6_000, 90.0, None);
    tool.tool_calls = 2;
    tool.tool_invalid_json = 1;
    tool.tool_errored = true;
    tool.degenerate = true;
    batch.push(tool);
    batch.push(bare_record("rejected", T0 + 7_000)); // no endpoint: not rolled up
    s.insert_request_records(&batch).await?;
    // the same batch again (a retry after an ambiguous failure) adds nothing
    s.insert_request_records(&batch).await?;
    // one row given twice in one batch counts once
    let twice = attempt("f", "p/e2", T0 + 8_000, 90.0, None);
    s.insert_request_records(&[twice.clone(), twice]).await?;

    let q = RollupQuery {
        since_ms: T0,
        until_ms: T0 + 10 * MINUTE_MS,
        ..RollupQuery::default()
    };
    let all = s.endpoint_rollups(&q).await?;
    ensure!(all.len() == 2, "{all:?}");
    let e1 = &all[0];
    ensure!(e1.endpoint == "p/e1" && e1.model == "m");
    let t = &e1.totals;
    ensure!(
        t.requests == 3 && t.errors == 1 && t.final_requests == 3,
        "{t:?}"
    );
    ensure!(t.prompt_tokens == 30 && t.completion_tokens == 15);
    // TTFT 40 → bucket 0 (≤50), 150 → bucket 2 (≤200), 20 s → the open bucket
    ensure!(
        t.ttft_hist[0] == 1 && t.ttft_hist[2] == 1 && t.ttft_hist[12] == 1,
        "{:?}",
        t.ttft_hist
    );
    ensure!(
        t.tpot_hist[2] == 3,
        "TPOT 12 ms is bucket 2: {:?}",
        t.tpot_hist
    );
    ensure!(
        e1.error_kinds.get("upstream_5xx") == Some(&1),
        "{:?}",
        e1.error_kinds
    );
    ensure!(e1.finish_reasons.get("stop") == Some(&2));
    ensure!(
        e1.finish_reasons.get("<script>x</script>") == Some(&1),
        "labels are stored as given"
    );
    let e2 = &all[1].totals;
    ensure!(e2.requests == 3, "{e2:?}");
    ensure!(e2.tool_requests == 1 && e2.tool_errored == 1 && e2.tool_calls == 2);
    ensure!(e2.tool_invalid_json == 1 && e2.degenerate == 1);
    ensure!(all[1].error_kinds.is_empty());

    // filters: endpoint, model, range
    let only = s
        .endpoint_rollups(&RollupQuery {
            endpoint: Some("p/e2".to_owned()),
            ..q.clone()
        })
        .await?;
    ensure!(only.len() == 1 && only[0].endpoint == "p/e2");
    let none = s
        .endpoint_rollups(&RollupQuery {
            model: Some("other".to_owned()),
            ..q.clone()
        })
        .await?;
    ensure!(none.is_empty());
    let first_minute = s
        .endpoint_rollups(&RollupQuery {
            model: Some("m".to_owned()),
            until_ms: T0 + MINUTE_MS,
            ..q.clone()
        })
        .await?;
    ensure!(first_minute[0].totals.requests == 2, "{first_minute:?}");
    ensure!(first_minute[0].error_kinds.get("upstream_5xx") == Some(&1));
    Ok(())
}

async fn strings_that_store_alike_roll_up_as_one(db: TestDb) -> Result<()> {
    // An endpoint with a NUL stores as the same name with U+FFFD, and labels are cut at 64
    // characters: records that differ only so make one rollup row and one label count (one
    // upsert touching a row twice would fail on PostgreSQL).
    let long = "r".repeat(64);
    let mut a = attempt("a", "p/e\0x", T0 + 1_000, 40.0, None);
    a.finish_reason = Some(format!("{long}1"));
    let mut b = attempt("b", "p/e\u{FFFD}x", T0 + 2_000, 40.0, None);
    b.finish_reason = Some(format!("{long}2"));
    db.store.insert_request_records(&[a, b]).await?;
    let all = first_minute(&db).await?;
    ensure!(all.len() == 1, "{all:?}");
    ensure!(all[0].endpoint == "p/e\u{FFFD}x" && all[0].totals.requests == 2);
    ensure!(
        all[0].finish_reasons.get(&long) == Some(&2),
        "{:?}",
        all[0].finish_reasons
    );
    Ok(())
}

async fn long_ranges_read_hours_and_minute_edges(db: TestDb) -> Result<()> {
    let s = &db.store;
    // one attempt at 0:30, 1:30, 2:30 and 5:10 after T0
    let rows: Vec<RequestRecord> = [30, 90, 150, 310]
        .iter()
        .map(|m| {
            attempt(
                &format!("h{m}"),
                "p/e",
                T0 + m * MINUTE_MS,
                80.0,
                (*m == 90).then_some("timeout"),
            )
        })
        .collect();
    s.insert_request_records(&rows).await?;
    for (since_min, until_min, want) in [
        (20, 160, 3),   // minutes 20..60, hour 1, minutes 120..160
        (40, 160, 2),   // starts after the first
        (0, 60 * 6, 4), // whole hours only
        (60, 120, 1),   // exactly one hour
        (91, 149, 0),   // inside one hour: minutes only
        (0, 311, 4),    // hours 0..5, minutes 300..311
    ] {
        let got = s
            .endpoint_rollups(&RollupQuery {
                since_ms: T0 + since_min * MINUTE_MS,
                until_ms: T0 + until_min * MINUTE_MS,
                ..RollupQuery::default()
            })
            .await?;
        let n = got.first().map_or(0, |e| e.totals.requests);
        ensure!(
            n == want,
            "[{since_min}, {until_min}) min: {n} attempts, want {want}"
        );
        let timeouts = got
            .first()
            .and_then(|e| e.error_kinds.get("timeout"))
            .copied()
            .unwrap_or(0);
        let want_timeouts = i64::from(since_min <= 90 && 90 < until_min);
        ensure!(
            timeouts == want_timeouts,
            "[{since_min}, {until_min}): {timeouts} timeouts"
        );
        if let Some(e) = got.first() {
            ensure!(e.finish_reasons.values().sum::<i64>() == want, "{e:?}");
        }
    }
    Ok(())
}

/// Attempts at pseudo-random minutes over three days and a bit (a seeded LCG); every range,
/// aligned or not to hours and days, sums to the attempts whose minute starts inside it — the
/// days, hours and minutes that cover it agree with a count over the raw attempts.
async fn day_hour_and_minute_covers_sum_like_the_minutes(db: TestDb) -> Result<()> {
    let s = &db.store;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: i64| {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        ((x >> 33) % n as u64) as i64
    };
    let span = 3 * DAY_MS + 5 * HOUR_MS;
    let rows: Vec<RequestRecord> = (0..400)
        .map(|i| {
            let ts = T0 + next(span / MINUTE_MS) * MINUTE_MS + next(MINUTE_MS);
            let error = (i % 7 == 0).then_some("timeout");
            attempt(&format!("d{i}"), "p/e", ts, 80.0, error)
        })
        .collect();
    s.insert_request_records(&rows).await?;
    let mut ranges = vec![
        (T0, T0 + span),                                        // everything
        (T0, T0 + DAY_MS),                                      // exactly one day
        (T0 + 90 * MINUTE_MS, T0 + 2 * DAY_MS + 7 * MINUTE_MS), // days, hours, minutes each side
        (T0 + DAY_MS - MINUTE_MS, T0 + DAY_MS + MINUTE_MS),     // two minutes across midnight
    ];
    for _ in 0..20 {
        let a = T0 + next(span / MINUTE_MS) * MINUTE_MS;
        let b = T0 + next(span / MINUTE_MS) * MINUTE_MS;
        ranges.push((a.min(b), a.max(b) + MINUTE_MS));
    }
    for (since, until) in ranges {
        let inside: Vec<&RequestRecord> = rows
            .iter()
            .filter(|r| (since..until).contains(&minute_of(r.ts_ms)))
            .collect();
        let got = s
            .endpoint_rollups(&RollupQuery {
                since_ms: since,
                until_ms: until,
                ..RollupQuery::default()
            })
            .await?;
        let n = got.first().map_or(0, |e| e.totals.requests);
        let timeouts = got
            .first()
            .and_then(|e| e.error_kinds.get("timeout"))
            .copied()
            .unwrap_or(0);
        let want_timeouts = inside.iter().filter(|r| r.error_kind.is_some()).count() as i64;
        ensure!(
            n == inside.len() as i64 && timeouts == want_timeouts,
            "[{}, {}) min from T0: {n} attempts ({timeouts} timeouts), want {} ({want_timeouts})",
            (since - T0) / MINUTE_MS,
            (until - T0) / MINUTE_MS,
            inside.len()
        );
    }
    Ok(())
}

/// Steps of whole hours and days read the hour and day rollups; the first step starts at the
/// range's start rounded down to the grain, and the steps count what the minutes count.
async fn series_steps_of_hours_and_days(db: TestDb) -> Result<()> {
    let s = &db.store;
    // one attempt at 0:10, 1:10, ..., 49:10 after T0
    let rows: Vec<RequestRecord> = (0..50)
        .map(|h| {
            let ts = T0 + h * HOUR_MS + 10 * MINUTE_MS;
            attempt(&format!("s{h}"), "p/e", ts, 80.0, None)
        })
        .collect();
    s.insert_request_records(&rows).await?;
    let until = T0 + 50 * HOUR_MS;
    let by_hours = s
        .endpoint_rollup_series("p/e", T0 + 30 * MINUTE_MS, until, 6 * HOUR_MS)
        .await?;
    let starts: Vec<i64> = by_hours
        .iter()
        .map(|p| (p.start_ms - T0) / HOUR_MS)
        .collect();
    let counts: Vec<i64> = by_hours.iter().map(|p| p.totals.requests).collect();
    ensure!(
        starts == [0, 6, 12, 18, 24, 30, 36, 42, 48] && counts == [6, 6, 6, 6, 6, 6, 6, 6, 2],
        "{starts:?} {counts:?}"
    );
    let by_days = s
        .endpoint_rollup_series("p/e", T0 + HOUR_MS, until, DAY_MS)
        .await?;
    let days: Vec<(i64, i64)> = by_days
        .iter()
        .map(|p| ((p.start_ms - T0) / DAY_MS, p.totals.requests))
        .collect();
    ensure!(days == [(0, 24), (1, 24), (2, 2)], "{days:?}");
    Ok(())
}

async fn rollup_series_steps(db: TestDb) -> Result<()> {
    let s = &db.store;
    let rows: Vec<RequestRecord> = (0..10)
        .map(|i| {
            attempt(
                &format!("r{i}"),
                "p/e",
                T0 + i * MINUTE_MS + 500,
                80.0,
                None,
            )
        })
        .collect();
    s.insert_request_records(&rows).await?;
    let per_minute = s
        .endpoint_rollup_series("p/e", T0, T0 + 10 * MINUTE_MS, MINUTE_MS)
        .await?;
    ensure!(per_minute.len() == 10, "{}", per_minute.len());
    ensure!(per_minute.iter().all(|p| p.totals.requests == 1));
    ensure!(per_minute[3].start_ms == T0 + 3 * MINUTE_MS);
    let five = s
        .endpoint_rollup_series("p/e", T0, T0 + 10 * MINUTE_MS, 5 * MINUTE_MS)
        .await?;
    ensure!(
        five.len() == 2 && five[0].totals.requests == 5 && five[1].start_ms == T0 + 5 * MINUTE_MS,
        "{five:?}"
    );
    // a range that starts mid-series
    let tail = s
        .endpoint_rollup_series(
            "p/e",
            T0 + 8 * MINUTE_MS,
            T0 + 60 * MINUTE_MS,
            30 * MINUTE_MS,
        )
        .await?;
    ensure!(tail.len() == 1 && tail[0].totals.requests == 2, "{tail:?}");
    ensure!(
        s.endpoint_rollup_series("p/none", T0, T0 + MINUTE_MS, MINUTE_MS)
            .await?
            .is_empty()
    );
    Ok(())
}

/// An endpoint's `errors` count the attempts that failed by its doing; a client that left,
/// a lost hedge and a 4xx refusing the request itself are counted by kind only.
async fn errors_are_the_endpoints_failures(db: TestDb) -> Result<()> {
    let failed = |id: &str, kind: &str, status: Option<u16>| RequestRecord {
        status,
        ..attempt(id, "p/e1", T0 + 1_000, 40.0, Some(kind))
    };
    let batch = vec![
        attempt("ok", "p/e1", T0 + 1_000, 40.0, None),
        failed("5xx", "upstream_5xx", Some(502)),
        failed("timeout", "timeout", None),
        failed("429", "rate_limited", Some(429)),
        failed("key", "upstream_4xx", Some(401)),
        failed("bad-request", "upstream_4xx", Some(400)),
        failed("too-large", "upstream_4xx", Some(413)),
        failed("left", "client_disconnect", Some(200)),
        failed("hedge", "hedge_lost", None),
        failed("unknown", "a_kind_of_the_future", Some(500)),
    ];
    db.store.insert_request_records(&batch).await?;
    let all = first_minute(&db).await?;
    ensure!(all.len() == 1, "{all:?}");
    let t = &all[0].totals;
    // 5xx, timeout, 429, 401 and the unknown kind
    ensure!(t.requests == 10 && t.errors == 5, "{t:?}");
    let kinds = &all[0].error_kinds;
    ensure!(
        kinds.get("upstream_4xx") == Some(&3)
            && kinds.get("client_disconnect") == Some(&1)
            && kinds.get("hedge_lost") == Some(&1),
        "{kinds:?}"
    );
    Ok(())
}

async fn rollups_through_the_writer(db: TestDb) -> Result<()> {
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), RecordWriterConfig::default());
    let now = samewise_store::now_ms();
    for i in 0..50 {
        ensure!(tx.try_send(attempt(&format!("w{i}"), "p/w", now, 60.0, None)));
    }
    writer.shutdown().await;
    let q = RollupQuery {
        since_ms: minute_of(now),
        until_ms: now + 1,
        ..RollupQuery::default()
    };
    let got = db.store.endpoint_rollups(&q).await?;
    ensure!(got.len() == 1 && got[0].totals.requests == 50, "{got:?}");
    Ok(())
}

async fn rollup_retention(db: TestDb) -> Result<()> {
    let s = &db.store;
    let rows = [
        attempt("old", "p/e", T0, 80.0, Some("timeout")),
        attempt("new", "p/e", T0 + DAY_MS + 2 * HOUR_MS, 80.0, None),
    ];
    s.insert_request_records(&rows).await?;
    // whole days only: a cut inside the second day keeps all of it
    ensure!(s.delete_rollups_before(T0 + DAY_MS + 3 * HOUR_MS).await? == 1);
    let got = s
        .endpoint_rollups(&RollupQuery {
            since_ms: 0,
            until_ms: i64::MAX,
            ..RollupQuery::default()
        })
        .await?;
    ensure!(
        got.len() == 1 && got[0].totals.requests == 1 && got[0].error_kinds.is_empty(),
        "{got:?}"
    );
    // raw-record retention leaves the rollups alone
    s.delete_request_records_before(T0 + 10 * MINUTE_MS).await?;
    let again = s
        .endpoint_rollups(&RollupQuery {
            since_ms: 0,
            until_ms: i64::MAX,
            ..RollupQuery::default()
        })
        .await?;
    ensure!(again == got);
    Ok(())
}

async fn admin_keys(db: TestDb) -> Result<()> {
    let s = &db.store;
    let (admin, admin_text) = s
        .create_api_key_with(
            "ops",
            KeyOptions {
                rpm_limit: None,
                admin: true,
            },
        )
        .await?;
    let (plain, plain_text) = s.create_api_key("app", Some(5)).await?;
    ensure!(admin.admin && !plain.admin);
    let found = s.find_api_key(&admin_text).await?;
    ensure!(found.as_ref().is_some_and(|k| k.admin), "{found:?}");
    let found = s.find_api_key(&plain_text).await?;
    ensure!(
        found
            .as_ref()
            .is_some_and(|k| !k.admin && k.rpm_limit == Some(5))
    );
    let listed = s.list_api_keys().await?;
    ensure!(listed.iter().filter(|k| k.admin).count() == 1);
    Ok(())
}

async fn probe_stats_and_tables(db: TestDb) -> Result<()> {
    let s = &db.store;
    for i in 0..3 {
        s.insert_probe_run(&ProbeRun {
            model: "m".to_owned(),
            endpoint: "p/e".to_owned(),
            kind: "prompt_logprobs".to_owned(),
            started_ms: T0 + i,
            finished_ms: T0 + i + 1,
            ok: true,
            stats: serde_json::json!({ "kl_mean": i as f64 / 10.0 }),
            raw: Some(vec![1, 2, 3]),
            ..ProbeRun::default()
        })
        .await?;
    }
    let got = s
        .probe_run_stats(&ProbeRunQuery {
            endpoint: Some("p/e".to_owned()),
            limit: 10,
            ..ProbeRunQuery::default()
        })
        .await?;
    ensure!(got.len() == 3 && got.iter().all(|r| r.raw.is_none()));
    ensure!(
        got[0].stats["kl_mean"] == serde_json::json!(0.2),
        "newest first: {:?}",
        got[0].stats
    );
    // the newest run per (endpoint, kind, outcome) since a time, of one model
    let more = [
        ("m", "p/e", "prompt_logprobs", false, 10),
        ("m", "p/e", "long_context", true, 5),
        ("m", "p/e", "long_context", true, 7),
        ("m", "q/e", "long_context", true, -50),
        ("other", "o/e", "prompt_logprobs", true, 20),
    ];
    for (model, endpoint, kind, ok, dt) in more {
        s.insert_probe_run(&ProbeRun {
            model: model.to_owned(),
            endpoint: endpoint.to_owned(),
            kind: kind.to_owned(),
            started_ms: T0 + dt,
            finished_ms: T0 + dt + 1,
            ok,
            raw: Some(vec![9]),
            ..ProbeRun::default()
        })
        .await?;
    }
    let latest = s.latest_probe_runs(Some("m"), T0).await?;
    let seen: Vec<(&str, &str, bool, i64)> = latest
        .iter()
        .map(|r| {
            (
                r.endpoint.as_str(),
                r.kind.as_str(),
                r.ok,
                r.started_ms - T0,
            )
        })
        .collect();
    ensure!(
        seen == [
            ("p/e", "prompt_logprobs", false, 10),
            ("p/e", "long_context", true, 7),
            ("p/e", "prompt_logprobs", true, 2),
        ] && latest.iter().all(|r| r.raw.is_none()),
        "{seen:?}"
    );
    ensure!(s.latest_probe_runs(None, T0).await?.len() == 4);
    // a run stored late but started earlier is counted, not taken for the newest
    s.insert_probe_run(&ProbeRun {
        model: "m".to_owned(),
        endpoint: "p/e".to_owned(),
        kind: "long_context".to_owned(),
        started_ms: T0 + 6,
        finished_ms: T0 + 9,
        ok: true,
        ..ProbeRun::default()
    })
    .await?;
    let newest = s.latest_probe_runs(Some("m"), T0 + 3).await?;
    ensure!(
        newest
            .iter()
            .any(|r| r.kind == "long_context" && r.started_ms == T0 + 7),
        "{newest:?}"
    );
    ensure!(s.latest_probe_runs(None, T0 + 100).await?.is_empty());
    let counts = s.probe_run_counts().await?;
    ensure!(
        counts.len() == 5
            && counts
                .iter()
                .any(|c| c.endpoint == "p/e" && c.runs == 3 && c.ok && c.kind == "prompt_logprobs")
            && counts
                .iter()
                .any(|c| c.endpoint == "p/e" && c.runs == 3 && c.ok && c.kind == "long_context"),
        "{counts:?}"
    );
    Ok(())
}

#[test]
fn histogram_quantiles() {
    let bounds = [10.0, 20.0, 40.0];
    assert_eq!(hist_quantile(&[0, 0, 0, 0], &bounds, 0.5), None);
    // 10 samples in (10, 20]: the median interpolates to the middle of the bucket
    assert_eq!(hist_quantile(&[0, 10, 0, 0], &bounds, 0.5), Some(15.0));
    // everything in the open bucket answers its lower bound
    assert_eq!(hist_quantile(&[0, 0, 0, 4], &bounds, 0.95), Some(40.0));
    assert_eq!(minute_of(T0 + 59_999), T0);
    assert_eq!(minute_of(-1), -MINUTE_MS);
}
