//! The simulation: every actor, the event loop, and the rules that move messages between them.
use std::collections::HashMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use mcp_resume_core::config::Config;
use mcp_resume_core::exchange::{Action, Exchange, MCP_RESUME_HEADER, OWNER_NOT_IN_CLUSTER};
use mcp_resume_core::ownership::{BRANCH_PATH, RESUME_PATH};

use crate::client::{Client, ClientConn, Kind, Logical, Purpose, MAX_RETRIES};
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
    /// A continuation's deadline for its owner's response headers (the adapters' timer).
    Deadline(usize),
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
    /// The upstream's response head the guard holds (its headers hook paused): delivered before
    /// the first body byte or end that passes, dropped for a local reply.
    head: Option<(u32, Headers)>,
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
/// cheap to make, and a mid-replay stall bound as short as the first event's (the sim's clients
/// always read, so only a stalled owner waits there; `stall-midway` runs with a 15 s bound).
pub fn guard_config() -> Config {
    let json = r#"{"mcp_paths":["/mcp"],"ownership":{"cluster":"mcp_ownership"},
        "keys":[{"id":1,"secret":"CrQq8kW6A9UQeBDCHpoc1FZ68OUEs76V3D2tOzS7iNU=","active":true}],
        "max_event_hold_bytes":4096,"replay_stall_timeout_ms":5000}"#;
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
        let (service, broken) = match Service::open(&opts.store, opts.limits()) {
            Ok(s) => (s, None),
            Err(e) => (Service::new(), Some(e)),
        };
        let mut w = World {
            net: Network::default(),
            faults,
            service,
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
            // A store that cannot be used fails the run at once, naming why.
            violation: broken.map(|what| Violation {
                invariant: Invariant::Store,
                client: 0,
                logical: None,
                what,
            }),
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
            Event::Deadline(conn) => self.deadline(conn),
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
}

mod clients;
mod proxy;
mod upstream;
