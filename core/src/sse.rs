//! Incremental SSE rewriter for the response body path.
//!
//! Parses `text/event-stream` bytes by the WHATWG rules
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html>) as they arrive, in chunks
//! split anywhere, and rewrites `id` fields. Everything else passes through byte for byte,
//! including line endings, comments, `retry:`, `event:` and `data:` lines.
//!
//! Rules, per block (the lines up to and including the blank line that dispatches it):
//! - Every `id` line is removed. When the block has an id (the last `id` line whose value has
//!   no NUL; an empty value is a reset and counts), `on_id` is called once at the blank line,
//!   with the id and the block's [content digest](content_digest), and its [`IdAction`] decides. A replacement `id: <s>` line is written as the block's **last line,
//!   right before the blank line**, ending in LF, or CRLF when the blank line starts with CR.
//!   Clients don't care about field order within a block.
//! - `id` lines containing NUL are removed without a callback: clients ignore them too.
//! - A block without such an id that a client dispatches (it has a `data` field, `data:` or a
//!   bare `data` included) gets [`OnId::on_event_without_id`], which may drop or cut it; other
//!   blocks without an id (comments, `retry`, `event` alone) are emitted unchanged.
//! - A block is held until its blank line so that [`IdAction::DropEvent`] and [`IdAction::Cut`]
//!   can suppress it whole. A block longer than `max_hold` bytes asks [`OnId::may_overflow`]:
//!   refused, the rewriter cuts before the block's first byte (counted in
//!   [`RewriterStats::overflow_cuts`]); allowed, it streams through ("overflowed", counted in
//!   [`RewriterStats::overflowed_blocks`]); its id is still replaced, and `DropEvent` or `Cut`
//!   stop output inside the block ([`Rewriter::cut_mid_block`]), so a client never dispatches it
//!   as a message: the stream ends there, or [`Rewriter::close_block`] closes the block as an
//!   event of our own type, after which a control event can follow.
//!   Whether and when a block overflows depends only on its bytes, never on how the stream was
//!   chunked (inside an `id` line the check waits for the line's end).
//! - An id value longer than `max_hold` is dropped without a callback (counted as oversized).
//! - Every leading byte-order mark look-alike some client strips ([`LeadStrip`]: any run of UTF-8
//!   BOMs and of their Latin-1 mojibake `ï»¿`) is consumed and not re-emitted, so every reader
//!   (WHATWG, the TypeScript and Python SDKs, the guard) reads the same first field, and a
//!   control event or the `retry:` hint can be put in front of the output. Should the output
//!   still start with a mark's first byte (an `id` line before it was removed), a blank line
//!   goes first.
//! - A `retry` field above the bound set by [`Rewriter::bound_retry`] (the client keeps the last
//!   one it parses) is followed by the bound: a `retry: <bound>` line is written before the
//!   block's blank line (or, in a block partly out when the stream ends, after its last line).
//!   The replica's line itself passes unchanged.
//! - An unterminated block at the end is never released: WHATWG and the TypeScript SDK discard
//!   it, Python dispatches one ending in CR, unchecked. The output ends with an LF (after a last
//!   CR, or ending the last line of a block partly out), so no reader holds or doubles its last
//!   line end.
//! - Where removing lines would join a lone CR with a following LF into one line end, the
//!   blank line is written as CR LF instead, keeping the event boundaries the client sees.
//!
//! Hot path: lines are found with a slice scan, and a block that starts and ends inside one
//! chunk is copied once, from the chunk straight to `out`. Only blocks spanning chunks are
//! copied into the internal hold buffer, which is reused. A block whose content is one run of
//! the chunk (LF line ends, its `id` lines first or last) is digested in one call at its end;
//! the streaming hasher only takes content that is not. Through [`OnId`] the new id is written
//! straight into `out`, so relaying an event allocates nothing.

use std::borrow::Cow;
use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

/// The content digest of an event: XXH3-64 of its lines other than `id` lines, each without its
/// line end and followed by one LF. So a replay with the same id is told apart from a different
/// event that reuses it, whatever line ends either used.
pub fn content_digest(lines: &[&[u8]]) -> u64 {
    let mut h = Xxh3Default::new();
    for l in lines {
        h.update(l);
        h.update(b"\n");
    }
    h.digest()
}

/// The [`content_digest`] of the block being read. While the block's content so far is one run
/// of the current chunk, only that range is kept, and hashed in one call at the block's end
/// (one-shot XXH3 costs half the streaming one on short events); content that is not (other line
/// ends, lines on both sides of an `id` line, a block across chunks) goes through the hasher.
struct ContentDigest {
    hasher: Xxh3Default,
    /// Content not hashed yet: `chunk[a..b]` of the current chunk.
    span: Option<(usize, usize)>,
    /// The hasher holds content of this block.
    hashing: bool,
}

impl std::fmt::Debug for ContentDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentDigest")
            .field("span", &self.span)
            .field("hashing", &self.hashing)
            .finish()
    }
}

impl ContentDigest {
    fn new() -> Self {
        ContentDigest {
            hasher: Xxh3Default::new(),
            span: None,
            hashing: false,
        }
    }

    /// Content `chunk[a..b]`.
    fn range(&mut self, chunk: &[u8], a: usize, b: usize) {
        match self.span {
            Some((x, y)) if y == a => self.span = Some((x, b)),
            _ => {
                self.spill(chunk);
                self.span = Some((a, b));
            }
        }
    }

    /// Content from elsewhere than `chunk`.
    fn bytes(&mut self, chunk: &[u8], bytes: &[u8]) {
        self.spill(chunk);
        self.hasher.update(bytes);
        self.hashing = true;
    }

    /// Hashes the kept range: before bytes from elsewhere, and before `chunk` goes away.
    fn spill(&mut self, chunk: &[u8]) {
        if let Some((a, b)) = self.span.take() {
            self.hasher.update(chunk.get(a..b).unwrap_or_default());
            self.hashing = true;
        }
    }

    fn digest(&mut self, chunk: &[u8]) -> u64 {
        if self.hashing {
            self.spill(chunk);
            return self.hasher.digest();
        }
        let run = self.span.and_then(|(a, b)| chunk.get(a..b));
        xxh3_64(run.unwrap_or_default())
    }

    fn reset(&mut self) {
        self.span = None;
        if self.hashing {
            self.hasher.reset();
            self.hashing = false;
        }
    }
}

/// Decides what becomes of each block's id, at the block's blank line ([`Rewriter::push_with`]).
pub trait OnId {
    /// Called once per block that has a (non-NUL) id, with that id (may be "" for a reset) and
    /// the block's [`content_digest`].
    fn on_id(&mut self, id: &str, digest: u64) -> IdAction;

    /// A block whose id is a bare reset and that has no `data` field: a client dispatches
    /// nothing, the reset only clears its last id. By default an [`OnId::on_id`] with "".
    fn on_dataless_reset(&mut self, digest: u64) -> IdAction {
        self.on_id("", digest)
    }

    /// After [`IdAction::Write`] for `id`: appends the block's new id to `out`, without
    /// `id: ` and line end. CR and LF in it are dropped; if it appends nothing, the id is kept.
    fn write_id(&mut self, id: &str, out: &mut Vec<u8>);

    /// Called once per block a client dispatches (it has a `data` field) that has no id the
    /// client would take (none, only NUL ones, or one too long to hold). Only
    /// [`IdAction::DropEvent`] and [`IdAction::Cut`] act; anything else relays the block as it is.
    fn on_event_without_id(&mut self) -> IdAction {
        IdAction::Keep
    }

    /// The block being held grew past `max_hold`: may it stream through, decided at its end
    /// (then a `Cut` or `DropEvent` leaves it unterminated)? `id`: its id so far, if any. On
    /// false the rewriter cuts before the block's first byte.
    fn may_overflow(&mut self, id: Option<&str>) -> bool {
        let _ = id;
        true
    }
}

/// A closure decides; it answers with [`IdAction::Replace`] (it has nothing to write).
impl<F: FnMut(&str, u64) -> IdAction> OnId for F {
    fn on_id(&mut self, id: &str, digest: u64) -> IdAction {
        self(id, digest)
    }

    fn write_id(&mut self, _: &str, _: &mut Vec<u8>) {}
}

/// What to do with a block's id, decided by the caller at the block's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdAction {
    /// Write `id: <s>` instead. `s` must be a valid id; CR and LF in it are dropped.
    Replace(String),
    /// Write `id: ` and what [`OnId::write_id`] appends, straight into the output.
    Write,
    /// Keep the block's id as it was.
    Keep,
    /// Emit the block without any `id` line: the client keeps the id it had.
    Omit,
    /// Suppress the whole block; on an overflowed block, partly sent, this is a [`IdAction::Cut`].
    DropEvent,
    /// Drop this block and everything after it; the rewriter becomes inert.
    Cut,
}

/// Counters for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RewriterStats {
    /// Blocks with an id, i.e. calls to `on_id`.
    pub ids: u64,
    /// Blocks suppressed by `DropEvent` (fully or, when overflowed, partly).
    pub dropped_blocks: u64,
    /// Blocks longer than `max_hold`, streamed instead of held.
    pub overflowed_blocks: u64,
    /// Blocks longer than `max_hold` that [`OnId::may_overflow`] refused: cut before any byte.
    pub overflow_cuts: u64,
    /// `id` lines ignored because they contain NUL.
    pub nul_ids: u64,
    /// `id` lines dropped because their value is longer than `max_hold`.
    pub oversized_ids: u64,
    /// Blocks written with a new id that also have a `data` field: the ids every client keeps
    /// (the TypeScript SDK's parser drops the id of a block without one).
    pub ids_kept: u64,
}

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// What readers strip at a stream's head: the UTF-8 BOM (WHATWG, `TextDecoderStream`) and the
/// BOM as Latin-1 re-encoded as UTF-8, `ï»¿` (eventsource-parser, in the TypeScript SDK's first
/// text chunk). Python strips neither. Their first bytes differ.
const LEAD_MARKS: [&[u8]; 2] = [&BOM, b"\xC3\xAF\xC2\xBB\xC2\xBF"];

/// Removes a stream's leading run of [`LEAD_MARKS`], in chunks split anywhere. What follows the
/// run starts with no mark, so no reader strips anything and all read the same first line.
#[derive(Debug, Clone, Default)]
pub struct LeadStrip {
    /// The mark being matched and how many of its bytes matched (in earlier chunks).
    partial: Option<(usize, usize)>,
    done: bool,
}

impl LeadStrip {
    /// Returns the bytes to pass on for `chunk`: first a partly matched mark that turned out to
    /// be content (from earlier chunks), then the rest of `chunk`.
    pub fn strip<'a>(&mut self, chunk: &'a [u8]) -> (&'static [u8], &'a [u8]) {
        let mut i = 0;
        while !self.done {
            let Some(&b) = chunk.get(i) else {
                return (&[], &[]);
            };
            match self.partial {
                None => match LEAD_MARKS.iter().position(|m| m.first() == Some(&b)) {
                    Some(k) => self.partial = Some((k, 1)),
                    None => self.done = true,
                },
                Some((k, n)) => {
                    let mark = LEAD_MARKS.get(k).copied().unwrap_or_default();
                    if mark.get(n) != Some(&b) {
                        self.done = true;
                        self.partial = None;
                        return (
                            mark.get(..n).unwrap_or_default(),
                            chunk.get(i..).unwrap_or_default(),
                        );
                    }
                    self.partial = (n + 1 < mark.len()).then_some((k, n + 1));
                }
            }
            if !self.done {
                i += 1;
            }
        }
        (&[], chunk.get(i..).unwrap_or_default())
    }

    /// End of stream: a partly matched mark is content.
    pub fn finish(&mut self) -> &'static [u8] {
        self.done = true;
        match self.partial.take() {
            Some((k, n)) => LEAD_MARKS
                .get(k)
                .and_then(|m| m.get(..n))
                .unwrap_or_default(),
            None => &[],
        }
    }
}

/// Where we are within the current line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    Start,
    /// "i" (1) or "id" (2) seen at a chunk end: may still become an `id` line.
    Prefix(u8),
    /// Inside an `id` line's value.
    Id {
        at_value_start: bool,
    },
    /// Inside any other line.
    Other,
}

/// Where a LF belongs that follows a CR which ended the previous chunk (one CRLF line end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lf {
    Content,
    IdLine,
    Out,
    Drop,
}

/// How far the current line reads as a `retry` field (`retry:`, one optional space, digits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryField {
    /// A `retry` field whose value is not plain digits: WHATWG clients ignore it, but Python's
    /// SDK reads it with `int()` (signs, inner underscores, surrounding whitespace, Unicode
    /// digits), so it may set any time: the bound follows it.
    Odd,
    No,
    /// The first `n` bytes of `retry:` matched.
    Name(u8),
    /// Right after the colon, then after the one space that may follow it.
    Colon,
    Space,
    /// Digits so far: their value (saturating).
    Value(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockId {
    None,
    Value,
    Oversized,
}

#[derive(Debug)]
pub struct Rewriter {
    max_hold: usize,
    /// Hold each block until its blank line (needed for `DropEvent` and `Cut`); when false,
    /// every block streams through as an overflowed one would, without being counted as such.
    hold_blocks: bool,
    /// The stream's leading BOM-like marks.
    lead: LeadStrip,
    line: Line,
    skip_lf: Option<Lf>,
    in_block: bool,
    /// The current block exceeded `max_hold` and is streamed.
    streaming: bool,
    /// Content bytes of the current block: `id` lines are left out (each value is bounded on
    /// its own), so a long id never makes a short event too long to hold.
    block_bytes: usize,
    /// Content of the current block carried over from earlier chunks.
    hold: Vec<u8>,
    /// Content ranges of the current block in the current chunk, not yet copied.
    runs: Vec<(usize, usize)>,
    line_id: Vec<u8>,
    line_id_nul: bool,
    line_id_over: bool,
    block_id: Vec<u8>,
    block_id_state: BlockId,
    /// The block has a `data` field: a client dispatches it.
    has_data: bool,
    /// `Some(n)`: the current line's first `n` bytes (all in earlier chunks) are `data`'s.
    data_name: Option<u8>,
    /// The largest `retry` (ms) a client may get; `None`: any passes.
    max_retry: Option<u64>,
    /// The current line as a `retry` field (read only with a bound, on lines starting `r`).
    retry_field: RetryField,
    /// The current block has a `retry` field above the bound.
    retry_over: bool,
    /// [`content_digest`] of the current block so far.
    content: ContentDigest,
    /// The last byte this rewriter wrote (None before any).
    last_out: Option<u8>,
    cut: bool,
    cut_mid_block: bool,
    /// The stream ended inside a block some bytes of which were already out.
    ended_mid_block: bool,
    /// [`Rewriter::close_block`] ended the output: all further input is ignored.
    closed: bool,
    stats: RewriterStats,
}

/// The event type of the event that closes a block partly sent ([`Rewriter::close_block`]). The SDK
/// clients (TypeScript, Python, rmcp) and `onmessage` take only `message` (or untyped) events as
/// messages: this one is skipped, or ignored as a control event.
pub const DISCARDED_EVENT: &str = "mcp-resume-discarded";

/// Ends a last line left without its line end. The `x` keeps the line from becoming a field it
/// was not: no field name holds an `x` (`ret` + `x` is no `retry`), and a value ending in it is
/// no number, so a `retry: 1` cut short of `retry: 10000` sets no reconnection time in any client
/// (WHATWG and eventsource-parser take only digits; Python's `int()` refuses the `x`).
const PARTIAL_LINE_END: &[u8] = b"x\n";

impl Rewriter {
    /// `max_hold`: the most bytes of one block held while waiting for its end.
    pub fn new(max_hold: usize) -> Rewriter {
        Rewriter {
            max_hold,
            hold_blocks: true,
            lead: LeadStrip::default(),
            line: Line::Start,
            skip_lf: None,
            in_block: false,
            streaming: false,
            block_bytes: 0,
            hold: Vec::new(),
            runs: Vec::new(),
            line_id: Vec::new(),
            line_id_nul: false,
            line_id_over: false,
            block_id: Vec::new(),
            block_id_state: BlockId::None,
            has_data: false,
            data_name: None,
            max_retry: None,
            retry_field: RetryField::No,
            retry_over: false,
            content: ContentDigest::new(),
            last_out: None,
            cut: false,
            cut_mid_block: false,
            ended_mid_block: false,
            closed: false,
            stats: RewriterStats::default(),
        }
    }

    /// A rewriter that never holds a block: its bytes go out as they arrive, only `id` lines
    /// are removed and the replacement written before the blank line. For callers that only
    /// ever answer `Replace` or `Keep` (a fresh stream): the output is the same as [`Rewriter::new`]'s,
    /// with one copy less and no held bytes. `DropEvent` and `Cut` act as on an overflowed block.
    /// `max_hold` still bounds an id value.
    pub fn streaming(max_hold: usize) -> Rewriter {
        Rewriter {
            hold_blocks: false,
            streaming: true,
            ..Rewriter::new(max_hold)
        }
    }

    /// Lowers every `retry` field a client reads to at most `max_ms` (see the module doc).
    pub fn bound_retry(&mut self, max_ms: Option<u64>) {
        self.max_retry = max_ms;
    }

    /// Feeds one chunk; rewritten bytes are appended to `out`. `on_id` is called once per block
    /// that has a (non-NUL) id, with that id (may be "" for a reset) and the block's
    /// [`content_digest`], at the block's blank line.
    pub fn push(
        &mut self,
        chunk: &[u8],
        out: &mut Vec<u8>,
        mut on_id: &mut dyn FnMut(&str, u64) -> IdAction,
    ) {
        self.push_with(chunk, out, &mut on_id);
    }

    /// [`Rewriter::push`] with an [`OnId`], which may write the new ids into `out` itself.
    pub fn push_with<O: OnId + ?Sized>(&mut self, chunk: &[u8], out: &mut Vec<u8>, on_id: &mut O) {
        if self.cut || self.closed {
            return;
        }
        let (earlier, chunk) = self.lead.strip(chunk);
        self.feed(earlier, out, on_id);
        self.feed(chunk, out, on_id);
    }

    /// End of stream. An unterminated block is not released: clients that follow WHATWG
    /// discard it, and Python's final-CR flush would dispatch it unchecked; so whatever the
    /// caller appends starts on a line of its own. If part of it is already out (streamed),
    /// [`Rewriter::output_mid_block`] stays true. A CR last gets an LF: TypeScript holds a final
    /// CR waiting for one, Python adds a blank line after it. No callback can happen here.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.cut || self.closed {
            return;
        }
        self.lead.finish();
        self.ended_mid_block = self.output_mid_block();
        if self.ended_mid_block {
            self.end_partial_line(out);
        } else if self.last_out == Some(b'\r') {
            // Pairs with the last CR; after an LF it would be a blank line.
            emit(&mut self.last_out, out, b"\n");
        }
        // The LF just written ends a last `retry` line too: clients read it.
        self.end_retry_line();
        if self.ended_mid_block {
            self.write_retry_bound(b"\n", out);
        }
        self.reset_block();
        self.line = Line::Start;
        self.skip_lf = None;
    }

    /// Ends the last line of a block partly out (it stays undispatched) when it has no line
    /// end yet; a last CR gets its LF. Never a blank line: that would dispatch the block.
    fn end_partial_line(&mut self, out: &mut Vec<u8>) {
        match self.last_out {
            Some(b'\r') => emit(&mut self.last_out, out, b"\n"),
            Some(b'\n') | None => {}
            Some(_) => emit(&mut self.last_out, out, PARTIAL_LINE_END),
        }
    }

    /// Closes a block partly out (streamed, then cut or ended) so that no client dispatches it
    /// as a message: its last line is ended as [`PARTIAL_LINE_END`] says, then the block gets
    /// the type [`DISCARDED_EVENT`] and its blank line. The output is then at a block boundary,
    /// where a control event can follow; further input is ignored. Writes nothing (false) when
    /// the output is at a block boundary already. The streamed output never holds the replica's
    /// `id` lines (they are removed, and the replacement written at the blank line), so the
    /// closed block changes no client's last event id.
    pub fn close_block(&mut self, out: &mut Vec<u8>) -> bool {
        if !(self.output_mid_block() || self.cut_mid_block) || self.closed {
            return false;
        }
        self.end_partial_line(out);
        emit(&mut self.last_out, out, b"event: ");
        emit(&mut self.last_out, out, DISCARDED_EVENT.as_bytes());
        emit(&mut self.last_out, out, b"\n\n");
        self.closed = true;
        self.ended_mid_block = false;
        self.cut_mid_block = false;
        self.reset_block();
        self.line = Line::Start;
        self.skip_lf = None;
        true
    }

    /// True after a `Cut`: all further input is ignored.
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// True when a `Cut` hit an overflowed block, so the output ends inside an unterminated
    /// block: anything appended after it would join that block. End the stream, or
    /// [`Rewriter::close_block`] first.
    pub fn cut_mid_block(&self) -> bool {
        self.cut_mid_block
    }

    /// True when the output so far ends inside a block (one being streamed, not held): anything
    /// appended now would join it, unless [`Rewriter::close_block`] closes it first.
    pub fn output_mid_block(&self) -> bool {
        (self.in_block && self.streaming) || self.ended_mid_block
    }

    /// Bytes currently buffered (held block content and id values); at most about 3 × `max_hold`:
    /// the content, the block's id and an id line being read are each bounded by it.
    pub fn held_bytes(&self) -> usize {
        self.hold.len() + self.line_id.len() + self.block_id.len()
    }

    pub fn stats(&self) -> RewriterStats {
        self.stats
    }

    fn feed<O: OnId + ?Sized>(&mut self, chunk: &[u8], out: &mut Vec<u8>, on_id: &mut O) {
        if chunk.is_empty() {
            // Keep a pending CR's state for the next non-empty chunk.
            return;
        }
        let mut i = 0;
        if let Some(lf) = self.skip_lf.take() {
            if chunk.first() == Some(&b'\n') {
                i = 1;
                match lf {
                    Lf::Content => self.add_run(0, 1),
                    Lf::IdLine => {}
                    Lf::Out => emit(&mut self.last_out, out, b"\n"),
                    Lf::Drop => {}
                }
                // As if the whole line end had come at once.
                self.check_overflow(chunk, out, on_id);
            }
        }
        while i < chunk.len() && !self.cut {
            let rest = chunk.get(i..).unwrap_or_default();
            i += match self.line {
                Line::Start => self.at_line_start(chunk, i, out, on_id),
                Line::Prefix(n) => self.in_prefix(chunk, rest, n, out),
                Line::Id { at_value_start } => self.in_id(chunk, i, at_value_start, out, on_id),
                Line::Other => self.in_other(chunk, i, out, on_id),
            };
        }
        if !self.cut {
            self.park(chunk, out, on_id);
        }
        self.content.spill(chunk);
        self.runs.clear();
    }

    /// Returns the bytes consumed; 0 when only the state changed.
    fn at_line_start<O: OnId + ?Sized>(
        &mut self,
        chunk: &[u8],
        i: usize,
        out: &mut Vec<u8>,
        on_id: &mut O,
    ) -> usize {
        let rest = chunk.get(i..).unwrap_or_default();
        if let Some(b'\r' | b'\n') = rest.first() {
            let (n, split) = eol_at(rest, 0);
            let term = rest.get(..n).unwrap_or_default();
            let lf = self.end_block(chunk, term, out, on_id);
            if split {
                self.skip_lf = Some(lf);
            }
            return n;
        }
        self.in_block = true;
        // Only the line's first bytes decide; the line end is found once, by the state that
        // takes the line (a data line is scanned once, not twice).
        if rest.starts_with(b"id:") {
            self.begin_id_line();
            return 3;
        }
        if let Some(b"id\r" | b"id\n") = rest.get(..3) {
            // A field name without colon has an empty value: an id reset.
            self.begin_id_line();
            return 2;
        }
        if rest == b"i" || rest == b"id" {
            self.line = Line::Prefix(rest.len() as u8);
            return rest.len();
        }
        self.line = Line::Other;
        if self.max_retry.is_some() && rest.first() == Some(&b'r') {
            self.retry_field = RetryField::Name(0);
        }
        // Whether the line is a `data` field, at once when its first 5 bytes are here.
        self.data_name = match rest.get(..5) {
            Some(head) => {
                let data = matches!(head, [b'd', b'a', b't', b'a', b':' | b'\r' | b'\n']);
                self.has_data |= data;
                None
            }
            None => Some(0),
        };
        0
    }

    /// Continues a line that began as "i" or "id" at the end of the previous chunk.
    fn in_prefix(&mut self, chunk: &[u8], rest: &[u8], n: u8, out: &mut Vec<u8>) -> usize {
        let next = rest.first().copied();
        match (n, next) {
            (1, Some(b'd')) => {
                self.line = Line::Prefix(2);
                1
            }
            (2, Some(b':')) => {
                self.begin_id_line();
                1
            }
            (2, Some(b'\r' | b'\n')) => {
                self.begin_id_line();
                0
            }
            _ => {
                let carried = b"id".get(..usize::from(n)).unwrap_or_default();
                self.content.bytes(chunk, carried);
                self.add_carry(carried, out);
                self.line = Line::Other;
                self.data_name = None;
                0
            }
        }
    }

    fn in_id<O: OnId + ?Sized>(
        &mut self,
        chunk: &[u8],
        i: usize,
        at_value_start: bool,
        out: &mut Vec<u8>,
        on_id: &mut O,
    ) -> usize {
        let rest = chunk.get(i..).unwrap_or_default();
        // One space after the colon is not part of the value.
        let start = usize::from(at_value_start && rest.first() == Some(&b' '));
        let from_start = rest.get(start..).unwrap_or_default();
        let (eol, nul) = find_eol_or_nul(from_start);
        let eol = eol.map(|p| p + start);
        let end = eol.unwrap_or(rest.len());
        self.collect_id(rest.get(start..end).unwrap_or_default(), nul);
        let Some(e) = eol else {
            self.line = Line::Id {
                at_value_start: false,
            };
            return end;
        };
        let (n, split) = eol_at(rest, e);
        self.finish_id_line();
        self.line = Line::Start;
        if split {
            self.skip_lf = Some(Lf::IdLine);
        }
        self.check_overflow(chunk, out, on_id);
        e + n
    }

    fn in_other<O: OnId + ?Sized>(
        &mut self,
        chunk: &[u8],
        i: usize,
        out: &mut Vec<u8>,
        on_id: &mut O,
    ) -> usize {
        let rest = chunk.get(i..).unwrap_or_default();
        if let Some(n) = self.data_name {
            self.match_data_name(n, rest);
        }
        let eol = find_eol(rest);
        if self.retry_field != RetryField::No {
            self.read_retry(rest.get(..eol.unwrap_or(rest.len())).unwrap_or_default());
        }
        let Some(e) = eol else {
            self.content.range(chunk, i, chunk.len());
            self.add_run(i, chunk.len());
            return rest.len();
        };
        self.end_retry_line();
        if rest.get(e) == Some(&b'\n') {
            // The line and its LF are the digest's bytes as they are.
            self.content.range(chunk, i, i + e + 1);
        } else {
            self.content.range(chunk, i, i + e);
            self.content.bytes(chunk, b"\n");
        }
        let (n, split) = eol_at(rest, e);
        self.add_run(i, i + e + n);
        self.line = Line::Start;
        if split {
            self.skip_lf = Some(Lf::Content);
        }
        self.check_overflow(chunk, out, on_id);
        e + n
    }

    /// Reads on in a line whose first `n` bytes are `data`'s: a `data` field (name then colon
    /// or line end) makes the block one a client dispatches. Looks at most 5 bytes per line.
    fn match_data_name(&mut self, mut n: u8, rest: &[u8]) {
        self.data_name = None;
        for &b in rest {
            match b"data".get(usize::from(n)) {
                Some(&want) if b == want => n += 1,
                Some(_) => return,
                None => {
                    self.has_data |= matches!(b, b':' | b'\r' | b'\n');
                    return;
                }
            }
        }
        // The chunk ended inside the name: the next one decides.
        self.data_name = Some(n);
    }

    /// Reads on in a line that may be a `retry` field (WHATWG: the value after one optional
    /// space, only ASCII digits, at least one; anything else after `retry:` is [`RetryField::Odd`]).
    fn read_retry(&mut self, bytes: &[u8]) {
        for &b in bytes {
            let digit = b.is_ascii_digit().then(|| u64::from(b - b'0'));
            self.retry_field = match (self.retry_field, digit) {
                (RetryField::No, _) => return,
                (RetryField::Name(n), _) => match b"retry:".get(usize::from(n)) {
                    Some(&want) if b == want && n == 5 => RetryField::Colon,
                    Some(&want) if b == want => RetryField::Name(n + 1),
                    _ => RetryField::No,
                },
                (RetryField::Colon, None) if b == b' ' => RetryField::Space,
                (RetryField::Colon | RetryField::Space, Some(d)) => RetryField::Value(d),
                (RetryField::Value(ms), Some(d)) => {
                    RetryField::Value(ms.saturating_mul(10).saturating_add(d))
                }
                (
                    RetryField::Colon | RetryField::Space | RetryField::Value(_) | RetryField::Odd,
                    _,
                ) => RetryField::Odd,
            };
        }
    }

    /// The current line ended: a `retry` field above the bound marks the block.
    fn end_retry_line(&mut self) {
        // The block's last `retry` is the one its client keeps.
        match (self.retry_field, self.max_retry) {
            (RetryField::Value(ms), Some(max)) => self.retry_over = ms > max,
            (RetryField::Odd, Some(_)) => self.retry_over = true,
            _ => {}
        }
        self.retry_field = RetryField::No;
    }

    /// After a block's content: the bound, when a `retry` field of the block was above it.
    fn write_retry_bound(&mut self, term: &[u8], out: &mut Vec<u8>) {
        let Some(max) = self.max_retry.filter(|_| self.retry_over) else {
            return;
        };
        emit(&mut self.last_out, out, b"retry: ");
        // Into a Vec this cannot fail.
        let _ = std::io::Write::write_fmt(out, format_args!("{max}"));
        emit(&mut self.last_out, out, id_line_end(term));
    }

    fn begin_id_line(&mut self) {
        self.line = Line::Id {
            at_value_start: true,
        };
        self.line_id.clear();
        self.line_id_nul = false;
        self.line_id_over = false;
    }

    /// `nul`: `v` contains a NUL (found by the line-end scan).
    fn collect_id(&mut self, v: &[u8], nul: bool) {
        if nul {
            self.line_id_nul = true;
        }
        if self.line_id_over {
            return;
        }
        if self.line_id.len() + v.len() > self.max_hold {
            self.line_id_over = true;
            self.line_id.clear();
        } else {
            self.line_id.extend_from_slice(v);
        }
    }

    fn finish_id_line(&mut self) {
        if self.line_id_nul {
            // Clients ignore the field, so an earlier id of the block still stands.
            self.stats.nul_ids += 1;
        } else if self.line_id_over {
            self.stats.oversized_ids += 1;
            self.block_id_state = BlockId::Oversized;
            self.block_id.clear();
        } else {
            std::mem::swap(&mut self.line_id, &mut self.block_id);
            self.block_id_state = BlockId::Value;
        }
        self.line_id.clear();
    }

    fn add_run(&mut self, a: usize, b: usize) {
        self.block_bytes += b - a;
        match self.runs.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => self.runs.push((a, b)),
        }
    }

    /// Content bytes from an earlier chunk; no runs of this chunk precede them.
    fn add_carry(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        self.block_bytes += bytes.len();
        if self.streaming {
            emit(&mut self.last_out, out, bytes);
        } else {
            self.hold.extend_from_slice(bytes);
        }
    }

    #[inline(always)]
    fn check_overflow<O: OnId + ?Sized>(&mut self, chunk: &[u8], out: &mut Vec<u8>, on_id: &mut O) {
        if !self.streaming && (self.block_bytes > self.max_hold || !self.hold_blocks) {
            self.overflow(chunk, out, on_id);
        }
    }

    /// Out of the per-line path: once per block at most.
    #[cold]
    #[inline(never)]
    fn overflow<O: OnId + ?Sized>(&mut self, chunk: &[u8], out: &mut Vec<u8>, on_id: &mut O) {
        if self.hold_blocks {
            let id = match self.block_id_state {
                BlockId::Value => Some(utf8_lossy(&self.block_id)),
                _ => None,
            };
            if !on_id.may_overflow(id.as_deref()) {
                // Cut before any byte of the block left: the output ends between blocks.
                self.stats.overflow_cuts += 1;
                self.cut = true;
                self.reset_block();
                return;
            }
            self.stats.overflowed_blocks += 1;
        }
        self.streaming = true;
        self.flush_content(chunk, out);
    }

    /// Writes the block content gathered so far (held, then this chunk's runs).
    fn flush_content(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.hold.is_empty() && self.runs.is_empty() {
            return;
        }
        emit(&mut self.last_out, out, &self.hold);
        self.hold.clear();
        for &(a, b) in &self.runs {
            emit(&mut self.last_out, out, chunk.get(a..b).unwrap_or_default());
        }
        self.runs.clear();
    }

    /// At a chunk's end: keep the open block's bytes of this chunk, or stream them.
    fn park<O: OnId + ?Sized>(&mut self, chunk: &[u8], out: &mut Vec<u8>, on_id: &mut O) {
        // Inside an id line the check waits for its end, as it does when the line comes whole:
        // the id a block has when it overflows must not depend on the chunking. (Its bytes are
        // not held meanwhile: the value is bounded on its own.)
        if !matches!(self.line, Line::Id { .. } | Line::Prefix(_)) {
            self.check_overflow(chunk, out, on_id);
        }
        if self.cut {
            return;
        }
        if self.streaming {
            self.flush_content(chunk, out);
        } else {
            for &(a, b) in &self.runs {
                self.hold
                    .extend_from_slice(chunk.get(a..b).unwrap_or_default());
            }
        }
        self.runs.clear();
    }

    /// Handles the blank line `term`; returns where a LF split from a CR `term` belongs.
    fn end_block<O: OnId + ?Sized>(
        &mut self,
        chunk: &[u8],
        term: &[u8],
        out: &mut Vec<u8>,
        on_id: &mut O,
    ) -> Lf {
        if !self.in_block {
            self.emit_terminator(term, out);
            return Lf::Out;
        }
        // Taken out for the block's end (and put back, keeping its buffer).
        let block_id = std::mem::take(&mut self.block_id);
        let id = utf8_lossy(&block_id);
        let action = if self.block_id_state == BlockId::Value {
            self.stats.ids += 1;
            let digest = self.content.digest(chunk);
            Some(match id.is_empty() && !self.has_data {
                true => on_id.on_dataless_reset(digest),
                false => on_id.on_id(&id, digest),
            })
        } else if self.has_data {
            // Dispatched under the client's earlier id: only suppressing or cutting it is
            // possible, anything else goes out as it is.
            match on_id.on_event_without_id() {
                a @ (IdAction::DropEvent | IdAction::Cut) => Some(a),
                _ => None,
            }
        } else {
            None
        };
        let lf = match action {
            None | Some(IdAction::Omit) => {
                self.flush_content(chunk, out);
                self.write_retry_bound(term, out);
                self.emit_terminator(term, out);
                Lf::Out
            }
            Some(IdAction::Keep) => {
                self.flush_content(chunk, out);
                let id = std::iter::once(block_id.as_slice());
                write_id_line(&mut self.last_out, out, id, term);
                self.write_retry_bound(term, out);
                self.emit_terminator(term, out);
                Lf::Out
            }
            Some(IdAction::Write) => {
                if self.has_data {
                    self.stats.ids_kept += 1;
                }
                self.flush_content(chunk, out);
                emit(&mut self.last_out, out, b"id: ");
                let at = out.len();
                on_id.write_id(&id, out);
                drop_line_ends(out, at);
                if out.len() == at {
                    // Nothing written: an empty value would reset the client's id.
                    out.extend_from_slice(&block_id);
                }
                emit(&mut self.last_out, out, id_line_end(term));
                self.write_retry_bound(term, out);
                self.emit_terminator(term, out);
                Lf::Out
            }
            Some(IdAction::Replace(s)) => {
                self.flush_content(chunk, out);
                let id = s.as_bytes().split(|&b| b == b'\r' || b == b'\n');
                write_id_line(&mut self.last_out, out, id, term);
                self.write_retry_bound(term, out);
                self.emit_terminator(term, out);
                Lf::Out
            }
            Some(IdAction::DropEvent) if !self.streaming => {
                self.stats.dropped_blocks += 1;
                Lf::Drop
            }
            Some(a @ (IdAction::DropEvent | IdAction::Cut)) => {
                if a == IdAction::DropEvent {
                    self.stats.dropped_blocks += 1;
                }
                // A block partly sent can only be kept from dispatching by never ending it.
                if self.streaming {
                    self.flush_content(chunk, out);
                    self.cut_mid_block = true;
                }
                self.cut = true;
                Lf::Drop
            }
        };
        drop(id);
        self.block_id = block_id;
        self.reset_block();
        lf
    }

    fn emit_terminator(&mut self, term: &[u8], out: &mut Vec<u8>) {
        // After a removed line, a lone CR could precede this LF and form one CRLF line end.
        if self.last_out == Some(b'\r') && term.first() == Some(&b'\n') {
            emit(&mut self.last_out, out, b"\r");
        }
        emit(&mut self.last_out, out, term);
    }

    fn reset_block(&mut self) {
        self.in_block = false;
        // Without holding, every block streams from its start.
        self.streaming = !self.hold_blocks;
        self.block_bytes = 0;
        self.hold.clear();
        self.runs.clear();
        self.block_id.clear();
        self.block_id_state = BlockId::None;
        self.has_data = false;
        self.data_name = None;
        self.retry_field = RetryField::No;
        self.retry_over = false;
        self.content.reset();
    }
}

/// Writes `id: <parts>` with a line end that can never pair with the blank line `term` into one
/// CRLF, and that does not depend on whether `term`'s LF has arrived yet.
fn write_id_line<'p>(
    last_out: &mut Option<u8>,
    out: &mut Vec<u8>,
    parts: impl Iterator<Item = &'p [u8]>,
    term: &[u8],
) {
    emit(last_out, out, b"id: ");
    for p in parts {
        emit(last_out, out, p);
    }
    emit(last_out, out, id_line_end(term));
}

/// The line end of a written `id` line before the blank line `term`. Not a lone CR: the blank
/// line's own CR may still be joined by a LF from the next chunk.
fn id_line_end(term: &[u8]) -> &'static [u8] {
    match term.first() {
        Some(b'\r') => b"\r\n",
        _ => b"\n",
    }
}

/// Removes CR and LF from `out[at..]`, so a written id cannot break the framing.
fn drop_line_ends(out: &mut Vec<u8>, at: usize) {
    if find_eol(out.get(at..).unwrap_or_default()).is_none() {
        return;
    }
    let mut i = 0;
    out.retain(|&b| {
        i += 1;
        i <= at || (b != b'\r' && b != b'\n')
    });
}

/// An id as text: borrowed when it is UTF-8 (`from_utf8` is faster than `from_utf8_lossy` on
/// that common case), with U+FFFD for invalid bytes as clients read them otherwise.
fn utf8_lossy(b: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(b) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(b),
    }
}

fn emit(last_out: &mut Option<u8>, out: &mut Vec<u8>, bytes: &[u8]) {
    if let Some(&last) = bytes.last() {
        // A removed `id` line can bring a mark (a BOM-like line start) to the head of the
        // output, where some readers strip it: a blank line first (it dispatches nothing) keeps
        // it where every reader reads it as the guard does.
        if last_out.is_none() && LEAD_MARKS.iter().any(|m| m.first() == bytes.first()) {
            out.push(b'\n');
        }
        *last_out = Some(last);
        out.extend_from_slice(bytes);
    }
}

/// memchr2 is word-at-a-time in plain wasm (~2.3x a byte loop there) and SIMD with simd128.
#[inline]
fn find_eol(s: &[u8]) -> Option<usize> {
    memchr::memchr2(b'\n', b'\r', s)
}

/// The line end in `s`, and whether a NUL comes before it: one scan for both (an `id` value
/// with a NUL is ignored).
fn find_eol_or_nul(s: &[u8]) -> (Option<usize>, bool) {
    match memchr::memchr3(b'\n', b'\r', 0, s) {
        Some(p) if s.get(p) == Some(&0) => {
            let after = s.get(p..).unwrap_or_default();
            (find_eol(after).map(|q| q + p), true)
        }
        found => (found, false),
    }
}

/// Length of the line end at `rest[e]`, and whether it is a CR ending the chunk (a LF may follow).
fn eol_at(rest: &[u8], e: usize) -> (usize, bool) {
    match (rest.get(e), rest.get(e + 1)) {
        (Some(b'\r'), Some(b'\n')) => (2, false),
        (Some(b'\r'), None) => (1, true),
        _ => (1, false),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One dispatched event as a WHATWG client sees it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Ev {
        kind: String,
        data: String,
        last_id: Option<String>,
    }

    /// What a client observes: events, `retry` values, and the final last event id.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Seen {
        events: Vec<Ev>,
        retries: Vec<u64>,
        last_id: Option<String>,
    }

    #[cfg(not(target_arch = "wasm32"))]
    /// What a client of the output sees is what it would of the input, except a `retry` in an
    /// unterminated last block, which is not released.
    fn relayed_as(got: &Seen, want: &Seen) -> bool {
        got.events == want.events
            && got.last_id == want.last_id
            && want.retries.starts_with(&got.retries)
    }

    /// The stream as the guard has every reader read it: without its leading run of marks.
    fn unmarked(mut bytes: &[u8]) -> &[u8] {
        while let Some(rest) = LEAD_MARKS.iter().find_map(|m| bytes.strip_prefix(*m)) {
            bytes = rest;
        }
        bytes
    }

    /// A small reference WHATWG parser over a whole stream; `None` = last event id never set.
    fn reference(bytes: &[u8]) -> Seen {
        let text = String::from_utf8_lossy(unmarked(bytes));
        let mut rest: &str = &text;
        let (mut data, mut kind) = (String::new(), String::new());
        let mut id_buf: Option<String> = None;
        let mut seen = Seen {
            events: vec![],
            retries: vec![],
            last_id: None,
        };
        // A final line without a line end is never processed.
        while let Some(p) = rest.find(['\r', '\n']) {
            let line = &rest[..p];
            let eol = if rest[p..].starts_with("\r\n") { 2 } else { 1 };
            rest = &rest[p + eol..];
            if line.is_empty() {
                seen.last_id = id_buf.clone();
                if data.is_empty() {
                    kind.clear();
                    continue;
                }
                if data.ends_with('\n') {
                    data.pop();
                }
                seen.events.push(Ev {
                    kind: if kind.is_empty() {
                        "message".into()
                    } else {
                        std::mem::take(&mut kind)
                    },
                    data: std::mem::take(&mut data),
                    last_id: seen.last_id.clone(),
                });
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (name, value) = match line.find(':') {
                Some(c) => (
                    &line[..c],
                    line[c + 1..].strip_prefix(' ').unwrap_or(&line[c + 1..]),
                ),
                None => (line, ""),
            };
            match name {
                "event" => kind = value.into(),
                "data" => {
                    data.push_str(value);
                    data.push('\n');
                }
                "id" if !value.contains('\0') => id_buf = Some(value.into()),
                "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                    seen.retries.push(value.parse().unwrap_or(u64::MAX))
                }
                _ => {}
            }
        }
        seen
    }

    /// Runs the rewriter over `chunks`; returns output and the ids passed to `on_id`.
    fn run_with(
        chunks: &[&[u8]],
        max_hold: usize,
        act: &mut dyn FnMut(&str) -> IdAction,
    ) -> (Vec<u8>, Vec<String>, Rewriter) {
        let mut rw = Rewriter::new(max_hold);
        let mut out = Vec::new();
        let mut ids = Vec::new();
        let mut cb = |id: &str, _: u64| {
            ids.push(id.to_owned());
            act(id)
        };
        for c in chunks {
            rw.push(c, &mut out, &mut cb);
        }
        rw.finish(&mut out);
        (out, ids, rw)
    }

    /// `(id, content digest)` of every `on_id` call, ids replaced.
    fn digests(chunks: &[&[u8]], max_hold: usize, streaming: bool) -> Vec<(String, u64)> {
        let mut rw = if streaming {
            Rewriter::streaming(max_hold)
        } else {
            Rewriter::new(max_hold)
        };
        let (mut out, mut got) = (Vec::new(), Vec::new());
        for c in chunks {
            rw.push(c, &mut out, &mut |id, d| {
                got.push((id.to_owned(), d));
                IdAction::Replace(format!("R{id}"))
            });
        }
        got
    }

    /// One block as a client reads it: its id (the last non-NUL `id` line's), whether it has
    /// a `data` field (a client dispatches it), and the digest of its other lines.
    #[cfg(not(target_arch = "wasm32"))]
    type RefBlock = (Option<String>, bool, u64);

    /// Reference for what the rewriter reports: every block (one or more lines, then a blank
    /// line) of the whole stream. Property tests only (native).
    #[cfg(not(target_arch = "wasm32"))]
    fn reference_blocks(bytes: &[u8]) -> Vec<RefBlock> {
        let mut rest = unmarked(bytes);
        let (mut lines, mut id, mut got): (Vec<&[u8]>, Option<&[u8]>, Vec<_>) =
            (vec![], None, vec![]);
        let (mut in_block, mut data) = (false, false);
        while let Some(p) = rest.iter().position(|&b| b == b'\r' || b == b'\n') {
            let line = &rest[..p];
            let eol = if rest[p..].starts_with(b"\r\n") { 2 } else { 1 };
            rest = &rest[p + eol..];
            if line.is_empty() {
                if std::mem::take(&mut in_block) {
                    let id = id.take().map(|v| String::from_utf8_lossy(v).into_owned());
                    got.push((id, std::mem::take(&mut data), content_digest(&lines)));
                }
                lines.clear();
                continue;
            }
            in_block = true;
            if line == b"id" || line.starts_with(b"id:") {
                let v = line.get(3..).unwrap_or_default();
                let v = v.strip_prefix(b" ").unwrap_or(v);
                if !v.contains(&0) {
                    id = Some(v);
                }
            } else {
                data |= line == b"data" || line.starts_with(b"data:");
                lines.push(line);
            }
        }
        got
    }

    /// Reference for [`digests`]: each block with a (non-NUL) id, its last id and the digest of
    /// its other lines.
    #[cfg(not(target_arch = "wasm32"))]
    fn reference_digests(bytes: &[u8]) -> Vec<(String, u64)> {
        let blocks = reference_blocks(bytes).into_iter();
        blocks.filter_map(|(id, _, d)| Some((id?, d))).collect()
    }

    /// Records every callback: `Some(id)` for `on_id`, `None` for `on_event_without_id`; and
    /// each `may_overflow` question, allowed when the id so far has a `k`.
    #[derive(Default)]
    #[cfg(not(target_arch = "wasm32"))]
    struct Calls(Vec<Option<String>>, Vec<Option<String>>);

    #[cfg(not(target_arch = "wasm32"))]
    impl OnId for Calls {
        fn on_id(&mut self, id: &str, _: u64) -> IdAction {
            self.0.push(Some(id.to_owned()));
            IdAction::Omit
        }

        fn write_id(&mut self, _: &str, _: &mut Vec<u8>) {}

        fn on_event_without_id(&mut self) -> IdAction {
            self.0.push(None);
            IdAction::Keep
        }

        fn may_overflow(&mut self, id: Option<&str>) -> bool {
            self.1.push(id.map(str::to_owned));
            id.is_some_and(|i| i.contains('k'))
        }
    }

    #[test]
    fn the_content_digest_ignores_ids_and_line_ends_and_sees_the_data() {
        let d = |s: &[u8]| digests(&[s], 1 << 16, false);
        let a = d(b"id: 1\nevent: message\ndata: {\"n\":1}\n\n");
        assert_eq!(a.len(), 1);
        assert_eq!(a, d(b"event: message\r\ndata: {\"n\":1}\r\nid: 1\r\n\r\n"));
        assert_eq!(a, d(b"event: message\rid: 1\rdata: {\"n\":1}\r\r"));
        assert_ne!(a, d(b"id: 1\nevent: message\ndata: {\"n\":2}\n\n"));
        assert_ne!(a, d(b"id: 1\ndata: {\"n\":1}\n\n"), "the event type counts");
        assert_ne!(
            d(b"id: 1\ndata: a\ndata: b\n\n"),
            d(b"id: 1\ndata: ab\n\n"),
            "so do line boundaries"
        );
        assert_eq!(
            a[0].1,
            content_digest(&[b"event: message", b"data: {\"n\":1}"])
        );
    }

    fn upper(id: &str) -> IdAction {
        IdAction::Replace(format!("R{}", id.to_uppercase()))
    }

    fn run(chunks: &[&[u8]]) -> (Vec<u8>, Vec<String>) {
        let (out, ids, _) = run_with(chunks, 1 << 16, &mut upper);
        (out, ids)
    }

    /// The whole input, then every split into two chunks, then one byte at a time: same output.
    fn check(input: &[u8], want: &[u8], want_ids: &[&str]) {
        let (out, ids) = run(&[input]);
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(want),
            "whole"
        );
        assert_eq!(ids, want_ids);
        for k in 0..=input.len() {
            let (a, b) = input.split_at(k);
            assert_eq!(run(&[a, b]).0, out, "split at {k}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run(&bytes).0, out, "bytewise");
    }

    #[test]
    fn plain_event_id_replaced_as_last_line() {
        check(b"id: a\ndata: x\n\n", b"data: x\nid: RA\n\n", &["a"]);
        check(
            b"event: message\nid: a\ndata: {}\n\n",
            b"event: message\ndata: {}\nid: RA\n\n",
            &["a"],
        );
    }

    #[test]
    fn bom_is_consumed() {
        check(
            b"\xEF\xBB\xBFid: a\ndata: x\n\n",
            b"data: x\nid: RA\n\n",
            &["a"],
        );
        // Not a BOM: bytes pass through.
        check(b"\xEF\xBBx: 1\n\n", b"\n\xEF\xBBx: 1\n\n", &[]);
        // A BOM later in the stream is content.
        check(b"\n\xEF\xBB\xBFid: a\n\n", b"\n\xEF\xBB\xBFid: a\n\n", &[]);
        assert_eq!(run(&[b"\xEF", b"\xBBx: 1\n\n"]).0, b"\n\xEF\xBBx: 1\n\n");
        // Every leading BOM and its Latin-1 mojibake `ï»¿`, in any order: each one some reader
        // strips and another does not.
        for lead in [
            "\u{feff}\u{feff}",
            "\u{ef}\u{bb}\u{bf}",
            "\u{feff}\u{ef}\u{bb}\u{bf}\u{feff}",
        ] {
            let input = format!("{lead}id: a\ndata: x\n\n");
            check(input.as_bytes(), b"data: x\nid: RA\n\n", &["a"]);
        }
        // A partial mark is content, and ends the head: a mark after it is kept. Output that
        // starts with a mark's first byte gets a blank line first, whatever follows.
        check(
            "\u{ef}\u{bb}x\u{feff}: 1\n\n".as_bytes(),
            "\n\u{ef}\u{bb}x\u{feff}: 1\n\n".as_bytes(),
            &[],
        );
        check(
            b"\xC3\xAF\xEF\xBB\xBF: 1\n\n",
            b"\n\xC3\xAF\xEF\xBB\xBF: 1\n\n",
            &[],
        );
        // A mark behind an `id` line the guard moves: WHATWG reads no data there, nor may a
        // reader that would strip it once it leads the output.
        for lead in ["\u{feff}", "\u{ef}\u{bb}\u{bf}"] {
            let input = format!("id: a\n{lead}data: x\n\n");
            let want = format!("\n{lead}data: x\nid: RA\n\n");
            check(input.as_bytes(), want.as_bytes(), &["a"]);
        }
    }

    #[test]
    fn line_endings() {
        check(
            b"id: 1\r\ndata: x\r\n\r\n",
            b"data: x\r\nid: R1\r\n\r\n",
            &["1"],
        );
        // A CR last gets an LF (TypeScript would wait for one).
        check(b"id: 1\rdata: x\r\r", b"data: x\rid: R1\r\n\r\n", &["1"]);
        check(
            b"data: x\r\nid: 1\n\r\n",
            b"data: x\r\nid: R1\r\n\r\n",
            &["1"],
        );
        // CR | LF across chunks is one line end.
        let (out, ids) = run(&[b"id: 1\r", b"\ndata: x\r", b"\n\r", b"\n"]);
        assert_eq!(out, b"data: x\r\nid: R1\r\n\r\n");
        assert_eq!(ids, ["1"]);
        // A CR at a chunk end dispatches at once; the next chunk does not start a blank line.
        let mut rw = Rewriter::new(1024);
        let mut out = Vec::new();
        let mut n = 0;
        rw.push(b"id: 1\rdata: x\r\r", &mut out, &mut |_, _| {
            n += 1;
            IdAction::Keep
        });
        assert_eq!(n, 1);
        rw.push(b"\ndata: y\n\n", &mut out, &mut |_, _| IdAction::Keep);
        assert_eq!(reference(&out).events.len(), 2);
    }

    #[test]
    fn comments_retry_and_multiline_data() {
        check(
            b": hi\nid: 1\ndata: x\n\n",
            b": hi\ndata: x\nid: R1\n\n",
            &["1"],
        );
        check(b": keepalive\n\n", b": keepalive\n\n", &[]);
        check(b"retry: 1000\n\n", b"retry: 1000\n\n", &[]);
        check(
            b"retry: 10\ndata: a\nid: 7\ndata: b\n\n",
            b"retry: 10\ndata: a\ndata: b\nid: R7\n\n",
            &["7"],
        );
        check(b"data: a\n\ndata: b\n\n", b"data: a\n\ndata: b\n\n", &[]);
    }

    #[test]
    fn id_with_nul_is_removed_without_callback() {
        check(b"id: a\0b\ndata: x\n\n", b"data: x\n\n", &[]);
        // An ignored field does not override the block's earlier id.
        check(
            b"id: good\nid: a\0\ndata: x\n\n",
            b"data: x\nid: RGOOD\n\n",
            &["good"],
        );
        let (out, _, rw) = run_with(&[b"id: \0\n\n"], 64, &mut upper);
        assert_eq!(out, b"\n");
        assert_eq!(rw.stats().nul_ids, 1);
    }

    #[test]
    fn empty_id_and_field_without_colon() {
        check(b"id:\ndata: x\n\n", b"data: x\nid: R\n\n", &[""]);
        check(b"id\ndata: x\n\n", b"data: x\nid: R\n\n", &[""]);
        check(b"id \n\n", b"id \n\n", &[]);
        check(b"data\n\n", b"data\n\n", &[]);
        check(b"i\n\n", b"i\n\n", &[]);
    }

    #[test]
    fn id_value_spacing_and_lookalikes() {
        check(b"id:x\n\n", b"id: RX\n\n", &["x"]);
        check(b"id:  x\n\n", b"id: R X\n\n", &[" x"]);
        check(b"idx: y\n\n", b"idx: y\n\n", &[]);
        check(b"ID: y\n\n", b"ID: y\n\n", &[]);
        check(b" id: y\n\n", b" id: y\n\n", &[]);
        for (a, b) in [
            ("i", "d: x\n\n"),
            ("id", ": x\n\n"),
            ("id:", " x\n\n"),
            ("id: ", "x\n\n"),
        ] {
            let (out, ids) = run(&[a.as_bytes(), b.as_bytes()]);
            assert_eq!(out, b"id: RX\n\n", "{a}|{b}");
            assert_eq!(ids, ["x"]);
        }
        let (out, ids) = run(&[b"i", b"dx: y\n\n"]);
        assert_eq!((out.as_slice(), ids.len()), (&b"idx: y\n\n"[..], 0));
    }

    #[test]
    fn priming_event_and_last_id_wins() {
        check(b"id: p\ndata:\n\n", b"data:\nid: RP\n\n", &["p"]);
        check(b"id: a\nid: b\ndata: x\n\n", b"data: x\nid: RB\n\n", &["b"]);
    }

    #[test]
    fn keep_rewrites_to_an_equivalent_line() {
        let (out, ids, _) = run_with(&[b"id:x\ndata: 1\n\n"], 64, &mut |_| IdAction::Keep);
        assert_eq!(
            (out.as_slice(), ids),
            (&b"data: 1\nid: x\n\n"[..], vec!["x".to_string()])
        );
        // Replacement text cannot break the framing.
        let (out, _, _) = run_with(&[b"id: a\n\n"], 64, &mut |_| {
            IdAction::Replace("x\r\ny".into())
        });
        assert_eq!(out, b"id: xy\n\n");
    }

    #[test]
    fn drop_event_suppresses_the_whole_block() {
        let input: &[u8] = b"id: a\ndata: 1\n\nid: b\ndata: 2\n\n: c\nid: c\ndata: 3\n\n";
        let mut act = |id: &str| {
            if id == "b" {
                IdAction::DropEvent
            } else {
                upper(id)
            }
        };
        let (whole, ids, rw) = run_with(&[input], 64, &mut act);
        assert_eq!(whole, b"data: 1\nid: RA\n\n: c\ndata: 3\nid: RC\n\n");
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(rw.stats().dropped_blocks, 1);
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run_with(&bytes, 64, &mut act).0, whole);
        // A dropped CR-terminated block takes its split LF with it.
        let (out, _, _) = run_with(&[b"id: b\rdata: 2\r\r", b"\ndata: 3\n\n"], 64, &mut act);
        assert_eq!(out, b"data: 3\n\n");
    }

    #[test]
    fn cut_stops_everything() {
        let input: &[u8] = b"id: a\ndata: 1\n\nid: b\ndata: 2\n\nid: c\ndata: 3\n\n";
        let mut act = |id: &str| if id == "b" { IdAction::Cut } else { upper(id) };
        let (out, ids, rw) = run_with(&[input], 64, &mut act);
        assert_eq!(out, b"data: 1\nid: RA\n\n");
        assert_eq!(ids, ["a", "b"]);
        assert!(rw.is_cut() && !rw.cut_mid_block());
        let mut rw = rw;
        let mut out = Vec::new();
        rw.push(b"data: more\n\n", &mut out, &mut |id, _| upper(id));
        rw.finish(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn overflowed_blocks_stream_through() {
        let big = format!("id: a\ndata: {}\n\n", "x".repeat(40));
        let (out, ids, rw) = run_with(&[big.as_bytes()], 16, &mut upper);
        assert_eq!(
            out,
            format!("data: {}\nid: RA\n\n", "x".repeat(40)).as_bytes()
        );
        assert_eq!(ids, ["a"]);
        assert_eq!(rw.stats().overflowed_blocks, 1);
        // Held bytes stay bounded while a long block streams.
        let mut rw = Rewriter::new(16);
        let mut out = Vec::new();
        for c in big.as_bytes().chunks(5) {
            rw.push(c, &mut out, &mut |id, _| upper(id));
            assert!(rw.held_bytes() <= 16);
        }
        // DropEvent and Cut both leave it unterminated: a client never dispatches it.
        for action in [IdAction::DropEvent, IdAction::Cut] {
            let (out, _, rw) = run_with(&[big.as_bytes(), b"data: next\n\n"], 16, &mut |_| {
                action.clone()
            });
            assert_eq!(out, format!("data: {}\n", "x".repeat(40)).as_bytes());
            assert!(rw.is_cut() && rw.cut_mid_block());
            assert!(reference(&out).events.is_empty());
        }
        // A short block after an overflowed one is held again.
        let mut both = big.clone();
        both.push_str("id: b\ndata: y\n\n");
        let mut act = |id: &str| {
            if id == "b" {
                IdAction::DropEvent
            } else {
                upper(id)
            }
        };
        let (out, _, _) = run_with(&[both.as_bytes()], 16, &mut act);
        assert_eq!(
            out,
            format!("data: {}\nid: RA\n\n", "x".repeat(40)).as_bytes()
        );
    }

    #[test]
    fn oversized_id_is_dropped() {
        let input = format!("id: {}\ndata: x\n\n", "z".repeat(20));
        let (out, ids, rw) = run_with(&[input.as_bytes()], 8, &mut upper);
        assert_eq!(out, b"data: x\n\n");
        assert!(ids.is_empty());
        assert_eq!(rw.stats().oversized_ids, 1);
    }

    #[test]
    fn removed_lines_never_merge_cr_and_lf() {
        // Dropping the NUL id leaves "data: x\r" before the "\n" blank line.
        let input: &[u8] = b"data: x\rid: \0\n\ndata: y\n\n";
        let (out, _) = run(&[input]);
        assert_eq!(reference(&out), reference(input));
        assert_eq!(reference(&out).events.len(), 2);
        let mut act = |id: &str| {
            if id == "b" {
                IdAction::DropEvent
            } else {
                upper(id)
            }
        };
        let (out, _, _) = run_with(
            &[b"data: a\n\r", b"id: b\ndata: 2\n\n\ndata: c\n\n"],
            64,
            &mut act,
        );
        assert_eq!(reference(&out).events.len(), 2);
    }

    #[test]
    fn unterminated_block_at_end() {
        // Never released: Python dispatches one ending in CR; whatever follows must start a line.
        let (out, ids) = run(&[b"data: x\nid: 1\ndata: y"]);
        assert_eq!(out, b"");
        assert!(ids.is_empty());
        assert_eq!(run(&[b"data: 1\n\ni"]).0, b"data: 1\n\n");
        assert_eq!(run(&[b"data: 1\n\nid: par"]).0, b"data: 1\n\n");
        assert_eq!(run(&[b"data: 1\n\ndata: 2\r"]).0, b"data: 1\n\n");
        // Part of it already out (streamed): the output stays inside a block, and a last CR
        // gets its LF, so Python does not dispatch it either.
        let mut rw = Rewriter::streaming(1024);
        let mut out = Vec::new();
        rw.push(b"data: 1\n\ndata: 2\r", &mut out, &mut |_, _| {
            IdAction::Keep
        });
        rw.finish(&mut out);
        assert_eq!(out, b"data: 1\n\ndata: 2\r\n");
        assert!(rw.output_mid_block());
        // Its last line gets a line end too: TypeScript would still hold a CR blank line before it.
        let mut rw = Rewriter::streaming(1024);
        let mut out = Vec::new();
        rw.push(b"data: 1\r\rdata: 2", &mut out, &mut |_, _| IdAction::Keep);
        rw.finish(&mut out);
        assert_eq!(out, b"data: 1\r\rdata: 2x\n");
    }

    /// Partial blocks of every shape, as a fresh stream streams them, split anywhere.
    const PARTIALS: &[&[u8]] = &[
        b"data: par",
        b"data: par\n",
        b"data: par\r",
        b"data: a\r\nda",
        b"data: a\ndata: b\ndata: c",
        b"dat",
        b"data",
        b"data:",
        b"event: mess",
        b"event: message\ndata: p",
        b"event",
        b"retry: 1",
        b"retry",
        b"ret",
        b": comm",
        b"id: 5\ndata: x",
        b"i",
        b"id",
        b"ix",
        b"data: \xE2\x82",
    ];

    #[test]
    fn a_closed_block_dispatches_no_message_and_a_signal_can_follow() {
        use crate::eventsource::Parser;
        let signal = crate::stream::control_event(crate::ownership::Reason::ResponseMissing);
        for partial in PARTIALS {
            let input = [b"data: a\n\n".as_slice(), partial].concat();
            for at in 0..=input.len() {
                for end in [false, true] {
                    let mut rw = Rewriter::streaming(1024);
                    let mut out = Vec::new();
                    for chunk in [&input[..at], &input[at..]] {
                        rw.push(chunk, &mut out, &mut |_, _| IdAction::Keep);
                    }
                    if end {
                        // The replica's clean end, then the signal.
                        rw.finish(&mut out);
                    }
                    rw.close_block(&mut out);
                    assert!(!rw.output_mid_block() && !rw.close_block(&mut out));
                    out.extend_from_slice(signal.as_bytes());
                    let how = format!("{:?} at {at} end {end}", String::from_utf8_lossy(&out));
                    let mut client = Parser::new();
                    let mut events = Vec::new();
                    client.feed(&out, &mut events);
                    let types: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
                    assert!(
                        types == ["", "mcp-resume"] || types == ["", DISCARDED_EVENT, "mcp-resume"],
                        "{types:?}: {how}"
                    );
                    assert_eq!(events[0].data, "a", "{how}");
                    assert_eq!(client.retry(), None, "a retry cut short sets none: {how}");
                    // Once closed, nothing more goes out.
                    let before = out.len();
                    rw.push(b"data: late\n\n", &mut out, &mut |_, _| IdAction::Keep);
                    rw.finish(&mut out);
                    assert_eq!(out.len(), before, "{how}");
                }
            }
        }
    }

    #[test]
    fn a_block_at_a_boundary_needs_no_closing() {
        let mut rw = Rewriter::streaming(1024);
        let mut out = Vec::new();
        rw.push(b"data: a\n\n", &mut out, &mut |_, _| IdAction::Keep);
        assert!(!rw.close_block(&mut out));
        assert_eq!(out, b"data: a\n\n");
    }

    #[test]
    fn held_bytes_track_open_blocks() {
        let mut rw = Rewriter::new(1024);
        let mut out = Vec::new();
        rw.push(b"id: abc\ndata: hel", &mut out, &mut |id, _| upper(id));
        assert!(out.is_empty());
        assert_eq!(rw.held_bytes(), "data: hel".len() + "abc".len());
        rw.push(b"lo\n\n", &mut out, &mut |id, _| upper(id));
        assert_eq!(out, b"data: hello\nid: RABC\n\n");
        assert_eq!(rw.held_bytes(), 0);
    }

    #[cfg(not(target_arch = "wasm32"))]
    /// A streaming rewriter's output is the holding one's, except that it already released
    /// the start of an unterminated last block, which the holding one drops (and so may end in
    /// a CR that got an LF): the same to every client.
    fn same_but_the_tail(held: &[u8], out: &[u8], streaming: bool) -> bool {
        if !streaming {
            return held == out;
        }
        let head = match held.ends_with(b"\r\n") {
            true => &held[..held.len() - 1],
            false => held,
        };
        out.starts_with(head) && relayed_as(&reference(held), &reference(out))
    }

    /// Answers every id with `Write` and writes `f(id)`.
    struct Writer<'a> {
        f: &'a dyn Fn(&str) -> String,
        ids: Vec<String>,
    }

    impl OnId for Writer<'_> {
        fn on_id(&mut self, id: &str, _: u64) -> IdAction {
            self.ids.push(id.to_owned());
            IdAction::Write
        }

        fn write_id(&mut self, id: &str, out: &mut Vec<u8>) {
            out.extend_from_slice((self.f)(id).as_bytes());
        }
    }

    /// Runs a rewriter (holding, or streaming) whose ids are written by a [`Writer`].
    fn run_written(
        chunks: &[&[u8]],
        streaming: bool,
        f: &dyn Fn(&str) -> String,
    ) -> (Vec<u8>, Vec<String>) {
        let mut rw = if streaming {
            Rewriter::streaming(1 << 16)
        } else {
            Rewriter::new(1 << 16)
        };
        let mut w = Writer { f, ids: vec![] };
        let mut out = Vec::new();
        for c in chunks {
            rw.push_with(c, &mut out, &mut w);
        }
        rw.finish(&mut out);
        (out, w.ids)
    }

    /// `chunks` through a rewriter whose `retry` bound is 50, in both modes, ids kept.
    fn bounded(chunks: &[&[u8]], streaming: bool) -> Vec<u8> {
        let mut rw = if streaming {
            Rewriter::streaming(1 << 16)
        } else {
            Rewriter::new(1 << 16)
        };
        rw.bound_retry(Some(50));
        let mut out = Vec::new();
        for c in chunks {
            rw.push(c, &mut out, &mut |_, _| IdAction::Keep);
        }
        rw.finish(&mut out);
        out
    }

    #[test]
    fn a_retry_above_the_bound_is_followed_by_the_bound() {
        let cases: &[(&[u8], &[u8])] = &[
            (
                b"retry: 3600000\nid: e1\ndata: x\n\n",
                b"retry: 3600000\ndata: x\nid: e1\nretry: 50\n\n",
            ),
            (b"retry:51\n\n", b"retry:51\nretry: 50\n\n"),
            (
                b"retry: 99999999999999999999999\r\n\r\n",
                b"retry: 99999999999999999999999\r\nretry: 50\r\n\r\n",
            ),
            (
                b"retry: 900\rdata: a\r\r",
                b"retry: 900\rdata: a\rretry: 50\r\n\r\n",
            ),
            // Not plain digits: browsers ignore it, Python's `int()` may read any time in it
            // (red team 6, `retry-pyint`).
            (b"retry:  900\n\n", b"retry:  900\nretry: 50\n\n"),
            (b"retry: +900\n\n", b"retry: +900\nretry: 50\n\n"),
            (b"retry: 9_00\n\n", b"retry: 9_00\nretry: 50\n\n"),
            (b"retry: 900 \n\n", b"retry: 900 \nretry: 50\n\n"),
            (b"retry:\t900\n\n", b"retry:\t900\nretry: 50\n\n"),
            (
                "retry: \u{ff13}00\n\n".as_bytes(),
                "retry: \u{ff13}00\nretry: 50\n\n".as_bytes(),
            ),
            (b"retry: 9x9\n\n", b"retry: 9x9\nretry: 50\n\n"),
            (b"retry: +9\nretry: 7\n\n", b"retry: +9\nretry: 7\n\n"),
            // At or under the bound, no value, not a retry field, or a later one in the block
            // under it.
            (b"retry: 50\n\n", b"retry: 50\n\n"),
            (b"retry:\n\n", b"retry:\n\n"),
            (b"retry: \n\n", b"retry: \n\n"),
            (b"retry\n\n", b"retry\n\n"),
            (b"retryx: 900\n\n", b"retryx: 900\n\n"),
            (b"data: retry: 900\n\n", b"data: retry: 900\n\n"),
            (b"retry: 900\nretry: 7\n\n", b"retry: 900\nretry: 7\n\n"),
            (
                b"retry: 7\nretry: 900\n\n",
                b"retry: 7\nretry: 900\nretry: 50\n\n",
            ),
        ];
        for &(input, want) in cases {
            for streaming in [false, true] {
                let whole = bounded(&[input], streaming);
                assert_eq!(
                    String::from_utf8_lossy(&whole),
                    String::from_utf8_lossy(want)
                );
                let bytes: Vec<&[u8]> = input.chunks(1).collect();
                assert_eq!(bounded(&bytes, streaming), whole);
            }
        }
        // A block partly out when the stream ends: its lines are read, so the bound follows (a
        // line cut short is closed as no retry at all).
        for (input, want) in [
            (&b"data: x\nretry: 900"[..], &[50][..]),
            (b"data: x\nretry: 900\n", &[900, 50][..]),
        ] {
            let out = bounded(&[input], true);
            let seen = reference(&out);
            assert_eq!(seen.retries, want, "{}", String::from_utf8_lossy(&out));
            assert!(seen.events.is_empty());
        }
        // Held and unfinished, the block never goes out.
        assert_eq!(bounded(&[b"retry: 900\n"], false), b"");
    }

    #[test]
    fn a_written_id_is_the_same_as_a_replacement() {
        let f = |id: &str| format!("R{}", id.to_uppercase());
        for input in [
            &b"id: a\ndata: x\n\n: c\n\nid: b\r\ndata: y\r\n\r\n"[..],
            b"data: x\rid: 1\r\rdata: 2\nid: 2\n\n",
        ] {
            let (want, want_ids) = run(&[input]);
            for streaming in [false, true] {
                let (out, ids) = run_written(&[input], streaming, &f);
                assert_eq!((&out, &ids), (&want, &want_ids), "{streaming}");
                let bytes: Vec<&[u8]> = input.chunks(1).collect();
                assert_eq!(run_written(&bytes, streaming, &f).0, want);
            }
        }
        // A written line end is dropped; nothing written keeps the id (not an empty reset).
        let (out, _) = run_written(&[b"id: a\ndata: x\n\n"], true, &|_| "x\r\ny\n".into());
        assert_eq!(out, b"data: x\nid: xy\n\n");
        let (out, _) = run_written(&[b"id: a\ndata: x\n\n"], false, &|_| String::new());
        assert_eq!(out, b"data: x\nid: a\n\n");
    }

    #[test]
    fn invalid_utf8_ids_reach_the_callback_as_clients_see_them() {
        let (_, ids) = run(&[b"id: a\xFFb\n\n"]);
        assert_eq!(ids, ["a\u{FFFD}b"]);
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) mod props {
        use super::*;
        use proptest::prelude::*;

        fn eol() -> impl Strategy<Value = &'static [u8]> {
            prop_oneof![Just(&b"\n"[..]), Just(&b"\r\n"[..]), Just(&b"\r"[..])]
        }

        fn text() -> impl Strategy<Value = Vec<u8>> {
            let byte = prop_oneof![
                8 => b'a'..=b'z',
                1 => Just(b' '),
                1 => Just(b':'),
                1 => Just(0u8),
                1 => Just(0xFFu8),
                1 => Just(0xC3u8),
                1 => Just(0xA9u8),
            ];
            prop::collection::vec(byte, 0..8)
        }

        fn line() -> impl Strategy<Value = Vec<u8>> {
            let cat = |a: &[u8], b: Vec<u8>| [a, b.as_slice()].concat();
            prop_oneof![
                3 => (prop_oneof![Just(&b"id:"[..]), Just(&b"id: "[..]), Just(&b"id:  "[..])], text())
                    .prop_map(move |(p, t)| cat(p, t)),
                1 => Just(b"id".to_vec()),
                1 => Just(b"data".to_vec()),
                3 => (prop_oneof![Just(&b"data:"[..]), Just(&b"data: "[..])], text()).prop_map(move |(p, t)| cat(p, t)),
                1 => text().prop_map(move |t| cat(b"event: ", t)),
                1 => prop_oneof![Just(b"retry: 100".to_vec()), Just(b"retry:5".to_vec()), Just(b"retry: x1".to_vec())],
                1 => text().prop_map(move |t| cat(b":", t)),
                1 => (prop_oneof![Just(&b"idx"[..]), Just(&b"i"[..]), Just(&b"d"[..]), Just(&b" id"[..]), Just(&b"ID"[..]), Just(&b"dat"[..]), Just(&b"datas"[..])], text())
                    .prop_map(move |(p, t)| cat(p, t)),
            ]
        }

        /// Random SSE streams: optional BOM, blocks of lines with mixed line ends, maybe a tail.
        pub(crate) fn stream() -> impl Strategy<Value = Vec<u8>> {
            let block = (prop::collection::vec((line(), eol()), 0..5), eol());
            (
                prop::collection::vec(0..LEAD_MARKS.len(), 0..3),
                prop::collection::vec(block, 0..6),
                prop::collection::vec((line(), eol()), 0..2),
                text(),
            )
                .prop_map(|(lead, blocks, tail, partial)| {
                    let mut s = Vec::new();
                    for m in lead {
                        s.extend_from_slice(LEAD_MARKS[m]);
                    }
                    for (lines, end) in blocks {
                        for (l, e) in lines {
                            s.extend_from_slice(&l);
                            s.extend_from_slice(e);
                        }
                        s.extend_from_slice(end);
                    }
                    for (l, e) in tail {
                        s.extend_from_slice(&l);
                        s.extend_from_slice(e);
                    }
                    s.extend_from_slice(&partial);
                    s
                })
        }

        /// `s` cut at the given points (any number, anywhere): the chunks a proxy might deliver.
        pub(crate) fn split<'a>(s: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(s.len() + 1)).collect();
            at.sort_unstable();
            let mut parts = Vec::new();
            let mut prev = 0;
            for p in at.into_iter().chain([s.len()]) {
                parts.push(&s[prev..p]);
                prev = p;
            }
            parts
        }

        fn f(id: &str) -> String {
            format!("R{}", id.len()) + id
        }

        fn mapped(mut seen: Seen) -> Seen {
            for e in &mut seen.events {
                e.last_id = e.last_id.as_deref().map(f);
            }
            seen.last_id = seen.last_id.as_deref().map(f);
            seen
        }

        proptest! {
            #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn replace_maps_ids_and_nothing_else(s in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
                let mut act = |id: &str| IdAction::Replace(f(id));
                let (whole, ids, _) = run_with(&[&s], 1 << 16, &mut act);
                prop_assert!(relayed_as(&reference(&whole), &mapped(reference(&s))));
                let (out, ids2, _) = run_with(&split(&s, &cuts), 1 << 16, &mut act);
                prop_assert_eq!(&out, &whole);
                prop_assert_eq!(&ids2, &ids);
                let bytes: Vec<&[u8]> = s.chunks(1).collect();
                prop_assert_eq!(&run_with(&bytes, 1 << 16, &mut act).0, &whole);
                // Keep changes nothing a client can see.
                let (kept, _, _) = run_with(&split(&s, &cuts), 1 << 16, &mut |_| IdAction::Keep);
                prop_assert!(relayed_as(&reference(&kept), &reference(&s)));
                // An id written into the output is the same as a replacement, in both modes.
                for streaming in [false, true] {
                    let (written, ids3) = run_written(&split(&s, &cuts), streaming, &f);
                    prop_assert!(same_but_the_tail(&whole, &written, streaming));
                    prop_assert_eq!(&ids3, &ids);
                }
            }

            #[test]
            fn a_bounded_retry_changes_only_the_retry_a_client_keeps(s in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
                for streaming in [false, true] {
                    let out = bounded(&split(&s, &cuts), streaming);
                    prop_assert_eq!(&bounded(&s.chunks(1).collect::<Vec<_>>(), streaming), &out);
                    let (got, want) = (reference(&out), reference(&s));
                    prop_assert_eq!(&got.events, &want.events);
                    prop_assert_eq!(&got.last_id, &want.last_id);
                    // Every retry is the replica's or the bound, and the one kept is at most it.
                    prop_assert!(got.retries.iter().all(|r| *r == 50 || want.retries.contains(r)));
                    prop_assert!(got.retries.last().is_none_or(|r| *r <= 50));
                }
            }

            #[test]
            fn output_does_not_depend_on_chunking(s in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8), max_hold in 0usize..40) {
                // Mixed actions and a small hold: overflow, drop and cut must be chunking-independent too.
                let mut act = |id: &str| {
                    if id.contains('q') { IdAction::Cut }
                    else if id.contains('d') { IdAction::DropEvent }
                    else if id.contains('k') { IdAction::Keep }
                    else { IdAction::Replace(f(id)) }
                };
                let (whole, ids, rw) = run_with(&[&s], max_hold, &mut act);
                let (out, ids2, rw2) = run_with(&split(&s, &cuts), max_hold, &mut act);
                prop_assert_eq!(&out, &whole);
                prop_assert_eq!(&ids2, &ids);
                prop_assert_eq!(rw.stats(), rw2.stats());
                prop_assert_eq!(rw.cut_mid_block(), rw2.cut_mid_block());
                let bytes: Vec<&[u8]> = s.chunks(1).collect();
                prop_assert_eq!(&run_with(&bytes, max_hold, &mut act).0, &whole);
                // Each event's content digest: the same in both modes, whatever the chunking
                // and whether its block overflowed, and that of its lines.
                let want = reference_digests(&s);
                for streaming in [false, true] {
                    prop_assert_eq!(&digests(&split(&s, &cuts), max_hold.max(s.len()), streaming), &want);
                    prop_assert_eq!(&digests(&bytes, max_hold.max(s.len()), streaming), &want);
                    let small = digests(&split(&s, &cuts), max_hold, streaming);
                    prop_assert_eq!(&small, &digests(&[&s], max_hold, streaming));
                }
            }

            #[test]
            fn streaming_mode_matches_holding_for_replace_and_keep(s in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8), max_hold in 0usize..40) {
                let mut act = |id: &str| if id.contains('k') { IdAction::Keep } else { IdAction::Replace(f(id)) };
                let (held, ids, _) = run_with(&[&s], 1 << 16, &mut act);
                for chunks in [split(&s, &cuts), s.chunks(1).collect()] {
                    let mut rw = Rewriter::streaming(1 << 16);
                    let mut out = Vec::new();
                    let mut ids2 = Vec::new();
                    let mut cb = |id: &str, _: u64| { ids2.push(id.to_owned()); act(id) };
                    for c in &chunks {
                        rw.push(c, &mut out, &mut cb);
                        // Nothing but an id value (and a possible "i"/"id" prefix) is ever held.
                        prop_assert!(rw.hold.is_empty());
                    }
                    rw.finish(&mut out);
                    prop_assert!(same_but_the_tail(&held, &out, true));
                    prop_assert_eq!(&ids2, &ids);
                    prop_assert_eq!(rw.stats().overflowed_blocks, 0);
                }
                // A small id bound drops long ids the same way in both modes.
                let (held_small, _, _) = run_with(&[&s], max_hold, &mut act);
                let mut rw = Rewriter::streaming(max_hold);
                let mut out = Vec::new();
                for c in split(&s, &cuts) {
                    rw.push(c, &mut out, &mut |id, _| act(id));
                }
                rw.finish(&mut out);
                prop_assert!(relayed_as(&reference(&held_small), &reference(&out)));
            }

            #[test]
            fn every_block_a_client_dispatches_or_takes_an_id_from_is_reported(s in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
                let want: Vec<Option<String>> = reference_blocks(&s)
                    .into_iter()
                    .filter(|(id, data, _)| id.is_some() || *data)
                    .map(|(id, _, _)| id)
                    .collect();
                for streaming in [false, true] {
                    for chunks in [split(&s, &cuts), s.chunks(1).collect()] {
                        let mut rw = if streaming { Rewriter::streaming(1 << 16) } else { Rewriter::new(1 << 16) };
                        let (mut calls, mut out) = (Calls::default(), Vec::new());
                        for c in &chunks {
                            rw.push_with(c, &mut out, &mut calls);
                        }
                        prop_assert_eq!(&calls.0, &want);
                        // Omit takes every id out: a client's last event id is never set.
                        rw.finish(&mut out);
                        prop_assert!(reference(&out).events.iter().all(|e| e.last_id.is_none()));
                    }
                }
            }

            #[test]
            fn a_refused_overflow_cuts_between_blocks_whatever_the_chunking(s in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8), max_hold in 0usize..40) {
                let go = |chunks: &[&[u8]]| {
                    let mut rw = Rewriter::new(max_hold);
                    let (mut calls, mut out) = (Calls::default(), Vec::new());
                    for c in chunks {
                        rw.push_with(c, &mut out, &mut calls);
                    }
                    rw.finish(&mut out);
                    (out, calls.0, calls.1, rw.stats(), rw.is_cut(), rw.cut_mid_block())
                };
                let whole = go(&[&s]);
                prop_assert_eq!(&go(&split(&s, &cuts)), &whole);
                let bytes: Vec<&[u8]> = s.chunks(1).collect();
                prop_assert_eq!(&go(&bytes), &whole);
                let (out, _, asked, stats, cut, mid) = whole;
                prop_assert_eq!(stats.overflow_cuts > 0, cut);
                prop_assert!(!mid);
                prop_assert_eq!(asked.len() as u64, stats.overflowed_blocks + stats.overflow_cuts);
                if cut {
                    // Nothing of the refused block left: the output ends where a block ended.
                    let (events, _) = crate::eventsource::parse(&[&out, b"data: end\n\n"]);
                    prop_assert_eq!(events.last().map(|e| e.data.as_str()), Some("end"));
                }
            }

            #[test]
            fn arbitrary_bytes_never_panic(s in prop::collection::vec(any::<u8>(), 0..200), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8), max_hold in 0usize..64) {
                let (out, _, _) = run_with(&split(&s, &cuts), max_hold, &mut |id: &str| IdAction::Replace(f(id)));
                prop_assert!(out.len() <= s.len() * 8 + 16);
            }
        }
    }
}
