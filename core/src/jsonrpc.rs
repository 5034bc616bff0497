//! The JSON-RPC request ids of a POST body, found as the body streams past.
//!
//! A refusal of a request stream's cursor must settle the client's pending calls, so the
//! errors it carries need the ids of the requests that opened the stream, exactly as the
//! client's own JSON parser reads them. The guard never buffers the body: [`RequestIdScanner`]
//! reads each chunk once, keeps a few bytes of state and the ids themselves (at most
//! [`MAX_REQUEST_IDS_BYTES`] in all), and reads the body to the end of its top-level value,
//! because that is where a JSON parser settles what the body says:
//! - the **last** of duplicate `id` keys wins (as in `JSON.parse`, Python's `json`, serde);
//! - keys are compared decoded (`"i\u0064"` is `id`);
//! - an id is kept as its **raw JSON text** and written back verbatim: a number beyond 64 bits
//!   or a string with a lone surrogate (`"\ud800"`) is never re-parsed into a lossy type;
//! - a **batch** (a JSON array, allowed by protocol 2025-03-26) yields the ids of all its
//!   requests (members with a `method`; notifications and responses have no call pending).
//!
//! The carried text is one id (`7`, `"abc"`) for a single request, or a JSON array of the raw
//! ids (`[1,"a"]`, no whitespace) for a batch; [`split_ids`] reads it back.

/// Longest carried text (one id, or a batch's array of ids). Every cursor of the stream embeds
/// it ([`crate::cursor::MAX_EMBEDDED_REQUEST_ID_BYTES`]), so it must stay well inside header
/// limits: a cursor carrying the longest is under 6 KiB of base64, below Envoy's 60 KiB of
/// request headers and common 8 KiB per-line proxy limits. Longer ids are not carried (see
/// docs/wire-contract.md, the settling answer).
pub const MAX_REQUEST_IDS_BYTES: usize = 4096;
/// A body whose top-level value has not ended after this many bytes is not scanned further
/// (its ids are not carried). Scanning is linear, constant-memory and skips string contents with
/// `memchr`; SDKs write the id after `params`, so a large argument must not hide it.
pub const MAX_SCAN_BYTES: usize = 64 << 20;
/// A UTF-8 byte order mark. Servers' parsers accept one leading the body (Python's
/// `json.loads(bytes)`, `TextDecoder` before `JSON.parse`) and nowhere else.
const BOM: [u8; 3] = [0xef, 0xbb, 0xbf];
/// Longest raw key that can still decode to `method` (each letter as a `\uXXXX` escape).
const MAX_KEY_BYTES: usize = 6 * 6;

/// Where the scan stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// Read more.
    Pending,
    /// The request ids as carried text: one raw id, or a batch's array of raw ids.
    Found(String),
    /// No id to carry: not a request (a notification, a response, garbage), ids that are not
    /// numbers or strings, ids longer than [`MAX_REQUEST_IDS_BYTES`], or a body too long.
    None,
}

/// Position inside a member-level object (a single request, or one element of a batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Key,
    Colon,
    Value,
    After,
}

/// What a member-level key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Other,
    Id,
    Method,
}

/// The token being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    Between,
    /// A string; `keep` says whether its bytes are kept (a member key, an id).
    Str {
        keep: Keep,
        esc: bool,
    },
    /// A number or literal; kept when it is an id.
    Scalar {
        id: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    Skip,
    Key,
    Id,
}

/// The last `id` of the current member-level object.
#[derive(Debug, Clone, PartialEq, Eq)]
enum IdSlot {
    Absent,
    /// Not a number or string (`null`, `true`, an object…): no call the client can match.
    Invalid,
    TooLong,
    Valid(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Top {
    Unknown,
    Object,
    Array,
}

/// Incremental scanner for the request ids of one JSON-RPC message or batch.
#[derive(Debug, Clone)]
pub struct RequestIdScanner {
    result: Scan,
    /// Bytes of a leading [`BOM`] read so far; `None` once the body's first bytes are not one.
    bom: Option<usize>,
    seen: usize,
    top: Top,
    depth: u32,
    /// Depth of the member-level object being read; 0 outside one.
    member: u32,
    slot: Slot,
    lex: Lex,
    /// The member key being read, inline: a Vec here cost every POST one allocation.
    key: [u8; MAX_KEY_BYTES],
    key_len: usize,
    key_long: bool,
    role: Role,
    /// The id text being read, and whether it outgrew the bound.
    cur: Vec<u8>,
    cur_long: bool,
    obj_id: IdSlot,
    obj_method: bool,
    /// Ids of the requests read so far, and whether one could not be carried.
    ids: Vec<String>,
    ids_bytes: usize,
    overflow: bool,
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
            bom: Some(0),
            seen: 0,
            top: Top::Unknown,
            depth: 0,
            member: 0,
            slot: Slot::After,
            lex: Lex::Between,
            key: [0; MAX_KEY_BYTES],
            key_len: 0,
            key_long: false,
            role: Role::Other,
            cur: Vec::new(),
            cur_long: false,
            obj_id: IdSlot::Absent,
            obj_method: false,
            ids: Vec::new(),
            ids_bytes: 0,
            overflow: false,
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
        let mut i = 0;
        while let Some(rest) = chunk.get(i..).filter(|r| !r.is_empty()) {
            if self.lex
                == (Lex::Str {
                    keep: Keep::Skip,
                    esc: false,
                })
            {
                // The bulk of a large body is string content nobody keeps: jump over it.
                match memchr::memchr2(b'"', b'\\', rest) {
                    Some(at) => i += at,
                    None => break,
                }
            }
            if let Some(&b) = chunk.get(i) {
                self.byte(b);
            }
            i += 1;
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

    /// The body ended: a body whose top-level value did not end carries no id.
    pub fn finish(&mut self) -> &Scan {
        if self.result == Scan::Pending {
            self.result = Scan::None;
        }
        &self.result
    }

    fn at_member(&self) -> bool {
        self.member != 0 && self.depth == self.member
    }

    fn byte(&mut self, b: u8) {
        if let Some(n) = self.bom {
            if BOM.get(n) == Some(&b) {
                self.bom = Some(n + 1).filter(|n| *n < BOM.len());
                return;
            }
            self.bom = None;
            if n > 0 {
                // Part of a BOM: not UTF-8, no parser reads a value here.
                self.result = Scan::None;
                return;
            }
        }
        match self.lex {
            Lex::Str { keep, esc } => {
                let closing = !esc && b == b'"';
                match keep {
                    // A key is kept without its quotes, an id with them.
                    Keep::Key if closing => {}
                    Keep::Key if self.key_len < MAX_KEY_BYTES => {
                        if let Some(k) = self.key.get_mut(self.key_len) {
                            *k = b;
                        }
                        self.key_len += 1;
                    }
                    Keep::Key => self.key_long = true,
                    Keep::Id => self.keep_id_byte(b),
                    Keep::Skip => {}
                }
                if closing {
                    self.lex = Lex::Between;
                    self.end_string(keep);
                } else {
                    let esc = !esc && b == b'\\';
                    self.lex = Lex::Str { keep, esc };
                }
                return;
            }
            Lex::Scalar { id } => {
                if !matches!(
                    b,
                    b',' | b'}' | b']' | b':' | b'"' | b'{' | b'[' | b' ' | b'\t' | b'\r' | b'\n'
                ) {
                    if id {
                        self.keep_id_byte(b);
                    }
                    return;
                }
                self.lex = Lex::Between;
                if id {
                    self.end_id(json_number(&self.cur));
                }
            }
            Lex::Between => {}
        }
        self.structural(b);
    }

    fn structural(&mut self, b: u8) {
        let value_here = self.at_member() && self.slot == Slot::Value;
        match b {
            b' ' | b'\t' | b'\r' | b'\n' => {}
            b'{' | b'[' if self.top == Top::Unknown => {
                self.depth = 1;
                if b == b'{' {
                    self.top = Top::Object;
                    self.open_member();
                } else {
                    self.top = Top::Array;
                }
            }
            _ if self.top == Top::Unknown => self.result = Scan::None,
            b'"' => {
                let keep = if self.at_member() && self.slot == Slot::Key {
                    self.key_len = 0;
                    self.key_long = false;
                    Keep::Key
                } else if value_here && self.value_starts() == Role::Id {
                    self.cur.push(b);
                    Keep::Id
                } else {
                    Keep::Skip
                };
                self.lex = Lex::Str { keep, esc: false };
            }
            b'{' | b'[' => {
                if value_here && self.value_starts() == Role::Id {
                    self.obj_id = IdSlot::Invalid;
                }
                self.depth = self.depth.saturating_add(1);
                if self.top == Top::Array && self.depth == 2 && b == b'{' {
                    self.open_member();
                }
            }
            b'}' | b']' => {
                if self.at_member() {
                    self.close_member();
                }
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.done();
                }
            }
            b':' if self.at_member() && self.slot == Slot::Colon => self.slot = Slot::Value,
            b',' if self.at_member() => self.slot = Slot::Key,
            _ => {
                let id = value_here && self.value_starts() == Role::Id;
                if id {
                    self.cur.push(b);
                }
                self.lex = Lex::Scalar { id };
            }
        }
    }

    /// A member value starts: what its key named (a `method` makes the object a request).
    fn value_starts(&mut self) -> Role {
        self.slot = Slot::After;
        match self.role {
            Role::Method => self.obj_method = true,
            Role::Id => {
                self.cur.clear();
                self.cur_long = false;
            }
            Role::Other => {}
        }
        self.role
    }

    fn keep_id_byte(&mut self, b: u8) {
        if self.cur.len() < MAX_REQUEST_IDS_BYTES {
            self.cur.push(b);
        } else {
            self.cur_long = true;
        }
    }

    fn end_string(&mut self, keep: Keep) {
        match keep {
            Keep::Key => {
                self.role = if self.key_long {
                    Role::Other
                } else {
                    key_role(self.key.get(..self.key_len).unwrap_or_default())
                };
                self.slot = Slot::Colon;
            }
            Keep::Id => self.end_id(json_string(&self.cur)),
            Keep::Skip => {}
        }
    }

    /// The id's text is complete; the last `id` of an object is the one its parser keeps.
    fn end_id(&mut self, lexically_valid: bool) {
        let raw = std::mem::take(&mut self.cur);
        self.obj_id = if self.cur_long {
            IdSlot::TooLong
        } else {
            match String::from_utf8(raw) {
                Ok(s) if lexically_valid => IdSlot::Valid(s),
                _ => IdSlot::Invalid,
            }
        };
    }

    fn open_member(&mut self) {
        self.member = self.depth;
        self.slot = Slot::Key;
        self.obj_id = IdSlot::Absent;
        self.obj_method = false;
    }

    fn close_member(&mut self) {
        self.member = 0;
        if !self.obj_method {
            return;
        }
        match std::mem::replace(&mut self.obj_id, IdSlot::Absent) {
            IdSlot::Valid(id) => {
                // Each id with its comma (or bracket): memory stays bounded however long the batch.
                self.ids_bytes = self.ids_bytes.saturating_add(id.len() + 1);
                if self.ids_bytes > MAX_REQUEST_IDS_BYTES + 1 {
                    self.overflow = true;
                } else {
                    self.ids.push(id);
                }
            }
            IdSlot::TooLong => self.overflow = true,
            IdSlot::Absent | IdSlot::Invalid => {}
        }
    }

    fn done(&mut self) {
        let ids = std::mem::take(&mut self.ids);
        let carried = match self.top {
            _ if self.overflow || ids.is_empty() => None,
            Top::Array => Some(format!("[{}]", ids.join(","))),
            _ => ids.into_iter().next_back(),
        };
        self.result = match carried {
            Some(c) if c.len() <= MAX_REQUEST_IDS_BYTES => Scan::Found(c),
            _ => Scan::None,
        };
    }
}

/// A member key, raw (without quotes): `id`, `method`, or another, compared decoded.
fn key_role(raw: &[u8]) -> Role {
    let decoded;
    let key: &[u8] = if raw.contains(&b'\\') {
        let mut quoted = Vec::with_capacity(raw.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(raw);
        quoted.push(b'"');
        match serde_json::from_slice::<String>(&quoted) {
            Ok(k) => {
                decoded = k;
                decoded.as_bytes()
            }
            // A lone surrogate: whatever it decodes to, it is neither key.
            Err(_) => return Role::Other,
        }
    } else {
        raw
    };
    match key {
        b"id" => Role::Id,
        b"method" => Role::Method,
        _ => Role::Other,
    }
}

/// JSON's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, any magnitude.
fn json_number(s: &[u8]) -> bool {
    fn digits(s: &[u8]) -> (usize, &[u8]) {
        let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
        (n, s.get(n..).unwrap_or_default())
    }
    let s = s.strip_prefix(b"-").unwrap_or(s);
    let leading_zero = s.first() == Some(&b'0');
    let (n, mut s) = digits(s);
    if n == 0 || (n > 1 && leading_zero) {
        return false;
    }
    if let Some(rest) = s.strip_prefix(b".") {
        let (m, r) = digits(rest);
        if m == 0 {
            return false;
        }
        s = r;
    }
    if let Some(rest) = s.strip_prefix(b"e").or_else(|| s.strip_prefix(b"E")) {
        let rest = rest
            .strip_prefix(b"+")
            .or_else(|| rest.strip_prefix(b"-"))
            .unwrap_or(rest);
        let (m, r) = digits(rest);
        if m == 0 {
            return false;
        }
        s = r;
    }
    s.is_empty()
}

/// JSON's string grammar (with its quotes): valid escapes, no raw control characters. A `\u`
/// escape may name a lone surrogate: `JSON.parse` and Python's `json` accept it.
fn json_string(s: &[u8]) -> bool {
    let Some(inner) = s.strip_prefix(b"\"").and_then(|r| r.strip_suffix(b"\"")) else {
        return false;
    };
    let mut it = inner.iter();
    while let Some(&b) = it.next() {
        match b {
            b'"' | 0..=0x1F => return false,
            b'\\' => match it.next() {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {}
                Some(b'u') => {
                    if !(0..4).all(|_| it.next().is_some_and(u8::is_ascii_hexdigit)) {
                        return false;
                    }
                }
                _ => return false,
            },
            _ => {}
        }
    }
    true
}

/// One id the guard carries: a JSON number or string, as raw text.
pub fn valid_id(raw: &str) -> bool {
    match raw.as_bytes().first() {
        Some(b'"') => json_string(raw.as_bytes()),
        Some(_) => json_number(raw.as_bytes()),
        None => false,
    }
}

/// The raw ids of a carried text (one id, or a batch's array of ids without whitespace);
/// `None` when it is not such a text or is longer than [`MAX_REQUEST_IDS_BYTES`].
pub fn split_ids(carried: &str) -> Option<Vec<&str>> {
    if carried.len() > MAX_REQUEST_IDS_BYTES {
        return None;
    }
    let Some(inner) = carried.strip_prefix('[').and_then(|r| r.strip_suffix(']')) else {
        return valid_id(carried).then(|| vec![carried]);
    };
    // Split at the commas outside strings.
    let mut ids = Vec::new();
    let (mut start, mut in_str, mut esc) = (0, false, false);
    for (i, b) in inner.bytes().enumerate() {
        match b {
            _ if std::mem::take(&mut esc) => {}
            b'\\' if in_str => esc = true,
            b'"' => in_str = !in_str,
            b',' if !in_str => {
                ids.push(inner.get(start..i)?);
                start = i + 1;
            }
            _ => {}
        }
    }
    ids.push(inner.get(start..)?);
    ids.iter().all(|id| valid_id(id)).then_some(ids)
}

/// A relayed message as the clients' JSON-RPC schemas read it: a response, its id and kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Response<'a> {
    /// `None`: an error response without id (it answers no call).
    pub id: Option<&'a serde_json::Value>,
    /// A result response (not an error).
    pub result: bool,
}

impl Response<'_> {
    /// Does this response answer the call `pending` (the raw id the client sent, parsed) for
    /// every client? Besides the TypeScript schema ([`client_response`]), Python's pydantic
    /// model takes an integer id only as an integer literal (`Field(strict=True)`), and the id
    /// must be the client's own exactly: one that a client maps to it (TypeScript's
    /// `Number("7")`) is not counted, so the end settles it, harmlessly (docs/clients.md).
    pub fn answers(&self, pending: &serde_json::Value) -> bool {
        self.id
            .is_some_and(|id| (id.is_string() || id.is_i64() || id.is_u64()) && id == pending)
    }
}

/// `Number.MAX_SAFE_INTEGER`: zod's `int()` takes no integer of larger magnitude.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// The MCP key of a task a result relates to (TypeScript's `RELATED_TASK_META_KEY`).
const RELATED_TASK_KEY: &str = "io.modelcontextprotocol/related-task";

/// `m` as the TypeScript SDK 1.32 reads a message event (`JSONRPCMessageSchema`, zod): a
/// response only when its strict schema accepts it, `None` otherwise (a request, a
/// notification, a batch, or a message it refuses with `onerror` and drops). Python's `mcp`
/// 2.3 accepts every response TypeScript does (its models ignore extra keys and take any
/// object as `result`), with one difference in the id ([`Response::answers`]).
/// - only `jsonrpc`, `id` and one of `result` / `error` (`.strict()`); `jsonrpc` is `"2.0"`;
/// - `id`: a string or a safe integer (`RequestIdSchema`); required on a result;
/// - `result`: an object whose `_meta`, if present, is an object with a string or integer
///   `progressToken` and an object with a string `taskId` under the related-task key, if
///   present (`ResultSchema`);
/// - `error`: an object with an integer `code` and a string `message`, any `data`.
pub fn client_response(m: &serde_json::Value) -> Option<Response<'_>> {
    let o = m.as_object()?;
    if o.get("jsonrpc")?.as_str()? != "2.0" {
        return None;
    }
    let id = o.get("id");
    let result = match (o.get("result"), o.get("error")) {
        (Some(r), None) => ts_result(r).then_some(true)?,
        (None, Some(e)) => ts_error(e).then_some(false)?,
        _ => return None,
    };
    let known = 2 + usize::from(id.is_some());
    let id_ok = match id {
        Some(i) => ts_id(i),
        None => !result,
    };
    (o.len() == known && id_ok).then_some(Response { id, result })
}

/// `z.number().int()` on the number `JSON.parse` makes of `v` (`1.0` and `1e2` are integers).
fn ts_int(v: &serde_json::Value) -> bool {
    v.as_f64()
        .is_some_and(|f| f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER)
}

fn ts_id(v: &serde_json::Value) -> bool {
    v.is_string() || ts_int(v)
}

fn ts_result(r: &serde_json::Value) -> bool {
    let Some(r) = r.as_object() else {
        return false;
    };
    let Some(meta) = r.get("_meta") else {
        return true;
    };
    let Some(meta) = meta.as_object() else {
        return false;
    };
    let token_ok = meta.get("progressToken").is_none_or(ts_id);
    let task_ok = meta
        .get(RELATED_TASK_KEY)
        .is_none_or(|t| t.get("taskId").is_some_and(serde_json::Value::is_string));
    token_ok && task_ok
}

fn ts_error(e: &serde_json::Value) -> bool {
    e.get("code").is_some_and(ts_int) && e.get("message").is_some_and(serde_json::Value::is_string)
}

/// The ids of a whole body (tests, fuzzing).
pub fn request_id(body: &[u8]) -> Option<String> {
    let mut s = RequestIdScanner::new();
    s.push(body);
    match s.finish() {
        Scan::Found(id) => Some(id.clone()),
        _ => None,
    }
}

/// Is `carried` a text the guard carries (see [`split_ids`])?
pub fn valid_request_id(carried: &str) -> bool {
    split_ids(carried).is_some()
}

#[cfg(test)]
#[path = "jsonrpc_tests.rs"]
pub(crate) mod tests;
