//! The JSON API under `/api/v1/`, the same data as the pages ([`crate::view`]):
//! `models`, `overview` (every endpoint's current answers), `endpoint` (one endpoint's page
//! data), `series` (rollups per step), `probe-series` (probe statistics per run), `alerts`
//! (list, one, acknowledge, resolve), `evals` (list, open, one). Errors are OpenAI-shaped. A
//! POST under a session carries its CSRF token in `X-CSRF-Token`.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use samewise_store::AlertState;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Admin;
use crate::extract::{Path, Query};
use crate::view::{self, Range};
use crate::{DashError, Dashboards};

type ApiResult = Result<Json<Value>, DashError>;

fn to_json(v: impl serde::Serialize) -> ApiResult {
    serde_json::to_value(v)
        .map(Json)
        .map_err(|e| DashError::BadRequest(format!("cannot encode the answer: {e}")))
}

/// `GET /api/v1/models`: the configured models, their endpoints, SLOs and ladders.
pub async fn models(State(d): State<Dashboards>, _admin: Admin) -> ApiResult {
    to_json(json!({ "models": d.inner.models }))
}

/// `?range=&model=`.
#[derive(Debug, Deserialize)]
pub struct OverviewQuery {
    range: Option<String>,
    model: Option<String>,
}

/// `GET /api/v1/overview?range=24h[&model=M]`: every endpoint's current answers.
pub async fn overview(
    State(d): State<Dashboards>,
    _admin: Admin,
    Query(q): Query<OverviewQuery>,
) -> ApiResult {
    let range = Range::parse(q.range.as_deref())?;
    if let Some(m) = &q.model
        && d.model(m).is_none()
    {
        return Err(DashError::NotFound(format!("no model {m:?}")));
    }
    let models = view::overview(&d, q.model.as_deref(), range).await?;
    to_json(json!({ "range": range, "models": models }))
}

/// `?endpoint=&range=&step=&kind=` (step in seconds).
#[derive(Debug, Deserialize)]
pub struct EndpointQuery {
    endpoint: String,
    range: Option<String>,
    step: Option<i64>,
    kind: Option<String>,
}

fn step_ms(step: Option<i64>) -> Result<Option<i64>, DashError> {
    match step {
        Some(s) if s < 60 || s % 60 != 0 => Err(DashError::BadRequest(
            "step is in seconds, a positive multiple of 60".to_owned(),
        )),
        Some(s) => Ok(Some(s.saturating_mul(1000))),
        None => Ok(None),
    }
}

/// `GET /api/v1/endpoint?endpoint=E&range=24h&step=S`: what the endpoint page shows.
pub async fn endpoint(
    State(d): State<Dashboards>,
    _admin: Admin,
    Query(q): Query<EndpointQuery>,
) -> ApiResult {
    let range = Range::parse(q.range.as_deref())?;
    to_json(view::endpoint(&d, &q.endpoint, range, step_ms(q.step)?).await?)
}

/// `GET /api/v1/series?endpoint=E&range=24h&step=S`: rollups per step.
pub async fn series(
    State(d): State<Dashboards>,
    _admin: Admin,
    Query(q): Query<EndpointQuery>,
) -> ApiResult {
    if d.model_of(&q.endpoint).is_none() {
        return Err(DashError::NotFound(format!(
            "no configured endpoint {:?}",
            q.endpoint
        )));
    }
    let range = Range::parse(q.range.as_deref())?;
    let step = step_ms(q.step)?.unwrap_or_else(|| range.default_step_ms());
    let points = view::series(&d, &q.endpoint, range, step).await?;
    to_json(json!({ "endpoint": q.endpoint, "range": range, "step_ms": step, "points": points }))
}

/// `GET /api/v1/probe-series?endpoint=E&range=24h[&kind=K]`: probe statistics per run.
pub async fn probe_series(
    State(d): State<Dashboards>,
    _admin: Admin,
    Query(q): Query<EndpointQuery>,
) -> ApiResult {
    if d.model_of(&q.endpoint).is_none() {
        return Err(DashError::NotFound(format!(
            "no configured endpoint {:?}",
            q.endpoint
        )));
    }
    let range = Range::parse(q.range.as_deref())?;
    let series = view::probe_series(&d, &q.endpoint, q.kind.as_deref(), range).await?;
    to_json(json!({ "endpoint": q.endpoint, "range": range, "series": series }))
}

/// `?state=&limit=`.
#[derive(Debug, Deserialize)]
pub struct AlertsQuery {
    state: Option<String>,
    limit: Option<u32>,
}

/// `GET /api/v1/alerts?state=open&limit=100`.
pub async fn alerts(
    State(d): State<Dashboards>,
    _admin: Admin,
    Query(q): Query<AlertsQuery>,
) -> ApiResult {
    let state = match q.state.as_deref() {
        None | Some("all") => None,
        Some(s) => Some(
            AlertState::parse(s)
                .ok_or_else(|| DashError::BadRequest(format!("unknown alert state {s:?}")))?,
        ),
    };
    let list = view::alerts(&d, state, q.limit.unwrap_or(100).min(1000)).await?;
    to_json(json!({ "alerts": list }))
}

/// `GET /api/v1/alerts/{id}`.
pub async fn alert(State(d): State<Dashboards>, _admin: Admin, Path(id): Path<i64>) -> ApiResult {
    to_json(view::evals::alert_detail(&d, id).await?)
}

/// `GET /api/v1/evals/{id}`: an eval job with its verdict and every item on both targets.
pub async fn eval_job(
    State(d): State<Dashboards>,
    _admin: Admin,
    Path(id): Path<i64>,
) -> ApiResult {
    to_json(view::evals::job(&d, id).await?)
}

/// `?endpoint=&limit=`.
#[derive(Debug, Deserialize)]
pub struct EvalsQuery {
    endpoint: Option<String>,
    limit: Option<u32>,
}

/// `GET /api/v1/evals?endpoint=E&limit=50`: jobs, newest first.
pub async fn eval_jobs(
    State(d): State<Dashboards>,
    _admin: Admin,
    Query(q): Query<EvalsQuery>,
) -> ApiResult {
    if let Some(e) = &q.endpoint
        && d.model_of(e).is_none()
    {
        return Err(DashError::NotFound(format!("no configured endpoint {e:?}")));
    }
    let limit = q.limit.unwrap_or(50).clamp(1, 1000);
    let jobs = d
        .inner
        .store
        .eval_jobs(None, q.endpoint.as_deref(), limit)
        .await?;
    let list: Vec<Value> = jobs.iter().map(view::evals::listed).collect();
    to_json(json!({ "jobs": list }))
}

/// The body of `POST /api/v1/evals`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenBody {
    endpoint: String,
    suite: String,
    #[serde(default)]
    baseline: Option<String>,
}

/// `POST /api/v1/evals` with `{"endpoint", "suite", "baseline"?}`: opens a job (checked as
/// `samewise evals run` checks it, no cooldown); 201 with its id and URLs. A worker of any
/// gateway on the store runs it.
pub async fn open_eval(
    State(d): State<Dashboards>,
    admin: Admin,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<(axum::http::StatusCode, Json<Value>), DashError> {
    admin.check_csrf(csrf(&headers))?;
    let opener = d.inner.evals.as_ref().ok_or_else(|| {
        DashError::NotFound("evals are not configured on this gateway".to_owned())
    })?;
    let body: OpenBody = serde_json::from_slice(&body).map_err(|e| {
        DashError::BadRequest(format!(
            "the body must be JSON {{\"endpoint\": ..., \"suite\": ..., \"baseline\"?: ...}}: {e}"
        ))
    })?;
    let mut params = serde_json::Map::new();
    params.insert("opened_by".to_owned(), json!("api"));
    let req = samewise_evals::OpenRequest {
        endpoint: body.endpoint,
        suite: samewise_evals::SuiteRef::Named(body.suite),
        baseline: body.baseline,
        params,
        alert_id: None,
    };
    let job = opener
        .open(&d.inner.store, &req, 0)
        .await
        .map_err(DashError::from)?
        .ok_or_else(|| DashError::BadRequest("the job was not opened".to_owned()))?;
    let mut doc = view::evals::listed(&job);
    doc["url"] = json!(format!("/evals/{}", job.id));
    doc["api_url"] = json!(format!("/api/v1/evals/{}", job.id));
    Ok((axum::http::StatusCode::CREATED, Json(doc)))
}

/// `POST /api/v1/alerts/{id}/ack`.
pub async fn ack(
    State(d): State<Dashboards>,
    admin: Admin,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> ApiResult {
    admin.check_csrf(csrf(&headers))?;
    to_json(view::set_alert(&d, id, false).await?)
}

/// `POST /api/v1/alerts/{id}/resolve`.
pub async fn resolve(
    State(d): State<Dashboards>,
    admin: Admin,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> ApiResult {
    admin.check_csrf(csrf(&headers))?;
    to_json(view::set_alert(&d, id, true).await?)
}

fn csrf(headers: &HeaderMap) -> Option<&str> {
    headers.get("x-csrf-token").and_then(|v| v.to_str().ok())
}
