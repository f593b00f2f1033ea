//! The statistical pieces end to end, through the public API, on a seeded toy model: full
//! logits → the top-k view an endpoint would return → per-position comparison → run summary
//! → noise floor → CUSUM ("changed?") and ladder + floor ("faithful?").
//!
//! A nondeterministic but faithful endpoint (fresh logit noise every request) runs for 150
//! rounds; in half of the worlds it silently switches to a biased, 4-bit-like model at round
//! 60. Checked: the switch raises a "changed" alarm within 3 rounds, the faithful verdict
//! flips to unfaithful after the switch and never before, and the unswitched endpoints
//! raise at most rare false alarms.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samewise_probes::compare::{
    PositionInput, compare_run, log_softmax, position_from_full_logprobs, summarize,
};
use samewise_probes::ladder::{Ladder, LevelBuilder, LevelKind, Metric};
use samewise_probes::noise::{FaithfulRule, NoiseFloor, judge, repeat_summary};
use samewise_probes::sequential::{Cusum, CusumConfig, Shift};

const V: usize = 32;
const P: usize = 64;
const K: usize = 5;

fn normal(g: &mut StdRng) -> f64 {
    let u1: f64 = g.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = g.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn perturb(base: &[Vec<f32>], sd: f64, g: &mut StdRng) -> Vec<Vec<f32>> {
    base.iter()
        .map(|l| l.iter().map(|&x| x + (sd * normal(g)) as f32).collect())
        .collect()
}

struct World {
    reference: Vec<Vec<f32>>,
    actual: Vec<u32>,
    ladder: Ladder,
}

fn world(seed: u64) -> anyhow::Result<World> {
    let mut g = StdRng::seed_from_u64(seed);
    let reference: Vec<Vec<f32>> = (0..P)
        .map(|_| (0..V).map(|_| (2.5 * normal(&mut g)) as f32).collect())
        .collect();
    let actual: Vec<u32> = (0..P).map(|_| g.random_range(0..V as u32)).collect();
    let mut levels = Vec::new();
    for (bits, sd) in [
        (8u32, 0.02),
        (6, 0.08),
        (5, 0.16),
        (4, 0.32),
        (3, 0.64),
        (2, 1.28),
    ] {
        let level = perturb(&reference, sd, &mut g);
        let mut b = LevelBuilder::new(K)?;
        for i in 0..P {
            b.add(&reference[i], &level[i], actual[i])?;
        }
        levels.push(b.finish(&format!("w{bits}"), LevelKind::Weights, bits)?);
    }
    let ladder = Ladder {
        model: "toy".into(),
        model_sha256: "0".into(),
        corpus: "simulated".into(),
        positions: P as u64,
        top_k: K as u32,
        levels,
    };
    ladder.validate()?;
    Ok(World {
        reference,
        actual,
        ladder,
    })
}

fn probe(w: &World, endpoint: &[Vec<f32>]) -> anyhow::Result<Vec<PositionInput>> {
    (0..P)
        .map(|i| {
            let r = log_softmax(&w.reference[i])?;
            let e = log_softmax(&endpoint[i])?;
            Ok(position_from_full_logprobs(&r, &e, w.actual[i], K)?)
        })
        .collect()
}

#[test]
fn switch_to_a_biased_model_is_changed_and_unfaithful() -> anyhow::Result<()> {
    let (rounds, switch_at, worlds) = (150usize, 60usize, 10u64);
    let request_noise = 0.05;
    let rule = FaithfulRule::default();
    let mut delays = Vec::new();
    let mut false_alarms = 0usize;
    let mut monitored_in_control = 0usize;
    for seed in 0..worlds {
        let w = world(seed)?;
        let mut g = StdRng::seed_from_u64(1000 + seed);
        let switches = seed % 2 == 0;
        let biased = perturb(&w.reference, 0.32, &mut g);

        // noise floor from two repeats of the first round's probe
        let r1 = probe(&w, &perturb(&w.reference, request_noise, &mut g))?;
        let r2 = probe(&w, &perturb(&w.reference, request_noise, &mut g))?;
        let mut floor = NoiseFloor::default();
        floor.record(repeat_summary(&r1, &r2)?.kl_mean)?;

        let cfg = CusumConfig {
            min_sd: 1e-6,
            ..CusumConfig::default()
        };
        let mut chart = Cusum::new(cfg)?;
        let mut detected = None;
        for round in 0..rounds {
            let model = if switches && round >= switch_at {
                &biased
            } else {
                &w.reference
            };
            let s = summarize(&compare_run(&probe(
                &w,
                &perturb(model, request_noise, &mut g),
            )?)?)?;
            let verdict = judge(
                &w.ladder,
                Metric::KlTopkMean,
                s.kl_mean,
                floor.floor(),
                &rule,
            )?;
            let obs = chart.observe(s.kl_mean)?;
            let switched = switches && round >= switch_at;
            assert_eq!(
                verdict.unfaithful, switched,
                "world {seed} round {round}: {verdict:?}"
            );
            if obs.alarm == Some(Shift::Up) {
                if switched {
                    detected.get_or_insert(round - switch_at + 1);
                } else {
                    false_alarms += 1;
                }
            }
            if !switched && obs.z.is_some() {
                monitored_in_control += 1;
            }
            if switched && verdict.ladder.equivalent.to_string().is_empty() {
                anyhow::bail!("empty equivalent");
            }
        }
        if switches {
            delays.push(
                detected.ok_or_else(|| anyhow::anyhow!("world {seed}: switch not detected"))?,
            );
        }
    }
    eprintln!(
        "pipeline: switch detected after {delays:?} rounds; {false_alarms} false alarms in {monitored_in_control} in-control monitored rounds"
    );
    assert!(delays.iter().all(|&d| d <= 3), "{delays:?}");
    // nominal ARL0 is 1,000; allow for the estimated baseline and a skewed statistic: at most
    // one false alarm per 100 in-control rounds
    assert!(
        false_alarms * 100 <= monitored_in_control,
        "{false_alarms} in {monitored_in_control}"
    );
    Ok(())
}
