//! The dynamic-module adapter's glue: the module linked against a mock of Envoy's callbacks
//! (`envoy/`), its hooks called in Envoy's order, through every scenario.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod envoy;

use envoy::{raw_headers, with};
use mcp_adapter_harness::scenarios::{self, Attribute, Callout, Flow, Headers, Proxy, Reply};
use mcp_resume_guard_native::abi::{EnvoyBuffer, BODY_CONTINUE, CALLOUT_SUCCESS, HEADERS_CONTINUE};
use std::collections::HashMap;
use std::ffi::c_void;
use std::os::raw::c_char;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// `envoy_dynamic_module_type_attribute_id` values the module reads.
const UPSTREAM_ADDRESS: u32 = 41;
const RESPONSE_CODE_DETAILS: u32 = 16;
/// The config scheduler's tick event.
const TICK: u64 = 1;
/// Envoy's pointer for the config (opaque to the module).
const CONFIG_ENVOY: *mut c_void = 0x10 as *mut c_void;
/// A callout that failed without a response (`envoy_dynamic_module_type_http_callout_result`).
const CALLOUT_RESET: u32 = 1;

fn buffer(b: &[u8]) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: b.as_ptr().cast::<c_char>(),
        length: b.len(),
    }
}

/// The module under the mock. `COMPLETE_INLINE`: Envoy completes a stream inside the
/// `continue_encoding` or `reset_stream` that ends it (`envoy::Envoy::complete_inline`).
struct Native<const COMPLETE_INLINE: bool = false> {
    config: *const c_void,
    /// Stream id (also Envoy's filter pointer) -> the module's filter.
    filters: HashMap<u32, *const c_void>,
    next: u32,
}

impl<const C: bool> Native<C> {
    fn e(s: u32) -> *mut c_void {
        // Envoy's filter pointer: any non-null value, one per stream.
        (0x1000 + s as usize) as *mut c_void
    }
    fn f(&self, s: u32) -> *const c_void {
        self.filters[&s]
    }
    fn stream<T>(&self, s: u32, f: impl FnOnce(&envoy::Stream) -> T) -> T {
        with(|e| f(&e.streams[&(Self::e(s) as usize)]))
    }
    fn stream_mut<T>(&self, s: u32, f: impl FnOnce(&mut envoy::Stream) -> T) -> T {
        with(|e| f(e.streams.entry(Self::e(s) as usize).or_default()))
    }
}

impl<const C: bool> Drop for Native<C> {
    fn drop(&mut self) {
        if !self.config.is_null() {
            // Stops and joins the tick thread.
            unsafe { envoy::envoy_dynamic_module_on_http_filter_config_destroy(self.config) };
        }
    }
}

fn headers_flow(r: u32) -> Flow {
    if r == HEADERS_CONTINUE {
        Flow::Continue
    } else {
        Flow::Stop
    }
}

fn body_flow(r: u32) -> Flow {
    if r == BODY_CONTINUE {
        Flow::Continue
    } else {
        Flow::Stop
    }
}

impl<const C: bool> Proxy for Native<C> {
    const HOLDS_HEADERS: bool = true;
    fn start(config: &str) -> Result<Self, String> {
        with(|e| {
            *e = envoy::Envoy::default();
            e.complete_inline = C;
        });
        let name = b"mcp_resume_guard";
        let c = unsafe {
            envoy::envoy_dynamic_module_on_http_filter_config_new(
                CONFIG_ENVOY,
                buffer(name),
                buffer(config.as_bytes()),
            )
        };
        if c.is_null() {
            return Err(with(|e| format!("{:?}", e.logs)));
        }
        with(|e| e.module_config = c as usize);
        Ok(Native {
            config: c,
            filters: HashMap::new(),
            next: 1,
        })
    }
    fn new_stream(&mut self) -> u32 {
        let s = self.next;
        self.next += 1;
        let f = unsafe { envoy::envoy_dynamic_module_on_http_filter_new(self.config, Self::e(s)) };
        assert!(!f.is_null());
        self.filters.insert(s, f);
        self.stream_mut(s, |st| st.module_filter = f as usize);
        s
    }
    fn request_headers(&mut self, s: u32, h: Headers, eos: bool) -> Flow {
        self.stream_mut(s, |st| st.request_headers = h);
        let r = unsafe {
            envoy::envoy_dynamic_module_on_http_filter_request_headers(Self::e(s), self.f(s), eos)
        };
        headers_flow(r)
    }
    fn request_body(&mut self, s: u32, chunk: &[u8], eos: bool) -> Flow {
        self.stream_mut(s, |st| st.request_body = chunk.to_vec());
        let r = unsafe {
            envoy::envoy_dynamic_module_on_http_filter_request_body(Self::e(s), self.f(s), eos)
        };
        if r == BODY_CONTINUE {
            self.stream_mut(s, |st| {
                let b = std::mem::take(&mut st.request_body);
                st.upstream_body.extend_from_slice(&b);
            });
        }
        body_flow(r)
    }
    fn response_headers(&mut self, s: u32, h: Headers, eos: bool) -> Flow {
        self.stream_mut(s, |st| st.response_headers = h);
        let r = unsafe {
            envoy::envoy_dynamic_module_on_http_filter_response_headers(Self::e(s), self.f(s), eos)
        };
        headers_flow(r)
    }
    fn response_body(&mut self, s: u32, chunk: &[u8], eos: bool) -> Flow {
        body_flow(unsafe { envoy::run_response_body(Self::e(s), chunk, eos) })
    }
    fn callout_answer(&mut self, token: u32, status: Option<u32>, body: &[u8]) {
        let call = with(|e| {
            e.callouts
                .iter()
                .find(|c| c.id == u64::from(token))
                .cloned()
        })
        .unwrap_or_else(|| panic!("no callout {token}"));
        let h: Headers = status
            .map(|s| vec![(":status".to_string(), s.to_string().into_bytes())])
            .unwrap_or_default();
        let mut raw = raw_headers(&h);
        let mut b = [buffer(body)];
        let result = if status.is_some() {
            CALLOUT_SUCCESS
        } else {
            CALLOUT_RESET
        };
        unsafe {
            if call.filter == 0 {
                envoy::envoy_dynamic_module_on_http_filter_config_http_callout_done(
                    CONFIG_ENVOY,
                    self.config,
                    call.id,
                    result,
                    raw.as_mut_ptr(),
                    raw.len(),
                    b.as_mut_ptr(),
                    b.len(),
                );
            } else {
                let s = self
                    .filters
                    .keys()
                    .copied()
                    .find(|s| Self::e(*s) as usize == call.filter)
                    .unwrap();
                envoy::envoy_dynamic_module_on_http_filter_http_callout_done(
                    Self::e(s),
                    self.f(s),
                    call.id,
                    result,
                    raw.as_mut_ptr(),
                    raw.len(),
                    b.as_mut_ptr(),
                    b.len(),
                );
            }
        }
    }
    fn tick(&mut self) {
        unsafe {
            envoy::envoy_dynamic_module_on_http_filter_config_scheduled(
                CONFIG_ENVOY,
                self.config,
                TICK,
            )
        };
        // The streams' events the tick committed run on their worker (this thread).
        for (filter, event) in with(|e| std::mem::take(&mut e.scheduled)) {
            let Some(s) = self
                .filters
                .keys()
                .copied()
                .find(|s| Self::e(*s) as usize == filter)
            else {
                continue;
            };
            unsafe {
                envoy::envoy_dynamic_module_on_http_filter_scheduled(Self::e(s), self.f(s), event)
            };
        }
    }
    fn advance_ms(&mut self, ms: u64) {
        // The module reads the system clock.
        std::thread::sleep(Duration::from_millis(ms));
    }
    fn end_stream(&mut self, s: u32) {
        self.filters.remove(&s).unwrap();
        // Once, even if Envoy already completed it inline.
        unsafe { envoy::complete_stream(Self::e(s)) };
    }
    fn set_attribute(&mut self, s: u32, a: Attribute, value: &str) {
        let id = match a {
            Attribute::UpstreamAddress => UPSTREAM_ADDRESS,
            Attribute::ResponseCodeDetails => RESPONSE_CODE_DETAILS,
        };
        self.stream_mut(s, |st| st.attributes.insert(id, value.as_bytes().to_vec()));
    }
    fn callouts(&self) -> Vec<Callout> {
        with(|e| {
            e.callouts
                .iter()
                .map(|c| Callout {
                    token: c.id as u32,
                    from_stream: c.filter != 0,
                    cluster: c.cluster.clone(),
                    headers: c.headers.clone(),
                    body: c.body.clone(),
                })
                .collect()
        })
    }
    fn upstream_headers(&self, s: u32) -> Headers {
        self.stream(s, |st| st.request_headers.clone())
    }
    fn upstream_body(&self, s: u32) -> Vec<u8> {
        self.stream(s, |st| st.upstream_body.clone())
    }
    fn client_headers(&self, s: u32) -> Headers {
        self.stream(s, |st| st.response_headers.clone())
    }
    fn client_body(&self, s: u32) -> Vec<u8> {
        self.stream(s, |st| st.client_body.clone())
    }
    fn local_replies(&self, s: u32) -> Vec<Reply> {
        self.stream(s, |st| {
            st.replies
                .iter()
                .map(|r| (r.status, r.headers.clone(), r.body.clone()))
                .collect()
        })
    }
    fn resumed(&self, s: u32) -> bool {
        self.stream(s, |st| st.continued > 0)
    }
    fn was_reset(&self, s: u32) -> bool {
        self.stream(s, |st| st.reset)
    }
    fn held(&self, s: u32) -> bool {
        self.stream(s, |st| st.buffered_response_body.is_some())
    }
    fn counter(&self, name: &str) -> Option<i64> {
        with(|e| {
            e.metrics
                .iter()
                .find(|m| m.name == name && !m.histogram)
                .map(|m| m.value as i64)
        })
    }
    fn histogram_samples(&self, name: &str) -> usize {
        with(|e| {
            e.metrics
                .iter()
                .find(|m| m.name == name && m.histogram)
                .map_or(0, |m| m.samples.len())
        })
    }
    fn metrics_defined(&self) -> usize {
        with(|e| e.metrics.len())
    }
}

mcp_adapter_harness::adapter_tests!(Native);

/// Envoy completes (and destroys) a stream inside the `continue_encoding` that lets its held end
/// go, while the exchange is still answering the callout: the stream's end still reaches it
/// (here: the branch end the store did not hear is recorded).
#[test]
fn a_stream_completed_inside_continue_encoding_still_ends_the_exchange() {
    scenarios::on_big_stack(
        scenarios::a_held_end_without_the_stores_answer_is_reported_at_the_streams_end::<
            Native<true>,
        >,
    );
}

/// The same with the `forked` answer: the held end gets its tail before Envoy completes it.
#[test]
fn a_held_end_completed_inside_continue_encoding_keeps_its_tail() {
    scenarios::on_big_stack(
        scenarios::a_held_end_is_finished_with_the_forked_event_the_store_asked_for::<Native<true>>,
    );
}

/// A callout Envoy answers before `http_callout` returns: the request-headers hook takes the
/// answer itself and lets the request go on (no `continue_decoding` from inside the hook).
#[test]
fn a_callout_answered_inline_continues_from_the_hook() {
    let mut p = <Native>::start(&scenarios::config()).unwrap();
    let verdict = r#"{"verdict":"continue","owner":"127.0.0.1:9101","expected":["e8"],"head":8}"#;
    with(|e| e.answer_inline = Some((200, verdict.as_bytes().to_vec())));
    let s = p.new_stream();
    let c = scenarios::cursor(mcp_resume_core::ownership::StreamKind::Get, 7, "e7", None);
    let req = scenarios::headers(&[
        (":method", "GET"),
        (":path", "/mcp"),
        ("mcp-session-id", scenarios::SID),
        ("last-event-id", &c),
    ]);
    assert_eq!(p.request_headers(s, req, true), Flow::Continue);
    assert!(!p.resumed(s), "no continue_decoding from inside the hook");
    // The configured timeout (default 250 ms) reaches Envoy.
    assert_eq!(with(|e| e.callouts[0].timeout_ms), 250);
    let up = p.upstream_headers(s);
    assert_eq!(scenarios::header(&up, "last-event-id"), Some("e7"));
    assert!(scenarios::header(&up, scenarios::OWNER_HEADER).is_some());
    p.end_stream(s);
}

/// The config's tick thread commits the scheduler's event, and stops with the config.
#[test]
fn the_tick_thread_commits_the_scheduler_event_until_the_config_goes() {
    let before = envoy::COMMITS.load(Ordering::SeqCst);
    let deleted = envoy::DELETED.load(Ordering::SeqCst);
    let p = <Native>::start(&scenarios::config()).unwrap();
    let t = Instant::now();
    while envoy::COMMITS.load(Ordering::SeqCst) == before && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(envoy::COMMITS.load(Ordering::SeqCst) > before, "no tick");
    drop(p);
    assert!(
        envoy::DELETED.load(Ordering::SeqCst) > deleted,
        "scheduler not deleted"
    );
}

/// A response header map Envoy cannot give is a host error: the exchange fails closed.
#[test]
fn unreadable_response_headers_fail_closed() {
    let mut p = <Native>::start(&scenarios::config()).unwrap();
    let s = p.new_stream();
    let req = scenarios::headers(&[(":method", "GET"), (":path", "/mcp")]);
    p.request_headers(s, req, true);
    // An empty map: Envoy gave nothing.
    p.response_headers(s, Vec::new(), false);
    assert_eq!(p.counter("mcp_resume_guard.host_errors"), Some(1));
    let replies = with(|e| e.streams[&(<Native>::e(s) as usize)].replies.clone());
    assert!(
        matches!(replies.as_slice(), [r] if r.details == "mcp_resume_guard"),
        "{replies:?}"
    );
    p.end_stream(s);
}

/// The store's answer about a held end arrives inside the body hook that asked (Envoy may answer
/// a callout before `http_callout` returns): the end is finished in that hook's own chunk, which
/// goes on, and nothing is held.
#[test]
fn a_held_ends_callout_answered_inline_finishes_it_in_the_hook() {
    use mcp_resume_core::ownership::{Reason, StreamKind};
    use mcp_resume_core::stream::control_event;
    let mut p = <Native>::start(&scenarios::config()).unwrap();
    let s = p.new_stream();
    let c = scenarios::cursor(StreamKind::Get, 7, "e7", None);
    let req = scenarios::headers(&[
        (":method", "GET"),
        (":path", "/mcp"),
        ("mcp-session-id", scenarios::SID),
        ("last-event-id", &c),
    ]);
    assert_eq!(p.request_headers(s, req, true), Flow::Stop);
    let verdict =
        r#"{"verdict":"continue","owner":"127.0.0.1:9101","expected":["e8"],"head":8,"branch":1}"#;
    let token = p.callouts()[0].token;
    p.callout_answer(token, Some(200), verdict.as_bytes());
    p.set_attribute(s, Attribute::UpstreamAddress, scenarios::OWNER);
    let sse = scenarios::headers(&[(":status", "200"), ("content-type", "text/event-stream")]);
    // Held until the first replayed event.
    assert_eq!(p.response_headers(s, sse, false), Flow::Stop);
    assert_eq!(
        p.response_body(s, b"id: e8\ndata: 8\n\n", false),
        Flow::Continue
    );
    let before = p.client_body(s);
    with(|e| e.answer_inline = Some((200, br#"{"forked":true}"#.to_vec())));
    assert_eq!(p.response_body(s, b"", true), Flow::Continue);
    assert!(!p.held(s));
    assert_eq!(p.stream(s, |st| st.encoding_continued), 0);
    let body = p.client_body(s);
    assert_eq!(
        String::from_utf8_lossy(&body[before.len()..]),
        control_event(Reason::Forked)
    );
    assert_eq!(p.counter("mcp_resume_guard.forked"), Some(1));
    p.end_stream(s);
}

/// Counts the module's allocations on a thread while [`envoy::COUNTING`] is on, except inside
/// the mock's own bookkeeping.
struct CountingAllocator;

fn counted() {
    let _ = envoy::COUNTING.try_with(|c| {
        if c.get() && envoy::QUIET.try_with(|q| q.get()).unwrap_or(1) == 0 {
            let _ = envoy::ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
        }
    });
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        counted();
        std::alloc::System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        std::alloc::System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        counted();
        std::alloc::System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        counted();
        std::alloc::System.realloc(p, l, n)
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// ABI calls and allocations of what `f` makes the module do.
#[derive(Debug, PartialEq, Eq)]
struct Cost {
    calls: u32,
    allocations: u64,
}

fn cost(f: impl FnOnce()) -> (Cost, String) {
    with(|e| e.calls.clear());
    envoy::ALLOCATIONS.with(|a| a.set(0));
    envoy::COUNTING.with(|c| c.set(true));
    f();
    envoy::COUNTING.with(|c| c.set(false));
    let c = Cost {
        calls: with(|e| e.abi_calls()),
        allocations: envoy::ALLOCATIONS.with(|a| a.get()),
    };
    (c, with(|e| e.call_list()))
}

/// A POST whose JSON answer the guard passes: its cost in ABI calls and allocations.
fn post(p: &mut Native, sid: &str) -> (Cost, String) {
    let s = p.new_stream();
    let req = scenarios::headers(&[
        (":method", "POST"),
        (":path", "/mcp"),
        (":authority", "mcp.example"),
        (":scheme", "http"),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-session-id", sid),
        ("mcp-protocol-version", "2025-06-18"),
        ("user-agent", "bench"),
    ]);
    let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo"}}"#;
    let resp = scenarios::headers(&[
        (":status", "200"),
        ("content-type", "application/json"),
        ("content-length", "40"),
        ("date", "Wed, 02 Dec 2026 11:00:00 GMT"),
        ("server", "replica"),
    ]);
    let c = cost(|| {
        assert_eq!(p.request_headers(s, req, false), Flow::Continue);
        assert_eq!(p.request_body(s, body, true), Flow::Continue);
        assert_eq!(p.response_headers(s, resp, false), Flow::Continue);
        assert_eq!(
            p.response_body(s, br#"{"jsonrpc":"2.0","id":7,"result":{}}"#, true),
            Flow::Continue
        );
    });
    p.end_stream(s);
    c
}

/// An SSE GET: the stream's setup (request and response headers), a chunk the guard rewrites,
/// and a chunk it leaves as it came; each chunk in `slices` slices.
fn sse_get(p: &mut Native, sid: &str, slices: usize) -> [(Cost, String); 3] {
    envoy::BODY_SLICES.with(|b| b.set(slices));
    let s = p.new_stream();
    let req = scenarios::headers(&[
        (":method", "GET"),
        (":path", "/mcp"),
        (":authority", "mcp.example"),
        (":scheme", "http"),
        ("accept", "text/event-stream"),
        ("mcp-session-id", sid),
        ("mcp-protocol-version", "2025-06-18"),
        ("user-agent", "bench"),
    ]);
    let resp = scenarios::headers(&[
        (":status", "200"),
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        ("date", "Wed, 02 Dec 2026 11:00:00 GMT"),
    ]);
    p.set_attribute(s, Attribute::UpstreamAddress, scenarios::OWNER);
    let setup = cost(|| {
        assert_eq!(p.request_headers(s, req, true), Flow::Continue);
        assert_eq!(p.response_headers(s, resp, false), Flow::Continue);
    });
    let rewritten = cost(|| {
        assert_eq!(
            p.response_body(s, b"id: e1\ndata: a\n\n", false),
            Flow::Continue
        );
    });
    let unchanged = cost(|| {
        assert_eq!(
            p.response_body(s, b": keep-alive\n\n", false),
            Flow::Continue
        );
    });
    let body = p.client_body(s);
    assert_eq!(scenarios::ids_in(&body).len(), 1);
    assert!(body.ends_with(b"\n\n: keep-alive\n\n"), "{body:?}");
    p.end_stream(s);
    envoy::BODY_SLICES.with(|b| b.set(2));
    [setup, rewritten, unchanged]
}

/// What a POST, an SSE GET's setup and its chunks cost in ABI calls and allocations, once the
/// worker is warm (another stream went first). Counted, so a change in either direction shows:
/// headers are read in place (only kept values copied), a chunk in one slice is parsed where
/// Envoy holds it, and a chunk the guard leaves as it came is not written back.
#[test]
fn abi_calls_and_allocations_per_request_and_chunk() {
    scenarios::on_big_stack(costs);
}

fn costs() {
    let mut p = <Native>::start(&scenarios::config()).unwrap();
    post(&mut p, "s-0");
    sse_get(&mut p, "s-0", 1);
    let post = post(&mut p, "s-1");
    let [setup, rewritten, unchanged] = sse_get(&mut p, "s-1", 1);
    let [_, rewritten2, unchanged2] = sse_get(&mut p, "s-2", 2);
    eprintln!("POST: {:?} {}", post.0, post.1);
    eprintln!("SSE GET setup: {:?} {}", setup.0, setup.1);
    eprintln!(
        "rewritten chunk, one slice: {:?} {}",
        rewritten.0, rewritten.1
    );
    eprintln!(
        "unchanged chunk, one slice: {:?} {}",
        unchanged.0, unchanged.1
    );
    eprintln!(
        "rewritten chunk, two slices: {:?} {}",
        rewritten2.0, rewritten2.1
    );
    eprintln!(
        "unchanged chunk, two slices: {:?} {}",
        unchanged2.0, unchanged2.1
    );
    // Unchanged: its slices listed, nothing drained or appended, nothing copied.
    assert!(
        !unchanged.1.contains("drain") && !unchanged.1.contains("append"),
        "{}",
        unchanged.1
    );
    assert_eq!(
        unchanged.0,
        Cost {
            calls: 2,
            allocations: 0
        },
        "{}",
        unchanged.1
    );
    assert!(
        !unchanged2.1.contains("drain") && !unchanged2.1.contains("append"),
        "{}",
        unchanged2.1
    );
    // Rewritten: list, drain, append (the size is the chunk's own).
    assert_eq!(rewritten.0.calls, 4, "{}", rewritten.1);
    assert_eq!(rewritten2.0.calls, 4, "{}", rewritten2.1);
    // Headers read in place: per map two calls, and only what the exchange keeps is copied.
    assert_eq!(setup.0.calls, 6, "{}", setup.1);
    assert!(setup.0.allocations <= 10, "{:?}", setup.0);
    assert!(post.0.allocations <= 8, "{:?}", post.0);
}

/// A stream that waited for a deadline made one scheduler, deleted with the stream.
#[test]
fn a_streams_scheduler_is_deleted_with_the_stream() {
    scenarios::on_big_stack(|| {
        scenarios::a_hung_owner_is_answered_at_the_deadline::<Native>();
        assert_eq!(
            with(|e| e.calls.get("http_filter_scheduler_new").copied()),
            Some(2)
        );
        assert_eq!(with(|e| e.schedulers), 0, "every scheduler deleted");
    });
}
