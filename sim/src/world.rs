//! The simulation: every actor, the event loop, and the rules that move messages between them.
use std::collections::HashMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use mcp_resume_core::config::Config;
use mcp_resume_core::exchange::{Action, Exchange, MCP_RESUME_HEADER, OWNER_NOT_IN_CLUSTER};
use mcp_resume_core::ownership::RESUME_PATH;

use crate::client::{Call, Client, ClientConn, Kind, Logical, Purpose, MAX_RETRIES};
use crate::gateway::{Gateway, Out, ProxyStream, Waiter};
use crate::network::{Fifo, Network};
use crate::options::Options;
use crate::oracle::{read, Invariant, Oracle, Seen, Violation};
use crate::replica::{Behaviour, Replica, Request};
use crate::rng::Rng;
use crate::service::Service;
use mcp_resume_core::eventsource::Parser;

type Headers = Vec<(String, Vec<u8>)>;

/// The service's `record_wait` and re-check period (its defaults).
const RECORD_WAIT_MS: u64 = 150;
const RECHECK_MS: u64 = 50;
/// Refusals that records still in flight may turn into a continuation (`in_flight` in
/// ownership/src/resume.rs); the others are final at once.
const WAITED_REASONS: [&str; 3] = ["\"unknown_stream\"", "\"gap\"", "\"session_inactive\""];

/// What reaches a client on one connection.
#[derive(Debug)]
pub enum Delivery {
    Head { status: u32, headers: Headers },
    Body(Vec<u8>),
    End,
}

#[derive(Debug)]
pub enum Event {
    ClientWake(usize),
    /// A request reaches its gateway.
    AtGateway(usize),
    /// A callout reaches the ownership service.
    AtService {
        gw: usize,
        token: u32,
        path: String,
        body: Vec<u8>,
        /// When the request first reached the service (a resume may wait for records).
        since: u64,
    },
    CalloutAnswer {
        gw: usize,
        token: u32,
        status: Option<u32>,
        body: Vec<u8>,
    },
    /// A forwarded request reaches its replica.
    AtReplica(usize),
    UpHeaders {
        conn: usize,
        status: u32,
        headers: Headers,
        eos: bool,
    },
    UpBody {
        conn: usize,
        bytes: Vec<u8>,
        eos: bool,
    },
    ToClient(usize, Delivery),
    /// The client closed the connection; the gateway hears it.
    ClientGone(usize),
    /// A replica writes the next entry of a stream.
    Emit {
        replica: usize,
        uid: u64,
    },
    Tick(usize),
    Restart(usize),
}

/// Where a proxy stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Request,
    Upstream,
    Responding,
    /// The end is held for the store's word on the branch.
    Held,
    Done,
}

struct Conn {
    cc: ClientConn,
    ps: ProxyStream,
    stage: Stage,
    /// The request as the client sent it.
    req: Headers,
    body: Vec<u8>,
    call_id: Option<String>,
    draw: u64,
    latency: u64,
    up: Fifo,
    down: Fifo,
    replica: Option<usize>,
    uid: Option<u64>,
}

pub struct World {
    pub opts: Options,
    pub net: Network,
    faults: Rng,
    service: Service,
    gateways: Vec<Gateway>,
    replicas: Vec<Replica>,
    pub clients: Vec<Client>,
    conns: Vec<Conn>,
    oracle: Oracle,
    keyring_config: Config,
    /// Which replica serves each session.
    homes: HashMap<String, usize>,
    /// Which replica wrote each stream.
    stream_home: HashMap<u64, usize>,
    next_uid: u64,
    pub steps: u64,
    pub violation: Option<Violation>,
    /// Trace lines of the traced client, tagged with their logical stream.
    pub trace: Vec<(Option<usize>, String)>,
    blip_until: u64,
    pub stats: Stats,
}

/// What a run did (so a green run shows it exercised something).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub calls: u64,
    pub settled: u64,
    pub resumes: u64,
    /// Resumes answered 200 with no signal.
    pub continued: u64,
    pub signals: u64,
    pub events: u64,
    /// Resumes invariant 3 applied to.
    pub must_continue: u64,
}

/// The gateways' guard configuration: the shipped defaults, a small hold so large events are
/// cheap to make.
pub fn guard_config() -> Config {
    let json = r#"{"mcp_paths":["/mcp"],"ownership":{"cluster":"mcp_ownership"},
        "keys":[{"id":1,"secret":"CrQq8kW6A9UQeBDCHpoc1FZ68OUEs76V3D2tOzS7iNU=","active":true}],
        "max_event_hold_bytes":4096}"#;
    match Config::from_json(json.as_bytes()) {
        Ok(c) => c,
        Err(e) => unreachable!("the simulator's fixed config: {e}"),
    }
}

fn header<'h>(h: &'h Headers, name: &str) -> Option<&'h [u8]> {
    h.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn text(v: Option<&[u8]>) -> Option<String> {
    v.map(|b| String::from_utf8_lossy(b).into_owned())
}

impl World {
    pub fn new(opts: Options) -> World {
        let config = guard_config();
        let mut faults = Rng::fork(opts.seed, 0xfa17);
        let gateways = (0..opts.gateways)
            .map(|g| {
                let skew = if opts.skew_ms > 0 {
                    faults.below(opts.skew_ms)
                } else {
                    0
                };
                Gateway::new(guard_config(), skew, opts.seed ^ (g as u64 + 1))
            })
            .collect();
        let mut menu_rng = Rng::fork(opts.seed, 0x3e2);
        let replicas = (0..opts.replicas)
            .map(|r| {
                let mut b = opts.menu[menu_rng.index(opts.menu.len())].clone();
                if menu_rng.chance(300) {
                    for extra in &opts.menu[menu_rng.index(opts.menu.len())] {
                        if !b.contains(extra) {
                            b.push(*extra);
                        }
                    }
                }
                Replica::new(format!("10.0.0.{}:8080", r + 1), b)
            })
            .collect();
        let clients = (0..opts.clients)
            .map(|c| Client::new(Rng::fork(opts.seed, 0xc11e + c as u64), opts.odd_ids))
            .collect();
        let mut w = World {
            net: Network::default(),
            faults,
            service: Service::new(),
            gateways,
            replicas,
            clients,
            conns: Vec::new(),
            oracle: Oracle::default(),
            keyring_config: config,
            homes: HashMap::new(),
            stream_home: HashMap::new(),
            // Fixed-width numbers keep every session's bytes the same length in every run (a
            // client drops at a byte offset: invariant 4 compares runs).
            next_uid: 100_000,
            steps: 0,
            violation: None,
            trace: Vec::new(),
            blip_until: 0,
            stats: Stats::default(),
            opts,
        };
        for c in 0..w.clients.len() {
            if w.opts.only_client.is_none_or(|o| o == c) {
                let d = w.clients[c].rng.range(0, 50);
                w.net.after(d, Event::ClientWake(c));
            }
        }
        for g in 0..w.gateways.len() {
            w.net.after(g as u64, Event::Tick(g));
        }
        for r in 0..w.replicas.len() {
            if w.replicas[r].has(Behaviour::Restart) {
                let d = w.faults.range(2_000, 10_000);
                w.net.after(d, Event::Restart(r));
            }
        }
        w
    }

    /// Replica addresses and their behaviours (for the report).
    pub fn describe(&self) -> String {
        self.replicas
            .iter()
            .map(|r| {
                let b: Vec<_> = r.behaviours.iter().map(|b| b.name()).collect();
                format!("{}={}", r.addr, b.join("+"))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn traced(&self, client: usize) -> bool {
        self.opts.trace == Some(client)
    }

    /// A trace line of `client`, about its logical stream `l` (`None`: the client as a whole).
    fn log(&mut self, client: usize, l: Option<usize>, what: impl FnOnce() -> String) {
        if self.traced(client) {
            let line = format!("{:>8} ms  {}", self.net.now, what());
            self.trace.push((l, line));
        }
    }

    fn violate(&mut self, invariant: Invariant, client: usize, l: usize, what: String) {
        if self.violation.is_none() {
            self.log(client, Some(l), || {
                format!("VIOLATION {}: {what}", invariant.name())
            });
            self.violation = Some(Violation {
                invariant,
                client,
                logical: Some(l),
                what,
            });
        }
    }

    /// Runs until `steps` events, the end of events, or a violation.
    pub fn run(&mut self) {
        self.run_until(u64::MAX);
    }

    /// Runs every event due by simulated time `end` (within `steps`), or to a violation.
    pub fn run_until(&mut self, end: u64) {
        while self.steps < self.opts.steps
            && self.violation.is_none()
            && self.net.next_at().is_some_and(|t| t <= end)
        {
            let Some(ev) = self.net.pop() else {
                break;
            };
            self.steps += 1;
            self.step(ev);
        }
        if self.violation.is_none() {
            for c in 0..self.clients.len() {
                self.check_settled(c);
            }
        }
    }

    fn step(&mut self, ev: Event) {
        match ev {
            Event::ClientWake(c) => self.client_wake(c),
            Event::AtGateway(conn) => self.at_gateway(conn),
            Event::AtService {
                gw,
                token,
                path,
                body,
                since,
            } => self.at_service(gw, token, path, body, since),
            Event::CalloutAnswer {
                gw,
                token,
                status,
                body,
            } => self.callout_answer(gw, token, status, body),
            Event::AtReplica(conn) => self.at_replica(conn),
            Event::UpHeaders {
                conn,
                status,
                headers,
                eos,
            } => self.up_headers(conn, status, headers, eos),
            Event::UpBody { conn, bytes, eos } => self.up_body(conn, bytes, eos),
            Event::ToClient(conn, d) => self.at_client(conn, d),
            Event::ClientGone(conn) => self.finish_proxy(conn),
            Event::Emit { replica, uid } => self.emit(replica, uid),
            Event::Tick(g) => self.tick(g),
            Event::Restart(r) => self.restart(r),
        }
    }

    // ---------- clients ----------

    fn client_wake(&mut self, c: usize) {
        let next = self.clients[c].rng.range(20, 300);
        self.net.after(next, Event::ClientWake(c));
        self.check_settled(c);
        if self.violation.is_some() {
            return;
        }
        let now = self.net.now;
        // Reconnections that are due.
        for l in 0..self.clients[c].logicals.len() {
            let due = {
                let lg = &self.clients[c].logicals[l];
                lg.conn.is_none() && lg.wanted() && lg.retry_at.is_some_and(|t| t <= now)
            };
            if due {
                self.reconnect(c, l);
            }
        }
        if self.clients[c].session.is_none() {
            if !self.clients[c].initializing {
                self.clients[c].initializing = true;
                self.clients[c].calls += 1;
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{},"method":"initialize","params":{{}}}}"#,
                    self.clients[c].calls
                );
                let id = self.clients[c].calls.to_string();
                self.open(
                    c,
                    Purpose::Initialize,
                    "POST",
                    None,
                    body.into_bytes(),
                    Some(id),
                );
            }
            return;
        }
        let roll = self.clients[c].rng.below(100);
        let open_calls = self.clients[c]
            .logicals
            .iter()
            .filter(|l| matches!(&l.kind, Kind::Call(_)) && l.wanted())
            .count();
        let has_get = self.clients[c]
            .logicals
            .iter()
            .any(|l| matches!(l.kind, Kind::Get));
        match roll {
            0..=29 if open_calls < 2 => {
                self.stats.calls += 1;
                let call = self.clients[c].new_call(now);
                let body = call.body.clone().into_bytes();
                let id = call.raw_id.clone();
                self.clients[c]
                    .logicals
                    .push(Logical::new(Kind::Call(call)));
                let l = self.clients[c].logicals.len() - 1;
                self.log(c, Some(l), || format!("call #{l} id {id}"));
                self.open(
                    c,
                    Purpose::Stream {
                        logical: l,
                        resume: false,
                    },
                    "POST",
                    None,
                    body,
                    Some(id),
                );
            }
            30..=44 if !has_get => {
                self.clients[c].logicals.push(Logical::new(Kind::Get));
                let l = self.clients[c].logicals.len() - 1;
                self.open(
                    c,
                    Purpose::Stream {
                        logical: l,
                        resume: false,
                    },
                    "GET",
                    None,
                    Vec::new(),
                    None,
                );
            }
            45..=54 => self.drop_some(c, false),
            55..=57 => self.drop_some(c, true),
            58..=60 => self.resume_twice(c),
            61..=70 => {
                // Close a half-open connection at last.
                if let Some(conn) = self.clients[c].half_open.pop() {
                    let lat = self.conns[conn].latency;
                    self.net.after(lat, Event::ClientGone(conn));
                }
            }
            71..=80 if self.opts.attack && c != 0 => self.attack(c),
            _ => {}
        }
    }

    /// A stranger resumes with a cursor of client 0 (stolen) under its own session: it must
    /// be refused, and client 0 must never notice.
    fn attack(&mut self, c: usize) {
        let stolen: Vec<String> = self.clients[0]
            .logicals
            .iter()
            .filter(|l| !l.last_id.is_empty())
            .map(|l| l.last_id.clone())
            .collect();
        if stolen.is_empty() {
            return;
        }
        let cursor = stolen[self.clients[c].rng.index(stolen.len())].clone();
        let mut lg = Logical::new(Kind::Get);
        // One attempt: the attacker does not reconnect.
        lg.dead = true;
        self.clients[c].logicals.push(lg);
        let l = self.clients[c].logicals.len() - 1;
        self.open(
            c,
            Purpose::Stream {
                logical: l,
                resume: true,
            },
            "GET",
            Some(cursor),
            Vec::new(),
            None,
        );
    }

    /// Drops a connection the client reads (closed, or left half-open); it will resume.
    fn drop_some(&mut self, c: usize, half_open: bool) {
        let reading: Vec<usize> = self.clients[c]
            .logicals
            .iter()
            .enumerate()
            .filter(|(_, l)| l.conn.is_some() && l.expect.last.is_some())
            .map(|(i, _)| i)
            .collect();
        if reading.is_empty() {
            return;
        }
        let l = reading[self.clients[c].rng.index(reading.len())];
        self.leave(c, l, half_open);
    }

    fn leave(&mut self, c: usize, l: usize, half_open: bool) {
        let Some(conn) = self.clients[c].logicals[l].conn.take() else {
            return;
        };
        self.conns[conn].cc.gone = true;
        self.log(c, Some(l), || {
            format!(
                "client leaves conn {conn} of #{l} ({})",
                if half_open { "half-open" } else { "closed" }
            )
        });
        if half_open {
            self.clients[c].half_open.push(conn);
        } else {
            let lat = self.conns[conn].latency;
            self.net.after(lat, Event::ClientGone(conn));
        }
        self.schedule_retry(c, l);
    }

    fn schedule_retry(&mut self, c: usize, l: usize) {
        let delay = self.clients[c].rng.range(50, 1000);
        let at = self.net.now + delay;
        self.clients[c].logicals[l].retry_at = Some(at);
    }

    /// Resumes a stream it reads with the same cursor again (the first stays half-open).
    fn resume_twice(&mut self, c: usize) {
        let pick: Vec<usize> = self.clients[c]
            .logicals
            .iter()
            .enumerate()
            .filter(|(_, l)| l.conn.is_some() && !l.last_id.is_empty() && l.wanted())
            .map(|(i, _)| i)
            .collect();
        if pick.is_empty() {
            return;
        }
        let l = pick[self.clients[c].rng.index(pick.len())];
        self.leave(c, l, true);
        self.reconnect(c, l);
    }

    fn reconnect(&mut self, c: usize, l: usize) {
        let lg = &mut self.clients[c].logicals[l];
        lg.retry_at = None;
        lg.retries += 1;
        if lg.retries > MAX_RETRIES {
            lg.dead = true;
            return;
        }
        let cursor = (!lg.last_id.is_empty()).then(|| lg.last_id.clone());
        let is_call = matches!(lg.kind, Kind::Call(_));
        if is_call && cursor.is_none() {
            // Nothing to resume from: the call cannot go on.
            lg.dead = true;
            let what = "a call's stream ended without a cursor; the call cannot be resumed";
            self.log(c, Some(l), || what.to_owned());
            return;
        }
        self.stats.resumes += u64::from(cursor.is_some());
        // Invariant 3 needs the client to be the stream's only reader: no earlier connection
        // of this stream still open at the gateway.
        let others = self.clients[c].half_open.iter().any(|k| {
            let other = &self.conns[*k];
            other.stage != Stage::Done
                && matches!(other.cc.purpose, Purpose::Stream { logical, .. } if logical == l)
        });
        let must = cursor
            .as_deref()
            .is_some_and(|k| self.opts.check_continue && !others && self.valid_resume(k));
        let resume = cursor.is_some();
        let conn = self.open(
            c,
            Purpose::Stream { logical: l, resume },
            "GET",
            cursor,
            Vec::new(),
            None,
        );
        self.conns[conn].cc.must_continue = must;
        self.stats.must_continue += u64::from(must);
    }

    /// Invariant 3's preconditions for a resume with `cursor`: its owner is a correct replica
    /// that holds the stream, nobody reads it, and every record reached the store.
    fn valid_resume(&self, cursor: &str) -> bool {
        let Ok(d) = self.keyring_config.keyring.decode(cursor) else {
            return false;
        };
        let Some(uid) = d
            .replica_event_id
            .as_deref()
            .and_then(|id| id.split_once('-'))
            .and_then(|(u, _)| u.parse::<u64>().ok())
        else {
            return false;
        };
        let Some(r) = self.stream_home.get(&uid).map(|r| &self.replicas[*r]) else {
            return false;
        };
        let settled = self.gateways.iter().all(|g| {
            g.worker.queued_records() == 0 && g.callouts.values().all(|w| *w != Waiter::Records)
        });
        r.behaviours == [Behaviour::Correct] && r.current(uid) && r.readers(uid) == 0 && settled
    }

    /// Opens a client connection; returns its index.
    fn open(
        &mut self,
        c: usize,
        purpose: Purpose,
        method: &str,
        cursor: Option<String>,
        body: Vec<u8>,
        call_id: Option<String>,
    ) -> usize {
        let rng = &mut self.clients[c].rng;
        let gw = rng.index(self.gateways.len());
        let latency = rng.range(1, 20);
        let draw = rng.next_u64();
        let mut req: Headers = vec![
            (":method".into(), method.as_bytes().to_vec()),
            (":path".into(), b"/mcp".to_vec()),
            (
                "accept".into(),
                b"application/json, text/event-stream".to_vec(),
            ),
        ];
        if let Some(s) = &self.clients[c].session {
            req.push(("mcp-session-id".into(), s.as_bytes().to_vec()));
            req.push(("mcp-protocol-version".into(), b"2025-06-18".to_vec()));
        }
        if let Some(k) = &cursor {
            req.push(("last-event-id".into(), k.as_bytes().to_vec()));
        }
        // The client's event source keeps its last event id across connections (WHATWG): the
        // new connection's parser starts from it.
        let mut parser = Parser::new();
        if let Purpose::Stream { logical, .. } = purpose {
            let last = &self.clients[c].logicals[logical].last_id;
            if !last.is_empty() {
                parser.feed(format!("id: {last}\n\n").as_bytes(), &mut Vec::new());
            }
        }
        let conn = self.conns.len();
        let tag = match purpose {
            Purpose::Stream { logical, .. } => Some(logical),
            Purpose::Initialize => None,
        };
        self.log(c, tag, || {
            format!("conn {conn}: {method} {purpose:?} via gateway {gw} cursor {cursor:?}")
        });
        self.conns.push(Conn {
            cc: ClientConn {
                client: c,
                purpose,
                parser,
                sse: false,
                status: 0,
                gone: false,
                must_continue: false,
            },
            ps: ProxyStream {
                gw,
                ex: Exchange::new(),
                fwd: req.clone(),
                resp: Vec::new(),
            },
            stage: Stage::Request,
            req,
            body,
            call_id,
            draw,
            latency,
            up: Fifo::default(),
            down: Fifo::default(),
            replica: None,
            uid: None,
        });
        if let Purpose::Stream { logical, .. } = purpose {
            self.clients[c].logicals[logical].conn = Some(conn);
        }
        self.net.after(latency, Event::AtGateway(conn));
        conn
    }

    fn check_settled(&mut self, c: usize) {
        let now = self.net.now;
        let bound = self.opts.bound_ms;
        let late = self.clients[c]
            .logicals
            .iter()
            .enumerate()
            .find_map(|(i, l)| match &l.kind {
                Kind::Call(call) if !call.settled && now.saturating_sub(call.started) > bound => {
                    Some((i, call.raw_id.clone()))
                }
                _ => None,
            });
        if let Some((l, id)) = late {
            self.violate(
                Invariant::Settles,
                c,
                l,
                format!("call id {id} has not settled within {bound} ms"),
            );
        }
    }

    fn at_client(&mut self, conn: usize, d: Delivery) {
        let c = self.conns[conn].cc.client;
        if self.conns[conn].cc.gone {
            return;
        }
        let Purpose::Stream { logical: l, resume } = self.conns[conn].cc.purpose else {
            if let Delivery::Head { status, headers } = d {
                let sid = text(header(&headers, "mcp-session-id"));
                self.clients[c].initializing = false;
                if (200..300).contains(&status) {
                    self.clients[c].session = sid;
                }
                self.conns[conn].cc.gone = true;
            }
            return;
        };
        match d {
            Delivery::Head { status, headers } => self.head(c, conn, l, resume, status, &headers),
            Delivery::Body(bytes) => self.body(c, conn, l, bytes),
            Delivery::End => {
                self.log(c, Some(l), || format!("conn {conn} ended"));
                self.conns[conn].cc.gone = true;
                if self.clients[c].logicals[l].conn == Some(conn) {
                    self.clients[c].logicals[l].conn = None;
                    if self.clients[c].logicals[l].wanted() {
                        self.schedule_retry(c, l);
                    }
                }
            }
        }
    }

    fn head(&mut self, c: usize, conn: usize, l: usize, resume: bool, status: u32, h: &Headers) {
        let signal = header(h, MCP_RESUME_HEADER).map(|v| String::from_utf8_lossy(v).into_owned());
        self.log(c, Some(l), || {
            format!("conn {conn}: {status} mcp-resume={signal:?}")
        });
        let sse = h.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("content-type")
                && String::from_utf8_lossy(v).contains("text/event-stream")
        });
        self.conns[conn].cc.sse = sse;
        self.conns[conn].cc.status = status;
        let outcome = format!("#{l} {status} signal={}", signal.is_some());
        self.clients[c].note(self.net.now, outcome);
        if signal.is_some() {
            self.stats.signals += 1;
            self.clients[c].logicals[l].expect.signal();
        } else if resume && status == 200 {
            self.stats.continued += 1;
        }
        if self.conns[conn].cc.must_continue && (signal.is_some() || status != 200) {
            self.violate(
                Invariant::Continues,
                c,
                l,
                format!("a valid resume was answered {status}, mcp-resume {signal:?}"),
            );
            return;
        }
        let ok = (200..300).contains(&status);
        let lg = &mut self.clients[c].logicals[l];
        if let Kind::Call(call) = &mut lg.kind {
            if !ok {
                if !resume || signal.is_some() {
                    // The SDK rejects the call with the HTTP error (or the guard's named refusal).
                    call.settled = true;
                } else {
                    // A failed resume the SDK cannot attach to the call: it stays pending.
                    lg.dead = true;
                }
            }
        }
    }

    fn body(&mut self, c: usize, conn: usize, l: usize, mut bytes: Vec<u8>) {
        if !self.conns[conn].cc.sse {
            return;
        }
        // Drop at any byte: the client reads a prefix and goes.
        let drop = self.clients[c].logicals[l].conn == Some(conn)
            && self.clients[c].logicals[l].expect.last.is_some()
            && self.clients[c].rng.chance(self.opts.drop_per_mille);
        if drop {
            let keep = self.clients[c].rng.index(bytes.len() + 1);
            bytes.truncate(keep);
        }
        let mut out = Vec::new();
        self.conns[conn].cc.parser.feed(&bytes, &mut out);
        for d in out {
            self.dispatched(c, conn, l, &d);
            if self.violation.is_some() {
                return;
            }
        }
        let after = self.conns[conn].cc.parser.last_event_id().to_owned();
        if after != self.clients[c].logicals[l].last_id
            && self.clients[c].logicals[l].conn == Some(conn)
        {
            if !after.is_empty() && self.keyring_config.keyring.decode(&after).is_err() {
                self.violate(
                    Invariant::Cursor,
                    c,
                    l,
                    format!("the client holds the id {after:?}, which is not a cursor"),
                );
                return;
            }
            self.clients[c].logicals[l].last_id = after;
        }
        if drop {
            self.leave(c, l, false);
        }
    }

    fn dispatched(
        &mut self,
        c: usize,
        conn: usize,
        l: usize,
        d: &mcp_resume_core::eventsource::Dispatch,
    ) {
        let seen = read(d);
        let session = self.clients[c].session.clone().unwrap_or_default();
        let must = self.conns[conn].cc.must_continue;
        match seen {
            Seen::Signal => {
                self.log(c, Some(l), || format!("conn {conn}: signal {}", d.data));
                self.clients[c].note(self.net.now, format!("#{l} signal {}", d.data));
                self.clients[c].logicals[l].expect.signal();
                if must {
                    self.violate(
                        Invariant::Continues,
                        c,
                        l,
                        format!("a valid resume was refused: {}", d.data),
                    );
                }
            }
            Seen::Error { id } => {
                let lg = &mut self.clients[c].logicals[l];
                if let Kind::Call(call) = &mut lg.kind {
                    if id == call.id {
                        call.settled = true;
                        self.stats.settled += 1;
                        lg.expect.signal();
                        self.clients[c].note(self.net.now, format!("#{l} settled by error"));
                    } else {
                        let what = format!(
                            "the call's stream answered an error for id {id}, the call's id is {}: it stays pending",
                            call.raw_id
                        );
                        self.violate(Invariant::Settles, c, l, what);
                    }
                }
            }
            Seen::Entry {
                session: s,
                uid,
                index,
                result,
            } => {
                self.log(c, Some(l), || {
                    format!("conn {conn}: dispatch stream {uid} #{index}")
                });
                // The resume continued: what ends its stream later is judged by invariants 1, 2.
                self.conns[conn].cc.must_continue = false;
                let mut expect = self.clients[c].logicals[l].expect;
                if let Err(what) = self.oracle.entry(&session, &mut expect, (&s, uid, index)) {
                    self.violate(Invariant::NextEvent, c, l, what);
                    return;
                }
                let name = self.clients[c].name(format!("u{uid}"));
                self.clients[c].note(self.net.now, format!("#{l} event {name}/{index}"));
                self.stats.events += 1;
                let lg = &mut self.clients[c].logicals[l];
                lg.expect = expect;
                if let (Kind::Call(call), Some(id)) = (&mut lg.kind, result) {
                    if id == call.id {
                        call.settled = true;
                        self.stats.settled += 1;
                    }
                }
            }
            Seen::Other => {}
        }
    }

    // ---------- gateways ----------

    fn tick(&mut self, g: usize) {
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, None, None);
        gw.worker.on_tick(&mut gw.host);
        let every = gw.worker.tick_ms();
        let outs = gw.effects(Waiter::Records, None);
        self.outs(g, None, outs);
        self.net.after(every.max(1), Event::Tick(g));
    }

    fn at_gateway(&mut self, conn: usize) {
        if self.conns[conn].stage == Stage::Done {
            return;
        }
        let c = &mut self.conns[conn];
        let g = c.ps.gw;
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, None, None);
        let req = c.req.clone();
        let action =
            c.ps.ex
                .on_request_headers(&mut gw.worker, &mut gw.host, Some(&req));
        if c.ps.ex.wants_request_body() {
            c.ps.ex.on_request_body(Some(&c.body), true);
        }
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        let local = outs.iter().any(|o| matches!(o, Out::Local { .. }));
        self.outs(g, Some(conn), outs);
        if action == Action::Continue && !local {
            self.forward(conn);
        }
    }

    fn forward(&mut self, conn: usize) {
        let c = &mut self.conns[conn];
        if c.stage != Stage::Request {
            return;
        }
        c.stage = Stage::Upstream;
        let at = c.up.due(self.net.now, c.latency);
        self.net.at(at, Event::AtReplica(conn));
    }

    fn outs(&mut self, g: usize, conn: Option<usize>, outs: Vec<Out>) {
        for o in outs {
            match o {
                Out::Forward => {
                    if let Some(conn) = conn {
                        self.forward(conn);
                    }
                }
                Out::Local {
                    status,
                    headers,
                    body,
                } => {
                    if let Some(conn) = conn {
                        self.deliver(conn, Delivery::Head { status, headers });
                        self.deliver(conn, Delivery::Body(body));
                        self.deliver(conn, Delivery::End);
                        self.finish_proxy(conn);
                    }
                }
                Out::Callout {
                    token,
                    path,
                    body,
                    timeout_ms,
                } => {
                    // Envoy answers a callout that outlives its timeout with its own 504.
                    self.net.after(
                        timeout_ms,
                        Event::CalloutAnswer {
                            gw: g,
                            token,
                            status: Some(504),
                            body: Vec::new(),
                        },
                    );
                    if !self.faults.chance(self.opts.callout_loss_per_mille) {
                        let lat = self.service_latency();
                        let since = self.net.now + lat;
                        self.net.after(
                            lat,
                            Event::AtService {
                                gw: g,
                                token,
                                path,
                                body,
                                since,
                            },
                        );
                    }
                }
                Out::Body(b) => {
                    if let Some(conn) = conn {
                        if !b.is_empty() {
                            self.deliver(conn, Delivery::Body(b));
                        }
                    }
                }
                Out::Finish(b) => {
                    if let Some(conn) = conn {
                        self.deliver(conn, Delivery::Body(b));
                        self.deliver(conn, Delivery::End);
                        self.finish_proxy(conn);
                    }
                }
                Out::Reset => {
                    if let Some(conn) = conn {
                        self.deliver(conn, Delivery::End);
                        self.finish_proxy(conn);
                    }
                }
            }
        }
    }

    fn deliver(&mut self, conn: usize, d: Delivery) {
        let c = &mut self.conns[conn];
        let at = c.down.due(self.net.now, c.latency);
        self.net.at(at, Event::ToClient(conn, d));
    }

    /// The proxy is done with the stream (ended, reset, or the client went away).
    fn finish_proxy(&mut self, conn: usize) {
        let c = &mut self.conns[conn];
        if c.stage == Stage::Done {
            return;
        }
        c.stage = Stage::Done;
        let g = c.ps.gw;
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, None, None);
        c.ps.ex.on_stream_end(&mut gw.worker, &mut gw.host);
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        if let (Some(r), Some(uid)) = (c.replica, c.uid) {
            self.replicas[r].drop_reader(uid, conn);
        }
        self.outs(g, None, outs);
    }

    /// One message's way between a gateway and the service.
    fn service_latency(&mut self) -> u64 {
        let jitter = match self.opts.service_jitter_ms {
            0 => 0,
            j => self.faults.below(j + 1),
        };
        1 + self.opts.service_latency_ms + jitter
    }

    fn at_service(&mut self, gw: usize, token: u32, path: String, body: Vec<u8>, since: u64) {
        let (status, answer) = if self.net.now < self.blip_until {
            (503, Vec::new())
        } else {
            self.service.handle(self.net.now, &path, body.clone())
        };
        // The service's wait for records still travelling (`record_wait`, polled every
        // RECHECK): a refusal records could still turn is decided again a little later.
        if status == 200
            && path == RESUME_PATH
            && self.net.now + RECHECK_MS <= since + RECORD_WAIT_MS
            && WAITED_REASONS.iter().any(|r| {
                answer.starts_with(br#"{"verdict":"new_stream""#)
                    && answer.windows(r.len()).any(|w| w == r.as_bytes())
            })
        {
            self.net.after(
                RECHECK_MS,
                Event::AtService {
                    gw,
                    token,
                    path,
                    body,
                    since,
                },
            );
            return;
        }
        let body = answer;
        if self.faults.chance(self.opts.store_blip_per_mille) {
            self.blip_until = self.net.now + self.faults.range(10, 500);
        }
        if self.opts.store_wipe_per_mille > 0 && self.faults.chance(self.opts.store_wipe_per_mille)
        {
            self.service.wipe();
        }
        let lat = self.service_latency();
        self.net.after(
            lat,
            Event::CalloutAnswer {
                gw,
                token,
                status: Some(status),
                body,
            },
        );
    }

    fn callout_answer(&mut self, g: usize, token: u32, status: Option<u32>, body: Vec<u8>) {
        let Some(waiter) = self.gateways[g].callouts.remove(&token) else {
            return;
        };
        match waiter {
            Waiter::Records => {
                let gw = &mut self.gateways[g];
                gw.enter(self.net.now, None, None);
                gw.worker
                    .on_records_response(&mut gw.host, token, status, Some(&body));
                let outs = gw.effects(Waiter::Records, None);
                self.outs(g, None, outs);
            }
            Waiter::Conn(conn) => {
                let c = &mut self.conns[conn];
                if c.stage == Stage::Done {
                    return;
                }
                let addr = c.replica.map(|r| self.replicas[r].addr.clone());
                let gw = &mut self.gateways[g];
                gw.enter(self.net.now, addr.as_deref(), None);
                c.ps.ex.on_callout_response(
                    &mut gw.worker,
                    &mut gw.host,
                    token,
                    status,
                    Some(&body),
                );
                let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
                self.outs(g, Some(conn), outs);
            }
        }
    }

    // ---------- replicas ----------

    fn at_replica(&mut self, conn: usize) {
        if self.conns[conn].stage == Stage::Done {
            return;
        }
        let fwd = self.conns[conn].ps.fwd.clone();
        let session = text(header(&fwd, "mcp-session-id"));
        let pin = header(&fwd, &self.keyring_config.owner_header)
            .and_then(|v| STANDARD.decode(v).ok())
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let r = match &pin {
            Some(addr) => self.replicas.iter().position(|r| &r.addr == addr),
            None => match &session {
                Some(s) => self.homes.get(s).copied(),
                None => {
                    let c = self.conns[conn].cc.client;
                    Some(self.clients[c].rng.index(self.replicas.len()))
                }
            },
        };
        let Some(r) = r else {
            // Strict stateful_session: the pinned owner is not in the cluster.
            let c = &mut self.conns[conn];
            let at = c.up.due(self.net.now, c.latency);
            let headers = vec![(":status".to_owned(), b"503".to_vec())];
            self.net.at(
                at,
                Event::UpHeaders {
                    conn,
                    status: 503,
                    headers,
                    eos: true,
                },
            );
            return;
        };
        self.conns[conn].replica = Some(r);
        let method = text(header(&fwd, ":method")).unwrap_or_default();
        let lei = text(header(&fwd, "last-event-id"));
        let c = &self.conns[conn];
        let req = Request {
            method: &method,
            session: session.as_deref(),
            last_event_id: lei.as_deref(),
            call_id: c.call_id.as_deref(),
            draw: c.draw,
        };
        let uid = self.next_uid;
        let Some(reply) = self.replicas[r].handle(&req, conn, uid) else {
            return;
        };
        for e in reply.ended {
            self.up(e, Vec::new(), true);
        }
        if let Some(sid) = text(header(&reply.headers, "mcp-session-id")) {
            self.homes.insert(sid, r);
        }
        if reply.stream == Some(uid) {
            self.next_uid += 1;
            self.stream_home.insert(uid, r);
            let d = self.replicas[r].pace(uid);
            self.net.after(d, Event::Emit { replica: r, uid });
        }
        let c = &mut self.conns[conn];
        c.uid = reply.stream;
        let mut headers = vec![(":status".to_owned(), reply.status.to_string().into_bytes())];
        headers.extend(reply.headers);
        let at = c.up.due(self.net.now, c.latency);
        let eos = reply.eos && reply.body.is_empty();
        self.net.at(
            at,
            Event::UpHeaders {
                conn,
                status: reply.status,
                headers,
                eos,
            },
        );
        if !eos {
            self.up(conn, reply.body, reply.eos);
        }
    }

    fn up(&mut self, conn: usize, bytes: Vec<u8>, eos: bool) {
        let c = &mut self.conns[conn];
        let at = c.up.due(self.net.now, c.latency);
        self.net.at(at, Event::UpBody { conn, bytes, eos });
    }

    fn emit(&mut self, r: usize, uid: u64) {
        let Some((bytes, readers, done, written)) = self.replicas[r].emit(uid) else {
            return;
        };
        self.oracle.written(&written);
        for conn in readers {
            self.up(conn, bytes.clone(), done);
        }
        if !done {
            let d = self.replicas[r].pace(uid);
            self.net.after(d, Event::Emit { replica: r, uid });
        }
    }

    fn restart(&mut self, r: usize) {
        for conn in self.replicas[r].restart() {
            self.up(conn, Vec::new(), true);
        }
        let d = self.faults.range(2_000, 10_000);
        self.net.after(d, Event::Restart(r));
    }

    fn up_headers(&mut self, conn: usize, status: u32, headers: Headers, eos: bool) {
        let c = &mut self.conns[conn];
        if c.stage != Stage::Upstream {
            return;
        }
        c.stage = Stage::Responding;
        let g = c.ps.gw;
        let addr = c.replica.map(|r| self.replicas[r].addr.clone());
        let details = addr.is_none().then_some(OWNER_NOT_IN_CLUSTER);
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, addr.as_deref(), details);
        c.ps.resp = headers.clone();
        if c.ps.ex.wants_response_headers() {
            c.ps.ex
                .on_response_headers(&mut gw.worker, &mut gw.host, Some(&headers), eos);
        } else {
            c.ps.ex
                .on_response_headers_unread(&mut gw.worker, &mut gw.host);
        }
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        if outs.iter().any(|o| matches!(o, Out::Local { .. })) {
            // The guard replaced the upstream's response.
            if let (Some(r), Some(uid)) = (c.replica, c.uid) {
                self.replicas[r].drop_reader(uid, conn);
            }
            self.outs(g, Some(conn), outs);
            return;
        }
        let resp: Headers =
            c.ps.resp
                .iter()
                .filter(|(k, _)| k != ":status")
                .cloned()
                .collect();
        self.deliver(
            conn,
            Delivery::Head {
                status,
                headers: resp,
            },
        );
        self.outs(g, Some(conn), outs);
        if eos {
            self.deliver(conn, Delivery::End);
            self.finish_proxy(conn);
        }
    }

    fn up_body(&mut self, conn: usize, bytes: Vec<u8>, eos: bool) {
        let c = &mut self.conns[conn];
        if c.stage != Stage::Responding {
            return;
        }
        let g = c.ps.gw;
        if !c.ps.ex.wants_body() {
            if !bytes.is_empty() {
                self.deliver(conn, Delivery::Body(bytes));
            }
            if eos {
                self.deliver(conn, Delivery::End);
                self.finish_proxy(conn);
            }
            return;
        }
        let addr = c.replica.map(|r| self.replicas[r].addr.clone());
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, addr.as_deref(), None);
        let action =
            c.ps.ex
                .on_response_body(&mut gw.worker, &mut gw.host, Some(&bytes), eos);
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        let ended = outs
            .iter()
            .any(|o| matches!(o, Out::Reset | Out::Finish(_) | Out::Local { .. }));
        if action == Action::Pause {
            c.stage = Stage::Held;
        }
        self.outs(g, Some(conn), outs);
        if eos && !ended && action == Action::Continue {
            self.deliver(conn, Delivery::End);
            self.finish_proxy(conn);
        }
    }

    /// Calls the client has and whether each settled (for reports).
    pub fn unsettled(&self) -> usize {
        self.clients
            .iter()
            .flat_map(|c| &c.logicals)
            .filter(|l| matches!(&l.kind, Kind::Call(Call { settled: false, .. })))
            .count()
    }
}
