//! Redis with ACL users and TLS: a redis-server of this test (127.0.0.1, port 6400 +
//! `E2E_PORT_OFFSET`, TLS only, stopped by pid), certificates made here with the openssl CLI.
//! The service authenticates as an ACL user, verifies the server against a CA file, and never
//! shows the password in an error, a response body or a log line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod suite;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mcp_ownership::redis::{RedisAuth, Secret};
use mcp_ownership::store::Limits;
use mcp_ownership::{RedisOptions, RedisStore, Store};

const USER: &str = "mrg-service";
const PASSWORD: &str = "pw-Zq8vR2xL5nT0kW3j";

fn offset() -> u16 {
    std::env::var("E2E_PORT_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("openssl");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, and a server certificate for 127.0.0.1 signed by it; plus an unrelated CA.
fn certificates(dir: &Path) {
    let o = |args: &[&str]| {
        run(Command::new("openssl").args(args).current_dir(dir));
    };
    for ca in ["ca", "other-ca"] {
        o(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=test {ca}"),
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.crt"),
        ]);
    }
    o(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    o(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ]);
}

struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server() -> Server {
    let port = 6400 + offset();
    let dir = std::env::temp_dir().join(format!("mcp-ownership-redis-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    certificates(&dir);
    let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            &p("server.crt"),
            "--tls-key-file",
            &p("server.key"),
        ])
        .args([
            "--tls-ca-cert-file",
            &p("ca.crt"),
            "--tls-auth-clients",
            "no",
        ])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ])
        // The default user is off: only the service's ACL user gets in.
        .args(["--user", "default", "off"])
        .args([
            "--user",
            USER,
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "&*",
            "+@all",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (is it installed? `make tools`)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { child, port, dir }
}

fn opts(auth: RedisAuth) -> RedisOptions {
    RedisOptions {
        prefix: format!("tls{}:", std::process::id()),
        // A debug build's TLS handshake is slow.
        op_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        auth,
        ..RedisOptions::default()
    }
}

fn good_auth(srv: &Server) -> RedisAuth {
    RedisAuth {
        username: Some(USER.into()),
        password: Some(Secret(PASSWORD.into())),
        ca_pem: Some(std::fs::read(srv.dir.join("ca.crt")).unwrap()),
    }
}

/// One test: the cases share one server (certificates take a moment).
#[tokio::test]
async fn acl_and_tls() {
    use suite::*;
    let srv = server();
    let url = format!("rediss://127.0.0.1:{}", srv.port);

    // The right user, password and CA: the store works, a verdict round-trips.
    let s = RedisStore::new(&url, Limits::default(), opts(good_auth(&srv))).unwrap();
    s.health().await.unwrap();
    apply(&s, &[open(S1), get_stream(S1, A, T0), events(S1, A, 1, 3)]).await;
    assert_eq!(verdict_get(&s, A, 1).await, cont(OWNER_X, ids(2, 3), 3));
    // The options never print the password.
    assert!(!format!("{:?}", opts(good_auth(&srv))).contains(PASSWORD));

    // Each wrong part fails as unavailable, and no error text carries the password.
    let wrong: Vec<(&str, String, RedisAuth)> = vec![
        (
            "wrong password",
            url.clone(),
            RedisAuth {
                password: Some(Secret(format!("{PASSWORD}-not"))),
                ..good_auth(&srv)
            },
        ),
        (
            "no credentials",
            url.clone(),
            RedisAuth {
                username: None,
                password: None,
                ..good_auth(&srv)
            },
        ),
        (
            "untrusted server",
            url.clone(),
            RedisAuth {
                ca_pem: Some(std::fs::read(srv.dir.join("other-ca.crt")).unwrap()),
                ..good_auth(&srv)
            },
        ),
        (
            "system roots",
            url.clone(),
            RedisAuth {
                ca_pem: None,
                ..good_auth(&srv)
            },
        ),
        (
            "plaintext to a TLS port",
            format!("redis://127.0.0.1:{}", srv.port),
            RedisAuth {
                ca_pem: None,
                ..good_auth(&srv)
            },
        ),
    ];
    for (what, url, auth) in wrong {
        let s = RedisStore::new(&url, Limits::default(), opts(auth)).unwrap();
        let e = s.health().await.expect_err(what);
        let text = format!("{e} {e:?}");
        assert!(
            matches!(e, mcp_ownership::store::StoreError::Unavailable(_)),
            "{what}: {text}"
        );
        assert!(!text.contains(PASSWORD), "{what}: {text}");
        let e = s.apply(&[open(S2)], T0).await.expect_err(what);
        assert!(!format!("{e} {e:?}").contains(PASSWORD), "{what}");
    }

    // A password in the URL works too, and a bad URL never shows it.
    let with_pw = format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{}", srv.port);
    let ca_only = RedisAuth {
        ca_pem: Some(std::fs::read(srv.dir.join("ca.crt")).unwrap()),
        ..RedisAuth::default()
    };
    let s = RedisStore::new(&with_pw, Limits::default(), opts(ca_only.clone())).unwrap();
    s.health().await.unwrap();
    for bad in [
        format!("rediss://{USER}:{PASSWORD}@127.0.0.1:x"),
        format!("rediss://{USER}:{PASSWORD}@:1"),
        format!("redis://{USER}:{PASSWORD}@127.0.0.1:1/notadb"),
    ] {
        let e = RedisStore::new(&bad, Limits::default(), opts(ca_only.clone()))
            .err()
            .unwrap()
            .to_string();
        assert!(!e.contains(PASSWORD), "{e}");
    }
}
