//! The named problem every refused request answers: a status and an `ErrorBody`.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mcp_resume_core::ownership::ErrorBody;

use crate::clock::system_clock;
use crate::store::StoreError;

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

    pub(crate) fn bad_field(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_field", detail)
    }

    /// A store failure, named by its class only: backend error texts stay in the log.
    pub fn store(store: &str, e: &StoreError) -> Self {
        log_store_error(e);
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("{store}: {}", e.class()),
        )
    }
}

/// Log a store error at most once a second (an outage fails every request), with the
/// backend's own text: store errors never carry credentials (URLs are redacted, passwords are
/// never part of a Redis error).
fn log_store_error(e: &StoreError) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = (system_clock())() / 1000;
    if LAST.swap(now, Ordering::Relaxed) != now {
        eprintln!("mcp-ownership: {e}; answering 503 store_unavailable");
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}
