//! `cursor_decode`: the `Last-Event-ID` decoder, on three kinds of input chosen by the first byte:
//! - 0: the rest is a cursor *body* (version byte and key id first), signed here with HMAC
//!   (legacy version 1, which still verifies), so that the strict field parser behind the MAC is
//!   reached (the parser is the same for every version);
//! - 1: the rest is the fields of a cursor to encode, which must decode back to them;
//! - anything else: the rest is the header value as text.
//!
//! Whatever decodes is canonical: re-encoding the decoded fields gives the same body bytes.
use arbitrary::{Arbitrary, Unstructured};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use mcp_resume_core::cursor::{
    Cursor, CursorError, DecodedCursor, CURSOR_VERSION, CURSOR_VERSION_HMAC,
    CURSOR_VERSION_ONE_BLOCK, CURSOR_VERSION_REQUEST, MAC_BYTES, MAX_CURSOR_CHARS,
    MAX_REPLICA_ID_BYTES,
};
use mcp_resume_core::ownership::StreamKind;
use sha2::Sha256;

use crate::keys::{keyring, secret, ACTIVE, VERIFY_ONLY};

pub fn cursor_decode(data: &[u8]) {
    match data.split_first() {
        Some((0, body)) => signed_body(body),
        Some((1, rest)) => encode_decode(rest),
        Some((_, text)) => text_value(&String::from_utf8_lossy(text)),
        None => text_value(""),
    }
}

fn text_value(text: &str) {
    let r = keyring().decode(text);
    if text.len() > MAX_CURSOR_CHARS {
        assert_eq!(r, Err(CursorError::TooLong));
    }
    if let Ok(d) = r {
        let raw = URL_SAFE_NO_PAD.decode(text).unwrap_or_default();
        assert_canonical(&raw, &d);
    }
}

fn signed_body(body: &[u8]) {
    // Sign with the key the body names when the ring has it, so both keys are exercised.
    let key_id = body.get(1).copied().unwrap_or(ACTIVE);
    let mut raw = vec![CURSOR_VERSION_HMAC, key_id];
    raw.extend_from_slice(body.get(2..).unwrap_or_default());
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(&secret(key_id)) else {
        return;
    };
    mac.update(&raw);
    let tag = mac.finalize().into_bytes();
    raw.extend_from_slice(tag.get(..MAC_BYTES).unwrap_or_default());
    let text = URL_SAFE_NO_PAD.encode(&raw);
    let r = keyring().decode(&text);
    if text.len() > MAX_CURSOR_CHARS {
        assert_eq!(r, Err(CursorError::TooLong));
        return;
    }
    match &r {
        Ok(d) => assert_canonical(&raw, d),
        Err(e) => {
            // The tag is right for either key the ring holds; only the body can be wrong.
            let known = key_id == ACTIVE || key_id == VERIFY_ONLY;
            let allowed: &[CursorError] = if known {
                &[CursorError::Malformed]
            } else {
                &[CursorError::Malformed, CursorError::UnknownKey]
            };
            assert!(allowed.contains(e), "{e:?} for key {key_id}");
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Fields {
    session: [u8; 8],
    incarnation: u64,
    request: bool,
    seq: u64,
    replica: Option<String>,
}

fn encode_decode(rest: &[u8]) {
    let Ok(f) = Fields::arbitrary_take_rest(Unstructured::new(rest)) else {
        return;
    };
    let c = Cursor {
        request_id: None,
        session: f.session,
        incarnation: f.incarnation,
        kind: if f.request {
            StreamKind::Request
        } else {
            StreamKind::Get
        },
        seq: f.seq,
        replica_event_id: f.replica.as_deref(),
    };
    let text = keyring().encode(&c);
    assert!(text.len() <= MAX_CURSOR_CHARS, "{} chars", text.len());
    assert!(text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    let d = keyring().decode(&text);
    let embeds = c
        .replica_event_id
        .filter(|r| r.len() <= MAX_REPLICA_ID_BYTES);
    let want = DecodedCursor {
        request_id: None,
        key_id: ACTIVE,
        session: c.session,
        incarnation: c.incarnation,
        kind: c.kind,
        seq: c.seq,
        replica_event_id: embeds.map(str::to_owned),
    };
    assert_eq!(d, Ok(want));
}

/// `raw` decoded to `d`: the fields re-encoded give the same bytes between the key id and the
/// MAC (new cursors are version 3, or 4 with a request id; legacy versions 1 and 2 only verify).
fn assert_canonical(raw: &[u8], d: &DecodedCursor) {
    assert!(d.key_id == ACTIVE || d.key_id == VERIFY_ONLY);
    let c = Cursor {
        request_id: d.request_id.as_deref(),
        session: d.session,
        incarnation: d.incarnation,
        kind: d.kind,
        seq: d.seq,
        replica_event_id: d.replica_event_id.as_deref(),
    };
    let again = URL_SAFE_NO_PAD
        .decode(keyring().encode(&c))
        .unwrap_or_default();
    let body = |b: &[u8]| {
        b.get(2..b.len().saturating_sub(MAC_BYTES))
            .map(<[u8]>::to_vec)
    };
    assert_eq!(body(raw), body(&again), "decoded body is not canonical");
    let version = raw.first().copied();
    assert!(
        [
            CURSOR_VERSION,
            CURSOR_VERSION_REQUEST,
            CURSOR_VERSION_HMAC,
            CURSOR_VERSION_ONE_BLOCK
        ]
        .map(Some)
        .contains(&version),
        "{version:?}"
    );
    let minted = if d.request_id.is_some() {
        CURSOR_VERSION_REQUEST
    } else {
        CURSOR_VERSION
    };
    assert_eq!(
        again.first().copied(),
        Some(minted),
        "new cursors are version 3, or 4 with a request id"
    );
    assert_eq!(
        keyring()
            .decode(&URL_SAFE_NO_PAD.encode(&again))
            .as_ref()
            .map(|x| (
                x.session,
                x.incarnation,
                x.kind,
                x.seq,
                x.replica_event_id.clone()
            )),
        Ok((
            d.session,
            d.incarnation,
            d.kind,
            d.seq,
            d.replica_event_id.clone()
        ))
    );
}
