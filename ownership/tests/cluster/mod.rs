//! A real local Redis Cluster for the tests: redis-server processes in cluster mode on
//! 127.0.0.1 (consecutive ports, shifted by `E2E_PORT_OFFSET`), joined with
//! `redis-cli --cluster create`. Each node runs under a watchdog shell that stops it (by pid)
//! once the test process is gone: the Rust test harness has no global teardown.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub fn offset() -> u16 {
    std::env::var("E2E_PORT_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub struct Cluster {
    pub ports: Vec<u16>,
    want_masters: usize,
    pub dir: PathBuf,
    nodes: Mutex<Vec<(u16, Child)>>,
}

/// `redis-cli -p port args…` (stdout).
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Cluster {
    /// `masters` primaries with `replicas` replicas each, on ports `base + offset ..`.
    pub fn start(base: u16, masters: usize, replicas: usize) -> Cluster {
        let n = masters * (1 + replicas);
        let first = base + offset();
        let ports: Vec<u16> = (first..first + n as u16).collect();
        let dir = std::env::temp_dir().join(format!(
            "mcp-ownership-cluster-{first}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let c = Cluster {
            ports: ports.clone(),
            want_masters: masters,
            dir,
            nodes: Mutex::new(Vec::new()),
        };
        for &p in &ports {
            c.spawn(p);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for p in &ports {
            create.arg(format!("127.0.0.1:{p}"));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c.wait_ok(Duration::from_secs(60));
        c
    }

    fn spawn(&self, port: u16) {
        let d = self.dir.display();
        let extra = format!(
            "--cluster-enabled yes --cluster-config-file {d}/nodes-{port}.conf \
             --cluster-node-timeout 1000 --cluster-replica-validity-factor 0 --dir {d} \
             --dbfilename dump-{port}.rdb"
        );
        let child = redis_test_server::start(port, &extra).expect("redis-server");
        self.nodes.lock().unwrap().push((port, child));
    }

    /// Every live node says `cluster_state:ok`, every replica is in sync with its primary,
    /// and all nodes agree on who the primaries are (as many as at the start: a primary that
    /// comes back after a failover turns into a replica).
    pub fn wait_ok(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let live: Vec<u16> = self
                .ports
                .iter()
                .copied()
                .filter(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
                .collect();
            let ok = live
                .iter()
                .all(|p| cli(*p, &["cluster", "info"]).contains("cluster_state:ok"));
            let synced = live.iter().all(|p| {
                let r = cli(*p, &["info", "replication"]);
                !r.contains("role:slave") || r.contains("master_link_status:up")
            });
            let views: Vec<Vec<u16>> = live.iter().map(|p| self.masters_seen_by(*p)).collect();
            let agree = views.windows(2).all(|w| w[0] == w[1])
                && views.iter().all(|v| v.len() == self.want_masters);
            if ok && synced && agree && !live.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                // Say what each node reported, so a cluster that would not settle is diagnosed
                // from the test log alone.
                let seen: Vec<String> = live
                    .iter()
                    .map(|p| {
                        let info = cli(*p, &["cluster", "info"]);
                        let repl = cli(*p, &["info", "replication"]);
                        let pick = |text: &str, key: &str| {
                            text.lines()
                                .find_map(|l| l.trim().strip_prefix(key))
                                .unwrap_or("-")
                                .to_string()
                        };
                        format!(
                            "{p}: state={} role={} link={} masters={:?}",
                            pick(&info, "cluster_state:"),
                            pick(&repl, "role:"),
                            pick(&repl, "master_link_status:"),
                            self.masters_seen_by(*p)
                        )
                    })
                    .collect();
                panic!(
                    "cluster not ok within {timeout:?}; live nodes:\n{}",
                    seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn masters_seen_by(&self, port: u16) -> Vec<u16> {
        let mut out: Vec<u16> = cli(port, &["cluster", "nodes"])
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let flags = f.get(2)?;
                if !flags.contains("master") || flags.contains("fail") {
                    return None;
                }
                f.get(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Ports of the primaries now.
    pub fn masters(&self) -> Vec<u16> {
        let p = self
            .ports
            .iter()
            .copied()
            .find(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            .expect("a live node");
        self.masters_seen_by(p)
    }

    /// The primary serving `key` now, and the slot.
    pub fn owner_of(&self, key: &str) -> (u16, u16) {
        let p = self.masters()[0];
        let slot: u16 = cli(p, &["cluster", "keyslot", key]).trim().parse().unwrap();
        for m in self.masters() {
            let nodes = cli(m, &["cluster", "nodes"]);
            let me = nodes.lines().find(|l| l.contains("myself")).unwrap();
            for range in me.split_whitespace().skip(8) {
                let (lo, hi) = match range.split_once('-') {
                    Some((a, b)) => (a.parse::<u16>(), b.parse::<u16>()),
                    None => (range.parse::<u16>(), range.parse::<u16>()),
                };
                if let (Ok(lo), Ok(hi)) = (lo, hi) {
                    if (lo..=hi).contains(&slot) {
                        return (m, slot);
                    }
                }
            }
        }
        panic!("no primary serves slot {slot}");
    }

    /// This node's cluster id.
    pub fn node_id(&self, port: u16) -> String {
        cli(port, &["cluster", "myid"]).trim().to_owned()
    }

    /// A replica of the primary on `master`.
    pub fn replica_of(&self, master: u16) -> u16 {
        let id = self.node_id(master);
        for &p in &self.ports {
            if p != master && cli(p, &["info", "replication"]).contains("role:slave") {
                let nodes = cli(p, &["cluster", "nodes"]);
                let me = nodes.lines().find(|l| l.contains("myself")).unwrap();
                if me.split_whitespace().nth(3) == Some(id.as_str()) {
                    return p;
                }
            }
        }
        panic!("no replica of {master}");
    }

    /// Stop the node on `port` at once (SIGKILL of its redis-server, by pid).
    pub fn kill(&self, port: u16) {
        let pid = cli(port, &["info", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .map(|p| p.trim().to_owned())
            .expect("process_id");
        let _ = Command::new("kill").args(["-9", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Start a killed node again; it rejoins from its nodes.conf.
    pub fn restart(&self, port: u16) {
        self.spawn(port);
    }

    /// Every node up and the cluster settled: a fault test that failed half-way (its node
    /// never restarted) must not fail the next one too.
    pub fn ensure_all_up(&self, timeout: Duration) {
        for &p in &self.ports {
            if TcpStream::connect(("127.0.0.1", p)).is_err() {
                self.restart(p);
            }
        }
        self.wait_ok(timeout);
    }

    /// Waits until every live node sees `port` as a primary (gossip lags a failover on a busy
    /// machine); false when it did not within `timeout`.
    pub fn wait_promoted(&self, port: u16, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self
                .ports
                .iter()
                .copied()
                .filter(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
                .all(|p| self.masters_seen_by(p).contains(&port));
            if seen {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self, scheme: &str) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("{scheme}://{}", hosts.join(","))
    }
}
