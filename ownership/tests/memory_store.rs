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
