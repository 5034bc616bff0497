//! The *floor* bench fixture: a Rust proxy-wasm HTTP filter that does nothing.
//!
//! Envoy still enters the VM for every header and body callback, so the difference between
//! this filter and bare Envoy is the proxy-wasm tax, and the difference between the guard and
//! this filter is the guard's own cost.
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

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

impl HttpContext for Pass {}
