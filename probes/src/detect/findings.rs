//! The faithful? findings that need no ladder: a fault signature that is a finding by itself
//! and the long-context probe's effective context (one run's statistics alone), and the
//! tool_calls probe's paired pass/fail outcomes against the reference's (pooled per case over
//! the endpoint's recent runs).

use samewise_store::{NewAlert, ProbeRun};

use super::{KIND_UNFAITHFUL, stat};

/// The `unfaithful` alert `run` raises, with its `summary` and `evidence` (to which it adds
/// `detector: "faithful"` and the run's `probe_kind`).
pub(super) fn unfaithful(
    run: &ProbeRun,
    summary: String,
    mut evidence: serde_json::Value,
) -> NewAlert {
    if let Some(e) = evidence.as_object_mut() {
        e.insert("detector".into(), "faithful".into());
        e.insert("probe_kind".into(), run.kind.clone().into());
    }
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

/// The tool_calls probe's paired finding over `history` (the endpoint's tool_calls runs, oldest
/// first, `run` among them): each case's newest outcome on both sides (`stats.cases` and
/// `stats.passes`) among the runs that started after `accepted_ms` (an operator's last
/// resolution of the endpoint's "unfaithful" alert) and not after `run`; flagged when the
/// endpoint fails more of them where the reference passes than the reverse, at McNemar's
/// exact p < `alpha`. One outcome per case: a case seen in many rounds is one piece of
/// evidence, so an endpoint that differs on a single case is never flagged by repetition. Only
/// runs asked as `run` was are pooled (`stats.forced_calls`, false where a run predates it): a
/// case's outcome under `tool_choice: "required"` and under `"auto"` are different questions,
/// so flipping `force_tool_calls` starts the pool over, as a resolution does. The
/// alert counts why the endpoint failed the cases it lost (`stats.faults`: `no_call`,
/// `unexpected_call`, or a call's verdict), so it says how the calls broke.
pub(super) fn tool_calls_finding(
    run: &ProbeRun,
    history: &[ProbeRun],
    accepted_ms: Option<i64>,
    alpha: f64,
) -> Option<NewAlert> {
    use std::collections::BTreeMap;
    // per case: reference passed, endpoint passed, the run, why the endpoint failed
    let mut newest: BTreeMap<&str, (bool, bool, i64, Option<&str>)> = BTreeMap::new();
    let forced = |r: &ProbeRun| {
        r.stats
            .get("forced_calls")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    for r in history.iter().filter(|r| {
        r.ok && r.kind == run.kind
            && r.repeat_of.is_none()
            && forced(r) == forced(run)
            && r.started_ms <= run.started_ms
            && accepted_ms.is_none_or(|t| r.started_ms > t)
    }) {
        let (Some(cases), Some(passes)) = (
            r.stats.get("cases").and_then(serde_json::Value::as_array),
            r.stats.get("passes").and_then(serde_json::Value::as_array),
        ) else {
            continue;
        };
        // why each side failed, where the run says (runs before `faults` was kept do not)
        let faults = r.stats.get("faults").and_then(serde_json::Value::as_array);
        for (i, (case, pass)) in cases.iter().zip(passes).enumerate() {
            let fault = faults
                .and_then(|f| f.get(i))
                .and_then(|f| f.get(1))
                .and_then(serde_json::Value::as_str);
            let (Some(case), Some(reference), Some(endpoint)) = (
                case.as_str(),
                pass.get(0).and_then(serde_json::Value::as_bool),
                pass.get(1).and_then(serde_json::Value::as_bool),
            ) else {
                continue;
            };
            newest.insert(case, (reference, endpoint, r.id, fault));
        }
    }
    let lost: Vec<&str> = newest
        .iter()
        .filter(|(_, (r, e, _, _))| *r && !*e)
        .map(|(c, _)| *c)
        .collect();
    let won: Vec<&str> = newest
        .iter()
        .filter(|(_, (r, e, _, _))| !*r && *e)
        .map(|(c, _)| *c)
        .collect();
    let (b, c) = (lost.len() as u64, won.len() as u64);
    if b <= c {
        return None;
    }
    let p = samewise_toolcheck::vendor::mcnemar_exact(b, c);
    if p >= alpha {
        return None;
    }
    let both = newest.values().filter(|(r, e, _, _)| *r && *e).count();
    // the endpoint's faults on the cases it lost: a diagnosis (calls broken, calls refused,
    // calls where none belong), not only a count
    let mut why: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, _, _, fault) in newest.values().filter(|(r, e, _, _)| *r && !*e) {
        *why.entry(fault.unwrap_or("unrecorded")).or_default() += 1;
    }
    let mut by_count: Vec<(&str, usize)> = why.iter().map(|(k, n)| (*k, *n)).collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let faults = by_count
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut runs: Vec<i64> = newest.values().map(|v| v.2).collect();
    runs.sort_unstable();
    runs.dedup();
    let summary = format!(
        "endpoint {}: tool calls fail where the reference's pass — {b} of {} cases lost, {c} won (McNemar p = {p:.2e}; both pass {both}) over {} tool_calls runs; the endpoint's faults: {faults}",
        run.endpoint,
        newest.len(),
        runs.len()
    );
    Some(unfaithful(
        run,
        summary,
        serde_json::json!({
            "statistic": "tool_calls_passes",
            "cases": newest.len(),
            "lost": lost,
            "won": won,
            "lost_faults": why,
            "both_pass": both,
            "threshold": alpha,
            "p_value": p,
            "schema_accuracy": run.stats.get("schema_accuracy").cloned().unwrap_or(serde_json::Value::Null),
            "reference_schema_accuracy": run.stats.get("reference_schema_accuracy").cloned().unwrap_or(serde_json::Value::Null),
            "probe_runs": runs,
        }),
    ))
}
