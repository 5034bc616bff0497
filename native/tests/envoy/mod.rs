//! A mock of the Envoy side of the dynamic-module ABI: every `envoy_dynamic_module_callback_*` the
//! module imports (the `extern` block of `abi.rs`), over a fake stream per filter pointer, and
//! the module's hooks declared as Envoy calls them. State is per thread: each test drives its
//! own module objects on its own thread.
#![allow(clippy::missing_safety_doc)]

use mcp_resume_guard_native::abi::{
    ConfigSchedulerPtr, EnvoyBuffer, HttpFilterConfigEnvoyPtr, HttpFilterEnvoyPtr, HttpHeader,
    ModuleBuffer, BODY_CONTINUE, BODY_STOP_AND_BUFFER, BUFFERED_RESPONSE_BODY,
    CALLOUT_INIT_SUCCESS, CALLOUT_SUCCESS, METRICS_SUCCESS, RECEIVED_REQUEST_BODY,
    RECEIVED_RESPONSE_BODY, REQUEST_HEADERS, RESPONSE_HEADERS,
};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::os::raw::c_char;
use std::sync::atomic::{AtomicU64, Ordering};

pub type Headers = Vec<(String, Vec<u8>)>;

// The module's hooks, as Envoy looks them up.
extern "C" {
    pub fn envoy_dynamic_module_on_http_filter_config_new(
        config_envoy: HttpFilterConfigEnvoyPtr,
        name: EnvoyBuffer,
        config: EnvoyBuffer,
    ) -> *const c_void;
    pub fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void);
    pub fn envoy_dynamic_module_on_http_filter_config_scheduled(
        config_envoy: HttpFilterConfigEnvoyPtr,
        config: *const c_void,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
        config_envoy: HttpFilterConfigEnvoyPtr,
        config: *const c_void,
        callout_id: u64,
        result: u32,
        headers: *mut HttpHeader,
        headers_size: usize,
        body: *mut EnvoyBuffer,
        body_size: usize,
    );
    pub fn envoy_dynamic_module_on_http_filter_new(
        config: *const c_void,
        filter_envoy: HttpFilterEnvoyPtr,
    ) -> *const c_void;
    pub fn envoy_dynamic_module_on_http_filter_destroy(filter: *const c_void);
    pub fn envoy_dynamic_module_on_http_filter_scheduled(
        e: HttpFilterEnvoyPtr,
        f: *const c_void,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_on_http_filter_request_headers(
        e: HttpFilterEnvoyPtr,
        f: *const c_void,
        end_of_stream: bool,
    ) -> u32;
    pub fn envoy_dynamic_module_on_http_filter_request_body(
        e: HttpFilterEnvoyPtr,
        f: *const c_void,
        end_of_stream: bool,
    ) -> u32;
    pub fn envoy_dynamic_module_on_http_filter_http_callout_done(
        e: HttpFilterEnvoyPtr,
        f: *const c_void,
        callout_id: u64,
        result: u32,
        headers: *mut HttpHeader,
        headers_size: usize,
        body: *mut EnvoyBuffer,
        body_size: usize,
    );
    pub fn envoy_dynamic_module_on_http_filter_response_headers(
        e: HttpFilterEnvoyPtr,
        f: *const c_void,
        end_of_stream: bool,
    ) -> u32;
    pub fn envoy_dynamic_module_on_http_filter_response_body(
        e: HttpFilterEnvoyPtr,
        f: *const c_void,
        end_of_stream: bool,
    ) -> u32;
    pub fn envoy_dynamic_module_on_http_filter_stream_complete(
        e: HttpFilterEnvoyPtr,
        f: *const c_void,
    );
}

/// A local reply: status, headers, body, details.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u32,
    pub headers: Headers,
    pub body: Vec<u8>,
    pub details: String,
}

/// A callout the module started; `filter` is 0 for the config's (records) callouts.
#[derive(Debug, Clone)]
pub struct Callout {
    pub id: u64,
    pub filter: usize,
    pub cluster: String,
    pub headers: Headers,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// One stream as Envoy holds it.
#[derive(Debug, Default)]
pub struct Stream {
    /// The module's filter object (for the hooks a local reply runs).
    pub module_filter: usize,
    pub request_headers: Headers,
    pub response_headers: Headers,
    /// The request body data of the current hook.
    pub request_body: Vec<u8>,
    /// The response body data of the current hook (reachable during the body hook only).
    pub response_body: Vec<u8>,
    /// A response body hook is running: its chunk is the received body.
    pub in_response_body_hook: bool,
    /// The response body a body hook held (StopIterationAndBuffer), until `continue_encoding`.
    pub buffered_response_body: Option<Vec<u8>>,
    /// `continue_encoding` calls.
    pub encoding_continued: u32,
    /// Envoy completed the stream and destroyed its filter.
    pub ended: bool,
    pub upstream_body: Vec<u8>,
    pub client_body: Vec<u8>,
    pub attributes: HashMap<u32, Vec<u8>>,
    pub replies: Vec<Reply>,
    pub continued: u32,
    pub reset: bool,
    pub request_body_reads: u32,
    /// Header maps the module changed, as they were, scribbled over (see [`moved`]).
    pub stale: Vec<Headers>,
    /// Body bytes the module drained, scribbled over.
    pub stale_bodies: Vec<Vec<u8>>,
}

/// A metric defined on the config.
#[derive(Debug, Clone)]
pub struct Metric {
    pub name: String,
    pub histogram: bool,
    pub value: u64,
    pub samples: Vec<u64>,
}

/// Envoy's side, for the current thread.
#[derive(Debug, Default)]
pub struct Envoy {
    pub streams: HashMap<usize, Stream>,
    pub callouts: Vec<Callout>,
    pub metrics: Vec<Metric>,
    pub logs: Vec<(u32, String)>,
    /// The module's config object (for the callouts answered inline).
    pub module_config: usize,
    /// Answer the next stream callout inside `http_callout` itself: status, body.
    pub answer_inline: Option<(u32, Vec<u8>)>,
    /// Complete the stream (stream-complete, then destroy) inside `continue_encoding` and
    /// `reset_stream`, as Envoy does when that call sends the response's last byte or resets it.
    pub complete_inline: bool,
    /// Callbacks the module called, by name (without `envoy_dynamic_module_callback_`).
    pub calls: HashMap<&'static str, u32>,
    next_callout: u64,
    /// Events committed to stream schedulers, not yet run: Envoy's filter pointer, event id.
    pub scheduled: Vec<(usize, u64)>,
    /// Stream schedulers made and not deleted.
    pub schedulers: u32,
}

impl Envoy {
    /// Callbacks called since the counts were last cleared, in all.
    pub fn abi_calls(&self) -> u32 {
        self.calls.values().sum()
    }

    /// The calls, sorted by name, as `name×n`.
    pub fn call_list(&self) -> String {
        let mut v: Vec<_> = self.calls.iter().map(|(k, n)| format!("{k}×{n}")).collect();
        v.sort();
        v.join(" ")
    }
}

thread_local! {
    static ENVOY: RefCell<Envoy> = RefCell::new(Envoy::default());
    /// Allocations are counted on this thread (by the test binary's allocator).
    pub static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Inside the mock's own bookkeeping: its allocations are not the module's.
    pub static QUIET: Cell<u32> = const { Cell::new(0) };
    /// How many slices Envoy keeps a body chunk in (when it has as many bytes).
    pub static BODY_SLICES: Cell<usize> = const { Cell::new(2) };
    /// Allocations (and reallocations) the module made while counting.
    pub static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Runs `f` as the mock's own work: its allocations are not counted.
pub fn quiet<T>(f: impl FnOnce() -> T) -> T {
    QUIET.with(|q| q.set(q.get() + 1));
    let r = f();
    QUIET.with(|q| q.set(q.get() - 1));
    r
}

/// Counts one call of a callback.
fn hit(name: &'static str) {
    with(|e| *e.calls.entry(name).or_default() += 1);
}

/// Scheduler events committed by the module's tick thread, from any thread.
pub static COMMITS: AtomicU64 = AtomicU64::new(0);
/// Schedulers deleted.
pub static DELETED: AtomicU64 = AtomicU64::new(0);

pub fn with<T>(f: impl FnOnce(&mut Envoy) -> T) -> T {
    quiet(|| ENVOY.with(|e| f(&mut e.borrow_mut())))
}

fn stream<T>(filter: HttpFilterEnvoyPtr, f: impl FnOnce(&mut Stream) -> T) -> T {
    with(|e| f(e.streams.entry(filter as usize).or_default()))
}

unsafe fn bytes(b: ModuleBuffer) -> Vec<u8> {
    if b.ptr.is_null() {
        return Vec::new();
    }
    quiet(|| std::slice::from_raw_parts(b.ptr.cast::<u8>(), b.length).to_vec())
}

unsafe fn text(b: ModuleBuffer) -> String {
    quiet(|| String::from_utf8_lossy(&bytes(b)).into_owned())
}

unsafe fn header_list(h: *const HttpHeader, n: usize) -> Headers {
    if h.is_null() {
        return Vec::new();
    }
    quiet(|| {
        std::slice::from_raw_parts(h, n)
            .iter()
            .map(|h| {
                let (k, v) = h.key_value();
                (String::from_utf8_lossy(k).into_owned(), v.to_vec())
            })
            .collect()
    })
}

fn envoy_buffer(b: &[u8]) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: b.as_ptr().cast::<c_char>(),
        length: b.len(),
    }
}

/// Headers as the ABI passes them; the pointers borrow `h`.
pub fn raw_headers(h: &Headers) -> Vec<HttpHeader> {
    h.iter()
        .map(|(k, v)| HttpHeader::of(k.as_bytes(), v))
        .collect()
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer) {
    hit("log");
    let m = text(message);
    with(|e| e.logs.push((level, m)));
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_is_validation_mode() -> bool {
    hit("is_validation_mode");
    false
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_get_concurrency() -> u32 {
    hit("get_concurrency");
    2
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_get_worker_index(
    _filter: HttpFilterEnvoyPtr,
) -> u32 {
    hit("http_filter_get_worker_index");
    1
}

fn define(name: ModuleBuffer, id: *mut usize, histogram: bool) -> u32 {
    // SAFETY: the module's buffer and out-pointer, valid for the call.
    let name = unsafe { text(name) };
    let i = with(|e| {
        e.metrics.push(Metric {
            name,
            histogram,
            value: 0,
            samples: Vec::new(),
        });
        e.metrics.len() - 1
    });
    unsafe { *id = i };
    METRICS_SUCCESS
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_counter(
    _config: HttpFilterConfigEnvoyPtr,
    name: ModuleBuffer,
    _label_names: *mut ModuleBuffer,
    _label_names_length: usize,
    id: *mut usize,
) -> u32 {
    hit("http_filter_config_define_counter");
    define(name, id, false)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
    _config: HttpFilterConfigEnvoyPtr,
    name: ModuleBuffer,
    _label_names: *mut ModuleBuffer,
    _label_names_length: usize,
    id: *mut usize,
) -> u32 {
    hit("http_filter_config_define_histogram");
    define(name, id, true)
}

fn update(id: usize, value: u64, record: bool) -> u32 {
    with(|e| match e.metrics.get_mut(id) {
        Some(m) if m.histogram == record => {
            if record {
                m.samples.push(value);
            } else {
                m.value += value;
            }
            METRICS_SUCCESS
        }
        _ => 1,
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_increment_counter(
    _filter: HttpFilterEnvoyPtr,
    id: usize,
    _label_values: *mut ModuleBuffer,
    _label_values_length: usize,
    value: u64,
) -> u32 {
    hit("http_filter_increment_counter");
    update(id, value, false)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
    _filter: HttpFilterEnvoyPtr,
    id: usize,
    _label_values: *mut ModuleBuffer,
    _label_values_length: usize,
    value: u64,
) -> u32 {
    hit("http_filter_record_histogram_value");
    update(id, value, true)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
    _config: HttpFilterConfigEnvoyPtr,
    id: usize,
    _label_values: *mut ModuleBuffer,
    _label_values_length: usize,
    value: u64,
) -> u32 {
    hit("http_filter_config_record_histogram_value");
    update(id, value, true)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
    _config: HttpFilterConfigEnvoyPtr,
    id: usize,
    _label_values: *mut ModuleBuffer,
    _label_values_length: usize,
    value: u64,
) -> u32 {
    hit("http_filter_config_increment_counter");
    update(id, value, false)
}

/// Envoy may move a map's bytes when a header changes: the map gets fresh copies, and its old
/// bytes are scribbled over and returned (kept, so a view the module still holds reads `#`s,
/// not freed memory, and the scenarios fail).
fn moved(h: &mut Headers) -> Headers {
    let fresh = h.clone();
    let mut old = std::mem::replace(h, fresh);
    for (k, v) in &mut old {
        v.fill(b'#');
        // SAFETY: `#` keeps the name valid UTF-8.
        unsafe { k.as_bytes_mut().fill(b'#') };
    }
    old
}

fn header_map(s: &mut Stream, kind: u32) -> Option<&mut Headers> {
    match kind {
        REQUEST_HEADERS => Some(&mut s.request_headers),
        RESPONSE_HEADERS => Some(&mut s.response_headers),
        _ => None,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_get_headers_size(
    filter: HttpFilterEnvoyPtr,
    header_type: u32,
) -> usize {
    hit("http_get_headers_size");
    stream(filter, |s| {
        header_map(s, header_type).map_or(0, |h| h.len())
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_headers(
    filter: HttpFilterEnvoyPtr,
    header_type: u32,
    result_headers: *mut HttpHeader,
) -> bool {
    hit("http_get_headers");
    stream(filter, |s| {
        let Some(h) = header_map(s, header_type) else {
            return false;
        };
        // The pointers stay valid until the map changes (the module copies them first).
        for (i, (k, v)) in h.iter().enumerate() {
            *result_headers.add(i) = HttpHeader::of(k.as_bytes(), v);
        }
        true
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_set_header(
    filter: HttpFilterEnvoyPtr,
    header_type: u32,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    hit("http_set_header");
    let key = text(key).to_ascii_lowercase();
    let value = (!value.ptr.is_null()).then(|| bytes(value));
    stream(filter, |s| {
        let Some(h) = header_map(s, header_type) else {
            return false;
        };
        let old = moved(h);
        s.stale.push(old);
        let Some(h) = header_map(s, header_type) else {
            return false;
        };
        match value {
            None => h.retain(|(k, _)| *k != key),
            Some(v) => match h.iter().position(|(k, _)| *k == key) {
                Some(i) => {
                    h[i].1 = v;
                    let mut n = 0;
                    h.retain(|(k, _)| {
                        n += usize::from(*k == key);
                        *k != key || n == 1
                    });
                }
                None => h.push((key, v)),
            },
        }
        true
    })
}

/// Envoy sends a local reply at once, through the encoder filters: this module's response
/// hooks run inside this call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_send_response(
    filter: HttpFilterEnvoyPtr,
    status_code: u32,
    headers: *mut HttpHeader,
    headers_size: usize,
    body: ModuleBuffer,
    details: ModuleBuffer,
) {
    hit("http_send_response");
    let reply = Reply {
        status: status_code,
        headers: header_list(headers, headers_size),
        body: bytes(body),
        details: text(details),
    };
    let module_filter = stream(filter, |s| {
        let mut h = vec![(":status".to_string(), status_code.to_string().into_bytes())];
        h.extend(reply.headers.iter().cloned());
        let old = moved(&mut s.response_headers);
        s.stale.push(old);
        s.response_headers = h;
        s.replies.push(reply.clone());
        s.module_filter
    });
    let f = module_filter as *const c_void;
    let eos = reply.body.is_empty();
    envoy_dynamic_module_on_http_filter_response_headers(filter, f, eos);
    if !eos {
        run_response_body(filter, &reply.body, true);
    }
}

/// Runs the module's response-body hook on `chunk` as Envoy does: the chunk is the received
/// body during the hook; what the hook lets continue reaches the client, what it holds
/// (StopIterationAndBuffer) becomes the buffered body.
pub unsafe fn run_response_body(filter: HttpFilterEnvoyPtr, chunk: &[u8], eos: bool) -> u32 {
    let module_filter = stream(filter, |s| {
        s.response_body = chunk.to_vec();
        s.in_response_body_hook = true;
        s.module_filter
    });
    let r = envoy_dynamic_module_on_http_filter_response_body(
        filter,
        module_filter as *const c_void,
        eos,
    );
    stream(filter, |s| {
        s.in_response_body_hook = false;
        let b = std::mem::take(&mut s.response_body);
        match r {
            BODY_CONTINUE => s.client_body.extend_from_slice(&b),
            BODY_STOP_AND_BUFFER => s
                .buffered_response_body
                .get_or_insert_with(Vec::new)
                .extend_from_slice(&b),
            _ => {}
        }
    });
    r
}

/// Envoy is done with the stream: the module hears it is complete, then its filter is
/// destroyed (once).
pub unsafe fn complete_stream(filter: HttpFilterEnvoyPtr) {
    let (first, module_filter) = stream(filter, |s| {
        (!std::mem::replace(&mut s.ended, true), s.module_filter)
    });
    if first {
        let f = module_filter as *const c_void;
        envoy_dynamic_module_on_http_filter_stream_complete(filter, f);
        envoy_dynamic_module_on_http_filter_destroy(f);
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_continue_decoding(
    filter: HttpFilterEnvoyPtr,
) {
    hit("http_filter_continue_decoding");
    stream(filter, |s| s.continued += 1);
}

/// The held response body goes out with the end of stream.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_continue_encoding(
    filter: HttpFilterEnvoyPtr,
) {
    hit("http_filter_continue_encoding");
    stream(filter, |s| {
        s.encoding_continued += 1;
        if let Some(b) = s.buffered_response_body.take() {
            s.client_body.extend_from_slice(&b);
        }
    });
    if with(|e| e.complete_inline) {
        unsafe { complete_stream(filter) };
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_reset_stream(
    filter: HttpFilterEnvoyPtr,
    _reason: u32,
    _details: ModuleBuffer,
) {
    hit("http_filter_reset_stream");
    stream(filter, |s| {
        s.reset = true;
        s.buffered_response_body = None;
    });
    if with(|e| e.complete_inline) {
        unsafe { complete_stream(filter) };
    }
}

fn body_of(s: &mut Stream, body_type: u32) -> Option<&mut Vec<u8>> {
    match body_type {
        RECEIVED_REQUEST_BODY => Some(&mut s.request_body),
        // Outside the body hook Envoy has no received chunk.
        RECEIVED_RESPONSE_BODY if s.in_response_body_hook => Some(&mut s.response_body),
        BUFFERED_RESPONSE_BODY => s.buffered_response_body.as_mut(),
        _ => None,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_get_body_size(
    filter: HttpFilterEnvoyPtr,
    body_type: u32,
) -> usize {
    hit("http_get_body_size");
    stream(filter, |s| body_of(s, body_type).map_or(0, |b| b.len()))
}

/// The body is kept in [`BODY_SLICES`] slices (default two, split at its middle), as Envoy's
/// buffers are chunked.
fn slices(b: &[u8]) -> Vec<&[u8]> {
    let parts = BODY_SLICES.with(Cell::get).max(1);
    quiet(|| match b.len() {
        0 => Vec::new(),
        n if n < parts => vec![b],
        n => {
            let step = n / parts;
            let mut v: Vec<&[u8]> = (0..parts - 1)
                .map(|i| &b[i * step..(i + 1) * step])
                .collect();
            v.push(&b[(parts - 1) * step..]);
            v
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks_size(
    filter: HttpFilterEnvoyPtr,
    body_type: u32,
) -> usize {
    hit("http_get_body_chunks_size");
    stream(filter, |s| {
        body_of(s, body_type).map_or(0, |b| slices(b).len())
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks(
    filter: HttpFilterEnvoyPtr,
    body_type: u32,
    result: *mut EnvoyBuffer,
) -> bool {
    hit("http_get_body_chunks");
    stream(filter, |s| {
        if body_type == RECEIVED_REQUEST_BODY {
            s.request_body_reads += 1;
        }
        let Some(b) = body_of(s, body_type) else {
            return false;
        };
        for (i, c) in slices(b).into_iter().enumerate() {
            *result.add(i) = envoy_buffer(c);
        }
        true
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_drain_body(
    filter: HttpFilterEnvoyPtr,
    body_type: u32,
    number_of_bytes: usize,
) -> bool {
    hit("http_drain_body");
    stream(filter, |s| {
        let Some(b) = body_of(s, body_type) else {
            return false;
        };
        // Envoy frees the drained slices: the old bytes are scribbled over (and kept), so a
        // view of the chunk read after the drain fails the scenarios.
        let rest = b[number_of_bytes.min(b.len())..].to_vec();
        let mut old = std::mem::replace(b, rest);
        old.fill(b'#');
        s.stale_bodies.push(old);
        true
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_append_body(
    filter: HttpFilterEnvoyPtr,
    body_type: u32,
    data: ModuleBuffer,
) -> bool {
    hit("http_append_body");
    let data = bytes(data);
    stream(filter, |s| {
        if body_type == BUFFERED_RESPONSE_BODY {
            // Envoy makes the buffered body if there is none yet.
            s.buffered_response_body
                .get_or_insert_with(Vec::new)
                .extend_from_slice(&data);
            return true;
        }
        let Some(b) = body_of(s, body_type) else {
            return false;
        };
        b.extend_from_slice(&data);
        true
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
    filter: HttpFilterEnvoyPtr,
    attribute_id: u32,
    result: *mut EnvoyBuffer,
) -> bool {
    hit("http_filter_get_attribute_string");
    stream(filter, |s| match s.attributes.get(&attribute_id) {
        Some(v) => {
            *result = envoy_buffer(v);
            true
        }
        None => false,
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_http_callout(
    filter: HttpFilterEnvoyPtr,
    callout_id_out: *mut u64,
    cluster_name: ModuleBuffer,
    headers: *mut HttpHeader,
    headers_size: usize,
    body: ModuleBuffer,
    timeout_milliseconds: u64,
) -> u32 {
    hit("http_filter_http_callout");
    let (id, inline, module_filter) = with(|e| {
        e.next_callout += 1;
        let id = e.next_callout;
        e.callouts.push(Callout {
            id,
            filter: filter as usize,
            cluster: text(cluster_name),
            headers: header_list(headers, headers_size),
            body: bytes(body),
            timeout_ms: timeout_milliseconds,
        });
        let m = e
            .streams
            .get(&(filter as usize))
            .map_or(0, |s| s.module_filter);
        (id, e.answer_inline.take(), m)
    });
    *callout_id_out = id;
    if let Some((status, body)) = inline {
        // Envoy may answer a callout before returning from the call that started it.
        let h: Headers = vec![(":status".into(), status.to_string().into_bytes())];
        let mut raw = raw_headers(&h);
        let mut b = [envoy_buffer(&body)];
        envoy_dynamic_module_on_http_filter_http_callout_done(
            filter,
            module_filter as *const c_void,
            id,
            CALLOUT_SUCCESS,
            raw.as_mut_ptr(),
            raw.len(),
            b.as_mut_ptr(),
            b.len(),
        );
    }
    CALLOUT_INIT_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_http_callout(
    _config: HttpFilterConfigEnvoyPtr,
    callout_id_out: *mut u64,
    cluster_name: ModuleBuffer,
    headers: *mut HttpHeader,
    headers_size: usize,
    body: ModuleBuffer,
    timeout_milliseconds: u64,
) -> u32 {
    hit("http_filter_config_http_callout");
    let id = with(|e| {
        e.next_callout += 1;
        let id = e.next_callout;
        e.callouts.push(Callout {
            id,
            filter: 0,
            cluster: text(cluster_name),
            headers: header_list(headers, headers_size),
            body: bytes(body),
            timeout_ms: timeout_milliseconds,
        });
        id
    });
    *callout_id_out = id;
    CALLOUT_INIT_SUCCESS
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
    _config: HttpFilterConfigEnvoyPtr,
) -> ConfigSchedulerPtr {
    hit("http_filter_config_scheduler_new");
    // Any non-null pointer: the scheduler is only ever handed back.
    std::ptr::NonNull::<c_void>::dangling().as_ptr()
}

/// Called from the module's tick thread.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
    _scheduler: ConfigSchedulerPtr,
    _event_id: u64,
) {
    hit("http_filter_config_scheduler_commit");
    COMMITS.fetch_add(1, Ordering::SeqCst);
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
    _scheduler: ConfigSchedulerPtr,
) {
    hit("http_filter_config_scheduler_delete");
    DELETED.fetch_add(1, Ordering::SeqCst);
}

/// A stream scheduler: Envoy's filter pointer, boxed.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_new(
    filter: HttpFilterEnvoyPtr,
) -> *mut c_void {
    hit("http_filter_scheduler_new");
    with(|e| e.schedulers += 1);
    Box::into_raw(Box::new(filter as usize)).cast::<c_void>()
}

/// Queued: the test runs it as Envoy's dispatcher would, on the stream's worker.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
    scheduler: *mut c_void,
    event_id: u64,
) {
    hit("http_filter_scheduler_commit");
    let filter = *scheduler.cast::<usize>();
    with(|e| e.scheduled.push((filter, event_id)));
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_delete(
    scheduler: *mut c_void,
) {
    hit("http_filter_scheduler_delete");
    drop(Box::from_raw(scheduler.cast::<usize>()));
    with(|e| e.schedulers -= 1);
}
