//! A small proxy-wasm host: it runs a real `.wasm` filter under the `wasmi`
//! interpreter and calls its hooks in the order Envoy does, with the host calls of ABI 0.2.1
//! backed by plain data ([`HostState`]) the test sets up and inspects.
//!
//! Envoy's behaviour that the guard relies on is kept: a local reply is sent after the hook that
//! asked for it returns, and passes through this filter's response hooks; a body chunk a hook
//! lets continue reaches the client as the hook left it; a response whose last body hook
//! answered Pause is held (the module may append to it from a callout's answer) until the
//! module continues it, after that call returns.
mod imports;
mod state;

pub use imports::{deserialize_map, serialize_map};
pub use state::{header, headers, Callout, Headers, HostState, LocalReply, Metric, Stream};

use std::path::{Path, PathBuf};
use std::process::Command;
pub use wasmi::Module;
use wasmi::{Engine, Instance, Linker, Store, WasmParams, WasmResults};

/// What a hook returned (proxy-wasm's `Action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    Pause,
}

/// A proxy-wasm VM with one plugin (root context) loaded.
pub struct Vm {
    store: Store<HostState>,
    instance: Instance,
    root: u32,
    next_context: u32,
}

/// Errors of the test host: a trap, a missing export, a refused configuration.
pub type Result<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Parses and validates `wasm` once; every [`Vm::start`] of a test run instantiates it again
/// (the debug build `make check` tests is 4.8 MB: parsing it for every VM took 12 of the test's 31 s).
pub fn load(wasm: &[u8]) -> Result<Module> {
    Module::new(&Engine::default(), wasm).map_err(err)
}

impl Vm {
    /// Starts a fresh VM of `module` and configures the plugin with `plugin_config`, as Envoy
    /// does: `_initialize`, the root context, `proxy_on_vm_start`, `proxy_on_configure`.
    /// `Err` when the plugin refuses its configuration (with what it logged).
    pub fn start(module: &Module, plugin_config: &[u8]) -> Result<Vm> {
        let engine = module.engine();
        let state = HostState {
            plugin_config: plugin_config.to_vec(),
            root_context: 1,
            effective: 1,
            now_ns: 1_700_000_000_000_000_000,
            random_state: 0x2545_f491_4f6c_dd1d,
            ..HostState::default()
        };
        let mut store = Store::new(engine, state);
        let mut linker = Linker::new(engine);
        imports::define(&mut linker, module).map_err(err)?;
        let instance = linker
            .instantiate_and_start(&mut store, module)
            .map_err(err)?;
        let mut vm = Vm {
            store,
            instance,
            root: 1,
            next_context: 2,
        };
        vm.call::<(), ()>("_initialize", ())?;
        vm.call::<(i32, i32), ()>("proxy_on_context_create", (1, 0))?;
        if vm.call::<(i32, i32), i32>("proxy_on_vm_start", (1, 0))? == 0 {
            return Err(format!("vm start refused: {:?}", vm.state().logs));
        }
        let n = plugin_config.len() as i32;
        if vm.call::<(i32, i32), i32>("proxy_on_configure", (1, n))? == 0 {
            return Err(format!("configuration refused: {:?}", vm.state().logs));
        }
        Ok(vm)
    }

    fn call<P: WasmParams, R: WasmResults>(&mut self, name: &str, args: P) -> Result<R> {
        let f = self
            .instance
            .get_typed_func::<P, R>(&self.store, name)
            .map_err(|e| format!("{name}: {e}"))?;
        f.call(&mut self.store, args).map_err(|e| {
            let s = self.store.data();
            format!(
                "{name} trapped: {e}; logs: {:?}; output: {}",
                s.logs,
                String::from_utf8_lossy(&s.output)
            )
        })
    }

    pub fn state(&self) -> &HostState {
        self.store.data()
    }

    pub fn state_mut(&mut self) -> &mut HostState {
        self.store.data_mut()
    }

    /// A stream's state (empty if unknown).
    pub fn stream(&self, ctx: u32) -> &Stream {
        static EMPTY: std::sync::OnceLock<Stream> = std::sync::OnceLock::new();
        self.state()
            .streams
            .get(&ctx)
            .unwrap_or_else(|| EMPTY.get_or_init(Stream::default))
    }

    pub fn stream_mut(&mut self, ctx: u32) -> &mut Stream {
        self.state_mut().streams.entry(ctx).or_default()
    }

    /// A new HTTP stream (context); its id.
    pub fn new_stream(&mut self) -> Result<u32> {
        let ctx = self.next_context;
        self.next_context += 1;
        self.state_mut().streams.insert(ctx, Stream::default());
        self.call::<(i32, i32), ()>("proxy_on_context_create", (ctx as i32, self.root as i32))?;
        Ok(ctx)
    }

    fn enter(&mut self, ctx: u32) {
        self.state_mut().effective = ctx;
    }

    fn action(v: i32) -> Action {
        if v == 0 {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    /// A local reply asked for during the last hook goes out now, through this filter's
    /// response hooks (as Envoy sends it after the VM call).
    fn deliver_local_reply(&mut self, ctx: u32, sent: usize) -> Result<()> {
        let Some(reply) = self.stream(ctx).local_replies.get(sent).cloned() else {
            return Ok(());
        };
        let mut h = vec![(":status".to_string(), reply.status.to_string().into_bytes())];
        h.extend(reply.headers);
        h.push((
            "content-length".to_string(),
            reply.body.len().to_string().into_bytes(),
        ));
        self.response_headers(ctx, h, reply.body.is_empty())?;
        if !reply.body.is_empty() {
            self.response_body(ctx, &reply.body, true)?;
        }
        Ok(())
    }

    /// The request headers; after the call the stream's `request_headers` are what goes upstream.
    pub fn request_headers(&mut self, ctx: u32, h: Headers, eos: bool) -> Result<Action> {
        let n = h.len() as i32;
        self.stream_mut(ctx).request_headers = h;
        let sent = self.stream(ctx).local_replies.len();
        self.enter(ctx);
        let a = self.call::<(i32, i32, i32), i32>(
            "proxy_on_request_headers",
            (ctx as i32, n, i32::from(eos)),
        )?;
        self.deliver_local_reply(ctx, sent)?;
        Ok(Self::action(a))
    }

    /// One request body chunk; what the hook lets continue goes upstream.
    pub fn request_body(&mut self, ctx: u32, chunk: &[u8], eos: bool) -> Result<Action> {
        let s = self.stream_mut(ctx);
        s.request_body.extend_from_slice(chunk);
        let n = s.request_body.len() as i32;
        self.enter(ctx);
        let a = self.call::<(i32, i32, i32), i32>(
            "proxy_on_request_body",
            (ctx as i32, n, i32::from(eos)),
        )?;
        let a = Self::action(a);
        if a == Action::Continue {
            let s = self.stream_mut(ctx);
            let b = std::mem::take(&mut s.request_body);
            s.upstream_body.extend_from_slice(&b);
        }
        Ok(a)
    }

    /// The response headers; after the call the stream's `response_headers` are what the
    /// client gets.
    pub fn response_headers(&mut self, ctx: u32, h: Headers, eos: bool) -> Result<Action> {
        let n = h.len() as i32;
        self.stream_mut(ctx).response_headers = h;
        let sent = self.stream(ctx).local_replies.len();
        self.enter(ctx);
        let a = self.call::<(i32, i32, i32), i32>(
            "proxy_on_response_headers",
            (ctx as i32, n, i32::from(eos)),
        )?;
        self.deliver_local_reply(ctx, sent)?;
        let a = Self::action(a);
        if a == Action::Pause && self.stream(ctx).local_replies.len() == sent {
            self.stream_mut(ctx).headers_stopped_all = true;
        }
        Ok(a)
    }

    /// One response body chunk; what the hook lets continue is appended to `client_body`.
    /// Paused at the end of stream, the body is held (`Stream::held`).
    pub fn response_body(&mut self, ctx: u32, chunk: &[u8], eos: bool) -> Result<Action> {
        let s = self.stream_mut(ctx);
        s.response_body.extend_from_slice(chunk);
        if s.headers_stopped_all {
            // Envoy buffers it; the module's body hook is not called.
            return Ok(Action::Pause);
        }
        let n = s.response_body.len() as i32;
        self.enter(ctx);
        let a = self.call::<(i32, i32, i32), i32>(
            "proxy_on_response_body",
            (ctx as i32, n, i32::from(eos)),
        )?;
        let a = Self::action(a);
        let s = self.stream_mut(ctx);
        if a == Action::Continue {
            let b = std::mem::take(&mut s.response_body);
            s.client_body.extend_from_slice(&b);
        } else if eos {
            s.held = true;
        }
        Ok(a)
    }

    /// A held response the module continued (`proxy_continue_stream`) goes out now, with the end
    /// of stream; one it closed is dropped (as Envoy does after the VM call that asked).
    fn release_held(&mut self, ctx: u32, continued: usize, closed: usize) {
        let s = self.stream_mut(ctx);
        if !s.held {
            return;
        }
        if s.closed.iter().skip(closed).any(|t| *t == 1) {
            s.held = false;
            s.response_body.clear();
        } else if s.continued.iter().skip(continued).any(|t| *t == 1) {
            s.held = false;
            let b = std::mem::take(&mut s.response_body);
            s.client_body.extend_from_slice(&b);
        }
    }

    /// The answer to callout `token` (`None` headers: the callout failed without a response).
    pub fn http_call_response(
        &mut self,
        token: u32,
        headers: Option<Headers>,
        body: &[u8],
    ) -> Result<()> {
        let n = headers.as_ref().map_or(0, Vec::len) as i32;
        let ctx = self
            .state()
            .callouts
            .iter()
            .find(|c| c.token == token)
            .map_or(self.root, |c| c.context);
        let sent = self.stream(ctx).local_replies.len();
        let (continued, closed) = (
            self.stream(ctx).continued.len(),
            self.stream(ctx).closed.len(),
        );
        self.state_mut().call_response = Some((headers.unwrap_or_default(), body.to_vec()));
        self.enter(self.root);
        // Envoy passes the root context; the module switches to the stream that asked.
        let r = self.call::<(i32, i32, i32, i32, i32), ()>(
            "proxy_on_http_call_response",
            (self.root as i32, token as i32, n, body.len() as i32, 0),
        );
        self.state_mut().call_response = None;
        r?;
        if ctx != self.root {
            self.release_held(ctx, continued, closed);
            self.deliver_local_reply(ctx, sent)?;
        }
        Ok(())
    }

    /// The root context's timer. A local reply it sent for a stream (switching to it with
    /// `proxy_set_effective_context`) goes out after the call, through that stream's hooks.
    pub fn tick(&mut self) -> Result<()> {
        let sent: Vec<(u32, usize)> = (self.state().streams.iter())
            .map(|(ctx, s)| (*ctx, s.local_replies.len()))
            .collect();
        self.enter(self.root);
        self.call::<i32, ()>("proxy_on_tick", self.root as i32)?;
        for (ctx, n) in sent {
            self.deliver_local_reply(ctx, n)?;
        }
        Ok(())
    }

    /// Moves the host's clock on.
    pub fn advance_ms(&mut self, ms: u64) {
        self.state_mut().now_ns += ms * 1_000_000;
    }

    /// The stream ends, however (complete, reset, client gone), in Envoy's order: the access
    /// log (`proxy_on_log`), then the filter's destruction (`proxy_on_done`, `proxy_on_delete`).
    pub fn end_stream(&mut self, ctx: u32) -> Result<()> {
        self.enter(ctx);
        self.call::<i32, ()>("proxy_on_log", ctx as i32)?;
        self.call::<i32, i32>("proxy_on_done", ctx as i32)?;
        self.call::<i32, ()>("proxy_on_delete", ctx as i32)?;
        self.state_mut().streams.remove(&ctx);
        Ok(())
    }
}

/// Builds the guard's `.wasm` (`cargo build --profile P --target wasm32-wasip1 -p
/// mcp-resume-guard`, a no-op when it is fresh) and returns its path. P is `release` (the build of
/// `make wasm`, in the same target directory), or `$MCP_ADAPTER_WASM_PROFILE`: `make check` says
/// `dev`, the build its lint step has just made, so the quick loop pays for no LTO build. Either way
/// the test runs the module the source makes.
pub fn build_guard_wasm() -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let profile = std::env::var("MCP_ADAPTER_WASM_PROFILE").unwrap_or_else(|_| "release".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "--profile",
            &profile,
            "--target",
            "wasm32-wasip1",
            "-p",
            "mcp-resume-guard",
            "--message-format=json-render-diagnostics",
        ])
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the guard's .wasm failed (is the wasm32-wasip1 target installed? \
             `make rust-targets` adds it):\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // The artefact's path from cargo's own messages: right whatever the target directory.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"compiler-artifact\"") && l.contains("mcp_resume_guard.wasm"))
        .filter_map(|l| {
            let start = l.find("\"filenames\":[")? + "\"filenames\":[".len();
            let list = &l[start..];
            let list = &list[..list.find(']')?];
            list.split(',')
                .map(|f| f.trim_matches('"').replace("\\\\", "\\"))
                .find(|f| f.ends_with(".wasm"))
        })
        .next_back()
        .map(PathBuf::from)
        .ok_or_else(|| "cargo built no mcp_resume_guard.wasm".to_string())
}
