//! Noise floors: how far an endpoint's two runs of the same probe differ (a noise-floor
//! pair), per run-stats key, from the pair's stored statistics or, for a pair stored without
//! them, from both runs' raw data; and the raw data the detectors read for the few runs that
//! need it.

use std::collections::BTreeMap;

use samewise_store::{ProbeRun, Store};

use super::{stat, store_err};
use crate::Result;
use crate::compare::{RunSummary, decode_positions};
use crate::noise::{NoiseFloor, repeat_summary};

/// The value of run-stats key `key` in a repeat summary, if it has one.
fn summary_stat(s: &RunSummary, key: &str) -> Option<f64> {
    match key {
        "kl_mean" => Some(s.kl_mean),
        "kl_p99" => Some(s.kl_p99),
        "dlogprob_mean" => Some(s.abs_dlogprob_mean),
        "top1_same" => Some(s.top1_same),
        "topk_overlap" => Some(s.topk_overlap),
        _ => None,
    }
}

/// The run-stats keys a noise floor is kept for.
const FLOOR_KEYS: [&str; 5] = [
    "kl_mean",
    "kl_p99",
    "dlogprob_mean",
    "top1_same",
    "topk_overlap",
];

/// A noise-floor pair's statistics (a run and its repeat, compared position by position from
/// their raw data: `kl_mean`, `kl_p99`, `dlogprob_mean`, `top1_same`, `topk_overlap`): what
/// the scheduler stores in the repeat's `stats.noise_pair`, so that the detectors read noise
/// floors from the runs' statistics without their raw data. An error when the data do not
/// line up (different generated tokens).
pub fn noise_pair_stats(first_raw: &[u8], repeat_raw: &[u8]) -> Result<serde_json::Value> {
    let summary = repeat_summary(
        &decode_positions(first_raw)?,
        &decode_positions(repeat_raw)?,
    )?;
    Ok(serde_json::Value::Object(
        FLOOR_KEYS
            .iter()
            .filter_map(|&k| summary_stat(&summary, k).map(|v| (k.to_owned(), v.into())))
            .collect(),
    ))
}

/// A fingerprint's noise-floor pair's statistics: per statistic of
/// [`FINGERPRINT_STATS`](super::FINGERPRINT_STATS) both runs have, how far apart they are
/// (`|first − repeat|`: its own logprobs on the same inputs asked twice). Null when the two
/// runs sent different inputs.
pub fn fingerprint_pair_stats(
    first: &serde_json::Value,
    repeat: &serde_json::Value,
) -> serde_json::Value {
    if first.get("inputs") != repeat.get("inputs") {
        return serde_json::Value::Null;
    }
    serde_json::Value::Object(
        super::FINGERPRINT_STATS
            .iter()
            .filter_map(|&k| {
                Some((
                    k.to_owned(),
                    (stat(first, k)? - stat(repeat, k)?).abs().into(),
                ))
            })
            .collect(),
    )
}

/// Noise floors per run-stats key, from the noise-floor pairs in `history` (a run with
/// `repeat_of` and its first run): the pair's `stats.noise_pair`, or, for a pair stored
/// without it, the pair's statistics from both runs' raw data. Pairs whose data do not line
/// up (different generated tokens; the scheduler stores `noise_pair: null`) are skipped.
pub(super) fn noise_floors(history: &[ProbeRun]) -> BTreeMap<String, NoiseFloor> {
    let mut floors: BTreeMap<String, NoiseFloor> = BTreeMap::new();
    for b in history.iter().filter(|r| r.ok) {
        let Some(first) = b.repeat_of else { continue };
        let Some(a) = history.iter().find(|r| r.id == first && r.ok) else {
            continue;
        };
        let pair = match (b.stats.get("noise_pair"), &a.raw, &b.raw) {
            (Some(pair), _, _) => Ok(pair.clone()),
            (None, Some(raw_a), Some(raw_b)) => noise_pair_stats(raw_a, raw_b),
            (None, _, _) => continue,
        };
        let pair = match pair {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(run = b.id, error = %e, "noise-floor pair skipped");
                continue;
            }
        };
        for &key in FLOOR_KEYS.iter().chain(&super::FINGERPRINT_STATS) {
            if let Some(v) = stat(&pair, key) {
                // a non-finite value is refused by record() and simply not counted
                let _ = floors.entry(key.to_owned()).or_default().record(v);
            }
        }
    }
    floors
}

/// The ids of the runs of `history` whose raw data `noise_floors` needs: both runs of each
/// noise-floor pair stored without `stats.noise_pair`.
pub(super) fn pairs_needing_raw(history: &[ProbeRun]) -> Vec<i64> {
    history
        .iter()
        .filter(|b| b.ok && b.stats.get("noise_pair").is_none())
        .filter_map(|b| b.repeat_of.map(|a| [a, b.id]))
        .flatten()
        .collect()
}

/// Fills in the raw data of the runs of `history` with these ids (those that have it).
pub(super) async fn load_raw(store: &Store, history: &mut [ProbeRun], ids: &[i64]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let raw: BTreeMap<i64, Vec<u8>> = store
        .probe_run_raw(ids)
        .await
        .map_err(store_err)?
        .into_iter()
        .collect();
    for r in history.iter_mut() {
        if let Some(bytes) = raw.get(&r.id) {
            r.raw = Some(bytes.clone());
        }
    }
    Ok(())
}
