//! Probe runs: round trip of every field, filters and newest-first order, the hourly token
//! sum, and the scheduler lock (one holder per PostgreSQL database).

use super::*;
use anyhow::Context;
use samewise_store::{ProbeRun, ProbeRunQuery};

both!(
    probe_run_round_trip,
    probe_run_filters_and_tokens,
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
