//! Reading forced tool calls back out of the text the tool grammar produced
//! ([`ToolSplitter`]): the name as soon as it is complete, then the arguments in pieces, as it
//! is generated. The engine's server streams forced calls with it, and the probes' in-process
//! reference reads its own forced calls with it, so both see the same calls — a call the
//! token limit cut included, partial as it is.

use super::{CALL_MID, CALL_PREFIX, CALL_SEP, CALL_SUFFIX};

/// Where a [`ToolSplitter`] is in the call text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prefix,
    Name,
    Mid,
    Args,
    Suffix,
    Sep,
}

/// Something a forced tool-call stream learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Call `.0`'s name is complete.
    Name(usize, String),
    /// More of call `.0`'s arguments.
    Args(usize, String),
}

/// Reads forced tool calls (text the tool grammar produced) as it arrives.
#[derive(Debug)]
pub struct ToolSplitter {
    phase: Phase,
    /// Bytes of the current literal matched.
    at: usize,
    /// The calls so far: name and arguments text (the last may be partial).
    calls: Vec<(String, String)>,
    /// The name being read.
    name: String,
    /// JSON nesting of the arguments.
    depth: usize,
    in_str: bool,
    esc: bool,
    /// Everything read (the text, should no call have started).
    text: String,
}

impl Default for ToolSplitter {
    fn default() -> Self {
        Self {
            phase: Phase::Prefix,
            at: 0,
            calls: Vec::new(),
            name: String::new(),
            depth: 0,
            in_str: false,
            esc: false,
            text: String::new(),
        }
    }
}

impl ToolSplitter {
    /// Reads more text; returns what it completed, in order.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let mut frag = String::new();
        self.text.push_str(text);
        for c in text.chars() {
            match self.phase {
                Phase::Prefix => self.lit(c, CALL_PREFIX, Phase::Name),
                Phase::Name if c == '"' => {
                    let name = std::mem::take(&mut self.name);
                    out.push(ToolEvent::Name(self.calls.len(), name.clone()));
                    self.calls.push((name, String::new()));
                    self.phase = Phase::Mid;
                    self.at = 1;
                }
                Phase::Name => self.name.push(c),
                Phase::Mid => self.lit(c, CALL_MID, Phase::Args),
                Phase::Args => {
                    frag.push(c);
                    if let Some(call) = self.calls.last_mut() {
                        call.1.push(c);
                    }
                    if self.json_char(c) {
                        if let Some(i) = self.calls.len().checked_sub(1) {
                            out.push(ToolEvent::Args(i, std::mem::take(&mut frag)));
                        }
                        self.phase = Phase::Suffix;
                        self.at = 0;
                    }
                }
                Phase::Suffix => self.lit(c, CALL_SUFFIX, Phase::Sep),
                Phase::Sep => self.lit(c, CALL_SEP, Phase::Prefix),
            }
        }
        if !frag.is_empty()
            && let Some(i) = self.calls.len().checked_sub(1)
        {
            out.push(ToolEvent::Args(i, frag));
        }
        out
    }

    /// The calls read (name, arguments text); the last is partial if the text stopped early.
    pub fn calls(&self) -> &[(String, String)] {
        &self.calls
    }

    /// Everything read so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn lit(&mut self, c: char, lit: &str, next: Phase) {
        self.at += c.len_utf8();
        if self.at >= lit.len() {
            self.phase = next;
            self.at = 0;
        }
    }

    /// Tracks the arguments' JSON; true when the object just closed.
    fn json_char(&mut self, c: char) -> bool {
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if c == '\\' {
                self.esc = true;
            } else if c == '"' {
                self.in_str = false;
            }
            return false;
        }
        match c {
            '"' => self.in_str = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            _ => {}
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitter_reads_names_first_then_arguments_in_pieces() {
        let text = format!(
            "{CALL_PREFIX}get_weather{CALL_MID}{{\"city\":\"O}}\\\"slo\",\"n\":[1]}}{CALL_SUFFIX}{CALL_SEP}{CALL_PREFIX}ping{CALL_MID}{{}}{CALL_SUFFIX}"
        );
        // every split point gives the same calls
        for cut in 1..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut s = ToolSplitter::default();
            let mut ev = s.push(&text[..cut]);
            ev.extend(s.push(&text[cut..]));
            let mut args = vec![String::new(), String::new()];
            let mut names = Vec::new();
            for e in ev {
                match e {
                    ToolEvent::Name(i, n) => {
                        assert!(args[i].is_empty(), "name before arguments");
                        names.push(n);
                    }
                    ToolEvent::Args(i, a) => args[i].push_str(&a),
                }
            }
            assert_eq!(names, ["get_weather", "ping"]);
            assert_eq!(args, ["{\"city\":\"O}\\\"slo\",\"n\":[1]}", "{}"]);
            assert_eq!(s.calls()[1], ("ping".to_owned(), "{}".to_owned()));
        }
    }
}
