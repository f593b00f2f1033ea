//! Captured bodies and regression cases: the byte bound evicts the oldest first and the age
//! bound expires rows, both in the insert's own SQL; reads skip expired rows; purge deletes by
//! model and time; bodies ride the record queue with their own byte bound (drops counted);
//! regression cases are one per (model, suite, source request), listed and deleted by
//! model, suite or id.

use super::*;
use samewise_store::{BodyQuery, CapturedBody, CaseQuery, NewCapturedBody, RegressionCase};
use serde_json::json;

both!(
    bodies_are_bounded_in_bytes_and_age,
    bodies_purge_by_model_and_time,
    bodies_ride_the_record_queue,
    regression_cases_once_per_request,
    regression_cases_listed_and_deleted_by_filter
);

fn body(id: &str, model: &str, ts_ms: i64, expires_ms: i64, pad: usize) -> CapturedBody {
    CapturedBody {
        request_id: id.to_owned(),
        ts_ms,
        expires_ms,
        model: model.to_owned(),
        endpoint: Some(format!("p/{model}")),
        route: "chat".to_owned(),
        flags: vec!["tool_error".to_owned(), "sampled".to_owned()],
        request: json!({"messages": [{"role": "user", "content": "x".repeat(pad)}]}),
        response: json!({"answer": {"text": "ok\u{0}"}}),
        bytes: 0,
    }
}

fn new(b: CapturedBody, max: i64) -> NewCapturedBody {
    NewCapturedBody {
        body: b,
        model_max_bytes: max,
    }
}

fn ids(rows: &[CapturedBody]) -> Vec<&str> {
    rows.iter().map(|b| b.request_id.as_str()).collect()
}

fn of(model: &str) -> BodyQuery {
    BodyQuery {
        model: Some(model.to_owned()),
        ..BodyQuery::default()
    }
}

async fn bodies_are_bounded_in_bytes_and_age(db: TestDb) -> Result<()> {
    let s = &db.store;
    let now = 1_000_000;
    let far = now + 3_600_000;
    // each row is ~1,100 bytes: a bound of 3,500 keeps the newest three
    let rows: Vec<NewCapturedBody> = (0..5)
        .map(|i| new(body(&format!("r{i}"), "m", now + i, far, 1000), 3500))
        .collect();
    let w = s.insert_captured_bodies(&rows, now).await?;
    ensure!(w.inserted == 5 && w.evicted == 2, "{w:?}");
    let kept = s.captured_bodies(&of("m"), now).await?;
    ensure!(ids(&kept) == ["r4", "r3", "r2"], "{:?}", ids(&kept));
    let b = &kept[0];
    ensure!(
        b.flags == ["tool_error", "sampled"]
            && b.bytes > 1000
            && b.endpoint.as_deref() == Some("p/m"),
        "{b:?}"
    );
    // a NUL in a body survives both backends (JSON text escapes it)
    ensure!(b.response["answer"]["text"] == "ok\u{0}", "{}", b.response);
    // another model's bound is its own; the same request id twice is stored once
    let other = [
        new(body("o1", "n", now, far, 10), 1 << 20),
        new(body("r4", "m", now + 9, far, 10), 3500),
    ];
    let w = s.insert_captured_bodies(&other, now).await?;
    ensure!(w.inserted == 1 && w.evicted == 0, "{w:?}");
    // a body bigger than its model's bound is not stored at all
    let w = s
        .insert_captured_bodies(&[new(body("huge", "m", now + 10, far, 5000), 3500)], now)
        .await?;
    ensure!(w.inserted == 0, "{w:?}");
    // age: a row past its expiry is never read, and the next insert deletes it
    let short = new(body("short", "n", now + 1, now + 100, 10), 1 << 20);
    s.insert_captured_bodies(&[short], now).await?;
    ensure!(s.captured_body("short", now + 50).await?.is_some());
    ensure!(s.captured_body("short", now + 100).await?.is_none());
    ensure!(ids(&s.captured_bodies(&of("n"), now + 200).await?) == ["o1"]);
    let w = s
        .insert_captured_bodies(
            &[new(body("o2", "n", now + 2, far, 10), 1 << 20)],
            now + 200,
        )
        .await?;
    ensure!(w.expired == 1, "{w:?}");
    // the window filters of a capture by alert
    let q = BodyQuery {
        endpoint: Some("p/m".to_owned()),
        since_ms: Some(now + 3),
        until_ms: Some(now + 5),
        ..BodyQuery::default()
    };
    ensure!(ids(&s.captured_bodies(&q, now).await?) == ["r4", "r3"]);
    Ok(())
}

async fn bodies_purge_by_model_and_time(db: TestDb) -> Result<()> {
    let s = &db.store;
    let far = i64::MAX / 2;
    let rows: Vec<NewCapturedBody> = ["a", "b"]
        .iter()
        .flat_map(|m| {
            (0..3).map(move |i| new(body(&format!("{m}{i}"), m, i * 1000, far, 5), 1 << 20))
        })
        .collect();
    s.insert_captured_bodies(&rows, 0).await?;
    ensure!(s.purge_captured_bodies(Some("a"), Some(2000)).await? == 2);
    ensure!(ids(&s.captured_bodies(&of("a"), 0).await?) == ["a2"]);
    ensure!(s.purge_captured_bodies(None, Some(1000)).await? == 1);
    ensure!(s.purge_captured_bodies(Some("b"), None).await? == 2);
    ensure!(s.purge_captured_bodies(None, None).await? == 1);
    ensure!(
        s.captured_bodies(&BodyQuery::default(), 0)
            .await?
            .is_empty()
    );
    Ok(())
}

async fn bodies_ride_the_record_queue(db: TestDb) -> Result<()> {
    let cfg = RecordWriterConfig {
        flush_interval: Duration::from_millis(20),
        max_queued_body_bytes: 2000,
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    let far = samewise_store::now_ms() + 3_600_000;
    let with = |id: &str, bytes: i64| {
        let mut b = body(id, "m", 1, far, 10);
        b.bytes = bytes;
        new(b, 1 << 20)
    };
    // the runtime is single-threaded: nothing drains between these sends
    ensure!(tx.try_send_with_body(full_record("q1", 1, 1), with("q1", 1500)));
    // over the queue's byte bound: the body is dropped, the record still goes
    ensure!(tx.try_send_with_body(full_record("q2", 1, 2), with("q2", 1000)));
    ensure!(tx.bodies_dropped() == 1 && tx.queued() == 2);
    writer.shutdown().await;
    ensure!(tx.written() == 2 && tx.bodies_written() == 1);
    let now = samewise_store::now_ms();
    ensure!(db.store.captured_body("q1", now).await?.is_some());
    ensure!(db.store.captured_body("q2", now).await?.is_none());
    ensure!(db.store.request_records(&by_id("q2")).await?.len() == 1);
    Ok(())
}

async fn regression_cases_once_per_request(db: TestDb) -> Result<()> {
    let s = &db.store;
    let case = |src: &str, suite: &str| RegressionCase {
        id: 0,
        model: "m".to_owned(),
        suite: suite.to_owned(),
        source_request_id: src.to_owned(),
        endpoint: Some("p/m".to_owned()),
        alert_id: Some(7),
        item: json!({"id": format!("case-{src}"), "request": {"messages": []}, "check": {"kind": "exact", "value": "x"}}),
        created_ms: 5,
    };
    let a = s.insert_regression_case(&case("r1", "regression")).await?;
    ensure!(a.is_some());
    ensure!(
        s.insert_regression_case(&case("r1", "regression"))
            .await?
            .is_none()
    );
    ensure!(
        s.insert_regression_case(&case("r1", "regression-tools"))
            .await?
            .is_some()
    );
    ensure!(
        s.insert_regression_case(&case("r2", "regression"))
            .await?
            .is_some()
    );
    let got = s.regression_cases("m", "regression").await?;
    ensure!(got.len() == 2 && got[0].id == a.unwrap_or(-1), "{got:?}");
    ensure!(got[0].item["id"] == "case-r1" && got[0].alert_id == Some(7));
    ensure!(s.regression_cases("other", "regression").await?.is_empty());
    ensure!(
        s.insert_regression_case(&case("", "regression"))
            .await
            .is_err()
    );
    Ok(())
}

async fn regression_cases_listed_and_deleted_by_filter(db: TestDb) -> Result<()> {
    let s = &db.store;
    let mut ids = Vec::new();
    for (model, suite, src) in [
        ("m", "regression", "r1"),
        ("m", "regression-tools", "r2"),
        ("n", "regression", "r3"),
        ("n", "regression", "r4"),
    ] {
        let case = RegressionCase {
            id: 0,
            model: model.to_owned(),
            suite: suite.to_owned(),
            source_request_id: src.to_owned(),
            endpoint: None,
            alert_id: None,
            item: json!({"id": src, "request": {"messages": []}, "check": {"kind": "exact", "value": "x"}}),
            created_ms: 1,
        };
        ids.push(anyhow::Context::context(
            s.insert_regression_case(&case).await?,
            "inserted",
        )?);
    }
    let q = |model: Option<&str>, suite: Option<&str>, id: Option<i64>| CaseQuery {
        model: model.map(str::to_owned),
        suite: suite.map(str::to_owned),
        id,
    };
    let srcs = |cases: Vec<RegressionCase>| -> Vec<String> {
        cases.into_iter().map(|c| c.source_request_id).collect()
    };
    ensure!(
        srcs(s.regression_cases_matching(&q(None, None, None)).await?) == ["r1", "r2", "r3", "r4"]
    );
    ensure!(
        srcs(
            s.regression_cases_matching(&q(Some("m"), None, None))
                .await?
        ) == ["r1", "r2"]
    );
    ensure!(
        srcs(
            s.regression_cases_matching(&q(None, Some("regression"), None))
                .await?
        ) == ["r1", "r3", "r4"]
    );
    ensure!(
        srcs(
            s.regression_cases_matching(&q(Some("n"), Some("regression"), Some(ids[3])))
                .await?
        ) == ["r4"]
    );
    ensure!(
        s.regression_cases_matching(&q(Some("m"), None, Some(ids[3])))
            .await?
            .is_empty()
    );
    // a quote in a filter is a value, not SQL
    ensure!(
        s.delete_regression_cases(&q(Some("m' OR '1'='1"), None, None))
            .await?
            == 0
    );
    ensure!(
        s.delete_regression_cases(&q(None, None, Some(ids[0])))
            .await?
            == 1
    );
    ensure!(
        s.delete_regression_cases(&q(None, None, Some(ids[0])))
            .await?
            == 0
    );
    ensure!(
        s.delete_regression_cases(&q(Some("n"), Some("regression"), None))
            .await?
            == 2
    );
    ensure!(srcs(s.regression_cases_matching(&q(None, None, None)).await?) == ["r2"]);
    ensure!(s.delete_regression_cases(&CaseQuery::default()).await? == 1);
    ensure!(
        s.regression_cases_matching(&CaseQuery::default())
            .await?
            .is_empty()
    );
    Ok(())
}
