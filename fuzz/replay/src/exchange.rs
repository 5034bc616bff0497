//! `exchange`: the guard's per-request state machine (core `exchange`) on a [`MockHost`],
//! driven by random event sequences in an order a proxy can deliver them: up to four
//! interleaved requests on one worker, callout answers (right, stale or garbage), upstream
//! response headers and body chunks, ticks that send records, and the answers to those.
//!
//! Invariants:
//! - no cursor reaches a replica unless the verdict was continue: a `Last-Event-ID` that is
//!   forwarded is the replica's own id from the cursor, after a `continue` verdict for it;
//! - no owner header leaves: one reaches a replica only as the guard's own pin of the owner the
//!   verdict named, and none reaches a client;
//! - a cursor that does not continue is refused explicitly (`Mcp-Resume` header, 409 body, and
//!   the control event at the head of an SSE body);
//! - every id a client sees in a rewritten body is one of the guard's cursors;
//! - every resume query the guard sends passes the ownership service's own validation, and
//!   every record it sends passes `Record::validate` (the guard checks before queueing, so the
//!   service never has to reject one); the harness answers batches as the service would, and a
//!   batch answered with a 4xx is never sent again (it would hold every later record back);
//! - nothing panics.
use arbitrary::{Arbitrary, Unstructured};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use mcp_ownership::api::{parse_records, parse_resume_query};
use mcp_resume_core::config::Config;
use mcp_resume_core::cursor::{session_binding, Cursor};
use mcp_resume_core::exchange::{Action, Exchange, Worker, MCP_RESUME_HEADER};
use mcp_resume_core::host::{Effect, MockHost};
use mcp_resume_core::ownership::{
    BranchQuery, Reason, ResumeVerdict, StreamKind, BRANCH_PATH, RECORDS_PATH, RESUME_PATH,
};
use mcp_resume_core::stream::control_event;

use crate::client;
use crate::keys::{secret, ACTIVE};
use crate::stream::{ev, render, Piece};

const OWNER_HEADER: &str = "x-mcp-owner";
const SESSIONS: [&str; 3] = ["s-1", "s-2", "s-\u{e9}"];
const OWNERS: [&str; 3] = ["127.0.0.1:9101", "127.0.0.1:9102", "[::1]:9103"];
const METHODS: [&str; 4] = ["GET", "POST", "DELETE", "PUT"];
const PATHS: [&str; 4] = ["/mcp", "/mcp?x=1", "/other", "/mcpx"];
const VERSIONS: [&str; 5] = ["2025-03-26", "2025-06-18", "2026-07-28", "2025-13-01", " "];
const STATUSES: [u32; 8] = [200, 200, 201, 204, 404, 409, 500, 503];
const MAX_EXCHANGES: usize = 4;

#[derive(Debug, Arbitrary)]
struct Setup {
    get_reject: bool,
    request_restart: bool,
    suppress_echo: bool,
    small_hold: bool,
    retention: u8,
    max_batch: u8,
    refuse_dispatch: bool,
}

#[derive(Debug, Arbitrary)]
enum CursorPick {
    Minted {
        session: u8,
        incarnation: u8,
        request: bool,
        seq: u16,
        replica: Option<u8>,
    },
    Text(String),
}

#[derive(Debug, Arbitrary)]
enum VerdictPick {
    Continue {
        owner: u8,
        expected: Vec<u8>,
        head: u16,
        /// The branch the store registered (none: it could not).
        branch: Option<u8>,
    },
    NewStream {
        reason: u8,
    },
    Raw(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Step {
    Request {
        method: u8,
        path: u8,
        session: Option<u8>,
        version: Option<u8>,
        cursor: Option<CursorPick>,
        owner_header: bool,
    },
    Callout {
        ex: u8,
        /// `None`: no response headers; otherwise mostly 200.
        status: Option<u8>,
        verdict: VerdictPick,
        stale_token: bool,
    },
    Response {
        ex: u8,
        status: u8,
        sse: bool,
        session: Option<u8>,
        owner_header: bool,
        upstream: u8,
    },
    Body {
        ex: u8,
        pieces: Vec<Piece>,
        eos: bool,
    },
    Tick {
        advance_ms: u16,
    },
    /// `None`: the service's own answer; `Some(true)`: no response; `Some(false)`: a 503.
    Records {
        failure: Option<bool>,
    },
}

#[derive(Debug, Arbitrary)]
struct Input {
    setup: Setup,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Held for the resume callout.
    Paused,
    /// Forwarded upstream; response headers may come.
    Released,
    /// Response headers passed; body chunks may come.
    Responding,
    /// Answered locally, or the response ended.
    Done,
}

type Headers = Vec<(String, Vec<u8>)>;

struct Ex {
    ex: Exchange,
    mcp: bool,
    /// The request's session id.
    session: Option<String>,
    /// The replica id embedded in the request's cursor, when it decodes.
    replica_id: Option<String>,
    /// The request as forwarded upstream, with the guard's changes applied.
    fwd: Headers,
    stage: Stage,
    token: Option<u32>,
    /// Owner named by a `continue` verdict this exchange received.
    continued: Option<String>,
    /// The request carried a cursor on an MCP path.
    had_cursor: bool,
    /// The `Mcp-Resume` value on the response, when the guard set one.
    refusal: Option<String>,
    rewrites: bool,
    /// Bytes the client received.
    body: Vec<u8>,
}

fn get<'h>(h: &'h Headers, name: &str) -> Option<&'h [u8]> {
    h.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn pick<T: Copy>(all: &[T], i: u8) -> T {
    all[usize::from(i) % all.len()]
}

fn config(s: &Setup) -> Option<Config> {
    let policy = |reject: bool| if reject { "reject" } else { "restart" };
    let max_batch = usize::from(s.max_batch % 8) + 1;
    let json = format!(
        r#"{{"mcp_paths":["/mcp"],"ownership":{{"cluster":"mcp_ownership","max_batch":{max_batch},"max_queue":{q}}},
            "keys":[{{"id":{ACTIVE},"secret":"{key}","active":true}}],
            "policy":{{"get_stream":"{g}","request_stream":"{r}"}},"retention":{ret},
            "max_event_hold_bytes":{hold},"suppress_cursor_echo":{echo}}}"#,
        q = max_batch * 4,
        key = STANDARD.encode(secret(ACTIVE)),
        g = policy(s.get_reject),
        r = policy(!s.request_restart),
        ret = s.retention % 8,
        hold = if s.small_hold { 1024 } else { 65536 },
        echo = s.suppress_echo,
    );
    Config::from_json(json.as_bytes()).ok()
}

/// Known reasons, so a header or body naming one can be checked.
fn reason_named(s: &str) -> bool {
    Reason::ALL.iter().any(|r| r.as_str() == s)
}

struct Run {
    w: Worker,
    host: MockHost,
    exs: Vec<Ex>,
    /// Records batch awaiting its answer: token, body, and whether the service accepts it.
    records: Option<(u32, Vec<u8>, bool)>,
}

impl Run {
    /// Applies and checks what the host was told, for exchange `i` (or the worker).
    fn effects(&mut self, i: Option<usize>) -> Vec<Effect> {
        let effects = self.host.take();
        for e in &effects {
            match e {
                Effect::Dispatch {
                    token,
                    headers,
                    body,
                    ..
                } => {
                    let path = headers
                        .iter()
                        .find(|(k, _)| k == ":path")
                        .map(|(_, v)| v.as_str());
                    match path {
                        Some(RESUME_PATH) => {
                            let q = parse_resume_query(body);
                            assert!(q.is_ok(), "the service refuses the guard's query: {q:?}");
                            if let Some(x) = i.and_then(|i| self.exs.get_mut(i)) {
                                x.token = Some(*token);
                            }
                        }
                        Some(RECORDS_PATH) => {
                            let b = parse_records(body);
                            assert!(b.is_ok(), "the guard's batch does not parse: {b:?}");
                            let rejected = b.map(|b| b.rejected).unwrap_or_default();
                            assert!(
                                rejected.is_empty(),
                                "the guard sent records the service rejects: {rejected:?}"
                            );
                            // The harness may still answer 400 (an older service, a proxy).
                            let valid = body.len() % 7 != 0;
                            self.records = Some((*token, body.clone(), valid));
                        }
                        Some(BRANCH_PATH) => {
                            let q: Result<BranchQuery, _> = serde_json::from_slice(body);
                            assert!(
                                q.is_ok_and(|q| q.validate().is_ok() && q.branch > 0),
                                "the guard asked about a branch the service refuses"
                            );
                            if let Some(x) = i.and_then(|i| self.exs.get_mut(i)) {
                                x.token = Some(*token);
                            }
                        }
                        other => unreachable!("callout to {other:?}"),
                    }
                }
                Effect::LocalResponse {
                    status,
                    headers,
                    body,
                } => {
                    let h: Vec<_> = headers
                        .iter()
                        .filter(|(k, _)| k == MCP_RESUME_HEADER)
                        .collect();
                    let reason = h
                        .first()
                        .and_then(|(_, v)| v.strip_prefix("rejected; reason="));
                    assert!(
                        h.len() == 1 && reason.is_some_and(reason_named),
                        "{headers:?}"
                    );
                    // A session id that cannot name a session is a bad request, never a resume.
                    let bad_sid = matches!(reason, Some("bad_session_id" | "duplicate_header"));
                    assert!(
                        *status == self.w.config.reject_status || (*status == 400 && bad_sid),
                        "{status} {reason:?}"
                    );
                    assert!(!headers
                        .iter()
                        .any(|(k, _)| k.eq_ignore_ascii_case(OWNER_HEADER)));
                    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
                    assert_eq!(v["error"]["data"]["reason"].as_str(), reason, "409 body");
                }
                _ => {}
            }
        }
        if let Some(x) = i.and_then(|i| self.exs.get_mut(i)) {
            for e in &effects {
                match e {
                    Effect::SetRequestHeader(k, v) => {
                        x.fwd.retain(|(n, _)| !n.eq_ignore_ascii_case(k));
                        x.fwd.push((k.clone(), v.as_bytes().to_vec()));
                    }
                    Effect::RemoveRequestHeader(k) => {
                        x.fwd.retain(|(n, _)| !n.eq_ignore_ascii_case(k))
                    }
                    Effect::BodyChunk(b) | Effect::FinishHeld(b) => x.body.extend_from_slice(b),
                    _ => {}
                }
            }
        }
        effects
    }

    /// The request goes upstream: check what it carries.
    fn release(&mut self, i: usize) {
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        x.stage = Stage::Released;
        if let Some(lei) = get(&x.fwd, "last-event-id").filter(|_| x.mcp) {
            let lei = String::from_utf8_lossy(lei);
            assert!(
                x.continued.is_some(),
                "a cursor reached a replica without a continue verdict"
            );
            assert_eq!(
                Some(lei.as_ref()),
                x.replica_id.as_deref(),
                "forwarded Last-Event-ID"
            );
        }
        if let Some(pin) = get(&x.fwd, OWNER_HEADER) {
            let want = x.continued.as_deref().map(|o| STANDARD.encode(o));
            assert_eq!(
                Some(pin),
                want.as_deref().map(str::as_bytes),
                "an owner pin the guard did not set reached a replica"
            );
        }
    }

    fn request(&mut self, step: &Step) {
        let Step::Request {
            method,
            path,
            session,
            version,
            cursor,
            owner_header,
        } = step
        else {
            return;
        };
        if self.exs.len() >= MAX_EXCHANGES {
            return;
        }
        let method = pick(&METHODS, *method);
        let path = pick(&PATHS, *path);
        let mut h: Headers = vec![
            (":method".into(), method.into()),
            (":path".into(), path.into()),
        ];
        let sid = session.map(|s| pick(&SESSIONS, s).to_owned());
        if let Some(s) = &sid {
            h.push(("mcp-session-id".into(), s.clone().into_bytes()));
        }
        if let Some(v) = version {
            h.push(("mcp-protocol-version".into(), pick(&VERSIONS, *v).into()));
        }
        if *owner_header {
            h.push((OWNER_HEADER.into(), STANDARD.encode(OWNERS[0]).into_bytes()));
        }
        let text = cursor.as_ref().map(|c| match c {
            CursorPick::Minted {
                session,
                incarnation,
                request,
                seq,
                replica,
            } => self.w.config.keyring.encode(&Cursor {
                request_id: None,
                session: session_binding(pick(&SESSIONS, *session).as_bytes()),
                incarnation: u64::from(*incarnation),
                kind: if *request {
                    StreamKind::Request
                } else {
                    StreamKind::Get
                },
                seq: u64::from(*seq),
                replica_event_id: replica.map(ev).as_deref(),
            }),
            CursorPick::Text(t) => t.clone(),
        });
        if let Some(t) = &text {
            h.push(("last-event-id".into(), t.clone().into_bytes()));
        }
        let mcp = self.w.config.is_mcp_path(path);
        let replica_id = text
            .as_deref()
            .and_then(|t| self.w.config.keyring.decode(t).ok())
            .and_then(|c| c.replica_event_id);
        self.exs.push(Ex {
            ex: Exchange::new(),
            mcp,
            session: sid,
            replica_id,
            fwd: h.clone(),
            stage: Stage::Paused,
            token: None,
            continued: None,
            had_cursor: mcp && text.is_some(),
            refusal: None,
            rewrites: false,
            body: Vec::new(),
        });
        let i = self.exs.len() - 1;
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        let action =
            x.ex.on_request_headers(&mut self.w, &mut self.host, Some(&h[..]));
        let effects = self.effects(Some(i));
        let replied = effects
            .iter()
            .any(|e| matches!(e, Effect::LocalResponse { .. }));
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        if replied {
            assert_eq!(action, Action::Pause);
            x.stage = Stage::Done;
        } else if action == Action::Continue {
            self.release(i);
        } else {
            assert!(x.token.is_some(), "paused without a callout or a reply");
        }
    }

    fn callout(&mut self, i: usize, status: Option<u8>, verdict: &VerdictPick, stale: bool) {
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        let (Stage::Paused, Some(token)) = (x.stage, x.token) else {
            return;
        };
        let body = match verdict {
            VerdictPick::Continue {
                owner,
                expected,
                head,
                branch,
            } => serde_json::json!({
                "verdict": "continue", "owner": pick(&OWNERS, *owner),
                "expected": expected.iter().copied().map(ev).collect::<Vec<_>>(), "head": head,
                "branch": branch.map(|b| u64::from(b) + 1),
            })
            .to_string()
            .into_bytes(),
            VerdictPick::NewStream { reason } => {
                serde_json::json!({"verdict": "new_stream", "reason": pick(&Reason::ALL, *reason)})
                    .to_string()
                    .into_bytes()
            }
            VerdictPick::Raw(b) => b.clone(),
        };
        let status = status.map(|s| if s % 4 == 0 { u32::from(s) + 100 } else { 200 });
        let token = if stale {
            token.wrapping_add(1000)
        } else {
            token
        };
        if !stale && status == Some(200) {
            // A cursor without the replica's id cannot be continued: the guard restarts it.
            if let Ok(ResumeVerdict::Continue { owner, .. }) = serde_json::from_slice(&body) {
                x.continued = x.replica_id.as_ref().map(|_| owner);
            }
        }
        x.ex.on_callout_response(&mut self.w, &mut self.host, token, status, Some(&body));
        let effects = self.effects(Some(i));
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        if stale {
            assert!(
                effects.is_empty(),
                "a stale callout answer acted: {effects:?}"
            );
            return;
        }
        x.token = None;
        if effects
            .iter()
            .any(|e| matches!(e, Effect::LocalResponse { .. }))
        {
            x.stage = Stage::Done;
        } else {
            assert!(
                effects.contains(&Effect::ResumeRequest),
                "callout answered, request still held"
            );
            self.release(i);
        }
    }

    fn response(&mut self, i: usize, step: &Step) {
        let Step::Response {
            status,
            sse,
            session,
            owner_header,
            upstream,
            ..
        } = step
        else {
            return;
        };
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        if x.stage != Stage::Released {
            return;
        }
        self.host.upstream = OWNERS
            .get(usize::from(*upstream % 4))
            .map(|s| (*s).to_owned());
        let status = pick(&STATUSES, *status);
        let mut h: Headers = vec![(":status".into(), status.to_string().into_bytes())];
        h.push((
            "content-type".into(),
            if *sse {
                "text/event-stream"
            } else {
                "application/json"
            }
            .into(),
        ));
        if let Some(s) = session {
            h.push(("mcp-session-id".into(), pick(&SESSIONS, *s).into()));
        }
        if *owner_header {
            let o = self.host.upstream.clone().unwrap_or_default();
            h.push((OWNER_HEADER.into(), STANDARD.encode(o).into_bytes()));
        }
        let action =
            x.ex.on_response_headers(&mut self.w, &mut self.host, Some(&h[..]), false);
        assert_eq!(action, Action::Continue);
        let effects = self.effects(Some(i));
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        if effects
            .iter()
            .any(|e| matches!(e, Effect::LocalResponse { .. }))
        {
            assert!(
                x.continued.is_some(),
                "only a failed continuation is answered at the response"
            );
            x.stage = Stage::Done;
            return;
        }
        if *owner_header {
            assert!(
                effects.contains(&Effect::RemoveResponseHeader(OWNER_HEADER.into())),
                "the owner header reached the client"
            );
        }
        let resume: Vec<&String> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::SetResponseHeader(k, v) if k == MCP_RESUME_HEADER => Some(v),
                _ => None,
            })
            .collect();
        x.refusal = resume.first().map(|s| (*s).clone());
        if x.had_cursor && x.continued.is_none() {
            let get = get(&x.fwd, ":method") == Some(b"GET");
            let want = if get {
                "restarted; reason="
            } else {
                "stripped; reason="
            };
            let ok = resume.len() == 1
                && resume
                    .first()
                    .and_then(|v| v.strip_prefix(want))
                    .is_some_and(reason_named);
            assert!(ok, "a refused cursor was not told: {resume:?}");
        } else {
            assert!(
                resume.is_empty(),
                "Mcp-Resume without a refusal: {resume:?}"
            );
        }
        // Bodies some client reads as SSE: a 2xx event stream, and any 2xx GET body (the
        // TypeScript SDK does not look at a GET's Content-Type).
        let is_get = get(&x.fwd, ":method") == Some(b"GET");
        x.rewrites = x.mcp && (200..300).contains(&status) && (*sse || is_get);
        assert_eq!(
            x.ex.wants_body(),
            x.rewrites,
            "which bodies the guard reads"
        );
        x.stage = Stage::Responding;
    }

    fn body(&mut self, i: usize, pieces: &[Piece], eos: bool) {
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        if x.stage != Stage::Responding {
            return;
        }
        if eos {
            x.stage = Stage::Done;
        }
        if !x.ex.wants_body() {
            return;
        }
        let chunk = render(pieces, x.replica_id.as_deref());
        let action =
            x.ex.on_response_body(&mut self.w, &mut self.host, Some(&chunk[..]), eos);
        let mut effects = self.effects(Some(i));
        if action == Action::Pause {
            // Only a registered branch's end is held, while the store is asked about it.
            assert!(eos, "a chunk before the end was held");
            let token = self.exs.get(i).and_then(|x| x.token);
            assert!(token.is_some(), "held without asking");
            let forked = chunk.len().is_multiple_of(2);
            let answer = format!(r#"{{"forked":{forked}}}"#);
            if let (Some(x), Some(token)) = (self.exs.get_mut(i), token) {
                x.token = None;
                x.ex.on_callout_response(
                    &mut self.w,
                    &mut self.host,
                    token,
                    Some(200),
                    Some(answer.as_bytes()),
                );
            }
            let after = self.effects(Some(i));
            assert!(
                after
                    .iter()
                    .any(|e| matches!(e, Effect::FinishHeld(_) | Effect::ResetResponse)),
                "a held end was never finished: {after:?}"
            );
            effects.extend(after);
        }
        if eos {
            if let Some(x) = self.exs.get_mut(i) {
                x.ex.on_stream_end(&mut self.w, &mut self.host);
            }
            self.effects(None);
        }
        let Some(x) = self.exs.get_mut(i) else {
            return;
        };
        if effects.contains(&Effect::ResetResponse) {
            x.stage = Stage::Done;
        }
        // A refused cursor's stream starts with the control event.
        let reason = x
            .refusal
            .as_deref()
            .and_then(|r| r.split_once("reason="))
            .map(|(_, r)| r);
        if let Some(reason) = reason.and_then(|r| Reason::ALL.into_iter().find(|x| x.as_str() == r))
        {
            assert!(
                x.body.starts_with(control_event(reason).as_bytes()),
                "no control event first"
            );
        }
        // Every id a client sees is a cursor of this guard.
        let sid = x.session.clone();
        for id in client::parse(&x.body).ids.iter().filter(|i| !i.is_empty()) {
            let c = self.w.config.keyring.decode(id);
            assert!(c.is_ok(), "id {id:?} reached the client: {c:?}");
            if let (Ok(c), Some(s)) = (c, &sid) {
                assert!(
                    c.is_bound_to(s.as_bytes()),
                    "a cursor bound to another session"
                );
            }
        }
    }

    /// Answers the batch in flight as the service would (200, or 400 for a batch it refuses),
    /// or with a transport failure or a 503. A refused batch is never sent again.
    fn records(&mut self, failure: Option<bool>) {
        let Some((token, body, valid)) = self.records.take() else {
            return;
        };
        let status = match failure {
            Some(true) => None,
            Some(false) => Some(503),
            None if valid => Some(200),
            None => Some(400),
        };
        let ack = if valid {
            br#"{"applied":1}"#.to_vec()
        } else {
            br#"{"error":"bad_field","detail":"records[0]: refused"}"#.to_vec()
        };
        self.w
            .on_records_response(&mut self.host, token, status, Some(&ack));
        self.effects(None);
        if status == Some(400) {
            // Nothing can queue records in between: a batch now is a resend.
            self.w.on_tick(&mut self.host);
            self.effects(None);
            let again = self.records.as_ref().map(|(_, b, _)| b);
            assert!(again != Some(&body), "a refused batch was sent again");
        }
    }
}

pub fn exchange(data: &[u8]) {
    let Ok(inp) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let Some(cfg) = config(&inp.setup) else {
        unreachable!("the harness's config is valid");
    };
    let mut host = MockHost::new();
    host.refuse_dispatch = inp.setup.refuse_dispatch;
    let mut run = Run {
        w: Worker::new(cfg),
        host,
        exs: Vec::new(),
        records: None,
    };
    for step in &inp.steps {
        let n = run.exs.len().max(1);
        match step {
            Step::Request { .. } => run.request(step),
            Step::Callout {
                ex,
                status,
                verdict,
                stale_token,
            } => run.callout(usize::from(*ex) % n, *status, verdict, *stale_token),
            Step::Response { ex, .. } => run.response(usize::from(*ex) % n, step),
            Step::Body { ex, pieces, eos } => run.body(usize::from(*ex) % n, pieces, *eos),
            Step::Tick { advance_ms } => {
                run.host.now_ms += u64::from(*advance_ms);
                run.w.on_tick(&mut run.host);
                run.effects(None);
            }
            Step::Records { failure } => run.records(*failure),
        }
    }
}
