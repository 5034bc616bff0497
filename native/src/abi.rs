//! The part of Envoy 1.40's dynamic-module C ABI (ABI version v0.2.0) that the guard uses: types,
//! and the callbacks Envoy exports to modules (checked against the symbols the `envoy` binary
//! exports). The event hooks the module exports are in `hooks.rs`.
//!
//! C enums are passed as `u32` (they are `int`-sized on every platform Envoy supports); only the
//! values used here are named.

use std::os::raw::{c_char, c_void};

/// The ABI version this module is written against; Envoy 1.40 logs a warning on a mismatch.
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

pub type HttpFilterConfigEnvoyPtr = *mut c_void;
pub type HttpFilterEnvoyPtr = *mut c_void;
pub type ConfigSchedulerPtr = *mut c_void;
pub type FilterSchedulerPtr = *mut c_void;

/// A buffer owned by Envoy, valid until the end of the current hook.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl EnvoyBuffer {
    pub const NULL: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, or empty for a null buffer.
    ///
    /// # Safety
    /// `ptr` must point to `length` readable bytes for the returned lifetime (Envoy guarantees
    /// it until the end of the current hook).
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.length)
        }
    }
}

/// A buffer owned by the module, read by Envoy during the call only.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl ModuleBuffer {
    pub fn of(b: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: b.as_ptr().cast::<c_char>(),
            length: b.len(),
        }
    }

    /// A null buffer: "remove" for header setters, "none" for optional strings.
    pub const NULL: ModuleBuffer = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
}

/// A header; the same layout serves Envoy-owned and module-owned headers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HttpHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

impl HttpHeader {
    pub fn of(k: &[u8], v: &[u8]) -> HttpHeader {
        HttpHeader {
            key_ptr: k.as_ptr().cast::<c_char>(),
            key_length: k.len(),
            value_ptr: v.as_ptr().cast::<c_char>(),
            value_length: v.len(),
        }
    }

    /// # Safety
    /// As [`EnvoyBuffer::bytes`], for both the key and the value.
    pub unsafe fn key_value<'a>(&self) -> (&'a [u8], &'a [u8]) {
        let k = EnvoyBuffer {
            ptr: self.key_ptr,
            length: self.key_length,
        };
        let v = EnvoyBuffer {
            ptr: self.value_ptr,
            length: self.value_length,
        };
        (k.bytes(), v.bytes())
    }
}

// envoy_dynamic_module_type_http_header_type
pub const REQUEST_HEADERS: u32 = 0;
pub const RESPONSE_HEADERS: u32 = 2;

// envoy_dynamic_module_type_http_body_type
pub const RECEIVED_REQUEST_BODY: u32 = 0;
pub const RECEIVED_RESPONSE_BODY: u32 = 2;
/// The response body a filter holds (it answered StopIterationAndBuffer): reachable from any
/// callback of the stream, not only the body hook.
pub const BUFFERED_RESPONSE_BODY: u32 = 3;

// envoy_dynamic_module_type_log_level
pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;
pub const LOG_CRITICAL: u32 = 5;

// envoy_dynamic_module_type_http_callout_init_result
pub const CALLOUT_INIT_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_http_callout_result
pub const CALLOUT_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_metrics_result
pub const METRICS_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_attribute_id
pub const ATTRIBUTE_RESPONSE_CODE_DETAILS: u32 = 16;
pub const ATTRIBUTE_UPSTREAM_ADDRESS: u32 = 41;

// envoy_dynamic_module_type_http_filter_stream_reset_reason
pub const RESET_LOCAL: u32 = 0;

// Statuses returned by the filter hooks (Envoy's Filter{Headers,Data,Trailers}Status).
pub const HEADERS_CONTINUE: u32 = 0;
pub const HEADERS_STOP_ITERATION: u32 = 1;
/// Stops the whole chain until `continue_decoding` (what proxy-wasm's `Pause` does).
pub const HEADERS_STOP_ALL_AND_WATERMARK: u32 = 4;
pub const BODY_CONTINUE: u32 = 0;
/// Holds the body until `continue_encoding` (what proxy-wasm's `Pause` does for a body).
pub const BODY_STOP_AND_BUFFER: u32 = 1;
pub const BODY_STOP_NO_BUFFER: u32 = 3;
pub const TRAILERS_CONTINUE: u32 = 0;
pub const LOCAL_REPLY_CONTINUE: u32 = 0;

extern "C" {
    pub fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
    pub fn envoy_dynamic_module_callback_is_validation_mode() -> bool;
    /// Worker threads; main thread only (program init, config creation).
    pub fn envoy_dynamic_module_callback_get_concurrency() -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_get_worker_index(
        filter: HttpFilterEnvoyPtr,
    ) -> u32;

    // ---- metrics (defined on the config, updated from a filter or the config) ----
    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: HttpFilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: HttpFilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
        filter: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
        config: HttpFilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: HttpFilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;

    // ---- headers ----
    pub fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: HttpFilterEnvoyPtr,
        header_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter: HttpFilterEnvoyPtr,
        header_type: u32,
        result_headers: *mut HttpHeader,
    ) -> bool;
    /// Sets (replacing every value) or, with a null value, removes a header.
    pub fn envoy_dynamic_module_callback_http_set_header(
        filter: HttpFilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    // ---- local replies and stream control ----
    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: HttpFilterEnvoyPtr,
        status_code: u32,
        headers: *mut HttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: HttpFilterEnvoyPtr);
    pub fn envoy_dynamic_module_callback_http_filter_continue_encoding(filter: HttpFilterEnvoyPtr);
    pub fn envoy_dynamic_module_callback_http_filter_reset_stream(
        filter: HttpFilterEnvoyPtr,
        reason: u32,
        details: ModuleBuffer,
    );

    // ---- bodies ----
    pub fn envoy_dynamic_module_callback_http_get_body_size(
        filter: HttpFilterEnvoyPtr,
        body_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: HttpFilterEnvoyPtr,
        body_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: HttpFilterEnvoyPtr,
        body_type: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_drain_body(
        filter: HttpFilterEnvoyPtr,
        body_type: u32,
        number_of_bytes: usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_append_body(
        filter: HttpFilterEnvoyPtr,
        body_type: u32,
        data: ModuleBuffer,
    ) -> bool;

    // ---- stream attributes ----
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: HttpFilterEnvoyPtr,
        attribute_id: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    // ---- callouts ----
    pub fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: HttpFilterEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut HttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: HttpFilterConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut HttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;

    // ---- per-stream scheduling: an event committed from any thread runs the stream's
    // `on_http_filter_scheduled` on its worker thread (never after the stream is gone) ----
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(
        filter: HttpFilterEnvoyPtr,
    ) -> FilterSchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: FilterSchedulerPtr,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(
        scheduler: FilterSchedulerPtr,
    );

    // ---- main-thread scheduling for the config ----
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: HttpFilterConfigEnvoyPtr,
    ) -> ConfigSchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: ConfigSchedulerPtr,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler: ConfigSchedulerPtr,
    );
}
