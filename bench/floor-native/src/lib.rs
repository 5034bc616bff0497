//! The native floors of `make bench`: an Envoy 1.40 dynamic module (ABI v0.2.0) that does
//! nothing (`filter_name: empty`), or copies every response body chunk out of Envoy and writes it
//! back (`filter_name: copy`), the least a native filter that edits SSE ids must do.
//!
//! The copy fixture writes back as many bytes as the guard does: the guard rewrites ids into
//! longer cursors, so the request header `x-bench-pad-ppm` (parts per million of the body, measured
//! by bench/run.py from the guard's own output) asks for that many extra bytes, written as an SSE
//! comment line (`:xxx…\n`) after a chunk that ends a line, so the stream stays valid SSE.
//!
//! The ABI declarations are the few this module needs, copied from native/src/abi.rs: linking
//! the guard's rlib would also link its `#[no_mangle]` hooks, which clash with these.
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::os::raw::c_char;

const ABI_VERSION: &[u8] = b"v0.2.0\0";
type EnvoyPtr = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct EnvoyBuffer {
    ptr: *const c_char,
    length: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ModuleBuffer {
    ptr: *const c_char,
    length: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct HttpHeader {
    key_ptr: *const c_char,
    key_length: usize,
    value_ptr: *const c_char,
    value_length: usize,
}

const REQUEST_HEADERS: u32 = 0;
const RECEIVED_RESPONSE_BODY: u32 = 2;
const CONTINUE: u32 = 0;

extern "C" {
    fn envoy_dynamic_module_callback_http_get_headers_size(f: EnvoyPtr, t: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        f: EnvoyPtr,
        t: u32,
        out: *mut HttpHeader,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_body_chunks_size(f: EnvoyPtr, t: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        f: EnvoyPtr,
        t: u32,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_drain_body(f: EnvoyPtr, t: u32, n: usize) -> bool;
    fn envoy_dynamic_module_callback_http_append_body(
        f: EnvoyPtr,
        t: u32,
        data: ModuleBuffer,
    ) -> bool;
}

/// # Safety
/// `ptr` points to `len` readable bytes for `'a` (Envoy's buffers, valid during the hook).
unsafe fn bytes<'a>(ptr: *const c_char, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr.cast::<u8>(), len)
    }
}

/// What the module was configured as (`filter_name`).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Empty,
    Copy,
}

struct Filter {
    mode: Mode,
    /// Extra bytes per million body bytes (`x-bench-pad-ppm`).
    pad_ppm: Cell<u64>,
    /// Pad owed, in millionths of a byte.
    owed: Cell<u64>,
    out: RefCell<Vec<u8>>,
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

impl Filter {
    fn request_headers(&self, e: EnvoyPtr) {
        if self.mode != Mode::Copy {
            return;
        }
        // SAFETY: Envoy fills `n` headers whose buffers live until the hook returns.
        unsafe {
            let n = envoy_dynamic_module_callback_http_get_headers_size(e, REQUEST_HEADERS);
            let mut hs = vec![
                HttpHeader {
                    key_ptr: std::ptr::null(),
                    key_length: 0,
                    value_ptr: std::ptr::null(),
                    value_length: 0,
                };
                n
            ];
            if n == 0
                || !envoy_dynamic_module_callback_http_get_headers(
                    e,
                    REQUEST_HEADERS,
                    hs.as_mut_ptr(),
                )
            {
                return;
            }
            for h in &hs {
                if bytes(h.key_ptr, h.key_length).eq_ignore_ascii_case(b"x-bench-pad-ppm") {
                    let v = bytes(h.value_ptr, h.value_length);
                    if let Some(p) = std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()) {
                        self.pad_ppm.set(p);
                    }
                }
            }
        }
    }

    fn response_body(&self, e: EnvoyPtr) {
        if self.mode != Mode::Copy {
            return;
        }
        let Ok(mut out) = self.out.try_borrow_mut() else {
            return;
        };
        out.clear();
        // SAFETY: Envoy's body slices, valid during the hook.
        unsafe {
            let n =
                envoy_dynamic_module_callback_http_get_body_chunks_size(e, RECEIVED_RESPONSE_BODY);
            if n == 0 {
                return;
            }
            let mut raw = vec![
                EnvoyBuffer {
                    ptr: std::ptr::null(),
                    length: 0
                };
                n
            ];
            if !envoy_dynamic_module_callback_http_get_body_chunks(
                e,
                RECEIVED_RESPONSE_BODY,
                raw.as_mut_ptr(),
            ) {
                return;
            }
            for b in &raw {
                out.extend_from_slice(bytes(b.ptr, b.length));
            }
        }
        let len = out.len();
        let owed = self
            .owed
            .get()
            .saturating_add((len as u64).saturating_mul(self.pad_ppm.get()));
        let pad = pad_after(&out, owed);
        if pad > 0 {
            push_pad(&mut out, pad);
        }
        self.owed
            .set(owed.saturating_sub((pad as u64).saturating_mul(1_000_000)));
        // SAFETY: the filter's own stream, inside its body hook.
        unsafe {
            envoy_dynamic_module_callback_http_drain_body(e, RECEIVED_RESPONSE_BODY, len);
            envoy_dynamic_module_callback_http_append_body(
                e,
                RECEIVED_RESPONSE_BODY,
                ModuleBuffer {
                    ptr: out.as_ptr().cast::<c_char>(),
                    length: out.len(),
                },
            );
        }
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr().cast::<c_char>()
}

/// The config is the mode itself (a `Box<Mode>`); any name but `empty` or `copy` is refused.
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config_envoy: EnvoyPtr,
    name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    // SAFETY: Envoy's buffer, valid during this hook.
    let mode = match unsafe { bytes(name.ptr, name.length) } {
        b"empty" => Mode::Empty,
        b"copy" => Mode::Copy,
        _ => return std::ptr::null(),
    };
    Box::into_raw(Box::new(mode)).cast_const().cast::<c_void>()
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    if !config.is_null() {
        // SAFETY: made by Box::into_raw in config_new, destroyed once.
        drop(unsafe { Box::from_raw(config.cast_mut().cast::<Mode>()) });
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _c: EnvoyPtr,
    _config: *const c_void,
    _event_id: u64,
) {
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _c: EnvoyPtr,
    _config: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *mut HttpHeader,
    _headers_size: usize,
    _body: *mut EnvoyBuffer,
    _body_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _filter_envoy: EnvoyPtr,
) -> *const c_void {
    if config.is_null() {
        return std::ptr::null();
    }
    // SAFETY: the live config, kept alive by Envoy for as long as its filters.
    let mode = unsafe { *config.cast::<Mode>() };
    let f = Filter {
        mode,
        pad_ppm: Cell::new(0),
        owed: Cell::new(0),
        out: RefCell::new(Vec::new()),
    };
    Box::into_raw(Box::new(f)).cast_const().cast::<c_void>()
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: *const c_void) {
    if !filter.is_null() {
        // SAFETY: made by Box::into_raw in filter_new, destroyed once, after its last hook.
        drop(unsafe { Box::from_raw(filter.cast_mut().cast::<Filter>()) });
    }
}

/// # Safety
/// `f` is null or a live filter made by `envoy_dynamic_module_on_http_filter_new`.
unsafe fn filter<'a>(f: *const c_void) -> Option<&'a Filter> {
    f.cast::<Filter>().as_ref()
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    e: EnvoyPtr,
    f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy passes the filter made for this stream.
    if let Some(f) = unsafe { filter(f) } {
        f.request_headers(e);
    }
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _e: EnvoyPtr,
    _f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    e: EnvoyPtr,
    f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy passes the filter made for this stream.
    if let Some(f) = unsafe { filter(f) } {
        f.response_body(e);
    }
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _e: EnvoyPtr,
    _f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _e: EnvoyPtr,
    _f: *const c_void,
) -> u32 {
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _e: EnvoyPtr,
    _f: *const c_void,
) -> u32 {
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(_e: EnvoyPtr, _f: *const c_void) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _e: EnvoyPtr,
    _f: *const c_void,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _e: EnvoyPtr,
    _f: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *mut HttpHeader,
    _headers_size: usize,
    _body: *mut EnvoyBuffer,
    _body_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _e: EnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
    _headers: *mut HttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _e: EnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _e: EnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
    _trailers: *mut HttpHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _e: EnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _e: EnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _e: EnvoyPtr,
    _f: *const c_void,
    _event_id: u64,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _e: EnvoyPtr,
    _f: *const c_void,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _e: EnvoyPtr,
    _f: *const c_void,
) {
}
