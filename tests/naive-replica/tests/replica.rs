//! End-to-end tests of the naive replica over real HTTP/1.1 on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use naive_replica::{parse_args, serve_until, AppState, Cli, Config};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

// ---------------------------------------------------------------- harness

struct Replica {
    addr: SocketAddr,
    state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Replica {
    async fn start(name: &str, dir: &Path, ring: usize) -> Replica {
        let mut cfg = Config::new(name, dir);
        cfg.ring = ring;
        Replica::with(cfg).await
    }

    async fn with(mut cfg: Config) -> Replica {
        cfg.tick_ms = 20;
        let state = AppState::new(cfg).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_until(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        Replica {
            addr,
            state,
            stop: Some(stop),
            task,
        }
    }
}

/// A scratch state dir, removed when dropped.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(tag: &str) -> TempDir {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "naive-replica-test-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
    /// (id, data) of every SSE event.
    fn events(&self) -> Vec<(String, Value)> {
        sse_events(&self.body)
    }
    fn ids(&self) -> Vec<String> {
        self.events().into_iter().map(|(id, _)| id).collect()
    }
}

fn sse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut id = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            (id, serde_json::from_str(&data).unwrap())
        })
        .collect()
}

fn request_text(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> String {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Accept: application/json, text/event-stream\r\n"
    );
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    req
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_line = std::str::from_utf8(&raw[..eol]).unwrap();
        let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16).unwrap();
        raw = &raw[eol + 2..];
        if size == 0 {
            break;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
    out
}

async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Resp {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request_text(addr, method, path, headers, body).as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .expect("response did not end in 10 s")
        .unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = std::str::from_utf8(&raw[..split]).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body_raw = &raw[split + 4..];
    let body = if chunked {
        dechunk(body_raw)
    } else {
        body_raw.to_vec()
    };
    Resp {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

async fn initialize(addr: SocketAddr, version: &str) -> (Resp, String) {
    let r = http(
        addr,
        "POST",
        "/mcp",
        &[],
        Some(&json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}
        })),
    )
    .await;
    let sid = r.header("mcp-session-id").unwrap_or_default().to_string();
    (r, sid)
}

async fn ledger_append(
    addr: SocketAddr,
    sid: &str,
    id: u64,
    entry: &str,
    steps: u64,
    extra: &[(&str, &str)],
) -> Resp {
    let mut headers = vec![("Mcp-Session-Id", sid)];
    headers.extend_from_slice(extra);
    http(
        addr,
        "POST",
        "/mcp",
        &headers,
        Some(&json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "ledger_append",
                       "arguments": {"entry": entry, "steps": steps, "step_ms": 5}}
        })),
    )
    .await
}

fn ledger_lines(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("ledger.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(range: std::ops::RangeInclusive<u64>) -> Vec<String> {
    range.map(|n| format!("e{n}")).collect()
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn initialize_negotiates_version_and_shares_the_session() {
    let dir = temp_dir("init");
    let r1 = Replica::start("r1", &dir, 64).await;
    let r2 = Replica::start("r2", &dir, 64).await;

    let (r, sid) = initialize(r1.addr, "2025-06-18").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-replica"), Some("r1"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(sid.len(), 32);
    assert!(sid.bytes().all(|b| b.is_ascii_hexdigit()));
    let v = r.json();
    assert_eq!(v["id"], 0);
    assert_eq!(v["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(v["result"]["serverInfo"]["name"], "naive-replica");
    assert_eq!(v["result"]["capabilities"], json!({"tools": {}}));
    assert_eq!(
        std::fs::read_to_string(dir.join("sessions").join(&sid)).unwrap(),
        "2025-06-18"
    );

    let (r, _) = initialize(r1.addr, "1999-01-01").await;
    assert_eq!(r.json()["result"]["protocolVersion"], "2025-03-26");

    // The other replica knows the session ("sessions were stored in Redis").
    let r = http(
        r2.addr,
        "POST",
        "/mcp",
        &[
            ("Mcp-Session-Id", &sid),
            ("MCP-Protocol-Version", "2025-06-18"),
        ],
        Some(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-replica"), Some("r2"));
    let names: Vec<_> = r.json()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["ledger_append", "echo"]);

    // Notification -> 202, empty.
    let r = http(
        r2.addr,
        "POST",
        "/mcp",
        &[("Mcp-Session-Id", &sid)],
        Some(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
    )
    .await;
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty());

    // echo is plain JSON.
    let r = http(
        r2.addr,
        "POST",
        "/mcp",
        &[("Mcp-Session-Id", &sid)],
        Some(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "echo", "arguments": {"text": "hi"}}})),
    )
    .await;
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["result"]["content"][0]["text"], "hi");
    assert_eq!(r2.state.counter(), 0, "echo emits no event");

    // DELETE on r2 ends it everywhere.
    let r = http(r2.addr, "DELETE", "/mcp", &[("Mcp-Session-Id", &sid)], None).await;
    assert_eq!(r.status, 200);
    let r = http(r1.addr, "GET", "/mcp", &[("Mcp-Session-Id", &sid)], None).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn unknown_session_is_404_and_bad_protocol_version_is_400() {
    let dir = temp_dir("errors");
    let r1 = Replica::start("r1", &dir, 64).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});

    for headers in [
        vec![],
        vec![("Mcp-Session-Id", "00112233445566778899aabbccddeeff")],
    ] {
        let r = http(r1.addr, "POST", "/mcp", &headers, Some(&body)).await;
        assert_eq!(r.status, 404);
        assert_eq!(r.header("x-replica"), Some("r1"));
        let v = r.json();
        assert_eq!(v["id"], Value::Null);
        assert_eq!(v["error"]["message"], "session not found");
    }
    // Even with a cursor: no session, no resume.
    let r = http(
        r1.addr,
        "GET",
        "/mcp",
        &[("Mcp-Session-Id", "abcdef"), ("Last-Event-ID", "e3")],
        None,
    )
    .await;
    assert_eq!(r.status, 404);

    let (_, sid) = initialize(r1.addr, "2025-06-18").await;
    let r = http(
        r1.addr,
        "POST",
        "/mcp",
        &[
            ("Mcp-Session-Id", &sid),
            ("MCP-Protocol-Version", "2099-01-01"),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], -32000);

    // x-replica on the fallback too.
    let r = http(r1.addr, "GET", "/elsewhere", &[], None).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("x-replica"), Some("r1"));
}

#[tokio::test]
async fn ledger_append_streams_ids_from_the_process_counter() {
    let dir = temp_dir("ledger");
    let r1 = Replica::start("r1", &dir, 64).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;

    let r = ledger_append(r1.addr, &sid, 7, "first", 3, &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.ids(), ids(1..=4));
    let ev = r.events();
    for (k, (_, data)) in ev.iter().take(3).enumerate() {
        assert_eq!(data["method"], "notifications/progress");
        assert_eq!(data["params"]["progressToken"], 7);
        assert_eq!(data["params"]["progress"], k as u64 + 1);
        assert_eq!(data["params"]["total"], 3);
        assert_eq!(data["params"]["message"], format!("r1 step {}", k + 1));
    }
    assert_eq!(ev[3].1["id"], 7);
    assert_eq!(
        ev[3].1["result"]["content"][0]["text"],
        "appended first on r1"
    );
    assert!(r.body.contains("event: message\n"));

    // The counter is per process, shared by all streams; progressToken from _meta.
    let r = http(
        r1.addr,
        "POST",
        "/mcp",
        &[("Mcp-Session-Id", &sid)],
        Some(&json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                     "params": {"name": "ledger_append", "_meta": {"progressToken": "tok"},
                                "arguments": {"entry": "second", "steps": 2, "step_ms": 1}}})),
    )
    .await;
    assert_eq!(r.ids(), ids(5..=7));
    assert_eq!(r.events()[0].1["params"]["progressToken"], "tok");

    let lines = ledger_lines(&dir);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["replica"], "r1");
    assert_eq!(lines[0]["session"], sid.as_str());
    assert_eq!(lines[0]["entry"], "first");
    assert!(lines[0]["ts"].as_u64().unwrap() > 0);
    assert_eq!(lines[1]["entry"], "second");

    let ring = r1.state.ring();
    assert_eq!(ring.len(), 7);
    assert_eq!(ring[0].stream_key, "post:7");
    assert_eq!(ring[6].stream_key, "post:8");
}

/// Failure 1 (docs/problem.md): the cursor lands on another replica, which has the session but not the
/// events, and "resumes" by continuing its own counter after the cursor.
#[tokio::test]
async fn resume_on_another_replica_bumps_its_counter() {
    let dir = temp_dir("xreplica");
    let r1 = Replica::start("r1", &dir, 64).await;
    let r2 = Replica::start("r2", &dir, 64).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;

    let r = ledger_append(r1.addr, &sid, 1, "x", 6, &[]).await;
    assert_eq!(r.ids(), ids(1..=7));

    let r = http(
        r2.addr,
        "GET",
        "/mcp?limit=2",
        &[("Mcp-Session-Id", &sid), ("Last-Event-ID", "e7")],
        None,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-replica"), Some("r2"));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.ids(), ids(8..=9));
    for (_, data) in r.events() {
        assert_eq!(data["method"], "notifications/message");
        assert_eq!(data["params"]["data"]["replica"], "r2");
    }
    assert_eq!(r2.state.counter(), 9);

    // r1 issues its own e8, e9: same ids, different payloads.
    let r = http(
        r1.addr,
        "GET",
        "/mcp?limit=2",
        &[("Mcp-Session-Id", &sid)],
        None,
    )
    .await;
    assert_eq!(r.ids(), ids(8..=9));
    assert_eq!(r.events()[0].1["params"]["data"]["replica"], "r1");

    // A lower cursor never moves the counter back; r2's own e8, e9 are "after" it.
    let r = http(
        r2.addr,
        "GET",
        "/mcp?limit=1",
        &[("Mcp-Session-Id", &sid), ("Last-Event-ID", "e3")],
        None,
    )
    .await;
    assert_eq!(r.ids(), ids(8..=10));
    // An unparseable cursor: just live.
    let r = http(
        r2.addr,
        "GET",
        "/mcp?limit=1",
        &[
            ("Mcp-Session-Id", &sid),
            ("Last-Event-ID", "_GET_stream_17"),
        ],
        None,
    )
    .await;
    assert_eq!(r.ids(), ids(11..=11));
}

/// Failure 2 (docs/problem.md): a POST carrying a stale Last-Event-ID is taken for a resumption and its
/// tools/call is silently dropped.
#[tokio::test]
async fn post_with_last_event_id_drops_the_call() {
    let dir = temp_dir("post-cursor-2");
    let r1 = Replica::start("r1", &dir, 64).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;
    let r = http(
        r1.addr,
        "POST",
        "/mcp?limit=2",
        &[
            ("Mcp-Session-Id", &sid),
            ("Last-Event-ID", "e42"),
            ("x-mcp-owner", "whatever"),
        ],
        Some(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                     "params": {"name": "ledger_append", "arguments": {"entry": "lost"}}})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.ids(), ids(43..=44));
    for (_, data) in r.events() {
        assert_eq!(data["method"], "notifications/message");
        assert!(data.get("id").is_none(), "no tools/call result");
    }
    assert!(
        ledger_lines(&dir).is_empty(),
        "the call must have been dropped"
    );

    let seen = r1.state.seen();
    let last = seen.last().unwrap();
    assert_eq!(last.method, "POST");
    assert_eq!(last.body_method.as_deref(), Some("tools/call"));
    assert_eq!(last.last_event_id.as_deref(), Some("e42"));
    assert!(last.has_owner_header);
}

/// The silent gap: a trimmed ring replays only its surviving tail.
#[tokio::test]
async fn trimmed_ring_replays_the_surviving_tail() {
    let dir = temp_dir("trim");
    let r1 = Replica::start("r1", &dir, 4).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;
    let r = ledger_append(r1.addr, &sid, 1, "x", 6, &[]).await;
    assert_eq!(r.ids(), ids(1..=7));
    let ring: Vec<_> = r1.state.ring().into_iter().map(|e| e.id).collect();
    assert_eq!(ring, ids(4..=7));

    let r = http(
        r1.addr,
        "GET",
        "/mcp?limit=1",
        &[("Mcp-Session-Id", &sid), ("Last-Event-ID", "e2")],
        None,
    )
    .await;
    // e3 is lost without a word; e4..e7 replayed; e8 live.
    assert_eq!(r.ids(), ids(4..=8));
}

/// Found in the ring: everything after it for the session, whatever stream it came from.
#[tokio::test]
async fn found_cursor_replays_every_stream_of_the_session() {
    let dir = temp_dir("found");
    let r1 = Replica::start("r1", &dir, 64).await;
    let (_, a) = initialize(r1.addr, "2025-06-18").await;
    let (_, b) = initialize(r1.addr, "2025-06-18").await;

    assert_eq!(
        ledger_append(r1.addr, &a, 1, "x", 2, &[]).await.ids(),
        ids(1..=3)
    );
    let r = http(
        r1.addr,
        "GET",
        "/mcp?limit=2",
        &[("Mcp-Session-Id", &a)],
        None,
    )
    .await;
    assert_eq!(r.ids(), ids(4..=5));
    let r = http(
        r1.addr,
        "GET",
        "/mcp?limit=1",
        &[("Mcp-Session-Id", &b)],
        None,
    )
    .await;
    assert_eq!(r.ids(), ids(6..=6));

    let r = http(
        r1.addr,
        "GET",
        "/mcp?limit=0",
        &[("Mcp-Session-Id", &a), ("Last-Event-ID", "e2")],
        None,
    )
    .await;
    // e3 from the POST stream, e4, e5 from the GET stream; not e6 (session b).
    assert_eq!(r.ids(), ids(3..=5));
    let ev = r.events();
    assert_eq!(ev[0].1["id"], 1);
    assert_eq!(ev[1].1["params"]["data"]["stream"], 1);
}

/// Disconnection is not cancellation: the tool call runs on and fills the ring.
#[tokio::test]
async fn disconnect_mid_call_still_fills_the_ring() {
    let dir = temp_dir("disconnect");
    let r1 = Replica::start("r1", &dir, 64).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;

    let mut s = TcpStream::connect(r1.addr).await.unwrap();
    let body = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                      "params": {"name": "ledger_append",
                                 "arguments": {"entry": "dropped", "steps": 5, "step_ms": 40}}});
    s.write_all(
        request_text(
            r1.addr,
            "POST",
            "/mcp",
            &[("Mcp-Session-Id", &sid)],
            Some(&body),
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("id: e1\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    drop(s);
    assert_eq!(ledger_lines(&dir).len(), 1, "side effect at the start");

    tokio::time::sleep(Duration::from_millis(600)).await;
    let ring: Vec<_> = r1.state.ring();
    assert_eq!(
        ring.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        ids(1..=6)
    );
    assert!(ring.iter().all(|e| e.stream_key == "post:5"));
    assert!(ring[5].sse.contains("appended dropped on r1"));
}

/// The standalone stream stops producing once its client is gone.
#[tokio::test]
async fn get_stream_stops_after_disconnect() {
    let dir = temp_dir("get-disconnect");
    let r1 = Replica::start("r1", &dir, 64).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;
    let mut s = TcpStream::connect(r1.addr).await.unwrap();
    s.write_all(request_text(r1.addr, "GET", "/mcp", &[("Mcp-Session-Id", &sid)], None).as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("id: e2\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    drop(s);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c1 = r1.state.counter();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(r1.state.counter(), c1, "producer must have stopped");
}

/// `--produce-while-away N`: the stream goes on without its client, the ring moves past the
/// cursor, and the resume continues silently with whatever survived.
#[tokio::test]
async fn produce_while_away_gives_the_silent_resume_into_a_later_tail() {
    let dir = temp_dir("away");
    let mut cfg = Config::new("r1", &dir);
    cfg.ring = 8;
    cfg.produce_while_away = 20;
    let r1 = Replica::with(cfg).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;
    let mut s = TcpStream::connect(r1.addr).await.unwrap();
    s.write_all(request_text(r1.addr, "GET", "/mcp", &[("Mcp-Session-Id", &sid)], None).as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("id: e3\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    drop(s);
    // 20 more events at 20 ms, then the producer stops.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while r1.state.counter() < 23 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r1.state.counter(), 23, "N more events, then it stops");
    let r = http(
        r1.addr,
        "GET",
        "/mcp?limit=0",
        &[("Mcp-Session-Id", &sid), ("Last-Event-ID", "e3")],
        None,
    )
    .await;
    // e4..e15 are lost without a word: the replay starts at e16.
    assert_eq!(r.ids(), ids(16..=23));
    let first = &r.events()[0].1;
    assert_eq!(first["params"]["data"]["n"], 16);
}

#[tokio::test]
async fn seen_reset_and_ring_endpoints() {
    let dir = temp_dir("debug");
    let r1 = Replica::start("r1", &dir, 64).await;
    let (_, sid) = initialize(r1.addr, "2025-03-26").await;
    let _ = http(
        r1.addr,
        "GET",
        "/mcp?limit=1",
        &[
            ("Mcp-Session-Id", &sid),
            ("MCP-Protocol-Version", "2025-03-26"),
        ],
        None,
    )
    .await;
    let seen = http(r1.addr, "GET", "/_naive/seen", &[], None).await.json();
    let seen = seen.as_array().unwrap();
    assert_eq!(seen.len(), 2, "debug endpoints are not recorded: {seen:?}");
    assert_eq!(seen[0]["method"], "POST");
    assert_eq!(seen[0]["body_method"], "initialize");
    assert_eq!(seen[0]["session"], Value::Null);
    assert_eq!(seen[1]["method"], "GET");
    assert_eq!(seen[1]["path"], "/mcp");
    assert_eq!(seen[1]["session"], sid.as_str());
    assert_eq!(seen[1]["last_event_id"], Value::Null);
    assert_eq!(seen[1]["mcp_protocol_version"], "2025-03-26");
    assert_eq!(seen[1]["has_owner_header"], false);

    let ring = http(r1.addr, "GET", "/_naive/ring", &[], None).await.json();
    assert_eq!(ring["replica"], "r1");
    assert_eq!(ring["counter"], 1);
    assert_eq!(ring["capacity"], 64);
    assert_eq!(ring["events"][0]["id"], "e1");
    assert_eq!(ring["events"][0]["stream_key"], "get");
    assert_eq!(ring["events"][0]["session"], sid.as_str());

    assert_eq!(
        http(r1.addr, "POST", "/_naive/reset", &[], None)
            .await
            .status,
        200
    );
    let seen = http(r1.addr, "GET", "/_naive/seen", &[], None).await.json();
    assert_eq!(seen, json!([]));
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let dir = temp_dir("shutdown");
    let mut r1 = Replica::start("r1", &dir, 64).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;
    let addr = r1.addr;
    let client =
        tokio::spawn(
            async move { http(addr, "GET", "/mcp", &[("Mcp-Session-Id", &sid)], None).await },
        );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = r1.stop.take().unwrap().send(());
    let served = tokio::time::timeout(Duration::from_secs(2), &mut r1.task)
        .await
        .expect("graceful shutdown took too long");
    assert!(served.unwrap().is_ok());
    let r = client.await.unwrap();
    assert_eq!(r.status, 200);
    assert!(!r.ids().is_empty());
}

/// Reads an open response until its body holds `needle` (5 s at most).
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, needle: &str) {
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(got).contains(needle) {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(
            n > 0,
            "ended before {needle:?}: {}",
            String::from_utf8_lossy(got)
        );
        got.extend_from_slice(&buf[..n]);
    }
}

/// `--hand-over`: a resume takes the session's stream over; the previous reader's response
/// ends cleanly and the stream goes on, same stream and count, on the new reader.
#[tokio::test]
async fn hand_over_gives_the_stream_to_the_newest_reader() {
    let dir = temp_dir("hand-over");
    let mut cfg = Config::new("r1", &dir);
    cfg.hand_over = true;
    let r1 = Replica::with(cfg).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;
    let mut a = TcpStream::connect(r1.addr).await.unwrap();
    a.write_all(request_text(r1.addr, "GET", "/mcp", &[("Mcp-Session-Id", &sid)], None).as_bytes())
        .await
        .unwrap();
    let mut got_a = Vec::new();
    read_until(&mut a, &mut got_a, "id: e2\n").await;
    let addr = r1.addr;
    let sid2 = sid.clone();
    let b = tokio::spawn(async move {
        http(
            addr,
            "GET",
            "/mcp?limit=3",
            &[("Mcp-Session-Id", &sid2), ("Last-Event-ID", "e2")],
            None,
        )
        .await
    });
    // The old reader's response ends, with the chunked terminator (a clean end).
    tokio::time::timeout(Duration::from_secs(5), a.read_to_end(&mut got_a))
        .await
        .expect("the old reader's response did not end")
        .unwrap();
    assert!(
        got_a.ends_with(b"0\r\n\r\n"),
        "{}",
        String::from_utf8_lossy(&got_a)
    );
    let b = b.await.unwrap();
    let ns: Vec<(u64, u64)> = b
        .events()
        .iter()
        .map(|(_, v)| {
            let d = &v["params"]["data"];
            (d["stream"].as_u64().unwrap(), d["n"].as_u64().unwrap())
        })
        .collect();
    // The replay (whatever the old reader was sent after e2), then 3 live events: one stream,
    // counting on from n = 3.
    assert!(ns.len() >= 3, "{ns:?}");
    assert!(ns.iter().all(|(s, _)| *s == ns[0].0), "{ns:?}");
    assert_eq!(
        ns.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        (3..3 + ns.len() as u64).collect::<Vec<_>>()
    );
    // Nobody reads it now: it stops.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = r1.state.counter();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(r1.state.counter(), c, "the producer must have stopped");
}

/// `--contiguity`: a resume's answer starts with the assertion, complete when the cursor is
/// in the ring, `complete: false` when it is not.
#[tokio::test]
async fn contiguity_assertion_leads_every_resume() {
    let dir = temp_dir("contiguity");
    let mut cfg = Config::new("r1", &dir);
    cfg.contiguity = true;
    let r1 = Replica::with(cfg).await;
    let (_, sid) = initialize(r1.addr, "2025-06-18").await;
    let r = ledger_append(r1.addr, &sid, 1, "x", 3, &[]).await;
    assert_eq!(r.ids(), ids(1..=4));
    let resume = |cursor: &'static str| {
        let sid = sid.clone();
        async move {
            http(
                r1.addr,
                "GET",
                "/mcp?limit=0",
                &[("Mcp-Session-Id", &sid), ("Last-Event-ID", cursor)],
                None,
            )
            .await
        }
    };
    let r = resume("e2").await;
    let evs = r.events();
    assert_eq!(r.ids(), ["e2", "e3", "e4"]);
    assert_eq!(evs[0].1["method"], "notifications/mcp-resume-guard/replay");
    assert_eq!(
        evs[0].1["params"],
        json!({"v": 1, "after": "e2", "complete": true, "count": 2})
    );
    let r = resume("x9").await;
    assert_eq!(r.ids(), ["x9"]);
    assert_eq!(
        r.events()[0].1["params"],
        json!({"v": 1, "after": "x9", "complete": false, "count": 0, "reason": "unknown_cursor"})
    );
}

#[test]
fn cli_parses_and_rejects() {
    let args = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let Cli::Run(cfg) = parse_args(args(
        "--listen 127.0.0.1:9101 --name r1 --state-dir /tmp/x --ring 8 --tick-ms 10 --path /rpc --owner-header X-A,x-b --produce-while-away 7",
    ))
    .unwrap() else {
        panic!("expected a config");
    };
    assert_eq!(cfg.listen.to_string(), "127.0.0.1:9101");
    assert_eq!(cfg.name, "r1");
    assert_eq!(cfg.ring, 8);
    assert_eq!(cfg.tick_ms, 10);
    assert_eq!(cfg.produce_while_away, 7);
    assert_eq!(cfg.path, "/rpc");
    assert_eq!(cfg.owner_headers, ["x-a", "x-b"]);

    let Cli::Run(cfg) =
        parse_args(args("--listen=127.0.0.1:0 --name=r2 --state-dir=/tmp/y")).unwrap()
    else {
        panic!("expected a config");
    };
    assert_eq!(cfg.ring, 64);
    assert_eq!(cfg.tick_ms, 50);
    assert_eq!(cfg.path, "/mcp");
    assert_eq!(cfg.owner_headers, ["x-mcp-owner"]);
    assert!(!cfg.hand_over && !cfg.contiguity);

    let Cli::Run(cfg) = parse_args(args(
        "--listen 127.0.0.1:0 --name r2 --state-dir /tmp/y --hand-over --contiguity",
    ))
    .unwrap() else {
        panic!("expected a config");
    };
    assert!(cfg.hand_over && cfg.contiguity);
    assert!(parse_args(args(
        "--listen 127.0.0.1:0 --name r2 --state-dir /tmp/y --hand-over=yes"
    ))
    .is_err());

    assert!(matches!(parse_args(args("--help")), Ok(Cli::Help)));
    assert!(parse_args(args("--name r1 --state-dir /tmp/x")).is_err());
    assert!(parse_args(args("--listen nope --name r1 --state-dir /tmp/x")).is_err());
    assert!(parse_args(args(
        "--listen 127.0.0.1:1 --name r1 --state-dir /x --path /_naive/seen"
    ))
    .is_err());
    assert!(parse_args(args(
        "--listen 127.0.0.1:1 --name r1 --state-dir /x --bogus"
    ))
    .is_err());
}

/// `--id-pad`: every id is padded to the length asked, and a padded cursor still resumes.
#[tokio::test]
async fn id_pad_makes_long_ids_that_still_resume() {
    let dir = temp_dir("pad");
    let mut cfg = Config::new("r1", &dir);
    cfg.id_pad = 1500;
    let state = AppState::new(cfg).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_until(listener, state, async move {
        let _ = rx.await;
    }));
    let (_, sid) = initialize(addr, "2025-06-18").await;
    let r = ledger_append(addr, &sid, 1, "x", 3, &[]).await;
    let got = r.ids();
    assert_eq!(got.len(), 4);
    for (n, id) in got.iter().enumerate() {
        assert_eq!(id.len(), 1500);
        assert!(id.starts_with(&format!("e{}.", n + 1)), "{}", &id[..8]);
    }
    let r = http(
        addr,
        "GET",
        "/mcp?limit=1",
        &[("Mcp-Session-Id", &sid), ("Last-Event-ID", &got[1])],
        None,
    )
    .await;
    let resumed = r.ids();
    assert_eq!(resumed[..2], got[2..]);
    assert!(resumed[2].starts_with("e5."));
    let _ = stop.send(());
    let _ = task.await;

    let args = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let Cli::Run(cfg) = parse_args(args(
        "--listen 127.0.0.1:1 --name r1 --state-dir /x --id-pad 64",
    ))
    .unwrap() else {
        panic!("expected a config");
    };
    assert_eq!(cfg.id_pad, 64);
    assert!(parse_args(args(
        "--listen 127.0.0.1:1 --name r1 --state-dir /x --id-pad big"
    ))
    .is_err());
}
