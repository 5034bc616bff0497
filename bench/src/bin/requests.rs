//! requests: the guard's per-request work for B1's GET → SSE (one priming event) on the native
//! target, through the core's exchange over the mock host, for profiling
//! (`valgrind --tool=callgrind target/.../requests 20000`).
//!
//! Usage: `requests [REQUESTS] [FLUSH_EVERY]`: each request is a GET with a session, answered 200
//! `text/event-stream` with one event; records flush (answered 200) every FLUSH_EVERY requests
//! (default 70: wrk's ~7 000 streams/s at the 10 ms flush).
use mcp_resume_core::config::Config;
use mcp_resume_core::exchange::{Exchange, Worker};
use mcp_resume_core::host::{Effect, MockHost};
use std::time::Instant;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let requests = args.first().copied().unwrap_or(20_000);
    let flush_every = args.get(1).copied().unwrap_or(70).max(1);
    let cfg = match Config::from_json(
        br#"{"ownership":{"cluster":"c"},"keys":[{"id":1,"secret":"17Vjr1MOFuUicxThufiY1oswS2eQj+6Y1DdNdURfwT0=","active":true}]}"#,
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut w = Worker::new(cfg);
    let mut host = MockHost::new();
    let req: Vec<(&str, &[u8])> = vec![
        (":method", b"GET"),
        (":path", b"/mcp"),
        (":authority", b"127.0.0.1:10000"),
        ("accept", b"text/event-stream"),
        ("mcp-session-id", b"bench-session"),
        ("mcp-protocol-version", b"2025-06-18"),
    ];
    let resp: Vec<(&str, &[u8])> = vec![
        (":status", b"200"),
        ("content-type", b"text/event-stream"),
        ("cache-control", b"no-cache"),
        ("mcp-session-id", b"bench-session"),
    ];
    let event = b"id: 1\ndata: \n\n";
    let mut bytes = 0usize;
    let t = Instant::now();
    for n in 0..requests {
        let mut ex = Exchange::new();
        ex.on_request_headers(&mut w, &mut host, Some(&req));
        ex.on_response_headers(&mut w, &mut host, Some(&resp), false);
        ex.on_response_body(&mut w, &mut host, Some(event), false);
        ex.on_response_body(&mut w, &mut host, Some(b""), true);
        if (n + 1) % flush_every == 0 {
            w.on_tick(&mut host);
            let token = host.next_token.wrapping_sub(1);
            w.on_records_response(&mut host, token, Some(200), Some(b"{}"));
        }
        for e in host.take() {
            if let Effect::BodyChunk(b) = e {
                bytes += b.len();
            }
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / requests as f64;
    println!("{{\"requests\":{requests},\"ns_per_request\":{ns:.1},\"body_bytes\":{bytes}}}");
}
