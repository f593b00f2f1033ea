//! Server-Sent Events, as OpenAI-compatible servers stream them: an incremental decoder that
//! survives events split across reads at any byte, and the encoder.
//!
//! The decoder follows the WHATWG event-stream rules that matter on this path: lines end with
//! CRLF, LF or CR (a CR at the end of one read and an LF at the start of the next are one line
//! end); `data:` lines of one event are joined with `\n`; one space after the colon is dropped;
//! lines starting with `:` are comments; an event is dispatched on a blank line and only if it
//! carried data. It is bounded: an event (or a line) larger than the configured maximum is an
//! error, so an upstream that never sends a line end cannot grow memory without limit.

use thiserror::Error;

/// The data of the event that ends an OpenAI stream.
pub const DONE: &str = "[DONE]";

/// The bytes of `data: [DONE]` followed by the blank line.
pub const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

/// The UTF-8 byte order mark, skipped at the start of a stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Default bound on one event's size (data plus the line being read): 4 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, when sent (OpenAI sends none; some providers send `error`).
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The `id:` field, when sent.
    pub id: Option<String>,
}

impl SseEvent {
    /// Whether this is the `[DONE]` sentinel.
    pub fn is_done(&self) -> bool {
        self.data.trim() == DONE
    }
}

/// Why a stream could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SseError {
    /// An event or line grew past the bound.
    #[error("server-sent event larger than {max} bytes")]
    EventTooLarge {
        /// The bound that was passed.
        max: usize,
    },
    /// A line was not UTF-8.
    #[error("server-sent event line is not valid UTF-8")]
    InvalidUtf8,
}

/// Incremental decoder: feed it bytes as they arrive, get back whole events.
#[derive(Debug, Clone)]
pub struct SseDecoder {
    /// Bytes of the line being read (no line end yet).
    line: Vec<u8>,
    /// The last byte fed was a CR: an LF first in the next read belongs to it.
    pending_cr: bool,
    /// Data of the event being assembled.
    data: String,
    /// Whether any `data:` line arrived for the event being assembled.
    has_data: bool,
    /// `event:` of the event being assembled.
    event: Option<String>,
    /// `id:` of the event being assembled.
    id: Option<String>,
    /// Bound on line plus data.
    max: usize,
    /// Nothing has been read yet (a UTF-8 BOM is skipped there).
    at_start: bool,
    /// The first bytes while they are a proper prefix of the BOM (it may arrive split across
    /// reads, like anything else).
    start: Vec<u8>,
    /// An event's data buffer handed back by [`SseDecoder::recycle`], emptied: the next
    /// event's data is read into it instead of a fresh allocation.
    spare: String,
}

/// The largest data buffer [`SseDecoder::recycle`] keeps (one huge event should not pin its
/// memory for the rest of the stream).
const RECYCLE_MAX_BYTES: usize = 64 * 1024;

impl Default for SseDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl SseDecoder {
    /// A decoder bounded at [`DEFAULT_MAX_EVENT_BYTES`].
    pub fn new() -> Self {
        Self::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A decoder with its own bound on one event's size.
    pub fn with_max_event_bytes(max: usize) -> Self {
        SseDecoder {
            line: Vec::new(),
            pending_cr: false,
            data: String::new(),
            has_data: false,
            event: None,
            id: None,
            max,
            at_start: true,
            start: Vec::new(),
            spare: String::new(),
        }
    }

    /// Hands back an event this decoder returned, once read: its data buffer (up to 64 KiB)
    /// serves the next event, so that a reader that recycles each event allocates no buffer
    /// per event.
    pub fn recycle(&mut self, ev: SseEvent) {
        let mut data = ev.data;
        if data.capacity() <= RECYCLE_MAX_BYTES && data.capacity() > self.spare.capacity() {
            data.clear();
            self.spare = data;
        }
    }

    /// Feeds the next bytes; returns the events they complete, in order.
    pub fn feed(&mut self, input: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut out = Vec::new();
        self.feed_into(input, &mut out)?;
        Ok(out)
    }

    /// [`SseDecoder::feed`], appending the events to `out` (a vector kept by the caller costs
    /// no allocation per read). On an error, `out` holds the events completed before it.
    pub fn feed_into(&mut self, input: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        // the stream's first bytes joined with those held back while they could be a BOM
        let first: Vec<u8>;
        let mut bytes = input;
        if self.at_start && !bytes.is_empty() {
            let mut start = std::mem::take(&mut self.start);
            start.extend_from_slice(bytes);
            if start.len() < BOM.len() && BOM.starts_with(&start) {
                self.start = start;
                return Ok(());
            }
            self.at_start = false;
            first = start;
            bytes = first.strip_prefix(BOM).unwrap_or(&first);
        }
        if self.pending_cr && !bytes.is_empty() {
            self.pending_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while !bytes.is_empty() {
            let Some(i) = memchr::memchr2(b'\n', b'\r', bytes) else {
                self.line.extend_from_slice(bytes);
                self.check_size()?;
                break;
            };
            let (text, rest) = bytes.split_at(i);
            let was_cr = rest.first() == Some(&b'\r');
            bytes = rest.get(1..).unwrap_or_default();
            if was_cr {
                if bytes.is_empty() {
                    self.pending_cr = true;
                } else if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                }
            }
            let event = if self.line.is_empty() {
                // the whole line is in this read: read it where it lies
                if text.len() + self.data.len() > self.max {
                    return Err(SseError::EventTooLarge { max: self.max });
                }
                self.take_line(text)?
            } else {
                self.line.extend_from_slice(text);
                self.check_size()?;
                let line = std::mem::take(&mut self.line);
                let event = self.take_line(&line);
                // the buffer's memory serves the next split line
                self.line = line;
                self.line.clear();
                event?
            };
            if let Some(ev) = event {
                out.push(ev);
            }
        }
        Ok(())
    }

    /// At the end of the stream: the event still being assembled, if it has data (a stream
    /// whose last event lacks its blank line). A partial last line is processed first.
    pub fn finish(&mut self) -> Result<Option<SseEvent>, SseError> {
        // a stream of only a BOM's first bytes: they are a (partial) line like any other
        let held = std::mem::take(&mut self.start);
        self.line.extend_from_slice(&held);
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            if let Some(ev) = self.take_line(&line)? {
                return Ok(Some(ev));
            }
        }
        Ok(self.dispatch())
    }

    /// Whether bytes of an unfinished event are held (a stream cut here was cut mid-event).
    pub fn has_partial(&self) -> bool {
        !self.line.is_empty() || !self.start.is_empty() || self.has_data || self.event.is_some()
    }

    fn check_size(&self) -> Result<(), SseError> {
        if self.line.len() + self.data.len() > self.max {
            return Err(SseError::EventTooLarge { max: self.max });
        }
        Ok(())
    }

    fn take_line(&mut self, line: &[u8]) -> Result<Option<SseEvent>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::InvalidUtf8)?;
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                } else if self.data.capacity() == 0 {
                    self.data = std::mem::take(&mut self.spare);
                }
                self.data.push_str(value);
                self.has_data = true;
                self.check_size()?;
            }
            "event" => self.event = Some(value.to_owned()),
            "id" => self.id = Some(value.to_owned()),
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        let id = self.id.take();
        if !self.has_data {
            return None;
        }
        self.has_data = false;
        Some(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
            id,
        })
    }
}

/// Encodes one event: `event:` when given, then one `data:` line per line of `data`, then the
/// blank line.
pub fn encode_event(event: Option<&str>, data: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 16);
    if let Some(e) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    for line in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix('\r').unwrap_or(line).as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out
}

/// Encodes a `data:` event carrying `data`.
pub fn encode_data(data: &str) -> Vec<u8> {
    encode_event(None, data)
}

/// Encodes a `data:` event carrying the JSON of `value`.
pub fn encode_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    Ok(encode_data(&serde_json::to_string(value)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "data: {\"a\":1}\n\n: keep-alive\n\nevent: error\r\ndata: x\r\ndata: y\r\n\r\ndata:nospace\r\rdata: [DONE]\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: None,
                data: "{\"a\":1}".into(),
                id: None,
            },
            SseEvent {
                event: Some("error".into()),
                data: "x\ny".into(),
                id: None,
            },
            SseEvent {
                event: None,
                data: "nospace".into(),
                id: None,
            },
            SseEvent {
                event: None,
                data: "[DONE]".into(),
                id: None,
            },
        ]
    }

    #[test]
    fn decodes_whole_stream() {
        let mut d = SseDecoder::new();
        let evs = d.feed(STREAM.as_bytes()).unwrap();
        assert_eq!(evs, expected());
        assert!(evs[3].is_done());
        assert!(!d.has_partial());
        assert_eq!(d.finish().unwrap(), None);
    }

    #[test]
    fn any_split_gives_the_same_events() {
        let bytes = STREAM.as_bytes();
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let mut d = SseDecoder::new();
                let mut evs = d.feed(&bytes[..a]).unwrap();
                evs.extend(d.feed(&bytes[a..b]).unwrap());
                evs.extend(d.feed(&bytes[b..]).unwrap());
                assert_eq!(evs, expected(), "split at {a},{b}");
            }
        }
    }

    #[test]
    fn recycled_events_lend_their_buffer_to_the_next() {
        let bytes = STREAM.as_bytes();
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        let mut evs = Vec::new();
        let mut last_ptr = None;
        // a byte at a time, each event handed back as soon as it is read
        for i in 0..bytes.len() {
            d.feed_into(&bytes[i..=i], &mut out).unwrap();
            for ev in out.drain(..) {
                if let Some(p) = last_ptr {
                    // the event's data was read into the buffer the last one gave back
                    assert_eq!(ev.data.as_ptr(), p, "event {}", evs.len());
                }
                last_ptr = Some(ev.data.as_ptr());
                evs.push(ev.clone());
                d.recycle(ev);
                // held, not freed: another allocation cannot be given the same address
                assert_eq!(Some(d.spare.as_ptr()), last_ptr);
            }
        }
        assert_eq!(evs, expected());
        // a buffer past the bound is not kept
        let mut big = String::with_capacity(RECYCLE_MAX_BYTES + 1);
        big.push('x');
        let mut d = SseDecoder::new();
        d.recycle(SseEvent {
            event: None,
            data: big,
            id: None,
        });
        assert_eq!(d.spare.capacity(), 0);
    }

    #[test]
    fn byte_at_a_time_with_multibyte_chars() {
        let s = "data: héllo 🎉\n\n";
        let mut d = SseDecoder::new();
        let mut evs = Vec::new();
        for b in s.as_bytes() {
            evs.extend(d.feed(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(evs[0].data, "héllo 🎉");
    }

    #[test]
    fn unterminated_last_event_is_returned_by_finish() {
        let mut d = SseDecoder::new();
        assert!(d.feed(b"data: {\"x\":1}\ndata: tail").unwrap().is_empty());
        assert!(d.has_partial());
        assert_eq!(d.finish().unwrap().unwrap().data, "{\"x\":1}\ntail");
    }

    #[test]
    fn bounded_against_endless_lines() {
        let mut d = SseDecoder::with_max_event_bytes(64);
        let err = (0..100).find_map(|_| d.feed(b"data: xxxxxxxxxx").err());
        assert_eq!(err, Some(SseError::EventTooLarge { max: 64 }));
        // a whole line in one read, and data lines that add up past the bound, alike
        let mut d = SseDecoder::with_max_event_bytes(64);
        let long = format!("data: {}\n\n", "x".repeat(64));
        assert_eq!(
            d.feed(long.as_bytes()),
            Err(SseError::EventTooLarge { max: 64 })
        );
        let mut d = SseDecoder::with_max_event_bytes(64);
        let err = (0..10).find_map(|_| d.feed(b"data: xxxxxxxxxxxxxxxxxxxx\n").err());
        assert_eq!(err, Some(SseError::EventTooLarge { max: 64 }));
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        let mut d = SseDecoder::new();
        assert_eq!(d.feed(b"data: \xff\xfe\n\n"), Err(SseError::InvalidUtf8));
    }

    #[test]
    fn bom_is_skipped_and_encoder_round_trips() {
        let mut d = SseDecoder::new();
        let mut bytes = b"\xEF\xBB\xBF".to_vec();
        bytes.extend(encode_event(Some("error"), "line1\nline2"));
        bytes.extend(DONE_EVENT);
        let evs = d.feed(&bytes).unwrap();
        assert_eq!(
            evs[0],
            SseEvent {
                event: Some("error".into()),
                data: "line1\nline2".into(),
                id: None
            }
        );
        assert!(evs[1].is_done());
    }

    #[test]
    fn a_bom_split_across_reads_is_skipped_too() {
        // found by the sse_decoder fuzz target: cut after its first byte, the BOM was kept and
        // the first line's field name was "\u{feff}data", so the event was lost
        let bytes = b"\xEF\xBB\xBFdata:!\nevent\n";
        let all = |pieces: &[&[u8]]| {
            let mut d = SseDecoder::new();
            let mut evs = Vec::new();
            for p in pieces {
                evs.extend(d.feed(p).unwrap());
            }
            evs.extend(d.finish().unwrap());
            evs
        };
        let expect = all(&[bytes]);
        assert_eq!(expect.len(), 1);
        assert_eq!(expect[0].data, "!");
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let evs = all(&[&bytes[..a], &bytes[a..b], &bytes[b..]]);
                assert_eq!(evs, expect, "split at {a},{b}");
            }
        }
        // a stream that is only the start of a BOM is a partial line, as it was read whole
        let mut d = SseDecoder::new();
        assert!(d.feed(b"\xEF").unwrap().is_empty());
        assert!(d.has_partial());
        assert_eq!(d.finish(), Err(SseError::InvalidUtf8));
    }
}
