//! `GET /evals/{id}`: one eval job down to the failing item — the verdict with its stated
//! parameters, both sides' pass rates and failure buckets, then every item on the suspect and
//! the baseline (the items the suspect failed and the baseline passed first), each with the
//! request, the answer and the check as the worker stored them. Everything is escaped.

use std::fmt::Write;

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use serde_json::Value;

use super::{PageResult, html};
use crate::auth::Admin;
use crate::html::{esc, page, time, url};
use crate::view::evals::{ItemSide, job};
use crate::{DashError, Dashboards};

fn side_html(b: &mut String, s: Option<&ItemSide>) {
    match s {
        None => b.push_str("<td class=\"muted\">not run</td>"),
        Some(s) => {
            let record = serde_json::to_string_pretty(&s.record).unwrap_or_default();
            let _ = write!(
                b,
                "<td><details class=\"verdict {tone}\"><summary>{ans}</summary><pre>{rec}</pre></details></td>",
                tone = if s.passed { "good" } else { "bad" },
                ans = if s.passed {
                    "passed".to_owned()
                } else {
                    esc(s.error_type.as_deref().unwrap_or("failed"))
                },
                rec = esc(&record)
            );
        }
    }
}

fn rate(v: &Value, side: &str) -> String {
    let s = &v[side];
    let n = s["n"].as_u64().unwrap_or(0);
    match (s["rate"].as_f64(), s["wilson95"].as_array()) {
        (Some(r), Some(w)) if w.len() == 2 => format!(
            "{:.0}% <span class=\"muted\">[{:.0}%, {:.0}%] of {n}</span>",
            r * 100.0,
            w[0].as_f64().unwrap_or(0.0) * 100.0,
            w[1].as_f64().unwrap_or(0.0) * 100.0
        ),
        (Some(r), _) => format!("{:.0}% of {n}", r * 100.0),
        _ => "—".to_owned(),
    }
}

/// `GET /evals/{id}`.
pub async fn job_page(
    State(d): State<Dashboards>,
    admin: Result<Admin, DashError>,
    Path(id): Path<i64>,
) -> PageResult {
    admin?;
    let j = job(&d, id).await?;
    let mut b = format!(
        "<dl><dt>Endpoint</dt><dd><a href=\"/endpoint?e={u}\">{e}</a> ({m})</dd><dt>Suite</dt><dd>{s}</dd>\
         <dt>Baseline</dt><dd>{base}</dd><dt>State</dt><dd class=\"state\">{st}</dd><dt>Opened</dt><dd>{o}</dd>\
         <dt>Finished</dt><dd>{f}</dd><dt>Tokens</dt><dd>{t}</dd>{alert}</dl>",
        u = url(&j.endpoint),
        e = esc(&j.endpoint),
        m = esc(&j.model),
        s = esc(&j.job.suite),
        base = esc(&j.baseline),
        st = esc(j.job.state),
        o = esc(&time(j.job.created_ms)),
        f = j.finished_ms.map_or("—".to_owned(), |t| esc(&time(t))),
        t = j.tokens,
        alert = j.job.alert_id.map_or(String::new(), |a| format!(
            "<dt>Opened by</dt><dd><a href=\"/alerts/{a}\">alert {a}</a></dd>"
        )),
    );
    if let Some(v) = &j.verdict {
        let _ = write!(
            b,
            "<h2>Verdict: <span class=\"verdict-word\">{verdict}</span></h2>\
             <table><tr><th></th><th>Pass rate (95% Wilson)</th></tr>\
             <tr><td>suspect</td><td>{sr}</td></tr><tr><td>baseline</td><td>{br}</td></tr></table>\
             <p>{summary}</p><details><summary>The verdict document</summary><pre>{doc}</pre></details>",
            verdict = esc(v["verdict"].as_str().unwrap_or("?")),
            sr = rate(v, "suspect"),
            br = rate(v, "baseline"),
            summary = esc(j.job.summary.as_deref().unwrap_or("")),
            doc = esc(&serde_json::to_string_pretty(v).unwrap_or_default()),
        );
    }
    let regressed = j.items.iter().filter(|i| i.regressed()).count();
    let _ = write!(
        b,
        "<h2>Items ({n}; the suspect failed and the baseline passed on {regressed})</h2>\
         <div class=\"scroll\"><table class=\"items\"><thead><tr><th>Item</th><th>Suspect</th>\
         <th>Baseline</th></tr></thead><tbody>",
        n = j.items.len()
    );
    for i in &j.items {
        let _ = write!(
            b,
            "<tr class=\"{c}\"><td>{item}</td>",
            c = if i.regressed() { "regressed" } else { "" },
            item = esc(&i.item)
        );
        side_html(&mut b, i.suspect.as_ref());
        side_html(&mut b, i.baseline.as_ref());
        b.push_str("</tr>");
    }
    b.push_str("</tbody></table></div>");
    Ok(html(page(&format!("Eval job {id}"), &b)).into_response())
}
