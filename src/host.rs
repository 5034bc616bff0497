//! Host calls that never panic: failures are logged and read as "absent".
use proxy_wasm::hostcalls as hc;
use proxy_wasm::types::{BufferType, LogLevel, MapType};
use std::time::{Duration, UNIX_EPOCH};

pub fn log(level: LogLevel, msg: &str) {
    let _ = hc::log(level, msg);
}

fn warn(what: &str, status: proxy_wasm::types::Status) {
    log(
        LogLevel::Warn,
        &format!("mcp-resume-guard: host call {what} failed: {status:?}"),
    );
}

pub fn plugin_configuration() -> Vec<u8> {
    hc::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
        .unwrap_or_default()
}

pub fn set_tick_period(p: Duration) {
    if let Err(s) = hc::set_tick_period(p) {
        warn("set_tick_period", s);
    }
}

pub fn now_ms() -> u64 {
    hc::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fresh incarnation id. WASI `random_get` works in Envoy's V8; fall back to the clock.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    match getrandom::fill(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => now_ms().rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15,
    }
}

/// All headers of a map in one host call (one allocation in the VM instead of one per value).
/// Values stay bytes: a header value that is not UTF-8 must not panic the VM.
pub struct Headers(Vec<(String, Vec<u8>)>);

impl Headers {
    /// The first value of `name` (lowercase, as Envoy keeps header names), lossily as UTF-8.
    pub fn get(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
    }
}

pub fn request_headers() -> Headers {
    Headers(
        hc::get_map_bytes(MapType::HttpRequestHeaders)
            .ok()
            .unwrap_or_default(),
    )
}

pub fn response_headers() -> Headers {
    Headers(
        hc::get_map_bytes(MapType::HttpResponseHeaders)
            .ok()
            .unwrap_or_default(),
    )
}

pub fn set_request_header(name: &str, value: &str) {
    if let Err(s) = hc::set_map_value(MapType::HttpRequestHeaders, name, Some(value)) {
        warn("set request header", s);
    }
}

pub fn set_response_header(name: &str, value: &str) {
    if let Err(s) = hc::set_map_value(MapType::HttpResponseHeaders, name, Some(value)) {
        warn("set response header", s);
    }
}

pub fn remove_request_header(name: &str) {
    if let Err(s) = hc::remove_map_value(MapType::HttpRequestHeaders, name) {
        warn("remove request header", s);
    }
}

pub fn remove_response_header(name: &str) {
    if let Err(s) = hc::remove_map_value(MapType::HttpResponseHeaders, name) {
        warn("remove response header", s);
    }
}

pub fn response_body(size: usize) -> Vec<u8> {
    hc::get_buffer(BufferType::HttpResponseBody, 0, size)
        .ok()
        .flatten()
        .unwrap_or_default()
}

pub fn set_response_body(size: usize, body: &[u8]) {
    if let Err(s) = hc::set_buffer(BufferType::HttpResponseBody, 0, size, body) {
        warn("set response body", s);
    }
}

pub fn send_response(status: u32, headers: &[(&str, &str)], body: &[u8]) {
    if let Err(s) = hc::send_http_response(status, headers.to_vec(), Some(body)) {
        warn("send_http_response", s);
    }
}

pub fn reset_response() {
    if let Err(s) = hc::reset_http_response() {
        warn("reset_http_response", s);
    }
}

pub fn resume_request() {
    if let Err(s) = hc::resume_http_request() {
        warn("resume_http_request", s);
    }
}

pub fn dispatch(
    cluster: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Option<u32> {
    match hc::dispatch_http_call(cluster, headers.to_vec(), Some(body), vec![], timeout) {
        Ok(token) => Some(token),
        Err(s) => {
            warn("dispatch_http_call", s);
            None
        }
    }
}

/// `:status` of the callout response being handled.
pub fn call_status() -> Option<u32> {
    hc::get_map_value(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| s.parse().ok())
}

pub fn call_body(size: usize) -> Option<Vec<u8>> {
    hc::get_buffer(BufferType::HttpCallResponseBody, 0, size)
        .ok()
        .flatten()
}

/// `ip:port` of the replica that served this request.
pub fn upstream_address() -> Option<String> {
    hc::get_property(vec!["upstream", "address"])
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}
