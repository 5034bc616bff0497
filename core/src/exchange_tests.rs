//! The exchange's rules, driven through the mock host.
use super::*;
use crate::cursor::Cursor;
use crate::host::{Effect, MockHost};
use crate::ownership::{RecordBatch, ResumeQuery};

const SECRET: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const OWNER: &str = "127.0.0.1:9101";
const SID: &str = "s-1";

fn config(extra: &str) -> Config {
    let json = format!(
        r#"{{"ownership":{{"cluster":"mcp_ownership"}},"keys":[{{"id":1,"secret":"{SECRET}","active":true}}]{extra}}}"#
    );
    match Config::from_json(json.as_bytes()) {
        Ok(c) => c,
        Err(e) => unreachable!("{e}"),
    }
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

fn cursor(w: &Worker, inc: u64, seq: u64, id: &str) -> String {
    w.config.keyring.encode(&Cursor {
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
        let batch: RecordBatch = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => unreachable!("{e}"),
        };
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
    let a = ex.on_request_headers(w, host, &get(&[("last-event-id", cursor)]));
    assert_eq!(a, Action::Pause);
    let Some((token, body)) = host.last_dispatch() else {
        unreachable!("no callout");
    };
    let q: Result<ResumeQuery, _> = serde_json::from_slice(body);
    assert!(q.is_ok());
    host.take();
    ex.on_callout_response(w, host, token, Some(200), Some(verdict.as_bytes()));
    (ex, host.take())
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn a_fresh_stream_is_rewritten_and_recorded() {
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    assert_eq!(
        ex.on_request_headers(&mut w, &mut host, &get(&[])),
        Action::Continue
    );
    ex.on_response_headers(&mut w, &mut host, &sse_ok());
    assert!(ex.wants_body());
    ex.on_response_body(
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

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
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
    ex.on_response_headers(&mut w, &mut host, &sse_ok());
    ex.on_response_body(
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

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn a_foreign_cursor_restarts_with_header_and_control_event() {
    let mut w = worker();
    let mut host = MockHost::new();
    let mut ex = Exchange::new();
    let a = ex.on_request_headers(&mut w, &mut host, &get(&[("last-event-id", "e7")]));
    assert_eq!(a, Action::Continue);
    assert!(removed_req(&host.effects, "last-event-id"));
    ex.on_response_headers(&mut w, &mut host, &sse_ok());
    assert_eq!(
        set_resp(&host.effects, MCP_RESUME_HEADER).as_deref(),
        Some("restarted; reason=foreign_cursor")
    );
    ex.on_response_body(&mut w, &mut host, b"id: e1\ndata: a\n\n", false);
    let body = String::from_utf8_lossy(&host.body()).into_owned();
    assert!(body.starts_with(&control_event(Reason::ForeignCursor)));
    assert_eq!(host.stat(Stat::Refused(Reason::ForeignCursor)), 1);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn a_callout_failure_fails_closed() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let mut ex = Exchange::new();
    ex.on_request_headers(&mut w, &mut host, &get(&[("last-event-id", &c)]));
    let Some((token, _)) = host.last_dispatch() else {
        unreachable!()
    };
    ex.on_callout_response(&mut w, &mut host, token, Some(503), None);
    let fx = host.take();
    assert!(removed_req(&fx, "last-event-id"));
    assert!(set_req(&fx, "last-event-id").is_none());
    assert_eq!(host.stat(Stat::CalloutFailures(CalloutFailure::Status)), 1);
    assert_eq!(host.stat(Stat::Refused(Reason::OwnershipUnavailable)), 1);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn an_owner_503_becomes_a_rejection_and_a_lost_stream() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let verdict = format!(r#"{{"verdict":"continue","owner":"{OWNER}","expected":[],"head":7}}"#);
    let (mut ex, _) = resume(&mut w, &mut host, &c, &verdict);
    ex.on_response_headers(&mut w, &mut host, &hdrs(&[(":status", "503")]));
    let reply = local_reply(&host.effects);
    assert!(matches!(reply, Some((409, b)) if b.contains("owner_unavailable")));
    let records = drain_records(&mut w, &mut host);
    assert!(matches!(records.as_slice(), [Record::StreamLost { .. }]));
}
