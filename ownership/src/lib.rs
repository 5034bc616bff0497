//! mcp-ownership: which replica owns which SSE stream incarnation, and may a cursor continue it.
//!
//! Small on purpose: HTTP/JSON handlers ([`api`]) over a [`store::Store`]. The decision itself
//! is the core's `decide`; this crate only gathers an atomic snapshot of facts for it.
pub mod api;
pub mod auth;
pub mod clock;
pub mod error;
pub mod memory;
pub mod metrics;
pub mod redis;
pub mod resume;
pub mod store;

use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use mcp_resume_core::ownership::{BRANCH_PATH, MAX_RECORDS_BODY_BYTES, RECORDS_PATH, RESUME_PATH};

pub use api::AppState;
pub use auth::{Auth, TokenFile};
pub use memory::MemoryStore;
pub use redis::{RedisOptions, RedisStore};
pub use resume::ResumeOptions;
pub use store::{Limits, Store};

/// The whole HTTP API, ready to serve or to embed.
pub fn router<S: Store>(state: AppState<S>) -> Router {
    let metrics = state.metrics.clone();
    let auth = state.auth.clone();
    Router::new()
        .route(RESUME_PATH, post(api::resume::<S>))
        .route(RECORDS_PATH, post(api::records::<S>))
        .route(BRANCH_PATH, post(api::branch::<S>))
        .route(auth::OWNERS_GONE_PATH, post(api::owners_gone::<S>))
        .route("/healthz", get(api::healthz::<S>))
        .route("/metrics", get(api::metrics::<S>))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_RECORDS_BODY_BYTES))
        // Outside the handlers and the body limit: a refused request is never read further.
        .layer(axum::middleware::from_fn_with_state(
            auth,
            auth::require_token,
        ))
        .layer(axum::middleware::from_fn_with_state(
            metrics,
            api::count_requests,
        ))
        .with_state(state)
}

/// Re-read the token files every `every` (a miss also re-reads at once; this makes removed
/// tokens stop working without a request having to fail first).
pub fn spawn_token_reload(auth: auth::Auth, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // File reads are blocking; they are tiny, but keep them off the async workers.
            let a = auth.clone();
            let _ = tokio::task::spawn_blocking(move || a.refresh()).await;
        }
    })
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
