//! Guards and the store together: each gateway is the core's exchange on a mock host (its own
//! clock), its records applied to the store under test, its callouts answered by `resolve`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use mcp_ownership::metrics::Metrics;
use mcp_ownership::resume::{end_branch, ResumeOptions};
use mcp_ownership::store::{Limits, Store};
use mcp_resume_core::config::Config;
use mcp_resume_core::exchange::{Action, Exchange, Worker};
use mcp_resume_core::host::{Effect, MockHost, Stat};
use mcp_resume_core::ownership::{Reason, RecordBatch, ResumeQuery};

use super::{resolve_branched, T0};

const SECRET: &str = "17Vjr1MOFuUicxThufiY1oswS2eQj+6Y1DdNdURfwT0=";
const OWNER: &str = "127.0.0.1:9101";

struct Gateway {
    w: Worker,
    host: MockHost,
}

type Headers = Vec<(String, Vec<u8>)>;

fn hdrs(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.as_bytes().to_vec()))
        .collect()
}

impl Gateway {
    /// A gateway whose clock reads `now_ms`.
    fn new(now_ms: u64) -> Gateway {
        let json = format!(
            r#"{{"ownership":{{"cluster":"mcp_ownership"}},"keys":[{{"id":1,"secret":"{SECRET}","active":true}}]}}"#
        );
        let mut host = MockHost::new();
        host.now_ms = now_ms;
        // Each gateway its own randomness (incarnation ids).
        host.rng ^= now_ms;
        host.upstream = Some(OWNER.into());
        Gateway {
            w: Worker::new(Config::from_json(json.as_bytes()).unwrap()),
            host,
        }
    }

    /// `initialize`: the replica answers with session `sid`.
    fn initialize(&mut self, sid: &str) {
        let mut ex = Exchange::new();
        let req = hdrs(&[(":method", "POST"), (":path", "/mcp")]);
        ex.on_request_headers(&mut self.w, &mut self.host, Some(&req));
        let resp = hdrs(&[
            (":status", "200"),
            ("content-type", "application/json"),
            ("mcp-session-id", sid),
        ]);
        ex.on_response_headers(&mut self.w, &mut self.host, Some(&resp), false);
    }

    /// A standalone GET request (with a cursor: a resume).
    fn get(&mut self, sid: &str, cursor: Option<&str>) -> (Exchange, Action) {
        let mut ex = Exchange::new();
        let mut req = hdrs(&[
            (":method", "GET"),
            (":path", "/mcp"),
            ("mcp-session-id", sid),
        ]);
        if let Some(c) = cursor {
            req.extend(hdrs(&[("last-event-id", c)]));
        }
        self.host.take();
        let a = ex.on_request_headers(&mut self.w, &mut self.host, Some(&req));
        (ex, a)
    }

    /// The stream's answer: SSE with one event `id`.
    fn stream(&mut self, ex: &mut Exchange, id: &str) -> String {
        let resp = hdrs(&[(":status", "200"), ("content-type", "text/event-stream")]);
        ex.on_response_headers(&mut self.w, &mut self.host, Some(&resp), false);
        self.host.take();
        let chunk = format!("id: {id}\ndata: x\n\n");
        ex.on_response_body(&mut self.w, &mut self.host, Some(chunk.as_bytes()), false);
        let body = String::from_utf8_lossy(&self.host.body()).into_owned();
        body.lines()
            .find_map(|l| l.strip_prefix("id: "))
            .map(str::to_owned)
            .expect("a rewritten id")
    }

    /// The resume callout just dispatched, answered by the store.
    async fn answer(&mut self, ex: &mut Exchange, store: &impl Store) {
        let (token, body) = self.host.last_dispatch().expect("a callout");
        let q: ResumeQuery = serde_json::from_slice(body).unwrap();
        let v = resolve_branched(store, &q, super::no_wait(), T0)
            .await
            .verdict;
        let v = serde_json::to_vec(&v).unwrap();
        ex.on_callout_response(&mut self.w, &mut self.host, token, Some(200), Some(&v));
    }

    /// Sends every queued record to the store.
    async fn flush(&mut self, store: &impl Store) {
        for _ in 0..10 {
            self.host.take();
            self.w.on_tick(&mut self.host);
            let Some((token, body)) = self.host.last_dispatch() else {
                return;
            };
            let batch: RecordBatch = serde_json::from_slice(body).unwrap();
            store.apply(&batch.records, T0).await.unwrap();
            let ack = format!(r#"{{"applied":{}}}"#, batch.records.len());
            self.w
                .on_records_response(&mut self.host, token, Some(200), Some(ack.as_bytes()));
        }
    }
}

/// Two gateways whose clocks disagree by an hour: a GET stream opened through the one ahead,
/// then a newer one through the other. The newer one's cursor continues and the older one's is
/// superseded, whatever `opened_ms` each gateway recorded: order comes from the store.
pub async fn gateways_with_skewed_clocks_pick_the_newest_get_stream<S: Store>(
    make: impl Fn(Limits) -> S,
) {
    let s = make(Limits::default());
    let sid = "skewed-clocks-session";
    let mut ahead = Gateway::new(T0 + 3_600_000);
    let mut exact = Gateway::new(T0);
    ahead.initialize(sid);
    let (mut old, _) = ahead.get(sid, None);
    let old_cursor = ahead.stream(&mut old, "e1");
    ahead.flush(&s).await;
    let (mut new, _) = exact.get(sid, None);
    let new_cursor = exact.stream(&mut new, "f1");
    exact.flush(&s).await;
    // Each cursor resumed through the other gateway.
    let (mut r, a) = exact.get(sid, Some(&new_cursor));
    assert_eq!(a, Action::Pause);
    exact.answer(&mut r, &s).await;
    assert_eq!(
        exact.host.stat(Stat::Continued),
        1,
        "the newest stream continues"
    );
    let (mut r, a) = ahead.get(sid, Some(&old_cursor));
    assert_eq!(a, Action::Pause);
    ahead.answer(&mut r, &s).await;
    assert_eq!(ahead.host.stat(Stat::Continued), 0);
    assert_eq!(ahead.host.stat(Stat::Refused(Reason::Superseded)), 1);
    assert!(
        !ahead
            .host
            .effects
            .iter()
            .any(|e| matches!(e, Effect::SetRequestHeader(k, _) if k == "last-event-id")),
        "the superseded cursor never reaches a replica"
    );
}

/// Red team 4's `abandon-race` through the real guard core on two gateways: a GET stream through
/// one; a copy of its resume through the other, dropped while its verdict was pending (the
/// store registered it; the `abandoned` record waits in that gateway's queue); then the real
/// resume through the first, whose replica relays one event and ends. Its clean end asks the
/// store while the other gateway's record is still queued: the ask waits for it
/// (`resume::end_branch`, as the handler runs it), and the client sees the replica's own end,
/// never `forked`.
pub async fn a_dropped_resume_through_another_gateway_never_forks_the_real_one<S: Store>(
    make: impl Fn(Limits) -> S,
) {
    let s = make(Limits::default());
    let sid = "abandon-race-session";
    let (mut real, mut other) = (Gateway::new(T0), Gateway::new(T0));
    real.initialize(sid);
    let (mut fresh, _) = real.get(sid, None);
    let cursor = real.stream(&mut fresh, "e1");
    real.flush(&s).await;

    let (mut dropped, a) = other.get(sid, Some(&cursor));
    assert_eq!(a, Action::Pause);
    let (_, body) = other.host.last_dispatch().expect("a resume callout");
    let q: ResumeQuery = serde_json::from_slice(body).unwrap();
    // The store answers (and registers the branch); the client is gone before the answer.
    resolve_branched(&s, &q, super::no_wait(), T0).await;
    dropped.on_stream_end(&mut other.w, &mut other.host);

    let (mut r, a) = real.get(sid, Some(&cursor));
    assert_eq!(a, Action::Pause);
    real.answer(&mut r, &s).await;
    assert_eq!(real.host.stat(Stat::Continued), 1);
    let resp = hdrs(&[(":status", "200"), ("content-type", "text/event-stream")]);
    r.on_response_headers(&mut real.w, &mut real.host, Some(&resp), false);
    real.host.take();
    let chunk = b"id: e2\ndata: x\n\n";
    r.on_response_body(&mut real.w, &mut real.host, Some(chunk), true);
    let (token, body) = real
        .host
        .last_dispatch()
        .expect("the clean end asks the store");
    let end: serde_json::Value = serde_json::from_slice(body).unwrap();
    let branch = end["branch"].as_u64().expect("a registered branch");
    let key = end["incarnation"].as_str().unwrap().to_owned();
    let session = end["session"].as_str().unwrap().to_owned();
    let opts = ResumeOptions {
        record_wait: Duration::from_millis(2_000),
        max_expected: 256,
    };
    let clock = || T0 + 10;
    let metrics = Metrics::new();
    let ask = end_branch(&s, (&session, &key, branch), &opts, &clock, &metrics);
    let late = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        other.flush(&s).await;
    };
    let (forked, ()) = tokio::join!(ask, late);
    let answer = format!(r#"{{"forked":{}}}"#, forked.unwrap());
    r.on_callout_response(
        &mut real.w,
        &mut real.host,
        token,
        Some(200),
        Some(answer.as_bytes()),
    );
    r.on_stream_end(&mut real.w, &mut real.host);
    let out = String::from_utf8_lossy(&real.host.body()).into_owned();
    assert!(out.contains("data: x"), "{out}");
    assert!(
        !out.contains("mcp-resume"),
        "the client's own dropped resume is no reader: {out}"
    );
    assert_eq!(real.host.stat(Stat::Forked), 0);
}
