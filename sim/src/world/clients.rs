//! The client side of the world: what clients do, and what they make of what reaches them
//! (every dispatched event goes to the oracle).
use super::*;

impl World {
    pub(super) fn client_wake(&mut self, c: usize) {
        let next = self.clients[c].rng.range(20, 300);
        self.net.after(next, Event::ClientWake(c));
        self.check_settled(c);
        if self.violation.is_some() {
            return;
        }
        let now = self.net.now;
        // Reconnections that are due.
        for l in 0..self.clients[c].logicals.len() {
            let due = {
                let lg = &self.clients[c].logicals[l];
                lg.conn.is_none() && lg.wanted() && lg.retry_at.is_some_and(|t| t <= now)
            };
            if due {
                self.reconnect(c, l);
            }
        }
        if self.clients[c].session.is_none() {
            if !self.clients[c].initializing {
                self.clients[c].initializing = true;
                self.clients[c].calls += 1;
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{},"method":"initialize","params":{{}}}}"#,
                    self.clients[c].calls
                );
                let id = self.clients[c].calls.to_string();
                self.open(
                    c,
                    Purpose::Initialize,
                    "POST",
                    None,
                    body.into_bytes(),
                    Some(id),
                );
            }
            return;
        }
        let roll = self.clients[c].rng.below(100);
        let open_calls = self.clients[c]
            .logicals
            .iter()
            .filter(|l| matches!(&l.kind, Kind::Call(_)) && l.wanted())
            .count();
        let has_get = self.clients[c]
            .logicals
            .iter()
            .any(|l| matches!(l.kind, Kind::Get));
        match roll {
            0..=29 if open_calls < 2 => {
                self.stats.calls += 1;
                let call = self.clients[c].new_call(now);
                let body = call.body.clone().into_bytes();
                let id = call.raw_id.clone();
                self.clients[c]
                    .logicals
                    .push(Logical::new(Kind::Call(call)));
                let l = self.clients[c].logicals.len() - 1;
                self.log(c, Some(l), || format!("call #{l} id {id}"));
                self.open(
                    c,
                    Purpose::Stream {
                        logical: l,
                        resume: false,
                    },
                    "POST",
                    None,
                    body,
                    Some(id),
                );
            }
            30..=44 if !has_get => {
                self.clients[c].logicals.push(Logical::new(Kind::Get));
                let l = self.clients[c].logicals.len() - 1;
                self.open(
                    c,
                    Purpose::Stream {
                        logical: l,
                        resume: false,
                    },
                    "GET",
                    None,
                    Vec::new(),
                    None,
                );
            }
            45..=54 => self.drop_some(c, false),
            55..=57 => self.drop_some(c, true),
            58..=60 => self.resume_twice(c),
            61..=70 => {
                // Close a half-open connection at last.
                if let Some(conn) = self.clients[c].half_open.pop() {
                    let lat = self.conns[conn].latency;
                    self.net.after(lat, Event::ClientGone(conn));
                }
            }
            71..=80 if self.opts.attack && c != 0 => self.attack(c),
            _ => {}
        }
    }

    /// A stranger resumes with a cursor of client 0 (stolen) under its own session: it must
    /// be refused, and client 0 must never notice.
    pub(super) fn attack(&mut self, c: usize) {
        let stolen: Vec<String> = self.clients[0]
            .logicals
            .iter()
            .filter(|l| !l.last_id.is_empty())
            .map(|l| l.last_id.clone())
            .collect();
        if stolen.is_empty() {
            return;
        }
        let cursor = stolen[self.clients[c].rng.index(stolen.len())].clone();
        let mut lg = Logical::new(Kind::Get);
        // One attempt: the attacker does not reconnect.
        lg.dead = true;
        self.clients[c].logicals.push(lg);
        let l = self.clients[c].logicals.len() - 1;
        self.open(
            c,
            Purpose::Stream {
                logical: l,
                resume: true,
            },
            "GET",
            Some(cursor),
            Vec::new(),
            None,
        );
    }

    /// Drops a connection the client reads (closed, or left half-open); it will resume.
    pub(super) fn drop_some(&mut self, c: usize, half_open: bool) {
        let reading: Vec<usize> = self.clients[c]
            .logicals
            .iter()
            .enumerate()
            // Drops hit the bytes of an answer: a client waiting for headers waits (its own
            // request timeout is the SDK's, past the oracle's bound).
            .filter(|(_, l)| l.droppable() && l.conn.is_some_and(|k| self.conns[k].cc.status != 0))
            .map(|(i, _)| i)
            .collect();
        if reading.is_empty() {
            return;
        }
        let l = reading[self.clients[c].rng.index(reading.len())];
        self.leave(c, l, half_open);
    }

    pub(super) fn leave(&mut self, c: usize, l: usize, half_open: bool) {
        let Some(conn) = self.clients[c].logicals[l].conn.take() else {
            return;
        };
        self.conns[conn].cc.gone = true;
        self.log(c, Some(l), || {
            format!(
                "client leaves conn {conn} of #{l} ({})",
                if half_open { "half-open" } else { "closed" }
            )
        });
        if half_open {
            self.clients[c].half_open.push(conn);
        } else {
            let lat = self.conns[conn].latency;
            self.net.after(lat, Event::ClientGone(conn));
        }
        self.schedule_retry(c, l);
    }

    pub(super) fn schedule_retry(&mut self, c: usize, l: usize) {
        let (lo, hi) = match self.opts.reconnect_after_ms {
            0 => (50, 1000),
            ms => (ms, ms + 1000),
        };
        let delay = self.clients[c].rng.range(lo, hi);
        let at = self.net.now + delay;
        self.clients[c].logicals[l].retry_at = Some(at);
    }

    /// Resumes a stream it reads with the same cursor again (the first stays half-open). As
    /// with drops, only a connection that has its answer's headers: a client waiting for them
    /// waits (one that left every attempt before the guard's headers deadline could hear nothing).
    pub(super) fn resume_twice(&mut self, c: usize) {
        let pick: Vec<usize> = self.clients[c]
            .logicals
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                l.conn.is_some_and(|k| self.conns[k].cc.status != 0)
                    && !l.last_id.is_empty()
                    && l.wanted()
            })
            .map(|(i, _)| i)
            .collect();
        if pick.is_empty() {
            return;
        }
        let l = pick[self.clients[c].rng.index(pick.len())];
        self.leave(c, l, true);
        self.reconnect(c, l);
    }

    pub(super) fn reconnect(&mut self, c: usize, l: usize) {
        let lg = &mut self.clients[c].logicals[l];
        lg.retry_at = None;
        lg.retries += 1;
        if lg.retries > MAX_RETRIES {
            lg.dead = true;
            return;
        }
        let cursor = (!lg.last_id.is_empty()).then(|| lg.last_id.clone());
        let is_call = matches!(lg.kind, Kind::Call(_));
        if is_call && cursor.is_none() {
            // Nothing to resume from: the call cannot go on.
            lg.dead = true;
            let what = "a call's stream ended without a cursor; the call cannot be resumed";
            self.log(c, Some(l), || what.to_owned());
            return;
        }
        self.stats.resumes += u64::from(cursor.is_some());
        // Retries the client drops while their verdict is pending (issue 30, 4): sent before
        // this resume, which follows as a reconnection does (`--drop-pending`), or along with it, so
        // they may reach the service after it (`--drop-pending-race`). Drawn only when asked
        // for, so runs without them draw as before.
        if let Some(k) = &cursor {
            let (before, race) = (
                self.opts.drop_pending_per_mille,
                self.opts.drop_pending_race,
            );
            if before + race > 0 && self.clients[c].rng.chance(before + race) {
                for _ in 0..3 {
                    self.drop_pending(c, l, k.clone());
                }
                if self.clients[c].rng.below(before + race) < before {
                    self.clients[c].logicals[l].retries -= 1;
                    self.schedule_retry(c, l);
                    return;
                }
            }
        }
        // Invariant 3 needs the client to be the stream's only reader: no earlier connection
        // of this stream still open at the gateway.
        let others = self.clients[c].half_open.iter().any(|k| {
            let other = &self.conns[*k];
            other.stage != Stage::Done
                && matches!(other.cc.purpose, Purpose::Stream { logical, .. } if logical == l)
        });
        let must = cursor
            .as_deref()
            .is_some_and(|k| self.opts.check_continue && !others && self.valid_resume(k));
        let resume = cursor.is_some();
        let conn = self.open(
            c,
            Purpose::Stream { logical: l, resume },
            "GET",
            cursor,
            Vec::new(),
            None,
        );
        self.conns[conn].cc.must_continue = must;
        self.stats.must_continue += u64::from(must);
    }

    /// A retry of the resume with `cursor` that the client abandons a few ms after it reaches
    /// the gateway, while the guard still waits for the service's verdict (issue 30, 4): it
    /// must cost the real reader nothing.
    fn drop_pending(&mut self, c: usize, l: usize, cursor: String) {
        let purpose = Purpose::Stream {
            logical: l,
            resume: true,
        };
        let conn = self.open(c, purpose, "GET", Some(cursor), Vec::new(), None);
        self.clients[c].logicals[l].conn = None;
        self.conns[conn].cc.gone = true;
        // Drawn only when asked for, so runs without late drops draw as before.
        let late = self.opts.drop_late > 0 && self.clients[c].rng.chance(self.opts.drop_late);
        let after = if late {
            self.clients[c].rng.range(10, 80)
        } else {
            self.clients[c].rng.range(1, 4)
        };
        let gone = self.conns[conn].latency + after;
        self.log(c, Some(l), || {
            let when = if late {
                "maybe after its owner answered"
            } else {
                "before its verdict"
            };
            format!("client drops conn {conn} of #{l} {when}")
        });
        self.net.after(gone, Event::ClientGone(conn));
    }

    /// Invariant 3's preconditions for a resume with `cursor`: its owner is a correct replica
    /// that holds the stream, nobody reads it, and every record reached the store.
    pub(super) fn valid_resume(&self, cursor: &str) -> bool {
        let Ok(d) = self.keyring_config.keyring.decode(cursor) else {
            return false;
        };
        let Some(uid) = d
            .replica_event_id
            .as_deref()
            .and_then(|id| id.split_once('-'))
            .and_then(|(u, _)| u.parse::<u64>().ok())
        else {
            return false;
        };
        let Some(r) = self.stream_home.get(&uid).map(|r| &self.replicas[*r]) else {
            return false;
        };
        let settled = self.gateways.iter().all(|g| {
            g.worker.queued_records() == 0 && g.callouts.values().all(|w| *w != Waiter::Records)
        });
        r.serves_correctly(uid) && r.current(uid) && r.readers(uid) == 0 && settled
    }

    /// Opens a client connection; returns its index.
    pub(super) fn open(
        &mut self,
        c: usize,
        purpose: Purpose,
        method: &str,
        cursor: Option<String>,
        body: Vec<u8>,
        call_id: Option<String>,
    ) -> usize {
        let rng = &mut self.clients[c].rng;
        let gw = rng.index(self.gateways.len());
        let latency = rng.range(1, 20);
        let draw = rng.next_u64();
        let mut req: Headers = vec![
            (":method".into(), method.as_bytes().to_vec()),
            (":path".into(), b"/mcp".to_vec()),
            (
                "accept".into(),
                b"application/json, text/event-stream".to_vec(),
            ),
        ];
        if let Some(s) = &self.clients[c].session {
            req.push(("mcp-session-id".into(), s.as_bytes().to_vec()));
            req.push(("mcp-protocol-version".into(), b"2025-06-18".to_vec()));
        }
        if let Some(k) = &cursor {
            req.push(("last-event-id".into(), k.as_bytes().to_vec()));
        }
        // The client's event source keeps its last event id across connections (WHATWG): the
        // new connection's parser starts from it.
        let mut parser = Parser::new();
        if let Purpose::Stream { logical, .. } = purpose {
            let last = &self.clients[c].logicals[logical].last_id;
            if !last.is_empty() {
                parser.feed(format!("id: {last}\n\n").as_bytes(), &mut Vec::new());
            }
        }
        let conn = self.conns.len();
        let tag = match purpose {
            Purpose::Stream { logical, .. } => Some(logical),
            Purpose::Initialize => None,
        };
        self.log(c, tag, || {
            format!("conn {conn}: {method} {purpose:?} via gateway {gw} cursor {cursor:?}")
        });
        self.conns.push(Conn {
            cc: ClientConn {
                client: c,
                purpose,
                parser,
                sse: false,
                status: 0,
                gone: false,
                must_continue: false,
            },
            ps: ProxyStream {
                gw,
                ex: Exchange::new(),
                fwd: req.clone(),
                resp: Vec::new(),
            },
            stage: Stage::Request,
            req,
            body,
            call_id,
            draw,
            latency,
            up: Fifo::default(),
            down: Fifo::default(),
            replica: None,
            uid: None,
            head: None,
        });
        if let Purpose::Stream { logical, .. } = purpose {
            self.clients[c].logicals[logical].conn = Some(conn);
        }
        self.net.after(latency, Event::AtGateway(conn));
        conn
    }

    pub(super) fn check_settled(&mut self, c: usize) {
        let now = self.net.now;
        let bound = self.opts.bound_ms;
        let late = self.clients[c]
            .logicals
            .iter()
            .enumerate()
            .find_map(|(i, l)| match &l.kind {
                Kind::Call(call) if !call.settled && now.saturating_sub(call.started) > bound => {
                    Some((i, call.raw_id.clone()))
                }
                _ => None,
            });
        if let Some((l, id)) = late {
            self.violate(
                Invariant::Settles,
                c,
                l,
                format!("call id {id} has not settled within {bound} ms"),
            );
        }
    }

    pub(super) fn at_client(&mut self, conn: usize, d: Delivery) {
        let c = self.conns[conn].cc.client;
        if self.conns[conn].cc.gone {
            return;
        }
        let Purpose::Stream { logical: l, resume } = self.conns[conn].cc.purpose else {
            if let Delivery::Head { status, headers } = d {
                let sid = text(header(&headers, "mcp-session-id"));
                self.clients[c].initializing = false;
                if (200..300).contains(&status) {
                    self.clients[c].session = sid;
                }
                self.conns[conn].cc.gone = true;
            }
            return;
        };
        match d {
            Delivery::Head { status, headers } => self.head(c, conn, l, resume, status, &headers),
            Delivery::Body(bytes) => self.body(c, conn, l, bytes),
            Delivery::End => {
                self.log(c, Some(l), || format!("conn {conn} ended"));
                self.conns[conn].cc.gone = true;
                if self.clients[c].logicals[l].conn == Some(conn) {
                    self.clients[c].logicals[l].conn = None;
                    if self.clients[c].logicals[l].wanted() {
                        self.schedule_retry(c, l);
                    }
                }
            }
        }
    }

    pub(super) fn head(
        &mut self,
        c: usize,
        conn: usize,
        l: usize,
        resume: bool,
        status: u32,
        h: &Headers,
    ) {
        let signal = header(h, MCP_RESUME_HEADER).map(|v| String::from_utf8_lossy(v).into_owned());
        self.log(c, Some(l), || {
            format!("conn {conn}: {status} mcp-resume={signal:?}")
        });
        // As the SDK clients read an answer (docs/sse-model.md): neither parses a 4xx or 5xx
        // body; below that, any Content-Type instance naming an event stream makes it one.
        let sse = status < 400
            && h.iter().any(|(k, v)| {
                k.eq_ignore_ascii_case("content-type")
                    && String::from_utf8_lossy(v)
                        .to_ascii_lowercase()
                        .contains("text/event-stream")
            });
        self.conns[conn].cc.sse = sse;
        self.conns[conn].cc.status = status;
        let outcome = format!("#{l} {status} signal={}", signal.is_some());
        self.clients[c].note(self.net.now, outcome);
        if signal.is_some() {
            self.stats.signals += 1;
            self.clients[c].logicals[l].expect.signal();
        } else if resume && status == 200 {
            self.stats.continued += 1;
        }
        if self.conns[conn].cc.must_continue && (signal.is_some() || status != 200) {
            self.violate(
                Invariant::Continues,
                c,
                l,
                format!("a valid resume was answered {status}, mcp-resume {signal:?}"),
            );
            return;
        }
        let ok = (200..300).contains(&status);
        let lg = &mut self.clients[c].logicals[l];
        if let Kind::Call(call) = &mut lg.kind {
            if !ok {
                if !resume || signal.is_some() {
                    // The SDK rejects the call with the HTTP error (or the guard's named refusal).
                    call.settled = true;
                } else {
                    // A failed resume the SDK cannot attach to the call: it stays pending.
                    lg.dead = true;
                }
            }
        }
    }

    pub(super) fn body(&mut self, c: usize, conn: usize, l: usize, mut bytes: Vec<u8>) {
        if !self.conns[conn].cc.sse {
            return;
        }
        // Drop at any byte: the client reads a prefix and goes.
        let drop = self.clients[c].logicals[l].conn == Some(conn)
            && self.clients[c].logicals[l].droppable()
            && self.clients[c].rng.chance(self.opts.drop_per_mille);
        if drop {
            let keep = self.clients[c].rng.index(bytes.len() + 1);
            bytes.truncate(keep);
        }
        let mut out = Vec::new();
        self.conns[conn].cc.parser.feed(&bytes, &mut out);
        for d in out {
            self.dispatched(c, conn, l, &d);
            if self.violation.is_some() {
                return;
            }
        }
        let after = self.conns[conn].cc.parser.last_event_id().to_owned();
        if after != self.clients[c].logicals[l].last_id
            && self.clients[c].logicals[l].conn == Some(conn)
        {
            if !after.is_empty() && self.keyring_config.keyring.decode(&after).is_err() {
                self.violate(
                    Invariant::Cursor,
                    c,
                    l,
                    format!("the client holds the id {after:?}, which is not a cursor"),
                );
                return;
            }
            self.clients[c].logicals[l].last_id = after;
        }
        if drop {
            self.leave(c, l, false);
        }
    }

    pub(super) fn dispatched(
        &mut self,
        c: usize,
        conn: usize,
        l: usize,
        d: &mcp_resume_core::eventsource::Dispatch,
    ) {
        let seen = read(d);
        let session = self.clients[c].session.clone().unwrap_or_default();
        let must = self.conns[conn].cc.must_continue;
        match seen {
            Seen::Signal => {
                self.log(c, Some(l), || format!("conn {conn}: signal {}", d.data));
                self.clients[c].note(self.net.now, format!("#{l} signal {}", d.data));
                self.clients[c].logicals[l].expect.signal();
                if must {
                    self.violate(
                        Invariant::Continues,
                        c,
                        l,
                        format!("a valid resume was refused: {}", d.data),
                    );
                }
            }
            Seen::Error { id } => {
                let lg = &mut self.clients[c].logicals[l];
                if let Kind::Call(call) = &mut lg.kind {
                    if id == call.id {
                        call.settled = true;
                        self.stats.settled += 1;
                        lg.expect.signal();
                        self.clients[c].note(self.net.now, format!("#{l} settled by error"));
                    } else {
                        let what = format!(
                            "the call's stream answered an error for id {id}, the call's id is {}: it stays pending",
                            call.raw_id
                        );
                        self.violate(Invariant::Settles, c, l, what);
                    }
                }
            }
            Seen::Entry {
                session: s,
                uid,
                index,
                result,
            } => {
                self.log(c, Some(l), || {
                    format!("conn {conn}: dispatch stream {uid} #{index}")
                });
                // The resume continued: what ends its stream later is judged by invariants 1, 2.
                self.conns[conn].cc.must_continue = false;
                let mut expect = self.clients[c].logicals[l].expect;
                if let Err(what) = self.oracle.entry(&session, &mut expect, (&s, uid, index)) {
                    self.violate(Invariant::NextEvent, c, l, what);
                    return;
                }
                let name = self.clients[c].name(format!("u{uid}"));
                self.clients[c].note(self.net.now, format!("#{l} event {name}/{index}"));
                self.stats.events += 1;
                let lg = &mut self.clients[c].logicals[l];
                lg.expect = expect;
                if let (Kind::Call(call), Some(id)) = (&mut lg.kind, result) {
                    if id == call.id {
                        call.settled = true;
                        self.stats.settled += 1;
                    }
                }
            }
            Seen::Other => {}
        }
    }
}
