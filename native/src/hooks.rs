//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`).
use crate::abi::{
    self, EnvoyBuffer, HttpFilterConfigEnvoyPtr, HttpFilterEnvoyPtr, HttpHeader, ModuleBuffer,
};
use std::ffi::c_void;
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn log(level: u32, msg: &str) {
    // SAFETY: the buffer is valid for the call.
    unsafe { abi::envoy_dynamic_module_callback_log(level, ModuleBuffer::of(msg.as_bytes())) }
}

/// Runs a hook body; a panic is logged and turned into `fallback`.
fn guarded<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            log(
                abi::LOG_CRITICAL,
                &format!("mcp-resume-guard: panic in {what}"),
            );
            fallback
        }
    }
}

struct Config;
struct Filter;

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    abi::ABI_VERSION.as_ptr().cast::<c_char>()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config_envoy: HttpFilterConfigEnvoyPtr,
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    guarded("config_new", std::ptr::null(), || {
        Box::into_raw(Box::new(Config))
            .cast_const()
            .cast::<c_void>()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guarded("config_destroy", (), || {
        if !config.is_null() {
            // SAFETY: made by Box::into_raw in config_new; Envoy destroys it once.
            drop(unsafe { Box::from_raw(config.cast_mut().cast::<Config>()) });
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    _config: *const c_void,
    _filter_envoy: HttpFilterEnvoyPtr,
) -> *const c_void {
    guarded("filter_new", std::ptr::null(), || {
        Box::into_raw(Box::new(Filter))
            .cast_const()
            .cast::<c_void>()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: *const c_void) {
    guarded("filter_destroy", (), || {
        if !filter.is_null() {
            // SAFETY: made by Box::into_raw in filter_new; Envoy destroys it once.
            drop(unsafe { Box::from_raw(filter.cast_mut().cast::<Filter>()) });
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    abi::HEADERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    abi::BODY_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
) -> u32 {
    abi::TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    guarded("response_headers", abi::HEADERS_CONTINUE, || {
        let mut upstream = EnvoyBuffer::NULL;
        // SAFETY: `e` is the live filter of this hook; the result is read within it.
        let addr = unsafe {
            if abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                e,
                abi::ATTRIBUTE_UPSTREAM_ADDRESS,
                &mut upstream,
            ) {
                String::from_utf8_lossy(upstream.bytes()).into_owned()
            } else {
                "none".to_string()
            }
        };
        // SAFETY: as above; the buffers are valid for the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_header(
                e,
                abi::RESPONSE_HEADERS,
                ModuleBuffer::of(b"x-native-probe"),
                ModuleBuffer::of(addr.as_bytes()),
            );
        }
        abi::HEADERS_CONTINUE
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    abi::BODY_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
) -> u32 {
    abi::TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
) {
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *mut HttpHeader,
    _headers_size: usize,
    _body: *mut EnvoyBuffer,
    _body_size: usize,
) {
}

// Streamed callouts, filter scheduling and watermarks are not used; Envoy requires the hooks.
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
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
    _event_id: u64,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _e: HttpFilterEnvoyPtr,
    _f: *const c_void,
) {
}
