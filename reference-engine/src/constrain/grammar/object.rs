//! The object reader: an object's structure, and its keys matched against the declared
//! property names (a property set of candidates narrowed byte by byte).

use super::depth::fitting;
use super::props::{all_bits, bit, filter};
use super::{ADDITIONAL, F, Frame, Grammar, Node, NodeId, ObjSt, Tr};
use crate::constrain::lexeme::{StrEv, StrSub, str_byte};

/// Feeds `inp` to an object frame (properties `seen` read, in state `st`), `depth` frames deep.
pub(super) fn step_obj(
    g: &Grammar,
    node: NodeId,
    seen: &mut u64,
    st: &mut ObjSt,
    inp: Option<u8>,
    depth: usize,
) -> Tr {
    let Some(Node::Obj(spec)) = g.nodes.get(node as usize) else {
        return Tr::Reject;
    };
    let all = all_bits(spec.keys.len());
    // the keys that may start here: those whose value fits below this object
    let keys = || {
        let free = spec.additional.is_some_and(|a| g.fits(a, depth));
        let fitting = fitting(g, spec, all & !*seen, depth);
        (free || fitting != 0).then_some((free, fitting))
    };
    let closable = spec.required & !*seen == 0;
    match (*st, inp) {
        (ObjSt::Open, Some(b'{')) => {
            *st = ObjSt::First;
            Tr::Stay
        }
        (ObjSt::First | ObjSt::After, Some(b'}')) if closable => Tr::Done(0),
        (ObjSt::First | ObjSt::NeedKey, Some(b'"')) => {
            let Some((free, fitting)) = keys() else {
                return Tr::Reject;
            };
            *st = ObjSt::KeyWait;
            Tr::PushKey(Frame(F::Key {
                node,
                // a free key matches any declared name (a seen one is a duplicate,
                // refused when it ends)
                cand: if free { all } else { fitting },
                pos: 0,
                sub: StrSub::Body,
                free,
            }))
        }
        (ObjSt::After, Some(b',')) if keys().is_some() => {
            *st = ObjSt::NeedKey;
            Tr::Stay
        }
        (ObjSt::Colon(i), Some(b':')) => {
            let child = if i == ADDITIONAL {
                spec.additional
            } else {
                spec.values.get(i as usize).copied()
            };
            match child {
                Some(c) => {
                    *st = ObjSt::ValWait(i);
                    Tr::Push(c)
                }
                None => Tr::Reject,
            }
        }
        _ => Tr::Reject,
    }
}

/// Feeds `inp` to a key frame (`cand`: the declared names it may still be, `pos` bytes read,
/// `sub`: where in the string's syntax; `free`: any key text may be written).
pub(super) fn step_key(
    g: &Grammar,
    node: NodeId,
    (cand, pos, sub): (&mut u64, &mut u32, &mut StrSub),
    free: bool,
    inp: Option<u8>,
    depth: usize,
) -> Tr {
    let Some(Node::Obj(spec)) = g.nodes.get(node as usize) else {
        return Tr::Reject;
    };
    let Some(b) = inp else {
        return Tr::Reject;
    };
    let p = *pos as usize;
    let exact =
        || (0..spec.keys.len()).find(|&i| *cand & bit(i as u32) != 0 && spec.keys[i].len() == p);
    if !free {
        if b == b'"'
            && let Some(i) = exact()
        {
            return Tr::Done(i as u32);
        }
        let next = filter(spec, *cand, p, b);
        if next == 0 {
            return Tr::Reject;
        }
        *cand = next;
        *pos += 1;
        return Tr::Stay;
    }
    match str_byte(sub, b) {
        StrEv::Reject => Tr::Reject,
        StrEv::Close => match exact() {
            // a declared property's value must fit too (the key frame is on top:
            // the value goes where it is)
            Some(i) if !spec.values.get(i).is_some_and(|&v| g.fits(v, depth - 1)) => Tr::Reject,
            Some(i) => Tr::Done(i as u32),
            None => Tr::Done(ADDITIONAL),
        },
        StrEv::Cont | StrEv::Char => {
            if *cand != 0 {
                *cand = filter(spec, *cand, p, b);
                *pos = pos.saturating_add(1);
            }
            Tr::Stay
        }
    }
}
