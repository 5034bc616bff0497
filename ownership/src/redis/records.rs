//! Applying records: one script per session record, owner epochs read before the StreamOpens
//! that need them, room for new sessions made or refused, and the session indexes after.
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use mcp_resume_core::ownership::{
    Record, SessionEnd, StreamKind, LONG_IDS_KEPT, REJECTED_FORKED, REJECTED_MISMATCH,
};
use redis::Cmd;

use super::config;
use super::pipeline::Placed;
use super::reply::{as_string, as_u64};
use super::{corrupt, RedisStore, SWEEP_PAGE};
use crate::store::{Applied, Refusal, StoreError, HIGH_WATER_PERCENT, STORE_FULL};

impl RedisStore {
    /// `EVALSHA apply` for one record (OwnerGone is not a session record: `None`). `admit`:
    /// a `session_open` may open a new session (room was made for it).
    fn apply_cmd(
        &self,
        r: &Record,
        now_ms: u64,
        epochs: &HashMap<String, u64>,
        admit: bool,
    ) -> Option<Placed> {
        let (session, incarnation) = match r {
            Record::SessionOpen { session, .. } | Record::SessionEnd { session, .. } => {
                (session, None)
            }
            Record::StreamOpen {
                session,
                incarnation,
                ..
            }
            | Record::Events {
                session,
                incarnation,
                ..
            }
            | Record::StreamLost {
                session,
                incarnation,
                ..
            }
            | Record::OwnerFailed {
                session,
                incarnation,
            }
            | Record::BranchEnd {
                session,
                incarnation,
                ..
            }
            | Record::Abandoned {
                session,
                incarnation,
                ..
            } => (session, Some(incarnation.as_str())),
            Record::OwnerGone { .. } => return None,
        };
        let base = self.session_base(session);
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.apply.sha);
        self.session_keys(&mut c, &base, incarnation);
        c.arg(&base)
            .arg(now_ms)
            .arg(self.limits.session_idle_ttl_ms)
            .arg(self.limits.max_window)
            .arg(self.limits.max_incarnations_per_session)
            .arg(self.keep_ms())
            .arg(self.limits.pending_ttl_ms);
        match r {
            Record::SessionOpen { version, .. } => {
                c.arg("so").arg(version).arg(if admit { "1" } else { "0" });
            }
            Record::SessionEnd { why, .. } => {
                c.arg("se").arg(match why {
                    SessionEnd::Terminated => "t",
                    SessionEnd::Expired => "e",
                });
            }
            Record::StreamOpen {
                incarnation,
                kind,
                owner,
                retention,
                supersedes,
                opened_ms,
                request_id,
                ..
            } => {
                c.arg("st")
                    .arg(incarnation)
                    .arg(kind_code(*kind))
                    .arg(owner)
                    .arg(epochs.get(owner).copied().unwrap_or(0))
                    .arg(retention)
                    .arg(if *supersedes { "1" } else { "0" })
                    .arg(opened_ms)
                    // '' (never valid JSON): none.
                    .arg(request_id.as_deref().unwrap_or(""));
            }
            Record::Events {
                incarnation,
                first_seq,
                ids,
                long,
                branch,
                trimmed,
                ..
            } => {
                c.arg("ev")
                    .arg(incarnation)
                    .arg(first_seq)
                    .arg(LONG_IDS_KEPT)
                    .arg(branch)
                    .arg(long.len())
                    .arg(trimmed)
                    .arg(self.limits.max_session_events);
                for l in long {
                    c.arg(l.seq).arg(l.id.as_bytes());
                }
                for id in ids {
                    c.arg(id.as_bytes());
                }
            }
            Record::StreamLost { incarnation, .. } => {
                c.arg("sl").arg(incarnation);
            }
            Record::OwnerFailed { incarnation, .. } => {
                c.arg("of").arg(incarnation);
            }
            Record::BranchEnd {
                incarnation,
                branch,
                ..
            } => {
                c.arg("be").arg(incarnation).arg(branch);
            }
            Record::Abandoned {
                incarnation,
                registration,
                ..
            } => {
                c.arg("ab").arg(incarnation).arg(registration);
            }
            Record::OwnerGone { .. } => return None,
        }
        Some(Placed { key: base, cmd: c })
    }

    /// Apply records in order: session records are pipelined (one round trip per run of them),
    /// an OwnerGone closes the run, so StreamOpens after it see the new epoch.
    pub(super) async fn apply_inner(
        &self,
        records: &[Record],
        now_ms: u64,
    ) -> Result<Applied, StoreError> {
        let mut out = Applied::default();
        let mut start = 0;
        while start < records.len() {
            let end = records[start..]
                .iter()
                .position(|r| matches!(r, Record::OwnerGone { .. }))
                .map_or(records.len(), |i| start + i + 1);
            self.apply_run(&records[start..end], start, now_ms, &mut out)
                .await?;
            start = end;
        }
        Ok(out)
    }

    async fn apply_run(
        &self,
        run: &[Record],
        offset: usize,
        now_ms: u64,
        out: &mut Applied,
    ) -> Result<(), StoreError> {
        // Owner epochs for the StreamOpens of this run, read before them.
        let mut owners: Vec<&str> = run
            .iter()
            .filter_map(|r| match r {
                Record::StreamOpen { owner, .. } => Some(owner.as_str()),
                _ => None,
            })
            .collect();
        owners.sort_unstable();
        owners.dedup();
        let mut epochs = HashMap::new();
        if !owners.is_empty() {
            let mut conn = self.conn("apply").await?;
            let got: Vec<Option<u64>> = redis::cmd("HMGET")
                .arg(self.owners_key())
                .arg(&owners)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail("apply", e))?;
            for (o, e) in owners.iter().zip(got) {
                epochs.insert((*o).to_owned(), e.unwrap_or(0));
            }
        }
        let opens = run
            .iter()
            .filter(|r| matches!(r, Record::SessionOpen { .. }))
            .count();
        let (mut room, full) = if opens > 0 {
            self.room(opens, now_ms).await?
        } else {
            (0, String::new())
        };
        // At the byte budget a session's growth is refused, as the memory store does at its
        // cap (INFO read at most once a second: an estimate, like the budget itself).
        let at_budget = if run.iter().any(grows) {
            self.at_budget().await
        } else {
            None
        };
        let mut refused = false;
        let mut cmds = Vec::with_capacity(run.len());
        // The position in `run` of each command.
        let mut placed = Vec::with_capacity(run.len());
        for (i, r) in run.iter().enumerate() {
            if let (Some((used, budget)), true) = (at_budget, grows(r)) {
                refused = true;
                out.refused.push(Refusal {
                    index: offset + i,
                    error: STORE_FULL,
                    detail: format!(
                        "Redis holds {used} bytes, at most {budget} (--redis-max-bytes) with \
                         every session active within the idle TTL: this session's growth is \
                         refused"
                    ),
                });
                continue;
            }
            if let Record::OwnerGone { owner } = r {
                let mut c = redis::cmd("EVALSHA");
                c.arg(&self.owner_gone.sha)
                    .arg(1)
                    .arg(self.owners_key())
                    .arg(owner)
                    .arg(now_ms);
                cmds.push(Placed {
                    key: self.owners_key(),
                    cmd: c,
                });
                placed.push(i);
                continue;
            }
            // Room is handed out in batch order; a session already open takes none in the
            // script, so at worst a batch refuses one it had room for (it is never over).
            let admit = matches!(r, Record::SessionOpen { .. }) && room > 0;
            room -= usize::from(admit);
            if let Some(c) = self.apply_cmd(r, now_ms, &epochs, admit) {
                cmds.push(c);
                placed.push(i);
            }
        }
        let replies = self.exec("apply", &cmds, true).await?;
        let (mut opened, mut promoted, mut pending) = (Vec::new(), Vec::new(), Vec::new());
        for (&i, v) in placed.iter().zip(&replies) {
            let Some(session) = run.get(i).and_then(session_of) else {
                continue;
            };
            let reply = as_string(v);
            // `events` the arbiter refused: "<a|p> <rejection>" (the session was written to).
            let (code, rejection) = match reply.as_deref().map(|r| r.split_once(' ')) {
                Some(Some((code, why))) => (Some(code), Some(why)),
                _ => (reply.as_deref(), None),
            };
            if let Some(why) = rejection {
                let (error, detail) = match why {
                    REJECTED_FORKED => (
                        REJECTED_FORKED,
                        "the branch was overtaken by a newer one".to_owned(),
                    ),
                    REJECTED_MISMATCH => (
                        REJECTED_MISMATCH,
                        "a seq is recorded with another event: the replica diverged, the \
                         incarnation is lost"
                            .to_owned(),
                    ),
                    "table_lost" => (
                        REJECTED_MISMATCH,
                        "the incarnation's branch table was lost (evicted or failed over): \
                         the incarnation is lost"
                            .to_owned(),
                    ),
                    other => return Err(corrupt("apply", format!("record reply {other:?}"))),
                };
                out.refused.push(Refusal {
                    index: offset + i,
                    error,
                    detail,
                });
            }
            match code {
                // Nothing written (branch_end).
                Some("n") => {}
                Some("a" | "k") => opened.push(session),
                Some("o") => {
                    opened.push(session);
                    promoted.push(session);
                }
                Some("p") => pending.push(session),
                Some("f") => {
                    refused = true;
                    out.refused.push(Refusal {
                        index: offset + i,
                        error: STORE_FULL,
                        detail: full.clone(),
                    });
                }
                other => return Err(corrupt("apply", format!("record reply {other:?}"))),
            }
        }
        self.update_indexes(&opened, &promoted, &pending, refused, now_ms)
            .await
    }

    /// The session and pending indexes after a run (and the refusal mark): the sweep's and
    /// the caps' view. Not waited on by replicas: an index a failover loses is rebuilt by
    /// the next write of each session, and the sweep drops what it no longer finds.
    async fn update_indexes(
        &self,
        opened: &[&str],
        promoted: &[&str],
        pending: &[&str],
        refused: bool,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut cmds = Vec::new();
        let mut add = |cmd: Cmd, key: String| cmds.push(Placed { key, cmd });
        if !opened.is_empty() {
            // Last write per session (GT: never moves back).
            let mut z = redis::cmd("ZADD");
            z.arg(self.index_key()).arg("GT");
            for s in opened {
                z.arg(now_ms).arg(*s);
            }
            add(z, self.index_key());
        }
        if !promoted.is_empty() {
            let mut z = redis::cmd("ZREM");
            z.arg(self.pending_key()).arg(promoted);
            add(z, self.pending_key());
        }
        if !pending.is_empty() {
            // When it appeared (NX: a pending session's TTL runs from its first record).
            let mut z = redis::cmd("ZADD");
            z.arg(self.pending_key()).arg("NX");
            for s in pending {
                z.arg(now_ms).arg(*s);
            }
            add(z, self.pending_key());
            let mut n = redis::cmd("ZCARD");
            n.arg(self.pending_key());
            add(n, self.pending_key());
        }
        if refused {
            self.last_refused.store(now_ms, Ordering::Relaxed);
            let mut c = redis::cmd("SET");
            c.arg(self.refused_key())
                .arg(now_ms)
                .arg("PX")
                .arg(self.limits.session_idle_ttl_ms.max(1));
            add(c, self.refused_key());
        }
        if cmds.is_empty() {
            return Ok(());
        }
        let count_at = (!pending.is_empty()).then(|| cmds.len() - 1 - usize::from(refused));
        let replies = self.exec("apply", &cmds, false).await?;
        let count = count_at
            .and_then(|i| replies.get(i))
            .and_then(as_u64)
            .unwrap_or(0);
        let max = self.limits.max_pending_sessions.max(1) as u64;
        if count > max {
            self.evict_pending(count - max, now_ms).await?;
        }
        Ok(())
    }

    /// Room for `wanted` new sessions, and the detail of a refusal. Sessions idle past their
    /// TTL are freed first; a session active within the TTL never is.
    async fn room(&self, wanted: usize, now_ms: u64) -> Result<(usize, String), StoreError> {
        let max = self.limits.max_sessions.max(1) as u64;
        let mut count = self.session_count().await?;
        if count.saturating_add(wanted as u64) > max {
            if let Some(cutoff) = self.idle_cutoff(now_ms) {
                self.sweep_index(&self.index_key(), cutoff, "free", now_ms)
                    .await?;
                count = self.session_count().await?;
            }
        }
        let room = usize::try_from(max.saturating_sub(count)).unwrap_or(usize::MAX);
        if let Some((used, budget)) = self.over_budget(false).await {
            // Freeing idle sessions may be enough; read the memory again after it.
            if let Some(cutoff) = self.idle_cutoff(now_ms) {
                self.sweep_index(&self.index_key(), cutoff, "free", now_ms)
                    .await?;
            }
            if self.over_budget(true).await.is_some() {
                return Ok((
                    0,
                    format!(
                        "Redis holds {used} bytes, new sessions are refused above \
                         {HIGH_WATER_PERCENT}% of the {budget}-byte budget \
                         (--redis-max-bytes, default 80% of maxmemory)"
                    ),
                ));
            }
        }
        Ok((
            room,
            format!("{count} sessions active within the idle TTL, at most {max} (--max-sessions)"),
        ))
    }

    /// The fullest primary at or past its whole byte budget: (used, budget).
    async fn at_budget(&self) -> Option<(u64, u64)> {
        let nodes = self.nodes(false).await.ok()?;
        config::over_budget(&nodes, self.opts.max_bytes, 100)
    }

    /// The fullest primary above the high water mark of its byte budget: (used, budget).
    /// Unknown (INFO refused or failing): not over, the session cap still holds.
    async fn over_budget(&self, fresh: bool) -> Option<(u64, u64)> {
        let nodes = self.nodes(fresh).await.ok()?;
        config::over_budget(&nodes, self.opts.max_bytes, HIGH_WATER_PERCENT as u64)
    }

    async fn session_count(&self) -> Result<u64, StoreError> {
        let mut conn = self.conn("apply").await?;
        redis::cmd("ZCARD")
            .arg(self.index_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("apply", e))
    }

    /// The pending cap: drop the `excess` oldest pending sessions.
    async fn evict_pending(&self, excess: u64, now_ms: u64) -> Result<(), StoreError> {
        let want = usize::try_from(excess)
            .unwrap_or(usize::MAX)
            .min(SWEEP_PAGE);
        let mut conn = self.conn("apply").await?;
        let oldest: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.pending_key())
            .arg(0)
            .arg(want.saturating_sub(1))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("apply", e))?;
        if oldest.is_empty() {
            return Ok(());
        }
        let mut cmds: Vec<Placed> = oldest
            .iter()
            .map(|s| self.sweep_cmd(s, now_ms, 0, "evict_pending"))
            .collect();
        let mut gone = redis::cmd("ZREM");
        gone.arg(self.pending_key()).arg(&oldest);
        cmds.push(Placed {
            key: self.pending_key(),
            cmd: gone,
        });
        self.exec("apply", &cmds, false).await?;
        Ok(())
    }
}

/// Does `r` grow a session (refused at the byte budget)?
fn grows(r: &Record) -> bool {
    match r {
        Record::Events { ids, .. } => !ids.is_empty(),
        Record::StreamOpen { .. } => true,
        _ => false,
    }
}

/// The session a record writes to (OwnerGone writes none).
fn session_of(r: &Record) -> Option<&str> {
    match r {
        Record::SessionOpen { session, .. }
        | Record::SessionEnd { session, .. }
        | Record::StreamOpen { session, .. }
        | Record::Events { session, .. }
        | Record::StreamLost { session, .. }
        | Record::OwnerFailed { session, .. }
        | Record::BranchEnd { session, .. }
        | Record::Abandoned { session, .. } => Some(session),
        Record::OwnerGone { .. } => None,
    }
}

fn kind_code(k: StreamKind) -> &'static str {
    match k {
        StreamKind::Get => "g",
        StreamKind::Request => "r",
    }
}
