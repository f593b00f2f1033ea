//! What the pages and the JSON API show, computed once from the store (rollups, probe runs,
//! alerts) and the gateway's live routing state, so that a page and its API answer always
//! agree. Nothing here renders; everything here is `Serialize`.
//!
//! Verdicts per endpoint:
//! - changed? — "yes" while a `changed` alert is active, "no" when logprob or fingerprint
//!   probes ran in the range without one, else "unknown";
//! - faithful? — "no" while an `unfaithful` alert is active (its evidence carries the
//!   ladder's "≈ N-bit"), "yes" when logprob probes ran without one, else "unknown" (saying so
//!   where only fingerprint probes, which never compare with the weights, ran);
//! - still works? — "no" when the newest probe run failed or at least half of the range's
//!   attempts (10 or more) erred, "yes" when either shows it working, else "unknown".

use std::collections::BTreeMap;

use samewise_store::{Alert, AlertQuery, AlertState, EndpointRollup, ProbeRun, ProbeRunQuery};
use samewise_store::{Rollup, RollupQuery};
use serde::Serialize;
use serde_json::Value;

use crate::stats::{self, Goodput, Rate};
use crate::{Band, DashError, Dashboards, Routing};

/// Logprob probe kinds, whose `kl_mean` the sparkline and the ladder bands show.
pub const LOGPROB_KINDS: [&str; 2] = ["prompt_logprobs", "completion_logprobs"];
/// The probe kind that compares an endpoint with its own past only (changed? without a
/// reference).
pub const FINGERPRINT_KIND: &str = "fingerprint";
/// The probe statistics charted on the endpoint page, when present in a run's stats.
pub const CHARTED_STATS: [&str; 12] = [
    "kl_mean",
    "kl_p99",
    "top1_same",
    "topk_overlap",
    "p_value",
    "trigger_f1",
    "schema_accuracy",
    "reference_schema_accuracy",
    "mismatch_rate",
    "own_logprob_mean",
    "own_top1_logprob_mean",
    "own_chat_logprob_mean",
];
/// Most probe runs read for one chart.
const MAX_RUNS: u32 = 5_000;
/// Eval jobs read per overview (newest first); older endpoints' jobs fall off the cell.
const EVAL_JOBS_READ: u32 = 500;

pub mod evals;

pub use evals::Evals;

/// A time range, `[since_ms, until_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Range {
    /// Start, unix milliseconds.
    pub since_ms: i64,
    /// End, unix milliseconds.
    pub until_ms: i64,
    /// The name it was asked by ("24h").
    pub name: &'static str,
}

/// The ranges offered, by name.
pub const RANGES: [(&str, i64); 7] = [
    ("5m", 300_000),
    ("15m", 900_000),
    ("1h", 3_600_000),
    ("6h", 6 * 3_600_000),
    ("24h", 24 * 3_600_000),
    ("7d", 7 * 86_400_000),
    ("30d", 30 * 86_400_000),
];

impl Range {
    /// The range `name` ("5m" .. "30d"; None = "24h") ending now.
    pub fn parse(name: Option<&str>) -> Result<Range, DashError> {
        let want = name.unwrap_or("24h");
        let (name, len) = RANGES
            .iter()
            .find(|(n, _)| *n == want)
            .copied()
            .ok_or_else(|| {
                let names: Vec<&str> = RANGES.iter().map(|(n, _)| *n).collect();
                DashError::BadRequest(format!(
                    "range must be one of {} (got {want:?})",
                    names.join(", ")
                ))
            })?;
        let now = samewise_store::now_ms();
        Ok(Range {
            since_ms: now - len,
            until_ms: now + 1,
            name,
        })
    }

    /// A step giving about 60 points (a whole number of minutes).
    pub fn default_step_ms(&self) -> i64 {
        let minutes = ((self.until_ms - self.since_ms) / 60 / 60_000).max(1);
        minutes * 60_000
    }
}

/// A yes / no / unknown answer with what it rests on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// "yes" | "no" | "unknown".
    pub answer: &'static str,
    /// Whether the answer is good news ("good" | "bad" | "unknown").
    pub tone: &'static str,
    /// One line saying why.
    pub why: String,
    /// The evidence (an alert's, or the probe run's statistics).
    pub evidence: Value,
}

/// One point of a probe statistic: one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// When the run started, unix milliseconds.
    pub t_ms: i64,
    /// The statistic.
    pub v: f64,
    /// The probe run's id.
    pub run_id: i64,
}

/// An alert as pages and the API show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlertView {
    /// Database id.
    pub id: i64,
    /// Logical model.
    pub model: String,
    /// Endpoint label.
    pub endpoint: String,
    /// "unfaithful" | "changed" | ...
    pub kind: String,
    /// "open" | "acknowledged" | "resolved".
    pub state: &'static str,
    /// Opened, unix milliseconds.
    pub opened_ms: i64,
    /// Last change, unix milliseconds.
    pub updated_ms: i64,
    /// Last confirmed, unix milliseconds.
    pub last_seen_ms: i64,
    /// Resolved, unix milliseconds.
    pub resolved_ms: Option<i64>,
    /// Who resolved it: "operator" | "quiet" (auto-resolved after its quiet period); null
    /// while active or when not recorded (resolved before schema v11).
    pub resolved_by: Option<&'static str>,
    /// One line.
    pub summary: String,
    /// The finding's evidence.
    pub evidence: Value,
}

/// One endpoint's row of the overview: its current answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndpointRow {
    /// Logical model.
    pub model: String,
    /// Endpoint label.
    pub endpoint: String,
    /// Has its behaviour changed?
    pub changed: Verdict,
    /// Is it faithful to the reference?
    pub faithful: Verdict,
    /// Does it still work?
    pub works: Verdict,
    /// "≈ 4-bit", from the active unfaithful alert's ladder position.
    pub bits: Option<String>,
    /// Effective context length (tokens) by the latest successful long_context probe.
    pub effective_context: Option<i64>,
    /// `kl_mean` of each logprob probe run of the last 24 h, oldest first.
    pub kl_24h: Vec<Point>,
    /// Attempts in the range.
    pub requests: i64,
    /// Attempts with tool calls that had any tool-call error.
    pub tool_errors: Option<Rate>,
    /// Attempts that erred.
    pub errors: Option<Rate>,
    /// TTFT median, milliseconds.
    pub ttft_p50_ms: Option<f64>,
    /// TTFT 95th percentile, milliseconds.
    pub ttft_p95_ms: Option<f64>,
    /// TPOT median, milliseconds.
    pub tpot_p50_ms: Option<f64>,
    /// TPOT 95th percentile, milliseconds.
    pub tpot_p95_ms: Option<f64>,
    /// Goodput against the model's SLO (None without an SLO or traffic).
    pub goodput: Option<Goodput>,
    /// Share of the model's attempts this endpoint served.
    pub traffic_share: Option<f64>,
    /// Routing state now.
    pub routing: Option<Routing>,
    /// Active (open or acknowledged) alerts.
    pub alerts: Vec<AlertView>,
    /// The latest eval verdicts ("no evals yet").
    pub evals: Evals,
}

/// A model and its endpoints' rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelOverview {
    /// Logical model.
    pub model: String,
    /// Its SLO.
    pub slo: Option<crate::Slo>,
    /// One row per endpoint.
    pub endpoints: Vec<EndpointRow>,
}

/// One step of an endpoint's rollup series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Start of the step, unix milliseconds.
    pub t_ms: i64,
    /// Attempts.
    pub requests: i64,
    /// Error rate.
    pub error_rate: Option<f64>,
    /// Tool-call error rate.
    pub tool_error_rate: Option<f64>,
    /// TTFT median, ms.
    pub ttft_p50_ms: Option<f64>,
    /// TTFT p95, ms.
    pub ttft_p95_ms: Option<f64>,
    /// TPOT median, ms.
    pub tpot_p50_ms: Option<f64>,
    /// TPOT p95, ms.
    pub tpot_p95_ms: Option<f64>,
    /// Degenerate cuts.
    pub degenerate: i64,
}

/// A probe statistic over the range, one point per run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeSeries {
    /// Probe kind.
    pub kind: String,
    /// Statistic name.
    pub stat: String,
    /// One point per ok run that reported it, oldest first.
    pub points: Vec<Point>,
}

/// What a per-call rate means for an N-step task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentRisk {
    /// What the rate counts.
    pub basis: &'static str,
    /// The per-call rate.
    pub p: f64,
    /// `(N, 1 − (1 − p)^N)` for N = 5, 15, 50.
    pub task_failure: Vec<(u32, f64)>,
}

/// Everything the endpoint page shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndpointDetail {
    /// The overview row.
    pub row: EndpointRow,
    /// The range.
    pub range: Range,
    /// Step of `series`, milliseconds.
    pub step_ms: i64,
    /// Rollups per step (steps without traffic absent).
    pub series: Vec<SeriesPoint>,
    /// Probe statistics per run.
    pub probes: Vec<ProbeSeries>,
    /// The calibration ladder's levels (bands on the `kl_mean` charts).
    pub ladder: Vec<Band>,
    /// Tool-call errors by kind over the range.
    pub tool_errors_by_kind: BTreeMap<&'static str, i64>,
    /// Attempts by error kind.
    pub error_kinds: BTreeMap<String, i64>,
    /// Attempts by finish reason.
    pub finish_reasons: BTreeMap<String, i64>,
    /// Degenerate cuts over the range.
    pub degenerate: i64,
    /// The per-call deviation rates compounded over agent tasks.
    pub agent: Vec<AgentRisk>,
    /// Every alert of the endpoint (newest first, at most 100).
    pub alerts: Vec<AlertView>,
}

impl AlertView {
    /// The view of a stored alert.
    pub fn of(a: &Alert) -> AlertView {
        AlertView {
            id: a.id,
            model: a.model.clone(),
            endpoint: a.endpoint.clone(),
            kind: a.kind.clone(),
            state: a.state.as_str(),
            opened_ms: a.opened_ms,
            updated_ms: a.updated_ms,
            last_seen_ms: a.last_seen_ms,
            resolved_ms: a.resolved_ms,
            resolved_by: a.resolved_by.map(samewise_store::Resolver::as_str),
            summary: a.summary.clone(),
            evidence: a.evidence.clone(),
        }
    }
}

/// The overview of every configured model (or only `model`) over `range`.
pub async fn overview(
    d: &Dashboards,
    model: Option<&str>,
    range: Range,
) -> Result<Vec<ModelOverview>, DashError> {
    let store = &d.inner.store;
    let q = RollupQuery {
        model: model.map(str::to_owned),
        endpoint: None,
        since_ms: range.since_ms,
        until_ms: range.until_ms,
    };
    // independent reads, in flight at once; one read of the runs for every model shown
    let (rollups, active, jobs, runs) = tokio::try_join!(
        async { Ok::<_, DashError>(store.endpoint_rollups(&q).await?) },
        async { Ok(store.active_alerts().await?) },
        async { Ok(store.eval_jobs(None, None, EVAL_JOBS_READ).await?) },
        runs_since(d, model, None, range),
    )?;
    let mut out = Vec::new();
    for m in d
        .inner
        .models
        .iter()
        .filter(|m| model.is_none_or(|x| x == m.name))
    {
        let total: i64 = rollups
            .iter()
            .filter(|r| r.model == m.name)
            .map(|r| r.totals.requests)
            .sum();
        let mut rows = Vec::new();
        for e in &m.endpoints {
            let r = rollups
                .iter()
                .find(|r| r.endpoint == *e && r.model == m.name);
            let mine: Vec<ProbeRun> = runs
                .iter()
                .filter(|r| r.endpoint == *e && r.model == m.name)
                .cloned()
                .collect();
            let evals = Evals::of(&jobs, &m.name, e);
            rows.push(row(d, &m.name, e, range, r, total, &active, evals, &mine)?);
        }
        out.push(ModelOverview {
            model: m.name.clone(),
            slo: m.slo,
            endpoints: rows,
        });
    }
    Ok(out)
}

/// Probe runs (without raw data) of `model` or `endpoint`, newest first: every run of the
/// last 24 h (the sparkline always covers 24 h) and, when `range` starts earlier, the newest
/// run of each endpoint, kind and outcome since its start — all a row's verdicts read (the
/// latest run, the latest ok logprob and long-context runs, whether any ran in the range),
/// without reading every run of a 30-day range.
async fn runs_since(
    d: &Dashboards,
    model: Option<&str>,
    endpoint: Option<&str>,
    range: Range,
) -> Result<Vec<ProbeRun>, DashError> {
    let day_ago = samewise_store::now_ms() - 24 * 3_600_000;
    let store = &d.inner.store;
    let mut runs = store
        .probe_run_stats(&ProbeRunQuery {
            model: model.map(str::to_owned),
            endpoint: endpoint.map(str::to_owned),
            kind: None,
            since_ms: Some(day_ago),
            limit: MAX_RUNS * 10,
        })
        .await?;
    if range.since_ms < day_ago {
        let known: std::collections::HashSet<i64> = runs.iter().map(|r| r.id).collect();
        let older = store.latest_probe_runs(model, range.since_ms).await?;
        runs.extend(
            older
                .into_iter()
                .filter(|r| endpoint.is_none_or(|e| r.endpoint == e) && !known.contains(&r.id)),
        );
        runs.sort_by_key(|r| std::cmp::Reverse((r.started_ms, r.id)));
    }
    Ok(runs)
}

/// The row of `endpoint` of `model`, from its rollup and its probe runs (`runs_since`).
#[allow(clippy::too_many_arguments)]
fn row(
    d: &Dashboards,
    model: &str,
    endpoint: &str,
    range: Range,
    rollup: Option<&EndpointRollup>,
    model_total: i64,
    active: &[Alert],
    evals: Evals,
    runs: &[ProbeRun],
) -> Result<EndpointRow, DashError> {
    let now = samewise_store::now_ms();
    let alerts: Vec<&Alert> = active
        .iter()
        .filter(|a| a.endpoint == endpoint && a.model == model)
        .collect();
    let empty = Rollup::default();
    let t = rollup.map_or(&empty, |r| &r.totals);
    let kl_24h: Vec<Point> = runs
        .iter()
        .rev()
        .filter(|r| r.ok && r.started_ms >= now - 24 * 3_600_000)
        .filter(|r| LOGPROB_KINDS.contains(&r.kind.as_str()))
        .filter_map(|r| point(r, "kl_mean"))
        .collect();
    let ran_in_range = |kinds: &[&str]| {
        runs.iter()
            .any(|r| r.ok && r.started_ms >= range.since_ms && kinds.contains(&r.kind.as_str()))
    };
    let logprob_runs_in_range = ran_in_range(&LOGPROB_KINDS);
    let fingerprints_in_range = ran_in_range(&[FINGERPRINT_KIND]);
    let find = |kind: &str| alerts.iter().find(|a| a.kind == kind).copied();
    let changed = match find("changed") {
        Some(a) => alert_verdict("yes", "bad", a),
        None if logprob_runs_in_range => {
            plain("no", "good", "logprob probes ran with no change alarm")
        }
        None if fingerprints_in_range => plain(
            "no",
            "good",
            "fingerprint probes (the endpoint's own logprobs) ran with no change alarm",
        ),
        None => plain("unknown", "unknown", "no logprob probe runs in the range"),
    };
    let unfaithful = find("unfaithful");
    let faithful = match unfaithful {
        Some(a) => alert_verdict("no", "bad", a),
        None if logprob_runs_in_range => {
            let latest = runs
                .iter()
                .find(|r| r.ok && LOGPROB_KINDS.contains(&r.kind.as_str()));
            Verdict {
                answer: "yes",
                tone: "good",
                why: "within the ladder's threshold on every logprob probe".to_owned(),
                evidence: latest.map_or(
                    Value::Null,
                    |r| serde_json::json!({ "probe_run": r.id, "kind": r.kind, "stats": r.stats }),
                ),
            }
        }
        None if fingerprints_in_range => plain(
            "unknown",
            "unknown",
            "only fingerprint probes ran: they compare the endpoint with its own past, not with the weights",
        ),
        None => plain("unknown", "unknown", "no logprob probe runs in the range"),
    };
    let errors = Rate::of(t.errors, t.requests);
    // does it still work? a degraded eval verdict, then a passive finding in live traffic,
    // then the latest probe and the range's error rate
    let works = match (evals.degraded(), find("passive"), runs.first()) {
        (Some(j), _, _) => Verdict {
            answer: "no",
            tone: "bad",
            why: format!("the {} eval judged it degraded", j.suite),
            evidence: serde_json::json!({ "eval_job": j }),
        },
        (None, Some(a), _) => alert_verdict("no", "bad", a),
        (None, None, Some(r)) if !r.ok => Verdict {
            answer: "no",
            tone: "bad",
            why: format!("the latest {} probe failed", r.kind),
            evidence: serde_json::json!({ "probe_run": r.id, "error": r.error }),
        },
        _ if errors.is_some_and(|e| e.n >= 10 && e.p >= 0.5) => Verdict {
            answer: "no",
            tone: "bad",
            why: "at least half of the range's attempts erred".to_owned(),
            evidence: serde_json::json!({ "errors": errors }),
        },
        (None, None, Some(r)) => Verdict {
            answer: "yes",
            tone: "good",
            why: format!("the latest {} probe succeeded", r.kind),
            evidence: serde_json::json!({ "probe_run": r.id, "errors": errors }),
        },
        _ if t.requests > 0 => Verdict {
            answer: "yes",
            tone: "good",
            why: "serving traffic".to_owned(),
            evidence: serde_json::json!({ "errors": errors }),
        },
        _ => plain(
            "unknown",
            "unknown",
            "no probes and no traffic in the range",
        ),
    };
    let slo = d.model(model).and_then(|m| m.slo);
    Ok(EndpointRow {
        model: model.to_owned(),
        endpoint: endpoint.to_owned(),
        changed,
        faithful,
        works,
        bits: unfaithful.and_then(|a| bits_text(&a.evidence)),
        effective_context: runs
            .iter()
            .find(|r| r.ok && r.kind == "long_context")
            .and_then(|r| r.stats.get("effective_context"))
            .and_then(Value::as_i64),
        kl_24h,
        requests: t.requests,
        tool_errors: Rate::of(t.tool_errored, t.tool_requests),
        errors,
        ttft_p50_ms: t.ttft_quantile(0.5),
        ttft_p95_ms: t.ttft_quantile(0.95),
        tpot_p50_ms: t.tpot_quantile(0.5),
        tpot_p95_ms: t.tpot_quantile(0.95),
        goodput: slo.and_then(|s| stats::goodput(t, &s)),
        traffic_share: (model_total > 0).then(|| t.requests as f64 / model_total as f64),
        routing: d.inner.live.routing(model, endpoint),
        alerts: alerts.iter().map(|a| AlertView::of(a)).collect(),
        evals,
    })
}

fn plain(answer: &'static str, tone: &'static str, why: &str) -> Verdict {
    Verdict {
        answer,
        tone,
        why: why.to_owned(),
        evidence: Value::Null,
    }
}

fn alert_verdict(answer: &'static str, tone: &'static str, a: &Alert) -> Verdict {
    Verdict {
        answer,
        tone,
        why: a.summary.clone(),
        evidence: serde_json::json!({ "alert": a.id, "state": a.state.as_str(), "evidence": a.evidence }),
    }
}

/// "≈ 4-bit" from an unfaithful alert's ladder position (`evidence.equivalent`).
pub fn bits_text(evidence: &Value) -> Option<String> {
    let eq = evidence.get("equivalent")?;
    let bits = eq.get("bits")?.as_f64()?;
    Some(match eq.get("relation")?.as_str()? {
        "approx" => format!("≈ {bits:.0}-bit"),
        "no_worse_than" => format!("≥ {bits:.0}-bit"),
        "worse_than" => format!("< {bits:.0}-bit"),
        _ => return None,
    })
}

fn point(r: &ProbeRun, stat: &str) -> Option<Point> {
    let v = r.stats.get(stat)?.as_f64()?;
    v.is_finite().then_some(Point {
        t_ms: r.started_ms,
        v,
        run_id: r.id,
    })
}

/// The endpoint page's data over `range` with `step_ms` (None = about 60 steps).
pub async fn endpoint(
    d: &Dashboards,
    endpoint: &str,
    range: Range,
    step_ms: Option<i64>,
) -> Result<EndpointDetail, DashError> {
    let spec = d
        .model_of(endpoint)
        .ok_or_else(|| DashError::NotFound(format!("no configured endpoint {endpoint:?}")))?;
    let model = spec.name.clone();
    let store = &d.inner.store;
    let q = RollupQuery {
        model: Some(model.clone()),
        endpoint: None,
        since_ms: range.since_ms,
        until_ms: range.until_ms,
    };
    let step_ms = step_ms
        .unwrap_or_else(|| range.default_step_ms())
        .max(60_000);
    // independent reads, in flight at once
    let (all, active, jobs, runs, series, probes) = tokio::try_join!(
        async { Ok::<_, DashError>(store.endpoint_rollups(&q).await?) },
        async { Ok(store.active_alerts().await?) },
        async { Ok(store.eval_jobs(None, None, EVAL_JOBS_READ).await?) },
        runs_since(d, Some(&model), Some(endpoint), range),
        series(d, endpoint, range, step_ms),
        probe_series(d, endpoint, None, range),
    )?;
    let total = all.iter().map(|r| r.totals.requests).sum();
    let mine = all.iter().find(|r| r.endpoint == endpoint);
    let evals = Evals::of(&jobs, &model, endpoint);
    let row = row(
        d, &model, endpoint, range, mine, total, &active, evals, &runs,
    )?;
    let empty = Rollup::default();
    let t = mine.map_or(&empty, |r| &r.totals);
    let tool_errors_by_kind = BTreeMap::from([
        ("invalid_json", t.tool_invalid_json),
        ("unknown_name", t.tool_unknown_name),
        ("schema_mismatch", t.tool_schema_mismatch),
        ("finish_mismatch", t.tool_finish_mismatch),
    ]);
    let mut agent = Vec::new();
    for (basis, rate) in [("tool-call error", row.tool_errors), ("error", row.errors)] {
        if let Some(r) = rate {
            agent.push(AgentRisk {
                basis,
                p: r.p,
                task_failure: stats::AGENT_STEPS
                    .iter()
                    .map(|&n| (n, stats::task_failure(r.p, n)))
                    .collect(),
            });
        }
    }
    let alerts = store
        .alerts(&AlertQuery {
            state: None,
            active_only: false,
            model: Some(model),
            endpoint: Some(endpoint.to_owned()),
            limit: 100,
        })
        .await?
        .iter()
        .map(AlertView::of)
        .collect();
    Ok(EndpointDetail {
        row,
        range,
        step_ms,
        series,
        probes,
        ladder: spec.ladder.clone(),
        tool_errors_by_kind,
        error_kinds: mine.map(|r| r.error_kinds.clone()).unwrap_or_default(),
        finish_reasons: mine.map(|r| r.finish_reasons.clone()).unwrap_or_default(),
        degenerate: t.degenerate,
        agent,
        alerts,
    })
}

/// `endpoint`'s rollups per `step_ms` over `range`.
pub async fn series(
    d: &Dashboards,
    endpoint: &str,
    range: Range,
    step_ms: i64,
) -> Result<Vec<SeriesPoint>, DashError> {
    let points = d
        .inner
        .store
        .endpoint_rollup_series(endpoint, range.since_ms, range.until_ms, step_ms)
        .await?;
    Ok(points
        .iter()
        .map(|p| {
            let t = &p.totals;
            SeriesPoint {
                t_ms: p.start_ms,
                requests: t.requests,
                error_rate: Rate::of(t.errors, t.requests).map(|r| r.p),
                tool_error_rate: Rate::of(t.tool_errored, t.tool_requests).map(|r| r.p),
                ttft_p50_ms: t.ttft_quantile(0.5),
                ttft_p95_ms: t.ttft_quantile(0.95),
                tpot_p50_ms: t.tpot_quantile(0.5),
                tpot_p95_ms: t.tpot_quantile(0.95),
                degenerate: t.degenerate,
            }
        })
        .collect())
}

/// The charted statistics of `endpoint`'s probe runs in `range` (only `kind`, if given), one
/// series per kind and statistic.
pub async fn probe_series(
    d: &Dashboards,
    endpoint: &str,
    kind: Option<&str>,
    range: Range,
) -> Result<Vec<ProbeSeries>, DashError> {
    let runs = d
        .inner
        .store
        .probe_run_stats(&ProbeRunQuery {
            model: None,
            endpoint: Some(endpoint.to_owned()),
            kind: kind.map(str::to_owned),
            since_ms: Some(range.since_ms),
            limit: MAX_RUNS,
        })
        .await?;
    let mut by: BTreeMap<(String, &'static str), Vec<Point>> = BTreeMap::new();
    for r in runs
        .iter()
        .rev()
        .filter(|r| r.ok && r.started_ms < range.until_ms)
    {
        for stat in CHARTED_STATS {
            if let Some(p) = point(r, stat) {
                by.entry((r.kind.clone(), stat)).or_default().push(p);
            }
        }
    }
    Ok(by
        .into_iter()
        .map(|((kind, stat), points)| ProbeSeries {
            kind,
            stat: stat.to_owned(),
            points,
        })
        .collect())
}

/// Alerts in `state` (None = all), newest first.
pub async fn alerts(
    d: &Dashboards,
    state: Option<AlertState>,
    limit: u32,
) -> Result<Vec<AlertView>, DashError> {
    Ok(d.inner
        .store
        .alerts(&AlertQuery {
            state,
            active_only: false,
            model: None,
            endpoint: None,
            limit,
        })
        .await?
        .iter()
        .map(AlertView::of)
        .collect())
}

/// Acknowledges (`resolve` false) or resolves alert `id`.
pub async fn set_alert(d: &Dashboards, id: i64, resolve: bool) -> Result<AlertView, DashError> {
    let store = &d.inner.store;
    let a = if resolve {
        store.resolve_alert(id).await?
    } else {
        store.ack_alert(id).await?
    };
    a.as_ref()
        .map(AlertView::of)
        .ok_or_else(|| DashError::NotFound(format!("no alert {id}")))
}
