//! The wrapper's bookkeeping against inner stores that trim, skip or fail (no HTTP).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{num::NonZeroUsize, sync::Arc, time::Duration};

use futures_util::StreamExt;
use mcp_resume_guard_contiguity::{
    ContiguityEventStore, RingEventStore, DEFAULT_MAX_TRACKED_EVENTS, REPLAY_METHOD,
};
use rmcp::{
    model::{CustomNotification, ServerJsonRpcMessage, ServerNotification},
    transport::streamable_http_server::session::{
        EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
    },
};
use serde_json::{json, Value};

fn note(n: u64) -> ServerSseMessage {
    let params = json!({ "level": "info", "data": { "n": n } });
    ServerSseMessage::from_message(ServerJsonRpcMessage::notification(
        ServerNotification::CustomNotification(CustomNotification::new(
            "notifications/message",
            Some(params),
        )),
    ))
}

fn priming() -> ServerSseMessage {
    ServerSseMessage::retry(Duration::from_millis(500))
}

async fn fill(store: &dyn EventStore, stream: &str, n: u64) -> Vec<EventId> {
    let mut ids = Vec::new();
    for i in 1..=n {
        ids.push(store.store_event(stream, &note(i)).await.unwrap());
    }
    ids
}

/// The replay as (id, JSON data) pairs; the first is the assertion.
async fn replay(store: &dyn EventStore, cursor: &str) -> Vec<(Option<String>, Value)> {
    let s = store.replay_events_after(cursor).await.unwrap();
    s.map(|e| {
        let data = e
            .message
            .as_deref()
            .map_or(Value::Null, |m| serde_json::to_value(m).unwrap());
        (e.event_id, data)
    })
    .collect()
    .await
}

fn params(head: &(Option<String>, Value)) -> Value {
    assert_eq!(head.1["method"], REPLAY_METHOD, "{head:?}");
    head.1["params"].clone()
}

fn ids_of(rest: &[(Option<String>, Value)]) -> Vec<String> {
    rest.iter().map(|(id, _)| id.clone().unwrap()).collect()
}

#[tokio::test]
async fn short_absence_a_complete_replay_starts_with_the_cursor_as_its_id() {
    let store = ContiguityEventStore::new(RingEventStore::new(100));
    let seen = fill(&store, "s", 3).await;
    let away = fill(&store, "s", 5).await;
    let r = replay(&store, &seen[2]).await;
    assert_eq!(
        r[0].0.as_deref(),
        Some(seen[2].as_str()),
        "event id = the cursor"
    );
    assert_eq!(
        r[0].1,
        json!({"jsonrpc": "2.0", "method": REPLAY_METHOD,
               "params": {"v": 1, "after": seen[2], "complete": true, "count": 5}})
    );
    assert_eq!(
        ids_of(&r[1..]),
        away,
        "the inner replay follows, ids unchanged"
    );
    assert_eq!(
        r[1].1["method"], "notifications/message",
        "messages unchanged"
    );
    assert_eq!(r[5].1["params"]["data"]["n"], 5);
}

#[tokio::test]
async fn empty_replay_is_complete_with_count_0() {
    let store = ContiguityEventStore::new(RingEventStore::new(100));
    let ids = fill(&store, "s", 3).await;
    let r = replay(&store, &ids[2]).await;
    assert_eq!(r.len(), 1);
    assert_eq!(
        params(&r[0]),
        json!({"v": 1, "after": ids[2], "complete": true, "count": 0})
    );
}

#[tokio::test]
async fn long_absence_the_inner_store_evicted_the_cursor_truncated() {
    // The ring replays nothing for a cursor it evicted; the wrapper still knows where it was.
    let store = ContiguityEventStore::new(RingEventStore::new(100));
    let seen = fill(&store, "s", 3).await;
    fill(&store, "s", 150).await;
    let r = replay(&store, &seen[2]).await;
    assert_eq!(r.len(), 1);
    assert_eq!(
        params(&r[0]),
        json!({"v": 1, "after": seen[2], "complete": false, "count": 0, "reason": "truncated"})
    );
}

#[tokio::test]
async fn long_absence_beyond_the_wrappers_memory_is_unknown_cursor() {
    let store = ContiguityEventStore::new(RingEventStore::new(100))
        .with_max_tracked_events(NonZeroUsize::new(100).unwrap());
    let seen = fill(&store, "s", 3).await;
    fill(&store, "s", 150).await;
    let r = replay(&store, &seen[2]).await;
    assert_eq!(params(&r[0])["reason"], "unknown_cursor");
    assert_eq!(params(&r[0])["complete"], false);
    // A recent cursor is still judged.
    let recent = fill(&store, "s", 2).await;
    assert_eq!(
        params(&replay(&store, &recent[0]).await[0])["complete"],
        true
    );
}

#[tokio::test]
async fn never_issued_cursor_is_unknown_and_the_inner_answer_is_passed_on() {
    let store = ContiguityEventStore::new(RingEventStore::new(100));
    fill(&store, "s", 2).await;
    let r = replay(&store, "never-issued").await;
    assert_eq!(r[0].0.as_deref(), Some("never-issued"));
    assert_eq!(
        params(&r[0]),
        json!({"v": 1, "after": "never-issued", "complete": false, "count": 0,
               "reason": "unknown_cursor"})
    );
    assert_eq!(r.len(), 1);
}

/// Replays what survives of the stream after an evicted cursor (like the naive replica), or a
/// chosen list of ids.
type Pick = Box<dyn Fn(&[ServerSseMessage]) -> Vec<ServerSseMessage> + Send + Sync>;

struct Tail {
    ring: RingEventStore,
    pick: Pick,
    all: std::sync::Mutex<Vec<ServerSseMessage>>,
    limit: usize,
}

impl Tail {
    fn new(
        limit: usize,
        pick: impl Fn(&[ServerSseMessage]) -> Vec<ServerSseMessage> + Send + Sync + 'static,
    ) -> Self {
        Tail {
            ring: RingEventStore::new(limit),
            pick: Box::new(pick),
            all: Default::default(),
            limit,
        }
    }
}

#[async_trait::async_trait]
impl EventStore for Tail {
    async fn store_event(
        &self,
        stream: &str,
        e: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let id = self.ring.store_event(stream, e).await?;
        let mut kept = e.clone();
        kept.event_id = Some(id.clone());
        let mut all = self.all.lock().unwrap();
        all.push(kept);
        let n = all.len();
        if n > self.limit {
            all.drain(..n - self.limit);
        }
        Ok(id)
    }
    async fn replay_events_after(&self, _last: &str) -> Result<EventStream, EventStoreError> {
        let picked = (self.pick)(&self.all.lock().unwrap());
        Ok(Box::pin(futures_util::stream::iter(picked)))
    }
}

#[tokio::test]
async fn a_surviving_tail_that_skips_events_is_not_contiguous_and_still_forwarded() {
    let store = ContiguityEventStore::new(Tail::new(3, |all| all.to_vec()));
    let ids = fill(&store, "s", 10).await;
    let r = replay(&store, &ids[2]).await;
    let p = params(&r[0]);
    assert_eq!(
        (p["complete"].clone(), p["reason"].clone()),
        (json!(false), json!("not_contiguous"))
    );
    assert_eq!(
        ids_of(&r[1..]),
        ids[7..],
        "the wrapper never changes a replay"
    );
    assert_eq!(p["count"], 3);
}

#[tokio::test]
async fn a_replay_that_skips_one_event_is_not_contiguous() {
    // Everything after the cursor but the second event: the ring itself never loses it.
    let store = ContiguityEventStore::new(Tail::new(100, |all| {
        let mut v: Vec<_> = all[3..].to_vec();
        v.remove(1);
        v
    }));
    let ids = fill(&store, "s", 8).await;
    let r = replay(&store, &ids[2]).await;
    assert_eq!(params(&r[0])["reason"], "not_contiguous");
    assert_eq!(r.len(), 1 + 4);
}

#[tokio::test]
async fn a_replay_that_repeats_an_event_is_not_contiguous() {
    let store = ContiguityEventStore::new(Tail::new(100, |all| {
        let mut v: Vec<_> = all[2..].to_vec();
        v.push(all[4].clone());
        v
    }));
    let ids = fill(&store, "s", 6).await;
    let r = replay(&store, &ids[1]).await;
    assert_eq!(params(&r[0])["reason"], "not_contiguous");
}

#[tokio::test]
async fn events_of_another_stream_are_not_contiguous() {
    let store =
        ContiguityEventStore::new(Tail::new(100, |all| vec![all[2].clone(), all[1].clone()]));
    let a = fill(&store, "a", 2).await;
    let b = fill(&store, "b", 1).await;
    let r = replay(&store, &a[0]).await;
    assert_eq!(params(&r[0])["reason"], "not_contiguous");
    assert_eq!(r[1].0.as_deref(), Some(b[0].as_str()));
}

#[tokio::test]
async fn a_replay_that_ends_early_is_truncated() {
    let store = ContiguityEventStore::new(Tail::new(100, |all| all[3..5].to_vec()));
    let ids = fill(&store, "s", 8).await;
    let r = replay(&store, &ids[2]).await;
    assert_eq!(
        params(&r[0]),
        json!({"v": 1, "after": ids[2], "complete": false, "count": 2, "reason": "truncated"})
    );
}

#[tokio::test]
async fn priming_events_take_no_number_and_may_be_the_cursor() {
    let store = ContiguityEventStore::new(RingEventStore::new(100));
    let p1 = store.store_event("s", &priming()).await.unwrap();
    let ids = fill(&store, "s", 3).await;
    let p2 = store.store_event("s", &priming()).await.unwrap();
    let r = replay(&store, &p1).await;
    assert_eq!(
        params(&r[0]),
        json!({"v": 1, "after": p1, "complete": true, "count": 3})
    );
    assert_eq!(ids_of(&r[1..]), ids);
    let last = replay(&store, &p2).await;
    assert_eq!(
        params(&last[0]),
        json!({"v": 1, "after": p2, "complete": true, "count": 0})
    );
    // A replay that includes a priming event is still complete.
    let with_priming = ContiguityEventStore::new(Tail::new(100, |all| all[1..].to_vec()));
    let a = fill(&with_priming, "s", 1).await;
    with_priming.store_event("s", &priming()).await.unwrap();
    fill(&with_priming, "s", 2).await;
    assert_eq!(
        params(&replay(&with_priming, &a[0]).await[0])["complete"],
        true
    );
}

/// A store whose replay always fails (rmcp would answer an empty 200).
struct Failing(RingEventStore);

#[async_trait::async_trait]
impl EventStore for Failing {
    async fn store_event(
        &self,
        stream: &str,
        e: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        self.0.store_event(stream, e).await
    }
    async fn replay_events_after(&self, _last: &str) -> Result<EventStream, EventStoreError> {
        Err("backend down".into())
    }
}

#[tokio::test]
async fn an_inner_failure_is_asserted_as_cannot() {
    let store = ContiguityEventStore::from_shared(Arc::new(Failing(RingEventStore::new(10))));
    let ids = fill(&store, "s", 2).await;
    let r = replay(&store, &ids[0]).await;
    assert_eq!(r.len(), 1);
    assert_eq!(params(&r[0])["reason"], "truncated");
    assert_eq!(
        params(&replay(&store, "x").await[0])["reason"],
        "unknown_cursor"
    );
}

/// A store that keeps its replay open for live events (a distributed log).
struct Live {
    ring: RingEventStore,
    tail: tokio::sync::Mutex<Option<tokio::sync::mpsc::Receiver<ServerSseMessage>>>,
}

#[async_trait::async_trait]
impl EventStore for Live {
    async fn store_event(
        &self,
        stream: &str,
        e: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        self.ring.store_event(stream, e).await
    }
    async fn replay_events_after(&self, last: &str) -> Result<EventStream, EventStoreError> {
        let replay = self.ring.replay_events_after(last).await?;
        let rx = self.tail.lock().await.take().unwrap();
        Ok(Box::pin(replay.chain(tokio_stream_like(rx))))
    }
}

fn tokio_stream_like(
    rx: tokio::sync::mpsc::Receiver<ServerSseMessage>,
) -> impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) })
}

#[tokio::test]
async fn an_open_replay_is_asserted_at_the_head_and_its_live_tail_follows() {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let store = ContiguityEventStore::new(Live {
        ring: RingEventStore::new(100),
        tail: tokio::sync::Mutex::new(Some(rx)),
    });
    let ids = fill(&store, "s", 4).await;
    let mut s = store.replay_events_after(&ids[1]).await.unwrap();
    let head = s.next().await.unwrap();
    let data = serde_json::to_value(head.message.as_deref().unwrap()).unwrap();
    assert_eq!(
        data["params"],
        json!({"v": 1, "after": ids[1], "complete": true, "count": 2})
    );
    assert_eq!(s.next().await.unwrap().event_id, Some(ids[2].clone()));
    assert_eq!(s.next().await.unwrap().event_id, Some(ids[3].clone()));
    let mut live = note(5);
    live.event_id = Some("live-1".into());
    tx.send(live).await.unwrap();
    assert_eq!(s.next().await.unwrap().event_id.as_deref(), Some("live-1"));
    drop(tx);
    assert!(s.next().await.is_none());
}

#[tokio::test]
async fn an_open_replay_that_lost_events_is_not_contiguous_when_the_next_one_comes() {
    // The ring evicted the cursor's successors and replays nothing; the stream stays open. The
    // verdict waits for the next event, which shows the gap.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let store = ContiguityEventStore::new(Live {
        ring: RingEventStore::new(3),
        tail: tokio::sync::Mutex::new(Some(rx)),
    });
    let seen = fill(&store, "s", 2).await;
    fill(&store, "s", 5).await;
    let produce = async {
        let mut live = note(8);
        live.event_id = Some(store.store_event("s", &note(8)).await.unwrap());
        tx.send(live).await.unwrap();
    };
    let (replayed, ()) = tokio::join!(store.replay_events_after(&seen[1]), produce);
    let head = replayed.unwrap().next().await.unwrap();
    let data = serde_json::to_value(head.message.as_deref().unwrap()).unwrap();
    assert_eq!(data["params"]["reason"], "not_contiguous", "{data}");
}

#[test]
fn the_default_memory_is_documented() {
    assert_eq!(DEFAULT_MAX_TRACKED_EVENTS, 100_000);
}
