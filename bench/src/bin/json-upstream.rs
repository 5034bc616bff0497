//! json-upstream: a minimal MCP-shaped replica for B1 and B3.
//!
//! * POST → `200 application/json` with a small JSON-RPC result. Without `mcp-session-id`
//!   in the request (an `initialize`), it answers with a new `mcp-session-id`.
//! * GET → `200 text/event-stream`, chunked (as SSE replicas send; a `content-length` would be
//!   removed by the guard alone, and the configurations would not do the same work): a priming event
//!   (`id: <n>` + empty data, as the MCP SDKs send) unless `?prime=0`, then the response ends.
//!   A GET with `last-event-id` (a resumption) or `?prime=0` gets a single comment.
//!
//! Usage: `json-upstream --listen 127.0.0.1:14101`
use mcp_bench::read_request;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

const JSON: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#;

fn main() -> std::io::Result<()> {
    let listen = std::env::args()
        .skip_while(|a| a != "--listen")
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:14101".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let l = TcpListener::bind(&listen).await?;
        let next = Arc::new(AtomicU64::new(1));
        loop {
            let (sock, _) = l.accept().await?;
            let _ = sock.set_nodelay(true);
            let next = next.clone();
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut r = BufReader::new(r);
                let mut out = Vec::with_capacity(512);
                while let Ok(Some(req)) = read_request(&mut r).await {
                    out.clear();
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if req.method == "GET" {
                        let body = if req.header("last-event-id").is_some()
                            || req.query_num("prime") == Some(0)
                        {
                            ": ok\n\n".to_string()
                        } else {
                            format!("id: {n}\ndata:\n\n")
                        };
                        out.extend_from_slice(
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                                body.len()
                            )
                            .as_bytes(),
                        );
                    } else {
                        let sid = if req.header("mcp-session-id").is_none() {
                            format!("mcp-session-id: bench-{n}\r\n")
                        } else {
                            String::new()
                        };
                        out.extend_from_slice(
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{sid}content-length: {}\r\n\r\n{JSON}",
                                JSON.len()
                            )
                            .as_bytes(),
                        );
                    }
                    if w.write_all(&out).await.is_err() {
                        break;
                    }
                }
            });
        }
    })
}
