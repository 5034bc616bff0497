//! What the exchange needs from the proxy it runs in, and the stats it reports.
//!
//! The exchange ([`crate::exchange`]) and the record queue ([`crate::records`]) never call a
//! proxy directly: they ask a [`Host`] (clock, randomness, upstream address, callouts) and
//! tell it what to do (set a header, replace a body chunk, dispatch a callout, count a stat).
//! An adapter implements it for one proxy ABI: proxy-wasm (`src/`) and the native Envoy
//! dynamic module (`native/`). [`MockHost`] implements it over plain data and records
//! every effect, so every rule is testable natively and the exchange can be fuzzed.
use crate::ownership::Reason;
use std::collections::HashMap;

/// Severity of a host log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Info,
    Warn,
    Error,
    Critical,
}

/// How a resume callout failed (the `callout_failures.<how>` stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalloutFailure {
    /// No response headers: reset mid-response, or no response at all.
    NoResponse,
    /// A status other than 200 (Envoy reports timeouts and refused connections as 503/504).
    Status,
    /// A 200 whose body is not a verdict.
    Body,
    /// The host refused to dispatch the callout.
    Dispatch,
    /// The query could not be encoded.
    Encode,
}

impl CalloutFailure {
    pub const ALL: [CalloutFailure; 5] = [
        CalloutFailure::NoResponse,
        CalloutFailure::Status,
        CalloutFailure::Body,
        CalloutFailure::Dispatch,
        CalloutFailure::Encode,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CalloutFailure::NoResponse => "no_response",
            CalloutFailure::Status => "status",
            CalloutFailure::Body => "body",
            CalloutFailure::Dispatch => "dispatch",
            CalloutFailure::Encode => "encode",
        }
    }
}

/// A counter the guard emits, named `mcp_resume_guard.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stat {
    /// Requests on an MCP path carrying `Last-Event-ID`.
    CursorsSeen,
    /// Cursors honoured: routed to the owner.
    Continued,
    /// Cursors not honoured, by reason.
    Refused(Reason),
    Restarted,
    Stripped,
    Rejected,
    /// Resume callouts made.
    Callouts,
    CalloutFailures(CalloutFailure),
    /// SSE ids rewritten to cursors.
    EventsRewritten,
    /// SSE responses that opened a new stream incarnation.
    StreamsOpened,
    /// Continuations cut because the replay diverged.
    ReplayMismatch,
    /// Requests (on any path) that carried the owner header.
    OwnerHeaderRemoved,
    /// Records the ownership service applied.
    RecordsSent,
    /// Records of batches that failed in transport or with a 5xx (retried).
    RecordsFailed,
    /// Records dropped because the queue was full.
    RecordsDropped,
    /// Records the guard found invalid before queueing them (never sent).
    RecordsInvalid,
    /// Records the service rejected (named in its answer, or a 4xx batch); never resent.
    RecordsRejected,
    /// Streams ended with the `forked` control event because a newer continuation took over.
    Forked,
    /// Host calls that failed where the guard had to fail closed (`host_error`).
    HostErrors,
}

impl Stat {
    /// Every stat, in a fixed order ([`Stat::index`]).
    pub fn all() -> Vec<Stat> {
        let mut v = vec![Stat::CursorsSeen, Stat::Continued];
        v.extend(Reason::ALL.iter().map(|r| Stat::Refused(*r)));
        v.extend([
            Stat::Restarted,
            Stat::Stripped,
            Stat::Rejected,
            Stat::Callouts,
        ]);
        v.extend(
            CalloutFailure::ALL
                .iter()
                .map(|f| Stat::CalloutFailures(*f)),
        );
        v.extend([
            Stat::EventsRewritten,
            Stat::StreamsOpened,
            Stat::ReplayMismatch,
            Stat::OwnerHeaderRemoved,
            Stat::RecordsSent,
            Stat::RecordsFailed,
            Stat::RecordsDropped,
            Stat::RecordsInvalid,
            Stat::RecordsRejected,
            Stat::Forked,
            Stat::HostErrors,
        ]);
        v
    }

    /// Position in [`Stat::all`], so an adapter can keep its metric ids in a plain array.
    pub fn index(self) -> usize {
        let reasons = Reason::ALL.len();
        let fails = CalloutFailure::ALL.len();
        let pos = |all: &[Reason], r: Reason| all.iter().position(|x| *x == r).unwrap_or(0);
        match self {
            Stat::CursorsSeen => 0,
            Stat::Continued => 1,
            Stat::Refused(r) => 2 + pos(&Reason::ALL, r),
            Stat::Restarted => 2 + reasons,
            Stat::Stripped => 3 + reasons,
            Stat::Rejected => 4 + reasons,
            Stat::Callouts => 5 + reasons,
            Stat::CalloutFailures(f) => {
                6 + reasons
                    + CalloutFailure::ALL
                        .iter()
                        .position(|x| *x == f)
                        .unwrap_or(0)
            }
            Stat::EventsRewritten => 6 + reasons + fails,
            Stat::StreamsOpened => 7 + reasons + fails,
            Stat::ReplayMismatch => 8 + reasons + fails,
            Stat::OwnerHeaderRemoved => 9 + reasons + fails,
            Stat::RecordsSent => 10 + reasons + fails,
            Stat::RecordsFailed => 11 + reasons + fails,
            Stat::RecordsDropped => 12 + reasons + fails,
            Stat::RecordsInvalid => 13 + reasons + fails,
            Stat::RecordsRejected => 14 + reasons + fails,
            Stat::Forked => 15 + reasons + fails,
            Stat::HostErrors => 16 + reasons + fails,
        }
    }

    /// The stat's name without the `mcp_resume_guard.` prefix.
    pub fn name(self) -> String {
        match self {
            Stat::CursorsSeen => "cursors_seen".into(),
            Stat::Continued => "continued".into(),
            Stat::Refused(r) => format!("refused.{}", r.as_str()),
            Stat::Restarted => "restarted".into(),
            Stat::Stripped => "stripped".into(),
            Stat::Rejected => "rejected".into(),
            Stat::Callouts => "callouts".into(),
            Stat::CalloutFailures(f) => format!("callout_failures.{}", f.as_str()),
            Stat::EventsRewritten => "events_rewritten".into(),
            Stat::StreamsOpened => "streams_opened".into(),
            Stat::ReplayMismatch => "replay_mismatch".into(),
            Stat::OwnerHeaderRemoved => "owner_header_removed".into(),
            Stat::RecordsSent => "records_sent".into(),
            Stat::RecordsFailed => "records_failed".into(),
            Stat::RecordsDropped => "records_dropped".into(),
            Stat::RecordsInvalid => "records_invalid".into(),
            Stat::RecordsRejected => "records_rejected".into(),
            Stat::Forked => "forked".into(),
            Stat::HostErrors => "host_errors".into(),
        }
    }
}

/// Every metric the guard defines is named `mcp_resume_guard.<name>`, in both builds.
pub const METRIC_PREFIX: &str = "mcp_resume_guard.";

/// The full metric name of `name` ([`Stat::name`] or [`CALLOUT_MS`]).
pub fn metric_name(name: &str) -> String {
    format!("{METRIC_PREFIX}{name}")
}

/// A random value when the host's randomness failed: spread from the clock. Only incarnation
/// ids and backoff jitter use randomness; none of them is a secret.
pub fn clock_random(now_ms: u64) -> u64 {
    now_ms.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15
}

/// The histogram of resume callout latency, `mcp_resume_guard.callout_ms`.
pub const CALLOUT_MS: &str = "callout_ms";

/// Everything the exchange asks of, or tells, the proxy. Methods that change the request or
/// response act on the request whose callback is running; failures are the host's to log.
pub trait Host {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// A fresh random value (incarnation ids, backoff jitter).
    fn random_u64(&mut self) -> u64;
    /// `ip:port` of the upstream that served this request, once known.
    fn upstream_address(&self) -> Option<String>;
    /// Envoy's `response.code_details` of this response, once known (read only when a
    /// continuation failed, to tell an owner that left the cluster from a busy one).
    fn response_code_details(&self) -> Option<String>;

    fn set_request_header(&mut self, name: &str, value: &str);
    /// Removes every value of `name`.
    fn remove_request_header(&mut self, name: &str);
    fn set_response_header(&mut self, name: &str, value: &str);
    /// Removes every value of `name`.
    fn remove_response_header(&mut self, name: &str);
    /// Answers locally instead of (or in place of) the upstream's response.
    fn send_local_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]);
    /// Lets a request paused for a callout continue.
    fn resume_request(&mut self);
    /// Replaces the response body chunk being handled.
    fn replace_body_chunk(&mut self, body: &[u8]);
    /// Ends the response abruptly (the client sees a reset stream).
    fn reset_response(&mut self);

    /// Dispatches an HTTP callout; `None` when the host refused. The answer arrives as an event
    /// carrying the returned token.
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u32>;

    /// Appends `tail` to the response body held since `on_response_body` answered
    /// [`crate::exchange::Action::Pause`] (at its end), and lets the response finish.
    fn finish_held_response(&mut self, tail: &[u8]);

    /// Whether response headers answered with [`crate::exchange::Action::Pause`] are held while
    /// the body still reaches the filter (Envoy's `StopIteration`). proxy-wasm hosts turn that
    /// pause into `StopAllIterationAndWatermark` (no body until resumed), so they say no.
    fn holds_headers_with_body(&self) -> bool {
        true
    }

    fn count(&mut self, stat: Stat, n: u64);
    fn observe_callout_ms(&mut self, ms: u64);
    fn log(&mut self, level: LogLevel, msg: &str);
}

/// One thing the exchange told the host to do, as [`MockHost`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    SetRequestHeader(String, String),
    RemoveRequestHeader(String),
    SetResponseHeader(String, String),
    RemoveResponseHeader(String),
    LocalResponse {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    ResumeRequest,
    BodyChunk(Vec<u8>),
    /// [`Host::finish_held_response`] with its tail.
    FinishHeld(Vec<u8>),
    ResetResponse,
    Dispatch {
        token: u32,
        cluster: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        timeout_ms: u64,
    },
    Log(LogLevel, String),
}

/// A host over plain data: a settable clock, deterministic randomness and an upstream address;
/// it records every effect and counts every stat. Used by the core's
/// tests, and by anything else that drives the exchange without a proxy (fuzzing).
#[derive(Debug, Default, Clone)]
pub struct MockHost {
    pub now_ms: u64,
    pub rng: u64,
    pub upstream: Option<String>,
    pub code_details: Option<String>,
    /// `true` makes every `dispatch` fail.
    pub refuse_dispatch: bool,
    pub next_token: u32,
    pub effects: Vec<Effect>,
    pub stats: HashMap<Stat, u64>,
    pub callout_ms: Vec<u64>,
    /// How often the clock was read (`now_ms`).
    pub clock_reads: std::cell::Cell<u64>,
    /// How often randomness was drawn (`random_u64`).
    pub random_draws: u64,
    /// [`Host::holds_headers_with_body`] (`true` as in the native build).
    pub holds_headers: bool,
}

impl MockHost {
    pub fn new() -> Self {
        MockHost {
            now_ms: 1_700_000_000_000,
            rng: 0x243f_6a88_85a3_08d3,
            upstream: Some("127.0.0.1:9101".into()),
            holds_headers: true,
            next_token: 1,
            ..MockHost::default()
        }
    }

    /// The value of a counter (0 if never counted).
    pub fn stat(&self, s: Stat) -> u64 {
        self.stats.get(&s).copied().unwrap_or(0)
    }

    /// Takes the recorded effects.
    pub fn take(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The last dispatched callout, if any.
    pub fn last_dispatch(&self) -> Option<(u32, &[u8])> {
        self.effects.iter().rev().find_map(|e| match e {
            Effect::Dispatch { token, body, .. } => Some((*token, body.as_slice())),
            _ => None,
        })
    }

    /// All body bytes written so far, concatenated.
    pub fn body(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for e in &self.effects {
            if let Effect::BodyChunk(b) | Effect::FinishHeld(b) = e {
                out.extend_from_slice(b);
            }
        }
        out
    }
}

fn owned(h: &[(&str, &str)]) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl Host for MockHost {
    fn now_ms(&self) -> u64 {
        self.clock_reads.set(self.clock_reads.get() + 1);
        self.now_ms
    }
    fn random_u64(&mut self) -> u64 {
        self.random_draws += 1;
        // splitmix64: deterministic, well spread.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn upstream_address(&self) -> Option<String> {
        self.upstream.clone()
    }
    fn response_code_details(&self) -> Option<String> {
        self.code_details.clone()
    }
    fn set_request_header(&mut self, name: &str, value: &str) {
        self.effects
            .push(Effect::SetRequestHeader(name.into(), value.into()));
    }
    fn remove_request_header(&mut self, name: &str) {
        self.effects.push(Effect::RemoveRequestHeader(name.into()));
    }
    fn set_response_header(&mut self, name: &str, value: &str) {
        self.effects
            .push(Effect::SetResponseHeader(name.into(), value.into()));
    }
    fn remove_response_header(&mut self, name: &str) {
        self.effects.push(Effect::RemoveResponseHeader(name.into()));
    }
    fn send_local_response(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        self.effects.push(Effect::LocalResponse {
            status,
            headers: owned(headers),
            body: body.to_vec(),
        });
    }
    fn resume_request(&mut self) {
        self.effects.push(Effect::ResumeRequest);
    }
    fn replace_body_chunk(&mut self, body: &[u8]) {
        self.effects.push(Effect::BodyChunk(body.to_vec()));
    }
    fn reset_response(&mut self) {
        self.effects.push(Effect::ResetResponse);
    }
    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Option<u32> {
        if self.refuse_dispatch {
            return None;
        }
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1);
        self.effects.push(Effect::Dispatch {
            token,
            cluster: cluster.into(),
            headers: owned(headers),
            body: body.to_vec(),
            timeout_ms,
        });
        Some(token)
    }
    fn finish_held_response(&mut self, tail: &[u8]) {
        self.effects.push(Effect::FinishHeld(tail.to_vec()));
    }
    fn holds_headers_with_body(&self) -> bool {
        self.holds_headers
    }
    fn count(&mut self, stat: Stat, n: u64) {
        *self.stats.entry(stat).or_insert(0) += n;
    }
    fn observe_callout_ms(&mut self, ms: u64) {
        self.callout_ms.push(ms);
    }
    fn log(&mut self, level: LogLevel, msg: &str) {
        self.effects.push(Effect::Log(level, msg.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_indexes_match_the_order_and_names_are_unique() {
        let all = Stat::all();
        for (i, s) in all.iter().enumerate() {
            assert_eq!(s.index(), i, "{s:?}");
        }
        let mut names: Vec<String> = all.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(names.contains(&"refused.gap".to_string()));
        assert!(names.contains(&"callout_failures.no_response".to_string()));
    }
}
