"""The system on 127.0.0.1, started and stopped by pid: one package for the e2e suite, the interop
suites, the chaos soak, `make demo` and the benchmarks.

  procs     a child process with its log (Proc), ports, the binaries under test, /proc readings
  envoy     Envoy configurations from envoy/*.yaml and the Envoy process (Envoy)
  services  starting replicas (naive, rmcp, TypeScript and Python SDK servers), ownership, Redis
  cluster   a local Redis Cluster (RedisCluster)
  client    a minimal MCP Streamable HTTP client and SSE reader (Client, SSEStream)
  resume    the guard's answers as a client reads them: cursor fields, control event, header
  upstream  a test's own MCP upstream in this process (Upstream: hostile ids, bulk bodies)
  topology  the whole stack: replicas + ownership instances on one store + N gateways (Stack)

Importable with `tools/` on the path: pytest's `pythonpath` (pytest.ini) and, for the scripts
make runs, `PYTHONPATH=tools` (the Makefile's $(PY)).
"""
