//! The record path: validation, bounded ids, byte caps, answers, backoff.
use super::*;
use crate::host::{Effect, MockHost};
use crate::ownership::{recorded_event, recorded_id, RecordBatch, MAX_RECORDED_EVENT_BYTES};

/// Events with a content digest of 0, for the tests that are about ids.
fn evs<S: AsRef<str>>(ids: impl IntoIterator<Item = S>) -> Vec<(S, u64)> {
    ids.into_iter().map(|i| (i, 0)).collect()
}

/// The recorded form of `id` with digest 0.
fn rec0(id: &str) -> String {
    recorded_event(id, 0)
}

const SECRET: &str = "17Vjr1MOFuUicxThufiY1oswS2eQj+6Y1DdNdURfwT0=";
const S: &str = "0123456789abcdef0123456789abcdef";
const I: &str = "0123456789abcdef";
const KEY: StreamKey<'static> = StreamKey {
    session: S,
    incarnation: I,
    branch: 0,
};

fn queue(extra: &str) -> RecordQueue {
    let json = format!(
        r#"{{"ownership":{{"cluster":"c"{extra}}},"keys":[{{"id":1,"secret":"{SECRET}","active":true}}]}}"#
    );
    RecordQueue::new(&Config::from_json(json.as_bytes()).unwrap())
}

fn open(owner: &str) -> Record {
    Record::StreamOpen {
        session: S.into(),
        incarnation: I.into(),
        kind: crate::ownership::StreamKind::Get,
        owner: owner.into(),
        retention: 0,
        supersedes: true,
        opened_ms: 1,
        request_id: None,
    }
}

/// Flushes once; the batch sent, its token and its body size.
fn flush(q: &mut RecordQueue, host: &mut MockHost) -> Option<(u32, Vec<Record>, usize)> {
    host.take();
    q.flush(host);
    let (token, body) = host.last_dispatch()?;
    let n = body.len();
    let batch: RecordBatch = serde_json::from_slice(body).unwrap();
    Some((token, batch.records, n))
}

#[test]
fn an_invalid_record_is_counted_and_never_queued() {
    let mut q = queue("");
    let mut host = MockHost::new();
    q.push(&mut host, open("replica-1.internal:80"));
    q.push(
        &mut host,
        Record::SessionOpen {
            session: S.into(),
            version: "bad version\u{1}".into(),
        },
    );
    assert_eq!(host.stat(Stat::RecordsInvalid), 2);
    assert!(q.is_empty());
    q.flush(&mut host);
    assert!(host.last_dispatch().is_none());
}

#[test]
fn ids_of_any_length_are_recorded_in_bounded_form() {
    let mut q = queue("");
    let mut host = MockHost::new();
    let mid = "m".repeat(1_500);
    let big = "b".repeat(16 * 1024);
    let huge = "h".repeat(100 * 1024);
    let ids = vec![
        "e1".to_string(),
        mid.clone(),
        "~tilde".to_string(),
        big.clone(),
        huge.clone(),
    ];
    q.push_events(&mut host, &KEY, 1, evs(ids));
    assert_eq!(host.stat(Stat::RecordsInvalid), 0);
    let (_, records, _) = flush(&mut q, &mut host).unwrap();
    let mut all_ids = Vec::new();
    let mut all_long = Vec::new();
    for r in &records {
        assert_eq!(r.validate(), Ok(()));
        if let Record::Events { ids, long, .. } = r {
            all_ids.extend(ids.iter().cloned());
            all_long.extend(long.iter().cloned());
        }
    }
    assert_eq!(all_ids.len(), 5);
    assert!(all_ids.iter().all(|i| i.len() <= MAX_RECORDED_EVENT_BYTES));
    assert_eq!(all_ids[0], "e1\n0000000000000000");
    assert_eq!(all_ids[1], rec0(&mid));
    assert_eq!(all_ids[2], rec0("~tilde"));
    assert!(all_ids[2].starts_with(&*recorded_id("~tilde")));
    assert_ne!(recorded_id("~tilde"), "~tilde");
    let long: Vec<(u64, usize)> = all_long.iter().map(|l| (l.seq, l.id.len())).collect();
    // The 100 KiB id is past MAX_LONG_ID_BYTES: digest only.
    assert_eq!(long, vec![(2, 1_500), (4, 16 * 1024)]);
}

#[test]
fn batches_and_the_queue_are_capped_by_bytes() {
    let mut q = queue(r#","max_batch":10000,"max_queue":1000000"#);
    let mut host = MockHost::new();
    // 3000 events of 120-byte ids with escapes, in chunks of 10 (merged per incarnation).
    let id = "x\"\\\t".repeat(30);
    for c in 0..300u64 {
        q.push_events(&mut host, &KEY, 1 + c * 10, evs(vec![id.clone(); 10]));
    }
    let bound = q.queued_bytes();
    let mut actual = 0;
    let mut seq = 1;
    while let Some((token, records, n)) = flush(&mut q, &mut host) {
        assert!(n <= BATCH_MAX_BYTES + 16, "batch of {n} bytes");
        actual += n - 14 - (records.len() - 1);
        for r in &records {
            if let Record::Events { first_seq, ids, .. } = r {
                assert_eq!(*first_seq, seq, "contiguous and in order");
                seq += ids.len() as u64;
            }
        }
        q.on_response(&mut host, token, Some(200), Some(b"{\"applied\":1}"));
    }
    assert_eq!(seq, 3001);
    assert!(bound >= actual, "the byte count is an upper bound");
    assert!(
        bound <= actual + actual / 20,
        "and a close one: {bound} vs {actual}"
    );
    // The queue by bytes: far more than QUEUE_MAX_BYTES while nothing is answered, over so
    // many streams that none has old ids to leave out.
    let mut q = queue(r#","max_queue":10000000"#);
    let big = "y".repeat(120);
    let mut at_first_drop = None;
    for c in 0..8_000u64 {
        let inc = format!("{c:016x}");
        let key = StreamKey {
            incarnation: &inc,
            ..KEY
        };
        q.push_events(&mut host, &key, 1, evs(vec![big.clone(); 10]));
        if host.stat(Stat::RecordsDropped) > 0 {
            at_first_drop.get_or_insert(q.queued_bytes());
        }
    }
    assert!(q.queued_bytes() <= QUEUE_MAX_BYTES);
    // Over the cap, the queue goes down to its low-water mark at once, so the pass over the
    // whole queue is not repeated for every record pushed at the cap.
    let first = at_first_drop.unwrap_or(usize::MAX);
    assert!(first <= QUEUE_MAX_BYTES - QUEUE_MAX_BYTES / 8, "{first}");
}

#[test]
fn named_rejections_are_dropped_and_the_rest_counted_as_sent() {
    let mut q = queue("");
    let mut host = MockHost::new();
    q.push(&mut host, open("127.0.0.1:9101"));
    q.push_events(&mut host, &KEY, 1, evs(["e1"]));
    q.push(
        &mut host,
        Record::OwnerGone {
            owner: "127.0.0.1:9102".into(),
        },
    );
    let (token, records, _) = flush(&mut q, &mut host).unwrap();
    assert_eq!(records.len(), 3);
    let ack = r#"{"applied":2,"rejected":[{"index":1,"error":"bad_field","detail":"records[1].ids[0]: x"}]}"#;
    q.on_response(&mut host, token, Some(200), Some(ack.as_bytes()));
    assert_eq!(host.stat(Stat::RecordsSent), 2);
    assert_eq!(host.stat(Stat::RecordsRejected), 1);
    assert!(q.is_empty(), "never requeued");
    assert!(flush(&mut q, &mut host).is_none());
    // The service of today answers without `rejected`: all applied.
    q.push(&mut host, open("127.0.0.1:9101"));
    let (token, _, _) = flush(&mut q, &mut host).unwrap();
    q.on_response(&mut host, token, Some(200), Some(b"{\"applied\":1}"));
    assert_eq!(host.stat(Stat::RecordsSent), 3);
}

#[test]
fn a_4xx_batch_is_dropped_never_retried() {
    let mut q = queue("");
    let mut host = MockHost::new();
    q.push(&mut host, open("127.0.0.1:9101"));
    q.push(
        &mut host,
        Record::OwnerGone {
            owner: "127.0.0.1:9102".into(),
        },
    );
    let (token, _, _) = flush(&mut q, &mut host).unwrap();
    q.on_response(
        &mut host,
        token,
        Some(400),
        Some(b"{\"error\":\"bad_field\"}"),
    );
    assert_eq!(host.stat(Stat::RecordsRejected), 2);
    assert_eq!(host.stat(Stat::RecordsFailed), 0);
    assert!(q.is_empty());
    assert!(flush(&mut q, &mut host).is_none());
}

#[test]
fn transport_failures_and_5xx_retry_with_jittered_exponential_backoff() {
    let mut q = queue("");
    let mut host = MockHost::new();
    q.push(&mut host, open("127.0.0.1:9101"));
    let mut ceilings = Vec::new();
    for round in 0..8 {
        let Some((token, records, _)) = flush(&mut q, &mut host) else {
            panic!("round {round}: the batch is retried")
        };
        assert_eq!(records.len(), 1);
        let status = if round % 2 == 0 { None } else { Some(503) };
        q.on_response(&mut host, token, status, None);
        let wait = q.retry_at_ms() - host.now_ms;
        ceilings.push(wait);
        assert!(
            wait <= (100u64 << round).min(5_000),
            "round {round}: {wait}"
        );
        // Not before it is due.
        if wait > 0 {
            assert!(flush(&mut q, &mut host).is_none());
        }
        host.now_ms += wait;
    }
    assert_eq!(host.stat(Stat::RecordsFailed), 8);
    assert!(
        ceilings.iter().any(|w| *w > 100),
        "the backoff grows: {ceilings:?}"
    );
    // Success resets it.
    let (token, _, _) = flush(&mut q, &mut host).unwrap();
    q.on_response(&mut host, token, Some(200), None);
    assert_eq!(q.retry_at_ms(), 0);
    assert_eq!(host.stat(Stat::RecordsSent), 1);
}

#[test]
fn posts_carry_the_configured_token() {
    let mut q = queue(r#","token":"s3cr3t-Token_1""#);
    let mut host = MockHost::new();
    q.push(&mut host, open("127.0.0.1:9101"));
    q.flush(&mut host);
    let auth = host.effects.iter().find_map(|e| match e {
        Effect::Dispatch { headers, .. } => headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.clone()),
        _ => None,
    });
    assert_eq!(auth.as_deref(), Some("Bearer s3cr3t-Token_1"));
}

#[test]
fn queued_events_are_written_exactly_as_the_record_serializes() {
    let mut q = queue("");
    let mut host = MockHost::new();
    let long = "l\"".repeat(100);
    let ids = [("e\n1", 1), ("é2", 2), (long.as_str(), 3), ("~x", u64::MAX)];
    q.push_events(&mut host, &KEY, 7, ids);
    // Joins the open record: contiguous seqs of the same incarnation.
    q.push_events(&mut host, &KEY, 11, [("e5", 0xabc)]);
    assert_eq!(q.len(), 1);
    host.take();
    q.flush(&mut host);
    let (_, body) = host.last_dispatch().unwrap();
    let want = Record::Events {
        session: S.into(),
        incarnation: I.into(),
        first_seq: 7,
        ids: vec![
            format!("{}\n0000000000000001", recorded_id("e\n1")),
            "é2\n0000000000000002".into(),
            format!("{}\n0000000000000003", recorded_id(&long)),
            format!("{}\nffffffffffffffff", recorded_id("~x")),
            "e5\n0000000000000abc".into(),
        ],
        long: vec![LongId { seq: 9, id: long }],
        branch: 0,
        trimmed: 0,
    };
    let want = format!(
        "{{\"records\":[{}]}}",
        serde_json::to_string(&want).unwrap_or_default()
    );
    assert_eq!(String::from_utf8_lossy(body), want);
}

/// Every record the queue sends until it is empty, each batch answered 200.
fn drain(q: &mut RecordQueue, host: &mut MockHost) -> Vec<Record> {
    let mut all = Vec::new();
    while let Some((token, records, _)) = flush(q, host) {
        q.on_response(host, token, Some(200), None);
        all.extend(records);
    }
    all
}

/// `n` short replica ids from seq `first`, as a bulk stream relays them.
fn bulk(first: u64, n: u64) -> Vec<(String, u64)> {
    (first..first + n).map(|s| (format!("e{s}"), s)).collect()
}

#[test]
fn a_stream_far_past_the_queue_cap_keeps_its_open_and_newest_ids() {
    let mut q = queue("");
    let mut host = MockHost::new();
    q.push(&mut host, open("127.0.0.1:9101"));
    // About 28 bytes recorded per event: 400k are ~11 MiB, past QUEUE_MAX_BYTES, with no
    // flush in between (a relay at line rate between two ticks of a slow service).
    let total = 400_000u64;
    for c in 0..total / 50 {
        q.push_events(&mut host, &KEY, 1 + c * 50, bulk(1 + c * 50, 50));
    }
    assert_eq!(host.stat(Stat::RecordsDropped), 0);
    assert!(q.queued_bytes() < 1 << 20, "{} bytes", q.queued_bytes());
    let records = drain(&mut q, &mut host);
    assert!(matches!(records.first(), Some(Record::StreamOpen { .. })));
    let mut seqs = Vec::new();
    let mut first_trimmed = None;
    for r in &records {
        if let Record::Events {
            first_seq,
            ids,
            trimmed,
            ..
        } = r
        {
            assert_eq!(r.validate(), Ok(()));
            first_trimmed.get_or_insert((*first_seq, *trimmed));
            seqs.extend((0..ids.len() as u64).map(|i| first_seq + i));
            assert_eq!(
                ids.last().cloned(),
                Some(recorded_event(
                    &format!("e{}", first_seq + ids.len() as u64 - 1),
                    first_seq + ids.len() as u64 - 1
                ))
            );
        }
    }
    // The newest `record_window` seqs, contiguous up to the last one relayed.
    assert_eq!(seqs.last(), Some(&total));
    assert!(
        seqs.len() >= 4096 && seqs.len() < 4096 + 4096,
        "{}",
        seqs.len()
    );
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    // The first record kept says that everything before it was left out on purpose.
    let (first_seq, trimmed) = first_trimmed.unwrap();
    assert_eq!(first_seq, seqs[0]);
    assert_eq!(first_seq - trimmed, 1, "seqs 1..{first_seq} trimmed");
    assert_eq!(host.stat(Stat::RecordsDropped), 0);
}

#[test]
fn at_the_cap_old_ids_go_before_any_other_record() {
    // A window larger than the queue: only the byte cap bounds the stream.
    let mut q = queue(r#","record_window":1000000"#);
    let mut host = MockHost::new();
    q.push(&mut host, open("127.0.0.1:9101"));
    let total = 400_000u64;
    for c in 0..total / 50 {
        q.push_events(&mut host, &KEY, 1 + c * 50, bulk(1 + c * 50, 50));
    }
    q.push(
        &mut host,
        Record::BranchEnd {
            session: S.into(),
            incarnation: I.into(),
            branch: 0,
        },
    );
    assert!(q.queued_bytes() <= QUEUE_MAX_BYTES);
    assert_eq!(host.stat(Stat::RecordsDropped), 0);
    let records = drain(&mut q, &mut host);
    assert!(matches!(records.first(), Some(Record::StreamOpen { .. })));
    assert!(matches!(records.last(), Some(Record::BranchEnd { .. })));
    let events: Vec<(u64, usize, u64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Events {
                first_seq,
                ids,
                trimmed,
                ..
            } => Some((*first_seq, ids.len(), *trimmed)),
            _ => None,
        })
        .collect();
    let (first, _, trimmed) = events[0];
    assert!(trimmed > 0 && first - trimmed == 1, "{:?}", events[0]);
    let (last, n, _) = events[events.len() - 1];
    assert_eq!(last + n as u64 - 1, total);
}

#[test]
fn a_branch_and_trimmed_record_is_written_exactly_as_it_serializes() {
    let mut q = queue("");
    let mut host = MockHost::new();
    let long = "q".repeat(300);
    let want = Record::Events {
        session: S.into(),
        incarnation: I.into(),
        first_seq: 10,
        ids: vec![
            "a\u{1}\u{1f}\u{8}\u{c}\t\"\\\n0000000000000001".into(),
            "é\u{7f}".into(),
            recorded_event(&long, 5),
        ],
        long: vec![LongId { seq: 12, id: long }],
        branch: 3,
        trimmed: 9,
    };
    q.push(&mut host, want.clone());
    assert_eq!(host.stat(Stat::RecordsInvalid), 0);
    host.take();
    q.flush(&mut host);
    let (_, body) = host.last_dispatch().unwrap();
    let want = format!(
        "{{\"records\":[{}]}}",
        serde_json::to_string(&want).unwrap_or_default()
    );
    assert_eq!(String::from_utf8_lossy(body), want);
}
