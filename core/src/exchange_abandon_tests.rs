//! A resume whose verdict goes unused (its client dropped it while the guard waited, or the
//! answer was lost or unusable) reports the registration it was tagged with, so the store never
//! counts the branch it may have registered as another reader.
use super::*;
use crate::ownership::check_registration;

/// Asks about `c`; returns the exchange, the callout's token and the query it sent.
fn ask(w: &mut Worker, host: &mut MockHost, c: &str) -> (Exchange, u32, ResumeQuery) {
    let mut ex = Exchange::new();
    assert_eq!(
        rq(&mut ex, w, host, &get(&[("last-event-id", c)])),
        Action::Pause
    );
    let (token, body) = host.last_dispatch().expect("a resume callout");
    let q: ResumeQuery = serde_json::from_slice(body).unwrap();
    host.take();
    (ex, token, q)
}

/// The registrations reported as abandoned, with the query fields they name.
fn abandoned(records: &[Record]) -> Vec<(String, String, String)> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Abandoned {
                session,
                incarnation,
                registration,
            } => Some((session.clone(), incarnation.clone(), registration.clone())),
            _ => None,
        })
        .collect()
}

fn named(q: &ResumeQuery) -> (String, String, String) {
    let r = q.registration.clone().expect("a registration");
    (q.session.clone(), q.incarnation.clone(), r)
}

#[test]
fn a_resume_dropped_while_its_verdict_is_pending_reports_its_registration() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    let (mut ex, token, q) = ask(&mut w, &mut host, &c);
    let (_, token2, q2) = ask(&mut w, &mut host, &c);
    assert_ne!(token, token2);
    let reg = q.registration.clone().unwrap_or_default();
    assert!(check_registration("registration", &reg).is_ok(), "{reg:?}");
    assert_ne!(q.registration, q2.registration, "drawn per resume");
    assert_eq!(q.validate(), Ok(()));

    ex.on_stream_end(&mut w, &mut host);
    let records = drain_records(&mut w, &mut host);
    assert_eq!(abandoned(&records), [named(&q)]);
    // The verdict that comes after the end is nobody's: nothing goes upstream.
    let verdict = format!(
        r#"{{"verdict":"continue","owner":"{OWNER}","expected":["e8"],"head":8,"branch":3}}"#
    );
    host.take();
    ex.on_callout_response(
        &mut w,
        &mut host,
        token,
        Some(200),
        Some(verdict.as_bytes()),
    );
    assert!(host.take().is_empty());
    ex.on_stream_end(&mut w, &mut host);
    assert!(drain_records(&mut w, &mut host).is_empty(), "reported once");
}

#[test]
fn a_verdict_the_exchange_does_not_use_reports_its_registration() {
    let mut w = worker();
    let mut host = MockHost::new();
    let c = cursor(&w, 42, 7, "e7");
    // No usable answer: the store may still have registered the branch.
    for (status, body) in [(None, None), (Some(503), None), (Some(200), Some("{}"))] {
        let (mut ex, token, q) = ask(&mut w, &mut host, &c);
        ex.on_callout_response(&mut w, &mut host, token, status, body.map(str::as_bytes));
        ex.on_stream_end(&mut w, &mut host);
        let records = drain_records(&mut w, &mut host);
        assert_eq!(abandoned(&records), [named(&q)], "{status:?} {body:?}");
    }
    // A refusal: the store registered nothing, there is nothing to report.
    let (mut ex, token, _) = ask(&mut w, &mut host, &c);
    let refusal = r#"{"verdict":"new_stream","reason":"gap"}"#;
    ex.on_callout_response(
        &mut w,
        &mut host,
        token,
        Some(200),
        Some(refusal.as_bytes()),
    );
    ex.on_stream_end(&mut w, &mut host);
    assert!(abandoned(&drain_records(&mut w, &mut host)).is_empty());
    // A continuation that goes on: its branch's end is reported, never an abandon.
    let (mut ex, token, _) = ask(&mut w, &mut host, &c);
    let verdict = format!(
        r#"{{"verdict":"continue","owner":"{OWNER}","expected":["e8"],"head":8,"branch":2}}"#
    );
    ex.on_callout_response(
        &mut w,
        &mut host,
        token,
        Some(200),
        Some(verdict.as_bytes()),
    );
    assert!(host.effects.contains(&Effect::ResumeRequest));
    ex.on_stream_end(&mut w, &mut host);
    let records = drain_records(&mut w, &mut host);
    assert!(abandoned(&records).is_empty());
    assert!(records
        .iter()
        .any(|r| matches!(r, Record::BranchEnd { branch: 2, .. })));
}

#[test]
fn registrations_on_the_wire_are_optional_and_checked() {
    let text = r#"{"session":"0123456789abcdef0123456789abcdef","incarnation":"0123456789abcdef","kind":"get","seq":3}"#;
    let q: ResumeQuery = serde_json::from_str(text).unwrap();
    assert_eq!(q.registration, None, "an older guard's query");
    assert_eq!(serde_json::to_string(&q).unwrap(), text);
    for bad in ["", "0123", "0123456789ABCDEF", "0123456789abcdefa"] {
        let mut q = q.clone();
        q.registration = Some(bad.into());
        assert!(
            q.validate().is_err_and(|e| e.field == "registration"),
            "{bad:?}"
        );
        let r = Record::Abandoned {
            session: q.session.clone(),
            incarnation: q.incarnation.clone(),
            registration: bad.into(),
        };
        assert!(r.validate().is_err_and(|e| e.field == "registration"));
    }
}
