// Against the real TypeScript SDK (server transport, example event store, Client): the wrapper's assertion
// goes out first on every replay, and a client talking to the server without a guard is not affected.
// The SDK comes from tests/interop/node_modules (or MCP_SDK_DIR: a dist/esm directory of the SDK).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { withContiguity, REPLAY_METHOD } from '../index.js';

const SDK = process.env.MCP_SDK_DIR
  ? new URL(`file://${process.env.MCP_SDK_DIR.replace(/\/?$/, '/')}`)
  : new URL('../../../tests/interop/node_modules/@modelcontextprotocol/sdk/dist/esm/', import.meta.url);
const sdk = p => import(new URL(p, SDK).href);
const { McpServer } = await sdk('server/mcp.js');
const { StreamableHTTPServerTransport } = await sdk('server/streamableHttp.js');
const { InMemoryEventStore } = await sdk('examples/shared/inMemoryEventStore.js');
const { Client } = await sdk('client/index.js');
const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');
const { CallToolResultSchema, isInitializeRequest } = await sdk('types.js');
const { z } = await import(new URL('../../zod/index.js', SDK).href).catch(() =>
  import(new URL('../../../../zod/index.js', SDK).href));

const PORT = 9170 + Number(process.env.E2E_PORT_OFFSET ?? 0);
const URL_ = `http://127.0.0.1:${PORT}/mcp`;
const store = withContiguity(new InMemoryEventStore());
const transports = new Map();
let server;

function mcpServer() {
  const s = new McpServer({ name: 'adapter-test', version: '1.0.0' });
  s.registerTool('steps', { description: 'progress per step, then a result',
    inputSchema: { n: z.number().int(), ms: z.number().int() } }, async ({ n, ms }, extra) => {
    for (let i = 1; i <= n; i++) {
      await new Promise(r => setTimeout(r, ms));
      await extra.sendNotification({ method: 'notifications/progress',
        params: { progressToken: extra._meta?.progressToken, progress: i, total: n } });
    }
    // The example store orders ids `<stream>_<ms>_<random>` as strings: a result stored in the same
    // millisecond as the last progress could replay before it. Keep every event in its own ms.
    await new Promise(r => setTimeout(r, ms));
    return { content: [{ type: 'text', text: `done ${n}` }] };
  });
  return s;
}

before(async () => {
  server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    const sid = req.headers['mcp-session-id'];
    if (sid && transports.has(sid)) return transports.get(sid).handleRequest(req, res, body);
    if (req.method === 'POST' && isInitializeRequest(body)) {
      const t = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(), eventStore: store,
        onsessioninitialized: id => transports.set(id, t) });
      await mcpServer().connect(t);
      return t.handleRequest(req, res, body);
    }
    res.writeHead(400).end();
  });
  await new Promise(r => server.listen(PORT, '127.0.0.1', r));
});

after(async () => {
  for (const t of transports.values()) await t.close().catch(() => {});
  server.closeAllConnections?.();
  await new Promise(r => server.close(r));
});

async function connect(sessionId) {
  const transport = new StreamableHTTPClientTransport(new URL(URL_), { sessionId,
    reconnectionOptions: { initialReconnectionDelay: 50, maxReconnectionDelay: 200, reconnectionDelayGrowFactor: 1, maxRetries: 1 } });
  const client = new Client({ name: 'adapter-test', version: '1.0.0' });
  const errors = [];
  client.onerror = e => errors.push(String(e?.message ?? e));
  await client.connect(transport);
  if (sessionId) transport.setProtocolVersion('2025-11-25');
  return { client, transport, errors };
}

test('the real client resumes a call through the wrapper: every progress and the result once, no error', async () => {
  const a = await connect();
  const sessionId = a.transport.sessionId;
  let token;
  const first = [];
  let dropped;
  const gotTwo = new Promise(r => { dropped = r; });
  const p = a.client.request({ method: 'tools/call', params: { name: 'steps', arguments: { n: 5, ms: 80 } } },
    CallToolResultSchema, { timeout: 8000, onresumptiontoken: t => { token = t; },
      onprogress: pr => { first.push(pr.progress); if (first.length === 2) dropped(); } });
  p.catch(() => {});
  await gotTwo;
  await a.transport.close();
  await new Promise(r => setTimeout(r, 500)); // the call finishes while nobody listens
  const b = await connect(sessionId);
  const seen = [];
  const orig = b.transport.onmessage;
  const second = [];
  // Replayed progress carries the first request's token: read it off the transport.
  b.transport.onmessage = (m, extra) => {
    seen.push(m.method ?? 'response');
    if (m.method === 'notifications/progress') second.push(m.params.progress);
    orig?.(m, extra);
  };
  const r = await b.client.request({ method: 'tools/call', params: { name: 'steps', arguments: { n: 5, ms: 80 } } },
    CallToolResultSchema, { timeout: 8000, resumptionToken: token });
  assert.equal(r.content[0].text, 'done 5');
  assert.deepEqual([...first, ...second], [1, 2, 3, 4, 5]);
  assert.ok(seen.includes(REPLAY_METHOD), 'the assertion reached the client transport, which ignores it');
  // The SDK's own complaints (the aborted stream, the replayed progress of the first request's token)
  // are the same without the wrapper; none is about the assertion.
  assert.deepEqual([...a.errors, ...b.errors].filter(e => e.includes(REPLAY_METHOD) || /replay/i.test(e)), []);
  await b.transport.close();
});

test('on the wire: the replay starts with the assertion, its id is the cursor', async () => {
  const c = await connect();
  const sessionId = c.transport.sessionId;
  const ids = [];
  // 5 ms apart: the example store orders ids `<stream>_<ms>_<random>` as strings, so events of one
  // millisecond replay in random order (which the wrapper reports as not_contiguous).
  await c.client.request({ method: 'tools/call', params: { name: 'steps', arguments: { n: 3, ms: 5 } } },
    CallToolResultSchema, { timeout: 8000, onresumptiontoken: t => ids.push(t) });
  await c.transport.close();
  const res = await fetch(URL_, { headers: { accept: 'text/event-stream', 'mcp-session-id': sessionId,
    'mcp-protocol-version': '2025-11-25', 'last-event-id': ids[1] } });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  let text = '';
  const deadline = Date.now() + 3000;
  while (!text.includes(`done 3`) && Date.now() < deadline) {
    const { value, done } = await reader.read();
    if (done) break;
    text += Buffer.from(value).toString();
  }
  await reader.cancel();
  const events = text.split('\n\n').filter(b => b.includes('data:'));
  assert.ok(events[0].includes(`id: ${ids[1]}`), events[0]);
  const first = JSON.parse(events[0].split('\n').find(l => l.startsWith('data: ')).slice(6));
  assert.equal(first.method, REPLAY_METHOD);
  assert.equal(first.params.complete, true, JSON.stringify(first.params));
  assert.equal(first.params.after, ids[1]);
  assert.equal(first.params.count, events.length - 1);
});
