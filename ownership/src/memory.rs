//! The embedded store: plain maps behind one mutex. Atomicity comes from the lock; no await
//! happens while it is held, so a std mutex is the right tool.
//!
//! Bounded globally, and defended rather than merely capped:
//! - records for a session never opened (`session_open` not applied) go to a separate, small
//!   pending area (`max_pending_sessions`, dropped after `pending_ttl_ms`), so made-up session
//!   ids never count against, or evict, opened sessions;
//! - a `session_open` finding `max_sessions` opened sessions (or the bytes above the high
//!   water mark) first frees sessions idle past their TTL, and is refused (`store_full`) if
//!   that is not enough: a session active within the TTL is never evicted to make room;
//! - past `max_bytes` (an estimate: string lengths plus a fixed overhead per entry), pending
//!   entries go first, then the least recently active sessions; their cursors read as
//!   `session_inactive`, never as a wrong continuation.
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use mcp_resume_core::decision::{IncarnationFacts, SessionState};
use mcp_resume_core::ownership::{
    split_recorded, Record, SessionEnd, StreamKind, LONG_IDS_KEPT, REJECTED_FORKED,
    REJECTED_MISMATCH,
};
use tokio::sync::watch;

use crate::store::{
    Applied, BranchOpen, CursorId, Facts, IncarnationView, Limits, Refusal, SnapshotQuery, Store,
    StoreError, StoreStats, ABANDONED_KEPT, BRANCHES_KEPT, HIGH_WATER_PERCENT,
    REGISTRATION_GRACE_MS, STORE_FULL,
};

/// A record the store did not apply: the named problem and its detail.
type Refused = (&'static str, String);

pub struct MemoryStore {
    limits: Limits,
    inner: Mutex<Inner>,
    changes: watch::Sender<u64>,
}

#[derive(Default)]
struct Inner {
    /// Opened sessions (a `session_open` applied).
    sessions: HashMap<String, Session>,
    /// Sessions with records but no `session_open` yet; `last_used_ms` is when they appeared.
    pending: HashMap<String, Session>,
    /// (appeared ms, session) of `pending`: oldest first.
    pending_lru: BTreeSet<(u64, String)>,
    /// When a write was last refused (`store_full`): unknown sessions may be refused ones.
    last_refused: Option<u64>,
    /// OwnerGone bumps an address's epoch; an incarnation remembers the epoch it opened in,
    /// so "owned until now" is one comparison, whatever the number of incarnations. An epoch
    /// is `max(previous + 1, now_ms)`, so it stays increasing across expiry (see `sweep`).
    owner_epochs: HashMap<String, u64>,
    /// (last used ms, session): least recently active first.
    lru: BTreeSet<(u64, String)>,
    /// Estimated bytes of all sessions, pending ones included.
    bytes: usize,
    /// Sessions evicted by the caps so far.
    evicted: u64,
    /// Logical clock for least-recently-recorded eviction (wall clocks tie and go backwards).
    tick: u64,
}

struct Session {
    state: SessionState,
    #[allow(dead_code)] // kept for operators and a later protocol-aware policy
    version: Option<String>,
    last_used_ms: u64,
    /// (order, incarnation) of the newest standalone GET stream. Kept on the session, not
    /// on incarnations, so supersession survives eviction and out-of-order StreamOpens.
    current_get: Option<(u64, String)>,
    incarnations: HashMap<String, Incarnation>,
}

#[derive(Default)]
struct Incarnation {
    /// `None` while only Events/StreamLost have landed (a placeholder).
    opened: Option<Opened>,
    lost: bool,
    /// Store times of the first and the latest `owner_failed` since the owner last answered
    /// for the stream (events recorded, or a continuation's clean end).
    failed: Option<(u64, u64)>,
    head: u64,
    window: BTreeMap<u64, String>,
    /// seq -> full replica id, for the newest LONG_IDS_KEPT seqs whose id was long.
    long: BTreeMap<u64, String>,
    last_tick: u64,
    /// Estimated bytes of `window` and `long`.
    entry_bytes: usize,
    /// Its branches, once a continuation registered one (`None`: nothing to arbitrate).
    branches: Option<Branches>,
    /// The highest `first_seq` of `events` that said the seqs before it were trimmed.
    trimmed_below: u64,
    /// (registration, store ms) of `abandoned` records that came before their registration,
    /// oldest first: at most [`ABANDONED_KEPT`], none older than [`REGISTRATION_GRACE_MS`].
    abandoned: VecDeque<(String, u64)>,
}

/// The branches of one incarnation (docs/forks.md): branch 0 (the first response) and at most
/// [`BRANCHES_KEPT`] continuations (see [`Branches::prune`]).
struct Branches {
    /// The highest number handed out.
    top: u64,
    /// The branch whose events were recorded last.
    writer: Option<u64>,
    kept: BTreeMap<u64, Branch>,
}

struct Branch {
    open: bool,
    /// Overtaken: the guard cuts it, and its later events are refused too.
    cut: bool,
    /// Store order (the tick) of its first accepted events; branch 0 relayed from the start (0).
    first: Option<u64>,
    /// Store order of its latest accepted events.
    latest: Option<u64>,
    /// Store time of its latest accepted events (records only land after they happened, so a
    /// branch whose latest landed before another was registered was fed before that one began).
    latest_ms: Option<u64>,
    /// When it was registered (store time; 0: branch 0, or back in the table by relaying).
    registered_ms: u64,
    /// The guard's token for the resume that registered it (`ResumeQuery.registration`).
    registration: Option<String>,
}

impl Branches {
    /// A new table: branch 0, the incarnation's first response, open and relaying from the start.
    fn new() -> Self {
        let zero = Branch {
            open: true,
            cut: false,
            first: Some(0),
            latest: None,
            latest_ms: None,
            registered_ms: 0,
            registration: None,
        };
        Branches {
            top: 0,
            writer: None,
            kept: BTreeMap::from([(0, zero)]),
        }
    }

    /// Register the next branch, within the table's bound (see [`Branches::prune`]): open,
    /// or ended at once when its resume was already abandoned (`born_ended`).
    fn open_next(&mut self, now_ms: u64, registration: Option<&str>, born_ended: bool) -> u64 {
        self.top += 1;
        let b = Branch {
            open: !born_ended,
            cut: false,
            first: None,
            latest: None,
            latest_ms: None,
            registered_ms: now_ms,
            registration: registration.map(str::to_owned),
        };
        self.kept.insert(self.top, b);
        self.prune(self.top);
        self.top
    }

    /// Keep at most [`BRANCHES_KEPT`] continuations (branch 0 always stays, and `keep`): the
    /// first to go are ended ones, then open ones that never relayed (a registration whose
    /// answer nobody used, e.g. a retry its client dropped), then the oldest. A branch that
    /// relays after it went is followed as one that starts relaying then.
    fn prune(&mut self, keep: u64) {
        while self.kept.len() > 1 + BRANCHES_KEPT as usize {
            let victim = self
                .kept
                .iter()
                .filter(|(g, _)| **g >= 1 && **g != keep)
                .min_by_key(|(g, b)| (b.prune_class(), **g))
                .map(|(g, _)| *g);
            match victim {
                Some(v) => {
                    self.kept.remove(&v);
                }
                None => break,
            }
        }
    }

    /// Are branch `g`'s events refused: another open, newer branch relayed after `g` started,
    /// or `g` was cut? A branch's first events never are, an ended branch's never are, nor
    /// those of a branch the table no longer lists (it starts relaying now).
    fn overtaken(&self, g: u64) -> bool {
        match self.kept.get(&g) {
            None => false,
            Some(Branch { cut: true, .. }) => true,
            Some(Branch {
                open: true,
                first: Some(first),
                ..
            }) => self
                .kept
                .range(g.saturating_add(1)..)
                .any(|(_, h)| h.open && h.latest.is_some_and(|l| l > *first)),
            Some(_) => false,
        }
    }

    /// Branch `g`'s events were accepted at store order `tick`, store time `now_ms` (`wrote`:
    /// with ids; without, its owner answered it: a continuation's response opened). It relays
    /// from then: an ended branch keeps its order; a handed-out branch the table no longer
    /// lists comes back, open.
    fn relayed(&mut self, g: u64, tick: u64, wrote: bool, now_ms: u64) {
        if wrote {
            self.writer = Some(g);
        }
        if (1..=self.top).contains(&g) && !self.kept.contains_key(&g) {
            let b = Branch {
                open: true,
                cut: false,
                first: None,
                latest: None,
                latest_ms: None,
                registered_ms: 0,
                registration: None,
            };
            self.kept.insert(g, b);
            self.prune(g);
        }
        if let Some(b) = self.kept.get_mut(&g).filter(|b| b.open) {
            b.first.get_or_insert(tick);
            b.latest = Some(tick);
            b.latest_ms = Some(now_ms);
        }
    }

    /// Mark `g` ended; would it be answered `forked` ([`Branches::would_fork`])?
    ///
    /// `told`: the guard asks at the branch's end and tells its client `forked` on a yes: that
    /// branch lost a fork, so it is cut (its records give way to the survivor's, see `arbitrate`).
    fn end(&mut self, g: u64, told: bool, now_ms: u64) -> bool {
        let forked = self.would_fork(g, now_ms);
        if let Some(b) = self.kept.get_mut(&g) {
            b.open = false;
            b.cut |= told && forked;
        }
        forked
    }

    /// Would `g`'s end be answered `forked` now? Yes when an open rival is a reader the replica
    /// may have chosen over it: a newer branch that relayed, or any fed since `g` was
    /// registered, or one registered within [`REGISTRATION_GRACE_MS`] that has not relayed yet
    /// (its request may still be reaching the replica). An older rival whose latest events
    /// landed before `g` was registered is not (a half-open old connection never locks its
    /// client out: red team 6, `olderopen`); records only land after they happened, so no flush
    /// makes a reader the replica chose over `g` look that old. Nor a registration past its
    /// grace (its guard never used the answer). Every such rival's guard may have its word a
    /// flush away: the owner's answer of a newer reader, or the end of a branch whose client
    /// went (an `abandoned` record, or the `branch_end` of a resume it reset after its owner
    /// answered). The clean end waits for it (`crate::resume::end_branch`), so a client's own
    /// dropped retry is never a reader; a rival still open after the wait is one.
    fn would_fork(&self, g: u64, now_ms: u64) -> bool {
        let me = self.kept.get(&g);
        self.rivals(g).any(|(h, b)| match b.first {
            Some(_) => h > g || fed_since(b, me),
            None => b.in_grace(now_ms),
        })
    }

    /// [`Branches::end`] (told), or `None` while [`Branches::would_fork`]: `g` is ended at once
    /// all the same (its replica ended it: it must not overtake the branch that may be reading
    /// now), and cut only once the answer is `forked`.
    fn end_settled(&mut self, g: u64, now_ms: u64) -> Option<bool> {
        if !self.would_fork(g, now_ms) {
            return Some(self.end(g, true, now_ms));
        }
        if let Some(b) = self.kept.get_mut(&g) {
            b.open = false;
        }
        None
    }

    /// The open branches numbered 1 or more other than `g`, with their numbers.
    fn rivals(&self, g: u64) -> impl Iterator<Item = (u64, &Branch)> {
        self.kept
            .iter()
            .filter(move |(h, b)| **h >= 1 && **h != g && b.open)
            .map(|(h, b)| (*h, b))
    }

    /// Ends the open branch that `registration` registered and that never relayed; `false`
    /// when the table holds none (not registered yet, or pruned).
    fn abandon(&mut self, registration: &str) -> bool {
        let found = self
            .kept
            .values_mut()
            .find(|b| b.registration.as_deref() == Some(registration));
        match found {
            Some(b) => {
                // A branch that relayed was used after all (never by this guard's token, but
                // the rule is the store's, not the guard's word).
                if b.first.is_none() {
                    b.open = false;
                }
                true
            }
            None => false,
        }
    }
}

/// Was branch `b` fed since `me` was registered (its latest events landed after that)? Unknown
/// times count as since (`me` no longer listed, or `b` relaying from before times were kept).
fn fed_since(b: &Branch, me: Option<&Branch>) -> bool {
    match (b.latest_ms, me) {
        (Some(l), Some(m)) => l >= m.registered_ms,
        _ => true,
    }
}

impl Branch {
    /// Registered at most [`REGISTRATION_GRACE_MS`] ago (its request may still be reaching
    /// the replica).
    fn in_grace(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.registered_ms) <= REGISTRATION_GRACE_MS
    }

    /// Which branches a full table drops first (lowest): ended and not cut, then open and
    /// never relayed, then the rest.
    fn prune_class(&self) -> u8 {
        match (self.open, self.cut, self.first) {
            (false, false, _) => 0,
            (true, _, None) => 1,
            _ => 2,
        }
    }
}

/// Is `new` another event than `recorded` (the id differs, or both have a digest and it does)?
fn diverges(recorded: &str, new: &str) -> bool {
    let (rid, rdigest) = split_recorded(recorded);
    let (nid, ndigest) = split_recorded(new);
    rid != nid || matches!((rdigest, ndigest), (Some(a), Some(b)) if a != b)
}

/// Per-entry estimates for the byte cap (map node, string header, key).
const SESSION_OVERHEAD: usize = 256;
const INCARNATION_OVERHEAD: usize = 256;
const ENTRY_OVERHEAD: usize = 64;
const BRANCH_OVERHEAD: usize = 64;

fn entry_cost(id: &str) -> usize {
    ENTRY_OVERHEAD + id.len()
}

impl Incarnation {
    fn cost(&self) -> usize {
        INCARNATION_OVERHEAD
            + self.entry_bytes
            + self
                .branches
                .as_ref()
                .map_or(0, |b| b.kept.len() * BRANCH_OVERHEAD)
            + self.abandoned.len() * BRANCH_OVERHEAD
            + self.opened.as_ref().map_or(0, |o| {
                o.owner.len() + o.request_id.as_ref().map_or(0, String::len)
            })
    }

    /// An `abandoned` record came before its registration: remembered for the grace period
    /// (the registration, when it comes, is born ended), within [`ABANDONED_KEPT`].
    fn remember_abandoned(&mut self, registration: &str, now_ms: u64) {
        self.forget_abandoned(now_ms);
        if self.abandoned.iter().any(|(r, _)| r == registration) {
            return;
        }
        if self.abandoned.len() >= ABANDONED_KEPT {
            self.abandoned.pop_front();
        }
        self.abandoned.push_back((registration.to_owned(), now_ms));
    }

    /// Was `registration` abandoned before it registered? Forgets it either way.
    fn take_abandoned(&mut self, registration: &str, now_ms: u64) -> bool {
        self.forget_abandoned(now_ms);
        let before = self.abandoned.len();
        self.abandoned.retain(|(r, _)| r != registration);
        self.abandoned.len() != before
    }

    fn forget_abandoned(&mut self, now_ms: u64) {
        self.abandoned
            .retain(|(_, at)| now_ms.saturating_sub(*at) <= REGISTRATION_GRACE_MS);
    }

    /// Insert or replace one map entry, keeping `entry_bytes` exact.
    fn put(map: &mut BTreeMap<u64, String>, bytes: &mut usize, seq: u64, id: &str) {
        if let Some(old) = map.insert(seq, id.to_owned()) {
            *bytes -= entry_cost(&old);
        }
        *bytes += entry_cost(id);
    }

    fn pop_oldest(map: &mut BTreeMap<u64, String>, bytes: &mut usize) {
        if let Some((_, old)) = map.pop_first() {
            *bytes -= entry_cost(&old);
        }
    }
}

struct Opened {
    kind: StreamKind,
    owner: String,
    owner_epoch: u64,
    retention: u64,
    /// The store's tick when its first StreamOpen was applied: orders GET streams.
    order: u64,
    /// The JSON-RPC id its StreamOpen carried (raw JSON text).
    request_id: Option<String>,
}

impl Session {
    fn new(state: SessionState, now_ms: u64) -> Self {
        Session {
            state,
            version: None,
            last_used_ms: now_ms,
            current_get: None,
            incarnations: HashMap::new(),
        }
    }

    fn idle_expired(&self, now_ms: u64, ttl_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_used_ms) > ttl_ms
    }

    fn cost(&self, key: &str) -> usize {
        SESSION_OVERHEAD
            + key.len()
            + self.version.as_ref().map_or(0, String::len)
            + self.current_get.as_ref().map_or(0, |(_, i)| i.len())
            + self
                .incarnations
                .iter()
                .map(|(id, inc)| id.len() + inc.cost())
                .sum::<usize>()
    }
}

/// The session a record writes to (OwnerGone writes none).
fn session_of(r: &Record) -> Option<&str> {
    match r {
        Record::SessionOpen { session, .. }
        | Record::SessionEnd { session, .. }
        | Record::StreamOpen { session, .. }
        | Record::Events { session, .. }
        | Record::StreamLost { session, .. }
        | Record::OwnerFailed { session, .. }
        | Record::BranchEnd { session, .. }
        | Record::Abandoned { session, .. } => Some(session),
        Record::OwnerGone { .. } => None,
    }
}

impl MemoryStore {
    pub fn new(limits: Limits) -> Self {
        let (changes, _) = watch::channel(0);
        MemoryStore {
            limits,
            inner: Mutex::new(Inner::default()),
            changes,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock, but if something ever did, the maps are still
        // structurally valid: keep serving rather than turning every request into a 503.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Drop `id` if it is idle past its TTL (opened) or waited too long for its
    /// `session_open` (pending), exactly as if the sweeper had already run, so the outcome of
    /// a write never depends on the sweeper's timing.
    fn expire_one(&mut self, id: &str, now_ms: u64, limits: &Limits) {
        if self
            .sessions
            .get(id)
            .is_some_and(|s| s.idle_expired(now_ms, limits.session_idle_ttl_ms))
        {
            self.drop_session(id);
        }
        if self
            .pending
            .get(id)
            .is_some_and(|s| s.idle_expired(now_ms, limits.pending_ttl_ms))
        {
            self.drop_pending(id);
        }
    }

    /// The session a record other than `session_open` writes to: the opened one, or else a
    /// pending one (made with state `fresh`).
    fn session_for_record(&mut self, id: &str, fresh: SessionState, now_ms: u64) -> &mut Session {
        if self.sessions.contains_key(id) {
            self.touch(id, now_ms);
            return self
                .sessions
                .entry(id.to_owned())
                .or_insert_with(|| Session::new(fresh, now_ms));
        }
        if !self.pending.contains_key(id) {
            self.pending_lru.insert((now_ms, id.to_owned()));
        }
        self.pending
            .entry(id.to_owned())
            .or_insert_with(|| Session::new(fresh, now_ms))
    }

    /// Room for one more opened session: sessions idle past their TTL (and, for bytes, pending
    /// entries) are freed first; a session active within the TTL never is.
    fn admit(&mut self, now_ms: u64, limits: &Limits) -> Result<(), String> {
        let max = limits.max_sessions.max(1);
        let high = limits.max_bytes / 100 * HIGH_WATER_PERCENT;
        if self.sessions.len() >= max || self.bytes > high {
            self.free_idle(now_ms, limits.session_idle_ttl_ms);
        }
        while self.bytes > high {
            let Some((_, id)) = self.pending_lru.first().cloned() else {
                break;
            };
            self.drop_pending(&id);
        }
        if self.sessions.len() >= max {
            return Err(format!(
                "{} sessions active within the idle TTL, at most {max} (--max-sessions)",
                self.sessions.len()
            ));
        }
        if self.bytes > high {
            return Err(format!(
                "about {} bytes held, new sessions are refused above {high} \
                 ({HIGH_WATER_PERCENT}% of --max-store-bytes)",
                self.bytes
            ));
        }
        Ok(())
    }

    /// Free opened sessions idle past `ttl`, least recently used first.
    fn free_idle(&mut self, now_ms: u64, ttl: u64) -> usize {
        let mut freed = 0;
        while let Some((lu, id)) = self.lru.first().cloned() {
            if now_ms.saturating_sub(lu) <= ttl {
                break;
            }
            self.drop_session(&id);
            freed += 1;
        }
        freed
    }

    /// Mark a session used at `now_ms` (never back in time), keeping the LRU index in step.
    fn touch(&mut self, id: &str, now_ms: u64) {
        if let Some(s) = self.sessions.get_mut(id) {
            if now_ms > s.last_used_ms {
                self.lru.remove(&(s.last_used_ms, id.to_owned()));
                s.last_used_ms = now_ms;
                self.lru.insert((now_ms, id.to_owned()));
            }
        }
    }

    fn drop_session(&mut self, id: &str) {
        if let Some(s) = self.sessions.remove(id) {
            self.lru.remove(&(s.last_used_ms, id.to_owned()));
            self.bytes = self.bytes.saturating_sub(s.cost(id));
        }
    }

    fn drop_pending(&mut self, id: &str) {
        if let Some(s) = self.pending.remove(id) {
            self.pending_lru.remove(&(s.last_used_ms, id.to_owned()));
            self.bytes = self.bytes.saturating_sub(s.cost(id));
        }
    }

    fn cost_of(&self, id: &str) -> usize {
        self.sessions
            .get(id)
            .or_else(|| self.pending.get(id))
            .map_or(0, |s| s.cost(id))
    }

    /// Bring the pending area and the bytes back within their caps (never dropping `keep`):
    /// pending entries first, oldest first; then, for bytes, sessions idle past their TTL. A
    /// session active within the TTL is never evicted: growth at the cap is refused instead
    /// (see [`Inner::room_for`]).
    fn enforce_caps(&mut self, keep: &str, now_ms: u64, limits: &Limits) {
        while self.pending.len() > limits.max_pending_sessions.max(1) {
            match self.oldest_pending(keep) {
                Some(v) => self.drop_pending(&v),
                None => break,
            }
        }
        self.make_room(0, keep, now_ms, limits);
    }

    /// Free pending entries (oldest first, never `keep`), then sessions idle past their TTL,
    /// until `extra` more bytes fit under the cap; whether they do.
    fn make_room(&mut self, extra: usize, keep: &str, now_ms: u64, limits: &Limits) -> bool {
        let fits = |i: &Inner| i.bytes.saturating_add(extra) <= limits.max_bytes;
        while !fits(self) {
            match self.oldest_pending(keep) {
                Some(v) => self.drop_pending(&v),
                None => break,
            }
        }
        if !fits(self) {
            self.free_idle(now_ms, limits.session_idle_ttl_ms);
        }
        fits(self)
    }

    /// Room for what `r` may add (an upper bound), for the records that grow a session:
    /// `events` with ids and `stream_open`. Refused at the cap: the session that pushes the
    /// store past it pays, never another one.
    fn room_for(
        &mut self,
        r: &Record,
        key: &str,
        now_ms: u64,
        limits: &Limits,
    ) -> Result<(), Refused> {
        let grows = match r {
            Record::Events {
                incarnation,
                ids,
                long,
                ..
            } if !ids.is_empty() => {
                ids.iter().map(|i| entry_cost(i)).sum::<usize>()
                    + long.iter().map(|l| entry_cost(&l.id)).sum::<usize>()
                    + INCARNATION_OVERHEAD
                    + incarnation.len()
            }
            Record::StreamOpen {
                incarnation,
                owner,
                request_id,
                ..
            } => {
                INCARNATION_OVERHEAD
                    + incarnation.len()
                    + owner.len()
                    + request_id.as_ref().map_or(0, String::len)
            }
            _ => return Ok(()),
        } + SESSION_OVERHEAD
            + key.len();
        if self.make_room(grows, key, now_ms, limits) {
            return Ok(());
        }
        self.last_refused = Some(now_ms);
        Err((
            STORE_FULL,
            format!(
                "about {} bytes held, at most {} (--max-store-bytes) with every session active \
                 within the idle TTL: this session's growth is refused",
                self.bytes, limits.max_bytes
            ),
        ))
    }

    fn oldest_pending(&self, keep: &str) -> Option<String> {
        self.pending_lru
            .iter()
            .find(|(_, id)| id != keep)
            .map(|(_, id)| id.clone())
    }

    /// Apply one record; `Err` names why it was refused.
    fn apply_one(&mut self, r: &Record, now_ms: u64, limits: &Limits) -> Result<(), Refused> {
        let Some(key) = session_of(r) else {
            return self.apply_record(r, now_ms, limits);
        };
        self.expire_one(key, now_ms, limits);
        self.room_for(r, key, now_ms, limits)?;
        let before = self.cost_of(key);
        let out = self.apply_record(r, now_ms, limits);
        let after = self.cost_of(key);
        self.bytes = (self.bytes + after).saturating_sub(before);
        self.enforce_caps(key, now_ms, limits);
        out
    }

    /// A fact about one incarnation (lost, failing): touched now, then `f`, within the caps.
    fn mark(
        &mut self,
        session: &str,
        incarnation: &str,
        now_ms: u64,
        limits: &Limits,
        f: impl FnOnce(&mut Incarnation),
    ) {
        let tick = self.next_tick();
        let s = self.session_for_record(session, SessionState::Active, now_ms);
        let inc = s.incarnations.entry(incarnation.to_owned()).or_default();
        inc.last_tick = tick;
        f(inc);
        evict(s, limits.max_incarnations_per_session, incarnation);
    }

    fn apply_record(&mut self, r: &Record, now_ms: u64, limits: &Limits) -> Result<(), Refused> {
        match r {
            Record::SessionOpen { session, version } => {
                if !self.sessions.contains_key(session) {
                    if let Err(why) = self.admit(now_ms, limits) {
                        self.last_refused = Some(now_ms);
                        return Err((STORE_FULL, why));
                    }
                    // What landed before the open (a pending entry) becomes the session: its
                    // streams, events and an end already recorded (ended is final).
                    let mut s = match self.pending.remove(session.as_str()) {
                        Some(p) => {
                            self.pending_lru.remove(&(p.last_used_ms, session.clone()));
                            p
                        }
                        None => Session::new(SessionState::Active, now_ms),
                    };
                    s.last_used_ms = now_ms;
                    self.lru.insert((now_ms, session.clone()));
                    self.sessions.insert(session.clone(), s);
                }
                self.touch(session, now_ms);
                // Ended is final: a late or replayed SessionOpen must not revive a session
                // that a DELETE or a 404 already ended (session ids are never reused).
                if let Some(s) = self.sessions.get_mut(session.as_str()) {
                    if s.state == SessionState::Active {
                        s.version = Some(version.clone());
                    }
                }
            }
            Record::SessionEnd { session, why } => {
                let end = match why {
                    SessionEnd::Terminated => SessionState::Terminated,
                    SessionEnd::Expired => SessionState::Expired,
                };
                let s = self.session_for_record(session, end, now_ms);
                // Terminated wins over Expired, whichever lands first.
                if s.state != SessionState::Terminated {
                    s.state = end;
                }
            }
            Record::StreamOpen {
                session,
                incarnation,
                kind,
                owner,
                retention,
                supersedes,
                // Accepted on the wire, never used for order: gateways' clocks differ.
                opened_ms: _,
                request_id,
            } => {
                let epoch = self.owner_epochs.get(owner).copied().unwrap_or(0);
                let tick = self.next_tick();
                let s = self.session_for_record(session, SessionState::Active, now_ms);
                let inc = s.incarnations.entry(incarnation.clone()).or_default();
                inc.last_tick = tick;
                match &mut inc.opened {
                    Some(o) => {
                        // A continuation re-sends StreamOpen. The same owner keeps the epoch it
                        // opened in, so an OwnerGone in between is not forgotten.
                        if o.owner != *owner {
                            o.owner = owner.clone();
                            o.owner_epoch = epoch;
                        }
                        o.retention = *retention;
                        o.kind = *kind;
                        if request_id.is_some() {
                            o.request_id.clone_from(request_id);
                        }
                        // Its order stays: a replayed StreamOpen never makes it newer.
                    }
                    None => {
                        inc.opened = Some(Opened {
                            kind: *kind,
                            owner: owner.clone(),
                            owner_epoch: epoch,
                            retention: *retention,
                            order: tick,
                            request_id: request_id.clone(),
                        });
                    }
                }
                if let (true, StreamKind::Get, Some(o)) = (*supersedes, *kind, &inc.opened) {
                    let candidate = (o.order, incarnation.clone());
                    // The GET stream whose StreamOpen the store applied last is the newest
                    // (the store's own order: no gateway clock can invert it); everything
                    // older reads as superseded (see `snapshot`).
                    if s.current_get.as_ref().is_none_or(|cur| candidate > *cur) {
                        s.current_get = Some(candidate);
                    }
                }
                evict(s, limits.max_incarnations_per_session, incarnation);
            }
            Record::Events {
                session,
                incarnation,
                first_seq,
                ids,
                long,
                branch,
                trimmed,
            } => {
                let tick = self.next_tick();
                let s = self.session_for_record(session, SessionState::Active, now_ms);
                let inc = s.incarnations.entry(incarnation.clone()).or_default();
                inc.last_tick = tick;
                // Without ids: the owner answered the branch (its response opened). An
                // overtaken branch is told so either way.
                if let Err(refused) = arbitrate(inc, incarnation, *branch, *first_seq, ids) {
                    evict(s, limits.max_incarnations_per_session, incarnation);
                    return Err(refused);
                }
                if let Some(b) = &mut inc.branches {
                    b.relayed(*branch, tick, !ids.is_empty(), now_ms);
                }
                // The owner answered for the stream again: an earlier failure passed.
                inc.failed = None;
                if *trimmed > 0 {
                    // Left out on purpose by the guard: a hole below never fills.
                    inc.trimmed_below = inc.trimmed_below.max(*first_seq);
                }
                let bytes = &mut inc.entry_bytes;
                for (i, id) in ids.iter().enumerate() {
                    // Validated upstream: first_seq + len fits comfortably in u64.
                    let seq = first_seq.saturating_add(i as u64);
                    Incarnation::put(&mut inc.window, bytes, seq, id);
                    inc.head = inc.head.max(seq);
                }
                // Keep the newest entries: those are the ones a resume can still need.
                while inc.window.len() > limits.max_window {
                    Incarnation::pop_oldest(&mut inc.window, bytes);
                }
                for l in long {
                    Incarnation::put(&mut inc.long, bytes, l.seq, &l.id);
                }
                while inc.long.len() > LONG_IDS_KEPT {
                    Incarnation::pop_oldest(&mut inc.long, bytes);
                }
                if !ids.is_empty() {
                    fit_session(s, limits.max_session_events, incarnation);
                }
                evict(s, limits.max_incarnations_per_session, incarnation);
            }
            Record::StreamLost {
                session,
                incarnation,
            } => {
                self.mark(session, incarnation, now_ms, limits, |inc| inc.lost = true);
            }
            Record::OwnerFailed {
                session,
                incarnation,
            } => {
                // The first failure opens the window (repeats never push it back); the latest
                // says whether failures stood through it.
                self.mark(session, incarnation, now_ms, limits, |inc| {
                    let (first, last) = inc.failed.get_or_insert((now_ms, now_ms));
                    *last = now_ms.max(*last).max(*first);
                });
            }
            Record::OwnerGone { owner } => {
                let e = self.owner_epochs.entry(owner.clone()).or_insert(0);
                *e = e.saturating_add(1).max(now_ms);
            }
            Record::BranchEnd {
                session,
                incarnation,
                branch,
            } => {
                self.end_branch(session, incarnation, *branch, false, now_ms);
            }
            Record::Abandoned {
                session,
                incarnation,
                registration,
            } => {
                // Only an opened incarnation registers branches: nothing to end elsewhere.
                if let Some(inc) = self
                    .incarnation_mut(session, incarnation)
                    .filter(|i| i.opened.is_some())
                {
                    let ended = inc
                        .branches
                        .as_mut()
                        .is_some_and(|b| b.abandon(registration));
                    if !ended {
                        inc.remember_abandoned(registration, now_ms);
                    }
                }
            }
        }
        Ok(())
    }

    /// A known incarnation (of an opened or a pending session).
    fn incarnation_mut(&mut self, session: &str, incarnation: &str) -> Option<&mut Incarnation> {
        let s = match self.sessions.get_mut(session) {
            Some(s) => s,
            None => self.pending.get_mut(session)?,
        };
        s.incarnations.get_mut(incarnation)
    }

    /// `told`: the guard asks at the branch's clean end, so its owner answered for the stream
    /// (a served continuation): an earlier failure passed.
    fn end_branch(
        &mut self,
        session: &str,
        incarnation: &str,
        branch: u64,
        told: bool,
        now_ms: u64,
    ) -> bool {
        let Some(inc) = self.incarnation_mut(session, incarnation) else {
            return false;
        };
        if told {
            inc.failed = None;
        }
        inc.branches
            .as_mut()
            .is_some_and(|b| b.end(branch, told, now_ms))
    }

    /// `end_branch` (told), except that an answer that would be `forked` is `None` (the rivals'
    /// word may be in flight): the branch is ended all the same, not yet cut.
    fn end_branch_settled(
        &mut self,
        session: &str,
        incarnation: &str,
        branch: u64,
        now_ms: u64,
    ) -> Option<bool> {
        let Some(inc) = self.incarnation_mut(session, incarnation) else {
            return Some(false);
        };
        inc.failed = None;
        inc.branches
            .as_mut()
            .map_or(Some(false), |b| b.end_settled(branch, now_ms))
    }

    /// The next branch of an opened incarnation of an active session (`None` otherwise).
    fn open_branch(
        &mut self,
        session: &str,
        incarnation: &str,
        registration: Option<&str>,
        now_ms: u64,
        limits: &Limits,
    ) -> Option<u64> {
        self.expire_one(session, now_ms, limits);
        let before = self.cost_of(session);
        let inc = self
            .sessions
            .get_mut(session)
            .filter(|s| s.state == SessionState::Active)?
            .incarnations
            .get_mut(incarnation)
            .filter(|i| i.opened.is_some())?;
        let born_ended = registration.is_some_and(|r| inc.take_abandoned(r, now_ms));
        let n = inc.branches.get_or_insert_with(Branches::new).open_next(
            now_ms,
            registration,
            born_ended,
        );
        let after = self.cost_of(session);
        self.bytes = (self.bytes + after).saturating_sub(before);
        self.enforce_caps(session, now_ms, limits);
        Some(n)
    }

    fn snapshot(&mut self, q: SnapshotQuery<'_>, now_ms: u64, limits: &Limits) -> Facts {
        let refusing = self
            .last_refused
            .is_some_and(|t| now_ms.saturating_sub(t) <= limits.session_idle_ttl_ms);
        // A pending session (never opened) is not a session yet.
        let Some(s) = self.sessions.get(q.session) else {
            return Facts {
                refusing,
                ..Facts::default()
            };
        };
        if s.idle_expired(now_ms, limits.session_idle_ttl_ms) {
            // Read as expired; the sweeper (or the next write) frees it.
            return Facts {
                session: Some(SessionState::Expired),
                incarnation: None,
                refusing,
            };
        }
        if s.state == SessionState::Active {
            self.touch(q.session, now_ms);
        }
        // An owner that kept failing through the whole window (a failure at each end, no
        // answer between): lost for good.
        if let Some(inc) = self
            .sessions
            .get_mut(q.session)
            .and_then(|s| s.incarnations.get_mut(q.incarnation))
        {
            if inc.failed.is_some_and(|(first, last)| {
                last.saturating_sub(first) > limits.owner_failure_window_ms
            }) {
                inc.lost = true;
            }
        }
        let Some(s) = self.sessions.get(q.session) else {
            return Facts {
                refusing,
                ..Facts::default()
            };
        };
        let incarnation = s.incarnations.get(q.incarnation).and_then(|inc| {
            let o = inc.opened.as_ref()?;
            let epoch = self.owner_epochs.get(&o.owner).copied().unwrap_or(0);
            let superseded = o.kind == StreamKind::Get
                && s.current_get
                    .as_ref()
                    .is_some_and(|(ord, id)| (*ord, id.as_str()) > (o.order, q.incarnation));
            let (retained_from, expected) =
                contiguity(&inc.window, q.seq, inc.head, q.max_expected);
            let cursor_id = match inc.long.get(&q.seq) {
                Some(id) => CursorId::Long(id.clone()),
                None if inc.window.get(&q.seq).is_some_and(|r| r.starts_with('~')) => {
                    CursorId::LongMissing
                }
                None => CursorId::Plain,
            };
            Some(IncarnationView {
                cursor_id,
                facts: IncarnationFacts {
                    kind: o.kind,
                    owner_lost: inc.lost || epoch > o.owner_epoch,
                    superseded,
                    head: inc.head,
                    retention: o.retention,
                    retained_from,
                },
                owner: o.owner.clone(),
                expected,
                request_id: o.request_id.clone(),
                trimmed_below: inc.trimmed_below,
            })
        });
        Facts {
            session: Some(s.state),
            incarnation,
            refusing,
        }
    }
}

/// The store's contiguity floor for `seq+1 ..= head` and the expected ids from `seq+1`.
/// Cost is bounded by the window size, not by `head - seq`.
fn contiguity(
    window: &BTreeMap<u64, String>,
    seq: u64,
    head: u64,
    max_expected: usize,
) -> (u64, Vec<String>) {
    if seq >= head {
        return (0, Vec::new());
    }
    let from = seq.saturating_add(1);
    // Walk down from head while seqs are consecutive; the first hole is the highest missing seq.
    let mut want = head;
    for (&s, _) in window.range(from..=head).rev() {
        if s != want {
            break;
        }
        if want == from {
            // Everything from seq+1 to head is recorded.
            let expected = window
                .range(from..=head)
                .take(max_expected)
                .map(|(_, id)| id.clone())
                .collect();
            return (0, expected);
        }
        want -= 1;
    }
    // `want` is missing: nothing at or below it can be vouched for.
    (want.saturating_add(1), Vec::new())
}

/// The arbiter's word on `events` of `branch` (`ids` from `first`, maybe none): refused when a
/// newer branch overtook it, or when a seq at or below the head is recorded with another event
/// (then the incarnation is lost: its replica diverged from the log). Appends past the head
/// cost nothing here.
fn arbitrate(
    inc: &mut Incarnation,
    incarnation: &str,
    branch: u64,
    first: u64,
    ids: &[String],
) -> Result<(), Refused> {
    let overtaken = |b: &mut Branches| {
        // The guard cuts it now: it holds the stream no more (another branch's end must not
        // count it as open), and its later events are refused too.
        if let Some(cut) = b.kept.get_mut(&branch) {
            cut.open = false;
            cut.cut = true;
        }
        Err((
            REJECTED_FORKED,
            format!("branch {branch} of incarnation {incarnation} was overtaken by a newer one"),
        ))
    };
    if let Some(b) = inc.branches.as_mut().filter(|b| b.overtaken(branch)) {
        return overtaken(b);
    }
    let below_head = inc
        .head
        .checked_sub(first)
        .map_or(0, |d| d.saturating_add(1));
    let recorded = ids
        .iter()
        .take(usize::try_from(below_head).unwrap_or(usize::MAX))
        .enumerate()
        .find_map(|(i, id)| {
            let seq = first.saturating_add(i as u64);
            let r = inc.window.get(&seq)?;
            diverges(r, id).then_some(seq)
        });
    if let Some(seq) = recorded {
        // Two continuations, both open, recorded two ways: the replica feeds two branches two
        // ways (a fork, not a lost log); the newer one is followed, the older one cut. Against
        // the first response's records (in flight when the continuation was decided) or an
        // ended branch's, it is a divergence.
        if let Some(b) = inc.branches.as_mut().filter(|_| branch >= 1) {
            let rival = b.writer.filter(|h| *h >= 1 && *h != branch);
            match rival.and_then(|h| b.kept.get(&h).map(|x| (h, x.open, x.cut))) {
                Some((h, true, _)) => return if branch > h { Ok(()) } else { overtaken(b) },
                // The writer lost a fork (cut): its records give way to the survivor's.
                Some((_, false, true)) => return Ok(()),
                _ => {}
            }
        }
        inc.lost = true;
        return Err((
            REJECTED_MISMATCH,
            format!(
                "seq {seq} of incarnation {incarnation} is recorded with another event: \
                 the replica diverged, the incarnation is lost"
            ),
        ));
    }
    Ok(())
}

/// Keep at most `max` recorded events in the session: the least recently recorded
/// incarnations give all theirs up first, the one just written (`current`, the most recently
/// recorded) its oldest last. Their cursors then read `gap`.
fn fit_session(s: &mut Session, max: usize, current: &str) {
    let mut total: usize = s.incarnations.values().map(|i| i.window.len()).sum();
    while total > max {
        let victim = s
            .incarnations
            .iter_mut()
            .filter(|(_, i)| !i.window.is_empty())
            .min_by_key(|(_, i)| i.last_tick);
        let Some((id, inc)) = victim else {
            break;
        };
        if id != current {
            total -= inc.window.len();
            inc.window.clear();
            inc.long.clear();
            inc.entry_bytes = 0;
            continue;
        }
        while total > max && !inc.window.is_empty() {
            Incarnation::pop_oldest(&mut inc.window, &mut inc.entry_bytes);
            total -= 1;
        }
    }
}

/// Keep at most `max` incarnations, dropping the least recently recorded (never `keep`).
fn evict(s: &mut Session, max: usize, keep: &str) {
    while s.incarnations.len() > max.max(1) {
        let victim = s
            .incarnations
            .iter()
            .filter(|(id, _)| id.as_str() != keep)
            .min_by_key(|(_, inc)| inc.last_tick)
            .map(|(id, _)| id.clone());
        match victim {
            Some(v) => {
                s.incarnations.remove(&v);
            }
            None => break,
        }
    }
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn apply(&self, records: &[Record], now_ms: u64) -> Result<Applied, StoreError> {
        let mut out = Applied::default();
        {
            let mut inner = self.lock();
            for (index, r) in records.iter().enumerate() {
                if let Err((error, detail)) = inner.apply_one(r, now_ms, &self.limits) {
                    out.refused.push(Refusal {
                        index,
                        error,
                        detail,
                    });
                }
            }
        }
        // Wake resumes waiting for in-flight records.
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
        Ok(out)
    }

    async fn open_branch(
        &self,
        session: &str,
        incarnation: &str,
        registration: Option<&str>,
        now_ms: u64,
    ) -> Result<BranchOpen, StoreError> {
        // One lock holds an incarnation and its table: they cannot be lost apart.
        Ok(self
            .lock()
            .open_branch(session, incarnation, registration, now_ms, &self.limits)
            .map_or(BranchOpen::Unregistered, BranchOpen::Numbered))
    }

    async fn end_branch(
        &self,
        session: &str,
        incarnation: &str,
        branch: u64,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        Ok(self
            .lock()
            .end_branch(session, incarnation, branch, true, now_ms))
    }

    async fn end_branch_settled(
        &self,
        session: &str,
        incarnation: &str,
        branch: u64,
        now_ms: u64,
    ) -> Result<Option<bool>, StoreError> {
        Ok(self
            .lock()
            .end_branch_settled(session, incarnation, branch, now_ms))
    }

    async fn snapshot(&self, query: SnapshotQuery<'_>, now_ms: u64) -> Result<Facts, StoreError> {
        Ok(self.lock().snapshot(query, now_ms, &self.limits))
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn health(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn stats(&self, _now_ms: u64) -> Result<StoreStats, StoreError> {
        let inner = self.lock();
        let incarnations = inner
            .sessions
            .values()
            .map(|s| s.incarnations.len() as u64)
            .sum();
        Ok(StoreStats {
            sessions: inner.sessions.len() as u64,
            pending: inner.pending.len() as u64,
            incarnations,
            bytes: inner.bytes as u64,
            evicted: inner.evicted,
            reconnects: 0,
            owners: inner.owner_epochs.len() as u64,
            touch_refused: 0,
        })
    }

    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let ttl = self.limits.session_idle_ttl_ms;
        let mut inner = self.lock();
        // Least recently used first: stop at the first session still alive.
        let freed = inner.free_idle(now_ms, ttl);
        while let Some((at, id)) = inner.pending_lru.first().cloned() {
            if now_ms.saturating_sub(at) <= self.limits.pending_ttl_ms {
                break;
            }
            inner.drop_pending(&id);
        }
        inner.expire_owner_epochs(now_ms, ttl);
        Ok(freed)
    }
}

impl Inner {
    /// Forget owner epochs bumped more than `ttl` ago. Before one goes, every incarnation it
    /// still makes lost is marked lost for good, so forgetting it changes no verdict.
    fn expire_owner_epochs(&mut self, now_ms: u64, ttl: u64) {
        let old: HashMap<String, u64> = self
            .owner_epochs
            .iter()
            .filter(|(_, e)| now_ms.saturating_sub(**e) > ttl)
            .map(|(o, e)| (o.clone(), *e))
            .collect();
        if old.is_empty() {
            return;
        }
        for s in self.sessions.values_mut().chain(self.pending.values_mut()) {
            for inc in s.incarnations.values_mut() {
                if let Some(o) = &inc.opened {
                    if old.get(&o.owner).is_some_and(|e| *e > o.owner_epoch) {
                        inc.lost = true;
                    }
                }
            }
        }
        self.owner_epochs.retain(|o, _| !old.contains_key(o));
    }
}

#[cfg(test)]
mod tests {
    use super::contiguity;
    use std::collections::BTreeMap;

    fn w(seqs: &[u64]) -> BTreeMap<u64, String> {
        seqs.iter().map(|s| (*s, format!("e{s}"))).collect()
    }

    #[test]
    fn contiguity_floor() {
        assert_eq!(
            contiguity(&w(&[1, 2, 3]), 0, 3, 10),
            (0, vec!["e1".into(), "e2".into(), "e3".into()])
        );
        assert_eq!(contiguity(&w(&[1, 2, 3]), 1, 3, 1), (0, vec!["e2".into()]));
        assert_eq!(contiguity(&w(&[1, 2, 3]), 3, 3, 10), (0, vec![]));
        assert_eq!(contiguity(&w(&[1, 3]), 0, 3, 10), (3, vec![]));
        assert_eq!(contiguity(&w(&[5, 6]), 2, 6, 10), (5, vec![]));
        assert_eq!(contiguity(&w(&[1, 2, 4]), 2, 4, 10), (4, vec![]));
        assert_eq!(contiguity(&w(&[]), 2, 6, 10), (7, vec![]));
    }
}
