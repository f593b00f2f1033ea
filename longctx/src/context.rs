//! Effective context lengths from per-length results.
//!
//! - [`effective_context`]: the longest length L such that every length up to L is good
//!   (the caller says what good is: not below the reference, not significantly below the
//!   baseline, at least 85.6%); 0 when the shortest is not.
//! - [`below_reference`]: the probe's rule for one length — the endpoint passed at least
//!   max(2, ⌈n/4⌉) fewer of n queries than the reference did on the same queries. One
//!   flipped query (a faithful but inexact endpoint near the margin) is not a finding;
//!   a lost quarter of the needles is.
//! - [`RULER_THRESHOLD`]: RULER's fixed rule (the Llama-2-7B score at 4K, 85.6%).
//! - [`one_doubling_below`]: the probe detector's rule.
//!
//! [`effective_context`]: crate::context::effective_context
//! [`below_reference`]: crate::context::below_reference
//! [`RULER_THRESHOLD`]: crate::context::RULER_THRESHOLD
//! [`one_doubling_below`]: crate::context::one_doubling_below

/// RULER's fixed threshold on a length's pass rate.
pub const RULER_THRESHOLD: f64 = 0.856;

/// The longest of `lengths` (ascending) such that `good` holds there and at every shorter
/// length; 0 when it fails at the first (or there is none).
pub fn effective_context(lengths: &[u32], good: &[bool]) -> u32 {
    let mut out = 0;
    for (l, g) in lengths.iter().zip(good) {
        if !g {
            break;
        }
        out = *l;
    }
    out
}

/// Whether an endpoint that passed `endpoint` of `n` queries is below a reference that
/// passed `reference` of them.
pub fn below_reference(endpoint: usize, reference: usize, n: usize) -> bool {
    let need = 2usize.max(n.div_ceil(4));
    reference >= endpoint + need
}

/// Whether an effective context is at least one doubling below the reference's.
pub fn one_doubling_below(endpoint: u32, reference: u32) -> bool {
    reference > 0 && u64::from(endpoint) * 2 <= u64::from(reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_context_is_the_longest_unbroken_prefix() {
        let l = [256, 512, 1024, 2048];
        assert_eq!(effective_context(&l, &[true, true, true, true]), 2048);
        assert_eq!(effective_context(&l, &[true, true, false, true]), 512);
        assert_eq!(effective_context(&l, &[false, true, true, true]), 0);
        assert_eq!(effective_context(&[], &[]), 0);
        assert_eq!(effective_context(&l, &[true]), 256);
    }

    #[test]
    fn below_needs_a_quarter_and_at_least_two() {
        assert!(!below_reference(3, 4, 4));
        assert!(below_reference(2, 4, 4));
        assert!(!below_reference(13, 16, 16));
        assert!(below_reference(12, 16, 16));
        assert!(!below_reference(5, 4, 4));
        assert!(!below_reference(0, 1, 1));
        assert!(one_doubling_below(512, 1024));
        assert!(one_doubling_below(0, 256));
        assert!(!one_doubling_below(768, 1024));
        assert!(!one_doubling_below(0, 0));
    }
}
