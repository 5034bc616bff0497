//! A signal after half an event: where the output ends inside a block longer than the hold bound
//! (streamed) and the stream can still be written, the block is closed as an event no client
//! dispatches as a message, then the control event and the settling answer follow; no reset.
use super::*;
use crate::eventsource::{parse, Dispatch};
use crate::sse::DISCARDED_EVENT;

/// What the client model dispatches from `out`.
fn dispatched(out: &str) -> Vec<Dispatch> {
    parse(&[out.as_bytes()]).0
}

/// The JSON-RPC messages a client application takes from `out` (untyped or `message` events).
fn app_messages(out: &str) -> Vec<serde_json::Value> {
    dispatched(out)
        .into_iter()
        .filter(|d| d.event.is_empty() || d.event == "message")
        .map(|d| serde_json::from_str(&d.data).unwrap_or(serde_json::Value::Null))
        .collect()
}

/// Event types the client model dispatches from `out`.
fn types(out: &str) -> Vec<String> {
    dispatched(out).into_iter().map(|d| d.event).collect()
}

/// A fresh POST (request id 9) answered `200 text/event-stream` with `chunks`, the last one
/// ending it.
fn fresh_post(chunks: &[&str]) -> (MockHost, String) {
    fresh_call_chunks(r#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#, chunks)
}

#[test]
fn a_fresh_request_stream_that_ends_inside_a_long_event_is_closed_and_settled() {
    let big = "x".repeat(200_000);
    // Whatever line the output ends in: a data line, after LF or CR, a `retry:` cut short.
    for tail in ["", "\n", "\r", "\ndata: more", "\nretry: 1", "\nev"] {
        let body = format!("data: {big}{tail}");
        for chunks in [vec![body.as_str(), ""], vec![body.as_str()]] {
            let (host, out) = fresh_post(&chunks);
            let how = format!("{tail:?} in {} chunk(s)", chunks.len());
            let signal = control_event(Reason::ResponseMissing);
            let closed = format!("event: {DISCARDED_EVENT}\n\n{signal}");
            assert!(out.contains(&closed), "{how}: {}", &out[200_000..]);
            assert_eq!(
                types(&out),
                [DISCARDED_EVENT, "mcp-resume", "message"],
                "{how}"
            );
            // The only message is the settling error, for the client's own request id.
            let msgs = app_messages(&out);
            assert_eq!(msgs.len(), 1, "{how}");
            assert_eq!(msgs[0]["id"], serde_json::json!(9), "{how}");
            assert_eq!(msgs[0]["error"]["data"]["reason"], "response_missing");
            assert!(!host.effects.contains(&Effect::ResetResponse), "{how}");
            assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 1);
            assert_eq!(parse(&[out.as_bytes()]).1, "", "no cursor to resume from");
        }
    }
}

/// Resumes a request stream (call 7) as branch 1 of a registered incarnation whose records hold
/// nothing after event 3, with a hold bound of 1024 bytes, and sends `body`, ending it.
fn held_branch_ending(body: &str) -> (Worker, MockHost, Exchange) {
    let mut w = Worker::new(config(r#","max_event_hold_bytes":1024"#));
    let mut host = MockHost::new();
    let c = w.config.keyring.encode(&Cursor {
        session: crate::cursor::session_binding(SID.as_bytes()),
        incarnation: 42,
        kind: StreamKind::Request,
        seq: 3,
        replica_event_id: Some("e3"),
        request_id: Some("7"),
    });
    let (mut ex, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 3, 1));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    host.take();
    assert_eq!(
        bd(&mut ex, &mut w, &mut host, body.as_bytes(), true),
        Action::Pause
    );
    (w, host, ex)
}

#[test]
fn a_held_branch_end_inside_a_long_event_is_closed_then_signalled() {
    let body = format!("id: e4\ndata: {}", "x".repeat(3000));
    for (answer, reason) in [
        (None, Reason::OwnershipUnavailable),
        (Some(r#"{"forked":true}"#), Reason::Forked),
    ] {
        let (mut w, mut host, mut ex) = held_branch_ending(&body);
        let streamed = body_str(&host);
        assert!(streamed.len() > 1024, "the long event streams");
        answer_end(&mut ex, &mut w, &mut host, answer);
        let tail = held_tail(&host.effects).expect("the end goes out");
        let want = format!("x\nevent: {DISCARDED_EVENT}\n\n{}", control_event(reason));
        assert_eq!(tail, want, "{reason:?}");
        assert!(!host.effects.contains(&Effect::ResetResponse));
        let out = format!("{streamed}{tail}");
        assert_eq!(types(&out), [DISCARDED_EVENT, "mcp-resume"], "{reason:?}");
    }
}

#[test]
fn a_cut_inside_a_long_event_is_closed_then_signalled() {
    // The host loses a chunk after part of a long event went out.
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = open_fresh_call(
        &mut w,
        &mut host,
        br#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#,
    );
    let part = format!("data: {}", "x".repeat(200_000));
    bd(&mut ex, &mut w, &mut host, part.as_bytes(), false);
    ex.on_response_body(&mut w, &mut host, None, false);
    let out = body_str(&host);
    assert_eq!(
        types(&out),
        [DISCARDED_EVENT, "mcp-resume", "message"],
        "{}",
        &out[200_000..]
    );
    let msgs = app_messages(&out);
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["error"]["data"]["reason"], "host_error");
    assert!(!host.effects.contains(&Effect::ResetResponse));
}
