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
    assert_eq!(p.response_headers(s, sse, false), Flow::Continue);
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
