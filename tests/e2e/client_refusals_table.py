"""Prints the table of docs/interop-ts-python.md ("A refused resume, judged by the application") from
the rows tests/e2e/test_client_refusals.py wrote to target/client-refusals.json.

    E2E_PORT_OFFSET=100 .venv/bin/pytest -q tests/e2e/test_client_refusals.py
    .venv/bin/python tests/e2e/client_refusals_table.py [target/client-refusals.json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDK = {"ts": "TypeScript 1.32.2", "py": "Python mcp 2.3.0"}
PATH = {("ts", "auto"): "automatic reconnect", ("ts", "token"): "`resumptionToken`",
        ("py", "auto"): "automatic reconnect", ("py", "token"): "`resumption_token`"}
KINDS = ["owner_gone", "gap", "session_inactive", "ownership_down", "forked"]


def cell_call(r: dict) -> str:
    if r["outcome"] == "error":
        return f"**settled**, error {r['code']}" + (f" `{r['reason']}`" if r["reason"] else " (no reason)")
    if r["outcome"] == "result":
        return "**settled** with the result"
    if r["outcome"] == "crash":
        return "**session crashed** under the call"
    return f"**did not settle** ({r['outcome']})"


def second(r: dict) -> str:
    if r["second_call"]:
        return "ok"
    if r.get("second_wrongly_settled"):
        return "**wrongly settled** by the refusal meant for the original request"
    return "fails"


def ms(v) -> str:
    return "—" if v is None else f"{v} ms"


def table(rows: dict) -> str:
    out = ["| SDK, path | refusal | guard's answer | the pending call | settled after the resume | "
           "second call | session |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for sdk in ("ts", "py"):
        for path in ("auto", "token"):
            for kind in KINDS:
                r = rows.get(f"{sdk}/{path}/{kind}")
                if r is None:
                    continue
                settle = ms(r["settle_ms"]) if r["outcome"] != "timeout" else f"timeout at {ms(r['settle_ms'])}"
                out.append(f"| {SDK[sdk]}, {PATH[(sdk, path)]} | `{kind}` | {r['guard_answer'] or '—'} | "
                           f"{cell_call(r)} | {settle} | {second(r)} | "
                           f"{'alive' if r['session_survived'] else 'gone'} |")
    return "\n".join(out)


def main() -> int:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "target" / "client-refusals.json"
    print(table(json.loads(src.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
