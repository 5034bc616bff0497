//! The shared store suite against a real Redis Cluster (3 primaries, 3 replicas, started by
//! this test binary on 127.0.0.1:6410-6415 + `E2E_PORT_OFFSET`, stopped when it exits),
//! with records acknowledged only once a replica holds them (`wait_replicas = 1`). Every test
//! gets its own key prefix, so the cases run in parallel on one cluster.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod suite;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use cluster::Cluster;
use mcp_ownership::store::Limits;
use mcp_ownership::{RedisOptions, RedisStore, Store};

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| Cluster::start(6410, 3, 1))
}

static NEXT: AtomicU64 = AtomicU64::new(0);

fn prefix() -> String {
    format!(
        "t{}-{}-{}:",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

fn make(limits: Limits) -> RedisStore {
    let opts = RedisOptions {
        prefix: prefix(),
        // A busy machine runs every case at once: generous, still bounded.
        op_timeout: Duration::from_secs(2),
        wait_replicas: 1,
        ..RedisOptions::default()
    };
    RedisStore::new(&cluster().url("redis-cluster"), limits, opts).expect("store")
}

store_suite!(make);

#[test]
fn cluster_urls() {
    use mcp_ownership::redis::parse_url;
    for good in [
        "redis-cluster://127.0.0.1:7000",
        "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,[::1]:7002",
        "rediss-cluster://redis-0.redis:6379,redis-1.redis:6379",
        "redis-cluster://user:pw@127.0.0.1:7000,127.0.0.1:7001",
    ] {
        assert!(parse_url(good).is_ok(), "{good}: {:?}", parse_url(good));
    }
    for (bad, want) in [
        ("redis-cluster://", "no host"),
        ("redis-cluster://127.0.0.1:7000,", "no host"),
        ("redis-cluster://127.0.0.1:7000/1", "no database number"),
        ("redis-cluster://h:x,h:7001", "bad port"),
        ("redis-cluster://h:0", "bad port"),
    ] {
        let e = parse_url(bad).err().unwrap().to_string();
        assert!(e.contains(want), "{bad}: {e}");
        assert!(e.contains("redis-cluster://HOST:PORT"), "{bad}: {e}");
    }
    // A password in the URL is never shown.
    let e = parse_url("redis-cluster://u:secret-pw@h:1/0")
        .err()
        .unwrap()
        .to_string();
    assert!(!e.contains("secret-pw"), "{e}");
    let e = RedisStore::new(
        "redis-cluster://127.0.0.1:7000",
        Limits::default(),
        RedisOptions {
            auth: mcp_ownership::redis::RedisAuth {
                ca_pem: Some(b"pem".to_vec()),
                ..Default::default()
            },
            ..RedisOptions::default()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("only for rediss-cluster://"), "{e}");
}

/// Sessions spread over every primary (it is a real Cluster), each session's keys on one
/// slot, and a resume of each continues.
#[tokio::test]
async fn sessions_spread_over_primaries_each_on_one_slot() {
    use suite::*;
    let c = cluster();
    let s = make(Limits::default());
    let mut owners = std::collections::BTreeSet::new();
    for n in 0..30 {
        let key = session_n(n);
        apply(
            &s,
            &[open(&key), get_stream(&key, A, T0), events(&key, A, 1, 3)],
        )
        .await;
        assert_eq!(
            verdict(&s, &key, A, mcp_resume_core::ownership::StreamKind::Get, 1).await,
            cont(OWNER_X, ids(2, 3), 3)
        );
        let base = s.session_base(&key);
        let (master, slot) = c.owner_of(&format!("{base}:s"));
        for k in [
            format!("{base}:n"),
            format!("{base}:i:{A}"),
            format!("{base}:w:{A}"),
        ] {
            assert_eq!(c.owner_of(&k), (master, slot), "{k}");
            assert_eq!(
                cluster::cli(master, &["exists", &k]).trim(),
                "1",
                "{k} on {master}"
            );
        }
        owners.insert(master);
    }
    assert_eq!(owners.len(), 3, "{owners:?}");
    assert!(s.health().await.is_ok());
    assert_eq!(s.name(), "redis-cluster");
}

/// A Cluster that is not there: every operation fails within the bound, as one Redis does.
#[tokio::test]
async fn unreachable_cluster_fails_fast() {
    use suite::*;
    let opts = RedisOptions {
        op_timeout: Duration::from_millis(150),
        ..RedisOptions::default()
    };
    let s = RedisStore::new(
        "redis-cluster://127.0.0.1:1,127.0.0.1:2",
        Limits::default(),
        opts,
    )
    .unwrap();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let e = s.health().await.unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        assert!(e.to_string().contains("redis"), "{e}");
        assert!(s.apply(&[open(S1)], T0).await.is_err());
    }
}
