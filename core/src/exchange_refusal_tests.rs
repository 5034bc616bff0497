//! Refusals as the client application hears them: a request stream's pending call settles,
//! every continuation is checked whatever the owner answers, encoded SSE never passes.
use super::*;

const REQ_ID: &str = "7";

fn req_cursor(w: &Worker, inc: u64, seq: u64, id: &str, request_id: Option<&str>) -> String {
    w.config.keyring.encode(&Cursor {
        session: crate::cursor::session_binding(SID.as_bytes()),
        incarnation: inc,
        kind: StreamKind::Request,
        seq,
        replica_event_id: Some(id),
        request_id,
    })
}

/// A local answer: status, headers, body.
type Local = (u16, Vec<(String, String)>, String);

fn local(effects: &[Effect]) -> Option<Local> {
    effects.iter().find_map(|e| match e {
        Effect::LocalResponse {
            status,
            headers,
            body,
        } => Some((
            *status,
            headers.clone(),
            String::from_utf8_lossy(body).into_owned(),
        )),
        _ => None,
    })
}

fn header_of<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The JSON-RPC messages of an SSE body's `message` events.
fn messages(body: &str) -> Vec<serde_json::Value> {
    body.split("\n\n")
        .filter(|b| b.lines().any(|l| l == "event: message"))
        .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// Asserts a settling answer: 200 SSE, the header, the control event, then an error for `id`.
fn assert_settles(effects: &[Effect], reason: Reason, id: serde_json::Value) {
    let Some((status, headers, body)) = local(effects) else {
        panic!("no local answer in {effects:?}")
    };
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header_of(&headers, "content-type"),
        Some("text/event-stream")
    );
    let want = format!("rejected; reason={reason}");
    assert_eq!(header_of(&headers, MCP_RESUME_HEADER), Some(want.as_str()));
    assert!(body.starts_with(&control_event(reason)), "{body}");
    let msgs = messages(&body);
    assert_eq!(msgs.len(), 1, "{body}");
    let m = &msgs[0];
    assert_eq!(m["id"], id, "{body}");
    assert_eq!(m["error"]["code"], REFUSED_CODE);
    assert_eq!(m["error"]["data"]["reason"], reason.as_str());
    let text = m["error"]["message"].as_str().unwrap_or_default();
    assert!(text.contains("outcome is unknown"), "{text}");
}

fn new_stream(reason: Reason) -> String {
    format!(r#"{{"verdict":"new_stream","reason":"{reason}"}}"#)
}

#[test]
fn a_refused_request_stream_cursor_settles_the_pending_call() {
    for reason in [
        Reason::Gap,
        Reason::OwnerUnavailable,
        Reason::SessionInactive,
    ] {
        let mut w = worker();
        let mut host = MockHost::new();
        let c = req_cursor(&w, 42, 3, "e3", Some(REQ_ID));
        let (ex, fx) = resume(&mut w, &mut host, &c, &new_stream(reason));
        assert_settles(&fx, reason, serde_json::json!(7));
        assert!(!fx.contains(&Effect::ResumeRequest), "answered locally");
        assert!(!ex.wants_response_headers());
        assert_eq!(host.stat(Stat::Refused(reason)), 1);
        assert_eq!(host.stat(Stat::Rejected), 1);
    }
    // A string id keeps its type; an unknown id is `null` (Python's client still settles).
    let mut w = worker();
    let mut host = MockHost::new();
    let c = req_cursor(&w, 42, 3, "e3", Some(r#""call-9""#));
    let (_, fx) = resume(&mut w, &mut host, &c, &new_stream(Reason::Gap));
    assert_settles(&fx, Reason::Gap, serde_json::json!("call-9"));
    let c = req_cursor(&w, 42, 3, "e3", None);
    let (_, fx) = resume(&mut w, &mut host, &c, &new_stream(Reason::Gap));
    assert_settles(&fx, Reason::Gap, serde_json::Value::Null);
}

#[test]
fn local_refusals_and_a_down_cluster_settle_too() {
    // Bound to another session: refused before any callout, still settled.
    let mut w = worker();
    let mut host = MockHost::new();
    let other = w.config.keyring.encode(&Cursor {
        session: crate::cursor::session_binding(b"another"),
        incarnation: 1,
        kind: StreamKind::Request,
        seq: 1,
        replica_event_id: Some("e1"),
        request_id: Some(REQ_ID),
    });
    let mut ex = Exchange::new();
    let a = rq(
        &mut ex,
        &mut w,
        &mut host,
        &get(&[("last-event-id", &other)]),
    );
    assert_eq!(a, Action::Pause);
    assert_settles(&host.take(), Reason::SessionMismatch, serde_json::json!(7));
    // The ownership service down: the cursor itself names the call.
    let c = req_cursor(&w, 42, 3, "e3", Some(REQ_ID));
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get(&[("last-event-id", &c)]));
    let (token, _) = host.last_dispatch().unwrap();
    host.take();
    ex.on_callout_response(&mut w, &mut host, token, None, None);
    assert_settles(
        &host.take(),
        Reason::OwnershipUnavailable,
        serde_json::json!(7),
    );
}

#[test]
fn the_409_stays_an_opt_in_policy_and_get_streams_restart() {
    let mut w = Worker::new(config(r#","policy":{"request_stream":"reject"}"#));
    let mut host = MockHost::new();
    let c = req_cursor(&w, 42, 3, "e3", Some(REQ_ID));
    let (_, fx) = resume(&mut w, &mut host, &c, &new_stream(Reason::Gap));
    assert!(matches!(local_reply(&fx), Some((409, b)) if b.contains("\"gap\"")));
    // A standalone GET stream's cursor restarts: no local answer, the cursor is stripped.
    let mut w = worker();
    let c = cursor(&w, 42, 3, "e3");
    let (_, fx) = resume(&mut w, &mut host, &c, &new_stream(Reason::Gap));
    assert!(local_reply(&fx).is_none());
    assert!(removed_req(&fx, "last-event-id"));
}

#[test]
fn a_reset_cursor_is_refused_by_name_before_any_callout() {
    // A replica's bare `id:` on a request stream: the client gets a reset cursor carrying its
    // call's id, not the cursor before (from which the replica would replay this event again).
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = open_fresh_call(
        &mut w,
        &mut host,
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
    );
    let body = b"id: r1\ndata: {}\n\nid:\ndata: {}\n\n";
    bd(&mut ex, &mut w, &mut host, body, false);
    let ids = ids_in(&host.body());
    let decoded: Vec<_> = ids
        .iter()
        .filter_map(|i| w.config.keyring.decode(i).ok())
        .map(|c| (c.seq, c.replica_event_id, c.request_id))
        .collect();
    let seven = Some("7".to_string());
    assert_eq!(
        decoded,
        [
            (1, Some("r1".into()), seven.clone()),
            (2, Some(String::new()), seven)
        ]
    );
    host.take();
    // Resumed from it: settled with the client's id, nobody asked.
    let mut ex = Exchange::new();
    let a = rq(
        &mut ex,
        &mut w,
        &mut host,
        &get(&[("last-event-id", &ids[1])]),
    );
    assert_eq!(a, Action::Pause);
    assert!(host.last_dispatch().is_none(), "no callout");
    assert_settles(&host.take(), Reason::IdReset, serde_json::json!(7));
    assert_eq!(host.stat(Stat::Refused(Reason::IdReset)), 1);
    // A GET stream's reset cursor restarts by name (the default policy), nobody asked.
    let c = cursor(&w, 42, 3, "");
    let mut ex = Exchange::new();
    let a = rq(&mut ex, &mut w, &mut host, &get(&[("last-event-id", &c)]));
    assert_eq!(a, Action::Continue);
    assert!(host.last_dispatch().is_none(), "no callout");
    assert!(removed_req(&host.effects, "last-event-id"));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    assert_eq!(
        set_resp(&host.effects, MCP_RESUME_HEADER).as_deref(),
        Some("restarted; reason=id_reset")
    );
    bd(&mut ex, &mut w, &mut host, b"id: e1\ndata: a\n\n", false);
    assert!(body_str(&host).starts_with(&control_event(Reason::IdReset)));
}

/// A POST whose body arrives in `chunks`, answered with SSE carrying one event `id: r1`;
/// returns the cursor the client saw.
fn post_stream(w: &mut Worker, host: &mut MockHost, chunks: &[&str]) -> String {
    let mut ex = Exchange::new();
    let post = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    assert_eq!(rq(&mut ex, w, host, &post), Action::Continue);
    for (i, c) in chunks.iter().enumerate() {
        assert!(ex.wants_request_body());
        ex.on_request_body(Some(c.as_bytes()), i + 1 == chunks.len());
    }
    rs(&mut ex, w, host, &sse_ok());
    assert!(!ex.wants_request_body());
    bd(&mut ex, w, host, b"id: r1\ndata: {}\n\n", false);
    let ids = ids_in(&host.body());
    host.take();
    ids.into_iter().next().unwrap_or_default()
}

#[test]
fn a_posts_id_is_read_from_its_body_and_rides_in_its_cursors() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = post_stream(
        &mut w,
        &mut host,
        &[
            r#"{"method":"tools/call","params":{"id":1},"#,
            r#""jsonrpc":"2.0","id":42}"#,
        ],
    );
    let d = w.config.keyring.decode(&c);
    assert!(
        matches!(&d, Ok(d) if d.request_id.as_deref() == Some("42") && d.kind == StreamKind::Request),
        "{d:?}"
    );
    // That cursor, refused later, settles call 42 without asking anyone for the id.
    let (_, fx) = resume(&mut w, &mut host, &c, &new_stream(Reason::Superseded));
    assert_settles(&fx, Reason::Superseded, serde_json::json!(42));
    // A body without a usable id: the stream still works, its cursors carry none.
    let c = post_stream(&mut w, &mut host, &[r#"[{"id":1}]"#]);
    assert!(matches!(w.config.keyring.decode(&c), Ok(d) if d.request_id.is_none()));
    // GETs never read a body.
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get(&[]));
    assert!(!ex.wants_request_body());
}

/// A continuation of a request stream (cursor at seq 3 of incarnation 42) with `expected`.
fn continue_request(
    w: &mut Worker,
    host: &mut MockHost,
    expected: &[&str],
) -> (Exchange, Vec<Effect>) {
    let c = req_cursor(w, 42, 3, "e3", Some(REQ_ID));
    let verdict = serde_json::json!({
        "verdict": "continue", "owner": OWNER, "expected": expected, "head": 3 + expected.len(),
    })
    .to_string();
    resume(w, host, &c, &verdict)
}

#[test]
fn a_continuation_answered_without_a_replay_is_refused_by_name() {
    let answers: [(&[(&str, &str)], bool); 6] = [
        (
            &[(":status", "200"), ("content-type", "text/event-stream")],
            true,
        ),
        (
            &[
                (":status", "200"),
                ("content-type", "text/event-stream"),
                ("content-length", "0"),
            ],
            true,
        ),
        (&[(":status", "204")], true),
        (
            &[(":status", "200"), ("content-type", "application/json")],
            false,
        ),
        (&[(":status", "307"), ("location", "/elsewhere")], true),
        (&[(":status", "404")], false),
    ];
    for (answer, eos) in answers {
        let mut w = worker();
        let mut host = MockHost::new();
        let (mut ex, _) = continue_request(&mut w, &mut host, &["e4"]);
        ex.on_response_headers(&mut w, &mut host, Some(&hdrs(answer)), eos);
        assert_settles(&host.effects, Reason::ReplayMissing, serde_json::json!(7));
        assert_eq!(host.stat(Stat::Refused(Reason::ReplayMissing)), 1);
        assert!(!ex.wants_body(), "{answer:?}");
        // A 2xx without the replay shows the log is gone; an error status refuses this resume only.
        let ok = answer.contains(&(":status", "200")) || answer.contains(&(":status", "204"));
        let records = drain_records(&mut w, &mut host);
        assert_eq!(
            records
                .iter()
                .any(|r| matches!(r, Record::StreamLost { .. })),
            ok,
            "{answer:?}: {records:?}"
        );
    }
    // A GET stream's continuation gets the 409.
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 3, "e3");
    let verdict =
        format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":["e4"],"head":4}}"#);
    let (mut ex, _) = resume(&mut w, &mut host, &c, &verdict);
    ex.on_response_headers(&mut w, &mut host, Some(&hdrs(&[(":status", "204")])), true);
    assert!(matches!(local_reply(&host.effects), Some((409, b)) if b.contains("replay_missing")));
}

/// Effects of resuming a stream of `kind` at the recorded head (nothing recorded after it).
fn continue_at_head(w: &mut Worker, host: &mut MockHost, kind: StreamKind) -> Exchange {
    match kind {
        StreamKind::Request => continue_request(w, host, &[]).0,
        StreamKind::Get => {
            let c = cursor(w, 42, 3, "e3");
            let verdict =
                format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":[],"head":3}}"#);
            resume(w, host, &c, &verdict).0
        }
    }
}

#[test]
fn at_the_recorded_head_a_request_streams_call_is_settled_but_no_loss_recorded() {
    // Nothing is recorded after the cursor, yet the call's response is still owed: any answer
    // but a replay settles it (a restarted owner's own 400 left TypeScript hanging for 30 s).
    let answers: [(&[(&str, &str)], bool); 6] = [
        (&[(":status", "204")], true),
        (
            &[(":status", "200"), ("content-type", "text/event-stream")],
            true,
        ),
        (
            &[(":status", "200"), ("content-type", "application/json")],
            false,
        ),
        (
            &[(":status", "400"), ("content-type", "application/json")],
            false,
        ),
        (&[(":status", "307"), ("location", "/elsewhere")], true),
        (&[(":status", "404")], true),
    ];
    for (answer, eos) in answers {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Request);
        ex.on_response_headers(&mut w, &mut host, Some(&hdrs(answer)), eos);
        assert_settles(&host.effects, Reason::ReplayMissing, serde_json::json!(7));
        assert!(!ex.wants_body(), "{answer:?}");
        let records = drain_records(&mut w, &mut host);
        let lost = records
            .iter()
            .any(|r| matches!(r, Record::StreamLost { .. }));
        assert!(!lost, "{answer:?}: {records:?}");
    }
    // A GET stream has no pending call: at its head the owner's own answer passes.
    for answer in [&[(":status", "204")][..], &[(":status", "400")][..]] {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Get);
        ex.on_response_headers(&mut w, &mut host, Some(&hdrs(answer)), true);
        assert!(local_reply(&host.effects).is_none(), "{answer:?}");
        assert_eq!(host.stat(Stat::Refused(Reason::ReplayMissing)), 0);
    }
}

#[test]
fn a_request_continuation_that_ends_without_an_event_settles_its_call() {
    for body in ["", ": keep-alive\n\n", "retry: 1000\n\n"] {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Request);
        rs(&mut ex, &mut w, &mut host, &sse_ok());
        bd(&mut ex, &mut w, &mut host, body.as_bytes(), true);
        let out = body_str(&host);
        let signal = control_event(Reason::ReplayMissing);
        assert!(out.starts_with(&format!("{body}{signal}")), "{out}");
        let msgs = messages(&out);
        assert_eq!(msgs.len(), 1, "{out}");
        assert_eq!(msgs[0]["id"], serde_json::json!(7));
        assert_eq!(msgs[0]["error"]["data"]["reason"], "replay_missing");
        assert_eq!(host.stat(Stat::Refused(Reason::ReplayMissing)), 1);
    }
    // A continuation that relays its call's response ends as the replica ended it.
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Request);
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    let response = "id: e4\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n";
    bd(&mut ex, &mut w, &mut host, response.as_bytes(), true);
    let out = body_str(&host);
    assert!(!out.contains("mcp-resume"), "{out}");
    assert_eq!(host.stat(Stat::Refused(Reason::ReplayMissing)), 0);
    // A GET stream's empty continuation is an ordinary early close.
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Get);
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(&mut ex, &mut w, &mut host, b"", true);
    assert_eq!(body_str(&host), "");
}

#[test]
fn a_registered_empty_request_continuation_settles_once_the_store_answers() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = req_cursor(&w, 42, 3, "e3", Some(REQ_ID));
    let (mut ex, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 3, 2));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    assert_eq!(bd(&mut ex, &mut w, &mut host, b"", true), Action::Pause);
    answer_end(&mut ex, &mut w, &mut host, Some(r#"{"forked":false}"#));
    let tail = held_tail(&host.effects).unwrap_or_default();
    assert!(
        tail.starts_with(&control_event(Reason::ReplayMissing)),
        "{tail}"
    );
    assert_eq!(messages(&tail).len(), 1, "{tail}");
}

#[test]
fn a_hung_owner_is_answered_at_the_deadline() {
    let mut w = worker();
    let mut host = MockHost::new();
    let start = host.now_ms;
    let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Request);
    assert_eq!(ex.deadline_ms(), Some(start + 5000));
    // Early: nothing happens.
    host.now_ms = start + 4999;
    assert!(!ex.on_deadline(&mut w, &mut host));
    assert!(local(&host.effects).is_none());
    // Due: the call is settled, the owner's failure recorded (it may pass: not lost).
    host.now_ms = start + 5000;
    assert!(ex.on_deadline(&mut w, &mut host));
    assert_settles(&host.effects, Reason::OwnerBusy, serde_json::json!(7));
    assert_eq!(host.stat(Stat::Refused(Reason::OwnerBusy)), 1);
    assert_eq!(ex.deadline_ms(), None);
    assert!(!ex.wants_response_headers());
    assert!(!ex.on_deadline(&mut w, &mut host));
    let records = drain_records(&mut w, &mut host);
    assert!(records
        .iter()
        .any(|r| matches!(r, Record::OwnerFailed { .. })));
    assert!(!records
        .iter()
        .any(|r| matches!(r, Record::StreamLost { .. })));
    // A GET stream's resume gets the rejection, by name.
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Get);
    host.now_ms += 5000;
    assert!(ex.on_deadline(&mut w, &mut host));
    let (status, headers, _) = local(&host.effects).expect("no answer");
    assert_eq!(status, 409);
    let want = Some("rejected; reason=owner_busy");
    assert_eq!(header_of(&headers, MCP_RESUME_HEADER), want);
}

#[test]
fn the_deadline_is_configured_and_ends_with_the_owners_headers_or_the_stream() {
    let mut w = Worker::new(config(r#","continuation_headers_timeout_ms":250"#));
    let mut host = MockHost::new();
    let start = host.now_ms;
    // No deadline before a continuation goes to its owner.
    assert_eq!(Exchange::new().deadline_ms(), None);
    let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Get);
    assert_eq!(ex.deadline_ms(), Some(start + 250));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    assert_eq!(ex.deadline_ms(), None);
    host.now_ms += 10_000;
    assert!(!ex.on_deadline(&mut w, &mut host));
    assert!(local(&host.effects).is_none());
    // A stream that ends while waiting has no deadline left either.
    let mut ex = continue_at_head(&mut w, &mut host, StreamKind::Get);
    ex.on_stream_end(&mut w, &mut host);
    assert_eq!(ex.deadline_ms(), None);
}

#[test]
fn sse_in_a_charset_other_than_utf8_is_never_relayed() {
    // A fresh GET stream answered with this Content-Type.
    let answer = |ct: &str| {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = Exchange::new();
        rq(&mut ex, &mut w, &mut host, &get(&[]));
        rs(
            &mut ex,
            &mut w,
            &mut host,
            &hdrs(&[(":status", "200"), ("content-type", ct)]),
        );
        (host, ex)
    };
    // Python's client decodes the body by its charset: UTF-16 or UTF-7 bytes would hide ids and
    // events from the guard's UTF-8 reading.
    for ct in [
        "text/event-stream; charset=utf-16-le",
        "text/event-stream;charset=\"UTF-7\"",
        "text/plain; charset=latin1, text/event-stream",
    ] {
        let (host, ex) = answer(ct);
        assert!(
            matches!(local_reply(&host.effects), Some((409, b)) if b.contains("encoded_stream")),
            "{ct}"
        );
        assert!(!ex.wants_body(), "{ct}");
    }
    // UTF-8 named, in any spelling, is read as usual.
    for ct in [
        "text/event-stream; charset=UTF-8",
        "text/event-stream;charset=\"utf8\"",
    ] {
        let (host, ex) = answer(ct);
        assert!(local_reply(&host.effects).is_none(), "{ct}");
        assert!(ex.wants_body(), "{ct}");
    }
}

#[test]
fn encoded_sse_is_never_relayed_and_replicas_are_asked_for_identity() {
    let gz = hdrs(&[
        (":status", "200"),
        ("content-type", "text/event-stream"),
        ("content-encoding", "gzip"),
    ]);
    // Requests on MCP paths ask for identity, whatever the client accepts.
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    rq(
        &mut ex,
        &mut w,
        &mut host,
        &get(&[("accept-encoding", "gzip, br")]),
    );
    assert_eq!(
        set_req(&host.take(), "accept-encoding").as_deref(),
        Some("identity")
    );
    // A fresh GET stream answered gzip: refused by name, not relayed.
    rs(&mut ex, &mut w, &mut host, &gz);
    assert!(matches!(local_reply(&host.effects), Some((409, b)) if b.contains("encoded_stream")));
    assert!(!ex.wants_body());
    assert_eq!(host.stat(Stat::Refused(Reason::EncodedStream)), 1);
    // A fresh POST stream answered gzip: its call is settled.
    host.take();
    let mut ex = Exchange::new();
    let post = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    rq(&mut ex, &mut w, &mut host, &post);
    ex.on_request_body(
        Some(br#"{"jsonrpc":"2.0","id":5,"method":"tools/call"}"#),
        true,
    );
    rs(&mut ex, &mut w, &mut host, &gz);
    assert_settles(&host.take(), Reason::EncodedStream, serde_json::json!(5));
    // A continuation answered gzip: refused; the owner's log is not declared lost for it.
    let (mut ex, _) = continue_request(&mut w, &mut host, &["e4"]);
    rs(&mut ex, &mut w, &mut host, &gz);
    assert_settles(&host.effects, Reason::EncodedStream, serde_json::json!(7));
    let records = drain_records(&mut w, &mut host);
    assert!(!records
        .iter()
        .any(|r| matches!(r, Record::StreamLost { .. })));
    // Identity (or an empty coding list) is fine.
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get(&[]));
    let plain = hdrs(&[
        (":status", "200"),
        ("content-type", "text/event-stream"),
        ("content-encoding", "identity"),
    ]);
    host.take();
    rs(&mut ex, &mut w, &mut host, &plain);
    assert!(local_reply(&host.effects).is_none());
    assert!(ex.wants_body());
}

#[test]
fn a_cut_request_stream_settles_its_call_but_a_forked_one_does_not() {
    // A replay that diverges: the control event, then the error for the call.
    let mut w = worker();
    let mut host = MockHost::new();
    let (mut ex, _) = continue_request(&mut w, &mut host, &["e4"]);
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(&mut ex, &mut w, &mut host, b"id: other\ndata: x\n\n", false);
    let body = body_str(&host);
    assert!(
        body.starts_with(&control_event(Reason::ReplayMismatch)),
        "{body}"
    );
    let msgs = messages(&body);
    assert_eq!(msgs.len(), 1, "{body}");
    assert_eq!(msgs[0]["id"], 7);
    assert_eq!(msgs[0]["error"]["data"]["reason"], "replay_mismatch");
    // A newer branch takes the stream over: the old branch ends with `forked` only, at its
    // next chunk (the store refused its events) or at its end (the replica closed it).
    for at_end in [false, true] {
        let mut w = worker();
        let mut host = MockHost::new();
        let c = req_cursor(&w, 42, 3, "e3", Some(REQ_ID));
        let (mut old, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 3, 1));
        rs(&mut old, &mut w, &mut host, &sse_ok());
        bd(&mut old, &mut w, &mut host, b"id: e4\ndata: x\n\n", false);
        host.take();
        if at_end {
            bd(&mut old, &mut w, &mut host, b"", true);
            answer_end(&mut old, &mut w, &mut host, Some(r#"{"forked":true}"#));
        } else {
            drain_rejecting(&mut w, &mut host, events_of(1));
            host.take();
            bd(&mut old, &mut w, &mut host, b"id: e5\ndata: x\n\n", false);
        }
        let body = body_str(&host);
        assert!(body.contains("forked"), "{body}");
        assert!(messages(&body).is_empty(), "{body}");
    }
}

#[test]
fn a_busy_owner_refuses_this_resume_only() {
    for details in [
        "upstream_reset_before_response_started{remote_connection_failure}",
        "upstream_reset_before_response_started{overflow}",
        "via_upstream",
    ] {
        let mut w = worker();
        let mut host = MockHost::new();
        let (mut ex, _) = continue_request(&mut w, &mut host, &["e4"]);
        host.code_details = Some(details.into());
        rs(&mut ex, &mut w, &mut host, &hdrs(&[(":status", "503")]));
        assert_settles(&host.effects, Reason::OwnerBusy, serde_json::json!(7));
        let records = drain_records(&mut w, &mut host);
        assert!(
            matches!(records.as_slice(), [Record::OwnerFailed { .. }]),
            "{details}: {records:?}"
        );
    }
    // Answered by another replica than the owner: not the owner's log either way.
    let mut w = worker();
    let mut host = MockHost::new();
    let (mut ex, _) = continue_request(&mut w, &mut host, &["e4"]);
    host.upstream = Some("127.0.0.1:9999".into());
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    assert_settles(&host.effects, Reason::OwnerBusy, serde_json::json!(7));
}

#[test]
fn a_stray_resume_refused_by_the_owner_does_not_end_the_healthy_branch() {
    for stray_answer in [&[(":status", "409")][..], &[(":status", "503")][..]] {
        let mut w = worker();
        let mut host = MockHost::new();
        // The healthy continuation, relaying.
        let (mut healthy, _) = continue_request(&mut w, &mut host, &[]);
        rs(&mut healthy, &mut w, &mut host, &sse_ok());
        bd(
            &mut healthy,
            &mut w,
            &mut host,
            b"id: e4\ndata: a\n\n",
            false,
        );
        // A stray resume of the same cursor, which the owner refuses (the SDK's own 409).
        let (mut stray, _) = continue_request(&mut w, &mut host, &["e4"]);
        rs(&mut stray, &mut w, &mut host, &hdrs(stray_answer));
        assert!(local_reply(&host.effects).is_some());
        host.take();
        bd(
            &mut healthy,
            &mut w,
            &mut host,
            b"id: e5\ndata: b\n\n",
            false,
        );
        let body = body_str(&host);
        assert!(!body.contains("forked"), "{stray_answer:?}: {body}");
        assert_eq!(ids_in(&host.body()).len(), 1, "{body}");
        // The fresh original of a stream is not forked by a refused continuation either.
        host.take();
        let mut ex = Exchange::new();
        let post = hdrs(&[
            (":method", "POST"),
            (":path", "/mcp"),
            ("mcp-session-id", SID),
        ]);
        rq(&mut ex, &mut w, &mut host, &post);
        rs(&mut ex, &mut w, &mut host, &sse_ok());
        bd(&mut ex, &mut w, &mut host, b"id: f1\ndata: a\n\n", false);
        let c = ids_in(&host.body()).pop().unwrap_or_default();
        let verdict = serde_json::json!({
            "verdict": "continue", "owner": OWNER, "expected": ["f2"], "head": 2,
        })
        .to_string();
        let (mut stray, _) = resume(&mut w, &mut host, &c, &verdict);
        rs(&mut stray, &mut w, &mut host, &hdrs(stray_answer));
        host.take();
        bd(&mut ex, &mut w, &mut host, b"id: f2\ndata: b\n\n", false);
        assert!(!body_str(&host).contains("forked"), "{stray_answer:?}");
    }
}

#[path = "exchange_id_tests.rs"]
mod ids;

#[path = "exchange_stall_tests.rs"]
mod stall;
