//! The batch writer: records arrive, a full queue counts drops (full in records or in bytes),
//! shutdown flushes, failed writes are counted, a refused row is isolated.

use super::*;

both!(
    writer_delivers_records,
    writer_counts_drops_when_full,
    writer_bounds_the_queue_in_bytes,
    writer_shutdown_flushes,
    writer_writes_full_batches_before_the_deadline,
    writer_empties_a_small_queue_before_it_fills,
    writer_counts_write_errors,
    writer_isolates_a_refused_row,
);

async fn writer_delivers_records(db: TestDb) -> Result<()> {
    let cfg = RecordWriterConfig {
        max_batch: 7,
        flush_interval: Duration::from_millis(20),
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    for i in 0..50 {
        ensure!(tx.try_send(full_record(&format!("w{i}"), 1, i)));
        if i % 10 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let store = db.store.clone();
    eventually(Duration::from_secs(20), "50 records written", || {
        let store = store.clone();
        let tx = tx.clone();
        async move { Ok(tx.written() == 50 && store.request_records(&all(100)).await?.len() == 50) }
    })
    .await?;
    // a lone record is written by the flush interval, without filling a batch
    ensure!(tx.try_send(full_record("lone", 1, 1000)));
    eventually(Duration::from_secs(20), "the lone record written", || {
        let store = store.clone();
        async move { Ok(store.request_records(&by_id("lone")).await?.len() == 1) }
    })
    .await?;
    ensure!(tx.dropped() == 0 && tx.write_errors() == 0 && tx.queued() == 0);
    writer.shutdown().await;
    ensure!(tx.written() == 51);
    Ok(())
}

async fn writer_counts_drops_when_full(db: TestDb) -> Result<()> {
    let cfg = RecordWriterConfig {
        capacity: 10,
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    // The test runtime is single-threaded and try_send never yields, so the writer cannot
    // drain between these sends: exactly 10 fit.
    let accepted = (0..15)
        .filter(|i| tx.try_send(full_record(&format!("d{i}"), 1, *i)))
        .count();
    ensure!(accepted == 10, "accepted {accepted}");
    ensure!(tx.dropped() == 5 && tx.queued() == 10);
    writer.shutdown().await;
    ensure!(tx.written() == 10 && tx.write_errors() == 0);
    ensure!(db.store.request_records(&all(100)).await?.len() == 10);
    // after shutdown nothing is accepted, and the refusal is counted
    ensure!(!tx.try_send(full_record("late", 1, 0)));
    ensure!(tx.dropped() == 6);
    Ok(())
}

async fn writer_bounds_the_queue_in_bytes(db: TestDb) -> Result<()> {
    let one = full_record("b0", 1, 0).approx_bytes();
    let cfg = RecordWriterConfig {
        capacity: 100,
        max_queued_record_bytes: 3 * one + one / 2,
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    // single-threaded and never yielding, as above: room for 3 records of this size, in bytes
    let accepted = (0..10)
        .filter(|i| tx.try_send(full_record(&format!("b{i}"), 1, *i)))
        .count();
    ensure!(accepted == 3, "accepted {accepted}");
    ensure!(tx.dropped() == 7 && tx.queued() == 3 && tx.queued_bytes() == 3 * one);
    // a record as large as the whole bound is refused, however empty the queue in records
    let mut big = full_record("big", 1, 0);
    big.model = "m".repeat(4 * one);
    ensure!(!tx.try_send(big) && tx.dropped() == 8);
    writer.shutdown().await;
    ensure!(tx.written() == 3 && tx.write_errors() == 0 && tx.queued_bytes() == 0);
    ensure!(db.store.request_records(&all(100)).await?.len() == 3);
    Ok(())
}

async fn writer_shutdown_flushes(db: TestDb) -> Result<()> {
    // a flush interval far longer than the test: only shutdown can write these
    let cfg = RecordWriterConfig {
        max_batch: 1000,
        flush_interval: Duration::from_secs(3600),
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    for i in 0..300 {
        ensure!(tx.try_send(full_record(&format!("s{i}"), 1, i)));
    }
    tokio::task::yield_now().await; // let the writer take the first records into a batch
    ensure!(db.store.request_records(&all(1000)).await?.is_empty());
    writer.shutdown().await;
    ensure!(tx.written() == 300 && tx.queued() == 0);
    ensure!(db.store.request_records(&all(1000)).await?.len() == 300);
    Ok(())
}

async fn writer_writes_full_batches_before_the_deadline(db: TestDb) -> Result<()> {
    // a flush interval far longer than the test: only full batches are written before shutdown
    let cfg = RecordWriterConfig {
        max_batch: 10,
        flush_interval: Duration::from_secs(3600),
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    for i in 0..25 {
        ensure!(tx.try_send(full_record(&format!("f{i:02}"), 1, i)));
        tokio::task::yield_now().await;
    }
    let store = db.store.clone();
    eventually(Duration::from_secs(20), "two full batches written", || {
        let tx = tx.clone();
        async move { Ok(tx.written() == 20) }
    })
    .await?;
    // the rest is not a batch: it waits for its deadline (an hour), so it is still unwritten
    tokio::time::sleep(Duration::from_millis(200)).await;
    ensure!(tx.written() == 20, "written {}", tx.written());
    ensure!(store.request_records(&all(100)).await?.len() == 20);
    writer.shutdown().await;
    ensure!(tx.written() == 25 && tx.queued() == 0 && tx.dropped() == 0);
    Ok(())
}

async fn writer_empties_a_small_queue_before_it_fills(db: TestDb) -> Result<()> {
    // A queue smaller than a batch, in records and then in bytes, and a flush interval far
    // longer than the test: the writer is woken when the queue is half full and writes what it
    // holds, so steady senders lose nothing.
    let one = full_record("q0", 1, 0).approx_bytes();
    let small = [
        RecordWriterConfig {
            capacity: 8,
            flush_interval: Duration::from_secs(3600),
            ..RecordWriterConfig::default()
        },
        RecordWriterConfig {
            max_queued_record_bytes: 8 * one,
            flush_interval: Duration::from_secs(3600),
            ..RecordWriterConfig::default()
        },
    ];
    for (n, cfg) in small.into_iter().enumerate() {
        let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
        for i in 0..40 {
            let id = format!("q{n}-{i:02}");
            // a sender that waits for room, as steady traffic gives the writer time
            eventually(Duration::from_secs(20), "room in the queue", || {
                let ok = tx.queued() < 7 && tx.queued_bytes() < 7 * one;
                async move { Ok(ok) }
            })
            .await?;
            ensure!(tx.try_send(full_record(&id, 1, i)), "{id} dropped");
            tokio::task::yield_now().await;
        }
        eventually(Duration::from_secs(20), "most records written", || {
            let w = tx.written();
            async move { Ok(w >= 36) }
        })
        .await?;
        ensure!(tx.dropped() == 0);
        writer.shutdown().await;
        ensure!(tx.written() == 40 && tx.dropped() == 0);
    }
    Ok(())
}

async fn writer_counts_write_errors(db: TestDb) -> Result<()> {
    let cfg = RecordWriterConfig {
        max_batch: 4,
        max_retries: 2,
        retry_backoff: Duration::from_millis(1),
        ..RecordWriterConfig::default()
    };
    // a closed store refuses every write
    let closed = Store::connect(Some(db.url()), db.data_dir()).await?;
    closed.close().await;
    let (tx, writer) = RecordWriter::spawn(closed, cfg);
    for i in 0..10 {
        ensure!(tx.try_send(full_record(&format!("e{i}"), 1, i)));
    }
    writer.shutdown().await;
    ensure!(
        tx.write_errors() == 10,
        "write_errors = {}",
        tx.write_errors()
    );
    ensure!(tx.written() == 0 && tx.dropped() == 0);
    ensure!(db.store.request_records(&all(100)).await?.is_empty());
    Ok(())
}

async fn writer_isolates_a_refused_row(db: TestDb) -> Result<()> {
    // SQLite stores a bound NaN as NULL, which latency_ms (NOT NULL) refuses: that row,
    // and only that row, is lost (and counted). PostgreSQL stores NaN as it is.
    let cfg = RecordWriterConfig {
        max_batch: 100,
        retry_backoff: Duration::from_millis(1),
        ..RecordWriterConfig::default()
    };
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    for i in 0..100 {
        let mut r = full_record(&format!("n{i:03}"), 1, i);
        if i == 37 {
            r.latency_ms = f64::NAN;
        }
        ensure!(tx.try_send(r));
    }
    writer.shutdown().await;
    let stored = db.store.request_records(&all(1000)).await?;
    match db.backend() {
        Backend::Sqlite => {
            ensure!(
                tx.written() == 99 && tx.write_errors() == 1,
                "written {} errors {}",
                tx.written(),
                tx.write_errors()
            );
            ensure!(stored.len() == 99 && stored.iter().all(|r| r.request_id != "n037"));
        }
        Backend::Postgres => {
            ensure!(tx.written() == 100 && tx.write_errors() == 0);
            let nan = db.store.request_records(&by_id("n037")).await?;
            ensure!(nan.len() == 1 && nan[0].latency_ms.is_nan());
        }
    }
    Ok(())
}

#[tokio::test]
async fn writer_waits_out_a_full_disk_and_shutdown_does_not_wait_forever() -> Result<()> {
    use samewise_store::testing::sqlite_limit_pages;
    let db = TestDb::sqlite().await?;
    let cfg = RecordWriterConfig {
        max_batch: 10,
        flush_interval: Duration::from_millis(5),
        max_retries: 2,
        retry_backoff: Duration::from_millis(1),
        ..RecordWriterConfig::default()
    };
    // a record of about 2 kB, so that 50 of them need pages the file does not have
    let big = |i: i64| full_record(&format!("{i:05}-{}", "x".repeat(2000)), 1, i);
    sqlite_limit_pages(&db.store, Some(0)).await?;
    let (tx, writer) = RecordWriter::spawn(db.store.clone(), cfg);
    for i in 0..50 {
        ensure!(tx.try_send(big(i)));
    }
    // the disk is full: the writer holds its batch and says it waits; nothing is lost
    eventually(Duration::from_secs(10), "the writer stalled", || {
        let tx = tx.clone();
        async move { Ok(tx.stalled()) }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        tx.write_errors() == 0 && tx.written() == 0 && tx.stalled(),
        "written {} errors {}",
        tx.written(),
        tx.write_errors()
    );
    // room again: every record is written, none twice
    sqlite_limit_pages(&db.store, None).await?;
    eventually(Duration::from_secs(10), "50 records written", || {
        let tx = tx.clone();
        async move { Ok(tx.written() == 50 && !tx.stalled()) }
    })
    .await?;
    ensure!(db.store.request_records(&all(1000)).await?.len() == 50);
    // full again, then a shutdown: the outage is waited out max_retries times, then the batch
    // and what is still queued are counted as lost at once
    sqlite_limit_pages(&db.store, Some(0)).await?;
    for i in 50..80 {
        ensure!(tx.try_send(big(i)));
    }
    let started = tokio::time::Instant::now();
    writer.shutdown().await;
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    ensure!(
        tx.written() == 50 && tx.write_errors() == 30 && tx.dropped() == 0,
        "written {} errors {} dropped {}",
        tx.written(),
        tx.write_errors(),
        tx.dropped()
    );
    ensure!(db.store.integrity_check().await?.is_empty());
    Ok(())
}
