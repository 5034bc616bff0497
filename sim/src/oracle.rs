//! The oracle sits where the client sits: it judges each event the client's parser dispatches
//! against the ground truth the replicas wrote (every stream's entries, which carry data).
use std::collections::HashMap;

use serde_json::Value;

use crate::replica::Written;
use mcp_resume_core::eventsource::Dispatch;

/// Which promise a violation breaks (docs/simulator.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invariant {
    /// 1: an event dispatched that is not the next of its stream, with no signal before it.
    NextEvent,
    /// 1 (ids): an id the client holds is not one of the guard's cursors.
    Cursor,
    /// 2: a call did not settle within the bound.
    Settles,
    /// 3: a valid resume (healthy owner holding the log, the only reader) did not continue.
    Continues,
    /// 4: a session's outcomes changed with other sessions' traffic.
    NonInterference,
    /// Memory and Redis stores gave a client different outcomes (`--differential 1`).
    Differential,
    /// Not an invariant: the run's store could not be used (no Redis at the URL).
    Store,
}

impl Invariant {
    pub fn name(self) -> &'static str {
        match self {
            Invariant::NextEvent => "next-event",
            Invariant::Cursor => "cursor",
            Invariant::Settles => "settles",
            Invariant::Continues => "continues",
            Invariant::NonInterference => "non-interference",
            Invariant::Differential => "differential",
            Invariant::Store => "store",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub client: usize,
    /// The client's logical stream it concerns.
    pub logical: Option<usize>,
    pub what: String,
}

/// What the client expects of its stream's next event: the next event with data after the
/// last one it dispatched (`last`: stream and entry index); when it has read nothing yet or a
/// signal came since (`free`), also the first event of a new stream of its own session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Expect {
    pub last: Option<(u64, u64)>,
    pub free: bool,
}

impl Expect {
    /// A signal came: a new stream may follow.
    pub fn signal(&mut self) {
        self.free = true;
    }
}

/// One dispatched event, as the client application reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// The `mcp-resume` control event.
    Signal,
    /// A JSON-RPC error answering `id`.
    Error {
        id: Value,
    },
    /// An entry of a stream; `result` carries the id of the call it answers.
    Entry {
        session: String,
        uid: u64,
        index: u64,
        result: Option<Value>,
    },
    Other,
}

pub fn read(d: &Dispatch) -> Seen {
    if d.event == "mcp-resume" {
        return Seen::Signal;
    }
    let Ok(v) = serde_json::from_str::<Value>(&d.data) else {
        return Seen::Other;
    };
    if v.get("error").is_some() {
        return Seen::Error {
            id: v.get("id").cloned().unwrap_or(Value::Null),
        };
    }
    let facts = v.get("params").or_else(|| v.get("result"));
    let entry = facts.and_then(|f| {
        Some((
            f.get("s")?.as_str()?.to_owned(),
            f.get("u")?.as_u64()?,
            f.get("n")?.as_u64()?,
        ))
    });
    match entry {
        Some((session, uid, index)) => Seen::Entry {
            session,
            uid,
            index,
            result: v.get("result").and(v.get("id")).cloned(),
        },
        None => Seen::Other,
    }
}

struct Truth {
    session: String,
    start: u64,
    /// Whether each entry (from `start`) carries data.
    data: Vec<bool>,
}

#[derive(Default)]
pub struct Oracle {
    truth: HashMap<u64, Truth>,
}

impl Oracle {
    pub fn written(&mut self, w: &Written) {
        let t = self.truth.entry(w.uid).or_insert_with(|| Truth {
            session: w.session.clone(),
            start: w.index,
            data: Vec::new(),
        });
        t.data.push(w.has_data);
    }

    /// The index of the first entry with data after `after` (or from the start).
    fn next_with_data(&self, uid: u64, after: Option<u64>) -> Option<u64> {
        let t = self.truth.get(&uid)?;
        let from = after.map_or(t.start, |a| a + 1);
        (from..t.start + t.data.len() as u64)
            .find(|i| t.data.get((i - t.start) as usize).copied().unwrap_or(false))
    }

    /// Judges an entry the client dispatched; on success the expectation moves past it.
    pub fn entry(
        &self,
        session: &str,
        expect: &mut Expect,
        (ev_session, uid, index): (&str, u64, u64),
    ) -> Result<(), String> {
        if ev_session != session {
            return Err(format!(
                "dispatched an event of another session ({ev_session}, stream {uid} #{index})"
            ));
        }
        if self.truth.get(&uid).is_none_or(|t| t.session != session) {
            return Err(format!(
                "dispatched stream {uid} #{index}, which no replica wrote"
            ));
        }
        let next = expect
            .last
            .and_then(|(u, i)| self.next_with_data(u, Some(i)).map(|n| (u, n)));
        let fresh = (expect.free || expect.last.is_none())
            .then(|| self.next_with_data(uid, None).map(|n| (uid, n)))
            .flatten();
        if next != Some((uid, index)) && fresh != Some((uid, index)) {
            return Err(format!(
                "dispatched stream {uid} #{index} with no signal; the next event of its stream is {next:?} (expectation {expect:?})"
            ));
        }
        *expect = Expect {
            last: Some((uid, index)),
            free: false,
        };
        Ok(())
    }
}
