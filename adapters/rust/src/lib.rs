//! Contiguity assertions for rmcp event stores, extension version 1.
//!
//! [`ContiguityEventStore`] wraps any rmcp [`EventStore`] so that every replay starts with one
//! event whose id is the cursor itself and whose data is the notification
//! `notifications/mcp-resume-guard/replay`, saying whether the replay is complete from the cursor.
//! The wire form and its meaning are specified in docs/contiguity-extension.md of mcp-resume-guard.
//!
//! ```no_run
//! use std::sync::Arc;
//! use mcp_resume_guard_contiguity::{ContiguityEventStore, RingEventStore};
//! use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
//!
//! let store = ContiguityEventStore::new(RingEventStore::new(100));
//! let manager = LocalSessionManager::default().with_event_store(Arc::new(store));
//! ```

use std::{
    collections::{HashMap, VecDeque},
    num::NonZeroUsize,
    sync::{Arc, Mutex, MutexGuard},
};

use futures_util::{FutureExt, StreamExt};
use rmcp::{
    model::{CustomNotification, ServerJsonRpcMessage, ServerNotification},
    transport::streamable_http_server::session::{
        EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
    },
};

mod ring;
pub use ring::RingEventStore;

/// JSON-RPC method of the assertion. MCP clients ignore notifications they do not know.
pub const REPLAY_METHOD: &str = "notifications/mcp-resume-guard/replay";
/// Extension version, `params.v`.
pub const VERSION: u64 = 1;
/// Ids remembered by default (oldest forgotten first).
pub const DEFAULT_MAX_TRACKED_EVENTS: usize = 100_000;

/// Why a replay is not complete (`params.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The cursor was never issued by this process, or has been forgotten.
    UnknownCursor,
    /// A replayed event is not the next one of the cursor's stream.
    NotContiguous,
    /// The replay ends before the stream's last event at the moment it began.
    Truncated,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::UnknownCursor => "unknown_cursor",
            Reason::NotContiguous => "not_contiguous",
            Reason::Truncated => "truncated",
        }
    }
}

/// The assertion a replay of `after` starts with: an event whose id is `after` itself.
/// `reason` is `None` for a complete replay.
pub fn assertion(after: &str, count: usize, reason: Option<Reason>) -> ServerSseMessage {
    let mut params = serde_json::json!({
        "v": VERSION,
        "after": after,
        "complete": reason.is_none(),
        "count": count,
    });
    if let (Some(reason), Some(obj)) = (reason, params.as_object_mut()) {
        obj.insert("reason".into(), reason.as_str().into());
    }
    let note = CustomNotification::new(REPLAY_METHOD, Some(params));
    ServerSseMessage::new(
        after,
        ServerJsonRpcMessage::notification(ServerNotification::CustomNotification(note)),
    )
}

/// Where an id sits in its stream. A priming event (no message) takes no number of its own.
#[derive(Debug, Clone)]
struct Pos {
    stream: Arc<str>,
    seq: u64,
    priming: bool,
    /// Tells a re-tracked id from its older entry in `order`.
    generation: u64,
}

#[derive(Debug, Default)]
struct Book {
    /// Last sequence number issued per stream.
    heads: HashMap<Arc<str>, u64>,
    tracked: HashMap<EventId, Pos>,
    /// Tracked ids, oldest first.
    order: VecDeque<(EventId, u64)>,
    /// Ids still tracked per stream.
    per_stream: HashMap<Arc<str>, usize>,
    generation: u64,
}

impl Book {
    fn stream_key(&self, stream: &str) -> Arc<str> {
        self.heads
            .get_key_value(stream)
            .map_or_else(|| Arc::from(stream), |(k, _)| k.clone())
    }

    fn track(&mut self, id: EventId, stream: Arc<str>, seq: u64, priming: bool, max: usize) {
        self.generation += 1;
        let generation = self.generation;
        *self.per_stream.entry(stream.clone()).or_default() += 1;
        self.order.push_back((id.clone(), generation));
        let current = stream.clone();
        if let Some(old) = self.tracked.insert(
            id,
            Pos {
                stream,
                seq,
                priming,
                generation,
            },
        ) {
            self.forget_one(&old.stream, &current);
        }
        while self.tracked.len() > max {
            let Some((old_id, old_generation)) = self.order.pop_front() else {
                break;
            };
            let live = self
                .tracked
                .get(&old_id)
                .is_some_and(|p| p.generation == old_generation);
            if !live {
                continue;
            }
            if let Some(old) = self.tracked.remove(&old_id) {
                self.forget_one(&old.stream, &current);
            }
        }
        // Entries left behind by re-tracked ids.
        while self
            .order
            .front()
            .is_some_and(|(id, g)| self.tracked.get(id).is_none_or(|p| p.generation != *g))
        {
            self.order.pop_front();
        }
    }

    fn forget_one(&mut self, stream: &Arc<str>, current: &Arc<str>) {
        let left = self
            .per_stream
            .get(stream)
            .map_or(0, |n| n.saturating_sub(1));
        if left > 0 {
            self.per_stream.insert(stream.clone(), left);
        } else {
            // Nothing of the stream is known any more: its numbering may start again.
            self.per_stream.remove(stream);
            if stream != current {
                self.heads.remove(stream);
            }
        }
    }
}

/// Wraps `inner` (any rmcp [`EventStore`]) so that every replay starts with an assertion whose
/// event id is the cursor itself. Event ids and events are the inner store's, unchanged; the
/// replay itself is unchanged too, the assertion is one event more, in front.
///
/// The wrapper numbers each stream's events itself (per process), so it can tell whether a
/// replay is complete: every event after the cursor, in order, up to the stream's head when the
/// replay began. It remembers at most `max_tracked_events` ids (oldest forgotten first); a cursor
/// it forgot is answered "cannot" (`unknown_cursor`), never "complete".
///
/// The inner replay is read until it reaches that head, then as long as it has events ready; the
/// assertion covers what was read. What the inner stream yields later (a store that keeps the
/// stream open for live events) follows unchanged: the live tail, which the assertion does not cover.
pub struct ContiguityEventStore {
    inner: Arc<dyn EventStore>,
    max_tracked_events: usize,
    book: Arc<Mutex<Book>>,
}

impl std::fmt::Debug for ContiguityEventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContiguityEventStore")
            .field("max_tracked_events", &self.max_tracked_events)
            .finish_non_exhaustive()
    }
}

impl ContiguityEventStore {
    pub fn new(inner: impl EventStore) -> Self {
        Self::from_shared(Arc::new(inner))
    }

    /// Wraps a store that is already shared.
    pub fn from_shared(inner: Arc<dyn EventStore>) -> Self {
        ContiguityEventStore {
            inner,
            max_tracked_events: DEFAULT_MAX_TRACKED_EVENTS,
            book: Arc::default(),
        }
    }

    /// Ids remembered (default [`DEFAULT_MAX_TRACKED_EVENTS`]).
    pub fn with_max_tracked_events(mut self, max: NonZeroUsize) -> Self {
        self.max_tracked_events = max.get();
        self
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // The book is consistent after every statement that holds it; a panic elsewhere leaves it usable.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Judges `event` (the next one the inner replay yielded); `last` is the last number seen.
    fn judge(&self, at: &Pos, last: &mut u64, event: &ServerSseMessage) -> Option<Reason> {
        let book = self.book();
        let pos = event.event_id.as_ref().and_then(|id| book.tracked.get(id));
        match pos {
            Some(p) if p.stream == at.stream => {
                if p.priming {
                    None
                } else if p.seq == *last + 1 {
                    *last = p.seq;
                    None
                } else {
                    Some(Reason::NotContiguous)
                }
            }
            _ => Some(Reason::NotContiguous),
        }
    }
}

#[async_trait::async_trait]
impl EventStore for ContiguityEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        // The number is taken before the inner store is awaited: call order is the stream's order.
        // If the inner store fails, the number stays taken: later replays over it say "cannot".
        let priming = event.message.is_none();
        let (stream, seq) = {
            let mut book = self.book();
            let stream = book.stream_key(stream_id);
            let head = book.heads.entry(stream.clone()).or_default();
            if !priming {
                *head += 1;
            }
            (stream, *head)
        };
        let id = self.inner.store_event(stream_id, event).await?;
        self.book()
            .track(id.clone(), stream, seq, priming, self.max_tracked_events);
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let (at, head) = {
            let book = self.book();
            let at = book.tracked.get(last_event_id).cloned();
            let head = at
                .as_ref()
                .map(|p| book.heads.get(&p.stream).copied().unwrap_or(p.seq));
            (at, head)
        };
        let mut inner = match self.inner.replay_events_after(last_event_id).await {
            // Fused: it is polled again after it may have ended.
            Ok(s) => s.fuse(),
            Err(e) => {
                // rmcp would answer an empty stream; the client still learns that this is no replay.
                tracing::warn!(%e, "inner event store cannot replay; asserting that");
                let reason = if at.is_some() {
                    Reason::Truncated
                } else {
                    Reason::UnknownCursor
                };
                let only = assertion(last_event_id, 0, Some(reason));
                return Ok(Box::pin(futures_util::stream::iter([only])));
            }
        };
        // Held back until the assertion, which must come first, is known. Read here, before rmcp
        // starts the response: a keep-alive comment sent ahead of a late assertion would hide it
        // from the guard, so the response waits for the verdict instead.
        let mut held = Vec::new();
        let mut verdict = if at.is_none() {
            Some(Reason::UnknownCursor)
        } else {
            None
        };
        if let (Some(at), Some(head)) = (&at, head) {
            let mut last = at.seq;
            while verdict.is_none() && last < head {
                match inner.next().await {
                    Some(event) => {
                        verdict = self.judge(at, &mut last, &event);
                        held.push(event);
                    }
                    None => verdict = Some(Reason::Truncated),
                }
            }
            // A finite replay is read to its end, so every event of it is judged.
            while verdict.is_none() {
                match inner.next().now_or_never() {
                    Some(Some(event)) => {
                        verdict = self.judge(at, &mut last, &event);
                        held.push(event);
                    }
                    Some(None) | None => break,
                }
            }
        }
        // Whatever the verdict, the replay itself is the inner store's: a client without a guard
        // gets exactly what it would have got without this wrapper.
        while let Some(Some(event)) = inner.next().now_or_never() {
            held.push(event);
        }
        let first = assertion(last_event_id, held.len(), verdict);
        Ok(Box::pin(
            futures_util::stream::iter(std::iter::once(first).chain(held)).chain(inner),
        ))
    }
}
