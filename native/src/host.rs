//! The dynamic-module implementations of the core's [`Host`]: one for a filter's stream (worker
//! thread), one for the configuration's record flush (main thread). Every call goes through the
//! C ABI in `abi` and never panics; failures are logged.
use crate::abi::{self, EnvoyBuffer, HttpFilterConfigEnvoyPtr, HttpFilterEnvoyPtr, HttpHeader};
use crate::abi::{ModuleBuffer, CALLOUT_INIT_SUCCESS, METRICS_SUCCESS};
use mcp_resume_core::host::{clock_random, metric_name, Host, LogLevel, Stat, CALLOUT_MS};
use std::time::{SystemTime, UNIX_EPOCH};

pub fn log(level: LogLevel, msg: &str) {
    let l = match level {
        LogLevel::Info => abi::LOG_INFO,
        LogLevel::Warn => abi::LOG_WARN,
        LogLevel::Error => abi::LOG_ERROR,
        LogLevel::Critical => abi::LOG_CRITICAL,
    };
    // SAFETY: the buffer is valid for the call.
    unsafe { abi::envoy_dynamic_module_callback_log(l, ModuleBuffer::of(msg.as_bytes())) }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    match getrandom::fill(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => clock_random(now_ms()),
    }
}

fn module_headers(h: &[(&str, &str)]) -> Vec<HttpHeader> {
    h.iter()
        .map(|(k, v)| HttpHeader::of(k.as_bytes(), v.as_bytes()))
        .collect()
}

/// The callout's token when Envoy started it; a refusal is logged and read as "no callout".
fn started(r: u32, what: &str, id: u64) -> Option<u32> {
    if r != CALLOUT_INIT_SUCCESS {
        log(
            LogLevel::Warn,
            &format!("mcp-resume-guard: host call {what} callout failed: {r}"),
        );
        return None;
    }
    token(id)
}

/// Callout ids are the exchange's tokens; Envoy numbers them from 1 per filter or config.
fn token(id: u64) -> Option<u32> {
    u32::try_from(id).ok()
}

/// Metric ids, one per [`Stat`] in [`Stat::all`] order, defined on the configuration with the
/// same names as the Wasm build (`mcp_resume_guard.<name>`); `None` where Envoy refused.
pub struct Metrics {
    counters: Vec<Option<usize>>,
    callout_ms: Option<usize>,
}

impl Metrics {
    /// Main thread, while Envoy still accepts new stats (during config creation).
    pub fn define(config: HttpFilterConfigEnvoyPtr) -> Metrics {
        let define = |name: String, histogram: bool| {
            let full = metric_name(&name);
            let mut id = 0usize;
            // SAFETY: `config` is the config being created; the buffers are valid for the call.
            let r = unsafe {
                let n = ModuleBuffer::of(full.as_bytes());
                if histogram {
                    abi::envoy_dynamic_module_callback_http_filter_config_define_histogram(
                        config,
                        n,
                        std::ptr::null_mut(),
                        0,
                        &mut id,
                    )
                } else {
                    abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                        config,
                        n,
                        std::ptr::null_mut(),
                        0,
                        &mut id,
                    )
                }
            };
            if r == METRICS_SUCCESS {
                Some(id)
            } else {
                log(LogLevel::Warn, &format!("cannot define metric {full}"));
                None
            }
        };
        Metrics {
            counters: Stat::all()
                .into_iter()
                .map(|s| define(s.name(), false))
                .collect(),
            callout_ms: define(CALLOUT_MS.to_string(), true),
        }
    }

    fn counter(&self, stat: Stat) -> Option<usize> {
        self.counters.get(stat.index()).copied().flatten()
    }

    fn count_on_config(&self, config: HttpFilterConfigEnvoyPtr, stat: Stat, n: u64) {
        if let Some(id) = self.counter(stat) {
            // SAFETY: `config` is alive while any of its filters or hooks run.
            unsafe {
                abi::envoy_dynamic_module_callback_http_filter_config_increment_counter(
                    config,
                    id,
                    std::ptr::null_mut(),
                    0,
                    n,
                );
            }
        }
    }
}

/// What a stream hook did that changes what it returns to Envoy.
#[derive(Default, Clone, Copy)]
pub struct Outcome {
    /// A local reply was sent: the stream belongs to it now.
    pub replied: bool,
    /// The stream was reset.
    pub reset: bool,
    /// `resume_request` was asked while the hook that paused is still running (the callout
    /// answered inline): the hook returns Continue instead of resuming later.
    pub resumed: bool,
    /// The held end of the response was let go (`finish_held_response`): from a callout's
    /// answer by `continue_encoding`, inside the body hook that held it by its return.
    pub released: bool,
    /// Envoy is done with the stream: no stream call may be made, stats go to the config.
    pub ended: bool,
}

/// The host as seen from one hook of one stream (worker thread).
pub struct FilterHost<'a> {
    pub filter: HttpFilterEnvoyPtr,
    pub config: HttpFilterConfigEnvoyPtr,
    pub metrics: &'a Metrics,
    /// Inside the hook that paused (request headers, response body): a callout answered
    /// inline resumes or finishes the stream by that hook's return, not by re-entering Envoy.
    pub inline: bool,
    pub out: Outcome,
    /// The response body chunk of the running body hook, as read (Envoy's until it is
    /// replaced): what replacing it drains, and what an unchanged chunk is compared with.
    pub received: Option<&'a [u8]>,
}

impl FilterHost<'_> {
    /// After a local reply or reset Envoy may already be tearing the stream down: stream calls
    /// stop, stats go through the configuration.
    fn stream_open(&self) -> bool {
        !self.out.replied && !self.out.reset && !self.out.released && !self.out.ended
    }

    /// Appends to body `t`; a failure is logged, counted and ends the stream (a held end
    /// without its tail must not reach the client as if complete).
    fn append_body(&mut self, t: u32, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        // SAFETY: the live filter; the data outlives the call.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_append_body(
                self.filter,
                t,
                ModuleBuffer::of(data),
            )
        };
        if !ok {
            log(
                LogLevel::Error,
                "mcp-resume-guard: host call append body failed; resetting the stream",
            );
            self.count(Stat::HostErrors, 1);
            self.reset_response();
        }
        ok
    }

    fn set_header(&mut self, kind: u32, name: &str, value: Option<&str>) {
        if !self.stream_open() {
            return;
        }
        let v = value.map_or(ModuleBuffer::NULL, |v| ModuleBuffer::of(v.as_bytes()));
        // SAFETY: `filter` is the live filter of the running hook; buffers valid for the call.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_set_header(
                self.filter,
                kind,
                ModuleBuffer::of(name.as_bytes()),
                v,
            )
        };
        if !ok && value.is_some() {
            log(
                LogLevel::Warn,
                &format!("mcp-resume-guard: host call set header {name} failed"),
            );
        }
    }
}

impl FilterHost<'_> {
    /// A string attribute of this stream, copied; `None` when absent or empty.
    fn attribute(&self, id: u32) -> Option<String> {
        if self.out.ended {
            // No stream to ask (the ended host has no filter pointer).
            return None;
        }
        let mut b = EnvoyBuffer::NULL;
        // SAFETY: the live filter; the result is copied before the hook ends.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.filter,
                id,
                &mut b,
            )
            .then(|| String::from_utf8(b.bytes().to_vec()).ok())
            .flatten()
            .filter(|s| !s.is_empty())
        }
    }
}

impl Host for FilterHost<'_> {
    fn now_ms(&self) -> u64 {
        now_ms()
    }

    fn random_u64(&mut self) -> u64 {
        random_u64()
    }

    fn upstream_address(&self) -> Option<String> {
        self.attribute(abi::ATTRIBUTE_UPSTREAM_ADDRESS)
    }

    fn response_code_details(&self) -> Option<String> {
        self.attribute(abi::ATTRIBUTE_RESPONSE_CODE_DETAILS)
    }

    fn set_request_header(&mut self, name: &str, value: &str) {
        self.set_header(abi::REQUEST_HEADERS, name, Some(value));
    }

    fn remove_request_header(&mut self, name: &str) {
        self.set_header(abi::REQUEST_HEADERS, name, None);
    }

    fn set_response_header(&mut self, name: &str, value: &str) {
        self.set_header(abi::RESPONSE_HEADERS, name, Some(value));
    }

    fn remove_response_header(&mut self, name: &str) {
        self.set_header(abi::RESPONSE_HEADERS, name, None);
    }

    fn send_local_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        if !self.stream_open() {
            return;
        }
        let mut h = module_headers(headers);
        self.out.replied = true;
        // SAFETY: the live filter; headers and body outlive the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                self.filter,
                u32::from(status),
                h.as_mut_ptr(),
                h.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(b"mcp_resume_guard"),
            );
        }
    }

    fn resume_request(&mut self) {
        if self.inline {
            self.out.resumed = true;
        } else if self.stream_open() {
            // SAFETY: the live filter, paused by this module's request-headers hook.
            unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_decoding(self.filter) }
        }
    }

    fn replace_body_chunk(&mut self, body: &[u8]) {
        if !self.stream_open() {
            return;
        }
        // A chunk the exchange left as it came goes on untouched (no drain, no append).
        let received = self.received.take();
        if received == Some(body) {
            return;
        }
        // SAFETY: the live filter inside its response-body hook; the exchange read the chunk
        // (`received`, whose views end here) before replacing it.
        unsafe {
            let t = abi::RECEIVED_RESPONSE_BODY;
            let size = match received {
                Some(r) => r.len(),
                None => abi::envoy_dynamic_module_callback_http_get_body_size(self.filter, t),
            };
            let drained = size == 0
                || abi::envoy_dynamic_module_callback_http_drain_body(self.filter, t, size);
            let appended = body.is_empty()
                || abi::envoy_dynamic_module_callback_http_append_body(
                    self.filter,
                    t,
                    ModuleBuffer::of(body),
                );
            if !drained || !appended {
                // Half a rewrite must not reach the client: end the stream instead.
                log(
                    LogLevel::Error,
                    "mcp-resume-guard: host call replace body failed; resetting the stream",
                );
                self.count(Stat::HostErrors, 1);
                self.reset_response();
            }
        }
    }

    fn reset_response(&mut self) {
        if !self.stream_open() {
            return;
        }
        self.out.reset = true;
        // SAFETY: the live filter.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_reset_stream(
                self.filter,
                abi::RESET_LOCAL,
                ModuleBuffer::of(b"mcp_resume_guard"),
            );
        }
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u32> {
        if !self.stream_open() {
            return None;
        }
        let mut h = module_headers(headers);
        let mut id = 0u64;
        // SAFETY: the live filter; headers and body outlive the call.
        let r = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_http_callout(
                self.filter,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                h.as_mut_ptr(),
                h.len(),
                ModuleBuffer::of(body),
                timeout_ms,
            )
        };
        started(r, "http", id)
    }

    /// Envoy keeps a body its filter held (StopIterationAndBuffer) as the stream's buffered
    /// body: the tail is appended there and `continue_encoding` sends it with the end of
    /// stream. Inside the body hook that held it the end is still that hook's chunk.
    fn finish_held_response(&mut self, tail: &[u8]) {
        if !self.stream_open() {
            return;
        }
        if self.inline {
            if self.append_body(abi::RECEIVED_RESPONSE_BODY, tail) {
                self.out.released = true;
            }
            return;
        }
        if !self.append_body(abi::BUFFERED_RESPONSE_BODY, tail) {
            return;
        }
        self.out.released = true;
        // SAFETY: the live filter, whose response this module's body hook held. Envoy may
        // complete the stream inside this call (the module's hooks take that into account).
        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_encoding(self.filter) }
    }

    fn count(&mut self, stat: Stat, n: u64) {
        if !self.stream_open() {
            self.metrics.count_on_config(self.config, stat, n);
            return;
        }
        if let Some(id) = self.metrics.counter(stat) {
            // SAFETY: the live filter of a config that defined the counter.
            unsafe {
                abi::envoy_dynamic_module_callback_http_filter_increment_counter(
                    self.filter,
                    id,
                    std::ptr::null_mut(),
                    0,
                    n,
                );
            }
        }
    }

    fn observe_callout_ms(&mut self, ms: u64) {
        let Some(id) = self.metrics.callout_ms else {
            return;
        };
        // SAFETY: the live filter (or, once the stream is gone, its config) defined it.
        unsafe {
            if self.stream_open() {
                abi::envoy_dynamic_module_callback_http_filter_record_histogram_value(
                    self.filter,
                    id,
                    std::ptr::null_mut(),
                    0,
                    ms,
                );
            } else {
                abi::envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
                    self.config,
                    id,
                    std::ptr::null_mut(),
                    0,
                    ms,
                );
            }
        }
    }

    fn log(&mut self, level: LogLevel, msg: &str) {
        log(level, msg);
    }
}

/// The host of the record flush and its answers: main thread, no stream. Stream calls are
/// never made from there; they are ignored.
pub struct ConfigHost<'a> {
    pub config: HttpFilterConfigEnvoyPtr,
    pub metrics: &'a Metrics,
    /// Callout ids dispatched during this call, for the caller to map to its worker.
    pub dispatched: Vec<u64>,
}

impl Host for ConfigHost<'_> {
    fn now_ms(&self) -> u64 {
        now_ms()
    }
    fn random_u64(&mut self) -> u64 {
        random_u64()
    }
    fn upstream_address(&self) -> Option<String> {
        None
    }
    fn response_code_details(&self) -> Option<String> {
        None
    }
    fn set_request_header(&mut self, _: &str, _: &str) {}
    fn remove_request_header(&mut self, _: &str) {}
    fn set_response_header(&mut self, _: &str, _: &str) {}
    fn remove_response_header(&mut self, _: &str) {}
    fn send_local_response(&mut self, _: u16, _: &[(&str, &str)], _: &[u8]) {}
    fn resume_request(&mut self) {}
    fn replace_body_chunk(&mut self, _: &[u8]) {}
    fn reset_response(&mut self) {}

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u32> {
        let mut h = module_headers(headers);
        let mut id = 0u64;
        // SAFETY: the config is alive on the main thread; headers and body outlive the call.
        let r = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_http_callout(
                self.config,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                h.as_mut_ptr(),
                h.len(),
                ModuleBuffer::of(body),
                timeout_ms,
            )
        };
        let t = started(r, "records", id)?;
        self.dispatched.push(id);
        Some(t)
    }

    fn finish_held_response(&mut self, _: &[u8]) {}
    fn count(&mut self, stat: Stat, n: u64) {
        self.metrics.count_on_config(self.config, stat, n);
    }
    fn observe_callout_ms(&mut self, _: u64) {}
    fn log(&mut self, level: LogLevel, msg: &str) {
        log(level, msg);
    }
}

/// The `:status` and body of a callout answer, copied out of Envoy's buffers. `status` is
/// `None` when the callout failed or has no headers.
///
/// # Safety
/// The pointers are the ones Envoy passed to the callout-done hook, valid during it.
pub unsafe fn callout_answer(
    result: u32,
    headers: *const HttpHeader,
    headers_size: usize,
    body: *const EnvoyBuffer,
    body_size: usize,
) -> (Option<u32>, Option<Vec<u8>>) {
    if result != abi::CALLOUT_SUCCESS || headers.is_null() || headers_size == 0 {
        return (None, None);
    }
    let hs = std::slice::from_raw_parts(headers, headers_size);
    let status = hs.iter().find_map(|h| {
        let (k, v) = h.key_value();
        (k == b":status")
            .then(|| std::str::from_utf8(v).ok()?.parse::<u32>().ok())
            .flatten()
    });
    let mut out = Vec::new();
    if !body.is_null() {
        for b in std::slice::from_raw_parts(body, body_size) {
            out.extend_from_slice(b.bytes());
        }
    }
    (status, Some(out))
}
