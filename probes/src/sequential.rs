//! The "changed?" detector: a CUSUM per endpoint and statistic, against the endpoint's own
//! baseline, so that looking after every probe round does not inflate false alarms.
//!
//! Each probe round yields one number per statistic (say the run's mean top-k KL). The first
//! [`CusumConfig::baseline_rounds`] rounds form the baseline: their mean `μ₀` and sample
//! standard deviation `σ₀`, with `σ = max(σ₀, min_sd)` — `min_sd` is the endpoint's
//! measured noise floor ([`crate::noise`]) or a configured minimum, so a baseline that
//! happened to be very quiet does not make every later wobble look like a shift. Then every
//! round is standardized, `z = (x − μ₀)/σ`, and fed to
//!
//! `S⁺ₜ = max(0, S⁺ₜ₋₁ + zₜ − k)`, `S⁻ₜ = max(0, S⁻ₜ₋₁ − zₜ − k)` (the lower side only when
//! two-sided), alarming when `S⁺ > h` (or `S⁻ > h`).
//!
//! # Choosing k and h: the in-control average run length
//! For i.i.d. N(0, 1) rounds, Siegmund's approximation gives the average run length of the
//! one-sided CUSUM with increments of mean `μ` as
//! `ARL(Δ) ≈ (exp(−2Δb) + 2Δb − 1) / (2Δ²)` with `Δ = μ − k`, `b = h + 1.166`
//! (`b²` when `Δ = 0`) — [`siegmund_arl`]. The in-control ARL0 is `ARL(−k)`; a two-sided
//! chart alarms on either side, so its ARL0 is half of that. [`CusumConfig::for_arl0`]
//! solves for `h` given `k` and a target ARL0.
//!
//! The default ([`CusumConfig::default`]) is `k = 0.5` (tuned to detect a 1σ shift fastest)
//! and a one-sided target ARL0 of 1,000 rounds, giving `h ≈ 5.07`: with a probe round every
//! 10 minutes, one false alarm per endpoint and statistic per ~7 days in control. A sustained
//! upward shift of 2σ is detected after `ARL(1.5) ≈ 3.9` rounds on average (zero-state), and
//! within 7 rounds in at least 95% of runs (both checked by simulation in the tests).
//!
//! For a guarantee that does not lean on normality, [`CusumConfig::e_detector`] picks `h`
//! from the e-detector view of the same chart: ARL0 ≥ the bound for any 1-sub-Gaussian
//! in-control sequence (for `k = 0.5` and a bound of 1,000, `h = ln 1000 ≈ 6.9`).
//!
//! The ARL0 holds for known `μ₀, σ`; estimating them from a short baseline shortens it (the
//! well-known estimated-parameters effect) and makes it vary from chart to chart: a
//! baseline whose σ came out small alarms sooner, one whose σ came out large rarely. With the
//! default 30 baseline rounds the tests check by simulation that the median in-control run
//! length stays above a third of the known-parameter median (`ARL0·ln 2`); a measured noise
//! floor as `min_sd` removes the too-small-σ charts that cause most early alarms.
//!
//! # Correcting h for the estimated baseline
//! Averaged over baselines the effect is large: at the known-parameter `h` (two-sided, ARL0
//! 1,000, k = 0.5: `h ≈ 5.75`) a 30-round baseline makes the in-control false-alarm rate
//! ≈ 0.46% per round instead of 0.1% ([`estimated_baseline_alarm_rate`]); the probe
//! benchmark (`bench/probes/run.sh`, part B) measured 0.41–0.44% per chart on an
//! 8-bit-activation endpoint probed with random text subsets, and a simulation gives the same
//! 0.44% for i.i.d. normal rounds, while the statistics' skew there is small (≈ 0.2 for the
//! per-round mean KL) and a log transform of it changed nothing: the estimated baseline is
//! the cause, not the statistic's shape. [`CusumConfig::for_estimated_baseline`] therefore
//! raises `h` until the expected rate over the baseline's sampling spread (normal theory:
//! `x̄` and `s²` of `baseline_rounds` rounds) is `1/arl0()`; the documented ARL0 then means
//! the long-run in-control rate over charts, `1/ARL0` per round. For k = 0.5 that is
//! `h ≈ 9.40` for 30 rounds (6.57 for 100, 53 for 8); for k = 1, `h ≈ 4.18` from 2.98 (14.5
//! for 8): a larger k is far less sensitive to the baseline mean's error (σ/√n against k).
//!
//! The changed? detector (`crate::detect`) uses the correction by default
//! (`cusum_baseline_correction`) with k = 1: a sustained 2σ shift then takes ≈ 4.8 rounds
//! (Siegmund; the uncorrected k = 0.5 chart it replaces took ≈ 4.4, a corrected k = 0.5 one
//! would take ≈ 6.8), 3σ ≈ 2.6 and 5σ ≈ 1.3; the shifts the probes exist for (w6/w5/w4
//! weights, tens of σ) alarm on the first round after the switch. The tests check by
//! simulation that the detector's default chart keeps 0.1% (±4 standard errors) on normal
//! rounds and a k = 0.5 chart on skewed (log-normal, skewness 0.3) rounds, and that both
//! exceed 0.3% without the correction. A larger k reacts more to a skewed statistic: on
//! log-normal rounds the corrected k = 1 chart measured 0.12% at skewness 0.2 and 0.13% at
//! 0.3 (k = 0.5: 0.107%, 0.101%); on the probes' own a8 rounds, see the benchmark's part B.
//!
//! The ARL0 is per chart. An endpoint watched on several statistics alarms on any of them:
//! with three charts its in-control ARL is about a third of the per-chart one (less than
//! that when the statistics move together).
//!
//! [`CusumConfig::baseline_rounds`]: crate::sequential::CusumConfig::baseline_rounds
//! [`siegmund_arl`]: crate::sequential::siegmund_arl
//! [`CusumConfig::for_arl0`]: crate::sequential::CusumConfig::for_arl0
//! [`CusumConfig::default`]: crate::sequential::CusumConfig::default
//! [`CusumConfig::e_detector`]: crate::sequential::CusumConfig::e_detector
//! [`estimated_baseline_alarm_rate`]: crate::sequential::estimated_baseline_alarm_rate
//! [`CusumConfig::for_estimated_baseline`]: crate::sequential::CusumConfig::for_estimated_baseline

use crate::{Result, invalid};

/// Siegmund's approximation of the one-sided CUSUM's average run length for i.i.d. N(μ, 1)
/// increments, `Δ = μ − k`, threshold `h` (see the module doc).
pub fn siegmund_arl(delta: f64, h: f64) -> f64 {
    let b = h + 1.166;
    if delta.abs() < 1e-9 {
        return b * b;
    }
    ((-2.0 * delta * b).exp() + 2.0 * delta * b - 1.0) / (2.0 * delta * delta)
}

/// The expected in-control false-alarm rate per round of a chart (`k`, `h`, sidedness) whose
/// `μ₀` and `σ` are estimated from `baseline_rounds` i.i.d. normal rounds, averaged over the
/// spread of those estimates (see the module doc): `x̄ − μ ~ N(0, σ²/n)` and
/// `s²/σ² ~ χ²ₙ₋₁/(n − 1)`, independent; given them the standardized rounds are
/// `N(a·r, r²)` with `a = (μ − x̄)/σ`, `r = σ/s`, i.e. a chart on `N(a, 1)` rounds with
/// `k/r`, `h/r`, whose rate is `1/ARL` by Siegmund (both sides when two-sided, at most 1).
/// The two integrals are sums over fixed grids. With known parameters (`baseline_rounds`
/// → ∞) it tends to `1/arl0`.
pub fn estimated_baseline_alarm_rate(
    k: f64,
    h: f64,
    two_sided: bool,
    baseline_rounds: usize,
) -> f64 {
    let n = baseline_rounds.max(2) as f64;
    let nu = n - 1.0;
    // the mean's error in σ units: a = z/√n, z ~ N(0, 1), on [−8, 8]
    const NZ: usize = 161;
    let (mut za, mut zw) = (Vec::with_capacity(NZ), Vec::with_capacity(NZ));
    for i in 0..NZ {
        let z = -8.0 + 16.0 * i as f64 / (NZ - 1) as f64;
        za.push(z / n.sqrt());
        zw.push((-0.5 * z * z).exp());
    }
    let zt: f64 = zw.iter().sum();
    // y = ln(s²/σ²), density ∝ exp(ν/2 · (y − eʸ + 1)); its spread is about √(2/ν), with a long
    // left tail when ν is small
    const NY: usize = 241;
    let sd = (2.0 / nu).sqrt();
    let (lo, hi) = (-(10.0 * sd + 20.0 / nu).min(40.0), 8.0 * sd + 2.0 / nu);
    let (mut yr, mut yw) = (Vec::with_capacity(NY), Vec::with_capacity(NY));
    for i in 0..NY {
        let y = lo + (hi - lo) * i as f64 / (NY - 1) as f64;
        yr.push((-0.5 * y).exp()); // r = σ/s
        yw.push((0.5 * nu * (y - y.exp() + 1.0)).exp()); // peak 1 at y = 0
    }
    let yt: f64 = yw.iter().sum();
    let mut rate = 0.0;
    for (&r, &wy) in yr.iter().zip(&yw) {
        if wy == 0.0 {
            continue;
        }
        let (kr, hr) = (k / r, h / r);
        let mut inner = 0.0;
        for (&a, &wz) in za.iter().zip(&zw) {
            let mut x = 1.0 / siegmund_arl(a - kr, hr);
            if two_sided {
                x += 1.0 / siegmund_arl(-a - kr, hr);
            }
            inner += wz * x.clamp(0.0, 1.0);
        }
        rate += wy * inner;
    }
    rate / (zt * yt)
}

/// The `h` at which [`estimated_baseline_alarm_rate`] is `1/arl0`: the threshold that keeps
/// the in-control false-alarm rate of a chart with a `baseline_rounds`-round estimated
/// baseline at the documented `1/arl0` on average over baselines. Memoized (a few ms each).
pub fn h_for_arl0_estimated(
    k: f64,
    arl0: f64,
    two_sided: bool,
    baseline_rounds: usize,
) -> Result<f64> {
    use std::sync::{Mutex, OnceLock};
    type Key = (u64, u64, bool, usize);
    static MEMO: OnceLock<Mutex<Vec<(Key, f64)>>> = OnceLock::new();
    let lo = h_for_arl0(k, arl0, two_sided)?; // known parameters: the smallest h
    if baseline_rounds < 2 {
        return Err(invalid("CUSUM baseline needs at least 2 rounds"));
    }
    let key = (k.to_bits(), arl0.to_bits(), two_sided, baseline_rounds);
    let memo = MEMO.get_or_init(|| Mutex::new(Vec::new()));
    if let Some(&(_, h)) = memo
        .lock()
        .map_err(|_| invalid("memo poisoned"))?
        .iter()
        .find(|(k2, _)| *k2 == key)
    {
        return Ok(h);
    }
    let target = 1.0 / arl0;
    let rate = |h: f64| estimated_baseline_alarm_rate(k, h, two_sided, baseline_rounds);
    let (mut lo, mut hi) = (lo, 2.0 * lo.max(1.0));
    while rate(hi) > target {
        lo = hi;
        hi *= 2.0;
        if hi > 1e6 {
            return Err(invalid("target ARL0 out of reach for this baseline"));
        }
    }
    while hi - lo > 1e-4 * hi {
        let mid = 0.5 * (lo + hi);
        if rate(mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let h = 0.5 * (lo + hi);
    if let Ok(mut m) = memo.lock() {
        if m.len() >= 64 {
            m.remove(0);
        }
        m.push((key, h));
    }
    Ok(h)
}

/// The cap on the sums kept without restarts, in units of `h`
/// ([`Observation::out_of_control`]).
pub const HELD_CAP: f64 = 2.0;

/// Configuration of one CUSUM chart.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CusumConfig {
    /// Reference value (allowance) in σ units: half the shift to detect fastest.
    pub k: f64,
    /// Decision threshold in σ units.
    pub h: f64,
    /// Also watch for downward shifts.
    pub two_sided: bool,
    /// Rounds that form the baseline before monitoring starts (≥ 2).
    pub baseline_rounds: usize,
    /// Lower bound on the baseline σ (the noise floor); must be > 0.
    pub min_sd: f64,
}

impl Default for CusumConfig {
    /// `k = 0.5`, `h` for a one-sided ARL0 of 1,000 rounds (≈ 5.07), 30 baseline rounds,
    /// `min_sd = 1e-9` (replace it with the endpoint's noise floor).
    fn default() -> Self {
        let h = h_for_arl0(0.5, 1000.0, false).unwrap_or(5.07);
        Self {
            k: 0.5,
            h,
            two_sided: false,
            baseline_rounds: 30,
            min_sd: 1e-9,
        }
    }
}

/// The `h` at which the chart's ARL0 (Siegmund) equals `arl0`, by bisection.
pub fn h_for_arl0(k: f64, arl0: f64, two_sided: bool) -> Result<f64> {
    if !(k > 0.0 && k.is_finite()) {
        return Err(invalid(format!("CUSUM k = {k} must be positive")));
    }
    if !(arl0 > 1.0 && arl0.is_finite()) {
        return Err(invalid(format!("target ARL0 {arl0} must exceed 1")));
    }
    let target = if two_sided { 2.0 * arl0 } else { arl0 };
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while siegmund_arl(-k, hi) < target {
        hi *= 2.0;
        if hi > 1e6 {
            return Err(invalid("target ARL0 out of reach"));
        }
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if siegmund_arl(-k, mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(0.5 * (lo + hi))
}

impl CusumConfig {
    /// A config whose ARL0 (Siegmund) is `arl0` rounds for this `k` and sidedness.
    pub fn for_arl0(k: f64, arl0: f64, two_sided: bool) -> Result<Self> {
        Ok(Self {
            k,
            h: h_for_arl0(k, arl0, two_sided)?,
            two_sided,
            ..Self::default()
        })
    }

    /// The same chart read as an e-detector (Shin, Ramdas & Rinaldo, "E-detectors", 2023):
    /// `exp(2k·S)` is the e-CUSUM of the likelihood ratios `exp(λz − λ²/2)` with `λ = 2k`,
    /// so alarming at `h = ln(arl0_bound)/(2k)` guarantees an in-control ARL of at least
    /// `arl0_bound` for *any* in-control sequence whose standardized rounds are
    /// 1-sub-Gaussian given the past (not only i.i.d. normal) — a distribution-free floor,
    /// at the price of a larger `h` than Siegmund's for the same target.
    pub fn e_detector(k: f64, arl0_bound: f64, two_sided: bool) -> Result<Self> {
        if !(k > 0.0 && k.is_finite()) {
            return Err(invalid(format!("CUSUM k = {k} must be positive")));
        }
        if !(arl0_bound > 1.0 && arl0_bound.is_finite()) {
            return Err(invalid(format!("ARL0 bound {arl0_bound} must exceed 1")));
        }
        // two sides each at 2·bound: alarms from either side still come no more often
        let c = if two_sided {
            2.0 * arl0_bound
        } else {
            arl0_bound
        };
        Ok(Self {
            k,
            h: c.ln() / (2.0 * k),
            two_sided,
            ..Self::default()
        })
    }

    /// This chart with `h` raised for its estimated baseline: the in-control false-alarm rate
    /// per round, averaged over the spread of a `baseline_rounds`-round baseline's mean and
    /// sd ([`estimated_baseline_alarm_rate`]), is `1/arl0()` — the rate `arl0()` promises
    /// for known parameters. `arl0()` of the result is larger (it ignores the estimation).
    pub fn for_estimated_baseline(&self) -> Result<Self> {
        self.validate()?;
        let h = h_for_arl0_estimated(self.k, self.arl0(), self.two_sided, self.baseline_rounds)?;
        Ok(Self { h, ..*self })
    }

    /// The chart's in-control ARL by Siegmund's approximation.
    pub fn arl0(&self) -> f64 {
        let one = siegmund_arl(-self.k, self.h);
        if self.two_sided { one / 2.0 } else { one }
    }

    /// The zero-state ARL (Siegmund) under a sustained upward shift of `shift` σ.
    pub fn arl_at_shift(&self, shift: f64) -> f64 {
        siegmund_arl(shift - self.k, self.h)
    }

    fn validate(&self) -> Result<()> {
        if !(self.k >= 0.0 && self.k.is_finite() && self.h > 0.0 && self.h.is_finite()) {
            return Err(invalid(format!(
                "CUSUM k = {}, h = {} invalid",
                self.k, self.h
            )));
        }
        if self.baseline_rounds < 2 {
            return Err(invalid("CUSUM baseline needs at least 2 rounds"));
        }
        if !(self.min_sd > 0.0 && self.min_sd.is_finite()) {
            return Err(invalid("CUSUM min_sd must be positive"));
        }
        Ok(())
    }
}

/// Which side of a chart fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Shift {
    /// The statistic rose.
    Up,
    /// The statistic fell.
    Down,
}

/// What one observed round did.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Observation {
    /// The standardized value; `None` while the baseline is still being collected.
    pub z: Option<f64>,
    /// Upper CUSUM after this round.
    pub s_hi: f64,
    /// Lower CUSUM after this round (0 when one-sided).
    pub s_lo: f64,
    /// Set on the round the chart fires; the sums then restart from 0.
    pub alarm: Option<Shift>,
    /// Set while the sums kept without those restarts (and capped at [`HELD_CAP`] × `h`) are
    /// over `h`: the statistic has not come back since the chart went out of control. The
    /// same as `alarm` up to the first alarm; after it, a lasting shift larger than `k` keeps
    /// it set every round, while the restarted sums need rounds to fire again; the cap makes
    /// a chart whose statistic is back at the baseline clear it within about `h/k` rounds,
    /// however large the shift was. `Detectors::changed` keeps an active "changed" alert
    /// confirmed while it holds.
    pub out_of_control: Option<Shift>,
}

/// One CUSUM chart; serializable so a scheduler can persist it between rounds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cusum {
    config: CusumConfig,
    baseline: Vec<f64>,
    /// `(μ₀, σ)` once the baseline is complete.
    fitted: Option<(f64, f64)>,
    s_hi: f64,
    s_lo: f64,
    /// The sums without the restart after an alarm ([`Observation::out_of_control`]).
    #[serde(default)]
    held_hi: f64,
    #[serde(default)]
    held_lo: f64,
    /// Rounds seen since monitoring started.
    monitored: u64,
}

impl Cusum {
    /// A chart that first collects `config.baseline_rounds` rounds.
    pub fn new(config: CusumConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            config,
            baseline: Vec::new(),
            fitted: None,
            s_hi: 0.0,
            s_lo: 0.0,
            held_hi: 0.0,
            held_lo: 0.0,
            monitored: 0,
        })
    }

    /// A chart with a known baseline (`sd` is still floored at `min_sd`).
    pub fn with_baseline(config: CusumConfig, mean: f64, sd: f64) -> Result<Self> {
        config.validate()?;
        if !(mean.is_finite() && sd.is_finite() && sd >= 0.0) {
            return Err(invalid("baseline mean and sd must be finite, sd ≥ 0"));
        }
        let mut c = Self::new(config)?;
        c.fitted = Some((mean, sd.max(config.min_sd)));
        Ok(c)
    }

    /// The configuration.
    pub fn config(&self) -> &CusumConfig {
        &self.config
    }

    /// `(μ₀, σ)` once the baseline is complete.
    pub fn baseline(&self) -> Option<(f64, f64)> {
        self.fitted
    }

    /// Rounds observed since monitoring began.
    pub fn monitored_rounds(&self) -> u64 {
        self.monitored
    }

    /// Feeds one round's statistic. NaN or infinite values are refused (the state is unchanged).
    pub fn observe(&mut self, x: f64) -> Result<Observation> {
        if !x.is_finite() {
            return Err(invalid(format!("CUSUM observation {x} is not finite")));
        }
        let Some((mean, sd)) = self.fitted else {
            self.baseline.push(x);
            if self.baseline.len() >= self.config.baseline_rounds {
                let n = self.baseline.len() as f64;
                let m = self.baseline.iter().sum::<f64>() / n;
                let var = self.baseline.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1.0);
                self.fitted = Some((m, var.sqrt().max(self.config.min_sd)));
            }
            return Ok(Observation {
                z: None,
                s_hi: 0.0,
                s_lo: 0.0,
                alarm: None,
                out_of_control: None,
            });
        };
        let z = (x - mean) / sd;
        self.monitored += 1;
        let (k, cap) = (self.config.k, HELD_CAP * self.config.h);
        self.s_hi = (self.s_hi + z - k).max(0.0);
        self.held_hi = (self.held_hi + z - k).clamp(0.0, cap);
        if self.config.two_sided {
            self.s_lo = (self.s_lo - z - k).max(0.0);
            self.held_lo = (self.held_lo - z - k).clamp(0.0, cap);
        }
        let over = |hi: f64, lo: f64| {
            if hi > self.config.h {
                Some(Shift::Up)
            } else if lo > self.config.h {
                Some(Shift::Down)
            } else {
                None
            }
        };
        let alarm = over(self.s_hi, self.s_lo);
        let obs = Observation {
            z: Some(z),
            s_hi: self.s_hi,
            s_lo: self.s_lo,
            alarm,
            out_of_control: over(self.held_hi, self.held_lo),
        };
        if alarm.is_some() {
            self.s_hi = 0.0;
            self.s_lo = 0.0;
        }
        Ok(obs)
    }

    /// Forgets the baseline (after an acknowledged change, the new behaviour becomes the
    /// baseline once enough rounds are seen).
    pub fn rebaseline(&mut self) {
        self.baseline.clear();
        self.fitted = None;
        self.s_hi = 0.0;
        self.s_lo = 0.0;
        self.held_hi = 0.0;
        self.held_lo = 0.0;
        self.monitored = 0;
    }
}

/// Feeds `values` (oldest first) to a new chart with `config`: the chart after the last
/// value and every value's observation. This is the whole chart logic of the changed?
/// detector for one statistic ([`crate::detect::changed_chart`]), pure, so that a benchmark
/// or a test replays exactly what the detector computes.
pub fn run_chart(config: CusumConfig, values: &[f64]) -> Result<(Cusum, Vec<Observation>)> {
    let mut chart = Cusum::new(config)?;
    let mut obs = Vec::with_capacity(values.len());
    for &x in values {
        obs.push(chart.observe(x)?);
    }
    Ok((chart, obs))
}

#[cfg(test)]
mod tests;
