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
        Some(Box::new(Pass))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Pass;

impl Context for Pass {}

fn flag(f: &str) -> bool {
    MODE.split(',').any(|m| m == f)
}

impl HttpContext for Pass {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
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
            if let Ok(Some(b)) = body {
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
