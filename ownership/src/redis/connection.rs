//! One multiplexed connection per link, made when first needed and made anew when it is broken:
//! READONLY after a failover (one endpoint), or a Cluster connection that answers nothing for
//! the stall bound.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::RoutingInfo;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::setup::{RedisOptions, SetupError, Target};

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
pub(super) struct Pulse {
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
pub(super) fn pulsed<'a, T: Send + 'a>(
    pulse: &Arc<Pulse>,
    fut: RedisFuture<'a, T>,
) -> RedisFuture<'a, T> {
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
pub(super) enum Conn {
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

/// One multiplexed connection to the store, made when first needed.
pub(super) enum Link {
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

pub(super) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Link {
    pub(super) fn new(target: &Target, opts: &RedisOptions) -> Result<Link, SetupError> {
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
                    .map_err(|e| SetupError::Connection(e.to_string()))?;
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

    pub(super) async fn get(&self) -> Result<Conn, redis::RedisError> {
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
    pub(super) fn renew_cluster(&self) {
        if let Link::Cluster { conn, dropped, .. } = self {
            if let Ok(mut slot) = conn.try_lock() {
                if slot.take().is_some() {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Cluster connections dropped as broken so far (0 for one Redis).
    pub(super) fn dropped(&self) -> u64 {
        match self {
            Link::Cluster { dropped, .. } => dropped.load(Ordering::Relaxed),
            Link::Single { .. } => 0,
        }
    }

    /// `Some(held)` for a Cluster link (`None`: one Redis, or a connect under way).
    pub(super) fn cluster_connected(&self) -> Option<bool> {
        match self {
            Link::Cluster { conn, .. } => conn.try_lock().ok().map(|slot| slot.is_some()),
            Link::Single { .. } => None,
        }
    }

    /// READONLY on one endpoint: it reaches a replica now; the next operation resolves anew.
    pub(super) fn replace_if_readonly(&self, e: &redis::RedisError) {
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

/// One Redis: the command. A Cluster: the command on every primary the client knows, all of
/// which must succeed.
pub(super) async fn on_every_primary(conn: &mut Conn, c: Cmd) -> redis::RedisResult<Value> {
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

pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::Pulse;

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
}
