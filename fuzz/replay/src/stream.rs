//! `stream_state`: one relayed SSE response (fresh or a continuation) from generated events.
//!
//! Invariants: every id a client sees is a cursor of this guard (never an empty reset), bound to the
//! stream's session, incarnation and kind, numbered consecutively from the stream's first
//! seq and naming the replica id it replaced; nothing else carries an id. The events handed
//! to the records are exactly those cursors, with the content digest of the event each one
//! replaced. A continuation relays the recorded events in their order, with the recorded
//! content where the records have a digest, or is cut; once cut, nothing more leaves. Judged
//! by the client model too: before a control event, every event a client dispatches on a
//! continuation is the next recorded one under its cursor, and later ones carry a cursor of
//! this stream; a client never ends with an id the guard did not mint.
use arbitrary::{Arbitrary, Unstructured};
use mcp_resume_core::cursor::{Cursor, DecodedCursor, MAX_REPLICA_ID_BYTES};
use mcp_resume_core::eventsource::{Dispatch, Parser};
use mcp_resume_core::ownership::{recorded_event, Reason, StreamKind};
use mcp_resume_core::sse::content_digest;
use mcp_resume_core::stream::{control_event, Flow, StreamState};

use crate::client;
use crate::keys::{keyring, ACTIVE};

/// The ownership service keeps every seq at most 2^53 - 1, so a continued cursor does too.
const MAX_SEQ: u64 = (1 << 53) - 1;

#[derive(Debug, Arbitrary)]
pub(crate) enum Id {
    /// The n-th recorded next event's id (`e<n>`).
    Expected(u8),
    /// The cursor's own replica id.
    Echo,
    Other(String),
    Reset,
}

#[derive(Debug, Arbitrary)]
pub(crate) enum Piece {
    Event {
        id: Id,
        data: u8,
        crlf: bool,
    },
    /// An event written as a hostile replica might: its id where a client ignores it, or
    /// applies it only after the event.
    Hostile {
        id: Id,
        data: u8,
        shape: Shape,
    },
    /// An event of [`LONG`] data bytes (more than this target's hold), its id first or last.
    Long {
        id: Id,
        id_first: bool,
    },
    NoId {
        data: u8,
    },
    Comment,
    Raw(Vec<u8>),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub(crate) enum Shape {
    IdAfterData,
    IdInNextBlock,
    NulId,
    /// `data:` with an empty value: dispatched, with empty data.
    EmptyData,
    /// Another id first, then the real one (the last counts).
    TwoIds,
}

/// Data bytes of a `Piece::Long`: more than `stream_state`'s largest hold.
const LONG: usize = 4097;

#[derive(Debug, Arbitrary)]
struct Continuation {
    seq: u64,
    replica: Option<u8>,
    expected: Vec<u8>,
    /// The data byte the records hold for `expected[i]` (a digest), or none (id only).
    recorded_data: Vec<Option<u8>>,
    suppress_echo: bool,
}

/// The content digest of an event [`render`] writes with `data`.
fn digest_of(data: u8) -> u64 {
    content_digest(&[format!("data: d{data}").as_bytes()])
}

#[derive(Debug, Arbitrary)]
struct Input {
    session: [u8; 8],
    incarnation: u64,
    request: bool,
    max_hold: u16,
    continuation: Option<Continuation>,
    pieces: Vec<Piece>,
    cuts: Vec<u16>,
}

pub(crate) fn ev(n: u8) -> String {
    format!("e{n}")
}

/// SSE bytes for `pieces`; `echo` is the replica id `Id::Echo` stands for.
pub(crate) fn render(pieces: &[Piece], echo: Option<&str>) -> Vec<u8> {
    let id_of = |id: &Id| match id {
        Id::Expected(n) => ev(*n),
        Id::Echo => echo.unwrap_or("e0").to_owned(),
        Id::Other(t) => t.clone(),
        Id::Reset => String::new(),
    };
    let mut s = Vec::new();
    for p in pieces {
        match p {
            Piece::Event { id, data, crlf } => {
                let id = id_of(id);
                let e = if *crlf { "\r\n" } else { "\n" };
                s.extend_from_slice(format!("id: {id}{e}data: d{data}{e}{e}").as_bytes());
            }
            Piece::Hostile { id, data, shape } => {
                let id = id_of(id);
                let ev = match shape {
                    Shape::IdAfterData => format!("data: d{data}\nid: {id}\n\n"),
                    Shape::IdInNextBlock => format!("data: d{data}\n\nid: {id}\n\n"),
                    Shape::NulId => format!("id: {id}\0\ndata: d{data}\n\n"),
                    Shape::EmptyData => format!("id: {id}\ndata:\n\n"),
                    Shape::TwoIds => format!("id: x{id}\ndata: d{data}\nid: {id}\n\n"),
                };
                s.extend_from_slice(ev.as_bytes());
            }
            Piece::Long { id, id_first } => {
                let (id, data) = (id_of(id), "x".repeat(LONG));
                let ev = match id_first {
                    true => format!("id: {id}\ndata: {data}\n\n"),
                    false => format!("data: {data}\nid: {id}\n\n"),
                };
                s.extend_from_slice(ev.as_bytes());
            }
            Piece::NoId { data } => s.extend_from_slice(format!("data: n{data}\n\n").as_bytes()),
            Piece::Comment => s.extend_from_slice(b": ping\n\n"),
            Piece::Raw(b) => s.extend_from_slice(b),
        }
    }
    s
}

pub fn stream_state(data: &[u8]) {
    let Ok(inp) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let kind = if inp.request {
        StreamKind::Request
    } else {
        StreamKind::Get
    };
    let max_hold = usize::from(inp.max_hold % 4096);
    let (mut s, first_seq, expected, echo) = match &inp.continuation {
        None => (
            StreamState::fresh(inp.session, inp.incarnation, kind, max_hold),
            1,
            Vec::new(),
            None,
        ),
        Some(c) => {
            let seq = c.seq % (MAX_SEQ + 1);
            let cursor = DecodedCursor {
                request_id: None,
                key_id: ACTIVE,
                session: inp.session,
                incarnation: inp.incarnation,
                kind,
                seq,
                replica_event_id: c.replica.map(ev),
            };
            let expected: Vec<(String, Option<u64>)> = c
                .expected
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let data = c.recorded_data.get(i).copied().flatten();
                    (ev(n), data.map(digest_of))
                })
                .collect();
            let records = expected
                .iter()
                .map(|(id, d)| d.map_or_else(|| id.clone(), |d| recorded_event(id, d)))
                .collect();
            let s = StreamState::continuation(&cursor, records, c.suppress_echo, max_hold);
            (s, seq + 1, expected, cursor.replica_event_id)
        }
    };
    assert_eq!(s.incarnation(), inp.incarnation);
    let body = render(&inp.pieces, echo.as_deref());
    let mut out = Vec::new();
    let mut relayed: Vec<(String, u64)> = Vec::new();
    let mut flow = Flow::Open;
    let take = |s: &mut StreamState, relayed: &mut Vec<(String, u64)>| {
        if let Some((first, ids)) = s.take_relayed() {
            assert_eq!(
                first,
                first_seq + relayed.len() as u64,
                "records' first seq"
            );
            relayed.extend(ids);
        }
    };
    for chunk in client::split(&body, &inp.cuts) {
        let before = out.len();
        let f = s.push(keyring(), chunk, &mut out);
        if flow == Flow::CutReplayMismatch {
            assert_eq!(f, Flow::CutReplayMismatch, "a cut stream reopened");
            assert_eq!(out.len(), before, "bytes left after the cut");
        }
        flow = f;
        take(&mut s, &mut relayed);
        assert!(
            s.held_bytes() <= 3 * max_hold + 2,
            "held {}",
            s.held_bytes()
        );
    }
    let before = out.len();
    let f = s.finish(&mut out);
    if flow == Flow::CutReplayMismatch {
        assert_eq!((f, out.len()), (Flow::CutReplayMismatch, before));
    }
    flow = f;
    take(&mut s, &mut relayed);
    assert_eq!(s.rewritten(), relayed.len() as u64);

    // Every id a client sees is one of our cursors, numbered from first_seq, naming what it replaced.
    let seen = client::parse(&out);
    let mut named = Vec::new();
    assert!(
        !seen.ids.iter().any(String::is_empty),
        "an empty id reached the client"
    );
    for (seq, id) in (first_seq..).zip(&seen.ids) {
        let c = keyring().decode(id);
        let Ok(c) = c else {
            unreachable!("id {id:?} a client sees is not a cursor: {c:?}");
        };
        assert_eq!(
            (c.key_id, c.session, c.incarnation, c.kind, c.seq),
            (ACTIVE, inp.session, inp.incarnation, kind, seq),
            "cursor fields"
        );
        named.push(c.replica_event_id);
    }
    assert_eq!(
        named.len(),
        relayed.len(),
        "cursors seen vs events recorded"
    );
    for (n, (r, _)) in named.iter().zip(&relayed) {
        if r.len() <= MAX_REPLICA_ID_BYTES {
            assert_eq!(n.as_deref(), Some(r.as_str()));
        }
    }
    // Contiguity: the recorded next events come first, in order.
    for ((id, digest), (want, want_digest)) in relayed.iter().zip(&expected) {
        assert_eq!(id, want, "a continuation relayed an unrecorded event");
        if let Some(d) = want_digest {
            assert_eq!(
                digest, d,
                "a continuation relayed other content under a recorded id"
            );
        }
    }
    // Without raw bytes or line ends in ids, every event is `data: d<k>`: each digest recorded
    // is one of those lines'.
    let plain = inp.pieces.iter().all(|p| match p {
        Piece::Raw(_) | Piece::Hostile { .. } | Piece::Long { .. } => false,
        Piece::Event {
            id: Id::Other(t), ..
        } => !t.contains(['\r', '\n']),
        _ => true,
    });
    if plain {
        let lines: Vec<u64> = inp
            .pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Event { data, .. } => Some(digest_of(*data)),
                _ => None,
            })
            .collect();
        for (_, d) in &relayed {
            assert!(lines.contains(d), "a recorded digest is no event's content");
        }
    }
    if flow == Flow::Open && !expected.is_empty() {
        assert!(
            !relayed.is_empty(),
            "an empty replay of recorded events stayed open"
        );
    }
    let start = match &inp.continuation {
        Some(_) => {
            let mut c = Vec::new();
            keyring().encode_to(
                &Cursor {
                    session: inp.session,
                    incarnation: inp.incarnation,
                    kind,
                    seq: first_seq - 1,
                    replica_event_id: echo.as_deref(),
                    request_id: None,
                },
                &mut c,
            );
            String::from_utf8_lossy(&c).into_owned()
        }
        None => String::new(),
    };
    judge(
        &out,
        &start,
        first_seq,
        &expected,
        !raw_pieces(&inp.pieces),
        |id| {
            keyring().decode(id).is_ok_and(|c| {
                (c.session, c.incarnation, c.kind) == (inp.session, inp.incarnation, kind)
            })
        },
    );
    let signal = control_event(Reason::ReplayMismatch);
    if !raw_pieces(&inp.pieces) && out.ends_with(signal.as_bytes()) {
        assert_eq!(
            flow,
            Flow::CutReplayMismatch,
            "control event on an open stream"
        );
    }
}

fn raw_pieces(pieces: &[Piece]) -> bool {
    pieces.iter().any(|p| matches!(p, Piece::Raw(_)))
}

/// What a client whose last event id was `start` (the cursor before `first_seq`) dispatches
/// from `out`, before a control event. While recorded events are expected, each event is
/// dispatched under the cursor of one of them, never under `start`, each recorded seq but the
/// last at most once and in order, and it names that recorded id (and, when `exact` and
/// recorded, has its content): an id-only recorded block dispatches nothing, so seqs may be
/// skipped. Every event carries a cursor of this stream (`ours`), or no id at all on a fresh
/// stream before its first; the client ends with such an id too.
fn judge(
    out: &[u8],
    start: &str,
    first_seq: u64,
    expected: &[(String, Option<u64>)],
    exact: bool,
    ours: impl Fn(&str) -> bool,
) {
    let mut client = Parser::new();
    let mut events: Vec<Dispatch> = Vec::new();
    let mut out = out;
    if !start.is_empty() {
        client.feed(format!("id: {start}\n\n").as_bytes(), &mut events);
        // The real stream's leading BOM is one a client strips.
        out = out.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(out);
    }
    client.feed(out, &mut events);
    let fine = |id: &str| (id.is_empty() && start.is_empty()) || ours(id);
    let last = first_seq - 1 + expected.len() as u64;
    let mut prev = first_seq - 1;
    for e in events.iter().take_while(|e| e.event != "mcp-resume") {
        assert!(
            fine(&e.last_event_id),
            "dispatched under {:?}",
            e.last_event_id
        );
        if expected.is_empty() {
            continue;
        }
        let Ok(c) = keyring().decode(&e.last_event_id) else {
            unreachable!("checked above");
        };
        assert!(c.seq >= first_seq, "dispatched before the replay: {e:?}");
        if c.seq > last || (c.seq == last && prev == last) {
            continue; // new events, after the replay
        }
        assert!(c.seq > prev, "twice under one replayed cursor: {e:?}");
        prev = c.seq;
        let Some((id, digest)) = expected.get((c.seq - first_seq) as usize) else {
            unreachable!("seq within the replay");
        };
        if id.len() <= MAX_REPLICA_ID_BYTES {
            assert_eq!(
                c.replica_event_id.as_ref(),
                Some(id),
                "not the recorded event: {e:?}"
            );
        }
        if let (Some(d), true) = (digest, exact) {
            let line = format!("data: {}", e.data);
            let got = content_digest(&[line.as_bytes()]);
            assert_eq!(got, *d, "other content than the recorded event: {e:?}");
        }
    }
    assert!(
        fine(client.last_event_id()),
        "a client ends with an id not minted"
    );
}
