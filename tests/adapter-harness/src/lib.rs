//! In-process tests of the guard's two adapters, without Envoy.
//!
//! The adapters only translate: they read headers and bodies from the proxy, hand them to the
//! core's exchange, and carry out what it asks. [`scenarios`] drives that glue through the
//! [`scenarios::Proxy`] trait, once per adapter: [`wasm`] runs the real `.wasm` under a small
//! proxy-wasm host, and the native module's tests (`native/tests/adapter.rs`) implement the
//! trait over a mock of Envoy's dynamic-module callbacks.
pub mod scenarios;
pub mod wasm;
