//! Alerts: what the detectors found about one endpoint, with a lifecycle (open →
//! acknowledged → resolved). At most one non-resolved alert exists per model, endpoint and
//! kind (a partial unique index on both backends): a detector that keeps finding the same
//! thing refreshes that alert's evidence and `last_seen_ms` instead of opening another;
//! once resolved, the next finding opens a new alert. Active alerts (open or acknowledged)
//! are what quality-aware routing reads.

use sqlx::Row;

use crate::probe_runs::{on_pool, sql, text};
use crate::{Store, StoreError};

/// Where an alert is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlertState {
    /// Found and not yet looked at.
    Open,
    /// An operator has seen it; still active (routing still honours it).
    Acknowledged,
    /// Over: resolved by an operator or automatically after a quiet period.
    Resolved,
}

impl AlertState {
    /// The stored (and displayed) name: "open" | "acknowledged" | "resolved".
    pub fn as_str(self) -> &'static str {
        match self {
            AlertState::Open => "open",
            AlertState::Acknowledged => "acknowledged",
            AlertState::Resolved => "resolved",
        }
    }

    /// Parses a stored or user-given name.
    pub fn parse(s: &str) -> Option<AlertState> {
        match s {
            "open" => Some(AlertState::Open),
            "acknowledged" | "ack" => Some(AlertState::Acknowledged),
            "resolved" => Some(AlertState::Resolved),
            _ => None,
        }
    }
}

/// Who resolved an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolver {
    /// A person: the CLI, the admin API or the dashboard ([`Store::resolve_alert`]).
    Operator,
    /// The detectors, after its quiet period passed without a new confirmation
    /// ([`Store::resolve_quiet_alerts`]).
    Quiet,
}

impl Resolver {
    /// The stored (and displayed) name: "operator" | "quiet".
    pub fn as_str(self) -> &'static str {
        match self {
            Resolver::Operator => "operator",
            Resolver::Quiet => "quiet",
        }
    }

    fn parse(s: &str) -> Option<Resolver> {
        match s {
            "operator" => Some(Resolver::Operator),
            "quiet" => Some(Resolver::Quiet),
            _ => None,
        }
    }
}

impl std::fmt::Display for AlertState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A detector's finding, to open an alert or refresh the active one.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAlert {
    /// The logical model.
    pub model: String,
    /// The endpoint label as the proxy names it.
    pub endpoint: String,
    /// What was found: "unfaithful", "changed", "passive", ...
    pub kind: String,
    /// One line for people.
    pub summary: String,
    /// Statistic, threshold, p-value, probe run ids, ... (a JSON object).
    pub evidence: serde_json::Value,
    /// When it was found, unix milliseconds.
    pub now_ms: i64,
}

/// A stored alert.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    /// Database id.
    pub id: i64,
    /// The logical model.
    pub model: String,
    /// The endpoint label.
    pub endpoint: String,
    /// What was found.
    pub kind: String,
    /// Lifecycle state.
    pub state: AlertState,
    /// When it was opened, unix milliseconds.
    pub opened_ms: i64,
    /// When it last changed (state or evidence).
    pub updated_ms: i64,
    /// When it was resolved.
    pub resolved_ms: Option<i64>,
    /// Who resolved it; None while it is active, and for an alert resolved before schema
    /// v11 (which recorded no resolver).
    pub resolved_by: Option<Resolver>,
    /// When a detector last confirmed it; auto-resolve counts quiet time from here.
    pub last_seen_ms: i64,
    /// One line for people (the latest finding's).
    pub summary: String,
    /// The latest finding's evidence.
    pub evidence: serde_json::Value,
}

impl Alert {
    /// The alert as JSON: the one shape the CLI's `--json`, the generic webhook and the API
    /// show.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "model": self.model,
            "endpoint": self.endpoint,
            "kind": self.kind,
            "state": self.state.as_str(),
            "opened_ms": self.opened_ms,
            "updated_ms": self.updated_ms,
            "resolved_ms": self.resolved_ms,
            "resolved_by": self.resolved_by.map(Resolver::as_str),
            "last_seen_ms": self.last_seen_ms,
            "summary": self.summary,
            "evidence": self.evidence,
        })
    }
}

/// Which alerts [`Store::alerts`] returns; `None` fields do not filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AlertQuery {
    /// Only alerts in this state.
    pub state: Option<AlertState>,
    /// Only active alerts (open or acknowledged); ignored when `state` is set.
    pub active_only: bool,
    /// Only alerts of this model.
    pub model: Option<String>,
    /// Only alerts of this endpoint.
    pub endpoint: Option<String>,
    /// At most this many (the newest).
    pub limit: u32,
}

/// Compare-and-set attempts on an alert's evidence before giving up (with a back-off of
/// `attempt` ms between them: about 0.2 s in all).
pub(crate) const CAS_ATTEMPTS: u64 = 20;

const COLUMNS: &str = "id, model, endpoint, kind, state, opened_ms, updated_ms, resolved_ms, \
                       last_seen_ms, summary, evidence, resolved_by";

impl Store {
    /// Opens an alert for `a`, or refreshes the active (open or acknowledged) alert of the
    /// same model, endpoint and kind with `a`'s summary and evidence. Returns the alert and
    /// whether it was newly opened.
    pub async fn upsert_alert(&self, a: &NewAlert) -> Result<(Alert, bool), StoreError> {
        match self.refresh_or_open(a, true).await? {
            Some(found) => Ok(found),
            None => Err(StoreError::InvalidInput(
                "an alert was neither refreshed nor opened".to_owned(),
            )),
        }
    }

    /// Refreshes the active alert of `a`'s model, endpoint and kind with `a`'s summary and
    /// evidence, as [`Store::upsert_alert`] does, but never opens one: None when there is no
    /// active alert. A confirmation that must not outlive an alert resolved meanwhile.
    pub async fn refresh_alert(&self, a: &NewAlert) -> Result<Option<Alert>, StoreError> {
        Ok(self
            .refresh_or_open(a, false)
            .await?
            .map(|(alert, _)| alert))
    }

    async fn refresh_or_open(
        &self,
        a: &NewAlert,
        open: bool,
    ) -> Result<Option<(Alert, bool)>, StoreError> {
        const OP: &str = "opening or refreshing an alert";
        if a.model.is_empty() || a.endpoint.is_empty() || a.kind.is_empty() {
            return Err(StoreError::InvalidInput(
                "an alert needs a model, an endpoint and a kind".to_owned(),
            ));
        }
        let to_text = |v: &serde_json::Value| {
            serde_json::to_string(v)
                .map_err(|e| StoreError::InvalidInput(format!("alert evidence: {e}")))
        };
        // A refresh is a compare-and-set on the active alert's evidence: it keeps the eval
        // verdicts attached to it (`evidence.evals`), and a verdict attached between our read
        // and our write makes the write miss and retry instead of being overwritten.
        let refresh = sql(
            self.backend(),
            &format!(
                "UPDATE alerts SET summary = $1, evidence = $2, last_seen_ms = $3, updated_ms = $3 \
                 WHERE id = $4 AND evidence = $5 AND state <> 'resolved' RETURNING {COLUMNS}"
            ),
        )
        .into_owned();
        let insert = sql(
            self.backend(),
            &format!(
                "INSERT INTO alerts (model, endpoint, kind, state, opened_ms, updated_ms, \
                 last_seen_ms, summary, evidence) VALUES ($1, $2, $3, 'open', $4, $4, $4, $5, $6) \
                 ON CONFLICT (model, endpoint, kind) WHERE state <> 'resolved' DO NOTHING \
                 RETURNING {COLUMNS}"
            ),
        )
        .into_owned();
        // Refresh the active alert if there is one; else insert; if a concurrent caller
        // changed the active alert or inserted one in between, start over.
        for attempt in 0..CAS_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(attempt)).await;
            }
            if let Some(active) = self.active_alert(&a.model, &a.endpoint, &a.kind).await? {
                let Some(old) = self.alert_evidence_text(active.id).await? else {
                    continue;
                };
                let stored: serde_json::Value =
                    serde_json::from_str(&old).unwrap_or(serde_json::Value::Null);
                let mut evidence = a.evidence.clone();
                if let Some(obj) = evidence.as_object_mut()
                    && !obj.contains_key("evals")
                    && let Some(evals) = stored.get("evals")
                {
                    obj.insert("evals".to_owned(), evals.clone());
                }
                let new = to_text(&evidence)?;
                let refreshed = on_pool!(&self.pool, |p| {
                    let row = sqlx::query(&refresh)
                        .bind(text(&a.summary))
                        .bind(text(&new))
                        .bind(a.now_ms)
                        .bind(active.id)
                        .bind(text(&old))
                        .fetch_optional(p)
                        .await
                        .map_err(StoreError::query(OP))?;
                    row.as_ref().map(alert_from_row).transpose()?
                });
                if let Some(alert) = refreshed {
                    return Ok(Some((alert, false)));
                }
                continue;
            }
            if !open {
                return Ok(None);
            }
            let evidence = to_text(&a.evidence)?;
            let inserted = on_pool!(&self.pool, |p| {
                let row = sqlx::query(&insert)
                    .bind(text(&a.model))
                    .bind(text(&a.endpoint))
                    .bind(text(&a.kind))
                    .bind(a.now_ms)
                    .bind(text(&a.summary))
                    .bind(text(&evidence))
                    .fetch_optional(p)
                    .await
                    .map_err(StoreError::query(OP))?;
                row.as_ref().map(alert_from_row).transpose()?
            });
            if let Some(alert) = inserted {
                return Ok(Some((alert, true)));
            }
        }
        Err(StoreError::InvalidInput(format!(
            "alert {}/{}/{} kept changing under concurrent writers",
            a.model, a.endpoint, a.kind
        )))
    }

    /// Alert `id`'s evidence exactly as stored (its text, not a re-serialisation): what a
    /// compare-and-set on the evidence compares against, since parsing and re-writing a
    /// float need not give back the same digits.
    pub(crate) async fn alert_evidence_text(&self, id: i64) -> Result<Option<String>, StoreError> {
        const OP: &str = "reading an alert's evidence";
        let stmt = sql(self.backend(), "SELECT evidence FROM alerts WHERE id = $1").into_owned();
        on_pool!(&self.pool, |p| {
            let row = sqlx::query(&stmt)
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(StoreError::query(OP))?;
            row.map(|r| r.try_get::<String, _>(0))
                .transpose()
                .map_err(StoreError::query(OP))
        })
    }

    /// The active alert of `model`, `endpoint` and `kind`, if any.
    /// The active (open or acknowledged) alert of `model`, `endpoint` and `kind`, if any.
    pub async fn active_alert(
        &self,
        model: &str,
        endpoint: &str,
        kind: &str,
    ) -> Result<Option<Alert>, StoreError> {
        const OP: &str = "reading an active alert";
        let stmt = sql(
            self.backend(),
            &format!(
                "SELECT {COLUMNS} FROM alerts WHERE model = $1 AND endpoint = $2 AND kind = $3 \
                 AND state <> 'resolved'"
            ),
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let row = sqlx::query(&stmt)
                .bind(text(model))
                .bind(text(endpoint))
                .bind(text(kind))
                .fetch_optional(p)
                .await
                .map_err(StoreError::query(OP))?;
            row.as_ref().map(alert_from_row).transpose()
        })
    }

    /// Alerts matching `q`, newest first (by id).
    pub async fn alerts(&self, q: &AlertQuery) -> Result<Vec<Alert>, StoreError> {
        const OP: &str = "reading alerts";
        on_pool!(&self.pool, |p| {
            let mut qb = sqlx::QueryBuilder::new(format!("SELECT {COLUMNS} FROM alerts WHERE 1=1"));
            if let Some(s) = q.state {
                qb.push(" AND state = ").push_bind(s.as_str());
            } else if q.active_only {
                qb.push(" AND state <> 'resolved'");
            }
            if let Some(m) = &q.model {
                qb.push(" AND model = ").push_bind(m.as_str());
            }
            if let Some(e) = &q.endpoint {
                qb.push(" AND endpoint = ").push_bind(e.as_str());
            }
            qb.push(" ORDER BY id DESC LIMIT ")
                .push_bind(i64::from(q.limit));
            let rows = qb
                .build()
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(alert_from_row).collect()
        })
    }

    /// The alert `id`, if it exists.
    pub async fn alert(&self, id: i64) -> Result<Option<Alert>, StoreError> {
        const OP: &str = "reading an alert";
        let stmt = sql(
            self.backend(),
            &format!("SELECT {COLUMNS} FROM alerts WHERE id = $1"),
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let row = sqlx::query(&stmt)
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(StoreError::query(OP))?;
            row.as_ref().map(alert_from_row).transpose()
        })
    }

    /// Acknowledges the open alert `id`. An alert already acknowledged or resolved is
    /// returned unchanged; None when there is no such alert.
    pub async fn ack_alert(&self, id: i64) -> Result<Option<Alert>, StoreError> {
        self.transition_alert(
            id,
            "acknowledging an alert",
            "SET state = 'acknowledged', updated_ms = $1 WHERE id = $2 AND state = 'open'",
        )
        .await
    }

    /// Resolves the active alert `id` as an operator ([`Resolver::Operator`]). An alert
    /// already resolved is returned unchanged; None when there is no such alert.
    pub async fn resolve_alert(&self, id: i64) -> Result<Option<Alert>, StoreError> {
        self.transition_alert(
            id,
            "resolving an alert",
            "SET state = 'resolved', updated_ms = $1, resolved_ms = $1, resolved_by = 'operator' \
             WHERE id = $2 AND state <> 'resolved'",
        )
        .await
    }

    /// Marks the active alert `id` as seen now, its summary and evidence unchanged, so that
    /// its quiet period starts again: a finding that another active alert holds (an eval's
    /// `eval_degraded` while the alert that opened the eval stays active). A resolved alert
    /// is returned unchanged (a confirmation never reopens); None when there is no such alert.
    pub async fn confirm_alert(&self, id: i64) -> Result<Option<Alert>, StoreError> {
        self.transition_alert(
            id,
            "confirming an alert",
            "SET last_seen_ms = $1 WHERE id = $2 AND state <> 'resolved' AND last_seen_ms < $1",
        )
        .await
    }

    /// When the newest alert of `model`, `endpoint` and `kind` that was resolved other than
    /// by its quiet period ([`Resolver::Quiet`]) was resolved: by an operator, or before
    /// schema v11 recorded who. The changed? detector's acceptance of a new behaviour.
    pub async fn last_operator_resolution(
        &self,
        model: &str,
        endpoint: &str,
        kind: &str,
    ) -> Result<Option<i64>, StoreError> {
        const OP: &str = "reading an endpoint's last resolution";
        let stmt = sql(
            self.backend(),
            "SELECT MAX(resolved_ms) FROM alerts WHERE model = $1 AND endpoint = $2 \
             AND kind = $3 AND state = 'resolved' \
             AND (resolved_by IS NULL OR resolved_by <> 'quiet')",
        )
        .into_owned();
        on_pool!(&self.pool, |p| {
            let row = sqlx::query(&stmt)
                .bind(text(model))
                .bind(text(endpoint))
                .bind(text(kind))
                .fetch_one(p)
                .await
                .map_err(StoreError::query(OP))?;
            row.try_get::<Option<i64>, _>(0)
                .map_err(StoreError::query(OP))
        })
    }

    /// One lifecycle step: `UPDATE alerts <set_where>` with `$1` = now and `$2` = id; when no
    /// row changed (already past that state, or no such alert) the alert as it stands.
    async fn transition_alert(
        &self,
        id: i64,
        op: &'static str,
        set_where: &str,
    ) -> Result<Option<Alert>, StoreError> {
        let stmt = sql(
            self.backend(),
            &format!("UPDATE alerts {set_where} RETURNING {COLUMNS}"),
        )
        .into_owned();
        let now = crate::now_ms();
        let changed = on_pool!(&self.pool, |p| {
            let row = sqlx::query(&stmt)
                .bind(now)
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(StoreError::query(op))?;
            row.as_ref().map(alert_from_row).transpose()?
        });
        match changed {
            Some(a) => Ok(Some(a)),
            None => self.alert(id).await,
        }
    }

    /// Auto-resolve: resolves every active alert that no detector has confirmed since
    /// `quiet_before_ms` (its `last_seen_ms` is earlier) and returns them, resolved
    /// ([`Resolver::Quiet`]).
    pub async fn resolve_quiet_alerts(
        &self,
        quiet_before_ms: i64,
    ) -> Result<Vec<Alert>, StoreError> {
        const OP: &str = "auto-resolving quiet alerts";
        let stmt = sql(
            self.backend(),
            &format!(
                "UPDATE alerts SET state = 'resolved', updated_ms = $1, resolved_ms = $1, \
                 resolved_by = 'quiet' WHERE state <> 'resolved' AND last_seen_ms < $2 \
                 RETURNING {COLUMNS}"
            ),
        )
        .into_owned();
        let now = crate::now_ms();
        let mut out: Vec<Alert> = on_pool!(&self.pool, |p| {
            let rows = sqlx::query(&stmt)
                .bind(now)
                .bind(quiet_before_ms)
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter()
                .map(alert_from_row)
                .collect::<Result<Vec<_>, _>>()?
        });
        out.sort_by_key(|a| a.id);
        Ok(out)
    }

    /// Every active (open or acknowledged) alert, oldest first: what routing honours.
    pub async fn active_alerts(&self) -> Result<Vec<Alert>, StoreError> {
        const OP: &str = "reading active alerts";
        let stmt = format!("SELECT {COLUMNS} FROM alerts WHERE state <> 'resolved' ORDER BY id");
        on_pool!(&self.pool, |p| {
            let rows = sqlx::query(&stmt)
                .fetch_all(p)
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(alert_from_row).collect()
        })
    }
}

fn alert_from_row<R>(row: &R) -> Result<Alert, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    const OP: &str = "decoding an alert";
    let state: String = row.try_get(4).map_err(StoreError::query(OP))?;
    let state = AlertState::parse(&state).ok_or_else(|| StoreError::Corrupt {
        column: "alerts.state",
        detail: format!("{state:?} is not an alert state"),
    })?;
    let evidence: String = row.try_get(10).map_err(StoreError::query(OP))?;
    let evidence = serde_json::from_str(&evidence).map_err(|e| StoreError::Corrupt {
        column: "alerts.evidence",
        detail: e.to_string(),
    })?;
    let resolved_by: Option<String> = row.try_get(11).map_err(StoreError::query(OP))?;
    let resolved_by = resolved_by
        .map(|s| {
            Resolver::parse(&s).ok_or_else(|| StoreError::Corrupt {
                column: "alerts.resolved_by",
                detail: format!("{s:?} is not a resolver"),
            })
        })
        .transpose()?;
    Ok(Alert {
        id: row.try_get(0).map_err(StoreError::query(OP))?,
        model: row.try_get(1).map_err(StoreError::query(OP))?,
        endpoint: row.try_get(2).map_err(StoreError::query(OP))?,
        kind: row.try_get(3).map_err(StoreError::query(OP))?,
        state,
        opened_ms: row.try_get(5).map_err(StoreError::query(OP))?,
        updated_ms: row.try_get(6).map_err(StoreError::query(OP))?,
        resolved_ms: row.try_get(7).map_err(StoreError::query(OP))?,
        resolved_by,
        last_seen_ms: row.try_get(8).map_err(StoreError::query(OP))?,
        summary: row.try_get(9).map_err(StoreError::query(OP))?,
        evidence,
    })
}
