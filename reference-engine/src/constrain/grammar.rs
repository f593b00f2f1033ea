//! The compiled form of a constraint: a [`Grammar`] of nodes (literals, sequences,
//! alternatives, choices among literal keys, and JSON strings, numbers, arrays and objects with
//! their bounds), and the byte-level pushdown automaton that walks it ([`State`]).
//!
//! A state is a small set of stacks of [`Frame`]s: one stack per live reading of the
//! output so far (`anyOf` branches that share a prefix are followed side by side and die
//! when a byte rules them out; at most [`MAX_STACKS`] are kept, while an enum's values or the
//! functions' names are one reading however many, [`Switch`]). A stack's top frame always
//! consumes bytes; frames below it are continuations (the array waiting for its item, the
//! object waiting for a value). The empty stack has read a whole instance and accepts only the
//! end of input.
//!
//! The automaton accepts exactly the bytes that keep the output a prefix of some valid
//! instance, so any token whose bytes pass is allowed, canonical tokenization or not. JSON
//! is read without insignificant whitespace. Numbers with bounds are read without exponent,
//! with at most [`MAX_BOUNDED_DIGITS`] digits, and every digit is checked for whether a
//! value within the bounds can still be reached; integers are written without a fraction.
//! `\u` escapes of UTF-16 surrogates are not produced (astral characters are written as
//! UTF-8). Enum and const values are matched in their compact serde_json spelling.

use super::lexeme::{NumFrame, NumOut, StrEv, StrSub, num_step, str_byte};

mod depth;
mod object;
mod props;
mod switch;

use props::bit;
pub use switch::Switch;

/// Index of a node in [`Grammar::nodes`].
pub type NodeId = u32;

/// Result code of a key that matched no declared property (an additional property).
const ADDITIONAL: u32 = u32::MAX;
/// Most frames on one stack (nesting depth of the output).
pub const MAX_DEPTH: usize = 48;
/// Most stacks (live readings) a state keeps.
pub const MAX_STACKS: usize = 32;
/// Most digits a bounded number is written with.
pub const MAX_BOUNDED_DIGITS: u8 = 17;
/// Most properties of one object schema (a property set is a 64-bit mask).
pub const MAX_PROPERTIES: usize = 64;

/// A numeric bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// The value.
    pub v: f64,
    /// Exclusive (`exclusiveMinimum`/`exclusiveMaximum`).
    pub strict: bool,
}

/// A JSON number's constraints.
#[derive(Debug, Clone, PartialEq)]
pub struct NumSpec {
    /// Integers only (no fraction, no exponent).
    pub integer: bool,
    /// Lower bound.
    pub lo: Option<Bound>,
    /// Upper bound.
    pub hi: Option<Bound>,
}

/// A JSON object's constraints.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjSpec {
    /// Declared property names, JSON-escaped, without quotes.
    pub keys: Vec<Box<[u8]>>,
    /// Each declared property's value node.
    pub values: Vec<NodeId>,
    /// Bit i set: property i is required.
    pub required: u64,
    /// The schema of other properties; None forbids them.
    pub additional: Option<NodeId>,
}

/// One grammar node.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// Exactly these bytes.
    Lit(Box<[u8]>),
    /// These nodes one after the other.
    Seq(Box<[NodeId]>),
    /// Any one of these nodes.
    Alt(Box<[NodeId]>),
    /// One of these literal keys, then its node ([`Grammar::switch`]).
    Switch(Box<Switch>),
    /// Any JSON value.
    Any,
    /// A JSON string of `min..=max` characters.
    Str {
        /// Least characters.
        min: u32,
        /// Most characters (`u32::MAX`: unbounded).
        max: u32,
    },
    /// A JSON number.
    Num(NumSpec),
    /// A JSON array of `min..=max` items.
    Arr {
        /// Each item's node.
        items: NodeId,
        /// Least items.
        min: u32,
        /// Most items (`u32::MAX`: unbounded).
        max: u32,
    },
    /// A JSON object.
    Obj(Box<ObjSpec>),
}

/// A compiled constraint: nodes and the root.
#[derive(Debug, Clone, PartialEq)]
pub struct Grammar {
    /// All nodes; children refer to them by index.
    pub nodes: Vec<Node>,
    /// What the whole output must be.
    pub root: NodeId,
    /// The nodes [`Node::Any`] dispatches to: object, array, string, number, true, false, null.
    any: [NodeId; 7],
    /// Per node, the fewest stack frames its shortest completion needs, its own included
    /// ([`Grammar::seal`]; more than [`MAX_DEPTH`] when it cannot be completed within it).
    heights: Vec<u8>,
}

impl Grammar {
    /// A grammar whose [`Node::Any`] targets exist; add nodes with [`Grammar::push`], then set
    /// [`Grammar::root`].
    pub fn new() -> Self {
        let mut g = Self {
            nodes: Vec::new(),
            root: 0,
            any: [0; 7],
            heights: Vec::new(),
        };
        let any = g.push(Node::Any);
        let obj = g.push(Node::Obj(Box::new(ObjSpec {
            keys: Vec::new(),
            values: Vec::new(),
            required: 0,
            additional: Some(any),
        })));
        let arr = g.push(Node::Arr {
            items: any,
            min: 0,
            max: u32::MAX,
        });
        let s = g.push(Node::Str {
            min: 0,
            max: u32::MAX,
        });
        let n = g.push(Node::Num(NumSpec {
            integer: false,
            lo: None,
            hi: None,
        }));
        let t = g.push(Node::Lit((*b"true").into()));
        let f = g.push(Node::Lit((*b"false").into()));
        let z = g.push(Node::Lit((*b"null").into()));
        g.any = [obj, arr, s, n, t, f, z];
        g.root = any;
        g
    }

    /// The node every [`Grammar::new`] starts with: any JSON value.
    pub const ANY: NodeId = 0;

    /// Adds a node, returning its id.
    pub fn push(&mut self, n: Node) -> NodeId {
        self.nodes.push(n);
        (self.nodes.len() - 1) as NodeId
    }

    /// The start state.
    pub fn start(&self) -> State {
        let mut st = vec![start(self.root)];
        let mut alts = Vec::new();
        let mut stacks = Vec::new();
        if settle(self, &mut st, &mut alts) {
            stacks.push(st);
        }
        stacks.extend(alts);
        let mut s = State { stacks };
        s.dedupe();
        s
    }
}

impl Default for Grammar {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ArrSt {
    Open,
    First,
    ItemWait,
    After,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ObjSt {
    Open,
    First,
    After,
    NeedKey,
    KeyWait,
    /// The key read was property `.0` (or [`ADDITIONAL`]): a colon comes next.
    Colon(u32),
    /// Reading the value of property `.0`.
    ValWait(u32),
}

/// One frame of a stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame(F);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum F {
    Start(NodeId),
    Seq {
        node: NodeId,
        next: u32,
    },
    Lit {
        node: NodeId,
        pos: u32,
    },
    Val,
    /// Has read `pos` bytes of the switch's keys `lo..hi`.
    Switch {
        node: NodeId,
        lo: u32,
        hi: u32,
        pos: u32,
    },
    Str {
        node: NodeId,
        chars: u32,
        sub: StrSub,
    },
    Num {
        node: NodeId,
        n: NumFrame,
    },
    Arr {
        node: NodeId,
        count: u32,
        st: ArrSt,
    },
    Obj {
        node: NodeId,
        seen: u64,
        st: ObjSt,
    },
    Key {
        node: NodeId,
        cand: u64,
        pos: u32,
        sub: StrSub,
        /// Any key text may be written (an additional property's value fits); else only the
        /// candidates' names.
        free: bool,
    },
}

fn start(n: NodeId) -> Frame {
    Frame(F::Start(n))
}

/// The automaton's state: the live stacks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct State {
    stacks: Vec<Vec<Frame>>,
}

impl State {
    /// True when no reading is left (the output cannot be valid).
    pub fn is_dead(&self) -> bool {
        self.stacks.is_empty()
    }

    /// How many readings are live.
    #[cfg(test)]
    pub(crate) fn readings(&self) -> usize {
        self.stacks.len()
    }

    /// When the only reading is inside a string body (between characters, not in an escape):
    /// how many more characters the string may take (`u32::MAX`: unbounded).
    pub fn string_room(&self, g: &Grammar) -> Option<u32> {
        let [stack] = self.stacks.as_slice() else {
            return None;
        };
        match stack.last()?.0 {
            F::Str {
                node,
                chars,
                sub: StrSub::Body,
            } => match g.nodes.get(node as usize) {
                Some(Node::Str { max, .. }) if *max == u32::MAX => Some(u32::MAX),
                Some(Node::Str { max, .. }) => Some(max.saturating_sub(chars)),
                _ => None,
            },
            // a free key that no declared property can match any more
            F::Key {
                cand: 0,
                sub: StrSub::Body,
                node,
                ..
            } => matches!(g.nodes.get(node as usize), Some(Node::Obj(o)) if o.additional.is_some())
                .then_some(u32::MAX),
            _ => None,
        }
    }

    /// Feeds one byte; false (and the state dead) if it cannot continue a valid instance.
    pub fn advance(&mut self, g: &Grammar, b: u8) -> bool {
        self.feed(g, Some(b))
    }

    /// Feeds bytes; false as soon as one is refused.
    pub fn advance_all(&mut self, g: &Grammar, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.advance(g, b))
    }

    /// Whether the output so far is a whole valid instance.
    pub fn can_finish(&self, g: &Grammar) -> bool {
        let mut s = self.clone();
        s.feed(g, None)
    }

    /// Whether some byte can still follow.
    pub fn can_continue(&self, g: &Grammar) -> bool {
        let mut s = State::default();
        (0..=255u8).any(|b| {
            s.clone_from(self);
            s.advance(g, b)
        })
    }

    fn feed(&mut self, g: &Grammar, inp: Option<u8>) -> bool {
        let mut forks = Vec::new();
        let mut i = 0;
        while i < self.stacks.len() {
            if feed_stack(g, &mut self.stacks[i], inp, &mut forks) {
                i += 1;
            } else {
                self.stacks.swap_remove(i);
            }
        }
        if !forks.is_empty() {
            self.stacks.extend(forks);
            self.dedupe();
        }
        !self.stacks.is_empty()
    }

    fn dedupe(&mut self) {
        if self.stacks.len() > 1 {
            self.stacks.sort();
            self.stacks.dedup();
            self.stacks.truncate(MAX_STACKS);
        }
    }
}

/// What one input did to the top frame.
enum Tr {
    Reject,
    /// Consumed; the top still reads.
    Stay,
    /// Not consumed; the top was replaced: feed again.
    Redo,
    /// Consumed; a child starts.
    Push(NodeId),
    /// Consumed; an object key starts.
    PushKey(Frame),
    /// Not consumed; a child starts and reads the input.
    PushRedo(NodeId),
    /// Consumed; the top is replaced by this node's start.
    Then(NodeId),
    /// Not consumed; the top is replaced by this node's start, which reads the input.
    ThenRedo(NodeId),
    /// Consumed; the top is complete with this result.
    Done(u32),
    /// Not consumed; the top is complete and the input goes to its parent.
    Pass(u32),
}

/// Feeds `inp` (None: end of input) to a settled stack; alternatives it forks go to `forks`.
fn feed_stack(
    g: &Grammar,
    st: &mut Vec<Frame>,
    inp: Option<u8>,
    forks: &mut Vec<Vec<Frame>>,
) -> bool {
    loop {
        let depth = st.len();
        let Some(top) = st.last_mut() else {
            return inp.is_none();
        };
        match step(g, top, inp, depth) {
            Tr::Reject => return false,
            Tr::Stay => return true,
            Tr::Redo => {}
            Tr::Push(n) => {
                st.push(start(n));
                return settle_then(g, st, forks, None);
            }
            Tr::PushKey(k) => {
                st.push(k);
                return true;
            }
            Tr::PushRedo(n) => {
                st.push(start(n));
                return settle_then(g, st, forks, Some(inp));
            }
            Tr::Then(n) => {
                *top = start(n);
                return settle_then(g, st, forks, None);
            }
            Tr::ThenRedo(n) => {
                *top = start(n);
                return settle_then(g, st, forks, Some(inp));
            }
            Tr::Done(r) => {
                st.pop();
                return child_done(st, r) && settle_then(g, st, forks, None);
            }
            Tr::Pass(r) => {
                st.pop();
                return child_done(st, r) && settle_then(g, st, forks, Some(inp));
            }
        }
    }
}

/// Settles `st` (alternatives go to `forks`); with `then`, feeds that input to each.
fn settle_then(
    g: &Grammar,
    st: &mut Vec<Frame>,
    forks: &mut Vec<Vec<Frame>>,
    then: Option<Option<u8>>,
) -> bool {
    let mut alts = Vec::new();
    let ok = settle(g, st, &mut alts) && then.is_none_or(|inp| feed_stack(g, st, inp, forks));
    for mut a in alts {
        if forks.len() < MAX_STACKS && then.is_none_or(|inp| feed_stack(g, &mut a, inp, forks)) {
            forks.push(a);
        }
    }
    ok
}

/// Expands starts and finished sequences until the top frame reads bytes (or the stack is
/// empty). Alternatives beyond the first become settled stacks in `alts`.
fn settle(g: &Grammar, st: &mut Vec<Frame>, alts: &mut Vec<Vec<Frame>>) -> bool {
    loop {
        if st.len() > MAX_DEPTH {
            return false;
        }
        let Some(&top) = st.last() else {
            return true;
        };
        match top.0 {
            F::Start(n) => {
                let Some(node) = g.nodes.get(n as usize) else {
                    return false;
                };
                if !g.fits(n, st.len() - 1) {
                    return false;
                }
                let f = match node {
                    Node::Lit(b) if b.is_empty() => {
                        st.pop();
                        if !child_done(st, 0) {
                            return false;
                        }
                        continue;
                    }
                    Node::Lit(_) => F::Lit { node: n, pos: 0 },
                    Node::Seq(_) => F::Seq { node: n, next: 0 },
                    Node::Alt(cs) => {
                        st.pop();
                        for &c in cs.iter().skip(1) {
                            if alts.len() >= MAX_STACKS {
                                break;
                            }
                            let mut s2 = st.clone();
                            s2.push(start(c));
                            if settle(g, &mut s2, alts) {
                                alts.push(s2);
                            }
                        }
                        match cs.first() {
                            Some(&c) => {
                                st.push(start(c));
                                continue;
                            }
                            None => return false,
                        }
                    }
                    Node::Any => F::Val,
                    Node::Switch(sw) => F::Switch {
                        node: n,
                        lo: 0,
                        hi: sw.keys.len() as u32,
                        pos: 0,
                    },
                    Node::Str { .. } => F::Str {
                        node: n,
                        chars: 0,
                        sub: StrSub::Open,
                    },
                    Node::Num(_) => F::Num {
                        node: n,
                        n: NumFrame::START,
                    },
                    Node::Arr { .. } => F::Arr {
                        node: n,
                        count: 0,
                        st: ArrSt::Open,
                    },
                    Node::Obj(_) => F::Obj {
                        node: n,
                        seen: 0,
                        st: ObjSt::Open,
                    },
                };
                if let Some(t) = st.last_mut() {
                    *t = Frame(f);
                }
                if !matches!(f, F::Seq { .. }) {
                    return true;
                }
            }
            F::Seq { node, next } => {
                let Some(Node::Seq(cs)) = g.nodes.get(node as usize) else {
                    return false;
                };
                match cs.get(next as usize) {
                    Some(&c) => {
                        if let Some(t) = st.last_mut() {
                            *t = Frame(F::Seq {
                                node,
                                next: next + 1,
                            });
                        }
                        st.push(start(c));
                    }
                    None => {
                        st.pop();
                        if !child_done(st, 0) {
                            return false;
                        }
                    }
                }
            }
            _ => return true,
        }
    }
}

/// Tells the (new) top that its child finished with result `r`.
fn child_done(st: &mut [Frame], r: u32) -> bool {
    let Some(top) = st.last_mut() else {
        return true;
    };
    match &mut top.0 {
        F::Arr {
            count,
            st: s @ ArrSt::ItemWait,
            ..
        } => {
            *count = count.saturating_add(1);
            *s = ArrSt::After;
        }
        F::Obj { seen, st: s, .. } => match *s {
            ObjSt::KeyWait => {
                if r != ADDITIONAL && *seen & bit(r) != 0 {
                    return false; // a duplicate key
                }
                *s = ObjSt::Colon(r);
            }
            ObjSt::ValWait(i) => {
                if i != ADDITIONAL {
                    *seen |= bit(i);
                }
                *s = ObjSt::After;
            }
            _ => {}
        },
        _ => {}
    }
    true
}

/// One input to the top frame, `depth` frames deep (a child it starts goes at index `depth`).
fn step(g: &Grammar, top: &mut Frame, inp: Option<u8>, depth: usize) -> Tr {
    match &mut top.0 {
        F::Start(_) | F::Seq { .. } => Tr::Reject,
        F::Lit { node, pos } => {
            let Some(Node::Lit(bytes)) = g.nodes.get(*node as usize) else {
                return Tr::Reject;
            };
            match (inp, bytes.get(*pos as usize)) {
                (Some(b), Some(&want)) if b == want => {
                    *pos += 1;
                    if *pos as usize == bytes.len() {
                        Tr::Done(0)
                    } else {
                        Tr::Stay
                    }
                }
                _ => Tr::Reject,
            }
        }
        F::Switch { node, lo, hi, pos } => match g.nodes.get(*node as usize) {
            Some(Node::Switch(sw)) => switch::step(g, sw, (lo, hi, pos), inp, depth - 1),
            _ => Tr::Reject,
        },
        F::Val => {
            let [obj, arr, s, n, t, f, z] = g.any;
            *top = Frame(match inp {
                Some(b'{') => F::Obj {
                    node: obj,
                    seen: 0,
                    st: ObjSt::Open,
                },
                Some(b'[') => F::Arr {
                    node: arr,
                    count: 0,
                    st: ArrSt::Open,
                },
                Some(b'"') => F::Str {
                    node: s,
                    chars: 0,
                    sub: StrSub::Open,
                },
                Some(b'-' | b'0'..=b'9') => F::Num {
                    node: n,
                    n: NumFrame::START,
                },
                Some(b't') => F::Lit { node: t, pos: 0 },
                Some(b'f') => F::Lit { node: f, pos: 0 },
                Some(b'n') => F::Lit { node: z, pos: 0 },
                _ => return Tr::Reject,
            });
            Tr::Redo
        }
        F::Str { node, chars, sub } => {
            let Some(Node::Str { min, max }) = g.nodes.get(*node as usize) else {
                return Tr::Reject;
            };
            let Some(b) = inp else {
                return Tr::Reject;
            };
            match str_byte(sub, b) {
                StrEv::Reject => Tr::Reject,
                StrEv::Cont => Tr::Stay,
                StrEv::Char => {
                    if *chars >= *max {
                        return Tr::Reject;
                    }
                    // unbounded strings do not count, so their states repeat (mask cache)
                    if *max != u32::MAX || *chars < *min {
                        *chars += 1;
                    }
                    Tr::Stay
                }
                StrEv::Close if *chars >= *min => Tr::Done(0),
                StrEv::Close => Tr::Reject,
            }
        }
        F::Num { node, n } => {
            let Some(Node::Num(spec)) = g.nodes.get(*node as usize) else {
                return Tr::Reject;
            };
            match num_step(spec, n, inp) {
                NumOut::Reject => Tr::Reject,
                NumOut::Stay => Tr::Stay,
                NumOut::Pass => Tr::Pass(0),
            }
        }
        F::Arr { node, count, st } => {
            let Some(&Node::Arr { items, min, max }) = g.nodes.get(*node as usize) else {
                return Tr::Reject;
            };
            match (*st, inp) {
                (ArrSt::Open, Some(b'[')) => {
                    *st = ArrSt::First;
                    Tr::Stay
                }
                (ArrSt::First, Some(b']')) if min == 0 => Tr::Done(0),
                (ArrSt::First, Some(b)) if b != b']' && max > 0 && g.fits(items, depth) => {
                    *st = ArrSt::ItemWait;
                    Tr::PushRedo(items)
                }
                (ArrSt::After, Some(b',')) if *count < max && g.fits(items, depth) => {
                    *st = ArrSt::ItemWait;
                    Tr::Push(items)
                }
                (ArrSt::After, Some(b']')) if *count >= min => Tr::Done(0),
                _ => Tr::Reject,
            }
        }
        F::Obj { node, seen, st } => object::step_obj(g, *node, seen, st, inp, depth),
        F::Key {
            node,
            cand,
            pos,
            sub,
            free,
        } => object::step_key(g, *node, (cand, pos, sub), *free, inp, depth),
    }
}
