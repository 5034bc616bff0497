//! `sse_rewriter`: the incremental SSE rewriter on arbitrary bytes, chunked anywhere.
//!
//! Invariants: the output, the questions asked (ids, events without one, overflows), the
//! stats and the cut state do not depend on how the input was chunked; the rewriter holds at most about twice `max_hold`; and
//! when every id is replaced by a function of itself (or kept), a client sees exactly the
//! input's events, with their ids mapped, in both the holding and the streaming mode.
use arbitrary::{Arbitrary, Unstructured};
use mcp_resume_core::sse::{IdAction, OnId, Rewriter, RewriterStats};

use crate::client::{self, Seen};

#[derive(Debug, Arbitrary)]
struct Input {
    /// Small, so blocks and ids overflow it.
    max_hold: u8,
    streaming: bool,
    /// Map ids by a function of themselves and check what a client sees.
    oracle: bool,
    cuts: Vec<u16>,
    /// One action per question, in order (cycled); ids are replaced by `R<n>` plus a suffix.
    script: Vec<u8>,
    stream: Vec<u8>,
}

pub fn sse_rewriter(data: &[u8]) {
    let Ok(inp) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    if inp.oracle {
        oracle(&inp);
    } else {
        scripted(&inp);
    }
}

struct Run {
    out: Vec<u8>,
    ids: Vec<String>,
    stats: RewriterStats,
    cut: bool,
    cut_mid_block: bool,
}

/// Asks `act` every question the rewriter asks, and logs it: an id, `\0none` for an event
/// without one, `\0overflow <id so far>` for a block too long to hold (refused on `Cut`).
struct Decider<'a> {
    act: &'a mut dyn FnMut(usize, &str) -> IdAction,
    ids: Vec<String>,
}

impl Decider<'_> {
    fn ask(&mut self, question: String) -> IdAction {
        let a = (self.act)(self.ids.len(), &question);
        self.ids.push(question);
        a
    }
}

impl OnId for Decider<'_> {
    fn on_id(&mut self, id: &str, _digest: u64) -> IdAction {
        self.ask(id.to_owned())
    }

    fn write_id(&mut self, _: &str, _: &mut Vec<u8>) {}

    fn on_event_without_id(&mut self) -> IdAction {
        self.ask("\0none".to_owned())
    }

    fn may_overflow(&mut self, id: Option<&str>) -> bool {
        self.ask(format!("\0overflow {id:?}")) != IdAction::Cut
    }
}

fn run(
    inp: &Input,
    max_hold: usize,
    chunks: &[&[u8]],
    act: &mut dyn FnMut(usize, &str) -> IdAction,
) -> Run {
    let mut rw = if inp.streaming {
        Rewriter::streaming(max_hold)
    } else {
        Rewriter::new(max_hold)
    };
    let mut out = Vec::new();
    let mut cb = Decider { act, ids: vec![] };
    for c in chunks {
        rw.push_with(c, &mut out, &mut cb);
        let held = rw.held_bytes();
        assert!(
            held <= 3 * max_hold + 2,
            "held {held} bytes with max_hold {max_hold}"
        );
    }
    rw.finish(&mut out);
    Run {
        out,
        ids: cb.ids,
        stats: rw.stats(),
        cut: rw.is_cut(),
        cut_mid_block: rw.cut_mid_block(),
    }
}

fn assert_same(a: &Run, b: &Run, how: &str) {
    assert_eq!(a.out, b.out, "output differs when chunked {how}");
    assert_eq!(a.ids, b.ids, "callbacks differ when chunked {how}");
    assert_eq!(a.stats, b.stats, "stats differ when chunked {how}");
    assert_eq!(
        (a.cut, a.cut_mid_block),
        (b.cut, b.cut_mid_block),
        "cut state differs when chunked {how}"
    );
}

fn scripted(inp: &Input) {
    let max_hold = usize::from(inp.max_hold);
    let mut act = |n: usize, _id: &str| {
        let op = match inp.script.len() {
            0 => 0,
            len => inp.script.get(n % len).copied().unwrap_or(0),
        };
        match op % 8 {
            0..=2 => IdAction::Replace(format!(
                "R{n}{}",
                ["", "\r", "\n", "\r\nx"][usize::from(op >> 6)]
            )),
            3 => IdAction::Omit,
            4 => IdAction::Keep,
            5 | 6 => IdAction::DropEvent,
            _ => IdAction::Cut,
        }
    };
    let whole = run(inp, max_hold, &[&inp.stream], &mut act);
    let parts = client::split(&inp.stream, &inp.cuts);
    assert_same(&whole, &run(inp, max_hold, &parts, &mut act), "at the cuts");
    // A refused overflow cuts before the block's first byte: the output ends between blocks.
    if whole.stats.overflow_cuts > 0 {
        assert!(
            whole.cut && !whole.cut_mid_block,
            "a refused overflow cut mid-block"
        );
    }
    if inp.stream.len() <= 512 {
        let bytes: Vec<&[u8]> = inp.stream.chunks(1).collect();
        assert_same(
            &whole,
            &run(inp, max_hold, &bytes, &mut act),
            "byte by byte",
        );
    }
    // Replacements never carry a line end: every id a client sees is a whole replacement or
    // an id the stream had.
    let seen = client::parse(&whole.out);
    let input = client::parse(&inp.stream);
    for id in &seen.ids {
        let replaced = id
            .strip_prefix('R')
            .map(|n| n.strip_suffix('x').unwrap_or(n))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        assert!(
            replaced || input.ids.contains(id),
            "id {id:?} came from nowhere"
        );
    }
}

fn mapped(id: &str) -> String {
    format!("M{}:{id}", id.len())
}

fn keeps(id: &str) -> bool {
    id.len().is_multiple_of(3)
}

fn oracle(inp: &Input) {
    // Nothing overflows or is oversized: the client view is fully determined.
    let max_hold = inp.stream.len() + 1;
    let mut act = |_: usize, id: &str| {
        if keeps(id) {
            IdAction::Keep
        } else {
            IdAction::Replace(mapped(id))
        }
    };
    let parts = client::split(&inp.stream, &inp.cuts);
    let r = run(inp, max_hold, &parts, &mut act);
    let f = |id: Option<String>| id.map(|i| if keeps(&i) { i } else { mapped(&i) });
    let mut want: Seen = client::parse(&inp.stream);
    for e in &mut want.events {
        e.last_id = f(e.last_id.take());
    }
    want.last_id = f(want.last_id.take());
    let got = client::parse(&r.out);
    // Several id lines in one block collapse into the one that counts.
    let (got_events, got_retries, got_last) = (got.events, got.retries, got.last_id);
    assert_eq!(got_events, want.events, "events a client sees");
    assert_eq!(got_retries, want.retries, "retry values a client sees");
    assert_eq!(got_last, want.last_id, "last event id a client ends with");
    assert_eq!(r.stats.overflowed_blocks, 0);
}
