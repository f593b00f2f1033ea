//! Test-only helpers for the seeded simulations: a reproducible generator and the normal,
//! binomial-band and quantile helpers the simulation tests share.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A generator seeded so every simulation is reproducible.
pub(crate) fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// One standard-normal draw (Box–Muller).
pub(crate) fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// The band `[n·p − 3σ, n·p + 3σ]` (σ = sqrt(n·p·(1−p))) that a Binomial(n, p) count falls
/// in with probability ≈ 0.997.
pub(crate) fn binomial_band(n: usize, p: f64) -> (f64, f64) {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (mean - 3.0 * sd, mean + 3.0 * sd)
}
