//! The *floor* bench fixture: a Rust proxy-wasm HTTP filter that does nothing.
//!
//! Envoy still enters the VM for every header and body callback, so the difference between
//! this filter and bare Envoy is the proxy-wasm tax, and the difference between the guard and
//! this filter is the guard's own cost.
//!
//! For experiments only, `FLOOR_MODE` at build time makes it touch response bodies the way a
//! rewriting filter must: `get` (copy each chunk into the VM) or `getset` (and write it back).
//! Flags that cost out the host calls a guard makes per request, for the same experiments:
//! `hdr` (read the request and response header maps), `prop` (read `upstream.address`), `time`
//! (read the clock), comma-separated with the modes above (`getset,hdr`).
//! The default build, the floor, does none of these.
//!
//! The `getset` build is the bench's *copy* fixture, which writes back as many bytes as the guard
//! does: the guard rewrites ids into longer cursors, so the request header `x-bench-pad-ppm`
//! (extra bytes per million body bytes, measured by bench/run.py from the guard's output) adds
//! that many bytes, as an SSE comment line (`:xxx…\n`) after a chunk that ends a line.
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

const MODE: &str = match option_env!("FLOOR_MODE") {
    Some(m) => m,
    None => "",
};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(FloorRoot) });
}}

struct FloorRoot;

impl Context for FloorRoot {}

impl RootContext for FloorRoot {
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Pass {
            pad_ppm: 0,
            owed: 0,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Pass {
    /// Extra bytes per million body bytes (`x-bench-pad-ppm`, copy fixture only).
    pad_ppm: u64,
    /// Pad owed, in millionths of a byte.
    owed: u64,
}

impl Context for Pass {}

fn flag(f: &str) -> bool {
    MODE.split(',').any(|m| m == f)
}

impl HttpContext for Pass {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        if flag("getset") {
            if let Ok(Some(v)) = proxy_wasm::hostcalls::get_map_value(
                proxy_wasm::types::MapType::HttpRequestHeaders,
                "x-bench-pad-ppm",
            ) {
                self.pad_ppm = v.parse().unwrap_or(0);
            }
        }
        if flag("hdr") {
            let _ = proxy_wasm::hostcalls::get_map_bytes(
                proxy_wasm::types::MapType::HttpRequestHeaders,
            );
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        if flag("hdr") {
            let _ = proxy_wasm::hostcalls::get_map_bytes(
                proxy_wasm::types::MapType::HttpResponseHeaders,
            );
        }
        if flag("prop") {
            let _ = proxy_wasm::hostcalls::get_property(vec!["upstream", "address"]);
        }
        if flag("time") {
            let _ = proxy_wasm::hostcalls::get_current_time();
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, _end_of_stream: bool) -> Action {
        if !(flag("get") || flag("getset")) {
            return Action::Continue;
        }
        let body = proxy_wasm::hostcalls::get_buffer(
            proxy_wasm::types::BufferType::HttpResponseBody,
            0,
            size,
        );
        if flag("getset") {
            if let Ok(Some(mut b)) = body {
                let owed = self
                    .owed
                    .saturating_add((size as u64).saturating_mul(self.pad_ppm));
                let pad = pad_after(&b, owed);
                if pad > 0 {
                    push_pad(&mut b, pad);
                }
                self.owed = owed.saturating_sub((pad as u64).saturating_mul(1_000_000));
                let _ = proxy_wasm::hostcalls::set_buffer(
                    proxy_wasm::types::BufferType::HttpResponseBody,
                    0,
                    size,
                    &b,
                );
            }
        }
        Action::Continue
    }
}

/// The pad the copy fixture adds after `chunk`: whole bytes owed, written only when `chunk` ends
/// a line (so the comment line starts at a line start) and at least 2 (`:` and `\n`).
fn pad_after(chunk: &[u8], owed: u64) -> usize {
    let whole = usize::try_from(owed / 1_000_000).unwrap_or(usize::MAX);
    if whole >= 2 && chunk.last() == Some(&b'\n') {
        whole
    } else {
        0
    }
}

/// The pad bytes: an SSE comment line of `n` bytes (`n` ≥ 2).
fn push_pad(out: &mut Vec<u8>, n: usize) {
    out.push(b':');
    out.resize(out.len() + n.saturating_sub(2), b'x');
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_whole_bytes_as_a_comment_line_after_a_line_end() {
        assert_eq!(pad_after(b"id: 1\n\n", 36_500_000), 36);
        assert_eq!(pad_after(b"data: x", 36_500_000), 0);
        assert_eq!(pad_after(b"\n", 1_999_999), 0);
        let mut out = b"id: 1\ndata: x\n\n".to_vec();
        push_pad(&mut out, 4);
        assert_eq!(out, b"id: 1\ndata: x\n\n:xx\n");
    }
}
