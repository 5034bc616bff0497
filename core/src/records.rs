//! Records to the ownership service: queued per worker, sent in batches from the worker's
//! tick, one batch in flight at a time, so relaying never waits on them.
use crate::config::Config;
use crate::host::{Host, Stat};
use crate::ownership::{Record, RecordBatch, RECORDS_PATH};
use std::collections::VecDeque;

/// Ids one merged `Events` record may reach: keeps a record (and a queue of them) bounded.
const MERGE_MAX_IDS: usize = 256;
/// How many queued records a new `Events` record looks back through for its incarnation.
const MERGE_LOOKBACK: usize = 64;
/// Ids one batch may carry, whatever `max_batch` says.
const BATCH_MAX_IDS: usize = 4096;
/// Event ids queued per worker at most (besides `max_queue` records).
const MAX_QUEUED_IDS: usize = 65_536;

fn ids_of(r: &Record) -> usize {
    match r {
        Record::Events { ids, .. } => ids.len(),
        _ => 0,
    }
}

#[derive(Debug, Default)]
pub struct RecordQueue {
    pending: VecDeque<Record>,
    /// The batch awaiting its answer, put back at the head if it fails.
    in_flight: Option<(u32, Vec<Record>)>,
    cluster: String,
    authority: String,
    timeout_ms: u64,
    max_batch: usize,
    max_queue: usize,
    /// Event ids in `pending`.
    queued_ids: usize,
}

impl RecordQueue {
    pub fn new(cfg: &Config) -> RecordQueue {
        let o = &cfg.ownership;
        RecordQueue {
            cluster: o.cluster.clone(),
            authority: o.authority.clone(),
            timeout_ms: o.timeout_ms.max(1000),
            max_batch: o.max_batch,
            max_queue: o.max_queue,
            ..RecordQueue::default()
        }
    }

    /// Records waiting to be sent.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn push<H: Host>(&mut self, host: &mut H, r: Record) {
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
                        self.enforce_bounds(host);
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
        self.enforce_bounds(host);
    }

    fn enforce_bounds<H: Host>(&mut self, host: &mut H) {
        while self.pending.len() > self.max_queue || self.queued_ids > MAX_QUEUED_IDS {
            let Some(r) = self.pending.pop_front() else {
                self.queued_ids = 0;
                break;
            };
            self.queued_ids = self.queued_ids.saturating_sub(ids_of(&r));
            host.count(Stat::RecordsDropped, 1);
        }
    }

    pub fn flush<H: Host>(&mut self, host: &mut H) {
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
                host.count(Stat::RecordsDropped, n as u64);
                return;
            }
        };
        let headers = [
            (":method", "POST"),
            (":path", RECORDS_PATH),
            (":authority", self.authority.as_str()),
            ("content-type", "application/json"),
        ];
        match host.dispatch(&self.cluster, &headers, &body, self.timeout_ms) {
            Some(token) => self.in_flight = Some((token, batch.records)),
            None => self.requeue(host, batch.records),
        }
    }

    /// The answer to a records post: `status` is `None` when no response headers arrived.
    pub fn on_response<H: Host>(
        &mut self,
        host: &mut H,
        token: u32,
        status: Option<u32>,
        _body: Option<&[u8]>,
    ) {
        let Some((want, records)) = self.in_flight.take() else {
            return;
        };
        if want != token {
            self.in_flight = Some((want, records));
            return;
        }
        if status == Some(200) {
            host.count(Stat::RecordsSent, records.len() as u64);
        } else {
            host.count(Stat::RecordsFailed, records.len() as u64);
            self.requeue(host, records);
        }
    }

    /// Put a failed batch back at the head; records are idempotent, so a resend is safe.
    fn requeue<H: Host>(&mut self, host: &mut H, records: Vec<Record>) {
        for r in records.into_iter().rev() {
            self.queued_ids += ids_of(&r);
            self.pending.push_front(r);
        }
        self.enforce_bounds(host);
    }
}
