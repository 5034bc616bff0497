//! The end of a fresh request stream settles the calls some real client is left waiting on:
//! a response one client's schema refuses answers nothing, and a relayed result response (to
//! any id) means the TypeScript SDK will not resume from the cursor it holds.
use super::*;

const CALL: &str = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#;
const PROGRESS: &str =
    "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n";

/// A fresh POST of [`CALL`] answered `200 text/event-stream`, whose body is `body` then ends.
fn fresh_ending(body: &str) -> (MockHost, String) {
    fresh_call_chunks(CALL, &[body, ""])
}

/// The ids of the guard's settling errors after its `response_missing` signal.
fn settled(out: &str) -> Vec<serde_json::Value> {
    let signal = control_event(Reason::ResponseMissing);
    let Some((_, tail)) = out.split_once(signal.as_str()) else {
        return Vec::new();
    };
    tail.split("\n\n")
        .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .inspect(|m| assert_eq!(m["error"]["data"]["reason"], "response_missing", "{out}"))
        .map(|m| m["id"].clone())
        .collect()
}

fn event(data: &str) -> String {
    format!("data: {data}\n\n")
}

/// Red team 4, `tscall-badres-*`, `baderr-*`, `res-nullmeta`: the call's own id, in a message
/// the TypeScript SDK's zod schema refuses (it calls `onerror` and drops it) or Python's
/// pydantic model does, then a clean end without a cursor.
#[test]
fn a_response_some_client_refuses_leaves_the_call_to_be_settled() {
    for data in [
        r#"{"jsonrpc":"2.0","id":9,"result":{},"x":1}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":5}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":[]}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":null}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":5}}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":null}}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"progressToken":1.5}}}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"io.modelcontextprotocol/related-task":{}}}}"#,
        r#"{"jsonrpc":"2.0","id":9,"error":"boom"}"#,
        r#"{"jsonrpc":"2.0","id":9,"error":{"code":1}}"#,
        r#"{"jsonrpc":"2.0","id":9,"error":{"code":1.5,"message":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":9,"error":{"code":"1","message":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":9,"error":{"code":1,"message":7}}"#,
        r#"{"jsonrpc":"2.0","id":9,"error":{"code":1,"message":"m"},"x":null}"#,
        // Python's strict integer id takes no float, TypeScript takes no array.
        r#"{"jsonrpc":"2.0","id":9.0,"result":{}}"#,
        r#"[{"jsonrpc":"2.0","id":9,"result":{}}]"#,
        r#"{"jsonrpc":"2.0","id":"9","result":{}}"#,
    ] {
        let (host, out) = fresh_ending(&event(data));
        assert_eq!(settled(&out), [serde_json::json!(9)], "{data}: {out}");
        assert_eq!(
            host.stat(Stat::Refused(Reason::ResponseMissing)),
            1,
            "{data}"
        );
    }
}

/// What every client takes as the call's response ends the watch: nothing is appended.
#[test]
fn a_response_every_client_accepts_answers_the_call() {
    for data in [
        r#"{"jsonrpc":"2.0","id":9,"result":{}}"#,
        r#"{"result":{"content":[],"isError":false},"id":9,"jsonrpc":"2.0"}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"progressToken":"t","x":[1]},"y":null}}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t"}}}}"#,
        r#"{"jsonrpc":"2.0","id":9,"error":{"code":-32603,"message":"m","data":null}}"#,
        r#"{"jsonrpc":"2.0","id":9,"error":{"code":1.0,"message":"","extra":1}}"#,
    ] {
        for body in [event(data), format!("id: e1\n{}", event(data))] {
            let (host, out) = fresh_ending(&body);
            assert!(!out.contains("mcp-resume"), "{data}: {out}");
            assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 0);
        }
    }
}

/// Red team 4, `tscall-other-cur`: a cursor, and a result response to an id the client never
/// sent. TypeScript counts any result response as its stream's (`receivedResponse`) and does
/// not resume: the end settles the call the client still waits on.
#[test]
fn a_result_to_another_id_means_the_client_does_not_resume() {
    for body in [
        format!(
            "id: e1\n{}",
            event(r#"{"jsonrpc":"2.0","id":987654,"result":{}}"#)
        ),
        format!(
            "id: p1\ndata:\n\n{}",
            event(r#"{"jsonrpc":"2.0","id":"z","result":{}}"#)
        ),
        format!(
            "{}id: e2\n{PROGRESS}",
            event(r#"{"jsonrpc":"2.0","id":8,"result":{"_meta":{}}}"#)
        ),
        // `JSON.parse` reads a lone surrogate that serde refuses: may be a result.
        format!(
            "id: e1\n{}",
            event(r#"{"jsonrpc":"2.0","id":8,"result":{"t":"\ud800"}}"#)
        ),
    ] {
        let (host, out) = fresh_ending(&body);
        assert_eq!(settled(&out), [serde_json::json!(9)], "{body}: {out}");
        assert_eq!(host.stat(Stat::Refused(Reason::ResponseMissing)), 1);
    }
}

/// Where every client resumes from its cursor, the end is left to that resume: a polling
/// stream (a priming id, notifications), an error response to another id (TypeScript sets
/// `receivedResponse` on results only), a message some client refuses, garbage.
#[test]
fn a_cursor_every_client_resumes_from_leaves_the_end_alone() {
    for body in [
        "id: p1\ndata:\n\n".to_owned(),
        format!("id: p1\ndata:\n\n{PROGRESS}{PROGRESS}"),
        format!(
            "id: e1\n{}",
            event(r#"{"jsonrpc":"2.0","id":987654,"error":{"code":1,"message":"m"}}"#)
        ),
        format!(
            "id: e1\n{}",
            event(r#"{"jsonrpc":"2.0","id":9,"result":5}"#)
        ),
        format!(
            "id: e1\n{}",
            event(r#"{"jsonrpc":"2.0","id":8,"result":{},"x":1}"#)
        ),
        format!(
            "id: e1\n{}",
            event(r#"[{"jsonrpc":"2.0","id":8,"result":{}}]"#)
        ),
        format!("id: e1\n{}", event("not json")),
    ] {
        let (host, out) = fresh_ending(&body);
        assert!(!out.contains("mcp-resume"), "{body}: {out}");
        assert_eq!(
            host.stat(Stat::Refused(Reason::ResponseMissing)),
            0,
            "{body}"
        );
    }
}

/// The last `retry` a client parses from `out` (lines with LF ends).
fn last_retry(out: &str) -> Option<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix("retry:"))
        .filter_map(|v| v.strip_prefix(' ').unwrap_or(v).parse().ok())
        .next_back()
}

/// Red team 4, `bigretry-cur`: a replica's `retry: 3600000` on a request stream would keep
/// both SDKs an hour from the resume the guard settles; the bound follows it (after the
/// guard's own hint too) on every stream (continuations open through the same path).
#[test]
fn a_replicas_long_retry_is_bounded() {
    let body = format!("retry: 3600000\nid: e1\n{PROGRESS}");
    for extra in ["", r#","client_retry_ms":400"#, r#","max_retry_ms":2500"#] {
        let mut w = Worker::new(config(extra));
        let bound = w.config.max_retry_ms;
        let mut host = MockHost::new();
        let mut ex = open_fresh_call(&mut w, &mut host, CALL.as_bytes());
        bd(&mut ex, &mut w, &mut host, body.as_bytes(), true);
        let out = body_str(&host);
        assert!(bound.is_some());
        assert_eq!(last_retry(&out), bound, "{extra}: {out}");
    }
    // Off: the replica's word passes.
    let mut w = Worker::new(config(r#","max_retry_ms":0"#));
    let mut host = MockHost::new();
    let mut ex = open_fresh_call(&mut w, &mut host, CALL.as_bytes());
    bd(&mut ex, &mut w, &mut host, body.as_bytes(), true);
    assert_eq!(last_retry(&body_str(&host)), Some(3_600_000));
    // A GET stream too: TypeScript keeps the last `retry:` of any stream for every reconnect.
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get(&[]));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(&mut ex, &mut w, &mut host, body.as_bytes(), true);
    assert_eq!(last_retry(&body_str(&host)), Some(10_000));
}
