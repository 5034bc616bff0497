//! Simulated MCP replicas (the upstreams), each with a menu of behaviours from correct to hostile.
//! A replica keeps its sessions and every stream's log (its ring) in memory; a restart on the
//! same address forgets them. Event data carry the stream's ground truth (session, stream, index)
//! so the oracle can judge what the client dispatches.
use std::collections::HashMap;

use crate::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Behaviour {
    /// Replays exactly from its ring after the cursor; the newest reader takes the stream over.
    Correct,
    /// Every reader gets the live events (an older reader is not ended).
    FeedAll,
    /// A second reader of a stream is refused (409).
    RefuseSecond,
    /// Forgets the log: a resume opens a fresh stream whose counter ids collide with the old ones.
    Forget,
    /// Some events carry a bare `id:` line (the client's last event id resets to empty).
    ResetIds,
    /// Some events are an `id:` alone, without data.
    IdsWithoutData,
    /// A resume replays the cursor's own event first (rmcp).
    EchoCursor,
    /// Some events are larger than the guard's `max_event_hold_bytes`.
    Large,
    /// SSE under odd content types: `text/plain, text/event-stream`, two headers, or under 500.
    OddType,
    /// A resume gets no answer at all (no headers).
    Hang,
    /// A resume that has entries to replay which some reader already got is answered
    /// `200 text/event-stream`, then only a comment, and nothing more (headers, then silence);
    /// any other resume as `correct` does.
    Stall,
    /// A resume that owes a replay of two or more entries some reader already got is answered
    /// with the first of them, then a comment, and nothing more (a stall in the middle of the
    /// replay); any other resume as `correct` does.
    StallMidway,
    /// A resume is answered 500.
    ServerError,
    /// Restarts on the same address now and then, forgetting sessions and logs; an unknown
    /// session is answered 400.
    Restart,
    /// A resume's replay starts with an event that is not the recorded next one, carrying no
    /// id, an id with a NUL (clients ignore it), or its id in a later block.
    Mangle,
    /// A stream's first resume is answered 503 (a blip), every later one as `correct` does
    /// (issue 30, 2: a blip that healed must not become a loss later).
    Blip,
    /// A call's notifications before its response carry no id line at all (progress with
    /// nothing to resume from): a stream cut before its response leaves the client no cursor.
    IdlessProgress,
    /// A resume is answered with its replay and then closed (SEP-1699 polling: the client
    /// resumes again for more); the stream goes on being written with no reader.
    Poll,
    /// Paces every stream from one replica-wide random stream, so one session's traffic shifts
    /// another's timing: not a fault of the guard; it proves invariant 4's check can fail.
    SharedPace,
}

impl Behaviour {
    pub const ALL: [Behaviour; 19] = [
        Behaviour::Correct,
        Behaviour::FeedAll,
        Behaviour::RefuseSecond,
        Behaviour::Forget,
        Behaviour::ResetIds,
        Behaviour::IdsWithoutData,
        Behaviour::EchoCursor,
        Behaviour::Large,
        Behaviour::OddType,
        Behaviour::Hang,
        Behaviour::Stall,
        Behaviour::StallMidway,
        Behaviour::ServerError,
        Behaviour::Restart,
        Behaviour::Mangle,
        Behaviour::SharedPace,
        Behaviour::Blip,
        Behaviour::IdlessProgress,
        Behaviour::Poll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Behaviour::Correct => "correct",
            Behaviour::FeedAll => "feed-all",
            Behaviour::RefuseSecond => "refuse-second",
            Behaviour::Forget => "forget",
            Behaviour::ResetIds => "reset-ids",
            Behaviour::IdsWithoutData => "ids-without-data",
            Behaviour::EchoCursor => "echo-cursor",
            Behaviour::Large => "large",
            Behaviour::OddType => "odd-type",
            Behaviour::Hang => "hang",
            Behaviour::Stall => "stall",
            Behaviour::StallMidway => "stall-midway",
            Behaviour::ServerError => "5xx",
            Behaviour::Restart => "restart",
            Behaviour::Mangle => "mangle-replay",
            Behaviour::SharedPace => "shared-pace",
            Behaviour::Blip => "blip",
            Behaviour::IdlessProgress => "idless-progress",
            Behaviour::Poll => "poll",
        }
    }

    pub fn parse(s: &str) -> Option<Behaviour> {
        Behaviour::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// Bytes of padding in a large event (the sim's gateways hold 4 KiB).
pub const LARGE_PAD: usize = 6000;

/// One request as the replica receives it.
pub struct Request<'a> {
    pub method: &'a str,
    pub session: Option<&'a str>,
    pub last_event_id: Option<&'a str>,
    /// The request's JSON-RPC id as raw JSON: the id the client's own JSON parser reads in its
    /// body (a replica answering a duplicate key or an escaped key reads it the same way).
    pub call_id: Option<&'a str>,
    /// Seeds the randomness of the stream this request may open (drawn by its client, so one
    /// session's streams never shift another's).
    pub draw: u64,
}

/// The replica's answer: headers now, a body chunk, maybe the end; `stream` when the connection
/// now reads a stream.
pub struct Reply {
    pub status: u32,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub eos: bool,
    pub stream: Option<u64>,
    /// Readers the replica ends (a newer reader took the stream over, a GET stream superseded).
    pub ended: Vec<usize>,
}

/// An entry of a stream's log as the replica wrote it.
struct Entry {
    bytes: Vec<u8>,
}

struct Stream {
    session: String,
    /// Index of the first entry (a forgetful replica counts on from a cursor).
    start: u64,
    entries: Vec<Entry>,
    readers: Vec<usize>,
    /// The JSON-RPC id of the call this stream answers (raw JSON); `None`: a GET stream.
    call_id: Option<String>,
    /// Entries still to write; a call's last one is its result.
    left: u64,
    rng: Rng,
    /// A `blip` replica answered this stream's resume 503 once.
    blipped: bool,
    /// Entries (a count from the first) written while a reader was attached.
    sent: usize,
}

/// What the oracle needs to know about a written entry.
pub struct Written {
    pub uid: u64,
    pub session: String,
    pub index: u64,
    pub has_data: bool,
}

pub struct Replica {
    pub addr: String,
    pub behaviours: Vec<Behaviour>,
    pub epoch: u32,
    sessions: HashMap<String, Option<u64>>,
    streams: HashMap<u64, Stream>,
    next_session: u64,
    /// The replica-wide pace ([`Behaviour::SharedPace`]).
    shared: Rng,
}

fn sse_headers(rng: &mut Rng, odd: bool) -> (u32, Vec<(String, Vec<u8>)>) {
    let h = |k: &str, v: &str| (k.to_owned(), v.as_bytes().to_vec());
    if odd {
        match rng.below(3) {
            0 => {
                return (
                    200,
                    vec![h("content-type", "text/plain, text/event-stream")],
                )
            }
            1 => {
                return (
                    200,
                    vec![
                        h("content-type", "text/plain"),
                        h("content-type", "text/event-stream"),
                    ],
                )
            }
            _ => return (500, vec![h("content-type", "text/event-stream")]),
        }
    }
    (200, vec![h("content-type", "text/event-stream")])
}

impl Replica {
    pub fn new(addr: String, behaviours: Vec<Behaviour>) -> Replica {
        Replica {
            addr,
            behaviours,
            // Fixed width (see the world's stream numbers).
            epoch: 100,
            sessions: HashMap::new(),
            streams: HashMap::new(),
            next_session: 100_000,
            shared: Rng::new(0x5eed),
        }
    }

    pub fn has(&self, b: Behaviour) -> bool {
        self.behaviours.contains(&b)
    }

    /// Restart on the same address: sessions and logs are gone, every reader is cut.
    pub fn restart(&mut self) -> Vec<usize> {
        self.epoch += 1;
        self.sessions.clear();
        let readers = self.streams.drain().flat_map(|(_, s)| s.readers).collect();
        readers
    }

    pub fn drop_reader(&mut self, uid: u64, conn: usize) {
        if let Some(s) = self.streams.get_mut(&uid) {
            s.readers.retain(|c| *c != conn);
        }
    }

    pub fn readers(&self, uid: u64) -> usize {
        self.streams.get(&uid).map_or(0, |s| s.readers.len())
    }

    fn reply(status: u32, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Reply {
        Reply {
            status,
            headers,
            body,
            eos: true,
            stream: None,
            ended: Vec::new(),
        }
    }

    fn json(status: u32, body: &str) -> Reply {
        Replica::reply(
            status,
            vec![("content-type".into(), b"application/json".to_vec())],
            body.as_bytes().to_vec(),
        )
    }

    /// Answers a request; `None`: it hangs (no headers, ever). `new_uid` names a new stream.
    pub fn handle(&mut self, req: &Request<'_>, conn: usize, new_uid: u64) -> Option<Reply> {
        let Some(sid) = req.session else {
            // initialize
            self.next_session += 1;
            let sid = format!("{}~{}~{}", self.addr, self.epoch, self.next_session);
            self.sessions.insert(sid.clone(), None);
            let mut r = Replica::json(
                200,
                &format!(
                    r#"{{"jsonrpc":"2.0","id":{},"result":{{"protocolVersion":"2025-06-18"}}}}"#,
                    req.call_id.unwrap_or("0")
                ),
            );
            r.headers.push(("mcp-session-id".into(), sid.into_bytes()));
            return Some(r);
        };
        if !self.sessions.contains_key(sid) {
            let status = if self.has(Behaviour::Restart) {
                400
            } else {
                404
            };
            return Some(Replica::json(
                status,
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"unknown session"}}"#,
            ));
        }
        match (req.method, req.last_event_id) {
            ("POST", _) => Some(self.open(sid, conn, new_uid, req.call_id, req.draw)),
            ("GET", None) => Some(self.open(sid, conn, new_uid, None, req.draw)),
            ("GET", Some(lei)) => self.resume(sid, lei, conn, new_uid, req.draw),
            ("DELETE", _) => {
                self.sessions.remove(sid);
                Some(Replica::reply(200, Vec::new(), Vec::new()))
            }
            _ => Some(Replica::json(405, "{}")),
        }
    }

    fn open(
        &mut self,
        sid: &str,
        conn: usize,
        uid: u64,
        call_id: Option<&str>,
        draw: u64,
    ) -> Reply {
        let mut rng = Rng::new(draw);
        let mut ended = Vec::new();
        if call_id.is_none() {
            // A new standalone GET stream supersedes the session's previous one.
            let prev = self.sessions.get_mut(sid).and_then(|g| g.replace(uid));
            if let Some(s) = prev.and_then(|p| self.streams.get_mut(&p)) {
                ended = std::mem::take(&mut s.readers);
            }
        }
        let left = if call_id.is_some() {
            rng.range(1, 6)
        } else {
            rng.range(3, 12)
        };
        let odd = self.has(Behaviour::OddType);
        let (status, headers) = sse_headers(&mut rng, odd);
        self.streams.insert(
            uid,
            Stream {
                session: sid.to_owned(),
                start: 0,
                entries: Vec::new(),
                readers: vec![conn],
                call_id: call_id.map(str::to_owned),
                left,
                rng,
                blipped: false,
                sent: 0,
            },
        );
        Reply {
            status,
            headers,
            body: Vec::new(),
            eos: false,
            stream: Some(uid),
            ended,
        }
    }

    fn resume(
        &mut self,
        sid: &str,
        lei: &str,
        conn: usize,
        new_uid: u64,
        draw: u64,
    ) -> Option<Reply> {
        if self.has(Behaviour::Hang) {
            return None;
        }
        if self.has(Behaviour::ServerError) {
            return Some(Replica::json(500, r#"{"error":"internal"}"#));
        }
        if self.has(Behaviour::Forget) {
            // A fresh stream whose per-stream counter goes on from the cursor's number.
            let from = lei.rsplit('-').next().and_then(|n| n.parse::<u64>().ok());
            let mut r = self.open(sid, conn, new_uid, None, draw);
            if let Some(s) = self.streams.get_mut(&new_uid) {
                s.start = from.map_or(0, |n| n + 1);
            }
            r.ended.clear();
            return Some(r);
        }
        let found = lei.split_once('-').and_then(|(u, i)| {
            let (u, i) = (u.parse::<u64>().ok()?, i.parse::<u64>().ok()?);
            let s = self.streams.get(&u)?;
            (s.session == sid && i >= s.start && i < s.start + s.entries.len() as u64)
                .then_some((u, i))
        });
        let Some((uid, i)) = found else {
            return Some(Replica::json(
                404,
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"unknown event id"}}"#,
            ));
        };
        let refuse = self.has(Behaviour::RefuseSecond);
        let feed_all = self.has(Behaviour::FeedAll);
        let echo = self.has(Behaviour::EchoCursor);
        let mangle = self.has(Behaviour::Mangle);
        let odd = self.has(Behaviour::OddType);
        let stall = self.has(Behaviour::Stall);
        let midway = self.has(Behaviour::StallMidway);
        let poll = self.has(Behaviour::Poll);
        let (status, headers) = sse_headers(&mut Rng::new(draw), odd);
        let s = self.streams.get_mut(&uid)?;
        let after = usize::try_from(i - s.start).unwrap_or(0) + 1;
        if (stall && after < s.sent) || (midway && after + 1 < s.sent) {
            // Owes a replay some reader already got, and sends none of it (`stall`) or only
            // its first event (`stall-midway`).
            let mut body = match midway {
                true => s
                    .entries
                    .get(after)
                    .map(|e| e.bytes.clone())
                    .unwrap_or_default(),
                false => Vec::new(),
            };
            body.extend_from_slice(b": stalled\n\n");
            return Some(Reply {
                status,
                headers,
                body,
                eos: false,
                stream: None,
                ended: Vec::new(),
            });
        }
        if self.behaviours.contains(&Behaviour::Blip) && !s.blipped {
            s.blipped = true;
            return Some(Replica::json(503, r#"{"error":"unavailable"}"#));
        }
        if refuse && !s.readers.is_empty() {
            return Some(Replica::json(409, r#"{"error":"stream has a reader"}"#));
        }
        let ended = if feed_all {
            Vec::new()
        } else {
            std::mem::take(&mut s.readers)
        };
        let from = usize::try_from(i - s.start).unwrap_or(0) + usize::from(!echo);
        let mut body = Vec::new();
        if mangle && from < s.entries.len() {
            // An event no log holds (stream 0), where the recorded next one should be.
            let next = format!("{uid}-{}", s.start + from as u64);
            let data = format!(
                r#"data: {{"jsonrpc":"2.0","method":"notifications/progress","params":{{"s":"{}","u":0,"n":0}}}}"#,
                s.session
            );
            let ghost = match draw % 3 {
                0 => format!("{data}\n\n"),
                1 => format!("id: {next}\0\n{data}\n\n"),
                _ => format!("{data}\n\nid: {next}\n\n"),
            };
            body.extend_from_slice(ghost.as_bytes());
        }
        for e in s.entries.iter().skip(from) {
            body.extend_from_slice(&e.bytes);
        }
        let eos = poll || (s.left == 0 && s.call_id.is_some());
        if !eos {
            s.readers.push(conn);
        }
        Some(Reply {
            status,
            headers,
            body,
            eos,
            stream: (!eos).then_some(uid),
            ended,
        })
    }

    /// A delay before stream `uid`'s next entry, from its own randomness.
    pub fn pace(&mut self, uid: u64) -> u64 {
        if self.has(Behaviour::SharedPace) {
            return self.shared.range(2, 60);
        }
        self.streams.get_mut(&uid).map_or(0, |s| s.rng.range(2, 60))
    }

    /// Whether `uid` is a stream a client may still resume here: held, and (a GET stream) not
    /// superseded by a newer one.
    /// Does the replica serve stream `uid`'s resumes as `correct` does (a `blip` replica once
    /// its one 503 is spent; a `poll` replica's replay is exact, it then ends it)?
    pub fn serves_correctly(&self, uid: u64) -> bool {
        match self.behaviours.as_slice() {
            [Behaviour::Correct] | [Behaviour::Poll] => true,
            [Behaviour::Blip] => self.streams.get(&uid).is_some_and(|s| s.blipped),
            _ => false,
        }
    }

    pub fn current(&self, uid: u64) -> bool {
        self.streams.get(&uid).is_some_and(|s| {
            s.call_id.is_some() || self.sessions.get(&s.session) == Some(&Some(uid))
        })
    }

    /// Writes the next entry of stream `uid`: its bytes, the readers it goes to, whether the
    /// stream ended with it, and what the oracle records. `None`: the stream is gone or done.
    pub fn emit(&mut self, uid: u64) -> Option<(Vec<u8>, Vec<usize>, bool, Written)> {
        let reset = self.has(Behaviour::ResetIds);
        let bare = self.has(Behaviour::IdsWithoutData);
        let large = self.has(Behaviour::Large);
        let counter_ids = self.has(Behaviour::Forget);
        let idless = self.has(Behaviour::IdlessProgress);
        let s = self.streams.get_mut(&uid)?;
        let r = &mut s.rng;
        if s.left == 0 {
            return None;
        }
        s.left -= 1;
        let index = s.start + s.entries.len() as u64;
        let last = s.left == 0;
        let id = if counter_ids {
            index.to_string()
        } else {
            format!("{uid}-{index}")
        };
        let id = (!(reset && r.chance(250))).then_some(id);
        let has_data = !(bare && !last && r.chance(300));
        let pad = if large && r.chance(400) {
            "x".repeat(LARGE_PAD)
        } else {
            String::new()
        };
        let mut bytes = Vec::new();
        match &id {
            _ if idless && s.call_id.is_some() && !last => {}
            Some(id) => {
                bytes.extend_from_slice(b"id: ");
                bytes.extend_from_slice(id.as_bytes());
                bytes.push(b'\n');
            }
            None => bytes.extend_from_slice(b"id:\n"),
        }
        if has_data {
            let facts = format!(
                r#"{{"s":"{}","u":{uid},"n":{index},"p":"{pad}"}}"#,
                s.session
            );
            let data = match (&s.call_id, last) {
                (Some(cid), true) => format!(r#"{{"jsonrpc":"2.0","id":{cid},"result":{facts}}}"#),
                _ => format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{facts}}}"#
                ),
            };
            bytes.extend_from_slice(b"data: ");
            bytes.extend_from_slice(data.as_bytes());
            bytes.push(b'\n');
        }
        bytes.push(b'\n');
        s.entries.push(Entry {
            bytes: bytes.clone(),
        });
        if !s.readers.is_empty() {
            s.sent = s.entries.len();
        }
        // A GET stream stays open after its last event; a call's stream ends with its result.
        let done = last && s.call_id.is_some();
        let readers = if done {
            std::mem::take(&mut s.readers)
        } else {
            s.readers.clone()
        };
        let written = Written {
            uid,
            session: s.session.clone(),
            index,
            has_data,
        };
        Some((bytes, readers, done, written))
    }
}
