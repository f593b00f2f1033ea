//! How deep the output may still nest: [`Grammar::seal`] computes each node's height, and the
//! readers consult [`Grammar::fits`] (and [`fitting`]) before they open anything, so that every
//! reading can always be completed within [`MAX_DEPTH`] frames.

use super::props::{bit, keep};
use super::{Grammar, MAX_DEPTH, Node, NodeId, ObjSpec};

/// The height of a node that cannot be completed within [`MAX_DEPTH`] frames.
const UNREACHABLE: u8 = MAX_DEPTH as u8 + 1;

impl Grammar {
    /// Computes each node's height (the fewest frames its shortest completion needs); call it
    /// once every node is pushed ([`crate::constrain::compile`] does). The readers then open
    /// nothing they could not close within [`MAX_DEPTH`]: a node starts only where its shortest
    /// completion fits, an array takes another item and an object another key only where that
    /// value fits.
    /// So no reading ends in a dead end (no byte allowed and the output not whole), however
    /// deep the output nests. Recursion is resolved by iterating to the fixed point from
    /// "unreachable"; each round settles one more level, so `MAX_DEPTH + 1` rounds suffice.
    pub fn seal(&mut self) {
        let mut h = vec![UNREACHABLE; self.nodes.len()];
        for _ in 0..=MAX_DEPTH {
            let mut changed = false;
            for i in 0..self.nodes.len() {
                let of = |c: NodeId| h.get(c as usize).copied().unwrap_or(UNREACHABLE);
                let below = |c: Option<u8>| c.map_or(1, |c| c.saturating_add(1));
                let v = match &self.nodes[i] {
                    Node::Lit(_) | Node::Str { .. } | Node::Num(_) | Node::Any => 1,
                    Node::Seq(cs) => below(cs.iter().map(|&c| of(c)).max()),
                    Node::Alt(cs) => cs.iter().map(|&c| of(c)).min().unwrap_or(UNREACHABLE),
                    // what follows a key replaces the switch's frame
                    Node::Switch(sw) => sw.then.iter().map(|&c| of(c)).min().unwrap_or(UNREACHABLE),
                    Node::Arr { items, min, .. } if *min > 0 => below(Some(of(*items))),
                    Node::Arr { .. } => 1,
                    Node::Obj(o) => below(
                        (0..o.keys.len())
                            .filter(|&k| o.required & bit(k as u32) != 0)
                            .map(|k| o.values.get(k).map_or(UNREACHABLE, |&c| of(c)))
                            .max(),
                    ),
                };
                let v = v.min(UNREACHABLE);
                if v < h[i] {
                    h[i] = v;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        self.heights = h;
    }

    /// Whether node `n` can start at stack index `at` and be completed within [`MAX_DEPTH`]
    /// frames (before [`Grammar::seal`]: whether its own frame fits).
    pub(super) fn fits(&self, n: NodeId, at: usize) -> bool {
        let h = self.heights.get(n as usize).map_or(1, |&h| usize::from(h));
        at + h <= MAX_DEPTH
    }
}

/// The candidates among `cand` whose value fits at stack index `at`.
pub(super) fn fitting(g: &Grammar, spec: &ObjSpec, cand: u64, at: usize) -> u64 {
    keep(cand, |i| spec.values.get(i).is_some_and(|&v| g.fits(v, at)))
}
