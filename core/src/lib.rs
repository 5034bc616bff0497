//! Host-free core of mcp-resume-guard.
//!
//! Everything here is plain data and plain functions, so it runs natively, in the ownership
//! service, and inside the proxy-wasm filter alike. Nothing here calls a proxy: the exchange
//! asks and tells a [`host::Host`], which each adapter implements.

pub mod config;
pub mod cursor;
pub mod decision;
pub mod eventsource;
pub mod exchange;
pub mod host;
pub mod jsonrpc;
pub mod ownership;
pub mod path;
pub mod records;
pub mod sse;
pub mod stream;
