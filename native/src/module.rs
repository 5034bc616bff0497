//! The module's two objects: the configuration (one per filter config, shared by every worker
//! thread) and the filter (one per stream, used on its worker thread only), and the main-thread
//! tick that flushes records.
use crate::abi::{self, ConfigSchedulerPtr, EnvoyBuffer, HttpFilterConfigEnvoyPtr};
use crate::abi::{HttpFilterEnvoyPtr, HttpHeader};
use crate::host::{self, ConfigHost, FilterHost, Metrics, Outcome};
use mcp_resume_core::config::Config;
use mcp_resume_core::exchange::{Action, Exchange, HeaderField, Worker};
use mcp_resume_core::host::{Host, LogLevel, Stat};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// The config scheduler's only event: run the tick.
pub const TICK: u64 = 1;
/// A stream scheduler's only event: its exchange's deadline passed.
pub const DEADLINE: u64 = 1;

/// A raw Envoy pointer that may cross threads: Envoy's own objects are thread-safe where the
/// ABI says a callback may be called from any thread (the scheduler), and otherwise only used on
/// the thread the ABI allows.
#[derive(Clone, Copy)]
struct EnvoyPtr(*mut c_void);
// SAFETY: see the type's documentation.
unsafe impl Send for EnvoyPtr {}
// SAFETY: see the type's documentation.
unsafe impl Sync for EnvoyPtr {}

/// A callout answer kept for later: callout id, `:status`, body.
type Answer = (u64, Option<u32>, Option<Vec<u8>>);

/// Wakes the main thread every `flush_ms` for the tick: dynamic modules have no timer, so a
/// small thread commits the config scheduler's event.
struct Ticker {
    scheduler: EnvoyPtr,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(config: HttpFilterConfigEnvoyPtr, period: Duration) -> Option<Ticker> {
        // SAFETY: main thread, during config creation.
        let scheduler =
            unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(config) };
        if scheduler.is_null() {
            return None;
        }
        let scheduler = EnvoyPtr(scheduler);
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s2 = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("mcp-guard-tick".into())
            .spawn(move || {
                // The whole wrapper moves in (not just its raw-pointer field).
                let scheduler = scheduler;
                let (lock, cv) = &*s2;
                let Ok(mut stopped) = lock.lock() else {
                    return;
                };
                loop {
                    match cv.wait_timeout(stopped, period) {
                        Ok((g, _)) => stopped = g,
                        Err(_) => return,
                    }
                    if *stopped {
                        return;
                    }
                    let sched: ConfigSchedulerPtr = scheduler.0;
                    // SAFETY: commit may be called from any thread; the scheduler is deleted
                    // only after this thread has been joined.
                    unsafe {
                        abi::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
                            sched, TICK,
                        )
                    };
                }
            });
        match spawned {
            Ok(t) => Some(Ticker {
                scheduler,
                stop,
                thread: Some(t),
            }),
            Err(e) => {
                host::log(
                    LogLevel::Critical,
                    &format!("mcp-resume-guard: cannot start the record flush thread: {e}"),
                );
                // SAFETY: created above, never committed.
                unsafe {
                    abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
                        scheduler.0,
                    )
                };
                None
            }
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Ok(mut s) = self.stop.0.lock() {
            *s = true;
        }
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: main thread (config destruction); the only other user was joined above.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.scheduler.0)
        };
    }
}

/// The in-module configuration: the parsed config per worker, metrics, the main-thread tick.
pub struct Guard {
    envoy: EnvoyPtr,
    pub metrics: Metrics,
    /// One per Envoy worker thread (records are queued per worker, as in the Wasm build): a
    /// worker's lock is only ever contended by the main thread's tick.
    workers: Vec<Mutex<Worker>>,
    /// Records callouts in flight: callout id -> worker.
    record_calls: Mutex<HashMap<u64, usize>>,
    ticking: AtomicBool,
    /// Records answers that arrived while the tick that sent them was still running.
    early: Mutex<Vec<Answer>>,
    ticker: Mutex<Option<Ticker>>,
    /// Streams whose exchange waits for a deadline: when it is due (ms) and the stream's
    /// scheduler. Dynamic modules have no per-stream timer: the tick commits the event, the
    /// stream's worker runs it. An entry leaves before its scheduler is deleted.
    deadlines: Mutex<Vec<(u64, EnvoyPtr)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic caught in a hook may have poisoned it; the data is still consistent enough to go on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Guard {
    /// Main thread. `Err` names the config field at fault.
    pub fn new(envoy: HttpFilterConfigEnvoyPtr, json: &[u8]) -> Result<Guard, String> {
        // SAFETY: main thread, during config creation.
        let (workers, validating) = unsafe {
            (
                abi::envoy_dynamic_module_callback_get_concurrency().max(1),
                abi::envoy_dynamic_module_callback_is_validation_mode(),
            )
        };
        // Config is not Clone: each worker gets its own parse of the same (already valid) bytes.
        let mut ws = Vec::new();
        for _ in 0..workers {
            let cfg = Config::from_json(json).map_err(|e| e.to_string())?;
            ws.push(Mutex::new(Worker::new(cfg)));
        }
        let tick_ms = ws.first().map(|w| lock(w).tick_ms()).unwrap_or(10).max(1);
        let metrics = Metrics::define(envoy);
        let ticker = if validating {
            None
        } else {
            Ticker::start(envoy, Duration::from_millis(tick_ms))
        };
        Ok(Guard {
            envoy: EnvoyPtr(envoy),
            metrics,
            workers: ws,
            record_calls: Mutex::new(HashMap::new()),
            ticking: AtomicBool::new(false),
            early: Mutex::new(Vec::new()),
            ticker: Mutex::new(ticker),
            deadlines: Mutex::new(Vec::new()),
        })
    }

    /// Main thread: stop the tick before the config goes away.
    pub fn shut_down(&self) {
        drop(lock(&self.ticker).take());
    }

    fn config_host(&self) -> ConfigHost<'_> {
        ConfigHost {
            config: self.envoy.0,
            metrics: &self.metrics,
            dispatched: Vec::new(),
        }
    }

    fn worker(&self, i: usize) -> MutexGuard<'_, Worker> {
        let n = self.workers.len().max(1);
        lock(&self.workers[i % n])
    }

    fn remember(&self, ids: Vec<u64>, worker: usize) {
        if !ids.is_empty() {
            let mut calls = lock(&self.record_calls);
            for id in ids {
                calls.insert(id, worker);
            }
        }
    }

    /// Main thread, every `flush_ms`: each worker's batched stats and next record batch.
    pub fn tick(&self) {
        self.ticking.store(true, Ordering::SeqCst);
        for i in 0..self.workers.len() {
            let mut h = self.config_host();
            self.worker(i).on_tick(&mut h);
            self.remember(h.dispatched, i);
        }
        self.ticking.store(false, Ordering::SeqCst);
        let early = std::mem::take(&mut *lock(&self.early));
        for (id, status, body) in early {
            self.deliver(id, status, body.as_deref());
        }
        self.fire_deadlines();
    }

    /// Main thread: commits the deadline event of every stream whose deadline passed (its
    /// worker thread runs it), once.
    fn fire_deadlines(&self) {
        let mut list = lock(&self.deadlines);
        if list.is_empty() {
            return;
        }
        let now = host::now_ms();
        list.retain(|(due, scheduler)| {
            if *due > now {
                return true;
            }
            // SAFETY: commit may be called from any thread; the scheduler is deleted only
            // after its entry left this list (under this lock).
            unsafe {
                abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(
                    scheduler.0,
                    DEADLINE,
                )
            };
            false
        });
    }

    /// Main thread: the answer to a records callout.
    pub fn on_records_answer(&self, id: u64, status: Option<u32>, body: Option<Vec<u8>>) {
        if self.ticking.load(Ordering::SeqCst) {
            // Answered inline while its tick still holds the worker: after the tick.
            lock(&self.early).push((id, status, body));
            return;
        }
        self.deliver(id, status, body.as_deref());
    }

    fn deliver(&self, id: u64, status: Option<u32>, body: Option<&[u8]>) {
        let Some(i) = lock(&self.record_calls).remove(&id) else {
            return;
        };
        let Ok(token) = u32::try_from(id) else {
            return;
        };
        let mut h = self.config_host();
        self.worker(i)
            .on_records_response(&mut h, token, status, body);
        self.remember(h.dispatched, i);
    }
}

/// One stream. Only ever reached through shared references: Envoy may call into it again from
/// inside one of its own callbacks (a local reply runs the response hooks, a callout may answer
/// inline, a reset may destroy the filter), so the exchange sits in a `RefCell` and a hook that
/// finds it borrowed knows it was re-entered.
pub struct Filter {
    guard: *const Guard,
    worker: usize,
    exchange: RefCell<Exchange>,
    /// A callout answer that arrived inline, while the request-headers hook was running.
    inline_answer: RefCell<Option<Answer>>,
    busy: Cell<u32>,
    destroyed: Cell<bool>,
    /// Envoy is done with the stream; the exchange must hear it ([`Filter::end_if_owed`]).
    end_owed: Cell<bool>,
    /// The exchange heard the stream's end.
    ended: Cell<bool>,
    /// This stream's scheduler, made when its exchange first waited for a deadline.
    scheduler: Cell<Option<EnvoyPtr>>,
    /// A watermark crossing reported while the exchange was busy: applied at the next chance.
    watermark: Cell<Option<bool>>,
}

thread_local! {
    /// One copy buffer per worker thread, for a body chunk Envoy holds in several slices.
    static CHUNK: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// One header list per worker thread: views into the map being read.
    static HEADERS: RefCell<Vec<EnvoyHeader>> = const { RefCell::new(Vec::new()) };
}

/// The header list is dropped after a map that grew it beyond this many headers.
const HEADERS_KEEP: usize = 256;

/// The chunk buffer is dropped after a chunk that grew it beyond this.
const CHUNK_KEEP_BYTES: usize = 1 << 20;

impl Filter {
    pub fn new(guard: &Guard, envoy: HttpFilterEnvoyPtr) -> Filter {
        // SAFETY: the live filter being created (worker thread).
        let worker =
            unsafe { abi::envoy_dynamic_module_callback_http_filter_get_worker_index(envoy) };
        Filter {
            guard,
            worker: worker as usize,
            exchange: RefCell::new(Exchange::new()),
            inline_answer: RefCell::new(None),
            busy: Cell::new(0),
            destroyed: Cell::new(false),
            end_owed: Cell::new(false),
            ended: Cell::new(false),
            scheduler: Cell::new(None),
            watermark: Cell::new(None),
        }
    }

    /// After a callout's answer: a continuation forwarded to its owner waits for its response
    /// headers until the exchange's deadline; the tick fires it ([`Guard::fire_deadlines`]).
    fn watch_deadline(&self, envoy: HttpFilterEnvoyPtr, ex: &Exchange) {
        let Some(due) = ex.deadline_ms() else {
            return;
        };
        if self.scheduler.get().is_some() || envoy.is_null() {
            return;
        }
        // SAFETY: the live filter, inside one of its hooks (worker thread).
        let s = unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_new(envoy) };
        if s.is_null() {
            host::log(
                LogLevel::Error,
                "mcp-resume-guard: no stream scheduler: a continuation has no deadline",
            );
            return;
        }
        self.scheduler.set(Some(EnvoyPtr(s)));
        lock(&self.guard().deadlines).push((due, EnvoyPtr(s)));
    }

    /// Leaves the deadline list and deletes the scheduler (the filter is being destroyed).
    fn drop_scheduler(&self) {
        let Some(s) = self.scheduler.take() else {
            return;
        };
        lock(&self.guard().deadlines).retain(|(_, x)| x.0 != s.0);
        // SAFETY: made by this filter; no longer in the list, so never committed again.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_delete(s.0) };
    }

    /// The stream's scheduled event: the exchange's deadline passed (early calls do nothing).
    pub fn scheduled(&self, envoy: HttpFilterEnvoyPtr, event: u64) {
        if event != DEADLINE {
            return;
        }
        let Ok(mut ex) = self.exchange.try_borrow_mut() else {
            return;
        };
        let mut h = self.host(envoy, false);
        let mut w = self.guard().worker(self.worker);
        if let Some(above) = self.watermark.take() {
            ex.on_downstream_backpressure(&w, &h, above);
        }
        ex.on_deadline(&mut w, &mut h);
        drop(w);
        // The deadline moved on (a replay that progresses): fired once more, when it is due.
        if let (Some(due), Some(s)) = (ex.deadline_ms(), self.scheduler.get()) {
            lock(&self.guard().deadlines).push((due, s));
        }
    }

    /// The client's write buffer crossed a watermark: the exchange suspends (or restarts) its
    /// wait between owed events; a restarted deadline is put back on the list.
    pub fn backpressure(&self, envoy: HttpFilterEnvoyPtr, above: bool) {
        let Ok(mut ex) = self.exchange.try_borrow_mut() else {
            // Inside another hook: the scheduled event applies it at the next tick.
            self.watermark.set(Some(above));
            if let Some(s) = self.scheduler.get() {
                lock(&self.guard().deadlines).push((0, s));
            }
            return;
        };
        self.watermark.set(None);
        let h = self.host(envoy, false);
        let w = self.guard().worker(self.worker);
        let before = ex.deadline_ms();
        ex.on_downstream_backpressure(&w, &h, above);
        drop(w);
        if let (Some(due), Some(s)) = (ex.deadline_ms(), self.scheduler.get()) {
            if before != Some(due) {
                lock(&self.guard().deadlines).push((due, s));
            }
        }
    }

    fn guard(&self) -> &Guard {
        // SAFETY: Envoy keeps a filter's config alive for as long as the filter.
        unsafe { &*self.guard }
    }

    fn host(&self, envoy: HttpFilterEnvoyPtr, inline: bool) -> FilterHost<'_> {
        let g = self.guard();
        FilterHost {
            filter: envoy,
            config: g.envoy.0,
            metrics: &g.metrics,
            inline,
            out: Outcome::default(),
            received: None,
        }
    }

    /// The host once Envoy is done with the stream: no stream call is made, stats go to the
    /// configuration.
    fn ended_host(&self) -> FilterHost<'_> {
        let mut h = self.host(std::ptr::null_mut(), false);
        h.out.ended = true;
        h
    }

    pub fn request_headers(&self, envoy: HttpFilterEnvoyPtr) -> u32 {
        let Ok(mut ex) = self.exchange.try_borrow_mut() else {
            return abi::HEADERS_CONTINUE;
        };
        let mut h = self.host(envoy, true);
        let mut w = self.guard().worker(self.worker);
        let mut action = with_headers(envoy, abi::REQUEST_HEADERS, |headers| {
            ex.on_request_headers(&mut w, &mut h, headers)
        });
        if let Some((id, status, body)) = self.inline_answer.borrow_mut().take() {
            if let Ok(token) = u32::try_from(id) {
                ex.on_callout_response(&mut w, &mut h, token, status, body.as_deref());
            }
            if h.out.resumed {
                action = Action::Continue;
            }
        }
        self.watch_deadline(envoy, &ex);
        if action == Action::Continue && !h.out.replied {
            abi::HEADERS_CONTINUE
        } else {
            abi::HEADERS_STOP_ALL_AND_WATERMARK
        }
    }

    pub fn callout_done(
        &self,
        envoy: HttpFilterEnvoyPtr,
        id: u64,
        status: Option<u32>,
        body: Option<Vec<u8>>,
    ) {
        let Ok(mut ex) = self.exchange.try_borrow_mut() else {
            // Answered inline, inside the request-headers hook that asked.
            *self.inline_answer.borrow_mut() = Some((id, status, body));
            return;
        };
        let Ok(token) = u32::try_from(id) else {
            return;
        };
        let mut h = self.host(envoy, false);
        let mut w = self.guard().worker(self.worker);
        ex.on_callout_response(&mut w, &mut h, token, status, body.as_deref());
        drop(w);
        self.watch_deadline(envoy, &ex);
    }

    pub fn request_body(&self, envoy: HttpFilterEnvoyPtr, eos: bool) -> u32 {
        let Ok(mut ex) = self.exchange.try_borrow_mut() else {
            return abi::BODY_CONTINUE;
        };
        if ex.wants_request_body() {
            with_chunk(envoy, abi::RECEIVED_REQUEST_BODY, |chunk| {
                ex.on_request_body(chunk, eos)
            });
        }
        abi::BODY_CONTINUE
    }

    pub fn response_headers(&self, envoy: HttpFilterEnvoyPtr, eos: bool) -> u32 {
        let Ok(mut ex) = self.exchange.try_borrow_mut() else {
            // The guard's own local reply on its way out: it passes untouched.
            return abi::HEADERS_CONTINUE;
        };
        let mut h = self.host(envoy, false);
        let mut w = self.guard().worker(self.worker);
        let mut action = Action::Continue;
        if ex.wants_response_headers() {
            action = with_headers(envoy, abi::RESPONSE_HEADERS, |headers| {
                ex.on_response_headers(&mut w, &mut h, headers, eos)
            });
        } else {
            // No map read: only the owner header goes.
            ex.on_response_headers_unread(&mut w, &mut h);
        }
        // Pause: the headers are held until the first replayed event (a body hook answers
        // Continue), the held end's `continue_encoding`, or the deadline's local reply.
        if h.out.replied || action == Action::Pause {
            abi::HEADERS_STOP_ITERATION
        } else {
            abi::HEADERS_CONTINUE
        }
    }

    pub fn response_body(&self, envoy: HttpFilterEnvoyPtr, eos: bool) -> u32 {
        let Ok(mut ex) = self.exchange.try_borrow_mut() else {
            return abi::BODY_CONTINUE;
        };
        if !ex.wants_body() {
            return abi::BODY_CONTINUE;
        }
        let mut w = self.guard().worker(self.worker);
        // A chunk that cannot be read is the exchange's to fail closed on.
        let (action, out) = with_chunk(envoy, abi::RECEIVED_RESPONSE_BODY, |chunk| {
            let mut h = self.host(envoy, true);
            h.received = chunk;
            let action = ex.on_response_body(&mut w, &mut h, chunk, eos);
            // The callout of a held end, answered inline: the end is finished in this chunk.
            if let Some((id, status, body)) = self.inline_answer.borrow_mut().take() {
                if let Ok(token) = u32::try_from(id) {
                    ex.on_callout_response(&mut w, &mut h, token, status, body.as_deref());
                }
            }
            (action, h.out)
        });
        let h = out;
        if h.reset {
            abi::BODY_STOP_NO_BUFFER
        } else if action == Action::Pause && ex.holds_response_headers() {
            // Headers held: the exchange keeps this chunk's output (Envoy got none of it).
            abi::BODY_STOP_NO_BUFFER
        } else if action == Action::Pause && !h.released {
            // Held until the callout's answer finishes it (`continue_encoding`).
            abi::BODY_STOP_AND_BUFFER
        } else {
            abi::BODY_CONTINUE
        }
    }

    /// Envoy is done with the stream (complete, reset, client gone): the exchange hears it
    /// once. Envoy may complete a stream from inside a call the exchange made (a reset, or the
    /// `continue_encoding` of a held end); the exchange is in use then, and the hook that
    /// made the call tells it on its way out ([`Filter::end_if_owed`]).
    pub fn stream_end(&self) {
        self.end_owed.set(true);
        self.end_if_owed();
    }

    /// Tells the exchange the stream ended, if Envoy said so and it has not heard it yet.
    pub fn end_if_owed(&self) {
        if !self.end_owed.get() || self.ended.get() {
            return;
        }
        let Ok(mut ex) = self.exchange.try_borrow_mut() else {
            return;
        };
        self.ended.set(true);
        let mut h = self.ended_host();
        let mut w = self.guard().worker(self.worker);
        ex.on_stream_end(&mut w, &mut h);
    }

    /// Counts one hook entry (matched by [`Filter::leave`]).
    pub fn enter(&self) {
        self.busy.set(self.busy.get().saturating_add(1));
    }

    /// Leaves a hook; `true` when the filter must now be freed (Envoy destroyed it meanwhile).
    pub fn leave(&self) -> bool {
        self.busy.set(self.busy.get().saturating_sub(1));
        self.busy.get() == 0 && self.destroyed.get()
    }

    /// Envoy destroys the filter; `true` when it can be freed now (no hook of it is running).
    /// A stream Envoy destroys without completing it has ended too.
    pub fn destroy(&self) -> bool {
        self.drop_scheduler();
        self.destroyed.set(true);
        self.end_owed.set(true);
        if self.busy.get() > 0 {
            // The running hook tells the exchange and frees the filter on its way out.
            return false;
        }
        self.end_if_owed();
        true
    }

    /// Fail closed after a panic in a hook: the stream is reset, so nothing half-decided
    /// reaches a replica or a client.
    pub fn fail_closed(&self, envoy: HttpFilterEnvoyPtr) {
        let mut h = self.host(envoy, false);
        h.count(Stat::HostErrors, 1);
        h.reset_response();
    }
}

/// A header of Envoy's map, read in place: its bytes are Envoy's, valid during the hook that read
/// them until the map changes (the exchange reads the whole slice before its first host call).
#[repr(transparent)]
struct EnvoyHeader(HttpHeader);

impl HeaderField for EnvoyHeader {
    fn name(&self) -> &[u8] {
        // SAFETY: filled by Envoy in this hook (see the type's documentation).
        unsafe { self.0.key_value().0 }
    }
    fn value(&self) -> &[u8] {
        // SAFETY: as for the name.
        unsafe { self.0.key_value().1 }
    }
}

const NO_HEADER: EnvoyHeader = EnvoyHeader(HttpHeader {
    key_ptr: std::ptr::null(),
    key_length: 0,
    value_ptr: std::ptr::null(),
    value_length: 0,
});

/// Runs `f` on the headers of one map, as views into Envoy's map (the exchange copies what it
/// keeps), listed in the worker's buffer (or a fresh one if that is in use). `None` when Envoy
/// could not give them (a request or response always has pseudo-headers, so an empty map is a
/// failure too).
fn with_headers<T>(
    envoy: HttpFilterEnvoyPtr,
    kind: u32,
    f: impl FnOnce(Option<&[EnvoyHeader]>) -> T,
) -> T {
    with_buffer(&HEADERS, HEADERS_KEEP, |buf| {
        // SAFETY: the live filter of the running hook; `buf` has room for `n` headers.
        let read = unsafe {
            let n = abi::envoy_dynamic_module_callback_http_get_headers_size(envoy, kind);
            buf.resize_with(n, || NO_HEADER);
            n > 0
                && abi::envoy_dynamic_module_callback_http_get_headers(
                    envoy,
                    kind,
                    buf.as_mut_ptr().cast::<HttpHeader>(),
                )
        };
        // The views must not outlive the hook: `with_buffer` clears them.
        f(read.then_some(&buf[..]))
    })
}

/// Runs `f` on the worker's reusable buffer `cell`, cleared (or on a fresh one when a nested
/// hook holds it); afterwards the buffer is cleared, and freed when it grew past `keep`.
fn with_buffer<E: 'static, T>(
    cell: &'static std::thread::LocalKey<RefCell<Vec<E>>>,
    keep: usize,
    f: impl FnOnce(&mut Vec<E>) -> T,
) -> T {
    cell.with(|c| {
        let mut own = Vec::new();
        let mut shared = c.try_borrow_mut();
        let buf = match shared.as_deref_mut() {
            Ok(b) => b,
            Err(_) => &mut own,
        };
        buf.clear();
        let r = f(buf);
        buf.clear();
        if buf.capacity() > keep {
            *buf = Vec::new();
        }
        r
    })
}

/// Slices of a body chunk read into a stack array; a chunk in more slices than this is listed
/// in a `Vec`.
const STACK_SLICES: usize = 8;

/// Runs `f` on this hook's chunk of body `t` (`None` when Envoy could not give it): the chunk
/// in place when Envoy holds it in one slice, otherwise copied once into the worker's buffer
/// (or a fresh one if that is in use).
fn with_chunk<T>(envoy: HttpFilterEnvoyPtr, t: u32, f: impl FnOnce(Option<&[u8]>) -> T) -> T {
    // SAFETY: the live filter inside its body hook; the slices are Envoy's, valid during the
    // hook until the body changes (the exchange reads the chunk before it replaces it).
    unsafe {
        let n = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(envoy, t);
        if n == 0 {
            return f(Some(&[]));
        }
        let mut stack = [EnvoyBuffer::NULL; STACK_SLICES];
        let mut heap = Vec::new();
        let slices: &mut [EnvoyBuffer] = if n <= STACK_SLICES {
            stack.get_mut(..n).unwrap_or_default()
        } else {
            heap.resize(n, EnvoyBuffer::NULL);
            &mut heap
        };
        if !abi::envoy_dynamic_module_callback_http_get_body_chunks(envoy, t, slices.as_mut_ptr()) {
            return f(None);
        }
        if let [one] = slices {
            return f(Some(one.bytes()));
        }
        with_buffer(&CHUNK, CHUNK_KEEP_BYTES, |buf| {
            for b in slices.iter() {
                buf.extend_from_slice(b.bytes());
            }
            f(Some(&buf[..]))
        })
    }
}
