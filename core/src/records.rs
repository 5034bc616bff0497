//! Records to the ownership service: validated, queued per worker, sent in batches from the
//! worker's tick, one batch in flight at a time, so relaying never waits on them.
//!
//! A record path nothing can poison:
//! - every record is checked with [`Record::validate`] before it is queued; an invalid one is
//!   dropped and counted (`records_invalid`), never sent;
//! - event ids of any length are recorded in bounded form ([`recorded_id`]), long ones with
//!   their full id in `long` (up to [`MAX_LONG_ID_BYTES`]);
//! - batches are capped by serialized bytes ([`BATCH_MAX_BYTES`]) and the queue by bytes
//!   ([`QUEUE_MAX_BYTES`]) as well as by `max_queue` records; the oldest go first (`records_dropped`);
//! - a 200 answer counts `applied` as sent and the records it names in `rejected` as rejected
//!   (`records_rejected`); any other 4xx rejects the whole batch; neither is ever resent;
//! - no answer, or a 5xx, puts the batch back at the head (records are idempotent) and retries
//!   it after an exponential backoff with full jitter (`records_failed`).
use crate::config::Config;
use crate::host::{Host, LogLevel, Stat};
use crate::ownership::{
    check_incarnation, check_seq, check_session, digest_hex, post_headers, recorded_id, FieldError,
    LongId, Reason, Record, RecordAck, DIGEST_MARK, MAX_EVENT_ID_BYTES, MAX_LONG_ID_BYTES,
    MAX_RECORDED_EVENT_BYTES, MAX_RECORDS_BODY_BYTES, RECORDS_PATH, REJECTED_FORKED,
    REJECTED_MISMATCH,
};
use std::collections::{HashMap, VecDeque};

/// Serialized bytes one batch carries at most (a single larger record still goes alone); well
/// under the service's [`MAX_RECORDS_BODY_BYTES`].
pub const BATCH_MAX_BYTES: usize = 256 * 1024;
/// Serialized bytes queued per worker at most: a relay faster than the ownership service takes
/// records must not grow the VM's memory without bound.
pub const QUEUE_MAX_BYTES: usize = 8 << 20;
/// An `Events` record grows (by merging, or when built from one chunk) to about this size.
const RECORD_MAX_BYTES: usize = 64 * 1024;
/// How many queued records a new `Events` record looks back through for its incarnation.
const MERGE_LOOKBACK: usize = 64;
/// First retry delay ceiling after a failed batch; doubled per failure up to [`BACKOFF_MAX_MS`].
const BACKOFF_FIRST_MS: u64 = 100;
/// One second: a failing service sees at most about one batch a second per worker, and records
/// queued while the store was away (sessions opened then) land within a second of its return.
const BACKOFF_MAX_MS: u64 = 1_000;
/// What one `long` entry adds besides its id's JSON: `{"seq":<20 digits>,"id":}` and a comma,
/// plus the first entry's `,"long":[]`.
const LONG_ENTRY_OVERHEAD: usize = 48;

/// Bytes of `s` as a JSON string, quotes included (serde_json's escaping).
fn json_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// Appends `s` as a JSON string, quotes included, byte for byte as serde_json writes it, in
/// one pass; says whether `s` held a CR or LF (which an SSE id never does: such an id is
/// recorded by digest instead).
fn push_json_str(out: &mut Vec<u8>, s: &str) -> bool {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let b = s.as_bytes();
    let mut line_break = false;
    let mut start = 0;
    out.push(b'"');
    for (i, &c) in b.iter().enumerate() {
        let short: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        line_break |= c == b'\n' || c == b'\r';
        out.extend_from_slice(b.get(start..i).unwrap_or_default());
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(c >> 4)]);
            out.push(HEX[usize::from(c & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
        start = i + 1;
    }
    out.extend_from_slice(b.get(start..).unwrap_or_default());
    out.push(b'"');
    line_break
}

/// What an `Events` record adds to its session and incarnation strings and its ids:
/// `{"type":"events","session":,"incarnation":,"first_seq":,"ids":[]}`, 20 digits,
/// `,"branch":` with 20 more, and `,"trimmed":` with 20 more.
const EVENTS_FRAME: usize = 65 + 20 + 10 + 20 + 11 + 20;

/// Which stream's branch an `Events` record belongs to.
#[derive(Debug, Clone, Copy)]
pub struct StreamKey<'a> {
    pub session: &'a str,
    pub incarnation: &'a str,
    pub branch: u64,
}

/// A branch the store refused events of: the stream it carries must end with `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overtaken {
    pub incarnation: String,
    pub branch: u64,
    pub reason: Reason,
}

/// An `Events` record as queued: its recorded ids already in JSON, comma-separated, so relaying
/// an event appends to one buffer instead of allocating a `String` (and building, validating
/// and merging a record per chunk). Written out in the wire form of [`Record::Events`].
#[derive(Debug)]
struct EventsBuf {
    session: String,
    incarnation: String,
    /// The relaying branch ([`Record::Events`]`.branch`).
    branch: u64,
    first_seq: u64,
    count: u64,
    ids: Vec<u8>,
    long: Vec<LongId>,
    /// Seqs of this branch right before `first_seq` left out on purpose
    /// ([`Record::Events`]`.trimmed`).
    trimmed: u64,
}

/// Where an [`EventsBuf`] stood before an append, to take it back.
#[derive(Clone, Copy)]
struct Mark {
    ids: usize,
    long: usize,
    count: u64,
}

impl EventsBuf {
    /// Checks what the whole record shares once, when it opens.
    fn open(stream: &StreamKey<'_>, first_seq: u64) -> Result<Self, FieldError> {
        check_session("session", stream.session)?;
        check_incarnation("incarnation", stream.incarnation)?;
        check_seq("first_seq", first_seq)?;
        Ok(EventsBuf {
            session: stream.session.to_owned(),
            incarnation: stream.incarnation.to_owned(),
            branch: stream.branch,
            first_seq,
            count: 0,
            ids: Vec::new(),
            long: Vec::new(),
            trimmed: 0,
        })
    }

    /// Bytes of the record with no ids (an upper bound).
    fn frame_len(&self) -> usize {
        EVENTS_FRAME + json_len(&self.session) + json_len(&self.incarnation)
    }

    fn same_stream(&self, stream: &StreamKey<'_>) -> bool {
        self.incarnation == stream.incarnation
            && self.branch == stream.branch
            && self.session == stream.session
    }

    /// Does seq `seq` of this stream (session, incarnation and branch) continue this record?
    fn continues(&self, stream: &StreamKey<'_>, seq: u64) -> bool {
        self.same_stream(stream) && self.first_seq.checked_add(self.count) == Some(seq)
    }

    /// The lowest seq this record speaks for: its first, or the first it says was trimmed.
    fn low(&self) -> u64 {
        self.first_seq.saturating_sub(self.trimmed)
    }

    fn mark(&self) -> Mark {
        Mark {
            ids: self.ids.len(),
            long: self.long.len(),
            count: self.count,
        }
    }

    fn rollback(&mut self, m: Mark) {
        self.ids.truncate(m.ids);
        self.long.truncate(m.long);
        self.count = m.count;
    }

    /// Appends the next seq's event, and its full id when it has a `long` entry; returns the
    /// bytes it adds to the record (exact for the id, an upper bound for a `long` entry).
    fn append(&mut self, ev: &Entry<'_>) -> Result<usize, FieldError> {
        let seq = self.first_seq.saturating_add(self.count);
        check_seq("first_seq", seq)?;
        let before = self.ids.len();
        if self.count > 0 {
            self.ids.push(b',');
        }
        let full = match *ev {
            Entry::Recorded { recorded, full } => {
                if recorded.len() > MAX_RECORDED_EVENT_BYTES {
                    // Validated before; never send what the service must refuse.
                    self.ids.truncate(before);
                    return Err(FieldError {
                        field: format!("ids[{}]", self.count),
                        detail: format!(
                            "{} bytes, at most {MAX_RECORDED_EVENT_BYTES}",
                            recorded.len()
                        ),
                    });
                }
                push_json_str(&mut self.ids, recorded);
                full
            }
            Entry::Relayed { id, digest } => {
                // The id as it is when it needs no digest form: one pass writes and checks it.
                let at = self.ids.len();
                let plain = id.len() <= MAX_EVENT_ID_BYTES && !id.starts_with(DIGEST_MARK);
                if !plain || push_json_str(&mut self.ids, id) {
                    self.ids.truncate(at);
                    push_json_str(&mut self.ids, &recorded_id(id));
                }
                // Inside the JSON string: an escaped LF, then the hex digits (no allocation).
                self.ids.pop();
                self.ids.extend_from_slice(b"\\n");
                self.ids.extend_from_slice(&digest_hex(digest));
                self.ids.push(b'"');
                (id.len() > MAX_EVENT_ID_BYTES && id.len() <= MAX_LONG_ID_BYTES).then_some(id)
            }
        };
        let mut add = self.ids.len() - before;
        if let Some(id) = full {
            add += json_len(id) + LONG_ENTRY_OVERHEAD;
            self.long.push(LongId {
                seq,
                id: id.to_owned(),
            });
        }
        self.count += 1;
        Ok(add)
    }

    /// The record in its wire form (that of [`Record::Events`], field for field).
    fn write(&self, out: &mut Vec<u8>) -> Result<(), FieldError> {
        out.extend_from_slice(br#"{"type":"events","session":"#);
        push_json_str(out, &self.session);
        out.extend_from_slice(br#","incarnation":"#);
        push_json_str(out, &self.incarnation);
        out.extend_from_slice(br#","first_seq":"#);
        push_u64(out, self.first_seq);
        out.extend_from_slice(br#","ids":["#);
        out.extend_from_slice(&self.ids);
        out.push(b']');
        if !self.long.is_empty() {
            out.extend_from_slice(br#","long":"#);
            write_json(out, &self.long)?;
        }
        if self.branch != 0 {
            out.extend_from_slice(br#","branch":"#);
            push_u64(out, self.branch);
        }
        if self.trimmed != 0 {
            out.extend_from_slice(br#","trimmed":"#);
            push_u64(out, self.trimmed);
        }
        out.push(b'}');
        Ok(())
    }
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        if let Some(d) = digits.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    out.extend_from_slice(digits.get(i..).unwrap_or_default());
}

/// One event for an `Events` record.
#[derive(Clone, Copy)]
enum Entry<'a> {
    /// Already in recorded form (a [`Record::Events`] pushed whole), with its `long` id if any.
    Recorded {
        recorded: &'a str,
        full: Option<&'a str>,
    },
    /// A relayed event: its replica id and content digest, recorded as
    /// [`crate::ownership::recorded_event`] would write them (without allocating), with a
    /// `long` entry when the id needs one.
    Relayed { id: &'a str, digest: u64 },
}

fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) -> Result<(), FieldError> {
    serde_json::to_writer(out, v).map_err(|e| FieldError {
        field: "ids".into(),
        detail: e.to_string(),
    })
}

#[derive(Debug)]
enum Item {
    Events(EventsBuf),
    /// Any other record, already in its wire form.
    Other(Vec<u8>),
}

/// A queued record and an upper bound of its serialized size.
#[derive(Debug)]
struct Queued {
    item: Item,
    bytes: usize,
}

impl Queued {
    fn write(&self, out: &mut Vec<u8>) -> Result<(), FieldError> {
        match &self.item {
            Item::Events(e) => e.write(out),
            Item::Other(r) => {
                out.extend_from_slice(r);
                Ok(())
            }
        }
    }

    fn events(&self) -> Option<&EventsBuf> {
        match &self.item {
            Item::Events(e) => Some(e),
            Item::Other(_) => None,
        }
    }
}

#[derive(Debug, Default)]
pub struct RecordQueue {
    pending: VecDeque<Queued>,
    /// The batch awaiting its answer.
    in_flight: Option<(u32, Vec<Queued>)>,
    cluster: String,
    authority: String,
    /// `authorization` header value of every post, when configured.
    auth: Option<String>,
    timeout_ms: u64,
    max_batch: usize,
    max_queue: usize,
    /// Recorded ids a stream keeps queued (about: whole records go).
    window: u64,
    /// Sum of `bytes` over `pending`.
    queued_bytes: usize,
    /// Consecutive failed batches, for the backoff.
    failures: u32,
    /// No batch is sent before this time (ms since epoch).
    retry_at_ms: u64,
}

impl RecordQueue {
    pub fn new(cfg: &Config) -> RecordQueue {
        let o = &cfg.ownership;
        RecordQueue {
            cluster: o.cluster.clone(),
            authority: o.authority.clone(),
            auth: cfg.ownership_authorization(),
            timeout_ms: o.timeout_ms.max(1000),
            max_batch: o.max_batch,
            max_queue: o.max_queue,
            window: o.record_window as u64,
            ..RecordQueue::default()
        }
    }

    /// Records waiting to be sent.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Serialized bytes waiting (an upper bound).
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Queues a record after checking it; an invalid record is counted and dropped.
    pub fn push<H: Host>(&mut self, host: &mut H, r: Record) {
        if let Err(e) = r.validate() {
            return invalid(host, &e);
        }
        match r {
            Record::Events {
                session,
                incarnation,
                first_seq,
                ids,
                long,
                branch,
                trimmed,
            } => {
                let stream = StreamKey {
                    session: &session,
                    incarnation: &incarnation,
                    branch,
                };
                let mut long = long.into_iter().peekable();
                let mut open = self.find_open(&stream, first_seq);
                if open.is_none() && (trimmed > 0 || ids.is_empty()) {
                    // Its own record, so what it says was trimmed stays with its first seq; one
                    // without ids says its branch's owner answered (events that follow join it).
                    open = self.open_record(&stream, first_seq, trimmed);
                }
                for (i, id) in ids.iter().enumerate() {
                    let seq = first_seq.saturating_add(i as u64);
                    let full = long.next_if(|l| l.seq == seq);
                    let ev = Entry::Recorded {
                        recorded: id,
                        full: full.as_ref().map(|l| l.id.as_str()),
                    };
                    if let Err(e) = self.append(&mut open, &stream, seq, &ev) {
                        invalid(host, &e);
                        break;
                    }
                }
            }
            r => {
                // Room for a typical record at once: growing from empty reallocates ~6 times.
                let mut wire = Vec::with_capacity(512);
                if let Err(e) = write_json(&mut wire, &r) {
                    return invalid(host, &e);
                }
                self.queued_bytes += wire.len();
                self.pending.push_back(Queued {
                    bytes: wire.len(),
                    item: Item::Other(wire),
                });
            }
        }
        self.enforce_bounds(host);
    }

    /// Queues the events a stream relayed: seq `first_seq + i` carried replica id `ids[i].0`
    /// with content digest `ids[i].1`. Events are recorded in bounded form
    /// ([`crate::ownership::recorded_event`]); they join the incarnation's open record while it has
    /// room (one record, and one session and incarnation key on the wire, per stream and
    /// flush, not per chunk), and a new one opens when it has not.
    pub fn push_events<H: Host, S: AsRef<str>>(
        &mut self,
        host: &mut H,
        stream: &StreamKey<'_>,
        first_seq: u64,
        ids: impl IntoIterator<Item = (S, u64)>,
    ) {
        let mut open = self.find_open(stream, first_seq);
        for (i, (id, digest)) in ids.into_iter().enumerate() {
            let seq = first_seq.saturating_add(i as u64);
            let ev = Entry::Relayed {
                id: id.as_ref(),
                digest,
            };
            if let Err(e) = self.append(&mut open, stream, seq, &ev) {
                invalid(host, &e);
                break;
            }
        }
        self.enforce_bounds(host);
    }

    /// The queued record that seq `seq` of this incarnation continues, if any. Streams
    /// interleave, so look back a little; only records of the same incarnation are ordered
    /// with respect to each other.
    fn find_open(&self, stream: &StreamKey<'_>, seq: u64) -> Option<usize> {
        let n = self.pending.len();
        (n.saturating_sub(MERGE_LOOKBACK)..n).rev().find(|&k| {
            self.pending
                .get(k)
                .and_then(Queued::events)
                .is_some_and(|e| e.continues(stream, seq))
        })
    }

    /// Queues a new, empty `Events` record; its index.
    fn open_record(&mut self, stream: &StreamKey<'_>, seq: u64, trimmed: u64) -> Option<usize> {
        let mut e = EventsBuf::open(stream, seq).ok()?;
        e.trimmed = trimmed;
        let bytes = e.frame_len();
        self.queued_bytes += bytes;
        self.pending.push_back(Queued {
            item: Item::Events(e),
            bytes,
        });
        Some(self.pending.len() - 1)
    }

    /// Appends one event to the open record (`open`, an index into `pending`), or to a new
    /// record when there is none or it is full (a single larger id still goes alone). When a
    /// stream's record fills, its records older than its newest `window` ids go.
    fn append(
        &mut self,
        open: &mut Option<usize>,
        stream: &StreamKey<'_>,
        seq: u64,
        ev: &Entry<'_>,
    ) -> Result<(), FieldError> {
        if let Some(q) = open.and_then(|k| self.pending.get_mut(k)) {
            if let Item::Events(e) = &mut q.item {
                let mark = e.mark();
                let add = e.append(ev)?;
                if q.bytes + add <= RECORD_MAX_BYTES || mark.count == 0 {
                    q.bytes += add;
                    self.queued_bytes += add;
                    return Ok(());
                }
                // Full: the event opens the stream's next record.
                e.rollback(mark);
            }
        }
        let full = open.is_some();
        let mut e = EventsBuf::open(stream, seq)?;
        let bytes = e.frame_len() + e.append(ev)?;
        self.queued_bytes += bytes;
        self.pending.push_back(Queued {
            item: Item::Events(e),
            bytes,
        });
        if full {
            self.trim_stream(stream);
        }
        *open = Some(self.pending.len() - 1);
        Ok(())
    }

    /// Keeps about `window` of a stream's newest queued ids: its older queued records go (the
    /// store keeps no more than its window per incarnation anyway, and a cursor older than
    /// that is a `gap` either way), and the oldest record kept says how many seqs before it
    /// were left out (`trimmed`), so the store never waits for them.
    fn trim_stream(&mut self, stream: &StreamKey<'_>) {
        let mut kept = 0u64;
        let mut newest_dropped = None;
        for k in (0..self.pending.len()).rev() {
            let Some(e) = self.pending.get(k).and_then(Queued::events) else {
                continue;
            };
            if !e.same_stream(stream) {
                continue;
            }
            if kept >= self.window {
                newest_dropped = Some(k);
                break;
            }
            kept += e.count;
        }
        let Some(last) = newest_dropped else {
            return;
        };
        let mut low = u64::MAX;
        let mut freed = 0;
        let mut k = 0;
        self.pending.retain(|q| {
            let i = k;
            k += 1;
            match q.events() {
                Some(e) if i <= last && e.same_stream(stream) => {
                    low = low.min(e.low());
                    freed += q.bytes;
                    false
                }
                _ => true,
            }
        });
        self.queued_bytes = self.queued_bytes.saturating_sub(freed);
        let oldest = self.pending.iter_mut().find_map(|q| match &mut q.item {
            Item::Events(e) if e.same_stream(stream) => Some(e),
            _ => None,
        });
        if let Some(e) = oldest {
            e.trimmed = e.trimmed.max(e.first_seq.saturating_sub(low));
        }
    }

    fn over_bounds(&self) -> bool {
        self.pending.len() > self.max_queue || self.queued_bytes > QUEUE_MAX_BYTES
    }

    /// Where a queue over its bounds is brought back to: 1/8 under each, so the pass over the
    /// whole queue runs once per many records at the cap, not once per record.
    fn low_water(&self) -> (usize, usize) {
        (
            self.max_queue - self.max_queue / 8,
            QUEUE_MAX_BYTES - QUEUE_MAX_BYTES / 8,
        )
    }

    /// Brings a queue over `max_queue` records or [`QUEUE_MAX_BYTES`] to its low-water mark: first by leaving
    /// out streams' older ids (an `Events` record with a newer one of its stream queued; that
    /// one says what was trimmed), and only then by dropping the oldest records
    /// (`records_dropped`).
    fn enforce_bounds<H: Host>(&mut self, host: &mut H) {
        if !self.over_bounds() {
            return;
        }
        self.trim_superseded();
        let (max_len, max_bytes) = self.low_water();
        while self.pending.len() > max_len || self.queued_bytes > max_bytes {
            let Some(q) = self.pending.pop_front() else {
                self.queued_bytes = 0;
                break;
            };
            self.queued_bytes = self.queued_bytes.saturating_sub(q.bytes);
            host.count(Stat::RecordsDropped, 1);
        }
    }

    /// Drops `Events` records that a newer record of their stream follows, oldest first, until
    /// the queue is at its low-water mark.
    fn trim_superseded(&mut self) {
        let n = self.pending.len();
        // The next record of each `Events` record's stream.
        let mut next: Vec<Option<usize>> = vec![None; n];
        {
            let mut newest: HashMap<(&str, &str, u64), usize> = HashMap::new();
            for (k, q) in self.pending.iter().enumerate().rev() {
                if let Some(e) = q.events() {
                    let key = (e.session.as_str(), e.incarnation.as_str(), e.branch);
                    if let (Some(slot), Some(&s)) = (next.get_mut(k), newest.get(&key)) {
                        *slot = Some(s);
                    }
                    newest.insert(key, k);
                }
            }
        }
        let mut gone = vec![false; n];
        let (mut len, mut bytes) = (n, self.queued_bytes);
        let (max_len, max_bytes) = self.low_water();
        for k in 0..n {
            if len <= max_len && bytes <= max_bytes {
                break;
            }
            let Some(s) = next.get(k).copied().flatten() else {
                continue;
            };
            let Some((low, freed)) = self
                .pending
                .get(k)
                .and_then(|q| q.events().map(|e| (e.low(), q.bytes)))
            else {
                continue;
            };
            if let Some(Item::Events(e)) = self.pending.get_mut(s).map(|q| &mut q.item) {
                e.trimmed = e.trimmed.max(e.first_seq.saturating_sub(low));
            }
            if let Some(g) = gone.get_mut(k) {
                *g = true;
            }
            len -= 1;
            bytes = bytes.saturating_sub(freed);
        }
        let mut k = 0;
        self.pending.retain(|_| {
            let keep = !gone.get(k).copied().unwrap_or(false);
            k += 1;
            keep
        });
        self.queued_bytes = bytes;
    }

    /// Sends the next batch, unless one is in flight or a retry is not due yet.
    pub fn flush<H: Host>(&mut self, host: &mut H) {
        if self.in_flight.is_some() || self.pending.is_empty() {
            return;
        }
        if self.retry_at_ms > 0 && host.now_ms() < self.retry_at_ms {
            return;
        }
        let mut n = 0;
        let mut bytes = 0;
        for q in self.pending.iter().take(self.max_batch) {
            if n > 0 && bytes + q.bytes > BATCH_MAX_BYTES {
                break;
            }
            bytes += q.bytes;
            n += 1;
        }
        let batch: Vec<Queued> = self.pending.drain(..n).collect();
        self.queued_bytes = self.queued_bytes.saturating_sub(bytes);
        let mut body = Vec::with_capacity(bytes + 16);
        body.extend_from_slice(b"{\"records\":[");
        for (i, q) in batch.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            if q.write(&mut body).is_err() {
                host.count(Stat::RecordsDropped, batch.len() as u64);
                return;
            }
        }
        body.extend_from_slice(b"]}");
        if body.len() > MAX_RECORDS_BODY_BYTES {
            // Cannot happen with the caps above; never send what the service must refuse.
            host.count(Stat::RecordsDropped, batch.len() as u64);
            return;
        }
        let headers = post_headers(RECORDS_PATH, &self.authority, self.auth.as_deref());
        match host.dispatch(&self.cluster, &headers, &body, self.timeout_ms) {
            Some(token) => self.in_flight = Some((token, batch)),
            None => self.failed(host, batch),
        }
    }

    /// The answer to a records post: `status` is `None` when no response headers arrived.
    /// Returns the branches whose events the store refused as overtaken or diverged.
    pub fn on_response<H: Host>(
        &mut self,
        host: &mut H,
        token: u32,
        status: Option<u32>,
        body: Option<&[u8]>,
    ) -> Vec<Overtaken> {
        let mut overtaken = Vec::new();
        let Some((want, batch)) = self.in_flight.take() else {
            return overtaken;
        };
        if want != token {
            self.in_flight = Some((want, batch));
            return overtaken;
        }
        let n = batch.len();
        match status {
            None => self.failed(host, batch),
            Some(s) if s >= 500 => self.failed(host, batch),
            Some(200) => {
                self.failures = 0;
                self.retry_at_ms = 0;
                // A 200 without `rejected` (or one the guard cannot read) applied everything.
                let ack: Option<RecordAck> = body.and_then(|b| serde_json::from_slice(b).ok());
                let mut rejected: Vec<usize> = Vec::new();
                let mut first_error = None;
                for r in ack.iter().flat_map(|a| a.rejected.iter()) {
                    let Some(q) = batch.get(r.index) else {
                        continue;
                    };
                    let reason = match r.error.as_str() {
                        REJECTED_FORKED => Some(Reason::Forked),
                        REJECTED_MISMATCH => Some(Reason::ReplayMismatch),
                        _ => None,
                    };
                    match (reason, &q.item) {
                        // The store's word on a branch, not a bad record: its stream ends.
                        (Some(reason), Item::Events(e)) => overtaken.push(Overtaken {
                            incarnation: e.incarnation.clone(),
                            branch: e.branch,
                            reason,
                        }),
                        _ => {
                            rejected.push(r.index);
                            first_error.get_or_insert(r);
                        }
                    }
                }
                rejected.sort_unstable();
                rejected.dedup();
                let not_applied = rejected.len() + overtaken.len();
                let sent = ack
                    .as_ref()
                    .map_or(n, |a| a.applied.min(n.saturating_sub(not_applied)));
                host.count(Stat::RecordsSent, sent as u64);
                if let Some(r) = first_error {
                    host.count(Stat::RecordsRejected, rejected.len() as u64);
                    host.log(
                        LogLevel::Warn,
                        &format!(
                            "mcp-resume-guard: {} record(s) rejected, e.g. {}: {}",
                            rejected.len(),
                            r.error,
                            r.detail
                        ),
                    );
                }
            }
            Some(s) => {
                // The service read the batch and refused it: resending cannot help.
                self.failures = 0;
                self.retry_at_ms = 0;
                host.count(Stat::RecordsRejected, n as u64);
                host.log(
                    LogLevel::Warn,
                    &format!("mcp-resume-guard: record batch of {n} refused with status {s}"),
                );
            }
        }
        overtaken
    }

    /// Puts a batch that failed in transport back at the head and schedules its retry.
    fn failed<H: Host>(&mut self, host: &mut H, batch: Vec<Queued>) {
        host.count(Stat::RecordsFailed, batch.len() as u64);
        for q in batch.into_iter().rev() {
            self.queued_bytes += q.bytes;
            self.pending.push_front(q);
        }
        self.enforce_bounds(host);
        self.failures = self.failures.saturating_add(1);
        let ceiling = BACKOFF_FIRST_MS
            .saturating_mul(1u64 << self.failures.saturating_sub(1).min(16))
            .min(BACKOFF_MAX_MS);
        // Full jitter: anywhere in [0, ceiling], so guards that failed together spread out.
        let delay = host.random_u64() % (ceiling + 1);
        self.retry_at_ms = host.now_ms().saturating_add(delay).max(1);
    }

    /// When the next batch may go (0: at once); for tests and diagnostics.
    pub fn retry_at_ms(&self) -> u64 {
        self.retry_at_ms
    }
}

/// Counts and logs a record that is not queued.
fn invalid<H: Host>(host: &mut H, e: &FieldError) {
    host.count(Stat::RecordsInvalid, 1);
    host.log(
        LogLevel::Warn,
        &format!("mcp-resume-guard: record not queued: {e}"),
    );
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
