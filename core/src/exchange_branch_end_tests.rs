//! A registered branch's clean end waits for the store's word only where it can change what the
//! client sees: not once a request stream's call was answered on the branch.
use super::*;

/// Resumes a request stream opened by the request(s) `carried` (cursor text) as branch 1.
fn resume_request(w: &mut Worker, host: &mut MockHost, carried: Option<&str>) -> Exchange {
    let c = w.config.keyring.encode(&Cursor {
        session: crate::cursor::session_binding(SID.as_bytes()),
        incarnation: 42,
        kind: StreamKind::Request,
        seq: 3,
        replica_event_id: Some("e3"),
        request_id: carried,
    });
    let (mut ex, _) = resume(w, host, &c, &branch_verdict(&[], 3, 1));
    rs(&mut ex, w, host, &sse_ok());
    host.take();
    ex
}

/// Questions to the store about ended branches.
fn branch_asks(effects: &[Effect]) -> usize {
    effects
        .iter()
        .filter(|e| {
            matches!(e, Effect::Dispatch { headers, .. }
                if headers.iter().any(|(k, v)| k == ":path" && v == BRANCH_PATH))
        })
        .count()
}

fn message(data: &str, id: &str) -> String {
    format!("id: {id}\ndata: {data}\n\n")
}

const PROGRESS: &str =
    r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#;

/// The call answered on this branch: its end goes out at once, unsignalled, and still reaches
/// the store as a record.
#[test]
fn a_request_streams_end_after_its_answer_asks_nothing() {
    let answer = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#;
    // In the last chunk, or before it (the end alone then), split anywhere.
    let whole = format!("{}{}", message(PROGRESS, "e4"), message(answer, "e5"));
    let (a, b) = whole.split_at(whole.len() - 9);
    for chunks in [vec![whole.as_str()], vec![a, b], vec![whole.as_str(), ""]] {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = resume_request(&mut w, &mut host, Some("7"));
        let mut last = Action::Pause;
        for (i, c) in chunks.iter().enumerate() {
            last = bd(
                &mut ex,
                &mut w,
                &mut host,
                c.as_bytes(),
                i + 1 == chunks.len(),
            );
        }
        assert_eq!(last, Action::Continue, "{chunks:?}");
        assert_eq!(branch_asks(&host.effects), 0, "{chunks:?}");
        let body = body_str(&host);
        assert_eq!(ids_in(body.as_bytes()).len(), 2, "{body}");
        assert!(!body.contains("mcp-resume"), "no signal: {body}");
        ex.on_stream_end(&mut w, &mut host);
        let records = drain_records(&mut w, &mut host);
        let ends = records
            .iter()
            .filter(|r| matches!(r, Record::BranchEnd { branch: 1, .. }))
            .count();
        assert_eq!(ends, 1, "{records:?}");
    }
}

/// Where the call is not answered on the branch (or that cannot be told), the end still asks
/// once, and a fork loser's end is signalled.
#[test]
fn an_end_before_the_answer_still_asks_the_store() {
    let other = r#"{"jsonrpc":"2.0","id":8,"result":{}}"#;
    let cases: [(Option<&str>, String); 7] = [
        // Progress only: the replica handed the stream to a newer reader.
        (Some("7"), message(PROGRESS, "e4")),
        // Another call's response, a request with the id, an event clients do not read as a
        // message, a response without its version.
        (Some("7"), message(other, "e4")),
        (
            Some("7"),
            message(r#"{"jsonrpc":"2.0","id":7,"method":"x"}"#, "e4"),
        ),
        (
            Some("7"),
            format!(
                "event: other\n{}",
                message(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, "e4")
            ),
        ),
        (Some("7"), message(r#"{"id":7,"result":{}}"#, "e4")),
        // A batch with one of its two calls answered.
        (
            Some(r#"[7,"a"]"#),
            message(r#"[{"jsonrpc":"2.0","id":7,"result":{}}]"#, "e4"),
        ),
        // The stream's request id is unknown.
        (
            None,
            message(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, "e4"),
        ),
    ];
    for (carried, chunk) in cases {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = resume_request(&mut w, &mut host, carried);
        assert_eq!(
            bd(&mut ex, &mut w, &mut host, chunk.as_bytes(), true),
            Action::Pause,
            "{chunk}"
        );
        assert_eq!(branch_asks(&host.effects), 1, "{chunk}");
        answer_end(&mut ex, &mut w, &mut host, Some(r#"{"forked":true}"#));
        assert_eq!(
            held_tail(&host.effects).as_deref(),
            Some(control_event(Reason::Forked).as_str()),
            "{chunk}"
        );
    }
    // Both calls of the batch answered, one event each: no question. (A batch answer is no
    // answer: the TypeScript SDK refuses an array, see the cases above.)
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = resume_request(&mut w, &mut host, Some(r#"[7,"a"]"#));
    let body = format!(
        "{}{}",
        message(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, "e4"),
        message(
            r#"{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"m"}}"#,
            "e5"
        )
    );
    assert_eq!(
        bd(&mut ex, &mut w, &mut host, body.as_bytes(), true),
        Action::Continue
    );
    assert_eq!(branch_asks(&host.effects), 0);
}

/// A GET stream has no call that completes: its clean end always asks.
#[test]
fn a_get_streams_end_still_asks_the_store() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let (mut ex, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 1));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    host.take();
    let chunk = message(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, "e8");
    assert_eq!(
        bd(&mut ex, &mut w, &mut host, chunk.as_bytes(), true),
        Action::Pause
    );
    assert_eq!(branch_asks(&host.effects), 1);
}

/// A block outgrowing the hold bound ends the watch: a response after it no longer counts
/// and the end asks (the client-model parser is never held unbounded).
#[test]
fn the_watch_is_bounded_by_the_hold_bound() {
    let mut w = Worker::new(config(r#","max_event_hold_bytes":1024"#));
    let mut host = MockHost::new();
    let mut ex = resume_request(&mut w, &mut host, Some("7"));
    let big = format!("id: e4\ndata: {}\n", "x".repeat(2000));
    bd(&mut ex, &mut w, &mut host, big.as_bytes(), false);
    assert!(ex.call.is_none(), "the watch ended");
    let rest = format!(
        "\n{}",
        message(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, "e5")
    );
    assert_eq!(
        bd(&mut ex, &mut w, &mut host, rest.as_bytes(), true),
        Action::Pause
    );
}
