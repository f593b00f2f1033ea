//! Property sets: an object's declared properties as bits of a `u64` (at most
//! [`super::MAX_PROPERTIES`]), the candidates a key or a value may still be.

use super::ObjSpec;

/// The set holding property `i` alone (empty past 63).
pub(super) fn bit(i: u32) -> u64 {
    1u64.checked_shl(i).unwrap_or(0)
}

/// The set of the first `n` properties.
pub(super) fn all_bits(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// The candidates among `cand` whose key has byte `b` at `p`.
pub(super) fn filter(spec: &ObjSpec, cand: u64, p: usize, b: u8) -> u64 {
    keep(cand, |i| {
        spec.keys.get(i).and_then(|k| k.get(p)) == Some(&b)
    })
}

/// The candidates among `cand` (a property set) for whose index `pred` holds.
pub(super) fn keep(cand: u64, pred: impl Fn(usize) -> bool) -> u64 {
    let mut out = 0;
    let mut rest = cand;
    while rest != 0 {
        let i = rest.trailing_zeros();
        rest &= rest - 1;
        if pred(i as usize) {
            out |= bit(i);
        }
    }
    out
}
