"""The chaos soak's own handling of a Redis Cluster that does not come back, on a real local cluster
(REDIS_PORT+50 .. +55, cluster bus +10000).

A cluster slower to settle than the soak's bound is the store's trouble, not a guard violation: the soak
must say what each node reported, hold back further Redis faults until the cluster is ok, and go on,
rather than stop with a traceback (which is how a slow failover once failed CI).
"""
import importlib.util
import random
import sys
import time

import pytest

import harness as h
from stack.cluster import RedisCluster

CLUSTER_BASE = h.REDIS_PORT + 50


def load_chaos():
    spec = importlib.util.spec_from_file_location("chaos", h.ROOT / "tests" / "chaos" / "chaos.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster(CLUSTER_BASE, name="harness").start()
    try:
        yield c
    finally:
        c.stop()


def shard_of(c: RedisCluster, master: int) -> list[int]:
    """The master's port and its replicas' ports, as the master sees them."""
    lines = [line.split() for line in c.cli(master, "cluster", "nodes").splitlines()]
    port = {p[0]: int(p[1].split("@")[0].rsplit(":", 1)[1]) for p in lines if len(p) > 3}
    me = next(p[0] for p in lines if "myself" in p[2])
    return [master] + [port[p[0]] for p in lines if len(p) > 3 and p[3] == me]


def test_wait_ok_names_what_each_node_reported(cluster):
    m = cluster.masters_now()[0]
    cluster.kill(m)
    try:
        with pytest.raises(TimeoutError) as e:
            cluster.wait_ok(0.3)
        msg = str(e.value)
        assert f"dead nodes: [{m}]" in msg
        for p in cluster.ports:
            if p != m:
                assert f"{p}: cluster_state=" in msg, msg
    finally:
        cluster.restart(m)
    cluster.wait_ok(30)


def test_soak_holds_back_redis_faults_while_the_cluster_is_not_ok(cluster):
    chaos = load_chaos()
    tally = chaos.Tally()
    system = chaos.System("redis-cluster", h.RUNS / "chaos-harness-state", tally)
    system.cluster = cluster
    shard = shard_of(cluster, cluster.masters_now()[0])
    assert len(shard) == 2, shard
    for p in shard:  # a whole shard gone: its slots are uncovered, so no node is ok
        cluster.kill(p)
    try:
        live = next(p for p in cluster.ports if p not in shard)
        deadline = time.monotonic() + 15
        while cluster.info(live).get("cluster_state") != "fail":  # once the others agree it is gone
            assert time.monotonic() < deadline, "the cluster never noticed a whole shard gone"
            time.sleep(0.2)
        assert not system.settle(0.5)
        assert tally.counts["redis_unsettled"] == 1
        masters_before = cluster.masters_now()
        system.fault("redis_master_kill", random.Random(1))
        system.fault("redis_cluster_restart", random.Random(1))
        assert tally.counts["redis_faults_deferred"] == 2
        assert sum(tally.faults.values()) == 0
        assert cluster.masters_now() == masters_before
        assert all(cluster.nodes[p].alive for p in cluster.ports if p not in shard)
    finally:
        for p in shard:
            cluster.restart(p)
    assert system.settle(30)
    assert system.cluster_settled and len(tally.settle_s) == 1
    assert tally.counts["redis_unsettled"] == 1
