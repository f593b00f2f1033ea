//! Retention: how long the store keeps request records and rollups, and the task that
//! deletes what is older.
//!
//! Request records are the bulk of the database (a row per upstream attempt: at 1,000
//! requests a second, 86 million a day), so they are kept for a bounded time
//! ([`RetentionConfig::records`], 30 days by default) and the rollups the dashboards read, with
//! each key's hourly usage, for longer ([`RetentionConfig::rollups`], 400 days). Both are cut at whole UTC days:
//! a pass deletes what lies before the start of the day that holds `now - keep`, so at least
//! `keep` is always kept (and at most a day more), and a rollup range reads the same in every
//! grain (see [`Store::delete_rollups_before`]).
//!
//! [`RetentionTask`] runs a pass when it starts and then every [`RetentionConfig::every`].
//! On PostgreSQL the old records' day partitions are dropped whole
//! ([`Store::delete_request_records_before`]). On SQLite they are deleted in steps of at most
//! [`RetentionConfig::chunk_rows`] rows, each its own short transaction, with a pause between
//! them: the record writer, which needs the same database's one write lock, waits at most one
//! step, never a whole day's delete. SQLite keeps the freed pages and reuses them for new rows,
//! so the file stops growing once retention deletes as much as the gateway writes.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::connect::Pool;
use crate::partitions::DAY_MS;
use crate::{Store, StoreError};

/// What to keep, and how the deleting is paced.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// How long request records are kept (`None`: for ever).
    pub records: Option<Duration>,
    /// How long the rollups (every grain, with their labels) and each key's hours are kept
    /// (`None`: for ever).
    pub rollups: Option<Duration>,
    /// Time between two passes.
    pub every: Duration,
    /// Most records one SQLite step deletes.
    pub chunk_rows: u32,
    /// Pause between two SQLite steps, in which the record writer gets the write lock.
    pub pause: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            records: Some(Duration::from_secs(30 * 86_400)),
            rollups: Some(Duration::from_secs(400 * 86_400)),
            every: Duration::from_secs(3600),
            chunk_rows: 10_000,
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
    /// Record-deleting steps (the last one finds fewer than `chunk_rows`).
    pub steps: u32,
    /// The longest step: on SQLite, the longest the record writer can have waited for it.
    pub longest_step: Duration,
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

    /// One retention pass at `now_ms`: the records, step by step, then the rollups. Stops
    /// between two steps once `stop` holds true (what is left goes in the next pass).
    pub async fn retention_pass(
        &self,
        cfg: &RetentionConfig,
        now_ms: i64,
        stop: &watch::Receiver<bool>,
    ) -> Result<RetentionPass, StoreError> {
        let mut pass = RetentionPass::default();
        if let Some(keep) = cfg.records {
            let cut = retention_cut(now_ms, keep);
            let step = cfg.chunk_rows.max(1);
            while !*stop.borrow() {
                let started = std::time::Instant::now();
                let n = self.delete_request_records_step(cut, step).await?;
                pass.steps += 1;
                pass.longest_step = pass.longest_step.max(started.elapsed());
                pass.records += n;
                if n < u64::from(step) {
                    break;
                }
                tokio::time::sleep(cfg.pause).await;
            }
        }
        if let Some(keep) = cfg.rollups
            && !*stop.borrow()
        {
            pass.rollup_minutes = self
                .delete_rollups_before(retention_cut(now_ms, keep))
                .await?;
        }
        Ok(pass)
    }
}

/// The background task that runs [`Store::retention_pass`] at start and every
/// [`RetentionConfig::every`]. A failed pass is logged and tried again at the next.
#[derive(Debug)]
pub struct RetentionTask {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl RetentionTask {
    /// Starts the task; `None` when nothing is to be deleted (both kept for ever).
    pub fn spawn(store: Store, cfg: RetentionConfig) -> Option<RetentionTask> {
        if cfg.records.is_none() && cfg.rollups.is_none() {
            return None;
        }
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(run(store, cfg, rx));
        Some(RetentionTask { task, stop })
    }

    /// Stops the task (between two steps of a pass) and waits for it.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the retention task failed");
        }
    }
}

async fn run(store: Store, cfg: RetentionConfig, mut stop: watch::Receiver<bool>) {
    loop {
        let started = std::time::Instant::now();
        match store.retention_pass(&cfg, crate::now_ms(), &stop).await {
            Ok(p) if p.records + p.rollup_minutes > 0 => tracing::info!(
                records = p.records,
                rollup_minutes = p.rollup_minutes,
                steps = p.steps,
                longest_step_ms = p.longest_step.as_millis(),
                ms = started.elapsed().as_millis(),
                "retention deleted old rows"
            ),
            Ok(_) => tracing::debug!("retention: nothing to delete"),
            Err(e) => tracing::warn!(error = %e, "retention pass failed; tried again at the next"),
        }
        tokio::select! {
            changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
            () = tokio::time::sleep(cfg.every) => {}
        }
    }
}
