//! The seeded generator behind every random choice of the tasks: SplitMix64 (Steele, Lea
//! and Flood, 2014), written out here so an item is the same text for a seed forever,
//! whatever version of a random-number crate the workspace uses.

/// SplitMix64.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0); the modulo bias is below 2⁻⁴⁰ for the small
    /// ranges used here.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Fisher–Yates.
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// Mixes `parts` into one seed (each part through a SplitMix64 step), so a group's seed
/// depends on its task and length, never on which other groups exist.
pub(crate) fn mix(parts: &[u64]) -> u64 {
    let mut r = Rng::new(0x5eed_10c7_c0de_0001);
    let mut h = r.next_u64();
    for p in parts {
        r = Rng::new(h ^ p);
        h = r.next_u64();
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_its_reference_values_and_stays_in_range() {
        // first outputs of SplitMix64 seeded with 0 (Vigna's reference implementation)
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        let mut r = Rng::new(7);
        for n in [1usize, 2, 3, 10, 1000] {
            for _ in 0..200 {
                assert!(r.below(n) < n);
                let u = r.unit();
                assert!((0.0..1.0).contains(&u));
            }
        }
        assert_eq!(r.below(0), 0);
        assert_ne!(mix(&[1, 2]), mix(&[2, 1]));
        assert_eq!(mix(&[1, 2]), mix(&[1, 2]));
    }
}
