//! The `retry:` hint (`client_retry_ms`): at the head of every request stream the guard relays,
//! invisible to the client application (no event, no last event id), and only there.
use super::*;
use crate::eventsource::{Dispatch, Parser};

const HINT: u64 = 250;

fn hinted() -> Worker {
    Worker::new(config(&format!(r#","client_retry_ms":{HINT}"#)))
}

/// What a client's parser makes of a body: events, last event id, reconnection time.
fn client(body: &[u8]) -> (Vec<Dispatch>, String, Option<u64>) {
    let mut p = Parser::new();
    let mut events = Vec::new();
    p.feed(body, &mut events);
    (events, p.last_event_id().to_string(), p.retry())
}

/// The body a client reads for a fresh POST answered as SSE with `chunks`.
fn post_answer(w: &mut Worker, chunks: &[&[u8]]) -> Vec<u8> {
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let req = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    rq(&mut ex, w, &mut host, &req);
    ex.on_request_body(
        Some(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#),
        true,
    );
    rs(&mut ex, w, &mut host, &sse_ok());
    for (i, c) in chunks.iter().enumerate() {
        bd(&mut ex, w, &mut host, c, i + 1 == chunks.len());
    }
    host.body()
}

/// The body a client reads for a continuation of a `kind` stream at its recorded head.
fn continuation(w: &mut Worker, kind: StreamKind, body: &[u8]) -> Vec<u8> {
    let mut host = MockHost::new();
    let c = w.config.keyring.encode(&Cursor {
        request_id: Some("1"),
        session: crate::cursor::session_binding(SID.as_bytes()),
        incarnation: 42,
        kind,
        seq: 3,
        replica_event_id: Some("e3"),
    });
    let verdict = format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":[],"head":3}}"#);
    let (mut ex, _) = resume(w, &mut host, &c, &verdict);
    rs(&mut ex, w, &mut host, &sse_ok());
    bd(&mut ex, w, &mut host, body, false);
    host.body()
}

const BODY: &[u8] = b"id: r1\ndata: {\"result\":1}\n\n";

#[test]
fn a_posts_sse_answer_starts_with_the_hint_and_dispatches_the_same() {
    let plain = post_answer(&mut worker(), &[BODY]);
    let with = post_answer(&mut hinted(), &[BODY]);
    assert!(with.starts_with(b"retry: 250\n\n"), "{with:?}");
    let (events, last, retry) = client(&with);
    assert_eq!((events.len(), retry), (1, Some(HINT)));
    assert_eq!((events, last), {
        let (e, l, r) = client(&plain);
        assert_eq!(r, None);
        (e, l)
    });
}

#[test]
fn a_request_streams_continuation_carries_the_hint_a_get_streams_does_not() {
    let body = b"id: e4\ndata: 4\n\n";
    let req = continuation(&mut hinted(), StreamKind::Request, body);
    assert!(req.starts_with(b"retry: 250\n\n"), "{req:?}");
    assert_eq!(client(&req).2, Some(HINT));
    assert_eq!(client(&req).0.len(), 1);
    let get = continuation(&mut hinted(), StreamKind::Get, body);
    assert_eq!(client(&get).2, None, "{get:?}");
    assert_eq!(client(&get).0.len(), 1);
    // A fresh GET stream: none either.
    let mut w = hinted();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get_headers());
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(&mut ex, &mut w, &mut host, body, false);
    assert_eq!(client(&host.body()).2, None);
    // Not configured: no hint anywhere.
    let plain = continuation(&mut worker(), StreamKind::Request, body);
    assert_eq!(client(&plain).2, None, "{plain:?}");
}

fn get_headers() -> Headers {
    get(&[])
}

#[test]
fn a_leading_bom_never_ends_up_in_a_field_name() {
    // The client strips one BOM at the very start only: after the hint it would turn `data`
    // into "\u{FEFF}data", an unknown field, and the event would vanish.
    let body = b"\xEF\xBB\xBFdata: {\"result\":1}\nid: r1\n\n";
    for split in [1, 2, 3, 4, 10] {
        let (a, b) = body.split_at(split);
        let with = client(&post_answer(&mut hinted(), &[a, b]));
        let (events, last, _) = client(&post_answer(&mut worker(), &[a, b]));
        assert_eq!(with.0.len(), 1, "split at {split}: {with:?}");
        assert_eq!(with.0[0].data, r#"{"result":1}"#);
        assert_eq!((with.0, with.1, with.2), (events, last, Some(HINT)));
    }
}

#[test]
fn the_servers_own_later_retry_wins() {
    let with = post_answer(&mut hinted(), &[b"retry: 3000\n\n", BODY]);
    assert_eq!(client(&with).2, Some(3000));
}

#[cfg(not(target_arch = "wasm32"))]
mod props {
    use super::*;
    use crate::sse::tests::props::{split, stream};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, cases: 256, ..ProptestConfig::default() })]

        /// Whatever the answer and however it is chunked, the hint changes only the client's
        /// reconnection time: the same events, the same last event id.
        #[test]
        fn the_hint_changes_nothing_but_the_reconnection_time(
            body in stream(),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let chunks = split(&body, &cuts);
            let (events, last, retry) = client(&post_answer(&mut worker(), &chunks));
            let (h_events, h_last, h_retry) = client(&post_answer(&mut hinted(), &chunks));
            prop_assert_eq!(h_events, events);
            prop_assert_eq!(h_last, last);
            prop_assert_eq!(h_retry, retry.or(Some(HINT)));
        }
    }
}
