//! The guard's per-request protocol as a host-free state machine.
//!
//! An adapter feeds plain events in (request headers, callout answer, response headers, body
//! chunk; per worker: tick and record answers) and the exchange acts through a [`Host`]. It
//! owns every rule of the exchange: which cursors are refused and how, the callout and its
//! verdict, session-lifecycle and stream records, opening or continuing a stream, owner
//! failure, cuts.
//!
//! Headers arrive as one slice of [`HeaderField`]s per direction (names as the proxy keeps them,
//! values as raw bytes), read once per direction. They may be views into the proxy's own header
//! map: every value the exchange keeps is copied, and the slice is read completely before the
//! first host call of the hook (a header the host sets, removes or replaces with a local reply
//! may move what a view points to).
use crate::config::{Config, Policy};
use crate::cursor::{incarnation_hex, session_binding_and_key, session_key, DecodedCursor};
use crate::decision::{check_locally, CursorRequest, LocalVerdict, DEFAULT_VERSION};
use crate::eventsource::{Dispatch, Parser};
use crate::host::{CalloutFailure, Host, LogLevel, Stat};
use crate::jsonrpc::{client_response, split_ids, RequestIdScanner, Scan};
use crate::ownership::{
    check_version, post_headers, BranchAnswer, BranchQuery, Reason, Record, ResumeQuery,
    ResumeVerdict, SessionEnd, StreamKind, BRANCH_PATH, RESUME_PATH,
};
use crate::records::{Overtaken, RecordQueue, StreamKey};
use crate::stream::{control_event, Flow, StreamState};
use base64::Engine as _;
use std::io::Write as _;

/// The response header that says a cursor was not honoured.
pub const MCP_RESUME_HEADER: &str = "mcp-resume";
/// Recorded as the version of a session whose `MCP-Protocol-Version` a record cannot carry.
pub const INVALID_VERSION: &str = "invalid";
/// The `Content-Type` of every response the guard relays as SSE: no parameters, so every client
/// decodes it as UTF-8 (the TypeScript SDK always does; Python's decodes by a `charset`).
const SSE_CONTENT_TYPE: &str = "text/event-stream";
/// The worker's scratch buffer is dropped after a chunk that grew it beyond this.
const SCRATCH_KEEP_BYTES: usize = 1 << 20;
/// The JSON-RPC error code of a refused resume (in the 409 body and the settling answer).
pub const REFUSED_CODE: i64 = -32010;
/// Branches the store refused events of, waiting for their stream's next chunk (per worker).
/// Each is taken by its stream's next chunk or end; the bound only matters if the store names
/// branches this worker no longer carries.
const MAX_OVERTAKEN: usize = 1024;
/// `response.code_details` of strict stateful_session when the owner is not in the cluster:
/// the one failure that shows the owner is gone, not just busy.
pub const OWNER_NOT_IN_CLUSTER: &str = "no_healthy_upstream";

/// What the proxy does with the request or response after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// Hold the request until the callout answers (or a local reply was sent).
    Pause,
}

/// Per-worker state: the configuration, the record queue and one output buffer lent to
/// whichever stream's chunk is being rewritten (callbacks never nest), so an open stream keeps
/// no buffer of its own.
#[derive(Debug)]
pub struct Worker {
    pub config: Config,
    /// `authorization` of callouts, when a token is configured.
    auth: Option<String>,
    records: RecordQueue,
    scratch: Vec<u8>,
    /// Events rewritten since the last tick, added to the stat once per tick.
    rewritten: u64,
    /// Streams opened since the last tick, added to the stat once per tick.
    opened: u64,
    /// The worker's clock, read from the host at most once per tick ([`Worker::clock_ms`]).
    clock_ms: Option<u64>,
    /// Incarnation ids ([`Worker::next_incarnation`]), seeded once from the host's randomness.
    incarnations: Option<Incarnations>,
    /// Branches the store refused events of (the store arbitrates forks for every gateway;
    /// this is the worker's copy of its answers, read by the branches' next chunk).
    overtaken: Vec<Overtaken>,
}

impl Worker {
    pub fn new(config: Config) -> Worker {
        Worker {
            records: RecordQueue::new(&config),
            auth: config.ownership_authorization(),
            config,
            scratch: Vec::new(),
            rewritten: 0,
            opened: 0,
            clock_ms: None,
            incarnations: None,
            overtaken: Vec::new(),
        }
    }

    /// How often the adapter should call [`Worker::on_tick`].
    pub fn tick_ms(&self) -> u64 {
        self.config.ownership.flush_ms
    }

    /// Periodic work: stats batched in the worker, and the next record batch.
    pub fn on_tick<H: Host>(&mut self, host: &mut H) {
        // The next use reads the host's clock again.
        self.clock_ms = None;
        for (stat, n) in [
            (Stat::EventsRewritten, std::mem::take(&mut self.rewritten)),
            (Stat::StreamsOpened, std::mem::take(&mut self.opened)),
        ] {
            if n > 0 {
                host.count(stat, n);
            }
        }
        self.records.flush(host);
    }

    /// The time as of the first use since the last tick: one clock read per tick however
    /// many streams open. Only for what a tick's precision serves (a record's `opened_ms`,
    /// which stores keep for information); latencies read the host's clock.
    fn clock_ms<H: Host>(&mut self, host: &H) -> u64 {
        *self.clock_ms.get_or_insert_with(|| host.now_ms())
    }

    /// A new incarnation id: unique on this worker, unpredictable across workers and gateways
    /// (the host's randomness seeds the worker once), with no host call per stream.
    fn next_incarnation<H: Host>(&mut self, host: &mut H) -> u64 {
        self.incarnations
            .get_or_insert_with(|| Incarnations::seeded(host.random_u64()))
            .next_id()
    }

    /// The answer to a record batch (`status` `None`: no response headers).
    pub fn on_records_response<H: Host>(
        &mut self,
        host: &mut H,
        token: u32,
        status: Option<u32>,
        body: Option<&[u8]>,
    ) {
        let cut = self.records.on_response(host, token, status, body);
        if !cut.is_empty() {
            self.overtaken.extend(cut);
            let extra = self.overtaken.len().saturating_sub(MAX_OVERTAKEN);
            self.overtaken.drain(..extra);
        }
    }

    /// Takes the store's word that this branch must end, if it gave one.
    fn take_overtaken(&mut self, incarnation: &str, branch: u64) -> Option<Reason> {
        let i = self
            .overtaken
            .iter()
            .position(|o| o.branch == branch && o.incarnation == incarnation)?;
        Some(self.overtaken.swap_remove(i).reason)
    }

    /// Records waiting to be sent.
    pub fn queued_records(&self) -> usize {
        self.records.len()
    }
}

/// A worker's incarnation ids: splitmix64 (a Weyl sequence of odd step through a bijective
/// mix) from a random start. Distinct for 2^64 ids on one worker; ids of two workers meet only
/// if their random starts fall within as many steps of each other. Incarnation ids are not
/// secrets (every cursor shows its own); they name a stream's lives within its session.
#[derive(Debug, Clone, Copy)]
struct Incarnations {
    state: u64,
}

impl Incarnations {
    fn seeded(seed: u64) -> Incarnations {
        Incarnations { state: seed }
    }

    fn next_id(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// One header as the proxy gives it: its name and its value's raw bytes. Tuples of owned or
/// borrowed strings are headers; an adapter may pass views into the proxy's own map instead.
pub trait HeaderField {
    fn name(&self) -> &[u8];
    fn value(&self) -> &[u8];
}

impl<K: AsRef<str>, V: AsRef<[u8]>> HeaderField for (K, V) {
    fn name(&self) -> &[u8] {
        self.0.as_ref().as_bytes()
    }
    fn value(&self) -> &[u8] {
        self.1.as_ref()
    }
}

#[derive(Debug, Default)]
struct RequestInfo {
    mcp: bool,
    method: String,
    /// Raw bytes: session ids are hashed as they are. `None` when absent or repeated.
    session_id: Option<Vec<u8>>,
    protocol_version: Option<String>,
    /// `Mcp-Session-Id` of the response: an SSE `initialize` response relays its events
    /// before any request carried the session id.
    response_session_id: Option<Vec<u8>>,
    /// A POST's JSON-RPC ids while its body is still being read ([`RequestIdScanner`]).
    id_scan: Option<Box<RequestIdScanner>>,
    /// The POST's JSON-RPC ids as carried text (one raw id, or a batch's array of them), once
    /// its body's top-level value ended: its stream's cursors carry it.
    request_id: Option<String>,
}

/// The request headers the exchange reads, from one pass over the map. Repeated headers the
/// exchange must read as one value are counted, so an ambiguous request is refused by name.
#[derive(Default)]
struct RequestView<'h> {
    path: Option<&'h [u8]>,
    method: Option<&'h [u8]>,
    session_id: Option<&'h [u8]>,
    session_ids: usize,
    last_event_id: Option<&'h [u8]>,
    last_event_ids: usize,
    version: Option<&'h [u8]>,
    versions: usize,
    owner_header: bool,
    accept_encoding: Option<&'h [u8]>,
}

impl<'h> RequestView<'h> {
    fn read<F: HeaderField>(h: &'h [F], owner_header: &str) -> Self {
        let owner_header = owner_header.as_bytes();
        let mut r = RequestView::default();
        for f in h {
            let (k, v) = (f.name(), f.value());
            let first = |slot: &mut Option<&'h [u8]>, n: &mut usize| {
                *n += 1;
                slot.get_or_insert(v);
            };
            if k.eq_ignore_ascii_case(b":path") {
                r.path.get_or_insert(v);
            } else if k.eq_ignore_ascii_case(b":method") {
                r.method.get_or_insert(v);
            } else if k.eq_ignore_ascii_case(b"mcp-session-id") {
                first(&mut r.session_id, &mut r.session_ids);
            } else if k.eq_ignore_ascii_case(b"last-event-id") {
                first(&mut r.last_event_id, &mut r.last_event_ids);
            } else if k.eq_ignore_ascii_case(b"mcp-protocol-version") {
                first(&mut r.version, &mut r.versions);
            } else if k.eq_ignore_ascii_case(owner_header) {
                r.owner_header = true;
            } else if k.eq_ignore_ascii_case(b"accept-encoding") {
                r.accept_encoding.get_or_insert(v);
            }
        }
        r
    }

    /// Why the request's `Mcp-Session-Id` cannot name a session: repeated, or not one value of
    /// visible ASCII (the MCP spec's 0x21–0x7E; an empty value included). `None`: absent or valid.
    fn session_id_refusal(&self) -> Option<Reason> {
        let visible = |v: &[u8]| !v.is_empty() && v.iter().all(|b| (0x21..=0x7e).contains(b));
        match self.session_id {
            _ if self.session_ids > 1 => Some(Reason::DuplicateHeader),
            Some(v) if !visible(v) => Some(Reason::BadSessionId),
            _ => None,
        }
    }
}

/// What the exchange reads of the response headers, from one pass over the map.
#[derive(Default)]
struct ResponseView {
    owner_header: bool,
    /// `:status` (0 when absent or not a number).
    status: u32,
    /// `Mcp-Session-Id`, copied; `None` when absent or repeated.
    session_id: Option<Vec<u8>>,
    /// Some `Content-Type` mentions `text/event-stream` (see [`is_event_stream`]).
    is_sse: bool,
    /// A `Location` header is present.
    location: bool,
    /// The first `Content-Encoding` names anything but identity, or a `Content-Type` names a
    /// charset other than UTF-8 (Python's client decodes by it: UTF-16 or UTF-7 bytes hide ids
    /// and events from a UTF-8 reading).
    encoded: bool,
    content_length: bool,
    /// `Content-Type` instances, and whether all of them were exactly [`SSE_CONTENT_TYPE`].
    content_types: u32,
    plain_sse_type: bool,
}

impl ResponseView {
    fn read<F: HeaderField>(h: &[F], owner_header: &str) -> Self {
        let owner_header = owner_header.as_bytes();
        let mut r = ResponseView::default();
        let (mut status, mut sid, mut sids, mut ce) = (None, None, 0, None);
        for f in h {
            let (k, v) = (f.name(), f.value());
            if k.eq_ignore_ascii_case(b":status") {
                status.get_or_insert(v);
            } else if k.eq_ignore_ascii_case(b"mcp-session-id") {
                sids += 1;
                sid.get_or_insert(v);
            } else if k.eq_ignore_ascii_case(b"content-type") {
                // Every instance: clients join repeated headers (", ") and read the joined value.
                r.is_sse |= is_event_stream(v);
                r.encoded |= foreign_charset(v);
                r.content_types += 1;
                r.plain_sse_type = r.content_types == 1 && v == SSE_CONTENT_TYPE.as_bytes();
            } else if k.eq_ignore_ascii_case(b"location") {
                r.location = true;
            } else if k.eq_ignore_ascii_case(b"content-encoding") {
                ce.get_or_insert(v);
            } else if k.eq_ignore_ascii_case(b"content-length") {
                r.content_length = true;
            } else if k.eq_ignore_ascii_case(owner_header) {
                r.owner_header = true;
            }
        }
        r.status = status
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0);
        r.session_id = sid.filter(|_| sids == 1).map(<[u8]>::to_vec);
        r.encoded |= encoded(ce);
        r
    }

    /// Whether some client reads this response's body as an event stream, so its ids must be
    /// rewritten. The TypeScript SDK reads any 2xx GET body as SSE without looking at the
    /// `Content-Type`, and a POST's when the media type is `text/event-stream`; Python's reads a
    /// POST's at any status below 400 but a redirect when the `Content-Type` starts with
    /// `text/event-stream`.
    fn client_reads_sse(&self, get: bool) -> bool {
        let redirect = matches!(self.status, 301 | 302 | 303 | 307 | 308) && self.location;
        match self.status {
            200..=299 => get || self.is_sse,
            300..=399 => self.is_sse && !redirect,
            _ => false,
        }
    }
}

/// Does a `Content-Type` value mention `text/event-stream` anywhere (ASCII case aside)? Clients
/// differ: the TypeScript SDK compares the parsed media type, Python's takes any value that
/// starts with it (`text/event-stream, text/plain`, `text/event-streams`), and joined headers put
/// it after a comma. Mentioning it anywhere covers them all; a false positive only rewrites ids
/// nobody reads.
fn is_event_stream(ct: &[u8]) -> bool {
    const SSE: &[u8] = b"text/event-stream";
    ct.windows(SSE.len()).any(|w| w.eq_ignore_ascii_case(SSE))
}

/// The callout as a small state machine keyed by its token.
#[derive(Debug)]
enum Phase {
    Idle,
    Asking {
        token: u32,
        cursor: DecodedCursor,
        started_ms: u64,
        /// What to record if the store's answer goes unused: the branch it may register for
        /// this resume must not count as another reader (`Record::Abandoned`).
        abandon: Record,
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
#[derive(Debug, Clone, Copy)]
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

/// What the client of a request stream (fresh, or a registered branch) dispatched (its own
/// parser over the guard's output), until the response to every request of the stream went out.
/// A call counts answered only by a `message` event every client takes as its response
/// ([`client_response`], [`crate::jsonrpc::Response::answers`]): anything one of them refuses (and drops) keeps
/// the end asking.
struct CallWatch {
    parser: Parser,
    /// Ids of the stream's requests still without a response: parsed JSON to match responses,
    /// and the raw text the client sent, to settle them with.
    pending: Vec<(serde_json::Value, String)>,
    /// A result response (to any id) went out: the TypeScript SDK then never resumes the
    /// stream, whatever cursor it holds.
    result_seen: bool,
    /// The dispatched events of the chunk being read (buffer reused).
    events: Vec<Dispatch>,
}

impl CallWatch {
    /// `None` when the stream's request ids are unknown (its end always asks).
    fn new(carried: Option<&str>) -> Option<Box<CallWatch>> {
        let pending = split_ids(carried?)?
            .into_iter()
            .map(|id| serde_json::from_str(id).ok().map(|v| (v, id.to_owned())))
            .collect::<Option<Vec<_>>>()?;
        (!pending.is_empty()).then(|| {
            Box::new(CallWatch {
                parser: Parser::new(),
                pending,
                result_seen: false,
                events: Vec::new(),
            })
        })
    }

    fn answered(&self) -> bool {
        self.pending.is_empty()
    }

    /// Would every client resume from a cursor it holds? The TypeScript SDK does not once it
    /// dispatched a result response (`receivedResponse`); Python's does not once it got any
    /// response, but that response then ended its call.
    fn clients_resume(&self) -> bool {
        !self.result_seen
    }

    /// The raw ids of the requests still without a response.
    fn unanswered(&self) -> impl Iterator<Item = &str> {
        self.pending.iter().map(|(_, raw)| raw.as_str())
    }

    /// Reads bytes that went out to the client. `false`: the block being read outgrew
    /// `max_hold` before the call was answered, and the watch ends.
    fn read(&mut self, out: &[u8], max_hold: usize) -> bool {
        if self.answered() {
            return true;
        }
        self.parser.feed(out, &mut self.events);
        for ev in self.events.drain(..) {
            if !(ev.event.is_empty() || ev.event == "message") {
                continue;
            }
            // A batch (an array) is no response to either SDK: TypeScript's schema refuses it,
            // Python's reports a parse error for its call.
            match serde_json::from_str::<serde_json::Value>(&ev.data) {
                Ok(msg) => {
                    if let Some(r) = client_response(&msg) {
                        self.result_seen |= r.result;
                        self.pending.retain(|(p, _)| !r.answers(p));
                    }
                }
                // JSON that `JSON.parse` reads but serde does not (a lone surrogate, a number
                // out of range) may be a result: err towards "the client will not resume".
                Err(_) => self.result_seen |= ev.data.contains("\"result\""),
            }
        }
        self.answered() || self.parser.held_bytes() <= max_hold
    }
}

/// One request/response through the guard.
pub struct Exchange {
    req: RequestInfo,
    phase: Phase,
    refusal: Option<Refusal>,
    stream: Option<StreamState>,
    /// Control event still to be sent at the head of the body.
    control_pending: Option<Reason>,
    /// The `retry:` hint (ms) still to be sent at the head of a request stream's body.
    retry_pending: Option<u64>,
    /// A cut sent its control event; the next chunk ends the stream.
    cut_sent: bool,
    /// Store keys of this stream's session and incarnation, computed once per stream.
    record_keys: Option<(String, String)>,
    /// The branch of the incarnation this response carries (0: its first response, or a
    /// continuation the store did not register), tagged on its `Events`.
    branch: u64,
    /// The store registered this continuation's branch: its end must be reported.
    branch_open: bool,
    /// The replica ended this branch; the end is held while the store says (answering this
    /// token) whether another branch of the incarnation is open: then this one was overtaken.
    ending: Option<u32>,
    /// A request stream (fresh, or a registered branch): whether its calls were answered on it.
    call: Option<Box<CallWatch>>,
    /// When a continuation forwarded to its owner must have its response headers, and, while
    /// recorded events are owed, its next replayed event (host clock, ms); `None` once the
    /// owed replay is complete or the exchange ended.
    headers_due: Option<u64>,
    /// A replay is expected and its first event has not been checked yet: the deadline runs.
    awaiting_replay: bool,
    /// The client's connection is above its write-buffer high watermark (hosts that report it):
    /// the client is not reading, so a wait between owed events is not the owner's.
    backpressured: bool,
    /// Meanwhile the owner's response headers are held (hosts that can, see
    /// [`Host::holds_headers_with_body`]): nothing reached the client, so the deadline can
    /// still answer locally.
    holding: bool,
    /// The rewritten output held with the headers (blocks that dispatch nothing: comments,
    /// `retry`), released with the first replayed event.
    held: Vec<u8>,
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange::new()
    }
}

fn lossy(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

impl Exchange {
    pub fn new() -> Exchange {
        Exchange {
            req: RequestInfo::default(),
            phase: Phase::Idle,
            refusal: None,
            stream: None,
            control_pending: None,
            retry_pending: None,
            cut_sent: false,
            record_keys: None,
            branch: 0,
            branch_open: false,
            ending: None,
            call: None,
            headers_due: None,
            awaiting_replay: false,
            backpressured: false,
            holding: false,
            held: Vec::new(),
        }
    }

    /// Whether the adapter must read the next request body chunk and pass it to
    /// [`Exchange::on_request_body`] (a POST whose JSON-RPC id is not found yet).
    pub fn wants_request_body(&self) -> bool {
        self.req.id_scan.is_some()
    }

    /// One request body chunk (`None`: the host could not read it; the ids are then unknown and
    /// a refusal of this stream's cursors cannot name them). The chunk always passes unchanged.
    pub fn on_request_body(&mut self, chunk: Option<&[u8]>, eos: bool) {
        let Some(scan) = self.req.id_scan.as_mut() else {
            return;
        };
        let found = match chunk {
            Some(c) => {
                scan.push(c);
                if eos {
                    scan.finish();
                }
                scan.result().clone()
            }
            None => Scan::None,
        };
        match found {
            Scan::Pending => {}
            Scan::Found(id) => {
                self.req.request_id = Some(id);
                self.req.id_scan = None;
            }
            Scan::None => self.req.id_scan = None,
        }
    }

    /// Whether the adapter must read the next body chunk and pass it in (otherwise it passes
    /// through untouched and need not be read at all).
    pub fn wants_body(&self) -> bool {
        self.stream.is_some()
            || self.control_pending.is_some()
            || self.retry_pending.is_some()
            || self.cut_sent
    }

    /// The request headers, or `None` when the host could not read them.
    ///
    /// Order: the owner header is removed on every path, before the path is matched; then only
    /// MCP paths go on. A request whose headers cannot be read may carry a cursor or a pin, so it
    /// is answered locally (`host_error`).
    pub fn on_request_headers<H: Host, F: HeaderField>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        headers: Option<&[F]>,
    ) -> Action {
        let Some(headers) = headers else {
            host.remove_request_header(&w.config.owner_header);
            host.remove_request_header("last-event-id");
            host.count(Stat::HostErrors, 1);
            host.count(Stat::Refused(Reason::HostError), 1);
            self.req.mcp = true;
            self.reject(w, host, Reason::HostError);
            return Action::Pause;
        };
        let cfg = &w.config;
        // Everything read from the headers (copied where kept), before the first host call.
        let h = RequestView::read(headers, &cfg.owner_header);
        let owner_header = h.owner_header;
        let path = h.path.map(String::from_utf8_lossy).unwrap_or_default();
        let mcp = cfg.is_mcp_path(&path);
        let identity = h.accept_encoding == Some(&b"identity"[..]);
        // `None`: no cursor; `Some(None)`: a cursor among repeated headers.
        let mut local = None;
        if mcp {
            self.req.method = h.method.map(lossy).unwrap_or_default();
            // A repeated session id is ambiguous: nothing is recorded or bound for it.
            self.req.session_id = h
                .session_id
                .filter(|_| h.session_ids == 1)
                .map(<[u8]>::to_vec);
            self.req.protocol_version = h.version.map(lossy);
            local = h.last_event_id.map(|last_event_id| {
                // Which value would the replica read? Not a question to guess at.
                let unique = h.last_event_ids == 1 && h.session_ids <= 1 && h.versions <= 1;
                unique.then(|| {
                    let req = CursorRequest {
                        is_get: self.req.method == "GET",
                        last_event_id,
                        session_id: self.req.session_id.as_deref(),
                        protocol_version: self.req.protocol_version.as_deref(),
                    };
                    check_locally(&cfg.keyring, &req)
                })
            });
        }
        // Only the guard may pin a replica, on any path: a client must not choose its pod.
        if owner_header {
            host.remove_request_header(&cfg.owner_header);
            host.count(Stat::OwnerHeaderRemoved, 1);
        }
        if !mcp {
            return Action::Continue;
        }
        self.req.mcp = true;
        // Refused before any replica sees it: a server may take an empty id for none and open a
        // session, past a rate limit that only counts POSTs without the header.
        if let Some(reason) = h.session_id_refusal() {
            host.count(Stat::Refused(reason), 1);
            self.reply_refusal(host, 400, &session_refusal_body(reason), reason);
            return Action::Pause;
        }
        // The guard must read every SSE answer: replicas are asked for identity encoding (an
        // encoded SSE answer is refused, `encoded_stream`). A compressor belongs after the guard.
        if !identity {
            host.set_request_header("accept-encoding", "identity");
        }
        if self.req.method == "POST" {
            self.req.id_scan = Some(Box::default());
        }
        let Some(local) = local else {
            return Action::Continue;
        };
        host.count(Stat::CursorsSeen, 1);
        match local {
            None => self.refuse(w, host, Reason::DuplicateHeader, None, None),
            Some(LocalVerdict::Refuse {
                reason,
                kind,
                request_id,
            }) => self.refuse(w, host, reason, kind, request_id.as_deref()),
            Some(LocalVerdict::Ask(cursor)) => {
                let sid = self.req.session_id.clone().unwrap_or_default();
                self.ask(w, host, cursor, &sid)
            }
        }
    }

    /// The answer to this request's resume callout: `status` is `None` when no response headers
    /// arrived, `body` when the host could not read it. Resumes the request when it goes on.
    pub fn on_callout_response<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        token: u32,
        status: Option<u32>,
        body: Option<&[u8]>,
    ) {
        if let Some(want) = self.ending {
            if want == token {
                self.ending = None;
                self.on_branch_answer(w, host, status, body);
            }
            return;
        }
        let Phase::Asking { token: want, .. } = &self.phase else {
            return;
        };
        if *want != token {
            return;
        }
        let Phase::Asking {
            cursor,
            started_ms,
            abandon,
            ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        let now = host.now_ms();
        host.observe_callout_ms(now.saturating_sub(started_ms));
        // Only a `new_stream` verdict says for sure that the store registered no branch.
        let mut refused = false;
        let action = match status {
            // A reset after the callout's headers, or a failure before any response, arrives
            // without headers; Envoy reports timeouts and refused connections as its own 503/504.
            None => self.callout_failed(w, host, &cursor, CalloutFailure::NoResponse),
            Some(200) => {
                let verdict = body.and_then(|b| serde_json::from_slice(b).ok());
                refused = matches!(verdict, Some(ResumeVerdict::NewStream { .. }));
                self.on_verdict(w, host, cursor, verdict)
            }
            Some(_) => self.callout_failed(w, host, &cursor, CalloutFailure::Status),
        };
        if let Phase::Continuing { .. } = self.phase {
            // Forwarded to the owner: its response headers are due within the bound.
            let wait = w.config.continuation_headers_timeout_ms;
            self.headers_due = Some(now.saturating_add(wait));
        } else if !refused {
            // Not forwarded (a lost or unusable answer, a continue without the replica's id):
            // a branch the store registered for it would never relay.
            Self::push_record(w, host, abandon);
        }
        if action == Action::Continue {
            host.resume_request();
        }
    }

    /// Whether the adapter must read the response headers and pass them to
    /// [`Exchange::on_response_headers`]; otherwise it calls
    /// [`Exchange::on_response_headers_unread`].
    pub fn wants_response_headers(&self) -> bool {
        self.req.mcp && !matches!(self.phase, Phase::Replied)
    }

    /// When the adapter must call [`Exchange::on_deadline`] (host clock, ms): a continuation
    /// is waiting for its owner's response headers or its next owed replayed event; it moves
    /// with each one. `None`: no deadline pending.
    pub fn deadline_ms(&self) -> Option<u64> {
        match self.phase {
            Phase::Continuing { .. } if !self.stalled_by_client() => self.headers_due,
            _ => None,
        }
    }

    /// The mid-replay deadline is suspended: the headers are out and the client is not reading.
    fn stalled_by_client(&self) -> bool {
        self.backpressured && self.stream.is_some() && !self.awaiting_replay
    }

    /// The host reports the client's connection above its write-buffer high watermark (`true`)
    /// or back below the low one. Meanwhile flow control holds the owner back, so the wait for
    /// the next owed event is suspended; when the client reads again it restarts, whole. The
    /// first replayed event's deadline is not (nothing reached the client yet).
    pub fn on_downstream_backpressure<H: Host>(&mut self, w: &Worker, host: &H, above: bool) {
        let was = self.stalled_by_client();
        self.backpressured = above;
        if was && !above && self.headers_due.is_some() {
            let wait = w.config.replay_stall_timeout_ms;
            self.headers_due = Some(host.now_ms().saturating_add(wait));
        }
    }

    /// Whether the owner's response headers are held (the adapter answered them with
    /// [`Action::Pause`]): until the first replayed event, the end of the body, or the deadline.
    pub fn holds_response_headers(&self) -> bool {
        self.holding
    }

    /// The adapter's timer, for an exchange with a [`Exchange::deadline_ms`] (early calls do
    /// nothing). Past the deadline the owner is taken as hung. While its headers were not
    /// sent on (none came, or they are held while a replay is expected and none of it came)
    /// the continuation is answered here (`owner_busy`: a request stream's call settled, a
    /// GET stream's resume rejected) through [`Host::send_local_response`], acting on this
    /// exchange's stream. Once they went out (a host that cannot hold them, or a replay that
    /// stalled after its first event) the stream is reset and recorded lost. `true` when it
    /// acted.
    pub fn on_deadline<H: Host>(&mut self, w: &mut Worker, host: &mut H) -> bool {
        let Some(due) = self.deadline_ms() else {
            return false;
        };
        if host.now_ms() < due {
            return false;
        }
        self.headers_due = None;
        let Phase::Continuing { cursor, owner, .. } = &self.phase else {
            return false;
        };
        let (cursor, owner) = (cursor.clone(), owner.clone());
        let replayed = self.stream.as_ref().map_or(0, StreamState::rewritten);
        let (what, ms) = match (self.stream.is_some(), self.awaiting_replay) {
            (false, _) => (
                "no response headers".to_owned(),
                w.config.continuation_headers_timeout_ms,
            ),
            (true, true) => (
                "its headers but no replayed event".to_owned(),
                w.config.continuation_headers_timeout_ms,
            ),
            (true, false) => (
                format!("{replayed} replayed event(s) but not the next one owed"),
                w.config.replay_stall_timeout_ms,
            ),
        };
        host.log(
            LogLevel::Warn,
            &format!("mcp-resume-guard: owner {owner} sent {what} in {ms} ms"),
        );
        // Whatever the owner sends later is not relayed: the answer ends the stream.
        let sent = self.stream.is_some() && !self.holding;
        self.awaiting_replay = false;
        self.holding = false;
        self.held = Vec::new();
        self.stream = None;
        if sent {
            // The headers went out (a host that cannot hold them, or a replay under way): no
            // local answer is possible any more. The stream is reset and recorded lost, so the
            // client's reconnect with its cursor is refused, and settled, at once.
            host.count(Stat::Refused(Reason::OwnerBusy), 1);
            self.phase = Phase::Replied;
            self.report_branch_end(w, host);
            self.record_stream_lost(w, host, &cursor);
            host.reset_response();
            return true;
        }
        self.owner_busy(w, host, &cursor);
        true
    }

    /// Response headers the exchange does not need to read (not an MCP request, or a local
    /// reply): the owner header is still removed, so no response carries it.
    pub fn on_response_headers_unread<H: Host>(&mut self, w: &mut Worker, host: &mut H) {
        host.remove_response_header(&w.config.owner_header);
    }

    /// The response headers, or `None` when the host could not read them; `end_of_stream`:
    /// the response has no body (headers only).
    pub fn on_response_headers<H: Host, F: HeaderField>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        headers: Option<&[F]>,
        end_of_stream: bool,
    ) -> Action {
        let due = self.headers_due.take();
        if !self.wants_response_headers() {
            self.on_response_headers_unread(w, host);
            return Action::Continue;
        }
        let Some(headers) = headers else {
            // Status, type and session unknown: ids could not be rewritten nor the replay
            // checked. Fail closed; the owner keeps its log, so nothing is recorded lost.
            host.remove_response_header(&w.config.owner_header);
            host.count(Stat::HostErrors, 1);
            host.count(Stat::Refused(Reason::HostError), 1);
            self.reject(w, host, Reason::HostError);
            return Action::Continue;
        };
        // Everything read from the headers (copied where kept), before the first host call.
        let h = ResponseView::read(headers, &w.config.owner_header);
        let status = h.status;
        // Whatever some client reads as SSE is relayed as a stream, its ids rewritten.
        let sse_ok = h.client_reads_sse(self.req.method == "GET");
        // Only a declared event stream counts as a continuation's replay.
        let replay = h.is_sse && (200..300).contains(&status);
        self.req.response_session_id = h.session_id;
        // stateful_session echoes the chosen host to clients; the owner never leaks.
        if h.owner_header {
            host.remove_response_header(&w.config.owner_header);
        }
        if let Phase::Continuing { cursor, owner, .. } = &self.phase {
            // Strict stateful_session answers 503 when the owner is down or gone; a 4xx is the
            // owner's own answer (404: session gone) and passes through.
            let served_by_owner = host.upstream_address().as_deref() == Some(owner.as_str());
            if status >= 500 || !served_by_owner {
                let cursor = cursor.clone();
                self.owner_failed(w, host, &cursor);
                return Action::Continue;
            }
        }
        self.record_session(w, host, status);
        // The body is final now: a POST's id not found yet is not coming.
        self.req.id_scan = None;
        if sse_ok && h.encoded {
            // Its ids cannot be read, rewritten or checked: never relayed.
            let (kind, request_id) = self.stream_identity();
            self.refuse_response(w, host, Reason::EncodedStream, kind, request_id.as_deref());
            return Action::Continue;
        }
        if let Phase::Continuing {
            cursor, expected, ..
        } = &self.phase
        {
            // The owner answered without a replay (no SSE, an error, or no body at all) while
            // events after the cursor are recorded, or while a request stream's call still
            // waits for its response (a restarted owner's own 400): refused by name, never
            // passed through unsignalled. A 2xx without the recorded replay shows the owner no
            // longer holds the log; an error status (another reader holds the stream, the
            // session ended) refuses this resume only.
            let owed = !expected.is_empty() || cursor.kind == StreamKind::Request;
            if owed && (!replay || end_of_stream) {
                let cursor = cursor.clone();
                if (200..300).contains(&status) && !expected.is_empty() {
                    self.record_stream_lost(w, host, &cursor);
                }
                self.refuse_response(
                    w,
                    host,
                    Reason::ReplayMissing,
                    cursor.kind,
                    cursor.request_id.as_deref(),
                );
                return Action::Continue;
            }
        }
        if let Some(refusal) = self.refusal {
            host.set_response_header(MCP_RESUME_HEADER, &refusal.header());
        }
        if sse_ok {
            // Every client then decodes the body as UTF-8, as the guard parses it, whatever the
            // replica's parameters said (a charset form the guard did not recognise included).
            // Removed first: a host's set may replace only the first of repeated instances.
            // Already so (the usual answer): no host calls.
            if !h.plain_sse_type {
                host.remove_response_header("content-type");
                host.set_response_header("content-type", SSE_CONTENT_TYPE);
            }
            self.control_pending = self.refusal.map(|r| r.reason);
            // The rewritten body's length differs; most SSE answers have none to remove.
            if h.content_length {
                host.remove_response_header("content-length");
            }
            self.open_stream(w, host);
            // A request stream's client reconnects after the hint, not its SDK's default delay.
            let request = self.stream.as_ref().map(StreamState::kind) == Some(StreamKind::Request);
            self.retry_pending = w.config.client_retry_ms.filter(|_| request);
            if matches!(&self.phase, Phase::Continuing { expected, .. } if !expected.is_empty()) {
                // Events after the cursor are recorded: the headers wait for the first of
                // them (or the body's end), within the same deadline, so an owner that answers
                // and then stalls is still answered here.
                self.headers_due = due;
                self.awaiting_replay = true;
                self.holding = host.holds_headers_with_body();
                if self.holding {
                    return Action::Pause;
                }
            }
        }
        Action::Continue
    }

    /// One response body chunk (only when [`Exchange::wants_body`]); the rewritten chunk goes
    /// out through [`Host::replace_body_chunk`]. At the end of a continuation's response the
    /// answer may be [`Action::Pause`]: the adapter holds the end until the exchange calls
    /// [`Host::finish_held_response`].
    pub fn on_response_body<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        chunk: Option<&[u8]>,
        eos: bool,
    ) -> Action {
        if !self.wants_body() {
            return Action::Continue;
        }
        if self.cut_sent {
            // The control event went out with the previous chunk; end the stream now, so the
            // client reconnects instead of waiting on a stream that will carry nothing more.
            host.replace_body_chunk(&[]);
            host.reset_response();
            return Action::Continue;
        }
        let replayed = self.stream.as_ref().map_or(0, StreamState::rewritten);
        let mut out = std::mem::take(&mut w.scratch);
        out.clear();
        // Output held with the headers goes first, now or with a later chunk.
        out.append(&mut self.held);
        let mut ask_end = None;
        if let Some(ms) = self.retry_pending.take() {
            // A block that dispatches nothing. The rewriter consumes a leading BOM, which would
            // otherwise follow the hint into a field name.
            let _ = write!(out, "retry: {ms}\n\n");
        }
        if let Some(reason) = self.control_pending.take() {
            out.extend_from_slice(control_event(reason).as_bytes());
        }
        match chunk {
            None => {
                // The chunk is lost: what follows would not be contiguous. Cut, say so.
                host.count(Stat::HostErrors, 1);
                self.cut(w, &mut out, Reason::HostError);
            }
            Some(chunk) => match self.overtaken(w) {
                Some(reason) => self.end_overtaken(w, host, &mut out, reason),
                None => {
                    // A registered branch's end waits for the store's word before the stream is
                    // finished: an empty replay ended for a newer reader is `forked`, not a
                    // mismatch. Not once its call was answered on it: no word can change what
                    // its client sees (docs/how-it-works.md); `on_stream_end` records the end.
                    let hold_end = eos && self.branch_open && self.stream.is_some();
                    self.relay(w, host, chunk, eos && !hold_end, &mut out);
                    if hold_end && !self.cut_sent {
                        if self.call.as_ref().is_some_and(|c| c.answered()) {
                            self.finish_stream(w, host, &mut out);
                        } else {
                            ask_end = self.ask_branch_end(w, host);
                            if ask_end.is_none() {
                                self.end_unarbitrated(host, CalloutFailure::Dispatch, &mut out);
                            }
                        }
                    }
                }
            },
        }
        if self.awaiting_replay && !self.release_headers(w, eos || ask_end.is_some(), &mut out) {
            // Envoy gets nothing of this chunk; the exchange keeps its output.
            host.replace_body_chunk(&[]);
            w.scratch = out;
            return Action::Pause;
        }
        self.pace_replay(w, host, replayed, eos);
        host.replace_body_chunk(&out);
        // Keep the worker's buffer, unless one huge chunk made it large.
        if out.capacity() > SCRATCH_KEEP_BYTES {
            out = Vec::new();
        }
        w.scratch = out;
        self.flush_relayed(w, host);
        match ask_end {
            Some(token) => {
                self.ending = Some(token);
                Action::Pause
            }
            None => Action::Continue,
        }
    }

    /// While the first replayed event is awaited: did it come with this chunk (checked and
    /// relayed, or the stream was cut or refused, or the body ended)? Then the deadline ends and
    /// held headers are released with the output. If not, and the headers are held, `out`
    /// (blocks that dispatch nothing) is kept, up to `max_event_hold_bytes`; beyond, it is
    /// dropped: no client dispatches any of it.
    fn release_headers(&mut self, w: &Worker, end: bool, out: &mut Vec<u8>) -> bool {
        let replayed = self.stream.as_ref().is_none_or(|s| s.rewritten() > 0);
        let continuing = matches!(self.phase, Phase::Continuing { .. });
        if end || replayed || !continuing || self.cut_sent {
            self.awaiting_replay = false;
            self.holding = false;
            self.headers_due = None;
            return true;
        }
        if !self.holding {
            // The headers went out: the output flows; only the deadline still waits.
            return true;
        }
        let whole = !self
            .stream
            .as_ref()
            .is_some_and(StreamState::output_mid_block);
        if out.len() > w.config.max_event_hold_bytes && whole {
            out.clear();
        }
        self.held.append(out);
        false
    }

    /// After the first replayed event, while the records say the owner still owes events, each
    /// wait for the next one is bounded by `replay_stall_timeout_ms`, counted from the last one
    /// checked and released (`replayed`: the count before this chunk). It is longer than the
    /// first event's bound: a client that stops reading holds the owner back too. Comments, repeats and
    /// the cursor's echo are no progress. None once the owed replay is complete (a tool may
    /// then be silent for minutes), or the body ended.
    fn pace_replay<H: Host>(&mut self, w: &Worker, host: &H, replayed: u64, eos: bool) {
        if self.awaiting_replay {
            // The first replayed event's deadline runs.
            return;
        }
        let owed = match (&self.phase, self.stream.as_ref()) {
            (Phase::Continuing { .. }, Some(s)) if !eos && !self.cut_sent => {
                s.owes_replay().then(|| s.rewritten())
            }
            _ => None,
        };
        match owed {
            None => self.headers_due = None,
            Some(now_replayed) if now_replayed > replayed => {
                let wait = w.config.replay_stall_timeout_ms;
                self.headers_due = Some(host.now_ms().saturating_add(wait));
            }
            Some(_) => {}
        }
    }

    /// The request's stream is over (complete, reset or abandoned): its branch no longer holds
    /// the stream. Adapters call this once, when the proxy is done with the request.
    pub fn on_stream_end<H: Host>(&mut self, w: &mut Worker, host: &mut H) {
        self.headers_due = None;
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            // Dropped while its verdict was pending: whatever the store registers for it never
            // relays. The next tick sends the record (a callout from an ending stream could
            // be answered to nobody, and the record queue waits for its answer).
            Phase::Asking { abandon, .. } => Self::push_record(w, host, abandon),
            other => self.phase = other,
        }
        if let Some((_, inc)) = &self.record_keys {
            // A word the stream can no longer use must not linger.
            if !w.overtaken.is_empty() {
                let _ = w.take_overtaken(inc, self.branch);
            }
        }
        self.report_branch_end(w, host);
    }

    /// The store's word, if any, that this branch was overtaken (looked up, not taken).
    fn overtaken(&self, w: &Worker) -> Option<Reason> {
        if w.overtaken.is_empty() {
            return None;
        }
        let (_, inc) = self.record_keys.as_ref()?;
        w.overtaken
            .iter()
            .find(|o| o.branch == self.branch && o.incarnation == *inc)
            .map(|o| o.reason)
    }

    /// The store refused this branch's events: a newer branch relays the stream (`forked`), or
    /// its replica diverged from the recorded log (`replay_mismatch`, the store marked the
    /// stream lost). Ends it explicitly, recording nothing more.
    fn end_overtaken<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        out: &mut Vec<u8>,
        reason: Reason,
    ) {
        if let Some((_, inc)) = &self.record_keys {
            let _ = w.take_overtaken(inc, self.branch);
        }
        match reason {
            Reason::Forked => host.count(Stat::Forked, 1),
            _ => host.count(Stat::ReplayMismatch, 1),
        }
        self.cut(w, out, reason);
    }

    /// Reads what goes out to a request stream's client, until its calls are answered; a block
    /// larger than the hold bound ends the watch (the end then falls back: see
    /// `settle_unanswered_end`, and a registered branch's end asks).
    fn watch_call(&mut self, w: &Worker, out: &[u8]) {
        if let Some(call) = self.call.as_mut() {
            if !call.read(out, w.config.max_event_hold_bytes) {
                self.call = None;
            }
        }
    }

    /// A registered branch whose replica ended it asks the store, once, whether another branch
    /// of the incarnation is open (a replica that hands the stream to a newer reader ends the
    /// older one cleanly: without this its client would see a silent end).
    fn ask_branch_end<H: Host>(&mut self, w: &mut Worker, host: &mut H) -> Option<u32> {
        let query = self.branch_query()?;
        let body = serde_json::to_vec(&query).ok()?;
        let o = &w.config.ownership;
        let headers = post_headers(BRANCH_PATH, &o.authority, w.auth.as_deref());
        // `None`: the end goes on; `on_stream_end` still reports it as a record.
        host.dispatch(&o.cluster, &headers, &body, o.timeout_ms)
    }

    /// The store's answer about an ended branch (`status` `None`: no answer). Without a usable
    /// answer the end is signalled, and reported as a record.
    fn on_branch_answer<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        status: Option<u32>,
        body: Option<&[u8]>,
    ) {
        let answer: Result<BranchAnswer, CalloutFailure> = match status {
            Some(200) => body
                .and_then(|b| serde_json::from_slice(b).ok())
                .ok_or(CalloutFailure::Body),
            Some(_) => Err(CalloutFailure::Status),
            None => Err(CalloutFailure::NoResponse),
        };
        if answer.is_ok() {
            // The store marked the branch ended. The end goes as a record too, behind the
            // branch's own records in the queue: one of them landing after the answer would
            // bring the branch back, open, into a table that let it go (docs/forks.md).
            self.report_branch_end(w, host);
        }
        let mut out = std::mem::take(&mut w.scratch);
        out.clear();
        match answer {
            // The replica's own end: the stream is finished as it would have been at once.
            Ok(BranchAnswer { forked: false }) => self.finish_stream(w, host, &mut out),
            Ok(BranchAnswer { forked: true }) => {
                host.count(Stat::Forked, 1);
                // Not settled: the newer branch carries the call on.
                self.end_signalled(Reason::Forked, &mut out);
            }
            Err(how) => self.end_unarbitrated(host, how, &mut out),
        }
        host.finish_held_response(&out);
        w.scratch = out;
        self.flush_relayed(w, host);
    }

    /// A clean end the store could not arbitrate (no usable answer, or no way to ask): it may
    /// be a fork loser's, so it is signalled (`ownership_unavailable`), never passed as the
    /// replica's own; the client's next resume asks again.
    fn end_unarbitrated<H: Host>(&mut self, host: &mut H, how: CalloutFailure, out: &mut Vec<u8>) {
        host.count(Stat::CalloutFailures(how), 1);
        self.end_signalled(Reason::OwnershipUnavailable, out);
    }

    /// End a held branch with the control event for `reason`; an event partly out (longer than
    /// the hold bound) is closed first, so no client dispatches it as a message.
    fn end_signalled(&mut self, reason: Reason, out: &mut Vec<u8>) {
        self.phase = Phase::Replied;
        signal(self.stream.as_mut(), reason, out);
    }

    fn branch_query(&self) -> Option<BranchQuery> {
        let (session, incarnation) = self.record_keys.clone()?;
        Some(BranchQuery {
            session,
            incarnation,
            branch: self.branch,
        })
    }

    /// A registered branch that ended without asking is reported as a record.
    fn report_branch_end<H: Host>(&mut self, w: &mut Worker, host: &mut H) {
        if !std::mem::take(&mut self.branch_open) {
            return;
        }
        if let Some(q) = self.branch_query() {
            let r = Record::BranchEnd {
                session: q.session,
                incarnation: q.incarnation,
                branch: q.branch,
            };
            Self::push_record(w, host, r);
        }
    }

    fn relay<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        chunk: &[u8],
        eos: bool,
        out: &mut Vec<u8>,
    ) {
        let flow = match self.stream.as_mut() {
            Some(stream) => {
                let flow = stream.push(&w.config.keyring, chunk, out);
                match eos {
                    true => stream.finish(out),
                    false => flow,
                }
            }
            None => {
                out.extend_from_slice(chunk);
                Flow::Open
            }
        };
        self.after_relay(w, host, flow, out);
        // `out` holds all this chunk sends (with what went before the relayed bytes).
        self.watch_call(w, out);
        if eos {
            self.settle_unanswered_end(w, host, out);
        }
    }

    /// The response ended: the stream's held bytes and its end checks go out.
    fn finish_stream<H: Host>(&mut self, w: &mut Worker, host: &mut H, out: &mut Vec<u8>) {
        if let Some(stream) = self.stream.as_mut() {
            let start = out.len();
            let flow = stream.finish(out);
            self.after_relay(w, host, flow, out);
            self.watch_call(w, out.get(start..).unwrap_or_default());
            self.settle_unanswered_end(w, host, out);
        }
    }

    /// A request stream ended without its call's response and without a cursor to resume
    /// from: a continuation that relayed no event (the client would resume into the same empty
    /// answer, `replay_missing`), or a fresh stream that relayed no id (the replica ended it
    /// before answering, maybe after id-less notifications, or its last id was a reset; the
    /// client has no cursor it can resume from, `response_missing`). Its end says so and settles the calls still unanswered: those the
    /// watch saw no response to, or, when it gave up (ids unknown, a block over the hold
    /// bound), all of them if nothing at all was relayed. A fresh stream that relayed an id
    /// (a priming event) is left alone while every client resumes from it: not after a result
    /// response to any id (the TypeScript SDK then does not resume, docs/clients.md).
    fn settle_unanswered_end<H: Host>(&mut self, w: &Worker, host: &mut H, out: &mut Vec<u8>) {
        let Some(stream) = self.stream.as_ref() else {
            return;
        };
        let watch = self.call.as_deref();
        let reason = match &self.phase {
            Phase::Continuing { cursor, .. }
                if cursor.kind == StreamKind::Request && stream.rewritten() == 0 =>
            {
                Reason::ReplayMissing
            }
            Phase::Idle
                if stream.kind() == StreamKind::Request && {
                    // A reset cursor is none to resume from.
                    let no_cursor = stream.cursors_kept() == 0 || stream.ends_on_reset();
                    match watch {
                        Some(c) => !c.answered() && (no_cursor || !c.clients_resume()),
                        None => no_cursor && stream.relayed_events() == 0,
                    }
                } =>
            {
                Reason::ResponseMissing
            }
            _ => return,
        };
        if stream.cut_reason().is_some() {
            return;
        }
        host.count(Stat::Refused(reason), 1);
        signal(self.stream.as_mut(), reason, out);
        // Only the calls the client has no response to: a batch's answered ones are done.
        let unanswered = watch.filter(|_| reason == Reason::ResponseMissing);
        self.settle_tail_of(w, out, reason, unanswered);
        self.phase = Phase::Replied;
    }

    fn after_relay<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        flow: Flow,
        out: &mut Vec<u8>,
    ) {
        let cut_reason = self.stream.as_ref().and_then(StreamState::cut_reason);
        if flow == Flow::CutReplayMismatch {
            self.cut_sent = true;
            self.settle_tail(w, out, cut_reason.unwrap_or(Reason::ReplayMismatch));
            // Tell the cluster once; the control event is already in `out`.
            if let Phase::Continuing { cursor, .. } =
                std::mem::replace(&mut self.phase, Phase::Replied)
            {
                // `gap` / `unasserted`: the replica's own word, or its silence in asserted mode.
                match cut_reason {
                    Some(r) if r != Reason::ReplayMismatch => host.count(Stat::Refused(r), 1),
                    _ => host.count(Stat::ReplayMismatch, 1),
                }
                self.record_stream_lost(w, host, &cursor);
            }
        }
    }

    /// Ends the stream after the control event for `reason` (an event partly out is closed
    /// first: no client dispatches it as a message).
    fn cut(&mut self, w: &Worker, out: &mut Vec<u8>, reason: Reason) {
        signal(self.stream.as_mut(), reason, out);
        self.settle_tail(w, out, reason);
        self.cut_sent = true;
        self.phase = Phase::Replied;
        if let Some(s) = self.stream.as_mut() {
            // Nothing of this chunk was relayed: nothing more to record.
            s.clear_relayed();
        }
        self.stream = None;
        self.control_pending = None;
    }

    /// Refuse a cursor: strip it and forward (restart), or answer locally (settle a request
    /// stream's pending call, or reject).
    fn refuse<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        reason: Reason,
        kind: Option<StreamKind>,
        request_id: Option<&str>,
    ) -> Action {
        host.count(Stat::Refused(reason), 1);
        let is_get = self.req.method == "GET";
        match w.config.policy_for(kind, reason) {
            Policy::Reject if is_get => {
                self.reject(w, host, reason);
                Action::Pause
            }
            Policy::Settle if is_get && kind == Some(StreamKind::Request) => {
                self.settle(host, reason, request_id);
                Action::Pause
            }
            _ => {
                host.remove_request_header("last-event-id");
                self.refusal = Some(Refusal {
                    reason,
                    get: is_get,
                });
                host.count(
                    if is_get {
                        Stat::Restarted
                    } else {
                        Stat::Stripped
                    },
                    1,
                );
                Action::Continue
            }
        }
    }

    /// A refusal once the request went to the owner (no restart is possible any more): a
    /// request stream's pending call is settled, anything else is rejected.
    fn refuse_response<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        reason: Reason,
        kind: StreamKind,
        request_id: Option<&str>,
    ) {
        host.count(Stat::Refused(reason), 1);
        // Refused before it relayed anything: its branch ends now, so the branch it would have
        // overtaken goes on (a stray resume must not end a healthy stream).
        self.report_branch_end(w, host);
        if kind == StreamKind::Request && w.config.policy.request_stream == Policy::Settle {
            self.settle(host, reason, request_id);
        } else {
            self.reject(w, host, reason);
        }
    }

    /// Answers a request stream's cursor with its end: the control event, then a JSON-RPC
    /// error for the opening request, which settles the client's pending call at once.
    fn settle<H: Host>(&mut self, host: &mut H, reason: Reason, request_id: Option<&str>) {
        host.count(Stat::Rejected, 1);
        self.phase = Phase::Replied;
        let mut body = control_event(reason);
        body.push_str(&settle_event(reason, request_id));
        let header = format!("rejected; reason={reason}");
        host.send_local_response(
            200,
            &[
                ("content-type", "text/event-stream"),
                ("cache-control", "no-cache"),
                (MCP_RESUME_HEADER, &header),
            ],
            body.as_bytes(),
        );
    }

    /// After a cut's control event in `out`: a request stream the client relies on also gets
    /// the error that settles its pending call. Not after `forked`: the newer branch goes on.
    fn settle_tail(&self, w: &Worker, out: &mut Vec<u8>, reason: Reason) {
        self.settle_tail_of(w, out, reason, None);
    }

    /// [`Self::settle_tail`] for the calls `watch` saw no response to (`None`: every call of
    /// the stream).
    fn settle_tail_of(
        &self,
        w: &Worker,
        out: &mut Vec<u8>,
        reason: Reason,
        watch: Option<&CallWatch>,
    ) {
        let Some(stream) = self.stream.as_ref() else {
            return;
        };
        let settles = stream.kind() == StreamKind::Request
            && w.config.policy.request_stream == Policy::Settle
            && reason != Reason::Forked;
        if settles && out.ends_with(control_event(reason).as_bytes()) {
            let events = match watch {
                Some(c) => settle_events(reason, c.unanswered()),
                None => settle_event(reason, stream.request_id()),
            };
            out.extend_from_slice(events.as_bytes());
        }
    }

    /// The kind and request id of this response's stream (continued or about to open).
    fn stream_identity(&self) -> (StreamKind, Option<String>) {
        match &self.phase {
            Phase::Continuing { cursor, .. } => (cursor.kind, cursor.request_id.clone()),
            _ if self.req.method == "GET" => (StreamKind::Get, None),
            _ => (StreamKind::Request, self.req.request_id.clone()),
        }
    }

    fn reject<H: Host>(&mut self, w: &Worker, host: &mut H, reason: Reason) {
        self.reply_refusal(host, w.config.reject_status, &reject_body(reason), reason);
    }

    /// Answers locally with a JSON refusal `body` that names `reason`.
    fn reply_refusal<H: Host>(&mut self, host: &mut H, status: u16, body: &str, reason: Reason) {
        host.count(Stat::Rejected, 1);
        self.phase = Phase::Replied;
        let header = format!("rejected; reason={reason}");
        host.send_local_response(
            status,
            &[
                ("content-type", "application/json"),
                (MCP_RESUME_HEADER, &header),
            ],
            body.as_bytes(),
        );
    }

    fn ask<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        cursor: DecodedCursor,
        session_id: &[u8],
    ) -> Action {
        let registration = format!("{:016x}", host.random_u64());
        let query = ResumeQuery {
            session: session_key(session_id),
            incarnation: incarnation_hex(cursor.incarnation),
            kind: cursor.kind,
            seq: cursor.seq,
            registration: Some(registration),
        };
        let body = match serde_json::to_vec(&query) {
            Ok(b) => b,
            Err(_) => return self.callout_failed(w, host, &cursor, CalloutFailure::Encode),
        };
        let o = &w.config.ownership;
        let headers = post_headers(RESUME_PATH, &o.authority, w.auth.as_deref());
        match host.dispatch(&o.cluster, &headers, &body, o.timeout_ms) {
            Some(token) => {
                host.count(Stat::Callouts, 1);
                let abandon = Record::Abandoned {
                    session: query.session,
                    incarnation: query.incarnation,
                    registration: query.registration.unwrap_or_default(),
                };
                self.phase = Phase::Asking {
                    token,
                    cursor,
                    started_ms: host.now_ms(),
                    abandon,
                };
                Action::Pause
            }
            None => self.callout_failed(w, host, &cursor, CalloutFailure::Dispatch),
        }
    }

    /// Fail closed: the cluster could not vouch for the cursor.
    fn callout_failed<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        cursor: &DecodedCursor,
        how: CalloutFailure,
    ) -> Action {
        host.count(Stat::CalloutFailures(how), 1);
        self.phase = Phase::Idle;
        let id = cursor.request_id.as_deref();
        self.refuse(w, host, Reason::OwnershipUnavailable, Some(cursor.kind), id)
    }

    fn on_verdict<H: Host>(
        &mut self,
        w: &mut Worker,
        host: &mut H,
        cursor: DecodedCursor,
        verdict: Option<ResumeVerdict>,
    ) -> Action {
        match verdict {
            None => self.callout_failed(w, host, &cursor, CalloutFailure::Body),
            Some(ResumeVerdict::NewStream { reason, request_id }) => {
                // The cursor carries every id; a store record of an older guard may name one
                // its cursor could not.
                let id = cursor.request_id.as_deref().or(request_id.as_deref());
                self.refuse(w, host, reason, Some(cursor.kind), id)
            }
            Some(ResumeVerdict::Continue {
                owner,
                expected,
                head,
                resume_id,
                branch,
            }) => {
                // `expected` lists seq+1 ..= head, cut short at the service's --max-expected: a
                // replay past the list could not be checked, so it is never relayed.
                let owed = head.saturating_sub(cursor.seq);
                if owed > expected.len() as u64 {
                    host.log(
                        LogLevel::Warn,
                        &format!(
                            "mcp-resume-guard: the ownership service listed {} of the {owed} \
                             recorded events owed (truncated by its --max-expected): resume refused",
                            expected.len()
                        ),
                    );
                    return self.callout_failed(w, host, &cursor, CalloutFailure::Body);
                }
                // A long replica id is not in the cursor; the store keeps the newest ones.
                let Some(replica_id) = cursor.replica_event_id.clone().or(resume_id) else {
                    let id = cursor.request_id.as_deref();
                    return self.refuse(w, host, Reason::UnknownStream, Some(cursor.kind), id);
                };
                let mut cursor = cursor;
                cursor.replica_event_id = Some(replica_id.clone());
                let pin = base64::engine::general_purpose::STANDARD.encode(owner.as_bytes());
                host.set_request_header("last-event-id", &replica_id);
                host.set_request_header(&w.config.owner_header, &pin);
                host.count(Stat::Continued, 1);
                // The store registered this branch: it arbitrates it against the others of
                // the incarnation, whatever gateway they cross (see `Events.branch`).
                if let (Some(b), Some(sid)) = (branch, self.req.session_id.as_deref()) {
                    self.branch = b;
                    self.branch_open = true;
                    if cursor.kind == StreamKind::Request {
                        self.call = CallWatch::new(cursor.request_id.as_deref());
                    }
                    self.record_keys =
                        Some((session_key(sid), incarnation_hex(cursor.incarnation)));
                }
                self.phase = Phase::Continuing {
                    cursor,
                    owner,
                    expected,
                };
                Action::Continue
            }
        }
    }

    fn push_record<H: Host>(w: &mut Worker, host: &mut H, r: Record) {
        w.records.push(host, r);
    }

    /// Session lifecycle facts visible in response headers.
    fn record_session<H: Host>(&self, w: &mut Worker, host: &mut H, status: u32) {
        let req_sid = self.req.session_id.as_deref();
        match (req_sid, self.req.response_session_id.as_deref()) {
            (None, Some(new_sid)) if (200..300).contains(&status) => {
                // A client's header must never make the record invalid: a value the record
                // cannot carry is recorded as "invalid" (the session still opens).
                let version = match self.req.protocol_version.as_deref() {
                    None => DEFAULT_VERSION.to_string(),
                    Some(v) if check_version("version", v).is_ok() => v.to_string(),
                    Some(_) => INVALID_VERSION.to_string(),
                };
                let r = Record::SessionOpen {
                    session: session_key(new_sid),
                    version,
                };
                Self::push_record(w, host, r);
            }
            (Some(sid), _) if status == 404 => {
                let r = Record::SessionEnd {
                    session: session_key(sid),
                    why: SessionEnd::Expired,
                };
                Self::push_record(w, host, r);
            }
            (Some(sid), _) if self.req.method == "DELETE" && (200..300).contains(&status) => {
                let r = Record::SessionEnd {
                    session: session_key(sid),
                    why: SessionEnd::Terminated,
                };
                Self::push_record(w, host, r);
            }
            _ => {}
        }
    }

    /// The session this response belongs to: the request's, or the one an `initialize`
    /// response just created.
    fn session_id(&self) -> Option<&[u8]> {
        self.req
            .session_id
            .as_deref()
            .or(self.req.response_session_id.as_deref())
    }

    /// A 2xx SSE response: open (or continue) an incarnation and start rewriting. A new
    /// incarnation costs one host call (the owner's address): its id comes from the worker's
    /// generator, its time from the worker's clock, its stat from the worker's tally.
    fn open_stream<H: Host>(&mut self, w: &mut Worker, host: &mut H) {
        // One SHA-256 of the session id gives both the cursor binding and the store key.
        let has_sid = self.session_id().is_some();
        let (binding, skey) = session_binding_and_key(self.session_id().unwrap_or_default());
        let max_hold = w.config.max_event_hold_bytes;
        let (stream, inc_hex) = match &self.phase {
            Phase::Continuing {
                cursor, expected, ..
            } => {
                let cfg = &w.config;
                let s = StreamState::continuation(
                    cursor,
                    expected.clone(),
                    cfg.suppress_cursor_echo,
                    max_hold,
                )
                .with_contiguity(cfg.contiguity);
                let inc_hex = has_sid.then(|| incarnation_hex(cursor.incarnation));
                if let (true, Some(hex)) = (self.branch_open, &inc_hex) {
                    // Its owner answered: the branch relays from now (a quiet one too), and a
                    // failure the store holds for the stream passed (docs/forks.md).
                    let r = Record::Events {
                        session: skey.clone(),
                        incarnation: hex.clone(),
                        first_seq: cursor.seq.saturating_add(1),
                        ids: Vec::new(),
                        long: Vec::new(),
                        branch: self.branch,
                        trimmed: 0,
                    };
                    Self::push_record(w, host, r);
                }
                (s, inc_hex)
            }
            _ => {
                let kind = if self.req.method == "GET" {
                    StreamKind::Get
                } else {
                    StreamKind::Request
                };
                let inc = w.next_incarnation(host);
                let inc_hex = has_sid.then(|| incarnation_hex(inc));
                if let (Some(hex), Some(owner)) = (&inc_hex, host.upstream_address()) {
                    let r = Record::StreamOpen {
                        session: skey.clone(),
                        incarnation: hex.clone(),
                        kind,
                        owner,
                        retention: w.config.retention,
                        supersedes: kind == StreamKind::Get,
                        opened_ms: w.clock_ms(host),
                        // Every carried id rides in the cursor; the field serves older guards.
                        request_id: None,
                    };
                    Self::push_record(w, host, r);
                }
                w.opened += 1;
                let request_id = match kind {
                    StreamKind::Request => self.req.request_id.clone(),
                    StreamKind::Get => None,
                };
                // Its end settles the calls left without a response (`settle_unanswered_end`).
                if kind == StreamKind::Request {
                    self.call = CallWatch::new(request_id.as_deref());
                }
                let s =
                    StreamState::fresh(binding, inc, kind, max_hold).with_request_id(request_id);
                (s, inc_hex)
            }
        };
        // A client waits at most this to resume. GET streams too: TypeScript keeps the last
        // `retry:` of any stream for all of its transport's reconnects.
        let mut stream = stream;
        stream.bound_retry(w.config.max_retry_ms);
        // Without a session nothing is recorded: such a stream cannot be resumed anyway.
        if let Some(hex) = inc_hex {
            self.record_keys = Some((skey, hex));
        }
        self.stream = Some(stream);
    }

    fn flush_relayed<H: Host>(&mut self, w: &mut Worker, host: &mut H) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        if let Some((first_seq, ids)) = stream.relayed() {
            w.rewritten += ids.len() as u64;
            if let Some((session, incarnation)) = &self.record_keys {
                let key = StreamKey {
                    session,
                    incarnation,
                    branch: self.branch,
                };
                w.records.push_events(host, &key, first_seq, ids.iter());
            }
        }
        stream.clear_relayed();
    }

    /// The continued incarnation's log is lost: later cursors for it restart at once.
    fn record_stream_lost<H: Host>(&self, w: &mut Worker, host: &mut H, cursor: &DecodedCursor) {
        if let Some(sid) = self.req.session_id.as_deref() {
            let r = Record::StreamLost {
                session: session_key(sid),
                incarnation: incarnation_hex(cursor.incarnation),
            };
            Self::push_record(w, host, r);
        }
    }

    /// The owner failed a continuation in a way that may pass: the store declares the stream
    /// lost only if such failures outlive its window.
    fn record_owner_failed<H: Host>(&self, w: &mut Worker, host: &mut H, cursor: &DecodedCursor) {
        if let Some(sid) = self.req.session_id.as_deref() {
            let r = Record::OwnerFailed {
                session: session_key(sid),
                incarnation: incarnation_hex(cursor.incarnation),
            };
            Self::push_record(w, host, r);
        }
    }

    /// The owner failed the continuation. Only an owner no longer in the cluster is evidence
    /// that its log is gone (`owner_unavailable`, recorded lost); anything else (a refused or
    /// reset connection, its own 5xx, a full circuit breaker) may pass, so only this resume is
    /// refused (`owner_busy`) and a later one may continue. Either way the client hears it.
    fn owner_failed<H: Host>(&mut self, w: &mut Worker, host: &mut H, cursor: &DecodedCursor) {
        if host.response_code_details().as_deref() != Some(OWNER_NOT_IN_CLUSTER) {
            return self.owner_busy(w, host, cursor);
        }
        self.record_stream_lost(w, host, cursor);
        let id = cursor.request_id.as_deref();
        self.refuse_response(w, host, Reason::OwnerUnavailable, cursor.kind, id);
    }

    /// The owner failed (or did not answer) the continuation in a way that may pass: only
    /// this resume is refused; the store declares the stream lost if such failures persist.
    fn owner_busy<H: Host>(&mut self, w: &mut Worker, host: &mut H, cursor: &DecodedCursor) {
        self.record_owner_failed(w, host, cursor);
        let id = cursor.request_id.as_deref();
        self.refuse_response(w, host, Reason::OwnerBusy, cursor.kind, id);
    }
}

/// Does a `Content-Type` value (joined instances too) declare a charset other than UTF-8 in a
/// form some client might read? Python's client takes it through `email.message`, which reads
/// RFC 2231 names (`charset*`, `charset*0`), strips Unicode whitespace and decodes
/// `charset'lang'value` with percent-escapes; the guard does not model that: any parameter whose
/// name, without its non-token bytes, contains `charset` must name UTF-8 plainly.
fn foreign_charset(ct: &[u8]) -> bool {
    ct.split(|b| *b == b',' || *b == b';').any(|param| {
        let (name, value) = match param.iter().position(|b| *b == b'=') {
            Some(i) => (&param[..i], &param[i + 1..]),
            None => (param, &[][..]),
        };
        names_charset(name) && !plain_utf8(value)
    })
}

/// Does a parameter name, its non-token bytes dropped, contain `charset` (ASCII case aside)?
fn names_charset(name: &[u8]) -> bool {
    const CHARSET: &[u8; 7] = b"charset";
    // The last seven token bytes, oldest first (zeros until filled, never `charset`): no
    // allocation per header.
    let mut window = [0u8; 7];
    name.iter().copied().filter(|b| is_tchar(*b)).any(|b| {
        window.rotate_left(1);
        window[6] = b.to_ascii_lowercase();
        &window == CHARSET
    })
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Is a parameter value `utf-8` or `utf8`, ASCII case aside, optionally quoted?
fn plain_utf8(value: &[u8]) -> bool {
    let value = value.trim_ascii();
    let value = value
        .strip_prefix(b"\"")
        .and_then(|v| v.strip_suffix(b"\""))
        .unwrap_or(value);
    value.eq_ignore_ascii_case(b"utf-8") || value.eq_ignore_ascii_case(b"utf8")
}

/// Does a `Content-Encoding` value name anything but identity?
fn encoded(value: Option<&[u8]>) -> bool {
    value.is_some_and(|v| {
        !v.split(|b| *b == b',')
            .map(<[u8]>::trim_ascii)
            .all(|c| c.is_empty() || c.eq_ignore_ascii_case(b"identity"))
    })
}

/// The SSE `message` events that settle a refused request stream's pending calls: one JSON-RPC
/// error per request id the stream carries (one for a single request, one per request of a
/// batch; each its own event, as the SDK clients parse one message per event), the id written
/// back as the raw JSON text the client sent, never re-parsed (`null` when the guard does not
/// know it).
pub fn settle_event(reason: Reason, request_ids: Option<&str>) -> String {
    let ids = request_ids
        .and_then(split_ids)
        .unwrap_or_else(|| vec!["null"]);
    settle_events(reason, ids.into_iter())
}

/// The JSON-RPC error that settles a refused request stream's call.
fn settle_error(reason: Reason) -> serde_json::Value {
    serde_json::json!({
        "code": REFUSED_CODE,
        "message": format!(
            "Last-Event-ID not honoured ({reason}): this request's stream cannot be resumed. \
             The call's outcome is unknown: it may or may not have run; do not assume either"
        ),
        "data": { "resumed": false, "reason": reason.as_str() }
    })
}

/// [`settle_event`] for the raw request ids `ids`.
fn settle_events<'a>(reason: Reason, ids: impl Iterator<Item = &'a str>) -> String {
    let error = settle_error(reason);
    ids.map(|id| {
        format!("event: message\ndata: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}\n\n")
    })
    .collect()
}

/// The 409 body of a rejection (JSON-RPC error shape, `id: null`).
pub fn reject_body(reason: Reason) -> String {
    refusal_body(
        reason,
        &format!(
            "Last-Event-ID not honoured ({reason}): reconnect without Last-Event-ID to open a new stream"
        ),
    )
}

/// The 400 body of a request refused for its `Mcp-Session-Id`. Both SDK clients settle the
/// POST's pending call with this error (`id: null` is read as the call's own).
pub fn session_refusal_body(reason: Reason) -> String {
    refusal_body(
        reason,
        &format!(
            "Mcp-Session-Id refused ({reason}): a session id is one value of visible ASCII \
             (0x21-0x7E); send the one the server issued, or none to open a session"
        ),
    )
}

/// A refusal in JSON-RPC error shape, `id: null`, naming `reason` in `data`.
fn refusal_body(reason: Reason, message: &str) -> String {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": REFUSED_CODE,
            "message": message,
            "data": { "resumed": false, "reason": reason.as_str() }
        }
    })
    .to_string()
}

/// The control event for `reason`, after closing an event of `stream` partly out (longer than
/// the hold bound) so that no client dispatches it as a message: the signal starts a block of
/// its own.
fn signal(stream: Option<&mut StreamState>, reason: Reason, out: &mut Vec<u8>) {
    if let Some(stream) = stream {
        stream.close_block(out);
    }
    out.extend_from_slice(control_event(reason).as_bytes());
}

#[cfg(test)]
#[path = "exchange_tests.rs"]
mod tests;
