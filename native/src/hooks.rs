//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`). Each one catches panics, so none
//! crosses into Envoy; a panic in a stream's hook resets that stream (fail closed).
use crate::abi::{self, EnvoyBuffer, HttpFilterConfigEnvoyPtr, HttpFilterEnvoyPtr, HttpHeader};
use crate::host::{callout_answer, log};
use crate::module::{Filter, Guard, TICK};
use mcp_resume_core::host::LogLevel;
use std::ffi::c_void;
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The filter name this module answers to (`filter_name` in the Envoy config).
const FILTER_NAME: &[u8] = b"mcp_resume_guard";

/// Runs a hook body; a panic is logged and turned into `fallback`.
fn guarded<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            log(
                LogLevel::Critical,
                &format!("mcp-resume-guard: panic in {what} (caught)"),
            );
            fallback
        }
    }
}

/// Runs a stream hook on its filter: counts the entry (a destroy from inside it is deferred
/// until it returns), catches a panic (the stream is reset, `fallback` returned), tells the
/// exchange of a stream end Envoy announced meanwhile, and frees the filter if Envoy destroyed
/// it meanwhile.
///
/// # Safety
/// `ptr` is a filter made by `envoy_dynamic_module_on_http_filter_new` and not yet freed.
unsafe fn with_filter<T: Copy>(
    what: &str,
    envoy: HttpFilterEnvoyPtr,
    ptr: *const c_void,
    fallback: T,
    f: impl FnOnce(&Filter) -> T,
) -> T {
    if ptr.is_null() {
        return fallback;
    }
    let filter = &*ptr.cast::<Filter>();
    filter.enter();
    let r = match catch_unwind(AssertUnwindSafe(|| f(filter))) {
        Ok(v) => v,
        Err(_) => {
            log(
                LogLevel::Critical,
                &format!("mcp-resume-guard: panic in {what} (caught); resetting the stream"),
            );
            let _ = catch_unwind(AssertUnwindSafe(|| filter.fail_closed(envoy)));
            fallback
        }
    };
    // Envoy completes a stream from inside a reset or a `continue_encoding` the exchange asked
    // for; the exchange, in use then, hears the end now.
    if catch_unwind(AssertUnwindSafe(|| filter.end_if_owed())).is_err() {
        log(
            LogLevel::Critical,
            &format!("mcp-resume-guard: panic in {what} (stream end, caught)"),
        );
    }
    if filter.leave() {
        drop(Box::from_raw(ptr.cast_mut().cast::<Filter>()));
    }
    r
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    // A panic's message and place go to Envoy's log (this module's own std; Envoy's stderr may
    // be nobody's).
    std::panic::set_hook(Box::new(|info| {
        log(LogLevel::Critical, &format!("mcp-resume-guard: {info}"));
    }));
    abi::ABI_VERSION.as_ptr().cast::<c_char>()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: HttpFilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    guarded("config_new", std::ptr::null(), || {
        // SAFETY: Envoy's buffers, valid during this hook.
        let (name, json) = unsafe { (name.bytes(), config.bytes()) };
        if name != FILTER_NAME {
            log(
                LogLevel::Critical,
                &format!(
                    "mcp-resume-guard: invalid config: filter_name: must be mcp_resume_guard, got {:?}",
                    String::from_utf8_lossy(name)
                ),
            );
            return std::ptr::null();
        }
        match Guard::new(config_envoy, json) {
            Ok(g) => Box::into_raw(Box::new(g)).cast_const().cast::<c_void>(),
            Err(e) => {
                // Envoy refuses the config; the message names the field.
                log(LogLevel::Critical, &format!("mcp-resume-guard: {e}"));
                std::ptr::null()
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guarded("config_destroy", (), || {
        if !config.is_null() {
            // SAFETY: made by Box::into_raw in config_new; Envoy destroys it once, after its
            // filters.
            let g = unsafe { Box::from_raw(config.cast_mut().cast::<Guard>()) };
            g.shut_down();
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: HttpFilterConfigEnvoyPtr,
    config: *const c_void,
    event_id: u64,
) {
    guarded("config_scheduled", (), || {
        if event_id == TICK && !config.is_null() {
            // SAFETY: the live config (main thread).
            unsafe { &*config.cast::<Guard>() }.tick();
        }
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: HttpFilterConfigEnvoyPtr,
    config: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *mut HttpHeader,
    headers_size: usize,
    body: *mut EnvoyBuffer,
    body_size: usize,
) {
    guarded("config_http_callout_done", (), || {
        if config.is_null() {
            return;
        }
        // SAFETY: Envoy's buffers, valid during this hook; the live config (main thread).
        let (status, body) =
            unsafe { callout_answer(result, headers, headers_size, body, body_size) };
        unsafe { &*config.cast::<Guard>() }.on_records_answer(callout_id, status, body);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    filter_envoy: HttpFilterEnvoyPtr,
) -> *const c_void {
    guarded("filter_new", std::ptr::null(), || {
        if config.is_null() {
            return std::ptr::null();
        }
        // SAFETY: the live config; Envoy keeps it alive for as long as this filter.
        let g = unsafe { &*config.cast::<Guard>() };
        Box::into_raw(Box::new(Filter::new(g, filter_envoy)))
            .cast_const()
            .cast::<c_void>()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: *const c_void) {
    guarded("filter_destroy", (), || {
        if filter.is_null() {
            return;
        }
        // SAFETY: made by Box::into_raw in filter_new. When a hook of this filter is running
        // (Envoy destroys it from inside a local reply or reset), that hook frees it on return.
        unsafe {
            if (*filter.cast::<Filter>()).destroy() {
                drop(Box::from_raw(filter.cast_mut().cast::<Filter>()));
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // Fallback on a panic: the stream was reset; stop it.
    // SAFETY: `f` is this stream's filter.
    unsafe {
        with_filter(
            "request_headers",
            e,
            f,
            abi::HEADERS_STOP_ALL_AND_WATERMARK,
            |f| f.request_headers(e),
        )
    }
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *mut HttpHeader,
    headers_size: usize,
    body: *mut EnvoyBuffer,
    body_size: usize,
) {
    // SAFETY: `f` is this stream's filter; Envoy's buffers are valid during this hook.
    unsafe {
        with_filter("http_callout_done", e, f, (), |f| {
            let (status, body) = callout_answer(result, headers, headers_size, body, body_size);
            f.callout_done(e, callout_id, status, body);
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: `f` is this stream's filter.
    unsafe {
        with_filter("response_headers", e, f, abi::HEADERS_STOP_ITERATION, |f| {
            f.response_headers(e, end_of_stream)
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: `f` is this stream's filter.
    unsafe {
        with_filter("response_body", e, f, abi::BODY_STOP_NO_BUFFER, |f| {
            f.response_body(e, end_of_stream)
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // The body always passes; only a POST's JSON-RPC id is read from it.
    // SAFETY: `f` is this stream's filter.
    unsafe {
        with_filter("request_body", e, f, abi::BODY_CONTINUE, |f| {
            f.request_body(e, end_of_stream)
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
) -> u32 {
    abi::TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
) -> u32 {
    abi::TRAILERS_CONTINUE
}

/// An event the module committed to this stream's scheduler (its continuation's deadline).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
    event_id: u64,
) {
    // SAFETY: `f` is this stream's filter.
    unsafe { with_filter("scheduled", e, f, (), |f| f.scheduled(e, event_id)) }
}

/// Envoy calls this once per stream, however it ended (before destroying the filter).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
) {
    // SAFETY: `f` is this stream's filter.
    unsafe { with_filter("stream_complete", e, f, (), Filter::stream_end) }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    abi::LOCAL_REPLY_CONTINUE
}

// Streamed callouts and per-route config are not used; Envoy
// looks the hooks up when it loads the filter.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
    _headers: *mut HttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
    _trailers: *mut HttpHeader,
    _trailers_size: usize,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

/// The client stopped reading (its connection's write buffer is above the high watermark): a
/// continuation's wait between owed events is suspended until it reads again.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
) {
    // SAFETY: `f` is this stream's filter.
    unsafe { with_filter("watermark", e, f, (), |f| f.backpressure(e, true)) }
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    e: HttpFilterEnvoyPtr,
    f: *const c_void,
) {
    // SAFETY: `f` is this stream's filter.
    unsafe { with_filter("watermark", e, f, (), |f| f.backpressure(e, false)) }
}
