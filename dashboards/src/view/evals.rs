//! The overview's "evals" cell: each endpoint's latest eval job per suite, read from the
//! store's job queue, with its verdict and a one-line summary (pass rates and p-value).
//! A "degraded" verdict also answers "still works?" (see `view::row`). And one alert's
//! detail: the jobs that answer it and, for a verdict's alert, the alerts that hold it.

use samewise_store::EvalJob;
use serde::Serialize;

use super::AlertView;
use crate::{DashError, Dashboards};

/// One eval job as a row shows it: the endpoint's latest job of a suite.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalView {
    /// Job id.
    pub id: i64,
    /// The suite.
    pub suite: String,
    /// "queued" | "running" | "succeeded" | "failed" | "cancelled".
    pub state: &'static str,
    /// "degraded" | "equivalent" | "inconclusive" | "n/a", once it finished.
    pub verdict: Option<String>,
    /// The suspect's and the baseline's pass rates and the paired p-value, in words.
    pub summary: Option<String>,
    /// The alert that opened it.
    pub alert_id: Option<i64>,
    /// When it was opened.
    pub created_ms: i64,
}

impl EvalView {
    /// The view of stored job `j`.
    pub fn of(j: &EvalJob) -> EvalView {
        let v = j.verdict.as_ref();
        let verdict = v.and_then(|v| v["verdict"].as_str()).map(str::to_owned);
        let rate = |side: &str| v.and_then(|v| v[side]["rate"].as_f64());
        let summary = match (rate("suspect"), rate("baseline")) {
            (Some(s), Some(b)) => Some(format!(
                "{:.0}% vs baseline {:.0}% on {} items{}",
                s * 100.0,
                b * 100.0,
                v.and_then(|v| v["items"].as_u64()).unwrap_or(0),
                v.and_then(|v| v["p_value"].as_f64())
                    .map(|p| {
                        if p < 0.001 {
                            format!(", p = {p:.1e}")
                        } else {
                            format!(", p = {p:.3}")
                        }
                    })
                    .unwrap_or_default()
            )),
            _ => j.error.clone(),
        };
        EvalView {
            id: j.id,
            suite: j.suite.clone(),
            state: j.state.as_str(),
            verdict,
            summary,
            alert_id: j.alert_id,
            created_ms: j.created_ms,
        }
    }
}

/// The "evals" cell: the endpoint's latest job per suite, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evals {
    /// The jobs.
    pub jobs: Vec<EvalView>,
    /// What the cell says when there is no job.
    pub note: &'static str,
}

impl Evals {
    /// The latest job per suite of `endpoint` of `model` among `jobs` (newest first).
    pub(crate) fn of(jobs: &[EvalJob], model: &str, endpoint: &str) -> Evals {
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for j in jobs
            .iter()
            .filter(|j| j.model == model && j.endpoint == endpoint)
        {
            if !seen.contains(&j.suite.as_str()) {
                seen.push(j.suite.as_str());
                out.push(EvalView::of(j));
            }
        }
        Evals {
            note: if out.is_empty() { "no evals yet" } else { "" },
            jobs: out,
        }
    }

    /// The newest finished job whose verdict is "degraded", if any.
    pub(crate) fn degraded(&self) -> Option<&EvalView> {
        self.jobs
            .iter()
            .find(|j| j.verdict.as_deref() == Some("degraded"))
    }
}

/// An alert that holds a verdict's `eval_degraded` alert.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Holder {
    /// Its id.
    pub id: i64,
    /// Its kind.
    pub kind: String,
}

/// One alert as its page and `GET /api/v1/alerts/{id}` show it: the alert, the eval jobs that
/// answer it (its own, and its endpoint's of the same incident, as the alert watcher counts
/// them; newest first) and, for an active `eval_degraded` alert, the active alerts that hold it
/// (empty: none, and it is resolved after its quiet period).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlertDetail {
    /// The alert.
    #[serde(flatten)]
    pub alert: AlertView,
    /// The jobs that answer it.
    pub eval_jobs: Vec<EvalView>,
    /// None: not an active verdict alert.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<Vec<Holder>>,
}

/// Alert `id`'s detail; `NotFound` when there is none.
pub async fn alert_detail(d: &Dashboards, id: i64) -> Result<AlertDetail, DashError> {
    let store = &d.inner.store;
    let a = store
        .alert(id)
        .await?
        .ok_or_else(|| DashError::NotFound(format!("no alert {id}")))?;
    let cooldown = d
        .inner
        .evals
        .as_ref()
        .map_or(samewise_evals::DEFAULT_COOLDOWN, |o| o.config().cooldown);
    let answering = samewise_evals::jobs_answering(store, &a, cooldown).await?;
    let held_by = samewise_evals::holders(store, &a, cooldown)
        .await?
        .map(|holders| {
            holders
                .into_iter()
                .map(|h| Holder {
                    id: h.id,
                    kind: h.kind,
                })
                .collect()
        });
    Ok(AlertDetail {
        alert: AlertView::of(&a),
        eval_jobs: answering.iter().map(EvalView::of).collect(),
        held_by,
    })
}

/// A job as `GET /api/v1/evals` lists it (and `POST` answers it): the cell's view with its
/// endpoint, baseline, model, progress and cost.
pub fn listed(j: &EvalJob) -> serde_json::Value {
    let mut v = serde_json::to_value(EvalView::of(j)).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        for (k, x) in [
            ("model", serde_json::json!(j.model)),
            ("endpoint", serde_json::json!(j.endpoint)),
            ("baseline", serde_json::json!(j.baseline)),
            ("items_total", serde_json::json!(j.items_total)),
            ("tokens", serde_json::json!(j.tokens)),
            ("started_ms", serde_json::json!(j.started_ms)),
            ("finished_ms", serde_json::json!(j.finished_ms)),
        ] {
            o.insert(k.to_owned(), x);
        }
    }
    v
}

/// One side's result of one item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ItemSide {
    /// Whether it passed its check.
    pub passed: bool,
    /// The failure bucket, when it failed.
    pub error_type: Option<String>,
    /// The request, the answer and the check (as the worker stored them).
    pub record: serde_json::Value,
}

/// One item on both targets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ItemView {
    /// The item's id in the suite.
    pub item: String,
    /// The suspect's result, once written.
    pub suspect: Option<ItemSide>,
    /// The baseline's result, once written.
    pub baseline: Option<ItemSide>,
}

impl ItemView {
    /// The suspect failed where the baseline passed (the items a verdict of "degraded"
    /// rests on).
    pub fn regressed(&self) -> bool {
        self.suspect.as_ref().is_some_and(|s| !s.passed)
            && self.baseline.as_ref().is_some_and(|b| b.passed)
    }
}

/// An eval job down to its items: what the job page and `/api/v1/evals/{id}` show.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobDetail {
    /// The job as the overview cell shows it.
    pub job: EvalView,
    /// The logical model.
    pub model: String,
    /// The suspect endpoint.
    pub endpoint: String,
    /// "reference" or a peer endpoint.
    pub baseline: String,
    /// When a worker first claimed it, and when it finished.
    pub started_ms: Option<i64>,
    /// When it finished.
    pub finished_ms: Option<i64>,
    /// Tokens spent (both targets).
    pub tokens: i64,
    /// The verdict document, once finished.
    pub verdict: Option<serde_json::Value>,
    /// Every item, those where the suspect failed and the baseline passed first.
    pub items: Vec<ItemView>,
}

/// Job `id` with its per-item results.
pub async fn job(d: &crate::Dashboards, id: i64) -> Result<JobDetail, crate::DashError> {
    let store = &d.inner.store;
    let j = store
        .eval_job(id)
        .await?
        .ok_or_else(|| crate::DashError::NotFound(format!("no eval job {id}")))?;
    let mut items: Vec<ItemView> = Vec::new();
    for r in store.eval_results(id).await? {
        let side = ItemSide {
            passed: r.passed,
            error_type: r.error_type.clone(),
            record: r.record.clone(),
        };
        let i = match items.iter().position(|i| i.item == r.item) {
            Some(i) => i,
            None => {
                items.push(ItemView {
                    item: r.item.clone(),
                    suspect: None,
                    baseline: None,
                });
                items.len() - 1
            }
        };
        match r.target.as_str() {
            "suspect" => items[i].suspect = Some(side),
            _ => items[i].baseline = Some(side),
        }
    }
    // regressions first, then the rest in write order (a stable sort keeps it)
    items.sort_by_key(|i| !i.regressed());
    Ok(JobDetail {
        job: EvalView::of(&j),
        model: j.model,
        endpoint: j.endpoint,
        baseline: j.baseline,
        started_ms: j.started_ms,
        finished_ms: j.finished_ms,
        tokens: j.tokens,
        verdict: j.verdict,
        items,
    })
}
