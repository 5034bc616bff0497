//! The proxy-wasm implementation of the core's [`Host`]: every call goes to the proxy-wasm ABI
//! and never panics (the trait helpers of the proxy-wasm crate unwrap); failures are logged.
use mcp_resume_core::host::{clock_random, metric_name, Host, LogLevel, Stat, CALLOUT_MS};
use proxy_wasm::hostcalls as hc;
use proxy_wasm::types::{BufferType, MapType, MetricType, Status};
use std::time::{Duration, UNIX_EPOCH};

fn level(l: LogLevel) -> proxy_wasm::types::LogLevel {
    use proxy_wasm::types::LogLevel as P;
    match l {
        LogLevel::Info => P::Info,
        LogLevel::Warn => P::Warn,
        LogLevel::Error => P::Error,
        LogLevel::Critical => P::Critical,
    }
}

pub fn log(l: LogLevel, msg: &str) {
    let _ = hc::log(level(l), msg);
}

fn warn(what: &str, status: Status) {
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

/// All headers of a map in one host call. Values stay bytes: a value that is not UTF-8 must
/// not panic the VM. `None` when the host could not give them.
pub fn header_map(map: MapType) -> Option<Vec<(String, Vec<u8>)>> {
    match hc::get_map_bytes(map) {
        Ok(h) => Some(h),
        Err(s) => {
            warn("get header map", s);
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

pub fn response_body(size: usize) -> Option<Vec<u8>> {
    body(BufferType::HttpResponseBody, size)
}

pub fn request_body(size: usize) -> Option<Vec<u8>> {
    body(BufferType::HttpRequestBody, size)
}

/// This callback's body chunk; `None` when the host refused it.
fn body(which: BufferType, size: usize) -> Option<Vec<u8>> {
    // An empty chunk (often the last) needs no host call.
    if size == 0 {
        return Some(Vec::new());
    }
    match hc::get_buffer(which, 0, size) {
        Ok(b) => Some(b.unwrap_or_default()),
        Err(s) => {
            warn("get body", s);
            None
        }
    }
}

fn property(path: Vec<&str>) -> Option<String> {
    hc::get_property(path)
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}

/// Metric ids, one per [`Stat`] in [`Stat::all`] order; 0 where the host refused to define one
/// (then updates are no-ops).
pub struct Metrics {
    counters: Vec<u32>,
    callout_ms: u32,
}

fn define(kind: MetricType, name: &str) -> u32 {
    match hc::define_metric(kind, &metric_name(name)) {
        Ok(id) => id,
        Err(_) => {
            log(LogLevel::Warn, &format!("cannot define metric {name}"));
            0
        }
    }
}

impl Metrics {
    pub fn define() -> Metrics {
        Metrics {
            counters: Stat::all()
                .into_iter()
                .map(|s| define(MetricType::Counter, &s.name()))
                .collect(),
            callout_ms: define(MetricType::Histogram, CALLOUT_MS),
        }
    }
}

/// The host as seen from one callback. `body_size` is the size of the body chunk being handled,
/// `received` that chunk as read (`None` outside a body callback or when it could not be read).
pub struct ProxyHost<'m> {
    pub metrics: &'m Metrics,
    pub body_size: usize,
    pub received: Option<&'m [u8]>,
}

impl<'m> ProxyHost<'m> {
    /// The host outside a response body callback.
    pub fn new(metrics: &'m Metrics) -> Self {
        ProxyHost {
            metrics,
            body_size: 0,
            received: None,
        }
    }
}

impl Host for ProxyHost<'_> {
    fn now_ms(&self) -> u64 {
        hc::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    /// WASI `random_get` works in Envoy's V8; fall back to the clock.
    fn random_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        match getrandom::fill(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => clock_random(self.now_ms()),
        }
    }

    fn upstream_address(&self) -> Option<String> {
        property(vec!["upstream", "address"])
    }

    fn response_code_details(&self) -> Option<String> {
        property(vec!["response", "code_details"])
    }

    fn set_request_header(&mut self, name: &str, value: &str) {
        if let Err(s) = hc::set_map_value(MapType::HttpRequestHeaders, name, Some(value)) {
            warn("set request header", s);
        }
    }

    fn remove_request_header(&mut self, name: &str) {
        if let Err(s) = hc::remove_map_value(MapType::HttpRequestHeaders, name) {
            warn("remove request header", s);
        }
    }

    fn set_response_header(&mut self, name: &str, value: &str) {
        if let Err(s) = hc::set_map_value(MapType::HttpResponseHeaders, name, Some(value)) {
            warn("set response header", s);
        }
    }

    fn remove_response_header(&mut self, name: &str) {
        if let Err(s) = hc::remove_map_value(MapType::HttpResponseHeaders, name) {
            warn("remove response header", s);
        }
    }

    fn send_local_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        if let Err(s) = hc::send_http_response(u32::from(status), headers.to_vec(), Some(body)) {
            warn("send_http_response", s);
        }
    }

    fn resume_request(&mut self) {
        if let Err(s) = hc::resume_http_request() {
            warn("resume_http_request", s);
        }
    }

    fn replace_body_chunk(&mut self, body: &[u8]) {
        // A chunk the exchange left as it came goes on without a write.
        if (body.is_empty() && self.body_size == 0) || self.received == Some(body) {
            return;
        }
        if let Err(s) = hc::set_buffer(BufferType::HttpResponseBody, 0, self.body_size, body) {
            warn("set response body", s);
        }
    }

    fn reset_response(&mut self) {
        if let Err(s) = hc::reset_http_response() {
            warn("reset_http_response", s);
        }
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u32> {
        let timeout = Duration::from_millis(timeout_ms);
        match hc::dispatch_http_call(cluster, headers.to_vec(), Some(body), vec![], timeout) {
            Ok(token) => Some(token),
            Err(s) => {
                warn("dispatch_http_call", s);
                None
            }
        }
    }

    /// Envoy holds the body of a response whose last body callback answered Pause
    /// (StopIterationAndBuffer) and, from an HTTP-call callback, hands that held body to
    /// `set_buffer`; a write that starts at or past its end appends (`Buffer::copyFrom`).
    /// `resume_http_response` then lets it go on with the end of stream.
    fn finish_held_response(&mut self, tail: &[u8]) {
        if !tail.is_empty() {
            if let Err(s) = hc::set_buffer(BufferType::HttpResponseBody, usize::MAX, 0, tail) {
                warn("append to the held response body", s);
            }
        }
        if let Err(s) = hc::resume_http_response() {
            warn("resume_http_response", s);
        }
    }

    /// proxy-wasm-cpp-host turns a headers pause (StopIteration) into
    /// StopAllIterationAndWatermark: no body callback until the filter resumes the response, so
    /// the exchange could never see the replay it would hold the headers for.
    fn holds_headers_with_body(&self) -> bool {
        false
    }

    fn count(&mut self, stat: Stat, n: u64) {
        let id = self
            .metrics
            .counters
            .get(stat.index())
            .copied()
            .unwrap_or(0);
        if id != 0 {
            let _ = hc::increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn observe_callout_ms(&mut self, ms: u64) {
        if self.metrics.callout_ms != 0 {
            let _ = hc::record_metric(self.metrics.callout_ms, ms);
        }
    }

    fn log(&mut self, l: LogLevel, msg: &str) {
        log(l, msg);
    }
}
