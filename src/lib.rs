//! mcp-resume-guard: the proxy-wasm adapter.
//!
//! Host translation only: it reads headers and bodies, hands them to the host-free exchange of
//! `mcp-resume-core` as plain events, and carries out what the exchange asks through
//! [`host::ProxyHost`]. Every rule of the guard lives in the core.

mod host;

use host::{Metrics, ProxyHost};
use mcp_resume_core::config::Config;
use mcp_resume_core::exchange::{Action as CoreAction, Exchange, Worker};
use mcp_resume_core::host::Host as _;
use mcp_resume_core::host::LogLevel;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType};
use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    // A panic aborts the VM (Envoy's failure policy decides what then); say where first.
    std::panic::set_hook(Box::new(|info| {
        host::log(LogLevel::Critical, &format!("mcp-resume-guard: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> {
        Box::new(Guard {
            id,
            ..Guard::default()
        })
    });
}}

fn action(a: CoreAction) -> Action {
    match a {
        CoreAction::Continue => Action::Continue,
        CoreAction::Pause => Action::Pause,
    }
}

/// The guard of one worker (proxy-wasm's root context): owns the worker state (config, record
/// queue) and the metric ids. `Guard` and `Filter` name the same things in the native build.
#[derive(Default)]
struct Guard {
    /// The root context's id: the tick switches back to it after acting on a stream.
    id: u32,
    worker: Option<Rc<RefCell<Worker>>>,
    metrics: Option<Rc<Metrics>>,
    waiting: Waiting,
}

/// Streams whose exchange has a deadline (a continuation waiting for its owner's response
/// headers, or for the first replayed event), by context id: proxy-wasm has no per-stream
/// timer, so the root's tick serves them.
type Waiting = Rc<RefCell<Vec<(u32, Weak<RefCell<Exchange>>)>>>;

impl Guard {
    /// Hands every exchange whose deadline passed to the core, acting on its own stream
    /// (`set_effective_context`; Envoy sends a local reply after the VM call). Exchanges
    /// without a deadline any more, or gone, leave the list.
    fn expire(&self, w: &RefCell<Worker>, m: &Metrics) {
        let mut h = ProxyHost::new(m);
        let due: Vec<(u32, Rc<RefCell<Exchange>>)> = {
            let mut list = self.waiting.borrow_mut();
            if list.is_empty() {
                return;
            }
            let now = h.now_ms();
            let mut due = Vec::new();
            list.retain(|(id, ex)| {
                let Some(ex) = ex.upgrade() else {
                    return false;
                };
                let deadline = ex.try_borrow().ok().map(|e| e.deadline_ms());
                match deadline {
                    Some(None) => false,
                    Some(Some(d)) if d <= now => {
                        due.push((*id, ex));
                        false
                    }
                    _ => true,
                }
            });
            due
        };
        for (id, ex) in due {
            if let Err(s) = hostcalls::set_effective_context(id) {
                host::log(
                    LogLevel::Warn,
                    &format!("mcp-resume-guard: set_effective_context failed: {s:?}"),
                );
                continue;
            }
            if let (Ok(mut w), Ok(mut ex)) = (w.try_borrow_mut(), ex.try_borrow_mut()) {
                ex.on_deadline(&mut w, &mut h);
            }
        }
        let _ = hostcalls::set_effective_context(self.id);
    }
}

impl Context for Guard {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        let (Some(w), Some(m)) = (&self.worker, &self.metrics) else {
            return;
        };
        let status = if headers > 0 {
            host::call_status()
        } else {
            None
        };
        let body = host::call_body(body);
        let mut h = ProxyHost::new(m);
        w.borrow_mut()
            .on_records_response(&mut h, token, status, body.as_deref());
    }
}

impl RootContext for Guard {
    fn on_configure(&mut self, _size: usize) -> bool {
        match Config::from_json(&host::plugin_configuration()) {
            Ok(cfg) => {
                let w = Worker::new(cfg);
                host::set_tick_period(Duration::from_millis(w.tick_ms()));
                self.metrics = Some(Rc::new(Metrics::define()));
                self.worker = Some(Rc::new(RefCell::new(w)));
                true
            }
            Err(e) => {
                // Envoy refuses the listener update; the message names the field.
                host::log(LogLevel::Critical, &format!("mcp-resume-guard: {e}"));
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let (Some(w), Some(m)) = (&self.worker, &self.metrics) {
            let mut h = ProxyHost::new(m);
            w.borrow_mut().on_tick(&mut h);
            self.expire(w, m);
        }
    }

    fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter {
            id,
            worker: self.worker.clone()?,
            metrics: self.metrics.clone()?,
            exchange: Rc::new(RefCell::new(Exchange::new())),
            waiting: self.waiting.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request/response through the guard (proxy-wasm's HTTP context).
struct Filter {
    id: u32,
    worker: Rc<RefCell<Worker>>,
    metrics: Rc<Metrics>,
    /// Shared with the root's list of waiting streams ([`Guard::expire`]).
    exchange: Rc<RefCell<Exchange>>,
    waiting: Waiting,
}

impl Context for Filter {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        let status = if headers > 0 {
            host::call_status()
        } else {
            None
        };
        let body = host::call_body(body);
        let mut h = ProxyHost::new(&self.metrics);
        let mut w = self.worker.borrow_mut();
        let mut ex = self.exchange.borrow_mut();
        ex.on_callout_response(&mut w, &mut h, token, status, body.as_deref());
        // A continuation went to its owner: the root's tick watches its deadline.
        if ex.deadline_ms().is_some() {
            let me = Rc::downgrade(&self.exchange);
            self.waiting.borrow_mut().push((self.id, me));
        }
    }

    /// Envoy calls this once, when it destroys the stream's filter (`onDestroy`), whatever
    /// ended the stream; `on_log` runs only for a completed request's access log.
    fn on_done(&mut self) -> bool {
        let mut h = ProxyHost::new(&self.metrics);
        let mut w = self.worker.borrow_mut();
        self.exchange.borrow_mut().on_stream_end(&mut w, &mut h);
        true
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let headers = host::header_map(MapType::HttpRequestHeaders);
        let mut h = ProxyHost::new(&self.metrics);
        let mut w = self.worker.borrow_mut();
        let mut ex = self.exchange.borrow_mut();
        action(ex.on_request_headers(&mut w, &mut h, headers.as_deref()))
    }

    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        let mut ex = self.exchange.borrow_mut();
        if ex.wants_request_body() {
            let chunk = host::request_body(size);
            ex.on_request_body(chunk.as_deref(), eos);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, eos: bool) -> Action {
        let mut h = ProxyHost::new(&self.metrics);
        let mut w = self.worker.borrow_mut();
        let mut ex = self.exchange.borrow_mut();
        if !ex.wants_response_headers() {
            // No map read: only the owner header goes.
            ex.on_response_headers_unread(&mut w, &mut h);
            return Action::Continue;
        }
        let headers = host::header_map(MapType::HttpResponseHeaders);
        // Never Pause for a replay (`holds_headers_with_body` is false): the host would stop
        // the body too (StopAllIterationAndWatermark).
        action(ex.on_response_headers(&mut w, &mut h, headers.as_deref(), eos))
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        let mut ex = self.exchange.borrow_mut();
        if !ex.wants_body() {
            return Action::Continue;
        }
        let chunk = host::response_body(size);
        let mut h = ProxyHost {
            metrics: &self.metrics,
            body_size: size,
            received: chunk.as_deref(),
        };
        let mut w = self.worker.borrow_mut();
        // Pause (at the end) is StopIterationAndBuffer: Envoy holds the body until the
        // exchange finishes it from the callout's answer (`finish_held_response`).
        action(ex.on_response_body(&mut w, &mut h, chunk.as_deref(), eos))
    }
}
