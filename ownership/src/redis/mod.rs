//! The shared store: Redis, one endpoint or a Redis Cluster. Several ownership instances (and
//! so several guards) share one truth.
//!
//! - **Atomic.** Every record is one Lua script over the keys of its session, and every verdict
//!   snapshot is one Lua script too (`lua.rs`), so a supersede, a trim, a terminate and a
//!   resume are linearizable with each other. The only fact outside a session's keys is the
//!   owner epoch (`owner_gone` is about an address, not a session): a snapshot reads it right
//!   after its session script, so an `owner_gone` landing during a resume already counts; the
//!   error is toward a new stream, never toward a blind replay.
//! - **Cluster.** All keys of a session carry the hash tag `{<session>}`, and every script
//!   names all the keys of the session it reads by name in `KEYS`, so while a slot migrates a
//!   script runs only where all of them are (else Redis answers TRYAGAIN: a 503, fail closed).
//!   Commands of one batch go in one pipeline per session; a pipeline that meets a redirect is
//!   run again command by command, which the cluster client redirects one by one.
//! - **Durable when asked.** With `wait_replicas > 0` every record pipeline ends with `WAIT`,
//!   so a record is acknowledged only once replicas hold it and a failover cannot lose it.
//! - **Bounded.** `max_window` events per incarnation, `max_incarnations_per_session`
//!   incarnations per session, and every key expires `session_idle_ttl + KEEP_GRACE` after the
//!   session's (or the incarnation's) last activity, even if no instance sweeps.
//! - **Fast failure.** Every operation is bounded by `op_timeout` (default 150 ms): with Redis
//!   down (or a Cluster failing over), the service answers 503 `store_unavailable` well inside
//!   the guard's callout timeout, and the connection is re-established in the background when
//!   Redis is back.
//!
//! Here: the store and its keys. `setup`: URL, credentials, TLS. `connection`: links and
//! reconnects. `pipeline`: running a batch. `records`, `snapshot`, `sweep`: the operations;
//! `branches`: a continuation's branch (docs/forks.md). `store`: the
//! [`Store`](crate::store::Store) trait over them, health and stats. `lua`: the
//! scripts and the key layout. `config`: what `INFO` says this Redis can do.
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use redis::Cmd;
use tokio::sync::watch;

use crate::store::{Limits, StoreError};
use config::NodeInfo;
use connection::{ms, Conn, Link};
use setup::{install_tls_provider, target, Target};

mod branches;
pub mod config;
mod connection;
mod lua;
mod pipeline;
mod records;
mod reply;
mod setup;
mod snapshot;
mod store;
mod sweep;

pub use setup::{
    client, is_cluster_url, parse_url, redacted, RedisAuth, RedisOptions, Secret, SetupError,
    CLUSTER_SCHEME, CLUSTER_TLS_SCHEME,
};

/// Keys outlive the idle TTL by this much, so the TTL check in the scripts (on the caller's
/// clock) decides, and Redis's own expiry only frees what nobody swept.
pub const KEEP_GRACE: Duration = Duration::from_secs(60);
/// How long one read of every primary's `INFO` serves the health check and the byte budget.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Sessions freed per sweep round trip.
const SWEEP_PAGE: usize = 500;
/// Sessions whose incarnations are counted exactly for the gauge; beyond, it is extrapolated.
const STATS_SAMPLE: usize = 10_000;

struct LoadedScript {
    code: String,
    sha: String,
}

impl LoadedScript {
    fn new(code: String) -> Self {
        let sha = redis::Script::new(&code).get_hash().to_owned();
        LoadedScript { code, sha }
    }
}

pub struct RedisStore {
    limits: Limits,
    opts: RedisOptions,
    /// `host:port` for messages (never the password of a URL); the first seed of a Cluster.
    addr: String,
    cluster: bool,
    main: Link,
    /// Records when they wait for replicas: `WAIT` blocks its connection, so records get one
    /// of their own and never hold up a resume.
    records: Option<Link>,
    apply: LoadedScript,
    snapshot: LoadedScript,
    sweep: LoadedScript,
    owner_gone: LoadedScript,
    branch: LoadedScript,
    changes: watch::Sender<u64>,
    /// When (caller's clock) this instance last had a write refused or failed; 0: never.
    last_refused: AtomicU64,
    /// Resume lookups whose last-used write Redis refused (answered read-only).
    touch_refused: AtomicU64,
    /// `INFO` of every primary, and when it was read (reused for [`PROBE_EVERY`]).
    probe: tokio::sync::Mutex<Option<(std::time::Instant, Vec<NodeInfo>)>>,
    /// Findings already logged (each change is logged once).
    logged: std::sync::Mutex<Vec<String>>,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis {what}: {e}"))
}

fn corrupt(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("redis {what}: {detail}"))
}

impl RedisStore {
    /// A store for `url`: `redis://HOST:PORT[/DB]` or `rediss://…` (one endpoint), or
    /// `redis-cluster://HOST:PORT[,HOST:PORT…]` or `rediss-cluster://…` (a Redis Cluster, every
    /// node listed a seed). Does not connect: the first operation does, so the service can
    /// start while Redis is down (/healthz says 503 until it answers). Must be called inside a
    /// Tokio runtime.
    pub fn new(url: &str, limits: Limits, opts: RedisOptions) -> Result<Self, SetupError> {
        if opts.prefix.contains(['{', '}']) {
            return Err(SetupError::Prefix(opts.prefix));
        }
        install_tls_provider();
        let target = target(url, &opts)?;
        let addr = match &target {
            Target::Single(c) => c.get_connection_info().addr().to_string(),
            Target::Cluster(_) => {
                let hosts = url.split_once("://").map_or(url, |(_, rest)| rest);
                hosts.rsplit('@').next().unwrap_or(hosts).to_owned()
            }
        };
        let cluster = matches!(target, Target::Cluster(_));
        let main = Link::new(&target, &opts)?;
        let records = if opts.wait_replicas > 0 {
            Some(Link::new(&target, &opts)?)
        } else {
            None
        };
        let (changes, _) = watch::channel(0);
        Ok(RedisStore {
            limits,
            opts,
            addr,
            cluster,
            main,
            records,
            apply: LoadedScript::new(lua::apply_script()),
            snapshot: LoadedScript::new(lua::snapshot_script()),
            sweep: LoadedScript::new(lua::sweep_script()),
            owner_gone: LoadedScript::new(lua::owner_gone_script()),
            branch: LoadedScript::new(lua::branch_script()),
            changes,
            last_refused: AtomicU64::new(0),
            touch_refused: AtomicU64::new(0),
            probe: tokio::sync::Mutex::new(None),
            logged: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The shared multiplexed connection (cheap clone; a Cluster's is made by the first call).
    async fn conn(&self, what: &str) -> Result<Conn, StoreError> {
        self.main.get().await.map_err(|e| self.fail(what, e))
    }

    /// A Redis error as a store error; READONLY also replaces a single endpoint's connections.
    fn fail(&self, what: &str, e: redis::RedisError) -> StoreError {
        self.main.replace_if_readonly(&e);
        if let Some(r) = &self.records {
            r.replace_if_readonly(&e);
        }
        unavailable(what, e)
    }

    /// Whether a Cluster connection is held now; `None` for one Redis or while connecting.
    pub fn cluster_connected(&self) -> Option<bool> {
        self.main.cluster_connected()
    }

    /// Cluster connections dropped as broken and made anew, both links (0 for one Redis).
    pub fn reconnects(&self) -> u64 {
        self.main.dropped() + self.records.as_ref().map_or(0, Link::dropped)
    }

    /// `host:port` of the Redis server (a Cluster: its seeds).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Key base of a session: every key of it starts with this and carries its hash tag.
    pub fn session_base(&self, session: &str) -> String {
        format!("{}{{{session}}}", self.opts.prefix)
    }

    /// `numkeys` and the keys a script over this session names: the session's hash and set,
    /// and the incarnation's four keys. Named, so that while a slot migrates Redis runs the
    /// script only on the node that holds all of them (TRYAGAIN otherwise).
    fn session_keys(&self, c: &mut Cmd, base: &str, incarnation: Option<&str>) {
        match incarnation {
            Some(inc) => c
                .arg(6)
                .arg(format!("{base}:s"))
                .arg(format!("{base}:n"))
                .arg(format!("{base}:i:{inc}"))
                .arg(format!("{base}:w:{inc}"))
                .arg(format!("{base}:l:{inc}"))
                .arg(format!("{base}:b:{inc}")),
            None => c.arg(2).arg(format!("{base}:s")).arg(format!("{base}:n")),
        };
    }

    fn index_key(&self) -> String {
        format!("{}sessions", self.opts.prefix)
    }

    fn pending_key(&self) -> String {
        format!("{}pending", self.opts.prefix)
    }

    fn refused_key(&self) -> String {
        format!("{}refused", self.opts.prefix)
    }

    fn owners_key(&self) -> String {
        format!("{}owners", self.opts.prefix)
    }

    fn keep_ms(&self) -> u64 {
        self.limits
            .session_idle_ttl_ms
            .saturating_add(ms(KEEP_GRACE))
    }

    /// Run `fut` within `limit`; a timeout is an `Unavailable` naming the operation.
    async fn bounded<T>(
        &self,
        what: &str,
        limit: Duration,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(unavailable(
                what,
                format!("no answer within {} ms", limit.as_millis()),
            )),
        }
    }
}
