//! The shared store suite against the in-memory store, plus its byte cap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod suite;

use mcp_ownership::store::Limits;
use mcp_ownership::{MemoryStore, Store};
use mcp_resume_core::ownership::Record;

store_suite!(MemoryStore::new);

/// Filling the store with 100x its byte cap keeps it under the cap (the estimate never
/// undercounts the ids it holds): above the high water mark new sessions are refused
/// (`store_full`) and their records, held as pending, go first; no session is evicted and a
/// session in use keeps its verdict.
#[tokio::test]
async fn byte_cap_bounds_memory_and_keeps_live_sessions() {
    use suite::*;
    const CAP: usize = 1 << 20;
    const IDS: u64 = 64;
    const ID_BYTES: usize = 200;
    let s = MemoryStore::new(Limits {
        max_bytes: CAP,
        ..Limits::default()
    });
    let live = session_n(1);
    fill_one(&s, 1, T0).await;
    let big = |n: u64, now: u64| {
        let key = session_n(n);
        vec![
            open(&key),
            get_stream(&key, A, now),
            Record::Events {
                session: key.clone(),
                incarnation: A.into(),
                first_seq: 1,
                ids: (0..IDS)
                    .map(|i| format!("{i:0>width$}", width = ID_BYTES))
                    .collect(),
                long: Vec::new(),
                branch: 0,
                trimmed: 0,
            },
        ]
    };
    let fillers = 100 * CAP as u64 / (IDS * ID_BYTES as u64);
    let mut refused = 0;
    for k in 0..fillers {
        let now = T0 + k + 1;
        let done = s.apply(&big(1000 + k, now), now).await.unwrap();
        refused += done.refused.len() as u64;
        if k % 50 == 0 {
            assert_eq!(
                verdict_at(&s, &live, 1, now).await,
                cont(OWNER_X, ids(2, 3), 3)
            );
        }
        let st = s.stats(now).await.unwrap();
        assert!(st.bytes <= CAP as u64, "{} bytes at step {k}", st.bytes);
        // Never undercounts: at least the raw id bytes of every session held.
        assert!(
            st.bytes >= (st.sessions - 1) * IDS * ID_BYTES as u64,
            "{st:?}"
        );
    }
    let st = s.stats(T0 + fillers + 1).await.unwrap();
    assert_eq!(st.evicted, 0, "{st:?}");
    assert!(refused >= fillers - 100, "{refused} refused: {st:?}");
    assert!(st.sessions > 10, "the cap is not a wipe: {st:?}");
    // Sessions already open keep growing past the high water mark: the live session's
    // resumes are continuations, whose branch table (at most 16 entries) it holds too.
    assert!(
        st.bytes <= (CAP / 100 * mcp_ownership::store::HIGH_WATER_PERCENT) as u64 + 22_000,
        "{st:?}"
    );
    assert_eq!(
        verdict_at(&s, &live, 1, T0 + fillers + 1).await,
        cont(OWNER_X, ids(2, 3), 3)
    );
    // Freeing returns the bytes: after the TTL everything is swept and the count is 0.
    let later = T0 + fillers + Limits::default().session_idle_ttl_ms + 10;
    s.sweep(later).await.unwrap();
    let st = s.stats(later).await.unwrap();
    assert_eq!((st.sessions, st.pending, st.bytes), (0, 0, 0), "{st:?}");
}

/// One session's traffic (8 GET streams of its own, 16,000 events) at the smallest byte cap
/// never evicts another session nor refuses its valid resume: the cap holds, the growth of the
/// session that pushes the store to it is refused (`store_full`), and its own budget
/// (`max_session_events`) trims only its own incarnations.
#[tokio::test]
async fn one_session_never_evicts_the_others() {
    use mcp_ownership::store::STORE_FULL;
    use suite::*;
    const CAP: usize = 1 << 20;
    let s = MemoryStore::new(Limits {
        max_bytes: CAP,
        ..Limits::default()
    });
    let victims: Vec<String> = (1..=12).map(session_n).collect();
    for n in 1..=12 {
        fill_one(&s, n, T0).await;
    }
    let attacker = session_n(999);
    apply(&s, &[open(&attacker)]).await;
    let streams: Vec<String> = (0..8u64).map(|i| format!("{:016x}", 0xa0 + i)).collect();
    for inc in &streams {
        apply(&s, &[get_stream(&attacker, inc, T0)]).await;
    }
    let mut full = 0;
    for round in 0..100u64 {
        let now = T0 + 1 + round;
        let batch: Vec<Record> = streams
            .iter()
            .map(|inc| Record::Events {
                session: attacker.clone(),
                incarnation: inc.clone(),
                first_seq: 1 + round * 20,
                ids: (0..20)
                    .map(|i| format!("attacker-event-{round:04}-{i:04}-padding"))
                    .collect(),
                long: Vec::new(),
                branch: 0,
                trimmed: 0,
            })
            .collect();
        let done = s.apply(&batch, now).await.unwrap();
        full += done
            .refused
            .iter()
            .filter(|r| r.error == STORE_FULL)
            .count();
        let st = s.stats(now).await.unwrap();
        assert!(
            st.bytes <= CAP as u64,
            "{} bytes at round {round}",
            st.bytes
        );
    }
    assert!(full > 0, "the cap was reached and the growth refused");
    let now = T0 + 200;
    let st = s.stats(now).await.unwrap();
    assert_eq!((st.evicted, st.sessions), (0, 13), "{st:?}");
    for v in &victims {
        assert_eq!(
            verdict_at(&s, v, 1, now).await,
            cont(OWNER_X, ids(2, 3), 3),
            "{v}"
        );
    }
}
