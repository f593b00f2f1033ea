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
//!   "effective_context"`, both values, the per-length passes). A tool_calls run is flagged
//!   when its endpoint fails cases the reference passes (a call where one is expected, every
//!   call valid; none where none is) more often than the reverse: McNemar's exact test over
//!   each case's newest outcome among the endpoint's tool_calls runs since an operator last
//!   resolved its "unfaithful" alert, below `tool_calls_alpha` (evidence: `statistic:
//!   "tool_calls_passes"`, the discordant cases by id, the runs they came from).
//! - **changed?** ([`Detectors::after_run`]): a two-sided CUSUM per endpoint, probe kind and
//!   statistic over the endpoint's stored runs, oldest first; its first
//!   `cusum_baseline_rounds` runs are the baseline, stored apart once complete
//!   (`Store::put_probe_baseline`), so it stays fixed however many runs follow and when
//!   retention deletes its runs. The chart is rebuilt on every run (so a restart loses
//!   nothing) from the baseline and the newest `history_runs` runs after it; an alarm on the
//!   newest run raises "changed", and a lasting shift keeps alarming however long it lasts.
//!   An operator's resolution of a "changed" alert (`samewise alerts resolve`, the API, the
//!   dashboard) accepts the new behaviour: the chart then starts over from the runs after the
//!   resolution (a new baseline). An auto-resolution after the quiet period accepts nothing:
//!   the baseline stays, so a shift small enough to alarm less often than once per quiet
//!   period is raised again (a new alert) instead of becoming the baseline. Between alarms,
//!   a run on which a chart is still out of control (its sums without the restart after an
//!   alarm over `h`, `Observation::out_of_control`) confirms the active alert without
//!   opening one, so a lasting shift keeps one alert open instead of one per alarm; its
//!   evidence is then the held chart's, with the last alarm kept as `last_alarm`. The chart logic is the pure
//!   [`changed_chart`]; its `h` is raised for the estimated 30-round baseline
//!   ([`changed_chart_config`], `crate::sequential`), which keeps the in-control false-alarm
//!   rate at the documented `1/cusum_arl0` per chart (without it the probe benchmark
//!   measured four times that). `cusum_arl0` is per chart: with the three default charts
//!   of a logprob probe, an endpoint's in-control ARL is about a third of it. The same
//!   charts follow a fingerprint probe's statistics (the endpoint's own echo logprobs on
//!   fixed texts, no reference: `own_logprob_mean`, `own_top1_logprob_mean`,
//!   `own_top1_agreement`, `own_tokens`; by greedy chat where echo is refused, `own_chat_*`),
//!   with σ at least `fingerprint_min_sd`; faithful? never judges those runs.
//! - **passive** ([`Detectors::sweep`]): per model, each endpoint's request records of the
//!   last `passive_window_ms` against the other endpoints': error rate, tool-call error rate
//!   and repetition-cut rate (two-proportion z, flagged only when the endpoint is worse),
//!   and, with three or more endpoints (so that the majority says what is normal), output
//!   length (Mann–Whitney) and finish reasons (chi-square); Benjamini–Hochberg over all of a
//!   model's tests at `passive_q`. The sweep also auto-resolves quiet alerts.
//!
//! Files: this one (faithful?, orchestration), `detect/changed.rs` (changed?: the fixed
//! baselines and the charts), `detect/floors.rs` (noise floors, and the raw data read for
//! the few runs that need it), `detect/diagnosis.rs` and `detect/findings.rs` (fault
//! signatures, pooled diagnosis, the findings), `detect/detector_config.rs`
//! ([`DetectorConfig`]), `detect/passive_sweep.rs` (the passive tests).
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
//! tool_calls_alpha = 0.01       # McNemar over the tool_calls cases' newest outcomes; needs 2·0.5^cases below it
//! max_mismatch_rate = 0.02
//! cusum_k = 1.0                 # CUSUM allowance (σ units): fastest on a 2σ shift
//! cusum_arl0 = 1000.0           # in-control average run length (rounds) per chart, two-sided
//! cusum_baseline_rounds = 30
//! cusum_min_sd = 1e-6
//! cusum_baseline_correction = true  # h raised so the estimated baseline keeps cusum_arl0
//! cusum_statistics = ["kl_mean", "top1_same", "dlogprob_mean", "mmd", "trigger_f1", "effective_context",
//!                     "own_logprob_mean", "own_top1_logprob_mean", "own_top1_agreement", "own_tokens",
//!                     "own_chat_logprob_mean", "own_chat_top1_agreement", "own_chat_tokens"]
//! fingerprint_min_sd = 1e-3     # least σ of a fingerprint chart (nats per token; tokens)
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

use samewise_store::{Alert, NewAlert, ProbeRun, ProbeRunQuery, Store};

use crate::alerting::{Alerting, AlertsConfig};
use crate::config::ProbesConfig;
use crate::ladder::{Equivalent, Ladder, Metric};
use crate::mmd::{SamplesTest, samples_p_value};
use crate::noise::NoiseFloor;
use crate::{ProbesError, Result};

mod diagnosis;
mod findings;
use diagnosis::{diagnosed, pooled_candidates, pooled_diagnosis};
use findings::{long_context_finding, signature_finding, tool_calls_finding, unfaithful};

mod changed;
mod detector_config;
mod floors;
mod passive_sweep;

pub use changed::{changed_chart, changed_chart_config};
pub use detector_config::DetectorConfig;
pub use floors::{fingerprint_pair_stats, noise_pair_stats};
use floors::{load_raw, noise_floors, pairs_needing_raw};

/// The statistics of a fingerprint run the changed? charts follow (the endpoint's own logprobs
/// by echo, then by greedy chat; `crate::kinds` writes them).
pub const FINGERPRINT_STATS: [&str; 7] = [
    "own_logprob_mean",
    "own_top1_logprob_mean",
    "own_top1_agreement",
    "own_tokens",
    "own_chat_logprob_mean",
    "own_chat_top1_agreement",
    "own_chat_tokens",
];

/// Alert kind of the faithful? detector.
pub const KIND_UNFAITHFUL: &str = "unfaithful";
/// Alert kind of the changed? detector.
pub const KIND_CHANGED: &str = "changed";
/// Alert kind of the passive detector.
pub const KIND_PASSIVE: &str = "passive";

/// The detectors with their alerting; built once per scheduler.
/// What the detectors found on one stored run, not yet raised ([`Detectors::judge`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judgement {
    /// The run repeats another (a noise-floor pair).
    repeat: bool,
    /// faithful?'s finding.
    unfaithful: Option<NewAlert>,
    /// changed?'s finding.
    changed: Option<changed::Changed>,
}

impl Judgement {
    /// Whether raising it would touch no alert.
    pub fn is_empty(&self) -> bool {
        self.unfaithful.is_none() && self.changed.is_none()
    }
}

#[derive(Debug)]
pub struct Detectors {
    cfg: DetectorConfig,
    ladder: Option<Ladder>,
    alerting: Alerting,
}

/// Whether `finding`'s endpoint has no active alert of its kind.
async fn no_active_alert(store: &Store, finding: &NewAlert) -> Result<bool> {
    let active = store
        .active_alert(&finding.model, &finding.endpoint, &finding.kind)
        .await
        .map_err(store_err)?;
    Ok(active.is_none())
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

/// Whether larger values of run-stats key `key` are better.
fn higher_is_better(key: &str) -> bool {
    matches!(
        key,
        "top1_same"
            | "topk_overlap"
            | "trigger_f1"
            | "schema_accuracy"
            | "effective_context"
            | "own_top1_agreement"
            | "own_chat_top1_agreement"
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

/// The tool_calls finding's smallest two-sided p is McNemar's with every case lost: a model
/// whose tool_calls cases are too few to reach `tool_calls_alpha` could never be flagged by
/// them, which is a configuration error.
fn check_tool_calls_alpha(cfg: &DetectorConfig, config: &ProbesConfig) -> Result<()> {
    for (name, m) in &config.models {
        if !m.kinds.contains(&crate::config::ProbeKind::ToolCalls) {
            continue;
        }
        let cases = crate::kinds::PromptSets::load(&m.prompt_sets)?
            .tool_call_prompts
            .len();
        let smallest = samewise_toolcheck::vendor::mcnemar_exact(cases as u64, 0);
        if smallest >= cfg.tool_calls_alpha {
            let needed = (1..=64)
                .find(|n| samewise_toolcheck::vendor::mcnemar_exact(*n, 0) < cfg.tool_calls_alpha)
                .unwrap_or(64);
            return Err(ProbesError::Config(format!(
                "probes.detectors.tool_calls_alpha = {} can never be reached with the {cases} tool_calls cases of models.{name} (McNemar's smallest two-sided p, every case lost, is 2·0.5^{cases} = {smallest:.4}): use at least {needed} cases or a larger tool_calls_alpha",
                cfg.tool_calls_alpha,
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
        check_tool_calls_alpha(&cfg, config)?;
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
        check_tool_calls_alpha(&cfg, config)?;
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

    /// Called after every stored probe run: faithful? and changed?, judged and raised
    /// ([`Self::judge`], then [`Self::raise`]). Returns the alerts the run opened or refreshed.
    /// A run that could not run (`ok = false`) is no evidence of drift and is skipped.
    pub async fn after_run(&self, store: &Store, run: &ProbeRun) -> Result<Vec<Alert>> {
        let judged = self.judge(store, run).await?;
        self.raise(store, judged).await
    }

    /// faithful? and changed? on a stored `run` over the endpoint's stored history, raising
    /// nothing: what [`Self::raise`] would open, refresh or confirm now. The scheduler judges
    /// a run once, asks [`Self::opens_alert`] of it, and raises the same judgement unless it
    /// stores a pair first (the history has then changed: it judges again).
    pub async fn judge(&self, store: &Store, run: &ProbeRun) -> Result<Judgement> {
        if !run.ok {
            return Ok(Judgement::default());
        }
        let mut history = self.history(store, run).await?;
        let floors = noise_floors(&history);
        // a tool_calls finding pools the runs since an operator accepted the endpoint
        let accepted_ms = if run.kind == "tool_calls" {
            store
                .last_operator_resolution(&run.model, &run.endpoint, KIND_UNFAITHFUL)
                .await
                .map_err(store_err)?
        } else {
            None
        };
        let mut unfaithful = self.faithful(run, &history, &floors, accepted_ms)?;
        // a flagged run names its fault over the runs pooled since the endpoint went over
        // the threshold: their raw data is read only then
        if unfaithful.is_some() {
            let pooled = pooled_candidates(run, &history);
            if !pooled.is_empty() {
                load_raw(store, &mut history, &pooled).await?;
                unfaithful = self.faithful(run, &history, &floors, accepted_ms)?;
            }
        }
        let changed = self.changed_on(store, run, &history, &floors).await?;
        Ok(Judgement {
            repeat: run.repeat_of.is_some(),
            unfaithful,
            changed,
        })
    }

    /// Raises what `judged` found: an "unfaithful" finding and a "changed" alarm open an alert
    /// or refresh the active one; a "changed" chart held out of control since its last alarm
    /// confirms the active alert (nothing when none is). Returns the alerts opened or touched.
    pub async fn raise(&self, store: &Store, judged: Judgement) -> Result<Vec<Alert>> {
        let mut out = Vec::new();
        if let Some(finding) = judged.unfaithful {
            out.push(self.alerting.raise(store, &finding).await?.0);
        }
        match judged.changed {
            Some(changed::Changed::Alarm(finding)) => {
                out.push(self.alerting.raise(store, &finding).await?.0);
            }
            Some(changed::Changed::Held(mut finding)) => {
                let active = store
                    .active_alert(&finding.model, &finding.endpoint, KIND_CHANGED)
                    .await
                    .map_err(store_err)?;
                // nothing to confirm when no alert is active (resolved meanwhile)
                if let Some(active) = active {
                    changed::keep_last_alarm(&mut finding, &active);
                    out.extend(self.alerting.confirm(store, &finding).await?);
                }
            }
            None => {}
        }
        Ok(out)
    }

    /// Whether raising `judged` would open an alert: an "unfaithful" finding where no such
    /// alert is active for its endpoint, or a "changed" alarm (a chart newly over h, not one
    /// held since an earlier alarm) where no "changed" alert is; never for a repeat. The
    /// scheduler asks it of a run whose kind has noise-floor pairs, so that such an alarm is
    /// first judged with a pair of the same round; an alarm that would only refresh an open
    /// alert is not (a lasting shift would otherwise pair every round).
    pub async fn opens_alert(&self, store: &Store, judged: &Judgement) -> Result<bool> {
        if judged.repeat {
            return Ok(false);
        }
        if let Some(finding) = &judged.unfaithful
            && no_active_alert(store, finding).await?
        {
            return Ok(true);
        }
        match &judged.changed {
            Some(changed::Changed::Alarm(finding)) => no_active_alert(store, finding).await,
            _ => Ok(false),
        }
    }

    /// The endpoint's newest `history_runs` runs of `run`'s kind, oldest first, `run` among
    /// them: statistics only, with the raw data of the noise-floor pairs that need it (tens of
    /// kB a run; the rest is read for the few runs that need it, by the caller).
    async fn history(&self, store: &Store, run: &ProbeRun) -> Result<Vec<ProbeRun>> {
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
        Ok(history)
    }

    /// The changed? finding on `run` over `history`, from its baselines.
    async fn changed_on(
        &self,
        store: &Store,
        run: &ProbeRun,
        history: &[ProbeRun],
        floors: &BTreeMap<String, NoiseFloor>,
    ) -> Result<Option<changed::Changed>> {
        // an operator's resolution of a "changed" alert accepts the new behaviour: the chart
        // restarts after it; an auto-resolution after the quiet period accepts nothing
        let accepted_ms = store
            .last_operator_resolution(&run.model, &run.endpoint, KIND_CHANGED)
            .await
            .map_err(store_err)?;
        let baselines = self.baselines(store, run, history, accepted_ms).await?;
        self.changed(run, history, floors, accepted_ms, &baselines)
    }

    /// The faithful? finding for `run`, if it is one.
    fn faithful(
        &self,
        run: &ProbeRun,
        history: &[ProbeRun],
        floors: &BTreeMap<String, NoiseFloor>,
        accepted_ms: Option<i64>,
    ) -> Result<Option<NewAlert>> {
        match run.kind.as_str() {
            "prompt_logprobs" | "completion_logprobs" => {}
            "samples" => return Ok(self.samples_finding(run)),
            "long_context" => return Ok(long_context_finding(run)),
            "tool_calls" => {
                return Ok(tool_calls_finding(
                    run,
                    history,
                    accepted_ms,
                    self.cfg.tool_calls_alpha,
                ));
            }
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
