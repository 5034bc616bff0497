//! Shared pieces of the bench binaries: a minimal HTTP/1.1 reader and writer (enough for the
//! fixtures, not a general server), chunked-body decoding, and `/proc` readers.
use std::io;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;

/// One request as the fixtures need it.
#[derive(Debug, Default)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A query parameter of the path, parsed as a number.
    pub fn query_num(&self, name: &str) -> Option<u64> {
        let (_, q) = self.path.split_once('?')?;
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.parse().ok())
    }
}

/// Reads one request (head and `content-length` body); `None` at a clean end of connection.
pub async fn read_request(r: &mut BufReader<OwnedReadHalf>) -> io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let mut req = Request {
        method: parts.next().unwrap_or_default().to_string(),
        path: parts.next().unwrap_or_default().to_string(),
        ..Request::default()
    };
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            req.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = req
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    req.body = vec![0; len];
    r.read_exact(&mut req.body).await?;
    Ok(Some(req))
}

/// Incremental `transfer-encoding: chunked` decoder that hands out payload slices.
#[derive(Debug, Default)]
pub struct Dechunker {
    /// Payload bytes left in the current chunk.
    left: usize,
    /// Reading the size line (hex digits and extensions up to LF).
    in_size: bool,
    size: usize,
    /// CRLF after a chunk's payload still to skip.
    skip: usize,
    pub done: bool,
}

impl Dechunker {
    pub fn new() -> Self {
        Dechunker {
            in_size: true,
            ..Dechunker::default()
        }
    }

    /// Feeds raw body bytes; calls `payload` with each decoded slice.
    pub fn feed(&mut self, mut buf: &[u8], payload: &mut dyn FnMut(&[u8])) {
        while !buf.is_empty() && !self.done {
            if self.skip > 0 {
                let n = self.skip.min(buf.len());
                self.skip -= n;
                buf = buf.get(n..).unwrap_or_default();
                continue;
            }
            if self.left > 0 {
                let n = self.left.min(buf.len());
                payload(buf.get(..n).unwrap_or_default());
                self.left -= n;
                buf = buf.get(n..).unwrap_or_default();
                if self.left == 0 {
                    self.skip = 2;
                    self.in_size = true;
                    self.size = 0;
                }
                continue;
            }
            // Size line.
            let Some((&b, rest)) = buf.split_first() else {
                break;
            };
            buf = rest;
            match b {
                b'0'..=b'9' => self.size = self.size * 16 + usize::from(b - b'0'),
                b'a'..=b'f' => self.size = self.size * 16 + usize::from(b - b'a' + 10),
                b'A'..=b'F' => self.size = self.size * 16 + usize::from(b - b'A' + 10),
                b'\n' => {
                    self.in_size = false;
                    if self.size == 0 {
                        self.done = true;
                    } else {
                        self.left = self.size;
                    }
                }
                _ => {}
            }
        }
    }
}

/// Counts SSE event terminators ("\n\n") across arbitrary splits.
#[derive(Debug, Default)]
pub struct EventCounter {
    last_lf: bool,
    pub events: u64,
    pub bytes: u64,
}

impl EventCounter {
    pub fn feed(&mut self, s: &[u8]) {
        if s.is_empty() {
            return;
        }
        self.bytes += s.len() as u64;
        if self.last_lf && s.first() == Some(&b'\n') {
            self.events += 1;
        }
        self.events += memchr::memmem::find_iter(s, b"\n\n").count() as u64;
        self.last_lf = s.last() == Some(&b'\n');
    }
}

/// utime + stime of a process, in clock ticks (USER_HZ, 100 per second on Linux).
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let ut: u64 = f.get(11)?.parse().ok()?;
    let st: u64 = f.get(12)?.parse().ok()?;
    Some(ut + st)
}

/// Resident set size of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Percentile (0..=100) of sorted samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted.get(idx).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunk_and_count_across_splits() {
        let body = b"5\r\nid: 1\r\n6\r\n\ndata:\r\n3\r\n x\n\r\n1\r\n\n\r\n0\r\n\r\n";
        for cut in 0..body.len() {
            let mut d = Dechunker::new();
            let mut c = EventCounter::default();
            let mut out = Vec::new();
            for part in [&body[..cut], &body[cut..]] {
                d.feed(part, &mut |p| {
                    out.extend_from_slice(p);
                    c.feed(p);
                });
            }
            assert_eq!(out, b"id: 1\ndata: x\n\n");
            assert_eq!(c.events, 1);
            assert!(d.done);
        }
    }

    #[test]
    fn query_and_percentiles() {
        let r = Request {
            path: "/mcp?size=1024&rate=1000".into(),
            ..Request::default()
        };
        assert_eq!(r.query_num("size"), Some(1024));
        assert_eq!(r.query_num("count"), None);
        assert_eq!(percentile(&[1, 2, 3, 4, 5], 50.0), 3);
        assert!(cpu_ticks(std::process::id()).is_some());
        assert!(rss_bytes(std::process::id()).is_some());
    }
}
