//! Per-position comparison of an endpoint against the reference, in llama.cpp's
//! KL-divergence vocabulary, and the compact encoding of the raw per-position data.
//!
//! A probe run yields, per scored position, the reference's and the endpoint's logprob of the
//! actual token and each side's top-k alternatives (ids already mapped to the reference
//! vocabulary by `crate::align`). [`compare_position`] turns one position into
//! [`PositionMetrics`]; [`summarize`] aggregates a run into a [`RunSummary`];
//! [`kl_full`] is the full-vocabulary KL used by the calibration ladder when both sides have
//! all logits; [`position_from_full_logprobs`] cuts full distributions down to the same top-k
//! view an endpoint gives, so the ladder's `kl_topk_mean` and a probe's KL measure the same
//! thing. [`encode_positions`]/[`decode_positions`] keep the raw inputs compactly (f32
//! little-endian) so runs can be stored and re-analysed.
//!
//! # The top-k KL with a tail bucket
//! Both sides' top-k lists are first cut to a common `k = min(|top_ref|, |top_ep|)` entries
//! (highest logprob first; an endpoint that caps `top_logprobs` lower than the reference is
//! compared at its own k). Let `S = (T_ref ∩ T_ep) ∪ {actual}`: the tokens whose probability
//! is known on *both* sides (the actual token's logprob is always reported by both). The
//! vocabulary is coarsened into the cells `{s}` for `s ∈ S` plus one tail cell holding
//! everything else; each side's tail mass is `1 − Σ_{s∈S} p(s)`. Then
//!
//! `KL_topk = Σ_{s∈S} p_ref(s)·ln(p_ref(s)/p_ep(s)) + tail_ref·ln(tail_ref/tail_ep)`
//!
//! This is the KL divergence between the two coarsened distributions, hence (data-processing
//! inequality) a lower bound of the full-vocabulary KL(ref‖endpoint). Tails are clamped below
//! at [`TAIL_EPSILON`], and endpoint probabilities inside `S` at `min(TAIL_EPSILON, p_ref)`
//! (rounding can make a top-k sum exceed 1, and a provider may report `-inf`), so the
//! statistic is always finite and identical inputs give exactly 0; a negative result from
//! rounding is clamped to 0.
//!
//! [`compare_position`]: crate::compare::compare_position
//! [`PositionMetrics`]: crate::compare::PositionMetrics
//! [`summarize`]: crate::compare::summarize
//! [`RunSummary`]: crate::compare::RunSummary
//! [`kl_full`]: crate::compare::kl_full
//! [`position_from_full_logprobs`]: crate::compare::position_from_full_logprobs
//! [`encode_positions`]: crate::compare::encode_positions
//! [`decode_positions`]: crate::compare::decode_positions
//! [`TAIL_EPSILON`]: crate::compare::TAIL_EPSILON

use base64::Engine as _;

use crate::{ProbesError, Result, invalid};

/// Floor for tail masses and for the endpoint's probabilities inside the support.
pub const TAIL_EPSILON: f64 = 1e-6;

/// One alternative of a top-k list: a reference token id and its natural-log probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopEntry {
    /// Reference-vocabulary token id.
    pub id: u32,
    /// Natural-log probability (≤ 0; `-inf` allowed for "probability zero").
    pub logprob: f64,
}

/// What one side (reference or endpoint) reported at one position.
#[derive(Debug, Clone, PartialEq)]
pub struct Side {
    /// Logprob this side gives the actual token at this position.
    pub actual_logprob: f64,
    /// This side's most likely tokens, any order (duplicates: the first wins).
    pub top: Vec<TopEntry>,
}

/// Everything known about one scored position.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionInput {
    /// The token actually present at this position (reference id).
    pub actual_id: u32,
    /// The reference engine's view.
    pub reference: Side,
    /// The endpoint's view.
    pub endpoint: Side,
}

/// Metrics of one position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionMetrics {
    /// KL(ref‖endpoint) over the top-k support plus tail bucket (see the module doc).
    pub kl: f64,
    /// Endpoint's logprob of the actual token minus the reference's.
    pub dlogprob: f64,
    /// Whether both sides' most likely token is the same.
    pub same_top1: bool,
    /// `|T_ref ∩ T_ep| / k` with `k` the common top-k size.
    pub overlap: f64,
}

/// Aggregates of one probe run.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunSummary {
    /// Number of positions.
    pub count: usize,
    /// Mean of [`PositionMetrics::kl`].
    pub kl_mean: f64,
    /// 99th percentile of KL (nearest rank: the `⌈0.99·n⌉`-th smallest).
    pub kl_p99: f64,
    /// Mean of `|dlogprob|`.
    pub abs_dlogprob_mean: f64,
    /// Share of positions with the same top-1.
    pub top1_same: f64,
    /// Mean top-k overlap.
    pub topk_overlap: f64,
}

fn check_logprob(lp: f64, what: &str) -> Result<f64> {
    if lp.is_nan() || lp == f64::INFINITY {
        return Err(invalid(format!(
            "{what}: logprob {lp} is not a log-probability"
        )));
    }
    // Providers round; a logprob slightly above 0 is a probability of 1.
    if lp > 1e-3 {
        return Err(invalid(format!("{what}: logprob {lp} > 0")));
    }
    Ok(lp.min(0.0))
}

/// The top list deduplicated (first occurrence wins), validated, sorted by logprob descending
/// (ties by id, so the order is deterministic), truncated to `k`.
fn top_sorted(top: &[TopEntry], what: &str) -> Result<Vec<TopEntry>> {
    let mut out: Vec<TopEntry> = Vec::with_capacity(top.len());
    for e in top {
        let logprob = check_logprob(e.logprob, what)?;
        if !out.iter().any(|o| o.id == e.id) {
            out.push(TopEntry { id: e.id, logprob });
        }
    }
    out.sort_by(|a, b| b.logprob.total_cmp(&a.logprob).then(a.id.cmp(&b.id)));
    Ok(out)
}

/// Compares one position. Errors on NaN/positive logprobs or an empty top list.
pub fn compare_position(p: &PositionInput) -> Result<PositionMetrics> {
    let r_actual = check_logprob(p.reference.actual_logprob, "reference actual")?;
    let e_actual = check_logprob(p.endpoint.actual_logprob, "endpoint actual")?;
    let mut rt = top_sorted(&p.reference.top, "reference top")?;
    let mut et = top_sorted(&p.endpoint.top, "endpoint top")?;
    if rt.is_empty() || et.is_empty() {
        return Err(invalid("a top-k list is empty"));
    }
    let k = rt.len().min(et.len());
    rt.truncate(k);
    et.truncate(k);

    let same_top1 = rt[0].id == et[0].id;
    let common: Vec<(u32, f64, f64)> = rt
        .iter()
        .filter_map(|r| {
            et.iter()
                .find(|e| e.id == r.id)
                .map(|e| (r.id, r.logprob, e.logprob))
        })
        .collect();
    let overlap = common.len() as f64 / k as f64;

    // Support S = common ∪ {actual}; the actual token's values come from `actual_logprob`.
    let mut support: Vec<(f64, f64)> = common
        .iter()
        .filter(|c| c.0 != p.actual_id)
        .map(|c| (c.1, c.2))
        .collect();
    support.push((r_actual, e_actual));

    // The endpoint's probability is floored at min(ε, p_ref) — never above the reference's,
    // so identical inputs stay identical and give exactly 0 — and the log ratio is taken in
    // log space (no exp/ln round trip).
    let ln_eps = TAIL_EPSILON.ln();
    let mut kl = 0.0;
    let (mut mass_r, mut mass_e) = (0.0, 0.0);
    for &(lr, le) in &support {
        let le = le.max(ln_eps.min(lr));
        let pr = lr.exp();
        mass_r += pr;
        mass_e += le.exp();
        if pr > 0.0 {
            kl += pr * (lr - le);
        }
    }
    let tail_r = (1.0 - mass_r).max(TAIL_EPSILON);
    let tail_e = (1.0 - mass_e).max(TAIL_EPSILON);
    kl += tail_r * (tail_r / tail_e).ln();

    Ok(PositionMetrics {
        kl: kl.max(0.0),
        dlogprob: e_actual - r_actual,
        same_top1,
        overlap,
    })
}

/// Compares every position of a run.
pub fn compare_run(positions: &[PositionInput]) -> Result<Vec<PositionMetrics>> {
    positions.iter().map(compare_position).collect()
}

/// The nearest-rank `q`-quantile (`0 < q ≤ 1`) of `values`: the `⌈q·n⌉`-th smallest.
pub fn quantile_nearest_rank(values: &[f64], q: f64) -> Result<f64> {
    if values.is_empty() {
        return Err(invalid("quantile of an empty sample"));
    }
    if !(q > 0.0 && q <= 1.0) {
        return Err(invalid(format!("quantile level {q} not in (0, 1]")));
    }
    if values.iter().any(|v| v.is_nan()) {
        return Err(invalid("quantile of a sample containing NaN"));
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    Ok(v[rank.clamp(1, v.len()) - 1])
}

/// Aggregates per-position metrics into a run summary. Errors on an empty run.
pub fn summarize(metrics: &[PositionMetrics]) -> Result<RunSummary> {
    let n = metrics.len();
    if n == 0 {
        return Err(invalid("no positions to summarize"));
    }
    let nf = n as f64;
    let kls: Vec<f64> = metrics.iter().map(|m| m.kl).collect();
    Ok(RunSummary {
        count: n,
        kl_mean: kls.iter().sum::<f64>() / nf,
        kl_p99: quantile_nearest_rank(&kls, 0.99)?,
        abs_dlogprob_mean: metrics.iter().map(|m| m.dlogprob.abs()).sum::<f64>() / nf,
        top1_same: metrics.iter().filter(|m| m.same_top1).count() as f64 / nf,
        topk_overlap: metrics.iter().map(|m| m.overlap).sum::<f64>() / nf,
    })
}

/// Log-softmax of raw logits, in f64: `f64::from(logit) - lse` with `lse` from
/// [`log_sum_exp`].
pub fn log_softmax(logits: &[f32]) -> Result<Vec<f64>> {
    let lse = log_sum_exp(logits)?;
    Ok(logits.iter().map(|&l| f64::from(l) - lse).collect())
}

/// The log-sum-exp of raw logits in f64 (max-shifted), the normaliser of [`log_softmax`]; a
/// caller that keeps it needs no vector of logprobs (the calibration ladder keeps one per
/// reference row). Errors on empty or non-finite logits.
pub fn log_sum_exp(logits: &[f32]) -> Result<f64> {
    if logits.is_empty() {
        return Err(invalid("empty logits"));
    }
    if logits.iter().any(|l| !l.is_finite()) {
        return Err(invalid("logits must be finite"));
    }
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
    Ok(max
        + logits
            .iter()
            .map(|&l| (f64::from(l) - max).exp())
            .sum::<f64>()
            .ln())
}

/// Full-vocabulary KL(ref‖endpoint) from two raw logit vectors of the same length
/// (`Σ_v p_ref(v)·(log p_ref(v) − log p_ep(v))`, computed in f64 after log-softmax).
pub fn kl_full(reference_logits: &[f32], endpoint_logits: &[f32]) -> Result<f64> {
    if reference_logits.len() != endpoint_logits.len() {
        return Err(ProbesError::LengthMismatch {
            what: "logit vectors",
            left: reference_logits.len(),
            right: endpoint_logits.len(),
        });
    }
    let lr = log_softmax(reference_logits)?;
    let le = log_softmax(endpoint_logits)?;
    kl_from_logprobs(&lr, &le)
}

/// Full-vocabulary KL(ref‖endpoint) from two log-probability vectors (what [`kl_full`]
/// computes after its log-softmax; a caller that needs the log-probabilities anyway, like the
/// calibration ladder, computes them once).
pub fn kl_from_logprobs(reference: &[f64], endpoint: &[f64]) -> Result<f64> {
    if reference.len() != endpoint.len() {
        return Err(ProbesError::LengthMismatch {
            what: "logprob vectors",
            left: reference.len(),
            right: endpoint.len(),
        });
    }
    let kl: f64 = reference
        .iter()
        .zip(endpoint)
        .map(|(&a, &b)| a.exp() * (a - b))
        .sum();
    Ok(kl.max(0.0))
}

/// Builds the top-k view of a position from two full log-probability vectors, exactly as an
/// endpoint returning `top_logprobs = k` would report it. Used by the calibration ladder's
/// `kl_topk_mean` so probes compare like with like.
pub fn position_from_full_logprobs(
    reference: &[f64],
    endpoint: &[f64],
    actual_id: u32,
    k: usize,
) -> Result<PositionInput> {
    if reference.len() != endpoint.len() {
        return Err(ProbesError::LengthMismatch {
            what: "logprob vectors",
            left: reference.len(),
            right: endpoint.len(),
        });
    }
    let a = actual_id as usize;
    if a >= reference.len() {
        return Err(invalid(format!(
            "actual id {actual_id} outside a vocabulary of {}",
            reference.len()
        )));
    }
    if k == 0 {
        return Err(invalid("k must be at least 1"));
    }
    let top = |lp: &[f64]| -> Vec<TopEntry> {
        top_k_ids(lp, k)
            .into_iter()
            .map(|i| TopEntry {
                id: i as u32,
                logprob: lp[i],
            })
            .collect()
    };
    Ok(PositionInput {
        actual_id,
        reference: Side {
            actual_logprob: reference[a],
            top: top(reference),
        },
        endpoint: Side {
            actual_logprob: endpoint[a],
            top: top(endpoint),
        },
    })
}

/// The `k` highest entries of `lp` (ties by lower index), highest first: exactly the first
/// `k` of a full sort by (logprob descending, index ascending), in one pass that keeps a
/// sorted buffer of `k` instead of sorting the whole vocabulary (the calibration ladder asks
/// this twice per position of a 49k-entry vocabulary).
pub fn top_k_ids(lp: &[f64], k: usize) -> Vec<usize> {
    // `x` ranks before `y`: a higher logprob, or the same (total order) and a lower index
    let before = |x: usize, y: usize| match lp[x].total_cmp(&lp[y]) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Equal => x < y,
        std::cmp::Ordering::Less => false,
    };
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for i in 0..lp.len() {
        if best.len() == k && best.last().is_some_and(|&w| !before(i, w)) {
            continue;
        }
        let at = best.partition_point(|&b| before(b, i));
        best.insert(at, i);
        best.truncate(k);
    }
    best
}

const MAGIC: &[u8; 4] = b"SWPP";
const VERSION: u8 = 1;

/// Encodes raw per-position inputs compactly:
/// `"SWPP"`, version byte `1`, `u32` count, then per position `u32` actual id, `f32`
/// reference actual logprob, `f32` endpoint actual logprob, `u8` n + n × (`u32` id, `f32`
/// logprob) for the reference top list, the same for the endpoint's; all little-endian.
/// Logprobs are stored as f32 (the precision providers send); top lists longer than 255
/// entries are an error.
pub fn encode_positions(positions: &[PositionInput]) -> Result<Vec<u8>> {
    let count = u32::try_from(positions.len()).map_err(|_| invalid("too many positions"))?;
    let mut out = Vec::with_capacity(9 + positions.len() * 100);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&count.to_le_bytes());
    for p in positions {
        out.extend_from_slice(&p.actual_id.to_le_bytes());
        out.extend_from_slice(&(p.reference.actual_logprob as f32).to_le_bytes());
        out.extend_from_slice(&(p.endpoint.actual_logprob as f32).to_le_bytes());
        for side in [&p.reference, &p.endpoint] {
            let n = u8::try_from(side.top.len()).map_err(|_| {
                invalid(format!("top list of {} entries (max 255)", side.top.len()))
            })?;
            out.push(n);
            for e in &side.top {
                out.extend_from_slice(&e.id.to_le_bytes());
                out.extend_from_slice(&(e.logprob as f32).to_le_bytes());
            }
        }
    }
    Ok(out)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let end = self.at.checked_add(N).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(ProbesError::Decode(format!(
                "truncated at byte {}",
                self.at
            )));
        };
        let mut a = [0u8; N];
        a.copy_from_slice(&self.bytes[self.at..end]);
        self.at = end;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take::<4>()?))
    }
    fn f32(&mut self) -> Result<f64> {
        Ok(f64::from(f32::from_le_bytes(self.take::<4>()?)))
    }
}

/// Decodes what [`encode_positions`] wrote.
pub fn decode_positions(bytes: &[u8]) -> Result<Vec<PositionInput>> {
    let mut r = Reader { bytes, at: 0 };
    if r.take::<4>()? != *MAGIC {
        return Err(ProbesError::Decode("bad magic".into()));
    }
    let [version] = r.take::<1>()?;
    if version != VERSION {
        return Err(ProbesError::Decode(format!("unknown version {version}")));
    }
    let count = r.u32()? as usize;
    // Each position takes at least 14 bytes: refuse counts the input cannot hold.
    if count > bytes.len() / 14 {
        return Err(ProbesError::Decode(format!(
            "count {count} exceeds the data"
        )));
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let actual_id = r.u32()?;
        let ra = r.f32()?;
        let ea = r.f32()?;
        let mut sides = [Vec::new(), Vec::new()];
        for side in &mut sides {
            let [n] = r.take::<1>()?;
            for _ in 0..n {
                let id = r.u32()?;
                let logprob = r.f32()?;
                side.push(TopEntry { id, logprob });
            }
        }
        let [rt, et] = sides;
        out.push(PositionInput {
            actual_id,
            reference: Side {
                actual_logprob: ra,
                top: rt,
            },
            endpoint: Side {
                actual_logprob: ea,
                top: et,
            },
        });
    }
    if r.at != bytes.len() {
        return Err(ProbesError::Decode(format!(
            "{} trailing bytes",
            bytes.len() - r.at
        )));
    }
    Ok(out)
}

/// [`encode_positions`] as standard base64 (for JSON or text columns).
pub fn encode_positions_base64(positions: &[PositionInput]) -> Result<String> {
    Ok(base64::engine::general_purpose::STANDARD.encode(encode_positions(positions)?))
}

/// Decodes what [`encode_positions_base64`] wrote.
pub fn decode_positions_base64(text: &str) -> Result<Vec<PositionInput>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| ProbesError::Decode(format!("base64: {e}")))?;
    decode_positions(&bytes)
}

#[cfg(test)]
mod tests;
