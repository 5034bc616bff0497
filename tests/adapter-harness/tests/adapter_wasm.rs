//! The proxy-wasm adapter's glue: the real release `.wasm` (built first if stale) under the
//! test host, through every scenario.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mcp_adapter_harness::scenarios::{Attribute, Callout, Flow, Proxy, Reply};
use mcp_adapter_harness::wasm::{build_guard_wasm, load, Action, Headers, Module, Vm};
use std::sync::OnceLock;

/// The module, built and loaded once per test run.
fn module() -> &'static Module {
    static MODULE: OnceLock<Module> = OnceLock::new();
    MODULE.get_or_init(|| {
        let path = build_guard_wasm().unwrap_or_else(|e| panic!("{e}"));
        let wasm = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        load(&wasm).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

struct Wasm(Vm);

fn flow(a: Result<Action, String>) -> Flow {
    match a.unwrap_or_else(|e| panic!("{e}")) {
        Action::Continue => Flow::Continue,
        Action::Pause => Flow::Stop,
    }
}

impl Proxy for Wasm {
    const HOLDS_HEADERS: bool = false;
    fn start(config: &str) -> Result<Self, String> {
        Vm::start(module(), config.as_bytes()).map(Wasm)
    }
    fn new_stream(&mut self) -> u32 {
        self.0.new_stream().unwrap()
    }
    fn request_headers(&mut self, s: u32, h: Headers, eos: bool) -> Flow {
        flow(self.0.request_headers(s, h, eos))
    }
    fn request_body(&mut self, s: u32, chunk: &[u8], eos: bool) -> Flow {
        flow(self.0.request_body(s, chunk, eos))
    }
    fn response_headers(&mut self, s: u32, h: Headers, eos: bool) -> Flow {
        flow(self.0.response_headers(s, h, eos))
    }
    fn response_body(&mut self, s: u32, chunk: &[u8], eos: bool) -> Flow {
        flow(self.0.response_body(s, chunk, eos))
    }
    fn callout_answer(&mut self, token: u32, status: Option<u32>, body: &[u8]) {
        let h = status.map(|s| vec![(":status".to_string(), s.to_string().into_bytes())]);
        self.0.http_call_response(token, h, body).unwrap();
    }
    fn tick(&mut self) {
        self.0.tick().unwrap();
    }
    fn advance_ms(&mut self, ms: u64) {
        self.0.advance_ms(ms);
    }
    fn end_stream(&mut self, s: u32) {
        self.0.end_stream(s).unwrap();
    }
    fn set_attribute(&mut self, s: u32, a: Attribute, value: &str) {
        let key = match a {
            Attribute::UpstreamAddress => "upstream.address",
            Attribute::ResponseCodeDetails => "response.code_details",
        };
        let props = &mut self.0.stream_mut(s).properties;
        props.insert(key.to_string(), value.as_bytes().to_vec());
    }
    fn callouts(&self) -> Vec<Callout> {
        let root = self.0.state().root_context;
        self.0
            .state()
            .callouts
            .iter()
            .map(|c| Callout {
                token: c.token,
                from_stream: c.context != root,
                cluster: c.cluster.clone(),
                headers: c.headers.clone(),
                body: c.body.clone(),
            })
            .collect()
    }
    fn upstream_headers(&self, s: u32) -> Headers {
        self.0.stream(s).request_headers.clone()
    }
    fn upstream_body(&self, s: u32) -> Vec<u8> {
        self.0.stream(s).upstream_body.clone()
    }
    fn client_headers(&self, s: u32) -> Headers {
        self.0.stream(s).response_headers.clone()
    }
    fn client_body(&self, s: u32) -> Vec<u8> {
        self.0.stream(s).client_body.clone()
    }
    fn local_replies(&self, s: u32) -> Vec<Reply> {
        let r = &self.0.stream(s).local_replies;
        r.iter()
            .map(|r| (r.status, r.headers.clone(), r.body.clone()))
            .collect()
    }
    fn resumed(&self, s: u32) -> bool {
        self.0.stream(s).continued.contains(&0)
    }
    fn was_reset(&self, s: u32) -> bool {
        !self.0.stream(s).closed.is_empty()
    }
    fn held(&self, s: u32) -> bool {
        self.0.stream(s).held
    }
    fn counter(&self, name: &str) -> Option<i64> {
        self.0.state().metric(name)
    }
    fn histogram_samples(&self, name: &str) -> usize {
        let m = &self.0.state().metrics;
        m.iter()
            .find(|m| m.name == name)
            .map_or(0, |m| m.samples.len())
    }
    fn metrics_defined(&self) -> usize {
        self.0.state().metrics.len()
    }
}

mcp_adapter_harness::adapter_tests!(Wasm);

/// Nothing the guard did in these scenarios failed at the host: no warning was logged.
#[test]
fn a_stream_logs_no_host_call_failure() {
    mcp_adapter_harness::scenarios::on_big_stack(no_host_call_failure);
}

fn no_host_call_failure() {
    let mut p = <Wasm as Proxy>::start(&mcp_adapter_harness::scenarios::config()).unwrap();
    let s = p.new_stream();
    let h = mcp_adapter_harness::wasm::headers(&[(":method", "GET"), (":path", "/mcp")]);
    p.request_headers(s, h, true);
    p.end_stream(s);
    assert!(
        p.0.state().tick_ms.is_some(),
        "the tick is set up at configuration"
    );
    let warnings = p.0.state().logs_at_least(3);
    assert!(warnings.is_empty(), "{warnings:?}");
}

/// Host calls and allocation callbacks of one hook or group of hooks, counted by the test host.
#[derive(Debug, PartialEq, Eq)]
struct Cost {
    calls: u32,
    allocations: u32,
}

fn cost(p: &mut Wasm, f: impl FnOnce(&mut Wasm)) -> (Cost, String) {
    p.0.state_mut().clear_counts();
    f(p);
    let s = p.0.state();
    let mut names: Vec<_> = s.calls.iter().map(|(k, v)| format!("{k}×{v}")).collect();
    names.sort();
    let c = Cost {
        calls: s.host_calls(),
        allocations: s.allocations,
    };
    (c, names.join(" "))
}

/// What an SSE GET costs in host calls once its worker is warm (another stream opened since the
/// last tick): the stream's setup (request and response headers), a chunk the guard rewrites,
/// and a chunk it leaves as it is. Counted, so a change in either direction shows.
#[test]
fn host_calls_per_sse_get() {
    mcp_adapter_harness::scenarios::on_big_stack(sse_get_costs);
}

fn sse_get(p: &mut Wasm, sid: &str) -> (Cost, String, Cost, String, Cost, String) {
    use mcp_adapter_harness::scenarios::{headers, OWNER};
    let s = p.new_stream();
    let req = headers(&[
        (":method", "GET"),
        (":path", "/mcp"),
        (":authority", "mcp.example"),
        ("mcp-session-id", sid),
    ]);
    let resp = headers(&[(":status", "200"), ("content-type", "text/event-stream")]);
    p.set_attribute(s, Attribute::UpstreamAddress, OWNER);
    let (setup, setup_names) = cost(p, |p| {
        assert_eq!(p.request_headers(s, req, true), Flow::Continue);
        assert_eq!(p.response_headers(s, resp, false), Flow::Continue);
    });
    let (rewritten, rw_names) = cost(p, |p| {
        p.response_body(s, b"id: e1\ndata: a\n\n", false);
    });
    let (unchanged, un_names) = cost(p, |p| {
        p.response_body(s, b": keep-alive\n\n", false);
    });
    let body = p.client_body(s);
    assert!(body.ends_with(b": keep-alive\n\n"), "{body:?}");
    p.end_stream(s);
    (setup, setup_names, rewritten, rw_names, unchanged, un_names)
}

fn sse_get_costs() {
    let mut p = <Wasm as Proxy>::start(&mcp_adapter_harness::scenarios::config()).unwrap();
    // The first stream of the worker seeds its incarnations and reads its clock.
    let first = sse_get(&mut p, "s-0");
    let warm = sse_get(&mut p, "s-1");
    eprintln!("first SSE GET setup: {:?} {}", first.0, first.1);
    eprintln!("warm SSE GET setup: {:?} {}", warm.0, warm.1);
    eprintln!("rewritten chunk: {:?} {}", warm.2, warm.3);
    eprintln!("unchanged chunk: {:?} {}", warm.4, warm.5);
    // Request headers: the map, the accept-encoding it sets. Response headers: the map, the
    // upstream address (the record's owner). No clock, randomness or stat per stream.
    assert_eq!(
        warm.0,
        Cost {
            calls: 4,
            allocations: 3
        },
        "{}",
        warm.1
    );
    // Read and replace.
    assert_eq!(
        warm.2,
        Cost {
            calls: 2,
            allocations: 1
        },
        "{}",
        warm.3
    );
    // Read only: the chunk goes on as it came.
    assert_eq!(
        warm.4,
        Cost {
            calls: 1,
            allocations: 1
        },
        "{}",
        warm.5
    );
}
