//! sse-load: the bench's load generator. Prints one JSON object per run on stdout.
//!
//! ```text
//! sse-load streams   --addr A --path P --conns N --secs T [--header k:v]... [--pid ENVOY] [--window-ms W]
//!                    [--open-secs O]
//! sse-load rate      --addr A --path P --rps R --secs T [--conns K] [--header k:v]... [--pid ENVOY]
//! sse-load ownership --addr A --from I --to J --secs T [--conns C] [--pid OWNERSHIP]
//! ```
//! * `streams`: N concurrent SSE GETs read for T seconds; counts events ("\n\n" after chunked
//!   decoding). With `--pid`, the process's CPU ticks are read once every stream is open and
//!   at the end, and every `--window-ms` (events and ticks per window: cost vs stream length).
//!   Streams get `--open-secs` (default 10) to open before the measurement starts.
//! * `rate`: requests (`--method`, default GET; `--body` for a JSON body) at a fixed rate over K
//!   keep-alive connections; latency of each full response.
//! * `ownership`: loads sessions I..J into the ownership service (session, one GET incarnation
//!   with one event each), then asks `/v1/resume` for random loaded sessions from C connections
//!   in a closed loop for T seconds: decisions per second and latency.
use mcp_bench::{cpu_ticks, percentile, rss_bytes, Dechunker, EventCounter};
use mcp_resume_core::cursor::{incarnation_hex, session_key};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Args {
    map: HashMap<String, String>,
    headers: Vec<String>,
}

impl Args {
    fn parse(it: impl Iterator<Item = String>) -> Args {
        let mut map = HashMap::new();
        let mut headers = Vec::new();
        let mut it = it.peekable();
        while let Some(k) = it.next() {
            let v = it.next().unwrap_or_default();
            if k == "--header" {
                headers.push(v);
            } else {
                map.insert(k.trim_start_matches('-').to_string(), v);
            }
        }
        Args { map, headers }
    }
    fn s(&self, k: &str, d: &str) -> String {
        self.map.get(k).cloned().unwrap_or_else(|| d.to_string())
    }
    fn n(&self, k: &str, d: u64) -> u64 {
        self.map.get(k).and_then(|v| v.parse().ok()).unwrap_or(d)
    }
    fn f(&self, k: &str, d: f64) -> f64 {
        self.map.get(k).and_then(|v| v.parse().ok()).unwrap_or(d)
    }
    fn request(&self, method: &str, path: &str) -> Vec<u8> {
        let mut r = format!("{method} {path} HTTP/1.1\r\nhost: bench\r\naccept: text/event-stream, application/json\r\n");
        for h in &self.headers {
            if let Some((k, v)) = h.split_once(':') {
                r.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        let body = self.s("body", "");
        if !body.is_empty() {
            r.push_str(&format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            ));
        }
        r.push_str("\r\n");
        r.push_str(&body);
        r.into_bytes()
    }
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let cmd = argv.next().unwrap_or_default();
    let args = Args::parse(argv);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            std::process::exit(2);
        }
    };
    let out = rt.block_on(async {
        match cmd.as_str() {
            "streams" => streams(&args).await,
            "rate" => rate(&args).await,
            "ownership" => ownership(&args).await,
            _ => Err("usage: sse-load streams|rate|ownership ...".to_string()),
        }
    });
    match out {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("sse-load {cmd}: {e}");
            std::process::exit(1);
        }
    }
}

/// Reads a response head; returns (status, content-length, chunked, leftover body bytes).
async fn read_head(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<(u16, Option<usize>, bool, Vec<u8>), String> {
    buf.clear();
    let mut tmp = [0u8; 16384];
    loop {
        if let Some(p) = memchr::memmem::find(buf, b"\r\n\r\n") {
            let head =
                String::from_utf8_lossy(buf.get(..p).unwrap_or_default()).to_ascii_lowercase();
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let mut len = None;
            let mut chunked = false;
            for l in head.lines() {
                if let Some(v) = l.strip_prefix("content-length:") {
                    len = v.trim().parse().ok();
                }
                if l.starts_with("transfer-encoding:") && l.contains("chunked") {
                    chunked = true;
                }
            }
            let rest = buf.get(p + 4..).unwrap_or_default().to_vec();
            return Ok((status, len, chunked, rest));
        }
        let n = s.read(&mut tmp).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed before response head".into());
        }
        buf.extend_from_slice(tmp.get(..n).unwrap_or_default());
    }
}

async fn streams(a: &Args) -> Result<String, String> {
    let addr = a.s("addr", "127.0.0.1:14030");
    let path = a.s("path", "/mcp?size=1024&rate=1000");
    let conns = a.n("conns", 20);
    let secs = a.f("secs", 3.0);
    let pid = a.n("pid", 0) as u32;
    let window = Duration::from_millis(a.n("window-ms", 0));
    let open_for = Duration::from_secs_f64(a.f("open-secs", 10.0));
    let events = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let open = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..conns {
        let (events, bytes, open, stop) =
            (events.clone(), bytes.clone(), open.clone(), stop.clone());
        let mut req = a.request("GET", &path);
        // Every stream its own session, as MCP clients are.
        let sid = format!("mcp-session-id: bench-stream-{i}\r\n\r\n");
        req.truncate(req.len() - 2);
        req.extend_from_slice(sid.as_bytes());
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            s.write_all(&req).await.map_err(|e| e.to_string())?;
            let mut buf = Vec::new();
            let (status, _, chunked, rest) = read_head(&mut s, &mut buf).await?;
            if status != 200 {
                return Err(format!("status {status}"));
            }
            open.fetch_add(1, Ordering::SeqCst);
            let mut d = Dechunker::new();
            let mut c = EventCounter::default();
            let feed = |raw: &[u8], d: &mut Dechunker, c: &mut EventCounter| {
                let before = c.events;
                let bb = c.bytes;
                if chunked {
                    d.feed(raw, &mut |p| c.feed(p));
                } else {
                    c.feed(raw);
                }
                events.fetch_add(c.events - before, Ordering::Relaxed);
                bytes.fetch_add(c.bytes - bb, Ordering::Relaxed);
            };
            feed(&rest, &mut d, &mut c);
            let mut tmp = vec![0u8; 256 * 1024];
            while !stop.load(Ordering::Relaxed) && !d.done {
                let n = s.read(&mut tmp).await.map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                feed(tmp.get(..n).unwrap_or_default(), &mut d, &mut c);
            }
            Ok::<(), String>(())
        }));
    }
    // Wait (bounded) until every stream has its headers.
    let t0 = Instant::now();
    while open.load(Ordering::SeqCst) < conns && t0.elapsed() < open_for {
        if tasks.iter().any(|t| t.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let e0 = events.load(Ordering::Relaxed);
    let b0 = bytes.load(Ordering::Relaxed);
    let c0 = cpu_ticks(pid).unwrap_or(0);
    let start = Instant::now();
    let mut windows = Vec::new();
    if window.is_zero() {
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    } else {
        let (mut le, mut lc) = (e0, c0);
        while start.elapsed().as_secs_f64() < secs {
            tokio::time::sleep(window).await;
            let (e, c) = (events.load(Ordering::Relaxed), cpu_ticks(pid).unwrap_or(0));
            windows.push(serde_json::json!({"events": e - le, "ticks": c - lc}));
            (le, lc) = (e, c);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let e1 = events.load(Ordering::Relaxed);
    let b1 = bytes.load(Ordering::Relaxed);
    let c1 = cpu_ticks(pid).unwrap_or(0);
    let rss = rss_bytes(pid).unwrap_or(0);
    stop.store(true, Ordering::Relaxed);
    let mut errors = Vec::new();
    for t in tasks {
        t.abort();
        if let Ok(Ok(Err(e))) = tokio::time::timeout(Duration::from_millis(50), t).await {
            errors.push(e);
        }
    }
    Ok(serde_json::json!({
        "events": e1 - e0, "bytes": b1 - b0, "secs": elapsed, "ticks": c1 - c0,
        "opened": open.load(Ordering::SeqCst), "conns": conns, "rss_end": rss,
        "windows": windows, "errors": errors,
    })
    .to_string())
}

/// Reads one full response (content-length or chunked); returns its status.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<u16, String> {
    let (status, len, chunked, rest) = read_head(s, buf).await?;
    let mut tmp = [0u8; 16384];
    if chunked {
        let mut d = Dechunker::new();
        d.feed(&rest, &mut |_| {});
        while !d.done {
            let n = s.read(&mut tmp).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("closed mid-body".into());
            }
            d.feed(tmp.get(..n).unwrap_or_default(), &mut |_| {});
        }
    } else {
        let mut have = rest.len();
        let want = len.unwrap_or(0);
        while have < want {
            let n = s.read(&mut tmp).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("closed mid-body".into());
            }
            have += n;
        }
    }
    Ok(status)
}

async fn rate(a: &Args) -> Result<String, String> {
    let addr = a.s("addr", "127.0.0.1:14030");
    let path = a.s("path", "/mcp");
    let rps = a.f("rps", 500.0);
    let secs = a.f("secs", 3.0);
    let conns = a.n("conns", 4).max(1);
    let pid = a.n("pid", 0) as u32;
    let req = Arc::new(a.request(&a.s("method", "GET"), &path));
    let total = (rps * secs) as u64;
    let start = Instant::now() + Duration::from_millis(20);
    let c0 = cpu_ticks(pid).unwrap_or(0);
    let mut tasks = Vec::new();
    for k in 0..conns {
        let (req, addr) = (req.clone(), addr.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut statuses: HashMap<u16, u64> = HashMap::new();
            let mut errors = 0u64;
            let mut s: Option<TcpStream> = None;
            let mut buf = Vec::new();
            let mut j = k;
            while j < total {
                let at = start + Duration::from_secs_f64(j as f64 / rps);
                tokio::time::sleep_until(at.into()).await;
                if s.is_none() {
                    s = TcpStream::connect(&addr).await.ok();
                    if let Some(s) = &s {
                        let _ = s.set_nodelay(true);
                    }
                }
                let t = Instant::now();
                let r = match s.as_mut() {
                    Some(sock) => match sock.write_all(&req).await {
                        Ok(()) => read_response(sock, &mut buf).await,
                        Err(e) => Err(e.to_string()),
                    },
                    None => Err("connect".into()),
                };
                match r {
                    Ok(st) => {
                        lat.push(t.elapsed().as_micros() as u64);
                        *statuses.entry(st).or_default() += 1;
                    }
                    Err(_) => {
                        errors += 1;
                        s = None;
                    }
                }
                j += conns;
            }
            (lat, statuses, errors)
        }));
    }
    let mut lat = Vec::new();
    let mut statuses: HashMap<String, u64> = HashMap::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, st, e)) = t.await {
            lat.extend(l);
            for (k, v) in st {
                *statuses.entry(k.to_string()).or_default() += v;
            }
            errors += e;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let c1 = cpu_ticks(pid).unwrap_or(0);
    lat.sort_unstable();
    Ok(serde_json::json!({
        "count": lat.len(), "errors": errors, "secs": elapsed, "ticks": c1 - c0,
        "p50_us": percentile(&lat, 50.0), "p90_us": percentile(&lat, 90.0),
        "p99_us": percentile(&lat, 99.0), "max_us": lat.last().copied().unwrap_or(0),
        "statuses": statuses,
    })
    .to_string())
}

async fn post(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    path: &str,
    body: &[u8],
) -> Result<u16, String> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: mcp-ownership\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut req = head.into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req).await.map_err(|e| e.to_string())?;
    read_response(s, buf).await
}

fn sid(i: u64) -> String {
    session_key(format!("bench-session-{i}").as_bytes())
}

fn inc(i: u64) -> String {
    incarnation_hex(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

async fn ownership(a: &Args) -> Result<String, String> {
    let addr = a.s("addr", "127.0.0.1:14200");
    let from = a.n("from", 0);
    let to = a.n("to", 1000);
    let secs = a.f("secs", 3.0);
    let conns = a.n("conns", 16).max(1);
    let pid = a.n("pid", 0) as u32;
    let mut s = TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    // Phase 1: sessions only; phase 2: one incarnation with one event per session.
    let rss0 = rss_bytes(pid).unwrap_or(0);
    let load_start = Instant::now();
    let phase = |i: u64, p: u8| -> serde_json::Value {
        if p == 1 {
            serde_json::json!({"type": "session_open", "session": sid(i), "version": "2025-06-18"})
        } else {
            serde_json::json!({"type": "stream_open", "session": sid(i), "incarnation": inc(i),
                "kind": "get", "owner": "127.0.0.1:14101", "retention": 64, "supersedes": true,
                "opened_ms": now_ms})
        }
    };
    let mut rss = [rss0, 0, 0];
    for p in [1u8, 2] {
        let mut i = from;
        while i < to {
            let end = (i + 500).min(to);
            let mut recs = Vec::new();
            for k in i..end {
                recs.push(phase(k, p));
                if p == 2 {
                    recs.push(serde_json::json!({"type": "events", "session": sid(k),
                        "incarnation": inc(k), "first_seq": 1, "ids": ["e1"]}));
                }
            }
            let body = serde_json::json!({ "records": recs }).to_string();
            let st = post(&mut s, &mut buf, "/v1/records", body.as_bytes()).await?;
            if st != 200 && st != 204 {
                return Err(format!("records: status {st}"));
            }
            i = end;
        }
        rss[usize::from(p)] = rss_bytes(pid).unwrap_or(0);
    }
    let load_secs = load_start.elapsed().as_secs_f64();
    // Decisions.
    let stop_at = Instant::now() + Duration::from_secs_f64(secs);
    let c0 = cpu_ticks(pid).unwrap_or(0);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..conns {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut outcomes: HashMap<String, u64> = HashMap::new();
            let mut errors = 0u64;
            let Ok(mut s) = TcpStream::connect(&addr).await else {
                return (lat, outcomes, 1);
            };
            let _ = s.set_nodelay(true);
            let mut buf = Vec::new();
            // xorshift over the loaded range.
            let mut x = 0x2545_F491_4F6C_DD1D_u64 ^ (k + 1);
            while Instant::now() < stop_at {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Any stored session, not only the ones loaded by this run.
                let i = x % to.max(1);
                let q = format!(
                    r#"{{"session":"{}","incarnation":"{}","kind":"get","seq":1}}"#,
                    sid(i),
                    inc(i)
                );
                let t = Instant::now();
                let head = format!(
                    "POST /v1/resume HTTP/1.1\r\nhost: mcp-ownership\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{q}",
                    q.len()
                );
                if s.write_all(head.as_bytes()).await.is_err() {
                    errors += 1;
                    break;
                }
                match read_verdict(&mut s, &mut buf).await {
                    Ok(v) => {
                        lat.push(t.elapsed().as_micros() as u64);
                        *outcomes.entry(v).or_default() += 1;
                    }
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
            (lat, outcomes, errors)
        }));
    }
    let mut lat = Vec::new();
    let mut outcomes: HashMap<String, u64> = HashMap::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, o, e)) = t.await {
            lat.extend(l);
            for (k, v) in o {
                *outcomes.entry(k).or_default() += v;
            }
            errors += e;
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let c1 = cpu_ticks(pid).unwrap_or(0);
    lat.sort_unstable();
    Ok(serde_json::json!({
        "sessions": to, "loaded": to - from, "load_secs": load_secs,
        "rss": rss, "count": lat.len(), "errors": errors, "secs": elapsed, "ticks": c1 - c0,
        "rate": lat.len() as f64 / elapsed,
        "p50_us": percentile(&lat, 50.0), "p99_us": percentile(&lat, 99.0),
        "outcomes": outcomes,
    })
    .to_string())
}

/// Reads a `/v1/resume` answer; returns "continue" or the reason.
async fn read_verdict(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<String, String> {
    let (status, len, _, mut rest) = read_head(s, buf).await?;
    let want = len.unwrap_or(0);
    let mut tmp = [0u8; 4096];
    while rest.len() < want {
        let n = s.read(&mut tmp).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed".into());
        }
        rest.extend_from_slice(tmp.get(..n).unwrap_or_default());
    }
    if status != 200 {
        return Ok(format!("http_{status}"));
    }
    let v: serde_json::Value = serde_json::from_slice(&rest).map_err(|e| e.to_string())?;
    Ok(match v.get("verdict").and_then(|v| v.as_str()) {
        Some("continue") => "continue".into(),
        _ => v
            .get("reason")
            .and_then(|r| r.as_str())
            .unwrap_or("other")
            .to_string(),
    })
}
