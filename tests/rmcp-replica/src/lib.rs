//! `rmcp-replica`: an MCP server built on the official Rust SDK (`rmcp`, pinned to 3.11.0)
//! and deployed the way docs/problem.md describes: several replicas share their *sessions* through
//! a store (here a directory of JSON files, rmcp's `SessionStore` trait), while each replica's
//! *events* stay in its own process (rmcp's `LocalSessionManager` cache).
//!
//! rmcp mints event ids `<index>/<http_request_id>` per session worker and per process, so two
//! replicas that serve the same session hand out the same ids for different streams. That is
//! the deployment the guard exists for. A test fixture, not a product.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use axum::{extract::Request, http::HeaderValue, middleware::Next, response::Response};
use mcp_resume_guard_contiguity::{ContiguityEventStore, RingEventStore};
use rmcp::{
    handler::server::wrapper::Parameters,
    model::{
        CallToolResult, ContentBlock, CustomNotification, ProgressNotificationParam,
        ServerCapabilities, ServerConfig, ServerNotification,
    },
    schemars,
    service::RequestContext,
    tool, tool_handler, tool_router,
    transport::streamable_http_server::{
        session::{
            local::{LocalSessionManager, SessionConfig},
            SessionState, SessionStore, SessionStoreError,
        },
        StreamableHttpServerConfig, StreamableHttpService,
    },
    ErrorData, RoleServer, ServerHandler,
};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

pub const USAGE: &str = "\
usage: rmcp-replica --listen 127.0.0.1:PORT --name NAME --state-dir DIR [--sse-retry-ms MS]
                    [--event-store ring:N[,contiguity]]

  --listen        address to serve MCP on (loopback only), path /mcp
  --name          replica name, sent back in the `x-replica` response header
  --state-dir     directory shared by all replicas: sessions/ (the shared session store)
                  and ledger.jsonl (one line per finished `progress` call)
  --sse-retry-ms  `retry:` of rmcp's priming events (default 500)
  --event-store   ring:N: rmcp's EventStore interface on a ring of the last N events per stream
                  (instead of rmcp's internal cache); ring:N,contiguity: the same, wrapped in
                  the contiguity adapter (adapters/rust), so every replay starts with an assertion
";

/// `--event-store ring:N[,contiguity]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventStoreSpec {
    pub ring: usize,
    pub contiguity: bool,
}

impl std::str::FromStr for EventStoreSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--event-store {s:?}: expected ring:N or ring:N,contiguity (N >= 1)");
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        let (n, contiguity) = match rest.split_once(',') {
            Some((n, "contiguity")) => (n, true),
            Some(_) => return Err(bad()),
            None => (rest, false),
        };
        let ring: usize = n.parse().map_err(|_| bad())?;
        if kind != "ring" || ring == 0 {
            return Err(bad());
        }
        Ok(EventStoreSpec { ring, contiguity })
    }
}

/// Command line.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub name: String,
    pub state_dir: PathBuf,
    pub sse_retry_ms: u64,
    pub event_store: Option<EventStoreSpec>,
}

#[derive(Debug)]
pub enum Cli {
    Run(Config),
    Help,
}

/// Parses the arguments after the program name.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Cli, String> {
    let mut listen = None;
    let mut name = None;
    let mut state_dir = None;
    let mut sse_retry_ms = 500u64;
    let mut event_store = None;
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(Cli::Help);
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                let addr: SocketAddr = value
                    .parse()
                    .map_err(|e| format!("--listen {value}: {e}"))?;
                if !addr.ip().is_loopback() {
                    return Err(format!(
                        "--listen {value}: only loopback addresses are allowed"
                    ));
                }
                listen = Some(addr);
            }
            "--name" => {
                if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(format!("--name {value:?}: visible ASCII only"));
                }
                name = Some(value);
            }
            "--state-dir" => state_dir = Some(PathBuf::from(value)),
            "--sse-retry-ms" => {
                sse_retry_ms = value
                    .parse()
                    .map_err(|e| format!("--sse-retry-ms {value}: {e}"))?;
            }
            "--event-store" => event_store = Some(value.parse()?),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(Cli::Run(Config {
        listen: listen.ok_or("--listen is required")?,
        name: name.ok_or("--name is required")?,
        state_dir: state_dir.ok_or("--state-dir is required")?,
        sse_retry_ms,
        event_store,
    }))
}

// ---- the shared session store ------------------------------------------------------------

/// rmcp's `SessionStore` on a directory shared by all replicas: one JSON file per session,
/// written atomically (temp file + rename). Any replica can then restore any session.
#[derive(Debug, Clone)]
pub struct FileSessionStore {
    dir: PathBuf,
}

impl FileSessionStore {
    pub fn new(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(FileSessionStore { dir })
    }

    /// Session ids are visible ASCII; anything but `[A-Za-z0-9_-]` is hex-escaped.
    fn path(&self, session_id: &str) -> PathBuf {
        let mut name = String::with_capacity(session_id.len() + 5);
        for b in session_id.bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                name.push(char::from(b));
            } else {
                name.push_str(&format!("%{b:02x}"));
            }
        }
        name.push_str(".json");
        self.dir.join(name)
    }
}

#[async_trait::async_trait]
impl SessionStore for FileSessionStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        match tokio::fs::read(self.path(session_id)).await {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Box::new(e)),
        }
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let path = self.path(session_id);
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        tokio::fs::write(&tmp, serde_json::to_vec(state)?).await?;
        tokio::fs::rename(&tmp, &path).await?;
        Ok(())
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        match tokio::fs::remove_file(self.path(session_id)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Box::new(e)),
        }
    }
}

// ---- the MCP server ----------------------------------------------------------------------

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ProduceArgs {
    /// Notifications to send (default 1).
    #[serde(default)]
    pub n: Option<u32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ProgressArgs {
    /// Progress notifications to send before the result (default 5).
    #[serde(default)]
    pub steps: Option<u32>,
    /// Delay before each notification, in milliseconds (default 200).
    #[serde(default)]
    pub step_ms: Option<u64>,
    /// Free text echoed in the result, to tell calls apart.
    #[serde(default)]
    pub label: Option<String>,
}

/// One MCP server per session; all of them on one replica share `name` and the ledger path.
#[derive(Clone)]
pub struct ProgressServer {
    name: Arc<str>,
    ledger: Arc<PathBuf>,
    /// Notifications `produce` sent in this session, to number them.
    produced: Arc<std::sync::atomic::AtomicU64>,
}

impl ProgressServer {
    pub fn new(name: Arc<str>, ledger: Arc<PathBuf>) -> Self {
        ProgressServer {
            name,
            ledger,
            produced: Arc::default(),
        }
    }
}

#[tool_router]
impl ProgressServer {
    /// Sends `n` `notifications/message` on the session's standalone GET stream (rmcp routes
    /// notifications that name no request there), numbered `data.n` from 1 per session.
    #[tool(
        description = "Sends `n` notifications/message on the standalone GET stream, numbered per session"
    )]
    async fn produce(
        &self,
        Parameters(args): Parameters<ProduceArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let n = args.n.unwrap_or(1).min(10_000);
        let mut last = 0;
        for _ in 0..n {
            last = self
                .produced
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1;
            let params = serde_json::json!({
                "level": "info",
                "data": { "replica": &*self.name, "n": last },
            });
            // A custom notification of the logging method: rmcp deprecates its logging API.
            let note = CustomNotification::new("notifications/message", Some(params));
            let _ = ctx
                .peer
                .send_notification(ServerNotification::CustomNotification(note))
                .await;
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "produced {last}"
        ))]))
    }

    /// Sends `steps` progress notifications (when the request has a progress token), then
    /// returns which replica ran the call. The call is appended to the shared ledger, so a
    /// test can tell how often it ran.
    #[tool(
        description = "Streams `steps` progress notifications, `step_ms` apart, then returns the label and the replica that ran it"
    )]
    async fn progress(
        &self,
        Parameters(args): Parameters<ProgressArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let steps = args.steps.unwrap_or(5).min(1000);
        let step_ms = args.step_ms.unwrap_or(200).min(60_000);
        let label = args.label.unwrap_or_default();
        let token = ctx.meta.get_progress_token();
        for step in 1..=steps {
            tokio::time::sleep(Duration::from_millis(step_ms)).await;
            if let Some(token) = &token {
                let note = ProgressNotificationParam::new(token.clone(), f64::from(step))
                    .with_total(f64::from(steps))
                    .with_message(format!("{label} step {step}/{steps} on {}", self.name));
                // A closed client stream is not a cancellation: keep working (the 2025 rule).
                let _ = ctx.peer.notify_progress(note).await;
            }
        }
        let line = serde_json::json!({ "label": label, "replica": &*self.name, "steps": steps });
        if let Err(e) = append_line(&self.ledger, &line.to_string()).await {
            eprintln!("rmcp-replica {}: ledger: {e}", self.name);
        }
        let text = format!("done: label={label} replica={} steps={steps}", self.name);
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }
}

#[tool_handler]
impl ServerHandler for ProgressServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions("rmcp-replica: interop fixture for mcp-resume-guard")
    }
}

async fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await?;
    f.write_all(format!("{line}\n").as_bytes()).await?;
    f.flush().await
}

/// The axum app: rmcp's Streamable HTTP service on `/mcp`, plus `x-replica` on every response.
pub fn app(cfg: &Config, ct: CancellationToken) -> std::io::Result<axum::Router> {
    let store = FileSessionStore::new(cfg.state_dir.join("sessions"))?;
    let retry = Duration::from_millis(cfg.sse_retry_ms);

    let mut session_config = SessionConfig::default();
    session_config.sse_retry = Some(retry);
    let mut manager = LocalSessionManager::default();
    manager.session_config = session_config;
    if let Some(spec) = cfg.event_store {
        let ring = RingEventStore::new(spec.ring);
        manager = if spec.contiguity {
            manager.with_event_store(Arc::new(ContiguityEventStore::new(ring)))
        } else {
            manager.with_event_store(Arc::new(ring))
        };
    }

    let mut server_config = StreamableHttpServerConfig::default()
        .with_sse_retry(Some(retry))
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .with_cancellation_token(ct);
    server_config.session_store = Some(Arc::new(store));

    let name: Arc<str> = Arc::from(cfg.name.as_str());
    let ledger = Arc::new(cfg.state_dir.join("ledger.jsonl"));
    let factory_name = name.clone();
    let service = StreamableHttpService::new(
        move || Ok(ProgressServer::new(factory_name.clone(), ledger.clone())),
        Arc::new(manager),
        server_config,
    );
    let header = HeaderValue::from_str(&cfg.name).map_err(std::io::Error::other)?;
    Ok(axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let header = header.clone();
                async move {
                    let mut resp: Response = next.run(req).await;
                    resp.headers_mut().insert("x-replica", header);
                    resp
                }
            },
        )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_the_command_line() {
        let cli = parse_args(args(&[
            "--listen",
            "127.0.0.1:9101",
            "--name",
            "r1",
            "--state-dir",
            "/tmp/x",
        ]));
        match cli {
            Ok(Cli::Run(c)) => {
                assert_eq!(c.listen.port(), 9101);
                assert_eq!(c.name, "r1");
                assert_eq!(c.sse_retry_ms, 500);
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_args(args(&[
            "--listen",
            "0.0.0.0:1",
            "--name",
            "a",
            "--state-dir",
            "d"
        ]))
        .is_err());
        assert!(parse_args(args(&["--name", "a", "--state-dir", "d"])).is_err());
        assert!(matches!(parse_args(args(&["--help"])), Ok(Cli::Help)));
        let base = ["--listen", "127.0.0.1:1", "--name", "a", "--state-dir", "d"];
        let with = |spec: &str| {
            let mut v = base.to_vec();
            v.extend(["--event-store", spec]);
            parse_args(args(&v))
        };
        match with("ring:100,contiguity") {
            Ok(Cli::Run(c)) => assert_eq!(
                c.event_store,
                Some(EventStoreSpec {
                    ring: 100,
                    contiguity: true
                })
            ),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(with("ring:5"), Ok(Cli::Run(c)) if c.event_store == Some(EventStoreSpec { ring: 5, contiguity: false }))
        );
        for bad in ["ring:0", "ring:x", "log:5", "ring:5,other", "ring"] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("--event-store"), "{e}");
        }
    }

    #[tokio::test]
    async fn file_store_round_trips_and_escapes_names() {
        let dir = std::env::temp_dir().join(format!("rmcp-replica-test-{}", std::process::id()));
        let store = FileSessionStore::new(dir.clone()).unwrap();
        assert!(store.path("../etc/passwd").starts_with(&dir));
        assert!(store.load("nope").await.unwrap().is_none());
        let state: SessionState = serde_json::from_value(serde_json::json!({
            "initialize_params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"}
            }
        }))
        .unwrap();
        store.store("a/b", &state).await.unwrap();
        assert!(store.load("a/b").await.unwrap().is_some());
        store.delete("a/b").await.unwrap();
        assert!(store.load("a/b").await.unwrap().is_none());
        store.delete("a/b").await.unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
