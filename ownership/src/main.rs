//! `mcp-ownership`: the ownership service binary (CLI, store choice, serve, shutdown).
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use mcp_ownership::{
    router, spawn_sweeper, AppState, Limits, MemoryStore, RedisOptions, RedisStore, ResumeOptions,
    Store,
};

const HELP: &str = "\
mcp-ownership: ownership service for mcp-resume-guard

USAGE:
    mcp-ownership [FLAGS]

FLAGS:
    --listen ADDR                        address to serve HTTP on [default: 127.0.0.1:9200]
    --store STORE                        `memory` (embedded, one instance only) or
                                         `redis://HOST:PORT[/DB]` (shared by every instance)
                                         [default: memory]
    --store-timeout-ms MS                upper bound on one Redis operation; keep it well
                                         below the guard's callout timeout [default: 150]
    --redis-prefix PREFIX                namespace of every Redis key [default: mrg:]
    --record-wait-ms MS                  how long a resume waits for records still in flight
                                         [default: 150]
    --session-idle-ttl-secs SECS         a session untouched this long reads as expired
                                         [default: 3600]
    --max-incarnations-per-session N     stream incarnations kept per session [default: 64]
    --max-window N                       recorded events kept per incarnation [default: 4096]
    --max-expected N                     expected event ids returned by a resume [default: 256]
    -h, --help                           print this help
";

#[derive(Debug)]
enum StoreSpec {
    Memory,
    Redis(String),
}

#[derive(Debug)]
struct Cli {
    listen: SocketAddr,
    store: StoreSpec,
    record_wait_ms: u64,
    session_idle_ttl_secs: u64,
    max_incarnations_per_session: usize,
    max_window: usize,
    max_expected: usize,
    store_timeout_ms: u64,
    redis_prefix: String,
}

enum Parsed {
    Run(Cli),
    Help,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
    let mut cli = Cli {
        listen: SocketAddr::from(([127, 0, 0, 1], 9200)),
        store: StoreSpec::Memory,
        record_wait_ms: 150,
        session_idle_ttl_secs: 3600,
        max_incarnations_per_session: 64,
        max_window: 4096,
        max_expected: 256,
        store_timeout_ms: 150,
        redis_prefix: "mrg:".to_owned(),
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Parsed::Help);
        }
        // Both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let known = [
            "--listen",
            "--store",
            "--record-wait-ms",
            "--session-idle-ttl-secs",
            "--max-incarnations-per-session",
            "--max-window",
            "--max-expected",
            "--store-timeout-ms",
            "--redis-prefix",
        ];
        if !known.contains(&flag.as_str()) {
            return Err(format!("unknown flag {flag:?} (see --help)"));
        }
        let value = match inline {
            Some(v) => v,
            None => args
                .next()
                .ok_or_else(|| format!("{flag}: missing value"))?,
        };
        match flag.as_str() {
            "--listen" => {
                cli.listen = value
                    .parse()
                    .map_err(|_| format!("--listen: expected ip:port, got {value:?}"))?
            }
            "--store" => {
                cli.store = if value == "memory" {
                    StoreSpec::Memory
                } else if value.starts_with("redis://") {
                    mcp_ownership::redis::parse_url(&value).map_err(|e| format!("--store: {e}"))?;
                    StoreSpec::Redis(value)
                } else {
                    return Err(format!(
                        "--store: expected `memory` or `redis://HOST:PORT`, got {value:?}"
                    ));
                }
            }
            "--record-wait-ms" => cli.record_wait_ms = number(&flag, &value, 0, 60_000)?,
            "--session-idle-ttl-secs" => {
                cli.session_idle_ttl_secs = number(&flag, &value, 1, 30 * 86_400)?
            }
            "--max-incarnations-per-session" => {
                cli.max_incarnations_per_session = number(&flag, &value, 1, 100_000)? as usize
            }
            "--max-window" => cli.max_window = number(&flag, &value, 1, 10_000_000)? as usize,
            "--max-expected" => cli.max_expected = number(&flag, &value, 0, 100_000)? as usize,
            "--store-timeout-ms" => cli.store_timeout_ms = number(&flag, &value, 1, 60_000)?,
            "--redis-prefix" => {
                if value.contains(['{', '}']) || value.is_empty() {
                    return Err(format!(
                        "--redis-prefix: must be non-empty and without braces, got {value:?}"
                    ));
                }
                cli.redis_prefix = value
            }
            _ => return Err(format!("unknown flag {flag:?} (see --help)")),
        }
    }
    Ok(Parsed::Run(cli))
}

fn number(flag: &str, value: &str, min: u64, max: u64) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag}: expected an integer in {min}..={max}, got {value:?}"
        )),
    }
}

fn main() -> ExitCode {
    let cli = match parse_args(std::env::args().skip(1)) {
        Ok(Parsed::Help) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(cli)) => cli,
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
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    let limits = Limits {
        max_window: cli.max_window,
        max_incarnations_per_session: cli.max_incarnations_per_session,
        session_idle_ttl_ms: cli.session_idle_ttl_secs.saturating_mul(1000),
    };
    // One arm per store; each hands a concrete store to the same generic `serve`.
    match &cli.store {
        StoreSpec::Memory => serve(MemoryStore::new(limits), &cli).await,
        StoreSpec::Redis(url) => {
            let op_timeout = Duration::from_millis(cli.store_timeout_ms);
            let opts = RedisOptions {
                prefix: cli.redis_prefix.clone(),
                op_timeout,
                connect_timeout: op_timeout.min(Duration::from_millis(100)),
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
                Err(e) => eprintln!(
                    "mcp-ownership: {e}; starting anyway: /healthz and store operations answer \
                     503 store_unavailable until redis at {} answers",
                    store.addr()
                ),
            }
            serve(store, &cli).await
        }
    }
}

async fn serve<S: Store>(store: S, cli: &Cli) -> ExitCode {
    let opts = ResumeOptions {
        record_wait: Duration::from_millis(cli.record_wait_ms),
        max_expected: cli.max_expected,
    };
    let state = AppState::new(store, opts);
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
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_and_forms() {
        let Ok(Parsed::Run(c)) = parse(&[]) else {
            panic!()
        };
        assert_eq!(c.listen.to_string(), "127.0.0.1:9200");
        assert!(matches!(c.store, StoreSpec::Memory));
        assert_eq!(
            (c.record_wait_ms, c.max_window, c.max_expected),
            (150, 4096, 256)
        );
        let Ok(Parsed::Run(c)) = parse(&[
            "--listen=0.0.0.0:1",
            "--max-window",
            "7",
            "--store",
            "redis://x:1",
        ]) else {
            panic!()
        };
        assert_eq!(c.listen.to_string(), "0.0.0.0:1");
        assert_eq!(c.max_window, 7);
        assert!(matches!(c.store, StoreSpec::Redis(_)));
        assert!(matches!(parse(&["--help"]), Ok(Parsed::Help)));
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (&["--listen", "nope"][..], "--listen"),
            (&["--store", "postgres://x"][..], "--store"),
            (&["--store", "redis://"][..], "--store"),
            (&["--store", "redis://h:x"][..], "--store"),
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
    }
}
