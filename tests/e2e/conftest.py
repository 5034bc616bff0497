import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

RING = 16  # events each naive replica keeps; the guard is told the same (`retention`)


class Stack:
    """Three naive replicas, the ownership service and one Envoy at a time."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.replicas: dict[int, h.Proc] = {}
        self.ownership: h.Proc | None = None
        self.envoy: h.Envoy | None = None
        self._envoy_key = None

    def start_replica(self, port: int) -> None:
        name = f"r{h.REPLICA_PORTS.index(port) + 1}"
        self.replicas[port] = h.start_replica(port, name, self.state_dir, ring=RING)

    def start(self) -> None:
        for p in h.REPLICA_PORTS:
            self.start_replica(p)
        self.ownership = h.start_ownership()

    def use(self, guard: bool, **overrides) -> h.Envoy:
        overrides.setdefault("retention", RING)
        key = json.dumps([guard, overrides], sort_keys=True)
        if self.envoy is not None and self.envoy.alive and key == self._envoy_key:
            return self.envoy
        if self.envoy is not None:
            self.envoy.stop()
        cfg = h.envoy_config(guard=guard, plugin_overrides=overrides if guard else None)
        self.envoy = h.Envoy("envoy-guard" if guard else "envoy-noguard", cfg).start()
        self._envoy_key = key
        return self.envoy

    def ensure_replicas(self) -> None:
        for p in h.REPLICA_PORTS:
            if p not in self.replicas or not self.replicas[p].alive:
                self.start_replica(p)
        for p in h.REPLICA_PORTS:
            h.replica_reset(p)

    def ensure_ownership(self) -> None:
        if self.ownership is None or not self.ownership.alive:
            self.ownership = h.start_ownership()

    def stop(self) -> None:
        for p in [self.envoy, self.ownership, *self.replicas.values()]:
            if p is not None:
                p.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("naive-state")
    s = Stack(state)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def fresh(stack):
    """Every test starts with all replicas and the ownership service up, logs cleared."""
    stack.ensure_replicas()
    stack.ensure_ownership()
    return stack
