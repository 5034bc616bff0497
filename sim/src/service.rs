//! The ownership service: its store (memory, or a real Redis through the service's own Redis
//! store and Lua scripts) behind the very handlers its HTTP routes call (`mcp_ownership::api`),
//! on the simulated clock. The memory store's futures complete at once, so a no-op waker polls
//! them; a Redis store's run to completion on a current-thread Tokio runtime, one `block_on` per
//! request, so the simulation stays one thread and every call sees the simulated `now_ms`.
//! Nothing here waits (`record_wait` is 0: the world re-asks a refusal that records in flight
//! could turn, and a branch end that would be `forked`, as the service's wait does).
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
use mcp_ownership::{RedisOptions, RedisStore};
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

/// The store a run uses (`--store`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StoreKind {
    #[default]
    Memory,
    /// `redis://HOST:PORT`: a real redis-server.
    Redis(String),
}

impl StoreKind {
    pub fn parse(s: &str) -> Result<StoreKind, String> {
        match s {
            "memory" => Ok(StoreKind::Memory),
            url if url.starts_with("redis://") => Ok(StoreKind::Redis(url.to_owned())),
            _ => Err(format!("--store {s}: memory or redis://HOST:PORT")),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Redis(url) => url,
        }
    }
}

/// Every Redis world gets its own key prefix, so runs (and tests) share one server.
static NEXT_PREFIX: AtomicU64 = AtomicU64::new(0);

/// What the handlers run over (one per world: size does not matter).
#[allow(clippy::large_enum_variant)]
enum Backend {
    Memory(AppState<MemoryStore>),
    Redis {
        state: AppState<RedisStore>,
        rt: tokio::runtime::Runtime,
        /// For the faults (delete keys, flush the world's keys).
        admin: redis::Connection,
        url: String,
        prefix: String,
    },
}

/// The ownership service on the simulated clock.
pub struct Service {
    backend: Backend,
    limits: Limits,
    clock: Arc<AtomicU64>,
}

fn opts() -> ResumeOptions {
    ResumeOptions {
        record_wait: Duration::ZERO,
        ..ResumeOptions::default()
    }
}

fn state<S: Store>(store: S, clock: &Arc<AtomicU64>) -> AppState<S> {
    let read = clock.clone();
    AppState::new(store, opts()).with_clock(Arc::new(move || read.load(Ordering::Relaxed)))
}

/// A Redis store on `url` under `prefix`, made inside `rt` (the store's connections live there).
fn redis_store(
    rt: &tokio::runtime::Runtime,
    url: &str,
    prefix: &str,
    limits: Limits,
) -> Result<RedisStore, String> {
    let o = RedisOptions {
        prefix: prefix.to_owned(),
        // Real time: a loaded machine must not turn a slow answer into a 503 (that would make
        // the run depend on the machine, not on its seed).
        op_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
        // Unbounded by bytes (the sim's Redis has no maxmemory): the memory store's
        // `max_bytes` has no Redis counterpart to compare with.
        max_bytes: Some(1 << 40),
        ..RedisOptions::default()
    };
    let _guard = rt.enter();
    RedisStore::new(url, limits, o).map_err(|e| format!("redis store {url}: {e}"))
}

impl Service {
    /// The memory store with the default limits.
    pub fn new() -> Self {
        Service::memory(Limits::default())
    }

    pub fn memory(limits: Limits) -> Self {
        let clock = Arc::new(AtomicU64::new(0));
        Service {
            backend: Backend::Memory(state(MemoryStore::new(limits), &clock)),
            limits,
            clock,
        }
    }

    /// The service over `kind`; a Redis store must answer now (else `Err` names why).
    pub fn open(kind: &StoreKind, limits: Limits) -> Result<Self, String> {
        let url = match kind {
            StoreKind::Memory => return Ok(Service::memory(limits)),
            StoreKind::Redis(url) => url,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let prefix = format!(
            "sim{}-{}:",
            std::process::id(),
            NEXT_PREFIX.fetch_add(1, Ordering::Relaxed)
        );
        let store = redis_store(&rt, url, &prefix, limits)?;
        rt.block_on(store.health())
            .map_err(|e| format!("redis store {url}: {e}"))?;
        let admin = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .map_err(|e| format!("redis {url}: {e}"))?;
        let clock = Arc::new(AtomicU64::new(0));
        Ok(Service {
            backend: Backend::Redis {
                state: state(store, &clock),
                rt,
                admin,
                url: url.clone(),
                prefix,
            },
            limits,
            clock,
        })
    }

    pub fn is_redis(&self) -> bool {
        matches!(self.backend, Backend::Redis { .. })
    }

    /// One request to the service at simulated time `now_ms`.
    pub fn handle(&mut self, now_ms: u64, path: &str, body: Vec<u8>) -> Answer {
        self.clock.store(now_ms, Ordering::Relaxed);
        let body = JsonBytes(Bytes::from(body));
        match &self.backend {
            Backend::Memory(st) => {
                block_on(call(st.clone(), path, body)).unwrap_or((503, Vec::new()))
            }
            Backend::Redis { state, rt, .. } => rt.block_on(call(state.clone(), path, body)),
        }
    }

    /// One try of a branch's clean end that does not wait (`api::branch_settled`): `None`
    /// while the answer waits on registrations that neither relayed nor ended (the world
    /// asks again a little later, as the service's own wait re-checks).
    pub fn branch_settled(&mut self, now_ms: u64, body: Vec<u8>) -> Option<Answer> {
        self.clock.store(now_ms, Ordering::Relaxed);
        let body = JsonBytes(Bytes::from(body));
        let settled = |r: Result<Option<axum::Json<_>>, api::ApiError>| match r {
            Ok(None) => None,
            Ok(Some(j)) => Some(answer(Ok(j))),
            Err(e) => Some(answer::<()>(Err(e))),
        };
        match &self.backend {
            Backend::Memory(st) => block_on(api::branch_settled(State(st.clone()), body))
                .map_or(Some((503, Vec::new())), settled),
            Backend::Redis { state, rt, .. } => {
                settled(rt.block_on(api::branch_settled(State(state.clone()), body)))
            }
        }
    }

    /// The store loses every key (a restart of a store without persistence).
    pub fn wipe(&mut self) {
        match &mut self.backend {
            Backend::Memory(_) => *self = Service::memory(self.limits),
            Backend::Redis { admin, prefix, .. } => delete_matching(admin, &format!("{prefix}*")),
        }
    }

    /// The ownership service restarts (a rollout): the memory store loses everything; a Redis
    /// store keeps every key, the new process gets new connections and loads its scripts anew.
    pub fn restart(&mut self) {
        match &mut self.backend {
            Backend::Memory(_) => self.wipe(),
            Backend::Redis {
                state: st,
                rt,
                url,
                prefix,
                ..
            } => {
                if let Ok(store) = redis_store(rt, url, prefix, self.limits) {
                    *st = state(store, &self.clock);
                }
            }
        }
    }

    /// Redis only: every branch table (`P{S}:b:<inc>`) is lost (a fault of the shared store);
    /// `false` for the memory store.
    pub fn lose_branch_tables(&mut self) -> bool {
        match &mut self.backend {
            Backend::Memory(_) => false,
            Backend::Redis { admin, prefix, .. } => {
                delete_matching(admin, &format!("{prefix}*:b:*"));
                true
            }
        }
    }
}

/// The handler for `path` over `st`, as its route runs it.
async fn call<S: Store>(st: AppState<S>, path: &str, body: JsonBytes) -> Answer {
    let st = State(st);
    match path {
        RESUME_PATH => answer(api::resume(st, body).await),
        RECORDS_PATH => answer(api::records(st, body).await),
        BRANCH_PATH => answer(api::branch(st, body).await),
        _ => (404, Vec::new()),
    }
}

/// Deletes the keys matching `pattern` (the sim's own prefix only). A failure leaves them: the
/// run then simply has no such fault.
fn delete_matching(admin: &mut redis::Connection, pattern: &str) {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query(admin)
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: Result<u64, _> = redis::cmd("DEL").arg(&keys).query(admin);
    }
}

impl Drop for Service {
    /// A Redis world leaves no keys behind.
    fn drop(&mut self) {
        if let Backend::Redis { admin, prefix, .. } = &mut self.backend {
            delete_matching(admin, &format!("{prefix}*"));
        }
    }
}

impl Default for Service {
    fn default() -> Self {
        Service::new()
    }
}
