import pytest

from stack.topology import Stack, running

RING = 16  # events each naive replica keeps; the guard is told the same (`retention`)


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """Three naive replicas, the ownership service and one Envoy at a time (`use()`)."""
    state = tmp_path_factory.mktemp("naive-state")
    s = Stack(state, replicas="naive", replica_args={"ring": RING}, plugin_defaults={"retention": RING})
    yield from running(s, s.start, remove=state)


@pytest.fixture
def fresh(stack):
    """Every test starts with all replicas and the ownership service up, logs cleared."""
    stack.ensure_replicas()
    stack.ensure_ownership()
    return stack
