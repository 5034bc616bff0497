//! sse-upstream: an SSE replica for B2. Every GET opens a chunked `text/event-stream` of
//! events `id: <n>\ndata: <payload>\n\n`, each about `size` bytes in total.
//!
//! Query: `size` (bytes per event, default 1024), `rate` (events per second per stream;
//! 0 = as fast as the connection takes them), `count` (events, then the stream ends; 0 = until
//! the client leaves). Paced streams write one chunk per tick with the events due by then.
//!
//! Usage: `sse-upstream --listen 127.0.0.1:14102`
use mcp_bench::read_request;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpListener;

/// Bulk streams write chunks of about this size.
const BULK_CHUNK: usize = 64 * 1024;

fn main() -> std::io::Result<()> {
    let listen = std::env::args()
        .skip_while(|a| a != "--listen")
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:14102".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let l = TcpListener::bind(&listen).await?;
        loop {
            let (sock, _) = l.accept().await?;
            let _ = sock.set_nodelay(true);
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut r = BufReader::new(r);
                if let Ok(Some(req)) = read_request(&mut r).await {
                    let size = req.query_num("size").unwrap_or(1024) as usize;
                    let rate = req.query_num("rate").unwrap_or(0);
                    let count = req.query_num("count").unwrap_or(0);
                    let _ = stream(&mut w, size, rate, count).await;
                }
            });
        }
    })
}

struct Events {
    payload: Vec<u8>,
    next: u64,
}

impl Events {
    fn new(size: usize) -> Self {
        // "id: NNNNNNN\ndata: " + payload + "\n\n" ≈ size bytes.
        let payload = vec![b'x'; size.saturating_sub(22).max(1)];
        Events { payload, next: 1 }
    }
    fn push(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("id: {}\ndata: ", self.next).as_bytes());
        out.extend_from_slice(&self.payload);
        out.extend_from_slice(b"\n\n");
        self.next += 1;
    }
}

async fn write_chunk(
    w: &mut OwnedWriteHalf,
    body: &[u8],
    frame: &mut Vec<u8>,
) -> std::io::Result<()> {
    frame.clear();
    frame.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
    frame.extend_from_slice(body);
    frame.extend_from_slice(b"\r\n");
    w.write_all(frame).await
}

async fn stream(w: &mut OwnedWriteHalf, size: usize, rate: u64, count: u64) -> std::io::Result<()> {
    w.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
        .await?;
    let mut ev = Events::new(size);
    let mut body = Vec::with_capacity(BULK_CHUNK + size + 64);
    let mut frame = Vec::with_capacity(BULK_CHUNK + size + 64);
    let limit = if count == 0 { u64::MAX } else { count };
    let mut sent = 0u64;
    if let Some(us) = 1_000_000u64.checked_div(rate) {
        paced(w, &mut ev, &mut body, &mut frame, rate, us.max(1), limit).await?;
    } else {
        while sent < limit {
            body.clear();
            while sent < limit && (body.is_empty() || body.len() + size <= BULK_CHUNK) {
                ev.push(&mut body);
                sent += 1;
            }
            write_chunk(w, &body, &mut frame).await?;
        }
    }
    w.write_all(b"0\r\n\r\n").await
}

async fn paced(
    w: &mut OwnedWriteHalf,
    ev: &mut Events,
    body: &mut Vec<u8>,
    frame: &mut Vec<u8>,
    rate: u64,
    period_us: u64,
    limit: u64,
) -> std::io::Result<()> {
    let mut sent = 0u64;
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_micros(period_us));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while sent < limit {
        tick.tick().await;
        let due = (start.elapsed().as_micros() as u64 * rate / 1_000_000 + 1).min(limit);
        if due <= sent {
            continue;
        }
        body.clear();
        while sent < due {
            ev.push(body);
            sent += 1;
        }
        write_chunk(w, body, frame).await?;
    }
    Ok(())
}
