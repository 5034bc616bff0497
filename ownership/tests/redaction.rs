//! The real binary: no response body and no log line carries a token, a Redis password or a
//! Redis error text. Listens on 127.0.0.1:(9260 + `E2E_PORT_OFFSET`), stopped by pid.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "guard-tok-9f8e7d6c5b4a3210";
const ADMIN: &str = "admin-tok-0a1b2c3d4e5f6789";
const URL_PW: &str = "urlpw-Qx7Kc2Lm9";
const FILE_PW: &str = "filepw-Rt5Vb8Nz1";

fn offset() -> u16 {
    std::env::var("E2E_PORT_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn http(port: u16, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    (status, out)
}

fn secrets() -> [&'static str; 4] {
    [TOKEN, ADMIN, URL_PW, FILE_PW]
}

/// Stops the service by pid if the test fails before it does.
struct Stop(u32);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.to_string()).status();
    }
}

#[test]
fn no_secret_in_any_body_or_log_line() {
    let dir = std::env::temp_dir().join(format!("mcp-own-redact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokens"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(dir.join("admin"), format!("{ADMIN}\n")).unwrap();
    std::fs::write(dir.join("pw"), format!("{FILE_PW}\n")).unwrap();
    let port = 9260 + offset();
    let bin = env!("CARGO_BIN_EXE_mcp-ownership");

    // Redis that is not there, with credentials in the URL and in a file.
    let child = Command::new(bin)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--store", &format!("redis://svc:{URL_PW}@127.0.0.1:1")])
        .args(["--redis-username", "svc"])
        .arg("--redis-password-file")
        .arg(dir.join("pw"))
        .arg("--token-file")
        .arg(dir.join("tokens"))
        .arg("--admin-token-file")
        .arg(dir.join("admin"))
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stop = Stop(child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "mcp-ownership did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let resume = r#"{"session":"0123456789abcdef0123456789abcdef","incarnation":"00000000000000aa","kind":"get","seq":1}"#;
    let records = r#"{"records":[{"type":"session_open","session":"0123456789abcdef0123456789abcdef","version":"v"}]}"#;
    let mut bodies = Vec::new();
    for (method, path, token, body, want) in [
        ("GET", "/healthz", None, "", 503),
        ("POST", "/v1/resume", Some(TOKEN), resume, 503),
        ("POST", "/v1/records", Some(TOKEN), records, 503),
        (
            "POST",
            "/v1/owners/gone",
            Some(ADMIN),
            r#"{"owner":"10.0.0.1:80"}"#,
            503,
        ),
        (
            "POST",
            "/v1/records",
            Some("wrong-token-0123456789"),
            records,
            401,
        ),
        (
            "POST",
            "/v1/owners/gone",
            Some(TOKEN),
            r#"{"owner":"10.0.0.1:80"}"#,
            401,
        ),
        ("GET", "/metrics", Some(TOKEN), "", 200),
    ] {
        let (st, text) = http(port, method, path, token, body);
        assert_eq!(st, want, "{method} {path}: {text}");
        if want == 503 {
            // The class of failure, not Redis's words.
            assert!(
                text.contains("unavailable") && !text.contains("refused"),
                "{text}"
            );
        }
        bodies.push(text);
    }
    // Let the health watcher log the outage, then stop by pid (SIGTERM: graceful).
    std::thread::sleep(Duration::from_millis(1500));
    Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    // Reaped: its pid may be reused now, so the guard must not kill it again.
    std::mem::forget(stop);
    let log =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    // The log does say what is wrong.
    assert!(
        log.contains("redis") && log.contains("127.0.0.1:1"),
        "{log}"
    );
    for secret in secrets() {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
        for b in &bodies {
            assert!(!b.contains(secret), "{secret} in a body:\n{b}");
        }
    }

    // A bad URL, a bad token file: refused at start, without the secret.
    for args in [
        vec![
            "--store".to_owned(),
            format!("redis://svc:{URL_PW}@127.0.0.1:x"),
        ],
        vec!["--store".to_owned(), format!("rediss://svc:{URL_PW}@:1")],
        vec!["--store".to_owned(), format!("postgres://svc:{URL_PW}@h:1")],
        vec![
            "--token-file".to_owned(),
            dir.join("pw").to_string_lossy().into_owned(),
        ],
    ] {
        std::fs::write(dir.join("pw"), "short\n").unwrap();
        let out = Command::new(bin).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains(URL_PW) && !err.contains("short"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
