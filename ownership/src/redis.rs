//! The shared store: Redis, one endpoint or a Redis Cluster. Several ownership instances (and
//! so several guards) share one truth.
//!
//! - **Atomic.** Every record is one Lua script over the keys of its session, and every verdict
//!   snapshot is one Lua script too (`redis_lua.rs`), so a supersede, a trim, a terminate and a
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
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mcp_resume_core::decision::{IncarnationFacts, SessionState};
use mcp_resume_core::ownership::{Record, SessionEnd, StreamKind, LONG_IDS_KEPT};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::watch;

use crate::redis_config::{self, NodeInfo};
use crate::redis_lua;
use crate::store::{
    Applied, CursorId, Facts, IncarnationView, Limits, Refusal, SnapshotQuery, Store, StoreError,
    StoreStats, HIGH_WATER_PERCENT, STORE_FULL,
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
/// `--store` schemes of a Redis Cluster: plain and TLS.
pub const CLUSTER_SCHEME: &str = "redis-cluster://";
pub const CLUSTER_TLS_SCHEME: &str = "rediss-cluster://";

/// A secret string: never shown by `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Who to be on Redis (ACL user and password; AUTH) and whom to trust (TLS). These override
/// any user or password in the URL.
#[derive(Debug, Clone, Default)]
pub struct RedisAuth {
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// PEM CA certificates for `rediss://`; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
}

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prepended to every key (a namespace; no `{` or `}`). Default `mrg:`.
    pub prefix: String,
    /// Upper bound on one store operation (snapshot, apply, health), connecting included.
    pub op_timeout: Duration,
    /// Upper bound on one connection attempt.
    pub connect_timeout: Duration,
    /// Upper bound on one sweep or stats call (they touch many sessions).
    pub bulk_timeout: Duration,
    /// Replicas that must hold a record before it is acknowledged (`WAIT`); 0: the primary's
    /// word is enough.
    pub wait_replicas: u32,
    /// Bytes of Redis memory (`used_memory`, per primary) above 90% of which new sessions are
    /// refused; `None`: 80% of the primary's `maxmemory`, or no budget when it has none.
    pub max_bytes: Option<u64>,
    pub auth: RedisAuth,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "mrg:".to_owned(),
            op_timeout: Duration::from_millis(150),
            connect_timeout: Duration::from_millis(100),
            bulk_timeout: Duration::from_secs(2),
            wait_replicas: 0,
            max_bytes: None,
            auth: RedisAuth::default(),
        }
    }
}

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

/// One command and the key that places it: on a Cluster, commands whose keys share a hash
/// tag go in one pipeline, in order.
struct Placed {
    key: String,
    cmd: Cmd,
}

/// The part of a key that picks its hash slot (Redis Cluster's rule).
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// Milliseconds on a monotonic clock, from the first call (never 0).
fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let ms = START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX).saturating_add(1)
}

/// A Cluster connection that answers nothing for this long (and at least 4 operation
/// bounds) is dropped and made anew.
const STALL_MIN: Duration = Duration::from_secs(1);

/// Whether one Cluster connection still answers. The cluster client can wedge: in a slot
/// refresh that never ends after a failover, it answers nothing and queues every request in
/// memory (its queue only drains when the refresh completes). Dropping the connection ends
/// its task and frees the queue; a new one starts from the seeds.
#[derive(Default)]
struct Pulse {
    /// `clock_ms` when the oldest request sent since the last answer was sent; 0: none.
    waiting_since: AtomicU64,
}

impl Pulse {
    fn sent(&self, now: u64) {
        use Ordering::Relaxed;
        let _ = self
            .waiting_since
            .compare_exchange(0, now, Relaxed, Relaxed);
    }

    /// Any reply counts, errors from Redis included (TRYAGAIN, NOSCRIPT: it is listening);
    /// a timeout or a broken connection does not.
    fn settle<T>(&self, r: &redis::RedisResult<T>) {
        let answered = match r {
            Ok(_) => true,
            Err(e) => {
                !(e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.kind() == redis::ErrorKind::ClusterConnectionNotFound)
            }
        };
        if answered {
            self.waiting_since.store(0, Ordering::Relaxed);
        }
    }

    fn stalled(&self, now: u64, stall_ms: u64) -> bool {
        let since = self.waiting_since.load(Ordering::Relaxed);
        since != 0 && now.saturating_sub(since) >= stall_ms
    }
}

/// A request on a Cluster connection, watched by its pulse.
fn pulsed<'a, T: Send + 'a>(pulse: &Arc<Pulse>, fut: RedisFuture<'a, T>) -> RedisFuture<'a, T> {
    let pulse = Arc::clone(pulse);
    pulse.sent(clock_ms());
    Box::pin(async move {
        let r = fut.await;
        pulse.settle(&r);
        r
    })
}

/// A connection of either kind.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection, Arc<Pulse>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c, pulse) => pulsed(pulse, c.req_packed_command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c, pulse) => pulsed(pulse, c.req_packed_commands(cmd, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c, _) => c.get_db(),
        }
    }
}

/// Where `--store` points, parsed (made once per store: size does not matter).
#[allow(clippy::large_enum_variant)]
enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

/// One multiplexed connection to the store, made when first needed.
enum Link {
    /// Replaced (re-resolving the host) when Redis says READONLY: after a failover the
    /// endpoint's name points at the new primary, the old connection at a replica.
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
        conn: std::sync::Mutex<ConnectionManager>,
    },
    /// Connected by the first operation (the service starts while the Cluster is down); the
    /// cluster client then follows slot moves and failovers itself. Made anew when it has
    /// answered nothing for `stall_ms` (see `Pulse`).
    Cluster {
        client: ClusterClient,
        conn: tokio::sync::Mutex<Option<(ClusterConnection, Arc<Pulse>)>>,
        stall_ms: u64,
        /// Connections dropped as broken: stalled, or every primary failing its PING.
        dropped: AtomicU64,
    },
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Link {
    fn new(target: &Target, opts: &RedisOptions) -> Result<Link, String> {
        match target {
            Target::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(opts.connect_timeout))
                    .set_response_timeout(Some(opts.op_timeout))
                    // One attempt per reconnect: the next operation triggers the next attempt, so
                    // a Redis that comes back is used at once and one that stays away costs no
                    // retries.
                    .set_number_of_retries(0)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(100));
                let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    .map_err(|e| format!("redis: {e}"))?;
                Ok(Link::Single {
                    client: client.clone(),
                    config,
                    conn: std::sync::Mutex::new(conn),
                })
            }
            Target::Cluster(client) => Ok(Link::Cluster {
                client: client.clone(),
                conn: tokio::sync::Mutex::new(None),
                stall_ms: ms(STALL_MIN.max(opts.op_timeout * 4)),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    async fn get(&self) -> Result<Conn, redis::RedisError> {
        match self {
            Link::Single { conn, .. } => Ok(Conn::Single(lock(conn).clone())),
            Link::Cluster {
                client,
                conn,
                stall_ms,
                dropped,
            } => {
                let mut slot = conn.lock().await;
                if let Some((c, pulse)) = slot.as_ref() {
                    if !pulse.stalled(clock_ms(), *stall_ms) {
                        return Ok(Conn::Cluster(c.clone(), Arc::clone(pulse)));
                    }
                    // Its task ends (and what it queued is freed) with the last clone.
                    *slot = None;
                    dropped.fetch_add(1, Ordering::Relaxed);
                    eprintln!(
                        "mcp-ownership: the Redis Cluster connection answered nothing for {stall_ms} ms; connecting anew"
                    );
                }
                let c = client.get_async_connection().await?;
                let pulse = Arc::new(Pulse::default());
                *slot = Some((c.clone(), Arc::clone(&pulse)));
                Ok(Conn::Cluster(c, pulse))
            }
        }
    }

    /// Drop a Cluster connection after an outage; the next operation connects anew. The
    /// cluster client keeps requests it could not serve during a failover or a restart after
    /// their callers gave up (its memory grew with every outage): a fresh one starts empty.
    /// Busy (someone is connecting): nothing to drop.
    fn renew_cluster(&self) {
        if let Link::Cluster { conn, dropped, .. } = self {
            if let Ok(mut slot) = conn.try_lock() {
                if slot.take().is_some() {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Cluster connections dropped as broken so far (0 for one Redis).
    fn dropped(&self) -> u64 {
        match self {
            Link::Cluster { dropped, .. } => dropped.load(Ordering::Relaxed),
            Link::Single { .. } => 0,
        }
    }

    /// `Some(held)` for a Cluster link (`None`: one Redis, or a connect under way).
    fn cluster_connected(&self) -> Option<bool> {
        match self {
            Link::Cluster { conn, .. } => conn.try_lock().ok().map(|slot| slot.is_some()),
            Link::Single { .. } => None,
        }
    }

    /// READONLY on one endpoint: it reaches a replica now; the next operation resolves anew.
    fn replace_if_readonly(&self, e: &redis::RedisError) {
        let readonly = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
            || e.to_string().contains("READONLY")
            || e.to_string().contains("ReadOnly");
        if let (
            true,
            Link::Single {
                client,
                config,
                conn,
            },
        ) = (readonly, self)
        {
            if let Ok(fresh) =
                ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            {
                *lock(conn) = fresh;
            }
        }
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

/// A Redis URL safe to print: any user and password replaced by `***`.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Is this `--store` value a Redis Cluster (`redis-cluster://`, `rediss-cluster://`)?
pub fn is_cluster_url(url: &str) -> bool {
    url.starts_with(CLUSTER_SCHEME) || url.starts_with(CLUSTER_TLS_SCHEME)
}

/// Check a `--store` Redis URL (`redis://…`, `rediss://…`, `redis-cluster://…`,
/// `rediss-cluster://…`) without connecting. The error says what is wrong and never shows a
/// password.
pub fn parse_url(url: &str) -> Result<(), String> {
    target(url, &RedisOptions::default()).map(|_| ())
}

fn target(url: &str, opts: &RedisOptions) -> Result<Target, String> {
    if is_cluster_url(url) {
        cluster_client(url, opts).map(Target::Cluster)
    } else {
        client(url, &opts.auth).map(Target::Single)
    }
}

/// `HOST:PORT` with a usable port (the port is optional: `default_port` ok).
fn check_hostport(hostport: &str, shown: &str, want: &str) -> Result<(), String> {
    if hostport.is_empty() || hostport.starts_with(':') {
        return Err(format!("expected {want}, got {shown:?} (no host)"));
    }
    if let Some((_, port)) = hostport.rsplit_once(':') {
        if !hostport.ends_with(']') && port.parse::<u16>().map_or(true, |p| p == 0) {
            // Not the port's text: without an '@', a mistyped `user:password` lands here.
            return Err(format!("expected {want} (bad port)"));
        }
    }
    Ok(())
}

/// The client for `url` with `auth` applied (credentials, TLS roots).
pub fn client(url: &str, auth: &RedisAuth) -> Result<redis::Client, String> {
    let shown = redacted(url);
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
        .ok_or_else(|| {
            format!("expected redis://HOST:PORT or rediss://HOST:PORT, got {shown:?}")
        })?;
    let hostport = rest.rsplit('@').next().unwrap_or(rest);
    let hostport = hostport.split('/').next().unwrap_or(hostport);
    check_hostport(hostport, &shown, "redis://HOST:PORT")?;
    let bad = |e: redis::RedisError| format!("{shown:?}: not a usable Redis URL ({:?})", e.kind());
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(bad)?;
    let mut settings = info.redis_settings().clone();
    if let Some(u) = &auth.username {
        settings = settings.set_username(u);
    }
    if let Some(p) = &auth.password {
        settings = settings.set_password(&p.0);
    }
    let info = info.set_redis_settings(settings);
    let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    match (&auth.ca_pem, tls) {
        (Some(pem), true) => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            },
        )
        .map_err(|e| format!("{shown:?}: the CA file is not usable ({:?})", e.kind())),
        (Some(_), false) => Err(format!(
            "{shown:?}: a CA file is only for rediss:// (TLS) URLs"
        )),
        (None, _) => redis::Client::open(info).map_err(bad),
    }
}

/// The Cluster client for `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]` (or
/// `rediss-cluster://` for TLS): every listed node is a seed; the client learns the rest.
fn cluster_client(url: &str, opts: &RedisOptions) -> Result<ClusterClient, String> {
    const WANT: &str = "redis-cluster://HOST:PORT[,HOST:PORT…]";
    let shown = redacted(url);
    let (scheme, rest) = match url.strip_prefix(CLUSTER_SCHEME) {
        Some(rest) => ("redis", rest),
        None => (
            "rediss",
            url.strip_prefix(CLUSTER_TLS_SCHEME)
                .ok_or_else(|| format!("expected {WANT}, got {shown:?}"))?,
        ),
    };
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    if hosts.contains('/') {
        return Err(format!(
            "expected {WANT}, got {shown:?} (a Cluster has no database number)"
        ));
    }
    let mut nodes = Vec::new();
    for hostport in hosts.split(',') {
        check_hostport(hostport, &shown, WANT)?;
        let node = match userinfo {
            Some(u) => format!("{scheme}://{u}@{hostport}"),
            None => format!("{scheme}://{hostport}"),
        };
        let info = redis::IntoConnectionInfo::into_connection_info(node.as_str())
            .map_err(|e| format!("{shown:?}: not a usable Redis URL ({:?})", e.kind()))?;
        nodes.push(info);
    }
    let tls = scheme == "rediss";
    let mut b = ClusterClientBuilder::new(nodes)
        .connection_timeout(opts.connect_timeout)
        // Per attempt and in all (retries and redirects included): one store operation.
        .response_timeout(opts.op_timeout)
        // Redirects are retried at once; TRYAGAIN and CLUSTERDOWN after 5-50 ms, a few times
        // only: a longer failover is a fast 503, and the next operation tries again.
        .retries(5)
        .min_retry_wait(5)
        .max_retry_wait(50)
        .retry_wait_formula(5, 2);
    if let Some(u) = &opts.auth.username {
        b = b.username(u);
    }
    if let Some(p) = &opts.auth.password {
        b = b.password(&p.0);
    }
    match (&opts.auth.ca_pem, tls) {
        (Some(pem), true) => {
            b = b.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            });
        }
        (Some(_), false) => {
            return Err(format!(
                "{shown:?}: a CA file is only for rediss-cluster:// (TLS) URLs"
            ))
        }
        (None, _) => {}
    }
    b.build()
        .map_err(|e| format!("{shown:?}: not a usable Redis Cluster URL ({:?})", e.kind()))
}

/// A TLS provider for rustls, installed once per process (rediss:// needs one).
fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis {what}: {e}"))
}

fn corrupt(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("redis {what}: {detail}"))
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || e.to_string().contains("NOSCRIPT")
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    as_i64(v).and_then(|n| u64::try_from(n).ok())
}

fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// One Redis: the command. A Cluster: the command on every primary the client knows, all of
/// which must succeed.
async fn on_every_primary(conn: &mut Conn, c: Cmd) -> redis::RedisResult<Value> {
    match conn {
        Conn::Single(m) => c.query_async::<Value>(m).await,
        Conn::Cluster(k, pulse) => {
            let routing = RoutingInfo::MultiNode((
                redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                Some(redis::cluster_routing::ResponsePolicy::AllSucceeded),
            ));
            pulsed(pulse, Box::pin(k.route_command(c, routing))).await
        }
    }
}

fn as_array(v: Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(a) | Value::Set(a) => Some(a),
        _ => None,
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RedisStore {
    /// A store for `url`: `redis://HOST:PORT[/DB]` or `rediss://…` (one endpoint), or
    /// `redis-cluster://HOST:PORT[,HOST:PORT…]` or `rediss-cluster://…` (a Redis Cluster, every
    /// node listed a seed). Does not connect: the first operation does, so the service can
    /// start while Redis is down (/healthz says 503 until it answers). Must be called inside a
    /// Tokio runtime.
    pub fn new(url: &str, limits: Limits, opts: RedisOptions) -> Result<Self, String> {
        if opts.prefix.contains(['{', '}']) {
            return Err(format!(
                "key prefix {:?} must not contain braces",
                opts.prefix
            ));
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
            apply: LoadedScript::new(redis_lua::apply_script()),
            snapshot: LoadedScript::new(redis_lua::snapshot_script()),
            sweep: LoadedScript::new(redis_lua::sweep_script()),
            owner_gone: LoadedScript::new(redis_lua::owner_gone_script()),
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
    /// and the incarnation's three keys. Named, so that while a slot migrates Redis runs the
    /// script only on the node that holds all of them (TRYAGAIN otherwise).
    fn session_keys(&self, c: &mut Cmd, base: &str, incarnation: Option<&str>) {
        match incarnation {
            Some(inc) => c
                .arg(5)
                .arg(format!("{base}:s"))
                .arg(format!("{base}:n"))
                .arg(format!("{base}:i:{inc}"))
                .arg(format!("{base}:w:{inc}"))
                .arg(format!("{base}:l:{inc}")),
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

    /// `SCRIPT LOAD` every script (on a Cluster: on every primary; a replica promoted later
    /// answers NOSCRIPT once and gets them then).
    async fn load_scripts(&self, conn: &mut Conn) -> Result<(), StoreError> {
        for s in [&self.apply, &self.snapshot, &self.sweep, &self.owner_gone] {
            let mut c = redis::cmd("SCRIPT");
            c.arg("LOAD").arg(&s.code);
            on_every_primary(conn, c)
                .await
                .map_err(|e| self.fail("script load", e))?;
        }
        Ok(())
    }

    /// Run `cmds` and return one reply per command, in order. One endpoint: one pipeline. A
    /// Cluster: one pipeline per hash tag, all at once. On NOSCRIPT (a new, restarted, flushed
    /// or just promoted node) the scripts are loaded and the commands run once more. Running
    /// a batch twice is harmless: records are idempotent upserts, the index ZADD is `GT`, and
    /// an `owner_gone` bumped twice still only makes its epoch differ from the one its
    /// incarnations opened in. `durable`: records, which wait for `wait_replicas` replicas.
    async fn exec(
        &self,
        what: &str,
        cmds: &[Placed],
        durable: bool,
    ) -> Result<Vec<Value>, StoreError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let (link, wait) = match (&self.records, durable) {
            (Some(r), true) => (r, self.opts.wait_replicas),
            _ => (&self.main, 0),
        };
        let conn = link.get().await.map_err(|e| self.fail(what, e))?;
        if !self.cluster {
            let all: Vec<&Placed> = cmds.iter().collect();
            return self.exec_group(what, conn, &all, wait).await;
        }
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_tag: HashMap<&str, usize> = HashMap::new();
        for (i, c) in cmds.iter().enumerate() {
            let g = *by_tag.entry(hash_tag(&c.key)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            if let Some(members) = groups.get_mut(g) {
                members.push(i);
            }
        }
        let runs = groups.iter().map(|members| {
            let group: Vec<&Placed> = members.iter().filter_map(|&i| cmds.get(i)).collect();
            let conn = conn.clone();
            async move { self.exec_group(what, conn, &group, wait).await }
        });
        let replies = futures_util::future::try_join_all(runs).await?;
        let mut out = vec![Value::Nil; cmds.len()];
        for (members, values) in groups.iter().zip(replies) {
            for (&i, v) in members.iter().zip(values) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = v;
                }
            }
        }
        Ok(out)
    }

    /// One pipeline (commands of one hash tag on a Cluster), plus `WAIT` when `wait > 0`.
    async fn exec_group(
        &self,
        what: &str,
        mut conn: Conn,
        group: &[&Placed],
        wait: u32,
    ) -> Result<Vec<Value>, StoreError> {
        if self.cluster && group.len() == 1 {
            return self.exec_one_by_one(what, conn, group, wait).await;
        }
        let mut p = redis::pipe();
        for c in group {
            p.add_command(c.cmd.clone());
        }
        if wait > 0 {
            p.add_command(self.wait_cmd(wait));
        }
        let mut replies = match p.query_async::<Vec<Value>>(&mut conn).await {
            Ok(v) => v,
            Err(e) if self.cluster && (is_noscript(&e) || e.is_cluster_error()) => {
                // MOVED, ASK, TRYAGAIN, CLUSTERDOWN: the cluster client follows (and retries)
                // those for single commands only.
                return self.exec_one_by_one(what, conn, group, wait).await;
            }
            Err(e) if is_noscript(&e) => {
                self.load_scripts(&mut conn).await?;
                p.query_async::<Vec<Value>>(&mut conn)
                    .await
                    .map_err(|e| self.fail(what, e))?
            }
            Err(e) => return Err(self.fail(what, e)),
        };
        if wait > 0 {
            self.check_wait(what, replies.pop().as_ref(), wait)?;
        }
        Ok(replies)
    }

    /// The commands of one hash tag one at a time (a Cluster's redirects are followed per
    /// command), then `WAIT` on the primary of their slot.
    async fn exec_one_by_one(
        &self,
        what: &str,
        mut conn: Conn,
        group: &[&Placed],
        wait: u32,
    ) -> Result<Vec<Value>, StoreError> {
        let mut out = Vec::with_capacity(group.len());
        for c in group {
            let v = match c.cmd.query_async::<Value>(&mut conn).await {
                Ok(v) => v,
                Err(e) if is_noscript(&e) => {
                    self.load_scripts(&mut conn).await?;
                    c.cmd
                        .query_async::<Value>(&mut conn)
                        .await
                        .map_err(|e| self.fail(what, e))?
                }
                Err(e) => return Err(self.fail(what, e)),
            };
            out.push(v);
        }
        if let (true, Some(first)) = (wait > 0, group.first()) {
            let acked = match &mut conn {
                Conn::Cluster(k, pulse) => {
                    let route = Route::with_key(first.key.as_bytes(), SlotAddr::Master);
                    let routing =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    pulsed(
                        pulse,
                        Box::pin(k.route_command(self.wait_cmd(wait), routing)),
                    )
                    .await
                }
                Conn::Single(m) => self.wait_cmd(wait).query_async::<Value>(m).await,
            }
            .map_err(|e| self.fail(what, e))?;
            self.check_wait(what, Some(&acked), wait)?;
        }
        Ok(out)
    }

    fn wait_cmd(&self, replicas: u32) -> Cmd {
        let mut c = redis::cmd("WAIT");
        // Well within the operation's bound, so the answer says why (0 would mean forever).
        c.arg(replicas)
            .arg((ms(self.opts.op_timeout) * 2 / 3).max(1));
        c
    }

    fn check_wait(&self, what: &str, reply: Option<&Value>, wait: u32) -> Result<(), StoreError> {
        let acked = reply.and_then(as_u64).unwrap_or(0);
        if acked < u64::from(wait) {
            return Err(unavailable(
                what,
                format!(
                    "{acked} of {wait} replicas acknowledged within {} ms",
                    (ms(self.opts.op_timeout) * 2 / 3).max(1)
                ),
            ));
        }
        Ok(())
    }

    /// `EVALSHA apply` for one record (OwnerGone is not a session record: `None`). `admit`:
    /// a `session_open` may open a new session (room was made for it).
    fn apply_cmd(
        &self,
        r: &Record,
        now_ms: u64,
        epochs: &HashMap<String, u64>,
        admit: bool,
    ) -> Option<Placed> {
        let (session, incarnation) = match r {
            Record::SessionOpen { session, .. } | Record::SessionEnd { session, .. } => {
                (session, None)
            }
            Record::StreamOpen {
                session,
                incarnation,
                ..
            }
            | Record::Events {
                session,
                incarnation,
                ..
            }
            | Record::StreamLost {
                session,
                incarnation,
                ..
            }
            | Record::OwnerFailed {
                session,
                incarnation,
            } => (session, Some(incarnation.as_str())),
            Record::OwnerGone { .. } => return None,
        };
        let base = self.session_base(session);
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.apply.sha);
        self.session_keys(&mut c, &base, incarnation);
        c.arg(&base)
            .arg(now_ms)
            .arg(self.limits.session_idle_ttl_ms)
            .arg(self.limits.max_window)
            .arg(self.limits.max_incarnations_per_session)
            .arg(self.keep_ms())
            .arg(self.limits.pending_ttl_ms);
        match r {
            Record::SessionOpen { version, .. } => {
                c.arg("so").arg(version).arg(if admit { "1" } else { "0" });
            }
            Record::SessionEnd { why, .. } => {
                c.arg("se").arg(match why {
                    SessionEnd::Terminated => "t",
                    SessionEnd::Expired => "e",
                });
            }
            Record::StreamOpen {
                incarnation,
                kind,
                owner,
                retention,
                supersedes,
                opened_ms,
                request_id,
                ..
            } => {
                c.arg("st")
                    .arg(incarnation)
                    .arg(kind_code(*kind))
                    .arg(owner)
                    .arg(epochs.get(owner).copied().unwrap_or(0))
                    .arg(retention)
                    .arg(if *supersedes { "1" } else { "0" })
                    .arg(opened_ms)
                    // '' (never valid JSON): none.
                    .arg(request_id.as_deref().unwrap_or(""));
            }
            Record::Events {
                incarnation,
                first_seq,
                ids,
                long,
                ..
            } => {
                c.arg("ev")
                    .arg(incarnation)
                    .arg(first_seq)
                    .arg(LONG_IDS_KEPT)
                    .arg(long.len());
                for l in long {
                    c.arg(l.seq).arg(l.id.as_bytes());
                }
                for id in ids {
                    c.arg(id.as_bytes());
                }
            }
            Record::StreamLost { incarnation, .. } => {
                c.arg("sl").arg(incarnation);
            }
            Record::OwnerFailed { incarnation, .. } => {
                c.arg("of").arg(incarnation);
            }
            Record::OwnerGone { .. } => return None,
        }
        Some(Placed { key: base, cmd: c })
    }

    /// Apply records in order: session records are pipelined (one round trip per run of them),
    /// an OwnerGone closes the run, so StreamOpens after it see the new epoch.
    async fn apply_inner(&self, records: &[Record], now_ms: u64) -> Result<Applied, StoreError> {
        let mut out = Applied::default();
        let mut start = 0;
        while start < records.len() {
            let end = records[start..]
                .iter()
                .position(|r| matches!(r, Record::OwnerGone { .. }))
                .map_or(records.len(), |i| start + i + 1);
            self.apply_run(&records[start..end], start, now_ms, &mut out)
                .await?;
            start = end;
        }
        Ok(out)
    }

    async fn apply_run(
        &self,
        run: &[Record],
        offset: usize,
        now_ms: u64,
        out: &mut Applied,
    ) -> Result<(), StoreError> {
        // Owner epochs for the StreamOpens of this run, read before them.
        let mut owners: Vec<&str> = run
            .iter()
            .filter_map(|r| match r {
                Record::StreamOpen { owner, .. } => Some(owner.as_str()),
                _ => None,
            })
            .collect();
        owners.sort_unstable();
        owners.dedup();
        let mut epochs = HashMap::new();
        if !owners.is_empty() {
            let mut conn = self.conn("apply").await?;
            let got: Vec<Option<u64>> = redis::cmd("HMGET")
                .arg(self.owners_key())
                .arg(&owners)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail("apply", e))?;
            for (o, e) in owners.iter().zip(got) {
                epochs.insert((*o).to_owned(), e.unwrap_or(0));
            }
        }
        let opens = run
            .iter()
            .filter(|r| matches!(r, Record::SessionOpen { .. }))
            .count();
        let (mut room, full) = if opens > 0 {
            self.room(opens, now_ms).await?
        } else {
            (0, String::new())
        };
        let mut cmds = Vec::with_capacity(run.len());
        for r in run {
            if let Record::OwnerGone { owner } = r {
                let mut c = redis::cmd("EVALSHA");
                c.arg(&self.owner_gone.sha)
                    .arg(1)
                    .arg(self.owners_key())
                    .arg(owner)
                    .arg(now_ms);
                cmds.push(Placed {
                    key: self.owners_key(),
                    cmd: c,
                });
                continue;
            }
            // Room is handed out in batch order; a session already open takes none in the
            // script, so at worst a batch refuses one it had room for (it is never over).
            let admit = matches!(r, Record::SessionOpen { .. }) && room > 0;
            room -= usize::from(admit);
            if let Some(c) = self.apply_cmd(r, now_ms, &epochs, admit) {
                cmds.push(c);
            }
        }
        let replies = self.exec("apply", &cmds, true).await?;
        let (mut opened, mut promoted, mut pending) = (Vec::new(), Vec::new(), Vec::new());
        let mut refused = false;
        for (i, (r, v)) in run.iter().zip(&replies).enumerate() {
            let Some(session) = session_of(r) else {
                continue;
            };
            match as_string(v).as_deref() {
                Some("a" | "k") => opened.push(session),
                Some("o") => {
                    opened.push(session);
                    promoted.push(session);
                }
                Some("p") => pending.push(session),
                Some("f") => {
                    refused = true;
                    out.refused.push(Refusal {
                        index: offset + i,
                        error: STORE_FULL,
                        detail: full.clone(),
                    });
                }
                other => return Err(corrupt("apply", format!("record reply {other:?}"))),
            }
        }
        self.update_indexes(&opened, &promoted, &pending, refused, now_ms)
            .await
    }

    /// The session and pending indexes after a run (and the refusal mark): the sweep's and
    /// the caps' view. Not waited on by replicas: an index a failover loses is rebuilt by
    /// the next write of each session, and the sweep drops what it no longer finds.
    async fn update_indexes(
        &self,
        opened: &[&str],
        promoted: &[&str],
        pending: &[&str],
        refused: bool,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut cmds = Vec::new();
        let mut add = |cmd: Cmd, key: String| cmds.push(Placed { key, cmd });
        if !opened.is_empty() {
            // Last write per session (GT: never moves back).
            let mut z = redis::cmd("ZADD");
            z.arg(self.index_key()).arg("GT");
            for s in opened {
                z.arg(now_ms).arg(*s);
            }
            add(z, self.index_key());
        }
        if !promoted.is_empty() {
            let mut z = redis::cmd("ZREM");
            z.arg(self.pending_key()).arg(promoted);
            add(z, self.pending_key());
        }
        if !pending.is_empty() {
            // When it appeared (NX: a pending session's TTL runs from its first record).
            let mut z = redis::cmd("ZADD");
            z.arg(self.pending_key()).arg("NX");
            for s in pending {
                z.arg(now_ms).arg(*s);
            }
            add(z, self.pending_key());
            let mut n = redis::cmd("ZCARD");
            n.arg(self.pending_key());
            add(n, self.pending_key());
        }
        if refused {
            self.last_refused.store(now_ms, Ordering::Relaxed);
            let mut c = redis::cmd("SET");
            c.arg(self.refused_key())
                .arg(now_ms)
                .arg("PX")
                .arg(self.limits.session_idle_ttl_ms.max(1));
            add(c, self.refused_key());
        }
        if cmds.is_empty() {
            return Ok(());
        }
        let count_at = (!pending.is_empty()).then(|| cmds.len() - 1 - usize::from(refused));
        let replies = self.exec("apply", &cmds, false).await?;
        let count = count_at
            .and_then(|i| replies.get(i))
            .and_then(as_u64)
            .unwrap_or(0);
        let max = self.limits.max_pending_sessions.max(1) as u64;
        if count > max {
            self.evict_pending(count - max, now_ms).await?;
        }
        Ok(())
    }

    /// Room for `wanted` new sessions, and the detail of a refusal. Sessions idle past their
    /// TTL are freed first; a session active within the TTL never is.
    async fn room(&self, wanted: usize, now_ms: u64) -> Result<(usize, String), StoreError> {
        let max = self.limits.max_sessions.max(1) as u64;
        let mut count = self.session_count().await?;
        if count.saturating_add(wanted as u64) > max {
            if let Some(cutoff) = self.idle_cutoff(now_ms) {
                self.sweep_index(&self.index_key(), cutoff, "free", now_ms)
                    .await?;
                count = self.session_count().await?;
            }
        }
        let room = usize::try_from(max.saturating_sub(count)).unwrap_or(usize::MAX);
        if let Some((used, budget)) = self.over_budget(false).await {
            // Freeing idle sessions may be enough; read the memory again after it.
            if let Some(cutoff) = self.idle_cutoff(now_ms) {
                self.sweep_index(&self.index_key(), cutoff, "free", now_ms)
                    .await?;
            }
            if self.over_budget(true).await.is_some() {
                return Ok((
                    0,
                    format!(
                        "Redis holds {used} bytes, new sessions are refused above \
                         {HIGH_WATER_PERCENT}% of the {budget}-byte budget \
                         (--redis-max-bytes, default 80% of maxmemory)"
                    ),
                ));
            }
        }
        Ok((
            room,
            format!("{count} sessions active within the idle TTL, at most {max} (--max-sessions)"),
        ))
    }

    /// The fullest primary above the high water mark of its byte budget: (used, budget).
    /// Unknown (INFO refused or failing): not over, the session cap still holds.
    async fn over_budget(&self, fresh: bool) -> Option<(u64, u64)> {
        let nodes = self.nodes(fresh).await.ok()?;
        redis_config::over_budget(&nodes, self.opts.max_bytes, HIGH_WATER_PERCENT as u64)
    }

    /// `INFO` of every primary, read at most once per [`PROBE_EVERY`] unless `fresh`.
    async fn nodes(&self, fresh: bool) -> Result<Vec<NodeInfo>, StoreError> {
        let mut slot = self.probe.lock().await;
        if let (false, Some((at, nodes))) = (fresh, slot.as_ref()) {
            if at.elapsed() < PROBE_EVERY {
                return Ok(nodes.clone());
            }
        }
        let mut conn = self.conn("health").await?;
        let texts: Vec<String> = match &mut conn {
            Conn::Single(m) => vec![redis::cmd("INFO")
                .query_async::<String>(m)
                .await
                .map_err(|e| self.fail("health", e))?],
            Conn::Cluster(k, pulse) => {
                // No response policy: one answer per primary, keyed by its address.
                let routing = RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    None,
                ));
                let v = pulsed(
                    pulse,
                    Box::pin(k.route_command(redis::cmd("INFO"), routing)),
                )
                .await
                .map_err(|e| self.fail("health", e))?;
                match v {
                    Value::Map(m) => m.into_iter().filter_map(|(_, v)| as_string(&v)).collect(),
                    other => as_string(&other).into_iter().collect(),
                }
            }
        };
        let nodes: Vec<NodeInfo> = texts.iter().map(|t| redis_config::parse_info(t)).collect();
        *slot = Some((std::time::Instant::now(), nodes.clone()));
        Ok(nodes)
    }

    /// Can this Redis do what the flags ask? `Err(Misconfigured)` names what to change;
    /// warnings are logged once. An `INFO` that fails (an ACL without it) checks nothing.
    async fn check_config(&self) -> Result<(), StoreError> {
        let Ok(nodes) = self.nodes(false).await else {
            return Ok(());
        };
        let f = redis_config::check(&nodes, self.opts.wait_replicas, self.opts.max_bytes);
        let mut all = f.problems.clone();
        all.extend(f.warnings.iter().cloned());
        {
            let mut logged = lock(&self.logged);
            if *logged != all {
                for w in &f.warnings {
                    eprintln!("mcp-ownership: WARNING: {w}");
                }
                *logged = all;
            }
        }
        if f.problems.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Misconfigured(f.problems.join("; ")))
        }
    }

    async fn session_count(&self) -> Result<u64, StoreError> {
        let mut conn = self.conn("apply").await?;
        redis::cmd("ZCARD")
            .arg(self.index_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("apply", e))
    }

    /// The pending cap: drop the `excess` oldest pending sessions.
    async fn evict_pending(&self, excess: u64, now_ms: u64) -> Result<(), StoreError> {
        let want = usize::try_from(excess)
            .unwrap_or(usize::MAX)
            .min(SWEEP_PAGE);
        let mut conn = self.conn("apply").await?;
        let oldest: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.pending_key())
            .arg(0)
            .arg(want.saturating_sub(1))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("apply", e))?;
        if oldest.is_empty() {
            return Ok(());
        }
        let mut cmds: Vec<Placed> = oldest
            .iter()
            .map(|s| self.sweep_cmd(s, now_ms, 0, "evict_pending"))
            .collect();
        let mut gone = redis::cmd("ZREM");
        gone.arg(self.pending_key()).arg(&oldest);
        cmds.push(Placed {
            key: self.pending_key(),
            cmd: gone,
        });
        self.exec("apply", &cmds, false).await?;
        Ok(())
    }

    fn sweep_cmd(&self, session: &str, now_ms: u64, ttl: u64, mode: &str) -> Placed {
        let base = self.session_base(session);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sweep.sha);
        self.session_keys(&mut cmd, &base, None);
        cmd.arg(&base).arg(now_ms).arg(ttl).arg(mode);
        Placed { key: base, cmd }
    }

    async fn snapshot_inner(&self, q: SnapshotQuery<'_>, now_ms: u64) -> Result<Facts, StoreError> {
        let base = self.session_base(q.session);
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.snapshot.sha);
        self.session_keys(&mut c, &base, Some(q.incarnation));
        c.arg(&base)
            .arg(now_ms)
            .arg(self.limits.session_idle_ttl_ms)
            .arg(q.incarnation)
            .arg(q.seq)
            .arg(q.max_expected)
            .arg(self.limits.max_window)
            .arg(self.keep_ms())
            .arg(self.limits.owner_failure_window_ms);
        let reply = self
            .exec(
                "snapshot",
                &[Placed {
                    key: base.clone(),
                    cmd: c,
                }],
                false,
            )
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| corrupt("snapshot", "empty reply"))?;
        let arr = as_array(reply).ok_or_else(|| corrupt("snapshot", "not an array"))?;
        let mut code = arr.first().and_then(as_i64);
        if let Some(c @ 11..=13) = code {
            // The lookup's last-used write was refused (Redis full): answered read-only.
            self.touch_refused.fetch_add(1, Ordering::Relaxed);
            code = Some(c - 10);
        }
        let session = match code {
            // Half-missing: part of the session's keys are gone. Lost, never fresh.
            Some(4) => {
                return Ok(Facts {
                    refusing: true,
                    ..Facts::default()
                })
            }
            Some(0) => {
                return Ok(Facts {
                    refusing: self.refusing(now_ms).await?,
                    ..Facts::default()
                })
            }
            Some(1) => SessionState::Active,
            Some(2) => SessionState::Terminated,
            Some(3) => SessionState::Expired,
            other => return Err(corrupt("snapshot", format!("session code {other:?}"))),
        };
        if arr.len() == 1 {
            return Ok(Facts {
                session: Some(session),
                incarnation: None,
                refusing: self.refusing(now_ms).await?,
            });
        }
        if arr.len() < 12 {
            return Err(corrupt("snapshot", format!("{} fields", arr.len())));
        }
        let bad = |f: &str| corrupt("snapshot", format!("field {f}"));
        let kind = match as_string(&arr[1]).as_deref() {
            Some("g") => StreamKind::Get,
            Some("r") => StreamKind::Request,
            _ => return Err(bad("kind")),
        };
        let owner = as_string(&arr[2]).ok_or_else(|| bad("owner"))?;
        let opened_epoch = as_u64(&arr[3]).ok_or_else(|| bad("epoch"))?;
        let lost = as_i64(&arr[4]).ok_or_else(|| bad("lost"))? == 1;
        let superseded = as_i64(&arr[5]).ok_or_else(|| bad("superseded"))? == 1;
        let head = as_u64(&arr[6]).ok_or_else(|| bad("head"))?;
        let retention = as_u64(&arr[7]).ok_or_else(|| bad("retention"))?;
        let retained_from = as_u64(&arr[8]).ok_or_else(|| bad("retained_from"))?;
        let cursor_id = match as_i64(&arr[9]) {
            Some(0) => CursorId::Plain,
            Some(1) => CursorId::Long(as_string(&arr[10]).ok_or_else(|| bad("resume_id"))?),
            Some(2) => CursorId::LongMissing,
            _ => return Err(bad("cursor_id")),
        };
        let request_id = as_string(&arr[11])
            .ok_or_else(|| bad("request_id"))
            .map(|r| (!r.is_empty()).then_some(r))?;
        let expected = arr[12..]
            .iter()
            .map(|v| as_string(v).ok_or_else(|| bad("expected")))
            .collect::<Result<Vec<_>, _>>()?;
        // The owner's epoch now: read after the session script (see the module docs).
        let owner_lost = if lost {
            true
        } else {
            let mut conn = self.conn("snapshot").await?;
            let now_epoch: Option<u64> = redis::cmd("HGET")
                .arg(self.owners_key())
                .arg(&owner)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail("snapshot", e))?;
            let gone = now_epoch.unwrap_or(0) > opened_epoch;
            if gone {
                // Lost for good: the owner's epoch may be forgotten later (sweep).
                let _: Result<(), _> = redis::cmd("HSET")
                    .arg(format!("{base}:i:{}", q.incarnation))
                    .arg("l")
                    .arg("1")
                    .query_async(&mut conn)
                    .await;
            }
            gone
        };
        Ok(Facts {
            session: Some(session),
            incarnation: Some(IncarnationView {
                facts: IncarnationFacts {
                    kind,
                    owner_lost,
                    superseded,
                    head,
                    retention,
                    retained_from,
                },
                owner,
                expected,
                cursor_id,
                request_id,
            }),
            refusing: false,
        })
    }

    /// Did this instance, or any other (the shared mark), have a write refused or failed
    /// within the idle TTL?
    async fn refusing(&self, now_ms: u64) -> Result<bool, StoreError> {
        let last = self.last_refused.load(Ordering::Relaxed);
        if last != 0 && now_ms.saturating_sub(last) <= self.limits.session_idle_ttl_ms {
            return Ok(true);
        }
        let mut conn = self.conn("snapshot").await?;
        let mark: Option<u64> = redis::cmd("GET")
            .arg(self.refused_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("snapshot", e))?;
        Ok(mark.is_some())
    }

    async fn stats_inner(&self) -> Result<StoreStats, StoreError> {
        let mut conn = self.conn("stats").await?;
        let sessions: u64 = redis::cmd("ZCARD")
            .arg(self.index_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("stats", e))?;
        let owners: u64 = redis::cmd("HLEN")
            .arg(self.owners_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("stats", e))?;
        let pending: u64 = redis::cmd("ZCARD")
            .arg(self.pending_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("stats", e))?;
        // The session cap refuses instead of evicting; Redis's own eviction is not ours.
        let evicted = 0;
        let reconnects = self.reconnects();
        if sessions == 0 {
            return Ok(StoreStats {
                evicted,
                reconnects,
                owners,
                pending,
                touch_refused: self.touch_refused.load(Ordering::Relaxed),
                ..StoreStats::default()
            });
        }
        let sample: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.index_key())
            .arg(0)
            .arg(STATS_SAMPLE.saturating_sub(1))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("stats", e))?;
        let cards: Vec<Placed> = sample
            .iter()
            .map(|s| {
                let base = self.session_base(s);
                let mut cmd = redis::cmd("ZCARD");
                cmd.arg(format!("{base}:n"));
                Placed { key: base, cmd }
            })
            .collect();
        let counts = self.exec("stats", &cards, false).await?;
        let counted: u64 = counts.iter().filter_map(as_u64).sum();
        let incarnations = if sample.is_empty() {
            0
        } else {
            // Exact up to STATS_SAMPLE sessions, extrapolated beyond.
            counted.saturating_mul(sessions) / sample.len() as u64
        };
        Ok(StoreStats {
            sessions,
            pending,
            touch_refused: self.touch_refused.load(Ordering::Relaxed),
            incarnations,
            bytes: 0,
            evicted,
            reconnects,
            owners,
        })
    }

    /// The score below which an opened session is idle past its TTL (`None`: none can be).
    fn idle_cutoff(&self, now_ms: u64) -> Option<u64> {
        now_ms.checked_sub(self.limits.session_idle_ttl_ms.saturating_add(1))
    }

    async fn sweep_inner(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut freed = 0;
        if let Some(cutoff) = self.idle_cutoff(now_ms) {
            freed += self
                .sweep_index(&self.index_key(), cutoff, "free", now_ms)
                .await?;
        }
        if let Some(cutoff) = now_ms.checked_sub(self.limits.pending_ttl_ms.saturating_add(1)) {
            self.sweep_index(&self.pending_key(), cutoff, "pending", now_ms)
                .await?;
        }
        self.expire_owner_epochs(now_ms).await?;
        Ok(freed)
    }

    /// Free the sessions of `index` scored at most `cutoff` that the sweep script (in `mode`)
    /// finds expired; returns how many.
    async fn sweep_index(
        &self,
        index: &str,
        cutoff: u64,
        mode: &str,
        now_ms: u64,
    ) -> Result<usize, StoreError> {
        let ttl = if mode == "free" {
            self.limits.session_idle_ttl_ms
        } else {
            self.limits.pending_ttl_ms
        };
        let mut freed = 0;
        let mut conn = self.conn("sweep").await?;
        // A bounded number of pages per call: the next sweep goes on.
        for _ in 0..20 {
            let idle: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(index)
                .arg("-inf")
                .arg(cutoff)
                .arg("LIMIT")
                .arg(0)
                .arg(SWEEP_PAGE)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail("sweep", e))?;
            if idle.is_empty() {
                break;
            }
            let frees: Vec<Placed> = idle
                .iter()
                .map(|s| self.sweep_cmd(s, now_ms, ttl, mode))
                .collect();
            let replies = self.exec("sweep", &frees, false).await?;
            let mut gone = redis::cmd("ZREM");
            gone.arg(index);
            let mut alive = redis::cmd("ZADD");
            alive.arg(index).arg("GT");
            let (mut n_gone, mut n_alive) = (0, 0);
            for (s, r) in idle.iter().zip(replies) {
                let arr = as_array(r).ok_or_else(|| corrupt("sweep", "not an array"))?;
                match arr.first().and_then(as_i64) {
                    Some(0) => {
                        gone.arg(s);
                        n_gone += 1;
                    }
                    Some(1) => {
                        gone.arg(s);
                        n_gone += 1;
                        freed += 1;
                    }
                    Some(2) => {
                        // Touched by resumes since the index saw it: re-score it.
                        let lu = arr.get(1).and_then(as_u64).unwrap_or(now_ms);
                        alive.arg(lu).arg(s);
                        n_alive += 1;
                    }
                    other => return Err(corrupt("sweep", format!("code {other:?}"))),
                }
            }
            let mut p = redis::pipe();
            if n_gone > 0 {
                p.add_command(gone).ignore();
            }
            if n_alive > 0 {
                p.add_command(alive).ignore();
            }
            if n_gone + n_alive > 0 {
                p.query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| self.fail("sweep", e))?;
            }
            if idle.len() < SWEEP_PAGE {
                break;
            }
        }
        Ok(freed)
    }

    /// Forget owner epochs bumped more than 2 × keep ago. An incarnation they still make lost
    /// was marked lost by the first snapshot that saw it; one nobody resumed received no record
    /// from its gone owner either, so its keys expired after one keep.
    async fn expire_owner_epochs(&self, now_ms: u64) -> Result<(), StoreError> {
        let Some(cutoff) = now_ms.checked_sub(self.keep_ms().saturating_mul(2)) else {
            return Ok(());
        };
        let mut conn = self.conn("sweep").await?;
        let all: HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(self.owners_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("sweep", e))?;
        let old: Vec<&String> = all
            .iter()
            .filter(|(_, e)| **e < cutoff)
            .map(|(o, _)| o)
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        redis::cmd("HDEL")
            .arg(self.owners_key())
            .arg(&old)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.fail("sweep", e))
    }
}

/// The session a record writes to (OwnerGone writes none).
fn session_of(r: &Record) -> Option<&str> {
    match r {
        Record::SessionOpen { session, .. }
        | Record::SessionEnd { session, .. }
        | Record::StreamOpen { session, .. }
        | Record::Events { session, .. }
        | Record::StreamLost { session, .. }
        | Record::OwnerFailed { session, .. } => Some(session),
        Record::OwnerGone { .. } => None,
    }
}

fn kind_code(k: StreamKind) -> &'static str {
    match k {
        StreamKind::Get => "g",
        StreamKind::Request => "r",
    }
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        if self.cluster {
            "redis-cluster"
        } else {
            "redis"
        }
    }

    async fn apply(&self, records: &[Record], now_ms: u64) -> Result<Applied, StoreError> {
        // A batch is one pipeline; a large one gets a little more time (records are not on
        // the resume path), never more than the bulk bound.
        let per_record = Duration::from_micros(50)
            .saturating_mul(u32::try_from(records.len()).unwrap_or(u32::MAX));
        let limit = (self.opts.op_timeout + per_record)
            .min(self.opts.bulk_timeout.max(self.opts.op_timeout));
        let r = self
            .bounded("apply", limit, self.apply_inner(records, now_ms))
            .await;
        if r.is_err() {
            // Records that may not have landed: unknown sessions may be theirs for a while.
            self.last_refused.store(now_ms, Ordering::Relaxed);
        }
        // Wake resumes waiting here for in-flight records (others poll: see resume.rs).
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
        r
    }

    async fn snapshot(&self, query: SnapshotQuery<'_>, now_ms: u64) -> Result<Facts, StoreError> {
        self.bounded(
            "snapshot",
            self.opts.op_timeout,
            self.snapshot_inner(query, now_ms),
        )
        .await
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn health(&self) -> Result<(), StoreError> {
        // A Cluster: every primary (all slots served); a replica down does not count.
        let r = self
            .bounded("ping", self.opts.op_timeout, async {
                let mut conn = self.conn("ping").await?;
                on_every_primary(&mut conn, redis::cmd("PING"))
                    .await
                    .map(|_| ())
                    .map_err(|e| self.fail("ping", e))
            })
            .await;
        if r.is_err() {
            // No primary answers, or not all: the Cluster is down or failing over.
            self.main.renew_cluster();
            if let Some(l) = &self.records {
                l.renew_cluster();
            }
            return r;
        }
        self.bounded("health", self.opts.op_timeout, self.check_config())
            .await
    }

    async fn stats(&self, _now_ms: u64) -> Result<StoreStats, StoreError> {
        self.bounded("stats", self.opts.bulk_timeout, self.stats_inner())
            .await
    }

    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.bounded("sweep", self.opts.bulk_timeout, self.sweep_inner(now_ms))
            .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{parse_url, Pulse};

    #[test]
    fn a_connection_stalls_only_when_nothing_answers_for_the_bound() {
        let io = || redis::RedisError::from(std::io::Error::other("reset"));
        let server = || {
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
                "TRYAGAIN",
            ))
        };
        let p = Pulse::default();
        assert!(!p.stalled(10_000, 1000), "nothing sent: not stalled");
        p.sent(1000);
        p.sent(1500);
        assert!(!p.stalled(1999, 1000));
        assert!(
            p.stalled(2000, 1000),
            "the oldest unanswered request counts"
        );
        p.settle::<()>(&Err(io()));
        assert!(p.stalled(2000, 1000), "a broken connection is no answer");
        p.settle::<()>(&Err(server()));
        assert!(!p.stalled(2000, 1000), "an error reply is an answer");
        p.sent(3000);
        p.settle(&Ok(()));
        assert!(!p.stalled(9000, 1000));
    }

    #[test]
    fn urls() {
        assert!(parse_url("redis://127.0.0.1:6390").is_ok());
        assert!(parse_url("redis://localhost").is_ok());
        assert!(parse_url("redis://127.0.0.1:6390/2").is_ok());
        for bad in [
            "127.0.0.1:6390",
            "redis://",
            "redis://:6390",
            "redis://host:notaport",
            "redis://host:0",
            "http://host:1",
        ] {
            let e = parse_url(bad).err().unwrap();
            assert!(
                e.contains("redis://HOST:PORT") || e.contains(bad),
                "{bad}: {e}"
            );
        }
    }
}
