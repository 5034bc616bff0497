//! The ownership service: its memory store behind the very handlers its HTTP routes call
//! (`mcp_ownership::api`), on the simulated clock. The store's futures complete at once, so a
//! no-op waker polls them; nothing here waits (`record_wait` is 0: the world re-asks a refusal
//! that records in flight could turn, as the service's wait does).
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use mcp_ownership::api::{self, AppState, JsonBytes};
use mcp_ownership::memory::MemoryStore;
use mcp_ownership::resume::ResumeOptions;
use mcp_ownership::store::{Limits, Store};
use mcp_resume_core::ownership::{BRANCH_PATH, RECORDS_PATH, RESUME_PATH};
use serde::Serialize;

/// Polls a future that never waits on anything outside the simulation.
fn block_on<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..64 {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
    }
    None
}

/// The service over a store whose futures complete without waiting (the memory store; a
/// networked store needs a runtime to poll it, which this loop does not have yet).
pub struct Service<S: Store = MemoryStore> {
    state: AppState<S>,
    clock: Arc<AtomicU64>,
}

/// An HTTP answer: status and body.
pub type Answer = (u32, Vec<u8>);

fn answer<T: Serialize>(r: Result<axum::Json<T>, api::ApiError>) -> Answer {
    match r {
        Ok(axum::Json(v)) => (200, serde_json::to_vec(&v).unwrap_or_default()),
        Err(e) => (
            u32::from(e.status.as_u16()),
            serde_json::to_vec(&e.body).unwrap_or_default(),
        ),
    }
}

impl Service<MemoryStore> {
    pub fn new() -> Self {
        Service::over(MemoryStore::new(Limits::default()))
    }

    /// The store loses every key (a restart of a store without persistence).
    pub fn wipe(&mut self) {
        *self = Service::new();
    }
}

impl<S: Store> Service<S> {
    /// The service over `store`, on the simulated clock, waiting for no record (see above).
    pub fn over(store: S) -> Self {
        let clock = Arc::new(AtomicU64::new(0));
        let read = clock.clone();
        let opts = ResumeOptions {
            record_wait: Duration::ZERO,
            ..ResumeOptions::default()
        };
        let state =
            AppState::new(store, opts).with_clock(Arc::new(move || read.load(Ordering::Relaxed)));
        Service { state, clock }
    }

    /// One request to the service at simulated time `now_ms`.
    pub fn handle(&mut self, now_ms: u64, path: &str, body: Vec<u8>) -> Answer {
        self.clock.store(now_ms, Ordering::Relaxed);
        let st = State(self.state.clone());
        let body = JsonBytes(Bytes::from(body));
        let out = match path {
            RESUME_PATH => block_on(api::resume(st, body)).map(answer),
            RECORDS_PATH => block_on(api::records(st, body)).map(answer),
            BRANCH_PATH => block_on(api::branch(st, body)).map(answer),
            _ => Some((404, Vec::new())),
        };
        out.unwrap_or((503, Vec::new()))
    }
}

impl Default for Service<MemoryStore> {
    fn default() -> Self {
        Service::new()
    }
}
