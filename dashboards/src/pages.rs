//! The HTML routes: overview, endpoint, compare, alerts (with acknowledge / resolve forms),
//! eval jobs down to their items (`evals`), login and logout, and the two assets (stylesheet, refresh script). Handlers are thin: they
//! authenticate, ask [`crate::view`] for the data and render it; every string from the store
//! goes through [`esc`]. Unauthenticated page requests are redirected to the login form.

use std::fmt::Write;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use crate::auth::{self, Admin, COOKIE};
use crate::extract::{Form, Query};
use crate::html::{esc, num, page, pct, url};
use crate::svg::{Line, chart, sparkline};
use crate::view::{self, EndpointDetail, EndpointRow, RANGES, Range, Verdict};
use crate::{DashError, Dashboards};

mod alerts;
mod evals;

use alerts::alerts_table;
pub use alerts::{ack, alert, alerts, resolve};
pub use evals::job_page;

/// A page's failure: a redirect to the login form, or an error page.
#[derive(Debug)]
pub struct PageError(DashError);

impl From<DashError> for PageError {
    fn from(e: DashError) -> Self {
        PageError(e)
    }
}

impl From<samewise_store::StoreError> for PageError {
    fn from(e: samewise_store::StoreError) -> Self {
        PageError(DashError::Store(e))
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match self.0 {
            DashError::Unauthenticated => Redirect::to("/login").into_response(),
            e => {
                let json = e.into_response();
                let status = json.status();
                let msg = match status {
                    StatusCode::INTERNAL_SERVER_ERROR => "internal error".to_owned(),
                    _ => status.canonical_reason().unwrap_or("error").to_owned(),
                };
                (
                    status,
                    html(page("Error", &format!("<p>{}</p>", esc(&msg)))),
                )
                    .into_response()
            }
        }
    }
}

type PageResult = Result<Response, PageError>;

fn html(body: String) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        body,
    )
}

/// `?range=&model=`.
#[derive(Debug, Deserialize)]
pub struct OverviewQuery {
    range: Option<String>,
    model: Option<String>,
}

/// `GET /`: one table per model, one row per endpoint.
pub async fn overview(
    State(d): State<Dashboards>,
    admin: Result<Admin, DashError>,
    q: Result<Query<OverviewQuery>, DashError>,
) -> PageResult {
    admin?;
    let Query(q) = q?;
    let range = Range::parse(q.range.as_deref())?;
    let models = view::overview(&d, q.model.as_deref(), range).await?;
    let mut b = range_picker("/", range, "");
    if models.is_empty() {
        b.push_str("<p>No models configured.</p>");
    }
    for m in &models {
        let _ = write!(b, "<section><h2>{}</h2>", esc(&m.model));
        match m.slo {
            Some(s) => {
                let _ = write!(
                    b,
                    "<p class=\"muted\">SLO: TTFT ≤ {} ms, TPOT ≤ {} ms</p>",
                    s.ttft_ms, s.tpot_ms
                );
            }
            None => b.push_str(
                "<p class=\"muted\">No SLO configured (<code>[models.NAME.slo]</code>).</p>",
            ),
        }
        b.push_str(TABLE_HEAD);
        for r in &m.endpoints {
            row_html(&mut b, r);
        }
        b.push_str("</tbody></table></div></section>");
    }
    Ok(html(page("Overview", &b)).into_response())
}

/// The overview table's opening and header row.
const TABLE_HEAD: &str = "<div class=\"scroll\"><table class=\"overview\"><thead><tr><th>Endpoint</th>\
     <th>Changed?</th><th>Faithful?</th><th>≈ bits</th><th>Context</th><th>Still works?</th>\
     <th>KL 24 h</th><th>Tool-call errors (95% CI)</th><th>TTFT p50 / p95</th>\
     <th>TPOT p50 / p95</th><th>Goodput</th><th>Errors</th><th>Traffic</th>\
     <th>Routing</th><th>Alerts</th><th>Evals</th></tr></thead><tbody>";

fn range_picker(path: &str, range: Range, extra: &str) -> String {
    let mut b = String::from("<p class=\"ranges\">Range: ");
    for (name, _) in RANGES {
        if name == range.name {
            let _ = write!(b, "<strong>{name}</strong> ");
        } else {
            let _ = write!(b, "<a href=\"{path}?range={name}{extra}\">{name}</a> ");
        }
    }
    b.push_str("</p>");
    b
}

fn verdict_html(b: &mut String, v: &Verdict, class: &str) {
    let evidence = serde_json::to_string_pretty(&v.evidence).unwrap_or_default();
    let _ = write!(
        b,
        "<td class=\"{class}\"><details class=\"verdict {tone}\" title=\"{why}\"><summary>{ans}</summary>\
         <p>{why}</p>{ev}</details></td>",
        tone = v.tone,
        why = esc(&v.why),
        ans = esc(v.answer),
        ev = if v.evidence.is_null() {
            String::new()
        } else {
            format!("<pre>{}</pre>", esc(&evidence))
        }
    );
}

fn rate_html(r: Option<crate::stats::Rate>) -> String {
    r.map_or("—".to_owned(), |r| {
        format!(
            "{} <span class=\"muted\">[{}, {}] of {}</span>",
            pct(Some(r.p)),
            pct(Some(r.lo)),
            pct(Some(r.hi)),
            r.n
        )
    })
}

fn row_html(b: &mut String, r: &EndpointRow) {
    let _ = write!(
        b,
        "<tr data-endpoint=\"{e}\"><td><a href=\"/endpoint?e={u}\">{e}</a></td>",
        e = esc(&r.endpoint),
        u = url(&r.endpoint)
    );
    verdict_html(b, &r.changed, "changed");
    verdict_html(b, &r.faithful, "faithful");
    let _ = write!(
        b,
        "<td class=\"bits\">{}</td>",
        esc(r.bits.as_deref().unwrap_or("—"))
    );
    let _ = write!(
        b,
        "<td class=\"context\" title=\"effective context length (tokens), latest long_context probe\">{}</td>",
        r.effective_context
            .map_or("—".to_owned(), |c| c.to_string())
    );
    verdict_html(b, &r.works, "works");
    let kl: Vec<(i64, f64)> = r.kl_24h.iter().map(|p| (p.t_ms, p.v)).collect();
    let _ = write!(b, "<td class=\"kl\">{}</td>", sparkline(&kl));
    let _ = write!(
        b,
        "<td class=\"tool\">{}</td><td>{} / {} ms</td><td>{} / {} ms</td>",
        rate_html(r.tool_errors),
        num(r.ttft_p50_ms, 0),
        num(r.ttft_p95_ms, 0),
        num(r.tpot_p50_ms, 1),
        num(r.tpot_p95_ms, 1)
    );
    let goodput = r.goodput.map_or("—".to_owned(), |g| {
        format!(
            "≥ {} <span class=\"muted\">(TTFT {}, TPOT {})</span>",
            pct(Some(g.at_least)),
            pct(g.ttft_within),
            pct(g.tpot_within)
        )
    });
    let _ = write!(
        b,
        "<td class=\"goodput\">{goodput}</td><td class=\"errors\">{}</td><td class=\"share\">{}</td>",
        rate_html(r.errors),
        pct(r.traffic_share)
    );
    match &r.routing {
        Some(rt) => {
            let _ = write!(
                b,
                "<td class=\"routing {s}\" title=\"{w}\">{s}{w2}</td>",
                s = esc(rt.state),
                w = esc(rt.why.as_deref().unwrap_or("")),
                w2 = rt
                    .why
                    .as_deref()
                    .map(|w| format!("<br><span class=\"muted\">{}</span>", esc(w)))
                    .unwrap_or_default()
            );
        }
        None => b.push_str("<td class=\"routing\">not routed</td>"),
    }
    b.push_str("<td class=\"alerts\">");
    if r.alerts.is_empty() {
        b.push_str("none");
    }
    for a in &r.alerts {
        let _ = write!(
            b,
            "<a href=\"/alerts/{}\" title=\"{}\">{} ({})</a> ",
            a.id,
            esc(&a.summary),
            esc(&a.kind),
            esc(a.state)
        );
    }
    b.push_str("</td><td class=\"evals\">");
    if r.evals.jobs.is_empty() {
        b.push_str(esc(r.evals.note).as_str());
    }
    for j in &r.evals.jobs {
        let tone = match j.verdict.as_deref() {
            Some("degraded") => "bad",
            Some("equivalent") => "good",
            _ => "unknown",
        };
        let _ = write!(
            b,
            "<a class=\"{tone}\" href=\"/evals/{}\" title=\"job {} · {}\">{}: {}</a> ",
            j.id,
            j.id,
            esc(j.summary.as_deref().unwrap_or("")),
            esc(&j.suite),
            esc(j.verdict.as_deref().unwrap_or(j.state))
        );
    }
    b.push_str("</td></tr>");
}

/// `?e=&range=&step=` (step in seconds).
#[derive(Debug, Deserialize)]
pub struct EndpointQuery {
    e: Option<String>,
    range: Option<String>,
    step: Option<i64>,
}

/// `GET /endpoint?e=ENDPOINT`: time series, breakdowns and alerts of one endpoint.
pub async fn endpoint(
    State(d): State<Dashboards>,
    admin: Result<Admin, DashError>,
    q: Result<Query<EndpointQuery>, DashError>,
) -> PageResult {
    let admin = admin?;
    let Query(q) = q?;
    let e =
        q.e.ok_or_else(|| DashError::BadRequest("missing ?e=ENDPOINT".to_owned()))?;
    let range = Range::parse(q.range.as_deref())?;
    let detail = view::endpoint(&d, &e, range, q.step.map(|s| s.saturating_mul(1000))).await?;
    let mut b = range_picker("/endpoint", range, &format!("&e={}", url(&e)));
    let _ = write!(
        b,
        "<p>Model <strong>{}</strong> · <a href=\"/compare?a={}\">compare with another endpoint</a></p>",
        esc(&detail.row.model),
        url(&e)
    );
    b.push_str(TABLE_HEAD);
    row_html(&mut b, &detail.row);
    b.push_str("</tbody></table></div>");
    detail_html(&mut b, &detail, &admin);
    Ok(html(page(&format!("Endpoint {e}"), &b)).into_response())
}

fn detail_html(b: &mut String, d: &EndpointDetail, admin: &Admin) {
    b.push_str("<h2>Probe statistics</h2><div class=\"charts\">");
    if d.probes.is_empty() {
        b.push_str("<p>No probe runs in the range.</p>");
    }
    for s in &d.probes {
        let pts: Vec<(i64, f64)> = s.points.iter().map(|p| (p.t_ms, p.v)).collect();
        let bands: Vec<Line> = if s.stat == "kl_mean" {
            ladder_bands(&d.ladder, &pts)
        } else {
            Vec::new()
        };
        let title = format!("{} · {} ({} runs)", s.kind, s.stat, s.points.len());
        b.push_str(&chart(&title, &pts, &bands));
    }
    b.push_str("</div><h2>Traffic</h2><div class=\"charts\">");
    let pick = |f: &dyn Fn(&view::SeriesPoint) -> Option<f64>| -> Vec<(i64, f64)> {
        d.series
            .iter()
            .filter_map(|p| f(p).map(|v| (p.t_ms, v)))
            .collect()
    };
    let step_min = d.step_ms / 60_000;
    for (title, pts) in [
        ("attempts per step", pick(&|p| Some(p.requests as f64))),
        ("error rate", pick(&|p| p.error_rate)),
        ("tool-call error rate", pick(&|p| p.tool_error_rate)),
        ("TTFT p50 (ms)", pick(&|p| p.ttft_p50_ms)),
        ("TTFT p95 (ms)", pick(&|p| p.ttft_p95_ms)),
        ("TPOT p50 (ms)", pick(&|p| p.tpot_p50_ms)),
        ("TPOT p95 (ms)", pick(&|p| p.tpot_p95_ms)),
        ("degenerate cuts", pick(&|p| Some(p.degenerate as f64))),
    ] {
        b.push_str(&chart(
            &format!("{title} · {step_min} min steps"),
            &pts,
            &[],
        ));
    }
    b.push_str("</div><h2>Per-call deviation and agent tasks</h2>");
    if d.agent.is_empty() {
        b.push_str("<p>No traffic in the range.</p>");
    } else {
        b.push_str("<table class=\"agent\"><thead><tr><th>Per-call rate</th><th>p</th>");
        for n in crate::stats::AGENT_STEPS {
            let _ = write!(b, "<th>{n}-step task</th>");
        }
        b.push_str("</tr></thead><tbody>");
        for a in &d.agent {
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td>",
                esc(a.basis),
                pct(Some(a.p))
            );
            for (_, f) in &a.task_failure {
                let _ = write!(b, "<td>{}</td>", pct(Some(*f)));
            }
            b.push_str("</tr>");
        }
        b.push_str(
            "</tbody></table><p class=\"muted\">1 − (1 − p)<sup>N</sup>: the chance that an \
             N-step agent task meets at least one such call.</p>",
        );
    }
    b.push_str("<h2>Breakdowns</h2><div class=\"cols\">");
    kv_table(
        b,
        "Tool-call errors by kind",
        d.tool_errors_by_kind.iter().map(|(k, v)| (*k, *v)),
    );
    kv_table(
        b,
        "Finish reasons",
        d.finish_reasons.iter().map(|(k, v)| (k.as_str(), *v)),
    );
    kv_table(
        b,
        "Error kinds",
        d.error_kinds.iter().map(|(k, v)| (k.as_str(), *v)),
    );
    kv_table(
        b,
        "Degeneration guard",
        [("cuts", d.degenerate)].into_iter(),
    );
    b.push_str("</div><h2>Alerts</h2>");
    alerts_table(b, &d.alerts, admin);
}

/// The ladder levels worth drawing beside `pts`: those up to 1.5 times the highest point,
/// and the first one above that (the levels far above would flatten the series to a line).
fn ladder_bands(ladder: &[crate::Band], pts: &[(i64, f64)]) -> Vec<Line> {
    let top = pts.iter().map(|p| p.1).fold(0.0_f64, f64::max) * 1.5;
    let mut levels: Vec<&crate::Band> = ladder.iter().collect();
    levels.sort_by(|a, b| a.kl_mean.total_cmp(&b.kl_mean));
    let mut out = Vec::new();
    for l in levels {
        out.push(Line {
            label: l.name.clone(),
            value: l.kl_mean,
        });
        if l.kl_mean > top {
            break;
        }
    }
    out
}

fn kv_table<'a>(b: &mut String, title: &str, rows: impl Iterator<Item = (&'a str, i64)>) {
    let _ = write!(
        b,
        "<table class=\"kv\"><caption>{}</caption><tbody>",
        esc(title)
    );
    let mut any = false;
    for (k, v) in rows {
        any = true;
        let _ = write!(b, "<tr><th>{}</th><td>{v}</td></tr>", esc(k));
    }
    if !any {
        b.push_str("<tr><td>none</td></tr>");
    }
    b.push_str("</tbody></table>");
}

/// `?a=&b=&range=`.
#[derive(Debug, Deserialize)]
pub struct CompareQuery {
    a: Option<String>,
    b: Option<String>,
    range: Option<String>,
}

/// `GET /compare?a=&b=`: two endpoints of one model side by side.
pub async fn compare(
    State(d): State<Dashboards>,
    admin: Result<Admin, DashError>,
    q: Result<Query<CompareQuery>, DashError>,
) -> PageResult {
    let admin = admin?;
    let Query(q) = q?;
    let range = Range::parse(q.range.as_deref())?;
    let mut b = String::from("<form method=\"get\" action=\"/compare\" class=\"pick\">");
    for (name, chosen) in [("a", &q.a), ("b", &q.b)] {
        let _ = write!(b, "<label>{name} <select name=\"{name}\">");
        for m in &d.inner.models {
            for e in &m.endpoints {
                let sel = if chosen.as_deref() == Some(e.as_str()) {
                    " selected"
                } else {
                    ""
                };
                let _ = write!(
                    b,
                    "<option value=\"{v}\"{sel}>{m} · {v}</option>",
                    v = esc(e),
                    m = esc(&m.name)
                );
            }
        }
        b.push_str("</select></label> ");
    }
    let _ = write!(
        b,
        "<input type=\"hidden\" name=\"range\" value=\"{}\"><button>Compare</button></form>",
        range.name
    );
    if let (Some(a), Some(c)) = (&q.a, &q.b) {
        let ma = d.model_of(a).map(|m| m.name.clone());
        if ma.is_none() || ma != d.model_of(c).map(|m| m.name.clone()) {
            return Err(DashError::BadRequest(
                "compare two configured endpoints of the same model".to_owned(),
            )
            .into());
        }
        let da = view::endpoint(&d, a, range, None).await?;
        let dc = view::endpoint(&d, c, range, None).await?;
        b.push_str(TABLE_HEAD);
        row_html(&mut b, &da.row);
        row_html(&mut b, &dc.row);
        b.push_str("</tbody></table></div><div class=\"side\">");
        for det in [&da, &dc] {
            let _ = write!(b, "<div class=\"half\"><h2>{}</h2>", esc(&det.row.endpoint));
            detail_html(&mut b, det, &admin);
            b.push_str("</div>");
        }
        b.push_str("</div>");
    }
    Ok(html(page("Compare", &b)).into_response())
}

/// `GET /login`: the login form.
pub async fn login_form() -> Response {
    html(page("Log in", LOGIN_FORM)).into_response()
}

const LOGIN_FORM: &str = "<form method=\"post\" action=\"/login\" class=\"login\">\
    <label>Admin key <input type=\"password\" name=\"key\" autocomplete=\"off\" required></label> \
    <button>Log in</button></form><p class=\"muted\">Create one with \
    <code>samewise keys create NAME --admin</code>.</p>";

/// The login form's fields.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    key: String,
}

/// `POST /login`: an admin key starts a session (cookie) and goes to the overview.
pub async fn login(
    State(d): State<Dashboards>,
    f: Result<Form<LoginForm>, DashError>,
) -> PageResult {
    let Form(f) = f?;
    let key = d.inner.store.find_api_key(f.key.trim()).await?;
    match key {
        Some(k) if k.admin => {
            let (token, _) = d.inner.sessions.start(k.id)?;
            let cookie = format!(
                "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                d.inner.config.session_ttl_ms / 1000
            );
            let mut res = Redirect::to("/").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                res.headers_mut().insert(header::SET_COOKIE, v);
            }
            Ok(res)
        }
        Some(_) => Ok((
            StatusCode::FORBIDDEN,
            html(page(
                "Log in",
                &format!("<p class=\"error\">That key is not an admin key.</p>{LOGIN_FORM}"),
            )),
        )
            .into_response()),
        None => Ok((
            StatusCode::UNAUTHORIZED,
            html(page(
                "Log in",
                &format!("<p class=\"error\">Unknown or revoked key.</p>{LOGIN_FORM}"),
            )),
        )
            .into_response()),
    }
}

/// `POST /logout`: ends the session and clears the cookie.
pub async fn logout(State(d): State<Dashboards>, headers: HeaderMap) -> Response {
    if let Some(t) = auth::cookie(&headers, COOKIE) {
        d.inner.sessions.end(t);
    }
    let mut res = Redirect::to("/login").into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("samewise_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    res
}

/// `GET /assets/refresh.js`.
pub async fn refresh_js() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/javascript; charset=utf-8"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("max-age=300"),
            ),
        ],
        include_str!("../assets/refresh.js"),
    )
        .into_response()
}

/// `GET /assets/style.css`.
pub async fn style_css() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/css; charset=utf-8"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("max-age=300"),
            ),
        ],
        include_str!("../assets/style.css"),
    )
        .into_response()
}
