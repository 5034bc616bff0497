//! Bearer tokens: refused requests change nothing, the admin endpoint has its own tokens,
//! token files rotate without a failed request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use mcp_ownership::{
    router, spawn_token_reload, AppState, Auth, Limits, MemoryStore, ResumeOptions, TokenFile,
};
use serde_json::{json, Value};
use tower::ServiceExt;

const S1: &str = "0123456789abcdef0123456789abcdef";
const A: &str = "00000000000000aa";
const X: &str = "10.0.0.1:8080";
const GUARD: &str = "guard-token-0123456789abcdef";
const GUARD2: &str = "guard-token-second-0123456789";
const ADMIN: &str = "admin-token-0123456789abcdef";

static NEXT: AtomicU64 = AtomicU64::new(0);

fn tmp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "mcp-ownership-auth-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Replace `path` atomically (write aside, rename over), as a Secret volume update does.
fn write_atomic(path: &Path, text: &str) {
    let aside = path.with_extension(format!("tmp{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

fn auth(dir: &Path, guard: &str, admin: Option<&str>) -> Auth {
    let g = dir.join("guard");
    write_atomic(&g, guard);
    let admin = admin.map(|a| {
        let p = dir.join("admin");
        write_atomic(&p, a);
        Arc::new(TokenFile::load("--admin-token-file", p).unwrap())
    });
    Auth {
        guard: Some(Arc::new(TokenFile::load("--token-file", g).unwrap())),
        admin,
    }
}

fn app_with(auth: Auth) -> Router {
    let opts = ResumeOptions {
        record_wait: Duration::ZERO,
        max_expected: 256,
    };
    router(AppState::new(MemoryStore::new(Limits::default()), opts).with_auth(auth))
}

async fn call(
    app: &Router,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: impl Into<Body>,
) -> (StatusCode, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = app
        .clone()
        .oneshot(req.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    if status == StatusCode::UNAUTHORIZED {
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    }
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn setup_records() -> Value {
    json!({"records": [
        {"type": "session_open", "session": S1, "version": "2025-06-18"},
        {"type": "stream_open", "session": S1, "incarnation": A, "kind": "get", "owner": X,
         "retention": 0, "supersedes": true, "opened_ms": 1},
        {"type": "events", "session": S1, "incarnation": A, "first_seq": 1, "ids": ["e1", "e2"]},
    ]})
}

fn resume_body() -> String {
    json!({"session": S1, "incarnation": A, "kind": "get", "seq": 1}).to_string()
}

async fn verdict(app: &Router) -> Value {
    let (st, text) = call(app, Method::POST, "/v1/resume", Some(GUARD), resume_body()).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn without_the_token_every_endpoint_is_401_and_nothing_changes() {
    let dir = tmp_dir();
    let app = app_with(auth(&dir, &format!("# guards\n{GUARD}\n"), Some(ADMIN)));
    let records = setup_records().to_string();
    let gone = json!({"owner": X}).to_string();
    let branch = json!({"session": S1, "incarnation": A, "branch": 1}).to_string();
    let huge = "x".repeat(4 << 20);
    let wrong = [
        None,
        Some("not-the-token-0123456789"),
        Some(""),
        Some(&GUARD[..GUARD.len() - 1]),
    ];
    for token in wrong {
        for (method, path, body) in [
            (Method::POST, "/v1/records", records.as_str()),
            (Method::POST, "/v1/resume", &resume_body()),
            (Method::POST, "/v1/owners/gone", gone.as_str()),
            (Method::POST, "/v1/branch", branch.as_str()),
            (Method::GET, "/metrics", ""),
            (Method::GET, "/nowhere", ""),
            (Method::GET, "/v1/records", ""),
            // Refused before the body is read: not 413.
            (Method::POST, "/v1/records", huge.as_str()),
        ] {
            let (st, text) = call(&app, method.clone(), path, token, body.to_owned()).await;
            assert_eq!(
                st,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {token:?}: {text}"
            );
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["error"], "unauthorized", "{text}");
        }
    }
    // Nothing landed.
    assert_eq!(verdict(&app).await["reason"], "session_inactive");
    // Other schemes and shapes of the header.
    for header in [
        format!("Basic {GUARD}"),
        GUARD.to_owned(),
        format!("Bearer{GUARD}"),
    ] {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/v1/records")
            .header("content-type", "application/json")
            .header("authorization", header.clone())
            .body(Body::from(records.clone()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{header}");
    }
    assert_eq!(verdict(&app).await["reason"], "session_inactive");

    // With the guard's token: records land, and the guard's token cannot mark owners gone.
    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/records",
        Some(GUARD),
        records.clone(),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(verdict(&app).await["verdict"], "continue");
    for token in [None, Some(GUARD)] {
        let (st, _) = call(&app, Method::POST, "/v1/owners/gone", token, gone.clone()).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(verdict(&app).await["verdict"], "continue");
    // The admin token works there, and only there.
    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/records",
        Some(ADMIN),
        records.clone(),
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _) = call(&app, Method::POST, "/v1/resume", Some(ADMIN), resume_body()).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/branch",
        Some(ADMIN),
        branch.clone(),
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    // The guard's token asks about a branch's end (the two resumes above made branches 1, 2).
    let (st, text) = call(
        &app,
        Method::POST,
        "/v1/branch",
        Some(GUARD),
        branch.clone(),
    )
    .await;
    assert_eq!((st, text.as_str()), (StatusCode::OK, r#"{"forked":true}"#));
    let (st, text) = call(
        &app,
        Method::POST,
        "/v1/owners/gone",
        Some(ADMIN),
        gone.clone(),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{text}");
    assert_eq!(verdict(&app).await["reason"], "owner_unavailable");

    // /healthz needs nothing (probes); /metrics needs the guard's token.
    let (st, _) = call(&app, Method::GET, "/healthz", None, "").await;
    assert_eq!(st, StatusCode::OK);
    let (st, text) = call(&app, Method::GET, "/metrics", Some(GUARD), "").await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        text.contains(r#"endpoint="records",code="401""#)
            || text.contains(r#"code="401",endpoint="records""#),
        "{text}"
    );

    // Guards authenticated, no admin file: nobody marks owners gone.
    let app = app_with(auth(&tmp_dir(), GUARD, None));
    for token in [None, Some(GUARD), Some(ADMIN)] {
        let (st, _) = call(&app, Method::POST, "/v1/owners/gone", token, gone.clone()).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
    }
}

#[test]
fn token_files_are_checked_at_load() {
    let dir = tmp_dir();
    for (text, words) in [
        ("", "no token"),
        ("# only a comment\n\n", "no token"),
        ("short\n", "line 1"),
        (
            &format!("{GUARD}\nwith a space in it 0123456789\n"),
            "line 2",
        ),
    ] {
        let p = dir.join("t");
        write_atomic(&p, text);
        let e = TokenFile::load("--token-file", &p)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--token-file") && e.contains(words), "{e}");
        assert!(!e.contains(GUARD) && !e.contains("space in it"), "{e}");
    }
    let e = TokenFile::load("--token-file", dir.join("missing"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--token-file") && e.contains("missing"), "{e}");
}

/// Requests with `token` in a loop until `stop`; returns (ok, failed).
fn hammer(
    app: Router,
    token: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64)> {
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
            let (st, _) = call(&app, Method::POST, "/v1/resume", Some(token), resume_body()).await;
            if st == StatusCode::OK {
                ok += 1;
            } else {
                failed += 1;
            }
            tokio::task::yield_now().await;
        }
        (ok, failed)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_without_a_failed_request() {
    let dir = tmp_dir();
    let a = auth(&dir, GUARD, None);
    let path = dir.join("guard");
    let app = app_with(a.clone());

    // 1. The file gains the new token while requests with the old one run.
    let stop = Arc::new(AtomicBool::new(false));
    let old = hammer(app.clone(), GUARD, stop.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    write_atomic(&path, &format!("{GUARD}\n{GUARD2}\n"));
    // The new token works at once (a miss re-reads the file), the old one still does.
    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/resume",
        Some(GUARD2),
        resume_body(),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let (ok, failed) = old.await.unwrap();
    assert!(
        ok > 10 && failed == 0,
        "old token during the add: {ok} ok, {failed} failed"
    );

    // From here the files are also polled (removals need it: nothing misses).
    let reload = spawn_token_reload(a, Duration::from_millis(50));
    // A half-written (empty) file keeps the last good set.
    std::fs::write(&path, "").unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    for t in [GUARD, GUARD2] {
        let (st, _) = call(&app, Method::POST, "/v1/resume", Some(t), resume_body()).await;
        assert_eq!(st, StatusCode::OK, "{t} after an empty write");
    }
    write_atomic(&path, &format!("{GUARD}\n{GUARD2}\n"));

    // 2. The old token is removed while requests with the new one run.
    let stop = Arc::new(AtomicBool::new(false));
    let new = hammer(app.clone(), GUARD2, stop.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    write_atomic(&path, &format!("{GUARD2}\n"));
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (st, _) = call(&app, Method::POST, "/v1/resume", Some(GUARD), resume_body()).await;
        if st == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(Instant::now() < deadline, "the removed token still works");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let (ok, failed) = new.await.unwrap();
    assert!(
        ok > 10 && failed == 0,
        "new token during the removal: {ok} ok, {failed} failed"
    );
    let (st, _) = call(&app, Method::POST, "/v1/resume", Some(GUARD), resume_body()).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    reload.abort();
}
