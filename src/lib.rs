//! mcp-resume-guard: the proxy-wasm adapter.
//!
//! Host translation only: it reads headers and bodies, hands them to the host-free exchange of
//! `mcp-resume-core` as plain events, and carries out what the exchange asks through
//! [`host::ProxyHost`]. Every rule of the guard lives in the core.

mod host;

use host::{Metrics, ProxyHost};
use mcp_resume_core::config::Config;
use mcp_resume_core::exchange::{Action as CoreAction, Exchange, Worker};
use mcp_resume_core::host::LogLevel;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    // A panic aborts the VM (Envoy's failure policy decides what then); say where first.
    std::panic::set_hook(Box::new(|info| {
        host::log(LogLevel::Critical, &format!("mcp-resume-guard: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Guard::default()) });
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
    worker: Option<Rc<RefCell<Worker>>>,
    metrics: Option<Rc<Metrics>>,
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
        }
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter {
            worker: self.worker.clone()?,
            metrics: self.metrics.clone()?,
            exchange: Exchange::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request/response through the guard (proxy-wasm's HTTP context).
struct Filter {
    worker: Rc<RefCell<Worker>>,
    metrics: Rc<Metrics>,
    exchange: Exchange,
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
        self.exchange
            .on_callout_response(&mut w, &mut h, token, status, body.as_deref());
    }

    /// Envoy calls this once, when it destroys the stream's filter (`onDestroy`), whatever
    /// ended the stream; `on_log` runs only for a completed request's access log.
    fn on_done(&mut self) -> bool {
        let mut h = ProxyHost::new(&self.metrics);
        let mut w = self.worker.borrow_mut();
        self.exchange.on_stream_end(&mut w, &mut h);
        true
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let headers = host::header_map(MapType::HttpRequestHeaders);
        let mut h = ProxyHost::new(&self.metrics);
        let mut w = self.worker.borrow_mut();
        action(
            self.exchange
                .on_request_headers(&mut w, &mut h, headers.as_deref()),
        )
    }

    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        if self.exchange.wants_request_body() {
            let chunk = host::request_body(size);
            self.exchange.on_request_body(chunk.as_deref(), eos);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, eos: bool) -> Action {
        let mut h = ProxyHost::new(&self.metrics);
        let mut w = self.worker.borrow_mut();
        if !self.exchange.wants_response_headers() {
            // No map read: only the owner header goes.
            self.exchange.on_response_headers_unread(&mut w, &mut h);
            return Action::Continue;
        }
        let headers = host::header_map(MapType::HttpResponseHeaders);
        action(
            self.exchange
                .on_response_headers(&mut w, &mut h, headers.as_deref(), eos),
        )
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        if !self.exchange.wants_body() {
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
        action(
            self.exchange
                .on_response_body(&mut w, &mut h, chunk.as_deref(), eos),
        )
    }
}
