// How fast does the real TypeScript client give up on a refused resume, for each answer the guard could give?
//
//   node failure_speed.mjs --port 9150 [--timeout 3000]
//
// A stand-in endpoint on 127.0.0.1:PORT answers a GET with Last-Event-ID byte for byte as the guard does:
//   reject     409 application/json, the guard's JSON-RPC error body (policy `reject`)
//   restart    200 text/event-stream: the `mcp-resume` control event, then a fresh stream that stays open
//              (policy `restart`)
//   sse-error  200 text/event-stream: the control event, then `event: message` carrying the guard's JSON-RPC
//              error (id null, the guard cannot know the client's request id), then the end of the stream
// The real Client + StreamableHTTPClientTransport meets each in two ways:
//   explicit   client.request(tools/call, {resumptionToken}) — an application resuming a call it persisted
//   auto       the transport's own reconnection after the server closed a POST stream (2025-11-25 polling)
// For each: ms to the first onerror, ms until the request promise settles (and how), HTTP requests made.
// `--abort-on-error` shows the application-side fix: abort the request from onerror.
// The same answers from the real guard in real Envoy are measured by tests/e2e/test_interop_ts.py.
import http from 'node:http';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const argv = process.argv.slice(2);
const opt = {};
for (let i = 0; i < argv.length; i++) if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[i + 1]?.startsWith('--') || argv[i + 1] === undefined ? true : argv[++i];
const PORT = Number(opt.port ?? 9150);
const TIMEOUT = Number(opt.timeout ?? 3000);
const ABORT_ON_ERROR = !!opt['abort-on-error'];

const REASON = 'session_mismatch';
const guardError = JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32010,
  message: `Last-Event-ID not honoured (${REASON}): reconnect without Last-Event-ID to open a new stream`,
  data: { resumed: false, reason: REASON } } });
const control = `event: mcp-resume\ndata: {"resumed":false,"reason":"${REASON}"}\n\n`;

let mode = 'reject';
let requests = 0;
const open = new Set();
const server = http.createServer((req, res) => {
  requests++;
  let body = '';
  req.on('data', c => { body += c; });
  req.on('end', () => {
    const msg = body ? JSON.parse(body) : null;
    const sse = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'mcp-session-id': 's1' };
    if (req.method === 'POST' && msg?.method === 'initialize') {
      res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 's1' });
      return res.end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { protocolVersion: '2025-11-25',
        capabilities: { tools: {} }, serverInfo: { name: 'stand-in', version: '0' } } }));
    }
    if (req.method === 'POST' && msg?.method === 'tools/call') {
      // 2025-11-25 polling: priming event with retry, one progress, then the server closes the stream.
      res.writeHead(200, sse);
      res.write('id: p0\nretry: 100\ndata: \n\n');
      return res.end();
    }
    if (req.method === 'POST') { res.writeHead(202); return res.end(); }
    if (req.method === 'GET' && !req.headers['last-event-id']) { res.writeHead(405); return res.end(); }
    if (req.method === 'GET') {
      if (mode === 'reject') {
        res.writeHead(409, { 'content-type': 'application/json', 'mcp-resume': `rejected; reason=${REASON}` });
        return res.end(guardError);
      }
      res.writeHead(200, { ...sse, 'mcp-resume': `restarted; reason=${REASON}` });
      res.write(control);
      if (mode === 'sse-error') { res.write(`event: message\ndata: ${guardError}\n\n`); return res.end(); }
      open.add(res); // restart: a fresh stream that carries nothing for this request
      res.on('close', () => open.delete(res));
      return;
    }
    res.writeHead(405); res.end();
  });
});

async function once(how) {
  requests = 0;
  const t0 = Date.now();
  const errors = [];
  const transport = new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${PORT}/mcp`), {
    reconnectionOptions: { initialReconnectionDelay: 1000, maxReconnectionDelay: 30000, reconnectionDelayGrowFactor: 1.5, maxRetries: 2 },
  });
  const client = new Client({ name: 'failure-speed', version: '0' });
  const ac = new AbortController();
  client.onerror = e => {
    errors.push({ t: Date.now() - t0, e: String(e?.message ?? e) });
    if (ABORT_ON_ERROR && !/aborted/.test(String(e?.message))) ac.abort(e);
  };
  await client.connect(transport);
  const base = requests;
  const start = Date.now();
  errors.length = 0;
  const params = { name: 'work', arguments: {} };
  const p = how === 'explicit'
    ? client.request({ method: 'tools/call', params }, CallToolResultSchema, { resumptionToken: 'cursor-1', timeout: TIMEOUT, signal: ac.signal })
    : client.request({ method: 'tools/call', params }, CallToolResultSchema, { timeout: TIMEOUT, signal: ac.signal });
  let outcome;
  try { await p; outcome = 'result'; } catch (e) { outcome = /timed out/i.test(String(e?.message)) ? 'timeout' : `error`; }
  const settled = Date.now() - start;
  const firstError = errors.find(x => x.t >= start - t0);
  const r = { how, outcome, settled_ms: settled, first_error_ms: firstError ? firstError.t - (start - t0) : null,
    first_error: firstError?.e?.replace(/\s+/g, ' ').slice(0, 100) ?? null, http_requests: requests - base };
  await transport.close().catch(() => {});
  for (const res of open) res.destroy();
  return r;
}

server.listen(PORT, '127.0.0.1', async () => {
  const results = [];
  for (const m of ['reject', 'restart', 'sse-error']) {
    mode = m;
    for (const how of ['explicit', 'auto']) results.push({ answer: m, ...(await once(how)) });
  }
  console.log(JSON.stringify({ timeout_ms: TIMEOUT, abort_on_error: ABORT_ON_ERROR, results }));
  server.close();
  process.exit(0);
});
setTimeout(() => { console.log(JSON.stringify({ fatal: 'hard timeout' })); process.exit(3); }, 60000).unref();
