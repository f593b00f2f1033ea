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

    /// Adds bytes; returns the blocks they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Bytes>, BlockTooLarge> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut i = self.scan;
        while i < self.buf.len() {
            let b = self.buf[i];
            let line_end = match b {
                b'\n' => i + 1,
                b'\r' => {
                    if i + 1 == self.buf.len() {
                        break; // an LF may follow in the next read
                    }
                    if self.buf[i + 1] == b'\n' {
                        i + 2
                    } else {
                        i + 1
                    }
                }
                _ => {
                    i += 1;
                    continue;
                }
            };
            let empty_line = i == self.line_start;
            self.line_start = line_end;
            i = line_end;
            if empty_line {
                out.push(self.buf.split_to(line_end).freeze());
                i = 0;
                self.line_start = 0;
            }
        }
        self.scan = i;
        if self.buf.len() > self.max {
            return Err(BlockTooLarge);
        }
        Ok(out)
    }

    /// Bytes of an unfinished block (the upstream ended without its blank line).
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }
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
            for b in f.push(p).unwrap_or_default() {
                out.push(b.to_vec());
            }
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
    fn unfinished_block_is_held_and_bounded() {
        let (out, partial) = blocks(&[b"data: 1\n\ndata: {\"half"]);
        assert_eq!(out.len(), 1);
        assert!(partial);
        let mut f = EventFramer::new(16);
        assert_eq!(f.push(b"data: 0123456789abcdef"), Err(BlockTooLarge));
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
