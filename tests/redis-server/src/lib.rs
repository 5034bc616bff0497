//! A local `redis-server` for Rust tests (the store suite, the cluster tests, the simulator's
//! corpus): one way to start it, on 127.0.0.1 only, and to be sure it stops.
//!
//! The Rust test harness has no global teardown, so each server runs under a watchdog shell
//! that stops it (by pid) once the test process is gone.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh server may take to open its port.
const OPEN_WITHIN: Duration = Duration::from_secs(10);

/// Whether `redis-server` is on the PATH.
pub fn installed() -> bool {
    Command::new("sh")
        .args(["-c", "command -v redis-server"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts `redis-server` on 127.0.0.1:`port` with no persistence, plus `extra` arguments
/// (already shell-quoted), and waits until the port accepts connections. A port already in use
/// is an error, never a server shared with another run.
pub fn start(port: u16, extra: &str) -> Result<Child, String> {
    // Another run's server on the port would answer for a while, then vanish under the test.
    if TcpStream::connect(("127.0.0.1", port)).is_ok() {
        return Err(format!(
            "127.0.0.1:{port} is already in use (another test run? set E2E_PORT_OFFSET)"
        ));
    }
    let script = format!(
        "redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no {extra} \
         --daemonize no --loglevel warning & rp=$!; \
         while kill -0 {parent} 2>/dev/null && kill -0 $rp 2>/dev/null; do sleep 0.2; done; \
         kill $rp 2>/dev/null; wait $rp",
        parent = std::process::id()
    );
    let child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("start redis-server (is it installed? `make tools`): {e}"))?;
    let deadline = Instant::now() + OPEN_WITHIN;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() >= deadline {
            return Err(format!("redis-server did not open 127.0.0.1:{port}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child)
}
