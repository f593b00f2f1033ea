//! Naming a fault signature in a faithful? finding: the run's own diagnosis (written by the
//! probe kind, `crate::kinds::diagnose`), or `different_model` over the endpoint's runs pooled
//! since it went over the threshold.

use samewise_store::ProbeRun;

use super::fmt_num;
use crate::compare::decode_positions;

/// Most prompt_logprobs runs pooled for a `different_model` diagnosis.
const POOLED_RUNS: usize = 16;

/// A faithful finding whose run carries a fault signature (`stats.diagnosis`, see
/// [`crate::kinds::diagnose`]) names the signature instead of a bit width: the statistic is
/// still over the threshold, but "≈ N-bit weights" would misdiagnose an API or template
/// fault. The ladder's reading stays in the evidence as `ladder_reading`, out of
/// `equivalent` (what pages show as "≈ N-bit").
pub(super) fn diagnosed(
    run: &ProbeRun,
    diagnosis: Option<&serde_json::Value>,
    label: &str,
    summary: String,
    mut evidence: serde_json::Value,
) -> (String, serde_json::Value) {
    let Some(d) = diagnosis.filter(|d| d.is_object()) else {
        return (summary, evidence);
    };
    let text = d
        .get("text")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("a known fault signature");
    let value = evidence.get("value").cloned();
    let threshold = evidence.get("threshold").cloned();
    if let Some(e) = evidence.as_object_mut() {
        if let Some(eq) = e.remove("equivalent_text") {
            e.insert("ladder_reading".into(), eq);
        }
        e.remove("equivalent");
        e.insert("diagnosis".into(), d.clone());
    }
    let num = |v: Option<serde_json::Value>| v.and_then(|v| v.as_f64()).map_or("?".into(), fmt_num);
    (
        format!(
            "endpoint {}: {text} ({label} {} over {}; not read as a weight width)",
            run.endpoint,
            num(value),
            num(threshold)
        ),
        evidence,
    )
}

/// The runs of `history` that [`pooled_diagnosis`] may pool with `run`, newest first: the
/// earlier ones that ran and are not repeats, at most [`POOLED_RUNS`] - 1.
fn earlier<'a>(run: &'a ProbeRun, history: &'a [ProbeRun]) -> impl Iterator<Item = &'a ProbeRun> {
    history
        .iter()
        .rev()
        .filter(move |r| r.id != run.id && r.ok && r.repeat_of.is_none())
        .take(POOLED_RUNS - 1)
}

/// The ids of the runs whose raw data [`pooled_diagnosis`] reads for `run`, when `run` is
/// flagged: none unless it would pool at all.
pub(super) fn pooled_candidates(run: &ProbeRun, history: &[ProbeRun]) -> Vec<i64> {
    if !pools(run) {
        return Vec::new();
    }
    earlier(run, history).map(|r| r.id).collect()
}

/// Whether [`pooled_diagnosis`] pools for `run`: a prompt_logprobs run without a signature of
/// its own.
fn pools(run: &ProbeRun) -> bool {
    run.kind == "prompt_logprobs" && run.stats.get("diagnosis").is_none()
}

/// The `different_model` diagnosis of an unfaithful prompt_logprobs run that has none of its
/// own, over its positions and those of the endpoint's runs just before it that were over the
/// threshold too (`over`), back to the first that was not, carried another signature, had
/// no per-position data or scored a text already pooled (`stats.texts`; at most
/// [`POOLED_RUNS`]; repeats of a noise-floor pair are left out: they score the same texts
/// again). One round of a few hundred positions rarely has the
/// power to tell a different model from drift of the same KL (`probes/README.md`); the rounds
/// since the endpoint went over the threshold together do. `history` is oldest first and
/// ends with `run`.
pub(super) fn pooled_diagnosis(
    run: &ProbeRun,
    history: &[ProbeRun],
    over: impl Fn(&ProbeRun) -> bool,
) -> Option<serde_json::Value> {
    if !pools(run) {
        return None;
    }
    let mut ids = Vec::new();
    let mut inputs = Vec::new();
    // each text counted once: a deterministic endpoint scores a text the same every round,
    // and a repeat would shrink the standard error without adding evidence
    let mut texts: Vec<&str> = Vec::new();
    for r in std::iter::once(run).chain(earlier(run, history)) {
        let other_signature = r
            .stats
            .pointer("/diagnosis/signature")
            .is_some_and(|sig| sig != "different_model");
        let run_texts: Vec<&str> = r
            .stats
            .get("texts")
            .and_then(serde_json::Value::as_array)
            .map(|t| t.iter().filter_map(serde_json::Value::as_str).collect())
            .unwrap_or_default();
        let repeated = run_texts.iter().any(|t| texts.contains(t));
        if ids.len() == POOLED_RUNS || other_signature || repeated || !over(r) {
            break;
        }
        texts.extend(run_texts);
        let Some(mut pos) = r.raw.as_deref().and_then(|b| decode_positions(b).ok()) else {
            break;
        };
        ids.push(r.id);
        inputs.append(&mut pos);
    }
    let mut d = crate::kinds::different_model(&inputs)?;
    if ids.len() > 1 {
        let text = d["text"].as_str().unwrap_or_default().to_owned();
        d["text"] = serde_json::json!(format!(
            "{text}; over this run and the {} before it that were over the threshold too",
            ids.len() - 1
        ));
    }
    d["probe_runs"] = serde_json::json!(ids);
    Some(d)
}
