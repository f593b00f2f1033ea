//! The overview's "evals" cell: each endpoint's latest eval job per suite, read from the
//! store's job queue, with its verdict and a one-line summary (pass rates and p-value).
//! A "degraded" verdict also answers "still works?" (see `view::row`).

use samewise_store::EvalJob;
use serde::Serialize;

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
    fn of(j: &EvalJob) -> EvalView {
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
