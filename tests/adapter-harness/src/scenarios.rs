//! The adapters' glue, scenario by scenario: the same exchanges through either adapter, checked
//! from the proxy's side (what goes upstream, what the client gets, what the host was asked).
//! The core's own tests check the rules; these check that every event reaches the core and every
//! answer reaches the proxy. [`adapter_tests!`](crate::adapter_tests) makes one `#[test]` of each.
use base64::Engine as _;
use mcp_resume_core::config::Config;
use mcp_resume_core::cursor::{
    incarnation_hex, session_binding, session_key, Cursor, DecodedCursor,
};
use mcp_resume_core::host::{Stat, CALLOUT_MS};
use mcp_resume_core::ownership::{
    BranchQuery, Reason, Record, RecordBatch, ResumeQuery, StreamKind, BRANCH_PATH, RECORDS_PATH,
    RESUME_PATH,
};
use mcp_resume_core::stream::control_event;

pub use crate::wasm::{header, headers, Headers};

/// The cursor key of [`config`].
pub const SECRET: &str = "17Vjr1MOFuUicxThufiY1oswS2eQj+6Y1DdNdURfwT0=";
/// The replica that owns the streams resumed here.
pub const OWNER: &str = "127.0.0.1:9101";
pub const SID: &str = "s-1";
pub const CLUSTER: &str = "mcp_ownership";
/// The owner header of the default config.
pub const OWNER_HEADER: &str = "x-mcp-owner";

/// The plugin configuration the scenarios run with.
pub fn config() -> String {
    config_with("")
}

/// [`config`] with more top-level fields (`extra` starts with a comma).
pub fn config_with(extra: &str) -> String {
    format!(
        r#"{{"ownership":{{"cluster":"{CLUSTER}"}},"keys":[{{"id":1,"secret":"{SECRET}","active":true}}]{extra}}}"#
    )
}

/// What a hook told the proxy to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stopped: paused for a callout, or answered locally.
    Stop,
}

/// A stream attribute the exchange reads from the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute {
    UpstreamAddress,
    ResponseCodeDetails,
}

/// A callout the adapter dispatched.
#[derive(Debug, Clone)]
pub struct Callout {
    pub token: u32,
    /// Dispatched for a stream (a resume) rather than by the worker (records).
    pub from_stream: bool,
    pub cluster: String,
    pub headers: Headers,
    pub body: Vec<u8>,
}

/// A local reply: status, headers, body.
pub type Reply = (u32, Headers, Vec<u8>);

/// One adapter under a fake proxy. Hooks are called in the order the proxy calls them; the
/// observers report what the proxy saw.
pub trait Proxy: Sized {
    /// Whether the adapter holds a continuation's response headers while its body reaches the
    /// filter (native: StopIteration); proxy-wasm cannot (a headers pause stops the body too).
    const HOLDS_HEADERS: bool;
    /// Loads the filter with `config`; `Err` when it refuses the configuration.
    fn start(config: &str) -> Result<Self, String>;
    fn new_stream(&mut self) -> u32;
    fn request_headers(&mut self, s: u32, h: Headers, eos: bool) -> Flow;
    fn request_body(&mut self, s: u32, chunk: &[u8], eos: bool) -> Flow;
    fn response_headers(&mut self, s: u32, h: Headers, eos: bool) -> Flow;
    fn response_body(&mut self, s: u32, chunk: &[u8], eos: bool) -> Flow;
    /// The answer to callout `token`; `status` `None`: it failed without a response.
    fn callout_answer(&mut self, token: u32, status: Option<u32>, body: &[u8]);
    /// The worker's timer; it also fires the streams' deadlines that passed.
    fn tick(&mut self);
    /// Moves the adapter's clock on by `ms` (the test host's clock, or real time).
    fn advance_ms(&mut self, ms: u64);
    fn end_stream(&mut self, s: u32);
    fn set_attribute(&mut self, s: u32, a: Attribute, value: &str);

    /// Every callout so far, in order.
    fn callouts(&self) -> Vec<Callout>;
    /// The request headers as they go upstream.
    fn upstream_headers(&self, s: u32) -> Headers;
    /// The request body as it went upstream.
    fn upstream_body(&self, s: u32) -> Vec<u8>;
    /// The response headers as the client gets them.
    fn client_headers(&self, s: u32) -> Headers;
    /// The response body as the client got it.
    fn client_body(&self, s: u32) -> Vec<u8>;
    fn local_replies(&self, s: u32) -> Vec<Reply>;
    /// The paused request was resumed.
    fn resumed(&self, s: u32) -> bool;
    /// The response was reset.
    fn was_reset(&self, s: u32) -> bool;
    /// The response's end is held: its last body hook stopped it, waiting for the filter.
    fn held(&self, s: u32) -> bool;
    /// A counter by its full name (`mcp_resume_guard.…`); `None` when not defined.
    fn counter(&self, name: &str) -> Option<i64>;
    /// Samples recorded in a histogram, by its full name.
    fn histogram_samples(&self, name: &str) -> usize;
    /// Metrics (counters and histograms) defined.
    fn metrics_defined(&self) -> usize;
}

fn start<P: Proxy>() -> P {
    match P::start(&config()) {
        Ok(p) => p,
        Err(e) => unreachable!("the filter refused its config: {e}"),
    }
}

fn cfg() -> Config {
    match Config::from_json(config().as_bytes()) {
        Ok(c) => c,
        Err(e) => unreachable!("{e}"),
    }
}

/// A cursor of incarnation 42 of session [`SID`], under the key of [`config`].
pub fn cursor(kind: StreamKind, seq: u64, id: &str, request_id: Option<&str>) -> String {
    cfg().keyring.encode(&Cursor {
        session: session_binding(SID.as_bytes()),
        incarnation: 42,
        kind,
        seq,
        replica_event_id: Some(id),
        request_id,
    })
}

fn decode(c: &str) -> DecodedCursor {
    match cfg().keyring.decode(c) {
        Ok(d) => d,
        Err(e) => unreachable!("{c}: {e:?}"),
    }
}

fn stat(s: Stat) -> String {
    format!("mcp_resume_guard.{}", s.name())
}

fn count<P: Proxy>(p: &P, s: Stat) -> i64 {
    p.counter(&stat(s)).unwrap_or(-1)
}

/// The SSE `id:` values of a body.
pub fn ids_in(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(str::to_string)
        .collect()
}

fn has(h: &Headers, name: &str) -> bool {
    header(h, name).is_some()
}

fn get(extra: &[(&str, &str)]) -> Headers {
    let mut h = headers(&[
        (":method", "GET"),
        (":path", "/mcp"),
        (":authority", "mcp.example"),
        ("mcp-session-id", SID),
    ]);
    h.extend(headers(extra));
    h
}

fn sse(extra: &[(&str, &str)]) -> Headers {
    let mut h = headers(&[(":status", "200"), ("content-type", "text/event-stream")]);
    h.extend(headers(extra));
    h
}

/// The only callout made for a stream since `before`.
fn stream_callout<P: Proxy>(p: &P, before: usize) -> Callout {
    let new: Vec<_> = p.callouts().into_iter().skip(before).collect();
    match new.as_slice() {
        [c] if c.from_stream => c.clone(),
        _ => unreachable!("want one stream callout, got {new:?}"),
    }
}

/// The only local reply of stream `s`.
fn reply<P: Proxy>(p: &P, s: u32) -> Reply {
    match p.local_replies(s).as_slice() {
        [r] => r.clone(),
        r => unreachable!("want one local reply, got {r:?}"),
    }
}

/// Asserts the settling answer to a refused request-stream cursor: 200 SSE, `mcp-resume`, the
/// JSON-RPC error for call 7; and that it reached the client as sent.
fn assert_settled<P: Proxy>(p: &P, s: u32, reason: &str) {
    let (status, h, body) = reply(p, s);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&h, "content-type"), Some("text/event-stream"));
    let want = format!("rejected; reason={reason}");
    assert_eq!(header(&h, "mcp-resume"), Some(want.as_str()));
    assert!(text.contains(r#""id":7"#), "{text}");
    assert!(text.contains("-32010"), "{text}");
    assert!(text.contains(&format!(r#""reason":"{reason}""#)), "{text}");
    // The guard's own reply passes its response hooks untouched.
    let client = p.client_headers(s);
    assert_eq!(
        header(&client, "mcp-resume"),
        Some(want.as_str()),
        "{client:?}"
    );
    assert_eq!(p.client_body(s), body);
}

/// A GET with a cursor of stream `kind` (seq 7, replica id `e7`, call 7), answered `verdict`.
fn resume<P: Proxy>(p: &mut P, kind: StreamKind, verdict: &str) -> u32 {
    let s = p.new_stream();
    let c = cursor(kind, 7, "e7", Some("7"));
    let before = p.callouts().len();
    let flow = p.request_headers(s, get(&[("last-event-id", &c)]), true);
    assert_eq!(flow, Flow::Stop, "paused for the callout");
    let call = stream_callout(p, before);
    p.callout_answer(call.token, Some(200), verdict.as_bytes());
    s
}

fn continue_verdict(expected: &[&str]) -> String {
    serde_json::json!({
        "verdict": "continue", "owner": OWNER, "expected": expected, "head": 7 + expected.len(),
    })
    .to_string()
}

/// A `continue` verdict whose continuation the store registered as branch `branch`.
fn branch_verdict(expected: &[&str], branch: u64) -> String {
    serde_json::json!({
        "verdict": "continue", "owner": OWNER, "expected": expected, "head": 7 + expected.len(),
        "branch": branch,
    })
    .to_string()
}

/// A GET continuation of incarnation 42 registered as branch 1, its owner's SSE answer begun
/// with the one expected event `e8`.
fn branch_one<P: Proxy>(p: &mut P) -> u32 {
    let s = resume(p, StreamKind::Get, &branch_verdict(&["e8"], 1));
    assert!(p.resumed(s));
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    // Held until the first replayed event, where the adapter can.
    assert_eq!(p.response_headers(s, sse(&[]), false), held_flow::<P>());
    assert_eq!(
        p.response_body(s, b"id: e8\ndata: 8\n\n", false),
        Flow::Continue
    );
    assert_eq!(ids_in(&p.client_body(s)).len(), 1);
    s
}

/// Ends branch 1's response: the end is held and the store asked, from the stream, whether
/// another branch of incarnation 42 is open; the query's callout.
fn hold_the_end<P: Proxy>(p: &mut P, s: u32) -> Callout {
    let before = p.callouts().len();
    assert_eq!(p.response_body(s, b"", true), Flow::Stop, "the end is held");
    assert!(p.held(s));
    let call = stream_callout(p, before);
    assert_eq!(call.cluster, CLUSTER);
    assert_eq!(header(&call.headers, ":path"), Some(BRANCH_PATH));
    assert_eq!(header(&call.headers, ":method"), Some("POST"));
    let q: BranchQuery = match serde_json::from_slice(&call.body) {
        Ok(q) => q,
        Err(e) => unreachable!("{e}: {}", String::from_utf8_lossy(&call.body)),
    };
    let want = BranchQuery {
        session: session_key(SID.as_bytes()),
        incarnation: incarnation_hex(42),
        branch: 1,
    };
    assert_eq!(q, want);
    call
}

/// The `BranchEnd` records among `records`, as branch numbers.
fn branch_ends(records: &[Record]) -> Vec<u64> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::BranchEnd {
                session,
                incarnation,
                branch,
            } => {
                assert_eq!(session, &session_key(SID.as_bytes()));
                assert_eq!(incarnation, &incarnation_hex(42));
                Some(*branch)
            }
            _ => None,
        })
        .collect()
}

/// The records of the batch the tick sends; answers it `{"applied": n}`.
fn flush<P: Proxy>(p: &mut P) -> Vec<Record> {
    let before = p.callouts().len();
    p.tick();
    let new: Vec<_> = p.callouts().into_iter().skip(before).collect();
    let [c] = new.as_slice() else {
        unreachable!("want one records callout, got {new:?}")
    };
    assert!(!c.from_stream, "records go from the worker, not a stream");
    assert_eq!(c.cluster, CLUSTER);
    assert_eq!(header(&c.headers, ":path"), Some(RECORDS_PATH));
    assert_eq!(header(&c.headers, ":method"), Some("POST"));
    let batch: RecordBatch = match serde_json::from_slice(&c.body) {
        Ok(b) => b,
        Err(e) => unreachable!("{e}: {}", String::from_utf8_lossy(&c.body)),
    };
    let ack = format!(r#"{{"applied":{}}}"#, batch.records.len());
    p.callout_answer(c.token, Some(200), ack.as_bytes());
    batch.records
}

/// Request headers reach the exchange: a GET with a cursor is paused for a resume callout with
/// the right cluster, path and query; the answer resumes it with the replica's id and the owner
/// pin; the owner's SSE answer is translated (owner header and `content-length` gone) and its
/// ids become cursors.
pub fn a_cursor_is_asked_about_and_its_continuation_pinned_to_the_owner<P: Proxy>() {
    let mut p: P = start();
    let s = p.new_stream();
    let c = cursor(StreamKind::Get, 7, "e7", None);
    let req = get(&[("last-event-id", &c), (OWNER_HEADER, "client-chosen")]);
    assert_eq!(p.request_headers(s, req, true), Flow::Stop);
    // A client never pins a replica.
    assert!(!has(&p.upstream_headers(s), OWNER_HEADER));
    let call = stream_callout(&p, 0);
    assert_eq!(call.cluster, CLUSTER);
    assert_eq!(header(&call.headers, ":path"), Some(RESUME_PATH));
    assert_eq!(header(&call.headers, ":method"), Some("POST"));
    let q: ResumeQuery = match serde_json::from_slice(&call.body) {
        Ok(q) => q,
        Err(e) => unreachable!("{e}"),
    };
    assert_eq!((q.seq, q.kind), (7, StreamKind::Get));
    assert!(!p.resumed(s));

    p.callout_answer(call.token, Some(200), continue_verdict(&["e8"]).as_bytes());
    assert!(p.resumed(s), "the callout answer resumes the request");
    let up = p.upstream_headers(s);
    assert_eq!(header(&up, "last-event-id"), Some("e7"));
    let pin = base64::engine::general_purpose::STANDARD.encode(OWNER);
    assert_eq!(header(&up, OWNER_HEADER), Some(pin.as_str()));
    assert_eq!(header(&up, "accept-encoding"), Some("identity"));
    assert_eq!(count(&p, Stat::CursorsSeen), 1);
    assert_eq!(count(&p, Stat::Callouts), 1);
    assert_eq!(count(&p, Stat::Continued), 1);
    assert_eq!(count(&p, Stat::OwnerHeaderRemoved), 1);
    assert_eq!(
        p.histogram_samples(&format!("mcp_resume_guard.{CALLOUT_MS}")),
        1
    );

    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    let answer = sse(&[("content-length", "16"), (OWNER_HEADER, &pin)]);
    // Held (not yet sent) until the first replayed event where the adapter can; changed in
    // place meanwhile.
    assert_eq!(p.response_headers(s, answer, false), held_flow::<P>());
    let client = p.client_headers(s);
    assert!(!has(&client, OWNER_HEADER), "{client:?}");
    assert!(!has(&client, "content-length"), "{client:?}");
    assert!(!has(&client, "mcp-resume"), "{client:?}");
    assert_eq!(header(&client, "content-type"), Some("text/event-stream"));

    assert_eq!(
        p.response_body(s, b"id: e8\ndata: 8\n\n", false),
        Flow::Continue
    );
    assert_eq!(p.response_body(s, b"", true), Flow::Continue);
    let body = p.client_body(s);
    let ids = ids_in(&body);
    assert_eq!(ids.len(), 1, "{}", String::from_utf8_lossy(&body));
    let d = decode(&ids[0]);
    assert_eq!((d.incarnation, d.seq), (42, 8));
    assert!(String::from_utf8_lossy(&body).contains("data: 8\n"));
    assert!(!p.was_reset(s));
    p.end_stream(s);
}

/// A POST's body is read (in chunks) and passes unchanged; its JSON-RPC id rides in the
/// cursors of its stream.
pub fn a_posts_json_rpc_id_rides_in_its_streams_cursors<P: Proxy>() {
    let mut p: P = start();
    let s = p.new_stream();
    let post = headers(&[
        (":method", "POST"),
        (":path", "/mcp"),
        ("mcp-session-id", SID),
        ("content-type", "application/json"),
    ]);
    assert_eq!(p.request_headers(s, post, false), Flow::Continue);
    let (a, b) = (
        r#"{"method":"tools/call","params":{"id":1},"#,
        r#""jsonrpc":"2.0","id":42}"#,
    );
    assert_eq!(p.request_body(s, a.as_bytes(), false), Flow::Continue);
    assert_eq!(p.request_body(s, b.as_bytes(), true), Flow::Continue);
    assert_eq!(p.upstream_body(s), format!("{a}{b}").into_bytes());
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    assert_eq!(p.response_headers(s, sse(&[]), false), Flow::Continue);
    p.response_body(s, b"id: r1\ndata: {}\n\n", true);
    let ids = ids_in(&p.client_body(s));
    assert_eq!(ids.len(), 1);
    let d = decode(&ids[0]);
    assert_eq!(d.kind, StreamKind::Request);
    assert_eq!(d.request_id.as_deref(), Some("42"));
    p.end_stream(s);
}

/// A refused request-stream cursor is answered locally: 200 `text/event-stream` with the
/// control event and the error that settles call 7; the request is never resumed.
pub fn a_refused_request_stream_cursor_is_settled_locally<P: Proxy>() {
    let mut p: P = start();
    let s = resume(
        &mut p,
        StreamKind::Request,
        r#"{"verdict":"new_stream","reason":"gap"}"#,
    );
    assert!(!p.resumed(s), "answered locally, never forwarded");
    assert_settled(&p, s, "gap");
    assert_eq!(count(&p, Stat::Rejected), 1);
    assert_eq!(p.counter("mcp_resume_guard.refused.gap"), Some(1));
    p.end_stream(s);
}

/// A continuation answered with headers only (`end_of_stream`) has no replay: refused by name.
pub fn a_headers_only_answer_to_a_continuation_is_refused<P: Proxy>() {
    let mut p: P = start();
    let s = resume(&mut p, StreamKind::Request, &continue_verdict(&["e8"]));
    assert!(p.resumed(s));
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    p.response_headers(s, sse(&[]), true);
    assert_settled(&p, s, "replay_missing");
    p.end_stream(s);
}

/// A restarted owner answers the continuation with its own error (`400`, unknown session) while
/// nothing after the cursor is recorded: the pending call is settled, never left hanging.
pub fn an_owners_own_error_at_the_head_settles_the_call<P: Proxy>() {
    let mut p: P = start();
    let s = resume(&mut p, StreamKind::Request, &continue_verdict(&[]));
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    let answer = headers(&[(":status", "400"), ("content-type", "application/json")]);
    p.response_headers(s, answer, false);
    assert_settled(&p, s, "replay_missing");
    p.end_stream(s);
}

/// A continuation whose owner sends no response headers is answered by the guard itself once
/// `continuation_headers_timeout_ms` passed, from the adapter's timer, once.
pub fn a_hung_owner_is_answered_at_the_deadline<P: Proxy>() {
    let mut p = match P::start(&config_with(r#","continuation_headers_timeout_ms":100"#)) {
        Ok(p) => p,
        Err(e) => unreachable!("the filter refused its config: {e}"),
    };
    let s = resume(&mut p, StreamKind::Request, &continue_verdict(&[]));
    assert!(p.resumed(s));
    p.tick();
    assert!(p.local_replies(s).is_empty(), "not before the deadline");
    p.advance_ms(150);
    p.tick();
    assert_settled(&p, s, "owner_busy");
    assert_eq!(p.counter("mcp_resume_guard.refused.owner_busy"), Some(1));
    p.advance_ms(150);
    p.tick();
    assert_eq!(p.local_replies(s).len(), 1, "answered once");
    p.end_stream(s);
    // A continuation whose owner answered in time has no deadline left.
    let s = resume(&mut p, StreamKind::Get, &continue_verdict(&[]));
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    p.response_headers(s, sse(&[]), false);
    p.advance_ms(150);
    p.tick();
    assert!(p.local_replies(s).is_empty());
    p.end_stream(s);
}

/// What the headers hook of a continuation that expects a replay answers.
fn held_flow<P: Proxy>() -> Flow {
    match P::HOLDS_HEADERS {
        true => Flow::Stop,
        false => Flow::Continue,
    }
}

/// A continuation that expects a replay holds its owner's headers (the headers hook stops)
/// until the first replayed event: comments before it are held too (the body hook stops and the
/// client gets nothing), then everything goes out with that event. An adapter that cannot hold
/// them passes everything at once.
pub fn an_expected_replay_holds_the_headers_until_its_first_event<P: Proxy>() {
    let mut p: P = start();
    let s = resume(&mut p, StreamKind::Get, &continue_verdict(&["e8"]));
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    assert_eq!(p.response_headers(s, sse(&[]), false), held_flow::<P>());
    assert_eq!(p.response_body(s, b": ping\n\n", false), held_flow::<P>());
    assert_eq!(p.client_body(s).is_empty(), P::HOLDS_HEADERS);
    assert_eq!(
        p.response_body(s, b"id: e8\ndata: x\n\n", false),
        Flow::Continue
    );
    let body = String::from_utf8_lossy(&p.client_body(s)).into_owned();
    assert!(body.starts_with(": ping\n\n"), "{body}");
    assert_eq!(ids_in(body.as_bytes()).len(), 1, "{body}");
    assert!(!p.held(s));
    p.end_stream(s);
}

/// An owner that answers the continuation's headers and then sends no replayed event (nothing,
/// or only comments) is answered at the same deadline as a hung owner, from the adapter's timer:
/// held headers never reached the client, so the local reply does; where the adapter could not
/// hold them, the stream is reset and recorded lost (the client's next resume is refused at once).
pub fn a_stalled_replay_is_answered_at_the_deadline<P: Proxy>() {
    for body in [&b""[..], b": keep-alive\n\n"] {
        let mut p = match P::start(&config_with(r#","continuation_headers_timeout_ms":100"#)) {
            Ok(p) => p,
            Err(e) => unreachable!("the filter refused its config: {e}"),
        };
        let s = resume(&mut p, StreamKind::Request, &continue_verdict(&["e8"]));
        p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
        assert_eq!(p.response_headers(s, sse(&[]), false), held_flow::<P>());
        if !body.is_empty() {
            assert_eq!(p.response_body(s, body, false), held_flow::<P>());
        }
        p.tick();
        assert!(p.local_replies(s).is_empty(), "not before the deadline");
        assert!(!p.was_reset(s));
        p.advance_ms(150);
        p.tick();
        assert_eq!(p.counter("mcp_resume_guard.refused.owner_busy"), Some(1));
        if P::HOLDS_HEADERS {
            assert_settled(&p, s, "owner_busy");
        } else {
            assert!(p.local_replies(s).is_empty());
            assert!(p.was_reset(s));
            let records = flush(&mut p);
            assert!(
                records
                    .iter()
                    .any(|r| matches!(r, Record::StreamLost { .. })),
                "{records:?}"
            );
        }
        p.end_stream(s);
    }
}

/// A replay that stalls after its first event, while recorded events are still owed, is reset
/// at the same deadline counted from the last replayed event, and recorded lost: the headers
/// are out, in either adapter. Each replayed event moves the deadline on (the native adapter's
/// scheduled event finds it moved and waits again).
pub fn a_replay_that_stalls_midway_is_reset_at_the_deadline<P: Proxy>() {
    let cfg = r#","continuation_headers_timeout_ms":100,"replay_stall_timeout_ms":100"#;
    let mut p = match P::start(&config_with(cfg)) {
        Ok(p) => p,
        Err(e) => unreachable!("the filter refused its config: {e}"),
    };
    let s = resume(
        &mut p,
        StreamKind::Get,
        &continue_verdict(&["e8", "e9", "e10"]),
    );
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    p.response_headers(s, sse(&[]), false);
    p.advance_ms(60);
    let first = p.response_body(s, b"id: e8\ndata: x\n\n", false);
    assert_eq!(first, Flow::Continue);
    // Each tick sends the records of the event relayed before it (and fires deadlines).
    p.advance_ms(60);
    flush(&mut p);
    let second = p.response_body(s, b"id: e9\ndata: x\n\n", false);
    assert_eq!(second, Flow::Continue);
    p.advance_ms(60);
    flush(&mut p);
    p.response_body(s, b": keep-alive\n\n", false);
    p.advance_ms(30);
    p.tick();
    assert!(!p.was_reset(s), "a steady replay is not cut");
    assert_eq!(ids_in(&p.client_body(s)).len(), 2);
    p.advance_ms(30);
    p.tick();
    assert!(p.was_reset(s), "100 ms after the last replayed event");
    assert!(p.local_replies(s).is_empty());
    assert_eq!(p.counter("mcp_resume_guard.refused.owner_busy"), Some(1));
    let records = flush(&mut p);
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::StreamLost { .. })),
        "{records:?}"
    );
    p.end_stream(s);
}

/// A failed continuation reads `response.code_details`: an owner no longer in the cluster is
/// `owner_unavailable` and recorded lost; any other failure is `owner_busy`.
pub fn an_owner_gone_from_the_cluster_is_told_from_a_busy_one<P: Proxy>() {
    for (details, reason, lost) in [
        ("no_healthy_upstream", "owner_unavailable", true),
        (
            "upstream_reset_before_response_started{overflow}",
            "owner_busy",
            false,
        ),
    ] {
        let mut p: P = start();
        let s = resume(&mut p, StreamKind::Request, &continue_verdict(&["e8"]));
        p.set_attribute(s, Attribute::ResponseCodeDetails, details);
        p.response_headers(s, headers(&[(":status", "503")]), true);
        assert_settled(&p, s, reason);
        p.end_stream(s);
        let records = flush(&mut p);
        let got = match records.as_slice() {
            [Record::StreamLost { .. }] => true,
            [Record::OwnerFailed { .. }] => false,
            r => unreachable!("{details}: {r:?}"),
        };
        assert_eq!(got, lost, "{details}");
    }
}

/// A fresh SSE stream is recorded: the tick sends the records as a callout, and its answer is
/// counted.
pub fn the_tick_flushes_records_as_a_callout<P: Proxy>() {
    let mut p: P = start();
    let s = p.new_stream();
    assert_eq!(p.request_headers(s, get(&[]), true), Flow::Continue);
    assert!(p.callouts().is_empty());
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    p.response_headers(s, sse(&[]), false);
    p.response_body(s, b"id: e1\ndata: a\n\nid: e2\ndata: b\n\n", false);
    assert_eq!(ids_in(&p.client_body(s)).len(), 2);
    let records = flush(&mut p);
    assert!(
        matches!(records.as_slice(), [Record::StreamOpen { owner, .. }, Record::Events { ids, .. }]
            if owner == OWNER && ids.len() == 2),
        "{records:?}"
    );
    assert_eq!(count(&p, Stat::RecordsSent), 2);
    assert_eq!(count(&p, Stat::StreamsOpened), 1);
    assert_eq!(count(&p, Stat::EventsRewritten), 2);
    p.end_stream(s);
}

/// The owner header never passes, on any path: removed from the request and, unread, from the
/// response of a request the guard does not otherwise look at.
pub fn the_owner_header_never_passes_on_any_path<P: Proxy>() {
    let mut p: P = start();
    let s = p.new_stream();
    let req = headers(&[
        (":method", "GET"),
        (":path", "/health"),
        (OWNER_HEADER, "x"),
    ]);
    assert_eq!(p.request_headers(s, req, true), Flow::Continue);
    assert!(!has(&p.upstream_headers(s), OWNER_HEADER));
    let answer = headers(&[(":status", "200"), (OWNER_HEADER, "eA==")]);
    assert_eq!(p.response_headers(s, answer, false), Flow::Continue);
    assert!(!has(&p.client_headers(s), OWNER_HEADER));
    assert_eq!(p.response_body(s, b"ok", true), Flow::Continue);
    assert_eq!(p.client_body(s), b"ok");
    assert_eq!(count(&p, Stat::OwnerHeaderRemoved), 1);
    p.end_stream(s);
}

/// A registered branch's end is held while the store is asked (from the stream) whether a
/// newer branch is open; its answer `forked` finishes the held end with the `forked` control
/// event, after what the client already had, and the stream ends cleanly.
pub fn a_held_end_is_finished_with_the_forked_event_the_store_asked_for<P: Proxy>() {
    let mut p: P = start();
    let s = branch_one(&mut p);
    let call = hold_the_end(&mut p, s);
    let before = p.client_body(s);
    p.callout_answer(call.token, Some(200), br#"{"forked":true}"#);
    assert!(!p.held(s), "the answer lets the held end go");
    assert!(!p.was_reset(s));
    let body = p.client_body(s);
    assert_eq!(
        String::from_utf8_lossy(&body[before.len().min(body.len())..]),
        control_event(Reason::Forked),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(body.starts_with(&before));
    assert_eq!(count(&p, Stat::Forked), 1);
    p.end_stream(s);
    // The store marked the branch ended when it answered; the end still goes as one record,
    // behind the branch's own (a late one must not bring the branch back open).
    assert_eq!(branch_ends(&flush(&mut p)), vec![1]);
}

/// The store's `not forked` lets the held end go as the replica sent it (nothing added).
pub fn a_held_end_the_store_did_not_fork_ends_as_the_replica_ended_it<P: Proxy>() {
    let mut p: P = start();
    let s = branch_one(&mut p);
    let call = hold_the_end(&mut p, s);
    let before = p.client_body(s);
    p.callout_answer(call.token, Some(200), br#"{"forked":false}"#);
    assert!(!p.held(s));
    assert!(!p.was_reset(s));
    assert_eq!(p.client_body(s), before);
    assert_eq!(count(&p, Stat::Forked), 0);
    p.end_stream(s);
    assert_eq!(branch_ends(&flush(&mut p)), vec![1]);
}

/// Without the store's answer (a 503) nobody can say whether a newer reader took the stream:
/// the held end goes on with the `ownership_unavailable` control event (never passed as the
/// replica's own), and the branch's end is reported as a record when the stream ends.
pub fn a_held_end_without_the_stores_answer_is_reported_at_the_streams_end<P: Proxy>() {
    let mut p: P = start();
    let s = branch_one(&mut p);
    let call = hold_the_end(&mut p, s);
    let before = p.client_body(s);
    p.callout_answer(call.token, Some(503), b"");
    assert!(!p.held(s));
    let body = p.client_body(s);
    assert!(body.starts_with(&before));
    assert_eq!(
        String::from_utf8_lossy(&body[before.len().min(body.len())..]),
        control_event(Reason::OwnershipUnavailable),
        "{}",
        String::from_utf8_lossy(&body)
    );
    p.end_stream(s);
    assert_eq!(branch_ends(&flush(&mut p)), vec![1]);
}

/// The stream's end reaches the exchange however it ends: a registered branch reset before
/// its response ended is reported as a `BranchEnd` record.
pub fn a_branch_reset_before_its_end_is_reported_as_ended<P: Proxy>() {
    let mut p: P = start();
    let s = branch_one(&mut p);
    p.end_stream(s);
    let records = flush(&mut p);
    assert_eq!(branch_ends(&records), vec![1], "{records:?}");
    // Its events were recorded as branch 1's.
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::Events { branch: 1, ids, .. } if ids.len() == 1)),
        "{records:?}"
    );
}

/// Every stat and the callout histogram are defined at configuration; a bad configuration is
/// refused.
pub fn metrics_are_defined_and_a_bad_config_is_refused<P: Proxy>() {
    let p: P = start();
    assert_eq!(p.metrics_defined(), Stat::all().len() + 1);
    for s in Stat::all() {
        assert_eq!(p.counter(&stat(s)), Some(0), "{}", s.name());
    }
    assert!(P::start(r#"{"ownership":{"cluster":""}}"#).is_err());
}

/// Runs `f` on a thread with a large stack (address space only, touched as used): an
/// unoptimised build of the Wasm interpreter takes some 20 MiB for a hook that calls back into
/// the module. A failure in `f` fails the caller.
pub fn on_big_stack(f: fn()) {
    let t = std::thread::Builder::new()
        .name("scenario".into())
        .stack_size(256 << 20)
        .spawn(f);
    match t.map(std::thread::JoinHandle::join) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => std::panic::resume_unwind(e),
        Err(e) => unreachable!("cannot start the scenario thread: {e}"),
    }
}

/// One `#[test]` per scenario, for the adapter `$proxy` (a [`Proxy`]).
#[macro_export]
macro_rules! adapter_tests {
    ($proxy:ty) => {
        $crate::adapter_tests!(@each $proxy;
            a_cursor_is_asked_about_and_its_continuation_pinned_to_the_owner,
            a_posts_json_rpc_id_rides_in_its_streams_cursors,
            a_refused_request_stream_cursor_is_settled_locally,
            a_headers_only_answer_to_a_continuation_is_refused,
            an_owners_own_error_at_the_head_settles_the_call,
            a_hung_owner_is_answered_at_the_deadline,
            an_expected_replay_holds_the_headers_until_its_first_event,
            a_stalled_replay_is_answered_at_the_deadline,
            a_replay_that_stalls_midway_is_reset_at_the_deadline,
            an_owner_gone_from_the_cluster_is_told_from_a_busy_one,
            the_tick_flushes_records_as_a_callout,
            the_owner_header_never_passes_on_any_path,
            a_held_end_is_finished_with_the_forked_event_the_store_asked_for,
            a_held_end_the_store_did_not_fork_ends_as_the_replica_ended_it,
            a_held_end_without_the_stores_answer_is_reported_at_the_streams_end,
            a_branch_reset_before_its_end_is_reported_as_ended,
            metrics_are_defined_and_a_bad_config_is_refused,
        );
    };
    (@each $proxy:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::scenarios::on_big_stack($crate::scenarios::$name::<$proxy>);
            }
        )*
    };
}
