//! Relaying an event allocates nothing: the heap allocations of a stream do not grow with the
//! number of events it relays (counted by a global allocator, per thread).
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mcp_resume_core::cursor::{DecodedCursor, Key, Keyring};
use mcp_resume_core::ownership::{recorded_event, StreamKind};
use mcp_resume_core::sse::content_digest;
use mcp_resume_core::stream::{Flow, StreamState};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCS.with(|a| a.get())
}

fn keys() -> Keyring {
    Keyring::new(
        Key {
            id: 1,
            secret: vec![7; 32],
        },
        vec![],
    )
    .unwrap()
}

/// How the events reach the stream.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// One event per chunk.
    Whole,
    /// Three events per chunk, CRLF line ends.
    ThreePerChunk,
    /// Each event split in two chunks inside its data line.
    Split,
}

fn event(n: usize, crlf: bool) -> String {
    let e = format!("event: message\nid: e{n}\ndata: {{\"n\":{n},\"pad\":\"xxxxxxxxxxxx\"}}\n\n");
    if crlf {
        e.replace('\n', "\r\n")
    } else {
        e
    }
}

fn chunks(events: usize, shape: Shape) -> Vec<Vec<u8>> {
    match shape {
        Shape::Whole => (1..=events).map(|n| event(n, false).into_bytes()).collect(),
        Shape::ThreePerChunk => (1..=events)
            .collect::<Vec<_>>()
            .chunks(3)
            .map(|ns| {
                ns.iter()
                    .map(|&n| event(n, true))
                    .collect::<String>()
                    .into_bytes()
            })
            .collect(),
        Shape::Split => (1..=events)
            .flat_map(|n| {
                let e = event(n, false).into_bytes();
                let (a, b) = e.split_at(e.len() - 8);
                [a.to_vec(), b.to_vec()]
            })
            .collect(),
    }
}

/// Allocations made while `s` relays `chunks`, the relayed ids read and cleared after every
/// chunk as the exchange does.
fn relay(s: &mut StreamState, chunks: &[Vec<u8>]) -> (u64, u64) {
    let k = keys();
    let mut out = Vec::with_capacity(4096);
    let mut ids = 0u64;
    let before = allocations();
    for c in chunks {
        out.clear();
        assert_eq!(s.push(&k, c, &mut out), Flow::Open);
        if let Some((_, r)) = s.relayed() {
            // Read as the record queue reads them.
            ids += r.iter().filter(|(id, _)| !id.is_empty()).count() as u64;
        }
        s.clear_relayed();
    }
    (allocations() - before, ids)
}

fn fresh(events: usize, shape: Shape) -> u64 {
    let chunks = chunks(events, shape);
    let mut s = StreamState::fresh([1; 8], 42, StreamKind::Get, 4096);
    let (allocs, ids) = relay(&mut s, &chunks);
    assert_eq!(ids, events as u64);
    allocs
}

/// A continuation that replays `events` recorded events (held, checked), then relays as many new.
fn continued(events: usize, shape: Shape) -> u64 {
    let all = chunks(2 * events, shape);
    let expected: Vec<String> = (1..=events)
        .map(|n| {
            let data = format!("data: {{\"n\":{n},\"pad\":\"xxxxxxxxxxxx\"}}");
            recorded_event(
                &format!("e{n}"),
                content_digest(&[b"event: message", data.as_bytes()]),
            )
        })
        .collect();
    let cursor = DecodedCursor {
        key_id: 1,
        session: [1; 8],
        incarnation: 42,
        kind: StreamKind::Get,
        seq: 7,
        replica_event_id: Some("e0".to_string()),
        request_id: None,
    };
    let mut s = StreamState::continuation(&cursor, expected, true, 4096);
    // The head (its first block) is read once per stream, not per event.
    let (_, first) = relay(&mut s, &all[..1]);
    let (allocs, ids) = relay(&mut s, &all[1..]);
    assert_eq!(ids + first, 2 * events as u64);
    allocs
}

#[test]
fn relaying_more_events_allocates_nothing_more() {
    for shape in [Shape::Whole, Shape::ThreePerChunk, Shape::Split] {
        // The first events size the buffers; from then on nothing is allocated per event.
        let few = fresh(30, shape);
        let many = fresh(3000, shape);
        assert_eq!(
            many, few,
            "fresh stream, {shape:?}: {few} allocations for 30 events, {many} for 3000"
        );
        let few = continued(30, shape);
        let many = continued(3000, shape);
        assert_eq!(
            many, few,
            "continuation, {shape:?}: {few} allocations for 30 events, {many} for 3000"
        );
    }
}
