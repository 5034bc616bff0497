//! Deployment shapes that used to fail silently: Redis that cannot do what the flags ask
//! (`WAIT` for replicas it does not have, an evicting policy) is reported by `/healthz` with the
//! variable to change; a full Redis refuses new sessions first (`store_full`), keeps answering
//! resumes of the sessions it holds (read-only), and a record it refuses reads `records_lost`.
//! Servers on 127.0.0.1:6440.. and a replica-less Cluster on 6430-6432 (+ `E2E_PORT_OFFSET`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod suite;

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mcp_ownership::store::{Limits, StoreError, STORE_FULL};
use mcp_ownership::{RedisOptions, RedisStore, Store};
use mcp_resume_core::ownership::{Reason, StreamKind};
use suite::*;

fn offset() -> u16 {
    std::env::var("E2E_PORT_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A redis-server of one test, stopped (by pid) when dropped.
struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(port: u16, extra: &[&str]) -> Server {
    let port = port + offset();
    let p = port.to_string();
    let mut args = vec![
        "--port",
        &p,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
    ];
    args.extend_from_slice(extra);
    let child = Command::new("redis-server")
        .args(&args)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (installed by `make tools`)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server(child, port)
}

fn store(url: &str, limits: Limits, opts: RedisOptions) -> RedisStore {
    RedisStore::new(
        url,
        limits,
        RedisOptions {
            op_timeout: Duration::from_secs(2),
            ..opts
        },
    )
    .unwrap()
}

async fn admin(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn misconfigured(r: Result<(), StoreError>, want: &str) {
    match r {
        Err(StoreError::Misconfigured(m)) => assert!(m.contains(want), "{m}"),
        other => panic!("expected a misconfiguration naming {want}: {other:?}"),
    }
}

/// `WAIT 1` against a primary without replicas: every record would be refused. /healthz says
/// so, naming the variable and the value to set.
#[tokio::test]
async fn wait_for_replicas_a_primary_lacks_is_reported() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use mcp_ownership::{router, AppState, ResumeOptions};
    use tower::ServiceExt;
    let srv = start(6441, &[]);
    let url = format!("redis://127.0.0.1:{}", srv.1);
    let asks_one = RedisOptions {
        wait_replicas: 1,
        ..RedisOptions::default()
    };
    let s = store(&url, Limits::default(), asks_one);
    misconfigured(s.health().await, "MCP_OWNERSHIP_REDIS_WAIT_REPLICAS=0");
    let app = router(AppState::new(s, ResumeOptions::default()));
    let resp = app
        .oneshot(Request::get("/healthz").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["status"], "misconfigured", "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("MCP_OWNERSHIP_REDIS_WAIT_REPLICAS=0"),
        "{v}"
    );
    let s = store(&url, Limits::default(), RedisOptions::default());
    s.health().await.unwrap();
    // An evicting policy that may take the owner epochs is a problem too.
    let mut a = admin(srv.1).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut a)
        .await
        .unwrap();
    let s = store(&url, Limits::default(), RedisOptions::default());
    misconfigured(s.health().await, "maxmemory-policy noeviction");
}

/// A Redis Cluster without replicas and the default `--redis-wait-replicas 1` for a Cluster:
/// reported by /healthz, with the variable to change.
#[tokio::test]
async fn replica_less_cluster_is_reported() {
    let c = cluster::Cluster::start(6430, 3, 0);
    let asks_one = RedisOptions {
        wait_replicas: 1,
        ..RedisOptions::default()
    };
    let s = store(&c.url("redis-cluster"), Limits::default(), asks_one);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match s.health().await {
            Err(StoreError::Misconfigured(m)) => {
                assert!(m.contains("MCP_OWNERSHIP_REDIS_WAIT_REPLICAS=0"), "{m}");
                break;
            }
            other => assert!(Instant::now() < deadline, "{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = store(
        &c.url("redis-cluster"),
        Limits::default(),
        RedisOptions::default(),
    );
    s.health().await.unwrap();
}

/// Fill Redis with other data until `used_memory` passes `target` bytes, or until Redis refuses
/// even a small write (the chunks shrink as big ones are refused: Redis counts the incoming
/// argument itself against maxmemory).
async fn fill_to(a: &mut redis::aio::MultiplexedConnection, target: u64, tag: &str) {
    let mut size = 256 * 1024;
    for i in 0..100_000 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(a)
            .await
            .unwrap();
        let used = mcp_ownership::redis::config::parse_info(&info).used;
        if used >= target {
            return;
        }
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("junk:{tag}:{i}"))
            .arg(vec![b'x'; size])
            .query_async(a)
            .await;
        if r.is_err() {
            if size <= 16 {
                return;
            }
            size /= 4;
        }
    }
    panic!("could not fill Redis to {target} bytes");
}

/// Redis with `maxmemory 16mb` and `noeviction` (the shipped policy, scaled down): past 90% of
/// the byte budget (80% of maxmemory) new sessions are refused by name; once Redis itself
/// refuses writes, a held session's resume still continues (read-only, counted), and a record
/// Redis refused makes an unknown stream read `records_lost`.
#[tokio::test]
async fn a_full_redis_refuses_new_sessions_first_and_still_answers() {
    const MAXMEMORY: u64 = 16 << 20;
    let srv = start(
        6442,
        &["--maxmemory", "16mb", "--maxmemory-policy", "noeviction"],
    );
    let url = format!("redis://127.0.0.1:{}", srv.1);
    let s = store(&url, Limits::default(), RedisOptions::default());
    s.health().await.unwrap();
    apply(&s, &[open(S1), get_stream(S1, A, T0), events(S1, A, 1, 3)]).await;
    let mut a = admin(srv.1).await;
    // Above 90% of the 80% budget, below maxmemory: Redis still writes, the service refuses.
    fill_to(&mut a, MAXMEMORY * 80 / 100, "a").await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let done = s.apply(&[open(S2)], T0).await.unwrap();
    assert_eq!(done.refused.len(), 1, "{done:?}");
    assert_eq!(done.refused[0].error, STORE_FULL);
    assert!(
        done.refused[0].detail.contains("--redis-max-bytes"),
        "{done:?}"
    );
    // The held session keeps recording and continuing.
    apply(&s, &[events(S1, A, 4, 4)]).await;
    assert_eq!(verdict_get(&s, A, 2).await, cont(OWNER_X, ids(3, 4), 4));
    // Now Redis itself is full: writes are refused.
    fill_to(&mut a, MAXMEMORY + (1 << 20), "b").await;
    let refused = s.apply(&[events(S1, B, 1, 1)], T0 + 1).await;
    assert!(refused.is_err(), "Redis refuses writes: {refused:?}");
    // A resume of the held session still continues: its last-used write is refused, the
    // lookup is answered read-only and counted; its branch is not registered (the write is
    // refused), so it continues without one.
    assert_eq!(
        resolve_branched(
            &s,
            &query(S1, A, StreamKind::Get, 2),
            mcp_ownership::ResumeOptions {
                record_wait: Duration::ZERO,
                max_expected: 256
            },
            T0 + 5
        )
        .await
        .verdict,
        cont(OWNER_X, ids(3, 4), 4)
    );
    assert!(s.stats(T0 + 5).await.unwrap().touch_refused >= 1);
    // A refused branch write is an answer (no number), never a store error.
    assert_eq!(
        s.open_branch(S1, A, None, T0 + 5).await,
        Ok(mcp_ownership::store::BranchOpen::Unregistered)
    );
    // The stream whose record Redis refused: records_lost, not unknown_stream.
    assert_eq!(
        verdict(&s, S1, B, StreamKind::Get, 1).await,
        new_stream(Reason::RecordsLost)
    );
    // And the session refused for room: records_lost, not session_inactive.
    assert_eq!(
        verdict(&s, S2, A, StreamKind::Get, 1).await,
        new_stream(Reason::RecordsLost)
    );
}
