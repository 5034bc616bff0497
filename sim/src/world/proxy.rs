//! The gateways' side of the world: requests and answers through the guard's exchange, callouts
//! to the ownership service, and the service itself.
use super::*;

impl World {
    pub(super) fn tick(&mut self, g: usize) {
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, None, None);
        gw.worker.on_tick(&mut gw.host);
        let every = gw.worker.tick_ms();
        let outs = gw.effects(Waiter::Records, None);
        self.outs(g, None, outs);
        self.net.after(every.max(1), Event::Tick(g));
    }

    pub(super) fn at_gateway(&mut self, conn: usize) {
        if self.conns[conn].stage == Stage::Done {
            return;
        }
        let c = &mut self.conns[conn];
        let g = c.ps.gw;
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, None, None);
        let req = c.req.clone();
        let action =
            c.ps.ex
                .on_request_headers(&mut gw.worker, &mut gw.host, Some(&req));
        if c.ps.ex.wants_request_body() {
            c.ps.ex.on_request_body(Some(&c.body), true);
        }
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        let local = outs.iter().any(|o| matches!(o, Out::Local { .. }));
        self.outs(g, Some(conn), outs);
        if action == Action::Continue && !local {
            self.forward(conn);
        }
    }

    pub(super) fn forward(&mut self, conn: usize) {
        let c = &mut self.conns[conn];
        if c.stage != Stage::Request {
            return;
        }
        c.stage = Stage::Upstream;
        let at = c.up.due(self.net.now, c.latency);
        self.net.at(at, Event::AtReplica(conn));
        self.arm_deadline(conn);
    }

    /// Schedules the adapters' timer for the exchange's deadline, if it has one. The guard's
    /// deadline is on the gateway's clock (skewed); the timer fires on ours.
    fn arm_deadline(&mut self, conn: usize) {
        let c = &self.conns[conn];
        if let Some(due) = c.ps.ex.deadline_ms() {
            let clock = self.net.now + self.gateways[c.ps.gw].skew_ms;
            self.net
                .after(due.saturating_sub(clock), Event::Deadline(conn));
        }
    }

    /// The adapters' timer: a continuation still waiting for its owner's headers (or, its
    /// headers held, for its first replayed event) is answered by the guard itself; one whose
    /// replay stalled with events still owed is reset. A deadline that moved on with the
    /// replay is scheduled again, as the native adapter does.
    pub(super) fn deadline(&mut self, conn: usize) {
        let c = &mut self.conns[conn];
        if !matches!(c.stage, Stage::Upstream | Stage::Responding) {
            return;
        }
        let g = c.ps.gw;
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, None, None);
        if !c.ps.ex.on_deadline(&mut gw.worker, &mut gw.host) {
            self.arm_deadline(conn);
            return;
        }
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        self.outs(g, Some(conn), outs);
    }

    pub(super) fn outs(&mut self, g: usize, conn: Option<usize>, outs: Vec<Out>) {
        for o in outs {
            match o {
                Out::Forward => {
                    if let Some(conn) = conn {
                        self.forward(conn);
                    }
                }
                Out::Local {
                    status,
                    headers,
                    body,
                } => {
                    if let Some(conn) = conn {
                        self.deliver(conn, Delivery::Head { status, headers });
                        self.deliver(conn, Delivery::Body(body));
                        self.deliver(conn, Delivery::End);
                        self.finish_proxy(conn);
                    }
                }
                Out::Callout {
                    token,
                    path,
                    body,
                    timeout_ms,
                } => {
                    // Envoy answers a callout that outlives its timeout with its own 504.
                    self.net.after(
                        timeout_ms,
                        Event::CalloutAnswer {
                            gw: g,
                            token,
                            status: Some(504),
                            body: Vec::new(),
                        },
                    );
                    if !self.faults.chance(self.opts.callout_loss_per_mille) {
                        let lat = self.service_latency();
                        let since = self.net.now + lat;
                        self.net.after(
                            lat,
                            Event::AtService {
                                gw: g,
                                token,
                                path,
                                body,
                                since,
                            },
                        );
                    }
                }
                Out::Body(b) => {
                    if let Some(conn) = conn {
                        if !b.is_empty() {
                            self.deliver(conn, Delivery::Body(b));
                        }
                    }
                }
                Out::Finish(b) => {
                    if let Some(conn) = conn {
                        self.deliver(conn, Delivery::Body(b));
                        self.deliver(conn, Delivery::End);
                        self.finish_proxy(conn);
                    }
                }
                Out::Reset => {
                    if let Some(conn) = conn {
                        self.deliver(conn, Delivery::End);
                        self.finish_proxy(conn);
                    }
                }
            }
        }
    }

    pub(super) fn deliver(&mut self, conn: usize, d: Delivery) {
        let c = &mut self.conns[conn];
        let at = c.down.due(self.net.now, c.latency);
        if let Some((status, headers)) = c.head.take() {
            // A held head goes out before anything else of its response.
            if !matches!(d, Delivery::Head { .. }) {
                self.net.at(
                    at,
                    Event::ToClient(conn, Delivery::Head { status, headers }),
                );
            }
        }
        self.net.at(at, Event::ToClient(conn, d));
    }

    /// The proxy is done with the stream (ended, reset, or the client went away).
    pub(super) fn finish_proxy(&mut self, conn: usize) {
        let c = &mut self.conns[conn];
        if c.stage == Stage::Done {
            return;
        }
        c.stage = Stage::Done;
        let g = c.ps.gw;
        let gw = &mut self.gateways[g];
        gw.enter(self.net.now, None, None);
        c.ps.ex.on_stream_end(&mut gw.worker, &mut gw.host);
        let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
        if let (Some(r), Some(uid)) = (c.replica, c.uid) {
            self.replicas[r].drop_reader(uid, conn);
        }
        self.outs(g, None, outs);
    }

    /// One message's way between a gateway and the service.
    pub(super) fn service_latency(&mut self) -> u64 {
        let jitter = match self.opts.service_jitter_ms {
            0 => 0,
            j => self.faults.below(j + 1),
        };
        1 + self.opts.service_latency_ms + jitter
    }

    pub(super) fn at_service(
        &mut self,
        gw: usize,
        token: u32,
        path: String,
        body: Vec<u8>,
        since: u64,
    ) {
        // The service's wait on a clean end whose answer would be `forked` while its rivals'
        // word may be in flight (`resume::end_branch`): asked again a little later, until the
        // wait is over.
        let settling = path == BRANCH_PATH && self.net.now + RECHECK_MS <= since + RECORD_WAIT_MS;
        let (status, answer) = if self.net.now < self.blip_until {
            (503, Vec::new())
        } else if settling {
            match self.service.branch_settled(self.net.now, body.clone()) {
                Some(a) => a,
                None => {
                    let again = Event::AtService {
                        gw,
                        token,
                        path,
                        body,
                        since,
                    };
                    self.net.after(RECHECK_MS, again);
                    return;
                }
            }
        } else {
            self.service.handle(self.net.now, &path, body.clone())
        };
        // The service's wait for records still travelling (`record_wait`, polled every
        // RECHECK): a refusal records could still turn is decided again a little later.
        if status == 200
            && path == RESUME_PATH
            && self.net.now + RECHECK_MS <= since + RECORD_WAIT_MS
            && WAITED_REASONS.iter().any(|r| {
                answer.starts_with(br#"{"verdict":"new_stream""#)
                    && answer.windows(r.len()).any(|w| w == r.as_bytes())
            })
        {
            self.net.after(
                RECHECK_MS,
                Event::AtService {
                    gw,
                    token,
                    path,
                    body,
                    since,
                },
            );
            return;
        }
        let body = answer;
        if self.faults.chance(self.opts.store_blip_per_mille) {
            self.blip_until = self.net.now + self.faults.range(10, 500);
        }
        if self.opts.store_wipe_per_mille > 0 && self.faults.chance(self.opts.store_wipe_per_mille)
        {
            self.service.wipe();
        }
        // Drawn only when asked for, so runs without these faults draw as before.
        if self.opts.service_restart_per_mille > 0
            && self.faults.chance(self.opts.service_restart_per_mille)
        {
            self.service.restart();
        }
        if self.opts.lose_branches_per_mille > 0
            && self.faults.chance(self.opts.lose_branches_per_mille)
        {
            self.service.lose_branch_tables();
        }
        let lat = self.service_latency();
        self.net.after(
            lat,
            Event::CalloutAnswer {
                gw,
                token,
                status: Some(status),
                body,
            },
        );
    }

    pub(super) fn callout_answer(
        &mut self,
        g: usize,
        token: u32,
        status: Option<u32>,
        body: Vec<u8>,
    ) {
        let Some(waiter) = self.gateways[g].callouts.remove(&token) else {
            return;
        };
        match waiter {
            Waiter::Records => {
                let gw = &mut self.gateways[g];
                gw.enter(self.net.now, None, None);
                gw.worker
                    .on_records_response(&mut gw.host, token, status, Some(&body));
                let outs = gw.effects(Waiter::Records, None);
                self.outs(g, None, outs);
            }
            Waiter::Conn(conn) => {
                let c = &mut self.conns[conn];
                if c.stage == Stage::Done {
                    return;
                }
                let addr = c.replica.map(|r| self.replicas[r].addr.clone());
                let gw = &mut self.gateways[g];
                gw.enter(self.net.now, addr.as_deref(), None);
                c.ps.ex.on_callout_response(
                    &mut gw.worker,
                    &mut gw.host,
                    token,
                    status,
                    Some(&body),
                );
                let outs = gw.effects(Waiter::Conn(conn), Some(&mut c.ps));
                self.outs(g, Some(conn), outs);
            }
        }
    }
}
