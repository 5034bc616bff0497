//! What the test host holds: the streams as the proxy sees them, and everything the module asked
//! of the host (callouts, local replies, metrics, logs, the tick period).
use std::collections::HashMap;

/// Headers in the order the proxy keeps them; values are bytes, names lowercase.
pub type Headers = Vec<(String, Vec<u8>)>;

/// `(name, value)` pairs for test input.
pub fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec()))
        .collect()
}

/// The first value of `name`, as text.
pub fn header<'h>(h: &'h Headers, name: &str) -> Option<&'h str> {
    h.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// A local reply the module sent (`proxy_send_local_response`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub details: String,
    pub headers: Headers,
    pub body: Vec<u8>,
}

/// A callout the module dispatched (`proxy_http_call`), from the stream or root context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callout {
    pub token: u32,
    /// The context that was effective when it was dispatched.
    pub context: u32,
    pub cluster: String,
    pub headers: Headers,
    pub body: Vec<u8>,
    pub timeout_ms: u32,
}

/// One HTTP stream as the proxy sees it.
#[derive(Debug, Default)]
pub struct Stream {
    /// Request headers: what the module saw, then (after its changes) what goes upstream.
    pub request_headers: Headers,
    /// Response headers: what the replica sent, then what reaches the client.
    pub response_headers: Headers,
    /// The request body chunk(s) the current hook may read.
    pub request_body: Vec<u8>,
    /// The response body chunk(s) the current hook may read and replace.
    pub response_body: Vec<u8>,
    /// Every request body byte that went upstream.
    pub upstream_body: Vec<u8>,
    /// Every response body byte that reached the client.
    pub client_body: Vec<u8>,
    /// Properties by dotted path (`upstream.address`, `response.code_details`).
    pub properties: HashMap<String, Vec<u8>>,
    /// Local replies the module sent, in order.
    pub local_replies: Vec<LocalReply>,
    /// `proxy_continue_stream` calls (0: request, 1: response).
    pub continued: Vec<u32>,
    /// `proxy_close_stream` calls (0: request, 1: response).
    pub closed: Vec<u32>,
    /// `proxy_get_buffer_bytes` reads of the request body.
    pub request_body_reads: u32,
    /// The response's end is held: its last body hook answered Pause at the end of stream, so
    /// `response_body` waits for `proxy_continue_stream` (or `proxy_close_stream`).
    pub held: bool,
    /// The response headers hook answered Pause: Envoy's proxy-wasm host makes that
    /// StopAllIterationAndWatermark, so body chunks are buffered without a body hook.
    pub headers_stopped_all: bool,
}

/// A metric defined by the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    pub name: String,
    /// 0 counter, 1 gauge, 2 histogram.
    pub kind: u32,
    pub value: i64,
    pub samples: Vec<u64>,
}

/// The host's state, reachable from every host call.
#[derive(Debug, Default)]
pub struct HostState {
    pub plugin_config: Vec<u8>,
    pub streams: HashMap<u32, Stream>,
    /// The context host calls act on (set before each hook, and by `proxy_set_effective_context`).
    pub effective: u32,
    pub root_context: u32,
    pub callouts: Vec<Callout>,
    pub next_token: u32,
    /// The callout answer being delivered: headers and body.
    pub call_response: Option<(Headers, Vec<u8>)>,
    pub metrics: Vec<Metric>,
    pub logs: Vec<(u32, String)>,
    pub tick_ms: Option<u32>,
    pub now_ns: u64,
    pub random_state: u64,
    /// What the module wrote to stdout or stderr.
    pub output: Vec<u8>,
    /// Host calls the module made, by import name.
    pub calls: HashMap<&'static str, u32>,
    /// `proxy_on_memory_allocate` calls the host made (to hand the module bytes).
    pub allocations: u32,
}

impl HostState {
    /// Counts one call of import `name`.
    pub fn hit(&mut self, name: &'static str) {
        *self.calls.entry(name).or_default() += 1;
    }

    /// Host calls made since the counts were last cleared, in all.
    pub fn host_calls(&self) -> u32 {
        self.calls.values().sum()
    }

    /// Clears the call and allocation counts.
    pub fn clear_counts(&mut self) {
        self.calls.clear();
        self.allocations = 0;
    }

    /// A counter's (or gauge's) value by its full name; `None` when never defined.
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.metrics
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    /// Log lines at `level` or above (3: warn).
    pub fn logs_at_least(&self, level: u32) -> Vec<&str> {
        self.logs
            .iter()
            .filter(|(l, _)| *l >= level)
            .map(|(_, m)| m.as_str())
            .collect()
    }
}
