//! One scoring job's sequences, with shared prefixes computed once.
//!
//! The prompts of one scoring request often share a long start: a long-context probe sends
//! the same haystack once per candidate answer, a prompt probe the same chat preamble. The
//! job sorts its sequences by their tokens; each one that shares at least
//! [`MIN_SHARED`] leading tokens with its predecessor in that order waits until the
//! predecessor has cached the common part, then *forks* it: it takes a copy of those
//! positions' keys and values and of their scores, and computes only the rest. A position's
//! keys, values and logits depend only on the tokens up to it, and the engine gives them the
//! same bits however the tokens were chunked or batched, so a forked sequence's scores are
//! the bits it would have had alone. On the GPU backend (whose caches live on the device)
//! nothing is forked: a waiting sequence is released to compute its prefix itself.

use super::prefix_cache::common_start;
use super::{Kind, Seq};
use crate::engine::ScoredSequence;
use crate::kv::KvCache;

/// Fewest shared leading tokens worth waiting for.
const MIN_SHARED: usize = 16;

/// A scoring job in flight.
#[derive(Debug)]
pub(crate) struct ScoreJob {
    seqs: Vec<Seq>,
    /// Per sequence, while it waits: the sequence it will fork from and how many positions.
    waits: Vec<Option<(usize, usize)>>,
    /// The sequences in token order (every donor comes before its followers).
    order: Vec<usize>,
    /// Positions taken from another sequence's cache instead of computed.
    shared: usize,
}

impl ScoreJob {
    /// A job over `seqs` (from [`super::Engine::score_seq`]).
    pub(crate) fn new(mut seqs: Vec<Seq>) -> Self {
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by(|&a, &b| seqs[a].tokens.cmp(&seqs[b].tokens));
        let mut waits = vec![None; seqs.len()];
        for w in order.windows(2) {
            let (donor, follower) = (w[0], w[1]);
            let common = common_start(&seqs[donor].tokens, &seqs[follower].tokens);
            if common >= MIN_SHARED {
                // the last shared position is computed again: its logits score the
                // follower's next token, which differs from the donor's
                waits[follower] = Some((donor, common - 1));
                seqs[donor].pinned = true;
            }
        }
        Self {
            seqs,
            waits,
            order,
            shared: 0,
        }
    }

    /// Forks the waiting sequences whose donor has cached enough, frees the caches of
    /// finished sequences no one waits on, and returns the sequences the next step should
    /// advance (none once the job is done).
    pub(crate) fn live(&mut self) -> Vec<&mut Seq> {
        for &f in &self.order {
            let Some((d, n)) = self.waits[f] else {
                continue;
            };
            if self.waits[d].is_some() || self.seqs[d].fed < n {
                continue;
            }
            let (follower, donor) = pair(&mut self.seqs, f, d);
            if follower.fork_from(donor, n) {
                self.shared += n;
            }
            self.waits[f] = None;
        }
        for s in &mut self.seqs {
            s.pinned = false;
        }
        for &(d, _) in self.waits.iter().flatten() {
            self.seqs[d].pinned = true;
        }
        for s in &mut self.seqs {
            if s.is_done() && !s.pinned && !s.cache.layers.is_empty() {
                s.cache = KvCache::default();
            }
        }
        self.seqs
            .iter_mut()
            .zip(&self.waits)
            .filter(|(s, w)| w.is_none() && !s.is_done())
            .map(|(s, _)| s)
            .collect()
    }

    /// True when every sequence is scored.
    pub(crate) fn is_done(&self) -> bool {
        self.seqs.iter().all(Seq::is_done)
    }

    /// Positions forked so far instead of computed.
    pub(crate) fn shared_positions(&self) -> usize {
        self.shared
    }

    /// The scores, in the order the sequences were given (of a finished job).
    pub(crate) fn take_scored(mut self) -> Vec<ScoredSequence> {
        self.seqs.iter_mut().filter_map(Seq::take_scored).collect()
    }
}

/// `v[i]` mutably and `v[j]` shared (`i != j`).
fn pair(v: &mut [Seq], i: usize, j: usize) -> (&mut Seq, &Seq) {
    if i < j {
        let (l, r) = v.split_at_mut(j);
        (&mut l[i], &r[0])
    } else {
        let (l, r) = v.split_at_mut(i);
        (&mut r[0], &l[j])
    }
}

impl Seq {
    /// Takes `donor`'s first `n` positions (cache and scores) as its own; false (and nothing
    /// changed) when the donor cannot give them.
    fn fork_from(&mut self, donor: &Seq, n: usize) -> bool {
        let Kind::Score { out: given, .. } = &donor.kind else {
            return false;
        };
        let Some(scores) = given.get(..=n) else {
            return false;
        };
        let Some(cache) = donor.cache.prefix(n) else {
            return false;
        };
        let Kind::Score { out, .. } = &mut self.kind else {
            return false;
        };
        *out = scores.to_vec();
        self.cache = cache;
        self.fed = n;
        true
    }
}
