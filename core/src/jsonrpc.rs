//! The JSON-RPC `id` of a POST body, found as the body streams past.
//!
//! A refusal of a request stream's cursor must settle the client's pending call, so the
//! error it carries needs the id of the request that opened the stream. The guard never
//! buffers the body: [`RequestIdScanner`] reads each chunk once, keeps a few bytes of state
//! and the id itself (at most [`MAX_REQUEST_ID_BYTES`]), and stops at the id. SDKs put `id`
//! after `params` (TypeScript builds `{...request, jsonrpc, id}`), so the whole body may be
//! read, up to [`MAX_SCAN_BYTES`].

/// Longest id the guard carries (raw JSON text: a number, or a string with its quotes): the
/// cursor embeds up to [`crate::cursor::MAX_EMBEDDED_REQUEST_ID_BYTES`], the record the rest.
pub use crate::ownership::MAX_REQUEST_ID_BYTES;
/// A body longer than this without its top-level `id` is not scanned further.
pub const MAX_SCAN_BYTES: usize = 1 << 20;

/// Where the scan stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// Read more.
    Pending,
    /// The top-level `id`, as raw JSON text (a number, or a string with its quotes).
    Found(String),
    /// No usable id: not an object (a batch, garbage), no `id`, a `null` or other id that
    /// cannot be carried, or the body was too long.
    None,
}

/// Position inside the top-level object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Key,
    Colon,
    Value,
}

/// Incremental scanner for the top-level `"id"` member of one JSON object.
#[derive(Debug, Clone)]
pub struct RequestIdScanner {
    result: Scan,
    started: bool,
    seen: usize,
    depth: u32,
    in_str: bool,
    esc: bool,
    slot: Slot,
    /// The top-level key being read: its first bytes, and whether it can still be `id`.
    key: [u8; 2],
    key_len: usize,
    key_plain: bool,
    /// The last top-level key was exactly `id`.
    key_is_id: bool,
    /// The id's bytes, while it is being read.
    value: Option<Vec<u8>>,
}

impl Default for RequestIdScanner {
    fn default() -> Self {
        RequestIdScanner::new()
    }
}

impl RequestIdScanner {
    pub fn new() -> Self {
        RequestIdScanner {
            result: Scan::Pending,
            started: false,
            seen: 0,
            depth: 0,
            in_str: false,
            esc: false,
            slot: Slot::Key,
            key: [0; 2],
            key_len: 0,
            key_plain: true,
            key_is_id: false,
            value: None,
        }
    }

    /// The outcome so far.
    pub fn result(&self) -> &Scan {
        &self.result
    }

    /// Reads one chunk; returns the outcome so far.
    pub fn push(&mut self, chunk: &[u8]) -> &Scan {
        if self.result != Scan::Pending {
            return &self.result;
        }
        for &b in chunk {
            self.byte(b);
            if self.result != Scan::Pending {
                return &self.result;
            }
        }
        self.seen = self.seen.saturating_add(chunk.len());
        if self.seen > MAX_SCAN_BYTES {
            self.result = Scan::None;
        }
        &self.result
    }

    /// The body ended: an id still being read (a number at the very end) is complete.
    pub fn finish(&mut self) -> &Scan {
        if self.result == Scan::Pending {
            self.result = Scan::None;
        }
        &self.result
    }

    fn byte(&mut self, b: u8) {
        if !self.started {
            match b {
                b' ' | b'\t' | b'\r' | b'\n' => {}
                b'{' => {
                    self.started = true;
                    self.depth = 1;
                }
                _ => self.result = Scan::None,
            }
            return;
        }
        if let Some(v) = self.value.as_mut() {
            if self.in_str {
                // A string id: ends at its closing quote.
                v.push(b);
                if std::mem::take(&mut self.esc) {
                } else if b == b'\\' {
                    self.esc = true;
                } else if b == b'"' {
                    self.in_str = false;
                    self.end_value();
                    return;
                }
                if v.len() > MAX_REQUEST_ID_BYTES {
                    self.result = Scan::None;
                }
                return;
            }
            match b {
                b' ' | b'\t' | b'\r' | b'\n' if v.is_empty() => {}
                b'"' if v.is_empty() => {
                    v.push(b);
                    self.in_str = true;
                }
                b'{' | b'[' if v.is_empty() => self.result = Scan::None,
                b',' | b'}' | b' ' | b'\t' | b'\r' | b'\n' => self.end_value(),
                _ => {
                    v.push(b);
                    if v.len() > MAX_REQUEST_ID_BYTES {
                        self.result = Scan::None;
                    }
                }
            }
            return;
        }
        if self.in_str {
            if std::mem::take(&mut self.esc) {
                self.key_plain = false;
                return;
            }
            match b {
                b'\\' => {
                    self.esc = true;
                    self.key_plain = false;
                }
                b'"' => {
                    self.in_str = false;
                    if self.depth == 1 && self.slot == Slot::Key {
                        self.key_is_id = self.key_plain && self.key_len == 2 && self.key == *b"id";
                        self.slot = Slot::Colon;
                    }
                }
                _ if self.depth == 1 && self.slot == Slot::Key => {
                    match self.key.get_mut(self.key_len) {
                        Some(k) => *k = b,
                        None => self.key_plain = false,
                    }
                    self.key_len = self.key_len.saturating_add(1);
                }
                _ => {}
            }
            return;
        }
        match b {
            b'"' => {
                self.in_str = true;
                if self.depth == 1 && self.slot == Slot::Key {
                    self.key_len = 0;
                    self.key_plain = true;
                }
            }
            b'{' | b'[' => self.depth = self.depth.saturating_add(1),
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    // The object ended without an id.
                    self.result = Scan::None;
                }
            }
            b':' if self.depth == 1 && self.slot == Slot::Colon => {
                self.slot = Slot::Value;
                if std::mem::take(&mut self.key_is_id) {
                    self.value = Some(Vec::with_capacity(8));
                }
            }
            b',' if self.depth == 1 => self.slot = Slot::Key,
            _ => {}
        }
    }

    /// The id's text is complete: keep it if it is a JSON number or string.
    fn end_value(&mut self) {
        let raw = self.value.take().unwrap_or_default();
        let ok = match raw.first() {
            Some(b'"') => serde_json::from_slice::<String>(&raw).is_ok(),
            Some(_) => serde_json::from_slice::<serde_json::Number>(&raw).is_ok(),
            None => false,
        };
        self.result = match String::from_utf8(raw) {
            Ok(s) if ok => Scan::Found(s),
            _ => Scan::None,
        };
    }
}

/// The id of a whole body (tests, fuzzing).
pub fn request_id(body: &[u8]) -> Option<String> {
    let mut s = RequestIdScanner::new();
    s.push(body);
    match s.finish() {
        Scan::Found(id) => Some(id.clone()),
        _ => None,
    }
}

/// Is `id` an id the guard carries (a JSON number or string, at most [`MAX_REQUEST_ID_BYTES`])?
pub fn valid_request_id(id: &str) -> bool {
    request_id(format!("{{\"id\":{id}}}").as_bytes()).as_deref() == Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_top_level_id_wherever_it_is() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
                Some("7"),
            ),
            (
                r#"{"method":"tools/call","params":{"id":99,"arguments":{"id":"x"}},"jsonrpc":"2.0","id":12}"#,
                Some("12"),
            ),
            (r#" { "id" : "abc-1" , "method":"x"}"#, Some(r#""abc-1""#)),
            (r#"{"id":"a\"b\\"}"#, Some(r#""a\"b\\""#)),
            (r#"{"id":-1.5e3}"#, Some("-1.5e3")),
            (r#"{"params":["id",{"id":1}],"id":2}"#, Some("2")),
            (r#"{"i\u0064":5,"id":6}"#, Some("6")),
            (r#"{"method":"notifications/initialized"}"#, None),
            (r#"{"id":null}"#, None),
            (r#"{"id":true}"#, None),
            (r#"{"id":{"a":1}}"#, None),
            (r#"{"id":[1]}"#, None),
            (r#"{"id":01}"#, None),
            (r#"[{"id":1}]"#, None),
            ("garbage", None),
            ("", None),
        ];
        for (body, want) in cases {
            assert_eq!(request_id(body.as_bytes()).as_deref(), *want, "{body}");
        }
    }

    #[test]
    fn any_split_into_chunks_gives_the_same_id() {
        let body = br#"{"method":"tools/call","params":{"name":"t","arguments":{"id":"no","s":"}\"{"}},"jsonrpc":"2.0","id":"req-42"}"#;
        for cut in 0..body.len() {
            let (a, b) = body.split_at(cut);
            let mut s = RequestIdScanner::new();
            s.push(a);
            s.push(b);
            assert_eq!(
                s.finish(),
                &Scan::Found(r#""req-42""#.into()),
                "cut at {cut}"
            );
        }
        // A number at the very end of the body is complete at finish.
        let mut s = RequestIdScanner::new();
        s.push(br#"{"id":123"#);
        assert_eq!(s.result(), &Scan::Pending);
        assert_eq!(s.finish(), &Scan::None, "an unterminated object has no id");
    }

    #[test]
    fn long_ids_and_long_bodies_are_bounded() {
        let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(MAX_REQUEST_ID_BYTES));
        assert_eq!(request_id(long.as_bytes()), None);
        let fits = format!(r#"{{"id":"{}"}}"#, "x".repeat(MAX_REQUEST_ID_BYTES - 2));
        assert!(request_id(fits.as_bytes()).is_some());
        let mut s = RequestIdScanner::new();
        s.push(br#"{"params":""#);
        let filler = vec![b'a'; MAX_SCAN_BYTES];
        assert_eq!(s.push(&filler), &Scan::None);
        assert!(valid_request_id("7"));
        assert!(valid_request_id(r#""a""#));
        assert!(!valid_request_id("null"));
        assert!(!valid_request_id(r#"1,"x":2"#));
    }
}
