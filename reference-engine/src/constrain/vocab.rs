//! The vocabulary as a byte trie, and the allowed-token mask of an automaton state.
//!
//! [`TokenTrie`] holds every non-special token's bytes in a trie (children of a node are
//! contiguous, sorted by byte). [`TokenTrie::fill_mask`] walks it depth first from a state:
//! a branch is followed while the automaton accepts its bytes, and every token ending on an
//! accepted path is allowed. So the mask holds exactly the tokens whose bytes keep the
//! output a valid prefix, whatever tokenization led there. Special tokens are never allowed
//! except the stop tokens, which are allowed when the output is a whole instance.

use super::grammar::{Grammar, State};

/// A set of token ids.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenSet {
    words: Vec<u64>,
}

impl TokenSet {
    /// The empty set over a vocabulary of `n` tokens.
    pub fn new(n: usize) -> Self {
        Self {
            words: vec![0; n.div_ceil(64)],
        }
    }

    /// Whether `t` is in the set.
    pub fn contains(&self, t: u32) -> bool {
        self.words
            .get(t as usize / 64)
            .is_some_and(|w| w >> (t % 64) & 1 == 1)
    }

    /// Adds `t` (ignored when out of range).
    pub fn insert(&mut self, t: u32) {
        if let Some(w) = self.words.get_mut(t as usize / 64) {
            *w |= 1 << (t % 64);
        }
    }

    /// How many tokens are in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct TrieNode {
    /// First child edge in [`Trie::edges`].
    first_edge: u32,
    /// Number of child edges.
    n_edges: u32,
    /// First token ending here in [`Trie::ends`].
    first_end: u32,
    /// Number of tokens ending here.
    n_ends: u32,
}

/// Token byte strings as a trie.
#[derive(Debug, Default)]
struct Trie {
    nodes: Vec<TrieNode>,
    /// (byte, child node), grouped per parent.
    edges: Vec<(u8, u32)>,
    /// Token ids, grouped per node they end at.
    ends: Vec<u32>,
    /// Longest token in bytes.
    max_len: usize,
}

impl Trie {
    /// A trie over the tokens `ids` (each non-empty), given every token's bytes.
    fn new(mut ids: Vec<u32>, bytes: &[Box<[u8]>]) -> Self {
        ids.sort_by(|&a, &b| bytes[a as usize].cmp(&bytes[b as usize]).then(a.cmp(&b)));
        let mut t = Self {
            nodes: vec![TrieNode::default()],
            ..Self::default()
        };
        // breadth-first over (node, sorted id range, depth) so each node's edges are contiguous
        let mut queue = std::collections::VecDeque::from([(0u32, 0usize, ids.len(), 0usize)]);
        while let Some((node, lo, hi, depth)) = queue.pop_front() {
            t.max_len = t.max_len.max(depth);
            let mut i = lo;
            let first_end = t.ends.len() as u32;
            while i < hi && bytes[ids[i] as usize].len() == depth {
                t.ends.push(ids[i]);
                i += 1;
            }
            let first_edge = t.edges.len() as u32;
            while i < hi {
                let b = bytes[ids[i] as usize][depth];
                let mut j = i;
                while j < hi && bytes[ids[j] as usize][depth] == b {
                    j += 1;
                }
                let child = t.nodes.len() as u32;
                t.nodes.push(TrieNode::default());
                t.edges.push((b, child));
                queue.push_back((child, i, j, depth + 1));
                i = j;
            }
            t.nodes[node as usize] = TrieNode {
                first_edge,
                n_edges: t.edges.len() as u32 - first_edge,
                first_end,
                n_ends: t.ends.len() as u32 - first_end,
            };
        }
        t
    }

    fn walk(
        &self,
        g: &Grammar,
        node: u32,
        depth: usize,
        mask: &mut TokenSet,
        scratch: &mut [State],
    ) {
        let n = self.nodes[node as usize];
        for &(b, child) in &self.edges[n.first_edge as usize..(n.first_edge + n.n_edges) as usize] {
            {
                let (here, rest) = scratch.split_at_mut(depth + 1);
                let next = &mut rest[0];
                next.clone_from(&here[depth]);
                if !next.advance(g, b) {
                    continue;
                }
            }
            let c = self.nodes[child as usize];
            for &t in &self.ends[c.first_end as usize..(c.first_end + c.n_ends) as usize] {
                mask.insert(t);
            }
            if c.n_edges > 0 {
                self.walk(g, child, depth + 1, mask, scratch);
            }
        }
    }
}

/// The vocabulary's token bytes as tries, with the string-body shortcut.
///
/// Inside a JSON string most tokens are plain text: no quote, backslash or control byte,
/// whole UTF-8 characters. Such a token is allowed there exactly when its characters fit
/// the string's remaining length, and it leaves the reader where it was; so in a string
/// body the mask is a precomputed set of plain tokens (by character count) plus a walk of
/// the much smaller trie of the other tokens. Elsewhere the whole trie is walked.
#[derive(Debug)]
pub struct TokenTrie {
    /// Every token that may appear in constrained output.
    all: Trie,
    /// The tokens that are not plain string text.
    special_in_strings: Trie,
    /// `plain_upto[k]`: plain tokens of at most k characters (the last: all of them).
    plain_upto: Vec<TokenSet>,
    /// Each token's bytes (empty for tokens that never appear in constrained output).
    bytes: Vec<Box<[u8]>>,
    /// Stop tokens: allowed when the output is complete.
    stops: Vec<u32>,
    /// Vocabulary size.
    vocab: usize,
}

impl TokenTrie {
    /// The trie of a tokenizer's vocabulary, its stop tokens ending the output (what every
    /// constrained generation over that tokenizer uses: the server's and the probes').
    pub fn of_tokenizer(tok: &crate::Tokenizer) -> Self {
        let entries: Vec<(&[u8], bool)> = (0..tok.vocab_size() as u32)
            .map(|t| (tok.token_bytes(t).unwrap_or_default(), tok.is_special(t)))
            .collect();
        let stops: Vec<u32> = tok.stop_ids().iter().copied().collect();
        Self::new(&entries, &stops)
    }

    /// A trie over `tokens` (index = id): `(bytes, special)`; special tokens are left out,
    /// `stops` end the output.
    pub fn new(tokens: &[(&[u8], bool)], stops: &[u32]) -> Self {
        let bytes: Vec<Box<[u8]>> = tokens
            .iter()
            .map(|(b, special)| {
                if *special {
                    Box::default()
                } else {
                    Box::from(*b)
                }
            })
            .collect();
        let ids: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&i| !bytes[i as usize].is_empty())
            .collect();
        let plain_len = |b: &[u8]| -> Option<usize> {
            let s = std::str::from_utf8(b).ok()?;
            s.bytes()
                .all(|c| c >= 0x20 && c != b'"' && c != b'\\')
                .then(|| s.chars().count())
        };
        let lens: Vec<Option<usize>> = bytes
            .iter()
            .map(|b| if b.is_empty() { None } else { plain_len(b) })
            .collect();
        let longest = lens.iter().flatten().copied().max().unwrap_or(0);
        let mut plain_upto = vec![TokenSet::new(tokens.len()); longest + 1];
        for (t, l) in lens.iter().enumerate() {
            if let Some(l) = *l {
                for set in &mut plain_upto[l..] {
                    set.insert(t as u32);
                }
            }
        }
        let others: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&i| lens[i as usize].is_none())
            .collect();
        Self {
            all: Trie::new(ids, &bytes),
            special_in_strings: Trie::new(others, &bytes),
            plain_upto,
            bytes,
            stops: stops.to_vec(),
            vocab: tokens.len(),
        }
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Whether `t` is a stop token.
    pub fn is_stop(&self, t: u32) -> bool {
        self.stops.contains(&t)
    }

    /// A token's bytes (empty for special tokens).
    pub fn token_bytes(&self, t: u32) -> &[u8] {
        self.bytes.get(t as usize).map_or(&[], |b| b)
    }

    /// Trie nodes (for figures).
    pub fn node_count(&self) -> usize {
        self.all.nodes.len()
    }

    /// Fills `mask` with the tokens allowed after `state`; `scratch` is reused between calls.
    pub fn fill_mask(
        &self,
        g: &Grammar,
        state: &State,
        mask: &mut TokenSet,
        scratch: &mut Vec<State>,
    ) {
        let trie = match state.string_room(g) {
            Some(room) => {
                let k = (room as usize).min(self.plain_upto.len().saturating_sub(1));
                match self.plain_upto.get(k) {
                    Some(set) => mask.clone_from(set),
                    None => mask.clear(),
                }
                &self.special_in_strings
            }
            None => {
                mask.clear();
                &self.all
            }
        };
        if scratch.len() < trie.max_len + 1 {
            scratch.resize_with(trie.max_len + 1, State::default);
        }
        scratch[0].clone_from(state);
        trie.walk(g, 0, 0, mask, scratch);
        if state.can_finish(g) {
            for &s in &self.stops {
                mask.insert(s);
            }
        }
    }
}
