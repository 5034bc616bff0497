//! Envoy stats the guard emits. Envoy shows them with its `wasmcustom.` prefix.
use crate::host;
use mcp_resume_core::ownership::Reason;
use proxy_wasm::hostcalls as hc;
use proxy_wasm::types::MetricType;

/// One metric id; 0 when the host refused to define it (then updates are no-ops).
#[derive(Clone, Copy, Default)]
pub struct Metric(u32);

impl Metric {
    fn define(kind: MetricType, name: &str) -> Metric {
        match hc::define_metric(kind, &format!("mcp_resume_guard.{name}")) {
            Ok(id) => Metric(id),
            Err(_) => {
                host::log(
                    proxy_wasm::types::LogLevel::Warn,
                    &format!("cannot define metric {name}"),
                );
                Metric(0)
            }
        }
    }
    pub fn inc(self) {
        self.add(1);
    }
    pub fn add(self, n: u64) {
        if self.0 != 0 {
            let _ = hc::increment_metric(self.0, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
    pub fn record(self, v: u64) {
        if self.0 != 0 {
            let _ = hc::record_metric(self.0, v);
        }
    }
}

pub struct Metrics {
    pub cursors_seen: Metric,
    pub continued: Metric,
    refused: Vec<(Reason, Metric)>,
    pub restarted: Metric,
    pub stripped: Metric,
    pub rejected: Metric,
    pub callouts: Metric,
    callout_failures: [(&'static str, Metric); 5],
    callout_ms: Metric,
    pub events_rewritten: Metric,
    pub streams_opened: Metric,
    pub replay_mismatch: Metric,
    pub owner_header_removed: Metric,
    pub records_sent: Metric,
    pub records_failed: Metric,
    pub records_dropped: Metric,
}

impl Metrics {
    pub fn define() -> Metrics {
        use MetricType::{Counter, Histogram};
        let c = |n: &str| Metric::define(Counter, n);
        Metrics {
            cursors_seen: c("cursors_seen"),
            continued: c("continued"),
            refused: Reason::ALL
                .iter()
                .map(|r| (*r, c(&format!("refused.{}", r.as_str()))))
                .collect(),
            restarted: c("restarted"),
            stripped: c("stripped"),
            rejected: c("rejected"),
            callouts: c("callouts"),
            callout_failures: ["no_response", "status", "body", "dispatch", "encode"]
                .map(|how| (how, c(&format!("callout_failures.{how}")))),
            callout_ms: Metric::define(Histogram, "callout_ms"),
            events_rewritten: c("events_rewritten"),
            streams_opened: c("streams_opened"),
            replay_mismatch: c("replay_mismatch"),
            owner_header_removed: c("owner_header_removed"),
            records_sent: c("records_sent"),
            records_failed: c("records_failed"),
            records_dropped: c("records_dropped"),
        }
    }

    pub fn refused(&self, reason: Reason) {
        if let Some((_, m)) = self.refused.iter().find(|(r, _)| *r == reason) {
            m.inc();
        }
    }

    pub fn callout_failure(&self, how: &str) {
        if let Some((_, m)) = self.callout_failures.iter().find(|(h, _)| *h == how) {
            m.inc();
        }
    }

    pub fn callout_latency(&self, ms: u64) {
        self.callout_ms.record(ms);
    }
}
