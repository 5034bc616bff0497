//! `naive-replica`: see the crate documentation and README.md.

use std::process::ExitCode;

use naive_replica::{parse_args, serve_until, AppState, Cli, USAGE};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> ExitCode {
    let cfg = match parse_args(std::env::args().skip(1)) {
        Ok(Cli::Run(cfg)) => cfg,
        Ok(Cli::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("naive-replica: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let state = match AppState::new(cfg.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "naive-replica: cannot prepare state dir {}: {e}",
                cfg.state_dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(cfg.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("naive-replica: cannot listen on {}: {e}", cfg.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().unwrap_or(cfg.listen);
    eprintln!(
        "naive-replica {} listening on http://{addr}{} (state dir {}, ring {}, tick {} ms)",
        cfg.name,
        cfg.path,
        cfg.state_dir.display(),
        cfg.ring,
        cfg.tick_ms
    );
    let name = cfg.name.clone();
    match serve_until(listener, state, shutdown_signal()).await {
        Ok(()) => {
            eprintln!("naive-replica {name} stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("naive-replica {name}: server error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let int = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = term => {}
        _ = int => {}
    }
}
