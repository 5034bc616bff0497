//! Prometheus metrics. Label values are all `&'static str` from closed sets, so cardinality
//! is bounded whatever clients send.
use std::time::Duration;

use mcp_resume_core::ownership::{Reason, Record, REJECTED_FORKED, REJECTED_MISMATCH};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::store::StoreStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: &'static str,
}

type HistogramFamily = Family<OpLabels, Histogram, fn() -> Histogram>;

fn store_latency_histogram() -> Histogram {
    // 20µs .. ~1.3s: an in-memory lock and a Redis round trip both land inside.
    Histogram::new(exponential_buckets(0.000_02, 3.0, 11))
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub verdicts: Family<OutcomeLabels, Counter>,
    pub records: Family<TypeLabels, Counter>,
    pub records_rejected: Counter,
    pub sessions_refused: Counter,
    pub growth_refused: Counter,
    pub resume_waits: Family<OutcomeLabels, Counter>,
    pub branches: Family<OutcomeLabels, Counter>,
    pub branch_ends: Family<OutcomeLabels, Counter>,
    pub events_refused: Family<ErrorLabels, Counter>,
    pub store_latency: HistogramFamily,
    pub store_errors: Family<OpLabels, Counter>,
    pub sessions: Gauge,
    pub pending: Gauge,
    pub incarnations: Gauge,
    pub store_bytes: Gauge,
    pub evicted: Gauge,
    pub reconnects: Gauge,
    pub touch_refused: Gauge,
}

/// Store operations as they appear in the `op` label.
pub const STORE_OPS: [&str; 7] = [
    "apply",
    "snapshot",
    "open_branch",
    "end_branch",
    "health",
    "stats",
    "sweep",
];

/// How a continuation's branch was registered (`branches` counter).
pub const BRANCH_OUTCOMES: [&str; 4] = ["registered", "unregistered", "lost", "store_error"];
/// The store's answers to `POST /v1/branch` (`branch_ends` counter).
pub const BRANCH_END_OUTCOMES: [&str; 2] = ["forked", "not_forked"];

/// Record types as they appear in the `type` label.
pub fn record_type(r: &Record) -> &'static str {
    match r {
        Record::SessionOpen { .. } => "session_open",
        Record::SessionEnd { .. } => "session_end",
        Record::StreamOpen { .. } => "stream_open",
        Record::Events { .. } => "events",
        Record::StreamLost { .. } => "stream_lost",
        Record::OwnerFailed { .. } => "owner_failed",
        Record::OwnerGone { .. } => "owner_gone",
        Record::BranchEnd { .. } => "branch_end",
        Record::Abandoned { .. } => "abandoned",
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let verdicts = Family::<OutcomeLabels, Counter>::default();
        let records = Family::<TypeLabels, Counter>::default();
        let records_rejected = Counter::default();
        let sessions_refused = Counter::default();
        let growth_refused = Counter::default();
        let pending = Gauge::default();
        let resume_waits = Family::<OutcomeLabels, Counter>::default();
        let branches = Family::<OutcomeLabels, Counter>::default();
        let branch_ends = Family::<OutcomeLabels, Counter>::default();
        let events_refused = Family::<ErrorLabels, Counter>::default();
        let store_latency: HistogramFamily = Family::new_with_constructor(store_latency_histogram);
        let store_errors = Family::<OpLabels, Counter>::default();
        let sessions = Gauge::default();
        let incarnations = Gauge::default();
        let store_bytes = Gauge::default();
        let evicted = Gauge::default();
        let reconnects = Gauge::default();
        let touch_refused = Gauge::default();

        // Counter names get `_total` appended by the encoder.
        registry.register(
            "mcp_ownership_http_requests",
            "HTTP requests by endpoint and status code",
            requests.clone(),
        );
        registry.register(
            "mcp_ownership_verdicts",
            "Resume verdicts by outcome: continue, or the reason of a new stream",
            verdicts.clone(),
        );
        registry.register(
            "mcp_ownership_records_applied",
            "Records applied by type",
            records.clone(),
        );
        registry.register(
            "mcp_ownership_records_rejected",
            "Records of a batch refused one by one (named in the answer's `rejected`)",
            records_rejected.clone(),
        );
        registry.register(
            "mcp_ownership_sessions_refused",
            "session_open records refused for want of room (store_full): the session cap or the byte budget is reached with every session active within the idle TTL",
            sessions_refused.clone(),
        );
        registry.register(
            "mcp_ownership_growth_refused",
            "Records that would grow an opened session (events, stream_open) refused for want of room (store_full): the store is at its byte cap with every session active within the idle TTL; the session that pushes it pays, no session is evicted",
            growth_refused.clone(),
        );
        registry.register(
            "mcp_ownership_resume_waits",
            "Resumes that waited for in-flight records, by the verdict they got: continue or new_stream",
            resume_waits.clone(),
        );
        registry.register(
            "mcp_ownership_branches",
            "Continuations by how their branch was registered: registered (numbered), unregistered (the store refused the write or no longer has the incarnation), lost (the incarnation's branch table was lost apart from it: the resume is refused records_lost) or store_error; unregistered and store_error continue unarbitrated",
            branches.clone(),
        );
        registry.register(
            "mcp_ownership_branch_ends",
            "POST /v1/branch answers: forked (another branch of the incarnation is open: the replica ended this one for a newer reader) or not_forked",
            branch_ends.clone(),
        );
        registry.register(
            "mcp_ownership_events_refused",
            "events records refused by the arbiter: forked (a newer branch overtook theirs) or replay_mismatch (their seqs are recorded with other events; the incarnation is lost)",
            events_refused.clone(),
        );
        registry.register(
            "mcp_ownership_store_operation_duration_seconds",
            "Store operation latency by operation",
            store_latency.clone(),
        );
        registry.register(
            "mcp_ownership_store_errors",
            "Store errors by operation",
            store_errors.clone(),
        );
        registry.register(
            "mcp_ownership_sessions",
            "Sessions held by the store",
            sessions.clone(),
        );
        registry.register(
            "mcp_ownership_pending_sessions",
            "Sessions with records but no session_open yet (held apart, never evicting opened sessions)",
            pending.clone(),
        );
        registry.register(
            "mcp_ownership_incarnations",
            "Stream incarnations held by the store",
            incarnations.clone(),
        );

        registry.register(
            "mcp_ownership_store_bytes",
            "Estimated bytes held by the memory store (0 for Redis: see its used_memory)",
            store_bytes.clone(),
        );
        registry.register(
            "mcp_ownership_sessions_evicted",
            "Sessions evicted by the global caps since this instance started",
            evicted.clone(),
        );
        registry.register(
            "mcp_ownership_store_reconnects",
            "Redis Cluster connections this instance dropped as broken (no answer for the stall bound, or no primary answering the health check) and made anew, since it started",
            reconnects.clone(),
        );

        registry.register(
            "mcp_ownership_touch_refused",
            "Resume lookups answered read-only because Redis refused their last-used write (maxmemory), since this instance started",
            touch_refused.clone(),
        );

        // Pre-create the closed label sets so dashboards and alerts see zeros, not absence.
        let _ = verdicts.get_or_create(&OutcomeLabels {
            outcome: "continue",
        });
        for r in Reason::ALL {
            let _ = verdicts.get_or_create(&OutcomeLabels {
                outcome: r.as_str(),
            });
        }
        for op in STORE_OPS {
            let _ = store_errors.get_or_create(&OpLabels { op });
        }
        for outcome in BRANCH_OUTCOMES {
            let _ = branches.get_or_create(&OutcomeLabels { outcome });
        }
        for outcome in BRANCH_END_OUTCOMES {
            let _ = branch_ends.get_or_create(&OutcomeLabels { outcome });
        }
        for error in [REJECTED_FORKED, REJECTED_MISMATCH] {
            let _ = events_refused.get_or_create(&ErrorLabels { error });
        }

        Metrics {
            registry,
            requests,
            verdicts,
            records,
            records_rejected,
            sessions_refused,
            growth_refused,
            resume_waits,
            branches,
            branch_ends,
            events_refused,
            store_latency,
            store_errors,
            sessions,
            pending,
            incarnations,
            store_bytes,
            evicted,
            reconnects,
            touch_refused,
        }
    }

    pub fn store_op(&self, op: &'static str, took: Duration, ok: bool) {
        self.store_latency
            .get_or_create(&OpLabels { op })
            .observe(took.as_secs_f64());
        if !ok {
            self.store_errors.get_or_create(&OpLabels { op }).inc();
        }
    }

    pub fn set_stats(&self, stats: StoreStats) {
        self.sessions
            .set(i64::try_from(stats.sessions).unwrap_or(i64::MAX));
        self.pending
            .set(i64::try_from(stats.pending).unwrap_or(i64::MAX));
        self.incarnations
            .set(i64::try_from(stats.incarnations).unwrap_or(i64::MAX));
        self.store_bytes
            .set(i64::try_from(stats.bytes).unwrap_or(i64::MAX));
        self.evicted
            .set(i64::try_from(stats.evicted).unwrap_or(i64::MAX));
        self.reconnects
            .set(i64::try_from(stats.reconnects).unwrap_or(i64::MAX));
        self.touch_refused
            .set(i64::try_from(stats.touch_refused).unwrap_or(i64::MAX));
    }

    /// OpenMetrics text exposition (Prometheus scrapes it natively).
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
