//! The detectors' orchestration over stored probe runs and request records: the statistics
//! of this crate applied to what the scheduler and the proxy wrote, turned into alerts.
//!
//! - **faithful?** ([`Detectors::after_run`]): a logprob run's statistic (default the
//!   top-k + tail mean KL, `stats.kl_mean`) against the model's calibration ladder, reported
//!   as "≈ N-bit equivalent" and flagged past the configured level (default `w6`, worse than
//!   6-bit weights) unless within the endpoint's noise floor ([`crate::noise`], measured on
//!   the stored noise-floor pairs: runs with `repeat_of`). Without a ladder, an absolute
//!   `kl_threshold` may be configured instead. A samples run is flagged when its p-value
//!   (Bonferroni over its MMD and reference log-likelihood permutation tests,
//!   `mmd::samples_p_value`) is below `samples_alpha`; a logprob run whose tokens do not
//!   map onto the reference vocabulary (`stats.mismatch_rate` above `max_mismatch_rate`)
//!   is flagged as a different tokenizer. A long_context run is flagged when its effective
//!   context is one doubling or more below the reference's (evidence: `statistic:
//!   "effective_context"`, both values, the per-length passes).
//! - **changed?** ([`Detectors::after_run`]): a two-sided CUSUM per endpoint, probe kind and
//!   statistic over the endpoint's stored runs, oldest first; its first
//!   `cusum_baseline_rounds` runs are the baseline, stored apart once complete
//!   (`Store::put_probe_baseline`), so it stays fixed however many runs follow and when
//!   retention deletes its runs. The chart is rebuilt on every run (so a restart loses
//!   nothing) from the baseline and the newest `history_runs` runs after it; an alarm on the
//!   newest run raises "changed", and a lasting shift keeps alarming however long it lasts.
//!   Resolving a "changed" alert accepts the new behaviour: the chart then starts over from
//!   the runs after the resolution (a new baseline). The chart logic is the pure
//!   [`changed_chart`]; its `h` is raised for the estimated 30-round baseline
//!   ([`changed_chart_config`], `crate::sequential`), which keeps the in-control false-alarm
//!   rate at the documented `1/cusum_arl0` per chart (without it the probe benchmark
//!   measured four times that). `cusum_arl0` is per chart: with the three default charts
//!   of a logprob probe, an endpoint's in-control ARL is about a third of it.
//! - **passive** ([`Detectors::sweep`]): per model, each endpoint's request records of the
//!   last `passive_window_ms` against the other endpoints': error rate, tool-call error rate
//!   and repetition-cut rate (two-proportion z, flagged only when the endpoint is worse),
//!   and, with three or more endpoints (so that the majority says what is normal), output
//!   length (Mann–Whitney) and finish reasons (chi-square); Benjamini–Hochberg over all of a
//!   model's tests at `passive_q`. The sweep also auto-resolves quiet alerts.
//!
//! Files: this one (faithful?, changed?, orchestration), `detect_config.rs`
//! ([`DetectorConfig`]), `detect_passive.rs` (the passive tests).
//!
//! Alert kinds: `unfaithful`, `changed`, `passive` (one active alert per endpoint and kind).
//!
//! ```toml
//! [probes.detectors]            # every key optional; defaults shown
//! level = "w6"                  # flag endpoints worse than this ladder level
//! floor_factor = 3.0            # ... unless within 3 × their repeat-noise floor
//! metric = "kl_topk_mean"       # | "dlogprob_mean" | "top1_same" | "topk_overlap"
//! # kl_threshold = 0.05         # without a ladder: flag mean KL above this
//! samples_alpha = 0.01              # needs permutations ≥ 2/samples_alpha (default 999)
//! max_mismatch_rate = 0.02
//! cusum_k = 1.0                 # CUSUM allowance (σ units): fastest on a 2σ shift
//! cusum_arl0 = 1000.0           # in-control average run length (rounds) per chart, two-sided
//! cusum_baseline_rounds = 30
//! cusum_min_sd = 1e-6
//! cusum_baseline_correction = true  # h raised so the estimated baseline keeps cusum_arl0
//! cusum_statistics = ["kl_mean", "top1_same", "dlogprob_mean", "mmd", "trigger_f1", "effective_context"]
//! history_runs = 500
//! passive_q = 0.01              # Benjamini–Hochberg false-discovery rate
//! passive_window_ms = 3600000
//! passive_min_requests = 30
//! [probes.alerts]
//! quiet_period_ms = 3600000     # auto-resolve after this long unconfirmed
//! [[probes.webhooks]]
//! url_env = "SLACK_WEBHOOK_URL" # or url = "https://..."
//! format = "slack"              # | "generic"
//! max_attempts = 5
//! backoff_ms = 500              # doubled per retry, at most max_backoff_ms (30000)
//! timeout_ms = 5000
//! ```
//! Every alert carries its evidence (statistic, value, threshold, p-value, probe run ids) and
//! a one-line summary.
//!
//! [`changed_chart`]: crate::detect::changed_chart
//! [`changed_chart_config`]: crate::detect::changed_chart_config

use std::collections::BTreeMap;

use samewise_store::{Alert, BaselineRun, NewAlert, ProbeBaseline, ProbeRun, ProbeRunQuery, Store};

use crate::alerting::{Alerting, AlertsConfig};
use crate::compare::{RunSummary, decode_positions};
use crate::config::ProbesConfig;
use crate::ladder::{Equivalent, Ladder, Metric};
use crate::mmd::{SamplesTest, samples_p_value};
use crate::noise::{NoiseFloor, repeat_summary};
use crate::sequential::{Cusum, CusumConfig, Observation, Shift, run_chart};
use crate::{ProbesError, Result};

mod diagnosis;
mod findings;
use diagnosis::{diagnosed, pooled_candidates, pooled_diagnosis};
use findings::{long_context_finding, signature_finding, unfaithful};

mod detector_config;
mod passive_sweep;

pub use detector_config::DetectorConfig;

/// Alert kind of the faithful? detector.
pub const KIND_UNFAITHFUL: &str = "unfaithful";
/// Alert kind of the changed? detector.
pub const KIND_CHANGED: &str = "changed";
/// Alert kind of the passive detector.
pub const KIND_PASSIVE: &str = "passive";

/// The detectors with their alerting; built once per scheduler.
#[derive(Debug)]
pub struct Detectors {
    cfg: DetectorConfig,
    ladder: Option<Ladder>,
    alerting: Alerting,
}

fn store_err(e: samewise_store::StoreError) -> ProbesError {
    ProbesError::Store(e)
}

/// The run-stats key of a ladder metric.
fn stat_key(metric: Metric) -> &'static str {
    match metric {
        Metric::KlMean | Metric::KlTopkMean => "kl_mean",
        Metric::KlP99 => "kl_p99",
        Metric::DlogprobMean => "dlogprob_mean",
        Metric::Top1Same => "top1_same",
        Metric::TopkOverlap => "topk_overlap",
    }
}

/// How a metric reads in a summary line.
fn metric_label(metric: Metric) -> &'static str {
    match metric {
        Metric::KlMean | Metric::KlTopkMean => "mean KL",
        Metric::KlP99 => "p99 KL",
        Metric::DlogprobMean => "mean |Δ logprob|",
        Metric::Top1Same => "same-top-1 rate",
        Metric::TopkOverlap => "top-k overlap",
    }
}

/// A numeric statistic of a run (`dlogprob_mean` also answers to `abs_dlogprob_mean`).
pub fn stat(stats: &serde_json::Value, key: &str) -> Option<f64> {
    let v = stats
        .get(key)
        .and_then(serde_json::Value::as_f64)
        .or_else(|| {
            (key == "dlogprob_mean")
                .then(|| {
                    stats
                        .get("abs_dlogprob_mean")
                        .and_then(serde_json::Value::as_f64)
                })
                .flatten()
        })?;
    v.is_finite().then_some(v)
}

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

/// Whether larger values of run-stats key `key` are better.
fn higher_is_better(key: &str) -> bool {
    matches!(
        key,
        "top1_same"
            | "topk_overlap"
            | "trigger_f1"
            | "schema_accuracy"
            | "effective_context"
            | "p_value"
    )
}

fn bits_text(e: &Equivalent) -> String {
    match e {
        Equivalent::NoWorseThan { bits } => format!("no worse than {bits}-bit"),
        Equivalent::Approx { bits, .. } => format!("≈{bits:.1}-bit"),
        Equivalent::WorseThan { bits } => format!("worse than {bits}-bit"),
    }
}

fn fmt_num(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e5) {
        format!("{v:.2e}")
    } else {
        format!("{v:.3}")
    }
}

/// A permutation p-value is never below `1 / (permutations + 1)`, the samples probe's
/// Bonferroni p over its two tests never below twice that: a model whose samples probe
/// could never reach `samples_alpha` would never be flagged, which is a configuration error.
fn check_samples_alpha(cfg: &DetectorConfig, config: &ProbesConfig) -> Result<()> {
    for (name, m) in &config.models {
        if !m.kinds.contains(&crate::config::ProbeKind::Samples) {
            continue;
        }
        // both tests, Bonferroni: the smallest p-value is 2/(B+1)
        let smallest = 2.0 / (m.permutations as f64 + 1.0);
        if smallest >= cfg.samples_alpha {
            return Err(ProbesError::Config(format!(
                "probes.detectors.samples_alpha = {} can never be reached with models.{name}.probes.permutations = {} (the samples probe's smallest p-value, Bonferroni over its two permutation tests, is 2/{} = {smallest:.4}): use at least {} permutations or a larger samples_alpha",
                cfg.samples_alpha,
                m.permutations,
                m.permutations + 1,
                (2.0 / cfg.samples_alpha).floor() as u64
            )));
        }
    }
    Ok(())
}

impl Detectors {
    /// Builds the detectors from the probes config: the `[probes.detectors]`,
    /// `[probes.alerts]` and `[[probes.webhooks]]` keys, and the ladder file if one is
    /// configured. Starts the webhook worker (needs a tokio runtime).
    pub fn from_config(config: &ProbesConfig) -> Result<Detectors> {
        let cfg = DetectorConfig::parse(&config.detectors)?;
        check_samples_alpha(&cfg, config)?;
        let alerts = AlertsConfig::parse(&config.detectors)?;
        let ladder = match &config.ladder {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ProbesError::Io {
                    context: format!("reading the ladder {}", path.display()),
                    source,
                })?;
                Some(Ladder::from_json(&text)?)
            }
        };
        Detectors::new(cfg, ladder, &alerts)
    }

    /// Validates the detectors' part of `config` (`[probes.detectors]`, `[probes.alerts]`,
    /// `[[probes.webhooks]]`, the ladder file and its level) without starting anything: for
    /// `samewise config check`.
    pub fn check_config(config: &ProbesConfig) -> Result<()> {
        let cfg = DetectorConfig::parse(&config.detectors)?;
        check_samples_alpha(&cfg, config)?;
        AlertsConfig::parse(&config.detectors)?;
        if let Some(path) = &config.ladder {
            let text = std::fs::read_to_string(path).map_err(|source| ProbesError::Io {
                context: format!("reading the ladder {}", path.display()),
                source,
            })?;
            Ladder::from_json(&text)?.threshold(cfg.metric, &cfg.rule.level)?;
        }
        Ok(())
    }

    /// Builds the detectors from typed parts.
    pub fn new(
        cfg: DetectorConfig,
        ladder: Option<Ladder>,
        alerts: &AlertsConfig,
    ) -> Result<Detectors> {
        if let Some(l) = &ladder {
            // fail at start-up, not at the first run
            l.threshold(cfg.metric, &cfg.rule.level)?;
        }
        Ok(Detectors {
            cfg,
            ladder,
            alerting: Alerting::start(alerts)?,
        })
    }

    /// The alert operations (with webhooks) these detectors use.
    pub fn alerting(&self) -> &Alerting {
        &self.alerting
    }

    /// The detectors' configuration.
    pub fn config(&self) -> &DetectorConfig {
        &self.cfg
    }

    /// Waits for pending webhook deliveries; call on shutdown.
    pub async fn shutdown(&self) {
        self.alerting.shutdown().await;
    }

    /// Called after every stored probe run: faithful? and changed?. Returns the alerts the
    /// run opened or refreshed. A run that could not run (`ok = false`) is no evidence of
    /// drift and is skipped.
    pub async fn after_run(&self, store: &Store, run: &ProbeRun) -> Result<Vec<Alert>> {
        if !run.ok {
            return Ok(Vec::new());
        }
        // the statistics only: the raw data (tens of kB a run) is read for the few runs that
        // need it, below
        let mut history = store
            .probe_run_stats(&ProbeRunQuery {
                model: Some(run.model.clone()),
                endpoint: Some(run.endpoint.clone()),
                kind: Some(run.kind.clone()),
                since_ms: None,
                limit: self.cfg.history_runs,
            })
            .await
            .map_err(store_err)?;
        history.reverse(); // oldest first
        if !history.iter().any(|r| r.id == run.id) {
            history.push(run.clone());
        }
        let pairs = pairs_needing_raw(&history);
        load_raw(store, &mut history, &pairs).await?;
        if let Some(last) = history.iter_mut().find(|r| r.id == run.id) {
            last.raw.clone_from(&run.raw);
        }
        let floors = noise_floors(&history);
        let mut out = Vec::new();
        let mut finding = self.faithful(run, &history, &floors)?;
        // a flagged run names its fault over the runs pooled since the endpoint went over
        // the threshold: their raw data is read only then
        if finding.is_some() {
            let pooled = pooled_candidates(run, &history);
            if !pooled.is_empty() {
                load_raw(store, &mut history, &pooled).await?;
                finding = self.faithful(run, &history, &floors)?;
            }
        }
        if let Some(finding) = finding {
            out.push(self.alerting.raise(store, &finding).await?.0);
        }
        // a resolved "changed" alert accepts the new behaviour: the chart restarts after it
        let accepted_ms = store
            .alerts(&samewise_store::AlertQuery {
                state: Some(samewise_store::AlertState::Resolved),
                active_only: false,
                model: Some(run.model.clone()),
                endpoint: Some(run.endpoint.clone()),
                limit: 100,
            })
            .await
            .map_err(store_err)?
            .iter()
            .filter(|a| a.kind == KIND_CHANGED)
            .filter_map(|a| a.resolved_ms)
            .max();
        let baselines = self.baselines(store, run, accepted_ms).await?;
        if let Some(finding) = self.changed(run, &history, &floors, accepted_ms, &baselines)? {
            out.push(self.alerting.raise(store, &finding).await?.0);
        }
        Ok(out)
    }

    /// The faithful? finding for `run`, if it is one.
    fn faithful(
        &self,
        run: &ProbeRun,
        history: &[ProbeRun],
        floors: &BTreeMap<String, NoiseFloor>,
    ) -> Result<Option<NewAlert>> {
        match run.kind.as_str() {
            "prompt_logprobs" | "completion_logprobs" => {}
            "samples" => return Ok(self.samples_finding(run)),
            "long_context" => return Ok(long_context_finding(run)),
            _ => return Ok(None),
        }
        if let Some(finding) = self.mismatch_finding(run) {
            return Ok(Some(finding));
        }
        if let Some(finding) = signature_finding(run) {
            return Ok(Some(finding));
        }
        let metric = self.cfg.metric;
        let key = stat_key(metric);
        let Some(value) = stat(&run.stats, key) else {
            return Ok(None);
        };
        let floor = floors.get(key).and_then(|f| f.floor_for(metric));
        let label = metric_label(metric);
        let (evidence, summary, threshold) = if let Some(ladder) = &self.ladder {
            let j = crate::noise::judge(ladder, metric, value, floor, &self.cfg.rule)?;
            if !j.unfaithful {
                return Ok(None);
            }
            let level = ladder.level(&self.cfg.rule.level);
            let level_text = match level {
                Some(l) if l.kind == crate::ladder::LevelKind::Weights => format!("{}-bit", l.bits),
                Some(l) => format!("{} ({}-bit activations)", l.name, l.bits),
                None => self.cfg.rule.level.clone(),
            };
            let cmp = if metric.higher_is_better() { "<" } else { ">" };
            let summary = format!(
                "endpoint {} behaves like {} weights: {label} {} {cmp} {} ({level_text}{})",
                run.endpoint,
                bits_text(&j.ladder.equivalent),
                fmt_num(value),
                fmt_num(j.effective_threshold),
                if (j.effective_threshold - j.ladder.threshold).abs() > 0.0 {
                    ", raised by its noise floor"
                } else {
                    ""
                },
            );
            let evidence = serde_json::json!({
                "detector": "faithful",
                "probe_kind": run.kind,
                "statistic": key,
                "value": value,
                "threshold": j.effective_threshold,
                "ladder_threshold": j.ladder.threshold,
                "level": self.cfg.rule.level,
                "noise_floor": floor,
                "floor_factor": self.cfg.rule.floor_factor,
                "equivalent": j.ladder.equivalent,
                "equivalent_text": j.ladder.equivalent.to_string(),
                "p_value": serde_json::Value::Null,
                "probe_runs": [run.id],
            });
            (evidence, summary, j.effective_threshold)
        } else if let (Some(t), Metric::KlTopkMean) = (self.cfg.kl_threshold, metric) {
            let effective = floor.map_or(t, |f| t.max(self.cfg.rule.floor_factor * f));
            if value <= effective {
                return Ok(None);
            }
            let summary = format!(
                "endpoint {}: {label} {} > {} (configured threshold; no calibration ladder)",
                run.endpoint,
                fmt_num(value),
                fmt_num(effective)
            );
            let evidence = serde_json::json!({
                "detector": "faithful",
                "probe_kind": run.kind,
                "statistic": key,
                "value": value,
                "threshold": effective,
                "configured_threshold": t,
                "noise_floor": floor,
                "floor_factor": self.cfg.rule.floor_factor,
                "p_value": serde_json::Value::Null,
                "probe_runs": [run.id],
            });
            (evidence, summary, effective)
        } else {
            return Ok(None);
        };
        // the threshold this run was judged by, applied to the runs before it
        let over = |r: &ProbeRun| {
            stat(&r.stats, key).is_some_and(|v| {
                if metric.higher_is_better() {
                    v < threshold
                } else {
                    v > threshold
                }
            })
        };
        let pooled = pooled_diagnosis(run, history, over);
        let diagnosis = pooled.as_ref().or_else(|| run.stats.get("diagnosis"));
        let (summary, evidence) = diagnosed(run, diagnosis, label, summary, evidence);
        Ok(Some(unfaithful(run, summary, evidence)))
    }

    /// Tokens that do not map onto the reference vocabulary: a different tokenizer.
    fn mismatch_finding(&self, run: &ProbeRun) -> Option<NewAlert> {
        let rate = stat(&run.stats, "mismatch_rate")?;
        if rate <= self.cfg.max_mismatch_rate {
            return None;
        }
        let unmappable = stat(&run.stats, "unmappable").unwrap_or(f64::NAN);
        let summary = format!(
            "endpoint {}: {:.1}% of its tokens ({unmappable:.0}) do not map onto the reference vocabulary (> {:.1}%): a different tokenizer is a different model",
            run.endpoint,
            100.0 * rate,
            100.0 * self.cfg.max_mismatch_rate
        );
        Some(unfaithful(
            run,
            summary,
            serde_json::json!({
                "detector": "faithful",
                "probe_kind": run.kind,
                "statistic": "mismatch_rate",
                "value": rate,
                "unmappable": run.stats.get("unmappable").cloned().unwrap_or(serde_json::Value::Null),
                "threshold": self.cfg.max_mismatch_rate,
                "p_value": serde_json::Value::Null,
                "probe_runs": [run.id],
            }),
        ))
    }

    fn samples_finding(&self, run: &ProbeRun) -> Option<NewAlert> {
        let p_mmd = stat(&run.stats, "p_value")?;
        let p_loglik = stat(&run.stats, "loglik_p_value");
        let (p, test) = samples_p_value(p_mmd, p_loglik);
        if p >= self.cfg.samples_alpha {
            return None;
        }
        let what = match test {
            SamplesTest::Loglik => {
                let diff = stat(&run.stats, "loglik_diff").unwrap_or(f64::NAN);
                format!(
                    "the reference finds them {} likely: mean log-likelihood {} nats/token against its own samples, permutation p = {}",
                    if diff < 0.0 { "less" } else { "more" },
                    fmt_num(diff),
                    fmt_num(p_loglik.unwrap_or(f64::NAN))
                )
            }
            SamplesTest::Mmd => format!("MMD permutation p = {}", fmt_num(p_mmd)),
        };
        let decision = if p_loglik.is_some() {
            format!("; over both tests (Bonferroni) p = {}", fmt_num(p))
        } else {
            String::new()
        };
        let summary = format!(
            "endpoint {}: its samples differ from the reference's ({what}{decision} < {})",
            run.endpoint,
            fmt_num(self.cfg.samples_alpha)
        );
        Some(unfaithful(
            run,
            summary,
            serde_json::json!({
                "detector": "faithful",
                "probe_kind": run.kind,
                "statistic": test.statistic(),
                "value": run.stats.get(test.statistic()).cloned().unwrap_or(serde_json::Value::Null),
                "threshold": self.cfg.samples_alpha,
                "p_value": p,
                "p_mmd": p_mmd,
                "p_loglik": p_loglik,
                "probe_runs": [run.id],
            }),
        ))
    }

    /// The changed? charts' fixed baselines for `run`'s endpoint and kind, by statistic: the
    /// stored baseline that follows the last accepted change (`accepted_ms`), and for a
    /// statistic without one the first `cusum_baseline_rounds` series runs after that change
    /// that carry it, read from the store (oldest first, whatever `history_runs` holds) and
    /// stored once there are that many. Until then the baseline is the runs there are.
    async fn baselines(
        &self,
        store: &Store,
        run: &ProbeRun,
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
        let missing: Vec<&String> = self
            .cfg
            .cusum_statistics
            .iter()
            .filter(|key| !out.contains_key(*key) && stat(&run.stats, key).is_some())
            .collect();
        if missing.is_empty() {
            return Ok(out);
        }
        // twice the rounds: a statistic that a few early runs lack still finds its baseline
        let limit = u32::try_from(rounds.saturating_mul(2)).unwrap_or(u32::MAX);
        let first = store
            .first_series_runs(&run.model, &run.endpoint, &run.kind, accepted_ms, limit)
            .await
            .map_err(store_err)?;
        for key in missing {
            let runs: Vec<BaselineRun> = first
                .iter()
                .filter_map(|r| {
                    stat(&r.stats, key).map(|value| BaselineRun {
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
                        statistic: key.clone(),
                        after_ms: accepted_ms,
                        runs: runs.clone(),
                        created_ms: samewise_store::now_ms(),
                    })
                    .await
                    .map_err(store_err)?;
            }
            out.insert(key.clone(), runs);
        }
        Ok(out)
    }

    /// The changed? finding: a CUSUM per watched statistic over the endpoint's runs of this
    /// kind (noise-floor repeats excluded, and only runs started after `accepted_ms`, when
    /// the endpoint's last "changed" alert was resolved), alarming on `run`. Each chart runs
    /// over the statistic's fixed baseline (`baselines`), then the runs of `history` after
    /// the baseline's last.
    fn changed(
        &self,
        run: &ProbeRun,
        history: &[ProbeRun],
        floors: &BTreeMap<String, NoiseFloor>,
        accepted_ms: Option<i64>,
        baselines: &BTreeMap<String, Vec<BaselineRun>>,
    ) -> Result<Option<NewAlert>> {
        if run.repeat_of.is_some() {
            return Ok(None);
        }
        let series: Vec<&ProbeRun> = history
            .iter()
            .filter(|r| r.ok && r.repeat_of.is_none())
            .filter(|r| accepted_ms.is_none_or(|t| r.started_ms > t))
            .collect();
        let mut alarms = Vec::new();
        let mut threshold = self.cfg.cusum.h;
        for key in &self.cfg.cusum_statistics {
            if stat(&run.stats, key).is_none() {
                continue;
            }
            let floor = floors.get(key.as_str()).and_then(|f| {
                if higher_is_better(key) {
                    f.floor_rate().map(|r| 1.0 - r)
                } else {
                    f.floor()
                }
            });
            let min_sd = floor.map_or(self.cfg.cusum.min_sd, |f| f.max(self.cfg.cusum.min_sd));
            let baseline = baselines.get(key).map_or(&[][..], Vec::as_slice);
            let after = baseline.last().map(|b| (b.started_ms, b.id));
            let (ids, values): (Vec<i64>, Vec<f64>) = baseline
                .iter()
                .map(|b| (b.id, b.value))
                .chain(
                    series
                        .iter()
                        .filter(|r| after.is_none_or(|a| (r.started_ms, r.id) > a))
                        .filter_map(|r| stat(&r.stats, key).map(|x| (r.id, x))),
                )
                .unzip();
            let (chart, observations) = changed_chart(&self.cfg, min_sd, &values)?;
            let last = ids
                .iter()
                .rposition(|&id| id == run.id)
                .map(|i| (values[i], observations[i]));
            let Some((x, obs)) = last else { continue };
            let Some(shift) = obs.alarm else { continue };
            let Some((mean, sd)) = chart.baseline() else {
                continue;
            };
            threshold = chart.config().h;
            let baseline_ids: Vec<i64> = ids
                .iter()
                .take(self.cfg.cusum.baseline_rounds)
                .copied()
                .collect();
            alarms.push(serde_json::json!({
                "statistic": key,
                "value": x,
                "shift": match shift { Shift::Up => "up", Shift::Down => "down" },
                "z": obs.z,
                "cusum": obs.s_hi.max(obs.s_lo),
                "threshold": chart.config().h,
                "k": self.cfg.cusum.k,
                "arl0": self.cfg.cusum.arl0(),
                "baseline_mean": mean,
                "baseline_sd": sd,
                "baseline_runs": baseline_ids,
            }));
        }
        if alarms.is_empty() {
            return Ok(None);
        }
        let parts: Vec<String> = alarms
            .iter()
            .map(|a| {
                let key = a["statistic"].as_str().unwrap_or("?");
                let dir = if a["shift"] == "up" { "rose" } else { "fell" };
                format!(
                    "{key} {dir} to {} from baseline {}",
                    fmt_num(a["value"].as_f64().unwrap_or(f64::NAN)),
                    fmt_num(a["baseline_mean"].as_f64().unwrap_or(f64::NAN))
                )
            })
            .collect();
        let summary = format!(
            "endpoint {} changed ({}): {} (CUSUM > {:.2}, in-control ARL ≈ {:.0} rounds per chart)",
            run.endpoint,
            run.kind,
            parts.join("; "),
            threshold,
            self.cfg.cusum.arl0()
        );
        Ok(Some(NewAlert {
            model: run.model.clone(),
            endpoint: run.endpoint.clone(),
            kind: KIND_CHANGED.to_owned(),
            summary,
            evidence: serde_json::json!({
                "detector": "changed",
                "probe_kind": run.kind,
                "statistic": alarms.first().map(|a| a["statistic"].clone()),
                "value": alarms.first().map(|a| a["value"].clone()),
                "threshold": threshold,
                "p_value": serde_json::Value::Null,
                "alarms": alarms,
                "probe_runs": [run.id],
            }),
            now_ms: run.finished_ms,
        }))
    }

    /// Called every sweep interval: the passive cross-endpoint tests over each model's
    /// recent request records, then auto-resolve of quiet alerts. Returns the alerts opened
    /// or refreshed, then those resolved.
    pub async fn sweep(&self, store: &Store, now_ms: i64) -> Result<Vec<Alert>> {
        let window_ms = i64::try_from(self.cfg.passive_window.as_millis()).unwrap_or(i64::MAX);
        let records = store
            .request_records(&samewise_store::RecordQuery {
                since_ms: Some(now_ms.saturating_sub(window_ms)),
                limit: samewise_store::MAX_QUERY_LIMIT,
                ..samewise_store::RecordQuery::default()
            })
            .await
            .map_err(store_err)?;
        let mut out = Vec::new();
        for finding in passive_sweep::findings(&records, &self.cfg, now_ms)? {
            out.push(self.alerting.raise(store, &finding).await?.0);
        }
        out.extend(self.alerting.auto_resolve(store, now_ms).await?);
        Ok(out)
    }
}

/// The faithful? finding of a long_context run: its effective context one doubling or more
/// below the reference's (`samewise_longctx::context::one_doubling_below`), with the
/// per-length passes of both sides as evidence.
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

/// The run-stats keys a noise floor is kept for.
const FLOOR_KEYS: [&str; 5] = [
    "kl_mean",
    "kl_p99",
    "dlogprob_mean",
    "top1_same",
    "topk_overlap",
];

/// A noise-floor pair's statistics (a run and its repeat, compared position by position from
/// their raw data) under [`FLOOR_KEYS`]: what the scheduler stores in the repeat's
/// `stats.noise_pair`, so that the detectors read noise floors from the runs' statistics
/// without their raw data. An error when the data do not line up (different generated
/// tokens).
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

/// Noise floors per run-stats key, from the noise-floor pairs in `history` (a run with
/// `repeat_of` and its first run): the pair's `stats.noise_pair`, or, for a pair stored
/// without it, the pair's statistics from both runs' raw data. Pairs whose data do not line
/// up (different generated tokens) are skipped.
fn noise_floors(history: &[ProbeRun]) -> BTreeMap<String, NoiseFloor> {
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
        for key in FLOOR_KEYS {
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
fn pairs_needing_raw(history: &[ProbeRun]) -> Vec<i64> {
    history
        .iter()
        .filter(|b| b.ok && b.stats.get("noise_pair").is_none())
        .filter_map(|b| b.repeat_of.map(|a| [a, b.id]))
        .flatten()
        .collect()
}

/// Fills in the raw data of the runs of `history` with these ids (those that have it).
async fn load_raw(store: &Store, history: &mut [ProbeRun], ids: &[i64]) -> Result<()> {
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
