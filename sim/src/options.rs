//! What one run simulates: sizes, the replicas' behaviour menu, faults, and the client quirks.
use crate::replica::Behaviour;
use crate::service::StoreKind;

#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    /// Events to process.
    pub steps: u64,
    pub clients: usize,
    pub gateways: usize,
    pub replicas: usize,
    /// Each replica draws one entry (sometimes two) from this menu; an entry is a set of
    /// behaviours (`echo-cursor+large`).
    pub menu: Vec<Vec<Behaviour>>,
    /// Clients' JSON-RPC ids: 0 plain; 1 big ints, 2 an escaped `id` key, 3 a duplicate `id`
    /// key, 4 a batch, 5 long string ids; 6 a mix of all.
    pub odd_ids: u64,
    /// A call must settle within this much simulated time.
    pub bound_ms: u64,
    /// Chance (per mille) that a client drops a stream it reads at some byte of a chunk.
    pub drop_per_mille: u64,
    /// Chance (per mille) that a callout is lost (the gateway then sees its timeout, 504).
    pub callout_loss_per_mille: u64,
    /// Chance (per mille, per request) that the store starts a short outage (503s).
    pub store_blip_per_mille: u64,
    /// Chance (per mille, per request) that the store loses every key.
    pub store_wipe_per_mille: u64,
    /// Chance (per mille, per request) that the ownership service restarts (a rollout): the
    /// memory store loses everything, a Redis store nothing.
    pub service_restart_per_mille: u64,
    /// Chance (per mille, per request) that every branch table is lost (Redis only).
    pub lose_branches_per_mille: u64,
    /// The store: memory, or a real Redis.
    pub store: StoreKind,
    /// The store's `Limits::max_bytes` and `Limits::max_session_events` (0: the default).
    pub store_max_bytes: usize,
    pub store_max_session_events: usize,
    /// Chance (per mille) that a client resuming also sends copies of the resume it drops a few
    /// ms later, while their verdict is pending (its own abandoned retries).
    pub drop_pending_per_mille: u64,
    /// The same, the dropped copies sent along with the resume (they may reach the service
    /// after it).
    pub drop_pending_race: u64,
    /// Chance (per mille) that such a copy is dropped late, 10-80 ms after it reached its
    /// gateway: its owner may have answered it (its branch relays) before its client reset it.
    pub drop_late: u64,
    /// Clients reconnect this long (up to 1 s more) after a stream ends or they drop it
    /// (0: after 50 ms to 1 s).
    pub reconnect_after_ms: u64,
    /// Gateways' clocks are ahead of the store's by up to this much.
    pub skew_ms: u64,
    /// One-way latency between a gateway and the service.
    pub service_latency_ms: u64,
    /// Up to this much more, drawn per message (callouts and answers then overtake each other;
    /// the draws are shared by all sessions, so not for invariant 4 runs).
    pub service_jitter_ms: u64,
    /// Clients other than client 0 also resume with client 0's cursors under their own session.
    pub attack: bool,
    /// Check invariant 3 (only meaningful without faults).
    pub check_continue: bool,
    /// Run only this client (the victim alone, for invariant 4).
    pub only_client: Option<usize>,
    /// Record a trace of this client's events.
    pub trace: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 1,
            steps: 100_000,
            clients: 6,
            gateways: 3,
            replicas: 3,
            menu: vec![vec![Behaviour::Correct]],
            odd_ids: 0,
            bound_ms: 60_000,
            drop_per_mille: 30,
            callout_loss_per_mille: 0,
            store_blip_per_mille: 0,
            store_wipe_per_mille: 0,
            service_restart_per_mille: 0,
            lose_branches_per_mille: 0,
            store: StoreKind::Memory,
            store_max_bytes: 0,
            store_max_session_events: 0,
            drop_pending_per_mille: 0,
            drop_pending_race: 0,
            drop_late: 0,
            reconnect_after_ms: 0,
            skew_ms: 0,
            service_latency_ms: 1,
            service_jitter_ms: 0,
            attack: false,
            check_continue: false,
            only_client: None,
            trace: None,
        }
    }
}

impl Options {
    /// The store's limits: the defaults, with the sizes the flags set.
    pub fn limits(&self) -> mcp_ownership::store::Limits {
        let mut l = mcp_ownership::store::Limits::default();
        if self.store_max_bytes > 0 {
            l.max_bytes = self.store_max_bytes;
        }
        if self.store_max_session_events > 0 {
            l.max_session_events = self.store_max_session_events;
        }
        l
    }

    /// Applies one `--flag value` pair; `Err` names what is wrong.
    pub fn set(&mut self, flag: &str, value: &str) -> Result<(), String> {
        let num = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag {
            "--seed" => self.seed = num()?,
            "--steps" => self.steps = num()?,
            "--clients" => self.clients = num()? as usize,
            "--gateways" => self.gateways = (num()? as usize).max(1),
            "--replicas" => self.replicas = (num()? as usize).max(1),
            "--menu" => {
                self.menu = value
                    .split(',')
                    .map(|set| {
                        set.split('+')
                            .map(|b| Behaviour::parse(b).ok_or(format!("unknown behaviour {b}")))
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .collect::<Result<_, _>>()?;
                if self.menu.is_empty() {
                    return Err("--menu: empty".into());
                }
            }
            "--odd-ids" => self.odd_ids = num()?,
            "--bound-ms" => self.bound_ms = num()?,
            "--drop" => self.drop_per_mille = num()?,
            "--callout-loss" => self.callout_loss_per_mille = num()?,
            "--store-blip" => self.store_blip_per_mille = num()?,
            "--store-wipe" => self.store_wipe_per_mille = num()?,
            "--service-restart" => self.service_restart_per_mille = num()?,
            "--lose-branches" => self.lose_branches_per_mille = num()?,
            "--store" => self.store = StoreKind::parse(value)?,
            "--store-max-bytes" => self.store_max_bytes = num()? as usize,
            "--store-max-session-events" => self.store_max_session_events = num()? as usize,
            "--drop-pending" => self.drop_pending_per_mille = num()?,
            "--drop-pending-race" => self.drop_pending_race = num()?,
            "--drop-late" => self.drop_late = num()?,
            "--reconnect-after-ms" => self.reconnect_after_ms = num()?,
            "--skew-ms" => self.skew_ms = num()?,
            "--service-latency-ms" => self.service_latency_ms = num()?,
            "--service-jitter-ms" => self.service_jitter_ms = num()?,
            "--check-continue" => self.check_continue = value == "1" || value == "true",
            "--attack" => self.attack = value == "1" || value == "true",
            _ => return Err(format!("unknown flag {flag}")),
        }
        Ok(())
    }

    /// The flags that reproduce this run.
    pub fn flags(&self) -> String {
        let menu: Vec<String> = self
            .menu
            .iter()
            .map(|set| set.iter().map(|b| b.name()).collect::<Vec<_>>().join("+"))
            .collect();
        format!(
            "--seed {} --steps {} --clients {} --gateways {} --replicas {} --menu {} --odd-ids {} --bound-ms {} --drop {} --drop-pending {} --drop-pending-race {} --drop-late {} --reconnect-after-ms {} --callout-loss {} --store {} --store-max-bytes {} --store-max-session-events {} --store-blip {} --store-wipe {} --service-restart {} --lose-branches {} --skew-ms {} --service-latency-ms {} --service-jitter-ms {} --attack {} --check-continue {}",
            self.seed, self.steps, self.clients, self.gateways, self.replicas, menu.join(","),
            self.odd_ids, self.bound_ms, self.drop_per_mille, self.drop_pending_per_mille, self.drop_pending_race, self.drop_late, self.reconnect_after_ms,
            self.callout_loss_per_mille, self.store.name(), self.store_max_bytes,
            self.store_max_session_events, self.store_blip_per_mille, self.store_wipe_per_mille,
            self.service_restart_per_mille, self.lose_branches_per_mille, self.skew_ms,
            self.service_latency_ms, self.service_jitter_ms, u8::from(self.attack),
            u8::from(self.check_continue),
        )
    }
}
