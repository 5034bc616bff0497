//! One SSE response as the guard relays it: ids rewritten to cursors, replay checked.
use crate::cursor::{Cursor, DecodedCursor, Keyring};
use crate::ownership::{recorded_id, Reason, StreamKind};
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
    /// Replica ids relayed since the last `take_relayed`; their seqs end just before
    /// `next_seq`, so the first one is derived, not stored.
    relayed: Vec<String>,
    rewritten: u64,
}

impl StreamState {
    /// A new incarnation: its first event gets seq 1. Nothing is ever dropped or cut on a
    /// fresh stream, so its events stream through without being held.
    pub fn fresh(session: [u8; 8], incarnation: u64, kind: StreamKind, max_hold: usize) -> Self {
        Self::new(Rewriter::streaming(max_hold), session, incarnation, kind)
    }

    fn new(rewriter: Rewriter, session: [u8; 8], incarnation: u64, kind: StreamKind) -> Self {
        StreamState {
            rewriter,
            ids: IdMap {
                session,
                incarnation,
                kind,
                next_seq: 1,
                expected: VecDeque::new(),
                echo: None,
                relayed: Vec::new(),
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
        // Held: a replayed echo is dropped whole and a divergent replay is cut before it leaves.
        let mut s = StreamState::new(
            Rewriter::new(max_hold),
            cursor.session,
            cursor.incarnation,
            cursor.kind,
        );
        s.ids.next_seq = cursor.seq.saturating_add(1);
        s.ids.expected = expected.into();
        if suppress_echo {
            s.ids.echo = cursor.replica_event_id.clone();
        }
        s
    }

    pub fn incarnation(&self) -> u64 {
        self.ids.incarnation
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
    ///
    /// A continuation that ends before relaying a single event while the records hold events
    /// after the cursor did not replay the recorded next event either: it is cut like any other
    /// mismatch, so it is not a silent, empty "resumption". (rmcp answers a stream it no longer
    /// holds, e.g. a finished call's, with an empty 200.) A replay that stops after some of the
    /// recorded events is an ordinary early close and stays open for the next resume.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Flow {
        if !self.cut {
            self.rewriter.finish(out);
            let empty_replay = self.ids.rewritten == 0 && !self.ids.expected.is_empty();
            if empty_replay && !self.rewriter.is_cut() {
                return self.cut_with_signal(out);
            }
        }
        self.after(out)
    }

    fn after(&mut self, out: &mut Vec<u8>) -> Flow {
        if self.cut {
            return Flow::CutReplayMismatch;
        }
        if self.rewriter.is_cut() {
            // A cut inside an oversized block leaves it unterminated: anything appended would
            // join it. The caller ends the stream instead, and the client drops the partial block.
            if self.rewriter.cut_mid_block() {
                self.cut = true;
                return Flow::CutReplayMismatch;
            }
            return self.cut_with_signal(out);
        }
        Flow::Open
    }

    fn cut_with_signal(&mut self, out: &mut Vec<u8>) -> Flow {
        self.cut = true;
        out.extend_from_slice(control_event(Reason::ReplayMismatch).as_bytes());
        Flow::CutReplayMismatch
    }

    /// Events relayed since the last call, for the records: (first seq, replica ids).
    pub fn take_relayed(&mut self) -> Option<(u64, Vec<String>)> {
        if self.ids.relayed.is_empty() {
            return None;
        }
        let ids = std::mem::take(&mut self.ids.relayed);
        let first = self.ids.next_seq.saturating_sub(ids.len() as u64);
        Some((first, ids))
    }

    /// True when the output so far ends inside an event, so nothing may be appended to it.
    pub fn output_mid_block(&self) -> bool {
        self.rewriter.output_mid_block()
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
        // The records hold ids in recorded form (a digest for long ones).
        let recorded = || recorded_id(id);
        if let Some(echo) = self.echo.take() {
            if echo == id && self.expected.front().map(String::as_str) != Some(&*recorded()) {
                return IdAction::DropEvent;
            }
        }
        if let Some(want) = self.expected.pop_front() {
            if want != *recorded() {
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
        self.relayed.push(id.to_string());
        self.rewritten += 1;
        IdAction::Replace(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::Key;

    fn keys() -> Keyring {
        match Keyring::new(
            Key {
                id: 1,
                secret: vec![7; 32],
            },
            vec![],
        ) {
            Ok(k) => k,
            Err(e) => unreachable!("{e:?}"),
        }
    }

    fn run(s: &mut StreamState, k: &Keyring, input: &str) -> (String, Flow) {
        let mut out = Vec::new();
        let flow = s.push(k, input.as_bytes(), &mut out);
        (String::from_utf8_lossy(&out).into_owned(), flow)
    }

    fn ids_of(out: &str) -> Vec<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .map(str::to_string)
            .collect()
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn fresh_stream_numbers_ids_from_one_and_records_them() {
        let k = keys();
        let mut s = StreamState::fresh([1; 8], 42, StreamKind::Get, 4096);
        let (out, flow) = run(
            &mut s,
            &k,
            "id: e5\ndata: a\n\n: comment\n\nid: e9\ndata: b\n\ndata: no id\n\n",
        );
        assert_eq!(flow, Flow::Open);
        let ids = ids_of(&out);
        assert_eq!(ids.len(), 2);
        let c0 = k
            .decode(&ids[0])
            .map(|c| (c.seq, c.replica_event_id, c.incarnation));
        assert_eq!(c0, Ok((1, Some("e5".to_string()), 42)));
        assert_eq!(k.decode(&ids[1]).map(|c| c.seq), Ok(2));
        assert!(out.contains("data: no id\n\n"));
        assert_eq!(
            s.take_relayed(),
            Some((1, vec!["e5".to_string(), "e9".to_string()]))
        );
        assert_eq!(s.take_relayed(), None);
        assert_eq!(s.rewritten(), 2);
    }

    fn cursor_at(seq: u64, id: &str) -> DecodedCursor {
        DecodedCursor {
            key_id: 1,
            session: [1; 8],
            incarnation: 42,
            kind: StreamKind::Get,
            seq,
            replica_event_id: Some(id.to_string()),
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn continuation_checks_the_replay_and_continues_the_numbering() {
        let k = keys();
        let expected = vec!["e8".to_string(), "e9".to_string()];
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096);
        let (out, flow) = run(
            &mut s,
            &k,
            "id: e7\ndata: echo\n\nid: e8\ndata: 8\n\nid: e9\ndata: 9\n\nid: e10\ndata: new\n\n",
        );
        assert_eq!(flow, Flow::Open);
        assert!(
            !out.contains("echo"),
            "the cursor's own event is suppressed"
        );
        let seqs: Vec<u64> = ids_of(&out)
            .iter()
            .filter_map(|i| k.decode(i).ok())
            .map(|c| c.seq)
            .collect();
        assert_eq!(seqs, vec![8, 9, 10]);
        assert_eq!(s.take_relayed().map(|r| r.0), Some(8));
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn a_replay_with_a_gap_is_cut_with_the_control_event() {
        let k = keys();
        let expected = vec!["e8".to_string(), "e9".to_string()];
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096);
        let (out, flow) = run(
            &mut s,
            &k,
            "id: e8\ndata: 8\n\nid: e12\ndata: later\n\nid: e13\ndata: x\n\n",
        );
        assert_eq!(flow, Flow::CutReplayMismatch);
        assert!(!out.contains("later") && !out.contains("data: x"));
        assert!(out.ends_with(&control_event(Reason::ReplayMismatch)));
        let (more, flow) = run(&mut s, &k, "id: e14\ndata: y\n\n");
        assert_eq!((more.as_str(), flow), ("", Flow::CutReplayMismatch));
    }

    fn finish(s: &mut StreamState) -> (String, Flow) {
        let mut out = Vec::new();
        let flow = s.finish(&mut out);
        (String::from_utf8_lossy(&out).into_owned(), flow)
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn an_empty_replay_of_recorded_events_is_cut_at_the_end() {
        let k = keys();
        let expected = || vec!["e8".to_string(), "e9".to_string()];
        // Nothing at all (rmcp's empty 200 for a stream it no longer holds).
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected(), true, 4096);
        let (out, flow) = finish(&mut s);
        assert_eq!(flow, Flow::CutReplayMismatch);
        assert_eq!(out, control_event(Reason::ReplayMismatch));
        // Only the suppressed echo and a comment.
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected(), true, 4096);
        let (out, flow) = run(&mut s, &k, "id: e7\ndata: echo\n\n: ping\n\n");
        assert_eq!((flow, out.contains("echo")), (Flow::Open, false));
        assert_eq!(finish(&mut s).1, Flow::CutReplayMismatch);
        // Part of the recorded events, then the end: an early close, not a mismatch.
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected(), true, 4096);
        run(&mut s, &k, "id: e8\ndata: 8\n\n");
        assert_eq!(finish(&mut s), (String::new(), Flow::Open));
        // Nothing recorded after the cursor: an empty replay is all there is.
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), vec![], true, 4096);
        assert_eq!(finish(&mut s), (String::new(), Flow::Open));
        // A fresh stream may be empty.
        let mut s = StreamState::fresh([1; 8], 1, StreamKind::Request, 4096);
        assert_eq!(finish(&mut s), (String::new(), Flow::Open));
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn echo_is_kept_when_it_is_the_expected_next_event() {
        let k = keys();
        // Same replica id reused: only a mismatch with the records decides.
        let mut s =
            StreamState::continuation(&cursor_at(7, "x"), vec!["x".to_string()], true, 4096);
        let (out, flow) = run(&mut s, &k, "id: x\ndata: 8\n\n");
        assert_eq!(flow, Flow::Open);
        assert_eq!(ids_of(&out).len(), 1);
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn empty_id_resets_and_is_kept() {
        let k = keys();
        let mut s = StreamState::fresh([1; 8], 1, StreamKind::Request, 4096);
        let (out, _) = run(&mut s, &k, "id:\ndata: a\n\n");
        assert!(out.contains("data: a"));
        assert_eq!(s.rewritten(), 0);
    }
}
