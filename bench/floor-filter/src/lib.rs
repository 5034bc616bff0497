//! The *floor* bench fixture: a Rust proxy-wasm HTTP filter that does nothing.
//!
//! Envoy still enters the VM for every header and body callback, so the difference between
//! this filter and bare Envoy is the proxy-wasm tax, and the difference between the guard and
//! this filter is the guard's own cost.
//!
//! For experiments only, `FLOOR_MODE` at build time makes it touch response bodies the way a
//! rewriting filter must: `get` (copy each chunk into the VM) or `getset` (and write it back).
//! The default build, the floor, does neither.
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

impl HttpContext for Pass {
    fn on_http_response_body(&mut self, size: usize, _end_of_stream: bool) -> Action {
        if MODE.is_empty() {
            return Action::Continue;
        }
        let body = proxy_wasm::hostcalls::get_buffer(
            proxy_wasm::types::BufferType::HttpResponseBody,
            0,
            size,
        );
        if MODE == "getset" {
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
