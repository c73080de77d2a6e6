//! A message buffer that stops the formatter at [`MAX_MESSAGE`] bytes.

use std::fmt;

use super::MAX_MESSAGE;

/// A message buffer that keeps at most [`MAX_MESSAGE`] bytes and then makes the
/// formatter stop (a `fmt::Error` ends `fmt::write` early), escaping control
/// characters on the way.
pub struct Bounded {
    buf: String,
    limit: usize,
    pub truncated: bool,
}

impl Default for Bounded {
    fn default() -> Self {
        Self::new()
    }
}

impl Bounded {
    pub fn new() -> Self {
        Self::with_limit(MAX_MESSAGE)
    }

    pub fn with_limit(limit: usize) -> Self {
        Bounded {
            buf: String::with_capacity(limit.min(1024)),
            limit,
            truncated: false,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.buf
    }

    pub(super) fn push_mark(&mut self, s: &str) {
        self.buf.push_str(s);
    }

    /// Appends past the limit (for the suffixes the logger adds itself).
    pub(super) fn mark(&mut self) -> &mut String {
        &mut self.buf
    }
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.truncated {
            return Err(fmt::Error);
        }
        for c in s.chars() {
            let escaped;
            let piece: &str = if c.is_control() && c != '\t' {
                escaped = c.escape_default().to_string();
                &escaped
            } else {
                let mut tmp = [0u8; 4];
                let len = c.encode_utf8(&mut tmp).len();
                if self.buf.len() + len > self.limit {
                    self.truncated = true;
                    return Err(fmt::Error);
                }
                self.buf.push(c);
                continue;
            };
            if self.buf.len() + piece.len() > self.limit {
                self.truncated = true;
                return Err(fmt::Error);
            }
            self.buf.push_str(piece);
        }
        Ok(())
    }
}
