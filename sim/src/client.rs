//! Simulated MCP clients: a session, tool calls whose answers are SSE streams, the standalone
//! GET stream; each stream a client reads is a *logical* stream that outlives its connections
//! (drops, resumes, half-open connections). A client parses what it receives with the WHATWG
//! client model and keeps, per stream, the last event id its parser holds.
use std::collections::HashMap;

use serde_json::Value;

use crate::oracle::Expect;
use crate::rng::Rng;
use mcp_resume_core::eventsource::Parser;

#[derive(Debug)]
pub struct Call {
    /// The request's JSON-RPC id as the client wrote it (raw JSON) and as it reads it back.
    pub raw_id: String,
    pub id: Value,
    /// The request body.
    pub body: String,
    pub started: u64,
    pub settled: bool,
}

#[derive(Debug)]
pub enum Kind {
    Get,
    Call(Call),
}

#[derive(Debug)]
pub struct Logical {
    pub kind: Kind,
    /// The connection the client reads it from now.
    pub conn: Option<usize>,
    /// The client's last event id for it (what a resume sends).
    pub last_id: String,
    pub expect: Expect,
    /// Reconnections made; a stream is given up after [`MAX_RETRIES`].
    pub retries: u32,
    /// A reconnection is due at this time.
    pub retry_at: Option<u64>,
    /// The client gave up on it (a refused resume the SDK cannot attach to the call).
    pub dead: bool,
}

pub const MAX_RETRIES: u32 = 12;

impl Logical {
    pub fn new(kind: Kind) -> Logical {
        Logical {
            kind,
            conn: None,
            last_id: String::new(),
            expect: Expect::default(),
            retries: 0,
            retry_at: None,
            dead: false,
        }
    }

    /// Whether the client still needs this stream.
    pub fn wanted(&self) -> bool {
        !self.dead
            && match &self.kind {
                Kind::Get => true,
                Kind::Call(c) => !c.settled,
            }
    }

    /// Whether a network drop may hit this stream: it dispatched something, and is not a call
    /// whose client holds no cursor (it could not resume it: its loss would be the network's,
    /// not the guard's; a replica that sends a call id-less notifications, `idless-progress`).
    pub fn droppable(&self) -> bool {
        self.expect.last.is_some()
            && !(matches!(self.kind, Kind::Call(_)) && self.last_id.is_empty())
    }
}

/// What one client connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Initialize,
    /// Reads logical stream `n`; `resume`: it carries a cursor.
    Stream {
        logical: usize,
        resume: bool,
    },
}

/// The client's end of a connection.
#[derive(Debug)]
pub struct ClientConn {
    pub client: usize,
    pub purpose: Purpose,
    pub parser: Parser,
    pub sse: bool,
    pub status: u32,
    /// The client stopped reading (closed, or left half-open).
    pub gone: bool,
    /// A resume that must continue (invariant 3 holds its preconditions).
    pub must_continue: bool,
}

pub struct Client {
    pub rng: Rng,
    pub session: Option<String>,
    pub initializing: bool,
    pub logicals: Vec<Logical>,
    pub calls: u64,
    /// Connections the client left half-open (the gateway never hears it is gone).
    pub half_open: Vec<usize>,
    /// Everything the application saw, normalized (invariant 4 compares these).
    pub outcomes: Vec<String>,
    names: HashMap<String, usize>,
    /// Odd JSON-RPC ids ([`crate::options::Options::odd_ids`]).
    pub odd_ids: u64,
}

impl Client {
    pub fn new(rng: Rng, odd_ids: u64) -> Client {
        Client {
            rng,
            session: None,
            initializing: false,
            logicals: Vec::new(),
            calls: 0,
            half_open: Vec::new(),
            outcomes: Vec::new(),
            names: HashMap::new(),
            odd_ids,
        }
    }

    /// A stable name for a session or stream id across runs (order of first appearance).
    pub fn name(&mut self, raw: String) -> usize {
        let n = self.names.len();
        *self.names.entry(raw).or_insert(n)
    }

    /// Records what the application saw at simulated time `now`.
    pub fn note(&mut self, now: u64, what: String) {
        self.outcomes.push(format!("{now} {what}"));
    }

    /// A new tool call: its id and body.
    pub fn new_call(&mut self, now: u64) -> Call {
        self.calls += 1;
        let n = self.calls;
        let kind = match self.odd_ids {
            6 => self.rng.below(6),
            k => k,
        };
        let params = r#""method":"tools/call","params":{"name":"work"}"#;
        let (raw_id, body) = match kind {
            1 => {
                let id = format!("1844674407370955161{n}00");
                (
                    id.clone(),
                    format!(r#"{{"jsonrpc":"2.0","id":{id},{params}}}"#),
                )
            }
            2 => (
                n.to_string(),
                format!(r#"{{"jsonrpc":"2.0","\u0069d":{n},{params}}}"#),
            ),
            3 => (
                (n + 1000).to_string(),
                format!(r#"{{"jsonrpc":"2.0","id":{n},{params},"id":{}}}"#, n + 1000),
            ),
            4 => (
                n.to_string(),
                format!(r#"[{{"jsonrpc":"2.0","id":{n},{params}}}]"#),
            ),
            5 => {
                let id = format!("\"{}{n}\"", "k".repeat(300));
                (
                    id.clone(),
                    format!(r#"{{"jsonrpc":"2.0","id":{id},{params}}}"#),
                )
            }
            _ => (
                n.to_string(),
                format!(r#"{{"jsonrpc":"2.0","id":{n},{params}}}"#),
            ),
        };
        let id = serde_json::from_str(&raw_id).unwrap_or(Value::Null);
        Call {
            raw_id,
            id,
            body,
            started: now,
            settled: false,
        }
    }
}
