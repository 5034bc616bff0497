//! One SSE response as the guard relays it: ids rewritten to cursors, replay checked.
use crate::cursor::{Cursor, DecodedCursor, Keyring};
use crate::ownership::{Reason, StreamKind};
use crate::sse::{IdAction, Rewriter};
use std::collections::VecDeque;

/// The control event that tells a client its cursor was not honoured. It has no `id:`,
/// so clients keep their own cursor logic; MCP clients ignore non-`message` events.
pub fn control_event(reason: Reason) -> String {
    format!(
        "event: mcp-resume\ndata: {{\"resumed\":false,\"reason\":\"{}\"}}\n\n",
        reason.as_str()
    )
}

/// Where a stream stands after a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Open,
    /// The replay diverged from the records: the stream was cut after a control event.
    CutReplayMismatch,
}

/// Per-response state: the SSE rewriter plus the id mapping.
pub struct StreamState {
    rewriter: Rewriter,
    ids: IdMap,
    cut: bool,
}

/// Maps each replica event id to a cursor and checks a continuation's replay.
struct IdMap {
    session: [u8; 8],
    incarnation: u64,
    kind: StreamKind,
    next_seq: u64,
    /// Recorded replica ids the owner must replay next, in order.
    expected: VecDeque<String>,
    /// The cursor's own event, which some servers (rmcp) send again first.
    echo: Option<String>,
    /// (seq, replica id) relayed since the last `take_relayed`; seqs are consecutive.
    relayed: Vec<String>,
    relayed_first: u64,
    rewritten: u64,
}

impl StreamState {
    /// A new incarnation: its first event gets seq 1.
    pub fn fresh(session: [u8; 8], incarnation: u64, kind: StreamKind, max_hold: usize) -> Self {
        StreamState {
            rewriter: Rewriter::new(max_hold),
            ids: IdMap {
                session,
                incarnation,
                kind,
                next_seq: 1,
                expected: VecDeque::new(),
                echo: None,
                relayed: Vec::new(),
                relayed_first: 1,
                rewritten: 0,
            },
            cut: false,
        }
    }

    /// A continuation of `cursor`'s incarnation; the owner must replay `expected` first.
    pub fn continuation(
        cursor: &DecodedCursor,
        expected: Vec<String>,
        suppress_echo: bool,
        max_hold: usize,
    ) -> Self {
        let mut s = StreamState::fresh(cursor.session, cursor.incarnation, cursor.kind, max_hold);
        let next = cursor.seq.saturating_add(1);
        s.ids.next_seq = next;
        s.ids.relayed_first = next;
        s.ids.expected = expected.into();
        if suppress_echo {
            s.ids.echo = cursor.replica_event_id.clone();
        }
        s
    }

    pub fn incarnation(&self) -> u64 {
        self.ids.incarnation
    }
    pub fn kind(&self) -> StreamKind {
        self.ids.kind
    }

    /// Rewrite one body chunk into `out`. On a replay mismatch the control event is
    /// appended and everything after is dropped.
    pub fn push(&mut self, keys: &Keyring, chunk: &[u8], out: &mut Vec<u8>) -> Flow {
        if !self.cut {
            let ids = &mut self.ids;
            self.rewriter
                .push(chunk, out, &mut |id| ids.on_id(keys, id));
        }
        self.after(out)
    }

    /// End of stream: flush a held, unterminated block (clients discard it; no id to map).
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Flow {
        if !self.cut {
            self.rewriter.finish(out);
        }
        self.after(out)
    }

    fn after(&mut self, out: &mut Vec<u8>) -> Flow {
        if self.cut {
            return Flow::CutReplayMismatch;
        }
        if self.rewriter.is_cut() {
            self.cut = true;
            out.extend_from_slice(control_event(Reason::ReplayMismatch).as_bytes());
            return Flow::CutReplayMismatch;
        }
        Flow::Open
    }

    /// Events relayed since the last call, for the records: (first seq, replica ids).
    pub fn take_relayed(&mut self) -> Option<(u64, Vec<String>)> {
        if self.ids.relayed.is_empty() {
            return None;
        }
        let first = self.ids.relayed_first;
        let ids = std::mem::take(&mut self.ids.relayed);
        self.ids.relayed_first = self.ids.next_seq;
        Some((first, ids))
    }

    /// Events rewritten so far.
    pub fn rewritten(&self) -> u64 {
        self.ids.rewritten
    }

    /// Bytes held by the SSE parser (bounded by `max_hold`).
    pub fn held_bytes(&self) -> usize {
        self.rewriter.held_bytes()
    }
}

impl IdMap {
    fn on_id(&mut self, keys: &Keyring, id: &str) -> IdAction {
        if id.is_empty() {
            // An empty id resets the client's cursor; nothing to bind.
            return IdAction::Keep;
        }
        if let Some(echo) = self.echo.take() {
            if echo == id && self.expected.front().map(String::as_str) != Some(id) {
                return IdAction::DropEvent;
            }
        }
        if let Some(want) = self.expected.pop_front() {
            if want != id {
                return IdAction::Cut;
            }
        }
        let seq = self.next_seq;
        self.next_seq = seq.saturating_add(1);
        let text = keys.encode(&Cursor {
            session: self.session,
            incarnation: self.incarnation,
            kind: self.kind,
            seq,
            replica_event_id: Some(id),
        });
        if self.relayed.is_empty() {
            self.relayed_first = seq;
        }
        self.relayed.push(id.to_string());
        self.rewritten += 1;
        IdAction::Replace(text)
    }
}
