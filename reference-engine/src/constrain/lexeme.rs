//! Readers of JSON's two lexemes that need more than literal matching: strings (escapes,
//! UTF-8 validity, character counts) and numbers (JSON's grammar, and for bounded numbers a
//! check at every digit that a value within the bounds can still be reached).

use super::grammar::{MAX_BOUNDED_DIGITS, NumSpec};

/// Where a string reader is inside the string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum StrSub {
    /// Before the opening quote.
    Open,
    /// Between characters.
    Body,
    /// After a backslash.
    Esc,
    /// After `\u` and this many hex digits; `d`: the first was `d`/`D`.
    Hex(u8, bool),
    /// Inside a UTF-8 character: `need` more bytes, the next in `lo..=hi`.
    Utf8 { need: u8, lo: u8, hi: u8 },
}

/// Where a number reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum NumSt {
    Start,
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    /// After `e+`.
    ESign,
    /// Reading a positive exponent.
    Exp,
    /// After `e-`.
    ENeg,
    /// Reading a negative exponent.
    ExpNeg,
}

pub(super) enum StrEv {
    Reject,
    /// Consumed inside a character.
    Cont,
    /// Consumed: a new character starts.
    Char,
    /// The closing quote.
    Close,
}

/// One byte of a JSON string (after the opening quote, or the quote itself in `Open`).
pub(super) fn str_byte(sub: &mut StrSub, b: u8) -> StrEv {
    match *sub {
        StrSub::Open => {
            if b == b'"' {
                *sub = StrSub::Body;
                StrEv::Cont
            } else {
                StrEv::Reject
            }
        }
        StrSub::Body => match b {
            b'"' => StrEv::Close,
            b'\\' => {
                *sub = StrSub::Esc;
                StrEv::Char
            }
            0x00..=0x1f => StrEv::Reject,
            0x20..=0x7f => StrEv::Char,
            0xc2..=0xdf => {
                *sub = StrSub::Utf8 {
                    need: 1,
                    lo: 0x80,
                    hi: 0xbf,
                };
                StrEv::Char
            }
            0xe0..=0xef => {
                let (lo, hi) = match b {
                    0xe0 => (0xa0, 0xbf),
                    0xed => (0x80, 0x9f),
                    _ => (0x80, 0xbf),
                };
                *sub = StrSub::Utf8 { need: 2, lo, hi };
                StrEv::Char
            }
            0xf0..=0xf4 => {
                let (lo, hi) = match b {
                    0xf0 => (0x90, 0xbf),
                    0xf4 => (0x80, 0x8f),
                    _ => (0x80, 0xbf),
                };
                *sub = StrSub::Utf8 { need: 3, lo, hi };
                StrEv::Char
            }
            _ => StrEv::Reject,
        },
        StrSub::Esc => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                *sub = StrSub::Body;
                StrEv::Cont
            }
            b'u' => {
                *sub = StrSub::Hex(0, false);
                StrEv::Cont
            }
            _ => StrEv::Reject,
        },
        StrSub::Hex(n, d) => {
            if !b.is_ascii_hexdigit() {
                return StrEv::Reject;
            }
            // no UTF-16 surrogates (\uD800-\uDFFF)
            if n == 1 && d && matches!(b, b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F') {
                return StrEv::Reject;
            }
            *sub = if n == 3 {
                StrSub::Body
            } else {
                StrSub::Hex(n + 1, n == 0 && (b == b'd' || b == b'D'))
            };
            StrEv::Cont
        }
        StrSub::Utf8 { need, lo, hi } => {
            if b < lo || b > hi {
                return StrEv::Reject;
            }
            *sub = if need == 1 {
                StrSub::Body
            } else {
                StrSub::Utf8 {
                    need: need - 1,
                    lo: 0x80,
                    hi: 0xbf,
                }
            };
            StrEv::Cont
        }
    }
}

/// What one input did to a number.
pub(super) enum NumOut {
    Reject,
    /// Consumed.
    Stay,
    /// Not part of the number, which is whole: the input goes to the parent.
    Pass,
}

/// A number read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct NumFrame {
    st: NumSt,
    neg: bool,
    /// Digits read, integer and fraction (bounded numbers).
    digits: u8,
    /// Fraction digits read (bounded numbers).
    fd: u8,
    /// The digits read, as an integer (bounded numbers).
    m: u64,
    /// Integer digits read, the first not 0: the value is below `10^int_digits`.
    int_digits: u16,
    /// The positive exponent read so far.
    exp: u16,
}

/// The largest decimal magnitude a number may reach: a value below `10^MAX_MAGNITUDE` is a
/// finite f64 (`f64::MAX` is about 1.8e308), so every number the grammar lets through parses
/// as one (serde_json, which the gateway's tool-call checks use, refuses `1e400` as "number out
/// of range"; others read it as infinity). Negative exponents only round towards zero.
const MAX_MAGNITUDE: u32 = 308;

impl NumFrame {
    /// Before the first byte.
    pub(super) const START: NumFrame = NumFrame {
        st: NumSt::Start,
        neg: false,
        digits: 0,
        fd: 0,
        m: 0,
        int_digits: 0,
        exp: 0,
    };

    /// Whether the value stays below `10^MAX_MAGNITUDE` with the (positive) exponent `exp`.
    fn finite_with(&self, exp: u32) -> bool {
        u32::from(self.int_digits) + exp <= MAX_MAGNITUDE
    }
}

/// One input to a number reader.
pub(super) fn num_step(spec: &NumSpec, n: &mut NumFrame, inp: Option<u8>) -> NumOut {
    let bounded = spec.lo.is_some() || spec.hi.is_some();
    let before = (n.st, n.neg, n.digits, n.fd, n.m);
    let ok = match (n.st, inp) {
        (NumSt::Start, Some(b'-')) => {
            n.st = NumSt::Minus;
            n.neg = true;
            true
        }
        (NumSt::Start | NumSt::Minus, Some(b'0')) => {
            n.st = NumSt::Zero;
            true
        }
        (NumSt::Start | NumSt::Minus, Some(d @ b'1'..=b'9')) => {
            n.st = NumSt::Int;
            n.m = u64::from(d - b'0');
            n.digits = 1;
            n.int_digits = 1;
            true
        }
        (NumSt::Int, Some(d @ b'0'..=b'9')) if n.finite_with(1) => {
            n.m = n.m.saturating_mul(10).saturating_add(u64::from(d - b'0'));
            n.digits = n.digits.saturating_add(1);
            n.int_digits += 1;
            true
        }
        (NumSt::Zero | NumSt::Int, Some(b'.'))
            if !spec.integer && (!bounded || n.digits < MAX_BOUNDED_DIGITS) =>
        {
            n.st = NumSt::Dot;
            true
        }
        (NumSt::Dot | NumSt::Frac, Some(d @ b'0'..=b'9')) => {
            n.st = NumSt::Frac;
            n.m = n.m.saturating_mul(10).saturating_add(u64::from(d - b'0'));
            n.digits = n.digits.saturating_add(1);
            n.fd = n.fd.saturating_add(1);
            true
        }
        (NumSt::Zero | NumSt::Int | NumSt::Frac, Some(b'e' | b'E'))
            if !spec.integer && !bounded =>
        {
            n.st = NumSt::E;
            true
        }
        (NumSt::E, Some(b'+')) => {
            n.st = NumSt::ESign;
            true
        }
        (NumSt::E, Some(b'-')) => {
            n.st = NumSt::ENeg;
            true
        }
        (NumSt::E | NumSt::ESign | NumSt::Exp, Some(d @ b'0'..=b'9'))
            if n.finite_with(u32::from(n.exp) * 10 + u32::from(d - b'0')) =>
        {
            n.st = NumSt::Exp;
            n.exp = n.exp * 10 + u16::from(d - b'0');
            true
        }
        (NumSt::ENeg | NumSt::ExpNeg, Some(b'0'..=b'9')) => {
            n.st = NumSt::ExpNeg;
            true
        }
        _ => false,
    };
    if ok {
        if bounded && (n.digits > MAX_BOUNDED_DIGITS && !spec.integer || !feasible(spec, n)) {
            (n.st, n.neg, n.digits, n.fd, n.m) = before;
            return NumOut::Reject;
        }
        return NumOut::Stay;
    }
    // anything else ends the number, if it is whole and within bounds
    let whole = matches!(
        n.st,
        NumSt::Zero | NumSt::Int | NumSt::Frac | NumSt::Exp | NumSt::ExpNeg
    );
    if whole && (!bounded || in_bounds(spec, value(n))) {
        NumOut::Pass
    } else {
        NumOut::Reject
    }
}

fn value(n: &NumFrame) -> f64 {
    let v = n.m as f64 / 10f64.powi(i32::from(n.fd));
    if n.neg { -v } else { v }
}

fn in_bounds(spec: &NumSpec, v: f64) -> bool {
    spec.lo
        .is_none_or(|b| if b.strict { v > b.v } else { v >= b.v })
        && spec
            .hi
            .is_none_or(|b| if b.strict { v < b.v } else { v <= b.v })
}

/// Whether an interval of values (`lo`/`hi` with inclusiveness) meets the bounds.
fn meets(spec: &NumSpec, lo: f64, lo_in: bool, hi: f64, hi_in: bool) -> bool {
    let (mut l, mut l_in, mut h, mut h_in) = (lo, lo_in, hi, hi_in);
    if let Some(b) = spec.lo
        && (b.v > l || (b.v == l && b.strict))
    {
        (l, l_in) = (b.v, !b.strict);
    }
    if let Some(b) = spec.hi
        && (b.v < h || (b.v == h && b.strict))
    {
        (h, h_in) = (b.v, !b.strict);
    }
    l < h || (l == h && l_in && h_in)
}

/// Whether a magnitude interval, with the number's sign, meets the bounds.
fn meets_mag(spec: &NumSpec, neg: bool, a: f64, b: f64, b_in: bool) -> bool {
    if neg {
        meets(spec, -b, b_in, -a, true)
    } else {
        meets(spec, a, true, b, b_in)
    }
}

/// Whether some completion of the number read so far lies within the bounds.
fn feasible(spec: &NumSpec, n: &NumFrame) -> bool {
    let inf = f64::INFINITY;
    let m = n.m as f64;
    match n.st {
        NumSt::Start => meets(spec, -inf, false, inf, false),
        NumSt::Minus => meets_mag(spec, true, 0.0, inf, false),
        NumSt::Zero if spec.integer => meets_mag(spec, n.neg, 0.0, 0.0, true),
        NumSt::Zero => meets_mag(spec, n.neg, 0.0, 1.0, false),
        NumSt::Int => {
            let room = if spec.integer {
                24
            } else {
                MAX_BOUNDED_DIGITS.saturating_sub(n.digits)
            };
            (0..=i32::from(room)).any(|k| {
                let p = 10f64.powi(k);
                if spec.integer {
                    meets_mag(spec, n.neg, m * p, m * p + p - 1.0, true)
                } else {
                    meets_mag(spec, n.neg, m * p, (m + 1.0) * p, false)
                }
            })
        }
        NumSt::Dot | NumSt::Frac => {
            let scale = 10f64.powi(i32::from(n.fd));
            meets_mag(spec, n.neg, m / scale, (m + 1.0) / scale, false)
        }
        NumSt::E | NumSt::ESign | NumSt::Exp | NumSt::ENeg | NumSt::ExpNeg => true,
    }
}
