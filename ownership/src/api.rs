//! HTTP handlers and input validation. Every input problem is a 4xx with a named `ErrorBody`;
//! every store problem is a 503; nothing here panics on input.
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mcp_resume_core::ownership::{
    BranchAnswer, BranchQuery, FieldError, Record, RecordAck, RejectedRecord, ResumeQuery,
    ResumeVerdict, BRANCH_PATH, MAX_BATCH_RECORDS, MAX_RECORDS_BODY_BYTES,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::auth::{Auth, OWNERS_GONE_PATH};
use crate::clock::{system_clock, Clock};
pub use crate::error::ApiError;
use crate::metrics::{record_type, ErrorLabels, Metrics, OutcomeLabels, RequestLabels, TypeLabels};
use crate::resume::{end_branch, resolve, timed, ResumeOptions};
use crate::store::{Applied, Store, STORE_FULL};

/// Everything a handler needs. Cheap to clone (all shared).
pub struct AppState<S> {
    pub store: Arc<S>,
    pub opts: ResumeOptions,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
    /// Who may call what (default: open).
    pub auth: Auth,
}

impl<S> Clone for AppState<S> {
    fn clone(&self) -> Self {
        AppState {
            store: self.store.clone(),
            opts: self.opts,
            metrics: self.metrics.clone(),
            clock: self.clock.clone(),
            auth: self.auth.clone(),
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
            auth: Auth::default(),
        }
    }

    /// Require bearer tokens (see [`crate::auth`]).
    pub fn with_auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    /// Replace the clock (tests drive idle TTLs without sleeping).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

/// The raw body of a JSON request: content type checked, size bounded, nothing parsed yet
/// (parsing is the plain functions below, so fuzzers and tests call exactly what handlers do).
pub struct JsonBytes(pub Bytes);

impl<St: Send + Sync> FromRequest<St> for JsonBytes {
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
                    format!("request body exceeds {MAX_RECORDS_BODY_BYTES} bytes"),
                )
            } else {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_body", rej.body_text())
            }
        })?;
        Ok(JsonBytes(bytes))
    }
}

/// One JSON document of type `T`, strictly: the error names the field, trailing garbage is
/// a syntax error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| json_error("", e))?;
    de.end()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_json", e.to_string()))?;
    Ok(value)
}

/// serde's message names the field for unknown/missing fields; the path names it for type
/// errors (`seq: invalid type: string "x", expected u64 ...`). Keep both. `prefix` locates
/// the document inside a larger one (`records[3]`).
fn json_error(prefix: &str, e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let name = match inner.classify() {
        serde_json::error::Category::Data => "bad_field",
        _ => "bad_json",
    };
    let path = match (prefix.is_empty(), path.is_empty() || path == ".") {
        (_, true) => prefix.to_owned(),
        (true, false) => path,
        (false, false) => format!("{prefix}.{path}"),
    };
    let detail = if path.is_empty() {
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

// ---------- parsing and validation ----------

fn bad_field(e: FieldError) -> ApiError {
    ApiError::bad_field(e.to_string())
}

/// `POST /v1/resume` body -> a valid query.
pub fn parse_resume_query(bytes: &[u8]) -> Result<ResumeQuery, ApiError> {
    let q: ResumeQuery = parse_json(bytes)?;
    q.validate().map_err(bad_field)?;
    Ok(q)
}

/// `POST /v1/branch` body -> a valid query.
pub fn parse_branch_query(bytes: &[u8]) -> Result<BranchQuery, ApiError> {
    let q: BranchQuery = parse_json(bytes)?;
    q.validate().map_err(bad_field)?;
    Ok(q)
}

/// `POST /v1/owners/gone` body -> the record it stands for.
pub fn parse_owner_gone(bytes: &[u8]) -> Result<Record, ApiError> {
    let body: OwnerGoneBody = parse_json(bytes)?;
    let r = Record::OwnerGone { owner: body.owner };
    r.validate().map_err(bad_field)?;
    Ok(r)
}

/// A batch split into the records to apply and the ones refused, each refused one named.
#[derive(Debug, Default)]
pub struct ParsedBatch {
    pub valid: Vec<Record>,
    /// Position in the batch of each of `valid`.
    pub positions: Vec<usize>,
    pub rejected: Vec<RejectedRecord>,
}

/// The `records` array, unparsed per element, refused as soon as it grows past
/// [`MAX_BATCH_RECORDS`] (never collected whole).
struct RawRecords(Vec<Box<RawValue>>);

impl<'de> Deserialize<'de> for RawRecords {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawRecords;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "an array of at most {MAX_BATCH_RECORDS} records")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<RawRecords, A::Error> {
                let mut out = Vec::new();
                while let Some(r) = seq.next_element::<Box<RawValue>>()? {
                    if out.len() == MAX_BATCH_RECORDS {
                        return Err(serde::de::Error::custom(format_args!(
                            "more than {MAX_BATCH_RECORDS} records in one batch"
                        )));
                    }
                    out.push(r);
                }
                Ok(RawRecords(out))
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatch {
    records: RawRecords,
}

/// `POST /v1/records` body -> valid and rejected records. Only the envelope can fail the
/// whole batch (not JSON, no `records` array, too many records); each element is parsed and
/// validated on its own.
pub fn parse_records(bytes: &[u8]) -> Result<ParsedBatch, ApiError> {
    let raw: RawBatch = parse_json(bytes)?;
    let mut out = ParsedBatch::default();
    for (index, elem) in raw.records.0.iter().enumerate() {
        let at = format!("records[{index}]");
        let mut de = serde_json::Deserializer::from_str(elem.get());
        let parsed = serde_path_to_error::deserialize::<_, Record>(&mut de)
            .map_err(|e| json_error(&at, e).body.detail)
            .and_then(|r| r.validate().map(|()| r).map_err(|e| format!("{at}.{e}")));
        match parsed {
            Ok(r) => {
                out.valid.push(r);
                out.positions.push(index);
            }
            Err(detail) => out.rejected.push(RejectedRecord {
                index,
                error: "bad_field".to_owned(),
                detail,
            }),
        }
    }
    Ok(out)
}

// ---------- handlers ----------

pub async fn resume<S: Store>(
    State(st): State<AppState<S>>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<ResumeVerdict>, ApiError> {
    let q = parse_resume_query(&body)?;
    let clock = st.clock.clone();
    let r = resolve(st.store.as_ref(), &q, &st.opts, clock.as_ref(), &st.metrics)
        .await
        .map_err(|e| ApiError::store(st.store.name(), &e))?;
    let outcome = match &r.verdict {
        ResumeVerdict::Continue { .. } => "continue",
        ResumeVerdict::NewStream { reason, .. } => reason.as_str(),
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
    JsonBytes(body): JsonBytes,
) -> Result<Json<RecordAck>, ApiError> {
    let batch = parse_records(&body)?;
    // A bad record is named and skipped; the others still land (records are independent
    // idempotent upserts, and the guard never resends a rejected one).
    st.metrics
        .records_rejected
        .inc_by(batch.rejected.len() as u64);
    let mut rejected = batch.rejected;
    let mut applied = batch.valid.len();
    if !batch.valid.is_empty() {
        let done = apply(&st, &batch.valid).await?;
        // Refused for room (store_full): named like a bad record, so the guard counts it and
        // never resends it.
        applied -= done.refused.len();
        for r in done.refused {
            match r.error {
                STORE_FULL
                    if matches!(batch.valid.get(r.index), Some(Record::SessionOpen { .. })) =>
                {
                    st.metrics.sessions_refused.inc()
                }
                STORE_FULL => st.metrics.growth_refused.inc(),
                error => st
                    .metrics
                    .events_refused
                    .get_or_create(&ErrorLabels { error })
                    .inc(),
            };
            let index = batch.positions.get(r.index).copied().unwrap_or(r.index);
            rejected.push(RejectedRecord {
                index,
                error: r.error.to_owned(),
                detail: format!("records[{index}]: {}", r.detail),
            });
        }
        rejected.sort_by_key(|r| r.index);
    }
    Ok(Json(RecordAck { applied, rejected }))
}

/// A continuation's branch ended cleanly: the store marks it ended and says whether another
/// branch of the incarnation is open (docs/forks.md).
pub async fn branch<S: Store>(
    State(st): State<AppState<S>>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<BranchAnswer>, ApiError> {
    let q = parse_branch_query(&body)?;
    let key = (q.session.as_str(), q.incarnation.as_str(), q.branch);
    let ended = end_branch(&*st.store, key, &st.opts, &*st.clock, &st.metrics);
    let forked = ended
        .await
        .map_err(|e| ApiError::store(st.store.name(), &e))?;
    Ok(Json(branch_answer(&st, forked)))
}

/// One try of a clean end that does not wait: `None` while its answer would be `forked` (the
/// branch is ended, not yet cut). The simulator drives the service's wait with it, on its
/// own clock, as it re-asks a resume that records in flight could turn.
pub async fn branch_settled<S: Store>(
    State(st): State<AppState<S>>,
    JsonBytes(body): JsonBytes,
) -> Result<Option<Json<BranchAnswer>>, ApiError> {
    let q = parse_branch_query(&body)?;
    let ended = st
        .store
        .end_branch_settled(&q.session, &q.incarnation, q.branch, (st.clock)());
    let forked = timed(&st.metrics, "end_branch", ended)
        .await
        .map_err(|e| ApiError::store(st.store.name(), &e))?;
    Ok(forked.map(|f| Json(branch_answer(&st, f))))
}

/// The answer to a clean end, counted.
fn branch_answer<S>(st: &AppState<S>, forked: bool) -> BranchAnswer {
    let outcome = if forked { "forked" } else { "not_forked" };
    st.metrics
        .branch_ends
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
    BranchAnswer { forked }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OwnerGoneBody {
    pub owner: String,
}

pub async fn owners_gone<S: Store>(
    State(st): State<AppState<S>>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<RecordAck>, ApiError> {
    let record = parse_owner_gone(&body)?;
    apply(&st, std::slice::from_ref(&record)).await?;
    Ok(Json(RecordAck {
        applied: 1,
        rejected: Vec::new(),
    }))
}

async fn apply<S: Store>(st: &AppState<S>, records: &[Record]) -> Result<Applied, ApiError> {
    let now = (st.clock)();
    let done = timed(&st.metrics, "apply", st.store.apply(records, now))
        .await
        .map_err(|e| ApiError::store(st.store.name(), &e))?;
    let mut refused = done.refused.iter().map(|r| r.index).peekable();
    for (i, r) in records.iter().enumerate() {
        if refused.next_if_eq(&i).is_some() {
            continue;
        }
        st.metrics
            .records
            .get_or_create(&TypeLabels {
                r#type: record_type(r),
            })
            .inc();
    }
    Ok(done)
}

pub async fn healthz<S: Store>(State(st): State<AppState<S>>) -> Response {
    let name = st.store.name();
    match timed(&st.metrics, "health", st.store.health()).await {
        Ok(()) => Json(serde_json::json!({"status": "ok", "store": name})).into_response(),
        // The class only: the backend's text stays in the log (see the health watcher).
        // A misconfiguration says what is wrong and which variable to change.
        Err(e @ crate::store::StoreError::Misconfigured(_)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "status": "misconfigured", "store": name, "detail": e.public_detail()
            })),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "unavailable", "store": name, "detail": e.class()})),
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
        Some(BRANCH_PATH) => "branch",
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
