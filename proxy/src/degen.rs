//! The degeneration guard: a generation that emits the same unit N times in a row (default 4,
//! seen in production on a real model stuck in a loop) is cut.
//!
//! A unit is what the answer offers at the finest grain:
//! - a streamed answer: each non-empty content delta (servers send about one token per delta);
//! - a non-streamed answer with logprobs: each token of `logprobs` (`content[].token` on chat,
//!   `tokens[]` on completions);
//! - a non-streamed answer without logprobs (the fallback): the whitespace-separated words of
//!   the text ([`text_units`]), so "the the the the" counts but one
//!   repeated character inside a word does not.
//!
//! Empty units carry no token and neither count nor break a run. The guard compares units
//! exactly (no trimming: `" no"` and `"no"` are different tokens).

/// Counts identical consecutive units; fires when one arrives `n` times in a row.
#[derive(Debug, Clone)]
pub struct RepeatGuard {
    /// Units in a row that fire the guard (at least 2).
    n: usize,
    /// The unit of the current run.
    last: String,
    /// Length of the current run.
    run: usize,
}

/// The smallest `n` the guard accepts: with 1, every unit would be a "repetition".
pub const MIN_REPEAT: usize = 2;

/// The default `n`.
pub const DEFAULT_REPEAT: usize = 4;

impl RepeatGuard {
    /// A guard that fires on `n` identical units in a row (`n` below 2 is taken as 2).
    pub fn new(n: usize) -> Self {
        RepeatGuard {
            n: n.max(MIN_REPEAT),
            last: String::new(),
            run: 0,
        }
    }

    /// Feeds the next unit; true when it completes (or extends) a run of `n` identical units.
    pub fn push(&mut self, unit: &str) -> bool {
        if unit.is_empty() {
            return self.run >= self.n;
        }
        if self.run > 0 && self.last == unit {
            self.run = self.run.saturating_add(1);
        } else {
            self.last.clear();
            self.last.push_str(unit);
            self.run = 1;
        }
        self.run >= self.n
    }
}

impl Default for RepeatGuard {
    fn default() -> Self {
        RepeatGuard::new(DEFAULT_REPEAT)
    }
}

/// The fallback units of a text without logprobs: its whitespace-separated words.
pub fn text_units(text: &str) -> impl Iterator<Item = &str> {
    text.split_whitespace()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Whether a whole text (no logprobs) has `n` identical words in a row.
    fn repeats_in_text(text: &str, n: usize) -> bool {
        let mut guard = RepeatGuard::new(n);
        text_units(text).any(|w| guard.push(w))
    }

    #[test]
    fn fires_on_the_nth_identical_unit() {
        let mut g = RepeatGuard::new(4);
        assert!(!g.push(" the"));
        assert!(!g.push(" the"));
        assert!(!g.push(" the"));
        assert!(g.push(" the"));
        assert!(g.push(" the"), "a longer run keeps firing");
        assert!(!g.push(" end"));
    }

    #[test]
    fn a_different_unit_breaks_the_run_and_empty_units_do_not() {
        let mut g = RepeatGuard::new(3);
        for u in ["a", "a", "b", "a", "a"] {
            assert!(!g.push(u));
        }
        assert!(!g.push(""));
        assert!(
            g.push("a"),
            "the empty delta neither counted nor broke the run"
        );
    }

    #[test]
    fn units_compare_exactly() {
        let mut g = RepeatGuard::new(2);
        assert!(!g.push(" no"));
        assert!(!g.push("no"));
        assert!(!g.push("No"));
    }

    #[test]
    fn threshold_below_two_is_two() {
        for n in [0, 1, 2] {
            let mut g = RepeatGuard::new(n);
            assert!(!g.push("x"), "n = {n}");
            assert!(g.push("x"), "n = {n}");
        }
        let mut g = RepeatGuard::default();
        assert!(!(0..3).any(|_| g.push("x")));
        assert!(g.push("x"), "the default fires on the 4th");
    }

    #[test]
    fn text_fallback_uses_words() {
        assert!(repeats_in_text("I think think think think so", 4));
        assert!(!repeats_in_text("I think think think so", 4));
        assert!(
            !repeats_in_text("aaaaaaaaaaaaaaaa", 4),
            "one long word is one unit"
        );
        assert!(
            repeats_in_text("ok\nok  ok\tok", 4),
            "any whitespace separates words"
        );
        assert!(!repeats_in_text("", 4));
    }

    /// The obvious definition: position i fires when the n units ending at i (empties
    /// removed) are equal.
    fn fires_naively(units: &[String], n: usize) -> Vec<bool> {
        let mut seen: Vec<&str> = Vec::new();
        units
            .iter()
            .map(|u| {
                if !u.is_empty() {
                    seen.push(u);
                }
                seen.len() >= n
                    && seen[seen.len() - n..]
                        .iter()
                        .all(|x| *x == seen[seen.len() - 1])
            })
            .collect()
    }

    proptest! {
        /// The guard agrees with the naive definition on every prefix of any sequence drawn
        /// from a small alphabet (so runs are common).
        #[test]
        fn agrees_with_naive_definition(units in proptest::collection::vec(prop_oneof!["", "a", "b", " a"], 0..60), n in 2usize..6) {
            let mut g = RepeatGuard::new(n);
            let got: Vec<bool> = units.iter().map(|u| g.push(u)).collect();
            prop_assert_eq!(got, fires_naively(&units, n));
        }

        /// A sequence where no unit equals its predecessor never fires.
        #[test]
        fn alternating_never_fires(units in proptest::collection::vec("[a-c]{1,3}", 0..60), n in 2usize..6) {
            let mut g = RepeatGuard::new(n);
            let mut prev: Option<&str> = None;
            for u in &units {
                if prev == Some(u.as_str()) {
                    continue;
                }
                prop_assert!(!g.push(u));
                prev = Some(u);
            }
        }

        /// Any unit pushed n times in a row fires exactly at the nth push, whatever came before.
        #[test]
        fn run_of_n_fires_at_n(prefix in proptest::collection::vec("[a-c]{1,2}", 0..20), unit in "[d-f]{1,3}", n in 2usize..8) {
            let mut g = RepeatGuard::new(n);
            for p in &prefix {
                g.push(p);
            }
            for k in 1..=n {
                prop_assert_eq!(g.push(&unit), k == n);
            }
        }
    }
}
