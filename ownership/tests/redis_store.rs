//! The shared store suite against a real `redis-server`, started by this test binary on
//! 127.0.0.1:6390 (+ `E2E_PORT_OFFSET`, or `REDIS_TEST_PORT`) and stopped when it exits.
//! Every test gets its own key prefix, so the cases run in parallel on one server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod suite;

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use mcp_ownership::store::Limits;
use mcp_ownership::{RedisOptions, RedisStore};

fn port() -> u16 {
    if let Ok(p) = std::env::var("REDIS_TEST_PORT") {
        return p.parse().expect("REDIS_TEST_PORT");
    }
    let offset: u16 = std::env::var("E2E_PORT_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    6390 + offset
}

/// The redis-server of this test binary, under a watchdog shell that stops it (by pid) once
/// this process is gone: the Rust test harness has no global teardown.
static SERVER: OnceLock<Mutex<Child>> = OnceLock::new();

fn server() -> u16 {
    let port = port();
    SERVER.get_or_init(|| {
        let child = redis_test_server::start(port, "").expect("redis-server");
        Mutex::new(child)
    });
    port
}

static NEXT: AtomicU64 = AtomicU64::new(0);

fn make(limits: Limits) -> RedisStore {
    let port = server();
    let prefix = format!(
        "t{}-{}-{}:",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let opts = RedisOptions {
        prefix,
        // A busy CI machine runs every case at once: generous, still bounded.
        op_timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    };
    RedisStore::new(&format!("redis://127.0.0.1:{port}"), limits, opts).expect("store")
}

store_suite!(make);

#[tokio::test]
async fn bad_url_is_a_clear_error() {
    for bad in ["redis://", "127.0.0.1:6390", "redis://h:x"] {
        let e = RedisStore::new(bad, Limits::default(), RedisOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("redis://HOST:PORT"), "{e}");
    }
}

#[tokio::test]
async fn unreachable_redis_fails_fast_then_recovers() {
    use mcp_ownership::Store;
    // Nothing listens on port 1: every operation fails within the op timeout.
    let opts = RedisOptions {
        op_timeout: Duration::from_millis(150),
        ..RedisOptions::default()
    };
    let s = RedisStore::new("redis://127.0.0.1:1", Limits::default(), opts).unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        let e = s.health().await.unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        assert!(e.to_string().contains("redis"), "{e}");
        let e = s.apply(&[suite::open(suite::S1)], suite::T0).await;
        assert!(e.is_err());
    }
    // And a store created while its Redis is up answers.
    let ok = make(Limits::default());
    ok.health().await.unwrap();
}

#[tokio::test]
async fn keys_are_hash_tagged_per_session() {
    use mcp_ownership::Store;
    use suite::*;
    let s = make(Limits::default());
    apply(
        &s,
        &[
            open(S1),
            get_stream(S1, A, T0),
            events(S1, A, 1, 3),
            events(S2, B, 1, 1),
            gone(OWNER_Y),
        ],
    )
    .await;
    let base = s.session_base(S1);
    let prefix = base.trim_end_matches(&format!("{{{S1}}}")).to_owned();
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", server())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.len() >= 7, "{keys:?}");
    for k in &keys {
        let rest = &k[prefix.len()..];
        let tagged =
            rest.starts_with(&format!("{{{S1}}}:")) || rest.starts_with(&format!("{{{S2}}}:"));
        assert!(
            tagged || ["sessions", "pending", "owners", "refused"].contains(&rest),
            "{k}"
        );
        // Every session key expires on its own, even if no instance ever sweeps.
        if tagged {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(k)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(ttl > 0, "{k} has no TTL");
        }
    }
    assert!(s.health().await.is_ok());
}

/// The HTTP face of a Redis outage: fast 503 `store_unavailable` with the reason, /healthz
/// 503, and the failed Redis operations counted and timed on /metrics.
#[tokio::test]
async fn http_503_and_metrics_when_redis_is_unreachable() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use mcp_ownership::{router, AppState, ResumeOptions};
    use tower::ServiceExt;

    async fn call(
        app: &axum::Router,
        method: &str,
        path: &str,
        body: &str,
    ) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    let opts = RedisOptions {
        op_timeout: Duration::from_millis(150),
        ..RedisOptions::default()
    };
    let down = RedisStore::new("redis://127.0.0.1:1", Limits::default(), opts).unwrap();
    let app = router(AppState::new(down, ResumeOptions::default()));
    let q = format!(
        r#"{{"session":"{}","incarnation":"{}","kind":"get","seq":1}}"#,
        suite::S1,
        suite::A
    );
    let started = Instant::now();
    let (status, body) = call(&app, "POST", "/v1/resume", &q).await;
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "store_unavailable");
    assert!(v["detail"].as_str().unwrap().contains("redis"), "{body}");
    let (status, body) = call(&app, "GET", "/healthz", "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains(r#""store":"redis""#), "{body}");
    let (status, body) = call(&app, "POST", "/v1/records", r#"{"records":[]}"#).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an empty batch needs no store: {body}"
    );
    let (_, metrics) = call(&app, "GET", "/metrics", "").await;
    for want in [
        r#"mcp_ownership_store_errors_total{op="snapshot"} 1"#,
        r#"mcp_ownership_store_errors_total{op="health"} 1"#,
        r#"mcp_ownership_store_operation_duration_seconds_count{op="snapshot"} 1"#,
    ] {
        assert!(metrics.contains(want), "{want} missing in\n{metrics}");
    }

    // The same service on a live Redis: records and a continuation, timed per operation.
    let live = make(Limits::default());
    let app = router(AppState::new(live, ResumeOptions::default()));
    let records = format!(
        r#"{{"records":[{{"type":"session_open","session":"{s}","version":"2025-06-18"}},
            {{"type":"stream_open","session":"{s}","incarnation":"{a}","kind":"get","owner":"10.0.0.1:8080","retention":0,"supersedes":true,"opened_ms":1}},
            {{"type":"events","session":"{s}","incarnation":"{a}","first_seq":1,"ids":["x1","x2"]}}]}}"#,
        s = suite::S1,
        a = suite::A
    );
    let (status, body) = call(&app, "POST", "/v1/records", &records).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&app, "POST", "/v1/resume", &q).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"verdict":"continue","owner":"10.0.0.1:8080","expected":["x2"],"head":2,"branch":1})
    );
    let (_, metrics) = call(&app, "GET", "/metrics", "").await;
    for want in [
        r#"mcp_ownership_store_operation_duration_seconds_count{op="apply"} 1"#,
        r#"mcp_ownership_store_operation_duration_seconds_count{op="snapshot"} 1"#,
        r#"mcp_ownership_store_errors_total{op="snapshot"} 0"#,
        "mcp_ownership_sessions 1",
        "mcp_ownership_incarnations 1",
    ] {
        assert!(metrics.contains(want), "{want} missing in\n{metrics}");
    }
}

/// A failover turns the primary this connection reaches into a replica: writes answer
/// READONLY. That is a 503 (never a panic, never a wrong verdict), the connection is
/// replaced, and once a primary answers at the address again, writes go through.
#[tokio::test]
async fn readonly_after_failover_is_unavailable_then_recovers() {
    use mcp_ownership::Store;
    struct Server(Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let port = server() + 2;
    let _server = Server(
        Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args([
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("redis://127.0.0.1:{port}");
    let s = RedisStore::new(&url, Limits::default(), RedisOptions::default()).unwrap();
    s.apply(&[suite::open(suite::S1)], suite::T0).await.unwrap();
    let admin = redis::Client::open(url.as_str()).unwrap();
    let mut a = admin.get_multiplexed_async_connection().await.unwrap();
    // A replica of a primary that does not exist: read-only at once.
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(1)
        .query_async(&mut a)
        .await
        .unwrap();
    let e = s
        .apply(&[suite::open(suite::S2)], suite::T0)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("read only replica"), "{e}");
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut a)
        .await
        .unwrap();
    s.apply(&[suite::open(suite::S2)], suite::T0).await.unwrap();
    let v = suite::verdict(
        &s,
        suite::S2,
        suite::A,
        mcp_resume_core::ownership::StreamKind::Get,
        0,
    )
    .await;
    // A write failed moments ago: a stream the store does not know may be one of its.
    assert_eq!(
        v,
        suite::new_stream(mcp_resume_core::ownership::Reason::RecordsLost)
    );
}

/// One lost key (the session hash, as an evicting policy or a failover may lose it) never makes
/// a superseded stream resumable: a later record does not re-create the session without its
/// newest-stream marker, and the session's cursors read `records_lost`, not a continuation.
#[tokio::test]
async fn a_lost_session_hash_never_revives_a_superseded_stream() {
    use mcp_resume_core::ownership::{Reason, StreamKind};
    use suite::*;
    let s = make(Limits::default());
    apply(
        &s,
        &[
            open(S1),
            get_stream(S1, A, T0),
            events(S1, A, 1, 3),
            get_stream(S1, B, T0 + 1),
            events(S1, B, 1, 1),
        ],
    )
    .await;
    assert_eq!(verdict_get(&s, A, 3).await, new_stream(Reason::Superseded));
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", server())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(format!("{}:s", s.session_base(S1)))
        .query_async(&mut conn)
        .await
        .unwrap();
    let lost = new_stream(Reason::RecordsLost);
    assert_eq!(verdict_get(&s, A, 3).await, lost);
    // B's next record lands: the session is not re-created as fresh.
    apply(&s, &[events(S1, B, 2, 2)]).await;
    assert_eq!(verdict_get(&s, A, 3).await, lost);
    assert_eq!(verdict_get(&s, B, 1).await, lost);
    // Not even a replayed session_open revives it.
    apply(&s, &[open(S1), events(S1, B, 3, 3)]).await;
    assert_eq!(verdict(&s, S1, A, StreamKind::Get, 3).await, lost);
}

/// An incarnation's branch table lost apart from it (an eviction, or a failover losing the
/// last writes) is detected and named: the incarnation is lost (`records_lost` for the resume
/// that finds it, `replay_mismatch` for a survivor's events, `forked` for a clean end), never
/// numbered anew (a renumbered branch could be silently ended, or cut the newer one).
#[tokio::test]
async fn a_lost_branch_table_is_named_never_renumbered() {
    use mcp_ownership::Store;
    use mcp_resume_core::ownership::{Reason, ResumeVerdict, StreamKind, REJECTED_MISMATCH};
    use suite::*;
    let s = make(Limits::default());
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", server())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let table = |inc: &str| format!("{}:b:{inc}", s.session_base(S1));
    apply(
        &s,
        &[
            open(S1),
            req_stream(A),
            events(S1, A, 1, 3),
            req_stream(B),
            events(S1, B, 1, 3),
        ],
    )
    .await;
    // The table goes (evicted): the survivor's events, its end and the next resume say so.
    let b1 = continue_branch(&s, A, 3).await.unwrap();
    assert_eq!(refusals(&s, &[relayed(A, b1, 4, 4)]).await, [None]);
    let _: () = redis::cmd("DEL")
        .arg(table(A))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        refusals(&s, &[relayed(A, b1, 5, 5)]).await,
        [Some(REJECTED_MISMATCH)]
    );
    assert!(s.end_branch(S1, A, b1, T0).await.unwrap(), "signalled");
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 4).await,
        new_stream(Reason::OwnerUnavailable)
    );
    // The table's last write is lost (a failover): it names an older top than its incarnation
    // recorded. The resume that meets it is refused, never handed a number in use.
    let b1 = continue_branch(&s, B, 3).await.unwrap();
    let b2 = continue_branch(&s, B, 3).await.unwrap();
    assert_eq!((b1, b2), (1, 2));
    let _: () = redis::cmd("HSET")
        .arg(table(B))
        .arg("n")
        .arg(b1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HDEL")
        .arg(table(B))
        .arg(b2)
        .query_async(&mut conn)
        .await
        .unwrap();
    let q = query(S1, B, StreamKind::Request, 3);
    assert_eq!(
        resolve_branched(&s, &q, no_wait(), T0).await.verdict,
        ResumeVerdict::NewStream {
            reason: Reason::RecordsLost,
            request_id: None
        }
    );
}

/// At the byte budget (`--redis-max-bytes`) a session's growth (`events` with ids, a new
/// stream) is refused by name (`store_full`), as the memory store does at its cap; the records
/// that end or mark things still land, and nothing already recorded is touched.
#[tokio::test]
async fn growth_is_refused_at_the_byte_budget() {
    use mcp_ownership::store::STORE_FULL;
    use mcp_ownership::Store;
    use mcp_resume_core::ownership::StreamKind;
    use suite::*;
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let base = s.session_base(S1);
    let opts = RedisOptions {
        prefix: base.trim_end_matches(&format!("{{{S1}}}")).to_owned(),
        op_timeout: Duration::from_secs(2),
        // Far below what any Redis holds: every primary is past it.
        max_bytes: Some(1),
        ..RedisOptions::default()
    };
    let url = format!("redis://127.0.0.1:{}", server());
    let full = RedisStore::new(&url, Limits::default(), opts).unwrap();
    let done = full
        .apply(
            &[
                events(S1, A, 4, 5),
                req_stream(B),
                failed(S1, A),
                branch_end(S1, A, 1),
            ],
            T0,
        )
        .await
        .unwrap();
    let mut got: Vec<(usize, &str)> = done.refused.iter().map(|r| (r.index, r.error)).collect();
    got.sort_unstable();
    assert_eq!(got, [(0, STORE_FULL), (1, STORE_FULL)], "{done:?}");
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 2).await,
        cont(OWNER_X, ids(3, 3), 3)
    );
}

/// The branch scripts wait for replicas like records (`--redis-wait-replicas`): a table a
/// failover could lose apart from its incarnation is never acknowledged. Here no replica
/// exists, so numbering a branch fails (the continuation then goes on unarbitrated).
#[tokio::test]
async fn branch_scripts_wait_for_replicas_like_records() {
    use mcp_ownership::store::StoreError;
    use mcp_ownership::Store;
    use suite::*;
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let base = s.session_base(S1);
    let opts = RedisOptions {
        prefix: base.trim_end_matches(&format!("{{{S1}}}")).to_owned(),
        op_timeout: Duration::from_millis(600),
        wait_replicas: 1,
        ..RedisOptions::default()
    };
    let url = format!("redis://127.0.0.1:{}", server());
    let durable = RedisStore::new(&url, Limits::default(), opts).unwrap();
    match durable.open_branch(S1, A, None, T0).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("replicas acknowledged"), "{m}"),
        other => panic!("{other:?}"),
    }
    match durable.end_branch(S1, A, 1, T0).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("replicas acknowledged"), "{m}"),
        other => panic!("{other:?}"),
    }
}
