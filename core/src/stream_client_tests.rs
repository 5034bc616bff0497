//! The guard judged by the client model ([`crate::eventsource`]): what a client's parser
//! dispatches from the guard's output on a continuation. Invariant: before a control event,
//! every dispatched event is exactly the next recorded event, with that event's cursor as the
//! client's last event id; once the recorded events are through, each later event carries a
//! cursor of this guard as the client's last event id; no event is dispatched twice (the
//! cursor's own included). And the output has nothing the SDK parsers read otherwise than the
//! model (docs/sse-model.md): no leading BOM-like mark, no CR last.
use super::tests::keys;
use super::*;
use crate::cursor::Cursor;
use crate::eventsource::{Dispatch, Parser};
use crate::ownership::recorded_event;
use crate::sse::{content_digest, DISCARDED_EVENT};

const SESSION: [u8; 8] = [1; 8];
const INCARNATION: u64 = 42;

/// The replica's recorded stream: event `i` has id `e<i>` and data `d<i>`.
fn rid(i: u64) -> String {
    format!("e{i}")
}

fn rdata(i: u64) -> String {
    format!("d{i}")
}

fn recorded(i: u64) -> String {
    let line = format!("data: {}", rdata(i));
    recorded_event(&rid(i), content_digest(&[line.as_bytes()]))
}

fn cursor_of(i: u64) -> DecodedCursor {
    DecodedCursor {
        request_id: None,
        key_id: 1,
        session: SESSION,
        incarnation: INCARNATION,
        kind: StreamKind::Get,
        seq: i,
        replica_event_id: Some(rid(i)),
    }
}

/// What a client whose cursor was event `k` ends with.
struct Run {
    out: Vec<u8>,
    events: Vec<Dispatch>,
    last_event_id: String,
    flow: Flow,
    reason: Option<Reason>,
}

/// A continuation from event `k` whose records hold events `k+1..=n`, fed `chunks` and
/// finished, read by a client whose last event id was `k`'s cursor.
fn resume(k: u64, n: u64, echo: bool, max_hold: usize, chunks: &[&[u8]]) -> Run {
    let keys = keys();
    let expected = (k + 1..=n).map(recorded).collect();
    let mut s = StreamState::continuation(&cursor_of(k), expected, echo, max_hold);
    let mut out = Vec::new();
    for c in chunks {
        s.push(&keys, c, &mut out);
    }
    let flow = s.finish(&mut out);
    let mut start = b"id: ".to_vec();
    let rid_k = rid(k);
    keys.encode_to(
        &Cursor {
            session: SESSION,
            incarnation: INCARNATION,
            kind: StreamKind::Get,
            seq: k,
            replica_event_id: Some(&rid_k),
            request_id: None,
        },
        &mut start,
    );
    start.extend_from_slice(b"\n\n");
    let mut client = Parser::new();
    let mut events = Vec::new();
    client.feed(&start, &mut events);
    client.feed(&out, &mut events);
    Run {
        out,
        events,
        last_event_id: client.last_event_id().to_owned(),
        flow,
        reason: s.cut_reason(),
    }
}

/// The invariant; returns how many recorded events the client got.
fn judge(k: u64, n: u64, run: &Run) -> Result<u64, String> {
    let keys = keys();
    let ours = |id: &str| match keys.decode(id) {
        Ok(c) if (c.session, c.incarnation) == (SESSION, INCARNATION) => Ok(c),
        other => Err(format!(
            "last event id {id:?} is no cursor of this stream: {other:?}"
        )),
    };
    // Where TypeScript or Python would read the output otherwise than the model.
    if run.out.first().is_some_and(|b| [0xEF, 0xC3].contains(b)) || run.out.ends_with(b"\r") {
        return Err(format!(
            "output a client reads ambiguously: {:?}",
            String::from_utf8_lossy(&run.out)
        ));
    }
    let mut next = k + 1;
    let mut dispatched = std::collections::HashSet::new();
    // The client's last event id before each event (k's cursor at first): an event that leaves
    // it as it was had no id of its own.
    let mut before: Option<&str> = None;
    for (i, e) in run.events.iter().enumerate() {
        if e.event == "mcp-resume" {
            break;
        }
        if e.event == DISCARDED_EVENT {
            // A block partly out, closed: no application takes it, and the signal follows.
            match run.events.get(i + 1) {
                Some(next) if next.event == "mcp-resume" => continue,
                next => {
                    return Err(format!(
                        "a closed block without a signal after it: {next:?}"
                    ))
                }
            }
        }
        let c = ours(&e.last_event_id)?;
        let own_id = before != Some(e.last_event_id.as_str()) && (before.is_some() || c.seq != k);
        before = Some(&e.last_event_id);
        // A reset cursor names no event: nothing to tell a repeat by.
        let reset = c.replica_event_id.as_deref() == Some("");
        let replica_id = c.replica_event_id.clone().unwrap_or_default();
        if own_id && !reset && (replica_id == rid(k) || !dispatched.insert(replica_id)) {
            return Err(format!("dispatched again: {e:?} at {c:?}"));
        }
        if next <= n {
            let want = (rdata(next), next, Some(rid(next)));
            if (&e.data, c.seq, &c.replica_event_id) != (&want.0, want.1, &want.2) {
                return Err(format!(
                    "expected recorded event {next}, dispatched {e:?} at {c:?}"
                ));
            }
            next += 1;
        } else if c.seq < n {
            return Err(format!("a new event {e:?} under an old cursor {c:?}"));
        }
    }
    ours(&run.last_event_id)?;
    Ok(next - k - 1)
}

/// Every split of `input` in two (and byte by byte): the invariant holds, and the outcome does
/// not depend on the split. Returns the outcome.
fn at_every_split(k: u64, n: u64, echo: bool, max_hold: usize, input: &[u8]) -> Run {
    let whole = resume(k, n, echo, max_hold, &[input]);
    let check = |run: &Run, how: &str| {
        if let Err(e) = judge(k, n, run) {
            panic!("{how}: {e}\n{:?}", String::from_utf8_lossy(input));
        }
        assert_eq!(run.events, whole.events, "{how}");
        assert_eq!((run.flow, run.reason), (whole.flow, whole.reason), "{how}");
    };
    check(&whole, "whole");
    for at in 0..=input.len() {
        let (a, b) = input.split_at(at);
        check(
            &resume(k, n, echo, max_hold, &[a, b]),
            &format!("split at {at}"),
        );
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    check(&resume(k, n, echo, max_hold, &bytes), "byte by byte");
    whole
}

fn signalled(run: &Run) -> bool {
    run.flow == Flow::CutReplayMismatch
        && run.reason == Some(Reason::ReplayMismatch)
        && run.events.last().is_some_and(|e| e.event == "mcp-resume")
}

#[test]
fn hole_1_a_reset_id_in_place_of_the_replay_is_cut_before_the_foreign_stream() {
    // The owner lost the cursor and starts another stream whose ids are bare resets.
    for reset in ["id:", "id", "id: "] {
        let foreign = format!("{reset}\ndata: foreign 1\n\n{reset}\ndata: foreign 2\n\n");
        let run = at_every_split(7, 9, true, 4096, foreign.as_bytes());
        assert!(signalled(&run), "{reset:?}");
        assert_eq!(
            run.events.len(),
            1,
            "only the control event: {:?}",
            run.events
        );
    }
    // A reset after part of the replay: the recorded events, then the signal.
    let input = "id: e8\ndata: d8\n\nid:\ndata: foreign\n\n";
    let run = at_every_split(7, 9, true, 4096, input.as_bytes());
    assert!(signalled(&run));
    assert_eq!(judge(7, 9, &run), Ok(1));
}

#[test]
fn hole_2_an_event_without_a_matchable_id_is_cut_before_it_is_dispatched() {
    for input in [
        // No id at all.
        "data: foreign\n\nid: e8\ndata: d8\n\n",
        // An id with NUL, which clients ignore.
        "id: e8\0\ndata: foreign\n\nid: e8\ndata: d8\n\n",
        // The id in a block of its own after the data.
        "data: foreign\n\nid: e8\n\n",
        "data: d8\n\nid: e8\n\n",
        // `data:` alone dispatches an event with empty data.
        "data:\n\nid: e8\ndata: d8\n\n",
        "data\n\nid: e8\ndata: d8\n\n",
    ] {
        let run = at_every_split(7, 9, true, 4096, input.as_bytes());
        assert!(signalled(&run), "{input:?}");
        assert_eq!(run.events.len(), 1, "{input:?}: {:?}", run.events);
    }
    // Blocks a client dispatches nothing from pass: comments, retry, event type alone, and an
    // id-less block whose line only starts like `data`.
    let input = ": c\n\nretry: 10\n\nevent: x\n\ndatum: 1\n\nid: e8\ndata: d8\n\n";
    let run = at_every_split(7, 8, true, 4096, input.as_bytes());
    assert_eq!((run.flow, judge(7, 8, &run)), (Flow::Open, Ok(1)));
}

#[test]
fn hole_3_an_echo_too_long_to_hold_is_cut_not_dispatched_twice() {
    let big = "x".repeat(3000);
    let echo_first = format!("id: e7\ndata: {big}\n\n");
    let echo_last = format!("data: {big}\nid: e7\n\n");
    for (n, echo) in [
        (7, &echo_first),
        (7, &echo_last),
        (8, &echo_first),
        (8, &echo_last),
    ] {
        let input = format!("{echo}id: e8\ndata: d8\n\n");
        let run = resume(7, n, true, 1024, &[input.as_bytes()]);
        assert!(signalled(&run), "{n} {echo:.20}");
        assert_eq!(run.events.len(), 1, "no echo: {:?}", run.events.first());
        let split: Vec<&[u8]> = input.as_bytes().chunks(100).collect();
        assert_eq!(resume(7, n, true, 1024, &split).events, run.events);
    }
    // An echo whose id comes late, behind another one, is closed as no message, then signalled.
    let input = format!("id: e9\ndata: {big}\nid: e7\n\nid: e8\ndata: d8\n\n");
    let run = at_every_split(7, 7, true, 1024, input.as_bytes());
    assert!(signalled(&run));
    let types: Vec<&str> = run.events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(types, [DISCARDED_EVENT, "mcp-resume"]);
    // Held echoes are dropped whole, as before; the replay continues.
    let run = at_every_split(
        7,
        8,
        true,
        4096,
        b"data: d7\nid: e7\n\nid: e8\ndata: d8\n\n",
    );
    assert_eq!((run.flow, judge(7, 8, &run)), (Flow::Open, Ok(1)));
}

#[test]
fn an_event_sent_again_at_once_is_dispatched_once() {
    // The replay, then its last event again (same id and data): the client gets it once, and
    // the stream goes on with new events.
    let again = b"id: e2\ndata: d2\n\nid: e3\ndata: d3\n\nid: e3\ndata: d3\n\nid: e4\ndata: d4\n\n";
    let run = at_every_split(1, 3, true, 1 << 16, again);
    let data: Vec<&str> = run.events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(data, ["d2", "d3", "d4"]);
    assert!(!signalled(&run));
    // The same id with other data is not the next event: cut before it.
    let reused = b"id: e2\ndata: d2\n\nid: e3\ndata: d3\n\nid: e3\ndata: other\n\n";
    let run = at_every_split(1, 3, true, 1 << 16, reused);
    assert!(signalled(&run));
    assert!(run.events.iter().all(|e| e.data != "other"));
}

#[test]
fn a_long_recorded_event_is_cut_but_a_long_new_one_streams() {
    let big = "x".repeat(3000);
    // Its content cannot be compared before it leaves.
    let input = format!("id: e8\ndata: {big}\n\n");
    let run = resume(7, 8, true, 1024, &[input.as_bytes()]);
    assert!(signalled(&run));
    // After the replay (and with no echo to look for) a long event streams through.
    let input = format!("id: e8\ndata: d8\n\nid: e9\ndata: {big}\n\n");
    let run = resume(7, 8, true, 1024, &[input.as_bytes()]);
    assert_eq!((run.flow, judge(7, 8, &run)), (Flow::Open, Ok(1)));
    assert_eq!(run.events.last().map(|e| e.data.len()), Some(3000));
    // Nothing recorded after the cursor: a long first event with its id first is not the echo.
    let input = format!("id: e8\ndata: {big}\n\n");
    let run = resume(7, 7, true, 1024, &[input.as_bytes()]);
    assert_eq!((run.flow, run.events.len()), (Flow::Open, 1));
}

#[test]
fn a_long_id_does_not_make_a_short_event_long() {
    // Ids are bounded on their own: only the content counts against the hold, so a recorded
    // event with an id near `max_hold` is still held, checked and continued.
    let long = "L".repeat(1020);
    let line = "data: d8";
    let expected = vec![recorded_event(&long, content_digest(&[line.as_bytes()]))];
    let cursor = cursor_of(7);
    let input = format!("id: {long}\n{line}\n\n");
    for chunk in [input.len(), 7] {
        let mut s = StreamState::continuation(&cursor, expected.clone(), true, 1024);
        let mut out = Vec::new();
        for c in input.as_bytes().chunks(chunk) {
            s.push(&keys(), c, &mut out);
        }
        assert_eq!((s.finish(&mut out), s.rewritten()), (Flow::Open, 1));
        assert!(s.held_bytes() == 0);
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod props {
    use super::*;
    use crate::sse::tests::props::split;
    use proptest::prelude::*;

    /// How a replica writes one event.
    #[derive(Debug, Clone, Copy)]
    enum Shape {
        Plain,
        Crlf,
        Cr,
        IdAfterData,
        IdInNextBlock,
        NoId,
        NulId,
        EmptyId,
        /// Another id first, then the real one (the last counts).
        TwoIds,
    }

    /// A piece of a replica's output.
    #[derive(Debug, Clone)]
    enum Piece {
        /// Recorded event `k + offset` (may be the echo, an older one or one past the records).
        Recorded(i64, Shape),
        /// A recorded id with other content.
        Foreign(i64, Shape),
        New(u8, Shape),
        /// An event longer than the hold, with the id of recorded `k + offset` or a new one.
        Long(Option<i64>, bool),
        Reset,
        Comment,
        Retry,
        /// A BOM-like mark ([`crate::sse`]): a client strips it at the head.
        Mark(bool),
        /// A block without its blank line (at the end: Python dispatches it if it ends in CR).
        Unterminated(bool),
    }

    fn shape() -> impl Strategy<Value = Shape> {
        prop_oneof![
            Just(Shape::Plain),
            Just(Shape::Crlf),
            Just(Shape::Cr),
            Just(Shape::IdAfterData),
            Just(Shape::IdInNextBlock),
            Just(Shape::NoId),
            Just(Shape::NulId),
            Just(Shape::EmptyId),
            Just(Shape::TwoIds),
        ]
    }

    fn honest_shape() -> impl Strategy<Value = Shape> {
        prop_oneof![
            Just(Shape::Plain),
            Just(Shape::Crlf),
            Just(Shape::Cr),
            Just(Shape::IdAfterData),
            Just(Shape::TwoIds),
        ]
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            4 => (-1i64..4, shape()).prop_map(|(o, s)| Piece::Recorded(o, s)),
            1 => (0i64..4, shape()).prop_map(|(o, s)| Piece::Foreign(o, s)),
            2 => (any::<u8>(), shape()).prop_map(|(j, s)| Piece::New(j, s)),
            1 => (prop::option::of(-1i64..4), any::<bool>()).prop_map(|(o, f)| Piece::Long(o, f)),
            1 => Just(Piece::Reset),
            1 => Just(Piece::Comment),
            1 => Just(Piece::Retry),
            1 => any::<bool>().prop_map(Piece::Mark),
            1 => any::<bool>().prop_map(Piece::Unterminated),
        ]
    }

    const HOLD: usize = 256;

    fn event(s: &mut String, id: &str, data: &str, shape: Shape) {
        let ev = match shape {
            Shape::Plain => format!("id: {id}\ndata: {data}\n\n"),
            Shape::Crlf => format!("id: {id}\r\ndata: {data}\r\n\r\n"),
            Shape::Cr => format!("id: {id}\rdata: {data}\r\r"),
            Shape::IdAfterData => format!("data: {data}\nid: {id}\n\n"),
            Shape::IdInNextBlock => format!("data: {data}\n\nid: {id}\n\n"),
            Shape::NoId => format!("data: {data}\n\n"),
            Shape::NulId => format!("id: {id}\0\ndata: {data}\n\n"),
            Shape::EmptyId => format!("id:\ndata: {data}\n\n"),
            Shape::TwoIds => format!("id: z{id}\ndata: {data}\nid: {id}\n\n"),
        };
        s.push_str(&ev);
    }

    fn render(k: u64, pieces: &[Piece]) -> String {
        let at = |o: i64| k.saturating_add_signed(o);
        let mut s = String::new();
        // New long events each get their own id.
        let mut longs = 0;
        for p in pieces {
            match p {
                Piece::Recorded(o, sh) => event(&mut s, &rid(at(*o)), &rdata(at(*o)), *sh),
                Piece::Foreign(o, sh) => event(&mut s, &rid(at(*o)), "foreign", *sh),
                Piece::New(j, sh) => event(&mut s, &format!("n{j}"), &format!("new {j}"), *sh),
                Piece::Long(o, id_first) => {
                    longs += 1;
                    let id = o.map_or_else(|| format!("long{longs}"), |o| rid(at(o)));
                    let data = "x".repeat(HOLD * 2);
                    let sh = if *id_first {
                        Shape::Plain
                    } else {
                        Shape::IdAfterData
                    };
                    event(&mut s, &id, &data, sh);
                }
                Piece::Reset => s.push_str("id:\n\n"),
                Piece::Comment => s.push_str(": ping\n\n"),
                Piece::Retry => s.push_str("retry: 100\n\n"),
                Piece::Mark(utf8) => s.push_str(if *utf8 { "\u{feff}" } else { "ï»¿" }),
                Piece::Unterminated(cr) => s.push_str(if *cr {
                    "data: partial\r"
                } else {
                    "event: message\ndata: partial"
                }),
            }
        }
        s
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn a_client_dispatches_only_the_next_recorded_event_before_a_signal(
            k in 1u64..5,
            more in 0u64..4,
            echo in any::<bool>(),
            pieces in prop::collection::vec(piece(), 0..8),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let n = k + more;
            let input = render(k, &pieces);
            let run = resume(k, n, echo, HOLD, &split(input.as_bytes(), &cuts));
            if let Err(e) = judge(k, n, &run) {
                return Err(TestCaseError::fail(format!("{e}\n{input:?}")));
            }
            let whole = resume(k, n, echo, HOLD, &[input.as_bytes()]);
            prop_assert_eq!(&run.events, &whole.events);
        }

        #[test]
        fn an_honest_replay_continues(
            k in 1u64..5,
            more in 0u64..4,
            echo in any::<bool>(),
            shapes in prop::collection::vec(honest_shape(), 4),
            echo_shape in honest_shape(),
            new in prop::collection::vec((any::<u8>(), honest_shape(), any::<bool>()), 0..4),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let n = k + more;
            let mut pieces = Vec::new();
            if echo {
                pieces.push(Piece::Recorded(0, echo_shape));
            }
            for (o, sh) in (1..=more as i64).zip(&shapes) {
                pieces.push(Piece::Recorded(o, *sh));
            }
            for (i, (_, sh, long)) in new.iter().enumerate() {
                // Ids are unique in a session: an honest replica never repeats one.
                let j = i as u8;
                pieces.push(if *long { Piece::Long(None, true) } else { Piece::New(j, *sh) });
                pieces.push(Piece::Comment);
            }
            let input = render(k, &pieces);
            let run = resume(k, n, echo, HOLD, &split(input.as_bytes(), &cuts));
            prop_assert_eq!(judge(k, n, &run), Ok(more));
            prop_assert_eq!(run.flow, Flow::Open);
            prop_assert_eq!(run.events.len(), more as usize + new.len());
        }
    }
}
