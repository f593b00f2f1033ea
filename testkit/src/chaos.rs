//! [`Chaos`]: a seeded stream of upstream faults for chaos runs (issue 14, item 3). A mock
//! given one ([`crate::MockUpstreamBuilder::chaos`], `mock-upstream --chaos SEED`) draws each
//! unscripted completion's [`Behavior`] from it: healthy answers (whole, split at awkward byte
//! offsets, or with a slow head), resets before and inside the response, stalls (a head that
//! never comes, a body that stops), slow-loris bodies, 5xx, 429 (with a `Retry-After` of one
//! second or of a day), malformed JSON and broken SSE, and storms: runs of 5xx or 429 answers
//! in a row.
//!
//! The same seed gives the same sequence of draws (SplitMix64, fixed forever); which request
//! gets which draw still depends on arrival order when requests overlap.

use std::time::Duration;

use crate::behavior::{Behavior, Reply};

/// The times a chaos stream's faults are sized against: the gateway's timeouts under test.
#[derive(Debug, Clone, Copy)]
pub struct ChaosTimes {
    /// Longest pause between body events of a slow-loris answer (under the gateway's idle
    /// timeout, so it trickles rather than times out).
    pub loris_gap: Duration,
    /// A slow head: under the gateway's first-byte floor.
    pub slow_head: Duration,
}

/// A seeded fault generator; see the module doc.
#[derive(Debug, Clone)]
pub struct Chaos {
    /// SplitMix64 state.
    state: u64,
    /// The fault being repeated and the answers left in its storm.
    storm: Option<(Behavior, u32)>,
    /// What the faults are sized against.
    times: ChaosTimes,
    /// Draws made so far.
    drawn: u64,
}

impl Chaos {
    /// A stream seeded with `seed`, its delays sized by `times`.
    pub fn new(seed: u64, times: ChaosTimes) -> Self {
        Chaos {
            state: seed,
            storm: None,
            times,
            drawn: 0,
        }
    }

    /// The next answer.
    pub fn next_behavior(&mut self) -> Behavior {
        self.drawn += 1;
        if let Some((b, left)) = self.storm.take() {
            if left > 1 {
                self.storm = Some((b.clone(), left - 1));
            }
            return b;
        }
        let roll = self.below(100);
        match roll {
            0..=39 => Behavior::Ok(Reply::default()),
            40..=44 => Behavior::SplitEvents,
            45..=49 => Behavior::DelayHeaders(self.times.slow_head),
            50..=54 => Behavior::Ok(Reply {
                chunk_delay: self.times.loris_gap,
                ..Reply::default()
            }),
            55..=59 => Behavior::Hang,
            60..=64 => Behavior::NeverEnds,
            65..=69 => Behavior::ResetBeforeResponse,
            70..=74 => Behavior::ResetAfterBytes(1 + self.below(300) as usize),
            75..=79 => Behavior::MalformedJson,
            80..=84 => Behavior::BrokenSse,
            85..=89 => self.status(),
            90..=94 => self.rate_limited(),
            _ => {
                // a storm: 10 to 39 answers of one kind in a row
                let b = if self.below(2) == 0 {
                    self.status()
                } else {
                    self.rate_limited()
                };
                let n = 10 + self.below(30) as u32;
                self.storm = Some((b.clone(), n - 1));
                b
            }
        }
    }

    /// Draws made so far.
    pub fn drawn(&self) -> u64 {
        self.drawn
    }

    fn status(&mut self) -> Behavior {
        let code = [500, 502, 503][self.below(3) as usize];
        Behavior::Status(
            code,
            format!(
                "{{\"error\":{{\"message\":\"chaos {code}\",\"type\":\"server_error\",\"code\":null}}}}"
            ),
        )
    }

    fn rate_limited(&mut self) -> Behavior {
        let retry_after = match self.below(3) {
            0 => None,
            1 => Some(1),
            _ => Some(86_400),
        };
        Behavior::RateLimited { retry_after }
    }

    /// A uniform draw in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// SplitMix64.
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times() -> ChaosTimes {
        ChaosTimes {
            loris_gap: Duration::from_millis(100),
            slow_head: Duration::from_millis(100),
        }
    }

    #[test]
    fn a_seed_repeats_and_every_fault_kind_comes_up() {
        let kinds = |seed| {
            let mut c = Chaos::new(seed, times());
            (0..2000)
                .map(|_| {
                    let b = c.next_behavior();
                    format!("{b:?}")
                        .split(['(', ' ', '{'])
                        .next()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect::<Vec<_>>()
        };
        let a = kinds(7);
        assert_eq!(a, kinds(7));
        assert_ne!(a, kinds(8));
        for k in [
            "Ok",
            "SplitEvents",
            "DelayHeaders",
            "Hang",
            "NeverEnds",
            "ResetBeforeResponse",
            "ResetAfterBytes",
            "MalformedJson",
            "BrokenSse",
            "Status",
            "RateLimited",
        ] {
            assert!(a.iter().any(|x| x == k), "{k} never drawn");
        }
        // storms: some run of at least 10 equal non-Ok answers
        let longest = a
            .chunk_by(|x, y| x == y)
            .filter(|r| r[0] != "Ok")
            .map(<[String]>::len)
            .max()
            .unwrap_or(0);
        assert!(longest >= 10, "no storm: longest fault run {longest}");
    }
}
