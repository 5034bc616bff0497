//! `eventsource`: the client model (`mcp_resume_core::eventsource`) on arbitrary bytes, chunked
//! anywhere.
//!
//! Invariants: the dispatched events, the last event id and the retry do not depend on how the
//! stream is chunked (cut points, and byte by byte); and the events and last event id are the
//! ones the fuzz oracle (`client::parse`, written from the spec independently) reads.
use arbitrary::{Arbitrary, Unstructured};
use mcp_resume_core::eventsource::{Dispatch, Parser};

use crate::client;

#[derive(Debug, Arbitrary)]
struct Input {
    cuts: Vec<u16>,
    stream: Vec<u8>,
}

type Reading = (Vec<Dispatch>, String, Option<u64>);

fn read(chunks: &[&[u8]]) -> Reading {
    let mut p = Parser::new();
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, &mut out);
    }
    (out, p.last_event_id().to_owned(), p.retry())
}

pub fn eventsource(data: &[u8]) {
    let Ok(inp) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let whole = read(&[&inp.stream]);
    let parts = client::split(&inp.stream, &inp.cuts);
    assert_eq!(read(&parts), whole, "chunked at {:?}", inp.cuts);
    let bytes: Vec<&[u8]> = inp.stream.chunks(1).collect();
    assert_eq!(read(&bytes), whole, "byte by byte");

    let seen = client::parse(&inp.stream);
    let events: Vec<(String, String, String)> = whole
        .0
        .into_iter()
        .map(|d| {
            let kind = if d.event.is_empty() {
                "message".into()
            } else {
                d.event
            };
            (kind, d.data, d.last_event_id)
        })
        .collect();
    let oracle: Vec<(String, String, String)> = seen
        .events
        .into_iter()
        .map(|e| (e.kind, e.data, e.last_id.unwrap_or_default()))
        .collect();
    assert_eq!(events, oracle);
    assert_eq!(whole.1, seen.last_id.unwrap_or_default());
}
