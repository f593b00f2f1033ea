//! Retention: how long the store keeps request records, probe runs and rollups, and the task
//! that deletes what is older.
//!
//! Request records are the bulk of the database (a row per upstream attempt: at 1,000
//! requests a second, 86 million a day), so they are kept for a bounded time
//! ([`RetentionConfig::records`], 30 days by default) and the rollups the dashboards read, with
//! each key's hourly usage, for longer ([`RetentionConfig::rollups`], 400 days). A probe run's
//! per-position data (`raw`: about 110 bytes a scored token at the default top-5; a
//! prompt-logprobs run about 55 kB, 0.7 MB an endpoint an hour at the default interval, 6 GB a
//! year) is what a flagged run's pooled diagnosis reads of the runs before it (and the noise
//! floor of a pair stored without its statistics, of the last `history_runs`, 500: under two
//! days at the default interval); it is cleared after
//! [`RetentionConfig::probe_raw`] (7 days), and the run itself — its statistics, a few hundred
//! bytes, which the dashboards chart — is deleted with the rollups. Everything is cut at whole
//! UTC days: a pass deletes what lies before the start of the day that holds `now - keep`, so
//! at least `keep` is always kept (and at most a day more), and a rollup range reads the same
//! in every grain (see [`Store::delete_rollups_before`]). Alerts, eval jobs, the all-time probe-run counts
//! (`probe_run_latest`) and the changed? detector's baselines (`probe_baselines`) are kept.
//!
//! [`RetentionTask`] runs a pass when it starts and then every [`RetentionConfig::every`].
//! On PostgreSQL the old records' day partitions are dropped whole
//! ([`Store::delete_request_records_before`]). On SQLite they are deleted in steps of at most
//! [`RetentionConfig::chunk_rows`] rows, each its own short transaction, with a pause between
//! them: the record writer, which needs the same database's one write lock, waits at most one
//! step, never a whole day's delete. Probe runs go the same way on both backends, at most
//! [`RetentionConfig::chunk_runs`] a step (a run's raw data can be a megabyte). SQLite keeps
//! the freed pages and reuses them for new rows, so the file stops growing once retention
//! deletes as much as the gateway writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::connect::Pool;
use crate::partitions::DAY_MS;
use crate::probe_runs::{on_pool, sql};
use crate::{Store, StoreError};

/// What to keep, and how the deleting is paced.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// How long request records are kept (`None`: for ever).
    pub records: Option<Duration>,
    /// How long the rollups (every grain, with their labels), each key's hours and the probe
    /// runs are kept (`None`: for ever).
    pub rollups: Option<Duration>,
    /// How long a probe run keeps its per-position data (`None`: for ever); then `raw` is
    /// cleared and the run's statistics stay.
    pub probe_raw: Option<Duration>,
    /// Time between two passes.
    pub every: Duration,
    /// Most records one SQLite step deletes.
    pub chunk_rows: u32,
    /// Most probe runs one step clears or deletes.
    pub chunk_runs: u32,
    /// Pause between two SQLite steps, in which the record writer gets the write lock.
    pub pause: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            records: Some(Duration::from_secs(30 * 86_400)),
            rollups: Some(Duration::from_secs(400 * 86_400)),
            probe_raw: Some(Duration::from_secs(7 * 86_400)),
            every: Duration::from_secs(3600),
            chunk_rows: 10_000,
            chunk_runs: 100,
            pause: Duration::from_millis(20),
        }
    }
}

/// What one pass deleted, and how long its longest step held the database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPass {
    /// Request records.
    pub records: u64,
    /// Per-minute rollup rows (the hours, days and labels of the same days go with them).
    pub rollup_minutes: u64,
    /// Probe runs whose per-position data was cleared.
    pub probe_raw: u64,
    /// Probe runs deleted.
    pub probe_runs: u64,
    /// Deleting or clearing steps, records' and probe runs' (the last of each kind finds fewer
    /// than a whole step).
    pub steps: u32,
    /// The longest step: on SQLite, the longest the record writer can have waited for it.
    pub longest_step: Duration,
}

impl RetentionPass {
    /// Whether the pass deleted or cleared anything.
    pub fn did_anything(&self) -> bool {
        self.records + self.rollup_minutes + self.probe_raw + self.probe_runs > 0
    }
}

/// The start of the UTC day that holds `now_ms - keep`: a pass deletes what lies before it.
pub fn retention_cut(now_ms: i64, keep: Duration) -> i64 {
    let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
    now_ms.saturating_sub(keep_ms).div_euclid(DAY_MS) * DAY_MS
}

impl Store {
    /// Deletes request records older than `ts_ms`, at most `max_rows` of them, oldest first, in
    /// one short transaction; returns how many went (fewer than `max_rows`: none are left). On
    /// PostgreSQL this is [`Store::delete_request_records_before`] (day partitions dropped
    /// whole), which never holds up the writer.
    pub async fn delete_request_records_step(
        &self,
        ts_ms: i64,
        max_rows: u32,
    ) -> Result<u64, StoreError> {
        match &self.pool {
            Pool::Postgres(_) => self.delete_request_records_before(ts_ms).await,
            Pool::Sqlite(pool) => Ok(sqlx::query(
                "DELETE FROM request_records WHERE rowid IN (SELECT rowid FROM request_records \
                 WHERE ts_ms < ? ORDER BY ts_ms LIMIT ?)",
            )
            .bind(ts_ms)
            .bind(i64::from(max_rows.max(1)))
            .execute(pool)
            .await
            .map_err(StoreError::query("deleting old request records"))?
            .rows_affected()),
        }
    }

    /// Clears the per-position data (`raw`) of probe runs started before `ts_ms`, at most
    /// `max_runs` of them, oldest first, in one short transaction; returns how many (fewer than
    /// `max_runs`: none are left). The runs and their statistics stay.
    pub async fn clear_probe_raw_step(&self, ts_ms: i64, max_runs: u32) -> Result<u64, StoreError> {
        self.probe_runs_step(
            "UPDATE probe_runs SET raw = NULL WHERE id IN (SELECT id FROM probe_runs \
             WHERE raw IS NOT NULL AND started_ms < $1 ORDER BY started_ms LIMIT $2)",
            ts_ms,
            max_runs,
            "clearing old probe runs' raw data",
        )
        .await
    }

    /// Deletes probe runs started before `ts_ms`, at most `max_runs` of them, oldest first, in
    /// one short transaction; returns how many went. A kept run that repeated a deleted one
    /// (a noise-floor pair cut in two) keeps its data with `repeat_of` set to NULL.
    pub async fn delete_probe_runs_step(
        &self,
        ts_ms: i64,
        max_runs: u32,
    ) -> Result<u64, StoreError> {
        self.probe_runs_step(
            "DELETE FROM probe_runs WHERE id IN (SELECT id FROM probe_runs \
             WHERE started_ms < $1 ORDER BY started_ms LIMIT $2)",
            ts_ms,
            max_runs,
            "deleting old probe runs",
        )
        .await
    }

    async fn probe_runs_step(
        &self,
        stmt: &str,
        ts_ms: i64,
        max_runs: u32,
        op: &'static str,
    ) -> Result<u64, StoreError> {
        let stmt = sql(self.backend(), stmt);
        let limit = i64::from(max_runs.max(1));
        on_pool!(&self.pool, |p| Ok(sqlx::query(&stmt)
            .bind(ts_ms)
            .bind(limit)
            .execute(p)
            .await
            .map_err(StoreError::query(op))?
            .rows_affected()))
    }

    /// One retention pass at `now_ms`: the records, the probe runs, the probe runs' raw data
    /// (each step by step), then the rollups. Stops between two steps once `stop` holds true
    /// (what is left goes in the next pass).
    pub async fn retention_pass(
        &self,
        cfg: &RetentionConfig,
        now_ms: i64,
        stop: &watch::Receiver<bool>,
    ) -> Result<RetentionPass, StoreError> {
        let mut pass = RetentionPass::default();
        let cut = |keep: Option<Duration>| keep.map(|k| retention_cut(now_ms, k));
        if let Some(ts) = cut(cfg.records) {
            pass.records = self
                .in_steps(cfg, Step::Records, ts, stop, &mut pass)
                .await?;
        }
        // the runs first, so that none has its raw data cleared only to be deleted
        let rollups = cut(cfg.rollups);
        if let Some(ts) = rollups {
            pass.probe_runs = self
                .in_steps(cfg, Step::ProbeRuns, ts, stop, &mut pass)
                .await?;
        }
        if let Some(ts) = cut(cfg.probe_raw) {
            pass.probe_raw = self
                .in_steps(cfg, Step::ProbeRaw, ts, stop, &mut pass)
                .await?;
        }
        if let Some(ts) = rollups
            && !*stop.borrow()
        {
            pass.rollup_minutes = self.delete_rollups_before(ts).await?;
        }
        Ok(pass)
    }

    /// Runs `step` on what lies before `ts_ms` until a step finds less than a whole one or
    /// `stop` holds true, pausing [`RetentionConfig::pause`] between two; counts the steps and
    /// the longest into `pass` and returns the rows.
    async fn in_steps(
        &self,
        cfg: &RetentionConfig,
        step: Step,
        ts_ms: i64,
        stop: &watch::Receiver<bool>,
        pass: &mut RetentionPass,
    ) -> Result<u64, StoreError> {
        let size = match step {
            Step::Records => cfg.chunk_rows,
            Step::ProbeRuns | Step::ProbeRaw => cfg.chunk_runs,
        }
        .max(1);
        let mut total = 0;
        while !*stop.borrow() {
            let started = std::time::Instant::now();
            let n = match step {
                Step::Records => self.delete_request_records_step(ts_ms, size).await?,
                Step::ProbeRuns => self.delete_probe_runs_step(ts_ms, size).await?,
                Step::ProbeRaw => self.clear_probe_raw_step(ts_ms, size).await?,
            };
            pass.steps += 1;
            pass.longest_step = pass.longest_step.max(started.elapsed());
            total += n;
            if n < u64::from(size) {
                break;
            }
            tokio::time::sleep(cfg.pause).await;
        }
        Ok(total)
    }
}

/// What a retention step deletes or clears.
#[derive(Debug, Clone, Copy)]
enum Step {
    Records,
    ProbeRuns,
    ProbeRaw,
}

/// What a [`RetentionTask`] has done since it started, shared with whoever reports it (the
/// gateway's `/metrics`): passes by outcome, what they deleted or cleared, and the last good
/// pass's end and longest step.
#[derive(Debug, Default)]
pub struct RetentionStats {
    passes: AtomicU64,
    failed: AtomicU64,
    records: AtomicU64,
    probe_runs: AtomicU64,
    probe_raw: AtomicU64,
    rollup_minutes: AtomicU64,
    last_pass_ms: AtomicI64,
    longest_step_us: AtomicU64,
}

impl RetentionStats {
    fn add(&self, pass: &RetentionPass, ended_ms: i64) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.records.fetch_add(pass.records, Ordering::Relaxed);
        self.probe_runs
            .fetch_add(pass.probe_runs, Ordering::Relaxed);
        self.probe_raw.fetch_add(pass.probe_raw, Ordering::Relaxed);
        self.rollup_minutes
            .fetch_add(pass.rollup_minutes, Ordering::Relaxed);
        let us = u64::try_from(pass.longest_step.as_micros()).unwrap_or(u64::MAX);
        self.longest_step_us.store(us, Ordering::Relaxed);
        self.last_pass_ms.store(ended_ms, Ordering::Relaxed);
    }

    /// Passes that finished, and passes that failed (each tried again at the next).
    pub fn passes(&self) -> (u64, u64) {
        (
            self.passes.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    /// Rows the finished passes deleted or cleared, in all, by what: `records`, `probe_runs`,
    /// `probe_raw` (runs whose raw data was cleared), `rollup_minutes`.
    pub fn rows(&self) -> [(&'static str, u64); 4] {
        [
            ("records", self.records.load(Ordering::Relaxed)),
            ("probe_runs", self.probe_runs.load(Ordering::Relaxed)),
            ("probe_raw", self.probe_raw.load(Ordering::Relaxed)),
            (
                "rollup_minutes",
                self.rollup_minutes.load(Ordering::Relaxed),
            ),
        ]
    }

    /// When the last finished pass ended (unix milliseconds) and its longest step; `None`
    /// before the first.
    pub fn last_pass(&self) -> Option<(i64, Duration)> {
        let ms = self.last_pass_ms.load(Ordering::Relaxed);
        (ms > 0).then(|| {
            let us = self.longest_step_us.load(Ordering::Relaxed);
            (ms, Duration::from_micros(us))
        })
    }
}

/// The background task that runs [`Store::retention_pass`] at start and every
/// [`RetentionConfig::every`]. A failed pass is logged, counted and tried again at the next.
#[derive(Debug)]
pub struct RetentionTask {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    stats: Arc<RetentionStats>,
}

impl RetentionTask {
    /// Starts the task; `None` when nothing is to be deleted (everything kept for ever).
    pub fn spawn(store: Store, cfg: RetentionConfig) -> Option<RetentionTask> {
        if cfg.records.is_none() && cfg.rollups.is_none() && cfg.probe_raw.is_none() {
            return None;
        }
        let (stop, rx) = watch::channel(false);
        let stats = Arc::new(RetentionStats::default());
        let task = tokio::spawn(run(store, cfg, rx, stats.clone()));
        Some(RetentionTask { task, stop, stats })
    }

    /// What the task has done so far (updated after every pass).
    pub fn stats(&self) -> Arc<RetentionStats> {
        self.stats.clone()
    }

    /// Stops the task (between two steps of a pass) and waits for it.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the retention task failed");
        }
    }
}

async fn run(
    store: Store,
    cfg: RetentionConfig,
    mut stop: watch::Receiver<bool>,
    stats: Arc<RetentionStats>,
) {
    loop {
        let started = std::time::Instant::now();
        match store.retention_pass(&cfg, crate::now_ms(), &stop).await {
            Ok(p) => {
                stats.add(&p, crate::now_ms());
                if p.did_anything() {
                    tracing::info!(
                        records = p.records,
                        probe_raw = p.probe_raw,
                        probe_runs = p.probe_runs,
                        rollup_minutes = p.rollup_minutes,
                        steps = p.steps,
                        longest_step_ms = p.longest_step.as_millis(),
                        ms = started.elapsed().as_millis(),
                        "retention deleted old rows"
                    );
                } else {
                    tracing::debug!("retention: nothing to delete");
                }
            }
            Err(e) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "retention pass failed; tried again at the next");
            }
        }
        tokio::select! {
            changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
            () = tokio::time::sleep(cfg.every) => {}
        }
    }
}
