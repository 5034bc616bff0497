//! The exchange's rules, driven through the mock host.
use super::*;
use crate::cursor::Cursor;
use crate::host::{Effect, MockHost};
use crate::ownership::{BranchQuery, RecordBatch, ResumeQuery};

const SECRET: &str = "17Vjr1MOFuUicxThufiY1oswS2eQj+6Y1DdNdURfwT0=";
const OWNER: &str = "127.0.0.1:9101";
const SID: &str = "s-1";

fn config(extra: &str) -> Config {
    let json = format!(
        r#"{{"ownership":{{"cluster":"mcp_ownership"}},"keys":[{{"id":1,"secret":"{SECRET}","active":true}}]{extra}}}"#
    );
    Config::from_json(json.as_bytes()).unwrap()
}

fn worker() -> Worker {
    Worker::new(config(""))
}

type Headers = Vec<(String, Vec<u8>)>;

fn hdrs(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.as_bytes().to_vec()))
        .collect()
}

fn get(extra: &[(&str, &str)]) -> Headers {
    let mut h = hdrs(&[
        (":method", "GET"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    h.extend(hdrs(extra));
    h
}

fn sse_ok() -> Headers {
    hdrs(&[(":status", "200"), ("content-type", "text/event-stream")])
}

fn rq(ex: &mut Exchange, w: &mut Worker, host: &mut MockHost, h: &[(String, Vec<u8>)]) -> Action {
    ex.on_request_headers(w, host, Some(h))
}

fn rs(ex: &mut Exchange, w: &mut Worker, host: &mut MockHost, h: &[(String, Vec<u8>)]) -> Action {
    ex.on_response_headers(w, host, Some(h), false)
}

fn bd(ex: &mut Exchange, w: &mut Worker, host: &mut MockHost, chunk: &[u8], eos: bool) -> Action {
    ex.on_response_body(w, host, Some(chunk), eos)
}

fn cursor(w: &Worker, inc: u64, seq: u64, id: &str) -> String {
    w.config.keyring.encode(&Cursor {
        request_id: None,
        session: crate::cursor::session_binding(SID.as_bytes()),
        incarnation: inc,
        kind: StreamKind::Get,
        seq,
        replica_event_id: Some(id),
    })
}

fn ids_in(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(str::to_string)
        .collect()
}

fn local_reply(effects: &[Effect]) -> Option<(u16, String)> {
    effects.iter().find_map(|e| match e {
        Effect::LocalResponse { status, body, .. } => {
            Some((*status, String::from_utf8_lossy(body).into_owned()))
        }
        _ => None,
    })
}

fn set_req(effects: &[Effect], name: &str) -> Option<String> {
    effects.iter().find_map(|e| match e {
        Effect::SetRequestHeader(k, v) if k == name => Some(v.clone()),
        _ => None,
    })
}

fn set_resp(effects: &[Effect], name: &str) -> Option<String> {
    effects.iter().find_map(|e| match e {
        Effect::SetResponseHeader(k, v) if k == name => Some(v.clone()),
        _ => None,
    })
}

fn removed_req(effects: &[Effect], name: &str) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::RemoveRequestHeader(k) if k == name))
}

/// Ticks until the queue is empty, answering every batch with 200; returns the records sent.
fn drain_records(w: &mut Worker, host: &mut MockHost) -> Vec<Record> {
    let mut out = Vec::new();
    for _ in 0..100 {
        host.take();
        w.on_tick(host);
        let Some((token, body)) = host.last_dispatch() else {
            break;
        };
        let batch: RecordBatch = serde_json::from_slice(body).unwrap();
        let n = batch.records.len();
        out.extend(batch.records);
        let ack = format!(r#"{{"applied":{n}}}"#);
        w.on_records_response(host, token, Some(200), Some(ack.as_bytes()));
    }
    out
}

/// A GET with a cursor, answered by the ownership service with `verdict`.
fn resume(
    w: &mut Worker,
    host: &mut MockHost,
    cursor: &str,
    verdict: &str,
) -> (Exchange, Vec<Effect>) {
    let mut ex = Exchange::new();
    let a = rq(&mut ex, w, host, &get(&[("last-event-id", cursor)]));
    assert_eq!(a, Action::Pause);
    let (token, body) = host.last_dispatch().expect("no callout");
    let q: Result<ResumeQuery, _> = serde_json::from_slice(body);
    assert!(q.is_ok());
    host.take();
    ex.on_callout_response(w, host, token, Some(200), Some(verdict.as_bytes()));
    (ex, host.take())
}

#[test]
fn a_fresh_stream_is_rewritten_and_recorded() {
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    assert_eq!(rq(&mut ex, &mut w, &mut host, &get(&[])), Action::Continue);
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    assert!(ex.wants_body());
    bd(
        &mut ex,
        &mut w,
        &mut host,
        b"id: e1\ndata: a\n\nid: e2\ndata: b\n\n",
        false,
    );
    let ids = ids_in(&host.body());
    assert_eq!(ids.len(), 2);
    let c = w.config.keyring.decode(&ids[1]).map(|c| c.seq);
    assert_eq!(c, Ok(2));
    let records = drain_records(&mut w, &mut host);
    assert!(matches!(records.first(), Some(Record::StreamOpen { owner, .. }) if owner == OWNER));
    assert!(
        matches!(records.get(1), Some(Record::Events { first_seq: 1, ids, .. }) if ids.len() == 2)
    );
    assert_eq!(host.stat(Stat::RecordsSent), 2);
    assert_eq!(host.stat(Stat::EventsRewritten), 2);
}

/// Opens an SSE GET stream of session `sid` on `w`.
fn open_get(w: &mut Worker, host: &mut MockHost, sid: &str) -> Exchange {
    let mut ex = Exchange::new();
    let h = hdrs(&[
        (":method", "GET"),
        (":path", "/mcp"),
        ("mcp-session-id", sid),
    ]);
    assert_eq!(rq(&mut ex, w, host, &h), Action::Continue);
    rs(&mut ex, w, host, &sse_ok());
    assert!(ex.wants_body());
    ex
}

#[test]
fn stream_setup_asks_the_host_for_time_and_randomness_once_per_worker_tick() {
    let mut w = worker();
    let mut host = MockHost::new();
    for sid in ["s-1", "s-2", "s-3"] {
        open_get(&mut w, &mut host, sid);
    }
    // Incarnations come from the worker's generator, seeded once; the time from its clock.
    assert_eq!(host.random_draws, 1);
    assert_eq!(host.clock_reads.get(), 1);
    // The stat is batched: added once per tick.
    assert_eq!(host.stat(Stat::StreamsOpened), 0);
    let t0 = host.now_ms;
    assert_eq!(opened_ms(drain_records(&mut w, &mut host)), [t0, t0, t0]);
    assert_eq!(host.stat(Stat::StreamsOpened), 3);
    // The tick makes the clock stale: the next stream reads it once more.
    let (reads, draws) = (host.clock_reads.get(), host.random_draws);
    host.now_ms += 10;
    open_get(&mut w, &mut host, "s-4");
    open_get(&mut w, &mut host, "s-5");
    assert_eq!(host.clock_reads.get(), reads + 1);
    assert_eq!(host.random_draws, draws);
    let t1 = t0 + 10;
    assert_eq!(opened_ms(drain_records(&mut w, &mut host)), [t1, t1]);
}

fn opened_ms(records: Vec<Record>) -> Vec<u64> {
    records
        .into_iter()
        .filter_map(|r| match r {
            Record::StreamOpen { opened_ms, .. } => Some(opened_ms),
            _ => None,
        })
        .collect()
}

#[test]
fn incarnations_are_distinct_per_worker_and_differ_between_workers() {
    let incarnations = |rng: u64| {
        let mut w = worker();
        let mut host = MockHost::new();
        host.rng = rng;
        for i in 0..200 {
            open_get(&mut w, &mut host, &format!("s-{}", i % 3));
        }
        drain_records(&mut w, &mut host)
            .into_iter()
            .filter_map(|r| match r {
                Record::StreamOpen { incarnation, .. } => Some(incarnation),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let a = incarnations(1);
    let b = incarnations(2);
    assert_eq!(a.len(), 200);
    let mut all: Vec<&String> = a.iter().chain(&b).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 400, "an incarnation id repeated");
}

#[test]
fn a_continued_cursor_goes_to_the_owner_with_the_replica_id() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let verdict =
        format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":["e8"],"head":8}}"#);
    let (mut ex, fx) = resume(&mut w, &mut host, &c, &verdict);
    assert_eq!(set_req(&fx, "last-event-id").as_deref(), Some("e7"));
    assert_eq!(
        set_req(&fx, "x-mcp-owner").as_deref(),
        Some("MTI3LjAuMC4xOjkxMDE=")
    );
    assert!(fx.contains(&Effect::ResumeRequest));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(
        &mut ex,
        &mut w,
        &mut host,
        b"id: e8\ndata: 8\n\nid: e9\ndata: 9\n\n",
        false,
    );
    let seqs: Vec<u64> = ids_in(&host.body())
        .iter()
        .filter_map(|i| w.config.keyring.decode(i).ok())
        .map(|c| c.seq)
        .collect();
    assert_eq!(seqs, vec![8, 9]);
    assert_eq!(host.stat(Stat::Continued), 1);
}

#[test]
fn a_foreign_cursor_restarts_with_header_and_control_event() {
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let a = rq(&mut ex, &mut w, &mut host, &get(&[("last-event-id", "e7")]));
    assert_eq!(a, Action::Continue);
    assert!(removed_req(&host.effects, "last-event-id"));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    assert_eq!(
        set_resp(&host.effects, MCP_RESUME_HEADER).as_deref(),
        Some("restarted; reason=foreign_cursor")
    );
    bd(&mut ex, &mut w, &mut host, b"id: e1\ndata: a\n\n", false);
    let body = String::from_utf8_lossy(&host.body()).into_owned();
    assert!(body.starts_with(&control_event(Reason::ForeignCursor)));
    assert_eq!(host.stat(Stat::Refused(Reason::ForeignCursor)), 1);
}

#[test]
fn a_callout_failure_fails_closed() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get(&[("last-event-id", &c)]));
    let (token, _) = host.last_dispatch().unwrap();
    ex.on_callout_response(&mut w, &mut host, token, Some(503), None);
    let fx = host.take();
    assert!(removed_req(&fx, "last-event-id"));
    assert!(set_req(&fx, "last-event-id").is_none());
    assert_eq!(host.stat(Stat::CalloutFailures(CalloutFailure::Status)), 1);
    assert_eq!(host.stat(Stat::Refused(Reason::OwnershipUnavailable)), 1);
}

#[test]
fn an_owner_out_of_the_cluster_is_a_rejection_and_a_lost_stream() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let verdict = format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":[],"head":7}}"#);
    let (mut ex, _) = resume(&mut w, &mut host, &c, &verdict);
    host.upstream = None;
    host.code_details = Some(OWNER_NOT_IN_CLUSTER.into());
    rs(&mut ex, &mut w, &mut host, &hdrs(&[(":status", "503")]));
    let reply = local_reply(&host.effects);
    assert!(matches!(reply, Some((409, b)) if b.contains("owner_unavailable")));
    let records = drain_records(&mut w, &mut host);
    assert!(matches!(records.as_slice(), [Record::StreamLost { .. }]));
}

#[test]
fn streams_with_long_ids_continue() {
    for len in [1_500, 16 * 1024] {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = Exchange::new();
        rq(&mut ex, &mut w, &mut host, &get(&[]));
        rs(&mut ex, &mut w, &mut host, &sse_ok());
        let id = |n: u32| format!("{n}-{}", "x".repeat(len));
        let chunk = format!("id: {}\ndata: a\n\nid: {}\ndata: b\n\n", id(1), id(2));
        bd(&mut ex, &mut w, &mut host, chunk.as_bytes(), false);
        let cursors = ids_in(&host.body());
        assert_eq!(cursors.len(), 2);
        let records = drain_records(&mut w, &mut host);
        assert_eq!(host.stat(Stat::RecordsInvalid), 0);
        let Some(Record::Events { ids, long, .. }) = records.get(1) else {
            panic!("{records:?}")
        };
        assert_eq!(long.len(), 2, "full ids kept for resumption");
        // The store answers the cursor at seq 1 with the recorded seq 2 and the full id of seq 1.
        let verdict = serde_json::json!({
            "verdict": "continue", "owner": OWNER, "expected": [ids[1]], "head": 2,
            "resume_id": long[0].id,
        })
        .to_string();
        let (mut ex, fx) = resume(&mut w, &mut host, &cursors[0], &verdict);
        assert_eq!(set_req(&fx, "last-event-id"), Some(id(1)));
        rs(&mut ex, &mut w, &mut host, &sse_ok());
        let replay = format!(
            "id: {}\ndata: echo\n\nid: {}\ndata: b\n\nid: e3\ndata: c\n\n",
            id(1),
            id(2)
        );
        bd(&mut ex, &mut w, &mut host, replay.as_bytes(), false);
        let body = String::from_utf8_lossy(&host.body()).into_owned();
        assert!(!body.contains("mcp-resume"), "{len}: continues: {body}");
        let seqs: Vec<u64> = ids_in(body.as_bytes())
            .iter()
            .filter_map(|i| w.config.keyring.decode(i).ok())
            .map(|c| c.seq)
            .collect();
        assert_eq!(seqs, vec![2, 3]);
        // Without the full id the store cannot resume it: a named refusal, never a guess.
        let verdict =
            format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":[],"head":1}}"#);
        let (_, fx) = resume(&mut w, &mut host, &cursors[0], &verdict);
        assert!(set_req(&fx, "last-event-id").is_none());
        assert!(host.stat(Stat::Refused(Reason::UnknownStream)) >= 1);
    }
}

#[test]
fn client_and_replica_values_never_make_a_record_invalid() {
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let h = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        (
            "mcp-protocol-version",
            "2025-06-18 \u{7f} and a very long tail that goes on and on and on",
        ),
    ]);
    rq(&mut ex, &mut w, &mut host, &h);
    let mut resp = sse_ok();
    resp.extend(hdrs(&[("mcp-session-id", "new")]));
    rs(&mut ex, &mut w, &mut host, &resp);
    let huge = "z".repeat(200 * 1024);
    let chunk = format!("id: {huge}\ndata: a\n\nid: \u{1}\"\\\ndata: b\n\n");
    bd(&mut ex, &mut w, &mut host, chunk.as_bytes(), true);
    let records = drain_records(&mut w, &mut host);
    assert_eq!(host.stat(Stat::RecordsInvalid), 0);
    assert!(
        matches!(records.first(), Some(Record::SessionOpen { version, .. }) if version == INVALID_VERSION)
    );
    assert!(records.iter().all(|r| r.validate().is_ok()));
}

fn removed_resp(effects: &[Effect], name: &str) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::RemoveResponseHeader(k) if k == name))
}

#[test]
fn a_pin_is_never_honoured_on_any_path_and_no_response_carries_it() {
    let mut w = worker();
    let owner = ("x-mcp-owner", "MTI3LjAuMC4xOjkxMDI=");
    for path in ["/other", "/mcp", "//mcp/", "/healthz?x", "/%6dcp"] {
        let mut host = MockHost::new();
        let mut ex = Exchange::new();
        let h = hdrs(&[(":method", "GET"), (":path", path), owner]);
        rq(&mut ex, &mut w, &mut host, &h);
        assert!(removed_req(&host.effects, "x-mcp-owner"), "{path}");
        assert!(set_req(&host.effects, "x-mcp-owner").is_none(), "{path}");
        // The response side, read or not.
        host.take();
        if ex.wants_response_headers() {
            let mut r = sse_ok();
            r.extend(hdrs(&[owner]));
            rs(&mut ex, &mut w, &mut host, &r);
        } else {
            ex.on_response_headers_unread(&mut w, &mut host);
        }
        assert!(removed_resp(&host.effects, "x-mcp-owner"), "{path}");
    }
    // A local reply too, and a response whose headers cannot be read.
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let verdict = format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":[],"head":7}}"#);
    let (mut ex, _) = resume(&mut w, &mut host, &c, &verdict);
    ex.on_response_headers::<_, (String, Vec<u8>)>(&mut w, &mut host, None, false);
    assert!(removed_resp(&host.effects, "x-mcp-owner"));
    host.take();
    ex.on_response_headers_unread(&mut w, &mut host);
    assert!(removed_resp(&host.effects, "x-mcp-owner"));
}

#[test]
fn mcp_paths_match_after_normalization() {
    let mut w = worker();
    for path in ["//mcp", "/mcp/", "/a/../mcp?x=1", "/%6Dcp"] {
        let mut host = MockHost::new();
        let mut ex = Exchange::new();
        let h = hdrs(&[(":method", "GET"), (":path", path), ("last-event-id", "e7")]);
        rq(&mut ex, &mut w, &mut host, &h);
        assert!(
            removed_req(&host.effects, "last-event-id"),
            "{path}: guarded"
        );
    }
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let h = hdrs(&[
        (":method", "GET"),
        (":path", "/mcpx"),
        ("last-event-id", "e7"),
    ]);
    rq(&mut ex, &mut w, &mut host, &h);
    assert!(host.effects.is_empty(), "not an MCP path");
}

#[test]
fn ambiguous_headers_are_refused_by_name() {
    let mut w = worker();
    let c = cursor(&w, 42, 7, "e7");
    // A repeated Mcp-Session-Id is refused outright (exchange_session_tests.rs).
    let cases: [Vec<(&str, &str)>; 2] = [
        vec![("last-event-id", &c), ("last-event-id", "e1")],
        vec![
            ("last-event-id", &c),
            ("mcp-protocol-version", "2025-06-18"),
            ("mcp-protocol-version", "2026-07-28"),
        ],
    ];
    for extra in cases {
        let mut host = MockHost::new();
        let mut ex = Exchange::new();
        rq(&mut ex, &mut w, &mut host, &get(&extra));
        assert!(removed_req(&host.effects, "last-event-id"));
        assert!(host.last_dispatch().is_none(), "no callout for {extra:?}");
        assert_eq!(host.stat(Stat::Refused(Reason::DuplicateHeader)), 1);
        rs(&mut ex, &mut w, &mut host, &sse_ok());
        assert_eq!(
            set_resp(&host.effects, MCP_RESUME_HEADER).as_deref(),
            Some("restarted; reason=duplicate_header")
        );
    }
}

#[test]
fn session_ids_are_hashed_as_raw_bytes() {
    let mut w = worker();
    let cursor_of = |w: &Worker, sid: &[u8]| {
        w.config.keyring.encode(&Cursor {
            request_id: None,
            session: crate::cursor::session_binding(sid),
            incarnation: 9,
            kind: StreamKind::Get,
            seq: 1,
            replica_event_id: Some("e1"),
        })
    };
    let h = |c: &str, sid: &[u8]| -> Headers {
        let mut h = hdrs(&[(":method", "GET"), (":path", "/mcp"), ("last-event-id", c)]);
        h.push(("mcp-session-id".into(), sid.to_vec()));
        h
    };
    let raw = b"s-1";
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let req = h(&cursor_of(&w, raw), raw);
    rq(&mut ex, &mut w, &mut host, &req);
    let (_, body) = host.last_dispatch().expect("bound to the raw bytes: asked");
    let q: ResumeQuery = serde_json::from_slice(body).unwrap();
    assert_eq!(q.session, crate::cursor::session_key(raw));
    // Bytes a lossy reading would fold together (invalid UTF-8 and its U+FFFD spelling) are no
    // session id at all: refused before any callout, so no two spellings share a binding.
    let odd: Vec<u8> = vec![b's', 0xff, 0xfe, b'1'];
    let lossy = String::from_utf8_lossy(&odd).into_owned();
    let c = cursor_of(&w, &odd);
    for sid in [odd.as_slice(), lossy.as_bytes()] {
        let mut host = MockHost::new();
        let mut ex = Exchange::new();
        rq(&mut ex, &mut w, &mut host, &h(&c, sid));
        assert!(host.last_dispatch().is_none(), "{sid:?}");
        assert_eq!(host.stat(Stat::Refused(Reason::BadSessionId)), 1);
    }
}

fn body_str(host: &MockHost) -> String {
    String::from_utf8_lossy(&host.body()).into_owned()
}

/// A `continue` verdict of branch `branch` (0: the store registered none).
fn branch_verdict(expected: &[&str], head: u64, branch: u64) -> String {
    let expected = serde_json::to_string(expected).unwrap();
    let b = match branch {
        0 => String::new(),
        n => format!(r#","branch":{n}"#),
    };
    format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":{expected},"head":{head}{b}}}"#)
}

/// Ticks until the queue is empty; `reject` names the records the store refuses (by error).
fn drain_rejecting(
    w: &mut Worker,
    host: &mut MockHost,
    reject: impl Fn(&Record) -> Option<&'static str>,
) -> Vec<Record> {
    let mut out = Vec::new();
    for _ in 0..100 {
        host.take();
        w.on_tick(host);
        let Some((token, body)) = host.last_dispatch() else {
            break;
        };
        let batch: RecordBatch = serde_json::from_slice(body).unwrap();
        let rejected: Vec<_> = batch
            .records
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                reject(r).map(|e| serde_json::json!({"index": i, "error": e, "detail": "test"}))
            })
            .collect();
        let ack = serde_json::json!({"applied": batch.records.len() - rejected.len(), "rejected": rejected});
        out.extend(batch.records);
        w.on_records_response(host, token, Some(200), Some(ack.to_string().as_bytes()));
    }
    out
}

fn events_of(branch: u64) -> impl Fn(&Record) -> Option<&'static str> {
    move |r| matches!(r, Record::Events { branch: b, .. } if *b == branch).then_some("forked")
}

/// The held end's question to the store, answered.
fn answer_end(
    ex: &mut Exchange,
    w: &mut Worker,
    host: &mut MockHost,
    answer: Option<&str>,
) -> BranchQuery {
    let (token, body) = host.last_dispatch().expect("no branch callout");
    let q: BranchQuery = serde_json::from_slice(body).unwrap();
    host.take();
    match answer {
        Some(a) => ex.on_callout_response(w, host, token, Some(200), Some(a.as_bytes())),
        None => ex.on_callout_response(w, host, token, None, None),
    }
    q
}

fn held_tail(effects: &[Effect]) -> Option<String> {
    effects.iter().find_map(|e| match e {
        Effect::FinishHeld(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    })
}

/// Two continuations of one cursor fed at once: the store refuses the older branch's events,
/// and that branch ends explicitly at its next chunk while the newer goes on.
#[test]
fn a_branch_the_store_overtook_ends_forked_at_its_next_chunk() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let (mut a, _) = resume(&mut w, &mut host, &c, &branch_verdict(&["e8"], 8, 1));
    rs(&mut a, &mut w, &mut host, &sse_ok());
    bd(&mut a, &mut w, &mut host, b"id: e8\ndata: 8\n\n", false);
    // The client reconnects (its first connection half-open) with the same cursor.
    let (mut b, _) = resume(&mut w, &mut host, &c, &branch_verdict(&["e8"], 8, 2));
    rs(&mut b, &mut w, &mut host, &sse_ok());
    host.take();
    bd(
        &mut b,
        &mut w,
        &mut host,
        b"id: e8\ndata: 8\n\nid: e9\ndata: 9\n\n",
        false,
    );
    assert_eq!(
        ids_in(&host.body()).len(),
        2,
        "the newest is never locked out"
    );
    let sent = drain_rejecting(&mut w, &mut host, events_of(1));
    let branches: Vec<u64> = sent
        .iter()
        .filter_map(|r| match r {
            Record::Events { branch, .. } => Some(*branch),
            _ => None,
        })
        .collect();
    assert_eq!(branches, [1, 2], "each branch's events carry its number");
    // The store's word on a branch is not a bad record: not counted as one.
    assert_eq!(host.stat(Stat::RecordsRejected), 0);
    // The older one's next chunk: the explicit end, nothing of the chunk relayed.
    host.take();
    bd(&mut a, &mut w, &mut host, b"id: e10\ndata: 10\n\n", false);
    assert_eq!(body_str(&host), control_event(Reason::Forked));
    host.take();
    bd(&mut a, &mut w, &mut host, b"id: e11\ndata: 11\n\n", false);
    assert!(host.effects.contains(&Effect::ResetResponse));
    a.on_stream_end(&mut w, &mut host);
    // The newer goes on; the older recorded no stream loss, and its end.
    host.take();
    bd(&mut b, &mut w, &mut host, b"id: e10\ndata: 10\n\n", false);
    assert_eq!(ids_in(&host.body()).len(), 1);
    let records = drain_records(&mut w, &mut host);
    assert!(!records
        .iter()
        .any(|r| matches!(r, Record::StreamLost { .. })));
    assert!(records
        .iter()
        .any(|r| matches!(r, Record::BranchEnd { branch: 1, .. })));
    assert_eq!(host.stat(Stat::Forked), 1);
    assert_eq!(host.stat(Stat::ReplayMismatch), 0);
    assert!(w.overtaken.is_empty(), "the word was taken");
}

/// A branch the replica ends holds its end and asks the store: an empty replay ended for a
/// newer reader is `forked`; without another open branch the same end is a replay mismatch.
#[test]
fn an_older_continuation_that_ends_empty_is_forked_not_a_mismatch() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let (mut a, _) = resume(&mut w, &mut host, &c, &branch_verdict(&["e8"], 8, 1));
    rs(&mut a, &mut w, &mut host, &sse_ok());
    host.take();
    assert_eq!(bd(&mut a, &mut w, &mut host, b"", true), Action::Pause);
    let q = answer_end(&mut a, &mut w, &mut host, Some(r#"{"forked":true}"#));
    assert_eq!((q.incarnation.as_str(), q.branch), ("000000000000002a", 1));
    assert_eq!(
        held_tail(&host.effects).as_deref(),
        Some(control_event(Reason::Forked).as_str())
    );
    a.on_stream_end(&mut w, &mut host);
    let records = drain_records(&mut w, &mut host);
    // No loss; the end the store already knows follows the branch's own records once more
    // (one of them landing later must not bring the branch back open), and only once.
    assert!(
        matches!(
            records.as_slice(),
            [Record::Events { ids, branch: 1, .. }, Record::BranchEnd { branch: 1, .. }]
                if ids.is_empty()
        ),
        "{records:?}"
    );
    // Without a newer branch the same end is a replay mismatch, as before.
    let (mut d, _) = resume(&mut w, &mut host, &c, &branch_verdict(&["e8"], 8, 3));
    rs(&mut d, &mut w, &mut host, &sse_ok());
    host.take();
    assert_eq!(bd(&mut d, &mut w, &mut host, b"", true), Action::Pause);
    answer_end(&mut d, &mut w, &mut host, Some(r#"{"forked":false}"#));
    assert_eq!(
        held_tail(&host.effects).as_deref(),
        Some(control_event(Reason::ReplayMismatch).as_str())
    );
    let records = drain_records(&mut w, &mut host);
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::StreamLost { .. })),
        "{records:?}"
    );
    assert_eq!(host.stat(Stat::Forked), 1);
}

/// At the head an empty end alone is a quiet, correct end; with another branch open it is the
/// replica closing this one for a newer reader.
#[test]
fn a_clean_end_at_the_head_asks_once_and_is_forked_only_when_another_branch_is_open() {
    for (answer, want) in [
        (r#"{"forked":true}"#, control_event(Reason::Forked)),
        (r#"{"forked":false}"#, String::new()),
    ] {
        let mut w = worker();
        let mut host = MockHost::new();
        let c = cursor(&w, 42, 7, "e7");
        let (mut a, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 1));
        rs(&mut a, &mut w, &mut host, &sse_ok());
        host.take();
        assert_eq!(
            bd(&mut a, &mut w, &mut host, b"id: e8\ndata: 8\n\n", true),
            Action::Pause
        );
        assert_eq!(
            ids_in(&host.body()).len(),
            1,
            "the last chunk goes out before the end is held"
        );
        let n = host
            .effects
            .iter()
            .filter(|e| matches!(e, Effect::Dispatch { .. }))
            .count();
        assert_eq!(n, 1, "asked once");
        answer_end(&mut a, &mut w, &mut host, Some(answer));
        assert_eq!(held_tail(&host.effects).as_deref(), Some(want.as_str()));
    }
}

/// No usable answer, or no callout at all: the store could not say whether a newer reader took
/// the stream, so the end is signalled (`ownership_unavailable`), never passed as the replica's
/// own, counted as a callout failure; the branch's end reaches the store as a record.
#[test]
fn an_end_the_store_cannot_answer_is_signalled_and_recorded() {
    let signal = crate::stream::control_event(Reason::OwnershipUnavailable);
    for (how, failure) in [
        ("no answer", CalloutFailure::NoResponse),
        ("garbage", CalloutFailure::Body),
        ("no dispatch", CalloutFailure::Dispatch),
    ] {
        let mut w = worker();
        let mut host = MockHost::new();
        let c = cursor(&w, 42, 7, "e7");
        let (mut a, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 4));
        rs(&mut a, &mut w, &mut host, &sse_ok());
        host.take();
        host.refuse_dispatch = how == "no dispatch";
        let act = bd(&mut a, &mut w, &mut host, b"", true);
        host.refuse_dispatch = false;
        let tail = match how {
            "no dispatch" => {
                assert_eq!(act, Action::Continue);
                host.effects.iter().find_map(|e| match e {
                    Effect::BodyChunk(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                })
            }
            "no answer" => {
                answer_end(&mut a, &mut w, &mut host, None);
                held_tail(&host.effects)
            }
            _ => {
                answer_end(&mut a, &mut w, &mut host, Some("{"));
                held_tail(&host.effects)
            }
        };
        assert_eq!(tail.as_deref(), Some(signal.as_str()), "{how}");
        assert_eq!(host.stat(Stat::CalloutFailures(failure)), 1, "{how}");
        a.on_stream_end(&mut w, &mut host);
        let records = drain_records(&mut w, &mut host);
        assert!(
            matches!(
                records.as_slice(),
                [Record::Events { ids, branch: 4, .. }, Record::BranchEnd { branch: 4, .. }]
                    if ids.is_empty()
            ),
            "{how}: {records:?}"
        );
        assert_eq!(host.stat(Stat::Forked), 0);
    }
}

/// A registered continuation its owner answered (200 SSE) says so at once, before any event
/// (`events` without ids from its first seq): the store counts it as relaying, and a failure it
/// held for the stream passed. Events that follow join that record; a branch the store did not
/// register, and a fresh stream, send none.
#[test]
fn a_continuation_its_owner_answered_says_so_before_any_event() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let answered = |records: &[Record]| -> Vec<(u64, u64, usize)> {
        records
            .iter()
            .filter_map(|r| match r {
                Record::Events {
                    first_seq,
                    ids,
                    branch,
                    ..
                } => Some((*branch, *first_seq, ids.len())),
                _ => None,
            })
            .collect()
    };
    // Quiet at the head: the answer alone.
    let (mut a, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 3));
    rs(&mut a, &mut w, &mut host, &sse_ok());
    assert_eq!(answered(&drain_records(&mut w, &mut host)), [(3, 8, 0)]);
    // Events that follow in the same flush join it.
    let (mut b, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 5));
    rs(&mut b, &mut w, &mut host, &sse_ok());
    bd(&mut b, &mut w, &mut host, b"id: e8\ndata: 8\n\n", false);
    assert_eq!(answered(&drain_records(&mut w, &mut host)), [(5, 8, 1)]);
    // Not registered, or a fresh stream: nothing before its events.
    let (mut d, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 0));
    rs(&mut d, &mut w, &mut host, &sse_ok());
    let mut f = Exchange::new();
    rq(&mut f, &mut w, &mut host, &get(&[]));
    rs(&mut f, &mut w, &mut host, &sse_ok());
    assert_eq!(answered(&drain_records(&mut w, &mut host)), []);
    for x in [&mut a, &mut b, &mut d, &mut f] {
        x.on_stream_end(&mut w, &mut host);
    }
}

/// Every end of a registered branch reaches the store once; fresh streams and branches the
/// store did not register cost nothing.
#[test]
fn branch_ends_are_reported_once_and_only_for_registered_branches() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    // Reset mid-stream (client gone): reported at the stream's end.
    let (mut a, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 2));
    rs(&mut a, &mut w, &mut host, &sse_ok());
    bd(&mut a, &mut w, &mut host, b"id: e8\ndata: 8\n\n", false);
    a.on_stream_end(&mut w, &mut host);
    a.on_stream_end(&mut w, &mut host);
    // Refused by the owner before it relayed: reported at once, not again at the end.
    let (mut b, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 3));
    host.code_details = Some("via_upstream".into());
    rs(&mut b, &mut w, &mut host, &hdrs(&[(":status", "503")]));
    b.on_stream_end(&mut w, &mut host);
    // Not registered (the store could not): no question at its end, no record.
    let (mut d, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 0));
    rs(&mut d, &mut w, &mut host, &sse_ok());
    host.take();
    assert_eq!(bd(&mut d, &mut w, &mut host, b"", true), Action::Continue);
    d.on_stream_end(&mut w, &mut host);
    // A fresh stream: nothing either.
    let mut f = Exchange::new();
    rq(&mut f, &mut w, &mut host, &get(&[]));
    rs(&mut f, &mut w, &mut host, &sse_ok());
    assert_eq!(
        bd(&mut f, &mut w, &mut host, b"id: x\ndata: 1\n\n", true),
        Action::Continue
    );
    f.on_stream_end(&mut w, &mut host);
    let ends: Vec<u64> = drain_records(&mut w, &mut host)
        .iter()
        .filter_map(|r| match r {
            Record::BranchEnd { branch, .. } => Some(*branch),
            _ => None,
        })
        .collect();
    assert_eq!(ends, [2, 3]);
}

/// The stream's first response (branch 0) ends at its next chunk once the store refused its
/// events: a continuation of it relays now.
#[test]
fn the_original_stream_is_forked_by_a_continuation_of_it() {
    let mut w = worker();
    let mut host = MockHost::new();
    let mut a = Exchange::new();
    rq(&mut a, &mut w, &mut host, &get(&[]));
    rs(&mut a, &mut w, &mut host, &sse_ok());
    bd(&mut a, &mut w, &mut host, b"id: e1\ndata: 1\n\n", false);
    let first = ids_in(&host.body());
    let (mut b, _) = resume(&mut w, &mut host, &first[0], &branch_verdict(&[], 1, 1));
    rs(&mut b, &mut w, &mut host, &sse_ok());
    // Without the store's word the original goes on (the replica may still feed it alone).
    host.take();
    bd(&mut a, &mut w, &mut host, b"id: e2\ndata: 2\n\n", false);
    assert_eq!(ids_in(&host.body()).len(), 1);
    drain_rejecting(&mut w, &mut host, events_of(0));
    host.take();
    bd(&mut a, &mut w, &mut host, b"id: e3\ndata: 3\n\n", false);
    assert_eq!(body_str(&host), control_event(Reason::Forked));
}

/// Events the store found recorded with other events: the branch's replica diverged from the
/// log; it is cut with `replay_mismatch`.
#[test]
fn a_branch_whose_events_diverge_from_the_records_is_cut() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    // At the recorded head while the successors' records are still in flight: nothing to check.
    let (mut a, _) = resume(&mut w, &mut host, &c, &branch_verdict(&[], 7, 1));
    rs(&mut a, &mut w, &mut host, &sse_ok());
    bd(
        &mut a,
        &mut w,
        &mut host,
        b"id: n1\ndata: fresh counter\n\n",
        false,
    );
    drain_rejecting(&mut w, &mut host, |r| {
        matches!(r, Record::Events { .. }).then_some("replay_mismatch")
    });
    host.take();
    bd(&mut a, &mut w, &mut host, b"id: n2\ndata: 2\n\n", false);
    assert_eq!(body_str(&host), control_event(Reason::ReplayMismatch));
    assert_eq!(host.stat(Stat::ReplayMismatch), 1);
}

#[test]
fn polling_reconnects_stay_continuations() {
    // 2025-11-25 polling: the server ends each stream after its events; the client resumes.
    let mut w = worker();
    let mut host = MockHost::new();
    let mut last = cursor(&w, 42, 7, "e7");
    for round in 0..5u64 {
        let seq = 7 + round;
        let verdict =
            format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":[],"head":{seq}}}"#);
        let (mut ex, fx) = resume(&mut w, &mut host, &last, &verdict);
        assert!(set_req(&fx, "last-event-id").is_some(), "round {round}");
        rs(&mut ex, &mut w, &mut host, &sse_ok());
        let chunk = format!("id: p{round}\ndata: poll\n\n");
        bd(&mut ex, &mut w, &mut host, chunk.as_bytes(), true);
        let body = body_str(&host);
        assert!(!body.contains("mcp-resume"), "round {round}: {body}");
        last = ids_in(&host.body()).pop().unwrap_or_default();
        host.take();
    }
    assert_eq!(host.stat(Stat::Forked), 0);
    assert_eq!(host.stat(Stat::Continued), 5);
}

#[test]
fn host_failures_fail_closed() {
    let mut w = worker();
    // Request headers that cannot be read: answered locally, cursor and pin removed.
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let a = ex.on_request_headers::<_, (String, Vec<u8>)>(&mut w, &mut host, None);
    assert_eq!(a, Action::Pause);
    assert!(removed_req(&host.effects, "last-event-id"));
    assert!(removed_req(&host.effects, "x-mcp-owner"));
    assert!(matches!(local_reply(&host.effects), Some((409, b)) if b.contains("host_error")));
    // A body chunk that cannot be read cuts the stream with the control event.
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get(&[]));
    rs(&mut ex, &mut w, &mut host, &sse_ok());
    bd(&mut ex, &mut w, &mut host, b"id: e1\ndata: 1\n\n", false);
    host.take();
    ex.on_response_body(&mut w, &mut host, None, false);
    assert_eq!(body_str(&host), control_event(Reason::HostError));
    host.take();
    bd(&mut ex, &mut w, &mut host, b"id: e2\ndata: 2\n\n", false);
    assert!(host.effects.contains(&Effect::ResetResponse));
    assert_eq!(host.stat(Stat::HostErrors), 1);
    // Response headers that cannot be read on an MCP request: rejected locally.
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    rq(&mut ex, &mut w, &mut host, &get(&[]));
    ex.on_response_headers::<_, (String, Vec<u8>)>(&mut w, &mut host, None, false);
    assert!(matches!(local_reply(&host.effects), Some((409, b)) if b.contains("host_error")));
}

#[test]
fn a_rewritten_streams_length_is_removed_only_when_it_has_one() {
    let removed = |resp: Headers| {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = Exchange::new();
        rq(&mut ex, &mut w, &mut host, &get(&[]));
        rs(&mut ex, &mut w, &mut host, &resp);
        host.take()
            .iter()
            .any(|e| matches!(e, Effect::RemoveResponseHeader(n) if n == "content-length"))
    };
    let mut with_length = sse_ok();
    with_length.extend(hdrs(&[("Content-Length", "15")]));
    assert!(
        removed(with_length),
        "a stale length would cut the rewritten stream"
    );
    assert!(!removed(sse_ok()), "no length: no host call");
}

/// The ids a client is handed when a fresh `method` request is answered with `response` and a body
/// holding `id: r1`: the raw one when the guard leaves the body alone.
fn fresh_answer_ids(method: &str, response: &[(&str, &str)]) -> Vec<String> {
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let req = hdrs(&[
        (":method", method),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    rq(&mut ex, &mut w, &mut host, &req);
    if ex.wants_request_body() {
        ex.on_request_body(
            Some(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#),
            true,
        );
    }
    rs(&mut ex, &mut w, &mut host, &hdrs(response));
    if !ex.wants_body() {
        return vec!["r1".into()];
    }
    bd(&mut ex, &mut w, &mut host, b"id: r1\ndata: {}\n\n", true);
    let ids = ids_in(&host.body());
    assert!(
        ids.iter().all(|c| w.config.keyring.decode(c).is_ok()),
        "{ids:?}"
    );
    ids
}

#[test]
fn every_answer_a_client_reads_as_sse_has_its_ids_rewritten() {
    let sse = ("content-type", "text/event-stream");
    let read_as_sse: [(&str, &[(&str, &str)]); 8] = [
        // Two headers, which clients join to "text/plain, text/event-stream".
        (
            "POST",
            &[(":status", "200"), ("content-type", "text/plain"), sse],
        ),
        (
            "POST",
            &[
                (":status", "200"),
                ("content-type", "text/plain, text/event-stream"),
            ],
        ),
        // Python takes any value starting with it.
        (
            "POST",
            &[
                (":status", "200"),
                ("content-type", "text/event-stream, text/plain"),
            ],
        ),
        (
            "POST",
            &[
                (":status", "200"),
                ("content-type", "TEXT/Event-Stream;charset=utf-8"),
            ],
        ),
        // The TypeScript SDK reads any 2xx GET body as SSE.
        ("GET", &[(":status", "200"), ("content-type", "text/plain")]),
        ("GET", &[(":status", "200")]),
        // Python reads a POST's body below 400 unless it is a redirect.
        ("POST", &[(":status", "300"), sse]),
        ("POST", &[(":status", "307"), sse]),
    ];
    for (method, response) in read_as_sse {
        let ids = fresh_answer_ids(method, response);
        assert!(
            ids.len() == 1 && ids[0] != "r1",
            "{method} {response:?}: {ids:?}"
        );
    }
    // Nobody reads these as SSE: the guard leaves them alone.
    let not_sse: [(&str, &[(&str, &str)]); 3] = [
        (
            "POST",
            &[(":status", "200"), ("content-type", "text/plain")],
        ),
        (
            "POST",
            &[(":status", "307"), ("location", "/elsewhere"), sse],
        ),
        ("GET", &[(":status", "404"), sse]),
    ];
    for (method, response) in not_sse {
        assert_eq!(
            fresh_answer_ids(method, response),
            ["r1"],
            "{method} {response:?}"
        );
    }
}

/// The `Content-Type` values a client gets: the replica's, edited by the effects as a host does
/// at worst (a set replaces only the first instance; a remove takes every one).
fn client_content_types(response: &[(String, Vec<u8>)], effects: &[Effect]) -> Vec<String> {
    let mut cts: Vec<String> = response
        .iter()
        .filter(|(k, _)| k == "content-type")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .collect();
    for e in effects {
        match e {
            Effect::RemoveResponseHeader(k) if k == "content-type" => cts.clear(),
            Effect::SetResponseHeader(k, v) if k == "content-type" => match cts.first_mut() {
                Some(first) => v.clone_into(first),
                None => cts.push(v.clone()),
            },
            _ => {}
        }
    }
    cts
}

#[test]
fn every_stream_relayed_reaches_clients_as_plain_text_event_stream() {
    // Whatever parameters the replica sent, no client decodes the body by anything but UTF-8,
    // as the guard parses it: fresh streams (GET, POST) and continuations alike.
    let sse_shapes: [&[(&str, &str)]; 6] = [
        &[("content-type", "text/event-stream; charset=utf-8")],
        &[("content-type", "TEXT/Event-Stream;charset=\"UTF8\"; x=1")],
        &[("content-type", "text/event-stream; charset*0=utf-8")],
        &[
            ("content-type", "text/event-stream;charset=utf-8"),
            ("content-type", "text/plain"),
        ],
        &[("content-type", "text/plain")],
        &[],
    ];
    for shape in sse_shapes {
        let response = hdrs(&[&[(":status", "200")], shape].concat());
        for method in ["GET", "POST"] {
            let post_reads_sse = shape.iter().any(|(_, v)| v.contains("vent-"));
            if method == "POST" && !post_reads_sse {
                continue;
            }
            let mut w = worker();
            let mut host = MockHost::new();
            let mut ex = Exchange::new();
            let req = hdrs(&[
                (":method", method),
                (":path", "/mcp"),
                ("mcp-session-id", SID),
            ]);
            rq(&mut ex, &mut w, &mut host, &req);
            if ex.wants_request_body() {
                ex.on_request_body(Some(br#"{"id":1,"method":"tools/call"}"#), true);
            }
            host.take();
            rs(&mut ex, &mut w, &mut host, &response);
            assert!(ex.wants_body(), "{method} {shape:?}");
            let cts = client_content_types(&response, &host.effects);
            assert_eq!(cts, ["text/event-stream"], "{method} {shape:?}");
        }
        // A continuation of a GET stream, answered with this replay.
        let mut w = worker();
        let mut host = MockHost::new();
        let c = cursor(&w, 42, 3, "e3");
        let verdict =
            format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":[],"head":3}}"#);
        let (mut ex, _) = resume(&mut w, &mut host, &c, &verdict);
        rs(&mut ex, &mut w, &mut host, &response);
        assert!(ex.wants_body(), "continuation {shape:?}");
        let cts = client_content_types(&response, &host.effects);
        assert_eq!(cts, ["text/event-stream"], "continuation {shape:?}");
    }
    // A JSON answer is not an event stream: its type is the replica's.
    let json = hdrs(&[
        (":status", "200"),
        ("content-type", "application/json; charset=utf-8"),
    ]);
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let post = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    rq(&mut ex, &mut w, &mut host, &post);
    ex.on_request_body(Some(br#"{"id":1,"method":"tools/call"}"#), true);
    host.take();
    rs(&mut ex, &mut w, &mut host, &json);
    let cts = client_content_types(&json, &host.effects);
    assert_eq!(cts, ["application/json; charset=utf-8"]);
}

/// Parameter names a client library may read as `charset`: RFC 2231 forms, any case, Unicode or
/// odd whitespace and bytes around them (Python's `email.message` strips Unicode whitespace).
const CHARSET_NAMES: &[&[u8]] = &[
    b"charset",
    b"CHARSET",
    b"ChArSeT",
    b"charset*",
    b"charset*0",
    b"charset*0*",
    b"charset*1",
    b" charset ",
    b"\tcharset",
    b"\xa0charset",
    b"charset\xa0",
    b"\xc2\xa0charset",
    b"\xe2\x80\x83charset",
    b"\xef\xbb\xbfcharset",
    b"\x0bcharset\x0c",
    b"\x1ccharset\x85",
    b"\x00charset",
];

/// Values naming a charset other than UTF-8 (or nothing): plain, quoted, RFC 2231
/// `charset'lang'value` with percent-escapes, or UTF-8 with something more.
const FOREIGN_VALUES: &[&[u8]] = &[
    b"utf-16le",
    b"UTF-16",
    b"utf-7",
    b"latin1",
    b"\"utf-16le\"",
    b"''utf-16le",
    b"utf-8''utf-16le",
    b"us-ascii'en'utf-16le",
    b"''%75tf-16le",
    b"%75tf-16le",
    b"'utf-16le'",
    b"\"utf-16\"le",
    b"utf-8-sig",
    b"utf-8 x",
    b"\xa0utf-16le",
    b"",
];

#[test]
fn a_declared_charset_but_utf8_is_refused_in_any_form() {
    let around: [(&[u8], &[u8]); 5] = [
        (b"text/event-stream;", b""),
        (b"text/event-stream; x=1;", b"; y=2"),
        (b"TEXT/EVENT-STREAM ;", b""),
        (b"text/plain, text/event-stream;", b""),
        (b"text/event-stream, text/plain;", b", text/x"),
    ];
    for (head, tail) in around {
        for name in CHARSET_NAMES {
            for value in FOREIGN_VALUES {
                let ct = [head, name, b"=", value, tail].concat();
                assert!(foreign_charset(&ct), "{:?}", String::from_utf8_lossy(&ct));
            }
            // Without a value at all.
            let ct = [head, name, tail].concat();
            assert!(foreign_charset(&ct), "{:?}", String::from_utf8_lossy(&ct));
            // UTF-8, named plainly, is read as usual.
            for value in [&b"utf-8"[..], b"UTF8", b"\"Utf-8\"", b" utf-8 "] {
                let ct = [head, name, b"=", value, tail].concat();
                assert!(!foreign_charset(&ct), "{:?}", String::from_utf8_lossy(&ct));
            }
        }
        // No charset: nothing to refuse.
        assert!(!foreign_charset(&[head, b" q=\"charse t\"", tail].concat()));
    }
    // The red team's three shapes, through the exchange: refused by name, never relayed.
    for ct in [
        &b"text/event-stream; charset*=''utf-16le"[..],
        b"text/event-stream; charset*0=utf-16le",
        b"text/event-stream;\xa0charset=utf-16le",
    ] {
        let mut w = worker();
        let mut host = MockHost::new();
        let mut ex = Exchange::new();
        rq(&mut ex, &mut w, &mut host, &get(&[]));
        let response = vec![
            (":status".to_string(), b"200".to_vec()),
            ("content-type".to_string(), ct.to_vec()),
        ];
        rs(&mut ex, &mut w, &mut host, &response);
        let ct = String::from_utf8_lossy(ct);
        assert!(
            matches!(local_reply(&host.effects), Some((409, b)) if b.contains("encoded_stream")),
            "{ct}"
        );
        assert!(!ex.wants_body(), "{ct}");
    }
}

#[path = "exchange_refusal_tests.rs"]
mod refusals;

#[path = "exchange_session_tests.rs"]
mod session_ids;

#[path = "exchange_abandon_tests.rs"]
mod abandoned;

#[path = "exchange_retry_tests.rs"]
mod retry_hint;

/// A fresh POST of `call` answered `200 text/event-stream`, whose body is `chunks`, the last
/// one ending it.
fn fresh_call_chunks(call: &str, chunks: &[&str]) -> (MockHost, String) {
    fresh_call_under(worker(), call, chunks)
}

/// A fresh POST of `call` through the guard of `w`, answered `200 text/event-stream`: the
/// exchange, ready for the answer's body.
fn open_fresh_call(w: &mut Worker, host: &mut MockHost, call: &[u8]) -> Exchange {
    let mut ex = Exchange::new();
    let post = hdrs(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
    ]);
    rq(&mut ex, w, host, &post);
    ex.on_request_body(Some(call), true);
    rs(&mut ex, w, host, &sse_ok());
    ex
}

/// [`fresh_call_chunks`] through the guard of worker `w`.
fn fresh_call_under(mut w: Worker, call: &str, chunks: &[&str]) -> (MockHost, String) {
    let mut host = MockHost::new();
    let mut ex = open_fresh_call(&mut w, &mut host, call.as_bytes());
    for (i, chunk) in chunks.iter().enumerate() {
        bd(
            &mut ex,
            &mut w,
            &mut host,
            chunk.as_bytes(),
            i + 1 == chunks.len(),
        );
    }
    let out = body_str(&host);
    (host, out)
}

#[path = "exchange_branch_end_tests.rs"]
mod branch_end;

#[path = "exchange_callwatch_tests.rs"]
mod callwatch;

#[path = "exchange_closeblock_tests.rs"]
mod closeblock;
