"""SECURITY.md names a test on every table row, and every test it names exists.

A row's tests are the backticked items of its `test` (or `tests`) column, and anywhere in the row the
backticked items written `path::name`. `name[id]` is a parametrized test (the id is dropped), and a
lone `[id]` is another id of the test before it. A name with a path must be a `def name(` (Python)
or `fn name` (Rust) in that file; a bare name, one anywhere under the source directories below.
A `path::name` in the prose must exist too. Nothing is started: this reads files.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "SECURITY.md"
# Where a bare test name may live.
SOURCE_DIRS = ("tests", "core", "ownership", "fuzz", "cli", "src")
SKIP_PARTS = {"node_modules", ".runs", "target", "__pycache__", ".venv"}
TEST_COLUMNS = ("test", "tests")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Row:
    line: int
    cells: list[str]
    test_col: int | None


def split_cells(line: str) -> list[str]:
    """Cells of a Markdown table line; a `|` inside backticks does not split."""
    cells, cur, code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
    cells.append(cur.strip())
    return cells


def table_rows(text: str) -> list[Row]:
    """Every body row of every table (header and separator lines skipped)."""
    lines = text.splitlines()
    rows, i = [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("|"):
            i += 1
            continue
        header = [c.lower() for c in split_cells(lines[i])]
        test_col = next((k for k, c in enumerate(header) if c in TEST_COLUMNS), None)
        i += 1
        if i < len(lines) and re.fullmatch(r"\s*\|[\s|:-]+\|?\s*", lines[i]):
            i += 1
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            rows.append(Row(i + 1, split_cells(lines[i]), test_col))
            i += 1
    return rows


def refs(row: Row) -> list[str]:
    """The raw test references of a row, in order."""
    out = []
    for k, cell in enumerate(row.cells):
        for item in re.findall(r"`([^`]+)`", cell):
            if k == row.test_col or "::" in item:
                out.append(item)
    return out


def parse_ref(item: str) -> tuple[str | None, str]:
    """(path or None, test name) of `path::name[id]` or `name[id]`."""
    base = re.sub(r"\[[^\]]*\]$", "", item)
    path, _, name = base.rpartition("::")
    return (path or None), name


@lru_cache(maxsize=None)
def source(path: Path) -> str:
    return path.read_text(errors="replace")


def defines(path: Path, name: str) -> bool:
    pattern = (rf"^\s*(async\s+)?def {re.escape(name)}\(" if path.suffix == ".py"
               else rf"\bfn {re.escape(name)}\b")
    return re.search(pattern, source(path), re.MULTILINE) is not None


@lru_cache(maxsize=1)
def all_sources() -> tuple[Path, ...]:
    out = []
    for d in SOURCE_DIRS:
        for p in (ROOT / d).rglob("*"):
            if p.suffix in (".py", ".rs") and p.is_file() and not SKIP_PARTS & set(p.parts):
                out.append(p)
    return tuple(out)


def missing(item: str) -> str | None:
    """Why the test `item` names does not exist, or None when it does."""
    path, name = parse_ref(item)
    if not IDENT.match(name):
        return f"`{item}` is not a test name"
    if path is not None:
        p = ROOT / path
        if not p.is_file():
            return f"`{item}`: no file {path}"
        if not defines(p, name):
            return f"`{item}`: no test {name} in {path}"
        return None
    if not any(defines(p, name) for p in all_sources()):
        return f"`{item}`: no test {name} under {', '.join(SOURCE_DIRS)}"
    return None


def problems(text: str) -> list[str]:
    """Every row without a test, and every named test that does not exist (in a row, or as
    `path::name` in the prose)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            for item in re.findall(r"`([^`]+::[^`]+)`", line):
                if (why := missing(item)) is not None:
                    out.append(f"SECURITY.md:{n}: {why}")
    for row in table_rows(text):
        items = refs(row)
        named = [i for i in items if not i.startswith("[")]
        where = f"SECURITY.md:{row.line} ({row.cells[0][:60]!r})"
        if not named:
            out.append(f"{where}: names no test")
            continue
        if items[0].startswith("["):
            out.append(f"{where}: `{items[0]}` follows no test name")
        for item in named:
            if (why := missing(item)) is not None:
                out.append(f"{where}: {why}")
    return out


def test_every_row_names_a_test_that_exists():
    text = DOC.read_text()
    rows = table_rows(text)
    assert len(rows) >= 50, f"only {len(rows)} table rows parsed from SECURITY.md"
    bad = problems(text)
    assert not bad, "\n".join(bad)


def test_the_sections_the_doc_promises_are_there():
    text = DOC.read_text()
    for heading in ("## Reporting a vulnerability", "## Threat model", "## Cursors: the MAC argument",
                    "## Control plane: the ownership service", "## Store", "## Key rotation",
                    "## Token rotation", "## Hostile input"):
        assert f"\n{heading}\n" in text, heading
    assert "GitHub security advisory" in text
    assert "(docs/fuzzing.md)" in text and (ROOT / "docs" / "fuzzing.md").is_file()
    assert "mcp-guard keygen" in text and "--token-file" in text and "--admin-token-file" in text


@pytest.mark.parametrize("row, words", [
    ("| x | y | `test_no_such_test_anywhere_h10` |", "no test test_no_such_test_anywhere_h10 under"),
    ("| x | y | `core/src/cursor.rs::made_up_name` |", "no test made_up_name in core/src/cursor.rs"),
    ("| x | y | `tests/e2e/nowhere.py::test_x` |", "no file tests/e2e/nowhere.py"),
    ("| x | y | nothing named here |", "names no test"),
    ("| x | y | `[h1]` |", "names no test"),
    ("| x | see `tests/e2e/test_hostile.py::test_made_up` |", "no test test_made_up in tests/e2e/test_hostile.py"),
    ("Prose: `ownership/tests/auth.rs::made_up_rotation` is the test.", "no test made_up_rotation in"),
])
def test_the_check_catches_a_made_up_or_missing_test(row, words):
    header = {4: "| a | b | test |\n| --- | --- | --- |\n", 3: "| a | b |\n| --- | --- |\n", 0: ""}[row.count("|")]
    bad = problems(header + row + "\n")
    assert len(bad) == 1 and words in bad[0], bad


def test_real_names_pass_the_check():
    doc = ("| a | b | test |\n| --- | --- | --- |\n"
           "| x | y | `test_garbage_from_the_ownership_service[huge]`, `[deep]` |\n"
           "| x | y | `ownership/tests/suite/mod.rs::owner_epochs_expire` |\n"
           "| x | y | `core/src/cursor.rs::any_bit_flip_is_rejected` |\n")
    assert problems(doc) == []
