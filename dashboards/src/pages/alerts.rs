//! The alert pages: `GET /alerts` (every alert, or those of a state), `GET /alerts/{id}` (one
//! alert with its evidence, the eval jobs that answer it and, for an `eval_degraded` alert,
//! the active alerts that hold it) and the acknowledge / resolve forms' `POST`s. Every string
//! from the store goes through [`esc`].

use std::fmt::Write;

use axum::extract::State;
use axum::response::{IntoResponse, Redirect};
use samewise_store::AlertState;
use serde::Deserialize;

use super::{PageResult, html};
use crate::auth::Admin;
use crate::extract::{Form, Path, Query};
use crate::html::{esc, page, time, url};
use crate::view::{self, AlertView};
use crate::{DashError, Dashboards};

pub(super) fn alerts_table(b: &mut String, alerts: &[AlertView], admin: &Admin) {
    if alerts.is_empty() {
        b.push_str("<p>No alerts.</p>");
        return;
    }
    b.push_str(
        "<div class=\"scroll\"><table class=\"alerts\"><thead><tr><th>#</th><th>Endpoint</th>\
         <th>Kind</th><th>State</th><th>Opened</th><th>Summary</th><th></th></tr></thead><tbody>",
    );
    for a in alerts {
        let _ = write!(
            b,
            "<tr data-alert=\"{id}\"><td><a href=\"/alerts/{id}\">{id}</a></td><td>{e}</td><td>{k}</td>\
             <td class=\"state\">{s}</td><td>{o}</td><td>{sum}</td><td>{f}</td></tr>",
            id = a.id,
            e = esc(&a.endpoint),
            k = esc(&a.kind),
            s = esc(a.state),
            o = esc(&time(a.opened_ms)),
            sum = esc(&a.summary),
            f = alert_forms(a, admin)
        );
    }
    b.push_str("</tbody></table></div>");
}

/// The alert page's "Resolved" row: when, and by whom; empty while the alert is active.
fn resolution(a: &AlertView) -> String {
    let Some(ms) = a.resolved_ms else {
        return String::new();
    };
    let by = match a.resolved_by {
        Some("operator") => " by an operator",
        Some("quiet") => " automatically, after its quiet period",
        _ => "",
    };
    format!(
        "<dt>Resolved</dt><dd class=\"resolved\">{}{by}</dd>",
        esc(&time(ms))
    )
}

fn alert_forms(a: &AlertView, admin: &Admin) -> String {
    let csrf = esc(admin.csrf());
    let mut f = String::new();
    if a.state == "open" {
        let _ = write!(
            f,
            "<form method=\"post\" action=\"/alerts/{}/ack\" class=\"inline\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><button class=\"ack\">Acknowledge</button></form>",
            a.id
        );
    }
    if a.state != "resolved" {
        let _ = write!(
            f,
            "<form method=\"post\" action=\"/alerts/{}/resolve\" class=\"inline\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><button class=\"resolve\">Resolve</button></form>",
            a.id
        );
    }
    f
}

/// `?state=`.
#[derive(Debug, Deserialize)]
pub struct AlertsQuery {
    state: Option<String>,
}

/// `GET /alerts`: every alert (or those in `?state=`), newest first.
pub async fn alerts(
    State(d): State<Dashboards>,
    admin: Result<Admin, DashError>,
    q: Result<Query<AlertsQuery>, DashError>,
) -> PageResult {
    let admin = admin?;
    let Query(q) = q?;
    let state = match q.state.as_deref() {
        None | Some("") | Some("all") => None,
        Some(s) => Some(
            AlertState::parse(s)
                .ok_or_else(|| DashError::BadRequest(format!("unknown alert state {s:?}")))?,
        ),
    };
    let list = view::alerts(&d, state, 500).await?;
    let mut b = String::from(
        "<p class=\"ranges\">Show: <a href=\"/alerts\">all</a> <a href=\"/alerts?state=open\">open</a> \
         <a href=\"/alerts?state=acknowledged\">acknowledged</a> <a href=\"/alerts?state=resolved\">resolved</a></p>",
    );
    alerts_table(&mut b, &list, &admin);
    Ok(html(page("Alerts", &b)).into_response())
}

/// `GET /alerts/{id}`: one alert with its evidence, the eval jobs that answer it and, for a
/// verdict's alert, the alerts that hold it.
pub async fn alert(
    State(d): State<Dashboards>,
    admin: Result<Admin, DashError>,
    id: Result<Path<i64>, DashError>,
) -> PageResult {
    let admin = admin?;
    let Path(id) = id?;
    let detail = view::evals::alert_detail(&d, id).await?;
    let a = &detail.alert;
    let evidence = serde_json::to_string_pretty(&a.evidence).unwrap_or_default();
    let mut jobs = String::new();
    for j in &detail.eval_jobs {
        let by = match j.alert_id {
            Some(x) if x == id => String::new(),
            Some(x) => format!(" (opened by <a href=\"/alerts/{x}\">alert {x}</a>)"),
            None => " (opened by hand)".to_owned(),
        };
        let _ = write!(
            jobs,
            "<li><a href=\"/evals/{}\">{}: {}</a>{by} <span class=\"muted\">{}</span></li>",
            j.id,
            esc(&j.suite),
            esc(j.verdict.as_deref().unwrap_or(j.state)),
            esc(j.summary.as_deref().unwrap_or(""))
        );
    }
    if !jobs.is_empty() {
        jobs = format!("<h2>Eval jobs that answer it</h2><ul class=\"jobs\">{jobs}</ul>");
    }
    let b = format!(
        "<dl><dt>Endpoint</dt><dd><a href=\"/endpoint?e={u}\">{e}</a> ({m})</dd><dt>Kind</dt><dd>{k}</dd>\
         <dt>State</dt><dd class=\"state\">{s}</dd><dt>Opened</dt><dd>{o}</dd><dt>Last seen</dt><dd>{l}</dd>{held}{r}\
         <dt>Summary</dt><dd class=\"summary\">{sum}</dd></dl>{jobs}<h2>Evidence</h2><pre class=\"evidence\">{ev}</pre>{f}",
        u = url(&a.endpoint),
        e = esc(&a.endpoint),
        m = esc(&a.model),
        k = esc(&a.kind),
        s = esc(a.state),
        o = esc(&time(a.opened_ms)),
        l = esc(&time(a.last_seen_ms)),
        held = held_by(detail.held_by.as_deref()),
        r = resolution(a),
        sum = esc(&a.summary),
        ev = esc(&evidence),
        f = alert_forms(a, &admin)
    );
    Ok(html(page(&format!("Alert {id}"), &b)).into_response())
}

/// A verdict's alert's "Held by" row (nothing for other alerts).
fn held_by(holders: Option<&[view::evals::Holder]>) -> String {
    let Some(holders) = holders else {
        return String::new();
    };
    let mut dd = String::new();
    for h in holders {
        let sep = if dd.is_empty() { "" } else { ", " };
        let _ = write!(
            dd,
            "{sep}<a href=\"/alerts/{}\">alert {}</a> ({})",
            h.id,
            h.id,
            esc(&h.kind)
        );
    }
    if dd.is_empty() {
        dd.push_str(
            "no active alert: resolved after its quiet period unless a verdict raises it again",
        );
    }
    format!("<dt>Held by</dt><dd class=\"held\">{dd}</dd>")
}

/// A form's CSRF field.
#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    csrf: Option<String>,
}

/// `POST /alerts/{id}/ack`.
pub async fn ack(
    State(d): State<Dashboards>,
    admin: Result<Admin, DashError>,
    id: Result<Path<i64>, DashError>,
    f: Result<Form<CsrfForm>, DashError>,
) -> PageResult {
    set(d, admin, id, f, false).await
}

/// `POST /alerts/{id}/resolve`.
pub async fn resolve(
    State(d): State<Dashboards>,
    admin: Result<Admin, DashError>,
    id: Result<Path<i64>, DashError>,
    f: Result<Form<CsrfForm>, DashError>,
) -> PageResult {
    set(d, admin, id, f, true).await
}

async fn set(
    d: Dashboards,
    admin: Result<Admin, DashError>,
    id: Result<Path<i64>, DashError>,
    f: Result<Form<CsrfForm>, DashError>,
    resolve: bool,
) -> PageResult {
    let admin = admin?;
    let (Path(id), Form(f)) = (id?, f?);
    admin.check_csrf(f.csrf.as_deref())?;
    view::set_alert(&d, id, resolve).await?;
    Ok(Redirect::to(&format!("/alerts/{id}")).into_response())
}
