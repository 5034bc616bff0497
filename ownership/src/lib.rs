//! mcp-ownership: which replica owns which SSE stream incarnation, and may a cursor continue it.
//!
//! Small on purpose: HTTP/JSON handlers ([`api`]) over a [`store::Store`]. The decision itself
//! is the core's `decide`; this crate only gathers an atomic snapshot of facts for it.
pub mod api;
pub mod memory;
pub mod metrics;
pub mod redis;
mod redis_lua;
pub mod resume;
pub mod store;

use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use mcp_resume_core::ownership::{MAX_RECORDS_BODY_BYTES, RECORDS_PATH, RESUME_PATH};

pub use api::AppState;
pub use memory::MemoryStore;
pub use redis::{RedisOptions, RedisStore};
pub use resume::ResumeOptions;
pub use store::{Limits, Store};

/// The whole HTTP API, ready to serve or to embed.
pub fn router<S: Store>(state: AppState<S>) -> Router {
    let metrics = state.metrics.clone();
    Router::new()
        .route(RESUME_PATH, post(api::resume::<S>))
        .route(RECORDS_PATH, post(api::records::<S>))
        .route(api::OWNERS_GONE_PATH, post(api::owners_gone::<S>))
        .route("/healthz", get(api::healthz::<S>))
        .route("/metrics", get(api::metrics::<S>))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_RECORDS_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            metrics,
            api::count_requests,
        ))
        .with_state(state)
}

/// Free idle-expired sessions every `every` until the runtime stops. Stores with native key
/// expiry make this a cheap no-op.
pub fn spawn_sweeper<S: Store>(
    state: &AppState<S>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let st = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = (st.clock)();
            let _ = resume::timed(&st.metrics, "sweep", st.store.sweep(now)).await;
        }
    })
}
