//! One SSE response as the guard relays it: ids rewritten to cursors, replay checked.
use crate::config::Contiguity;
use crate::cursor::{Cursor, DecodedCursor, Keyring};
use crate::ownership::{digest_matches, recorded_id, split_recorded, Reason, StreamKind};
use crate::sse::{IdAction, LeadStrip, OnId, Rewriter};
use serde::Deserialize;
use std::collections::VecDeque;
use xxhash_rust::xxh3::xxh3_64;

/// JSON-RPC method of a replica's contiguity assertion (docs/contiguity-extension.md).
pub const ASSERTION_METHOD: &str = "notifications/mcp-resume-guard/replay";
/// The extension version this guard reads (`params.v`).
pub const ASSERTION_VERSION: u64 = 1;

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
    /// The stream was cut after a control event: the replay diverged from the records, or
    /// the replica's assertion said it cannot replay (`gap`), or none came in `asserted` mode
    /// (`unasserted`). [`StreamState::cut_reason`] says which.
    CutReplayMismatch,
}

/// Per-response state: the SSE rewriter plus the id mapping.
pub struct StreamState {
    rewriter: Rewriter,
    ids: IdMap,
    cut: bool,
    cut_reason: Option<Reason>,
    /// A continuation's head, until its first block says whether the replica asserted
    /// contiguity.
    head: Option<Head>,
    /// A dropped assertion ended in a CR at a chunk's end: an LF next belongs to it.
    skip_lf: bool,
    /// The leading BOM-like marks, removed before the head is read.
    lead: LeadStrip,
}

/// Replica ids relayed, in order, in one buffer: relaying an event allocates nothing.
#[derive(Debug, Default)]
pub struct RelayedIds {
    text: String,
    /// End of each id in `text`, and the event's content digest.
    ends: Vec<(usize, u64)>,
}

/// The most ids a continuation remembers as dispatched (16 bytes each, 4 KiB in all, taken
/// at once with the first).
const SEEN_CAP: usize = 256;

/// A buffer grown past this by long ids is let go once they are recorded.
const RELAYED_KEEP_BYTES: usize = 4096;

impl RelayedIds {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The ids and content digests, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&(end, digest)| {
            let id = self.text.get(start..end).unwrap_or_default();
            start = end;
            (id, digest)
        })
    }

    fn push(&mut self, id: &str, digest: u64) {
        self.text.push_str(id);
        self.ends.push((self.text.len(), digest));
    }

    fn clear(&mut self) {
        if self.text.capacity() > RELAYED_KEEP_BYTES {
            *self = RelayedIds::default();
        } else {
            self.text.clear();
            self.ends.clear();
        }
    }
}

/// Maps each replica event id to a cursor and checks a continuation's replay.
struct IdMap {
    session: [u8; 8],
    incarnation: u64,
    kind: StreamKind,
    next_seq: u64,
    /// Recorded events (id and content digest) the owner must replay next, in order.
    expected: VecDeque<String>,
    /// The cursor's own replica id (a continuation's): that event was dispatched already.
    echo: Option<String>,
    /// Drop the cursor's own event when it comes again (rmcp sends it first); else cut.
    suppress_echo: bool,
    /// The opening request's JSON-RPC id, carried in every cursor of a request stream.
    request_id: Option<String>,
    /// Replica ids relayed since the last `clear_relayed`; their seqs end just before
    /// `next_seq`, so the first one is derived, not stored.
    relayed: RelayedIds,
    rewritten: u64,
    /// Events relayed without a cursor (no id): the client dispatches them under no new id.
    plain: u64,
    /// The seq of the cursor to write for the id just answered with [`IdAction::Write`].
    minted: u64,
    /// A continuation's events the client dispatched (XXH3 of the replica id, content digest):
    /// the cursor's own once seen, and the last [`SEEN_CAP`] relayed. One sent again is dropped
    /// whole (same content) or cut (other content), never dispatched twice.
    seen: VecDeque<(u64, u64)>,
    /// A continuation: repeats are judged (its blocks are held, so one can be dropped whole).
    continuation: bool,
    /// The last id was a reset: a reset cursor written ([`IdMap::on_reset`]) or a dataless
    /// reset dropped ([`IdMap::on_dataless_reset`]).
    last_reset: bool,
}

/// The rewriter's view of a stream: decides at each id, then writes its cursor into the output.
struct Minter<'a> {
    ids: &'a mut IdMap,
    keys: &'a Keyring,
}

impl OnId for Minter<'_> {
    fn on_id(&mut self, id: &str, digest: u64) -> IdAction {
        self.ids.on_id(id, digest)
    }

    fn on_dataless_reset(&mut self, _: u64) -> IdAction {
        self.ids.on_dataless_reset()
    }

    fn write_id(&mut self, id: &str, out: &mut Vec<u8>) {
        self.ids.write_cursor(self.keys, id, out);
    }

    fn on_event_without_id(&mut self) -> IdAction {
        self.ids.on_event_without_id()
    }

    fn may_overflow(&mut self, id: Option<&str>) -> bool {
        self.ids.may_overflow(id)
    }
}

impl StreamState {
    /// A new incarnation: its first event gets seq 1. Nothing is ever dropped or cut on a
    /// fresh stream, so a GET stream's events stream through without being held. A request
    /// stream's blocks are held to their end (up to `max_hold`): one the replica leaves
    /// unfinished is then never out, so the end can still settle the call.
    pub fn fresh(session: [u8; 8], incarnation: u64, kind: StreamKind, max_hold: usize) -> Self {
        let rewriter = match kind {
            StreamKind::Request => Rewriter::new(max_hold),
            StreamKind::Get => Rewriter::streaming(max_hold),
        };
        Self::new(rewriter, session, incarnation, kind)
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
                request_id: None,
                relayed: RelayedIds::default(),
                rewritten: 0,
                plain: 0,
                minted: 0,
                seen: VecDeque::new(),
                continuation: false,
                suppress_echo: false,
                last_reset: false,
            },
            cut: false,
            cut_reason: None,
            head: None,
            skip_lf: false,
            lead: LeadStrip::default(),
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
        s.ids.request_id = cursor.request_id.clone();
        s.ids.continuation = true;
        s.ids.echo = cursor.replica_event_id.clone();
        s.ids.suppress_echo = suppress_echo;
        // An assertion is read in both modes; `with_contiguity` decides what its absence means.
        s.head = Some(Head::new(
            cursor.replica_event_id.clone().unwrap_or_default(),
            Contiguity::Relayed,
            max_hold,
        ));
        s
    }

    /// Carries the opening request's JSON-RPC id(s) (carried text, [`crate::jsonrpc`]) in every
    /// cursor of this stream.
    pub fn with_request_id(mut self, id: Option<String>) -> Self {
        self.ids.request_id = id;
        self
    }

    /// The opening request's JSON-RPC id(s) this stream carries.
    pub fn request_id(&self) -> Option<&str> {
        self.ids.request_id.as_deref()
    }

    /// The stream's kind.
    pub fn kind(&self) -> StreamKind {
        self.ids.kind
    }

    /// What a continuation without the replica's assertion gets (no effect on fresh streams).
    pub fn with_contiguity(mut self, mode: Contiguity) -> Self {
        if let Some(h) = self.head.as_mut() {
            h.mode = mode;
        }
        self
    }

    /// Why the stream was cut, once [`Flow::CutReplayMismatch`] was returned.
    pub fn cut_reason(&self) -> Option<Reason> {
        self.cut_reason
    }

    pub fn incarnation(&self) -> u64 {
        self.ids.incarnation
    }

    /// Rewrite one body chunk into `out`. On a replay mismatch the control event is
    /// appended and everything after is dropped.
    pub fn push(&mut self, keys: &Keyring, chunk: &[u8], out: &mut Vec<u8>) -> Flow {
        if self.cut {
            return self.after(out);
        }
        let (earlier, chunk) = self.lead.strip(chunk);
        self.take(keys, earlier, out);
        self.take(keys, chunk, out);
        self.after(out)
    }

    /// Input with the leading marks removed: to the head while it is undecided, else relayed.
    fn take(&mut self, keys: &Keyring, mut chunk: &[u8], out: &mut Vec<u8>) {
        if chunk.is_empty() {
            return;
        }
        if std::mem::take(&mut self.skip_lf) && chunk.first() == Some(&b'\n') {
            chunk = chunk.get(1..).unwrap_or_default();
        }
        match self.head.take() {
            Some(mut head) => {
                head.buf.extend_from_slice(chunk);
                self.read_head(keys, head, out);
            }
            None => self.feed(keys, chunk, out),
        }
    }

    fn feed(&mut self, keys: &Keyring, bytes: &[u8], out: &mut Vec<u8>) {
        if !self.cut {
            let mut minter = Minter {
                ids: &mut self.ids,
                keys,
            };
            self.rewriter.push_with(bytes, out, &mut minter);
        }
    }

    /// Acts on what the head shows so far; puts the head back while it is undecided.
    fn read_head(&mut self, keys: &Keyring, mut head: Head, out: &mut Vec<u8>) {
        let step = head.scan();
        let buf = std::mem::take(&mut head.buf);
        match step {
            HeadStep::Wait => {
                head.buf = buf;
                self.head = Some(head);
            }
            HeadStep::First { start, end, said } => {
                let (before, rest) = buf.split_at(start.min(buf.len()));
                let after = buf.get(end..).unwrap_or_default();
                match (said, head.mode) {
                    (Said::Complete, _) => {
                        // The assertion itself is the guard's: it never reaches the client.
                        self.skip_lf = after.is_empty() && buf.last() == Some(&b'\r');
                        self.feed(keys, before, out);
                        self.feed(keys, after, out);
                    }
                    (Said::Cannot, _) => {
                        self.feed(keys, before, out);
                        self.cut_with_signal(Reason::Gap, out);
                    }
                    (Said::Invalid | Said::Nothing, Contiguity::Asserted) => {
                        self.feed(keys, before, out);
                        self.cut_with_signal(Reason::Unasserted, out);
                    }
                    (Said::Invalid, Contiguity::Relayed) => {
                        self.skip_lf = after.is_empty() && buf.last() == Some(&b'\r');
                        self.feed(keys, before, out);
                        self.feed(keys, after, out);
                    }
                    (Said::Nothing, Contiguity::Relayed) => {
                        self.feed(keys, before, out);
                        self.feed(keys, rest, out);
                    }
                }
            }
            HeadStep::NoEvent => match head.mode {
                // The first block is larger than `max_hold`: no assertion is.
                Contiguity::Asserted => {
                    self.cut_with_signal(Reason::Unasserted, out);
                }
                Contiguity::Relayed => self.feed(keys, &buf, out),
            },
        }
    }

    /// End of stream: a held, unterminated block is not released (WHATWG and TypeScript discard
    /// it, Python dispatches one ending in CR unchecked), so a control event after it starts on
    /// a line of its own.
    ///
    /// A continuation that ends before relaying a single event while the records hold events
    /// after the cursor did not replay the recorded next event either: it is cut like any other
    /// mismatch, so it is not a silent, empty "resumption". (rmcp answers a stream it no longer
    /// holds, e.g. a finished call's, with an empty 200.) A replay that stops after some of the
    /// recorded events is an ordinary early close and stays open for the next resume.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Flow {
        // A partly matched mark at the very end starts an unterminated block: not released.
        self.lead.finish();
        if let Some(head) = self.head.take() {
            // The head holds at most one unterminated block, which has no id to map.
            if !self.cut {
                match head.mode {
                    Contiguity::Asserted => {
                        self.cut_with_signal(Reason::Unasserted, out);
                    }
                    Contiguity::Relayed => {
                        self.rewriter
                            .push(&head.buf, out, &mut |_, _| IdAction::Keep);
                    }
                }
            }
        }
        let empty_replay = self.ids.rewritten == 0 && !self.ids.expected.is_empty();
        if !self.cut && empty_replay && !self.rewriter.is_cut() {
            // The unterminated block held is not flushed (clients discard it anyway): the
            // control event must start a line of its own, or a client reads it as a message.
            return self.cut_with_signal(Reason::ReplayMismatch, out);
        }
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
            return self.cut_with_signal(Reason::ReplayMismatch, out);
        }
        Flow::Open
    }

    /// A cut inside an over-long block, partly out, closes it first
    /// ([`StreamState::close_block`]), so the control event starts a block of its own.
    fn cut_with_signal(&mut self, reason: Reason, out: &mut Vec<u8>) -> Flow {
        self.cut = true;
        self.cut_reason = Some(reason);
        self.rewriter.close_block(out);
        out.extend_from_slice(control_event(reason).as_bytes());
        Flow::CutReplayMismatch
    }

    /// Closes a block partly out so that no client dispatches it as a message
    /// ([`Rewriter::close_block`]): a control event may follow. False when the output was at
    /// a block boundary already. The stream takes no more input.
    pub fn close_block(&mut self, out: &mut Vec<u8>) -> bool {
        self.rewriter.close_block(out)
    }

    /// Events relayed since the last [`StreamState::clear_relayed`], for the records: (first
    /// seq, replica ids).
    pub fn relayed(&self) -> Option<(u64, &RelayedIds)> {
        let ids = &self.ids.relayed;
        if ids.is_empty() {
            return None;
        }
        let first = self.ids.next_seq.saturating_sub(ids.len() as u64);
        Some((first, ids))
    }

    /// Forgets the relayed ids (they were recorded).
    pub fn clear_relayed(&mut self) {
        self.ids.relayed.clear();
    }

    /// [`StreamState::relayed`] as owned ids and digests, then [`StreamState::clear_relayed`].
    pub fn take_relayed(&mut self) -> Option<(u64, Vec<(String, u64)>)> {
        let taken = self
            .relayed()
            .map(|(first, ids)| (first, ids.iter().map(|(i, d)| (i.to_owned(), d)).collect()));
        self.clear_relayed();
        taken
    }

    /// True when the output so far ends inside an event, so nothing may be appended to it
    /// before [`StreamState::close_block`].
    pub fn output_mid_block(&self) -> bool {
        self.rewriter.output_mid_block()
    }

    /// The replay check still expects recorded events: the owner owes them.
    pub fn owes_replay(&self) -> bool {
        !self.ids.expected.is_empty()
    }

    /// Events rewritten so far.
    pub fn rewritten(&self) -> u64 {
        self.ids.rewritten
    }

    /// Cursors written on blocks with a `data` field: the ones every client holds after the
    /// stream (an id-only block's id is lost to the TypeScript SDK).
    pub fn cursors_kept(&self) -> u64 {
        self.rewriter.stats().ids_kept
    }

    /// The last id is a reset: a reset cursor, which a client that holds it cannot resume from,
    /// or a dataless reset dropped (every client holds the cursor before it, but the replica
    /// named no place to resume after it).
    pub fn ends_on_reset(&self) -> bool {
        self.ids.last_reset
    }

    /// Events relayed so far, with a cursor or without (a block a client may dispatch; an
    /// id-only block counts too: erring towards "something came").
    pub fn relayed_events(&self) -> u64 {
        self.ids.rewritten.saturating_add(self.ids.plain)
    }

    /// Lowers every `retry:` the client gets to at most `max_ms` ([`Rewriter::bound_retry`]).
    pub fn bound_retry(&mut self, max_ms: Option<u64>) {
        self.rewriter.bound_retry(max_ms);
    }

    /// Bytes held by the SSE parser (bounded by `max_hold`).
    pub fn held_bytes(&self) -> usize {
        self.rewriter.held_bytes()
    }
}

/// The start of a continuation, held until its first event with an id.
struct Head {
    /// The replica's own id of the cursor (the `Last-Event-ID` the owner got).
    cursor: String,
    mode: Contiguity,
    max_hold: usize,
    /// Everything received so far: the first block, and what followed it in the last chunk.
    buf: Vec<u8>,
}

enum HeadStep {
    /// The first block is not complete yet.
    Wait,
    /// The first block is `buf[start..end]` (only blank lines before it).
    First {
        start: usize,
        end: usize,
        said: Said,
    },
    /// No complete block within `max_hold` bytes.
    NoEvent,
}

/// What the first block of a continuation says about the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    /// A valid assertion for this cursor: the replay is complete.
    Complete,
    /// A valid assertion for this cursor: the replica cannot replay from it.
    Cannot,
    /// An event of the extension's method that is not a valid assertion for this cursor
    /// (another cursor, unknown version, bad fields). Dropped like an assertion, trusted as none.
    Invalid,
    /// Anything else (an ordinary event, a comment): the replica does not speak the extension.
    Nothing,
}

/// One SSE block's fields that matter here.
#[derive(Default)]
struct Block {
    id: Option<Vec<u8>>,
    event: Vec<u8>,
    data: Vec<u8>,
    data_lines: usize,
}

impl Head {
    fn new(cursor: String, mode: Contiguity, max_hold: usize) -> Head {
        Head {
            cursor,
            mode,
            max_hold,
            buf: Vec::new(),
        }
    }

    /// Reads the first block of `buf` by the WHATWG line rules (blank lines before it are
    /// skipped). A CR at the end of `buf` ends its line at once, as the rewriter does; an LF
    /// after it is then a blank line.
    fn scan(&self) -> HeadStep {
        let buf = self.buf.as_slice();
        // Leading marks were removed before ([`LeadStrip`]).
        let mut at = 0;
        let mut start = at;
        let mut block = Block::default();
        let mut lines = 0;
        while let Some((line, next)) = line_at(buf, at) {
            at = next;
            if !line.is_empty() {
                lines += 1;
                field(&mut block, line);
            } else if lines == 0 {
                start = at;
            } else {
                let said = match block.id {
                    Some(_) => self.judge(&block),
                    None => Said::Nothing,
                };
                return HeadStep::First {
                    start,
                    end: at,
                    said,
                };
            }
        }
        if buf.len() > self.max_hold {
            return HeadStep::NoEvent;
        }
        HeadStep::Wait
    }

    fn judge(&self, block: &Block) -> Said {
        #[derive(Deserialize)]
        struct Message {
            jsonrpc: String,
            method: String,
            params: Option<serde_json::Value>,
        }
        #[derive(Deserialize)]
        struct Params {
            v: u64,
            after: String,
            complete: bool,
        }
        if !(block.event.is_empty() || block.event == b"message") || block.data_lines == 0 {
            return Said::Nothing;
        }
        let Ok(msg) = serde_json::from_slice::<Message>(&block.data) else {
            return Said::Nothing;
        };
        if msg.method != ASSERTION_METHOD {
            return Said::Nothing;
        }
        let params = msg
            .params
            .and_then(|p| serde_json::from_value::<Params>(p).ok());
        let id = block.id.as_deref().unwrap_or_default();
        match params {
            Some(p)
                if msg.jsonrpc == "2.0"
                    && p.v == ASSERTION_VERSION
                    && p.after == self.cursor
                    && id == self.cursor.as_bytes() =>
            {
                if p.complete {
                    Said::Complete
                } else {
                    Said::Cannot
                }
            }
            _ => Said::Invalid,
        }
    }
}

/// The line of `buf` starting at `at` and where the next one starts; None while unterminated.
fn line_at(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let e = memchr::memchr2(b'\r', b'\n', rest)?;
    let crlf = rest.get(e) == Some(&b'\r') && rest.get(e + 1) == Some(&b'\n');
    let line = rest.get(..e)?;
    Some((line, at + e + 1 + usize::from(crlf)))
}

fn field(block: &mut Block, line: &[u8]) {
    if line.first() == Some(&b':') {
        return;
    }
    let (name, value) = match memchr::memchr(b':', line) {
        Some(c) => {
            let v = line.get(c + 1..).unwrap_or_default();
            (
                line.get(..c).unwrap_or_default(),
                v.strip_prefix(b" ").unwrap_or(v),
            )
        }
        None => (line, &b""[..]),
    };
    match name {
        b"id" if !value.contains(&0) => block.id = Some(value.to_vec()),
        b"event" => block.event = value.to_vec(),
        b"data" => {
            if block.data_lines > 0 {
                block.data.push(b'\n');
            }
            block.data.extend_from_slice(value);
            block.data_lines += 1;
        }
        _ => {}
    }
}

impl IdMap {
    fn on_id(&mut self, id: &str, digest: u64) -> IdAction {
        if id.is_empty() {
            return self.on_reset(digest);
        }
        // The records hold ids in recorded form (a digest for long ones).
        let recorded = || recorded_id(id);
        let hash = self.continuation.then(|| xxh3_64(id.as_bytes()));
        if let Some(h) = hash {
            if let Some(&(_, seen_digest)) = self.seen.iter().find(|(s, _)| *s == h) {
                // Dispatched already on this continuation (ids are unique in a session): the
                // same event again is dropped whole; the same id with other data is a reused
                // id, not the next event.
                return match digest == seen_digest {
                    true => IdAction::DropEvent,
                    false => IdAction::Cut,
                };
            }
            let next = self.expected.front().map(|w| split_recorded(w).0);
            if self.echo.as_deref() == Some(id) && next != Some(&*recorded()) {
                // The cursor's own event, dispatched before the resume.
                if !self.suppress_echo {
                    return IdAction::Cut;
                }
                self.remember(h, digest);
                return IdAction::DropEvent;
            }
        }
        if let Some(want) = self.expected.pop_front() {
            // Same id, other data: a replica that reused the id for another event.
            let (want_id, want_digest) = split_recorded(&want);
            if want_id != &*recorded() || !digest_matches(want_digest, digest) {
                return IdAction::Cut;
            }
        }
        self.mint(id, digest);
        if let Some(h) = hash {
            self.remember(h, digest);
        }
        IdAction::Write
    }

    /// A bare `id:` on a block with data resets a WHATWG client's last event id: the replica names no place after
    /// this event, so a client must never resume past it as if from the cursor before (the
    /// replica would replay what it dispatched since). The block gets a reset cursor (its
    /// replica id embedded empty), which the guard refuses at once (`id_reset`). It is
    /// recorded like any event (empty id, content digest), so the seqs stay contiguous and a
    /// replay from an earlier cursor must bring this very event here. The SDKs ignore an
    /// empty id, WHATWG clients reset: the cursor makes them all hold the same.
    fn on_reset(&mut self, digest: u64) -> IdAction {
        if let Some(want) = self.expected.pop_front() {
            // Only the recorded reset itself, same content, is the recorded next event.
            let (want_id, want_digest) = split_recorded(&want);
            if !want_id.is_empty() || !want_digest.is_some_and(|d| digest_matches(Some(d), digest))
            {
                return IdAction::Cut;
            }
        }
        self.mint("", digest);
        self.last_reset = true;
        IdAction::Write
    }

    /// A bare `id:` on a block without data dispatches nothing, so nothing after it could be
    /// dispatched twice; its only effect would be to clear a WHATWG client's last id, which the
    /// SDKs ignore. Its id line is dropped: every client keeps the cursor it had. It is no
    /// recorded event (a replay skips it too), but a request stream whose last id was one
    /// still ends on a reset: the replica names no place to resume after it.
    fn on_dataless_reset(&mut self) -> IdAction {
        self.last_reset = true;
        IdAction::Omit
    }

    /// Numbers the event being relayed (its cursor's seq is `minted`) and keeps it for the records.
    fn mint(&mut self, id: &str, digest: u64) {
        self.minted = self.next_seq;
        self.next_seq = self.minted.saturating_add(1);
        self.relayed.push(id, digest);
        self.rewritten += 1;
        self.last_reset = false;
    }

    /// Past [`SEEN_CAP`] the oldest is forgotten: see docs/sse-model.md.
    fn remember(&mut self, hash: u64, digest: u64) {
        if self.seen.capacity() == 0 {
            // One allocation per continuation, not one per doubling.
            self.seen.reserve_exact(SEEN_CAP);
        }
        if self.seen.len() >= SEEN_CAP {
            self.seen.pop_front();
        }
        self.seen.push_back((hash, digest));
    }

    /// True when `id` was dispatched already on this continuation (the cursor's own included).
    fn repeats(&self, id: &str) -> bool {
        let h = xxh3_64(id.as_bytes());
        self.echo.as_deref() == Some(id) || self.seen.iter().any(|(s, _)| *s == h)
    }

    /// An event without an id cannot be matched with the recorded next event: it is cut while
    /// one is expected; after the replay it is new, and relayed.
    fn on_event_without_id(&mut self) -> IdAction {
        match self.expected.is_empty() {
            true => {
                self.plain += 1;
                IdAction::Keep
            }
            false => IdAction::Cut,
        }
    }

    /// A block too long to hold is checked at its end, but by then its bytes are out: only a
    /// cut can still keep it from being dispatched, and that cut carries no control event. So
    /// it may stream only when nothing but its end can decide against it: no recorded event is
    /// expected (its content could not be compared before it leaves), and it repeats neither
    /// the cursor's event nor one relayed, as far as its id so far says (an id line later in it
    /// still leads to the cut). Otherwise the stream is cut with the control event before the block's first byte.
    fn may_overflow(&self, id: Option<&str>) -> bool {
        // Without an id yet, a block after a suppressed echo's cursor may still be that echo.
        self.expected.is_empty()
            && match id {
                Some(i) => !self.repeats(i),
                None => !(self.suppress_echo && self.echo.is_some()),
            }
    }

    /// The cursor of the event `on_id` just numbered, base64 written straight into `out`.
    fn write_cursor(&self, keys: &Keyring, id: &str, out: &mut Vec<u8>) {
        keys.encode_to(
            &Cursor {
                session: self.session,
                incarnation: self.incarnation,
                kind: self.kind,
                seq: self.minted,
                replica_event_id: Some(id),
                request_id: self.request_id.as_deref(),
            },
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::Key;
    use crate::ownership::recorded_event;
    use crate::sse::content_digest;

    pub(super) fn keys() -> Keyring {
        Keyring::new(
            Key {
                id: 1,
                secret: vec![7; 32],
            },
            vec![],
        )
        .unwrap()
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

    #[test]
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
        let digest = |lines: &[&str]| {
            let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
            content_digest(&lines)
        };
        assert_eq!(
            s.take_relayed(),
            Some((
                1,
                vec![
                    ("e5".to_string(), digest(&["data: a"])),
                    ("e9".to_string(), digest(&["data: b"]))
                ]
            ))
        );
        assert_eq!(s.take_relayed(), None);
        assert_eq!(s.rewritten(), 2);
    }

    fn cursor_at(seq: u64, id: &str) -> DecodedCursor {
        DecodedCursor {
            request_id: None,
            key_id: 1,
            session: [1; 8],
            incarnation: 42,
            kind: StreamKind::Get,
            seq,
            replica_event_id: Some(id.to_string()),
        }
    }

    /// The recorded form of a replica event `id` whose only line is `data: <data>`.
    fn recorded(id: &str, data: &str) -> String {
        let line = format!("data: {data}");
        recorded_event(id, content_digest(&[line.as_bytes()]))
    }

    #[test]
    fn a_replay_that_reuses_the_next_id_for_other_data_is_cut() {
        // A replica whose counter restarted hands out the recorded next id with another event.
        let k = keys();
        let expected = vec![recorded("e8", "8"), recorded("e9", "9")];
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096);
        let (out, flow) = run(&mut s, &k, "id: e8\ndata: not 8\n\nid: e9\ndata: 9\n\n");
        assert_eq!(flow, Flow::CutReplayMismatch);
        assert_eq!(s.cut_reason(), Some(Reason::ReplayMismatch));
        assert!(!out.contains("not 8"), "{out}");
        assert_eq!(out, control_event(Reason::ReplayMismatch));
        // The same events, line ends and field order aside, continue.
        let expected = vec![recorded("e8", "8"), recorded("e9", "9")];
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096);
        let (out, flow) = run(&mut s, &k, "data: 8\r\nid: e8\r\n\r\nid: e9\rdata: 9\r\r");
        assert_eq!(
            (flow, out.matches("id: ").count()),
            (Flow::Open, 2),
            "{out:?}"
        );
        // Records written without a digest are checked by id alone.
        let expected = vec!["e8".to_string()];
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096);
        let (_, flow) = run(&mut s, &k, "id: e8\ndata: anything\n\n");
        assert_eq!(flow, Flow::Open);
        // A malformed digest in the records never matches.
        let expected = vec!["e8\nnot-hex-digits!".to_string()];
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096);
        let (_, flow) = run(&mut s, &k, "id: e8\ndata: 8\n\n");
        assert_eq!(flow, Flow::CutReplayMismatch);
    }

    #[test]
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

    #[test]
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

    #[test]
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
        // An unterminated tail is not flushed before the control event, which would join it.
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected(), true, 4096);
        let (out, _) = run(&mut s, &k, ": ping\n\nx");
        let (end, flow) = finish(&mut s);
        assert_eq!(
            (flow, end),
            (
                Flow::CutReplayMismatch,
                control_event(Reason::ReplayMismatch)
            )
        );
        assert_eq!(out, ": ping\n\n");
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

    /// Feeds `input` to a new `make()` whole and split at every offset, then finishes; the
    /// output must not depend on the split. Returns it and the flow.
    fn relayed_split(make: &dyn Fn() -> StreamState, input: &[u8]) -> (String, Flow) {
        let k = keys();
        let mut whole: Option<(String, Flow)> = None;
        for cut in 0..=input.len() {
            let mut s = make();
            let mut out = Vec::new();
            let (a, b) = input.split_at(cut);
            s.push(&k, a, &mut out);
            s.push(&k, b, &mut out);
            let flow = s.finish(&mut out);
            let got = (String::from_utf8_lossy(&out).into_owned(), flow);
            match &whole {
                None => whole = Some(got),
                Some(w) => assert_eq!(w, &got, "split at {cut}"),
            }
        }
        whole.unwrap()
    }

    /// The data of each event the client model dispatches from `out`.
    fn dispatched(out: &str) -> Vec<String> {
        crate::eventsource::parse(&[out.as_bytes()])
            .0
            .into_iter()
            .map(|d| d.data)
            .collect()
    }

    #[test]
    fn no_event_is_dispatched_twice_on_a_continuation() {
        let ev = |id: &str, data: &str| format!("id: {id}\ndata: {data}\n\n");
        let (g1, g2, g3, g4) = (ev("g1", "1"), ev("g2", "2"), ev("g3", "3"), ev("g4", "4"));
        // The replay, then its first event again (red team 2, dupreplay).
        let make = || {
            let expected = vec![recorded("g2", "2"), recorded("g3", "3")];
            StreamState::continuation(&cursor_at(1, "g1"), expected, true, 4096)
        };
        let (out, flow) = relayed_split(&make, format!("{g2}{g3}{g2}{g4}").as_bytes());
        assert_eq!(
            (flow, dispatched(&out)),
            (Flow::Open, vec!["2".into(), "3".into(), "4".into()])
        );
        // At the head: the cursor's own event twice (red team 2, echo2), and once more later.
        let make = || StreamState::continuation(&cursor_at(3, "g3"), vec![], true, 4096);
        let (out, flow) = relayed_split(&make, format!("{g3}{g3}{g4}{g3}{g4}").as_bytes());
        assert_eq!(
            (flow, dispatched(&out)),
            (Flow::Open, vec!["4".to_string()])
        );
        // The same id with other data, after the echo or after it was relayed: cut.
        let again = |id: &str| format!("id: {id}\ndata: other\n\n");
        for input in [
            format!("{g3}{}", again("g3")),
            format!("{g4}{}", again("g4")),
        ] {
            let (out, flow) = relayed_split(&make, input.as_bytes());
            assert_eq!(flow, Flow::CutReplayMismatch, "{input:?}");
            assert!(
                !out.contains("other") && out.ends_with(&control_event(Reason::ReplayMismatch))
            );
        }
        // Without echo suppression the cursor's own event is cut, never relayed anew.
        let make = || StreamState::continuation(&cursor_at(3, "g3"), vec![], false, 4096);
        let (out, flow) = relayed_split(&make, format!("{g4}{g3}").as_bytes());
        assert_eq!(flow, Flow::CutReplayMismatch);
        assert_eq!(
            out,
            format!(
                "data: 4\nid: {}\n\n{}",
                ids_of(&out)[0],
                control_event(Reason::ReplayMismatch)
            )
        );
        // A fresh stream checks nothing: ids are the replica's business there.
        let make = || StreamState::fresh([1; 8], 1, StreamKind::Get, 4096);
        let (out, _) = relayed_split(&make, format!("{g1}{g1}").as_bytes());
        assert_eq!(dispatched(&out).len(), 2);
    }

    #[test]
    fn a_continuation_remembers_the_last_relayed_ids_up_to_the_cap() {
        let k = keys();
        let mut s = StreamState::continuation(&cursor_at(0, "c"), vec![], true, 4096);
        let mut out = Vec::new();
        for i in 0..=SEEN_CAP {
            s.push(&k, format!("id: e{i}\ndata: {i}\n\n").as_bytes(), &mut out);
        }
        let (more, flow) = run(&mut s, &k, "id: e1\ndata: 1\n\nid: e0\ndata: 0\n\n");
        // e1 is still remembered and dropped; e0, the oldest, was let go (docs/sse-model.md).
        assert_eq!(
            (flow, dispatched(&more)),
            (Flow::Open, vec!["0".to_string()])
        );
        assert!(s.ids.seen.len() <= SEEN_CAP);
    }

    #[test]
    fn an_unterminated_last_block_is_never_released() {
        // Red team 2, partialcr: Python would dispatch a final block ending in CR.
        let make = || {
            let expected = vec![recorded("g2", "2"), recorded("g3", "3")];
            StreamState::continuation(&cursor_at(1, "g1"), expected, true, 4096)
        };
        let (out, flow) = relayed_split(&make, b"id: g2\ndata: 2\n\ndata: FOREIGN g3\r");
        assert_eq!(flow, Flow::Open);
        assert!(!out.contains("FOREIGN") && out.ends_with("\n\n"), "{out:?}");
        // Red team 2, partialline: what the exchange appends then starts on a line of its own.
        let make = || StreamState::continuation(&cursor_at(1, "g1"), vec![], true, 4096);
        for tail in [
            "event: message\ndata: partial",
            "data: partial\r",
            "\u{feff}",
        ] {
            let (out, flow) = relayed_split(&make, tail.as_bytes());
            assert_eq!((flow, out.as_str()), (Flow::Open, ""), "{tail:?}");
        }
        let mut s = make();
        let mut out = Vec::new();
        s.push(&keys(), b"event: message\ndata: partial", &mut out);
        s.finish(&mut out);
        assert!(!s.output_mid_block());
    }

    #[test]
    fn leading_bom_like_marks_are_removed_so_every_reader_sees_the_first_field() {
        // Red team 2, ts-bom2 / ts-mojibom: TypeScript strips two marks, Python none, WHATWG one.
        let make = || {
            let expected = vec![recorded("g2", "2")];
            StreamState::continuation(&cursor_at(1, "g1"), expected, true, 4096)
        };
        for lead in [
            "\u{feff}\u{feff}",
            "\u{ef}\u{bb}\u{bf}",
            "\u{feff}\u{ef}\u{bb}\u{bf}",
        ] {
            let input = format!("{lead}data: FOREIGN g2\n\n");
            let (out, flow) = relayed_split(&make, input.as_bytes());
            assert_eq!(flow, Flow::CutReplayMismatch, "{lead:?}");
            assert_eq!(out, control_event(Reason::ReplayMismatch), "{lead:?}");
            // The honest replay behind the same marks continues.
            let input = format!("{lead}id: g2\ndata: 2\n\n");
            let (out, flow) = relayed_split(&make, input.as_bytes());
            assert_eq!(
                (flow, dispatched(&out)),
                (Flow::Open, vec!["2".to_string()])
            );
        }
        // Red team 2, tscall-mojiprog: a fresh stream's first id is a cursor too.
        let k = keys();
        let make = || StreamState::fresh([1; 8], 1, StreamKind::Request, 4096);
        let (out, _) = relayed_split(
            &make,
            "\u{ef}\u{bb}\u{bf}id: r1\ndata: progress\n\n".as_bytes(),
        );
        let ids = ids_of(&out);
        assert_eq!(ids.len(), 1, "{out:?}");
        assert!(
            k.decode(&ids[0]).is_ok() && out.starts_with("data: progress"),
            "{out:?}"
        );
    }

    #[test]
    fn echo_is_kept_when_it_is_the_expected_next_event() {
        let k = keys();
        // Same replica id reused: only a mismatch with the records decides.
        let mut s =
            StreamState::continuation(&cursor_at(7, "x"), vec!["x".to_string()], true, 4096);
        let (out, flow) = run(&mut s, &k, "id: x\ndata: 8\n\n");
        assert_eq!(flow, Flow::Open);
        assert_eq!(ids_of(&out).len(), 1);
    }

    #[test]
    fn an_empty_id_gets_a_reset_cursor_recorded_with_its_content() {
        let k = keys();
        let replica = |out: &str| -> Vec<(u64, Option<String>)> {
            ids_of(out)
                .iter()
                .filter_map(|i| k.decode(i).ok())
                .map(|c| (c.seq, c.replica_event_id))
                .collect()
        };
        let reset = |seq| (seq, Some(String::new()));
        let mut s = StreamState::fresh([1; 8], 1, StreamKind::Request, 4096);
        let (out, _) = run(&mut s, &k, "id: e1\ndata: a\n\nid:\ndata: b\n\n");
        assert_eq!(replica(&out), [(1, Some("e1".into())), reset(2)], "{out:?}");
        assert!(!out.contains("id: \n") && !out.contains("id:\n"), "{out:?}");
        assert!(s.ends_on_reset());
        // Recorded with an empty id, so the seqs stay contiguous.
        let b = content_digest(&[b"data: b"]);
        assert_eq!(
            s.take_relayed().map(|(f, r)| (f, r[1].clone())),
            Some((1, ("".into(), b)))
        );
        // A real id clears the flag.
        let (out, _) = run(&mut s, &k, "id: e3\ndata: c\n\n");
        assert_eq!(replica(&out), [(3, Some("e3".into()))], "{out:?}");
        assert!(!s.ends_on_reset());
        assert_eq!(s.rewritten(), 3);
        // After a continuation's replay too.
        let expected = vec!["e8".to_string()];
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096);
        let (out, flow) = run(&mut s, &k, "id: e8\ndata: 8\n\nid:\ndata: new\n\n");
        assert_eq!(flow, Flow::Open, "{out:?}");
        assert_eq!(replica(&out), [(8, Some("e8".into())), reset(9)], "{out:?}");
        // And as the first event of a continuation with nothing recorded after the cursor.
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), vec![], true, 4096);
        let (out, flow) = run(&mut s, &k, "id:\ndata: new\n\n");
        assert_eq!(
            (flow, replica(&out)),
            (Flow::Open, vec![reset(8)]),
            "{out:?}"
        );
    }

    #[test]
    fn a_dataless_reset_is_dropped_and_no_event() {
        // A bare id on a block without data (`id`, `id:`, with an event name or a comment)
        // dispatches nothing: no reset cursor, no seq, nothing recorded, every client keeps its
        // cursor. The stream still ends on a reset (the replica names no place after it).
        let k = keys();
        for block in ["id\n\n", "id:\n\n", "event: x\nid:\n\n", ": c\nid:\r\n\r\n"] {
            let mut s = StreamState::fresh([1; 8], 1, StreamKind::Request, 4096);
            let (out, _) = run(&mut s, &k, &format!("id: e1\ndata: a\n\n{block}"));
            assert_eq!(ids_of(&out).len(), 1, "{block:?}: {out:?}");
            assert!(!out.contains("id:\n") && !out.contains("id\n"), "{out:?}");
            assert_eq!(s.rewritten(), 1, "{block:?}");
            assert!(s.ends_on_reset(), "{block:?}");
            assert_eq!(s.take_relayed().map(|(_, r)| r.len()), Some(1));
            // A continuation answered with only one relays no id at all.
            let mut s = StreamState::continuation(&cursor_at(7, "e7"), vec![], true, 4096);
            let (out, flow) = run(&mut s, &k, block);
            assert_eq!(flow, Flow::Open, "{out:?}");
            assert!(ids_of(&out).is_empty(), "{block:?}: {out:?}");
            assert_eq!(s.rewritten(), 0);
            // Inside a replay it is skipped: the recorded next event still comes next.
            let expected = vec![recorded("e8", "8")];
            let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096);
            let (out, flow) = run(&mut s, &k, &format!("{block}id: e8\ndata: 8\n\n"));
            assert_eq!(flow, Flow::Open, "{block:?}: {out:?}");
            assert_eq!(ids_of(&out).len(), 1, "{out:?}");
            assert!(!s.owes_replay());
        }
    }

    #[test]
    fn a_recorded_reset_replays_only_as_itself() {
        let k = keys();
        let line = "data: b";
        let digest = content_digest(&[line.as_bytes()]);
        let expected = || vec![recorded_event("", digest), recorded_event("e9", 1)];
        // The same event (a bare id, the same content) is the recorded next one.
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), expected(), true, 4096);
        let (out, flow) = run(&mut s, &k, &format!("id:\n{line}\n\n"));
        assert_eq!(flow, Flow::Open, "{out:?}");
        let c = ids_of(&out).first().and_then(|i| k.decode(i).ok());
        assert_eq!(
            c.map(|c| (c.seq, c.replica_event_id)),
            Some((8, Some(String::new())))
        );
        // Other content, a real id in its place, or a recorded reset without its digest: cut.
        for (input, recorded) in [
            ("id:\ndata: other\n\n", expected()),
            ("id: x\ndata: b\n\n", expected()),
            ("id:\ndata: b\n\n", vec![String::new()]),
        ] {
            let mut s = StreamState::continuation(&cursor_at(7, "e7"), recorded, true, 4096);
            let (out, flow) = run(&mut s, &k, input);
            assert_eq!(flow, Flow::CutReplayMismatch, "{input:?}");
            assert!(ids_of(&out).is_empty(), "{out:?}");
        }
    }

    fn assertion(after: &str, complete: bool) -> String {
        format!(
            "event: message\nid: {after}\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"{ASSERTION_METHOD}\",\"params\":{{\"v\":1,\"after\":\"{after}\",\"complete\":{complete},\"count\":2}}}}\n\n"
        )
    }

    fn continued(mode: Contiguity) -> StreamState {
        let expected = vec!["e8".to_string()];
        StreamState::continuation(&cursor_at(7, "e7"), expected, true, 4096).with_contiguity(mode)
    }

    /// Feeds `input` split at `cut` (and once whole), then finishes; output and flow must not
    /// depend on the split.
    fn run_split(mode: Contiguity, input: &str) -> (String, Flow, Option<Reason>) {
        let k = keys();
        let mut whole: Option<(String, Flow, Option<Reason>)> = None;
        for cut in 0..=input.len() {
            let mut s = continued(mode);
            let mut out = Vec::new();
            s.push(&k, &input.as_bytes()[..cut], &mut out);
            s.push(&k, &input.as_bytes()[cut..], &mut out);
            let flow = s.finish(&mut out);
            // Cursors differ only by nothing: same key, same seqs, so the text is comparable.
            let got = (
                String::from_utf8_lossy(&out).into_owned(),
                flow,
                s.cut_reason(),
            );
            match &whole {
                None => whole = Some(got),
                Some(w) => assert_eq!(w, &got, "split at {cut}"),
            }
        }
        whole.unwrap()
    }

    #[test]
    fn a_complete_assertion_is_dropped_and_the_replay_continues_in_both_modes() {
        let k = keys();
        for mode in [Contiguity::Relayed, Contiguity::Asserted] {
            let input = format!(
                "\n{}id: e8\ndata: 8\n\nid: e9\ndata: 9\n\n",
                assertion("e7", true)
            );
            let (out, flow, reason) = run_split(mode, &input);
            assert_eq!((flow, reason), (Flow::Open, None), "{mode:?}");
            assert!(
                !out.contains(ASSERTION_METHOD),
                "never reaches the client: {out}"
            );
            assert!(
                out.starts_with('\n'),
                "a blank line before it passes: {out:?}"
            );
            let seqs: Vec<u64> = ids_of(&out)
                .iter()
                .filter_map(|i| k.decode(i).ok())
                .map(|c| c.seq)
                .collect();
            assert_eq!(seqs, vec![8, 9]);
        }
    }

    #[test]
    fn a_replica_that_cannot_replay_yields_gap_before_anything_in_both_modes() {
        for mode in [Contiguity::Relayed, Contiguity::Asserted] {
            let input = format!("{}id: e1\ndata: other stream\n\n", assertion("e7", false));
            let (out, flow, reason) = run_split(mode, &input);
            assert_eq!((flow, reason), (Flow::CutReplayMismatch, Some(Reason::Gap)));
            assert_eq!(out, control_event(Reason::Gap), "{mode:?}");
        }
    }

    #[test]
    fn without_an_assertion_asserted_mode_says_unasserted_before_any_event() {
        let input = "retry: 100\n\nid: e8\ndata: 8\n\nid: e9\ndata: 9\n\n";
        let (out, flow, reason) = run_split(Contiguity::Asserted, input);
        assert_eq!(
            (flow, reason),
            (Flow::CutReplayMismatch, Some(Reason::Unasserted))
        );
        assert_eq!(out, control_event(Reason::Unasserted));
        // The assertion must be the first block: after a comment it is none.
        let late = format!(": ping\n\n{}id: e8\ndata: 8\n\n", assertion("e7", true));
        let (out, _, reason) = run_split(Contiguity::Asserted, &late);
        assert_eq!(
            (out, reason),
            (control_event(Reason::Unasserted), Some(Reason::Unasserted))
        );
        // The same replay in relayed mode is today's evidence: it matches the records.
        let (out, flow, _) = run_split(Contiguity::Relayed, input);
        assert_eq!((flow, ids_of(&out).len()), (Flow::Open, 2));
        // An empty continuation carries no assertion either.
        let (out, flow, reason) = run_split(Contiguity::Asserted, ": ping\n\n");
        assert_eq!(
            (flow, reason),
            (Flow::CutReplayMismatch, Some(Reason::Unasserted))
        );
        assert!(out.ends_with(&control_event(Reason::Unasserted)));
        // An unterminated block at the end is no assertion.
        let (out, _, reason) = run_split(Contiguity::Asserted, "id: e8\ndata: 8");
        assert_eq!(
            (out, reason),
            (control_event(Reason::Unasserted), Some(Reason::Unasserted))
        );
    }

    #[test]
    fn an_invalid_assertion_is_dropped_and_counts_as_none() {
        let wrong_cursor = assertion("e6", true);
        let v2 = assertion("e7", true).replace("\"v\":1", "\"v\":2");
        let no_complete = assertion("e7", true).replace(",\"complete\":true", "");
        let other_id = assertion("e7", true).replace("id: e7", "id: e5");
        for bad in [wrong_cursor, v2, no_complete, other_id] {
            let input = format!("{bad}id: e8\ndata: 8\n\n");
            let (out, flow, _) = run_split(Contiguity::Relayed, &input);
            assert_eq!((flow, ids_of(&out).len()), (Flow::Open, 1), "{bad}");
            assert!(!out.contains(ASSERTION_METHOD));
            let (out, _, reason) = run_split(Contiguity::Asserted, &input);
            assert_eq!(reason, Some(Reason::Unasserted), "{bad}");
            assert!(!out.contains(ASSERTION_METHOD) && !out.contains("data: 8"));
        }
    }

    #[test]
    fn line_ends_bom_and_multi_line_data_are_read_like_the_rewriter_reads_them() {
        let a = assertion("e7", true);
        let crlf = a.replace('\n', "\r\n");
        let cr = a.replace('\n', "\r");
        let split_data = a.replace("data: {", "data: {\ndata: ");
        for head in [crlf, cr, format!("\u{feff}{a}"), split_data] {
            let input = format!("{head}id: e8\ndata: 8\n\n");
            let (out, flow, reason) = run_split(Contiguity::Asserted, &input);
            assert_eq!((flow, reason), (Flow::Open, None), "{head:?}");
            assert_eq!(ids_of(&out).len(), 1, "{out:?}");
            assert!(!out.contains(ASSERTION_METHOD));
        }
    }

    #[test]
    fn a_head_larger_than_max_hold_without_an_event_is_no_assertion() {
        let k = keys();
        let big = format!("data: {}\n", "x".repeat(5000));
        let mut s = continued(Contiguity::Asserted);
        let mut out = Vec::new();
        assert_eq!(
            s.push(&k, big.as_bytes(), &mut out),
            Flow::CutReplayMismatch
        );
        assert_eq!(s.cut_reason(), Some(Reason::Unasserted));
        assert_eq!(
            String::from_utf8_lossy(&out),
            control_event(Reason::Unasserted)
        );
        // Relayed: a block too long to hold while a recorded event is expected is cut before it.
        let mut s = continued(Contiguity::Relayed);
        let mut out = Vec::new();
        assert_eq!(
            s.push(&k, big.as_bytes(), &mut out),
            Flow::CutReplayMismatch
        );
        assert_eq!(s.cut_reason(), Some(Reason::ReplayMismatch));
        assert_eq!(out, control_event(Reason::ReplayMismatch).as_bytes());
        // With nothing expected and no echo to look for it streams through.
        let mut s = StreamState::continuation(&cursor_at(7, "e7"), vec![], false, 4096);
        let mut out = Vec::new();
        assert_eq!(s.push(&k, big.as_bytes(), &mut out), Flow::Open);
        assert!(out.len() >= big.len(), "streams through");
    }

    #[test]
    fn fresh_streams_never_look_for_an_assertion() {
        let k = keys();
        let mut s = StreamState::fresh([1; 8], 1, StreamKind::Get, 4096)
            .with_contiguity(Contiguity::Asserted);
        let (out, flow) = run(&mut s, &k, &assertion("e7", false));
        assert_eq!((flow, ids_of(&out).len()), (Flow::Open, 1));
        assert_eq!(finish(&mut s).1, Flow::Open);
    }
}

#[cfg(test)]
#[path = "stream_client_tests.rs"]
mod client_tests;
