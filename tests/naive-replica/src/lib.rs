//! A deliberately **naive** MCP Streamable-HTTP replica.
//!
//! It reproduces, on purpose, the failures described in docs/problem.md, so
//! that the guard in front of it has something real to guard:
//!
//! * sessions live in a shared directory ("sessions were stored in Redis"),
//!   so every replica accepts every session;
//! * event ids come from one **per-process** counter (`e1`, `e2`, …) shared by all the
//!   streams of the process;
//! * the event log is a **process-local** ring buffer of the last `--ring` events of all
//!   streams;
//! * resumption is "session exists ⇒ resume": any `Last-Event-ID` on a known session is
//!   honoured, whatever the request was (a POST's body is silently dropped), an unknown
//!   id bumps the local counter so new events continue "after" it, and a trimmed ring
//!   replays only its surviving tail (the silent gap).
//!
//! See README.md beside this crate for the CLI and the endpoints.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::{Future, IntoFuture};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// Protocol revisions this replica accepts in `initialize` and in `MCP-Protocol-Version`.
pub const SUPPORTED_VERSIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];
/// Revision answered when the client asks for one we do not know.
pub const DEFAULT_VERSION: &str = "2025-03-26";
/// Crate version, reported in `serverInfo.version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Usage text printed by `--help` and on argument errors.
pub const USAGE: &str = "\
naive-replica: a deliberately naive MCP Streamable-HTTP replica (test fixture)

USAGE:
    naive-replica --listen ADDR --name NAME --state-dir DIR [OPTIONS]

REQUIRED:
    --listen ADDR          socket address to listen on, e.g. 127.0.0.1:9101 (port 0 = any)
    --name NAME            replica name, sent in every response as `x-replica: NAME`
    --state-dir DIR        shared state: DIR/sessions/<id> and DIR/ledger.jsonl

OPTIONS:
    --ring N               process-local ring buffer size, in events [default: 64]
    --tick-ms MS           interval of the standalone GET stream's notifications [default: 50]
    --path PATH            the MCP endpoint [default: /mcp]
    --owner-header NAME    header recorded as `has_owner_header` in /_naive/seen;
                           repeatable or comma-separated [default: x-mcp-owner]
    --id-pad BYTES         pad every SSE event id to at least BYTES bytes
                           (`e<num>.xxx…`, for long-id tests) [default: 0]
    --produce-while-away N a standalone stream whose client went away keeps producing
                           N more events into the ring [default: 0]
    --hand-over            one standalone stream per session, fed to its newest reader:
                           every GET and every resume takes it over, and the previous
                           reader's response ends cleanly
    --contiguity           a resume's answer starts with the contiguity assertion
                           (docs/contiguity-extension.md, version 1)
    -h, --help             print this help

ENDPOINTS:
    POST|GET|DELETE PATH   MCP Streamable HTTP (JSON-RPC 2.0)
    GET  /_naive/seen      every request received (except /_naive/*)
    POST /_naive/reset     clear that list
    GET  /_naive/ring      dump the event counter and ring buffer
";

/// Runtime configuration, from the command line.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub name: String,
    pub state_dir: PathBuf,
    pub ring: usize,
    pub tick_ms: u64,
    pub path: String,
    /// Events a standalone stream still produces after its client went away.
    pub produce_while_away: u64,
    /// Lower-cased header names.
    pub owner_headers: Vec<String>,
    /// Minimum length of an SSE event id (0: `e<num>` as is).
    pub id_pad: usize,
    /// One standalone stream per session, handed to its newest reader (`--hand-over`).
    pub hand_over: bool,
    /// Resumes start with the contiguity assertion (`--contiguity`).
    pub contiguity: bool,
}

impl Config {
    /// A configuration with the defaults, for tests and embedding.
    pub fn new(name: &str, state_dir: &Path) -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            name: name.to_string(),
            state_dir: state_dir.to_path_buf(),
            ring: 64,
            tick_ms: 50,
            path: "/mcp".to_string(),
            owner_headers: vec!["x-mcp-owner".to_string()],
            id_pad: 0,
            produce_while_away: 0,
            hand_over: false,
            contiguity: false,
        }
    }
}

/// Outcome of command-line parsing.
#[derive(Debug)]
pub enum Cli {
    Run(Config),
    Help,
}

/// Parse the arguments (without the program name).
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Cli, String> {
    let mut listen: Option<SocketAddr> = None;
    let mut name: Option<String> = None;
    let mut state_dir: Option<PathBuf> = None;
    let mut ring: usize = 64;
    let mut tick_ms: u64 = 50;
    let mut path = "/mcp".to_string();
    let mut owner_headers: Vec<String> = Vec::new();
    let mut id_pad: usize = 0;
    let mut produce_while_away: u64 = 0;
    let mut hand_over = false;
    let mut contiguity = false;

    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if flag == "-h" || flag == "--help" {
            return Ok(Cli::Help);
        }
        if flag == "--hand-over" || flag == "--contiguity" {
            if inline.is_some() {
                return Err(format!("{flag} takes no value"));
            }
            *(if flag == "--hand-over" {
                &mut hand_over
            } else {
                &mut contiguity
            }) = true;
            continue;
        }
        let mut value = || -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it.next().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag.as_str() {
            "--listen" => {
                let v = value()?;
                listen = Some(
                    v.parse()
                        .map_err(|e| format!("--listen {v:?}: not a socket address ({e})"))?,
                );
            }
            "--name" => {
                let v = value()?;
                if v.is_empty() || HeaderValue::from_str(&v).is_err() {
                    return Err(format!(
                        "--name {v:?}: must be a non-empty header-safe string"
                    ));
                }
                name = Some(v);
            }
            "--state-dir" => state_dir = Some(PathBuf::from(value()?)),
            "--ring" => {
                let v = value()?;
                ring = v
                    .parse()
                    .map_err(|e| format!("--ring {v:?}: not a count ({e})"))?;
            }
            "--tick-ms" => {
                let v = value()?;
                tick_ms = v
                    .parse()
                    .map_err(|e| format!("--tick-ms {v:?}: not milliseconds ({e})"))?;
                if tick_ms == 0 {
                    return Err("--tick-ms must be at least 1".to_string());
                }
            }
            "--path" => {
                let v = value()?;
                let ok = v.starts_with('/')
                    && v.len() > 1
                    && !v.starts_with("/_naive")
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c));
                if !ok {
                    return Err(format!(
                        "--path {v:?}: must start with '/', use [A-Za-z0-9/._-] and not be under /_naive"
                    ));
                }
                path = v;
            }
            "--owner-header" => {
                let v = value()?;
                for h in v.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                    owner_headers.push(h.to_ascii_lowercase());
                }
            }
            "--id-pad" => {
                let v = value()?;
                id_pad = v
                    .parse()
                    .map_err(|e| format!("--id-pad {v:?}: not a byte count ({e})"))?;
                if id_pad > 1 << 20 {
                    return Err(format!("--id-pad {v:?}: at most 1048576 bytes"));
                }
            }
            "--produce-while-away" => {
                let v = value()?;
                produce_while_away = v
                    .parse()
                    .map_err(|e| format!("--produce-while-away {v:?}: not a count ({e})"))?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if owner_headers.is_empty() {
        owner_headers.push("x-mcp-owner".to_string());
    }
    Ok(Cli::Run(Config {
        listen: listen.ok_or("--listen is required")?,
        name: name.ok_or("--name is required")?,
        state_dir: state_dir.ok_or("--state-dir is required")?,
        ring,
        tick_ms,
        path,
        owner_headers,
        id_pad,
        produce_while_away,
        hand_over,
        contiguity,
    }))
}

/// One event of the process-local ring buffer.
#[derive(Clone, Debug, Serialize)]
pub struct RingEvent {
    /// `e<num>`.
    pub id: String,
    #[serde(skip)]
    num: u64,
    pub session: String,
    /// `get` for standalone streams, `post:<request id>` for tool-call streams.
    pub stream_key: String,
    /// The exact SSE text that was (or would have been) sent.
    pub sse: String,
}

/// One request as received, for `/_naive/seen`.
#[derive(Clone, Debug, Serialize)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub session: Option<String>,
    pub last_event_id: Option<String>,
    pub mcp_protocol_version: Option<String>,
    pub has_owner_header: bool,
    pub body_method: Option<String>,
}

struct Log {
    counter: u64,
    ring: VecDeque<RingEvent>,
}

/// A session's standalone stream under `--hand-over`, fed to its newest reader.
struct Live {
    /// The producer task that feeds it (a stopped producer must not remove its successor).
    producer: u64,
    reader: Option<mpsc::UnboundedSender<String>>,
    /// Live events the current reader still takes (`?limit=N`).
    left: Option<u64>,
}

/// What the naive replay made of a cursor (the contiguity assertion says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplayFrom {
    /// The cursor is in the ring: every later event of the session follows.
    Found,
    /// Not in the ring, but later events of the session survive: replayed, with a gap.
    Tail,
    /// Not in the ring and nothing after it (or not one of our ids): nothing replayed.
    Unknown,
}

struct Inner {
    cfg: Config,
    replica_header: HeaderValue,
    log: Mutex<Log>,
    seen: Mutex<Vec<Seen>>,
    streams: AtomicU64,
    /// Standalone streams by session (`--hand-over`); locked before `log`.
    live: Mutex<HashMap<String, Live>>,
    shutdown: watch::Sender<bool>,
}

/// Shared state of one replica process.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl AppState {
    /// Create the state; makes `state_dir/sessions`.
    pub fn new(cfg: Config) -> io::Result<Self> {
        std::fs::create_dir_all(cfg.state_dir.join("sessions"))?;
        let replica_header = HeaderValue::from_str(&cfg.name)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let (shutdown, _) = watch::channel(false);
        Ok(AppState {
            inner: Arc::new(Inner {
                cfg,
                replica_header,
                log: Mutex::new(Log {
                    counter: 0,
                    ring: VecDeque::new(),
                }),
                seen: Mutex::new(Vec::new()),
                streams: AtomicU64::new(0),
                live: Mutex::new(HashMap::new()),
                shutdown,
            }),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Stop every producer so that open streams end (used on SIGTERM/SIGINT).
    pub fn begin_shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    /// Current value of the per-process event counter.
    pub fn counter(&self) -> u64 {
        lock(&self.inner.log).counter
    }

    /// Snapshot of the ring buffer.
    pub fn ring(&self) -> Vec<RingEvent> {
        lock(&self.inner.log).ring.iter().cloned().collect()
    }

    /// Snapshot of the requests seen.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.inner.seen).clone()
    }

    fn sessions_dir(&self) -> PathBuf {
        self.inner.cfg.state_dir.join("sessions")
    }

    fn ledger_path(&self) -> PathBuf {
        self.inner.cfg.state_dir.join("ledger.jsonl")
    }

    /// Allocate the next per-process id, record the event in the ring, return its SSE text.
    fn emit(&self, session: &str, stream_key: &str, msg: &Value) -> String {
        let data = msg.to_string();
        let mut log = lock(&self.inner.log);
        log.counter += 1;
        let num = log.counter;
        let id = padded_id(num, self.inner.cfg.id_pad);
        let sse = format!("id: {id}\nevent: message\ndata: {data}\n\n");
        log.ring.push_back(RingEvent {
            id,
            num,
            session: session.to_string(),
            stream_key: stream_key.to_string(),
            sse: sse.clone(),
        });
        while log.ring.len() > self.inner.cfg.ring {
            log.ring.pop_front();
        }
        sse
    }

    /// The naive resumption: what to replay for `last_event_id` on `session`.
    fn naive_replay(&self, session: &str, last_event_id: &str) -> (Vec<String>, ReplayFrom) {
        let mut log = lock(&self.inner.log);
        // Ids are per-process, so another session may own the same id here: look it up in
        // this session's events only (what replica 2 of docs/problem.md does: it finds nothing).
        if let Some(pos) = log
            .ring
            .iter()
            .position(|e| e.id == last_event_id && e.session == session)
        {
            // Found: replay everything after it for the session, whatever stream it came from.
            let replay = log
                .ring
                .iter()
                .skip(pos + 1)
                .filter(|e| e.session == session)
                .map(|e| e.sse.clone())
                .collect();
            return (replay, ReplayFrom::Found);
        }
        let Some(k) = parse_event_id(last_event_id) else {
            return (Vec::new(), ReplayFrom::Unknown);
        };
        // Replay whatever survives after it: the silent gap of a trimmed ring.
        let tail: Vec<String> = log
            .ring
            .iter()
            .filter(|e| e.num > k && e.session == session)
            .map(|e| e.sse.clone())
            .collect();
        if tail.is_empty() {
            // Not ours: "resume" numbering right after it from our own counter (docs/problem.md:
            // "began emitting new events starting at e8 from its own fresh counter").
            log.counter = k;
            (tail, ReplayFrom::Unknown)
        } else {
            log.counter = log.counter.max(k);
            (tail, ReplayFrom::Tail)
        }
    }

    /// The naive replay of `last_event_id` into `tx`, after the contiguity assertion with
    /// `--contiguity` (complete when the cursor was found: every later event of the session
    /// is taken for the stream's, which holds for a session with one stream at a time).
    fn send_replay(&self, session: &str, last_event_id: &str, tx: &mpsc::UnboundedSender<String>) {
        let (replay, from) = self.naive_replay(session, last_event_id);
        // The receiver is still in hand: these sends cannot fail.
        if self.inner.cfg.contiguity {
            let _ = tx.send(contiguity_assertion(last_event_id, from, replay.len()));
        }
        for chunk in replay {
            let _ = tx.send(chunk);
        }
    }

    /// `--hand-over`: the session's standalone stream, now fed to this new reader (after the
    /// replay of `last_event_id`, if any); the previous reader's response ends cleanly. The
    /// replay and the switch happen under one lock, so no event falls between them.
    fn attach(&self, session: &str, last_event_id: Option<&str>, limit: Option<u64>) -> Response {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut live = lock(&self.inner.live);
        if let Some(leid) = last_event_id {
            self.send_replay(session, leid, &tx);
        }
        if limit == Some(0) {
            // Exactly the replay: not a reader of the stream.
            return sse_response(rx);
        }
        match live.get_mut(session) {
            Some(l) => {
                // Dropping the previous sender ends that response once it has sent what it holds.
                l.reader = Some(tx);
                l.left = limit;
            }
            None => {
                let producer = self.inner.streams.fetch_add(1, Ordering::Relaxed) + 1;
                live.insert(
                    session.to_string(),
                    Live {
                        producer,
                        reader: Some(tx),
                        left: limit,
                    },
                );
                self.spawn_handed(session.to_string(), producer);
            }
        }
        sse_response(rx)
    }

    /// The producer of a `--hand-over` stream: a notification every `--tick-ms` to whichever
    /// reader the session's entry holds; with no reader, `--produce-while-away` more events
    /// into the ring, then it stops (and so on shutdown).
    fn spawn_handed(&self, session: String, producer: u64) {
        let state = self.clone();
        let tick = Duration::from_millis(self.inner.cfg.tick_ms);
        let away_budget = self.inner.cfg.produce_while_away;
        let mut shutdown = self.inner.shutdown.subscribe();
        tokio::spawn(async move {
            let mut n: u64 = 0;
            let mut away: Option<u64> = None;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(tick) => {}
                    _ = shutdown.wait_for(|v| *v) => break,
                }
                let mut live = lock(&state.inner.live);
                let Some(l) = live.get_mut(&session).filter(|l| l.producer == producer) else {
                    return;
                };
                if l.reader.as_ref().is_some_and(|r| r.is_closed()) {
                    l.reader = None;
                }
                if l.reader.is_some() {
                    away = None;
                } else {
                    let left = away.get_or_insert(away_budget);
                    if *left == 0 {
                        live.remove(&session);
                        return;
                    }
                    *left -= 1;
                }
                n += 1;
                let msg = live_message(&state.inner.cfg.name, producer, n);
                let sse = state.emit(&session, "get", &msg);
                let Some(l) = live.get_mut(&session) else {
                    return;
                };
                if let Some(r) = l.reader.take() {
                    let _ = r.send(sse);
                    let left = l.left.map(|x| x.saturating_sub(1));
                    l.left = left;
                    // The reader's `?limit` is reached: its response ends.
                    if left != Some(0) {
                        l.reader = Some(r);
                    }
                }
            }
            // Shut down: the reader's response ends.
            let mut live = lock(&state.inner.live);
            if live.get(&session).is_some_and(|l| l.producer == producer) {
                live.remove(&session);
            }
        });
    }

    fn record(&self, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) {
        let has_owner_header = self
            .inner
            .cfg
            .owner_headers
            .iter()
            .any(|h| headers.contains_key(h.as_str()));
        let seen = Seen {
            method: method.to_string(),
            path: uri.path().to_string(),
            session: header_str(headers, "mcp-session-id"),
            last_event_id: header_str(headers, "last-event-id"),
            mcp_protocol_version: header_str(headers, "mcp-protocol-version"),
            has_owner_header,
            body_method: body_method(body),
        };
        lock(&self.inner.seen).push(seen);
    }

    async fn session_known(&self, sid: &str) -> bool {
        valid_session_id(sid)
            && tokio::fs::try_exists(self.sessions_dir().join(sid))
                .await
                .unwrap_or(false)
    }

    /// Spawn the standalone-stream producer: a notification every `--tick-ms`, until the
    /// client goes away, `limit` events were sent, or the process shuts down. With
    /// `--produce-while-away N` it goes on for N more events after the client went away, into
    /// the ring only (as SDK servers with an event store do).
    fn spawn_live(&self, session: String, tx: mpsc::UnboundedSender<String>, limit: Option<u64>) {
        let state = self.clone();
        let stream_no = self.inner.streams.fetch_add(1, Ordering::Relaxed) + 1;
        let tick = Duration::from_millis(self.inner.cfg.tick_ms);
        let away_budget = self.inner.cfg.produce_while_away;
        let mut shutdown = self.inner.shutdown.subscribe();
        tokio::spawn(async move {
            let mut n: u64 = 0;
            // Events still to produce with nobody listening; None while the client is there.
            let mut away: Option<u64> = None;
            loop {
                if limit.is_some_and(|l| n >= l) || away == Some(0) {
                    break;
                }
                let listening = away.is_none();
                tokio::select! {
                    _ = tokio::time::sleep(tick) => {}
                    _ = tx.closed(), if listening => {
                        away = Some(away_budget);
                        continue;
                    }
                    _ = shutdown.wait_for(|v| *v) => break,
                }
                if away.is_none() && tx.is_closed() {
                    away = Some(away_budget);
                    continue;
                }
                n += 1;
                let msg = live_message(&state.inner.cfg.name, stream_no, n);
                let sse = state.emit(&session, "get", &msg);
                match away.as_mut() {
                    Some(left) => *left -= 1,
                    None => {
                        if tx.send(sse).is_err() {
                            away = Some(away_budget);
                        }
                    }
                }
            }
        });
    }
}

/// The notification a standalone stream sends every tick.
fn live_message(replica: &str, stream_no: u64, n: u64) -> Value {
    json!({
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {
            "level": "info",
            "data": {"replica": replica, "stream": stream_no, "n": n}
        }
    })
}

/// The contiguity assertion (docs/contiguity-extension.md, version 1) for a replay of `count`
/// events after `cursor`.
fn contiguity_assertion(cursor: &str, from: ReplayFrom, count: usize) -> String {
    let mut params =
        json!({"v": 1, "after": cursor, "complete": from == ReplayFrom::Found, "count": count});
    match from {
        ReplayFrom::Found => {}
        ReplayFrom::Tail => params["reason"] = json!("not_contiguous"),
        ReplayFrom::Unknown => params["reason"] = json!("unknown_cursor"),
    }
    let msg = json!({
        "jsonrpc": "2.0",
        "method": "notifications/mcp-resume-guard/replay",
        "params": params,
    });
    format!("id: {cursor}\nevent: message\ndata: {msg}\n\n")
}

fn parse_event_id(id: &str) -> Option<u64> {
    let digits = id.strip_prefix('e')?;
    digits.split('.').next()?.parse().ok()
}

/// `e<num>`, padded to `pad` bytes as `e<num>.xxx…` (the number stays readable).
fn padded_id(num: u64, pad: usize) -> String {
    let mut id = format!("e{num}");
    if id.len() < pad {
        id.push('.');
        let fill = pad.saturating_sub(id.len());
        id.extend(std::iter::repeat_n('x', fill));
    }
    id
}

fn valid_session_id(sid: &str) -> bool {
    !sid.is_empty() && sid.len() <= 128 && sid.bytes().all(|b| b.is_ascii_hexdigit())
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

fn body_method(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let first_with_method = match &v {
        Value::Array(items) => items.iter().find(|i| i.get("method").is_some())?,
        other => other,
    };
    first_with_method
        .get("method")?
        .as_str()
        .map(str::to_string)
}

fn query_u64(query: Option<&str>, key: &str) -> Option<u64> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// 32 lower-case hex characters from the OS's random source.
fn new_session_id() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    if !filled {
        // Fallback: std's randomly keyed hasher, mixed with time and a counter.
        use std::hash::{BuildHasher, Hasher};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        for chunk in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(now_ms());
            h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
            chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn rpc_error(status: StatusCode, id: Value, code: i64, message: &str) -> Response {
    json_response(
        status,
        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
    )
}

fn rpc_result(id: Value, result: Value) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"jsonrpc": "2.0", "id": id, "result": result}),
    )
}

fn session_not_found() -> Response {
    rpc_error(
        StatusCode::NOT_FOUND,
        Value::Null,
        -32001,
        "session not found",
    )
}

fn sse_response(rx: mpsc::UnboundedReceiver<String>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(Bytes::from(chunk)), rx))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

fn tools() -> Value {
    json!([
        {
            "name": "ledger_append",
            "description": "Append an entry to the shared ledger (a side effect), then stream progress.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "entry": {"type": "string"},
                    "steps": {"type": "integer", "minimum": 0, "default": 5},
                    "step_ms": {"type": "integer", "minimum": 0, "default": 100}
                },
                "required": ["entry"]
            }
        },
        {
            "name": "echo",
            "description": "Answer the text at once, as application/json.",
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"]
            }
        }
    ])
}

/// Build the router for one replica.
pub fn router(state: AppState) -> Router {
    let path = state.inner.cfg.path.clone();
    Router::new()
        .route(&path, any(mcp))
        .route("/_naive/seen", get(debug_seen))
        .route("/_naive/reset", post(debug_reset))
        .route("/_naive/ring", get(debug_ring))
        .fallback(fallback)
        .layer(middleware::from_fn_with_state(state.clone(), add_replica))
        .with_state(state)
}

/// Serve until `signal` completes, then shut down gracefully (producers are stopped so
/// open streams end); force the end 3 s later if connections still linger.
pub async fn serve_until<F>(listener: TcpListener, state: AppState, signal: F) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let app = router(state.clone());
    let st = state.clone();
    let graceful = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            signal.await;
            st.begin_shutdown();
        })
        .into_future();
    let mut shutdown = state.inner.shutdown.subscribe();
    let deadline = async move {
        if shutdown.wait_for(|v| *v).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    tokio::select! {
        r = graceful => r,
        _ = deadline => Ok(()),
    }
}

async fn add_replica(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    resp.headers_mut()
        .insert("x-replica", state.inner.replica_header.clone());
    resp
}

async fn debug_seen(State(state): State<AppState>) -> Response {
    json_response(StatusCode::OK, &json!(state.seen()))
}

async fn debug_reset(State(state): State<AppState>) -> Response {
    lock(&state.inner.seen).clear();
    StatusCode::OK.into_response()
}

async fn debug_ring(State(state): State<AppState>) -> Response {
    let (counter, events) = {
        let log = lock(&state.inner.log);
        (log.counter, log.ring.iter().cloned().collect::<Vec<_>>())
    };
    json_response(
        StatusCode::OK,
        &json!({
            "replica": state.inner.cfg.name,
            "counter": counter,
            "capacity": state.inner.cfg.ring,
            "events": events,
        }),
    )
}

async fn fallback(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    state.record(&method, &uri, &headers, &body);
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

async fn mcp(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    state.record(&method, &uri, &headers, &body);

    if let Some(v) = headers.get("mcp-protocol-version") {
        let known = v
            .to_str()
            .is_ok_and(|v| SUPPORTED_VERSIONS.contains(&v.trim()));
        if !known {
            let shown = String::from_utf8_lossy(v.as_bytes()).into_owned();
            return rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                -32000,
                &format!(
                    "Bad Request: Unsupported protocol version: {shown} (supported versions: {})",
                    SUPPORTED_VERSIONS.join(", ")
                ),
            );
        }
    }

    let session = header_str(&headers, "mcp-session-id");
    let known = match &session {
        Some(sid) => state.session_known(sid).await,
        None => false,
    };
    let limit = query_u64(uri.query(), "limit");

    // Naive resume: "session exists ⇒ resume", whatever the method, body ignored.
    if let (Some(sid), true, Some(leid)) = (&session, known, headers.get("last-event-id")) {
        if method == Method::GET || method == Method::POST {
            let leid = String::from_utf8_lossy(leid.as_bytes()).into_owned();
            if state.inner.cfg.hand_over {
                return state.attach(sid, Some(&leid), limit);
            }
            let (tx, rx) = mpsc::unbounded_channel();
            state.send_replay(sid, &leid, &tx);
            state.spawn_live(sid.clone(), tx, limit);
            return sse_response(rx);
        }
    }

    match method {
        Method::POST => handle_post(&state, session.filter(|_| known), &body).await,
        Method::GET => match session.filter(|_| known) {
            Some(sid) if state.inner.cfg.hand_over => state.attach(&sid, None, limit),
            Some(sid) => {
                let (tx, rx) = mpsc::unbounded_channel();
                state.spawn_live(sid, tx, limit);
                sse_response(rx)
            }
            None => session_not_found(),
        },
        Method::DELETE => match session.filter(|_| known) {
            Some(sid) => match tokio::fs::remove_file(state.sessions_dir().join(&sid)).await {
                Ok(()) => StatusCode::OK.into_response(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => session_not_found(),
                Err(e) => rpc_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Value::Null,
                    -32603,
                    &format!("cannot delete session: {e}"),
                ),
            },
            None => session_not_found(),
        },
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET, POST, DELETE")],
        )
            .into_response(),
    }
}

async fn handle_post(state: &AppState, session: Option<String>, body: &[u8]) -> Response {
    let msg: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                -32700,
                &format!("Parse error: {e}"),
            )
        }
    };
    if let Value::Array(items) = &msg {
        // Batches are accepted only when they carry no request.
        let all_one_way = items
            .iter()
            .all(|i| i.get("id").is_none() || i.get("method").is_none());
        return match (all_one_way, session) {
            (true, Some(_)) => StatusCode::ACCEPTED.into_response(),
            (true, None) => session_not_found(),
            (false, _) => rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                -32600,
                "batches with requests are not supported",
            ),
        };
    }
    let Some(obj) = msg.as_object() else {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            Value::Null,
            -32600,
            "Invalid Request",
        );
    };
    let rpc_method = obj.get("method").and_then(Value::as_str);
    let id = obj.get("id").cloned();

    if let (Some("initialize"), Some(id)) = (rpc_method, &id) {
        return initialize(state, id.clone(), obj.get("params")).await;
    }
    let Some(sid) = session else {
        return session_not_found();
    };
    // Notifications and client responses.
    let (Some(id), Some(rpc_method)) = (id, rpc_method) else {
        return StatusCode::ACCEPTED.into_response();
    };
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    match rpc_method {
        "ping" => rpc_result(id, json!({})),
        "tools/list" => rpc_result(id, json!({"tools": tools()})),
        "tools/call" => tools_call(state, sid, id, &params).await,
        other => rpc_error(
            StatusCode::OK,
            id,
            -32601,
            &format!("Method not found: {other}"),
        ),
    }
}

async fn initialize(state: &AppState, id: Value, params: Option<&Value>) -> Response {
    let requested = params
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let version = SUPPORTED_VERSIONS
        .iter()
        .find(|v| **v == requested)
        .copied()
        .unwrap_or(DEFAULT_VERSION);
    let sid = new_session_id();
    if let Err(e) = tokio::fs::write(state.sessions_dir().join(&sid), version).await {
        return rpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            id,
            -32603,
            &format!("cannot store session: {e}"),
        );
    }
    let mut resp = rpc_result(
        id,
        json!({
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "naive-replica", "version": VERSION}
        }),
    );
    if let Ok(v) = HeaderValue::from_str(&sid) {
        resp.headers_mut().insert("mcp-session-id", v);
    }
    resp
}

async fn tools_call(state: &AppState, sid: String, id: Value, params: &Value) -> Response {
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    let args = params.get("arguments").cloned().unwrap_or(json!({}));
    match name {
        "echo" => {
            let text = args.get("text").and_then(Value::as_str).unwrap_or("");
            rpc_result(id, json!({"content": [{"type": "text", "text": text}]}))
        }
        "ledger_append" => {
            let Some(entry) = args.get("entry").and_then(Value::as_str) else {
                return rpc_error(
                    StatusCode::OK,
                    id,
                    -32602,
                    "ledger_append: `entry` (string) is required",
                );
            };
            let steps = args.get("steps").and_then(Value::as_u64).unwrap_or(5);
            let step_ms = args.get("step_ms").and_then(Value::as_u64).unwrap_or(100);
            let token = params
                .get("_meta")
                .and_then(|m| m.get("progressToken"))
                .cloned()
                .unwrap_or_else(|| id.clone());

            // The side effect, at the start of the call.
            let line = json!({
                "replica": state.inner.cfg.name,
                "session": sid,
                "entry": entry,
                "ts": now_ms(),
            })
            .to_string()
                + "\n";
            if let Err(e) = append_ledger(&state.ledger_path(), line.as_bytes()).await {
                return rpc_error(
                    StatusCode::OK,
                    id,
                    -32603,
                    &format!("ledger write failed: {e}"),
                );
            }

            let (tx, rx) = mpsc::unbounded_channel::<String>();
            let state = state.clone();
            let entry = entry.to_string();
            let stream_key = format!("post:{id}");
            let mut shutdown = state.inner.shutdown.subscribe();
            // Disconnection is not cancellation: the producer runs to the end and fills the
            // ring whether or not anybody still reads `rx`.
            tokio::spawn(async move {
                let name = state.inner.cfg.name.clone();
                for k in 1..=steps {
                    if k > 1 {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(step_ms)) => {}
                            _ = shutdown.wait_for(|v| *v) => return,
                        }
                    }
                    let msg = json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {
                            "progressToken": token,
                            "progress": k,
                            "total": steps,
                            "message": format!("{name} step {k}"),
                        }
                    });
                    let _ = tx.send(state.emit(&sid, &stream_key, &msg));
                }
                if steps > 0 {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(step_ms)) => {}
                        _ = shutdown.wait_for(|v| *v) => return,
                    }
                }
                let msg = json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "result": {"content": [{"type": "text", "text": format!("appended {entry} on {name}")}]}
                });
                let _ = tx.send(state.emit(&sid, &stream_key, &msg));
            });
            sse_response(rx)
        }
        other => rpc_error(
            StatusCode::OK,
            id,
            -32602,
            &format!("Unknown tool: {other}"),
        ),
    }
}

async fn append_ledger(path: &Path, line: &[u8]) -> io::Result<()> {
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await?;
    f.write_all(line).await?;
    f.flush().await
}
