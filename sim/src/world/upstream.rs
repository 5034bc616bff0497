//! The replicas' side of the world: routing a forwarded request, the replica's answer, the events
//! it writes, its restarts.
use super::*;

impl World {
    pub(super) fn at_replica(&mut self, conn: usize) {
        if self.conns[conn].stage == Stage::Done {
            return;
        }
        let fwd = self.conns[conn].ps.fwd.clone();
        let session = text(header(&fwd, "mcp-session-id"));
        let pin = header(&fwd, &self.keyring_config.owner_header)
            .and_then(|v| STANDARD.decode(v).ok())
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let r = match &pin {
            Some(addr) => self.replicas.iter().position(|r| &r.addr == addr),
            None => match &session {
                Some(s) => self.homes.get(s).copied(),
                None => {
                    let c = self.conns[conn].cc.client;
                    Some(self.clients[c].rng.index(self.replicas.len()))
                }
            },
        };
        let Some(r) = r else {
            // Strict stateful_session: the pinned owner is not in the cluster.
            let c = &mut self.conns[conn];
            let at = c.up.due(self.net.now, c.latency);
            let headers = vec![(":status".to_owned(), b"503".to_vec())];
            self.net.at(
                at,
                Event::UpHeaders {
                    conn,
                    status: 503,
                    headers,
                    eos: true,
                },
            );
            return;
        };
        self.conns[conn].replica = Some(r);
        let method = text(header(&fwd, ":method")).unwrap_or_default();
        let lei = text(header(&fwd, "last-event-id"));
        let c = &self.conns[conn];
        let req = Request {
            method: &method,
            session: session.as_deref(),
            last_event_id: lei.as_deref(),
            call_id: c.call_id.as_deref(),
            draw: c.draw,
        };
        let uid = self.next_uid;
        let Some(reply) = self.replicas[r].handle(&req, conn, uid) else {
            return;
        };
        for e in reply.ended {
            self.up(e, Vec::new(), true);
        }
        if let Some(sid) = text(header(&reply.headers, "mcp-session-id")) {
            self.homes.insert(sid, r);
        }
        if reply.stream == Some(uid) {
            self.next_uid += 1;
            self.stream_home.insert(uid, r);
            let d = self.replicas[r].pace(uid);
            self.net.after(d, Event::Emit { replica: r, uid });
        }
        let c = &mut self.conns[conn];
        c.uid = reply.stream;
        let mut headers = vec![(":status".to_owned(), reply.status.to_string().into_bytes())];
        headers.extend(reply.headers);
        let at = c.up.due(self.net.now, c.latency);
        let eos = reply.eos && reply.body.is_empty();
        self.net.at(
            at,
            Event::UpHeaders {
                conn,
                status: reply.status,
                headers,
                eos,
            },
        );
        if !eos {
            self.up(conn, reply.body, reply.eos);
        }
    }

    pub(super) fn up(&mut self, conn: usize, bytes: Vec<u8>, eos: bool) {
        let c = &mut self.conns[conn];
        let at = c.up.due(self.net.now, c.latency);
        self.net.at(at, Event::UpBody { conn, bytes, eos });
    }

    pub(super) fn emit(&mut self, r: usize, uid: u64) {
        let Some((bytes, readers, done, written)) = self.replicas[r].emit(uid) else {
            return;
        };
        self.oracle.written(&written);
        for conn in readers {
            self.up(conn, bytes.clone(), done);
        }
        if !done {
            let d = self.replicas[r].pace(uid);
            self.net.after(d, Event::Emit { replica: r, uid });
        }
    }

    pub(super) fn restart(&mut self, r: usize) {
        for conn in self.replicas[r].restart() {
            self.up(conn, Vec::new(), true);
        }
        let d = self.faults.range(2_000, 10_000);
        self.net.after(d, Event::Restart(r));
    }

    pub(super) fn up_headers(&mut self, conn: usize, status: u32, headers: Headers, eos: bool) {
        let c = &mut self.conns[conn];
        if c.stage != Stage::Upstream {
            return;
        }
        c.stage = Stage::Responding;
        let g = c.ps.gw;
        let addr = c.replica.map(|r| self.replicas[r].addr.clone());
        let details = addr.is_none().then_some(OWNER_NOT_IN_CLUSTER);
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, addr.as_deref(), details);
        c.ps.resp = headers.clone();
        let mut action = Action::Continue;
        if c.ps.ex.wants_response_headers() {
            action =
                c.ps.ex
                    .on_response_headers(&mut gw.worker, &mut gw.host, Some(&headers), eos);
        } else {
            c.ps.ex
                .on_response_headers_unread(&mut gw.worker, &mut gw.host);
        }
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        if outs.iter().any(|o| matches!(o, Out::Local { .. })) {
            // The guard replaced the upstream's response.
            if let (Some(r), Some(uid)) = (c.replica, c.uid) {
                self.replicas[r].drop_reader(uid, conn);
            }
            self.outs(g, Some(conn), outs);
            return;
        }
        let resp: Headers =
            c.ps.resp
                .iter()
                .filter(|(k, _)| k != ":status")
                .cloned()
                .collect();
        if action == Action::Pause {
            // Held by the guard until the first replayed event (or the deadline).
            c.head = Some((status, resp));
        } else {
            self.deliver(
                conn,
                Delivery::Head {
                    status,
                    headers: resp,
                },
            );
        }
        self.outs(g, Some(conn), outs);
        if eos {
            self.deliver(conn, Delivery::End);
            self.finish_proxy(conn);
        }
    }

    pub(super) fn up_body(&mut self, conn: usize, bytes: Vec<u8>, eos: bool) {
        let c = &mut self.conns[conn];
        if c.stage != Stage::Responding {
            return;
        }
        let g = c.ps.gw;
        if !c.ps.ex.wants_body() {
            if !bytes.is_empty() {
                self.deliver(conn, Delivery::Body(bytes));
            }
            if eos {
                self.deliver(conn, Delivery::End);
                self.finish_proxy(conn);
            }
            return;
        }
        let addr = c.replica.map(|r| self.replicas[r].addr.clone());
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, addr.as_deref(), None);
        let action =
            c.ps.ex
                .on_response_body(&mut gw.worker, &mut gw.host, Some(&bytes), eos);
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        let ended = outs
            .iter()
            .any(|o| matches!(o, Out::Reset | Out::Finish(_) | Out::Local { .. }));
        // A pause while the headers are held keeps waiting for the next chunk; otherwise it
        // holds the end for the store's word.
        if action == Action::Pause && !c.ps.ex.holds_response_headers() {
            c.stage = Stage::Held;
        }
        self.outs(g, Some(conn), outs);
        if eos && !ended && action == Action::Continue {
            self.deliver(conn, Delivery::End);
            self.finish_proxy(conn);
        }
    }
}
