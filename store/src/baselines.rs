//! The changed? detector's fixed baselines: per endpoint, probe kind and statistic, the
//! values of the first `cusum_baseline_rounds` runs (or of the first after the endpoint's last
//! accepted change) that its CUSUM chart compares every newer run with. Kept apart from
//! `probe_runs`, so the baseline stays what it was however many runs follow (the detector
//! reads only the newest `history_runs`) and when retention deletes the runs it came from.

use sqlx::Row;

use crate::probe_runs::{on_pool, sql, text};
use crate::{Store, StoreError};

/// One statistic's baseline of one endpoint's probe kind.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProbeBaseline {
    /// The logical model.
    pub model: String,
    /// The endpoint label.
    pub endpoint: String,
    /// The probe kind.
    pub kind: String,
    /// The run-stats key (`kl_mean`, `top1_same`, ...).
    pub statistic: String,
    /// The accepted change (a resolved "changed" alert, unix milliseconds) whose later runs
    /// the baseline is made of; `None`: the endpoint's first runs.
    pub after_ms: Option<i64>,
    /// The baseline runs, oldest first.
    pub runs: Vec<BaselineRun>,
    /// When it was stored, unix milliseconds.
    pub created_ms: i64,
}

/// One run of a baseline: which run, when it started, its value of the statistic.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BaselineRun {
    /// The probe run's id (the run itself may since have been deleted by retention).
    pub id: i64,
    /// When the run started, unix milliseconds.
    pub started_ms: i64,
    /// The run's value of the statistic (finite).
    pub value: f64,
}

impl Store {
    /// The stored baselines of `endpoint`'s `kind` runs for `model`, by statistic.
    pub async fn probe_baselines(
        &self,
        model: &str,
        endpoint: &str,
        kind: &str,
    ) -> Result<Vec<ProbeBaseline>, StoreError> {
        const OP: &str = "reading probe baselines";
        let stmt = sql(
            self.backend(),
            "SELECT statistic, after_ms, runs, created_ms FROM probe_baselines \
             WHERE model = $1 AND endpoint = $2 AND kind = $3 ORDER BY statistic",
        );
        let rows = on_pool!(&self.pool, |p| {
            let rows = sqlx::query(&stmt)
                .bind(text(model))
                .bind(text(endpoint))
                .bind(text(kind))
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter()
                .map(|r| {
                    Ok((
                        r.try_get::<String, _>(0).map_err(StoreError::query(OP))?,
                        r.try_get::<Option<i64>, _>(1)
                            .map_err(StoreError::query(OP))?,
                        r.try_get::<String, _>(2).map_err(StoreError::query(OP))?,
                        r.try_get::<i64, _>(3).map_err(StoreError::query(OP))?,
                    ))
                })
                .collect::<Result<Vec<_>, StoreError>>()?
        });
        rows.into_iter()
            .map(|(statistic, after_ms, runs, created_ms)| {
                Ok(ProbeBaseline {
                    model: model.to_owned(),
                    endpoint: endpoint.to_owned(),
                    kind: kind.to_owned(),
                    statistic,
                    after_ms,
                    runs: decode_runs(&runs)?,
                    created_ms,
                })
            })
            .collect()
    }

    /// Stores `b`, replacing the baseline of the same model, endpoint, kind and statistic.
    pub async fn put_probe_baseline(&self, b: &ProbeBaseline) -> Result<(), StoreError> {
        const OP: &str = "storing a probe baseline";
        if b.model.is_empty()
            || b.endpoint.is_empty()
            || b.kind.is_empty()
            || b.statistic.is_empty()
        {
            return Err(StoreError::InvalidInput(
                "a probe baseline needs a model, an endpoint, a kind and a statistic".to_owned(),
            ));
        }
        if let Some(r) = b.runs.iter().find(|r| !r.value.is_finite()) {
            return Err(StoreError::InvalidInput(format!(
                "probe baseline value of run {} is not finite: {}",
                r.id, r.value
            )));
        }
        let runs = serde_json::Value::Array(
            b.runs
                .iter()
                .map(|r| serde_json::json!([r.id, r.started_ms, r.value]))
                .collect(),
        )
        .to_string();
        let stmt = sql(
            self.backend(),
            "INSERT INTO probe_baselines (model, endpoint, kind, statistic, after_ms, runs, \
             created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (model, endpoint, kind, statistic) DO UPDATE SET \
             after_ms = excluded.after_ms, runs = excluded.runs, created_ms = excluded.created_ms",
        );
        on_pool!(&self.pool, |p| sqlx::query(&stmt)
            .bind(text(&b.model))
            .bind(text(&b.endpoint))
            .bind(text(&b.kind))
            .bind(text(&b.statistic))
            .bind(b.after_ms)
            .bind(runs.as_str())
            .bind(b.created_ms)
            .execute(p)
            .await
            .map_err(StoreError::query(OP))
            .map(|_| ()))
    }
}

fn decode_runs(s: &str) -> Result<Vec<BaselineRun>, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        column: "probe_baselines.runs",
        detail,
    };
    let rows: Vec<(i64, i64, f64)> = serde_json::from_str(s).map_err(|e| corrupt(e.to_string()))?;
    Ok(rows
        .into_iter()
        .map(|(id, started_ms, value)| BaselineRun {
            id,
            started_ms,
            value,
        })
        .collect())
}
