"""A real local Redis Cluster for tests and the chaos soak: redis-server processes in cluster mode on
127.0.0.1, joined with `redis-cli --cluster create`, started and stopped by pid.

Three masters and three replicas by default, on consecutive ports from `base`.
"""
from __future__ import annotations

import shutil
import subprocess
import time

from .procs import HOST, RUNS, Proc


class RedisCluster:
    def __init__(self, base: int, masters: int = 3, replicas_per_master: int = 1, name: str = "cluster",
                 extra_args: list[str] | None = None):
        self.base = base
        self.masters = masters
        self.replicas_per_master = replicas_per_master
        self.name = name
        self.extra_args = extra_args or []
        self.ports = list(range(base, base + masters * (1 + replicas_per_master)))
        self.dir = RUNS / f"redis-{name}-{base}"
        self.nodes: dict[int, Proc] = {}

    @property
    def url(self) -> str:
        """The ownership service's `--store` value: every node as a seed."""
        return "redis-cluster://" + ",".join(f"{HOST}:{p}" for p in self.ports)

    def _node(self, port: int) -> Proc:
        d = self.dir / str(port)
        d.mkdir(parents=True, exist_ok=True)
        return Proc(f"redis-{self.name}-{port}", [
            "redis-server", "--port", port, "--bind", HOST, "--cluster-enabled", "yes",
            "--cluster-config-file", d / "nodes.conf", "--cluster-node-timeout", "1000",
            # A replica may take over however long its master has been gone (tests kill masters at will).
            "--cluster-replica-validity-factor", "0",
            "--dir", d, "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
            *self.extra_args,
        ], port=port)

    def start(self, timeout: float = 60.0) -> "RedisCluster":
        shutil.rmtree(self.dir, ignore_errors=True)
        for p in self.ports:
            self.nodes[p] = self._node(p).start()
        args = ["redis-cli", "--cluster", "create", *[f"{HOST}:{p}" for p in self.ports],
                "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {r.stdout}\n{r.stderr}")
        self.wait_ok(timeout)
        return self

    def cli(self, port: int, *args: str, timeout: float = 5.0) -> str:
        r = subprocess.run(["redis-cli", "-h", HOST, "-p", str(port), *args], capture_output=True, text=True,
                           timeout=timeout)
        return r.stdout

    def info(self, port: int) -> dict[str, str]:
        out = {}
        for line in self.cli(port, "cluster", "info").splitlines():
            k, _, v = line.strip().partition(":")
            out[k] = v
        return out

    def replication(self, port: int) -> dict[str, str]:
        out = {}
        for line in self.cli(port, "info", "replication").splitlines():
            k, _, v = line.strip().partition(":")
            out[k] = v
        return out

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node reports cluster_state:ok and every live replica is in sync with a master
        (a replica that never synced cannot take over). On timeout the error says what each node last
        reported, so a cluster that would not settle can be diagnosed from the log alone."""
        deadline = time.monotonic() + timeout
        seen = "  nothing yet"
        while time.monotonic() < deadline:
            live = [p for p, n in self.nodes.items() if n.alive]
            try:
                states = {p: (self.info(p), self.replication(p)) for p in live}
            except (OSError, subprocess.TimeoutExpired) as e:
                seen = f"  redis-cli failed: {e}"
                time.sleep(0.2)
                continue
            seen = "\n".join(
                f"  {p}: cluster_state={i.get('cluster_state')} slots_ok={i.get('cluster_slots_ok')} "
                f"pfail={i.get('cluster_slots_pfail')} fail={i.get('cluster_slots_fail')} "
                f"epoch={i.get('cluster_current_epoch')} role={r.get('role')} "
                f"master_port={r.get('master_port', '-')} link={r.get('master_link_status', '-')} "
                f"sync_in_progress={r.get('master_sync_in_progress', '-')}"
                for p, (i, r) in sorted(states.items()))
            ok = live and all(i.get("cluster_state") == "ok" for i, _ in states.values())
            synced = all(r.get("role") != "slave" or r.get("master_link_status") == "up"
                         for _, r in states.values())
            if ok and synced:
                return
            time.sleep(0.2)
        dead = [p for p, n in self.nodes.items() if not n.alive]
        raise TimeoutError(f"cluster {self.name} not ok within {timeout}s (dead nodes: {dead or 'none'}); "
                           f"last seen:\n{seen}")

    def masters_now(self) -> list[int]:
        """Ports of the nodes that are masters right now (as a live node sees it)."""
        for p, n in self.nodes.items():
            if not n.alive:
                continue
            out = []
            for line in self.cli(p, "cluster", "nodes").splitlines():
                parts = line.split()
                if len(parts) > 2 and "master" in parts[2] and "fail" not in parts[2]:
                    out.append(int(parts[1].split("@")[0].rsplit(":", 1)[1]))
            if out:
                return sorted(out)
        return []

    def kill(self, port: int) -> None:
        self.nodes[port].kill()

    def restart(self, port: int) -> None:
        """Start a stopped node again; it rejoins from its nodes.conf (as a replica if it was failed over)."""
        self.nodes[port] = self._node(port).start()

    def stop(self) -> None:
        for n in self.nodes.values():
            n.stop()

    def restart_all(self, timeout: float | None = 60.0) -> None:
        """A whole-cluster restart: every node stops, then every node starts again from its nodes.conf;
        then, unless timeout is None, wait until it is ok."""
        for n in self.nodes.values():
            n.stop()
        for p in self.ports:
            self.nodes[p] = self._node(p).start()
        if timeout is not None:
            self.wait_ok(timeout)

    def rss_pids(self) -> dict[str, int]:
        return {n.name: n.proc.pid for n in self.nodes.values() if n.alive and n.proc is not None}
