//! The decision procedure (docs/design.md), as a pure function over what the store knows.
//!
//! Order matters: session, ownership, contiguity, incarnation.
//! The first failing condition names the reason.
use crate::cursor::{session_binding, DecodedCursor, Keyring};
use crate::ownership::{Reason, StreamKind};

/// Lifecycle of a session as the store knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    Active,
    Terminated,
    Expired,
}

/// What the store knows about the cursor's incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncarnationFacts {
    pub kind: StreamKind,
    /// The owner failed a continuation, or was marked gone after this incarnation opened.
    pub owner_lost: bool,
    /// A newer standalone GET stream of the session replaced this one.
    pub superseded: bool,
    /// Highest sequence number recorded so far.
    pub head: u64,
    /// Events per stream the owner retains (its ring size); 0 = unknown, no local gap check.
    pub retention: u64,
    /// Lowest sequence the owner still holds, when the replica reported a trim; 0 = unknown.
    pub retained_from: u64,
}

/// Decide whether a cursor at `seq` may continue its incarnation.
///
/// `Ok(())` means: forward to the owner with the cursor. `Err(reason)` means a new stream.
pub fn decide(
    session: Option<SessionState>,
    incarnation: Option<&IncarnationFacts>,
    kind: StreamKind,
    seq: u64,
) -> Result<(), Reason> {
    // 1. Session: active, not expired, not terminated.
    if session != Some(SessionState::Active) {
        return Err(Reason::SessionInactive);
    }
    // 2. Ownership: some incarnation owns this cursor and its owner still holds the log.
    let inc = match incarnation {
        Some(inc) if inc.kind == kind => inc,
        _ => return Err(Reason::UnknownStream),
    };
    if seq > inc.head {
        // The cursor is ahead of the records: they were lost or have not landed.
        return Err(Reason::UnknownStream);
    }
    if inc.owner_lost {
        return Err(Reason::OwnerUnavailable);
    }
    // 3. Contiguity: every event from seq+1 to head must still be retained.
    if inc.retention > 0 && inc.head - seq > inc.retention {
        return Err(Reason::Gap);
    }
    if inc.retained_from > 0 && seq.saturating_add(1) < inc.retained_from {
        return Err(Reason::Gap);
    }
    // 4. Incarnation: not superseded by a newer stream.
    if inc.superseded {
        return Err(Reason::Superseded);
    }
    Ok(())
}

/// The first protocol revision without resumption ("ignore it; streams are not resumable").
pub const FIRST_UNRESUMABLE_VERSION: &str = "2026-07-28";
/// The revision to assume when `MCP-Protocol-Version` is absent (the spec's rule).
pub const DEFAULT_VERSION: &str = "2025-03-26";

/// Can a request of this protocol revision resume a stream? A malformed value is not
/// resumable: the cursor is stripped and the replica answers its own 400.
pub fn version_resumable(version: Option<&str>) -> bool {
    let v = version.map(str::trim).unwrap_or(DEFAULT_VERSION);
    let b = v.as_bytes();
    let shaped = b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        });
    let num = |r: std::ops::Range<usize>| v.get(r).and_then(|x| x.parse::<u32>().ok()).unwrap_or(0);
    let is_date = shaped && (1..=12).contains(&num(5..7)) && (1..=31).contains(&num(8..10));
    is_date && v < FIRST_UNRESUMABLE_VERSION
}

/// The request facts the local checks need, read from headers.
#[derive(Debug, Clone, Copy)]
pub struct CursorRequest<'a> {
    pub is_get: bool,
    /// Raw header bytes: a value that is not UTF-8 is not a cursor of this guard.
    pub last_event_id: &'a [u8],
    /// Raw header bytes, hashed as they are (never converted lossily).
    pub session_id: Option<&'a [u8]>,
    pub protocol_version: Option<&'a str>,
}

/// Outcome of the checks the guard makes before any callout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalVerdict {
    /// Authentic and bound to this session: ask the ownership cluster.
    Ask(DecodedCursor),
    /// Refused without a callout. `kind` is the cursor's stream kind when it could be read.
    Refuse {
        reason: Reason,
        kind: Option<StreamKind>,
        /// The opening request's JSON-RPC id the cursor carries, when it could be read.
        request_id: Option<String>,
    },
}

/// Version, method, format/MAC/key, session binding, then a reset cursor; in that order.
pub fn check_locally(keys: &Keyring, req: &CursorRequest<'_>) -> LocalVerdict {
    let refuse = |reason, kind| LocalVerdict::Refuse {
        reason,
        kind,
        request_id: None,
    };
    if !version_resumable(req.protocol_version) {
        return refuse(Reason::NotResumableVersion, None);
    }
    if !req.is_get {
        // Legacy clients carry cursors across sessions, even on POST: never let one eat a body.
        return refuse(Reason::PostCursor, None);
    }
    let Ok(text) = std::str::from_utf8(req.last_event_id) else {
        return refuse(Reason::ForeignCursor, None);
    };
    let cursor = match keys.decode(text) {
        Ok(c) => c,
        Err(_) => return refuse(Reason::ForeignCursor, None),
    };
    let reason = match req.session_id {
        None => Reason::SessionInactive,
        Some(sid) if session_binding(sid) != cursor.session => Reason::SessionMismatch,
        // A reset cursor (docs/sse-model.md): the replica named no place to replay from.
        Some(_) if cursor.replica_event_id.as_deref() == Some("") => Reason::IdReset,
        Some(_) => return LocalVerdict::Ask(cursor),
    };
    LocalVerdict::Refuse {
        reason,
        kind: Some(cursor.kind),
        request_id: cursor.request_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inc() -> IncarnationFacts {
        IncarnationFacts {
            kind: StreamKind::Get,
            owner_lost: false,
            superseded: false,
            head: 9,
            retention: 5,
            retained_from: 0,
        }
    }

    fn d(
        session: Option<SessionState>,
        i: Option<IncarnationFacts>,
        seq: u64,
    ) -> Result<(), Reason> {
        decide(session, i.as_ref(), StreamKind::Get, seq)
    }

    #[test]
    fn continues_inside_the_window() {
        let a = Some(SessionState::Active);
        assert_eq!(d(a, Some(inc()), 9), Ok(()));
        assert_eq!(d(a, Some(inc()), 4), Ok(()));
    }

    #[test]
    fn each_condition_names_its_reason() {
        let a = Some(SessionState::Active);
        assert_eq!(d(None, Some(inc()), 9), Err(Reason::SessionInactive));
        assert_eq!(
            d(Some(SessionState::Terminated), Some(inc()), 9),
            Err(Reason::SessionInactive)
        );
        assert_eq!(
            d(Some(SessionState::Expired), Some(inc()), 9),
            Err(Reason::SessionInactive)
        );
        assert_eq!(d(a, None, 9), Err(Reason::UnknownStream));
        assert_eq!(d(a, Some(inc()), 10), Err(Reason::UnknownStream));
        let other_kind = IncarnationFacts {
            kind: StreamKind::Request,
            ..inc()
        };
        assert_eq!(d(a, Some(other_kind), 9), Err(Reason::UnknownStream));
        let lost = IncarnationFacts {
            owner_lost: true,
            ..inc()
        };
        assert_eq!(d(a, Some(lost), 9), Err(Reason::OwnerUnavailable));
        assert_eq!(d(a, Some(inc()), 3), Err(Reason::Gap));
        let trimmed = IncarnationFacts {
            retention: 0,
            retained_from: 8,
            ..inc()
        };
        assert_eq!(d(a, Some(trimmed), 7), Ok(()));
        assert_eq!(d(a, Some(trimmed), 6), Err(Reason::Gap));
        let sup = IncarnationFacts {
            superseded: true,
            ..inc()
        };
        assert_eq!(d(a, Some(sup), 9), Err(Reason::Superseded));
    }

    #[test]
    fn order_is_session_ownership_contiguity_incarnation() {
        let all_bad = IncarnationFacts {
            owner_lost: true,
            superseded: true,
            ..inc()
        };
        assert_eq!(d(None, Some(all_bad), 1), Err(Reason::SessionInactive));
        let a = Some(SessionState::Active);
        assert_eq!(d(a, Some(all_bad), 1), Err(Reason::OwnerUnavailable));
        let gap_and_sup = IncarnationFacts {
            superseded: true,
            ..inc()
        };
        assert_eq!(d(a, Some(gap_and_sup), 1), Err(Reason::Gap));
    }

    #[test]
    fn versions() {
        assert!(version_resumable(None));
        assert!(version_resumable(Some("2025-03-26")));
        assert!(version_resumable(Some("2025-06-18")));
        assert!(version_resumable(Some("2025-11-25")));
        assert!(!version_resumable(Some("2026-07-28")));
        assert!(!version_resumable(Some("2027-01-01")));
        assert!(!version_resumable(Some("banana")));
        assert!(!version_resumable(Some("2025-1-1")));
        assert!(!version_resumable(Some("2025-13-45")));
        assert!(!version_resumable(Some("2025-00-10")));
    }

    fn ring() -> Keyring {
        Keyring::new(
            crate::cursor::Key {
                id: 3,
                secret: vec![9; 32],
            },
            vec![],
        )
        .unwrap()
    }

    fn cursor_for(keys: &Keyring, sid: &str) -> String {
        keys.encode(&crate::cursor::Cursor {
            request_id: None,
            session: session_binding(sid.as_bytes()),
            incarnation: 5,
            kind: StreamKind::Get,
            seq: 3,
            replica_event_id: Some("e3"),
        })
    }

    fn local(
        keys: &Keyring,
        is_get: bool,
        lei: &str,
        sid: Option<&str>,
        v: Option<&str>,
    ) -> LocalVerdict {
        check_locally(
            keys,
            &CursorRequest {
                is_get,
                last_event_id: lei.as_bytes(),
                session_id: sid.map(str::as_bytes),
                protocol_version: v,
            },
        )
    }

    fn refused(reason: Reason, kind: Option<StreamKind>) -> LocalVerdict {
        LocalVerdict::Refuse {
            reason,
            kind,
            request_id: None,
        }
    }

    #[test]
    fn local_checks_in_order() {
        let k = ring();
        let good = cursor_for(&k, "s1");
        let get = Some(StreamKind::Get);
        assert!(
            matches!(local(&k, true, &good, Some("s1"), None), LocalVerdict::Ask(c) if c.seq == 3)
        );
        assert_eq!(
            local(&k, true, &good, Some("s1"), Some("2026-07-28")),
            refused(Reason::NotResumableVersion, None)
        );
        assert_eq!(
            local(&k, false, &good, Some("s1"), None),
            refused(Reason::PostCursor, None)
        );
        assert_eq!(
            local(&k, true, "e7", Some("s1"), None),
            refused(Reason::ForeignCursor, None)
        );
        assert_eq!(
            local(&k, true, &good, Some("s2"), None),
            refused(Reason::SessionMismatch, get)
        );
        assert_eq!(
            local(&k, true, &good, None, None),
            refused(Reason::SessionInactive, get)
        );
        let other = Keyring::new(
            crate::cursor::Key {
                id: 3,
                secret: vec![1; 32],
            },
            vec![],
        )
        .unwrap();
        assert_eq!(
            local(&other, true, &good, Some("s1"), None),
            refused(Reason::ForeignCursor, None)
        );
    }

    #[test]
    fn a_reset_cursor_is_refused_before_any_callout_with_its_request_id() {
        let k = ring();
        let reset = |kind, request_id| {
            k.encode(&crate::cursor::Cursor {
                request_id,
                session: session_binding(b"s1"),
                incarnation: 5,
                kind,
                seq: 4,
                replica_event_id: Some(""),
            })
        };
        assert_eq!(
            local(
                &k,
                true,
                &reset(StreamKind::Request, Some("7")),
                Some("s1"),
                None
            ),
            LocalVerdict::Refuse {
                reason: Reason::IdReset,
                kind: Some(StreamKind::Request),
                request_id: Some("7".into()),
            }
        );
        let get = reset(StreamKind::Get, None);
        assert_eq!(
            local(&k, true, &get, Some("s1"), None),
            refused(Reason::IdReset, Some(StreamKind::Get))
        );
        // Another session's reset cursor is that session's business: a mismatch first.
        assert_eq!(
            local(&k, true, &get, Some("s2"), None),
            refused(Reason::SessionMismatch, Some(StreamKind::Get))
        );
    }
}
