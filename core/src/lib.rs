//! Host-free core of mcp-resume-guard.
//!
//! Everything here is plain functions over plain data, so it runs natively, in the
//! ownership service, and inside the proxy-wasm filter alike. Nothing here calls a host.

pub mod config;
pub mod cursor;
pub mod decision;
pub mod ownership;
pub mod sse;
pub mod stream;
