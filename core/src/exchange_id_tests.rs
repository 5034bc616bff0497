//! The settling answer names the client's own ids, whatever path refuses the cursor: the id as
//! the client's JSON parser reads the POST body (last duplicate key, escaped keys, big numbers,
//! lone surrogates, batches, long ids), written back as raw text.
use super::*;
use crate::jsonrpc::MAX_REQUEST_IDS_BYTES;

/// The raw `id` texts of a settling body's `message` events, in order.
fn raw_ids(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|b| b.lines().any(|l| l == "event: message"))
        .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| {
            let rest = d.strip_prefix(r#"{"jsonrpc":"2.0","id":"#)?;
            // The error object after the id has no `,"error":{` of its own.
            rest.rfind(r#","error":{"#)
                .and_then(|at| rest.get(..at))
                .map(str::to_owned)
        })
        .collect()
}

/// How a refusal of a request stream's cursor is decided.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// At request time, before any callout: the cursor is bound to another session.
    Local,
    /// The ownership service is down.
    CalloutFailed,
    /// The service's verdict.
    Verdict,
    /// At response time: the owner failed the continuation.
    OwnerFailed,
}

const PATHS: [Path; 4] = [
    Path::Local,
    Path::CalloutFailed,
    Path::Verdict,
    Path::OwnerFailed,
];

/// The local answer to a resume of cursor `c`, refused along `path`.
fn refuse_along(w: &mut Worker, host: &mut MockHost, c: &str, path: Path) -> Option<Local> {
    host.take();
    match path {
        Path::Local => {
            let mut ex = Exchange::new();
            let h = hdrs(&[
                (":method", "GET"),
                (":path", "/mcp"),
                ("mcp-session-id", "another-session"),
                ("last-event-id", c),
            ]);
            rq(&mut ex, w, host, &h);
            local(&host.take())
        }
        Path::CalloutFailed => {
            let mut ex = Exchange::new();
            rq(&mut ex, w, host, &get(&[("last-event-id", c)]));
            let (token, _) = host.last_dispatch()?;
            host.take();
            ex.on_callout_response(w, host, token, None, None);
            local(&host.take())
        }
        Path::Verdict => local(&resume(w, host, c, &new_stream(Reason::Gap)).1),
        Path::OwnerFailed => {
            let verdict = serde_json::json!({
                "verdict": "continue", "owner": OWNER, "expected": ["r2"], "head": 2,
            })
            .to_string();
            let (mut ex, _) = resume(w, host, c, &verdict);
            rs(&mut ex, w, host, &hdrs(&[(":status", "503")]));
            local(&host.take())
        }
    }
}

/// A POST of `body` (two chunks cut at `cut`, each passed while the exchange asks for it),
/// answered with SSE carrying one event `id: r1`; returns the cursor the client saw.
fn post(w: &mut Worker, host: &mut MockHost, body: &str, cut: usize) -> String {
    let mut ex = Exchange::new();
    let h = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    rq(&mut ex, w, host, &h);
    let (a, b) = body.as_bytes().split_at(cut.min(body.len()));
    for (chunk, eos) in [(a, false), (b, true)] {
        if ex.wants_request_body() {
            ex.on_request_body(Some(chunk), eos);
        }
    }
    rs(&mut ex, w, host, &sse_ok());
    bd(&mut ex, w, host, b"id: r1\ndata: {}\n\n", false);
    let ids = ids_in(&host.body());
    host.take();
    ids.into_iter().next().unwrap_or_default()
}

/// The ids of the requests of a body as serde_json reads it (a stand-in for the client's
/// parser: last duplicate key wins, keys decoded); `None` when serde_json cannot read it.
fn parsed_ids(body: &str) -> Option<Vec<serde_json::Value>> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let reqs = match v {
        serde_json::Value::Array(a) => a,
        one => vec![one],
    };
    Some(
        reqs.iter()
            .filter(|r| r.get("method").is_some())
            .filter_map(|r| r.get("id").cloned())
            .collect(),
    )
}

/// POSTs `body` in two chunks cut at `cut`, refuses its stream's cursor along `path`, and checks
/// the settling answer names exactly the raw ids `want`, which parse as the body's ids do.
fn assert_settles_with(body: &str, cut: usize, want: &[&str], path: Path) {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = post(&mut w, &mut host, body, cut);
    let Some((status, _, answer)) = refuse_along(&mut w, &mut host, &c, path) else {
        panic!("{path:?}: no local answer for {body:.200}");
    };
    assert_eq!(status, 200, "{path:?}: {answer:.200}");
    assert_eq!(raw_ids(&answer), want, "{path:?}: {body:.300}");
    let events = answer.matches("event: message\n").count();
    assert_eq!(events, want.len(), "one event per id: {answer:.300}");
    let carried = want != ["null"];
    if let Some(ids) = parsed_ids(body).filter(|_| carried) {
        // Each event is one JSON-RPC message, its id the body's id as a parser reads both.
        assert_eq!(messages(&answer).len(), want.len(), "{answer:.300}");
        let got: Vec<_> = want
            .iter()
            .map(|raw| serde_json::from_str::<serde_json::Value>(raw).ok())
            .collect();
        assert_eq!(
            got,
            ids.into_iter().map(Some).collect::<Vec<_>>(),
            "{body:.300}"
        );
    }
}

#[test]
fn every_id_the_guard_accepts_settles_whatever_path_refuses() {
    let long = format!(r#""{}""#, "q".repeat(MAX_REQUEST_IDS_BYTES - 2));
    let cases: Vec<(String, Vec<&str>)> = vec![
        // Beyond 64 bits: a float once re-parsed, written back as sent.
        (
            r#"{"jsonrpc":"2.0","method":"tools/call","id":18446744073709551616}"#.into(),
            vec!["18446744073709551616"],
        ),
        (
            r#"{"jsonrpc":"2.0","method":"tools/call","id":1.0e+2}"#.into(),
            vec!["1.0e+2"],
        ),
        // An escaped key is `id`.
        (
            r#"{"jsonrpc":"2.0","method":"tools/call","i\u0064":5}"#.into(),
            vec!["5"],
        ),
        // Duplicate keys: the last wins.
        (
            r#"{"id":1,"jsonrpc":"2.0","method":"tools/call","id":"second"}"#.into(),
            vec![r#""second""#],
        ),
        // A lone surrogate, kept as its escape.
        (
            r#"{"jsonrpc":"2.0","method":"tools/call","id":"\ud800"}"#.into(),
            vec![r#""\ud800""#],
        ),
        // The longest id the guard carries: in the cursor, so no path needs the store.
        (
            format!(r#"{{"jsonrpc":"2.0","method":"tools/call","id":{long}}}"#),
            vec![long.as_str()],
        ),
        // A batch: one error per request, notifications skipped.
        (
            r#"[{"jsonrpc":"2.0","method":"a","id":1},{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","method":"b","id":"two"}]"#.into(),
            vec!["1", r#""two""#],
        ),
    ];
    for (body, want) in &cases {
        for path in PATHS {
            assert_settles_with(body, body.len() / 2, want, path);
        }
    }
}

#[test]
fn ids_the_guard_cannot_carry_settle_with_null_and_no_store_record() {
    // Longer than the bound: not carried, never a part of it.
    let too_long = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/call","id":"{}"}}"#,
        "q".repeat(MAX_REQUEST_IDS_BYTES)
    );
    for path in PATHS {
        assert_settles_with(&too_long, 10, &["null"], path);
    }
    // The guard no longer records ids for the store: every carried one is in the cursor.
    let mut w = worker();
    let mut host = MockHost::new();
    let body = r#"{"method":"x","id":"a-long-id-of-more-than-sixty-four-bytes-which-once-went-to-the-store"}"#;
    post(&mut w, &mut host, body, 0);
    let records = drain_records(&mut w, &mut host);
    assert!(
        records.iter().any(|r| matches!(
            r,
            Record::StreamOpen {
                request_id: None,
                ..
            }
        )),
        "{records:?}"
    );
}

#[test]
fn a_store_record_of_an_older_guard_still_names_the_call() {
    // An older guard kept ids over 64 bytes in the store, not in its version-3 cursor.
    let mut w = worker();
    let mut host = MockHost::new();
    let c = req_cursor(&w, 42, 3, "e3", None);
    let long = format!("\"{}\"", "q".repeat(100));
    let verdict = serde_json::json!({"verdict": "new_stream", "reason": "gap", "request_id": long})
        .to_string();
    let (_, fx) = resume(&mut w, &mut host, &c, &verdict);
    assert_settles(&fx, Reason::Gap, serde_json::json!("q".repeat(100)));
}

#[cfg(not(target_arch = "wasm32"))]
mod props {
    use super::*;
    use crate::jsonrpc::tests::gen;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// For any request body a JSON parser reads, the settling answer's ids are the body's ids:
        /// raw-text equal, and equal as serde_json reads both (when it can).
        #[test]
        fn the_settling_answer_names_the_bodys_own_ids(
            (body, ids) in gen::body(),
            cut in 0usize..512,
            path in prop::sample::select(PATHS.to_vec()),
        ) {
            let carried = match body.as_bytes().first() {
                Some(b'[') => format!("[{}]", ids.join(",")),
                _ => ids.concat(),
            };
            let want: Vec<&str> = if carried.len() > MAX_REQUEST_IDS_BYTES {
                vec!["null"]
            } else {
                ids.iter().map(String::as_str).collect()
            };
            assert_settles_with(&body, cut, &want, path);
        }
    }
}
