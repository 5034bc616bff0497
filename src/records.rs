//! Records to the ownership cluster: queued per worker, sent in batches from the root
//! context's tick, one batch in flight at a time, so relaying never waits on them.
use crate::host;
use crate::metrics::Metrics;
use mcp_resume_core::config::Config;
use mcp_resume_core::ownership::{Record, RecordBatch, RECORDS_PATH};
use std::collections::VecDeque;
use std::time::Duration;

/// Ids one merged `Events` record may reach: keeps a record (and a queue of them) bounded.
const MERGE_MAX_IDS: usize = 256;
/// How many queued records a new `Events` record looks back through for its incarnation.
const MERGE_LOOKBACK: usize = 64;
/// Ids one batch may carry, whatever `max_batch` says: at most 4096 × ~130 bytes of JSON, well
/// under the ownership service's 1 MiB body limit.
const BATCH_MAX_IDS: usize = 4096;
/// Event ids queued per worker at most (besides `max_queue` records): a relay faster than the
/// ownership service takes records must not grow the VM's memory without bound. Past it the
/// oldest records are dropped and counted in `records_dropped`.
const MAX_QUEUED_IDS: usize = 65_536;

fn ids_of(r: &Record) -> usize {
    match r {
        Record::Events { ids, .. } => ids.len(),
        _ => 0,
    }
}

#[derive(Default)]
pub struct RecordQueue {
    pending: VecDeque<Record>,
    /// The batch awaiting its answer, put back at the head if it fails.
    in_flight: Option<(u32, Vec<Record>)>,
    cluster: String,
    authority: String,
    timeout: Duration,
    max_batch: usize,
    max_queue: usize,
    /// Event ids in `pending`.
    queued_ids: usize,
    /// Events rewritten since the last tick, for the `events_rewritten` stat.
    pub rewritten: u64,
}

impl RecordQueue {
    pub fn configure(&mut self, cfg: &Config) {
        let o = &cfg.ownership;
        self.cluster = o.cluster.clone();
        self.authority = o.authority.clone();
        self.timeout = Duration::from_millis(o.timeout_ms.max(1000));
        self.max_batch = o.max_batch;
        self.max_queue = o.max_queue;
    }

    pub fn push(&mut self, r: Record, m: &Metrics) {
        // Events that continue a recently queued record of the same incarnation join it: one
        // record (and one session and incarnation key on the wire) per stream and flush, not per
        // chunk. Streams interleave, so look back a little; only records of the same incarnation
        // are ordered with respect to each other.
        let r = match r {
            Record::Events {
                session: s2,
                incarnation: i2,
                first_seq: f2,
                ids: more,
            } => {
                let open =
                    self.pending
                        .iter_mut()
                        .rev()
                        .take(MERGE_LOOKBACK)
                        .find_map(|p| match p {
                            Record::Events {
                                session,
                                incarnation,
                                first_seq,
                                ids,
                            } if *incarnation == i2 && *session == s2 => Some((first_seq, ids)),
                            _ => None,
                        });
                match open {
                    Some((first_seq, ids))
                        if ids.len() < MERGE_MAX_IDS
                            && first_seq.checked_add(ids.len() as u64) == Some(f2) =>
                    {
                        self.queued_ids += more.len();
                        ids.extend(more);
                        self.enforce_bounds(m);
                        return;
                    }
                    _ => Record::Events {
                        session: s2,
                        incarnation: i2,
                        first_seq: f2,
                        ids: more,
                    },
                }
            }
            r => r,
        };
        self.queued_ids += ids_of(&r);
        self.pending.push_back(r);
        self.enforce_bounds(m);
    }

    /// Drops the oldest records while the queue holds more than `max_queue` records or more
    /// than [`MAX_QUEUED_IDS`] event ids.
    fn enforce_bounds(&mut self, m: &Metrics) {
        while self.pending.len() > self.max_queue || self.queued_ids > MAX_QUEUED_IDS {
            let Some(r) = self.pending.pop_front() else {
                self.queued_ids = 0;
                break;
            };
            self.queued_ids = self.queued_ids.saturating_sub(ids_of(&r));
            m.records_dropped.inc();
        }
    }

    pub fn flush(&mut self, m: &Metrics) {
        if self.in_flight.is_some() || self.pending.is_empty() {
            return;
        }
        let mut n = 0;
        let mut ids = 0;
        for r in self.pending.iter().take(self.max_batch) {
            if let Record::Events { ids: i, .. } = r {
                if n > 0 && ids + i.len() > BATCH_MAX_IDS {
                    break;
                }
                ids += i.len();
            }
            n += 1;
        }
        let records: Vec<Record> = self.pending.drain(..n).collect();
        self.queued_ids = self.queued_ids.saturating_sub(ids);
        let batch = RecordBatch { records };
        let body = match serde_json::to_vec(&batch) {
            Ok(b) => b,
            Err(_) => {
                m.records_dropped.add(n as u64);
                return;
            }
        };
        let headers = [
            (":method", "POST"),
            (":path", RECORDS_PATH),
            (":authority", self.authority.as_str()),
            ("content-type", "application/json"),
        ];
        match host::dispatch(&self.cluster, &headers, &body, self.timeout) {
            Some(token) => self.in_flight = Some((token, batch.records)),
            None => self.requeue(batch.records, m),
        }
    }

    pub fn on_response(&mut self, token: u32, ok: bool, m: &Metrics) {
        let Some((want, records)) = self.in_flight.take() else {
            return;
        };
        if want != token {
            self.in_flight = Some((want, records));
            return;
        }
        if ok {
            m.records_sent.add(records.len() as u64);
        } else {
            m.records_failed.add(records.len() as u64);
            self.requeue(records, m);
        }
    }

    /// Put a failed batch back at the head; records are idempotent, so a resend is safe.
    fn requeue(&mut self, records: Vec<Record>, m: &Metrics) {
        for r in records.into_iter().rev() {
            self.queued_ids += ids_of(&r);
            self.pending.push_front(r);
        }
        self.enforce_bounds(m);
    }
}
