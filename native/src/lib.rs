//! mcp-resume-guard as an Envoy dynamic module: a native HTTP filter loaded by Envoy's
//! `envoy.filters.http.dynamic_modules` filter as `libmcp_resume_guard_native.so`.
//!
//! The binding to Envoy's C ABI is written here (`abi`), not taken from an SDK. Every event hook
//! catches panics, so none crosses the FFI boundary (build with `panic = "unwind"`, as the
//! `native` profile does).

mod abi;
mod hooks;
