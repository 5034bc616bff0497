"""The SDK soak's verdict (tests/chaos/soak_sdk.py) on made-up call records: what fails `make soak-sdk`
and `make test` (soak-sdk-smoke), what is counted apart, and how a settled call is timed."""
from __future__ import annotations

import re
import sys
from types import SimpleNamespace

from stack.procs import ROOT

sys.path.insert(0, str(ROOT / "tests" / "chaos"))
import soak_sdk  # noqa: E402

ARGS = dict(ts_clients=1, py_clients=0, rmcp_clients=0, hung_allowed=False)
DEATH = {"at": 5_000, "owner": "127.0.0.1:9101", "pool": "everything", "kind": "prestop"}


def call(outcome="completed", **kw) -> dict:
    r = {"sdk": "typescript", "client": "ts-0", "pool": "everything", "start": 1_000, "end": 4_000,
         "outcome": outcome, "reason": None, "break_at": None, "replica": "127.0.0.1:9101", "progress": [1, 2],
         "resumes": 0, "answers": [], "violations": []}
    r.update(kw)
    return r


def rc(recs, deaths=(DEATH,), **args) -> int:
    return soak_sdk.verdict(recs, list(deaths), 0, SimpleNamespace(**{**ARGS, **args}))[0]


def test_a_clean_run_passes():
    assert rc([call(), call("settled", reason="owner_unavailable")]) == 0


def test_a_violation_fails_the_run():
    assert rc([call(violations=["progress 1 repeated after 1"])]) == 1


def test_a_repeat_the_sdk_asked_for_is_counted_apart():
    r = call(violations=["progress 1 repeated after 2"], stale_resume=True)
    assert rc([r]) == 0
    assert soak_sdk.sdks(r) and not soak_sdk.ours(r)


def test_a_hung_call_fails_unless_allowed():
    assert rc([call("hung")]) == 1
    assert rc([call("hung")], hung_allowed=True) == 0


def test_nothing_exercised_fails():
    assert rc([call()], deaths=()) == 1
    assert rc([call()], py_clients=2) == 1  # no Python call was made


def test_settle_is_timed_from_the_calls_own_replica():
    other = {**DEATH, "owner": "127.0.0.1:9102", "at": 6_000}
    r = call("settled", end=7_000, break_at=6_500)
    soak_sdk.attribute([r], [DEATH, other])
    assert (r["from_death"], r["from_break"], r["death_kind"]) == (2_000, 500, "prestop")
    unknown = call("settled", end=7_000, replica=None)
    soak_sdk.attribute([unknown], [DEATH, other])
    assert unknown["from_death"] == 1_000  # the pool's latest death during the call


def test_make_test_runs_the_smoke_and_hung_calls_fail_it_by_default():
    mk = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:.*\bsoak-sdk-smoke\b", mk, re.M)
    assert re.search(r"^SOAK_HUNG_ALLOWED\s*\?=\s*$", mk, re.M)
    assert "$(if $(SOAK_HUNG_ALLOWED),--hung-allowed)" in mk
