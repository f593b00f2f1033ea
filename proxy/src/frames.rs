//! Byte-exact SSE framing for the relay: splits an upstream byte stream into whole event
//! blocks (everything up to and including the blank line that ends an event, comments and
//! keep-alives included) without changing a byte, so the relay can forward each block as the
//! upstream sent it, drop one (the usage chunk the client did not ask for), or stop before one
//! (a degenerate generation). Lines end with LF, CRLF or CR, as in the SSE specification; a
//! CR at the end of a read waits for the next byte to know whether an LF follows.
//!
//! Bounded: a block that grows past `max` bytes without ending is an error, so an upstream
//! that never sends a blank line cannot grow memory without limit.

use bytes::{Bytes, BytesMut};

/// Splits bytes into event blocks.
#[derive(Debug)]
pub struct EventFramer {
    /// Bytes of the block being assembled (no blank line yet).
    buf: BytesMut,
    /// Where scanning resumes in `buf`.
    scan: usize,
    /// Where the current line starts in `buf`.
    line_start: usize,
    /// Largest block accepted.
    max: usize,
}

/// A block grew past the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockTooLarge;

impl EventFramer {
    /// A framer that accepts blocks up to `max` bytes.
    pub fn new(max: usize) -> Self {
        EventFramer {
            buf: BytesMut::new(),
            scan: 0,
            line_start: 0,
            max,
        }
    }

    /// Adds bytes; appends the blocks they complete to `out`, in order. A block that lies
    /// whole in `bytes` with nothing held before it is a slice of `bytes` (no copy): only an
    /// unfinished block's bytes are held, and copied once more when it completes.
    pub fn push(&mut self, bytes: Bytes, out: &mut Vec<Bytes>) -> Result<(), BlockTooLarge> {
        if self.buf.is_empty() {
            // nothing held: scan and slice the read itself (scan and line_start are 0 here)
            let (mut start, mut scan, mut line_start) = (0, 0, 0);
            while let Some(end) = next_block_end(&bytes, &mut scan, &mut line_start) {
                out.push(bytes.slice(start..end));
                (start, scan, line_start) = (end, end, end);
            }
            if start < bytes.len() {
                self.buf.extend_from_slice(&bytes[start..]);
                self.scan = scan - start;
                self.line_start = line_start - start;
            }
        } else {
            self.buf.extend_from_slice(&bytes);
            while let Some(end) = next_block_end(&self.buf, &mut self.scan, &mut self.line_start) {
                out.push(self.buf.split_to(end).freeze());
                self.scan = 0;
                self.line_start = 0;
            }
        }
        if self.buf.len() > self.max {
            return Err(BlockTooLarge);
        }
        Ok(())
    }

    /// Bytes of an unfinished block (the upstream ended without its blank line).
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Scans `b` from `*scan` for the blank line that ends the block whose current line starts at
/// `*line_start` (both offsets into `b`): returns the offset just past it, or None when `b` ends
/// first, with `*scan` where scanning resumes once more bytes are appended (at a final CR, whose
/// LF may be in the next read) and `*line_start` kept.
fn next_block_end(b: &[u8], scan: &mut usize, line_start: &mut usize) -> Option<usize> {
    let mut i = *scan;
    while let Some(off) = memchr::memchr2(b'\n', b'\r', b.get(i..).unwrap_or_default()) {
        let at = i + off;
        let line_end = if b[at] == b'\n' {
            at + 1
        } else if at + 1 == b.len() {
            *scan = at; // an LF may follow in the next read
            return None;
        } else if b[at + 1] == b'\n' {
            at + 2
        } else {
            at + 1
        };
        let empty_line = at == *line_start;
        *line_start = line_end;
        i = line_end;
        if empty_line {
            return Some(line_end);
        }
    }
    *scan = b.len();
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const STREAM: &[u8] = b"data: {\"a\":1}\n\n: keep-alive\n\nevent: error\r\ndata: x\r\n\r\ndata:nospace\r\rdata: [DONE]\n\n";

    fn blocks(parts: &[&[u8]]) -> (Vec<Vec<u8>>, bool) {
        let mut f = EventFramer::new(1 << 20);
        let mut out = Vec::new();
        for p in parts {
            let mut got = Vec::new();
            f.push(Bytes::copy_from_slice(p), &mut got)
                .unwrap_or_default();
            out.extend(got.iter().map(|b| b.to_vec()));
        }
        (out, f.has_partial())
    }

    #[test]
    fn splits_at_blank_lines_with_every_line_ending() {
        let (out, partial) = blocks(&[STREAM]);
        let expected: Vec<&[u8]> = vec![
            b"data: {\"a\":1}\n\n",
            b": keep-alive\n\n",
            b"event: error\r\ndata: x\r\n\r\n",
            b"data:nospace\r\r",
            b"data: [DONE]\n\n",
        ];
        assert_eq!(out, expected.iter().map(|b| b.to_vec()).collect::<Vec<_>>());
        assert!(!partial);
    }

    #[test]
    fn cr_at_the_end_of_a_read_waits_for_the_next() {
        let (out, partial) = blocks(&[b"data: x\r\n\r", b"\ndata: y\n\n"]);
        assert_eq!(
            out,
            vec![b"data: x\r\n\r\n".to_vec(), b"data: y\n\n".to_vec()]
        );
        assert!(!partial);
    }

    #[test]
    fn a_block_whole_in_a_read_is_a_slice_of_it() {
        let mut f = EventFramer::new(1 << 20);
        let read = Bytes::from_static(b"data: 1\n\ndata: 2\n\ndata: 3");
        let mut got = Vec::new();
        assert_eq!(f.push(read.clone(), &mut got), Ok(()));
        assert_eq!(got, [&b"data: 1\n\n"[..], &b"data: 2\n\n"[..]]);
        assert_eq!(got[0].as_ptr(), read.as_ptr());
        assert_eq!(got[1].as_ptr(), read[9..].as_ptr());
        // the held rest is completed from the next read (a copy), then slicing resumes
        got.clear();
        assert_eq!(
            f.push(Bytes::from_static(b"\n\ndata: 4\r\n\r\n"), &mut got),
            Ok(())
        );
        assert_eq!(got, [&b"data: 3\n\n"[..], &b"data: 4\r\n\r\n"[..]]);
        assert!(!f.has_partial());
    }

    #[test]
    fn unfinished_block_is_held_and_bounded() {
        let (out, partial) = blocks(&[b"data: 1\n\ndata: {\"half"]);
        assert_eq!(out.len(), 1);
        assert!(partial);
        let mut f = EventFramer::new(16);
        let mut got = Vec::new();
        assert_eq!(
            f.push(Bytes::from_static(b"data: 0123456789abcdef"), &mut got),
            Err(BlockTooLarge)
        );
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_blocks(cuts in proptest::collection::vec(0..STREAM.len(), 0..8)) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut parts: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            for c in cuts {
                parts.push(&STREAM[at..c]);
                at = c;
            }
            parts.push(&STREAM[at..]);
            let (whole, _) = blocks(&[STREAM]);
            let (split, partial) = blocks(&parts);
            prop_assert_eq!(&whole, &split);
            prop_assert!(!partial);
            prop_assert_eq!(split.concat(), STREAM.to_vec());
        }
    }
}
