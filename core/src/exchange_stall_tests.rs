//! Nothing pending without an end: a fresh request stream that ends with nothing settles its
//! call; a continuation whose owner sends headers and then no event is answered at the deadline.
use super::*;

/// A fresh POST (request id 9) answered `200 text/event-stream`, whose body is `body` then ends.
fn fresh_post_ending(body: &str) -> (MockHost, String) {
    fresh_call_ending(r#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#, body)
}

/// A fresh POST of `call` answered `200 text/event-stream`, whose body is `body` then ends.
fn fresh_call_ending(call: &str, body: &str) -> (MockHost, String) {
    fresh_call_chunks(call, &[body, ""])
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
fn a_fresh_request_stream_that_leaves_no_client_a_cursor_settles_its_call() {
    // Blocks that dispatch nothing and leave the TypeScript SDK no id (an id-only block's id is
    // lost to it), ids the guard drops, a block the replica never finished (held, so never out).
    for body in [
        "id: p1\n\n",
        "data:\n\n",
        "data: \n\n",
        "id:\ndata:\n\n",
        "id: a\0b\ndata:\n\n",
        "event: ping\ndata: x\n\n",
        "data: {\"jsonrpc\"",
        "id: r1\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,",
    ] {
        let (host, out) = fresh_post_ending(body);
        let msgs = messages(&out);
        assert_eq!(msgs.len(), 1, "{body:?}: {out}");
        assert_eq!(msgs[0]["id"], serde_json::json!(9), "{body:?}");
        assert_eq!(msgs[0]["error"]["data"]["reason"], "response_missing");
        assert!(!host.effects.contains(&Effect::ResetResponse), "{body:?}");
        assert!(
            !out.contains("jsonrpc\"\n") && !out.contains("\"id\":9,\n"),
            "{out}"
        );
    }
}

/// Kept under the name SECURITY.md's row cites until that row names the closing event (see
/// exchange_closeblock_tests.rs): such a stream is no longer reset, but closed, signalled, settled.
#[test]
fn a_request_stream_that_ends_inside_a_block_already_partly_out_is_reset() {
    // Too long to hold: part of the block goes out before the body ends inside it.
    let body = format!("data: {}", "x".repeat(200_000));
    let (host, out) = fresh_post_ending(&body);
    let closed = format!(
        "x\nevent: {}\n\n{}",
        crate::sse::DISCARDED_EVENT,
        control_event(Reason::ResponseMissing)
    );
    assert!(out.contains(&closed), "{}", &out[200_000..]);
    assert_eq!(messages(&out).len(), 1);
    assert!(!host.effects.contains(&Effect::ResetResponse));
    assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 1);
}

#[test]
fn a_fresh_request_stream_with_a_priming_id_or_an_answer_is_left_alone() {
    // A priming event: the client resumes from its cursor (SEP-1699 polling).
    // The answer, without an id: the call is settled by the replica.
    for body in [
        "id: p1\ndata:\n\n",
        "data: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{}}\n\n",
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

const PROGRESS: &str =
    "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n";

/// The settling errors in `out` after the `response_missing` signal: their ids.
fn settled_ids(out: &str) -> Vec<serde_json::Value> {
    let signal = control_event(Reason::ResponseMissing);
    let Some((_, tail)) = out.split_once(signal.as_str()) else {
        return Vec::new();
    };
    messages(tail)
        .iter()
        .inspect(|m| assert_eq!(m["error"]["data"]["reason"], "response_missing", "{out}"))
        .map(|m| m["id"].clone())
        .collect()
}

#[test]
fn a_fresh_request_stream_that_ends_after_id_less_notifications_settles_its_call() {
    // A progress notification (no id, no `event:`), then the replica ends before answering.
    for body in [
        PROGRESS.to_owned(),
        format!(": ping\n\n{PROGRESS}{PROGRESS}"),
        // A response to another id, or one the client would not take as a response.
        "data: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{}}\n\n".to_owned(),
        "data: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{},\"error\":{}}\n\n".to_owned(),
        "event: other\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{}}\n\n".to_owned(),
    ] {
        let (host, out) = fresh_post_ending(&body);
        assert!(out.starts_with(&body), "{out}");
        assert_eq!(settled_ids(&out), [serde_json::json!(9)], "{out}");
        assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 1);
    }
    // Under policy `reject` the end is signalled, no call settled by the guard (as when
    // nothing came).
    let reject = Worker::new(config(r#","policy":{"request_stream":"reject"}"#));
    let call = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#;
    let (_, out) = fresh_call_under(reject, call, &[PROGRESS, ""]);
    assert!(
        out.ends_with(&control_event(Reason::ResponseMissing)),
        "{out}"
    );
    assert!(messages(&out).is_empty(), "{out}");
    // A bare `id:` leaves the client a reset cursor: nothing it can resume from.
    let (_, out) = fresh_post_ending("id:\ndata: x\n\n");
    assert_eq!(settled_ids(&out), [serde_json::json!(9)], "{out}");
}

#[test]
fn an_answered_or_resumable_fresh_request_stream_is_left_alone() {
    for body in [
        // The response, without an id, after a notification; an error answers too.
        format!("{PROGRESS}data: {{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{{}}}}\n\n"),
        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,\"error\":{\"code\":1,\"message\":\"m\"}}\n\n"
            .to_owned(),
        // A priming id, then only notifications: the client holds a cursor and resumes.
        format!("id: p1\ndata:\n\n{PROGRESS}"),
    ] {
        let (host, out) = fresh_post_ending(&body);
        assert!(!out.contains("mcp-resume"), "{out}");
        assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 0);
        // The answer in the chunk that ends the stream is read before the end is judged.
        let call = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#;
        let (_, out) = fresh_call_chunks(call, &[&body]);
        assert!(!out.contains("mcp-resume"), "{out}");
    }
}

#[test]
fn a_batch_whose_stream_ends_settles_only_its_unanswered_calls() {
    let call = r#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":"x","method":"b"},{"jsonrpc":"2.0","id":3,"method":"c"}]"#;
    // One answered alone, one by an error: only "x" is left. (A batch answer answers none:
    // exchange_callwatch_tests.rs.)
    let body = format!(
        "{PROGRESS}data: {{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{}}}}\n\n\
         data: {{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{{\"code\":1,\"message\":\"m\"}}}}\n\n"
    );
    let (host, out) = fresh_call_ending(call, &body);
    assert!(out.starts_with(&body), "{out}");
    assert_eq!(settled_ids(&out), [serde_json::json!("x")], "{out}");
    assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 1);
    // All answered: nothing.
    let all = format!("{body}data: {{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"result\":{{}}}}\n\n");
    let (host, out) = fresh_call_ending(call, &all);
    assert_eq!(out, all);
    assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 0);
}

#[test]
fn a_watch_past_its_bound_keeps_the_old_rule() {
    // A notification that outgrows the hold bound across chunks ends the watch: something was
    // relayed, so the end is left alone, as before the watch.
    let w = worker();
    let big = format!(
        "data: {{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":\"{}\"}}",
        "x".repeat(w.config.max_event_hold_bytes + 10)
    );
    let call = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#;
    let (host, out) = fresh_call_chunks(call, &[&big, "\n\n", ""]);
    assert_eq!(out, format!("{big}\n\n"));
    assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 0);
    // Ids the guard cannot read (`null`): the same old rule, an empty stream still settles.
    // The same block whole in one chunk is read: not an answer, so the call is settled.
    let (_, out) = fresh_call_ending(call, &format!("{big}\n\n"));
    assert_eq!(settled_ids(&out), [serde_json::json!(9)]);
    let call = r#"{"jsonrpc":"2.0","method":"tools/call"}"#;
    let (_, out) = fresh_call_ending(call, PROGRESS);
    assert!(!out.contains("mcp-resume"), "{out}");
    let (_, out) = fresh_call_ending(call, "");
    assert!(
        out.contains(&control_event(Reason::ResponseMissing)),
        "{out}"
    );
}

/// A request stream's continuation at seq 3 with `e4` recorded after the cursor; its owner
/// answered `200 text/event-stream`. Returns the exchange and the headers' action.
fn continue_expecting(w: &mut Worker, host: &mut MockHost) -> (Exchange, Action) {
    let (mut ex, _) = continue_request(w, host, &["e4"]);
    host.take();
    let action = rs(&mut ex, w, host, &sse_ok());
    (ex, action)
}

fn no_effect_but_empty_chunks(effects: &[Effect]) -> bool {
    effects.iter().all(|e| match e {
        Effect::BodyChunk(b) => b.is_empty(),
        Effect::LocalResponse { .. } | Effect::ResetResponse | Effect::FinishHeld(_) => false,
        _ => true,
    })
}

#[test]
fn expected_replay_holds_the_headers_until_its_first_event() {
    let mut w = worker();
    let mut host = MockHost::new();
    let start = host.now_ms;
    let (mut ex, action) = continue_expecting(&mut w, &mut host);
    assert_eq!(action, Action::Pause);
    assert!(ex.holds_response_headers());
    // One deadline for the headers and the first replayed event, counted from forwarding.
    assert_eq!(ex.deadline_ms(), Some(start + 5000));
    // Comments and a `retry` dispatch nothing: held, Envoy gets nothing yet.
    let a = bd(
        &mut ex,
        &mut w,
        &mut host,
        b": ping\n\nretry: 500\n\n",
        false,
    );
    assert_eq!(a, Action::Pause);
    assert!(no_effect_but_empty_chunks(&host.take()));
    // The first replayed event, in two chunks: released with what was held before it.
    let a = bd(&mut ex, &mut w, &mut host, b"id: e4\ndata: ", false);
    assert_eq!(a, Action::Pause);
    host.take();
    let a = bd(&mut ex, &mut w, &mut host, b"{}\n\n", false);
    assert_eq!(a, Action::Continue);
    assert!(!ex.holds_response_headers());
    assert_eq!(ex.deadline_ms(), None);
    let out = body_str(&host);
    assert!(out.starts_with(": ping\n\nretry: 500\n\n"), "{out}");
    assert_eq!(ids_in(out.as_bytes()).len(), 1, "{out}");
    // Later chunks stream as usual.
    host.take();
    assert_eq!(
        bd(&mut ex, &mut w, &mut host, b": more\n\n", false),
        Action::Continue
    );
    assert_eq!(body_str(&host), ": more\n\n");
}

#[test]
fn an_owner_that_answers_then_stalls_is_answered_at_the_deadline() {
    for (kind, body) in [
        (StreamKind::Request, ""),
        (StreamKind::Request, ": keep-alive\n\n"),
        (StreamKind::Request, "retry: 100\n\nevent: x\n\n"),
        (StreamKind::Get, ": keep-alive\n\n"),
    ] {
        let mut w = worker();
        let mut host = MockHost::new();
        let start = host.now_ms;
        let mut ex = match kind {
            StreamKind::Request => continue_expecting(&mut w, &mut host).0,
            StreamKind::Get => {
                let c = cursor(&w, 42, 3, "e3");
                let verdict = format!(
                    r#"{{"verdict":"continue","owner":"{OWNER}","expected":["e4"],"head":4}}"#
                );
                let (mut ex, _) = resume(&mut w, &mut host, &c, &verdict);
                assert_eq!(rs(&mut ex, &mut w, &mut host, &sse_ok()), Action::Pause);
                ex
            }
        };
        if !body.is_empty() {
            bd(&mut ex, &mut w, &mut host, body.as_bytes(), false);
        }
        host.take();
        host.now_ms = start + 4999;
        assert!(!ex.on_deadline(&mut w, &mut host));
        host.now_ms = start + 5000;
        assert!(ex.on_deadline(&mut w, &mut host), "{body}");
        match kind {
            StreamKind::Request => {
                assert_settles(&host.effects, Reason::OwnerBusy, serde_json::json!(7))
            }
            StreamKind::Get => {
                let (status, headers, _) = local(&host.effects).expect("no answer");
                assert_eq!(status, 409);
                let want = Some("rejected; reason=owner_busy");
                assert_eq!(header_of(&headers, MCP_RESUME_HEADER), want);
            }
        }
        assert!(!ex.holds_response_headers());
        // Nothing the owner sends later is relayed.
        assert!(!ex.wants_body());
        let records = drain_records(&mut w, &mut host);
        assert!(records
            .iter()
            .any(|r| matches!(r, Record::OwnerFailed { .. })));
    }
}

#[test]
fn a_held_continuation_whose_body_ends_is_released_with_its_end() {
    // Ended with nothing but comments: the headers go with the mismatch cut and the settling
    // error, as an empty replay always did.
    let mut w = worker();
    let mut host = MockHost::new();
    let (mut ex, _) = continue_expecting(&mut w, &mut host);
    bd(&mut ex, &mut w, &mut host, b": ping\n\n", false);
    host.take();
    assert_eq!(bd(&mut ex, &mut w, &mut host, b"", true), Action::Continue);
    assert!(!ex.holds_response_headers());
    assert_eq!(ex.deadline_ms(), None);
    let out = body_str(&host);
    assert!(out.starts_with(": ping\n\n"), "{out}");
    assert!(
        out.contains(&control_event(Reason::ReplayMismatch)),
        "{out}"
    );
    assert_eq!(messages(&out).len(), 1, "{out}");
    // A replay that diverges is released with its cut, before any of it is dispatched.
    let mut w = worker();
    let mut host = MockHost::new();
    let (mut ex, _) = continue_expecting(&mut w, &mut host);
    host.take();
    let a = bd(&mut ex, &mut w, &mut host, b"id: other\ndata: x\n\n", false);
    assert_eq!(a, Action::Continue);
    assert!(!ex.holds_response_headers());
    assert!(body_str(&host).starts_with(&control_event(Reason::ReplayMismatch)));
}

#[test]
fn held_output_is_bounded() {
    let mut w = worker();
    let mut host = MockHost::new();
    let (mut ex, _) = continue_expecting(&mut w, &mut host);
    // Many small comments (one larger than the bound would be cut, as it always was).
    let comment = format!(": {}\n\n", "x".repeat(100));
    for _ in 0..=w.config.max_event_hold_bytes / comment.len() {
        bd(&mut ex, &mut w, &mut host, comment.as_bytes(), false);
    }
    assert!(ex.holds_response_headers());
    host.take();
    bd(&mut ex, &mut w, &mut host, b"id: e4\ndata: {}\n\n", false);
    let out = body_str(&host);
    assert!(!out.contains("xxx"), "{}", out.len());
    assert_eq!(ids_in(out.as_bytes()).len(), 1, "{out}");
}

#[test]
fn nothing_expected_passes_the_headers_at_once_without_a_deadline() {
    for kind in [StreamKind::Request, StreamKind::Get] {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = continue_at_head(&mut w, &mut host, kind);
        assert_eq!(rs(&mut ex, &mut w, &mut host, &sse_ok()), Action::Continue);
        assert!(!ex.holds_response_headers());
        assert_eq!(ex.deadline_ms(), None);
        host.take();
        assert_eq!(
            bd(&mut ex, &mut w, &mut host, b": ping\n\n", false),
            Action::Continue
        );
        assert_eq!(body_str(&host), ": ping\n\n");
    }
}

#[test]
fn a_host_that_cannot_hold_headers_resets_a_stalled_replay_and_records_it_lost() {
    // proxy-wasm: a headers pause would stop the body too, so the headers go at once; the
    // deadline still waits for the first replayed event.
    let mut w = worker();
    let mut host = MockHost::new();
    host.holds_headers = false;
    let start = host.now_ms;
    let (mut ex, action) = continue_expecting(&mut w, &mut host);
    assert_eq!(action, Action::Continue);
    assert!(!ex.holds_response_headers());
    assert_eq!(ex.deadline_ms(), Some(start + 5000));
    assert_eq!(
        bd(&mut ex, &mut w, &mut host, b": ping\n\n", false),
        Action::Continue
    );
    assert_eq!(body_str(&host), ": ping\n\n");
    drain_records(&mut w, &mut host);
    host.take();
    host.now_ms = start + 5000;
    assert!(ex.on_deadline(&mut w, &mut host));
    // No local answer is possible: reset, and the stream recorded lost so the next resume is
    // refused (and settled) at once.
    assert!(local(&host.effects).is_none());
    assert!(host.effects.contains(&Effect::ResetResponse));
    assert_eq!(host.stat(Stat::Refused(Reason::OwnerBusy)), 1);
    let records = drain_records(&mut w, &mut host);
    assert!(records
        .iter()
        .any(|r| matches!(r, Record::StreamLost { .. })));
    assert!(!ex.on_deadline(&mut w, &mut host));
    // A replay that comes in time ends the deadline.
    let mut w = worker();
    let mut host = MockHost::new();
    host.holds_headers = false;
    let (mut ex, _) = continue_expecting(&mut w, &mut host);
    bd(&mut ex, &mut w, &mut host, b"id: e4\ndata: {}\n\n", false);
    assert_eq!(ex.deadline_ms(), None);
    host.now_ms += 10_000;
    assert!(!ex.on_deadline(&mut w, &mut host));
}

/// A request stream's continuation at seq 3 with `e4`..`e6` recorded after the cursor, its
/// owner's `200 text/event-stream` headers in (held or not, as `holds` says), then `e4`
/// replayed at `start + 1000`. Returns the exchange and `start`.
fn replaying_first_of_three(w: &mut Worker, host: &mut MockHost, holds: bool) -> (Exchange, u64) {
    host.holds_headers = holds;
    let start = host.now_ms;
    let (mut ex, _) = continue_request(w, host, &["e4", "e5", "e6"]);
    rs(&mut ex, w, host, &sse_ok());
    host.now_ms = start + 1000;
    assert_eq!(
        bd(&mut ex, w, host, b"id: e4\ndata: {}\n\n", false),
        Action::Continue
    );
    assert!(!ex.holds_response_headers());
    drain_records(w, host);
    host.take();
    (ex, start)
}

/// The deadline at `due` acts (not a millisecond before): the stream is reset, no local
/// answer (the headers are out), and the incarnation recorded lost.
fn assert_reset_lost_at(ex: &mut Exchange, w: &mut Worker, host: &mut MockHost, due: u64) {
    assert_eq!(ex.deadline_ms(), Some(due));
    host.now_ms = due - 1;
    assert!(!ex.on_deadline(w, host));
    assert!(!host.effects.contains(&Effect::ResetResponse));
    host.now_ms = due;
    assert!(ex.on_deadline(w, host));
    assert!(local(&host.effects).is_none());
    assert!(host.effects.contains(&Effect::ResetResponse));
    assert_eq!(host.stat(Stat::Refused(Reason::OwnerBusy)), 1);
    let records = drain_records(w, host);
    assert!(records
        .iter()
        .any(|r| matches!(r, Record::StreamLost { .. })));
    // Nothing the owner sends later is relayed, and the deadline is spent.
    assert!(!ex.wants_body());
    assert_eq!(ex.deadline_ms(), None);
    assert!(!ex.on_deadline(w, host));
}

#[test]
fn an_owner_that_stalls_after_its_first_replayed_event_is_reset_and_recorded_lost() {
    for holds in [true, false] {
        let mut w = worker();
        let mut host = MockHost::new();
        let (mut ex, start) = replaying_first_of_three(&mut w, &mut host, holds);
        // Counted from the release of `e4`, not from forwarding, by its own bound.
        let stall = w.config.replay_stall_timeout_ms;
        assert_reset_lost_at(&mut ex, &mut w, &mut host, start + 1000 + stall);
    }
}

#[test]
fn blocks_that_dispatch_nothing_are_no_progress_in_an_owed_replay() {
    for holds in [true, false] {
        let mut w = worker();
        let mut host = MockHost::new();
        let (mut ex, start) = replaying_first_of_three(&mut w, &mut host, holds);
        // Comments, a `retry`, an event without data, the first event again (dropped whole)
        // and the cursor's own echo: the client dispatches none of them.
        for (i, chunk) in [
            ": keep-alive\n\n",
            "retry: 100\n\n",
            "event: x\n\n",
            "id: e4\ndata: {}\n\n",
            "id: e3\ndata: {}\n\n",
        ]
        .iter()
        .enumerate()
        {
            host.now_ms = start + 2000 + 5000 * i as u64;
            bd(&mut ex, &mut w, &mut host, chunk.as_bytes(), false);
        }
        let out = body_str(&host);
        assert!(ids_in(out.as_bytes()).is_empty(), "{out}");
        host.take();
        let stall = w.config.replay_stall_timeout_ms;
        assert_reset_lost_at(&mut ex, &mut w, &mut host, start + 1000 + stall);
    }
}

#[test]
fn a_slow_but_steady_replay_is_never_cut_and_a_complete_one_has_no_deadline() {
    for holds in [true, false] {
        let mut w = worker();
        let mut host = MockHost::new();
        let (mut ex, start) = replaying_first_of_three(&mut w, &mut host, holds);
        // Each owed event just inside the deadline counted from the one before.
        let stall = w.config.replay_stall_timeout_ms;
        host.now_ms = start + 999 + stall;
        assert!(!ex.on_deadline(&mut w, &mut host));
        bd(&mut ex, &mut w, &mut host, b"id: e5\ndata: {}\n\n", false);
        assert_eq!(ex.deadline_ms(), Some(start + 999 + 2 * stall));
        host.now_ms = start + 998 + 2 * stall;
        assert!(!ex.on_deadline(&mut w, &mut host));
        bd(&mut ex, &mut w, &mut host, b"id: e6\ndata: {}\n\n", false);
        // The owed replay is complete: the tool may be silent for as long as it runs.
        assert_eq!(ex.deadline_ms(), None);
        host.now_ms = start + 1_000_000;
        assert!(!ex.on_deadline(&mut w, &mut host));
        assert!(!host.effects.contains(&Effect::ResetResponse));
        assert!(local(&host.effects).is_none());
        assert_eq!(ids_in(body_str(&host).as_bytes()).len(), 2);
        assert!(ex.wants_body());
    }
}

#[test]
fn an_owed_replay_whose_body_ends_early_has_no_deadline() {
    // An early close with events still owed stays open for the next resume: no reset later.
    for holds in [true, false] {
        let mut w = worker();
        let mut host = MockHost::new();
        let (mut ex, _) = replaying_first_of_three(&mut w, &mut host, holds);
        bd(&mut ex, &mut w, &mut host, b"", true);
        assert_eq!(ex.deadline_ms(), None);
        host.now_ms += 1_000_000;
        assert!(!ex.on_deadline(&mut w, &mut host));
        assert!(!host.effects.contains(&Effect::ResetResponse));
    }
}

/// The worker's config with `extra` JSON fields.
fn worker_with(extra: &str) -> Worker {
    Worker::new(config(extra))
}

#[test]
fn a_reader_slower_than_the_first_events_bound_keeps_its_owed_replay() {
    // The client stops reading mid-replay: flow control holds the owner back for longer than
    // the first event's bound. Only `replay_stall_timeout_ms` gives the stream up.
    for holds in [true, false] {
        let mut w = worker_with(
            r#","continuation_headers_timeout_ms":5000,"replay_stall_timeout_ms":30000"#,
        );
        let mut host = MockHost::new();
        let (mut ex, start) = replaying_first_of_three(&mut w, &mut host, holds);
        host.now_ms = start + 1000 + 8000;
        assert!(!ex.on_deadline(&mut w, &mut host), "8 s of a slow reader");
        assert!(!host.effects.contains(&Effect::ResetResponse));
        bd(&mut ex, &mut w, &mut host, b"id: e5\ndata: {}\n\n", false);
        assert_eq!(ids_in(body_str(&host).as_bytes()).len(), 1);
        host.take();
        assert_reset_lost_at(&mut ex, &mut w, &mut host, start + 9000 + 30_000);
    }
}

/// A request stream's continuation at seq 3 whose owner answers `body` and ends.
fn continuation_answering(body: &str) -> (MockHost, String) {
    let mut w = worker();
    let mut host = MockHost::new();
    let (mut ex, _) = continue_request(&mut w, &mut host, &[]);
    host.take();
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(&mut ex, &mut w, &mut host, body.as_bytes(), true);
    let out = body_str(&host);
    (host, out)
}

#[test]
fn a_continuation_answered_with_only_a_dataless_reset_settles_its_call() {
    // The TypeScript SDK drops an id-only block's id and would resume into the same answer
    // until its own timeout: the reset is dropped, so the continuation relayed no event.
    for body in ["id:\n\n", "id\n\n", ": x\nid:\n\n"] {
        let (host, out) = continuation_answering(body);
        assert!(ids_in(out.as_bytes()).is_empty(), "{body:?}: {out}");
        let msgs = messages(&out);
        assert_eq!(msgs.len(), 1, "{body:?}: {out}");
        assert_eq!(
            msgs[0]["error"]["data"]["reason"], "replay_missing",
            "{out}"
        );
        assert_eq!(host.stat(Stat::Refused(Reason::ReplayMissing)), 1);
    }
}

#[test]
fn a_fresh_request_stream_ending_on_a_dataless_reset_settles_its_call() {
    let (host, out) =
        fresh_post_ending("id: e1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n\nid:\n\n");
    assert_eq!(ids_in(out.as_bytes()).len(), 1, "{out}");
    assert_eq!(settled_ids(&out), [serde_json::json!(9)], "{out}");
    assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 1);
}

#[test]
fn a_verdict_listing_fewer_events_than_owed_is_refused_before_forwarding() {
    // The service cut its list short (--max-expected): events past it could not be checked.
    let mut w = worker();
    let mut host = MockHost::new();
    let c = req_cursor(&w, 42, 3, "e3", Some(REQ_ID));
    let truncated = serde_json::json!({
        "verdict": "continue", "owner": OWNER, "expected": ["e4", "e5"], "head": 6,
    })
    .to_string();
    let (ex, fx) = resume(&mut w, &mut host, &c, &truncated);
    assert_settles(&fx, Reason::OwnershipUnavailable, serde_json::json!(7));
    assert_eq!(ex.deadline_ms(), None);
    assert!(!fx
        .iter()
        .any(|e| matches!(e, Effect::SetRequestHeader(k, _) if k == "last-event-id")));
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Log(_, l) if l.contains("--max-expected"))));
    // The whole list (head - seq entries) continues.
    let mut host = MockHost::new();
    let (_, fx) = continue_request(&mut w, &mut host, &["e4", "e5", "e6"]);
    assert!(local(&fx).is_none());
    assert_eq!(host.stat(Stat::Continued), 1);
}

#[test]
fn a_client_above_its_write_watermark_suspends_the_wait_between_owed_events() {
    for holds in [true, false] {
        let mut w = worker();
        let mut host = MockHost::new();
        let (mut ex, start) = replaying_first_of_three(&mut w, &mut host, holds);
        let stall = w.config.replay_stall_timeout_ms;
        host.now_ms = start + 2000;
        ex.on_downstream_backpressure(&w, &host, true);
        assert_eq!(ex.deadline_ms(), None);
        // Long past the bound: the client, not the owner, holds the replay back.
        host.now_ms = start + 1000 + 3 * stall;
        assert!(!ex.on_deadline(&mut w, &mut host));
        assert!(!host.effects.contains(&Effect::ResetResponse));
        // It reads again: the owner gets the whole bound from now.
        let back = host.now_ms;
        ex.on_downstream_backpressure(&w, &host, false);
        assert_reset_lost_at(&mut ex, &mut w, &mut host, back + stall);
    }
}

#[test]
fn backpressure_does_not_suspend_the_first_replayed_events_deadline() {
    let mut w = worker();
    let mut host = MockHost::new();
    let start = host.now_ms;
    let (mut ex, _) = continue_expecting(&mut w, &mut host);
    ex.on_downstream_backpressure(&w, &host, true);
    assert_eq!(ex.deadline_ms(), Some(start + 5000));
}
