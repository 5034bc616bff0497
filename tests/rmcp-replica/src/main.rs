//! `rmcp-replica`: see the crate documentation.

use std::process::ExitCode;

use rmcp_replica::{app, parse_args, Cli, USAGE};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    let cfg = match parse_args(std::env::args().skip(1)) {
        Ok(Cli::Run(cfg)) => cfg,
        Ok(Cli::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rmcp-replica: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let ct = CancellationToken::new();
    let router = match app(&cfg, ct.clone()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "rmcp-replica: cannot prepare state dir {}: {e}",
                cfg.state_dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(cfg.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rmcp-replica: cannot listen on {}: {e}", cfg.listen);
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "rmcp-replica {} (rmcp 3.11.0) listening on http://{}/mcp (state dir {})",
        cfg.name,
        cfg.listen,
        cfg.state_dir.display()
    );
    let stop = ct.clone();
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            // Ends open SSE streams, so the graceful shutdown does not wait for them.
            stop.cancel();
        })
        .await;
    match served {
        Ok(()) => {
            eprintln!("rmcp-replica {} stopped", cfg.name);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rmcp-replica {}: server error: {e}", cfg.name);
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
