//! A bounded in-memory event store: the last N events of every stream, like the SDKs' example
//! stores. rmcp 3.11 ships none; this one serves tests and single-process servers.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Mutex, MutexGuard},
};

use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};

#[derive(Debug, Default)]
struct Rings {
    next_id: u64,
    /// Per stream, its surviving events, oldest first.
    streams: HashMap<String, VecDeque<ServerSseMessage>>,
    /// Id of every surviving event to its stream.
    index: HashMap<EventId, String>,
}

/// Keeps the last `per_stream` events of each stream; ids are a process-wide counter.
/// A cursor it no longer holds (evicted, or never issued) replays nothing, as the SDKs' example
/// stores do: the silent gap the contiguity assertion exists to name.
#[derive(Debug)]
pub struct RingEventStore {
    per_stream: usize,
    rings: Mutex<Rings>,
}

impl RingEventStore {
    /// `per_stream` of 0 is taken as 1.
    pub fn new(per_stream: usize) -> Self {
        RingEventStore {
            per_stream: per_stream.max(1),
            rings: Mutex::default(),
        }
    }

    fn rings(&self) -> MutexGuard<'_, Rings> {
        self.rings.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait::async_trait]
impl EventStore for RingEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let mut rings = self.rings();
        rings.next_id += 1;
        let id = rings.next_id.to_string();
        let mut stored = event.clone();
        stored.event_id = Some(id.clone());
        let ring = rings.streams.entry(stream_id.to_owned()).or_default();
        ring.push_back(stored);
        let evicted = if ring.len() > self.per_stream {
            ring.pop_front()
        } else {
            None
        };
        if let Some(old) = evicted.and_then(|e| e.event_id) {
            rings.index.remove(&old);
        }
        rings.index.insert(id.clone(), stream_id.to_owned());
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let rings = self.rings();
        let after: Vec<ServerSseMessage> = rings
            .index
            .get(last_event_id)
            .and_then(|stream| rings.streams.get(stream))
            .map(|ring| {
                ring.iter()
                    .skip_while(|e| e.event_id.as_deref() != Some(last_event_id))
                    .skip(1)
                    // Priming events are stored but never replayed, as in the SDKs.
                    .filter(|e| e.message.is_some())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        Ok(Box::pin(futures_util::stream::iter(after)))
    }
}
