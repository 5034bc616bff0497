//! Freeing what outlived its TTL: idle sessions, pending ones, old owner epochs.
use std::collections::HashMap;

use super::pipeline::Placed;
use super::reply::{as_array, as_i64, as_u64};
use super::{corrupt, RedisStore, SWEEP_PAGE};
use crate::store::StoreError;

impl RedisStore {
    pub(super) fn sweep_cmd(&self, session: &str, now_ms: u64, ttl: u64, mode: &str) -> Placed {
        let base = self.session_base(session);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sweep.sha);
        self.session_keys(&mut cmd, &base, None);
        cmd.arg(&base).arg(now_ms).arg(ttl).arg(mode);
        Placed { key: base, cmd }
    }

    /// The score below which an opened session is idle past its TTL (`None`: none can be).
    pub(super) fn idle_cutoff(&self, now_ms: u64) -> Option<u64> {
        now_ms.checked_sub(self.limits.session_idle_ttl_ms.saturating_add(1))
    }

    pub(super) async fn sweep_inner(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut freed = 0;
        if let Some(cutoff) = self.idle_cutoff(now_ms) {
            freed += self
                .sweep_index(&self.index_key(), cutoff, "free", now_ms)
                .await?;
        }
        if let Some(cutoff) = now_ms.checked_sub(self.limits.pending_ttl_ms.saturating_add(1)) {
            self.sweep_index(&self.pending_key(), cutoff, "pending", now_ms)
                .await?;
        }
        self.expire_owner_epochs(now_ms).await?;
        Ok(freed)
    }

    /// Free the sessions of `index` scored at most `cutoff` that the sweep script (in `mode`)
    /// finds expired; returns how many.
    pub(super) async fn sweep_index(
        &self,
        index: &str,
        cutoff: u64,
        mode: &str,
        now_ms: u64,
    ) -> Result<usize, StoreError> {
        let ttl = if mode == "free" {
            self.limits.session_idle_ttl_ms
        } else {
            self.limits.pending_ttl_ms
        };
        let mut freed = 0;
        let mut conn = self.conn("sweep").await?;
        // A bounded number of pages per call: the next sweep goes on.
        for _ in 0..20 {
            let idle: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(index)
                .arg("-inf")
                .arg(cutoff)
                .arg("LIMIT")
                .arg(0)
                .arg(SWEEP_PAGE)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail("sweep", e))?;
            if idle.is_empty() {
                break;
            }
            let frees: Vec<Placed> = idle
                .iter()
                .map(|s| self.sweep_cmd(s, now_ms, ttl, mode))
                .collect();
            let replies = self.exec("sweep", &frees, false).await?;
            let mut gone = redis::cmd("ZREM");
            gone.arg(index);
            let mut alive = redis::cmd("ZADD");
            alive.arg(index).arg("GT");
            let (mut n_gone, mut n_alive) = (0, 0);
            for (s, r) in idle.iter().zip(replies) {
                let arr = as_array(r).ok_or_else(|| corrupt("sweep", "not an array"))?;
                match arr.first().and_then(as_i64) {
                    Some(0) => {
                        gone.arg(s);
                        n_gone += 1;
                    }
                    Some(1) => {
                        gone.arg(s);
                        n_gone += 1;
                        freed += 1;
                    }
                    Some(2) => {
                        // Touched by resumes since the index saw it: re-score it.
                        let lu = arr.get(1).and_then(as_u64).unwrap_or(now_ms);
                        alive.arg(lu).arg(s);
                        n_alive += 1;
                    }
                    other => return Err(corrupt("sweep", format!("code {other:?}"))),
                }
            }
            let mut p = redis::pipe();
            if n_gone > 0 {
                p.add_command(gone).ignore();
            }
            if n_alive > 0 {
                p.add_command(alive).ignore();
            }
            if n_gone + n_alive > 0 {
                p.query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| self.fail("sweep", e))?;
            }
            if idle.len() < SWEEP_PAGE {
                break;
            }
        }
        Ok(freed)
    }

    /// Forget owner epochs bumped more than 2 × keep ago. An incarnation they still make lost
    /// was marked lost by the first snapshot that saw it; one nobody resumed received no record
    /// from its gone owner either, so its keys expired after one keep.
    async fn expire_owner_epochs(&self, now_ms: u64) -> Result<(), StoreError> {
        let Some(cutoff) = now_ms.checked_sub(self.keep_ms().saturating_mul(2)) else {
            return Ok(());
        };
        let mut conn = self.conn("sweep").await?;
        let all: HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(self.owners_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("sweep", e))?;
        let old: Vec<&String> = all
            .iter()
            .filter(|(_, e)| **e < cutoff)
            .map(|(o, _)| o)
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        redis::cmd("HDEL")
            .arg(self.owners_key())
            .arg(&old)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.fail("sweep", e))
    }
}
