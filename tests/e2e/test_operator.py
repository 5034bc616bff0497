"""Operator tooling end to end: `make demo` in front of awkward servers, the `mcp-guard` CLI on
cursors the guard really minted, and a real Prometheus scraping a run (rules loaded, every
dashboard query answered from real data).

The demo runs as a subprocess with its ports shifted by DEMO_SHIFT from this suite's, so it never
meets the session's stack; the stand-in servers listen on 127.0.0.1 next to it.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import harness as h

CLI = h.BIN / "mcp-guard"
DEMO = h.ROOT / "scripts" / "demo.py"
DASHBOARD = h.ROOT / "observability" / "grafana" / "mcp-resume-guard.json"
RULES = h.ROOT / "observability" / "prometheus" / "mcp-resume-guard.rules.yaml"
DEMO_SHIFT = 50
DEMO_OFFSET = h.PORT_OFFSET + DEMO_SHIFT
IDLE_PORT = 9131 + DEMO_OFFSET
ERROR_PORT = 9132 + DEMO_OFFSET
DEMO_PORTS = [10000 + DEMO_OFFSET, 9901 + DEMO_OFFSET, 9200 + DEMO_OFFSET]
PROMETHEUS_PORT = 9090 + h.PORT_OFFSET


def need(path: Path) -> None:
    if not path.exists():
        pytest.fail(f"{path} missing: `make build` builds it")


# ---- stand-in MCP servers --------------------------------------------------------------------

class IdleGetServer(BaseHTTPRequestHandler):
    """Answers initialize, notifications and pings; its GET stream opens and then stays silent
    (as the reference server's streamableHttp mode does)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        msg = json.loads(body or b"{}")
        if "id" not in msg:
            self.send_response(202)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        out = json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                          "result": {"protocolVersion": "2025-06-18", "capabilities": {},
                                     "serverInfo": {"name": "idle", "version": "0"}}
                          if msg.get("method") == "initialize" else {}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        if msg.get("method") == "initialize":
            self.send_header("mcp-session-id", "idle-session-1")
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.flush()
        # Silent until the client goes away (bounded).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.connection], [], [], 0.5)
            if r and not self.connection.recv(1, 0):
                break
        self.close_connection = True

    def do_DELETE(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()


class ErrorServer(BaseHTTPRequestHandler):
    """Every request gets a 500 with a JSON body."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def _fail(self):
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        out = b'{"error":"internal"}'
        self.send_response(500)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_DELETE = _fail


@pytest.fixture
def standin(request):
    handler, port = request.param
    srv = ThreadingHTTPServer((h.HOST, port), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield port
    srv.shutdown()
    srv.server_close()


# ---- running the demo --------------------------------------------------------------------------

def children(pid: int) -> set[int]:
    """Direct children of pid, from /proc."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.add(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: set[int], timeout: float = 15) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


class DemoRun:
    def __init__(self, tmp_path: Path, *args: str):
        need(CLI)
        self.out_path = tmp_path / "demo.out"
        # The demo imports the stack package from tools/, as `make demo` runs it.
        env = dict(os.environ, E2E_PORT_OFFSET=str(DEMO_OFFSET), PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(h.ROOT / "tools"))
        self.out = open(self.out_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(DEMO), *args], cwd=h.ROOT, env=env,
                                     stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.out_path.read_text()

    def wait_for(self, needle: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return self.text()
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail(f"demo never printed {needle!r} (exit {self.proc.poll()}):\n{self.text()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.out.close()


@pytest.fixture
def demo_runs():
    runs: list[DemoRun] = []
    yield runs
    for r in runs:
        r.close()
    for port in DEMO_PORTS:
        h.wait_port_free(port, timeout=15)


def ready(admin_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{h.HOST}:{admin_port}/ready", timeout=2) as r:
            return r.read().strip() == b"LIVE"
    except OSError:
        return False


@pytest.mark.parametrize("standin", [(IdleGetServer, IDLE_PORT)], indirect=True)
def test_demo_in_front_of_a_server_whose_get_stream_stays_idle(standin, demo_runs, tmp_path):
    run = DemoRun(tmp_path, "--upstreams", f"{h.HOST}:{standin}")
    demo_runs.append(run)
    out = run.wait_for("Running. Ctrl-C stops everything.")
    assert "Traceback" not in out, out
    assert "1. initialize -> Mcp-Session-Id: idle-session-1" in out
    assert "continuation: not shown" in out and "0 event(s)" in out
    assert "Mcp-Resume: restarted; reason=foreign_cursor" in out
    assert "Mcp-Resume: stripped; reason=post_cursor" in out
    # The labelled stats after the walk-through.
    assert 'mcp_resume_guard_refused{reason="foreign_cursor"} 1' in out
    assert 'mcp_resume_guard_refused{reason="post_cursor"} 1' in out
    # Still serving after the walk-through: the demo did not take Envoy down with it.
    time.sleep(2)
    assert run.proc.poll() is None
    assert ready(9901 + DEMO_OFFSET)
    kids = children(run.proc.pid)
    assert len(kids) >= 2, kids  # ownership service and Envoy
    os.kill(run.proc.pid, signal.SIGINT)
    assert run.proc.wait(timeout=30) == 0
    assert not wait_gone(kids), "processes left after Ctrl-C"
    assert "stopped everything the demo started." in run.text()
    for port in DEMO_PORTS:
        h.wait_port_free(port, timeout=5)


@pytest.mark.parametrize("standin", [(ErrorServer, ERROR_PORT)], indirect=True)
def test_demo_in_front_of_a_server_that_answers_errors_and_dies_cleanly_when_killed(
        standin, demo_runs, tmp_path):
    run = DemoRun(tmp_path, "--upstreams", f"{h.HOST}:{standin}")
    demo_runs.append(run)
    out = run.wait_for("Running. Ctrl-C stops everything.")
    assert "Traceback" not in out, out
    assert "(initialize: could not show it:" in out
    assert "4. resume with a legacy id 'e7' -> 500, Mcp-Resume: restarted; reason=foreign_cursor" in out
    kids = children(run.proc.pid)
    assert len(kids) >= 2, kids
    # SIGKILL leaves no chance to clean up: PR_SET_PDEATHSIG must take the children down.
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait(timeout=10)
    assert not wait_gone(kids), "children outlived a killed demo"
    for port in DEMO_PORTS:
        h.wait_port_free(port, timeout=5)


def test_demo_checks_config_first_and_names_the_field(demo_runs, tmp_path):
    bad = tmp_path / "plugin.json"
    bad.write_text(json.dumps({"ownership": {"cluster": "mcp_ownership"},
                               "keys": [{"id": 1, "active": True, "secret": "c2hvcnQ="}]}))
    run = DemoRun(tmp_path, "--config", str(bad), "--once")
    demo_runs.append(run)
    assert run.proc.wait(timeout=60) == 2
    out = run.text()
    assert "keys[0].secret: must decode to at least 32 bytes, got 5" in out, out
    assert "Envoy on" not in out  # nothing was started


def test_demo_runs_a_given_config_and_store(demo_runs, tmp_path):
    good = tmp_path / "plugin.json"
    good.write_text(json.dumps({"ownership": {"cluster": "mcp_ownership"}, "retention": 64,
                                "keys": [{"id": 7, "active": True, "secret": h.TEST_KEY}]}))
    redis_port = 6390 + DEMO_OFFSET
    run = DemoRun(tmp_path, "--config", str(good), "--store", f"redis://127.0.0.1:{redis_port}", "--once")
    demo_runs.append(run)
    assert run.proc.wait(timeout=120) == 0, run.text()
    out = run.text()
    assert f"starting redis-server on 127.0.0.1:{redis_port}" in out
    assert "key id:           7 (the active key)" in out  # the given keys mint the cursors
    assert "replay starts at the next event: True" in out, out
    h.wait_port_free(redis_port, timeout=10)


def test_demo_starts_and_uses_a_local_redis_cluster(demo_runs, tmp_path):
    """STORE=redis-cluster://127.0.0.1:P with nothing listening: the demo starts a 3+3 cluster there, runs
    the walk-through on it and stops every node with itself."""
    base = 7400 + DEMO_OFFSET
    run = DemoRun(tmp_path, "--store", f"redis-cluster://127.0.0.1:{base}", "--once")
    demo_runs.append(run)
    assert run.proc.wait(timeout=180) == 0, run.text()
    out = run.text()
    assert f"starting a local Redis Cluster on 127.0.0.1:{base}..{base + 5}" in out, out
    assert f"(store: redis-cluster://127.0.0.1:{base})" in out, out
    assert "replay starts at the next event: True" in out, out  # continued at the owner, contiguous
    assert "Mcp-Resume: restarted; reason=" in out, out  # the legacy id, said so
    assert "Mcp-Resume: stripped; reason=post_cursor" in out, out
    for p in range(base, base + 6):
        h.wait_port_free(p, timeout=15)


def test_demo_names_a_local_cluster_it_cannot_start(demo_runs, tmp_path):
    base = 7400 + DEMO_OFFSET
    run = DemoRun(tmp_path, "--store", f"redis-cluster://127.0.0.1:{base},127.0.0.1:{base + 10}", "--once")
    demo_runs.append(run)
    assert run.proc.wait(timeout=60) != 0
    assert f"name ports within {base}..{base + 5}" in run.text(), run.text()
    assert "Envoy on" not in run.text()


# ---- the CLI on cursors the guard minted -----------------------------------------------------

def cli(*args: str) -> subprocess.CompletedProcess:
    need(CLI)
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=30)


def cli_json(*args: str) -> tuple[int, dict]:
    r = cli(*args, "--json")
    try:
        return r.returncode, json.loads(r.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"not JSON: {r.stdout}{r.stderr}")


def test_cli_inspects_and_asks_about_real_cursors(fresh, tmp_path):
    envoy = fresh.use(guard=True)
    cfg = str(envoy.cfg_path)
    c = h.Client()
    sid = c.initialize()
    s = c.get_stream()
    evs = s.read(3)
    s.close()
    assert len(evs) == 3
    code, a = cli_json("inspect-cursor", "--config", cfg, "--session", sid, evs[0].id)
    assert code == 0 and a["valid"] and a["bound_to_session"], a
    assert a["kind"] == "get" and a["key_id"] == 1 and a["key_active"]
    assert a["version"] == 3 and re.fullmatch(r"[0-9a-f]{16}", a["incarnation"])
    assert a["replica_event_id"] and a["replica_event_id"].startswith("e")
    _, b = cli_json("inspect-cursor", "--config", cfg, "--session", sid, evs[1].id)
    assert b["seq"] == a["seq"] + 1 and b["incarnation"] == a["incarnation"]

    # Plain refusals.
    code, m = cli_json("inspect-cursor", "--config", cfg, "--session", "another-session", evs[0].id)
    assert code == 1 and m["reason"] == "session_mismatch", m
    tampered = evs[0].id[:-2] + ("AA" if not evs[0].id.endswith("AA") else "BB")
    code, t = cli_json("inspect-cursor", "--config", cfg, tampered)
    assert code == 1 and t["reason"] == "foreign_cursor" and t["error"] == "bad_mac", t
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"ownership": {"cluster": "c"},
                                 "keys": [{"id": 9, "active": True, "secret": h.TEST_KEY}]}))
    code, u = cli_json("inspect-cursor", "--config", str(other), evs[0].id)
    assert code == 1 and u["error"] == "unknown_key" and "key id 1" in u["why"], u
    code, legacy = cli_json("inspect-cursor", "--config", cfg, "e7")
    assert code == 1 and legacy["error"] == "malformed"
    human = cli("inspect-cursor", "--config", cfg, "--session", sid, evs[0].id).stdout
    assert "kind:             get" in human and f"seq:              {a['seq']}" in human

    # The ownership service's verdict, then the preStop call, then the verdict again.
    url = f"http://{h.HOST}:{h.OWNERSHIP_PORT}"
    code, v = cli_json("verdict", "--url", url, "--config", cfg, "--session", sid, evs[0].id)
    assert code == 0 and v["verdict"]["verdict"] == "continue", v
    owner = v["verdict"]["owner"]
    assert owner in {f"{h.HOST}:{p}" for p in h.REPLICA_PORTS}
    assert v["verdict"]["head"] >= b["seq"]
    gone = cli("mark-gone", "--url", url, owner)
    assert gone.returncode == 0 and json.loads(gone.stdout)["applied"] == 1, gone
    code, v2 = cli_json("verdict", "--url", url, "--config", cfg, "--session", sid, evs[0].id)
    assert code == 0 and v2["verdict"] == {"verdict": "new_stream", "reason": "owner_unavailable"}, v2
    # The guard agrees: the client is told, not replayed elsewhere.
    r = c.get_stream(last_event_id=evs[0].id)
    r.close()
    assert r.header("mcp-resume") == "restarted; reason=owner_unavailable"
    # No service: the tool says so and fails, as the guard fails closed.
    down = cli("verdict", "--url", f"http://{h.HOST}:{9 + h.PORT_OFFSET}", "--config", cfg,
               "--session", sid, evs[0].id)
    assert down.returncode == 1 and "POST" in down.stderr


# ---- Prometheus ---------------------------------------------------------------------------------

def prom_get(path: str, **params) -> dict:
    q = urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(f"http://{h.HOST}:{PROMETHEUS_PORT}{path}?{q}", timeout=5) as r:
        return json.loads(r.read())


def dashboard_queries() -> list[tuple[str, str]]:
    d = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in d["panels"] for t in p["targets"]]


METRIC = re.compile(r"\b((?:mcp|envoy)_[a-zA-Z0-9_]+)\b")


def query_problems(expr: str) -> list[str]:
    """Why a dashboard query is no good against this Prometheus: a metric nobody exports, or
    no data."""
    problems = []
    for name in sorted(set(METRIC.findall(re.sub(r"\{[^}]*\}", "", expr)))):  # not label names
        if not prom_get("/api/v1/series", **{"match[]": name})["data"]:
            problems.append(f"no series named {name}")
    q = expr.replace("$__rate_interval", "1m")
    res = prom_get("/api/v1/query", query=q)
    if res["status"] != "success" or not res["data"]["result"]:
        problems.append(f"no data for {q}")
    return problems


def traffic(c: h.Client) -> None:
    """Continuations (callouts), a restart, a stripped POST cursor."""
    s = c.get_stream()
    evs = s.read(2)
    s.close()
    r = c.get_stream(last_event_id=evs[0].id)
    r.read(1)
    r.close()
    r = c.get_stream(last_event_id="e7")
    r.close()
    c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "ping"}, {"last-event-id": "e7"})


def test_prometheus_scrapes_a_run_and_every_dashboard_query_returns_data(fresh, tmp_path):
    if not Path("/usr/bin/prometheus").exists():
        pytest.fail("prometheus missing: `make prometheus`")
    fresh.use(guard=True)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "envoy", "metrics_path": "/stats/prometheus",
             "static_configs": [{"targets": [f"{h.HOST}:{h.ADMIN_PORT}"]}]},
            {"job_name": "mcp-ownership",
             "static_configs": [{"targets": [f"{h.HOST}:{h.OWNERSHIP_PORT}"]}]},
        ]}))
    prom = h.Proc(f"prometheus-{PROMETHEUS_PORT}",
                  ["/usr/bin/prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                   f"--web.listen-address={h.HOST}:{PROMETHEUS_PORT}", "--log.level=warn"],
                  port=PROMETHEUS_PORT).start()
    try:
        c = h.Client()
        c.initialize()
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            traffic(c)
            up = prom_get("/api/v1/query", query="up")["data"]["result"]
            if len(up) == 2 and all(u["value"][1] == "1" for u in up) and \
                    prom_get("/api/v1/query", query="count(mcp_resume_guard_callout_ms_count)")["data"]["result"]:
                break
            time.sleep(1)
        time.sleep(6)  # a few more scrapes, so rate() has samples on both sides of the traffic
        traffic(c)
        time.sleep(3)
        problems = {f"{title}: {expr}": p for title, expr in dashboard_queries() if (p := query_problems(expr))}
        assert not problems, json.dumps(problems, indent=1)
        # The labelled series the issue names.
        got = prom_get("/api/v1/query", query='mcp_resume_guard_refused{reason="foreign_cursor"}')
        assert got["data"]["result"] and float(got["data"]["result"][0]["value"][1]) >= 1
        # The alert rules loaded and evaluate without errors on real data.
        groups = prom_get("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) >= 10 and all(r["health"] == "ok" for r in rules), rules
        # The check itself fails on a query that names a metric nobody exports.
        assert query_problems("sum(rate(mcp_resume_guard_nonexistent[$__rate_interval]))")
    finally:
        prom.stop()
