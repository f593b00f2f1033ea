//! What a batch of inserted records adds to the rollups: each record summed once, into its
//! minute; the hours and days summed from those minutes (a minute lies in one hour, an hour in
//! one UTC day); each key's usage per hour (`key_hours`, what `keys usage` reads); the upsert
//! statements for every grain, run in the records' transaction.

use std::borrow::Cow;
use std::collections::HashMap;

use sqlx::{Database, QueryBuilder};

use super::{DAYS, Grain, HOURS, MAX_LABEL_CHARS, MINUTES, ROWS_PER_UPSERT, Rollup, value_columns};
use crate::probe_runs::text;
use crate::records::pow2_chunks;
use crate::{KeyUsage, RequestRecord};

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

/// The minute, hour and day rows and labelled counts that `rows` add, and each key's hours.
pub(crate) struct Deltas<'a> {
    grains: Vec<GrainDeltas<'a>>,
    /// (hour, the key's usage in it), sorted by key then hour.
    keys: Vec<(i64, KeyUsage)>,
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
        let mut keys: HashMap<(i64, i64), KeyUsage> = HashMap::new();
        let minutes = Sums::of(
            rows.into_iter().inspect(|r| {
                if let Some(key_id) = r.key_id {
                    let hour = r.ts_ms.div_euclid(HOURS.ms) * HOURS.ms;
                    keys.entry((key_id, hour))
                        .or_insert_with(|| KeyUsage {
                            key_id,
                            last_ms: r.ts_ms,
                            ..KeyUsage::default()
                        })
                        .add(r);
                }
            }),
            MINUTES.ms,
        );
        let hours = minutes.coarser(HOURS.ms);
        let days = hours.coarser(DAYS.ms);
        let mut keys: Vec<(i64, KeyUsage)> =
            keys.into_iter().map(|((_, hour), u)| (hour, u)).collect();
        keys.sort_by_key(|(hour, u)| (u.key_id, *hour));
        Deltas {
            grains: vec![
                minutes.into_grain(MINUTES),
                hours.into_grain(HOURS),
                days.into_grain(DAYS),
            ],
            keys,
        }
    }

    /// The upsert statements for the deltas, to run inside the records' transaction.
    pub(crate) fn statements<'q, DB>(&'q self) -> Vec<QueryBuilder<'q, DB>>
    where
        DB: Database,
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        f64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let mut out: Vec<QueryBuilder<'q, DB>> = self
            .grains
            .iter()
            .flat_map(GrainDeltas::statements)
            .collect();
        for chunk in pow2_chunks(&self.keys, ROWS_PER_UPSERT) {
            let mut qb = QueryBuilder::<DB>::new(
                "INSERT INTO key_hours (key_id, hour_ms, requests, failed, attempts, \
                 prompt_tokens, completion_tokens, cost_usd, last_ms) ",
            );
            qb.push_values(chunk, |mut b, (hour, u)| {
                b.push_bind(u.key_id)
                    .push_bind(*hour)
                    .push_bind(u.requests)
                    .push_bind(u.failed)
                    .push_bind(u.attempts)
                    .push_bind(u.prompt_tokens)
                    .push_bind(u.completion_tokens)
                    .push_bind(u.cost_usd)
                    .push_bind(u.last_ms);
            });
            qb.push(
                " ON CONFLICT (key_id, hour_ms) DO UPDATE SET \
                 requests = key_hours.requests + excluded.requests, \
                 failed = key_hours.failed + excluded.failed, \
                 attempts = key_hours.attempts + excluded.attempts, \
                 prompt_tokens = key_hours.prompt_tokens + excluded.prompt_tokens, \
                 completion_tokens = key_hours.completion_tokens + excluded.completion_tokens, \
                 cost_usd = key_hours.cost_usd + excluded.cost_usd, \
                 last_ms = CASE WHEN excluded.last_ms > key_hours.last_ms \
                 THEN excluded.last_ms ELSE key_hours.last_ms END",
            );
            out.push(qb);
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partitions::DAY_MS;
    use crate::rollups::HOUR_MS;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

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
