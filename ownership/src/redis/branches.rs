//! A continuation's branch (docs/forks.md): numbered, and ended, by one script over the
//! incarnation's branch table.
use super::pipeline::Placed;
use super::reply::as_i64;
use super::{corrupt, RedisStore};
use crate::store::{BranchOpen, StoreError, BRANCHES_KEPT};

/// What the `open` script answers for an incarnation that is not opened.
const NOT_OPENED: i64 = -1;
/// What the `open` script answers when Redis refused the write (maxmemory).
const REFUSED: i64 = -2;
/// What the `open` script answers when the table was lost apart from its incarnation.
const TABLE_LOST: i64 = -3;
/// What the `settle` script answers while the end's answer would be `forked` (it waits).
const UNSETTLED: i64 = 2;

impl RedisStore {
    /// One run of the branch script for (session, incarnation) in `mode` (`open`, `end`, `settle`).
    async fn branch_run(
        &self,
        session: &str,
        incarnation: &str,
        mode: &str,
        branch: u64,
        registration: Option<&str>,
        now_ms: u64,
    ) -> Result<i64, StoreError> {
        let base = self.session_base(session);
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.branch.sha);
        self.session_keys(&mut c, &base, Some(incarnation));
        c.arg(&base)
            .arg(now_ms)
            .arg(self.limits.session_idle_ttl_ms)
            .arg(mode)
            .arg(incarnation)
            .arg(branch)
            .arg(self.keep_ms())
            .arg(BRANCHES_KEPT)
            .arg(registration.unwrap_or(""));
        // Waited on by replicas like records: the table shares its incarnation's durability.
        let reply = self
            .exec("branch", &[Placed { key: base, cmd: c }], true)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| corrupt("branch", "empty reply"))?;
        as_i64(&reply).ok_or_else(|| corrupt("branch", format!("reply {reply:?}")))
    }

    pub(super) async fn open_branch_inner(
        &self,
        session: &str,
        incarnation: &str,
        registration: Option<&str>,
        now_ms: u64,
    ) -> Result<BranchOpen, StoreError> {
        match self
            .branch_run(session, incarnation, "open", 0, registration, now_ms)
            .await?
        {
            NOT_OPENED | REFUSED => Ok(BranchOpen::Unregistered),
            TABLE_LOST => Ok(BranchOpen::Lost),
            n => u64::try_from(n)
                .map(BranchOpen::Numbered)
                .map_err(|_| corrupt("branch", format!("number {n}"))),
        }
    }

    /// `settle`: `None` (the branch ended, not cut) while the answer would be `forked` (the
    /// rivals' word may be in flight).
    pub(super) async fn end_branch_inner(
        &self,
        session: &str,
        incarnation: &str,
        branch: u64,
        settle: bool,
        now_ms: u64,
    ) -> Result<Option<bool>, StoreError> {
        let mode = if settle { "settle" } else { "end" };
        match self
            .branch_run(session, incarnation, mode, branch, None, now_ms)
            .await?
        {
            0 => Ok(Some(false)),
            1 => Ok(Some(true)),
            UNSETTLED if settle => Ok(None),
            n => Err(corrupt("branch", format!("end answer {n}"))),
        }
    }
}
