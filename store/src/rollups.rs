//! Per-endpoint per-minute rollups of request records (`endpoint_minutes`, and
//! `endpoint_minute_labels` for error kinds and finish reasons), and the same per hour
//! (`endpoint_hours`, `endpoint_hour_labels`) and per UTC day (`endpoint_days`,
//! `endpoint_day_labels`): a range reads its whole days from the days, the whole hours left at
//! its edges from the hours and only the partial hours from the minutes. They are what
//! dashboards, the passive sweep and eval triggers read instead of raw rows.
//!
//! The record writer keeps them up to date: [`Store::insert_request_records`] adds the
//! records it actually inserted (not the ones skipped as already stored) to their minute's
//! row in the same transaction, with `ON CONFLICT ... DO UPDATE SET c = c + excluded.c`, so
//! concurrent writers and retried batches never double-count. Only upstream attempts (records
//! with an endpoint) are rolled up. Latency histograms use the fixed bucket bounds
//! [`TTFT_BOUNDS_MS`] and [`TPOT_BOUNDS_MS`]; quantiles are interpolated within a bucket.
//! Rollups are not touched by request-record retention ([`Store::delete_rollups_before`]
//! is their own, longer, retention).

use std::collections::{BTreeMap, HashMap};

use sqlx::{QueryBuilder, Row};

use crate::RequestRecord;
// one UTC day, the coarsest grain (a 30-day range reads its whole days): the partitions' day
use crate::partitions::DAY_MS;
use crate::probe_runs::{on_pool, sql, text};

mod deltas;
use crate::{Store, StoreError};
pub(crate) use deltas::Deltas;

/// Buckets per latency histogram (the bounds plus one open bucket).
pub const BUCKETS: usize = 13;
/// Upper bounds (inclusive) of the TTFT buckets, milliseconds; the last bucket is open.
pub const TTFT_BOUNDS_MS: [f64; BUCKETS - 1] = [
    50.0, 100.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0, 10000.0,
];
/// Upper bounds (inclusive) of the TPOT buckets, milliseconds; the last bucket is open.
pub const TPOT_BOUNDS_MS: [f64; BUCKETS - 1] = [
    5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 75.0, 100.0, 150.0, 200.0, 500.0,
];
/// One minute, the rollup grain, in milliseconds.
pub const MINUTE_MS: i64 = 60_000;
/// One hour, the coarse grain long ranges read, in milliseconds.
pub const HOUR_MS: i64 = 3_600_000;

/// One rollup grain: its tables and time column.
#[derive(Debug, Clone, Copy)]
struct Grain {
    table: &'static str,
    labels: &'static str,
    col: &'static str,
    ms: i64,
}

const MINUTES: Grain = Grain {
    table: "endpoint_minutes",
    labels: "endpoint_minute_labels",
    col: "minute_ms",
    ms: MINUTE_MS,
};

const HOURS: Grain = Grain {
    table: "endpoint_hours",
    labels: "endpoint_hour_labels",
    col: "hour_ms",
    ms: HOUR_MS,
};

const DAYS: Grain = Grain {
    table: "endpoint_days",
    labels: "endpoint_day_labels",
    col: "day_ms",
    ms: DAY_MS,
};

/// Every grain, coarsest first; each divides the one before it.
const GRAINS: [Grain; 3] = [DAYS, HOURS, MINUTES];

/// `[since, until)` as the fewest rollup rows cover it: the whole units of the coarsest grain
/// inside it, then the same recursively for the pieces left at either edge, down to minutes
/// (which take whatever is left, so a range not on a minute boundary reads the minutes that
/// start inside it). Pieces are `(grain, since, until)`, each aligned to its grain.
fn cover(since: i64, until: i64, grains: &[Grain]) -> Vec<(Grain, i64, i64)> {
    let Some((&g, finer)) = grains.split_first() else {
        return Vec::new();
    };
    if since >= until {
        return Vec::new();
    }
    if finer.is_empty() {
        return vec![(g, since, until)];
    }
    let first = since.div_euclid(g.ms) * g.ms + if since.rem_euclid(g.ms) == 0 { 0 } else { g.ms };
    let last = until.div_euclid(g.ms) * g.ms;
    if first >= last {
        return cover(since, until, finer);
    }
    let mut out = cover(since, first, finer);
    out.push((g, first, last));
    out.extend(cover(last, until, finer));
    out
}
/// Longest label (error kind, finish reason) kept; longer ones are cut (they come from
/// providers, so they are bounded here).
pub const MAX_LABEL_CHARS: usize = 64;

/// Counts over a set of upstream attempts (one minute of one endpoint, or a sum of them).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rollup {
    /// Upstream attempts.
    pub requests: i64,
    /// Attempts whose answer reached the client.
    pub final_requests: i64,
    /// Attempts that failed by the endpoint's doing ([`RequestRecord::failed_by_endpoint`]:
    /// not a client that left, a lost hedge or a 4xx refusing the request; those are still
    /// counted by kind).
    pub errors: i64,
    /// Attempts that returned tool calls or disagreed on the finish reason (the tool-call
    /// error rate's denominator).
    pub tool_requests: i64,
    /// Attempts with any tool-call error (the rate's numerator).
    pub tool_errored: i64,
    /// Tool calls returned.
    pub tool_calls: i64,
    /// Tool calls with arguments that are not JSON.
    pub tool_invalid_json: i64,
    /// Tool calls naming an undeclared tool.
    pub tool_unknown_name: i64,
    /// Tool calls failing the declared schema.
    pub tool_schema_mismatch: i64,
    /// Attempts whose finish reason and calls disagreed.
    pub tool_finish_mismatch: i64,
    /// Generations cut by the degeneration guard.
    pub degenerate: i64,
    /// Prompt tokens.
    pub prompt_tokens: i64,
    /// Completion tokens.
    pub completion_tokens: i64,
    /// Attempts per TTFT bucket (`TTFT_BOUNDS_MS`).
    pub ttft_hist: [i64; BUCKETS],
    /// Attempts per TPOT bucket (`TPOT_BOUNDS_MS`).
    pub tpot_hist: [i64; BUCKETS],
}

/// One endpoint's rollups summed over a time range, with its labelled counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointRollup {
    /// The endpoint label.
    pub endpoint: String,
    /// The logical model it served.
    pub model: String,
    /// The sums.
    pub totals: Rollup,
    /// Attempts per error kind.
    pub error_kinds: BTreeMap<String, i64>,
    /// Attempts per finish reason.
    pub finish_reasons: BTreeMap<String, i64>,
}

/// One step of an endpoint's time series: the rollups of `[start_ms, start_ms + step)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupPoint {
    /// Start of the step, unix milliseconds.
    pub start_ms: i64,
    /// The sums over the step.
    pub totals: Rollup,
}

/// Which rollups [`Store::endpoint_rollups`] sums; `None` fields do not filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RollupQuery {
    /// Only this model's endpoints.
    pub model: Option<String>,
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Minutes starting at or after this time (unix milliseconds).
    pub since_ms: i64,
    /// Minutes starting before this time.
    pub until_ms: i64,
}

/// The scalar columns, in [`Rollup`]'s field order.
const SCALARS: [&str; 13] = [
    "requests",
    "final_requests",
    "errors",
    "tool_requests",
    "tool_errored",
    "tool_calls",
    "tool_invalid_json",
    "tool_unknown_name",
    "tool_schema_mismatch",
    "tool_finish_mismatch",
    "degenerate",
    "prompt_tokens",
    "completion_tokens",
];

/// Most rows per upsert statement (a power of two: [`crate::records::pow2_chunks`]): 42
/// bound values each, under SQLite's 32,766 limit.
const ROWS_PER_UPSERT: usize = 256;

impl Rollup {
    /// Adds one attempt.
    pub fn add(&mut self, r: &RequestRecord) {
        self.requests += 1;
        self.final_requests += i64::from(r.final_attempt);
        self.errors += i64::from(r.failed_by_endpoint());
        let tool_related = r.tool_calls > 0 || r.tool_finish_mismatch.is_some();
        self.tool_requests += i64::from(tool_related);
        self.tool_errored += i64::from(r.tool_errored);
        self.tool_calls += i64::from(r.tool_calls);
        self.tool_invalid_json += i64::from(r.tool_invalid_json);
        self.tool_unknown_name += i64::from(r.tool_unknown_name);
        self.tool_schema_mismatch += i64::from(r.tool_schema_mismatch);
        self.tool_finish_mismatch += i64::from(r.tool_finish_mismatch.is_some());
        self.degenerate += i64::from(r.degenerate);
        self.prompt_tokens += r.prompt_tokens.unwrap_or(0).max(0);
        self.completion_tokens += r.completion_tokens.unwrap_or(0).max(0);
        if let Some(t) = r.ttft_ms {
            self.ttft_hist[bucket(&TTFT_BOUNDS_MS, t)] += 1;
        }
        if let Some(t) = r.tpot_ms {
            self.tpot_hist[bucket(&TPOT_BOUNDS_MS, t)] += 1;
        }
    }

    /// Adds every count of `o`.
    pub fn merge(&mut self, o: &Rollup) {
        for (a, b) in self.scalars_mut().into_iter().zip(o.scalars()) {
            *a += b;
        }
        for (a, b) in self.ttft_hist.iter_mut().zip(o.ttft_hist) {
            *a += b;
        }
        for (a, b) in self.tpot_hist.iter_mut().zip(o.tpot_hist) {
            *a += b;
        }
    }

    /// The `q` quantile (0..=1) of TTFT in milliseconds, None without samples.
    pub fn ttft_quantile(&self, q: f64) -> Option<f64> {
        hist_quantile(&self.ttft_hist, &TTFT_BOUNDS_MS, q)
    }

    /// The `q` quantile (0..=1) of TPOT in milliseconds, None without samples.
    pub fn tpot_quantile(&self, q: f64) -> Option<f64> {
        hist_quantile(&self.tpot_hist, &TPOT_BOUNDS_MS, q)
    }

    /// Share of TTFT samples at or under `target_ms` (counted by whole buckets: exact when
    /// the target is a bucket bound, else the buckets wholly under it), None without samples.
    pub fn ttft_share_within(&self, target_ms: f64) -> Option<f64> {
        share_within(&self.ttft_hist, &TTFT_BOUNDS_MS, target_ms)
    }

    /// As [`Rollup::ttft_share_within`] for TPOT.
    pub fn tpot_share_within(&self, target_ms: f64) -> Option<f64> {
        share_within(&self.tpot_hist, &TPOT_BOUNDS_MS, target_ms)
    }

    fn scalars(&self) -> [i64; 13] {
        [
            self.requests,
            self.final_requests,
            self.errors,
            self.tool_requests,
            self.tool_errored,
            self.tool_calls,
            self.tool_invalid_json,
            self.tool_unknown_name,
            self.tool_schema_mismatch,
            self.tool_finish_mismatch,
            self.degenerate,
            self.prompt_tokens,
            self.completion_tokens,
        ]
    }

    fn scalars_mut(&mut self) -> [&mut i64; 13] {
        [
            &mut self.requests,
            &mut self.final_requests,
            &mut self.errors,
            &mut self.tool_requests,
            &mut self.tool_errored,
            &mut self.tool_calls,
            &mut self.tool_invalid_json,
            &mut self.tool_unknown_name,
            &mut self.tool_schema_mismatch,
            &mut self.tool_finish_mismatch,
            &mut self.degenerate,
            &mut self.prompt_tokens,
            &mut self.completion_tokens,
        ]
    }
}

/// The bucket of `v` under `bounds` (inclusive upper bounds; past the last, the open one).
fn bucket(bounds: &[f64], v: f64) -> usize {
    bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len())
}

/// The `q` quantile of a bucketed histogram, linearly interpolated within its bucket (the
/// open bucket answers its lower bound).
pub fn hist_quantile(hist: &[i64], bounds: &[f64], q: f64) -> Option<f64> {
    let total: i64 = hist.iter().sum();
    if total <= 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0i64;
    for (i, &n) in hist.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let lo = if i == 0 { 0.0 } else { bounds[i - 1] };
            let Some(&hi) = bounds.get(i) else {
                return Some(lo);
            };
            let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return Some(lo + (hi - lo) * within);
        }
        below += n;
    }
    bounds.last().copied()
}

fn share_within(hist: &[i64], bounds: &[f64], target: f64) -> Option<f64> {
    let total: i64 = hist.iter().sum();
    if total <= 0 {
        return None;
    }
    let within: i64 = hist
        .iter()
        .zip(bounds)
        .take_while(|(_, b)| **b <= target)
        .map(|(n, _)| *n)
        .sum();
    Some(within as f64 / total as f64)
}

/// The minute a timestamp falls in.
pub fn minute_of(ts_ms: i64) -> i64 {
    ts_ms.div_euclid(MINUTE_MS) * MINUTE_MS
}

/// Every summed column: the scalars, then the TTFT and TPOT buckets.
fn value_columns() -> Vec<String> {
    SCALARS
        .iter()
        .map(|s| (*s).to_owned())
        .chain((0..BUCKETS).map(|i| format!("ttft_h{i}")))
        .chain((0..BUCKETS).map(|i| format!("tpot_h{i}")))
        .collect()
}

/// `CAST(COALESCE(SUM(c), 0) AS BIGINT)` for every summed column (PostgreSQL's SUM of BIGINT
/// is NUMERIC).
fn sum_columns() -> String {
    value_columns()
        .iter()
        .map(|c| format!("CAST(COALESCE(SUM({c}), 0) AS BIGINT)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads the summed columns starting at column `first`.
fn rollup_from_row<R>(row: &R, first: usize) -> Result<Rollup, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding a rollup";
    let mut r = Rollup::default();
    let mut i = first;
    for v in r.scalars_mut() {
        *v = row.try_get(i).map_err(StoreError::query(OP))?;
        i += 1;
    }
    for v in r.ttft_hist.iter_mut().chain(r.tpot_hist.iter_mut()) {
        *v = row.try_get(i).map_err(StoreError::query(OP))?;
        i += 1;
    }
    Ok(r)
}

impl Store {
    /// Each endpoint's rollups summed over `q`'s range, ordered by model then endpoint.
    /// Whole days inside the range are read from the daily tables, whole hours left at its
    /// edges from the hourly ones and only the partial hours from the minute tables.
    pub async fn endpoint_rollups(
        &self,
        q: &RollupQuery,
    ) -> Result<Vec<EndpointRollup>, StoreError> {
        let pieces: Vec<(Grain, RollupQuery)> = cover(q.since_ms, q.until_ms, &GRAINS)
            .into_iter()
            .map(|(grain, since, until)| {
                let sub = RollupQuery {
                    since_ms: since,
                    until_ms: until,
                    ..q.clone()
                };
                (grain, sub)
            })
            .collect();
        // the pieces are independent reads: all in flight at once, on the pool's connections
        let sums = futures_util::future::try_join_all(
            pieces
                .iter()
                .map(|(grain, sub)| self.sum_rollups(*grain, sub)),
        )
        .await?;
        let mut out: Vec<EndpointRollup> = Vec::new();
        for piece in sums {
            for part in piece {
                match out.iter_mut().find(|e| e.endpoint == part.endpoint) {
                    Some(e) => {
                        e.totals.merge(&part.totals);
                        for (k, n) in part.error_kinds {
                            *e.error_kinds.entry(k).or_default() += n;
                        }
                        for (k, n) in part.finish_reasons {
                            *e.finish_reasons.entry(k).or_default() += n;
                        }
                    }
                    None => out.push(part),
                }
            }
        }
        out.sort_by(|a, b| (&a.model, &a.endpoint).cmp(&(&b.model, &b.endpoint)));
        Ok(out)
    }

    /// One grain's sums over `q`'s range (which the caller aligns to the grain).
    async fn sum_rollups(
        &self,
        g: Grain,
        q: &RollupQuery,
    ) -> Result<Vec<EndpointRollup>, StoreError> {
        let Grain {
            table, labels, col, ..
        } = g;
        const OP: &str = "summing endpoint rollups";
        let sums = async {
            let out: Vec<EndpointRollup> = on_pool!(&self.pool, |p| {
                let mut qb = QueryBuilder::new(format!(
                    "SELECT endpoint, MIN(model), {} FROM {table} WHERE {col} >= ",
                    sum_columns()
                ));
                qb.push_bind(q.since_ms)
                    .push(format!(" AND {col} < "))
                    .push_bind(q.until_ms);
                if let Some(m) = &q.model {
                    qb.push(" AND model = ").push_bind(m.as_str());
                }
                if let Some(e) = &q.endpoint {
                    qb.push(" AND endpoint = ").push_bind(e.as_str());
                }
                qb.push(" GROUP BY endpoint");
                let rows = qb
                    .build()
                    .fetch_all(p)
                    .await
                    .map_err(StoreError::query(OP))?;
                rows.iter()
                    .map(|row| {
                        Ok(EndpointRollup {
                            endpoint: row.try_get(0).map_err(StoreError::query(OP))?,
                            model: row.try_get(1).map_err(StoreError::query(OP))?,
                            totals: rollup_from_row(row, 2)?,
                            ..EndpointRollup::default()
                        })
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?
            });
            Ok::<_, StoreError>(out)
        };
        let labels = async {
            let labels: Vec<(String, String, String, i64)> = on_pool!(&self.pool, |p| {
                let mut qb = QueryBuilder::new(format!(
                    "SELECT l.endpoint, l.dim, l.label, CAST(SUM(l.n) AS BIGINT) \
                 FROM {labels} l WHERE l.{col} >= "
                ));
                qb.push_bind(q.since_ms)
                    .push(format!(" AND l.{col} < "))
                    .push_bind(q.until_ms);
                if let Some(e) = &q.endpoint {
                    qb.push(" AND l.endpoint = ").push_bind(e.as_str());
                }
                if let Some(m) = &q.model {
                    qb.push(format!(
                        " AND l.endpoint IN (SELECT DISTINCT endpoint FROM {table} WHERE model = "
                    ))
                    .push_bind(m.as_str())
                    .push(format!(" AND {col} >= "))
                    .push_bind(q.since_ms)
                    .push(format!(" AND {col} < "))
                    .push_bind(q.until_ms)
                    .push(")");
                }
                qb.push(" GROUP BY l.endpoint, l.dim, l.label");
                qb.build()
                    .fetch_all(p)
                    .await
                    .map_err(StoreError::query(OP))?
                    .iter()
                    .map(|row| {
                        Ok((
                            row.try_get(0).map_err(StoreError::query(OP))?,
                            row.try_get(1).map_err(StoreError::query(OP))?,
                            row.try_get(2).map_err(StoreError::query(OP))?,
                            row.try_get(3).map_err(StoreError::query(OP))?,
                        ))
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?
            });
            Ok::<_, StoreError>(labels)
        };
        // the sums and their labels in flight at once
        let (mut out, labels) = tokio::try_join!(sums, labels)?;
        let index: HashMap<String, usize> = out
            .iter()
            .enumerate()
            .map(|(i, e)| (e.endpoint.clone(), i))
            .collect();
        for (endpoint, dim, l, n) in labels {
            let Some(&i) = index.get(&endpoint) else {
                continue;
            };
            let map = match dim.as_str() {
                "error_kind" => &mut out[i].error_kinds,
                "finish_reason" => &mut out[i].finish_reasons,
                _ => continue,
            };
            *map.entry(l).or_default() += n;
        }
        out.sort_by(|a, b| (&a.model, &a.endpoint).cmp(&(&b.model, &b.endpoint)));
        Ok(out)
    }

    /// `endpoint`'s rollups per step of `step_ms` (smaller than a minute is one minute)
    /// over `[since_ms, until_ms)`, oldest first; steps without traffic are absent. Steps are
    /// read from the coarsest grain that divides them (a 12-hour step from the hours, a day
    /// from the days), and start on that grain's boundary: the first step starts at
    /// `since_ms` rounded down to it.
    pub async fn endpoint_rollup_series(
        &self,
        endpoint: &str,
        since_ms: i64,
        until_ms: i64,
        step_ms: i64,
    ) -> Result<Vec<RollupPoint>, StoreError> {
        const OP: &str = "reading an endpoint's rollup series";
        let step = step_ms.max(MINUTE_MS);
        let Grain { table, col, ms, .. } = GRAINS
            .into_iter()
            .find(|g| step % g.ms == 0)
            .unwrap_or(MINUTES);
        let since = since_ms.div_euclid(ms) * ms;
        on_pool!(&self.pool, |p| {
            let mut qb = QueryBuilder::new(format!("SELECT CAST(({col} - "));
            qb.push_bind(since)
                .push(") / ")
                .push_bind(step)
                .push(format!(
                    " AS BIGINT) AS step_no, {} FROM {table} WHERE endpoint = ",
                    sum_columns()
                ))
                .push_bind(text(endpoint))
                .push(format!(" AND {col} >= "))
                .push_bind(since)
                .push(format!(" AND {col} < "))
                .push_bind(until_ms)
                .push(" GROUP BY step_no ORDER BY step_no");
            qb.build()
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?
                .iter()
                .map(|row| {
                    let n: i64 = row.try_get(0).map_err(StoreError::query(OP))?;
                    Ok(RollupPoint {
                        start_ms: since + n * step,
                        totals: rollup_from_row(row, 1)?,
                    })
                })
                .collect()
        })
    }

    /// Deletes the rollups of the whole UTC days before `ts_ms` (their own retention, longer
    /// than raw rows'), in every grain and each key's hours (`key_hours`): the cut is rounded down to a day so that the days,
    /// hours and minutes kept always agree (a range over the cut sums the same whichever grain
    /// covers it). Returns how many minute rows were deleted.
    pub async fn delete_rollups_before(&self, ts_ms: i64) -> Result<u64, StoreError> {
        const OP: &str = "deleting old rollups";
        let cut = ts_ms.div_euclid(DAY_MS) * DAY_MS;
        let mut minutes = 0;
        // coarsest first: a reader never sees a day without its minutes
        for g in GRAINS {
            let Grain {
                table, labels, col, ..
            } = g;
            let (labels, rows) = (
                format!("DELETE FROM {labels} WHERE {col} < $1"),
                format!("DELETE FROM {table} WHERE {col} < $1"),
            );
            let (labels, rows) = (sql(self.backend(), &labels), sql(self.backend(), &rows));
            let n = on_pool!(&self.pool, |p| {
                sqlx::query(&labels)
                    .bind(cut)
                    .execute(p)
                    .await
                    .map_err(StoreError::query(OP))?;
                sqlx::query(&rows)
                    .bind(cut)
                    .execute(p)
                    .await
                    .map_err(StoreError::query(OP))?
                    .rows_affected()
            });
            minutes = n;
        }
        // each key's hours (`keys usage`) are kept as long as the rollups
        let keys = sql(self.backend(), "DELETE FROM key_hours WHERE hour_ms < $1");
        on_pool!(&self.pool, |p| {
            sqlx::query(&keys)
                .bind(cut)
                .execute(p)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected()
        });
        Ok(minutes)
    }
}
