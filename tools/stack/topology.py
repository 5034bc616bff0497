"""The whole stack on 127.0.0.1: MCP replicas, ownership instances on one store, N gateways (Envoys).

    Stack(state_dir, replicas="naive"|"rmcp"|"ts"|"py", store="memory"|"redis"|"redis-cluster",
          build="wasm"|"native", gateways=N, ownership_ports=[...], ...)

The e2e suites hold one at a time per port set and swap the gateways' configuration with `use()`;
the chaos soak starts it whole and replaces its parts while it runs; the demo runs one as is.
"""
from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Callable

from . import services
from .cluster import RedisCluster
from .envoy import BASES, BUILD, Envoy, envoy_config
from .procs import ADMIN_PORT, ENVOY_PORT, HOST, OWNERSHIP_PORT, REDIS_PORT, REPLICA_PORTS, Proc, \
    http_post

# How each kind of replica starts, is named, and is told to forget what it served.
REPLICAS: dict[str, tuple[Callable[..., Proc], str, str | None]] = {
    "naive": (lambda port, name, stack, **kw: services.start_replica(port, name, stack.state_dir, **kw), "r",
              "/_naive/reset"),
    "rmcp": (lambda port, name, stack, **kw: services.start_rmcp_replica(port, name, stack.state_dir, **kw), "r",
             None),
    "ts": (lambda port, name, stack, **kw: services.start_ts_replica(port, name, **kw), "r", "/_interop/reset"),
    "py": (lambda port, name, stack, **kw: services.start_py_replica(port, name, **kw), "py", "/_interop/reset"),
}
STORES = ("memory", "redis", "redis-cluster")


class Stack:
    """Replicas on `replica_ports`, ownership instances on `ownership_ports` sharing one store, and
    `gateways` Envoys (listener ENVOY_PORT + 10 i, admin ADMIN_PORT + 10 i) loading the guard.

    `ownership_ports=[]` runs none: the gateways then call instances someone else runs (another
    stack's, on OWNERSHIP_PORT). `configure(cfg, i)` makes a last change to gateway i's config;
    `plugin_defaults` are plugin overrides every `use()` starts from.
    """

    def __init__(self, state_dir: Path, *, replicas: str = "naive", replica_ports: list[int] | None = None,
                 replica_args: dict | None = None, ownership_ports: list[int] | None = None,
                 ownership_args: list | None = None, store: str = "memory", cluster_base: int | None = None,
                 gateways: int = 1, envoy_ports: list[int] | None = None, admin_ports: list[int] | None = None,
                 build: str | None = None, base: str | None = None, name: str = "envoy", concurrency: int = 1,
                 configure: Callable[[dict, int], None] | None = None, plugin_defaults: dict | None = None,
                 upstreams: list[tuple[str, int]] | None = None):
        if replicas not in REPLICAS:
            raise ValueError(f"replicas must be one of {sorted(REPLICAS)}, not {replicas!r}")
        if store not in STORES:
            raise ValueError(f"store must be one of {STORES}, not {store!r}")
        self.state_dir = state_dir
        self.kind = replicas
        # Upstreams someone else runs (host, port) take the replicas' place behind the gateways.
        self.upstreams = upstreams or None
        self.replica_ports = [] if upstreams else list(REPLICA_PORTS if replica_ports is None else replica_ports)
        self.replica_args = dict(replica_args or {})
        self.ownership_ports = list([OWNERSHIP_PORT] if ownership_ports is None else ownership_ports)
        self.ownership_args = list(ownership_args or [])
        self.store = store
        self.cluster_base = REDIS_PORT + 10 if cluster_base is None else cluster_base
        self.envoy_ports = envoy_ports or [ENVOY_PORT + 10 * i for i in range(gateways)]
        self.admin_ports = admin_ports or [ADMIN_PORT + 10 * i for i in range(gateways)]
        self.base = base or BASES[build or BUILD]
        self.name = name
        self.concurrency = concurrency
        self.configure = configure
        self.plugin_defaults = dict(plugin_defaults or {})
        self.replicas: dict[int, Proc] = {}
        self.owners: dict[int, Proc] = {}
        self.redis: Proc | None = None
        self.cluster: RedisCluster | None = None
        self.envoys: list[Envoy | None] = [None] * len(self.envoy_ports)
        self._key: str | None = None

    # -- replicas --

    def replica_name(self, port: int) -> str:
        return f"{REPLICAS[self.kind][1]}{self.replica_ports.index(port) + 1}"

    def port_of(self, name: str) -> int:
        """The port of replica `r2` (or `py2`)."""
        return self.replica_ports[int(name.lstrip("rpy")) - 1]

    def start_replica(self, port: int) -> Proc:
        start = REPLICAS[self.kind][0]
        self.replicas[port] = start(port, self.replica_name(port), self, **self.replica_args)
        return self.replicas[port]

    def ensure_replicas(self, reset: bool = True) -> None:
        """Every replica up (started again where it died); with `reset`, each forgets what it served."""
        for p in self.replica_ports:
            if p not in self.replicas or not self.replicas[p].alive:
                self.start_replica(p)
        if reset:
            self.reset()

    def reset(self) -> None:
        path = REPLICAS[self.kind][2]
        for p in self.replica_ports if path else []:
            http_post(p, path)

    # -- ownership and its store --

    @property
    def ownership(self) -> Proc | None:
        """The first ownership instance (the only one, in most stacks)."""
        return self.owners.get(self.ownership_ports[0]) if self.ownership_ports else None

    @ownership.setter
    def ownership(self, p: Proc | None) -> None:
        if p is None:
            self.owners.pop(self.ownership_ports[0], None)
        else:
            self.owners[self.ownership_ports[0]] = p

    def store_url(self) -> str | None:
        if self.store == "redis":
            return f"redis://{HOST}:{REDIS_PORT}"
        if self.store == "redis-cluster":
            return RedisCluster(self.cluster_base, name=self.name).url if self.cluster is None else self.cluster.url
        return None

    def start_store(self) -> None:
        if self.store == "redis":
            self.redis = services.start_redis()
        elif self.store == "redis-cluster":
            self.cluster = RedisCluster(self.cluster_base, name=self.name).start()

    def ensure_store(self) -> None:
        if self.store == "redis" and (self.redis is None or not self.redis.alive):
            self.start_store()
        elif self.store == "redis-cluster":
            if self.cluster is None:
                self.start_store()
            self.cluster.wait_ok()

    def start_ownership(self, port: int) -> Proc:
        url = self.store_url()
        extra = (["--store", url] if url else []) + self.ownership_args
        self.owners[port] = services.start_ownership(port, extra)
        return self.owners[port]

    def ensure_ownership(self) -> None:
        for p in self.ownership_ports:
            if p not in self.owners or not self.owners[p].alive:
                self.start_ownership(p)

    # -- gateways --

    @property
    def envoy(self) -> Envoy | None:
        """The first gateway."""
        return self.envoys[0]

    @envoy.setter
    def envoy(self, e: Envoy | None) -> None:
        self.envoys[0] = e

    def gateway_config(self, i: int, guard: bool = True, overrides: dict | None = None) -> dict:
        cfg = envoy_config(guard=guard, plugin_overrides=overrides if guard else None,
                           replica_ports=self.replica_ports, listener_port=self.envoy_ports[i],
                           admin_port=self.admin_ports[i], ownership_ports=self.ownership_ports or None,
                           base=self.base, upstreams=self.upstreams)
        if self.configure is not None:
            self.configure(cfg, i)
        return cfg

    def start_gateway(self, i: int, guard: bool = True, overrides: dict | None = None) -> Envoy:
        """Gateway i (stopped first if it runs) with the guard and these plugin overrides, or without it."""
        if self.envoys[i] is not None:
            self.envoys[i].stop()
        name = f"{self.name}{i if len(self.envoys) > 1 else ''}-{'guard' if guard else 'noguard'}"
        self.envoys[i] = Envoy(name, self.gateway_config(i, guard, overrides), self.admin_ports[i],
                               self.envoy_ports[i], concurrency=self.concurrency).start()
        return self.envoys[i]

    def use(self, guard: bool = True, **overrides) -> Envoy:
        """Every gateway with this configuration (restarted only if it changed or one died); the first."""
        overrides = {**self.plugin_defaults, **overrides}
        key = json.dumps([guard, overrides], sort_keys=True)
        if key != self._key or not all(e is not None and e.alive for e in self.envoys):
            for e in self.envoys:
                if e is not None:
                    e.stop()
            for i in range(len(self.envoys)):
                self.start_gateway(i, guard, overrides)
            self._key = key
        return self.envoys[0]

    def stop_gateways(self) -> None:
        for e in self.envoys:
            if e is not None:
                e.stop()
        self._key = None

    @contextlib.contextmanager
    def own_gateway(self, name: str, cfg: dict):
        """An Envoy of the caller's own config (its ports as the config names them), stopped on exit;
        the stack's gateways are stopped first, and the next `use()` starts them again."""
        self.stop_gateways()
        self.envoys = [None] * len(self.envoys)
        env = Envoy(name, cfg, concurrency=self.concurrency).start()
        try:
            yield env
        finally:
            env.stop()

    # -- the whole --

    def start(self) -> "Stack":
        """Store, replicas and ownership; the gateways start with `use()`."""
        self.ensure_store()
        self.ensure_replicas(reset=False)
        self.ensure_ownership()
        return self

    def vacate(self) -> None:
        """Stop the gateways and the replicas, so that another stack can take their ports; the
        ownership service stays. `ensure_replicas()` and `use()` bring them back."""
        self.stop_gateways()
        for p in self.replicas.values():
            p.stop()

    def processes(self) -> dict[str, Proc]:
        out: dict[str, Proc] = {f"replica:{p}": r for p, r in self.replicas.items()}
        out.update({f"ownership:{p}": o for p, o in self.owners.items()})
        out.update({f"envoy:{i}": e for i, e in enumerate(self.envoys) if e is not None})
        if self.cluster is not None:
            out.update({f"redis:{p}": n for p, n in self.cluster.nodes.items()})
        if self.redis is not None:
            out["redis"] = self.redis
        return out

    def stop(self) -> None:
        self.stop_gateways()
        for p in [*self.owners.values(), *self.replicas.values(), self.redis]:
            if p is not None:
                p.stop()
        if self.cluster is not None:
            self.cluster.stop()


def running(s, start: Callable[[], object] | None = None, remove: Path | None = None):
    """A pytest fixture's body for any stack-like object: `start()`, yield it, then stop it and
    remove the directory `remove`, whatever happens."""
    try:
        if start is not None:
            start()
        yield s
    finally:
        s.stop()
        if remove is not None:
            shutil.rmtree(remove, ignore_errors=True)
