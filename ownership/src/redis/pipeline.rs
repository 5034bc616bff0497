//! Running a batch of commands: one pipeline per hash tag, NOSCRIPT answered by loading the
//! scripts, redirects followed command by command, and `WAIT` for durable records.
use std::collections::HashMap;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Value};

use super::connection::{ms, on_every_primary, pulsed, Conn};
use super::reply::as_u64;
use super::{unavailable, RedisStore};
use crate::store::StoreError;

/// One command and the key that places it: on a Cluster, commands whose keys share a hash
/// tag go in one pipeline, in order.
pub(super) struct Placed {
    pub(super) key: String,
    pub(super) cmd: Cmd,
}

/// The part of a key that picks its hash slot (Redis Cluster's rule).
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || e.to_string().contains("NOSCRIPT")
}

impl RedisStore {
    /// `SCRIPT LOAD` every script (on a Cluster: on every primary; a replica promoted later
    /// answers NOSCRIPT once and gets them then).
    async fn load_scripts(&self, conn: &mut Conn) -> Result<(), StoreError> {
        for s in [
            &self.apply,
            &self.snapshot,
            &self.sweep,
            &self.owner_gone,
            &self.branch,
        ] {
            let mut c = redis::cmd("SCRIPT");
            c.arg("LOAD").arg(&s.code);
            on_every_primary(conn, c)
                .await
                .map_err(|e| self.fail("script load", e))?;
        }
        Ok(())
    }

    /// Run `cmds` and return one reply per command, in order. One endpoint: one pipeline. A
    /// Cluster: one pipeline per hash tag, all at once. On NOSCRIPT (a new, restarted, flushed
    /// or just promoted node) the scripts are loaded and the commands run once more. Running
    /// a batch twice is harmless: records are idempotent upserts, the index ZADD is `GT`, and
    /// an `owner_gone` bumped twice still only makes its epoch differ from the one its
    /// incarnations opened in. `durable`: records, which wait for `wait_replicas` replicas.
    pub(super) async fn exec(
        &self,
        what: &str,
        cmds: &[Placed],
        durable: bool,
    ) -> Result<Vec<Value>, StoreError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let (link, wait) = match (&self.records, durable) {
            (Some(r), true) => (r, self.opts.wait_replicas),
            _ => (&self.main, 0),
        };
        let conn = link.get().await.map_err(|e| self.fail(what, e))?;
        if !self.cluster {
            let all: Vec<&Placed> = cmds.iter().collect();
            return self.exec_group(what, conn, &all, wait).await;
        }
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_tag: HashMap<&str, usize> = HashMap::new();
        for (i, c) in cmds.iter().enumerate() {
            let g = *by_tag.entry(hash_tag(&c.key)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            if let Some(members) = groups.get_mut(g) {
                members.push(i);
            }
        }
        let runs = groups.iter().map(|members| {
            let group: Vec<&Placed> = members.iter().filter_map(|&i| cmds.get(i)).collect();
            let conn = conn.clone();
            async move { self.exec_group(what, conn, &group, wait).await }
        });
        let replies = futures_util::future::try_join_all(runs).await?;
        let mut out = vec![Value::Nil; cmds.len()];
        for (members, values) in groups.iter().zip(replies) {
            for (&i, v) in members.iter().zip(values) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = v;
                }
            }
        }
        Ok(out)
    }

    /// One pipeline (commands of one hash tag on a Cluster), plus `WAIT` when `wait > 0`.
    async fn exec_group(
        &self,
        what: &str,
        mut conn: Conn,
        group: &[&Placed],
        wait: u32,
    ) -> Result<Vec<Value>, StoreError> {
        if self.cluster && group.len() == 1 {
            return self.exec_one_by_one(what, conn, group, wait).await;
        }
        let mut p = redis::pipe();
        for c in group {
            p.add_command(c.cmd.clone());
        }
        if wait > 0 {
            p.add_command(self.wait_cmd(wait));
        }
        let mut replies = match p.query_async::<Vec<Value>>(&mut conn).await {
            Ok(v) => v,
            Err(e) if self.cluster && (is_noscript(&e) || e.is_cluster_error()) => {
                // MOVED, ASK, TRYAGAIN, CLUSTERDOWN: the cluster client follows (and retries)
                // those for single commands only.
                return self.exec_one_by_one(what, conn, group, wait).await;
            }
            Err(e) if is_noscript(&e) => {
                self.load_scripts(&mut conn).await?;
                p.query_async::<Vec<Value>>(&mut conn)
                    .await
                    .map_err(|e| self.fail(what, e))?
            }
            Err(e) => return Err(self.fail(what, e)),
        };
        if wait > 0 {
            self.check_wait(what, replies.pop().as_ref(), wait)?;
        }
        Ok(replies)
    }

    /// The commands of one hash tag one at a time (a Cluster's redirects are followed per
    /// command), then `WAIT` on the primary of their slot.
    async fn exec_one_by_one(
        &self,
        what: &str,
        mut conn: Conn,
        group: &[&Placed],
        wait: u32,
    ) -> Result<Vec<Value>, StoreError> {
        let mut out = Vec::with_capacity(group.len());
        for c in group {
            let v = match c.cmd.query_async::<Value>(&mut conn).await {
                Ok(v) => v,
                Err(e) if is_noscript(&e) => {
                    self.load_scripts(&mut conn).await?;
                    c.cmd
                        .query_async::<Value>(&mut conn)
                        .await
                        .map_err(|e| self.fail(what, e))?
                }
                Err(e) => return Err(self.fail(what, e)),
            };
            out.push(v);
        }
        if let (true, Some(first)) = (wait > 0, group.first()) {
            let acked = match &mut conn {
                Conn::Cluster(k, pulse) => {
                    let route = Route::with_key(first.key.as_bytes(), SlotAddr::Master);
                    let routing =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    pulsed(
                        pulse,
                        Box::pin(k.route_command(self.wait_cmd(wait), routing)),
                    )
                    .await
                }
                Conn::Single(m) => self.wait_cmd(wait).query_async::<Value>(m).await,
            }
            .map_err(|e| self.fail(what, e))?;
            self.check_wait(what, Some(&acked), wait)?;
        }
        Ok(out)
    }

    fn wait_cmd(&self, replicas: u32) -> Cmd {
        let mut c = redis::cmd("WAIT");
        // Well within the operation's bound, so the answer says why (0 would mean forever).
        c.arg(replicas)
            .arg((ms(self.opts.op_timeout) * 2 / 3).max(1));
        c
    }

    fn check_wait(&self, what: &str, reply: Option<&Value>, wait: u32) -> Result<(), StoreError> {
        let acked = reply.and_then(as_u64).unwrap_or(0);
        if acked < u64::from(wait) {
            return Err(unavailable(
                what,
                format!(
                    "{acked} of {wait} replicas acknowledged within {} ms",
                    (ms(self.opts.op_timeout) * 2 / 3).max(1)
                ),
            ));
        }
        Ok(())
    }
}
