//! The faithful? findings read from one run's statistics alone, with no threshold or ladder:
//! a fault signature that is a finding by itself, and the long-context probe's effective
//! context.

use samewise_store::{NewAlert, ProbeRun};

use super::{KIND_UNFAITHFUL, stat};

/// The `unfaithful` alert `run` raises, with its `summary` and `evidence`.
pub(super) fn unfaithful(run: &ProbeRun, summary: String, evidence: serde_json::Value) -> NewAlert {
    NewAlert {
        model: run.model.clone(),
        endpoint: run.endpoint.clone(),
        kind: KIND_UNFAITHFUL.to_owned(),
        summary,
        evidence,
        now_ms: run.finished_ms,
    }
}

/// Fault signatures that are findings by themselves, whatever the statistic says: the
/// weights may be served exactly, yet the endpoint does not do what requests ask.
const STANDALONE_SIGNATURES: [&str; 1] = ["sampling_ignored"];

/// The finding of a run whose diagnosis is one of [`STANDALONE_SIGNATURES`].
pub(super) fn signature_finding(run: &ProbeRun) -> Option<NewAlert> {
    let d = run.stats.get("diagnosis")?;
    let signature = d.get("signature")?.as_str()?;
    if !STANDALONE_SIGNATURES.contains(&signature) {
        return None;
    }
    let text = d.get("text")?.as_str()?;
    Some(unfaithful(
        run,
        format!("endpoint {}: {text}", run.endpoint),
        serde_json::json!({
            "detector": "faithful",
            "probe_kind": run.kind,
            "statistic": signature,
            "diagnosis": d,
            "p_value": serde_json::Value::Null,
            "probe_runs": [run.id],
        }),
    ))
}

pub(super) fn long_context_finding(run: &ProbeRun) -> Option<NewAlert> {
    let value = stat(&run.stats, "effective_context")?;
    let reference = stat(&run.stats, "reference_effective_context")?;
    let (v, r) = (value.max(0.0) as u32, reference.max(0.0) as u32);
    if !samewise_longctx::context::one_doubling_below(v, r) {
        return None;
    }
    let lengths: Vec<serde_json::Value> = run
        .stats
        .get("lengths")
        .and_then(serde_json::Value::as_array)
        .map(|ls| {
            ls.iter()
                .map(|l| {
                    serde_json::json!({"length": l["length"], "passed": l["passed"],
                        "reference_passed": l["reference_passed"], "queries": l["queries"],
                        "below": l["below"], "truncated": l["truncated"]})
                })
                .collect()
        })
        .unwrap_or_default();
    let detail: Vec<String> = lengths
        .iter()
        .map(|l| {
            format!(
                "{}: {}/{} vs {}/{}",
                l["length"], l["passed"], l["queries"], l["reference_passed"], l["queries"]
            )
        })
        .collect();
    let diagnosis = run.stats.get("diagnosis").filter(|d| d.is_object());
    let why = diagnosis
        .and_then(|d| d.get("text"))
        .and_then(serde_json::Value::as_str)
        .map_or(String::new(), |t| format!(": {t}"));
    let summary = format!(
        "endpoint {}: effective context {v} tokens, reference {r}{why} (long_context passes per length, endpoint vs reference: {})",
        run.endpoint,
        detail.join(", ")
    );
    Some(unfaithful(
        run,
        summary,
        serde_json::json!({
            "detector": "faithful",
            "probe_kind": run.kind,
            "statistic": "effective_context",
            "value": v,
            "reference_value": r,
            "threshold": r / 2,
            "window": run.stats.get("window").cloned().unwrap_or(serde_json::Value::Null),
            "scoring": run.stats.get("scoring").cloned().unwrap_or(serde_json::Value::Null),
            "lengths": lengths,
            "diagnosis": diagnosis.cloned().unwrap_or(serde_json::Value::Null),
            "p_value": serde_json::Value::Null,
            "probe_runs": [run.id],
        }),
    ))
}
