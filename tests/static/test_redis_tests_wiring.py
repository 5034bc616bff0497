"""The ownership service's Redis tests are behind the crate feature `redis-tests` (so `make check`
builds everything else in one cargo call without redis-server). Without the feature cargo skips them
silently: this checks that every `ownership/tests/redis_*.rs` needs the feature and that `make unit`
and `make lint` turn it on."""
from __future__ import annotations

import re
import tomllib

from stack.procs import ROOT


def recipe(makefile: str, target: str) -> str:
    m = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert m, f"no `{target}` target in the Makefile"
    return m.group(1)


def test_every_redis_test_needs_the_feature():
    manifest = tomllib.loads((ROOT / "ownership" / "Cargo.toml").read_text())
    gated = {t["name"] for t in manifest.get("test", []) if "redis-tests" in t.get("required-features", [])}
    files = {p.stem for p in (ROOT / "ownership" / "tests").glob("redis_*.rs")}
    assert files, "no ownership/tests/redis_*.rs"
    assert files <= gated, f"redis tests without `required-features = [\"redis-tests\"]`: {sorted(files - gated)}"


def test_make_unit_and_lint_turn_the_feature_on():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^REDIS_TESTS\s*:?=\s*--features mcp-ownership/redis-tests\s*$", makefile, re.M)
    assert re.search(r"cargo test --workspace \$\(REDIS_TESTS\)", recipe(makefile, "unit"))
    assert re.search(r"cargo clippy --workspace --all-targets \$\(REDIS_TESTS\)", recipe(makefile, "lint"))
