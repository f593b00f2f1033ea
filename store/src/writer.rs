//! The batch writer that keeps the database off the request path. The proxy hands each
//! [`RequestRecord`] to [`RecordSender::try_send`], which never blocks or awaits: the
//! record goes into a bounded queue, or, when the queue is full, is dropped and counted in
//! [`RecordSender::dropped`]. One task drains the queue and writes batches of up to
//! `max_batch` rows, at most `flush_interval` after the first row of a batch arrived. While
//! it fills a batch the task sleeps: it is woken by the deadline, or by the sender that finds
//! the queue holding a batch's worth (`max_batch` rows, or half the queue's bound in records or
//! in bytes when that is less: see [`Worth`]; [`RecordSender::try_send`] checks with three
//! atomic loads), not by each record nor by a polling tick. Such a batch is written at once, so a
//! small queue empties before it fills.
//!
//! A database that is away (PostgreSQL stopped or unreachable, a SQLite disk full: see
//! [`StoreError::is_unavailable`]) loses nothing by itself: the batch in hand is tried again,
//! with doubling backoff up to [`OUTAGE_BACKOFF_CAP`], for as long as the outage lasts, while
//! new records wait in the queue up to its capacity and the rest are dropped (counted); the
//! writes resume when the database returns. [`RecordSender::stalled`] says meanwhile that the
//! writer is waiting (a write in flight for over [`STALL_AFTER`] — a stopped PostgreSQL makes
//! each try wait out the pool's acquire timeout — or a batch being tried again). Any other failure is retried `max_retries` times; if it
//! still fails, its rows are counted in [`RecordSender::write_errors`] and logged at ERROR. A
//! batch the database refuses because of one row's data is written in halves until that row is
//! isolated, so a bad row costs only itself. Nothing is lost without a count.
//!
//! The queue is bounded twice: in records (`capacity`) and in bytes
//! ([`RecordWriterConfig::max_queued_record_bytes`], each record's estimate from
//! [`RequestRecord::approx_bytes`]), so a queue sized for small records cannot hold gigabytes of
//! large ones; a record over either bound is dropped and counted alike.
//!
//! Captured bodies ([`crate::CapturedBody`], opt-in per model) ride the same queue beside
//! their record ([`RecordSender::try_send_with_body`]): the queue's bound in records still
//! holds, and the bodies waiting in it are bounded too, in bytes
//! ([`RecordWriterConfig::max_queued_body_bytes`]); a body over that bound is dropped (its
//! record still goes) and counted in [`RecordSender::bodies_dropped`]. Bodies are written
//! after their batch's records, in their own transaction that also enforces the store's
//! bounds; a failed body write is retried like records, then counted as dropped.
//!
//! [`RecordWriter::shutdown`] closes the queue, writes everything still in it, and waits for
//! the task. At shutdown an outage is waited out only `max_retries` times: if the database is
//! still away then, that batch and everything still queued are counted as write errors at
//! once, so a stopped database cannot hold a gateway's exit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use crate::{NewCapturedBody, RequestRecord, Store, StoreError};

/// How often the writer makes sure the next days' partitions exist (they are created
/// [`crate::partitions::DAYS_AHEAD`] days ahead, so an hour is ample).
const PARTITION_CHECK_EVERY: Duration = Duration::from_secs(3600);

/// Longest pause between two tries of a batch while the database is away: writes resume at
/// most this long (plus one connection attempt) after it returns.
pub const OUTAGE_BACKOFF_CAP: Duration = Duration::from_secs(1);

/// A write still in flight after this long counts as stalled ([`RecordSender::stalled`]); a
/// batch of `max_batch` rows takes milliseconds on a healthy database.
pub const STALL_AFTER: Duration = Duration::from_secs(1);

/// The queue's default bound on record bytes: 32 MiB, about 73,000 records of the usual size
/// (a gateway record with its usual short strings is about 460 bytes).
pub const DEFAULT_MAX_QUEUED_RECORD_BYTES: usize = 32 << 20;

/// Tuning of the writer.
#[derive(Debug, Clone)]
pub struct RecordWriterConfig {
    /// Records the queue holds before `try_send` starts dropping.
    pub capacity: usize,
    /// Most rows written in one transaction.
    pub max_batch: usize,
    /// Longest a record waits in a partial batch before the batch is written.
    pub flush_interval: Duration,
    /// Retries of a failed batch before its rows are counted as write errors.
    pub max_retries: u32,
    /// Wait before the first retry; doubles on each further one.
    pub retry_backoff: Duration,
    /// Bytes of captured bodies the queue holds at most (beyond: the body is dropped, its
    /// record still queued).
    pub max_queued_body_bytes: usize,
    /// Bytes of records (their [`RequestRecord::approx_bytes`]) the queue holds at most
    /// (beyond: the record is dropped and counted, as when the queue is full).
    pub max_queued_record_bytes: usize,
}

impl Default for RecordWriterConfig {
    fn default() -> Self {
        RecordWriterConfig {
            capacity: 10_000,
            // a transaction's own work (its rollup upserts, the pages it rewrites, the
            // statements it prepares) is shared by more rows: `writer_bench` on SQLite under
            // callgrind, 31,000 instructions a row in batches of 500 against 26,600 in batches
            // of 4,096 (README, "Store writer"); at 4,000 requests/s about one batch a second,
            // written in tens of milliseconds
            max_batch: 4096,
            // a second: at 1,000 requests/s a batch a second (or per `max_batch` rows) cost the
            // record path's threads 5.0-6.6 us a request against 8.3-10.0 at five a second
            // (README, "Benchmarks"), and a record still reaches the dashboards within a second
            // or two of its request
            flush_interval: Duration::from_secs(1),
            max_retries: 4,
            retry_backoff: Duration::from_millis(100),
            max_queued_body_bytes: 64 << 20,
            max_queued_record_bytes: DEFAULT_MAX_QUEUED_RECORD_BYTES,
        }
    }
}

/// The request path's end of the queue. Cheap to clone; all clones share the counters.
#[derive(Debug, Clone)]
pub struct RecordSender {
    tx: mpsc::Sender<Queued>,
    /// The bound on queued body bytes.
    max_body_bytes: usize,
    /// The bound on queued record bytes.
    max_record_bytes: usize,
    /// A queue holding this much wakes the writer before its flush deadline.
    worth: Worth,
    /// Wakes the writer filling a batch when the queue holds a batch's worth.
    batch_ready: Arc<Notify>,
    counters: Arc<Counters>,
}

/// The writer task's handle: keep it to drain the queue on shutdown.
#[derive(Debug)]
pub struct RecordWriter {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
}

/// One queue entry: a record and, when its request was captured, the body.
#[derive(Debug)]
struct Queued {
    record: RequestRecord,
    /// The record's [`RequestRecord::approx_bytes`], counted while it is queued.
    bytes: usize,
    body: Option<Box<NewCapturedBody>>,
}

/// Counters shared by the senders and the task.
#[derive(Debug, Default)]
struct Counters {
    /// Records refused because the queue was full (or the writer had shut down).
    dropped: AtomicU64,
    /// Records committed to the database.
    written: AtomicU64,
    /// Records given up on after every retry failed.
    write_errors: AtomicU64,
    /// True while the batch in hand waits for the database: a write in flight for over
    /// [`STALL_AFTER`], or a failed one being tried again.
    stalled: AtomicBool,
    /// Bytes of the captured bodies in the queue now.
    body_bytes_queued: AtomicUsize,
    /// Bytes of the records in the queue or the batch being gathered (their estimates).
    record_bytes_queued: AtomicUsize,
    /// Bodies dropped: over the byte bound, queue full, or their write failed.
    bodies_dropped: AtomicU64,
    /// Bodies handed to the store (inserted, or skipped as already stored).
    bodies_written: AtomicU64,
}

impl RecordSender {
    /// Queues `r` for writing without waiting. Returns false, and counts the record as
    /// dropped, when the queue is full (in records or in bytes) or the writer has shut down.
    pub fn try_send(&self, r: RequestRecord) -> bool {
        self.queue(r, None)
    }

    /// As [`RecordSender::try_send`], with the request's captured body (its `bytes`: the
    /// caller's estimate, which the queue's byte bound counts). A body that would take the
    /// queued bodies over `max_queued_body_bytes` is dropped and counted; the record still goes.
    pub fn try_send_with_body(&self, r: RequestRecord, body: NewCapturedBody) -> bool {
        let c = &self.counters;
        if !reserve(&c.body_bytes_queued, body_bytes(&body), self.max_body_bytes) {
            c.bodies_dropped.fetch_add(1, Ordering::Relaxed);
            return self.try_send(r);
        }
        self.queue(r, Some(Box::new(body)))
    }

    /// Queues a record (and its body, whose bytes are already reserved) within both bounds,
    /// or drops and counts it.
    fn queue(&self, record: RequestRecord, body: Option<Box<NewCapturedBody>>) -> bool {
        let c = &self.counters;
        let bytes = record.approx_bytes();
        let body = if reserve(&c.record_bytes_queued, bytes, self.max_record_bytes) {
            match self.tx.try_send(Queued {
                record,
                bytes,
                body,
            }) {
                Ok(()) => {
                    if self.worth.reached(self.queued(), c) {
                        self.batch_ready.notify_one();
                    }
                    return true;
                }
                Err(e) => {
                    let q = e.into_inner();
                    unreserve(&c.record_bytes_queued, q.bytes);
                    q.body
                }
            }
        } else {
            body
        };
        c.dropped.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = body {
            c.bodies_dropped.fetch_add(1, Ordering::Relaxed);
            unreserve(&c.body_bytes_queued, body_bytes(&b));
        }
        false
    }

    /// Captured bodies dropped so far (over the queue's byte bound, queue full, or their
    /// write failed).
    pub fn bodies_dropped(&self) -> u64 {
        self.counters.bodies_dropped.load(Ordering::Relaxed)
    }

    /// Captured bodies handed to the store so far.
    pub fn bodies_written(&self) -> u64 {
        self.counters.bodies_written.load(Ordering::Relaxed)
    }

    /// Records dropped so far because the queue was full (or closed).
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Records committed to the database so far.
    pub fn written(&self) -> u64 {
        self.counters.written.load(Ordering::Relaxed)
    }

    /// Records lost because their batch failed every retry.
    pub fn write_errors(&self) -> u64 {
        self.counters.write_errors.load(Ordering::Relaxed)
    }

    /// True while the writer's batch waits for the database: a write in flight for over
    /// `STALL_AFTER`, or a failed one being tried again (a database that is away is tried
    /// until it returns; meanwhile new records fill the queue, then are dropped).
    pub fn stalled(&self) -> bool {
        self.counters.stalled.load(Ordering::Relaxed)
    }

    /// Records waiting in the queue now (not counting a batch being written).
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Bytes of the records waiting to be written now (their estimates): those in the queue
    /// and those of the batch being gathered (up to `flush_interval`), not a batch whose
    /// write has begun.
    pub fn queued_bytes(&self) -> usize {
        self.counters.record_bytes_queued.load(Ordering::Relaxed)
    }
}

impl RecordWriter {
    /// Starts the writer task on the current Tokio runtime and returns the sender for the
    /// request path and the handle that drains and stops the task. A `capacity` or
    /// `max_batch` of 0 is treated as 1.
    pub fn spawn(store: Store, cfg: RecordWriterConfig) -> (RecordSender, RecordWriter) {
        let (tx, rx) = mpsc::channel(cfg.capacity.max(1));
        let (stop, stop_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let max_body_bytes = cfg.max_queued_body_bytes;
        let max_record_bytes = cfg.max_queued_record_bytes;
        let worth = Worth::of(&cfg);
        let batch_ready = Arc::new(Notify::new());
        let task = tokio::spawn(run(
            store,
            cfg,
            rx,
            stop_rx,
            Arc::clone(&counters),
            Arc::clone(&batch_ready),
        ));
        let sender = RecordSender {
            tx,
            max_body_bytes,
            max_record_bytes,
            worth,
            batch_ready,
            counters: Arc::clone(&counters),
        };
        (
            sender,
            RecordWriter {
                task,
                stop,
                counters,
            },
        )
    }

    /// Stops accepting records, writes everything already queued, and waits for the task.
    /// Records sent after this call are counted as dropped.
    pub async fn shutdown(self) {
        // The task may already have ended (every sender dropped): then nobody listens.
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the request-record writer task failed");
        }
        tracing::debug!(
            written = self.counters.written.load(Ordering::Relaxed),
            dropped = self.counters.dropped.load(Ordering::Relaxed),
            write_errors = self.counters.write_errors.load(Ordering::Relaxed),
            "request-record writer stopped"
        );
    }
}

/// The writer task: gather a batch, write it, repeat; on stop, close and drain the queue.
async fn run(
    store: Store,
    cfg: RecordWriterConfig,
    mut rx: mpsc::Receiver<Queued>,
    mut stop: watch::Receiver<bool>,
    counters: Arc<Counters>,
    batch_ready: Arc<Notify>,
) {
    let max_batch = cfg.max_batch.max(1);
    let worth = Worth::of(&cfg);
    let mut batch: Vec<Queued> = Vec::with_capacity(max_batch);
    // Set once shutdown was asked for: the queue is closed and only drained from then on.
    let mut stopping = false;
    // False once the RecordWriter was dropped without shutdown: then the task runs until
    // the last sender is gone.
    let mut handle_alive = true;
    // When to next make sure the coming days have their partitions (PostgreSQL).
    let mut next_partition_check = tokio::time::Instant::now() + PARTITION_CHECK_EVERY;
    // Set when, at shutdown, the database stayed away through every retry: what is still
    // queued is counted as lost without trying.
    let mut give_up = false;
    loop {
        if !stopping && *stop.borrow() {
            // (the stop arrived while a batch waited out an outage, which saw it first)
            stopping = true;
            rx.close();
        }
        if stopping {
            if rx.recv_many(&mut batch, max_batch).await == 0 {
                break; // closed and empty
            }
        } else {
            // Wait for the first record of a batch, or the stop signal.
            tokio::select! {
                biased;
                changed = stop.changed(), if handle_alive => {
                    if changed.is_ok() {
                        stopping = true;
                        rx.close();
                    } else {
                        handle_alive = false;
                    }
                    continue;
                }
                n = rx.recv_many(&mut batch, max_batch) => {
                    if n == 0 {
                        break; // every sender is gone and the queue is empty
                    }
                }
            }
            // Fill the batch until it holds a batch's worth or flush_interval has passed: sleep
            // until the deadline or until a sender sees a batch's worth queued, then take what
            // arrived without waiting. A wake-up that finds less (a notice left from before
            // this batch) sleeps again.
            let deadline = tokio::time::Instant::now() + cfg.flush_interval;
            while !stopping {
                if take_ready(&mut rx, &mut batch, max_batch)
                    || worth.reached(batch.len(), &counters)
                    || tokio::time::Instant::now() >= deadline
                {
                    break;
                }
                tokio::select! {
                    biased;
                    changed = stop.changed(), if handle_alive => {
                        if changed.is_ok() {
                            stopping = true;
                            rx.close();
                        } else {
                            handle_alive = false;
                        }
                    }
                    () = batch_ready.notified() => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
        }
        if tokio::time::Instant::now() >= next_partition_check {
            next_partition_check = tokio::time::Instant::now() + PARTITION_CHECK_EVERY;
            if let Err(e) = store
                .ensure_record_partitions(crate::now_ms(), crate::partitions::DAYS_AHEAD)
                .await
            {
                tracing::warn!(error = %e, "could not create request-record day partitions");
            }
        }
        let (records, bodies) = split(&mut batch, &counters);
        if give_up {
            lost(&counters, &records, None, 0);
            lost_bodies(&counters, bodies.len(), None);
        } else {
            let away = write_batch(&store, &cfg, &records, &counters, &mut stop).await;
            give_up = away && *stop.borrow();
            if give_up {
                lost_bodies(&counters, bodies.len(), None);
            } else {
                write_bodies(&store, &cfg, &bodies, &counters).await;
            }
        }
    }
}

/// A batch's worth, written before its deadline: `max_batch` records, or half the queue's bound
/// in records or in bytes when that is less (so that a small queue is emptied before it is full
/// and drops records). The senders and the writer ask the same question.
#[derive(Debug, Clone, Copy)]
struct Worth {
    records: usize,
    bytes: usize,
}

impl Worth {
    fn of(cfg: &RecordWriterConfig) -> Worth {
        Worth {
            records: cfg.max_batch.max(1).min((cfg.capacity / 2).max(1)),
            bytes: cfg.max_queued_record_bytes / 2,
        }
    }

    /// Whether `records` waiting (in the queue, or taken into the batch), or the record bytes
    /// queued now, make a batch's worth.
    fn reached(self, records: usize, counters: &Counters) -> bool {
        records >= self.records
            || counters.record_bytes_queued.load(Ordering::Relaxed) >= self.bytes
    }
}

/// Takes the records already queued, without waiting, until `batch` holds `max_batch`; true
/// when the queue is closed and empty (nothing more will come).
fn take_ready(rx: &mut mpsc::Receiver<Queued>, batch: &mut Vec<Queued>, max_batch: usize) -> bool {
    while batch.len() < max_batch {
        match rx.try_recv() {
            Ok(q) => batch.push(q),
            Err(mpsc::error::TryRecvError::Empty) => return false,
            Err(mpsc::error::TryRecvError::Disconnected) => return true,
        }
    }
    false
}

/// Empties `batch` into its records and its bodies (no longer counted as queued).
fn split(
    batch: &mut Vec<Queued>,
    counters: &Counters,
) -> (Vec<RequestRecord>, Vec<NewCapturedBody>) {
    let mut records = Vec::with_capacity(batch.len());
    let mut bodies = Vec::new();
    for q in batch.drain(..) {
        unreserve(&counters.record_bytes_queued, q.bytes);
        records.push(q.record);
        if let Some(b) = q.body {
            unreserve(&counters.body_bytes_queued, body_bytes(&b));
            bodies.push(*b);
        }
    }
    (records, bodies)
}

/// A body's size as its byte bound counts it (the caller's estimate, `bytes`).
fn body_bytes(b: &NewCapturedBody) -> usize {
    usize::try_from(b.body.bytes.max(0)).unwrap_or(usize::MAX)
}

/// Adds `size` to the bytes `queued` if the sum stays within `max`; false (nothing added)
/// otherwise.
fn reserve(queued: &AtomicUsize, size: usize, max: usize) -> bool {
    queued
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
            q.checked_add(size).filter(|t| *t <= max)
        })
        .is_ok()
}

/// Something left the queue: its `size` bytes no longer count against the bound.
fn unreserve(queued: &AtomicUsize, size: usize) {
    let _ = queued.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
        Some(q.saturating_sub(size))
    });
}

/// Writes a batch's captured bodies (after its records), retrying `max_retries` times; a
/// write that still fails counts them as dropped (logged at WARN: bodies are opt-in samples
/// of traffic, bounded and evictable, unlike the records).
async fn write_bodies(
    store: &Store,
    cfg: &RecordWriterConfig,
    bodies: &[NewCapturedBody],
    counters: &Counters,
) {
    if bodies.is_empty() {
        return;
    }
    let mut backoff = cfg.retry_backoff;
    let mut attempt = 0u32;
    loop {
        match store.insert_captured_bodies(bodies, crate::now_ms()).await {
            Ok(w) => {
                counters
                    .bodies_written
                    .fetch_add(bodies.len() as u64, Ordering::Relaxed);
                if w.evicted + w.expired > 0 {
                    tracing::debug!(
                        evicted = w.evicted,
                        expired = w.expired,
                        "captured bodies trimmed to their bounds"
                    );
                }
                return;
            }
            Err(e) if attempt < cfg.max_retries && !is_row_error(&e) => {
                attempt += 1;
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2).min(OUTAGE_BACKOFF_CAP);
            }
            Err(e) => {
                lost_bodies(counters, bodies.len(), Some(&e));
                return;
            }
        }
    }
}

/// Counts `n` bodies as dropped and says so at WARN.
fn lost_bodies(counters: &Counters, n: usize, e: Option<&StoreError>) {
    if n == 0 {
        return;
    }
    counters
        .bodies_dropped
        .fetch_add(n as u64, Ordering::Relaxed);
    let e = e.map_or_else(
        || "shutting down with the database away".to_owned(),
        ToString::to_string,
    );
    tracing::warn!(error = %e, bodies = n, "writing captured bodies failed; they are dropped");
}

/// Writes one batch, retrying with doubling backoff; counts the outcome. While the database is
/// away the batch is tried again without a bound until `stop` is raised (then `max_retries`
/// more times). When the batch still fails because of a row's data (a constraint or data
/// error, not a connection or server problem), it is written again in halves until the
/// refused rows are isolated, so that one bad row costs only itself. Returns true when the
/// batch was lost because the database stayed away.
async fn write_batch(
    store: &Store,
    cfg: &RecordWriterConfig,
    batch: &[RequestRecord],
    counters: &Counters,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    if batch.is_empty() {
        return false;
    }
    let mut backoff = cfg.retry_backoff;
    // retries counted against max_retries (an outage's tries count only once stopping)
    let mut attempt = 0u32;
    // tries while the database was away, for the log
    let mut outage_tries = 0u64;
    let outcome = loop {
        let write = store.insert_request_records(batch);
        tokio::pin!(write);
        let result = tokio::select! {
            r = &mut write => r,
            () = tokio::time::sleep(STALL_AFTER) => {
                counters.stalled.store(true, Ordering::Relaxed);
                write.await
            }
        };
        match result {
            Ok(()) => {
                counters
                    .written
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                break false;
            }
            Err(e) if is_row_error(&e) && batch.len() > 1 => {
                tracing::warn!(error = %e, rows = batch.len(), "a row of the batch was refused; writing the batch in parts to isolate it");
                isolate(store, batch, counters).await;
                break false;
            }
            Err(e) if e.is_unavailable() && !*stop.borrow() => {
                outage_tries += 1;
                counters.stalled.store(true, Ordering::Relaxed);
                if outage_tries == 1 {
                    tracing::warn!(error = %e, rows = batch.len(), queued = cfg.capacity, "the database is away; request records wait in the queue (up to its capacity, then they are dropped and counted) until it returns");
                }
                pause(backoff, stop).await;
                backoff = backoff.saturating_mul(2).min(OUTAGE_BACKOFF_CAP);
            }
            Err(e) if attempt < cfg.max_retries && !is_row_error(&e) => {
                attempt += 1;
                counters.stalled.store(true, Ordering::Relaxed);
                tracing::warn!(error = %e, rows = batch.len(), attempt, "writing request records failed; retrying");
                pause(backoff, stop).await;
                backoff = backoff.saturating_mul(2);
            }
            Err(e) => {
                lost(counters, batch, Some(&e), attempt);
                break e.is_unavailable();
            }
        }
    };
    counters.stalled.store(false, Ordering::Relaxed);
    if outage_tries > 0 && !outcome {
        tracing::warn!(
            tries = outage_tries,
            "the database is back; request records are written again"
        );
    }
    outcome
}

/// Sleeps `backoff`, or less when shutdown is asked for meanwhile.
async fn pause(backoff: Duration, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(backoff) => {}
        changed = stop.changed() => {
            if changed.is_err() {
                // the handle is gone without a shutdown: nobody will raise stop
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

/// Writes `batch` in ever smaller parts; parts refused for a row error are split again,
/// single refused rows (and parts failing for any other reason) are counted as lost.
async fn isolate(store: &Store, batch: &[RequestRecord], counters: &Counters) {
    let mut parts = vec![batch];
    while let Some(part) = parts.pop() {
        match store.insert_request_records(part).await {
            Ok(()) => {
                counters
                    .written
                    .fetch_add(part.len() as u64, Ordering::Relaxed);
            }
            Err(e) if is_row_error(&e) && part.len() > 1 => {
                let (a, b) = part.split_at(part.len() / 2);
                parts.push(b);
                parts.push(a);
            }
            Err(e) => lost(counters, part, Some(&e), 0),
        }
    }
}

/// Counts `rows` as lost and says so at ERROR (a person must look: records are missing).
/// `e` is `None` for rows not tried: queued at a shutdown that found the database away.
fn lost(counters: &Counters, rows: &[RequestRecord], e: Option<&StoreError>, retries: u32) {
    counters
        .write_errors
        .fetch_add(rows.len() as u64, Ordering::Relaxed);
    let e = e.map_or_else(
        || "shutting down with the database away".to_owned(),
        ToString::to_string,
    );
    tracing::error!(
        error = %e,
        rows = rows.len(),
        retries,
        first_request_id = rows.first().map(|r| r.request_id.as_str()).unwrap_or_default(),
        "writing request records failed; these records are lost"
    );
}

/// True when the database refused the statement because of the data in it (constraint
/// violations, invalid values), which retrying cannot fix but splitting the batch can.
fn is_row_error(e: &StoreError) -> bool {
    let StoreError::Query {
        source: sqlx::Error::Database(db),
        ..
    } = e
    else {
        return false;
    };
    if !matches!(db.kind(), sqlx::error::ErrorKind::Other) {
        return true;
    }
    let code = db.code().unwrap_or_default();
    if code.len() == 5 {
        // a PostgreSQL SQLSTATE: classes 22 (data exception) and 23 (integrity constraint)
        code.starts_with("22") || code.starts_with("23")
    } else {
        // a SQLite result code: TOOBIG (18), CONSTRAINT (19, and its extended codes), MISMATCH (20)
        code.parse::<i32>()
            .is_ok_and(|c| matches!(c & 0xff, 18..=20))
    }
}
