//! `mcp-ownership`: the ownership service binary (CLI, store choice, serve, shutdown).
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mcp_ownership::redis::{RedisAuth, Secret};
use mcp_ownership::{
    router, spawn_sweeper, spawn_token_reload, AppState, Auth, Limits, MemoryStore, RedisOptions,
    RedisStore, ResumeOptions, Store, TokenFile,
};

/// Every default, written once (the help shows them).
mod defaults {
    pub const LISTEN: &str = "127.0.0.1:9200";
    pub const STORE: &str = "memory";
    pub const STORE_TIMEOUT_MS: u64 = 150;
    pub const REDIS_PREFIX: &str = "mrg:";
    pub const RECORD_WAIT_MS: u64 = mcp_ownership::resume::DEFAULT_RECORD_WAIT_MS;
    pub const SESSION_IDLE_TTL_SECS: u64 = 3600;
    pub const MAX_INCARNATIONS_PER_SESSION: usize = 64;
    pub const MAX_EXPECTED: usize = mcp_ownership::resume::DEFAULT_MAX_EXPECTED;
    /// A continue verdict never owes more than the window, so its list is never cut short.
    pub const MAX_WINDOW: usize = MAX_EXPECTED;
    pub const MAX_SESSIONS: usize = 100_000;
    pub const MAX_PENDING_SESSIONS: usize = 10_000;
    pub const OWNER_FAILURE_WINDOW_MS: u64 = 30_000;
    pub const MAX_STORE_BYTES: usize = 256 << 20;
    pub const MAX_SESSION_EVENTS: usize = 16_384;
}

/// mcp-ownership: ownership service for mcp-resume-guard.
///
/// Every flag can also be set by the environment variable shown with it (a flag wins).
#[derive(Debug, Parser)]
#[command(name = "mcp-ownership", version)]
struct Cli {
    /// Address to serve HTTP on.
    #[arg(long, env = "MCP_OWNERSHIP_LISTEN", value_name = "ADDR", default_value = defaults::LISTEN)]
    listen: SocketAddr,

    /// `memory` (embedded, one instance only), `redis://HOST:PORT[/DB]` (shared by every
    /// instance) or `redis-cluster://HOST:PORT[,HOST:PORT…]` (a Redis Cluster, every node
    /// listed a seed); `rediss://` and `rediss-cluster://` for TLS. Give credentials with
    /// --redis-username and --redis-password-file (or MCP_OWNERSHIP_REDIS_PASSWORD), not in
    /// the URL.
    #[arg(long, env = "MCP_OWNERSHIP_STORE", value_name = "STORE", default_value = defaults::STORE, hide_env_values = true)]
    store: String,

    /// Upper bound on one Redis operation; keep it well below the guard's callout timeout.
    #[arg(long, env = "MCP_OWNERSHIP_STORE_TIMEOUT_MS", value_name = "MS",
          default_value_t = defaults::STORE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=60_000), allow_negative_numbers = true)]
    store_timeout_ms: u64,

    /// Namespace of every Redis key (non-empty, no braces).
    #[arg(long, env = "MCP_OWNERSHIP_REDIS_PREFIX", value_name = "PREFIX",
          default_value = defaults::REDIS_PREFIX, value_parser = redis_prefix)]
    redis_prefix: String,

    /// Redis ACL user (with a password: AUTH user password).
    #[arg(long, env = "MCP_OWNERSHIP_REDIS_USERNAME", value_name = "USER")]
    redis_username: Option<String>,

    /// File whose first line is the Redis password. Or MCP_OWNERSHIP_REDIS_PASSWORD (the
    /// password itself; never a flag, so it is never on a command line).
    #[arg(long, env = "MCP_OWNERSHIP_REDIS_PASSWORD_FILE", value_name = "PATH")]
    redis_password_file: Option<PathBuf>,

    /// PEM CA certificates to verify a rediss:// server with (default: the system's roots).
    #[arg(long, env = "MCP_OWNERSHIP_REDIS_CA_FILE", value_name = "PATH")]
    redis_ca_file: Option<PathBuf>,

    /// Replicas that must hold a record before it is acknowledged (Redis WAIT), so that a
    /// failover cannot lose it. Default: 1 on a Redis Cluster, 0 on one endpoint.
    #[arg(long, env = "MCP_OWNERSHIP_REDIS_WAIT_REPLICAS", value_name = "N",
          value_parser = clap::value_parser!(u32).range(0..=16), allow_negative_numbers = true)]
    redis_wait_replicas: Option<u32>,

    /// Bytes of Redis memory (used_memory, per primary) the service lets its data grow to:
    /// above 90% of it new sessions are refused (store_full) before Redis refuses writes.
    /// Default: 80% of each primary's maxmemory (none when Redis has no maxmemory). Must stay
    /// under 95% of maxmemory (/healthz says so otherwise).
    #[arg(long, env = "MCP_OWNERSHIP_REDIS_MAX_BYTES", value_name = "BYTES",
          value_parser = clap::value_parser!(u64).range(1 << 20..=1 << 50), allow_negative_numbers = true)]
    redis_max_bytes: Option<u64>,

    /// An owner that failed continuations (owner_failed: refused, reset, its own 5xx) is taken
    /// as gone once its failures stood through this long (a failure at each end) with no
    /// answer between (events, a served continuation); before, a resume may try it again (a
    /// blip is not a loss).
    #[arg(long, env = "MCP_OWNERSHIP_OWNER_FAILURE_WINDOW_MS", value_name = "MS",
          default_value_t = defaults::OWNER_FAILURE_WINDOW_MS, value_parser = clap::value_parser!(u64).range(0..=3_600_000), allow_negative_numbers = true)]
    owner_failure_window_ms: u64,

    /// How long a resume waits for records still in flight, and a clean branch end that would be
    /// `forked` for its rivals' guards' word (docs/forks.md).
    #[arg(long, env = "MCP_OWNERSHIP_RECORD_WAIT_MS", value_name = "MS",
          default_value_t = defaults::RECORD_WAIT_MS, value_parser = clap::value_parser!(u64).range(0..=60_000), allow_negative_numbers = true)]
    record_wait_ms: u64,

    /// A session untouched this long reads as expired.
    #[arg(long, env = "MCP_OWNERSHIP_SESSION_IDLE_TTL_SECS", value_name = "SECS",
          default_value_t = defaults::SESSION_IDLE_TTL_SECS, value_parser = clap::value_parser!(u64).range(1..=30 * 86_400), allow_negative_numbers = true)]
    session_idle_ttl_secs: u64,

    /// Stream incarnations kept per session.
    #[arg(long, env = "MCP_OWNERSHIP_MAX_INCARNATIONS_PER_SESSION", value_name = "N",
          default_value_t = defaults::MAX_INCARNATIONS_PER_SESSION, value_parser = count(1, 100_000), allow_negative_numbers = true)]
    max_incarnations_per_session: usize,

    /// Recorded events kept per incarnation.
    #[arg(long, env = "MCP_OWNERSHIP_MAX_WINDOW", value_name = "N",
          default_value_t = defaults::MAX_WINDOW, value_parser = count(1, 10_000_000), allow_negative_numbers = true)]
    max_window: usize,

    /// Opened sessions kept in all. At the cap, sessions idle past the idle TTL are freed;
    /// if none is, a new session is refused (`store_full`, counted in
    /// mcp_ownership_sessions_refused_total): a session active within the TTL is never evicted
    /// for room. Size it above initialize rate × idle TTL (README). Memory and Redis.
    #[arg(long, env = "MCP_OWNERSHIP_MAX_SESSIONS", value_name = "N",
          default_value_t = defaults::MAX_SESSIONS, value_parser = count(1, 1_000_000_000), allow_negative_numbers = true)]
    max_sessions: usize,

    /// Sessions with records but no session_open yet (a record that overtook its session's
    /// open), kept apart from --max-sessions; past it the oldest is dropped. Records for
    /// made-up session ids land here and never touch opened sessions.
    #[arg(long, env = "MCP_OWNERSHIP_MAX_PENDING_SESSIONS", value_name = "N",
          default_value_t = defaults::MAX_PENDING_SESSIONS, value_parser = count(1, 1_000_000_000), allow_negative_numbers = true)]
    max_pending_sessions: usize,

    /// Recorded events a session keeps across all its incarnations. Past it, the session's
    /// least recently recorded incarnations give theirs up first (their cursors read `gap`),
    /// then the one just written its oldest: one session's traffic never grows into the
    /// others' room. Memory and Redis.
    #[arg(long, env = "MCP_OWNERSHIP_MAX_SESSION_EVENTS", value_name = "N",
          default_value_t = defaults::MAX_SESSION_EVENTS, value_parser = count(1, 1_000_000_000), allow_negative_numbers = true)]
    max_session_events: usize,

    /// Estimated bytes the memory store keeps in all. Above 90% of it new sessions are
    /// refused (store_full); at it a session's growth (events, new streams) is refused
    /// (store_full, counted in mcp_ownership_growth_refused_total). A session active within
    /// the idle TTL is never evicted for room. Keep it well below the container's memory
    /// limit. Redis: --redis-max-bytes.
    #[arg(long, env = "MCP_OWNERSHIP_MAX_STORE_BYTES", value_name = "BYTES",
          default_value_t = defaults::MAX_STORE_BYTES, value_parser = count(1 << 20, 1 << 46), allow_negative_numbers = true)]
    max_store_bytes: usize,

    /// Bearer tokens of the guards, one per line; every endpoint but /healthz and
    /// /v1/owners/gone requires one. Re-read when the file changes (rotation: old and new
    /// tokens side by side, then only the new). Without it the service is open to anyone who
    /// reaches it (a local demo only; a warning is logged).
    #[arg(long, env = "MCP_OWNERSHIP_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<PathBuf>,

    /// Bearer tokens allowed on /v1/owners/gone (the preStop hook, operators), and only there.
    /// With --token-file but without this, /v1/owners/gone refuses everybody.
    #[arg(long, env = "MCP_OWNERSHIP_ADMIN_TOKEN_FILE", value_name = "PATH")]
    admin_token_file: Option<PathBuf>,

    /// Expected event ids returned by a resume. Below --max-window, a resume owing more
    /// recorded events than this is refused by the guard (`ownership_unavailable`): it cannot
    /// check a replay past the list.
    #[arg(long, env = "MCP_OWNERSHIP_MAX_EXPECTED", value_name = "N",
          default_value_t = defaults::MAX_EXPECTED, value_parser = count(0, 100_000), allow_negative_numbers = true)]
    max_expected: usize,
}

/// A `usize` flag within `min..=max`.
fn count(min: u64, max: u64) -> impl clap::builder::TypedValueParser<Value = usize> {
    use clap::builder::TypedValueParser as _;
    clap::value_parser!(u64)
        .range(min..=max)
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn redis_prefix(value: &str) -> Result<String, String> {
    if value.is_empty() || value.contains(['{', '}']) {
        Err("must be non-empty and without braces".to_owned())
    } else {
        Ok(value.to_owned())
    }
}

#[derive(Debug)]
enum StoreSpec {
    Memory,
    Redis(String),
}

/// The environment variable holding the Redis password itself.
const REDIS_PASSWORD_ENV: &str = "MCP_OWNERSHIP_REDIS_PASSWORD";

/// Redis credentials and TLS roots from the flags, files and environment.
fn redis_auth(cli: &Cli, password_env: Option<String>) -> Result<RedisAuth, String> {
    let password = match (&cli.redis_password_file, password_env) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "--redis-password-file and {REDIS_PASSWORD_ENV}: give the password one way"
            ))
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--redis-password-file {}: {e}", path.display()))?;
            let first = text.lines().next().unwrap_or("").trim_end_matches('\r');
            if first.is_empty() {
                return Err(format!(
                    "--redis-password-file {}: the first line is empty",
                    path.display()
                ));
            }
            Some(Secret(first.to_owned()))
        }
        (None, Some(p)) if p.is_empty() => None,
        (None, p) => p.map(Secret),
    };
    let ca_pem = cli
        .redis_ca_file
        .as_ref()
        .map(|p| std::fs::read(p).map_err(|e| format!("--redis-ca-file {}: {e}", p.display())))
        .transpose()?;
    Ok(RedisAuth {
        username: cli.redis_username.clone(),
        password,
        ca_pem,
    })
}

/// `--store`, checked without ever echoing the value: a Redis URL may carry a password.
fn store_spec(value: &str) -> Result<StoreSpec, String> {
    if value == "memory" {
        Ok(StoreSpec::Memory)
    } else if value.starts_with("redis://")
        || value.starts_with("rediss://")
        || mcp_ownership::redis::is_cluster_url(value)
    {
        mcp_ownership::redis::parse_url(value).map_err(|e| format!("--store: {e}"))?;
        Ok(StoreSpec::Redis(value.to_owned()))
    } else {
        Err(
            "--store: expected `memory`, `redis://HOST:PORT` (or rediss://) or \
             `redis-cluster://HOST:PORT[,HOST:PORT…]` (or rediss-cluster://)"
                .to_owned(),
        )
    }
}

// RSS follows the live heap, not its highest point (see Cargo.toml).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; usage errors exit 2.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let store = match store_spec(&cli.store) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mcp-ownership: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(w) = expected_warning(&cli) {
        eprintln!("{w}");
    }
    let auth = match load_auth(&cli) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mcp-ownership: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcp-ownership: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli, store, auth))
}

/// A verdict's `expected` list shorter than the window makes the guard refuse every resume
/// that owes more (it never relays a replay it cannot check).
fn expected_warning(cli: &Cli) -> Option<String> {
    (cli.max_expected < cli.max_window).then(|| {
        format!(
            "mcp-ownership: WARNING: --max-expected {} is below --max-window {}: a resume owing \
             more than {} recorded events is refused by the guard (ownership_unavailable) \
             instead of continued",
            cli.max_expected, cli.max_window, cli.max_expected
        )
    })
}

fn load_auth(cli: &Cli) -> Result<Auth, String> {
    let load = |flag, path: &Option<PathBuf>| {
        path.as_ref()
            .map(|p| {
                TokenFile::load(flag, p)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .transpose()
    };
    let auth = Auth {
        guard: load("--token-file", &cli.token_file)?,
        admin: load("--admin-token-file", &cli.admin_token_file)?,
    };
    match (&auth.guard, &auth.admin) {
        (None, _) => eprintln!(
            "mcp-ownership: WARNING: no --token-file: records, resumes and metrics are open to \
             anyone who can reach {} (fine for a local demo, never for a deployment)",
            cli.listen
        ),
        (Some(_), None) => {
            eprintln!("mcp-ownership: no --admin-token-file: /v1/owners/gone refuses every caller")
        }
        (Some(_), Some(_)) => {}
    }
    Ok(auth)
}

async fn run(cli: Cli, store: StoreSpec, auth: Auth) -> ExitCode {
    let limits = Limits {
        max_window: cli.max_window,
        max_incarnations_per_session: cli.max_incarnations_per_session,
        session_idle_ttl_ms: cli.session_idle_ttl_secs.saturating_mul(1000),
        max_sessions: cli.max_sessions,
        max_bytes: cli.max_store_bytes,
        max_session_events: cli.max_session_events,
        max_pending_sessions: cli.max_pending_sessions,
        owner_failure_window_ms: cli.owner_failure_window_ms,
        ..Limits::default()
    };
    // One arm per store; each hands a concrete store to the same generic `serve`.
    match &store {
        StoreSpec::Memory => serve(MemoryStore::new(limits), &cli, auth).await,
        StoreSpec::Redis(url) => {
            let op_timeout = Duration::from_millis(cli.store_timeout_ms);
            let redis_auth = match redis_auth(&cli, std::env::var(REDIS_PASSWORD_ENV).ok()) {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("mcp-ownership: {e}");
                    return ExitCode::from(2);
                }
            };
            let opts = RedisOptions {
                auth: redis_auth,
                prefix: cli.redis_prefix.clone(),
                op_timeout,
                // A TLS handshake is a round trip more.
                wait_replicas: cli
                    .redis_wait_replicas
                    .unwrap_or(u32::from(mcp_ownership::redis::is_cluster_url(url))),
                max_bytes: cli.redis_max_bytes,
                connect_timeout: if url.starts_with("rediss") {
                    op_timeout
                } else {
                    op_timeout.min(Duration::from_millis(100))
                },
                ..RedisOptions::default()
            };
            let store = match RedisStore::new(url, limits, opts) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("mcp-ownership: --store: {e}");
                    return ExitCode::from(2);
                }
            };
            // Redis down at start is not fatal: say so, serve 503 store_unavailable (and
            // /healthz 503) until it answers, and say when it does.
            match store.health().await {
                Ok(()) => eprintln!("mcp-ownership: redis at {} is answering", store.addr()),
                // Not fatal either: replicas come and go (a failover leaves a primary without
                // one for a while), and an exit would turn that into a crash loop.
                Err(e @ mcp_ownership::store::StoreError::Misconfigured(_)) => {
                    eprintln!("mcp-ownership: ERROR: {e}; /healthz answers 503 until this is fixed")
                }
                Err(e) => eprintln!(
                    "mcp-ownership: {e}; starting anyway: /healthz and store operations answer \
                     503 store_unavailable until redis at {} answers",
                    store.addr()
                ),
            }
            serve(store, &cli, auth).await
        }
    }
}

async fn serve<S: Store>(store: S, cli: &Cli, auth: Auth) -> ExitCode {
    let opts = ResumeOptions {
        record_wait: Duration::from_millis(cli.record_wait_ms),
        max_expected: cli.max_expected,
    };
    let reload =
        (!auth.is_open()).then(|| spawn_token_reload(auth.clone(), Duration::from_secs(1)));
    let state = AppState::new(store, opts).with_auth(auth);
    // Sweep often enough that memory follows the TTL, rarely enough to cost nothing.
    let every = Duration::from_secs((cli.session_idle_ttl_secs / 10).clamp(1, 60));
    let sweeper = spawn_sweeper(&state, every);
    let watcher = spawn_health_watch(&state);
    let listener = match tokio::net::TcpListener::bind(cli.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mcp-ownership: --listen {}: cannot bind: {e}", cli.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().unwrap_or(cli.listen);
    eprintln!(
        "mcp-ownership listening on {addr} (store: {})",
        state.store.name()
    );
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await;
    sweeper.abort();
    watcher.abort();
    if let Some(r) = reload {
        r.abort();
    }
    match served {
        Ok(()) => {
            eprintln!("mcp-ownership: shut down");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mcp-ownership: server error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Log every change of the store's reachability (once per change, not per request), so an
/// operator sees "redis unavailable" and "redis back" in the log.
fn spawn_health_watch<S: Store>(state: &AppState<S>) -> tokio::task::JoinHandle<()> {
    let st = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_ok: Option<bool> = None;
        loop {
            tick.tick().await;
            let r = mcp_ownership::resume::timed(&st.metrics, "health", st.store.health()).await;
            let ok = r.is_ok();
            if was_ok.is_some_and(|w| w != ok) {
                match r {
                    Ok(()) => eprintln!(
                        "mcp-ownership: store {} is answering again",
                        st.store.name()
                    ),
                    Err(e) => eprintln!("mcp-ownership: {e}; answering 503 store_unavailable"),
                }
            }
            was_ok = Some(ok);
        }
    })
}

/// Resolves on SIGINT or SIGTERM (Kubernetes sends SIGTERM; a terminal sends SIGINT).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            // Cannot listen for SIGTERM: fall back to SIGINT only.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        Cli::try_parse_from(std::iter::once("mcp-ownership").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_forms() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:9200");
        assert!(matches!(store_spec(&c.store), Ok(StoreSpec::Memory)));
        assert_eq!(
            (c.record_wait_ms, c.max_window, c.max_expected),
            (150, 4096, 4096)
        );
        assert_eq!(expected_warning(&c), None);
        let low = parse(&["--max-expected", "256"]).unwrap();
        let w = expected_warning(&low).unwrap_or_default();
        assert!(
            w.contains("--max-expected 256") && w.contains("--max-window 4096"),
            "{w}"
        );
        let c = parse(&[
            "--listen=0.0.0.0:1",
            "--max-window",
            "7",
            "--store",
            "redis://x:1",
        ])
        .unwrap();
        assert_eq!(c.listen.to_string(), "0.0.0.0:1");
        assert_eq!(c.max_window, 7);
        assert!(matches!(store_spec(&c.store), Ok(StoreSpec::Redis(_))));
        let help = Cli::try_parse_from(["mcp-ownership", "--help"]).unwrap_err();
        assert!(!help.use_stderr());
        Cli::command().debug_assert();
    }

    #[test]
    fn help_names_every_flag_its_variable_and_default() {
        let help = Cli::command().render_long_help().to_string();
        for arg in Cli::command().get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" || long == "version" {
                continue;
            }
            assert!(help.contains(&format!("--{long}")), "--{long} missing");
            let env = arg.get_env().unwrap().to_string_lossy().into_owned();
            assert!(env.starts_with("MCP_OWNERSHIP_"), "--{long}: {env}");
            assert!(help.contains(&env), "{env} missing in help");
        }
        assert!(help.contains("[default: 127.0.0.1:9200]"), "{help}");
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (&["--listen", "nope"][..], "--listen"),
            (&["--store-timeout-ms", "0"][..], "--store-timeout-ms"),
            (&["--redis-prefix", "a{b}"][..], "--redis-prefix"),
            (&["--max-window", "0"][..], "--max-window"),
            (&["--record-wait-ms", "-1"][..], "--record-wait-ms"),
            (&["--max-expected"][..], "--max-expected"),
            (&["--bogus", "1"][..], "--bogus"),
        ] {
            let err = parse(args).err().unwrap();
            assert!(err.contains(flag), "{err}");
        }
        for (store, words) in [
            ("postgres://x", "expected `memory`"),
            ("redis://", "no host"),
            ("redis://h:x", "bad port"),
        ] {
            let err = store_spec(store).err().unwrap();
            assert!(err.contains("--store") && err.contains(words), "{err}");
        }
    }

    #[test]
    fn redis_password_from_a_file_or_the_environment() {
        let f = std::env::temp_dir().join(format!("mcp-own-pw-{}", std::process::id()));
        std::fs::write(&f, "s3cr3t-pw\nignored\n").unwrap();
        let path = f.to_string_lossy().into_owned();
        let c = parse(&["--redis-username", "u", "--redis-password-file", &path]).unwrap();
        let a = redis_auth(&c, None).unwrap();
        assert_eq!(a.username.as_deref(), Some("u"));
        assert_eq!(a.password, Some(Secret("s3cr3t-pw".into())));
        assert!(!format!("{a:?}").contains("s3cr3t"));
        let e = redis_auth(&c, Some("x".into())).err().unwrap();
        assert!(e.contains("one way"), "{e}");
        let c = parse(&[]).unwrap();
        let a = redis_auth(&c, Some("from-env".into())).unwrap();
        assert_eq!(a.password, Some(Secret("from-env".into())));
        std::fs::write(&f, "\n").unwrap();
        let c = parse(&["--redis-password-file", &path]).unwrap();
        let e = redis_auth(&c, None).err().unwrap();
        assert!(
            e.contains("--redis-password-file") && e.contains("empty"),
            "{e}"
        );
        let _ = std::fs::remove_file(&f);
    }

    #[test]
    fn a_bad_store_url_never_shows_its_password() {
        for url in [
            "redis://user:s3cr3t-pw@host:notaport",
            "redis://user:s3cr3t-pw",
            "redis://:s3cr3t-pw@:1",
            "rediss:/user:s3cr3t-pw@h",
            "http://user:s3cr3t-pw@h:1",
        ] {
            let err = store_spec(url).err().unwrap();
            assert!(!err.contains("s3cr3t"), "{err}");
        }
    }
}
