//! A gateway: one guard worker (the real `Worker`) behind a `MockHost` on the gateway's own
//! (possibly skewed) clock, and the proxy streams it carries. The host records what the
//! exchange told it; this module turns those effects into what the proxy does.
use std::collections::HashMap;

use mcp_resume_core::config::Config;
use mcp_resume_core::exchange::{Exchange, Worker};
use mcp_resume_core::host::{Effect, MockHost};

/// Who waits for a callout's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiter {
    Conn(usize),
    Records,
}

pub struct Gateway {
    pub worker: Worker,
    pub host: MockHost,
    /// Added to the simulated clock (clock skew between gateways).
    pub skew_ms: u64,
    pub callouts: HashMap<u32, Waiter>,
}

/// What the proxy does after an exchange callback.
#[derive(Debug)]
pub enum Out {
    /// Forward the held request upstream.
    Forward,
    /// Answer locally (replaces any upstream response).
    Local {
        status: u32,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    },
    Callout {
        token: u32,
        path: String,
        body: Vec<u8>,
        timeout_ms: u64,
    },
    Body(Vec<u8>),
    /// The held response's tail, then its end.
    Finish(Vec<u8>),
    Reset,
}

/// The proxy's side of one client request.
pub struct ProxyStream {
    pub gw: usize,
    pub ex: Exchange,
    /// The request headers as they go upstream (the guard's edits applied).
    pub fwd: Vec<(String, Vec<u8>)>,
    /// The response headers as they go to the client.
    pub resp: Vec<(String, Vec<u8>)>,
}

fn set(h: &mut Vec<(String, Vec<u8>)>, k: &str, v: &str) {
    h.retain(|(n, _)| !n.eq_ignore_ascii_case(k));
    h.push((k.to_owned(), v.as_bytes().to_vec()));
}

fn remove(h: &mut Vec<(String, Vec<u8>)>, k: &str) {
    h.retain(|(n, _)| !n.eq_ignore_ascii_case(k));
}

impl Gateway {
    pub fn new(config: Config, skew_ms: u64, seed: u64) -> Gateway {
        let mut host = MockHost::new();
        host.rng = seed;
        Gateway {
            worker: Worker::new(config),
            host,
            skew_ms,
            callouts: HashMap::new(),
        }
    }

    /// Prepares the host for a callback at simulated `now` on behalf of `upstream`.
    pub fn enter(&mut self, now: u64, upstream: Option<&str>, details: Option<&str>) {
        self.host.now_ms = now + self.skew_ms;
        self.host.upstream = upstream.map(str::to_owned);
        self.host.code_details = details.map(str::to_owned);
    }

    /// Turns the recorded effects into proxy actions; callouts are remembered for `waiter`.
    pub fn effects(&mut self, waiter: Waiter, ps: Option<&mut ProxyStream>) -> Vec<Out> {
        let mut out = Vec::new();
        let mut ps = ps;
        for e in self.host.take() {
            match e {
                Effect::SetRequestHeader(k, v) => {
                    if let Some(p) = ps.as_deref_mut() {
                        set(&mut p.fwd, &k, &v);
                    }
                }
                Effect::RemoveRequestHeader(k) => {
                    if let Some(p) = ps.as_deref_mut() {
                        remove(&mut p.fwd, &k);
                    }
                }
                Effect::SetResponseHeader(k, v) => {
                    if let Some(p) = ps.as_deref_mut() {
                        set(&mut p.resp, &k, &v);
                    }
                }
                Effect::RemoveResponseHeader(k) => {
                    if let Some(p) = ps.as_deref_mut() {
                        remove(&mut p.resp, &k);
                    }
                }
                Effect::LocalResponse {
                    status,
                    headers,
                    body,
                } => out.push(Out::Local {
                    status: u32::from(status),
                    headers: headers
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect(),
                    body,
                }),
                Effect::ResumeRequest => out.push(Out::Forward),
                Effect::BodyChunk(b) => out.push(Out::Body(b)),
                Effect::FinishHeld(b) => out.push(Out::Finish(b)),
                Effect::ResetResponse => out.push(Out::Reset),
                Effect::Dispatch {
                    token,
                    headers,
                    body,
                    timeout_ms,
                    ..
                } => {
                    let path = headers
                        .iter()
                        .find(|(k, _)| k == ":path")
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default();
                    self.callouts.insert(token, waiter);
                    out.push(Out::Callout {
                        token,
                        path,
                        body,
                        timeout_ms,
                    });
                }
                Effect::Log(..) => {}
            }
        }
        out
    }
}
