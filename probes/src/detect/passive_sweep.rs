//! The passive detector of [`super`]: each endpoint's recent request records against the
//! other endpoints of the same model, Benjamini–Hochberg over all of a model's tests.
//!
//! Rates where more is worse (errors, tool-call errors, repetition cuts) are tested with a
//! two-proportion z-test of the endpoint against the rest and flagged only when the endpoint
//! is the worse side, so two endpoints suffice. Output length (Mann–Whitney U) and finish
//! reasons (chi-square) have no "worse" direction: they are tested only with three or more
//! endpoints, pairwise, and an endpoint is flagged when it differs from a majority of the
//! others (see [`majority_tests`]).
//!
//! Only records that say something about their endpoint are compared ([`blames_client`]): a
//! client that went away, a request the endpoint rightly refused (a 4xx caused by the request)
//! and a rate limit are left out of every test, so one bad client stuck to one endpoint by
//! cache affinity cannot get a healthy endpoint flagged.

use std::collections::BTreeMap;

use samewise_store::{ErrorKind, NewAlert, RequestRecord};

use super::{DetectorConfig, KIND_PASSIVE, fmt_num};
use crate::Result;
use crate::passive::{
    TestResult, bh_adjusted, chi_square_independence, mann_whitney_u, proportions_vs_rest,
};

/// Finish-reason categories of the chi-square test; anything else (or none) is "other".
const FINISH_REASONS: [&str; 4] = ["stop", "length", "tool_calls", "content_filter"];

/// One test of one endpoint.
struct Test {
    endpoint: usize,
    signal: &'static str,
    result: TestResult,
    /// The endpoint is on the bad side (or the signal has no bad side).
    bad: bool,
    /// What to show: the endpoint's value and the rest's.
    detail: serde_json::Value,
    text: String,
}

/// Whether a record's failure is the client's or the traffic's doing, not the endpoint's: the
/// client went away (`client_disconnect`), the gateway cancelled a hedged attempt that another
/// endpoint beat (`hedge_lost`), the endpoint rate limited (429), or it refused the request
/// itself ([`samewise_store::refuses_the_request`]: 400, 404, 413, 422, ...).
fn blames_client(r: &RequestRecord) -> bool {
    match r.error_kind.as_deref().map(ErrorKind::parse) {
        Some(Some(ErrorKind::RateLimited)) => true,
        None | Some(Some(ErrorKind::Upstream4xx)) => {
            r.status == Some(429) || samewise_store::refuses_the_request(r.status)
        }
        Some(Some(k)) => !k.may_be_the_endpoints(),
        Some(None) => false,
    }
}

fn is_error(r: &RequestRecord) -> bool {
    r.error_kind.is_some() || r.status.is_none_or(|s| s >= 500)
}

fn pct(x: u64, n: u64) -> f64 {
    if n == 0 { 0.0 } else { x as f64 / n as f64 }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// For tests without a "worse" side: endpoint `i` is tested against each other endpoint
/// (`pair(i, j)`), and its p-value is the one at which it differs from a strict majority of
/// them (the majority-th smallest pairwise p; an intersection-union test, valid for "differs
/// from a majority"). An outlier among normal endpoints is flagged; the normal ones, which
/// agree with each other, are not.
fn majority_tests(
    m: usize,
    pair: impl Fn(usize, usize) -> Result<TestResult>,
) -> Result<Vec<TestResult>> {
    let need = (m - 1) / 2 + 1;
    (0..m)
        .map(|i| {
            let mut ps: Vec<TestResult> = (0..m)
                .filter(|&j| j != i)
                .map(|j| pair(i, j))
                .collect::<Result<_>>()?;
            ps.sort_by(|a, b| a.p_value.total_cmp(&b.p_value));
            ps.get(need - 1).copied().ok_or_else(|| {
                crate::ProbesError::InvalidInput("majority test needs two endpoints".to_owned())
            })
        })
        .collect()
}

/// Rate tests: `count(r)` → (x, n) per endpoint; endpoints with n = 0 sit this one out.
fn rate_tests(
    per_endpoint: &[(&str, Vec<&RequestRecord>)],
    signal: &'static str,
    label: &str,
    count: impl Fn(&[&RequestRecord]) -> (u64, u64),
    tests: &mut Vec<Test>,
) -> Result<()> {
    let counted: Vec<(usize, (u64, u64))> = per_endpoint
        .iter()
        .enumerate()
        .map(|(i, (_, rs))| (i, count(rs)))
        .filter(|(_, (_, n))| *n > 0)
        .collect();
    if counted.len() < 2 {
        return Ok(());
    }
    let (sx, sn) = counted
        .iter()
        .fold((0, 0), |(a, b), (_, (x, n))| (a + x, b + n));
    let results = proportions_vs_rest(&counted.iter().map(|(_, c)| *c).collect::<Vec<_>>())?;
    for ((i, (x, n)), result) in counted.iter().zip(results) {
        let (rx, rn) = (sx - x, sn - n);
        tests.push(Test {
            endpoint: *i,
            signal,
            result,
            bad: result.statistic > 0.0,
            detail: serde_json::json!({"count": x, "n": n, "rate": pct(*x, *n), "rest_count": rx, "rest_n": rn, "rest_rate": pct(rx, rn)}),
            text: format!(
                "{label} {:.1}% vs {:.1}% on the other endpoints",
                100.0 * pct(*x, *n),
                100.0 * pct(rx, rn)
            ),
        });
    }
    Ok(())
}

/// The passive findings over `records` (any models, any endpoints).
pub(super) fn findings(
    records: &[RequestRecord],
    cfg: &DetectorConfig,
    now_ms: i64,
) -> Result<Vec<NewAlert>> {
    let mut out = Vec::new();
    for (model, endpoints) in by_model(records) {
        let per_endpoint: Vec<(&str, Vec<&RequestRecord>)> = endpoints
            .into_iter()
            .filter(|(_, rs)| rs.len() as u64 >= cfg.passive_min_requests)
            .collect();
        if per_endpoint.len() < 2 {
            continue;
        }
        let tests = model_tests(&per_endpoint)?;
        if tests.is_empty() {
            continue;
        }
        out.extend(alerts(model, &per_endpoint, &tests, cfg, now_ms)?);
    }
    Ok(out)
}

/// The records that speak about their endpoint (attempts, not blamed on the client), per
/// model and endpoint.
fn by_model(records: &[RequestRecord]) -> BTreeMap<&str, BTreeMap<&str, Vec<&RequestRecord>>> {
    let mut by_model: BTreeMap<&str, BTreeMap<&str, Vec<&RequestRecord>>> = BTreeMap::new();
    for r in records {
        if r.attempt == 0 || blames_client(r) {
            continue;
        }
        let Some(endpoint) = r.endpoint.as_deref() else {
            continue;
        };
        by_model
            .entry(&r.model)
            .or_default()
            .entry(endpoint)
            .or_default()
            .push(r);
    }
    by_model
}

/// Every test of one model's endpoints against each other: the rates, and with three or more
/// endpoints the output lengths and finish reasons.
fn model_tests(per_endpoint: &[(&str, Vec<&RequestRecord>)]) -> Result<Vec<Test>> {
    let mut tests = Vec::new();
    rate_tests(
        per_endpoint,
        "error_rate",
        "error rate",
        |rs| {
            (
                rs.iter().filter(|r| is_error(r)).count() as u64,
                rs.len() as u64,
            )
        },
        &mut tests,
    )?;
    rate_tests(
        per_endpoint,
        "tool_error_rate",
        "tool-call error rate",
        |rs| {
            let with_tools: Vec<_> = rs
                .iter()
                .filter(|r| r.tool_calls > 0 || r.tool_errored)
                .collect();
            (
                with_tools.iter().filter(|r| r.tool_errored).count() as u64,
                with_tools.len() as u64,
            )
        },
        &mut tests,
    )?;
    rate_tests(
        per_endpoint,
        "repetition_cut_rate",
        "repetition-cut rate",
        |rs| {
            (
                rs.iter().filter(|r| r.degenerate).count() as u64,
                rs.len() as u64,
            )
        },
        &mut tests,
    )?;
    if per_endpoint.len() >= 3 {
        length_tests(per_endpoint, &mut tests)?;
        finish_tests(per_endpoint, &mut tests)?;
    }
    Ok(tests)
}

/// Output length (Mann–Whitney U on successful answers), each endpoint against the majority.
fn length_tests(per_endpoint: &[(&str, Vec<&RequestRecord>)], tests: &mut Vec<Test>) -> Result<()> {
    let lengths: Vec<Vec<f64>> = per_endpoint
        .iter()
        .map(|(_, rs)| {
            rs.iter()
                .filter(|r| !is_error(r))
                .map(|r| r.output_chars as f64)
                .collect()
        })
        .collect();
    if lengths.iter().all(|l| !l.is_empty()) {
        let medians: Vec<f64> = lengths.iter().map(|l| median(l)).collect();
        for (i, result) in majority_tests(lengths.len(), |i, j| {
            mann_whitney_u(&lengths[i], &lengths[j])
        })?
        .into_iter()
        .enumerate()
        {
            let others: Vec<f64> = medians
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, m)| *m)
                .collect();
            let mr = median(&others);
            let m = medians[i];
            tests.push(Test {
                endpoint: i,
                signal: "output_length",
                result,
                bad: true,
                detail: serde_json::json!({"median_chars": m, "others_median_chars": mr, "n": lengths[i].len()}),
                text: format!("median output {m:.0} chars vs {mr:.0} on the other endpoints"),
            });
        }
    }
    Ok(())
}

/// Finish-reason mix (chi-square on counts), each endpoint against the majority.
fn finish_tests(per_endpoint: &[(&str, Vec<&RequestRecord>)], tests: &mut Vec<Test>) -> Result<()> {
    let finish: Vec<Vec<u64>> = per_endpoint
        .iter()
        .map(|(_, rs)| {
            let mut c = vec![0u64; FINISH_REASONS.len() + 1];
            for r in rs.iter().filter(|r| !is_error(r)) {
                let idx = r
                    .finish_reason
                    .as_deref()
                    .and_then(|f| FINISH_REASONS.iter().position(|k| *k == f))
                    .unwrap_or(FINISH_REASONS.len());
                c[idx] += 1;
            }
            c
        })
        .collect();
    let pair = |i: usize, j: usize| {
        chi_square_independence(&[finish[i].clone(), finish[j].clone()]).map(|(r, _)| r)
    };
    for (i, result) in majority_tests(finish.len(), pair)?.into_iter().enumerate() {
        let names: Vec<&str> = FINISH_REASONS.iter().copied().chain(["other"]).collect();
        let counts: serde_json::Map<String, serde_json::Value> = names
            .iter()
            .zip(&finish[i])
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        tests.push(Test {
            endpoint: i,
            signal: "finish_reasons",
            result,
            bad: true,
            detail: serde_json::json!({"counts": counts}),
            text: "finish reasons differ from the other endpoints'".to_owned(),
        });
    }
    Ok(())
}

/// One alert per endpoint with a test left after Benjamini–Hochberg at `passive_q`.
fn alerts(
    model: &str,
    per_endpoint: &[(&str, Vec<&RequestRecord>)],
    tests: &[Test],
    cfg: &DetectorConfig,
    now_ms: i64,
) -> Result<Vec<NewAlert>> {
    let mut out = Vec::new();
    let adjusted = bh_adjusted(&tests.iter().map(|t| t.result.p_value).collect::<Vec<_>>())?;
    let mut flagged: BTreeMap<usize, Vec<(&Test, f64)>> = BTreeMap::new();
    for (t, adj) in tests.iter().zip(adjusted) {
        if t.bad && adj <= cfg.passive_q {
            flagged.entry(t.endpoint).or_default().push((t, adj));
        }
    }
    for (i, hits) in flagged {
        let endpoint = per_endpoint[i].0;
        let parts: Vec<String> = hits
            .iter()
            .map(|(t, adj)| {
                format!(
                    "{} (p = {}, BH-adjusted {})",
                    t.text,
                    fmt_num(t.result.p_value),
                    fmt_num(*adj)
                )
            })
            .collect();
        let listed: Vec<serde_json::Value> = hits
            .iter()
            .map(|(t, adj)| {
                serde_json::json!({
                    "signal": t.signal,
                    "statistic": t.result.statistic,
                    "p_value": t.result.p_value,
                    "p_adjusted": adj,
                    "detail": t.detail,
                })
            })
            .collect();
        let Some((first, first_adj)) = hits.first() else {
            continue;
        };
        out.push(NewAlert {
            model: model.to_owned(),
            endpoint: endpoint.to_owned(),
            kind: KIND_PASSIVE.to_owned(),
            summary: format!(
                "endpoint {endpoint} differs from the other endpoints of {model} in live traffic: {} (FDR q = {})",
                parts.join("; "),
                cfg.passive_q
            ),
            evidence: serde_json::json!({
                "detector": "passive",
                "statistic": first.signal,
                "value": first.result.statistic,
                "threshold": cfg.passive_q,
                "p_value": first_adj,
                "tests": listed,
                "endpoints_compared": per_endpoint.len(),
                "requests": per_endpoint[i].1.len(),
                "window_ms": i64::try_from(cfg.passive_window.as_millis()).unwrap_or(i64::MAX),
                "probe_runs": [],
            }),
            now_ms,
        });
    }
    Ok(out)
}
