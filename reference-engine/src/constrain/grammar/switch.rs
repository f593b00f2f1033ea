//! A choice among literal keys, each followed by its own node ([`Node::Switch`]): `enum`
//! values (followed by nothing) and tool calls (a function's name, then its arguments). One
//! reading follows all keys at once as the range of sorted keys that share the bytes read so
//! far, so a choice among hundreds of values costs one stack, where [`Node::Alt`] would need
//! one reading per value and keep at most [`super::MAX_STACKS`] of them (an enum's later
//! values, or a long tool list's later functions, could not be written at all).

use super::{Grammar, Node, NodeId, Tr};

/// Keys and what follows each.
#[derive(Debug, Clone, PartialEq)]
pub struct Switch {
    /// The keys, sorted and distinct, none empty.
    pub keys: Vec<Box<[u8]>>,
    /// `then[i]` follows `keys[i]`.
    pub then: Vec<NodeId>,
}

impl Grammar {
    /// A node that reads one of `choices`' keys, then that key's node. Keys given more than
    /// once are followed by any of their nodes; an empty key is followed by its node alone.
    /// Where one key is a prefix of another (numbers: `1` and `12`), a byte that continues the
    /// longer one continues it: no node that follows a key may start with such a byte (true of
    /// JSON values, whose followers are `,`, `]`, `}` or the end).
    pub fn switch(&mut self, mut choices: Vec<(Box<[u8]>, NodeId)>) -> NodeId {
        choices.sort_by(|a, b| a.0.cmp(&b.0));
        let mut keys: Vec<Box<[u8]>> = Vec::with_capacity(choices.len());
        let mut then: Vec<Vec<NodeId>> = Vec::with_capacity(choices.len());
        let mut bare = Vec::new();
        for (k, n) in choices {
            if k.is_empty() {
                bare.push(n);
            } else if keys.last() == Some(&k) {
                if let Some(t) = then.last_mut().filter(|t| !t.contains(&n)) {
                    t.push(n);
                }
            } else {
                keys.push(k);
                then.push(vec![n]);
            }
        }
        let then = then
            .into_iter()
            .map(|t| match t.as_slice() {
                [one] => *one,
                _ => self.push(Node::Alt(t.into())),
            })
            .collect();
        let sw = self.push(Node::Switch(Box::new(Switch { keys, then })));
        if bare.is_empty() {
            return sw;
        }
        bare.push(sw);
        self.push(Node::Alt(bare.into()))
    }
}

/// Feeds `inp` to a switch frame that has read `pos` bytes of the keys `lo..hi`, at stack
/// index `at`. A key whose node does not fit at `at` is not taken.
pub(super) fn step(
    g: &Grammar,
    sw: &Switch,
    (lo, hi, pos): (&mut u32, &mut u32, &mut u32),
    inp: Option<u8>,
    at: usize,
) -> Tr {
    let (l, p) = (*lo as usize, *pos as usize);
    let Some(range) = sw.keys.get(l..*hi as usize) else {
        return Tr::Reject;
    };
    let fits = |i: usize| sw.then.get(i).is_some_and(|&t| g.fits(t, at));
    if let Some(b) = inp {
        // the keys with byte b at p: a run of the sorted range (a key that ends at p sorts first)
        let a = l + range.partition_point(|k| k.get(p).is_none_or(|&c| c < b));
        let z = l + range.partition_point(|k| k.get(p).is_none_or(|&c| c <= b));
        if (a..z).any(fits) {
            if z - a == 1 && sw.keys[a].len() == p + 1 {
                return Tr::Then(sw.then[a]);
            }
            (*lo, *hi, *pos) = (a as u32, z as u32, *pos + 1);
            return Tr::Stay;
        }
    }
    // the input continues no key: the key that ends here, if any, is the one read
    match range.first() {
        Some(k) if k.len() == p && fits(l) => Tr::ThenRedo(sw.then[l]),
        _ => Tr::Reject,
    }
}
