//! Versioned, authenticated cursor codec: the SSE event id clients see.
//!
//! Binary layout, all integers big-endian unless noted:
//!
//! | field            | size      | notes                                                   |
//! |------------------|-----------|---------------------------------------------------------|
//! | version          | 1         | [`CURSOR_VERSION`] (3) for every new cursor             |
//! | key id           | 1         | which key of the [`Keyring`] made the MAC               |
//! | session binding  | 8         | [`session_binding`] of the session id                   |
//! | incarnation      | 8         | u64 BE, the stream incarnation                          |
//! | kind             | 1         | [`StreamKind::as_u8`]                                   |
//! | seq              | 1..=10    | u64 as LEB128, minimal encoding only                    |
//! | replica id len   | 1         | 0..=[`MAX_REPLICA_ID_BYTES`], or 0xFF = not embedded    |
//! | replica id       | len       | UTF-8 bytes of the replica's own event id               |
//! | request ids len  | 1..=2     | version 4 only: LEB128, minimal, 1..=[`MAX_EMBEDDED_REQUEST_ID_BYTES`] |
//! | request ids      | len       | version 4 only: the POST's JSON-RPC id(s), raw JSON ([`crate::jsonrpc`]) |
//! | MAC              | 16        | see below, over all bytes before it                     |
//!
//! A request stream's cursors are version **4**: version 3's layout and MAC plus the id of the
//! request that opened the stream (or the array of a batch's ids), as the raw JSON text the client
//! sent, so a refusal can settle the client's pending calls without asking anyone, whatever path
//! decides it. Every other cursor is version 3. The length was one byte (ids of at most 64 bytes)
//! before it became LEB128; both read the same below 128, so older version-4 cursors still decode.
//!
//! The version byte names the MAC (the layout is the same for all three):
//! - **3**, every cursor minted now: the first 16 bytes of BLAKE3 `keyed_hash(K₃, body)`, where
//!   K₃ = BLAKE3 `derive_key("mcp-resume-guard 2026-12 cursor MAC v3", secret)`. A standard keyed
//!   construction from a maintained crate; a body of up to 64 bytes (a replica id of up to
//!   ~43 bytes) costs one compression, the longest body three.
//! - **1** (HMAC-SHA256, first 16 bytes) and **2** (one SHA-256 compression keyed by a derived
//!   one-block key, only for bodies of at most 55 bytes) were minted by earlier releases. They
//!   still verify while [`Keyring::with_legacy_macs`] allows it (the default), so cursors that
//!   clients hold keep working for one rotation window after an upgrade; nothing signs them.
//!
//! All tags are verified in constant time; the version byte is under the MAC and the three use
//! independent keys derived from the secret, so no tag can be turned into another version's.
//!
//! Text form: base64 URL-safe alphabet without padding, so it is a valid SSE id and HTTP
//! header value.
//!
//! The owner's address is never part of a cursor. Decoding checks, in order: length, base64,
//! version, key id, MAC (constant time), then the fields strictly.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::block_api::compress256;
use sha2::{Digest, Sha256};

use crate::jsonrpc::valid_request_id;
use crate::ownership::StreamKind;

/// The version of every cursor minted now without a request id: BLAKE3 `keyed_hash` tag.
pub const CURSOR_VERSION: u8 = 3;
/// Version 3 plus the JSON-RPC id of the request that opened the stream; same MAC.
pub const CURSOR_VERSION_REQUEST: u8 = 4;
/// Legacy, verify-only: HMAC-SHA256 tag.
pub const CURSOR_VERSION_HMAC: u8 = 1;
/// Legacy, verify-only: one keyed SHA-256 compression (bodies of at most [`ONE_BLOCK`] bytes).
pub const CURSOR_VERSION_ONE_BLOCK: u8 = 2;
/// BLAKE3 key-derivation context of the version-3 MAC key (domain separation from the other uses
/// of the secret).
const K3_CONTEXT: &str = "mcp-resume-guard 2026-12 cursor MAC v3";
/// Longest message that, with SHA-256's padding (0x80 and the 8-byte length), fits one block.
pub const ONE_BLOCK: usize = 55;
/// Labels of the two halves of the version-2 key K₂ (domain separation from the HMAC key use).
const K2_LABELS: [&[u8]; 2] = [
    b"mcp-resume-guard cursor v2 one-block key, half 0",
    b"mcp-resume-guard cursor v2 one-block key, half 1",
];
const SHA256_IV: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];
/// Longest request id text a version-4 cursor carries: every id the guard carries
/// ([`crate::jsonrpc::MAX_REQUEST_IDS_BYTES`]), so no refusal depends on the store to settle.
pub const MAX_EMBEDDED_REQUEST_ID_BYTES: usize = crate::jsonrpc::MAX_REQUEST_IDS_BYTES;
/// Length bytes of the embedded request id (LEB128 of [`MAX_EMBEDDED_REQUEST_ID_BYTES`]).
const REQUEST_ID_LEN_BYTES: usize = 2;
/// Longer replica ids are not embedded (`replica_event_id = None`); the guard's records still map seq to them.
pub const MAX_REPLICA_ID_BYTES: usize = 128;
/// Length of the truncated tag (every version).
pub const MAC_BYTES: usize = 16;

const NOT_EMBEDDED: u8 = 0xFF;
const FIXED_HEAD: usize = 1 + 1 + 8 + 8 + 1;
const MAX_VARINT: usize = 10;
/// Largest binary cursor: fixed head, longest varint, length byte, longest replica id, the
/// longest request id with its length, MAC.
pub const MAX_CURSOR_BYTES: usize = FIXED_HEAD
    + MAX_VARINT
    + 1
    + MAX_REPLICA_ID_BYTES
    + REQUEST_ID_LEN_BYTES
    + MAX_EMBEDDED_REQUEST_ID_BYTES
    + MAC_BYTES;
/// Cursors up to this size are sealed on the stack (every cursor whose request id is at most 64
/// bytes); larger ones, rare, in a vector.
const INLINE_CURSOR_BYTES: usize =
    FIXED_HEAD + MAX_VARINT + 1 + MAX_REPLICA_ID_BYTES + 1 + 64 + MAC_BYTES;
/// Smallest binary cursor: one-byte varint, no replica id.
const MIN_CURSOR_BYTES: usize = FIXED_HEAD + 1 + 1 + MAC_BYTES;
/// Any longer `Last-Event-ID` is rejected before decoding (unpadded base64 of [`MAX_CURSOR_BYTES`]).
pub const MAX_CURSOR_CHARS: usize = (MAX_CURSOR_BYTES * 4).div_ceil(3);
// base64's decode_slice wants room for its whole-quantum estimate.
const DECODE_BUF: usize = MAX_CURSOR_CHARS.div_ceil(4) * 3;

/// One HMAC key. The secret is used directly as the HMAC-SHA256 key; its minimum length
/// (32 bytes) is enforced by the config loader.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    pub id: u8,
    pub secret: Vec<u8>,
}

impl fmt::Debug for Key {
    // Never print secrets into logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyringError {
    /// Two keys share this id, so a cursor's key id would be ambiguous.
    DuplicateKeyId(u8),
    /// The HMAC implementation refused this key.
    InvalidKey(u8),
}

impl fmt::Display for KeyringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyringError::DuplicateKeyId(id) => write!(f, "duplicate key id {id}"),
            KeyringError::InvalidKey(id) => write!(f, "invalid key {id}"),
        }
    }
}

impl std::error::Error for KeyringError {}

/// One key, ready to use for every cursor version.
#[derive(Clone)]
struct KeyState {
    id: u8,
    /// K₃, the BLAKE3 key of version 3.
    blake3: [u8; 32],
    // Pre-keyed HMAC state: cloning it skips hashing the key pads on every cursor.
    hmac: Hmac<Sha256>,
    /// SHA-256 chaining value after the block K₂ (version 2).
    one_block: [u32; 8],
}

/// One active key that signs, plus verify-only keys kept during rotation.
#[derive(Clone)]
pub struct Keyring {
    active: u8,
    keys: Vec<KeyState>,
    /// Whether versions 1 and 2 still verify.
    legacy: bool,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<u8> = self.keys.iter().map(|k| k.id).collect();
        f.debug_struct("Keyring")
            .field("active", &self.active)
            .field("key_ids", &ids)
            .field("legacy_macs", &self.legacy)
            .finish()
    }
}

/// The fields of a cursor to encode; borrows the replica's event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor<'a> {
    pub session: [u8; 8],
    pub incarnation: u64,
    pub kind: StreamKind,
    pub seq: u64,
    /// Embedded only when at most [`MAX_REPLICA_ID_BYTES`] long; otherwise decodes as `None`.
    pub replica_event_id: Option<&'a str>,
    /// The JSON-RPC id(s) (raw JSON, see [`crate::jsonrpc`]) of the request whose stream this
    /// is; embedded when at most [`MAX_EMBEDDED_REQUEST_ID_BYTES`] (the scanner keeps no longer).
    pub request_id: Option<&'a str>,
}

/// A verified cursor. The session binding is not checked here (the caller knows the session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedCursor {
    pub key_id: u8,
    pub session: [u8; 8],
    pub incarnation: u64,
    pub kind: StreamKind,
    pub seq: u64,
    pub replica_event_id: Option<String>,
    /// The opening request's JSON-RPC id(s) (raw JSON text), for a version-4 cursor.
    pub request_id: Option<String>,
}

impl DecodedCursor {
    /// Whether this cursor was minted for `session_id`.
    pub fn is_bound_to(&self, session_id: &[u8]) -> bool {
        self.session == session_binding(session_id)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorError {
    TooLong,
    Malformed,
    UnknownVersion,
    UnknownKey,
    BadMac,
}

impl CursorError {
    /// Short name for logs and stats.
    pub fn as_str(self) -> &'static str {
        match self {
            CursorError::TooLong => "too_long",
            CursorError::Malformed => "malformed",
            CursorError::UnknownVersion => "unknown_version",
            CursorError::UnknownKey => "unknown_key",
            CursorError::BadMac => "bad_mac",
        }
    }
}

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for CursorError {}

impl Keyring {
    pub fn new(active: Key, verify_only: Vec<Key>) -> Result<Keyring, KeyringError> {
        let mut keys: Vec<KeyState> = Vec::with_capacity(1 + verify_only.len());
        for key in std::iter::once(&active).chain(verify_only.iter()) {
            if keys.iter().any(|k| k.id == key.id) {
                return Err(KeyringError::DuplicateKeyId(key.id));
            }
            let hmac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key.secret)
                .map_err(|_| KeyringError::InvalidKey(key.id))?;
            keys.push(KeyState {
                id: key.id,
                blake3: blake3::derive_key(K3_CONTEXT, &key.secret),
                one_block: one_block_state(&derive_k2(&hmac)),
                hmac,
            });
        }
        Ok(Keyring {
            active: active.id,
            keys,
            legacy: true,
        })
    }

    /// Whether cursors of the legacy versions 1 and 2 still verify (the default). Turn it off
    /// once every cursor minted before the upgrade has aged out (one rotation window).
    pub fn with_legacy_macs(mut self, accept: bool) -> Self {
        self.legacy = accept;
        self
    }

    pub fn active_id(&self) -> u8 {
        self.active
    }

    /// Ids of all keys that verify, the active one first.
    pub fn key_ids(&self) -> impl Iterator<Item = u8> + '_ {
        self.keys.iter().map(|k| k.id)
    }

    fn key(&self, id: u8) -> Option<&KeyState> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// Encodes with the active key.
    pub fn encode(&self, c: &Cursor<'_>) -> String {
        let mut s = String::new();
        self.encode_into(c, &mut s);
        s
    }

    /// Appends the text cursor to `out`; allocates only if `out` must grow.
    pub fn encode_into(&self, c: &Cursor<'_>, out: &mut String) {
        let buf = self.seal(c);
        out.reserve((buf.bytes().len() * 4).div_ceil(3));
        URL_SAFE_NO_PAD.encode_string(buf.bytes(), out);
    }

    /// Appends the text cursor to `out` as bytes, base64 written in place: no intermediate
    /// string, and no allocation unless `out` must grow. The same text as [`Keyring::encode`].
    pub fn encode_to(&self, c: &Cursor<'_>, out: &mut Vec<u8>) {
        let buf = self.seal(c);
        let at = out.len();
        out.resize(at + (buf.bytes().len() * 4).div_ceil(3), 0);
        let written = match out.get_mut(at..) {
            Some(dst) => URL_SAFE_NO_PAD.encode_slice(buf.bytes(), dst).unwrap_or(0),
            None => 0,
        };
        // The room is exact, so this only drops bytes if the encoder wrote fewer (it cannot).
        out.truncate(at + written);
    }

    /// The binary cursor with its MAC, made with the active key.
    fn seal(&self, c: &Cursor<'_>) -> Buf {
        let mut buf = Buf::new();
        let request_id = c
            .request_id
            .filter(|r| r.len() <= MAX_EMBEDDED_REQUEST_ID_BYTES && !r.is_empty());
        let version = match request_id {
            Some(_) => CURSOR_VERSION_REQUEST,
            None => CURSOR_VERSION,
        };
        buf.push(&[version, self.active]);
        buf.push(&c.session);
        buf.push(&c.incarnation.to_be_bytes());
        buf.push(&[c.kind.as_u8()]);
        let mut v = [0u8; MAX_VARINT];
        let n = write_varint(c.seq, &mut v);
        buf.push(v.get(..n).unwrap_or_default());
        match c.replica_event_id {
            Some(r) if r.len() <= MAX_REPLICA_ID_BYTES => {
                // Fits in u8 since MAX_REPLICA_ID_BYTES < 0xFF.
                buf.push(&[r.len() as u8]);
                buf.push(r.as_bytes());
            }
            _ => buf.push(&[NOT_EMBEDDED]),
        }
        if let Some(r) = request_id {
            let n = write_varint(r.len() as u64, &mut v);
            buf.push(v.get(..n).unwrap_or_default());
            buf.push(r.as_bytes());
        }
        if let Some(key) = self.key(self.active) {
            let tag = v3_tag(&key.blake3, buf.bytes());
            buf.push(&tag);
        }
        buf
    }

    /// Verifies and parses a text cursor with whichever key of the ring its key id names.
    pub fn decode(&self, text: &str) -> Result<DecodedCursor, CursorError> {
        if text.len() > MAX_CURSOR_CHARS {
            return Err(CursorError::TooLong);
        }
        let mut raw = [0u8; DECODE_BUF];
        let n = URL_SAFE_NO_PAD
            .decode_slice(text.as_bytes(), &mut raw)
            .map_err(|_| CursorError::Malformed)?;
        let bytes = raw.get(..n).ok_or(CursorError::Malformed)?;
        let version = match bytes.first() {
            None => return Err(CursorError::Malformed),
            Some(&v @ (CURSOR_VERSION | CURSOR_VERSION_REQUEST)) => v,
            Some(&v @ (CURSOR_VERSION_HMAC | CURSOR_VERSION_ONE_BLOCK)) if self.legacy => v,
            Some(_) => return Err(CursorError::UnknownVersion),
        };
        let key_id = *bytes.get(1).ok_or(CursorError::Malformed)?;
        let key = self.key(key_id).ok_or(CursorError::UnknownKey)?;
        if n < MIN_CURSOR_BYTES {
            return Err(CursorError::Malformed);
        }
        let (body, tag) = bytes
            .split_at_checked(n - MAC_BYTES)
            .ok_or(CursorError::Malformed)?;
        let authentic = match version {
            CURSOR_VERSION | CURSOR_VERSION_REQUEST => ct_eq(&v3_tag(&key.blake3, body), tag),
            // Only single-block bodies were ever signed this way.
            CURSOR_VERSION_ONE_BLOCK => {
                let want = one_block_tag(&key.one_block, body).ok_or(CursorError::Malformed)?;
                ct_eq(&want, tag)
            }
            _ => {
                let mut mac = key.hmac.clone();
                mac.update(body);
                mac.verify_truncated_left(tag).is_ok()
            }
        };
        if !authentic {
            return Err(CursorError::BadMac);
        }
        parse_body(version, key_id, body)
    }
}

/// First 16 bytes of BLAKE3 `keyed_hash(K₃, body)`.
fn v3_tag(k3: &[u8; 32], body: &[u8]) -> [u8; MAC_BYTES] {
    let h = blake3::keyed_hash(k3, body);
    let mut tag = [0u8; MAC_BYTES];
    if let Some(t) = h.as_bytes().get(..MAC_BYTES) {
        tag.copy_from_slice(t);
    }
    tag
}

/// K₂ = HMAC(secret, label 0) ‖ HMAC(secret, label 1): 64 bytes, one SHA-256 block.
fn derive_k2(hmac: &Hmac<Sha256>) -> [u8; 64] {
    let mut k2 = [0u8; 64];
    for (half, label) in k2.chunks_mut(32).zip(K2_LABELS) {
        let mut m = hmac.clone();
        m.update(label);
        half.copy_from_slice(&m.finalize().into_bytes());
    }
    k2
}

/// The chaining value after compressing the key block: SHA-256's state after K₂.
fn one_block_state(k2: &[u8; 64]) -> [u32; 8] {
    let mut st = SHA256_IV;
    compress256(&mut st, &[*k2]);
    st
}

/// First 16 bytes of SHA-256(K₂ ‖ body) from K₂'s chaining value: one compression.
/// `None` when `body` does not fit one block with SHA-256's padding.
fn one_block_tag(state: &[u32; 8], body: &[u8]) -> Option<[u8; MAC_BYTES]> {
    if body.len() > ONE_BLOCK {
        return None;
    }
    let mut block = [0u8; 64];
    block.get_mut(..body.len())?.copy_from_slice(body);
    *block.get_mut(body.len())? = 0x80;
    // Total message length in bits: the key block plus the body.
    let bits = ((64 + body.len()) as u64) * 8;
    block.get_mut(56..)?.copy_from_slice(&bits.to_be_bytes());
    let mut st = *state;
    compress256(&mut st, &[block]);
    let mut tag = [0u8; MAC_BYTES];
    for (out, w) in tag.chunks_mut(4).zip(st) {
        out.copy_from_slice(&w.to_be_bytes());
    }
    Some(tag)
}

/// Constant-time equality of two tags (no early exit on the first differing byte).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Parses the MAC-verified body; any deviation from the layout is `Malformed`.
fn parse_body(version: u8, key_id: u8, body: &[u8]) -> Result<DecodedCursor, CursorError> {
    let mut r = Reader(body);
    r.take(2)?; // version and key id, already checked
    let session: [u8; 8] = r.array()?;
    let incarnation = u64::from_be_bytes(r.array()?);
    let kind = StreamKind::from_u8(r.byte()?).ok_or(CursorError::Malformed)?;
    let seq = read_varint(&mut r)?;
    let replica_event_id = match r.byte()? {
        NOT_EMBEDDED => None,
        len if usize::from(len) <= MAX_REPLICA_ID_BYTES => {
            let b = r.take(usize::from(len))?;
            Some(
                std::str::from_utf8(b)
                    .map_err(|_| CursorError::Malformed)?
                    .to_owned(),
            )
        }
        _ => return Err(CursorError::Malformed),
    };
    let request_id = if version == CURSOR_VERSION_REQUEST {
        let len = usize::try_from(read_varint(&mut r)?).map_err(|_| CursorError::Malformed)?;
        if len > MAX_EMBEDDED_REQUEST_ID_BYTES {
            return Err(CursorError::Malformed);
        }
        let b = r.take(len)?;
        match std::str::from_utf8(b) {
            Ok(id) if valid_request_id(id) => Some(id.to_owned()),
            _ => return Err(CursorError::Malformed),
        }
    } else {
        None
    };
    if !r.0.is_empty() {
        return Err(CursorError::Malformed);
    }
    Ok(DecodedCursor {
        key_id,
        session,
        incarnation,
        kind,
        seq,
        replica_event_id,
        request_id,
    })
}

/// Encode buffer: on the stack up to [`INLINE_CURSOR_BYTES`], then in `spill` (a long request
/// id), so the common cursor costs no allocation and no large zeroed array.
struct Buf {
    b: [u8; INLINE_CURSOR_BYTES],
    len: usize,
    spill: Vec<u8>,
}

impl Buf {
    fn new() -> Self {
        Buf {
            b: [0; INLINE_CURSOR_BYTES],
            len: 0,
            spill: Vec::new(),
        }
    }
    fn push(&mut self, s: &[u8]) {
        if self.spill.is_empty() {
            if let Some(dst) = self.b.get_mut(self.len..self.len + s.len()) {
                dst.copy_from_slice(s);
                self.len += s.len();
                return;
            }
            self.spill
                .extend_from_slice(self.b.get(..self.len).unwrap_or_default());
        }
        self.spill.extend_from_slice(s);
    }
    fn bytes(&self) -> &[u8] {
        if self.spill.is_empty() {
            self.b.get(..self.len).unwrap_or_default()
        } else {
            &self.spill
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CursorError> {
        let (head, rest) = self.0.split_at_checked(n).ok_or(CursorError::Malformed)?;
        self.0 = rest;
        Ok(head)
    }
    fn byte(&mut self) -> Result<u8, CursorError> {
        let (&b, rest) = self.0.split_first().ok_or(CursorError::Malformed)?;
        self.0 = rest;
        Ok(b)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], CursorError> {
        self.take(N)?.try_into().map_err(|_| CursorError::Malformed)
    }
}

fn write_varint(mut v: u64, out: &mut [u8; MAX_VARINT]) -> usize {
    let mut n = 0;
    for slot in out.iter_mut() {
        let low = (v & 0x7F) as u8;
        v >>= 7;
        n += 1;
        if v == 0 {
            *slot = low;
            break;
        }
        *slot = low | 0x80;
    }
    n
}

/// Strict LEB128: at most 10 bytes, no overflow, no redundant trailing zero groups.
fn read_varint(r: &mut Reader<'_>) -> Result<u64, CursorError> {
    let mut v: u64 = 0;
    for i in 0..MAX_VARINT {
        let b = r.byte()?;
        let low = u64::from(b & 0x7F);
        let shift = 7 * i as u32;
        // The 10th byte may only carry the top bit of a u64.
        if i == MAX_VARINT - 1 && low > 1 {
            return Err(CursorError::Malformed);
        }
        v |= low << shift;
        if b & 0x80 == 0 {
            // A zero final group after the first byte means a non-minimal encoding.
            if i > 0 && low == 0 {
                return Err(CursorError::Malformed);
            }
            return Ok(v);
        }
    }
    Err(CursorError::Malformed)
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// First 8 bytes of SHA-256(session id): binds a cursor to its session without revealing it.
pub fn session_binding(session_id: &[u8]) -> [u8; 8] {
    session_binding_and_key(session_id).0
}

/// Lowercase hex of the first 16 bytes of SHA-256(session id): the store key of a session.
pub fn session_key(session_id: &[u8]) -> String {
    session_binding_and_key(session_id).1
}

/// [`session_binding`] and [`session_key`] from one SHA-256 of the session id.
pub fn session_binding_and_key(session_id: &[u8]) -> ([u8; 8], String) {
    let h = sha256(session_id);
    let mut binding = [0u8; 8];
    if let Some(b) = h.get(..8) {
        binding.copy_from_slice(b);
    }
    let mut s = String::with_capacity(32);
    push_hex(h.get(..16).unwrap_or_default(), &mut s);
    (binding, s)
}

/// 16 lowercase hex chars.
pub fn incarnation_hex(id: u64) -> String {
    let mut s = String::with_capacity(16);
    push_hex(&id.to_be_bytes(), &mut s);
    s
}

/// Inverse of [`incarnation_hex`]; accepts exactly 16 lowercase hex chars.
pub fn parse_incarnation_hex(s: &str) -> Option<u64> {
    if s.len() != 16 {
        return None;
    }
    s.bytes().try_fold(0u64, |acc, c| {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        Some((acc << 4) | u64::from(d))
    })
}

fn push_hex(bytes: &[u8], s: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        for nib in [b >> 4, b & 0x0F] {
            s.push(char::from(
                HEX.get(usize::from(nib)).copied().unwrap_or(b'0'),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: u8, fill: u8) -> Key {
        Key {
            id,
            secret: vec![fill; 32],
        }
    }

    fn ring(id: u8, fill: u8) -> Keyring {
        Keyring::new(key(id, fill), vec![]).unwrap()
    }

    fn sample(replica: Option<&str>) -> Cursor<'_> {
        Cursor {
            request_id: None,
            session: session_binding(b"sess-1"),
            incarnation: 0x0102_0304_0506_0708,
            kind: StreamKind::Request,
            seq: 300,
            replica_event_id: replica,
        }
    }

    fn same(c: &Cursor<'_>, d: &DecodedCursor) -> bool {
        c.session == d.session
            && c.incarnation == d.incarnation
            && c.kind == d.kind
            && c.seq == d.seq
            && c.replica_event_id == d.replica_event_id.as_deref()
            && c.request_id == d.request_id.as_deref()
    }

    /// Decodes text into raw bytes (test helper).
    fn raw(text: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(text).unwrap_or_default()
    }

    /// Builds a cursor body by hand and signs it (version 3), to reach post-MAC parse errors.
    fn signed(key_fill: u8, key_id: u8, body: &[u8]) -> String {
        signed_as(CURSOR_VERSION, key_fill, key_id, body)
    }

    fn signed_as(version: u8, key_fill: u8, key_id: u8, body: &[u8]) -> String {
        let mut b = vec![version, key_id];
        b.extend_from_slice(body);
        let k3 = blake3::derive_key(K3_CONTEXT, &[key_fill; 32]);
        let tag = blake3::keyed_hash(&k3, &b);
        b.extend_from_slice(&tag.as_bytes()[..MAC_BYTES]);
        URL_SAFE_NO_PAD.encode(b)
    }

    /// Cursors minted by the previous release (versions 2, 1, 2) with key id 3, secret [9; 32],
    /// for `sample(Some("ev-1"))`, `sample(Some(&"l".repeat(40)))` and `sample(None)`.
    const LEGACY: [&str; 3] = [
        "AgOr5jPzpHonWAECAwQFBgcIAawCBGV2LTEqyWJJPH-mmNxIHzIBJbRX",
        "AQOr5jPzpHonWAECAwQFBgcIAawCKGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxMZ_SaMB6CDu0oo-mMwXtL",
        "AgOr5jPzpHonWAECAwQFBgcIAawC_yHfZKE_5PEZSovpSxGLrYY",
    ];

    #[test]
    fn round_trip() {
        let r = ring(7, 0xAB);
        for replica in [None, Some(""), Some("_GET_stream_1712_abc"), Some("é/1")] {
            let c = sample(replica);
            let text = r.encode(&c);
            assert!(text.len() <= MAX_CURSOR_CHARS);
            assert!(text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            let d = r.decode(&text);
            assert!(matches!(&d, Ok(d) if same(&c, d) && d.key_id == 7), "{d:?}");
        }
        let mut s = String::from("prefix:");
        r.encode_into(&sample(None), &mut s);
        assert!(s.starts_with("prefix:"));
        assert_eq!(&s[7..], r.encode(&sample(None)));
    }

    /// Cursors minted by the release before `encode_to`: the wire text must not change.
    const MINTED: [&str; 3] = [
        "Awer5jPzpHonWAECAwQFBgcIAawCBGV2LTEMObOysd69pGsNGmEbaKje",
        "BAer5jPzpHonWAECAwQFBgcIAawCBGV2LTEHInJlcS03ItNOCypuv5A_FtXMsZUfZHo",
        "BAer5jPzpHonWAECAwQFBgcIAf___________wGAbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGxsbGwHInJlcS03IqqfBk8zptUpytlfRGMmWMM",
    ];

    #[test]
    fn encode_to_writes_the_same_text_in_place() {
        let r = ring(7, 0xAB);
        let long = "l".repeat(MAX_REPLICA_ID_BYTES);
        let mut c = sample(Some("ev-1"));
        let mut cursors = vec![c];
        c.request_id = Some("\"req-7\"");
        cursors.push(c);
        c.replica_event_id = Some(&long);
        c.seq = u64::MAX;
        cursors.push(c);
        let mut out = b"id: ".to_vec();
        for (c, want) in cursors.iter().zip(MINTED) {
            assert_eq!(r.encode(c), want);
            let at = out.len();
            r.encode_to(c, &mut out);
            assert_eq!(&out[at..], want.as_bytes());
        }
        assert!(out.starts_with(b"id: "));
        // Appending never reallocates when the room is there.
        let mut out = Vec::with_capacity(MAX_CURSOR_CHARS);
        let p = out.as_ptr();
        r.encode_to(&cursors[2], &mut out);
        assert_eq!((out.as_ptr(), out.len()), (p, MINTED[2].len()));
    }

    #[test]
    fn a_request_id_rides_in_a_version_4_cursor() {
        let r = ring(7, 0xAB);
        for id in ["0", "12345", "\"req-1\"", "-2.5e1"] {
            let c = Cursor {
                request_id: Some(id),
                ..sample(Some("ev-1"))
            };
            let text = r.encode(&c);
            assert_eq!(raw(&text)[0], CURSOR_VERSION_REQUEST);
            assert!(matches!(&r.decode(&text), Ok(d) if same(&c, d)), "{id}");
        }
        // Without one (or with one too long to carry) it stays version 3.
        let too_long = format!("\"{}\"", "r".repeat(MAX_EMBEDDED_REQUEST_ID_BYTES));
        for id in [None, Some(""), Some(too_long.as_str())] {
            let c = Cursor {
                request_id: id,
                ..sample(Some("ev-1"))
            };
            let text = r.encode(&c);
            assert_eq!(raw(&text)[0], CURSOR_VERSION);
            assert!(matches!(&r.decode(&text), Ok(d) if d.request_id.is_none()));
        }
        // A signed version-4 body whose id is not a JSON number or string is malformed.
        let mut body = session_binding(b"s").to_vec();
        body.extend_from_slice(&7u64.to_be_bytes());
        body.extend_from_slice(&[1, 5, NOT_EMBEDDED]);
        for bad in [&b"null"[..], b"{}", b"1,2", b"", b"\"a"] {
            let mut b = body.clone();
            b.push(bad.len() as u8);
            b.extend_from_slice(bad);
            let text = signed_as(CURSOR_VERSION_REQUEST, 0xAB, 7, &b);
            assert_eq!(r.decode(&text), Err(CursorError::Malformed), "{bad:?}");
        }
        let mut ok = body.clone();
        ok.extend_from_slice(&[1, b'9']);
        assert!(r
            .decode(&signed_as(CURSOR_VERSION_REQUEST, 0xAB, 7, &ok))
            .is_ok());
    }

    #[test]
    fn every_carried_request_id_rides_raw_whatever_its_length() {
        let r = ring(7, 0xAB);
        let long = format!("\"{}\"", "r".repeat(MAX_EMBEDDED_REQUEST_ID_BYTES - 2));
        for id in [
            "18446744073709551616",
            "1e400",
            r#""\ud800""#,
            r#"[1,"a,b",18446744073709551616]"#,
            &format!("\"{}\"", "r".repeat(200)),
            &long,
        ] {
            let c = Cursor {
                request_id: Some(id),
                ..sample(Some("ev-1"))
            };
            let text = r.encode(&c);
            assert!(matches!(&r.decode(&text), Ok(d) if same(&c, d)), "{id}");
            let mut out = b"x".to_vec();
            r.encode_to(&c, &mut out);
            assert_eq!(out.get(1..), Some(text.as_bytes()), "{id}");
        }
        // Longer than the bound: not embedded, never a part of it.
        let too_long = format!("\"{}\"", "r".repeat(MAX_EMBEDDED_REQUEST_ID_BYTES - 1));
        let c = Cursor {
            request_id: Some(&too_long),
            ..sample(Some("ev-1"))
        };
        assert!(matches!(r.decode(&r.encode(&c)), Ok(d) if d.request_id.is_none()));

        // The length is LEB128: a version-4 cursor of an older release (one length byte, ids
        // of at most 64 bytes) reads the same; a redundant or oversized length is malformed.
        let mut body = session_binding(b"s").to_vec();
        body.extend_from_slice(&7u64.to_be_bytes());
        body.extend_from_slice(&[1, 5, NOT_EMBEDDED]);
        let old_id = format!("\"{}\"", "o".repeat(62));
        let mut old = body.clone();
        old.push(64);
        old.extend_from_slice(old_id.as_bytes());
        let d = r.decode(&signed_as(CURSOR_VERSION_REQUEST, 0xAB, 7, &old));
        assert_eq!(d.map(|d| d.request_id), Ok(Some(old_id)));
        let mut redundant = body.clone();
        redundant.extend_from_slice(&[0x81, 0x00, b'9']);
        let over = MAX_EMBEDDED_REQUEST_ID_BYTES + 1;
        let mut oversized = body.clone();
        oversized.extend_from_slice(&[(over as u8) | 0x80, (over >> 7) as u8]);
        oversized.extend(std::iter::repeat_n(b'1', over));
        for b in [redundant, oversized] {
            let text = signed_as(CURSOR_VERSION_REQUEST, 0xAB, 7, &b);
            assert_eq!(r.decode(&text), Err(CursorError::Malformed));
        }
    }

    #[test]
    fn extremes_round_trip_and_fit_the_bound() {
        let r = ring(0, 1);
        let long = "x".repeat(MAX_REPLICA_ID_BYTES);
        let long_request = format!("\"{}\"", "r".repeat(MAX_EMBEDDED_REQUEST_ID_BYTES - 2));
        let c = Cursor {
            request_id: Some(&long_request),
            session: [0xFF; 8],
            incarnation: u64::MAX,
            kind: StreamKind::Get,
            seq: u64::MAX,
            replica_event_id: Some(&long),
        };
        let text = r.encode(&c);
        assert_eq!(text.len(), MAX_CURSOR_CHARS);
        assert!(matches!(r.decode(&text), Ok(d) if same(&c, &d)));
        let c0 = Cursor {
            seq: 0,
            ..sample(None)
        };
        assert!(matches!(r.decode(&r.encode(&c0)), Ok(d) if same(&c0, &d)));
    }

    #[test]
    fn an_empty_replica_id_round_trips_apart_from_none() {
        // A reset cursor embeds an empty id (length 0); `None` is "not embedded" (0xFF).
        let r = ring(1, 2);
        let reset = r.encode(&sample(Some("")));
        let absent = r.encode(&sample(None));
        assert_ne!(reset, absent);
        assert!(matches!(r.decode(&reset), Ok(d) if d.replica_event_id.as_deref() == Some("")));
        assert!(matches!(r.decode(&absent), Ok(d) if d.replica_event_id.is_none()));
    }

    #[test]
    fn overlong_replica_id_is_not_embedded() {
        let r = ring(1, 2);
        let long = "y".repeat(MAX_REPLICA_ID_BYTES + 1);
        let text = r.encode(&sample(Some(&long)));
        assert!(matches!(r.decode(&text), Ok(d) if d.replica_event_id.is_none() && d.seq == 300));
    }

    #[test]
    fn every_error_is_reachable() {
        let r = ring(3, 9);
        let good = r.encode(&sample(Some("ev-1")));
        assert_eq!(
            r.decode(&"A".repeat(MAX_CURSOR_CHARS + 1)),
            Err(CursorError::TooLong)
        );
        assert_eq!(r.decode(""), Err(CursorError::Malformed));
        assert_eq!(r.decode("not base64!"), Err(CursorError::Malformed));
        assert_eq!(r.decode(&format!("{good}=")), Err(CursorError::Malformed));
        // An unknown version with an otherwise valid shape.
        let mut b = raw(&good);
        b[0] = 5;
        assert_eq!(
            r.decode(&URL_SAFE_NO_PAD.encode(&b)),
            Err(CursorError::UnknownVersion)
        );
        let other = ring(4, 9);
        assert_eq!(other.decode(&good), Err(CursorError::UnknownKey));
        let mut b = raw(&good);
        let last = b.len() - 1;
        b[last] ^= 1;
        assert_eq!(
            r.decode(&URL_SAFE_NO_PAD.encode(&b)),
            Err(CursorError::BadMac)
        );
        // Validly signed but structurally wrong bodies.
        let head = |kind: u8| {
            let mut v = vec![0u8; 16];
            v.push(kind);
            v
        };
        let mut bad_kind = head(9);
        bad_kind.extend_from_slice(&[1, NOT_EMBEDDED]);
        let mut trailing = head(0);
        trailing.extend_from_slice(&[1, NOT_EMBEDDED, 0]);
        let mut nonminimal = head(0);
        nonminimal.extend_from_slice(&[0x81, 0x00, NOT_EMBEDDED]);
        let mut overflow = head(0);
        overflow.extend_from_slice(&[0xFF; 9]);
        overflow.extend_from_slice(&[0x02, NOT_EMBEDDED]);
        let mut bad_len = head(0);
        bad_len.extend_from_slice(&[1, 129, b'a']);
        let mut bad_utf8 = head(0);
        bad_utf8.extend_from_slice(&[1, 1, 0xFF]);
        let mut short_id = head(0);
        short_id.extend_from_slice(&[1, 5, b'a']);
        for body in [
            bad_kind, trailing, nonminimal, overflow, bad_len, bad_utf8, short_id,
        ] {
            let text = signed(9, 3, &body);
            assert_eq!(r.decode(&text), Err(CursorError::Malformed), "{body:?}");
        }
        let mut ok = head(0);
        ok.extend_from_slice(&[0x80, 0x01, NOT_EMBEDDED]);
        assert!(matches!(r.decode(&signed(9, 3, &ok)), Ok(d) if d.seq == 128));
    }

    #[test]
    fn every_new_cursor_is_version_3_with_a_blake3_keyed_tag() {
        let r = ring(3, 9);
        let k3 = blake3::derive_key(K3_CONTEXT, &[9; 32]);
        for id in [
            None,
            Some(""),
            Some("ev-1"),
            Some(&*"l".repeat(MAX_REPLICA_ID_BYTES)),
        ] {
            let b = raw(&r.encode(&sample(id)));
            assert_eq!(b[0], CURSOR_VERSION);
            let (body, tag) = b.split_at(b.len() - MAC_BYTES);
            assert_eq!(tag, &blake3::keyed_hash(&k3, body).as_bytes()[..MAC_BYTES]);
        }
        // K₃ is neither the secret nor the HMAC key use of it.
        assert_ne!(k3, [9; 32]);
    }

    #[test]
    fn legacy_cursors_verify_for_one_rotation_window() {
        let r = ring(3, 9);
        let long = "l".repeat(40);
        let want = [Some("ev-1"), Some(long.as_str()), None];
        for (text, id) in LEGACY.iter().zip(want) {
            let d = r.decode(text);
            assert!(matches!(&d, Ok(d) if same(&sample(id), d)), "{text}: {d:?}");
        }
        assert_eq!(raw(LEGACY[0])[0], CURSOR_VERSION_ONE_BLOCK);
        assert_eq!(raw(LEGACY[1])[0], CURSOR_VERSION_HMAC);
        // After the window the operator turns them off: they become unknown versions.
        let strict = ring(3, 9).with_legacy_macs(false);
        for text in LEGACY {
            assert_eq!(strict.decode(text), Err(CursorError::UnknownVersion));
        }
        assert!(strict.decode(&strict.encode(&sample(Some("ev-1")))).is_ok());
    }

    #[test]
    fn one_block_tag_is_truncated_sha256_of_k2_and_body() {
        // The fast path computes exactly SHA-256(K₂ ‖ body), from a precomputed chaining value.
        let hmac = <Hmac<Sha256> as KeyInit>::new_from_slice(&[9; 32]).unwrap();
        let k2 = derive_k2(&hmac);
        let st = one_block_state(&k2);
        for len in [0usize, 1, 21, 54, 55] {
            let body: Vec<u8> = (0..len as u8).collect();
            let mut whole = k2.to_vec();
            whole.extend_from_slice(&body);
            let want = Sha256::digest(&whole);
            assert_eq!(
                one_block_tag(&st, &body).map(|t| t.to_vec()),
                Some(want[..MAC_BYTES].to_vec()),
                "{len}"
            );
        }
        assert_eq!(one_block_tag(&st, &[0; ONE_BLOCK + 1]), None);
        // The two halves of K₂ differ from each other and from the secret's HMAC use.
        assert_ne!(k2[..32], k2[32..]);
        assert!(ct_eq(b"abc", b"abc") && !ct_eq(b"abc", b"abd") && !ct_eq(b"ab", b"abc"));
    }

    #[test]
    fn versions_cannot_be_swapped_or_stretched() {
        let r = ring(3, 9);
        let relabel = |text: &str, v: u8| {
            let mut b = raw(text);
            b[0] = v;
            URL_SAFE_NO_PAD.encode(&b)
        };
        // A version-3 cursor relabelled as a legacy version fails that version's MAC.
        let v3 = r.encode(&sample(Some("ev-1")));
        for v in [CURSOR_VERSION_HMAC, CURSOR_VERSION_ONE_BLOCK] {
            assert_eq!(r.decode(&relabel(&v3, v)), Err(CursorError::BadMac), "{v}");
        }
        // Legacy cursors relabelled as another version fail too.
        for (text, v) in [
            (LEGACY[0], CURSOR_VERSION),
            (LEGACY[0], CURSOR_VERSION_HMAC),
            (LEGACY[1], CURSOR_VERSION),
        ] {
            assert_eq!(r.decode(&relabel(text, v)), Err(CursorError::BadMac), "{v}");
        }
        // A longer-than-one-block body is never a version-2 cursor, whatever its tag.
        assert_eq!(
            r.decode(&relabel(LEGACY[1], CURSOR_VERSION_ONE_BLOCK)),
            Err(CursorError::Malformed)
        );
    }

    #[test]
    fn key_rotation() {
        let old = ring(1, 0x11);
        let text = old.encode(&sample(Some("a")));
        let rotated = Keyring::new(key(2, 0x22), vec![key(1, 0x11)]).unwrap();
        assert_eq!(rotated.active_id(), 2);
        assert!(matches!(rotated.decode(&text), Ok(d) if d.key_id == 1));
        let fresh = rotated.encode(&sample(Some("a")));
        assert!(matches!(rotated.decode(&fresh), Ok(d) if d.key_id == 2));
        assert_eq!(ring(2, 0x22).decode(&text), Err(CursorError::UnknownKey));
        assert_eq!(old.decode(&fresh), Err(CursorError::UnknownKey));
    }

    #[test]
    fn same_key_id_other_secret_is_bad_mac() {
        let text = ring(5, 0x01).encode(&sample(None));
        assert_eq!(ring(5, 0x02).decode(&text), Err(CursorError::BadMac));
    }

    #[test]
    fn duplicate_key_ids_are_refused() {
        assert_eq!(
            Keyring::new(key(1, 1), vec![key(2, 2), key(1, 3)]).err(),
            Some(KeyringError::DuplicateKeyId(1))
        );
        assert!(format!("{:?}", key(1, 0x41)).contains("redacted"));
    }

    #[test]
    fn session_helpers() {
        // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
        assert_eq!(session_key(b"abc"), "ba7816bf8f01cfea414140de5dae2223");
        assert_eq!(
            session_binding_and_key(b"abc"),
            (session_binding(b"abc"), session_key(b"abc"))
        );
        assert_eq!(
            session_binding(b"abc"),
            [0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea]
        );
        let d = DecodedCursor {
            request_id: None,
            key_id: 0,
            session: session_binding(b"abc"),
            incarnation: 0,
            kind: StreamKind::Get,
            seq: 0,
            replica_event_id: None,
        };
        assert!(d.is_bound_to(b"abc"));
        assert!(!d.is_bound_to(b"abd"));
        assert_eq!(incarnation_hex(0xdead_beef), "00000000deadbeef");
        assert_eq!(parse_incarnation_hex("00000000deadbeef"), Some(0xdead_beef));
        assert_eq!(
            parse_incarnation_hex(&incarnation_hex(u64::MAX)),
            Some(u64::MAX)
        );
        for bad in [
            "00000000DEADBEEF",
            "deadbeef",
            "+0000000deadbeef",
            "00000000deadbeeg",
            "",
        ] {
            assert_eq!(parse_incarnation_hex(bad), None, "{bad}");
        }
        assert_eq!(CursorError::BadMac.to_string(), "bad_mac");
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod props {
        use super::*;
        use proptest::prelude::*;

        fn kind() -> impl Strategy<Value = StreamKind> {
            prop_oneof![Just(StreamKind::Get), Just(StreamKind::Request)]
        }

        fn fields() -> impl Strategy<Value = ([u8; 8], u64, StreamKind, u64, Option<String>)> {
            (
                any::<[u8; 8]>(),
                any::<u64>(),
                kind(),
                prop_oneof![any::<u64>(), 0u64..300],
                proptest::option::of(".{0,140}"),
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn round_trips((session, incarnation, kind, seq, replica) in fields(), id in any::<u8>(), fill in any::<u8>()) {
                let r = ring(id, fill);
                let c = Cursor { session, incarnation, kind, seq, replica_event_id: replica.as_deref(), request_id: None };
                let text = r.encode(&c);
                prop_assert!(text.len() <= MAX_CURSOR_CHARS);
                let d = r.decode(&text);
                prop_assert!(d.is_ok(), "{:?}", d);
                let d = d.unwrap();
                let embeds = replica.as_ref().is_some_and(|s| s.len() <= MAX_REPLICA_ID_BYTES);
                prop_assert_eq!(d.replica_event_id.is_some(), embeds);
                if embeds {
                    prop_assert!(same(&c, &d));
                }
                prop_assert_eq!((d.session, d.incarnation, d.kind, d.seq, d.key_id), (session, incarnation, kind, seq, id));
            }

            #[test]
            fn any_bit_flip_is_rejected((session, incarnation, kind, seq, replica) in fields(), bit in any::<prop::sample::Index>()) {
                let r = ring(1, 0x5A);
                let c = Cursor { session, incarnation, kind, seq, replica_event_id: replica.as_deref(), request_id: None };
                let mut b = raw(&r.encode(&c));
                let i = bit.index(b.len() * 8);
                b[i / 8] ^= 1 << (i % 8);
                prop_assert!(r.decode(&URL_SAFE_NO_PAD.encode(&b)).is_err());
            }

            #[test]
            fn any_truncation_is_rejected((session, incarnation, kind, seq, replica) in fields(), cut in any::<prop::sample::Index>()) {
                let r = ring(1, 0x5A);
                let c = Cursor { session, incarnation, kind, seq, replica_event_id: replica.as_deref(), request_id: None };
                let text = r.encode(&c);
                let bytes = raw(&text);
                let keep = cut.index(bytes.len());
                prop_assert!(r.decode(&URL_SAFE_NO_PAD.encode(&bytes[..keep])).is_err());
                let keep_chars = cut.index(text.len());
                prop_assert!(r.decode(&text[..keep_chars]).is_err());
            }

            #[test]
            fn other_key_is_rejected((session, incarnation, kind, seq, replica) in fields(), a in any::<[u8; 32]>(), b in any::<[u8; 32]>()) {
                prop_assume!(a != b);
                let ra = Keyring::new(Key { id: 1, secret: a.to_vec() }, vec![]).unwrap();
                let rb = Keyring::new(Key { id: 1, secret: b.to_vec() }, vec![]).unwrap();
                let c = Cursor { session, incarnation, kind, seq, replica_event_id: replica.as_deref(), request_id: None };
                prop_assert_eq!(rb.decode(&ra.encode(&c)), Err(CursorError::BadMac));
            }

            #[test]
            fn random_text_never_panics(s in "\\PC{0,300}", t in "[A-Za-z0-9_-]{0,240}") {
                let r = ring(1, 0x5A);
                let _ = r.decode(&s);
                // Mostly well-formed base64 reaches the MAC check.
                prop_assert!(r.decode(&t).is_err());
            }
        }
    }
}
