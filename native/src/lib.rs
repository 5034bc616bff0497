//! mcp-resume-guard as an Envoy dynamic module: a native HTTP filter loaded by Envoy's
//! `envoy.filters.http.dynamic_modules` filter as `libmcp_resume_guard_native.so`.
//!
//! A second thin adapter, next to the proxy-wasm one, over the core's host-free exchange: the
//! hooks (`hooks`) hand Envoy's events to [`mcp_resume_core::exchange`] and carry out what it
//! asks through the core's `Host` trait (`host`). The binding to Envoy's C ABI (`abi`) is
//! written here, not taken from an SDK. Every hook catches panics, so none crosses the FFI
//! boundary (the `native` build profile unwinds instead of aborting).

// Public for the in-process tests (tests/adapter.rs): its types are the ones their mock of
// Envoy's callbacks is written with.
pub mod abi;
mod hooks;
mod host;
mod module;
