//! mcp-resume-guard: the proxy-wasm adapter.
//!
//! Thin by design: it reads headers and bodies, asks the host-free core what to do,
//! and does it. The decision procedure, cursor codec and SSE rewriter live in
//! `mcp-resume-core`. Host calls go through `host`, which logs failures instead of
//! panicking (the trait helpers of the proxy-wasm crate unwrap).

mod host;
mod metrics;
mod records;

use base64::Engine as _;
use mcp_resume_core::config::{Config, Policy};
use mcp_resume_core::cursor::{
    incarnation_hex, session_binding_and_key, session_key, DecodedCursor,
};
use mcp_resume_core::decision::{check_locally, CursorRequest, LocalVerdict};
use mcp_resume_core::ownership::{
    Reason, Record, ResumeQuery, ResumeVerdict, SessionEnd, StreamKind, RESUME_PATH,
};
use mcp_resume_core::stream::{control_event, Flow, StreamState};
use metrics::Metrics;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use records::RecordQueue;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// The shared scratch buffer is dropped after a chunk that grew it beyond this.
const SCRATCH_KEEP_BYTES: usize = 1 << 20;

/// The response header that says a cursor was not honoured.
pub const MCP_RESUME_HEADER: &str = "mcp-resume";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(GuardRoot::default()) });
}}

/// Per-worker root: owns the parsed config, the metrics and the record queue.
#[derive(Default)]
struct GuardRoot {
    config: Option<Rc<Config>>,
    metrics: Option<Rc<Metrics>>,
    queue: Rc<RefCell<RecordQueue>>,
    /// One output buffer per worker, lent to whichever stream's body chunk is being rewritten
    /// (callbacks never nest), so an open stream keeps no buffer of its own.
    scratch: Rc<RefCell<Vec<u8>>>,
}

impl Context for GuardRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        headers: usize,
        _body: usize,
        _trailers: usize,
    ) {
        let ok = headers > 0 && host::call_status() == Some(200);
        let mut q = self.queue.borrow_mut();
        if let Some(m) = &self.metrics {
            q.on_response(token, ok, m);
        }
    }
}

impl RootContext for GuardRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = host::plugin_configuration();
        match Config::from_json(&bytes) {
            Ok(cfg) => {
                let cfg = Rc::new(cfg);
                self.metrics = Some(Rc::new(Metrics::define()));
                self.queue.borrow_mut().configure(&cfg);
                host::set_tick_period(Duration::from_millis(cfg.ownership.flush_ms));
                self.config = Some(cfg);
                true
            }
            Err(e) => {
                // Envoy refuses the listener update; the message names the field.
                host::log(LogLevel::Critical, &format!("mcp-resume-guard: {e}"));
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(m) = &self.metrics {
            let mut q = self.queue.borrow_mut();
            // Counted per chunk in the VM, added to Envoy's stat once per tick: a host call less
            // per body chunk.
            let n = std::mem::take(&mut q.rewritten);
            if n > 0 {
                m.events_rewritten.add(n);
            }
            q.flush(m);
        }
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        let metrics = self.metrics.clone()?;
        Some(Box::new(Guard {
            config,
            metrics,
            queue: self.queue.clone(),
            req: RequestInfo::default(),
            phase: Phase::Idle,
            refusal: None,
            stream: None,
            control_pending: None,
            cut_sent: false,
            scratch: self.scratch.clone(),
            record_keys: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[derive(Default)]
struct RequestInfo {
    mcp: bool,
    method: String,
    session_id: Option<String>,
    protocol_version: Option<String>,
    /// `Mcp-Session-Id` of the response, read with the response headers: header maps cannot be
    /// read from body callbacks (Envoy answers BadArgument and proxy-wasm panics), and an SSE
    /// `initialize` response (TypeScript and Python SDKs) relays its events before any request
    /// carried the session id.
    response_session_id: Option<String>,
}

/// The callout as a small state machine keyed by its token.
enum Phase {
    Idle,
    Asking {
        token: u32,
        cursor: DecodedCursor,
        started_ms: u64,
    },
    /// Forwarded to the owner with the replica's own id restored.
    Continuing {
        cursor: DecodedCursor,
        owner: String,
        expected: Vec<String>,
    },
    /// A local reply was sent; nothing more to do.
    Replied,
}

/// A cursor that was not honoured and the request forwarded without it.
#[derive(Clone, Copy)]
struct Refusal {
    reason: Reason,
    get: bool,
}

impl Refusal {
    fn header(self) -> String {
        let what = if self.get { "restarted" } else { "stripped" };
        format!("{what}; reason={}", self.reason)
    }
}

struct Guard {
    config: Rc<Config>,
    metrics: Rc<Metrics>,
    queue: Rc<RefCell<RecordQueue>>,
    req: RequestInfo,
    phase: Phase,
    refusal: Option<Refusal>,
    stream: Option<StreamState>,
    /// Control event still to be sent at the head of the body.
    control_pending: Option<Reason>,
    /// A replay mismatch cut the stream and the control event was sent.
    cut_sent: bool,
    /// The worker's scratch buffer for rewritten body chunks.
    scratch: Rc<RefCell<Vec<u8>>>,
    /// Store keys of this stream's session and incarnation, computed once per stream.
    record_keys: Option<(String, String)>,
}

impl Guard {
    /// Refuse a cursor: strip it and forward (restart), or answer locally (reject).
    /// Returns the action for the request headers phase.
    fn refuse(&mut self, reason: Reason, kind: Option<StreamKind>) -> Action {
        self.metrics.refused(reason);
        let is_get = self.req.method == "GET";
        match self.config.policy_for(kind, reason) {
            Policy::Reject if is_get => {
                self.reject(reason);
                Action::Pause
            }
            _ => {
                host::remove_request_header("last-event-id");
                self.refusal = Some(Refusal {
                    reason,
                    get: is_get,
                });
                if is_get {
                    self.metrics.restarted.inc();
                } else {
                    self.metrics.stripped.inc();
                }
                Action::Continue
            }
        }
    }

    fn reject(&mut self, reason: Reason) {
        self.metrics.rejected.inc();
        self.phase = Phase::Replied;
        let body = reject_body(reason);
        let header = format!("rejected; reason={reason}");
        host::send_response(
            u32::from(self.config.reject_status),
            &[
                ("content-type", "application/json"),
                (MCP_RESUME_HEADER, &header),
            ],
            body.as_bytes(),
        );
    }

    fn ask(&mut self, cursor: DecodedCursor, session_id: &str) -> Action {
        let query = ResumeQuery {
            session: session_key(session_id.as_bytes()),
            incarnation: incarnation_hex(cursor.incarnation),
            kind: cursor.kind,
            seq: cursor.seq,
        };
        let body = match serde_json::to_vec(&query) {
            Ok(b) => b,
            Err(_) => return self.callout_failed(cursor.kind, "encode"),
        };
        let o = &self.config.ownership;
        let headers = [
            (":method", "POST"),
            (":path", RESUME_PATH),
            (":authority", o.authority.as_str()),
            ("content-type", "application/json"),
        ];
        match host::dispatch(
            &o.cluster,
            &headers,
            &body,
            Duration::from_millis(o.timeout_ms),
        ) {
            Some(token) => {
                self.metrics.callouts.inc();
                self.phase = Phase::Asking {
                    token,
                    cursor,
                    started_ms: host::now_ms(),
                };
                Action::Pause
            }
            None => self.callout_failed(cursor.kind, "dispatch"),
        }
    }

    /// Fail closed: the cluster could not vouch for the cursor.
    fn callout_failed(&mut self, kind: StreamKind, how: &str) -> Action {
        self.metrics.callout_failure(how);
        self.phase = Phase::Idle;
        self.refuse(Reason::OwnershipUnavailable, Some(kind))
    }

    fn on_verdict(&mut self, cursor: DecodedCursor, verdict: Option<ResumeVerdict>) -> Action {
        match verdict {
            None => self.callout_failed(cursor.kind, "body"),
            Some(ResumeVerdict::NewStream { reason }) => self.refuse(reason, Some(cursor.kind)),
            Some(ResumeVerdict::Continue {
                owner, expected, ..
            }) => {
                let Some(replica_id) = cursor.replica_event_id.clone() else {
                    return self.refuse(Reason::UnknownStream, Some(cursor.kind));
                };
                let pin = base64::engine::general_purpose::STANDARD.encode(owner.as_bytes());
                host::set_request_header("last-event-id", &replica_id);
                host::set_request_header(&self.config.owner_header, &pin);
                self.metrics.continued.inc();
                self.phase = Phase::Continuing {
                    cursor,
                    owner,
                    expected,
                };
                Action::Continue
            }
        }
    }

    fn push_record(&self, r: Record) {
        self.queue.borrow_mut().push(r, &self.metrics);
    }

    /// Session lifecycle facts visible in response headers.
    fn record_session(&self, status: u32) {
        let req_sid = self.req.session_id.as_deref();
        match (req_sid, self.req.response_session_id.clone()) {
            (None, Some(new_sid)) if (200..300).contains(&status) => {
                self.push_record(Record::SessionOpen {
                    session: session_key(new_sid.as_bytes()),
                    version: self
                        .req
                        .protocol_version
                        .clone()
                        .unwrap_or_else(|| mcp_resume_core::decision::DEFAULT_VERSION.to_string()),
                });
            }
            (Some(sid), _) if status == 404 => self.push_record(Record::SessionEnd {
                session: session_key(sid.as_bytes()),
                why: SessionEnd::Expired,
            }),
            (Some(sid), _) if self.req.method == "DELETE" && (200..300).contains(&status) => self
                .push_record(Record::SessionEnd {
                    session: session_key(sid.as_bytes()),
                    why: SessionEnd::Terminated,
                }),
            _ => {}
        }
    }

    /// The session this response belongs to: the request's, or the one an `initialize`
    /// response just created.
    fn session_id(&self) -> Option<&str> {
        self.req
            .session_id
            .as_deref()
            .or(self.req.response_session_id.as_deref())
    }

    /// A 2xx SSE response: open (or continue) an incarnation and start rewriting.
    fn open_stream(&mut self) {
        // One SHA-256 of the session id gives both the cursor binding and the store key.
        let sid = self.session_id().map(str::to_owned);
        let (binding, skey) = session_binding_and_key(sid.as_deref().unwrap_or("").as_bytes());
        let max_hold = self.config.max_event_hold_bytes;
        let stream = match &self.phase {
            Phase::Continuing {
                cursor, expected, ..
            } => StreamState::continuation(
                cursor,
                expected.clone(),
                self.config.suppress_cursor_echo,
                max_hold,
            )
            .with_contiguity(self.config.contiguity),
            _ => {
                let kind = if self.req.method == "GET" {
                    StreamKind::Get
                } else {
                    StreamKind::Request
                };
                let inc = host::random_u64();
                if let (Some(_), Some(owner)) = (&sid, host::upstream_address()) {
                    self.push_record(Record::StreamOpen {
                        session: skey.clone(),
                        incarnation: incarnation_hex(inc),
                        kind,
                        owner,
                        retention: self.config.retention,
                        supersedes: kind == StreamKind::Get,
                        opened_ms: host::now_ms(),
                    });
                }
                self.metrics.streams_opened.inc();
                StreamState::fresh(binding, inc, kind, max_hold)
            }
        };
        // Without a session nothing is recorded: such a stream cannot be resumed anyway.
        if sid.is_some() {
            self.record_keys = Some((skey, incarnation_hex(stream.incarnation())));
        }
        host::remove_response_header("content-length");
        self.stream = Some(stream);
    }

    fn flush_relayed(&mut self) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        let Some((first_seq, ids)) = stream.take_relayed() else {
            return;
        };
        self.queue.borrow_mut().rewritten += ids.len() as u64;
        let Some((session, incarnation)) = self.record_keys.clone() else {
            return;
        };
        self.push_record(Record::Events {
            session,
            incarnation,
            first_seq,
            ids,
        });
    }

    /// The continued incarnation's log is lost: later cursors for it restart at once.
    fn record_stream_lost(&self, cursor: &DecodedCursor) {
        if let Some(sid) = self.req.session_id.as_deref() {
            self.push_record(Record::StreamLost {
                session: session_key(sid.as_bytes()),
                incarnation: incarnation_hex(cursor.incarnation),
            });
        }
    }

    /// The owner failed the continuation: its log is lost. Tell the client explicitly.
    fn owner_failed(&mut self, cursor: &DecodedCursor) {
        self.record_stream_lost(cursor);
        self.metrics.refused(Reason::OwnerUnavailable);
        self.reject(Reason::OwnerUnavailable);
    }
}

impl Context for Guard {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _trailers: usize) {
        let Phase::Asking { token: want, .. } = &self.phase else {
            return;
        };
        if *want != token {
            return;
        }
        let Phase::Asking {
            cursor, started_ms, ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        self.metrics
            .callout_latency(host::now_ms().saturating_sub(started_ms));
        let action = if headers == 0 {
            // A reset after the callout's headers, or a failure before any response, arrives without
            // headers; Envoy reports timeouts and refused connections as its own 503/504.
            self.callout_failed(cursor.kind, "no_response")
        } else if host::call_status() != Some(200) {
            self.callout_failed(cursor.kind, "status")
        } else {
            let verdict = host::call_body(body).and_then(|b| serde_json::from_slice(&b).ok());
            self.on_verdict(cursor, verdict)
        };
        if matches!(action, Action::Continue) {
            host::resume_request();
        }
    }
}

impl HttpContext for Guard {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        // One host call for all of them (each single read is a VM round trip plus an allocation).
        let h = host::request_headers();
        let path = h.get(":path").unwrap_or_default();
        if !self.config.is_mcp_path(&path) {
            return Action::Continue;
        }
        self.req.mcp = true;
        // Only the guard may pin a replica: a client must not choose its pod.
        if h.has(&self.config.owner_header) {
            host::remove_request_header(&self.config.owner_header);
            self.metrics.owner_header_removed.inc();
        }
        self.req.method = h.get(":method").unwrap_or_default();
        self.req.session_id = h.get("mcp-session-id");
        self.req.protocol_version = h.get("mcp-protocol-version");
        let Some(last_event_id) = h.get("last-event-id") else {
            return Action::Continue;
        };
        self.metrics.cursors_seen.inc();
        let req = CursorRequest {
            is_get: self.req.method == "GET",
            last_event_id: &last_event_id,
            session_id: self.req.session_id.as_deref(),
            protocol_version: self.req.protocol_version.as_deref(),
        };
        match check_locally(&self.config.keyring, &req) {
            LocalVerdict::Refuse { reason, kind } => self.refuse(reason, kind),
            LocalVerdict::Ask(cursor) => {
                let sid = self.req.session_id.clone().unwrap_or_default();
                self.ask(cursor, &sid)
            }
        }
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        if !self.req.mcp || matches!(self.phase, Phase::Replied) {
            return Action::Continue;
        }
        let h = host::response_headers();
        // stateful_session echoes the chosen host to clients; the owner never leaks.
        if h.has(&self.config.owner_header) {
            host::remove_response_header(&self.config.owner_header);
        }
        let status = h
            .get(":status")
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0);
        self.req.response_session_id = h.get("mcp-session-id");
        if let Phase::Continuing { cursor, owner, .. } = &self.phase {
            // Strict stateful_session answers 503 when the owner is down or gone; a 4xx is the
            // owner's own answer (404: session gone) and passes through.
            let served_by_owner = host::upstream_address().as_deref() == Some(owner.as_str());
            if status >= 500 || !served_by_owner {
                let cursor = cursor.clone();
                self.owner_failed(&cursor);
                return Action::Continue;
            }
        }
        self.record_session(status);
        let is_sse = h
            .get("content-type")
            .map(|ct| {
                ct.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            })
            .unwrap_or(false);
        if let Some(refusal) = self.refusal {
            host::set_response_header(MCP_RESUME_HEADER, &refusal.header());
        }
        if is_sse && (200..300).contains(&status) {
            self.control_pending = self.refusal.map(|r| r.reason);
            self.open_stream();
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        if self.stream.is_none() && self.control_pending.is_none() {
            return Action::Continue;
        }
        if self.cut_sent {
            // The control event went out with the previous chunk; end the stream now, so the
            // client reconnects instead of waiting on a stream that will carry nothing more.
            host::set_response_body(size, &[]);
            host::reset_response();
            return Action::Continue;
        }
        let chunk = host::response_body(size);
        let mut out = std::mem::take(&mut *self.scratch.borrow_mut());
        out.clear();
        if let Some(reason) = self.control_pending.take() {
            out.extend_from_slice(control_event(reason).as_bytes());
        }
        let mut flow = Flow::Open;
        let mut cut_reason = None;
        if let Some(stream) = self.stream.as_mut() {
            flow = stream.push(&self.config.keyring, &chunk, &mut out);
            if eos {
                flow = stream.finish(&mut out);
            }
            cut_reason = stream.cut_reason();
        } else {
            out.extend_from_slice(&chunk);
        }
        if flow == Flow::CutReplayMismatch {
            self.cut_sent = true;
        }
        if flow == Flow::CutReplayMismatch && !matches!(self.phase, Phase::Replied) {
            // Tell the cluster once; the control event is already in `out`.
            if let Phase::Continuing { cursor, .. } =
                std::mem::replace(&mut self.phase, Phase::Replied)
            {
                // `gap` / `unasserted`: the replica's own word, or its silence in asserted mode.
                match cut_reason {
                    Some(r) if r != Reason::ReplayMismatch => self.metrics.refused(r),
                    _ => self.metrics.replay_mismatch.inc(),
                }
                self.record_stream_lost(&cursor);
            }
        }
        host::set_response_body(size, &out);
        // Keep the worker's buffer, unless one huge chunk made it large.
        if out.capacity() > SCRATCH_KEEP_BYTES {
            out = Vec::new();
        }
        *self.scratch.borrow_mut() = out;
        self.flush_relayed();
        Action::Continue
    }
}

fn reject_body(reason: Reason) -> String {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32010,
            "message": format!(
                "Last-Event-ID not honoured ({reason}): reconnect without Last-Event-ID to open a new stream"
            ),
            "data": { "resumed": false, "reason": reason.as_str() }
        }
    })
    .to_string()
}
