//! `ownership_request`: the ownership service's request bodies, parsed and validated by the
//! very functions its handlers call. The first byte picks the endpoint.
//!
//! Invariants: a refusal is a named 400; a body that passes validation survives a
//! serialise-and-parse round trip unchanged and still passes, and its fields are in the shapes
//! the store relies on.
use axum::http::StatusCode;
use mcp_ownership::api::{
    check_owner, parse_json, validate_batch, validate_query, ApiError, OwnerGoneBody,
    MAX_BATCH_RECORDS, MAX_EVENT_ID_BYTES, MAX_SEQ,
};
use mcp_resume_core::cursor::parse_incarnation_hex;
use mcp_resume_core::ownership::{Record, RecordBatch, ResumeQuery};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::net::SocketAddr;

pub fn ownership_request(data: &[u8]) {
    let Some((which, body)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => endpoint::<ResumeQuery>(body, |q| {
            validate_query(q)?;
            assert!(parse_incarnation_hex(&q.incarnation).is_some());
            assert!(is_session(&q.session) && q.seq <= MAX_SEQ);
            Ok(())
        }),
        1 => endpoint::<RecordBatch>(body, |b| {
            validate_batch(b)?;
            assert!(b.records.len() <= MAX_BATCH_RECORDS);
            b.records.iter().for_each(valid_record);
            Ok(())
        }),
        _ => endpoint::<OwnerGoneBody>(body, |g| {
            check_owner("owner", &g.owner)?;
            assert!(is_owner(&g.owner));
            Ok(())
        }),
    }
}

fn endpoint<T>(body: &[u8], validate: impl Fn(&T) -> Result<(), ApiError>)
where
    T: DeserializeOwned + Serialize + Debug,
{
    let checked = parse_json::<T>(body).and_then(|v| validate(&v).map(|()| v));
    match checked {
        Err(e) => {
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{e:?}");
            assert!(
                ["bad_json", "bad_field"].contains(&e.body.error.as_str()),
                "{e:?}"
            );
            assert!(!e.body.detail.is_empty());
        }
        Ok(v) => {
            let text = serde_json::to_vec(&v).unwrap_or_default();
            let again = parse_json::<T>(&text);
            let same = again
                .as_ref()
                .map(|a| serde_json::to_vec(a).unwrap_or_default() == text);
            assert!(matches!(same, Ok(true)), "round trip: {again:?} vs {v:?}");
            if let Ok(a) = again {
                assert!(validate(&a).is_ok(), "revalidation of {a:?}");
            }
        }
    }
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
        } => {
            assert!(is_session(session) && is_hex(incarnation, 16));
            let last = first_seq.saturating_add((ids.len() as u64).saturating_sub(1));
            assert!(last <= MAX_SEQ);
            assert!(ids.iter().all(|i| i.len() <= MAX_EVENT_ID_BYTES));
        }
        Record::StreamLost {
            session,
            incarnation,
        } => assert!(is_session(session) && is_hex(incarnation, 16)),
        Record::OwnerGone { owner } => assert!(is_owner(owner)),
    }
}
