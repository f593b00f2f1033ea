//! What a "changed" alert's auto-resolution does to a lasting shift: i.i.d. normal rounds of
//! one statistic (σ 1) shift by δ at round `SWITCH_AT` (60) and stay shifted for `AFTER` (440)
//! rounds; the product's own chart (`detect::changed_chart_config` with the default detector
//! settings: k 1, h for the estimated 30-round baseline, ARL0 1,000, two-sided) runs over them
//! while an alert opens on an alarm, is confirmed by each later alarm, and is auto-resolved
//! once `QUIET` (12: an hour of 5-minute rounds) rounds pass without one. Three policies:
//! "quiet accepts" (before schema v11: any resolution started a new baseline from the runs
//! after it), "operator only" (only an operator's resolution does, and none happens here) and
//! "operator only, held" (now: also, a round on which the chart is still out of control since
//! its alarm, `Observation::out_of_control`, confirms the active alert). Per δ and policy over `WORLDS` (200) seeded worlds: the worlds whose shift became the
//! baseline unseen, the share of post-switch rounds with a "changed" alert active, the worlds
//! still showing it at the last round, and the alerts opened after the switch (each a
//! webhook). Then a shift of `TRANSIENT` (50) rounds that ends: the rounds from the endpoint's
//! return until no alert is active, with and without the hold. 500 rounds fit the detector's `history_runs` window, so one pass per baseline is
//! the chart the detector rebuilds each round. Not a test: it prints numbers.
//!
//!   cargo run --release -p samewise-probes --example changed_lifecycle
//!   SHIFTS=0,1,1.25 WORLDS=1000 cargo run --release -p samewise-probes --example changed_lifecycle

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samewise_probes::detect::{DetectorConfig, changed_chart_config};
use samewise_probes::sequential::Cusum;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v} does not parse")),
        Err(_) => Ok(default),
    }
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u: f64 = 1.0 - rng.random::<f64>();
    let v: f64 = rng.random::<f64>();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// One world's lifecycle under a policy.
#[derive(Debug, Default)]
struct World {
    /// The baseline moved onto shifted rounds without an operator.
    accepted: bool,
    /// Post-switch rounds with a "changed" alert active.
    active_rounds: usize,
    /// An alert active at the last round.
    active_at_end: bool,
    /// Alerts opened at or after the switch.
    opened_after: usize,
    /// Alerts opened before the switch (false alarms).
    opened_before: usize,
    /// Rounds from the endpoint's return (`back_at`) to the first without an active alert.
    cleared_after: Option<usize>,
}

fn run_world(
    det: &DetectorConfig,
    values: &[f64],
    (switch_at, back_at): (usize, usize),
    quiet: usize,
    quiet_accepts: bool,
    hold: bool,
) -> Result<World> {
    let config = changed_chart_config(det, det.cusum.min_sd)?;
    let mut chart = Cusum::new(config)?;
    let mut last_seen: Option<usize> = None;
    let mut w = World::default();
    for (t, &x) in values.iter().enumerate() {
        // the sweep: an alert unconfirmed for longer than the quiet period is resolved
        if last_seen.is_some_and(|s| t - s > quiet) {
            last_seen = None;
            if quiet_accepts {
                // the runs after the resolution are the new baseline
                chart = Cusum::new(config)?;
                w.accepted |= t >= switch_at;
            }
        }
        let obs = chart.observe(x)?;
        // held: a run on which the chart is still out of control confirms the active alert
        if hold && last_seen.is_some() && obs.out_of_control.is_some() {
            last_seen = Some(t);
        }
        if obs.alarm.is_some() {
            if last_seen.is_none() {
                if t >= switch_at {
                    w.opened_after += 1;
                } else {
                    w.opened_before += 1;
                }
            }
            last_seen = Some(t);
        }
        if t >= switch_at && last_seen.is_some() {
            w.active_rounds += 1;
        }
        if t >= back_at && last_seen.is_none() && w.cleared_after.is_none() {
            w.cleared_after = Some(t - back_at);
        }
    }
    w.active_at_end = last_seen.is_some();
    Ok(w)
}

fn main() -> Result<()> {
    let worlds: usize = env_or("WORLDS", 200)?;
    let switch_at: usize = env_or("SWITCH_AT", 60)?;
    let after: usize = env_or("AFTER", 440)?;
    let quiet: usize = env_or("QUIET", 12)?;
    let seed: u64 = env_or("SEED", 7)?;
    let shifts: Vec<f64> = std::env::var("SHIFTS")
        .unwrap_or_else(|_| "0,0.5,0.75,1,1.25,1.5,2,3".to_owned())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .context("SHIFTS: a comma-separated list of σ")
        })
        .collect::<Result<_>>()?;
    let transient: usize = env_or("TRANSIENT", 50)?;
    let transient_shifts: Vec<f64> = std::env::var("TRANSIENT_SHIFTS")
        .unwrap_or_else(|_| "1.5,3,10,50".to_owned())
        .split(',')
        .map(|s| s.trim().parse().context("TRANSIENT_SHIFTS: a list of σ"))
        .collect::<Result<_>>()?;
    let det = DetectorConfig::default();
    let h = changed_chart_config(&det, det.cusum.min_sd)?.h;
    println!(
        "changed? lifecycle: {worlds} worlds, switch at round {switch_at}, {after} rounds after, \
         quiet period {quiet} rounds, k {} h {h:.2}, baseline {} rounds",
        det.cusum.k, det.cusum.baseline_rounds
    );
    println!(
        "| shift (σ) | policy | shift accepted unseen | post-switch rounds with the alert active \
         | active at the last round | alerts opened after the switch (mean, max) | false alerts before it |"
    );
    println!("|---|---|---|---|---|---|---|");
    let policies = [
        ("quiet accepts", true, false),
        ("operator only", false, false),
        ("operator only, held", false, true),
    ];
    // every world's rounds: standard normal, shifted by δ from `switch_at` to `back_at`
    let worlds_of = |delta: f64, back_at: usize, quiet_accepts: bool, hold: bool| {
        (0..worlds)
            .map(|w| {
                let mut rng = StdRng::seed_from_u64(seed ^ (w as u64).wrapping_mul(0x9E37_79B9));
                let values: Vec<f64> = (0..switch_at + after)
                    .map(|t| {
                        let shifted = (switch_at..back_at).contains(&t);
                        normal(&mut rng) + if shifted { delta } else { 0.0 }
                    })
                    .collect();
                run_world(
                    &det,
                    &values,
                    (switch_at, back_at),
                    quiet,
                    quiet_accepts,
                    hold,
                )
            })
            .collect::<Result<Vec<World>>>()
    };
    for &delta in &shifts {
        for (name, quiet_accepts, hold) in policies {
            let all = worlds_of(delta, switch_at + after, quiet_accepts, hold)?;
            let accepted = all.iter().filter(|w| w.accepted).count();
            let active: usize = all.iter().map(|w| w.active_rounds).sum();
            let at_end = all.iter().filter(|w| w.active_at_end).count();
            let opened: usize = all.iter().map(|w| w.opened_after).sum();
            let max_opened = all.iter().map(|w| w.opened_after).max().unwrap_or(0);
            let before: usize = all.iter().map(|w| w.opened_before).sum();
            println!(
                "| {delta} | {name} | {accepted} of {worlds} | {:.1}% | {at_end} of {worlds} | {:.2}, {max_opened} | {before} |",
                100.0 * active as f64 / (worlds * after) as f64,
                opened as f64 / worlds as f64,
            );
        }
    }
    println!(
        "\nA shift of {transient} rounds, then the endpoint back at its baseline: rounds from the \
         return until no alert is active (median, max; worlds still active at the end)"
    );
    println!("| shift (σ) | policy | rounds to clear: median, max | never cleared |");
    println!("|---|---|---|---|");
    for &delta in &transient_shifts {
        for (name, quiet_accepts, hold) in &policies[1..] {
            let all = worlds_of(delta, switch_at + transient, *quiet_accepts, *hold)?;
            let mut cleared: Vec<usize> = all.iter().filter_map(|w| w.cleared_after).collect();
            cleared.sort_unstable();
            let never = worlds - cleared.len();
            let median = cleared.get(cleared.len() / 2).copied().unwrap_or(0);
            let max = cleared.last().copied().unwrap_or(0);
            println!("| {delta} | {name} | {median}, {max} | {never} |");
        }
    }
    Ok(())
}
