//! The degeneration guard: a generation that emits the same unit N times in a row (default 4,
//! seen in production on a real model stuck in a loop) is cut — once the run also spans at least
//! `min_chars` characters (default 128). Without that floor the guard cut ordinary answers:
//! digit-by-digit tokenizers (SmolLM2, Llama 2, Mistral, Qwen) write `1000000` as seven units,
//! six of them `"0"`; a hex constant is `"ffff"` again and again, laughter `" ha"`, an emoji one
//! delta each. A real loop runs to `max_tokens`, so waiting for 128 characters costs it at most
//! a few dozen tokens more.
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

/// Counts identical consecutive units; fires when a run is `n` units and `min_chars`
/// characters long.
#[derive(Debug, Clone)]
pub struct RepeatGuard {
    /// Units in a row that fire the guard (at least 2).
    n: usize,
    /// Characters the run must span too.
    min_chars: usize,
    /// The unit of the current run.
    last: String,
    /// Length of the current run, in units (its characters: `run` × those of `last`).
    run: usize,
}

/// The smallest `n` the guard accepts: with 1, every unit would be a "repetition".
pub const MIN_REPEAT: usize = 2;

/// The default `n`.
pub const DEFAULT_REPEAT: usize = 4;

/// The default `min_chars`.
pub const DEFAULT_MIN_CHARS: usize = 128;

impl RepeatGuard {
    /// A guard that fires on `n` identical units in a row (`n` below 2 is taken as 2) spanning
    /// at least `min_chars` characters (0: the units alone count).
    pub fn new(n: usize, min_chars: usize) -> Self {
        RepeatGuard {
            n: n.max(MIN_REPEAT),
            min_chars,
            last: String::new(),
            run: 0,
        }
    }

    /// Feeds the next unit; true when it completes (or extends) a run that fires.
    pub fn push(&mut self, unit: &str) -> bool {
        if !unit.is_empty() {
            if self.run > 0 && self.last == unit {
                self.run = self.run.saturating_add(1);
            } else {
                self.last.clear();
                self.last.push_str(unit);
                self.run = 1;
            }
        }
        // characters are counted only once the run is long enough to matter
        self.run >= self.n && self.run.saturating_mul(self.last.chars().count()) >= self.min_chars
    }
}

impl Default for RepeatGuard {
    fn default() -> Self {
        RepeatGuard::new(DEFAULT_REPEAT, DEFAULT_MIN_CHARS)
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
        let mut guard = RepeatGuard::new(n, 0);
        text_units(text).any(|w| guard.push(w))
    }

    #[test]
    fn fires_on_the_nth_identical_unit() {
        let mut g = RepeatGuard::new(4, 0);
        assert!(!g.push(" the"));
        assert!(!g.push(" the"));
        assert!(!g.push(" the"));
        assert!(g.push(" the"));
        assert!(g.push(" the"), "a longer run keeps firing");
        assert!(!g.push(" end"));
    }

    #[test]
    fn a_different_unit_breaks_the_run_and_empty_units_do_not() {
        let mut g = RepeatGuard::new(3, 0);
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
        let mut g = RepeatGuard::new(2, 0);
        assert!(!g.push(" no"));
        assert!(!g.push("no"));
        assert!(!g.push("No"));
    }

    #[test]
    fn threshold_below_two_is_two() {
        for n in [0, 1, 2] {
            let mut g = RepeatGuard::new(n, 0);
            assert!(!g.push("x"), "n = {n}");
            assert!(g.push("x"), "n = {n}");
        }
        let long = "x".repeat(32);
        let mut g = RepeatGuard::default();
        assert!(!(0..3).any(|_| g.push(&long)));
        assert!(
            g.push(&long),
            "the default fires on the 4th unit of 32 characters"
        );
    }

    /// Each answer as SmolLM2-135M's tokenizer splits it (the engine's `/tokenize`).
    fn tokens(parts: &[(&str, usize)]) -> Vec<String> {
        parts
            .iter()
            .flat_map(|(t, k)| std::iter::repeat_n(t.to_string(), *k))
            .collect()
    }

    #[test]
    fn ordinary_answers_pass_the_default_guard_and_loops_do_not() {
        let rule = format!(" {}", "-".repeat(63));
        let ordinary = [
            // 1000000 (digits one by one), and Solidity's bytes32(0)
            tokens(&[("1", 1), ("0", 6)]),
            tokens(&[("0", 1), ("x", 1), ("0", 64)]),
            // a 128-bit hex constant, laughter, an emoji a delta
            tokens(&[("0", 1), ("x", 1), ("ffff", 8)]),
            tokens(&[("ha", 1), (" ha", 20)]),
            tokens(&[("\u{1F602}", 24)]),
            // a 79-column rule in a code comment
            tokens(&[("#", 1), (&rule, 1), ("-------------", 1)]),
        ];
        for answer in &ordinary {
            let mut g = RepeatGuard::default();
            assert!(!answer.iter().any(|u| g.push(u)), "{answer:?} was cut");
        }
        // loops: the run fires where it reaches 4 units and 128 characters
        for (unit, at) in [(" the", 32), ("0", 128), ("\n", 128), ("ffff", 32)] {
            let mut g = RepeatGuard::default();
            let fired = (1..=1000).find(|_| g.push(unit));
            assert_eq!(fired, Some(at), "{unit:?}");
        }
        let mut g = RepeatGuard::default();
        let fired = (1..=10).find(|_| g.push(&"loop ".repeat(8)));
        assert_eq!(fired, Some(4), "a 40-character unit: the 4th");
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
    /// removed) are equal and the whole run of them ending at i spans `min_chars` characters.
    fn fires_naively(units: &[String], n: usize, min_chars: usize) -> Vec<bool> {
        let mut seen: Vec<&str> = Vec::new();
        units
            .iter()
            .map(|u| {
                if !u.is_empty() {
                    seen.push(u);
                }
                let Some(last) = seen.last() else {
                    return false;
                };
                let run = seen.iter().rev().take_while(|x| *x == last).count();
                run >= n && run * last.chars().count() >= min_chars
            })
            .collect()
    }

    proptest! {
        /// The guard agrees with the naive definition on every prefix of any sequence drawn
        /// from a small alphabet (so runs are common).
        #[test]
        fn agrees_with_naive_definition(units in proptest::collection::vec(prop_oneof!["", "a", "b", " a", "\u{e9}\u{e9}"], 0..60), n in 2usize..6, min_chars in 0usize..12) {
            let mut g = RepeatGuard::new(n, min_chars);
            let got: Vec<bool> = units.iter().map(|u| g.push(u)).collect();
            prop_assert_eq!(got, fires_naively(&units, n, min_chars));
        }

        /// A sequence where no unit equals its predecessor never fires.
        #[test]
        fn alternating_never_fires(units in proptest::collection::vec("[a-c]{1,3}", 0..60), n in 2usize..6) {
            let mut g = RepeatGuard::new(n, 0);
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
            let mut g = RepeatGuard::new(n, 0);
            for p in &prefix {
                g.push(p);
            }
            for k in 1..=n {
                prop_assert_eq!(g.push(&unit), k == n);
            }
        }
    }
}
