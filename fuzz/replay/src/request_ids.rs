//! `request_ids`: the POST body scanner (`jsonrpc::RequestIdScanner`), differentially against
//! serde_json as a stand-in for the client's JSON parser. The first byte picks the chunk size;
//! the rest is the body.
//!
//! Invariants:
//! - the result does not depend on chunking;
//! - whatever is found is a carried text: raw ids that are JSON numbers or strings, no CR or LF
//!   (it is written into an SSE `data:` line), at most `MAX_REQUEST_IDS_BYTES`;
//! - when serde_json reads the body, the ids found are exactly the ids of its requests (objects
//!   with a `method` and a number or string `id`, the last duplicate key winning), in order, each
//!   parsing to the same value; none are found only when there are none, or they are too long.
use mcp_resume_core::jsonrpc::{request_id, split_ids, RequestIdScanner, MAX_REQUEST_IDS_BYTES};
use serde_json::Value;

pub fn request_ids(data: &[u8]) {
    let (size, body) = match data.split_first() {
        Some((s, rest)) => (usize::from(*s).max(1), rest),
        None => (1, data),
    };
    let mut s = RequestIdScanner::new();
    for chunk in body.chunks(size) {
        s.push(chunk);
    }
    let chunked = match s.finish() {
        mcp_resume_core::jsonrpc::Scan::Found(c) => Some(c.clone()),
        _ => None,
    };
    let whole = request_id(body);
    assert_eq!(chunked, whole, "chunking changed the result");
    let found: Option<Vec<&str>> = whole.as_deref().map(|c| {
        assert!(c.len() <= MAX_REQUEST_IDS_BYTES, "{} bytes", c.len());
        assert!(!c.contains(['\r', '\n']), "{c:?}");
        let ids = split_ids(c);
        assert!(ids.is_some(), "not a carried text: {c:?}");
        ids.unwrap_or_default()
    });
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let want = requests(&v);
    match found {
        None => assert!(
            want.is_empty() || body.len() > MAX_REQUEST_IDS_BYTES,
            "ids {want:?} not found"
        ),
        Some(ids) => {
            let got: Vec<Option<Value>> =
                ids.iter().map(|r| serde_json::from_str(r).ok()).collect();
            let want: Vec<Option<Value>> = want.into_iter().map(Some).collect();
            assert_eq!(got, want);
        }
    }
}

/// The ids of the requests of a parsed body: a request object, or a batch's request objects.
fn requests(v: &Value) -> Vec<Value> {
    let one = |o: &Value| {
        o.as_object()
            .filter(|o| o.contains_key("method"))
            .and_then(|o| o.get("id"))
            .filter(|id| id.is_number() || id.is_string())
            .cloned()
    };
    match v {
        Value::Array(a) => a.iter().filter_map(one).collect(),
        _ => one(v).into_iter().collect(),
    }
}
