//! Nothing pending without an end: a fresh request stream that ends with nothing settles its
//! call; a continuation whose owner sends headers and then no event is answered at the deadline.
use super::*;

/// A fresh POST (request id 9) answered `200 text/event-stream`, whose body is `body` then ends.
fn fresh_post_ending(body: &str) -> (MockHost, String) {
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let post = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    rq(&mut ex, &mut w, &mut host, &post);
    let call = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#;
    ex.on_request_body(Some(call.as_bytes()), true);
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(&mut ex, &mut w, &mut host, body.as_bytes(), false);
    bd(&mut ex, &mut w, &mut host, b"", true);
    let out = body_str(&host);
    (host, out)
}

#[test]
fn a_fresh_request_stream_that_ends_with_nothing_settles_its_call() {
    for body in ["", ": keep-alive\n\n", "retry: 1000\n\n", "event: x\n\n"] {
        let (host, out) = fresh_post_ending(body);
        let signal = control_event(Reason::ResponseMissing);
        assert!(out.starts_with(&format!("{body}{signal}")), "{out}");
        let msgs = messages(&out);
        assert_eq!(msgs.len(), 1, "{out}");
        assert_eq!(msgs[0]["id"], serde_json::json!(9));
        assert_eq!(msgs[0]["error"]["data"]["reason"], "response_missing");
        assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 1);
    }
}

#[test]
fn a_fresh_request_stream_with_a_priming_id_or_an_answer_is_left_alone() {
    // A priming event: the client resumes from its cursor (SEP-1699 polling).
    // An answer without an id, or a bare `id:`: something came; the guard cannot tell more.
    for body in [
        "id: p1\ndata:\n\n",
        "data: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{}}\n\n",
        "id:\ndata: x\n\n",
    ] {
        let (host, out) = fresh_post_ending(body);
        assert!(!out.contains("mcp-resume"), "{out}");
        assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 0);
    }
    // A GET stream that ends empty is an ordinary end.
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get(&[]));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(&mut ex, &mut w, &mut host, b"", true);
    assert_eq!(body_str(&host), "");
}
