//! `ownership_request`: the ownership service's request bodies, parsed and validated by the
//! very functions its handlers call. The first byte picks the endpoint.
//!
//! Invariants: a refusal is a named 400; a body that passes validation survives a
//! serialise-and-parse round trip unchanged and still passes, and its fields are in the shapes
//! the store relies on.
use axum::http::StatusCode;
use mcp_ownership::api::{parse_owner_gone, parse_records, parse_resume_query, ApiError};
use mcp_resume_core::cursor::parse_incarnation_hex;
use mcp_resume_core::ownership::{Record, MAX_BATCH_RECORDS, MAX_EVENT_ID_BYTES, MAX_SEQ};
use std::net::SocketAddr;

pub fn ownership_request(data: &[u8]) {
    let Some((which, body)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => match parse_resume_query(body) {
            Err(e) => named_400(&e),
            Ok(q) => {
                assert!(parse_incarnation_hex(&q.incarnation).is_some());
                assert!(is_session(&q.session) && q.seq <= MAX_SEQ);
                let again = serde_json::to_vec(&q).unwrap_or_default();
                assert_eq!(parse_resume_query(&again).ok(), Some(q), "round trip");
            }
        },
        1 => match parse_records(body) {
            Err(e) => named_400(&e),
            Ok(b) => {
                assert!(b.valid.len() + b.rejected.len() <= MAX_BATCH_RECORDS);
                b.valid.iter().for_each(valid_record);
                for r in &b.valid {
                    // What the service accepted survives a round trip and is accepted again.
                    let text = serde_json::json!({ "records": [r] }).to_string();
                    let again = parse_records(text.as_bytes());
                    assert!(
                        again
                            .as_ref()
                            .is_ok_and(|a| a.valid.len() == 1 && &a.valid[0] == r),
                        "round trip of {r:?}: {again:?}"
                    );
                }
                let mut last = None;
                for r in &b.rejected {
                    assert!(
                        r.detail.starts_with(&format!("records[{}]", r.index)),
                        "{r:?}"
                    );
                    assert!(last < Some(r.index), "rejections in order");
                    last = Some(r.index);
                }
            }
        },
        _ => match parse_owner_gone(body) {
            Err(e) => named_400(&e),
            Ok(Record::OwnerGone { owner }) => assert!(is_owner(&owner)),
            Ok(other) => unreachable!("owners/gone parsed as {other:?}"),
        },
    }
}

fn named_400(e: &ApiError) {
    assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e:?}");
    assert!(
        ["bad_json", "bad_field"].contains(&e.body.error.as_str()),
        "{e:?}"
    );
    assert!(!e.body.detail.is_empty());
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn is_session(s: &str) -> bool {
    is_hex(s, 32)
}

fn is_owner(s: &str) -> bool {
    s.parse::<SocketAddr>()
        .is_ok_and(|a| a.port() != 0 && a.to_string() == s)
}

fn valid_record(r: &Record) {
    match r {
        Record::SessionOpen { session, version } => {
            assert!(is_session(session));
            assert!(!version.is_empty() && version.bytes().all(|b| b.is_ascii_graphic()));
        }
        Record::SessionEnd { session, .. } => assert!(is_session(session)),
        Record::StreamOpen {
            session,
            incarnation,
            owner,
            ..
        } => assert!(is_session(session) && is_hex(incarnation, 16) && is_owner(owner)),
        Record::Events {
            session,
            incarnation,
            first_seq,
            ids,
            ..
        } => {
            assert!(is_session(session) && is_hex(incarnation, 16));
            let last = first_seq.saturating_add((ids.len() as u64).saturating_sub(1));
            assert!(last <= MAX_SEQ);
            assert!(ids.iter().all(|i| i.len() <= MAX_EVENT_ID_BYTES));
        }
        Record::StreamLost {
            session,
            incarnation,
        }
        | Record::OwnerFailed {
            session,
            incarnation,
        }
        | Record::BranchEnd {
            session,
            incarnation,
            ..
        }
        | Record::Abandoned {
            session,
            incarnation,
            ..
        } => assert!(is_session(session) && is_hex(incarnation, 16)),
        Record::OwnerGone { owner } => assert!(is_owner(owner)),
    }
}
