//! The demo's live terminal summary, read from the dashboards' JSON API with an admin key
//! (`/api/v1/overview`), exactly what the browser shows: one line per endpoint with its
//! three answers (changed? faithful? still works?), "≈ N-bit", effective context, traffic
//! share over the last five minutes and over the run, active alerts and eval verdicts; and
//! one event line whenever an alert opens or an eval job finishes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

/// One endpoint as the summary shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `provider/model`.
    pub endpoint: String,
    /// "yes" | "no" | "unknown".
    pub changed: String,
    /// "yes" | "no" | "unknown".
    pub faithful: String,
    /// "≈ 4-bit", when unfaithful on the ladder.
    pub bits: Option<String>,
    /// Effective context length by the latest long-context probe.
    pub context: Option<i64>,
    /// "yes" | "no" | "unknown".
    pub works: String,
    /// Routing state ("active", "demoted", "excluded").
    pub routing: String,
    /// Share of the model's requests over the last five minutes.
    pub share_recent: Option<f64>,
    /// Share over the last hour.
    pub share_run: Option<f64>,
    /// Requests over the last hour.
    pub requests: i64,
    /// Active alerts: `(id, kind, summary)`.
    pub alerts: Vec<(i64, String, String)>,
    /// Eval jobs, latest per suite: `(id, suite, verdict or state, summary)`.
    pub evals: Vec<(i64, String, String, String)>,
}

/// A client of the overview API.
#[derive(Debug, Clone)]
pub struct Overview {
    http: reqwest::Client,
    base_url: String,
    admin_key: String,
    model: String,
}

impl Overview {
    /// For `model` on the gateway at `base_url`.
    pub fn new(base_url: &str, admin_key: &str, model: &str) -> Overview {
        Overview {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap_or_default(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            admin_key: admin_key.to_owned(),
            model: model.to_owned(),
        }
    }

    async fn get(&self, range: &str) -> Result<Value, String> {
        let res = self
            .http
            .get(format!(
                "{}/api/v1/overview?range={range}&model={}",
                self.base_url, self.model
            ))
            .bearer_auth(&self.admin_key)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = res.status();
        let bytes = res.bytes().await.map_err(|e| e.to_string())?;
        let body: Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("{status}: not JSON ({e})"))?;
        if !status.is_success() {
            return Err(format!("{status}: {body}"));
        }
        Ok(body)
    }

    /// The model's rows now.
    pub async fn rows(&self) -> Result<Vec<Row>, String> {
        let run = self.get("1h").await?;
        let recent = self.get("5m").await?;
        let recent_share: BTreeMap<String, Option<f64>> = endpoints(&recent)
            .map(|e| (text(&e["endpoint"]), e["traffic_share"].as_f64()))
            .collect();
        Ok(endpoints(&run)
            .map(|e| {
                let endpoint = text(&e["endpoint"]);
                Row {
                    share_recent: recent_share.get(&endpoint).copied().flatten(),
                    changed: text(&e["changed"]["answer"]),
                    faithful: text(&e["faithful"]["answer"]),
                    bits: e["bits"].as_str().map(str::to_owned),
                    context: e["effective_context"].as_i64(),
                    works: text(&e["works"]["answer"]),
                    routing: text(&e["routing"]["state"]),
                    share_run: e["traffic_share"].as_f64(),
                    requests: e["requests"].as_i64().unwrap_or(0),
                    alerts: list(&e["alerts"])
                        .map(|a| {
                            (
                                a["id"].as_i64().unwrap_or(0),
                                text(&a["kind"]),
                                text(&a["summary"]),
                            )
                        })
                        .collect(),
                    evals: list(&e["evals"]["jobs"])
                        .map(|j| {
                            let v = j["verdict"]
                                .as_str()
                                .unwrap_or(j["state"].as_str().unwrap_or("?"));
                            (
                                j["id"].as_i64().unwrap_or(0),
                                text(&j["suite"]),
                                v.to_owned(),
                                text(&j["summary"]),
                            )
                        })
                        .collect(),
                    endpoint,
                }
            })
            .collect())
    }
}

fn endpoints(overview: &Value) -> impl Iterator<Item = &Value> {
    list(&overview["models"]).flat_map(|m| list(&m["endpoints"]))
}

fn list(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

fn pct(v: Option<f64>) -> String {
    v.map_or("—".to_owned(), |p| format!("{:.0}%", p * 100.0))
}

/// The table: a header and one line per endpoint.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "  {:<13} {:<8} {:<14} {:<7} {:<6} {:>9} {:>7}  {:<9} {:<22} {}\n",
        "endpoint",
        "changed?",
        "faithful?",
        "works?",
        "ctx",
        "share 5m",
        "all",
        "routing",
        "alerts",
        "evals"
    );
    for r in rows {
        let faithful = match &r.bits {
            Some(b) if r.faithful == "no" => format!("no ({b})"),
            _ => r.faithful.clone(),
        };
        let alerts = if r.alerts.is_empty() {
            "—".to_owned()
        } else {
            r.alerts
                .iter()
                .map(|(_, k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let evals = if r.evals.is_empty() {
            "—".to_owned()
        } else {
            r.evals
                .iter()
                .map(|(_, suite, v, _)| format!("{suite}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            s,
            "  {:<13} {:<8} {:<14} {:<7} {:<6} {:>9} {:>7}  {:<9} {:<22} {}",
            r.endpoint,
            r.changed,
            faithful,
            r.works,
            r.context.map_or("—".to_owned(), |c| c.to_string()),
            pct(r.share_recent),
            pct(r.share_run),
            r.routing,
            alerts,
            evals
        );
    }
    s
}

/// What happened between two readings: alerts opened, eval jobs opened and finished.
pub fn events(before: &[Row], now: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for r in now {
        let old = before.iter().find(|b| b.endpoint == r.endpoint);
        for (id, kind, summary) in &r.alerts {
            if !old.is_some_and(|o| o.alerts.iter().any(|a| a.0 == *id)) {
                out.push(format!("{} — alert #{id} {kind}: {summary}", r.endpoint));
            }
        }
        for (id, suite, v, summary) in &r.evals {
            let was = old.and_then(|o| o.evals.iter().find(|e| e.0 == *id));
            if was.is_none_or(|w| w.2 != *v) {
                let detail = if summary.is_empty() {
                    String::new()
                } else {
                    format!(" ({summary})")
                };
                out.push(format!(
                    "{} — eval job #{id} {suite}: {v}{detail}",
                    r.endpoint
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(endpoint: &str) -> Row {
        Row {
            endpoint: endpoint.into(),
            changed: "no".into(),
            faithful: "yes".into(),
            bits: None,
            context: Some(1024),
            works: "yes".into(),
            routing: "active".into(),
            share_recent: Some(0.25),
            share_run: Some(0.2),
            requests: 10,
            alerts: vec![],
            evals: vec![],
        }
    }

    #[test]
    fn events_name_new_alerts_and_changed_verdicts_once() {
        let before = vec![row("w4/smol")];
        let mut now = before.clone();
        now[0]
            .alerts
            .push((3, "unfaithful".into(), "≈ 4-bit".into()));
        now[0]
            .evals
            .push((9, "tool_calls".into(), "running".into(), String::new()));
        let e = events(&before, &now);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("alert #3 unfaithful"));
        assert!(events(&now, &now).is_empty());
        let mut done = now.clone();
        done[0].evals[0].2 = "degraded".into();
        let e = events(&now, &done);
        assert_eq!(e, ["w4/smol — eval job #9 tool_calls: degraded"]);
    }

    #[test]
    fn the_table_has_a_line_per_endpoint_with_the_bits() {
        let mut r = row("w4/smol");
        r.faithful = "no".into();
        r.bits = Some("≈ 4-bit".into());
        let t = table(&[row("exact/smol"), r]);
        assert_eq!(t.lines().count(), 3);
        assert!(t.contains("no (≈ 4-bit)") && t.contains("25%"), "{t}");
    }
}
