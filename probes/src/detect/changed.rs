//! changed?: the CUSUM charts over an endpoint's runs of a kind, from the fixed baseline
//! (stored apart, `Store::put_probe_baseline`) over the newest `history_runs` runs after it.

use std::collections::BTreeMap;

use samewise_store::{Alert, BaselineRun, NewAlert, ProbeBaseline, ProbeRun, Store};

use super::{Detectors, KIND_CHANGED, fmt_num, higher_is_better, stat, store_err};
use crate::Result;
use crate::noise::NoiseFloor;
use crate::sequential::{Cusum, CusumConfig, Observation, Shift, run_chart};

use super::DetectorConfig;

impl Detectors {
    /// The changed? charts' fixed baselines for `run`'s endpoint and kind, by statistic: the
    /// stored baseline that follows the last accepted change (`accepted_ms`), and for a
    /// statistic without one the first `cusum_baseline_rounds` series runs after that change
    /// that carry it, read from the store (oldest first, whatever `history_runs` holds) and
    /// stored once there are that many. Until then the baseline is the runs there are. A
    /// fingerprint's statistics are keyed by its inputs ([`chart_key`]): their first runs are
    /// those with the run's inputs, from the oldest such run `history` holds.
    pub(super) async fn baselines(
        &self,
        store: &Store,
        run: &ProbeRun,
        history: &[ProbeRun],
        accepted_ms: Option<i64>,
    ) -> Result<BTreeMap<String, Vec<BaselineRun>>> {
        let rounds = self.cfg.cusum.baseline_rounds;
        let mut out: BTreeMap<String, Vec<BaselineRun>> = store
            .probe_baselines(&run.model, &run.endpoint, &run.kind)
            .await
            .map_err(store_err)?
            .into_iter()
            .filter(|b| b.after_ms == accepted_ms && b.runs.len() == rounds)
            .map(|b| (b.statistic, b.runs))
            .collect();
        let inputs = inputs_of(run);
        let missing: Vec<&String> = self
            .cfg
            .cusum_statistics
            .iter()
            .filter(|key| {
                !out.contains_key(&chart_key(key, inputs)) && stat(&run.stats, key).is_some()
            })
            .collect();
        if missing.is_empty() {
            return Ok(out);
        }
        // twice the rounds: a statistic that a few early runs lack still finds its baseline
        let limit = u32::try_from(rounds.saturating_mul(2)).unwrap_or(u32::MAX);
        // a fingerprint's runs with these inputs start with the oldest one in the history
        let from = inputs.and_then(|i| {
            let first = history.iter().filter(|r| inputs_of(r) == Some(i));
            first.map(|r| r.started_ms - 1).min()
        });
        let after = match (accepted_ms, from) {
            (Some(a), Some(f)) => Some(a.max(f)),
            (a, f) => a.or(f),
        };
        let first = store
            .first_series_runs(&run.model, &run.endpoint, &run.kind, after, limit)
            .await
            .map_err(store_err)?;
        for key in missing {
            let runs: Vec<BaselineRun> = first
                .iter()
                .filter_map(|r| {
                    chart_value(r, key, inputs).map(|value| BaselineRun {
                        id: r.id,
                        started_ms: r.started_ms,
                        value,
                    })
                })
                .take(rounds)
                .collect();
            if runs.len() == rounds {
                store
                    .put_probe_baseline(&ProbeBaseline {
                        model: run.model.clone(),
                        endpoint: run.endpoint.clone(),
                        kind: run.kind.clone(),
                        statistic: chart_key(key, inputs),
                        after_ms: accepted_ms,
                        runs: runs.clone(),
                        created_ms: samewise_store::now_ms(),
                    })
                    .await
                    .map_err(store_err)?;
            }
            out.insert(chart_key(key, inputs), runs);
        }
        Ok(out)
    }

    /// The changed? finding: a CUSUM per watched statistic over the endpoint's runs of this
    /// kind (noise-floor repeats excluded, and only runs started after `accepted_ms`, when
    /// an operator last resolved the endpoint's "changed" alert), on `run`: an alarm, or,
    /// without one, a chart still out of control since its last alarm
    /// ([`Observation::out_of_control`](crate::sequential::Observation::out_of_control)). Each
    /// chart runs over the statistic's fixed baseline (`baselines`), then the runs of
    /// `history` after the baseline's last.
    pub(super) fn changed(
        &self,
        run: &ProbeRun,
        history: &[ProbeRun],
        floors: &BTreeMap<String, NoiseFloor>,
        accepted_ms: Option<i64>,
        baselines: &BTreeMap<String, Vec<BaselineRun>>,
    ) -> Result<Option<Changed>> {
        if run.repeat_of.is_some() {
            return Ok(None);
        }
        let series: Vec<&ProbeRun> = history
            .iter()
            .filter(|r| r.ok && r.repeat_of.is_none())
            .filter(|r| accepted_ms.is_none_or(|t| r.started_ms > t))
            .collect();
        let (mut alarms, mut held) = (Vec::new(), Vec::new());
        let mut threshold = self.cfg.cusum.h;
        let inputs = inputs_of(run);
        for key in &self.cfg.cusum_statistics {
            if stat(&run.stats, key).is_none() {
                continue;
            }
            let fingerprint = super::FINGERPRINT_STATS.contains(&key.as_str());
            let floor = floors.get(key.as_str()).and_then(|f| {
                // a fingerprint pair's values are distances (|first − repeat|) whatever the
                // statistic's direction
                if higher_is_better(key) && !fingerprint {
                    f.floor_rate().map(|r| 1.0 - r)
                } else {
                    f.floor()
                }
            });
            let least = if fingerprint {
                self.cfg.cusum.min_sd.max(self.cfg.fingerprint_min_sd)
            } else {
                self.cfg.cusum.min_sd
            };
            let min_sd = floor.map_or(least, |f| f.max(least));
            let baseline = baselines
                .get(&chart_key(key, inputs))
                .map_or(&[][..], Vec::as_slice);
            let after = baseline.last().map(|b| (b.started_ms, b.id));
            let (ids, values): (Vec<i64>, Vec<f64>) = baseline
                .iter()
                .map(|b| (b.id, b.value))
                .chain(
                    series
                        .iter()
                        .filter(|r| after.is_none_or(|a| (r.started_ms, r.id) > a))
                        .filter_map(|r| chart_value(r, key, inputs).map(|x| (r.id, x))),
                )
                .unzip();
            let (chart, observations) = changed_chart(&self.cfg, min_sd, &values)?;
            let last = ids
                .iter()
                .rposition(|&id| id == run.id)
                .map(|i| (values[i], observations[i]));
            let Some((x, obs)) = last else { continue };
            let (shift, still) = match (obs.alarm, obs.out_of_control) {
                (Some(shift), _) => (shift, false),
                (None, Some(shift)) => (shift, true),
                (None, None) => continue,
            };
            let Some((mean, sd)) = chart.baseline() else {
                continue;
            };
            threshold = chart.config().h;
            let baseline_ids: Vec<i64> = ids
                .iter()
                .take(self.cfg.cusum.baseline_rounds)
                .copied()
                .collect();
            let entry = serde_json::json!({
                "statistic": key,
                "value": x,
                "shift": match shift { Shift::Up => "up", Shift::Down => "down" },
                "held": still,
                "z": obs.z,
                // the restarted sums that alarm; a held entry is over h only without restarts
                "cusum": if still { serde_json::Value::Null } else { obs.s_hi.max(obs.s_lo).into() },
                "threshold": chart.config().h,
                "k": self.cfg.cusum.k,
                "arl0": self.cfg.cusum.arl0(),
                "baseline_mean": mean,
                "baseline_sd": sd,
                "baseline_runs": baseline_ids,
                "inputs": inputs,
            });
            if still {
                held.push(entry);
            } else {
                alarms.push(entry);
            }
        }
        let (still, entries) = match (alarms.is_empty(), held.is_empty()) {
            (true, true) => return Ok(None),
            (true, false) => (true, held),
            (false, _) => (false, alarms),
        };
        let parts: Vec<String> = entries
            .iter()
            .map(|a| {
                let key = a["statistic"].as_str().unwrap_or("?");
                let value = fmt_num(a["value"].as_f64().unwrap_or(f64::NAN));
                let base = fmt_num(a["baseline_mean"].as_f64().unwrap_or(f64::NAN));
                let dir = if a["shift"] == "up" { "rose" } else { "fell" };
                if still {
                    format!("{key} at {value}, still {dir} from baseline {base}")
                } else {
                    format!("{key} {dir} to {value} from baseline {base}")
                }
            })
            .collect();
        let summary = format!(
            "endpoint {} {} ({}): {} ({}, in-control ARL ≈ {:.0} rounds per chart)",
            run.endpoint,
            if still { "still changed" } else { "changed" },
            run.kind,
            parts.join("; "),
            if still {
                format!("CUSUM without restarts > {threshold:.2} since its alarm")
            } else {
                format!("CUSUM > {threshold:.2}")
            },
            self.cfg.cusum.arl0()
        );
        let finding = NewAlert {
            model: run.model.clone(),
            endpoint: run.endpoint.clone(),
            kind: KIND_CHANGED.to_owned(),
            summary,
            evidence: serde_json::json!({
                "detector": "changed",
                "probe_kind": run.kind,
                "statistic": entries.first().map(|a| a["statistic"].clone()),
                "value": entries.first().map(|a| a["value"].clone()),
                "threshold": threshold,
                "p_value": serde_json::Value::Null,
                "held": still,
                "alarms": entries,
                "probe_runs": [run.id],
            }),
            now_ms: run.finished_ms,
        };
        Ok(Some(if still {
            Changed::Held(finding)
        } else {
            Changed::Alarm(finding)
        }))
    }
}

/// A fingerprint run's inputs (`stats.inputs`: a digest of what it sent), None for the other
/// kinds.
fn inputs_of(run: &ProbeRun) -> Option<&str> {
    run.stats.get("inputs").and_then(serde_json::Value::as_str)
}

/// The name a statistic's chart and stored baseline go by: `key`, or for a fingerprint
/// `key@inputs`, so that changing what the fingerprint sends starts new charts from the
/// runs with the new inputs instead of alarming against the old ones.
fn chart_key(key: &str, inputs: Option<&str>) -> String {
    match inputs {
        Some(i) => format!("{key}@{i}"),
        None => key.to_owned(),
    }
}

/// `key` of run `r` when it belongs on the chart of runs with `inputs`.
fn chart_value(r: &ProbeRun, key: &str, inputs: Option<&str>) -> Option<f64> {
    if inputs.is_some() && inputs_of(r) != inputs {
        return None;
    }
    stat(&r.stats, key)
}

/// What changed? found on a run.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Changed {
    /// A chart alarmed: raise "changed" (open it, or refresh the active one).
    Alarm(NewAlert),
    /// No alarm, but a chart has stayed out of control since its last one: confirm the active
    /// "changed" alert (its quiet period starts over), open none.
    Held(NewAlert),
}

/// A held confirmation replaces the alert's evidence with how the chart stands now; it keeps
/// the alarm that last raised or refreshed the alert beside it, so the alert still shows what
/// alarmed: `evidence.last_alarm` is the active alert's evidence when that was an alarm's
/// (without the verdicts the store keeps apart), with `at_ms` when it was seen, or else the
/// `last_alarm` the held evidence already carries.
pub(super) fn keep_last_alarm(finding: &mut NewAlert, active: &Alert) {
    let alarm = if active.evidence["held"] == true {
        active.evidence.get("last_alarm").cloned()
    } else {
        let mut e = active.evidence.clone();
        if let Some(o) = e.as_object_mut() {
            o.remove("evals");
            o.insert("at_ms".to_owned(), active.last_seen_ms.into());
        }
        Some(e)
    };
    if let (Some(alarm), Some(o)) = (alarm, finding.evidence.as_object_mut()) {
        o.insert("last_alarm".to_owned(), alarm);
    }
}

/// The chart configuration the changed? detector uses for one statistic: the configured
/// chart with `min_sd` (the configured minimum, raised by the statistic's noise floor) and,
/// with `cusum_baseline_correction` (the default), `h` raised for the estimated baseline
/// ([`CusumConfig::for_estimated_baseline`]) so that the in-control false-alarm rate per
/// chart is the documented `1/cusum_arl0`.
pub fn changed_chart_config(cfg: &DetectorConfig, min_sd: f64) -> Result<CusumConfig> {
    let chart = CusumConfig {
        min_sd,
        ..cfg.cusum
    };
    if cfg.cusum_baseline_correction {
        chart.for_estimated_baseline()
    } else {
        Ok(chart)
    }
}

/// The changed? chart of one statistic over an endpoint's series of per-run values (oldest
/// first, runs after the last accepted change): [`changed_chart_config`] fed the values in
/// order. `Detectors::changed` raises "changed" when the newest run's observation alarms;
/// the benchmark (`probes/examples/detection_power/`) calls this same function.
pub fn changed_chart(
    cfg: &DetectorConfig,
    min_sd: f64,
    values: &[f64],
) -> Result<(Cusum, Vec<Observation>)> {
    run_chart(changed_chart_config(cfg, min_sd)?, values)
}
