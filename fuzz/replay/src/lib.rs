//! Fuzz target bodies, one function per target. `fuzz/fuzz_targets/*.rs` call them under
//! libFuzzer (nightly, coverage-guided); `tests/replay.rs` calls them on every committed corpus
//! input (stable, part of `cargo test --workspace`). A body panics, through `assert!`, exactly
//! when the code under test panics or breaks one of the invariants the body states.
mod client;
mod config;
mod cursor;
mod eventsource;
mod exchange;
mod keys;
mod ownership;
mod request_ids;
mod sse;
mod stream;

pub use config::config_parse;
pub use cursor::cursor_decode;
pub use eventsource::eventsource;
pub use exchange::exchange;
pub use ownership::ownership_request;
pub use request_ids::request_ids;
pub use sse::sse_rewriter;
pub use stream::stream_state;

/// A target body: one fuzz input in, a panic on any violated invariant.
pub type Body = fn(&[u8]);

/// Every target by name, as its corpus directory (`fuzz/corpus/<name>`) and fuzz binary are named.
pub const TARGETS: &[(&str, Body)] = &[
    ("cursor_decode", cursor_decode),
    ("sse_rewriter", sse_rewriter),
    ("stream_state", stream_state),
    ("config_parse", config_parse),
    ("ownership_request", ownership_request),
    ("exchange", exchange),
    ("eventsource", eventsource),
    ("request_ids", request_ids),
];
