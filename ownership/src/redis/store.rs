//! The [`Store`] trait over Redis: every operation bounded, plus health (PING, then what `INFO`
//! says this Redis cannot do) and stats.
use std::sync::atomic::Ordering;
use std::time::Duration;

use mcp_resume_core::ownership::Record;
use redis::cluster_routing::RoutingInfo;
use redis::Value;
use tokio::sync::watch;

use super::config::{self, NodeInfo};
use super::connection::{lock, on_every_primary, pulsed, Conn};
use super::pipeline::Placed;
use super::reply::{as_string, as_u64};
use super::{corrupt, RedisStore, PROBE_EVERY, STATS_SAMPLE};
use crate::store::{Applied, BranchOpen, Facts, SnapshotQuery, Store, StoreError, StoreStats};

impl RedisStore {
    /// `INFO` of every primary, read at most once per [`PROBE_EVERY`] unless `fresh`.
    pub(super) async fn nodes(&self, fresh: bool) -> Result<Vec<NodeInfo>, StoreError> {
        let mut slot = self.probe.lock().await;
        if let (false, Some((at, nodes))) = (fresh, slot.as_ref()) {
            if at.elapsed() < PROBE_EVERY {
                return Ok(nodes.clone());
            }
        }
        let mut conn = self.conn("health").await?;
        let texts: Vec<String> = match &mut conn {
            Conn::Single(m) => vec![redis::cmd("INFO")
                .query_async::<String>(m)
                .await
                .map_err(|e| self.fail("health", e))?],
            Conn::Cluster(k, pulse) => {
                // No response policy: one answer per primary, keyed by its address.
                let routing = RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    None,
                ));
                let v = pulsed(
                    pulse,
                    Box::pin(k.route_command(redis::cmd("INFO"), routing)),
                )
                .await
                .map_err(|e| self.fail("health", e))?;
                match v {
                    Value::Map(m) => m.into_iter().filter_map(|(_, v)| as_string(&v)).collect(),
                    other => as_string(&other).into_iter().collect(),
                }
            }
        };
        let nodes: Vec<NodeInfo> = texts.iter().map(|t| config::parse_info(t)).collect();
        *slot = Some((std::time::Instant::now(), nodes.clone()));
        Ok(nodes)
    }

    /// Can this Redis do what the flags ask? `Err(Misconfigured)` names what to change;
    /// warnings are logged once. An `INFO` that fails (an ACL without it) checks nothing.
    async fn check_config(&self) -> Result<(), StoreError> {
        let Ok(nodes) = self.nodes(false).await else {
            return Ok(());
        };
        let f = config::check(&nodes, self.opts.wait_replicas, self.opts.max_bytes);
        let mut all = f.problems.clone();
        all.extend(f.warnings.iter().cloned());
        {
            let mut logged = lock(&self.logged);
            if *logged != all {
                for w in &f.warnings {
                    eprintln!("mcp-ownership: WARNING: {w}");
                }
                *logged = all;
            }
        }
        if f.problems.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Misconfigured(f.problems.join("; ")))
        }
    }

    async fn stats_inner(&self) -> Result<StoreStats, StoreError> {
        let mut conn = self.conn("stats").await?;
        let sessions: u64 = redis::cmd("ZCARD")
            .arg(self.index_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("stats", e))?;
        let owners: u64 = redis::cmd("HLEN")
            .arg(self.owners_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("stats", e))?;
        let pending: u64 = redis::cmd("ZCARD")
            .arg(self.pending_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("stats", e))?;
        // The session cap refuses instead of evicting; Redis's own eviction is not ours.
        let evicted = 0;
        let reconnects = self.reconnects();
        if sessions == 0 {
            return Ok(StoreStats {
                evicted,
                reconnects,
                owners,
                pending,
                touch_refused: self.touch_refused.load(Ordering::Relaxed),
                ..StoreStats::default()
            });
        }
        let sample: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.index_key())
            .arg(0)
            .arg(STATS_SAMPLE.saturating_sub(1))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("stats", e))?;
        let cards: Vec<Placed> = sample
            .iter()
            .map(|s| {
                let base = self.session_base(s);
                let mut cmd = redis::cmd("ZCARD");
                cmd.arg(format!("{base}:n"));
                Placed { key: base, cmd }
            })
            .collect();
        let counts = self.exec("stats", &cards, false).await?;
        let counted: u64 = counts.iter().filter_map(as_u64).sum();
        let incarnations = if sample.is_empty() {
            0
        } else {
            // Exact up to STATS_SAMPLE sessions, extrapolated beyond.
            counted.saturating_mul(sessions) / sample.len() as u64
        };
        Ok(StoreStats {
            sessions,
            pending,
            touch_refused: self.touch_refused.load(Ordering::Relaxed),
            incarnations,
            bytes: 0,
            evicted,
            reconnects,
            owners,
        })
    }
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        if self.cluster {
            "redis-cluster"
        } else {
            "redis"
        }
    }

    async fn apply(&self, records: &[Record], now_ms: u64) -> Result<Applied, StoreError> {
        // A batch is one pipeline; a large one gets a little more time (records are not on
        // the resume path), never more than the bulk bound.
        let per_record = Duration::from_micros(50)
            .saturating_mul(u32::try_from(records.len()).unwrap_or(u32::MAX));
        let limit = (self.opts.op_timeout + per_record)
            .min(self.opts.bulk_timeout.max(self.opts.op_timeout));
        let r = self
            .bounded("apply", limit, self.apply_inner(records, now_ms))
            .await;
        if r.is_err() {
            // Records that may not have landed: unknown sessions may be theirs for a while.
            self.last_refused.store(now_ms, Ordering::Relaxed);
        }
        // Wake resumes waiting here for in-flight records (others poll: see resume.rs).
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
        r
    }

    async fn open_branch(
        &self,
        session: &str,
        incarnation: &str,
        registration: Option<&str>,
        now_ms: u64,
    ) -> Result<BranchOpen, StoreError> {
        self.bounded(
            "open_branch",
            self.opts.op_timeout,
            self.open_branch_inner(session, incarnation, registration, now_ms),
        )
        .await
    }

    async fn end_branch(
        &self,
        session: &str,
        incarnation: &str,
        branch: u64,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let ended = self.end_branch_inner(session, incarnation, branch, false, now_ms);
        let ended = self
            .bounded("end_branch", self.opts.op_timeout, ended)
            .await?;
        ended.ok_or_else(|| corrupt("branch", "end answered as waiting"))
    }

    async fn end_branch_settled(
        &self,
        session: &str,
        incarnation: &str,
        branch: u64,
        now_ms: u64,
    ) -> Result<Option<bool>, StoreError> {
        let ended = self.end_branch_inner(session, incarnation, branch, true, now_ms);
        self.bounded("end_branch", self.opts.op_timeout, ended)
            .await
    }

    async fn snapshot(&self, query: SnapshotQuery<'_>, now_ms: u64) -> Result<Facts, StoreError> {
        self.bounded(
            "snapshot",
            self.opts.op_timeout,
            self.snapshot_inner(query, now_ms),
        )
        .await
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn health(&self) -> Result<(), StoreError> {
        // A Cluster: every primary (all slots served); a replica down does not count.
        let r = self
            .bounded("ping", self.opts.op_timeout, async {
                let mut conn = self.conn("ping").await?;
                on_every_primary(&mut conn, redis::cmd("PING"))
                    .await
                    .map(|_| ())
                    .map_err(|e| self.fail("ping", e))
            })
            .await;
        if r.is_err() {
            // No primary answers, or not all: the Cluster is down or failing over.
            self.main.renew_cluster();
            if let Some(l) = &self.records {
                l.renew_cluster();
            }
            return r;
        }
        self.bounded("health", self.opts.op_timeout, self.check_config())
            .await
    }

    async fn stats(&self, _now_ms: u64) -> Result<StoreStats, StoreError> {
        self.bounded("stats", self.opts.bulk_timeout, self.stats_inner())
            .await
    }

    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.bounded("sweep", self.opts.bulk_timeout, self.sweep_inner(now_ms))
            .await
    }
}
