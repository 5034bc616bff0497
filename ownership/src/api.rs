//! HTTP handlers and input validation. Every input problem is a 4xx with a named `ErrorBody`;
//! every store problem is a 503; nothing here panics on input.
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mcp_resume_core::ownership::{
    ErrorBody, Record, RecordAck, RecordBatch, ResumeQuery, ResumeVerdict,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::metrics::{record_type, Metrics, OutcomeLabels, RequestLabels, TypeLabels};
use crate::resume::{resolve, timed, ResumeOptions};
use crate::store::Store;

/// Path of the operator / preStop endpoint (not in the core: only people and hooks call it).
pub const OWNERS_GONE_PATH: &str = "/v1/owners/gone";
/// Request bodies above this are refused with 413 before parsing.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Records per batch.
pub const MAX_BATCH_RECORDS: usize = 10_000;
/// Bytes per replica event id.
pub const MAX_EVENT_ID_BYTES: usize = 1024;
/// Bytes of a protocol version string.
pub const MAX_VERSION_BYTES: usize = 64;
/// Sequence numbers stay within JSON's exactly representable integers (2^53 - 1), which also
/// keeps every `seq + 1` far from overflow.
pub const MAX_SEQ: u64 = (1 << 53) - 1;

pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Milliseconds since the Unix epoch from the system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    })
}

/// Everything a handler needs. Cheap to clone (all shared).
pub struct AppState<S> {
    pub store: Arc<S>,
    pub opts: ResumeOptions,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
}

impl<S> Clone for AppState<S> {
    fn clone(&self) -> Self {
        AppState {
            store: self.store.clone(),
            opts: self.opts,
            metrics: self.metrics.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl<S: Store> AppState<S> {
    pub fn new(store: S, opts: ResumeOptions) -> Self {
        AppState {
            store: Arc::new(store),
            opts,
            metrics: Arc::new(Metrics::new()),
            clock: system_clock(),
        }
    }

    /// Replace the clock (tests drive idle TTLs without sleeping).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

/// A 4xx/5xx with a named problem.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, error: &str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            body: ErrorBody {
                error: error.to_owned(),
                detail: detail.into(),
            },
        }
    }

    fn bad_field(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_field", detail)
    }

    fn store(e: crate::store::StoreError) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            e.to_string(),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// A JSON body extractor whose every rejection is an [`ApiError`] (axum's own `Json` answers
/// in plain text).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, St: Send + Sync> FromRequest<St> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &St) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "content-type must be application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rej| {
            if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("request body exceeds {MAX_BODY_BYTES} bytes"),
                )
            } else {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_body", rej.body_text())
            }
        })?;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(json_error)?;
        // Trailing garbage after the document is a syntax error too.
        de.end()
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_json", e.to_string()))?;
        Ok(JsonBody(value))
    }
}

/// serde's message names the field for unknown/missing fields; the path names it for type
/// errors (`seq: invalid type: string "x", expected u64 ...`). Keep both.
fn json_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let name = match inner.classify() {
        serde_json::error::Category::Data => "bad_field",
        _ => "bad_json",
    };
    let detail = if path.is_empty() || path == "." {
        inner.to_string()
    } else {
        format!("{path}: {inner}")
    };
    ApiError::new(StatusCode::BAD_REQUEST, name, detail)
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

// ---------- validation ----------

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn check_session(field: &str, s: &str) -> Result<(), ApiError> {
    if is_lower_hex(s, 32) {
        Ok(())
    } else {
        Err(ApiError::bad_field(format!(
            "{field}: expected 32 lowercase hex digits, got {}",
            shown(s)
        )))
    }
}

fn check_incarnation(field: &str, s: &str) -> Result<(), ApiError> {
    if is_lower_hex(s, 16) {
        Ok(())
    } else {
        Err(ApiError::bad_field(format!(
            "{field}: expected 16 lowercase hex digits, got {}",
            shown(s)
        )))
    }
}

/// `ip:port` in canonical form, since the owner string is an identity (OwnerGone matches it
/// byte for byte) and Envoy's `upstream.address` is canonical.
pub fn check_owner(field: &str, s: &str) -> Result<(), ApiError> {
    match s.parse::<SocketAddr>() {
        Ok(a) if a.to_string() == s && a.port() != 0 => Ok(()),
        _ => Err(ApiError::bad_field(format!(
            "{field}: expected ip:port (e.g. 10.0.0.7:8080 or [fd00::7]:8080), got {}",
            shown(s)
        ))),
    }
}

fn check_seq(field: &str, seq: u64) -> Result<(), ApiError> {
    if seq <= MAX_SEQ {
        Ok(())
    } else {
        Err(ApiError::bad_field(format!(
            "{field}: {seq} exceeds {MAX_SEQ}"
        )))
    }
}

/// A short, safe rendering of a bad value for the error detail.
fn shown(s: &str) -> String {
    let cut: String = s.chars().take(48).collect();
    if cut.len() < s.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

pub fn validate_query(q: &ResumeQuery) -> Result<(), ApiError> {
    check_session("session", &q.session)?;
    check_incarnation("incarnation", &q.incarnation)?;
    check_seq("seq", q.seq)
}

pub fn validate_record(i: usize, r: &Record) -> Result<(), ApiError> {
    let f = |name: &str| format!("records[{i}].{name}");
    match r {
        Record::SessionOpen { session, version } => {
            check_session(&f("session"), session)?;
            let printable = version.bytes().all(|b| b.is_ascii_graphic());
            if version.is_empty() || version.len() > MAX_VERSION_BYTES || !printable {
                return Err(ApiError::bad_field(format!(
                    "{}: expected 1..={MAX_VERSION_BYTES} printable ASCII characters, got {}",
                    f("version"),
                    shown(version)
                )));
            }
        }
        Record::SessionEnd { session, .. } => check_session(&f("session"), session)?,
        Record::StreamOpen {
            session,
            incarnation,
            owner,
            ..
        } => {
            check_session(&f("session"), session)?;
            check_incarnation(&f("incarnation"), incarnation)?;
            check_owner(&f("owner"), owner)?;
        }
        Record::Events {
            session,
            incarnation,
            first_seq,
            ids,
            ..
        } => {
            check_session(&f("session"), session)?;
            check_incarnation(&f("incarnation"), incarnation)?;
            let last = first_seq.saturating_add((ids.len() as u64).saturating_sub(1));
            if last > MAX_SEQ {
                return Err(ApiError::bad_field(format!(
                    "{}: first_seq + number of ids exceeds {MAX_SEQ}",
                    f("first_seq")
                )));
            }
            if let Some((j, id)) = ids
                .iter()
                .enumerate()
                .find(|(_, id)| id.len() > MAX_EVENT_ID_BYTES)
            {
                return Err(ApiError::bad_field(format!(
                    "{}: {} bytes, at most {MAX_EVENT_ID_BYTES}",
                    f(&format!("ids[{j}]")),
                    id.len()
                )));
            }
        }
        Record::StreamLost {
            session,
            incarnation,
        } => {
            check_session(&f("session"), session)?;
            check_incarnation(&f("incarnation"), incarnation)?;
        }
        Record::OwnerGone { owner } => check_owner(&f("owner"), owner)?,
    }
    Ok(())
}

// ---------- handlers ----------

pub async fn resume<S: Store>(
    State(st): State<AppState<S>>,
    JsonBody(q): JsonBody<ResumeQuery>,
) -> Result<Json<ResumeVerdict>, ApiError> {
    validate_query(&q)?;
    let clock = st.clock.clone();
    let r = resolve(st.store.as_ref(), &q, &st.opts, clock.as_ref(), &st.metrics)
        .await
        .map_err(ApiError::store)?;
    let outcome = match &r.verdict {
        ResumeVerdict::Continue { .. } => "continue",
        ResumeVerdict::NewStream { reason } => reason.as_str(),
    };
    st.metrics
        .verdicts
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
    if let Some(continued) = r.waited {
        // How a wait for in-flight records ended: they landed and the cursor continues, or not.
        let outcome = if continued { "continue" } else { "new_stream" };
        st.metrics
            .resume_waits
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
    Ok(Json(r.verdict))
}

pub async fn records<S: Store>(
    State(st): State<AppState<S>>,
    JsonBody(batch): JsonBody<RecordBatch>,
) -> Result<Json<RecordAck>, ApiError> {
    if batch.records.len() > MAX_BATCH_RECORDS {
        return Err(ApiError::bad_field(format!(
            "records: {} records, at most {MAX_BATCH_RECORDS} per batch",
            batch.records.len()
        )));
    }
    // Validate the whole batch first: a bad batch changes nothing, so the guard can fix and
    // resend it without wondering what half landed.
    for (i, r) in batch.records.iter().enumerate() {
        validate_record(i, r)?;
    }
    apply(&st, &batch.records).await?;
    Ok(Json(RecordAck {
        applied: batch.records.len(),
        rejected: Vec::new(),
    }))
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OwnerGoneBody {
    pub owner: String,
}

pub async fn owners_gone<S: Store>(
    State(st): State<AppState<S>>,
    JsonBody(body): JsonBody<OwnerGoneBody>,
) -> Result<Json<RecordAck>, ApiError> {
    check_owner("owner", &body.owner)?;
    let records = [Record::OwnerGone { owner: body.owner }];
    apply(&st, &records).await?;
    Ok(Json(RecordAck {
        applied: 1,
        rejected: Vec::new(),
    }))
}

async fn apply<S: Store>(st: &AppState<S>, records: &[Record]) -> Result<(), ApiError> {
    let now = (st.clock)();
    timed(&st.metrics, "apply", st.store.apply(records, now))
        .await
        .map_err(ApiError::store)?;
    for r in records {
        st.metrics
            .records
            .get_or_create(&TypeLabels {
                r#type: record_type(r),
            })
            .inc();
    }
    Ok(())
}

pub async fn healthz<S: Store>(State(st): State<AppState<S>>) -> Response {
    let name = st.store.name();
    match timed(&st.metrics, "health", st.store.health()).await {
        Ok(()) => Json(serde_json::json!({"status": "ok", "store": name})).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "unavailable", "store": name, "detail": e.to_string()})),
        )
            .into_response(),
    }
}

pub async fn metrics<S: Store>(State(st): State<AppState<S>>) -> Response {
    // Gauges are read at scrape time; a failing store still lets the counters be scraped.
    if let Ok(stats) = timed(&st.metrics, "stats", st.store.stats((st.clock)())).await {
        st.metrics.set_stats(stats);
    }
    match st.metrics.render() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics_unavailable",
            "encoding failed",
        )
        .into_response(),
    }
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

pub async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// Counts every response by endpoint (the route, never the raw path: bounded labels) and code.
pub async fn count_requests(
    State(metrics): State<Arc<Metrics>>,
    req: Request,
    next: Next,
) -> Response {
    let endpoint = match req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        Some(mcp_resume_core::ownership::RESUME_PATH) => "resume",
        Some(mcp_resume_core::ownership::RECORDS_PATH) => "records",
        Some(OWNERS_GONE_PATH) => "owners_gone",
        Some("/healthz") => "healthz",
        Some("/metrics") => "metrics",
        _ => "other",
    };
    let resp = next.run(req).await;
    metrics
        .requests
        .get_or_create(&RequestLabels {
            endpoint,
            code: resp.status().as_u16(),
        })
        .inc();
    resp
}
