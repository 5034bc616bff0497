//! The facts for one verdict: the session script's reply, then the owner's epoch now.
use std::sync::atomic::Ordering;

use mcp_resume_core::decision::{IncarnationFacts, SessionState};
use mcp_resume_core::ownership::StreamKind;

use super::pipeline::Placed;
use super::reply::{as_array, as_i64, as_string, as_u64};
use super::{corrupt, RedisStore};
use crate::store::{CursorId, Facts, IncarnationView, SnapshotQuery, StoreError};

impl RedisStore {
    pub(super) async fn snapshot_inner(
        &self,
        q: SnapshotQuery<'_>,
        now_ms: u64,
    ) -> Result<Facts, StoreError> {
        let base = self.session_base(q.session);
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.snapshot.sha);
        self.session_keys(&mut c, &base, Some(q.incarnation));
        c.arg(&base)
            .arg(now_ms)
            .arg(self.limits.session_idle_ttl_ms)
            .arg(q.incarnation)
            .arg(q.seq)
            .arg(q.max_expected)
            .arg(self.limits.max_window)
            .arg(self.keep_ms())
            .arg(self.limits.owner_failure_window_ms);
        let reply = self
            .exec(
                "snapshot",
                &[Placed {
                    key: base.clone(),
                    cmd: c,
                }],
                false,
            )
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| corrupt("snapshot", "empty reply"))?;
        let arr = as_array(reply).ok_or_else(|| corrupt("snapshot", "not an array"))?;
        let mut code = arr.first().and_then(as_i64);
        if let Some(c @ 11..=13) = code {
            // The lookup's last-used write was refused (Redis full): answered read-only.
            self.touch_refused.fetch_add(1, Ordering::Relaxed);
            code = Some(c - 10);
        }
        let session = match code {
            // Half-missing: part of the session's keys are gone. Lost, never fresh.
            Some(4) => {
                return Ok(Facts {
                    refusing: true,
                    ..Facts::default()
                })
            }
            Some(0) => {
                return Ok(Facts {
                    refusing: self.refusing(now_ms).await?,
                    ..Facts::default()
                })
            }
            Some(1) => SessionState::Active,
            Some(2) => SessionState::Terminated,
            Some(3) => SessionState::Expired,
            other => return Err(corrupt("snapshot", format!("session code {other:?}"))),
        };
        if arr.len() == 1 {
            return Ok(Facts {
                session: Some(session),
                incarnation: None,
                refusing: self.refusing(now_ms).await?,
            });
        }
        if arr.len() < 13 {
            return Err(corrupt("snapshot", format!("{} fields", arr.len())));
        }
        let bad = |f: &str| corrupt("snapshot", format!("field {f}"));
        let kind = match as_string(&arr[1]).as_deref() {
            Some("g") => StreamKind::Get,
            Some("r") => StreamKind::Request,
            _ => return Err(bad("kind")),
        };
        let owner = as_string(&arr[2]).ok_or_else(|| bad("owner"))?;
        let opened_epoch = as_u64(&arr[3]).ok_or_else(|| bad("epoch"))?;
        let lost = as_i64(&arr[4]).ok_or_else(|| bad("lost"))? == 1;
        let superseded = as_i64(&arr[5]).ok_or_else(|| bad("superseded"))? == 1;
        let head = as_u64(&arr[6]).ok_or_else(|| bad("head"))?;
        let retention = as_u64(&arr[7]).ok_or_else(|| bad("retention"))?;
        let retained_from = as_u64(&arr[8]).ok_or_else(|| bad("retained_from"))?;
        let cursor_id = match as_i64(&arr[9]) {
            Some(0) => CursorId::Plain,
            Some(1) => CursorId::Long(as_string(&arr[10]).ok_or_else(|| bad("resume_id"))?),
            Some(2) => CursorId::LongMissing,
            _ => return Err(bad("cursor_id")),
        };
        let request_id = as_string(&arr[11])
            .ok_or_else(|| bad("request_id"))
            .map(|r| (!r.is_empty()).then_some(r))?;
        let trimmed_below = as_u64(&arr[12]).ok_or_else(|| bad("trimmed_below"))?;
        let expected = arr[13..]
            .iter()
            .map(|v| as_string(v).ok_or_else(|| bad("expected")))
            .collect::<Result<Vec<_>, _>>()?;
        // The owner's epoch now: read after the session script (see the module docs).
        let owner_lost = if lost {
            true
        } else {
            let mut conn = self.conn("snapshot").await?;
            let now_epoch: Option<u64> = redis::cmd("HGET")
                .arg(self.owners_key())
                .arg(&owner)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail("snapshot", e))?;
            let gone = now_epoch.unwrap_or(0) > opened_epoch;
            if gone {
                // Lost for good: the owner's epoch may be forgotten later (sweep).
                let _: Result<(), _> = redis::cmd("HSET")
                    .arg(format!("{base}:i:{}", q.incarnation))
                    .arg("l")
                    .arg("1")
                    .query_async(&mut conn)
                    .await;
            }
            gone
        };
        Ok(Facts {
            session: Some(session),
            incarnation: Some(IncarnationView {
                facts: IncarnationFacts {
                    kind,
                    owner_lost,
                    superseded,
                    head,
                    retention,
                    retained_from,
                },
                owner,
                expected,
                cursor_id,
                request_id,
                trimmed_below,
            }),
            refusing: false,
        })
    }

    /// Did this instance, or any other (the shared mark), have a write refused or failed
    /// within the idle TTL?
    async fn refusing(&self, now_ms: u64) -> Result<bool, StoreError> {
        let last = self.last_refused.load(Ordering::Relaxed);
        if last != 0 && now_ms.saturating_sub(last) <= self.limits.session_idle_ttl_ms {
            return Ok(true);
        }
        let mut conn = self.conn("snapshot").await?;
        let mark: Option<u64> = redis::cmd("GET")
            .arg(self.refused_key())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail("snapshot", e))?;
        Ok(mark.is_some())
    }
}
