//! Faults of a real Redis Cluster (3 primaries, 3 replicas on 127.0.0.1:6420-6425 +
//! `E2E_PORT_OFFSET`, this binary's own): a primary killed (the replica takes over, with an
//! empty script cache), and a slot migrated key by key while records and resumes run. The
//! store fails closed (a bounded error, never a wrong verdict) and recovers on its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cluster;
mod suite;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cluster::{cli, Cluster};
use mcp_ownership::store::Limits;
use mcp_ownership::{RedisOptions, RedisStore, Store};
use mcp_resume_core::ownership::{ResumeVerdict, StreamKind};
use suite::*;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
/// One fault at a time: they change the whole cluster.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| Cluster::start(6420, 3, 1))
}

fn make(prefix: &str) -> RedisStore {
    let opts = RedisOptions {
        prefix: prefix.to_owned(),
        op_timeout: Duration::from_millis(150),
        wait_replicas: 1,
        ..RedisOptions::default()
    };
    RedisStore::new(&cluster().url("redis-cluster"), Limits::default(), opts).expect("store")
}

/// Apply as the guard does: resend until acknowledged (the first call also connects, which
/// on a busy machine may not fit in one operation's bound).
async fn send(s: &RedisStore, records: &[mcp_resume_core::ownership::Record]) {
    for _ in 0..100 {
        if s.apply(records, T0).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    apply(s, records).await;
}

/// A session with one GET stream of three events, acknowledged; its resume at 1 continues.
async fn stream_of_three(s: &RedisStore, key: &str) -> ResumeVerdict {
    send(
        s,
        &[open(key), get_stream(key, A, T0), events(key, A, 1, 3)],
    )
    .await;
    let right = cont(OWNER_X, ids(2, 3), 3);
    assert_eq!(try_verdict(s, key, 1).await.0.unwrap(), right);
    right
}

/// One resume of `inc` at `seq`: Ok(verdict) or the store's error, timed.
async fn try_verdict(
    s: &RedisStore,
    session: &str,
    seq: u64,
) -> (Result<ResumeVerdict, String>, Duration) {
    use mcp_ownership::metrics::Metrics;
    use mcp_ownership::resume::{resolve, ResumeOptions};
    let q = query(session, A, StreamKind::Get, seq);
    let opts = ResumeOptions {
        record_wait: Duration::ZERO,
        max_expected: 256,
    };
    let clock = || T0;
    let t = Instant::now();
    let r = resolve(s, &q, &opts, &clock, &Metrics::new()).await;
    // The branch number is the suite's business (and under faults a continuation may go on
    // without one): these cases check the verdict's facts.
    let unbranched = |mut v: ResumeVerdict| {
        if let ResumeVerdict::Continue { branch, .. } = &mut v {
            *branch = None;
        }
        v
    };
    (
        r.map(|r| unbranched(r.verdict)).map_err(|e| e.to_string()),
        t.elapsed(),
    )
}

/// Resumes of `inc` at `seq` until one is answered, or `within` has passed: the last result.
async fn verdict_once_answering(
    s: &RedisStore,
    session: &str,
    seq: u64,
    within: Duration,
) -> Result<ResumeVerdict, String> {
    let mut v = try_verdict(s, session, seq).await.0;
    let started = Instant::now();
    while v.is_err() && started.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(50)).await;
        v = try_verdict(s, session, seq).await.0;
    }
    v
}

/// A primary dies: while the Cluster fails over every resume on it is a fast error (never a
/// verdict other than the right one), records acknowledged before (WAIT 1) survive on the
/// promoted replica, which has no scripts loaded (NOSCRIPT → loaded on every primary), and
/// everything works again without touching the service.
#[tokio::test]
async fn primary_killed_fails_closed_then_recovers() {
    let _one = SERIAL.lock().await;
    let c = cluster();
    c.ensure_all_up(Duration::from_secs(60));
    let s = make("kill:");
    let key = session_n(7);
    let right = stream_of_three(&s, &key).await;
    let (master, _) = c.owner_of(&format!("{}:s", s.session_base(&key)));
    let replica = c.replica_of(master);
    // The promoted node must load the scripts itself.
    assert_eq!(cli(replica, &["script", "flush"]).trim(), "OK");
    c.kill(master);
    let killed = Instant::now();
    let (mut errors, mut slowest, mut recovered) = (0, Duration::ZERO, None);
    while killed.elapsed() < Duration::from_secs(20) {
        let (r, took) = try_verdict(&s, &key, 1).await;
        slowest = slowest.max(took);
        match r {
            Ok(v) => {
                assert_eq!(v, right, "a wrong verdict during the failover");
                if errors > 0 {
                    recovered = Some(killed.elapsed());
                    break;
                }
            }
            Err(e) => {
                assert!(e.contains("redis"), "{e}");
                errors += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = recovered.expect("no recovery within 20 s");
    eprintln!(
        "primary killed: {errors} failed resumes, slowest {slowest:?}, continuing again after {recovered:?}"
    );
    assert!(errors > 0, "the dead primary was never noticed");
    assert!(slowest < Duration::from_millis(400), "{slowest:?}");
    assert!(
        c.wait_promoted(replica, Duration::from_secs(30)),
        "{replica} not promoted"
    );
    // The promoted primary has no replica yet: records are refused (fast), since a second
    // failover could lose them. The primary may have applied them all the same (WAIT does
    // not undo), so resumes may see them; the guard sends them again until they are
    // acknowledged. (The new primary had no scripts: NOSCRIPT, then SCRIPT LOAD.)
    // (The records' own connection learns the new topology on its first use: that one may
    // time out instead.)
    let mut why = String::new();
    for _ in 0..10 {
        let t = Instant::now();
        why = match s.apply(&[events(&key, A, 4, 5)], T0).await {
            Err(e) => e.to_string(),
            // Acknowledged: a replica already holds them (the cluster gave the promoted primary
            // one in the meantime), which is what WAIT asks; nothing is refused then.
            Ok(done) => {
                assert!(done.refused.is_empty(), "{done:?}");
                eprintln!("the promoted primary already had a replica: records acknowledged");
                why = "0 of 1 replicas (acknowledged instead)".into();
                break;
            }
        };
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        if why.contains("0 of 1 replicas") {
            break;
        }
    }
    assert!(why.contains("0 of 1 replicas"), "{why}");
    let v = try_verdict(&s, &key, 1).await.0.unwrap();
    assert!(v == right || v == cont(OWNER_X, ids(2, 5), 5), "{v:?}");
    // The old primary comes back as its replica: the resent records are acknowledged.
    c.restart(master);
    c.wait_ok(Duration::from_secs(60));
    send(&s, &[events(&key, A, 4, 5)]).await;
    assert_eq!(
        try_verdict(&s, &key, 3).await.0.unwrap(),
        cont(OWNER_X, ids(4, 5), 5)
    );
    assert_eq!(
        try_verdict(&s, &key, 1).await.0.unwrap(),
        cont(OWNER_X, ids(2, 5), 5)
    );
}

/// A whole-cluster outage drops the Cluster connection at the first failed health check: the
/// cluster client keeps what it could not serve, and its memory grew with every outage. The
/// next operation connects anew and the verdicts are right again.
#[tokio::test]
async fn an_outage_renews_the_cluster_connection() {
    let _one = SERIAL.lock().await;
    let c = cluster();
    c.ensure_all_up(Duration::from_secs(60));
    let s = make("renew:");
    let key = session_n(11);
    let right = stream_of_three(&s, &key).await;
    assert_eq!(s.cluster_connected(), Some(true));
    let ports = c.ports.clone();
    for &p in &ports {
        c.kill(p);
    }
    let down = Instant::now();
    let mut renewed = false;
    while down.elapsed() < Duration::from_secs(10) {
        if s.health().await.is_err() {
            renewed = s.cluster_connected() == Some(false);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for &p in &ports {
        c.restart(p);
    }
    c.wait_ok(Duration::from_secs(60));
    assert!(renewed, "a failed health check kept the old connection");
    // Nothing persists across the restart (no save, no AOF): the records are sent again.
    send(
        &s,
        &[open(&key), get_stream(&key, A, T0), events(&key, A, 1, 3)],
    )
    .await;
    let v = verdict_once_answering(&s, &key, 1, Duration::from_secs(20)).await;
    assert_eq!(v.unwrap(), right);
    assert_eq!(s.cluster_connected(), Some(true));
}

/// Every node stops answering (`CLIENT PAUSE … ALL`: connections stay open, nothing is
/// served), with no health check to notice: the operations themselves find that the Cluster
/// connection answered nothing for the stall bound, drop it, and connect anew. The cluster
/// client can wedge like this after a failover and then queue every request in memory.
#[tokio::test]
async fn a_connection_that_answers_nothing_is_made_anew() {
    let _one = SERIAL.lock().await;
    let c = cluster();
    c.ensure_all_up(Duration::from_secs(60));
    let s = make("stall:");
    let key = session_n(12);
    let right = stream_of_three(&s, &key).await;
    assert_eq!(s.reconnects(), 0);
    for &p in &c.ports {
        assert_eq!(cli(p, &["CLIENT", "PAUSE", "2500", "ALL"]).trim(), "OK");
    }
    let paused = Instant::now();
    while paused.elapsed() < Duration::from_millis(2300) {
        let (v, took) = try_verdict(&s, &key, 1).await;
        assert!(v.is_err() || v.as_ref().unwrap() == &right, "{v:?}");
        assert!(took < Duration::from_millis(400), "not bounded: {took:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        s.reconnects() >= 1,
        "a connection that answered nothing for 2 s was kept"
    );
    let v = verdict_once_answering(&s, &key, 1, Duration::from_secs(10)).await;
    assert_eq!(v.unwrap(), right);
}

/// A slot holding a session moves to another primary, key by key (`CLUSTER SETSLOT …
/// MIGRATING/IMPORTING`, `MIGRATE`, `SETSLOT … NODE`), while records land and resumes run on
/// it. Each resume is the right continue (its head never behind an acknowledged record) or a
/// fast error (TRYAGAIN while the session's keys are split): never a new stream, never a
/// continue on stale facts.
#[tokio::test]
async fn slot_migration_keeps_verdicts_right() {
    let _one = SERIAL.lock().await;
    let c = cluster();
    c.ensure_all_up(Duration::from_secs(60));
    c.wait_ok(Duration::from_secs(60));
    let s = std::sync::Arc::new(make("move:"));
    let key = session_n(11);
    send(
        &s,
        &[open(&key), get_stream(&key, A, T0), events(&key, A, 1, 3)],
    )
    .await;
    // A second incarnation, so the session has many keys to split.
    send(
        &s,
        &[
            stream(&key, B, StreamKind::Request, OWNER_Y, 0, false, T0),
            events(&key, B, 1, 2),
        ],
    )
    .await;
    let base = s.session_base(&key);
    let (from, slot) = c.owner_of(&format!("{base}:s"));
    let to = *c.masters().iter().find(|m| **m != from).unwrap();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(3));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (s, key, acked, stop) = (s.clone(), key.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed, mut next) = (0u64, 0u64, 4u64);
            let mut failed_records = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match s.apply(&[events(&key, A, next, next)], T0).await {
                    Ok(_) => {
                        acked.store(next, std::sync::atomic::Ordering::SeqCst);
                        next += 1;
                    }
                    Err(e) => {
                        if failed_records < 3 {
                            eprintln!("record refused: {e}");
                        }
                        failed_records += 1;
                    }
                }
                let floor = acked.load(std::sync::atomic::Ordering::SeqCst);
                match try_verdict(&s, &key, 1).await.0 {
                    Ok(ResumeVerdict::Continue {
                        owner,
                        expected,
                        head,
                        ..
                    }) => {
                        assert_eq!(owner, OWNER_X);
                        assert!(head >= floor, "head {head} behind acknowledged {floor}");
                        assert_eq!(expected, ids(2, head), "not contiguous");
                        ok += 1;
                    }
                    Ok(other) => panic!("wrong verdict during the migration: {other:?}"),
                    Err(e) => {
                        if failed < 3 {
                            eprintln!("resume failed: {e}");
                        }
                        failed += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            eprintln!("{failed_records} records refused");
            (ok, failed, next - 1)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (from_id, to_id) = (c.node_id(from), c.node_id(to));
    let slot_s = slot.to_string();
    assert_eq!(
        cli(to, &["cluster", "setslot", &slot_s, "importing", &from_id]).trim(),
        "OK"
    );
    assert_eq!(
        cli(from, &["cluster", "setslot", &slot_s, "migrating", &to_id]).trim(),
        "OK"
    );
    let mut moved = 0;
    let started = Instant::now();
    // The session's hash first: scripts that follow it to the new primary (ASK) must not
    // read the keys still on the old one as missing.
    let mut first = Some(format!("{base}:s"));
    loop {
        let keys = cli(from, &["cluster", "getkeysinslot", &slot_s, "1"]);
        let Some(k) = first
            .take()
            .or_else(|| keys.lines().next().map(str::to_owned))
        else {
            break;
        };
        if k.is_empty() {
            break;
        }
        let r = cli(
            from,
            &["migrate", "127.0.0.1", &to.to_string(), &k, "0", "5000"],
        );
        assert!(r.contains("OK"), "MIGRATE {k}: {r}");
        moved += 1;
        assert!(moved < 100, "keys keep appearing in slot {slot}");
        // Stretch the split: resumes and records meet it.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    for m in c.masters() {
        let r = cli(m, &["cluster", "setslot", &slot_s, "node", &to_id]);
        assert!(r.contains("OK"), "SETSLOT NODE on {m}: {r}");
    }
    let split_for = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed, last) = load.await.unwrap();
    eprintln!("slot {slot} moved {from} → {to}: {moved} keys in {split_for:?}; {ok} right continues, {failed} fast errors; head {last}");
    assert!(moved >= 4, "{moved}");
    assert!(ok > 0 && failed > 0, "ok {ok}, failed {failed}");
    assert_eq!(c.owner_of(&format!("{base}:s")).0, to);
    // Everything on the new primary, nothing left behind.
    assert_eq!(
        cli(from, &["cluster", "countkeysinslot", &slot_s]).trim(),
        "0"
    );
    let last = acked.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        try_verdict(&s, &key, 1).await.0.unwrap(),
        cont(OWNER_X, ids(2, last), last)
    );
    assert_eq!(
        verdict(&*s, &key, B, StreamKind::Request, 1).await,
        cont(OWNER_Y, ids(2, 2), 2)
    );
}
