//! A request whose `Mcp-Session-Id` cannot name a session is refused before any replica sees
//! it: an empty one would otherwise pass a proxy rate limit on POSTs without the header.
use super::*;

fn post(session_ids: &[&[u8]]) -> Headers {
    let mut h = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("content-type", "application/json"),
    ]);
    h.extend(
        session_ids
            .iter()
            .map(|v| ("mcp-session-id".to_string(), v.to_vec())),
    );
    h
}

/// Sends `h` through a fresh exchange: its action and effects.
fn send(w: &mut Worker, h: &[(String, Vec<u8>)]) -> (Action, MockHost) {
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let a = rq(&mut ex, w, &mut host, h);
    (a, host)
}

/// Asserts a 400 refusal naming `reason` that a client settles its call with, and that nothing
/// was forwarded, asked or changed on the request.
fn assert_refused(a: Action, host: &MockHost, reason: Reason, case: &str) {
    assert_eq!(a, Action::Pause, "{case}");
    let local = host.effects.iter().find_map(|e| match e {
        Effect::LocalResponse {
            status,
            headers,
            body,
        } => Some((*status, headers.clone(), body.clone())),
        _ => None,
    });
    let Some((status, headers, body)) = local else {
        panic!("{case}: no local answer in {:?}", host.effects)
    };
    assert_eq!(status, 400, "{case}");
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(
        header("content-type").as_deref(),
        Some("application/json"),
        "{case}"
    );
    let want = format!("rejected; reason={reason}");
    assert_eq!(header(MCP_RESUME_HEADER), Some(want), "{case}");
    // The SDK clients answer a 4xx JSON-RPC error with `id: null` as the call's own error.
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["jsonrpc"], "2.0", "{case}");
    assert!(v["id"].is_null(), "{case}");
    assert_eq!(v["error"]["code"], REFUSED_CODE, "{case}");
    assert_eq!(v["error"]["data"]["reason"], reason.as_str(), "{case}");
    let text = v["error"]["message"].as_str().unwrap_or_default();
    assert!(text.contains("Mcp-Session-Id"), "{case}: {text}");
    assert!(
        !host.effects.iter().any(|e| matches!(
            e,
            Effect::SetRequestHeader(..) | Effect::Dispatch { .. } | Effect::ResumeRequest
        )),
        "{case}: {:?}",
        host.effects
    );
    assert_eq!(host.stat(Stat::Refused(reason)), 1, "{case}");
}

#[test]
fn a_session_id_outside_visible_ascii_never_reaches_a_replica() {
    let mut w = worker();
    let bad: [&[u8]; 8] = [
        b"",
        b" ",
        b"s 1",
        b"s\t1",
        b"s-1\x7f",
        b"\x00",
        "s-\u{e9}".as_bytes(),
        b"s-1\xff",
    ];
    for sid in bad {
        let (a, host) = send(&mut w, &post(&[sid]));
        assert_refused(a, &host, Reason::BadSessionId, &format!("POST {sid:?}"));
        let mut h = get(&[]);
        h.retain(|(k, _)| k != "mcp-session-id");
        h.push(("mcp-session-id".into(), sid.to_vec()));
        let (a, host) = send(&mut w, &h);
        assert_refused(a, &host, Reason::BadSessionId, &format!("GET {sid:?}"));
    }
}

#[test]
fn a_cursor_with_an_empty_session_id_is_refused_before_any_callout() {
    let mut w = worker();
    let c = cursor(&w, 42, 7, "e7");
    let mut h = hdrs(&[
        (":method", "GET"),
        (":path", "/mcp"),
        ("mcp-session-id", ""),
    ]);
    h.extend(hdrs(&[("last-event-id", &c)]));
    let (a, host) = send(&mut w, &h);
    assert_refused(a, &host, Reason::BadSessionId, "GET with a cursor");
    assert_eq!(host.stat(Stat::CursorsSeen), 0);
}

#[test]
fn a_repeated_session_id_never_reaches_a_replica() {
    let mut w = worker();
    let cases: [&[&[u8]]; 3] = [&[b"s-1", b"s-1"], &[b"", b"s-1"], &[b"s-1", b"s-2", b"s-3"]];
    for sids in cases {
        let (a, host) = send(&mut w, &post(sids));
        assert_refused(a, &host, Reason::DuplicateHeader, &format!("{sids:?}"));
    }
    // With a cursor as well: refused outright, never stripped and forwarded.
    let c = cursor(&w, 42, 7, "e7");
    let (a, host) = send(
        &mut w,
        &get(&[("last-event-id", &c), ("mcp-session-id", "s-2")]),
    );
    assert_refused(a, &host, Reason::DuplicateHeader, "GET with a cursor");
}

#[test]
fn valid_or_absent_session_ids_go_on() {
    let mut w = worker();
    let long = "~".repeat(4096);
    let good: [&[u8]; 5] = [b"!", b"~", b"s-1", long.as_bytes(), b"a\"b\\c,d;e"];
    for sid in good {
        let (a, host) = send(&mut w, &post(&[sid]));
        assert_eq!(a, Action::Continue, "{sid:?}");
        assert!(
            !host
                .effects
                .iter()
                .any(|e| matches!(e, Effect::LocalResponse { .. })),
            "{sid:?}"
        );
    }
    let (a, host) = send(&mut w, &post(&[]));
    assert_eq!(a, Action::Continue);
    assert_eq!(host.stat(Stat::Rejected), 0);
    // Not an MCP path: not the guard's to judge.
    let h = hdrs(&[
        (":method", "POST"),
        (":path", "/health"),
        ("mcp-session-id", ""),
    ]);
    let (a, host) = send(&mut w, &h);
    assert_eq!(a, Action::Continue);
    assert!(host.effects.is_empty());
}
