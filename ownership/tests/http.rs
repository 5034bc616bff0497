//! The HTTP API, through the router (tower `oneshot`) and over a real socket.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use mcp_ownership::store::{Applied, BranchOpen, Facts, SnapshotQuery, StoreError, StoreStats};
use mcp_ownership::{router, AppState, Limits, MemoryStore, ResumeOptions, Store};
use mcp_resume_core::ownership::Record;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tower::ServiceExt;

const S1: &str = "0123456789abcdef0123456789abcdef";
const A: &str = "00000000000000aa";
const B: &str = "00000000000000bb";
const X: &str = "10.0.0.1:8080";

fn opts(wait_ms: u64) -> ResumeOptions {
    ResumeOptions {
        record_wait: Duration::from_millis(wait_ms),
        max_expected: 256,
    }
}

fn app() -> Router {
    router(AppState::new(MemoryStore::new(Limits::default()), opts(0)))
}

async fn call(
    app: &Router,
    method: Method,
    path: &str,
    ctype: Option<&str>,
    body: impl Into<Body>,
) -> (StatusCode, String) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(ct) = ctype {
        req = req.header("content-type", ct);
    }
    let resp = app
        .clone()
        .oneshot(req.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn post(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    let (st, text) = call(
        app,
        Method::POST,
        path,
        Some("application/json"),
        body.to_string(),
    )
    .await;
    (
        st,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

fn setup_records() -> Value {
    json!({"records": [
        {"type": "session_open", "session": S1, "version": "2025-06-18"},
        {"type": "stream_open", "session": S1, "incarnation": A, "kind": "get", "owner": X,
         "retention": 0, "supersedes": true, "opened_ms": 1},
        {"type": "events", "session": S1, "incarnation": A, "first_seq": 1, "ids": ["e1", "e2", "e3"]},
    ]})
}

fn resume_body(inc: &str, seq: u64) -> Value {
    json!({"session": S1, "incarnation": inc, "kind": "get", "seq": seq})
}

fn assert_error(
    status: StatusCode,
    body: &Value,
    want_status: StatusCode,
    error: &str,
    detail_has: &str,
) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"], error, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(detail_has),
        "detail {detail:?} lacks {detail_has:?}"
    );
}

#[tokio::test]
async fn records_then_resume() {
    let app = app();
    let (st, ack) = post(&app, "/v1/records", setup_records()).await;
    assert_eq!((st, ack), (StatusCode::OK, json!({"applied": 3})));
    let (st, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"verdict": "continue", "owner": X, "expected": ["e2", "e3"], "head": 3, "branch": 1})
    );
    let (st, v) = post(&app, "/v1/resume", resume_body(B, 1)).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"verdict": "new_stream", "reason": "unknown_stream"})
    );
}

#[tokio::test]
async fn bad_json_and_fields_are_named() {
    let app = app();
    let (st, text) = call(
        &app,
        Method::POST,
        "/v1/resume",
        Some("application/json"),
        "{\"session\":",
    )
    .await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_json", "EOF");

    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": S1, "incarnation": A, "kind": "get"}),
    )
    .await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "seq");
    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": S1, "incarnation": A, "kind": "get", "seq": "7"}),
    )
    .await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "seq");
    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": S1, "incarnation": A, "kind": "get", "seq": 1, "extra": 1}),
    )
    .await;
    assert_error(
        st,
        &body,
        StatusCode::BAD_REQUEST,
        "bad_field",
        "unknown field `extra`",
    );
    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": S1, "incarnation": A, "kind": "sideways", "seq": 1}),
    )
    .await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "sideways");
    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": S1, "incarnation": A, "kind": "get", "seq": 1, "registration": "XYZ"}),
    )
    .await;
    assert_error(
        st,
        &body,
        StatusCode::BAD_REQUEST,
        "bad_field",
        "registration",
    );
    let (st, text) = call(
        &app,
        Method::POST,
        "/v1/resume",
        Some("application/json"),
        format!("{} x", resume_body(A, 1)),
    )
    .await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_json", "trailing");

    // Shapes.
    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": "ABC", "incarnation": A, "kind": "get", "seq": 1}),
    )
    .await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "session");
    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": S1, "incarnation": "00000000000000AA", "kind": "get", "seq": 1}),
    )
    .await;
    assert_error(
        st,
        &body,
        StatusCode::BAD_REQUEST,
        "bad_field",
        "incarnation",
    );
    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": S1, "incarnation": A, "kind": "get", "seq": u64::MAX}),
    )
    .await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "seq");
    let (st, body) = post(
        &app,
        "/v1/resume",
        json!({"session": S1, "incarnation": A, "kind": "get", "seq": -1}),
    )
    .await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "seq");
}

/// One rejected record of a batch: (index, detail). Panics unless the answer is a 200 ack.
fn rejected(st: StatusCode, ack: &Value) -> Vec<(u64, String)> {
    assert_eq!(st, StatusCode::OK, "{ack}");
    ack.get("rejected")
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    assert_eq!(e["error"], "bad_field", "{e}");
                    (
                        e["index"].as_u64().unwrap(),
                        e["detail"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_bad_record_is_named_and_the_others_apply() {
    let app = app();
    // Record 1 (the stream_open) is bad; 0 and 2 land.
    let mut batch = setup_records();
    batch["records"][1]["owner"] = json!("pod-a");
    let (st, ack) = post(&app, "/v1/records", batch).await;
    let r = rejected(st, &ack);
    assert_eq!(ack["applied"], 2, "{ack}");
    assert_eq!(r.len(), 1, "{ack}");
    assert_eq!(r[0].0, 1);
    assert!(r[0].1.starts_with("records[1].owner: "), "{}", r[0].1);
    // The session and the events landed; the incarnation has no StreamOpen, so no owner.
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(v["reason"], "unknown_stream", "{v}");
    // Its StreamOpen arriving later completes it: the events were applied.
    let (st, ack) = post(&app, "/v1/records", setup_records()).await;
    assert_eq!(rejected(st, &ack), vec![]);
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(
        v,
        json!({"verdict": "continue", "owner": X, "expected": ["e2", "e3"], "head": 3, "branch": 1})
    );

    for (owner, ok) in [
        ("10.0.0.1:080", false),
        ("10.0.0.1:0", false),
        ("[fd00::1]:80", true),
        ("10.0.0.1", false),
    ] {
        let mut batch = setup_records();
        batch["records"][1]["owner"] = json!(owner);
        let (st, ack) = post(&app, "/v1/records", batch).await;
        assert_eq!(rejected(st, &ack).is_empty(), ok, "{owner}: {ack}");
    }

    // Every kind of per-record problem, each named with its index and field, in one batch.
    let good = json!({"type": "session_open", "session": S1, "version": "2025-06-18"});
    let cases: Vec<(Value, &str)> = vec![
        (json!({"type": "nonsense", "session": S1}), "nonsense"),
        (
            json!({"type": "events", "session": S1, "incarnation": A, "first_seq": 1, "ids": ["ok", "x".repeat(129)]}),
            "ids[1]: 129 bytes",
        ),
        (
            json!({"type": "events", "session": S1, "incarnation": A, "first_seq": u64::MAX, "ids": ["a"]}),
            "first_seq",
        ),
        (
            json!({"type": "session_open", "session": S1, "version": ""}),
            "version",
        ),
        (
            json!({"type": "events", "session": S1, "incarnation": A, "first_seq": 1, "ids": ["a"],
                   "long": [{"seq": 1, "id": "y".repeat(200)}]}),
            "long[0].id: does not match the recorded digest",
        ),
        (
            json!({"type": "events", "session": S1, "incarnation": A, "first_seq": 1, "ids": ["a"],
                   "long": [{"seq": 2, "id": "y".repeat(200)}]}),
            "long[0].seq",
        ),
        (
            json!({"type": "stream_lost", "session": S1, "incarnation": A, "extra": 1}),
            "unknown field `extra`",
        ),
        (
            json!({"type": "events", "session": S1, "incarnation": A, "first_seq": "1", "ids": []}),
            // Inside a tagged record serde cannot name the field of a type error.
            ": invalid type: string \"1\", expected u64",
        ),
        (json!(7), "invalid type"),
    ];
    let mut records = vec![good.clone()];
    for (r, _) in &cases {
        records.push(r.clone());
        records.push(good.clone());
    }
    let (st, ack) = post(&app, "/v1/records", json!({ "records": records })).await;
    let r = rejected(st, &ack);
    assert_eq!(ack["applied"], cases.len() + 1, "{ack}");
    assert_eq!(r.len(), cases.len(), "{ack}");
    for (k, ((index, detail), (_, want))) in r.iter().zip(&cases).enumerate() {
        let at = 2 * k as u64 + 1;
        assert_eq!(*index, at, "{ack}");
        assert!(
            detail.starts_with(&format!("records[{at}]")) && detail.contains(want),
            "{detail:?} lacks {want:?}"
        );
    }

    // Only the envelope fails a whole batch.
    let many: Vec<Value> = (0..10_001)
        .map(|_| json!({"type": "owner_gone", "owner": X}))
        .collect();
    let (st, body) = post(&app, "/v1/records", json!({ "records": many })).await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "10000");
    let (st, body) = post(&app, "/v1/records", json!({ "records": {} })).await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "records");
    let (st, body) = post(&app, "/v1/records", json!({ "recs": [] })).await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "recs");
    let (st, text) = call(
        &app,
        Method::POST,
        "/v1/records",
        Some("application/json"),
        "{\"records\": [",
    )
    .await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_json", "EOF");
}

/// A 1,500-byte and a 16 KiB replica id go through records (digest + full form) and come back
/// in a verdict as `resume_id`; the expected ids are the recorded forms.
#[tokio::test]
async fn long_ids_round_trip_over_http() {
    use mcp_resume_core::ownership::recorded_id;
    let app = app();
    post(&app, "/v1/records", setup_records()).await;
    let l1500 = format!("a{}", "1".repeat(1499));
    let l16k = format!("b{}", "2".repeat(16 * 1024 - 1));
    let (d1500, d16k) = (recorded_id(&l1500), recorded_id(&l16k));
    assert_eq!((d1500.len(), d16k.len()), (44, 44));
    let batch = json!({"records": [{
        "type": "events", "session": S1, "incarnation": A, "first_seq": 4,
        "ids": [d1500, "e5", d16k],
        "long": [{"seq": 4, "id": l1500}, {"seq": 6, "id": l16k}],
    }]});
    let (st, ack) = post(&app, "/v1/records", batch).await;
    assert_eq!((st, ack), (StatusCode::OK, json!({"applied": 1})));
    let (st, v) = post(&app, "/v1/resume", resume_body(A, 3)).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"verdict": "continue", "owner": X, "expected": [d1500, "e5", d16k], "head": 6, "branch": 1})
    );
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 4)).await;
    assert_eq!(
        v,
        json!({"verdict": "continue", "owner": X, "expected": ["e5", d16k], "head": 6, "resume_id": l1500, "branch": 2})
    );
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 6)).await;
    assert_eq!(
        v,
        json!({"verdict": "continue", "owner": X, "expected": [], "head": 6, "resume_id": l16k, "branch": 3})
    );
}

#[tokio::test]
async fn transport_errors_are_json() {
    let app = app();
    let (st, text) = call(&app, Method::GET, "/v1/resume", None, Body::empty()).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(
        st,
        &body,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "GET",
    );
    let (st, text) = call(
        &app,
        Method::POST,
        "/healthz",
        Some("application/json"),
        "{}",
    )
    .await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(
        st,
        &body,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "POST",
    );
    let (st, text) = call(&app, Method::GET, "/nope", None, Body::empty()).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(st, &body, StatusCode::NOT_FOUND, "not_found", "endpoint");
    let (st, text) = call(
        &app,
        Method::POST,
        "/v1/resume",
        Some("text/plain"),
        resume_body(A, 1).to_string(),
    )
    .await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(
        st,
        &body,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "application/json",
    );
    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/resume",
        None,
        resume_body(A, 1).to_string(),
    )
    .await;
    assert_eq!(st, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/resume",
        Some("application/json; charset=utf-8"),
        resume_body(A, 1).to_string(),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let big = format!("{{\"records\":[],\"pad\":\"{}\"}}", "x".repeat(1024 * 1024));
    let (st, text) = call(
        &app,
        Method::POST,
        "/v1/records",
        Some("application/json"),
        big,
    )
    .await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(
        st,
        &body,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        "bytes",
    );
}

#[tokio::test]
async fn owners_gone_endpoint() {
    let app = app();
    post(&app, "/v1/records", setup_records()).await;
    let (st, body) = post(&app, "/v1/owners/gone", json!({"owner": "nope"})).await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "owner");
    let (st, body) = post(&app, "/v1/owners/gone", json!({"owner": X, "why": 1})).await;
    assert_error(st, &body, StatusCode::BAD_REQUEST, "bad_field", "why");
    let (st, ack) = post(&app, "/v1/owners/gone", json!({"owner": X})).await;
    assert_eq!((st, ack), (StatusCode::OK, json!({"applied": 1})));
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(
        v,
        json!({"verdict": "new_stream", "reason": "owner_unavailable"})
    );
}

#[tokio::test]
async fn healthz_and_metrics() {
    let app = app();
    let (st, text) = call(&app, Method::GET, "/healthz", None, Body::empty()).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"status": "ok", "store": "memory"})
    );
    post(&app, "/v1/records", setup_records()).await;
    post(&app, "/v1/resume", resume_body(A, 1)).await;
    post(&app, "/v1/resume", resume_body(B, 1)).await;
    post(&app, "/v1/resume", json!({})).await;
    let (st, text) = call(&app, Method::GET, "/metrics", None, Body::empty()).await;
    assert_eq!(st, StatusCode::OK);
    for line in [
        "mcp_ownership_verdicts_total{outcome=\"continue\"} 1",
        "mcp_ownership_verdicts_total{outcome=\"unknown_stream\"} 1",
        "mcp_ownership_verdicts_total{outcome=\"gap\"} 0",
        "mcp_ownership_http_requests_total{endpoint=\"resume\",code=\"200\"} 2",
        "mcp_ownership_http_requests_total{endpoint=\"resume\",code=\"400\"} 1",
        "mcp_ownership_http_requests_total{endpoint=\"records\",code=\"200\"} 1",
        "mcp_ownership_records_applied_total{type=\"events\"} 1",
        "mcp_ownership_store_errors_total{op=\"snapshot\"} 0",
        "mcp_ownership_store_operation_duration_seconds_count{op=\"snapshot\"} 2",
        "mcp_ownership_sessions 1",
        "mcp_ownership_incarnations 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

/// A resume waits for records that are still travelling, through the handler.
#[tokio::test]
async fn resume_waits_for_in_flight_records() {
    let app = router(AppState::new(
        MemoryStore::new(Limits::default()),
        opts(5_000),
    ));
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { post(&app, "/v1/resume", resume_body(A, 2)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    post(&app, "/v1/records", setup_records()).await;
    let (st, v) = waiter.await.unwrap();
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"verdict": "continue", "owner": X, "expected": ["e3"], "head": 3, "branch": 1})
    );
    let (_, text) = call(&app, Method::GET, "/metrics", None, Body::empty()).await;
    assert!(
        text.contains("mcp_ownership_resume_waits_total{outcome=\"continue\"} 1"),
        "{text}"
    );
}

/// Idle TTL through the handler, with an injected clock.
#[tokio::test]
async fn idle_ttl_with_injected_clock() {
    let now = Arc::new(AtomicU64::new(1_000_000));
    let clock = {
        let now = now.clone();
        Arc::new(move || now.load(Ordering::SeqCst))
    };
    let limits = Limits {
        session_idle_ttl_ms: 10_000,
        ..Limits::default()
    };
    let app = router(AppState::new(MemoryStore::new(limits), opts(0)).with_clock(clock));
    post(&app, "/v1/records", setup_records()).await;
    now.fetch_add(10_000, Ordering::SeqCst);
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(v["verdict"], "continue");
    now.fetch_add(10_001, Ordering::SeqCst);
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(v["reason"], "session_inactive");
}

/// A store that is down: every operation fails.
struct DownStore(watch::Sender<u64>);

impl Store for DownStore {
    fn name(&self) -> &'static str {
        "down"
    }
    async fn apply(&self, _: &[Record], _: u64) -> Result<Applied, StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
    async fn snapshot(&self, _: SnapshotQuery<'_>, _: u64) -> Result<Facts, StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
    async fn open_branch(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: u64,
    ) -> Result<BranchOpen, StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
    async fn end_branch(&self, _: &str, _: &str, _: u64, _: u64) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
    async fn end_branch_settled(
        &self,
        _: &str,
        _: &str,
        _: u64,
        _: u64,
    ) -> Result<Option<bool>, StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
    async fn health(&self) -> Result<(), StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
    async fn stats(&self, _: u64) -> Result<StoreStats, StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
    async fn sweep(&self, _: u64) -> Result<usize, StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
}

/// What a failing backend says: it must reach the log only, never a response body.
const DOWN_TEXT: &str = "connection refused by redis://u:hunter2@10.9.9.9:6379";

#[tokio::test]
async fn store_failure_is_503() {
    let app = router(AppState::new(DownStore(watch::channel(0).0), opts(300)));
    let (st, body) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_error(
        st,
        &body,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "down: unavailable",
    );
    assert!(!body.to_string().contains("hunter2"), "{body}");
    let (st, body) = post(&app, "/v1/records", setup_records()).await;
    assert_error(
        st,
        &body,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "down: unavailable",
    );
    assert!(!body.to_string().contains("hunter2"), "{body}");
    let (st, text) = call(&app, Method::GET, "/healthz", None, Body::empty()).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"status": "unavailable", "store": "down", "detail": "unavailable"})
    );
    let branch = json!({"session": S1, "incarnation": A, "branch": 1});
    let (st, body) = post(&app, "/v1/branch", branch).await;
    assert_error(
        st,
        &body,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "down: unavailable",
    );
    assert!(!body.to_string().contains("hunter2"), "{body}");
    // Validation still comes first: bad input is 400 even when the store is down.
    let (st, _) = post(&app, "/v1/resume", json!({"nope": 1})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let (st, text) = call(&app, Method::GET, "/metrics", None, Body::empty()).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        text.contains("mcp_ownership_store_errors_total{op=\"snapshot\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("mcp_ownership_store_errors_total{op=\"stats\"} 1"),
        "{text}"
    );
}

// ---------------- over a real socket ----------------

async fn serve(state: AppState<MemoryStore>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    addr
}

/// A deliberately tiny HTTP/1.1 client: one request per connection, `Connection: close`.
async fn raw(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String, String) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or(""));
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    conn.read_to_end(&mut resp).await.unwrap();
    let resp = String::from_utf8(resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[tokio::test]
async fn socket_end_to_end() {
    let addr = serve(AppState::new(
        MemoryStore::new(Limits::default()),
        opts(5_000),
    ))
    .await;

    let (st, head, body) = raw(addr, "GET", "/healthz", None).await;
    assert_eq!(st, 200);
    assert!(head.contains("content-type: application/json"));
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"status": "ok", "store": "memory"})
    );

    // A resume sent before its records: answered once they land over another connection.
    let waiter = tokio::spawn(async move {
        raw(
            addr,
            "POST",
            "/v1/resume",
            Some(&resume_body(A, 3).to_string()),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (st, _, body) = raw(
        addr,
        "POST",
        "/v1/records",
        Some(&setup_records().to_string()),
    )
    .await;
    assert_eq!((st, body.as_str()), (200, "{\"applied\":3}"));
    let (st, _, body) = waiter.await.unwrap();
    assert_eq!(st, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"verdict": "continue", "owner": X, "expected": [], "head": 3, "branch": 1})
    );

    let (st, _, body) = raw(addr, "POST", "/v1/resume", Some("{\"session\": 5}")).await;
    assert_eq!(st, 400);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "bad_field");
    assert!(v["detail"].as_str().unwrap().contains("session"), "{v}");

    let (st, _, body) = raw(
        addr,
        "POST",
        "/v1/resume",
        Some("{\"session\": \"x\", \"bogus\": 1}"),
    )
    .await;
    assert_eq!(st, 400);
    assert!(body.contains("bogus"), "{body}");

    let (st, head, body) = raw(addr, "DELETE", "/v1/records", None).await;
    assert_eq!(st, 405);
    assert!(head.contains("content-type: application/json"));
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "method_not_allowed"
    );

    let (st, _, body) = raw(
        addr,
        "POST",
        "/v1/owners/gone",
        Some(&json!({"owner": X}).to_string()),
    )
    .await;
    assert_eq!((st, body.as_str()), (200, "{\"applied\":1}"));
    let (_, _, body) = raw(
        addr,
        "POST",
        "/v1/resume",
        Some(&resume_body(A, 3).to_string()),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["reason"],
        "owner_unavailable"
    );

    let (st, head, body) = raw(addr, "GET", "/metrics", None).await;
    assert_eq!(st, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(
        body.contains("mcp_ownership_verdicts_total{outcome=\"continue\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("mcp_ownership_verdicts_total{outcome=\"owner_unavailable\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("mcp_ownership_records_applied_total{type=\"owner_gone\"} 1"),
        "{body}"
    );
    assert!(body.trim_end().ends_with("# EOF"));
}

#[tokio::test]
async fn socket_garbage_never_kills_the_server() {
    let addr = serve(AppState::new(MemoryStore::new(Limits::default()), opts(0))).await;
    for body in ["", "null", "[]", "{\"records\": null}", "\u{0}\u{1}"] {
        let (st, _, resp) = raw(addr, "POST", "/v1/records", Some(body)).await;
        assert_eq!(st, 400, "{body:?} → {resp}");
        let v: Value = serde_json::from_str(&resp).unwrap();
        assert!(v["error"].is_string() && v["detail"].is_string(), "{resp}");
    }
    // A bad element is the record's problem, not the batch's.
    for body in ["{\"records\": [{}]}", "{\"records\": [{\"type\": 7}]}"] {
        let (st, _, resp) = raw(addr, "POST", "/v1/records", Some(body)).await;
        assert_eq!(st, 200, "{body:?} → {resp}");
        let v: Value = serde_json::from_str(&resp).unwrap();
        assert_eq!(v["applied"], 0, "{resp}");
        assert_eq!(v["rejected"][0]["index"], 0, "{resp}");
    }
    let (st, _, _) = raw(addr, "GET", "/healthz", None).await;
    assert_eq!(st, 200);
}

/// A store whose change feed never fires (like a shared store that cannot see records landing
/// through another instance): resume still finds them by re-checking.
struct Deaf(MemoryStore);

impl Store for Deaf {
    fn name(&self) -> &'static str {
        "deaf"
    }
    async fn apply(&self, r: &[Record], now: u64) -> Result<Applied, StoreError> {
        self.0.apply(r, now).await
    }
    async fn snapshot(&self, q: SnapshotQuery<'_>, now: u64) -> Result<Facts, StoreError> {
        self.0.snapshot(q, now).await
    }
    async fn open_branch(
        &self,
        s: &str,
        i: &str,
        r: Option<&str>,
        now: u64,
    ) -> Result<BranchOpen, StoreError> {
        self.0.open_branch(s, i, r, now).await
    }
    async fn end_branch(&self, s: &str, i: &str, b: u64, now: u64) -> Result<bool, StoreError> {
        self.0.end_branch(s, i, b, now).await
    }
    async fn end_branch_settled(
        &self,
        s: &str,
        i: &str,
        b: u64,
        now: u64,
    ) -> Result<Option<bool>, StoreError> {
        self.0.end_branch_settled(s, i, b, now).await
    }
    fn changes(&self) -> watch::Receiver<u64> {
        // Sender dropped at once: `changed()` errors immediately, forever.
        watch::channel(0).1
    }
    async fn health(&self) -> Result<(), StoreError> {
        self.0.health().await
    }
    async fn stats(&self, now: u64) -> Result<StoreStats, StoreError> {
        self.0.stats(now).await
    }
    async fn sweep(&self, now: u64) -> Result<usize, StoreError> {
        self.0.sweep(now).await
    }
}

#[tokio::test]
async fn resume_rechecks_without_change_feed() {
    let state = AppState::new(Deaf(MemoryStore::new(Limits::default())), opts(2_000));
    let app = router(state.clone());
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { post(&app, "/v1/resume", resume_body(A, 2)).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    // Straight into the store, as another instance would.
    let batch: mcp_resume_core::ownership::RecordBatch =
        serde_json::from_value(setup_records()).unwrap();
    state
        .store
        .apply(&batch.records, (state.clock)())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (st, v) = waiter.await.unwrap();
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["verdict"], "continue", "{v}");
    assert!(started.elapsed() < Duration::from_millis(1_000));
}

/// Red team 4's `abandon-race` through two gateways: a real continuation's clean end asks
/// `POST /v1/branch` while a dropped copy of its resume, registered, has its `abandoned` record
/// still on the way through another gateway and another instance of this service (a store
/// whose change feed never fires). The answer waits for it, re-checking, and is the replica's
/// own end; a registration nobody settles still counts once the wait is over.
#[tokio::test]
async fn branch_end_waits_for_an_abandon_through_another_instance() {
    let state = AppState::new(Deaf(MemoryStore::new(Limits::default())), opts(2_000));
    let app = router(state.clone());
    assert_eq!(
        post(&app, "/v1/records", setup_records()).await.0,
        StatusCode::OK
    );
    let mut branches = Vec::new();
    for reg in ["00000000000000a1", "00000000000000b1", "00000000000000b2"] {
        let mut q = resume_body(A, 1);
        q["registration"] = json!(reg);
        let (st, v) = post(&app, "/v1/resume", q).await;
        assert_eq!(
            (st, &v["verdict"]),
            (StatusCode::OK, &json!("continue")),
            "{v}"
        );
        branches.push(v["branch"].as_u64().unwrap());
    }
    let relayed = json!({"records": [{"type": "events", "session": S1, "incarnation": A,
        "first_seq": 2, "ids": ["e2", "e3"], "branch": branches[0]}]});
    assert_eq!(post(&app, "/v1/records", relayed).await.0, StatusCode::OK);
    let end = json!({"session": S1, "incarnation": A, "branch": branches[0]});
    let waiter = {
        let (app, end) = (app.clone(), end.clone());
        tokio::spawn(async move { post(&app, "/v1/branch", end).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    // Straight into the store, as another instance would.
    let abandoned = |reg: &str| Record::Abandoned {
        session: S1.into(),
        incarnation: A.into(),
        registration: reg.into(),
    };
    let records = [abandoned("00000000000000b1"), abandoned("00000000000000b2")];
    state.store.apply(&records, (state.clock)()).await.unwrap();
    let started = std::time::Instant::now();
    let (st, v) = waiter.await.unwrap();
    assert_eq!((st, v), (StatusCode::OK, json!({"forked": false})));
    assert!(started.elapsed() < Duration::from_millis(1_000));

    // A registration whose guard never says a word: counted after the wait, as before.
    let mut q = resume_body(A, 3);
    q["registration"] = json!("00000000000000c1");
    let (_, v) = post(&app, "/v1/resume", q).await;
    assert_eq!(v["verdict"], "continue", "{v}");
    let mut q = resume_body(A, 3);
    q["registration"] = json!("00000000000000c2");
    let (_, v) = post(&app, "/v1/resume", q).await;
    let end = json!({"session": S1, "incarnation": A, "branch": v["branch"]});
    let short = AppState {
        opts: opts(100),
        ..state.clone()
    };
    let app = router(short);
    assert_eq!(
        post(&app, "/v1/branch", end).await.1,
        json!({"forked": true})
    );
}

/// A full store refuses a new session by name (`store_full`, in `rejected` at its batch
/// position), counts it, and answers its cursors `records_lost` (counted as a verdict).
#[tokio::test]
async fn store_full_is_named_counted_and_explains_the_verdict() {
    let limits = Limits {
        max_sessions: 1,
        ..Limits::default()
    };
    let app = router(AppState::new(MemoryStore::new(limits), opts(0)));
    let (st, ack) = post(&app, "/v1/records", setup_records()).await;
    assert_eq!((st, ack), (StatusCode::OK, json!({"applied": 3})));
    let other = "fedcba9876543210fedcba9876543210";
    let batch = json!({"records": [
        {"type": "session_end", "session": "x", "why": "expired"},
        {"type": "session_open", "session": other, "version": "2025-06-18"},
        {"type": "events", "session": other, "incarnation": A, "first_seq": 1, "ids": ["e1"]},
    ]});
    let (st, ack) = post(&app, "/v1/records", batch).await;
    assert_eq!(st, StatusCode::OK, "{ack}");
    assert_eq!(ack["applied"], 1, "{ack}");
    assert_eq!(ack["rejected"][0]["index"], 0, "{ack}");
    assert_eq!(ack["rejected"][1]["index"], 1, "{ack}");
    assert_eq!(ack["rejected"][1]["error"], "store_full", "{ack}");
    let detail = ack["rejected"][1]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("records[1]: ") && detail.contains("--max-sessions"),
        "{detail}"
    );
    let body = json!({"session": other, "incarnation": A, "kind": "get", "seq": 1});
    let (_, v) = post(&app, "/v1/resume", body).await;
    assert_eq!(v["reason"], "records_lost", "{v}");
    // The opened session is untouched.
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(v["verdict"], "continue", "{v}");
    let (_, text) = call(&app, Method::GET, "/metrics", None, Body::empty()).await;
    for line in [
        "mcp_ownership_sessions_refused_total 1",
        "mcp_ownership_verdicts_total{outcome=\"records_lost\"} 1",
        "mcp_ownership_pending_sessions 1",
        "mcp_ownership_sessions 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
}

/// `POST /v1/branch`: the store marks the branch ended and answers whether another branch of
/// the incarnation is open; a bad body is a named 400. Records refused by the arbiter are named
/// in `rejected` (`forked`, `replay_mismatch`); all of it is counted.
#[tokio::test]
async fn branch_endpoint_and_refused_events() {
    let app = app();
    post(&app, "/v1/records", setup_records()).await;
    for want in 1..=2 {
        let (_, v) = post(&app, "/v1/resume", resume_body(A, 3)).await;
        assert_eq!(v["branch"], want, "{v}");
    }
    // Branch 1 relays: a branch that never relayed makes no other one forked.
    let relayed = json!({"records": [{"type": "events", "session": S1, "incarnation": A,
                                      "first_seq": 4, "ids": ["e4"], "branch": 1}]});
    post(&app, "/v1/records", relayed).await;
    let ask = |branch: u64, inc: &str| json!({"session": S1, "incarnation": inc, "branch": branch});
    for (q, forked) in [(ask(2, A), true), (ask(1, A), false), (ask(1, B), false)] {
        let (st, v) = post(&app, "/v1/branch", q.clone()).await;
        assert_eq!((st, v), (StatusCode::OK, json!({"forked": forked})), "{q}");
    }
    for (body, error, detail) in [
        (
            json!({"session": "XYZ", "incarnation": A, "branch": 1}),
            "bad_field",
            "session",
        ),
        (
            json!({"session": S1, "incarnation": "aa", "branch": 1}),
            "bad_field",
            "incarnation",
        ),
        (
            json!({"session": S1, "incarnation": A}),
            "bad_field",
            "branch",
        ),
        (
            json!({"session": S1, "incarnation": A, "branch": -1}),
            "bad_field",
            "branch",
        ),
        (
            ask(1, A).as_object().map_or(json!(null), |o| {
                let mut o = o.clone();
                o.insert("extra".into(), json!(1));
                Value::Object(o)
            }),
            "bad_field",
            "extra",
        ),
    ] {
        let (st, v) = post(&app, "/v1/branch", body.clone()).await;
        assert_error(st, &v, StatusCode::BAD_REQUEST, error, detail);
    }
    let (st, text) = call(
        &app,
        Method::POST,
        "/v1/branch",
        Some("application/json"),
        "{",
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{text}");
    let (st, _) = call(&app, Method::POST, "/v1/branch", Some("text/plain"), "{}").await;
    assert_eq!(st, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (st, _) = call(&app, Method::GET, "/v1/branch", None, Body::empty()).await;
    assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);

    // Branches 3 and 4 relay at once: 3's next events are refused; then 4 replays another
    // event at a recorded seq.
    for _ in 0..2 {
        post(&app, "/v1/resume", resume_body(A, 3)).await;
    }
    let ev = |branch: u64, first: u64, ids: &[&str]| {
        json!({"type": "events", "session": S1, "incarnation": A, "first_seq": first,
               "ids": ids, "branch": branch})
    };
    let batch = json!({"records": [ev(3, 4, &["e4"]), ev(4, 4, &["e4"]), ev(3, 5, &["e5"]),
                                   ev(4, 5, &["other"]), ev(4, 6, &["e6"])]});
    let (st, ack) = post(&app, "/v1/records", batch).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(ack["applied"], 4, "{ack}");
    let refused: Vec<(u64, &str)> = ack["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["index"].as_u64().unwrap(), r["error"].as_str().unwrap()))
        .collect();
    assert_eq!(refused, [(2, "forked")], "{ack}");
    let batch = json!({"records": [ev(4, 4, &["other"])]});
    let (_, ack) = post(&app, "/v1/records", batch).await;
    assert_eq!(ack["rejected"][0]["error"], "replay_mismatch", "{ack}");
    assert!(
        ack["rejected"][0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("records[0]: "),
        "{ack}"
    );
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 3)).await;
    assert_eq!(v["reason"], "owner_unavailable", "{v}");

    let (_, text) = call(&app, Method::GET, "/metrics", None, Body::empty()).await;
    for line in [
        "mcp_ownership_http_requests_total{endpoint=\"branch\",code=\"200\"} 3",
        "mcp_ownership_http_requests_total{endpoint=\"branch\",code=\"400\"} 6",
        "mcp_ownership_branch_ends_total{outcome=\"forked\"} 1",
        "mcp_ownership_branch_ends_total{outcome=\"not_forked\"} 2",
        "mcp_ownership_branches_total{outcome=\"registered\"} 4",
        "mcp_ownership_branches_total{outcome=\"store_error\"} 0",
        "mcp_ownership_events_refused_total{error=\"forked\"} 1",
        "mcp_ownership_events_refused_total{error=\"replay_mismatch\"} 1",
        "mcp_ownership_sessions_refused_total 0",
        "mcp_ownership_records_applied_total{type=\"events\"} 6",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

/// A store that answers everything but cannot register branches.
struct NoBranches(MemoryStore);

impl Store for NoBranches {
    fn name(&self) -> &'static str {
        "no-branches"
    }
    async fn apply(&self, r: &[Record], now: u64) -> Result<Applied, StoreError> {
        self.0.apply(r, now).await
    }
    async fn snapshot(&self, q: SnapshotQuery<'_>, now: u64) -> Result<Facts, StoreError> {
        self.0.snapshot(q, now).await
    }
    async fn open_branch(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: u64,
    ) -> Result<BranchOpen, StoreError> {
        Err(StoreError::Unavailable(DOWN_TEXT.into()))
    }
    async fn end_branch(&self, s: &str, i: &str, b: u64, now: u64) -> Result<bool, StoreError> {
        self.0.end_branch(s, i, b, now).await
    }
    async fn end_branch_settled(
        &self,
        s: &str,
        i: &str,
        b: u64,
        now: u64,
    ) -> Result<Option<bool>, StoreError> {
        self.0.end_branch_settled(s, i, b, now).await
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.0.changes()
    }
    async fn health(&self) -> Result<(), StoreError> {
        self.0.health().await
    }
    async fn stats(&self, now: u64) -> Result<StoreStats, StoreError> {
        self.0.stats(now).await
    }
    async fn sweep(&self, now: u64) -> Result<usize, StoreError> {
        self.0.sweep(now).await
    }
}

/// A store error while registering the branch never turns a continuation into a refusal: the
/// verdict continues without a branch, and it is counted.
#[tokio::test]
async fn a_branch_the_store_cannot_register_still_continues() {
    let app = router(AppState::new(
        NoBranches(MemoryStore::new(Limits::default())),
        opts(0),
    ));
    post(&app, "/v1/records", setup_records()).await;
    let (st, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(
        (st, v),
        (
            StatusCode::OK,
            json!({"verdict": "continue", "owner": X, "expected": ["e2", "e3"], "head": 3})
        )
    );
    let (_, text) = call(&app, Method::GET, "/metrics", None, Body::empty()).await;
    for line in [
        "mcp_ownership_branches_total{outcome=\"store_error\"} 1",
        "mcp_ownership_branches_total{outcome=\"registered\"} 0",
        "mcp_ownership_store_errors_total{op=\"open_branch\"} 1",
        "mcp_ownership_verdicts_total{outcome=\"continue\"} 1",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

/// A session's growth at the byte cap is refused by name (`store_full`, in `rejected`) and
/// counted apart from refused sessions (`mcp_ownership_growth_refused_total`, the alert
/// `McpOwnershipStoreFullGrowth`); what the session already holds still continues.
#[tokio::test]
async fn growth_at_the_cap_is_named_and_counted() {
    let limits = Limits {
        max_bytes: 1 << 20,
        ..Limits::default()
    };
    let app = router(AppState::new(MemoryStore::new(limits), opts(0)));
    let (st, ack) = post(&app, "/v1/records", setup_records()).await;
    assert_eq!((st, ack), (StatusCode::OK, json!({"applied": 3})));
    // Four more streams of 120-byte ids: the cap is reached before the session's own bounds.
    let big: Vec<String> = (0..64).map(|i| format!("{i:0>120}")).collect();
    let mut refused = 0;
    for round in 0..50u64 {
        for inc in [
            "00000000000000b1",
            "00000000000000b2",
            "00000000000000b3",
            "00000000000000b4",
        ] {
            let batch = json!({"records": [{"type": "events", "session": S1, "incarnation": inc,
                                            "first_seq": 1 + round * 64, "ids": big}]});
            let (st, ack) = post(&app, "/v1/records", batch).await;
            assert_eq!(st, StatusCode::OK, "{ack}");
            if let Some(r) = ack["rejected"].as_array().and_then(|r| r.first()) {
                assert_eq!(r["error"], "store_full", "{ack}");
                assert!(
                    r["detail"].as_str().unwrap().contains("--max-store-bytes"),
                    "{ack}"
                );
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "the cap was reached");
    let (_, text) = call(&app, Method::GET, "/metrics", None, Body::empty()).await;
    for line in [
        format!("mcp_ownership_growth_refused_total {refused}"),
        "mcp_ownership_sessions_refused_total 0".to_owned(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    let (_, v) = post(&app, "/v1/resume", resume_body(A, 1)).await;
    assert_eq!(v["verdict"], "continue", "{v}");
}
