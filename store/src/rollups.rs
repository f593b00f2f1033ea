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

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use sqlx::{Database, QueryBuilder, Row};

use crate::RequestRecord;
// one UTC day, the coarsest grain (a 30-day range reads its whole days): the partitions' day
use crate::partitions::DAY_MS;
use crate::probe_runs::{on_pool, sql, text};
use crate::records::pow2_chunks;
use crate::{Store, StoreError};

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
    /// Attempts with an error kind.
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
    /// Attempts per TTFT bucket ([`TTFT_BOUNDS_MS`]).
    pub ttft_hist: [i64; BUCKETS],
    /// Attempts per TPOT bucket ([`TPOT_BOUNDS_MS`]).
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
        self.errors += i64::from(r.error_kind.is_some());
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

/// A label as stored: at most [`MAX_LABEL_CHARS`] characters, NUL replaced (borrowed when
/// that changes nothing).
fn label(s: &str) -> Cow<'_, str> {
    match text(s) {
        Cow::Borrowed(b) => match b.char_indices().nth(MAX_LABEL_CHARS) {
            None => Cow::Borrowed(b),
            Some((end, _)) => Cow::Borrowed(&b[..end]),
        },
        Cow::Owned(o) => Cow::Owned(o.chars().take(MAX_LABEL_CHARS).collect()),
    }
}

/// The minute, hour and day rows and labelled counts that `rows` add.
pub(crate) struct Deltas<'a> {
    grains: Vec<GrainDeltas<'a>>,
}

/// The rows one grain's tables get: (endpoint, start, model, sums) and (endpoint, start,
/// dimension, label, count), as stored, borrowed from the records where storing changes nothing.
struct GrainDeltas<'a> {
    grain: Grain,
    rows: Vec<(Cow<'a, str>, i64, Cow<'a, str>, Rollup)>,
    labels: Vec<(LabelKey<'a>, i64)>,
}

/// A labelled count's key as stored: endpoint, start, dimension, label.
type LabelKey<'a> = (Cow<'a, str>, i64, &'static str, Cow<'a, str>);

impl<'a> Deltas<'a> {
    /// Sums `rows` (only those with an endpoint) per endpoint and minute, hour and day. Each
    /// record is summed once, into its minute; the hours are sums of those minutes and the days
    /// of those hours (a minute lies in one hour, an hour in one UTC day), so a record is
    /// hashed once, not once per grain: in `writer_bench` the rollups' share of the writer's
    /// instructions fell from 25% to ~9% (README, "Store writer").
    pub(crate) fn of(rows: impl IntoIterator<Item = &'a RequestRecord>) -> Deltas<'a> {
        let minutes = Sums::of(rows, MINUTES.ms);
        let hours = minutes.coarser(HOURS.ms);
        let days = hours.coarser(DAYS.ms);
        Deltas {
            grains: vec![
                minutes.into_grain(MINUTES),
                hours.into_grain(HOURS),
                days.into_grain(DAYS),
            ],
        }
    }

    /// The upsert statements for the deltas, to run inside the records' transaction.
    pub(crate) fn statements<'q, DB>(&'q self) -> Vec<QueryBuilder<'q, DB>>
    where
        DB: Database,
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        self.grains
            .iter()
            .flat_map(GrainDeltas::statements)
            .collect()
    }
}

/// One grain's sums while they are gathered, keyed as stored (NUL replaced, labels cut): two
/// strings that store alike make one row, or one upsert would touch a row twice. `text` and
/// `label` borrow from the record unless they change something, so a record costs no copy.
struct Sums<'a> {
    rows: RowSums<'a>,
    labels: HashMap<LabelKey<'a>, i64>,
}

/// (endpoint, start) → (the position of its first record, that record's model, sums): a row's
/// model is its first record's, whichever grain.
type RowSums<'a> = HashMap<(Cow<'a, str>, i64), (usize, Cow<'a, str>, Rollup)>;

impl<'a> Sums<'a> {
    /// The records summed per endpoint and start of their `ms`-long step.
    fn of(rows: impl IntoIterator<Item = &'a RequestRecord>, ms: i64) -> Sums<'a> {
        let mut sums = Sums {
            rows: HashMap::new(),
            labels: HashMap::new(),
        };
        for (i, r) in rows.into_iter().enumerate() {
            let Some(endpoint) = r.endpoint.as_deref() else {
                continue;
            };
            let endpoint = text(endpoint);
            let at = r.ts_ms.div_euclid(ms) * ms;
            sums.rows
                .entry((endpoint.clone(), at))
                .or_insert_with(|| (i, text(&r.model), Rollup::default()))
                .2
                .add(r);
            if let Some(k) = &r.error_kind {
                *sums
                    .labels
                    .entry((endpoint.clone(), at, "error_kind", label(k)))
                    .or_default() += 1;
            }
            if let Some(f) = &r.finish_reason {
                *sums
                    .labels
                    .entry((endpoint, at, "finish_reason", label(f)))
                    .or_default() += 1;
            }
        }
        sums
    }

    /// These sums summed again per `ms`-long step, a multiple of their own step.
    fn coarser(&self, ms: i64) -> Sums<'a> {
        let mut rows: RowSums<'a> = HashMap::with_capacity(self.rows.len());
        for ((endpoint, at), (first, model, r)) in &self.rows {
            let row = rows
                .entry((endpoint.clone(), at.div_euclid(ms) * ms))
                .or_insert_with(|| (*first, model.clone(), Rollup::default()));
            if *first < row.0 {
                row.0 = *first;
                row.1 = model.clone();
            }
            row.2.merge(r);
        }
        let mut labels: HashMap<LabelKey<'a>, i64> = HashMap::with_capacity(self.labels.len());
        for ((endpoint, at, dim, l), n) in &self.labels {
            *labels
                .entry((endpoint.clone(), at.div_euclid(ms) * ms, *dim, l.clone()))
                .or_default() += n;
        }
        Sums { rows, labels }
    }

    /// The rows to upsert into `grain`'s tables, in a fixed order, so concurrent writers take
    /// row locks in the same order.
    fn into_grain(self, grain: Grain) -> GrainDeltas<'a> {
        let mut rows: Vec<_> = self
            .rows
            .into_iter()
            .map(|((e, at), (_, model, r))| (e, at, model, r))
            .collect();
        rows.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        let mut labels: Vec<_> = self.labels.into_iter().collect();
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        GrainDeltas {
            grain,
            rows,
            labels,
        }
    }
}

impl<'a> GrainDeltas<'a> {
    fn statements<'q, DB>(&'q self) -> Vec<QueryBuilder<'q, DB>>
    where
        DB: Database,
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let Grain {
            table, labels, col, ..
        } = self.grain;
        let mut out = Vec::new();
        for chunk in pow2_chunks(&self.rows, ROWS_PER_UPSERT) {
            let mut qb =
                QueryBuilder::<DB>::new(format!("INSERT INTO {table} (endpoint, {col}, model, "));
            qb.push(value_columns().join(", "));
            qb.push(") ");
            qb.push_values(chunk, |mut b, (endpoint, at, model, r)| {
                b.push_bind(endpoint.as_ref())
                    .push_bind(*at)
                    .push_bind(model.as_ref());
                for v in r
                    .scalars()
                    .into_iter()
                    .chain(r.ttft_hist)
                    .chain(r.tpot_hist)
                {
                    b.push_bind(v);
                }
            });
            qb.push(format!(" ON CONFLICT (endpoint, {col}) DO UPDATE SET "));
            let sets: Vec<String> = value_columns()
                .iter()
                .map(|c| format!("{c} = {table}.{c} + excluded.{c}"))
                .collect();
            qb.push(sets.join(", "));
            out.push(qb);
        }
        for chunk in pow2_chunks(&self.labels, ROWS_PER_UPSERT) {
            let mut qb = QueryBuilder::<DB>::new(format!(
                "INSERT INTO {labels} (endpoint, {col}, dim, label, n) "
            ));
            qb.push_values(chunk, |mut b, ((endpoint, at, dim, l), n)| {
                b.push_bind(endpoint.as_ref())
                    .push_bind(*at)
                    .push_bind(*dim)
                    .push_bind(l.as_ref())
                    .push_bind(*n);
            });
            qb.push(format!(
                " ON CONFLICT (endpoint, {col}, dim, label) DO UPDATE SET n = {labels}.n + excluded.n"
            ));
            out.push(qb);
        }
        out
    }
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
    /// than raw rows'), in every grain: the cut is rounded down to a day so that the days,
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
        Ok(minutes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    type Expected = (
        BTreeMap<(String, i64), (String, Rollup)>,
        BTreeMap<(String, i64, String, String), i64>,
    );

    /// One grain summed straight from the records, each record into its own step, the model
    /// the first record's: what the minutes summed into hours and days must equal.
    fn direct(grain: Grain, rows: &[RequestRecord]) -> Expected {
        let (mut sums, mut labels) = (BTreeMap::new(), BTreeMap::new());
        for r in rows {
            let Some(e) = &r.endpoint else { continue };
            let e = text(e).into_owned();
            let at = r.ts_ms.div_euclid(grain.ms) * grain.ms;
            sums.entry((e.clone(), at))
                .or_insert_with(|| (text(&r.model).into_owned(), Rollup::default()))
                .1
                .add(r);
            for (dim, l) in [
                ("error_kind", &r.error_kind),
                ("finish_reason", &r.finish_reason),
            ] {
                if let Some(l) = l {
                    let key = (e.clone(), at, dim.to_owned(), label(l).into_owned());
                    *labels.entry(key).or_default() += 1;
                }
            }
        }
        (sums, labels)
    }

    fn gathered(g: &GrainDeltas<'_>) -> Expected {
        let sums = g
            .rows
            .iter()
            .map(|(e, at, m, r)| ((e.to_string(), *at), (m.to_string(), r.clone())))
            .collect();
        let labels = g
            .labels
            .iter()
            .map(|((e, at, d, l), n)| ((e.to_string(), *at, (*d).to_owned(), l.to_string()), *n))
            .collect();
        (sums, labels)
    }

    #[test]
    fn hours_and_days_from_minutes_equal_sums_of_the_records() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        // around a day boundary, so steps of every grain split; two models on one endpoint
        let t0 = 20_000 * DAY_MS - 2 * HOUR_MS;
        let rows: Vec<RequestRecord> = (0..2_000)
            .map(|i| {
                let e = rng.random_range(0..5u32);
                RequestRecord {
                    request_id: format!("r{i}"),
                    attempt: 1,
                    ts_ms: t0 + rng.random_range(0..4 * HOUR_MS),
                    model: if e == 0 && rng.random_bool(0.5) {
                        "m2"
                    } else {
                        "m"
                    }
                    .to_owned(),
                    endpoint: (e < 4).then(|| format!("p/e{e}{}", if e == 3 { "\0" } else { "" })),
                    error_kind: rng.random_bool(0.2).then(|| "upstream_5xx".to_owned()),
                    finish_reason: Some(["stop", "length", "tool_calls"][i % 3].to_owned()),
                    ttft_ms: Some(rng.random_range(1.0..5_000.0)),
                    tpot_ms: rng.random_bool(0.5).then(|| rng.random_range(1.0..200.0)),
                    prompt_tokens: Some(rng.random_range(1..1_000)),
                    completion_tokens: Some(rng.random_range(1..1_000)),
                    tool_calls: rng.random_range(0..3),
                    ..RequestRecord::default()
                }
            })
            .collect();
        let deltas = Deltas::of(&rows);
        let grains: Vec<i64> = deltas.grains.iter().map(|g| g.grain.ms).collect();
        assert_eq!(grains, [MINUTES.ms, HOURS.ms, DAYS.ms]);
        for g in &deltas.grains {
            let want = direct(g.grain, &rows);
            assert!(want.0.len() > 1 && !want.1.is_empty());
            assert_eq!(gathered(g), want, "grain of {} ms", g.grain.ms);
            // sorted by (endpoint, start), as upserts take their row locks
            assert!(
                g.rows
                    .windows(2)
                    .all(|w| (&w[0].0, w[0].1) < (&w[1].0, w[1].1))
            );
        }
    }
}
