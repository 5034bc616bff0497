// An MCP replica built from the real TypeScript SDK (@modelcontextprotocol/sdk, pinned in package.json).
//
//   node ts_server.mjs --port 9101 --name r1 [--retry-ms 200] [--store-limit N] [--contiguity] [--keepalive-ms MS]
//
// * StreamableHTTPServerTransport per session (sessions live in this process only), with an event store and
//   `retryInterval`: on 2025-11-25 the SDK writes a priming event (id + empty data) with `retry:`, and the
//   tool can close the stream (`closeSSEStream`) so the client polls with Last-Event-ID.
// * One event store shared by every session of the process, like the SDK's example store it never checks
//   which session a cursor belongs to (the cross-session replay the guard refuses). Unlike the example store
//   it replays in insertion order (the example sorts `<stream>_<ms>_<rand>` ids as strings, which reorders
//   events minted in the same millisecond) and knows the `_GET_stream` id (which the example's
//   split('_')[0] turns into '').
// * Tool `progress_steps {steps, step_ms, close_every?, tag?}`: one progress notification per step, then a text
//   result; `close_every: k` closes the SSE stream after every k-th step (server-side polling, 2025-11-25 only).
// * Tool `produce {n, step_ms?}`: n `notifications/message` on the session's standalone GET stream, numbered
//   per session (`data.n`), whether or not a client listens: the SDK stores them for a later replay.
// * `--store-limit N`: a trimming store instead, like the SDKs' example stores: the last N events per stream,
//   evicted ids forgotten, no getStreamIdForEventId. `--contiguity`: the store wrapped by the contiguity
//   adapter (adapters/typescript). `--keepalive-ms`: the transport's SSE keep-alive interval.
// * Test hooks, never on /mcp: GET /_interop/state (tool calls and the Last-Event-ID of every request),
//   POST /_interop/expire?session=ID (forget a session: later requests get 404), POST /_interop/reset.
// Listens on 127.0.0.1 only; every response carries `x-replica: <name>`.
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]?.startsWith('--') ? true : all[i + 1]]);
  return acc;
}, []));
const PORT = Number(args.port ?? 9101);
const NAME = args.name ?? `ts-${PORT}`;
const RETRY_MS = Number(args['retry-ms'] ?? 200);
const STORE_LIMIT = Number(args['store-limit'] ?? 0);
const CONTIGUITY = 'contiguity' in args;
const KEEPALIVE_MS = args['keepalive-ms'] === undefined ? undefined : Number(args['keepalive-ms']);

class OrderedEventStore {
  constructor() {
    this.seq = 0;
    this.events = new Map(); // eventId -> {streamId, message, seq}
    this.byStream = new Map(); // streamId -> [eventId]
  }
  async storeEvent(streamId, message) {
    const id = `${streamId}_${NAME}_${++this.seq}`;
    this.events.set(id, { streamId, message });
    if (!this.byStream.has(streamId)) this.byStream.set(streamId, []);
    this.byStream.get(streamId).push(id);
    return id;
  }
  async getStreamIdForEventId(eventId) {
    return this.events.get(eventId)?.streamId;
  }
  async replayEventsAfter(lastEventId, { send }) {
    const ev = this.events.get(lastEventId);
    if (!ev) return '';
    const ids = this.byStream.get(ev.streamId) ?? [];
    for (const id of ids.slice(ids.indexOf(lastEventId) + 1)) {
      const { message } = this.events.get(id);
      if (message && Object.keys(message).length > 0) await send(id, message);
    }
    return ev.streamId;
  }
}

class TrimmingEventStore {
  constructor(limit) {
    this.limit = limit;
    this.seq = 0;
    this.events = new Map(); // eventId -> {streamId, message}
    this.byStream = new Map(); // streamId -> [eventId], oldest first, at most `limit`
  }
  async storeEvent(streamId, message) {
    const id = `${streamId}_${NAME}_${++this.seq}`;
    this.events.set(id, { streamId, message });
    if (!this.byStream.has(streamId)) this.byStream.set(streamId, []);
    const ids = this.byStream.get(streamId);
    ids.push(id);
    while (ids.length > this.limit) this.events.delete(ids.shift());
    return id;
  }
  async replayEventsAfter(lastEventId, { send }) {
    const ev = this.events.get(lastEventId);
    if (!ev) return '';
    const ids = this.byStream.get(ev.streamId) ?? [];
    for (const id of ids.slice(ids.indexOf(lastEventId) + 1)) {
      const { message } = this.events.get(id);
      if (message && Object.keys(message).length > 0) await send(id, message);
    }
    return ev.streamId;
  }
}

const { withContiguity } = await import('../../adapters/typescript/index.js');
const inner = STORE_LIMIT > 0 ? new TrimmingEventStore(STORE_LIMIT) : new OrderedEventStore();
const store = CONTIGUITY ? withContiguity(inner) : inner;
const transports = new Map(); // session id -> transport
const state = { name: NAME, tool_calls: [], requests: [] };

function newServer() {
  const server = new McpServer({ name: `interop-ts-${NAME}`, version: '1.0.0' }, { capabilities: { logging: {} } });
  let produced = 0;
  server.registerTool('produce', {
    description: 'Sends n notifications on the standalone GET stream, listened to or not',
    inputSchema: { n: z.number().int().min(1).max(10000), step_ms: z.number().int().min(0).max(1000).optional() },
  }, async ({ n, step_ms }) => {
    for (let i = 0; i < n; i++) {
      if (step_ms) await new Promise(r => setTimeout(r, step_ms));
      await server.server.notification({ method: 'notifications/message',
        params: { level: 'info', data: { replica: NAME, n: ++produced } } });
    }
    return { content: [{ type: 'text', text: `produced ${produced}` }] };
  });
  server.registerTool('progress_steps', {
    description: 'Streams one progress notification per step, then returns a result',
    inputSchema: { steps: z.number().int().min(1).max(100), step_ms: z.number().int().min(0).max(10000),
      close_every: z.number().int().min(1).optional(), tag: z.string().optional() },
  }, async ({ steps, step_ms, close_every, tag }, extra) => {
    const call = { tag: tag ?? null, session: extra.sessionId, steps, done: false };
    state.tool_calls.push(call);
    const token = extra._meta?.progressToken;
    for (let i = 1; i <= steps; i++) {
      await new Promise(r => setTimeout(r, step_ms));
      if (token !== undefined) {
        await extra.sendNotification({ method: 'notifications/progress',
          params: { progressToken: token, progress: i, total: steps, message: `step ${i}` } });
      }
      if (close_every !== undefined && i % close_every === 0 && i < steps && extra.closeSSEStream) extra.closeSSEStream();
    }
    call.done = true;
    return { content: [{ type: 'text', text: `done ${tag ?? ''} ${steps} steps on ${NAME}` }] };
  });
  return server;
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', c => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString()));
    req.on('error', reject);
  });
}

function json(res, status, obj) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(obj));
}

const httpServer = http.createServer(async (req, res) => {
  res.setHeader('x-replica', NAME);
  const url = new URL(req.url, `http://${req.headers.host ?? '127.0.0.1'}`);
  try {
    if (url.pathname === '/_interop/state') return json(res, 200, { ...state, sessions: [...transports.keys()] });
    if (url.pathname === '/_interop/reset') { state.tool_calls = []; state.requests = []; return json(res, 200, {}); }
    if (url.pathname === '/_interop/expire') {
      const sid = url.searchParams.get('session');
      const t = transports.get(sid);
      transports.delete(sid);
      if (t) await t.close();
      return json(res, t ? 200 : 404, {});
    }
    if (url.pathname !== '/mcp') return json(res, 404, { error: 'not found' });

    const sid = req.headers['mcp-session-id'];
    state.requests.push({ method: req.method, session: sid ?? null,
      last_event_id: req.headers['last-event-id'] ?? null,
      mcp_protocol_version: req.headers['mcp-protocol-version'] ?? null });
    if (state.requests.length > 2000) state.requests.splice(0, 1000);
    const body = req.method === 'POST' ? JSON.parse((await readBody(req)) || 'null') : undefined;

    if (sid) {
      const t = transports.get(sid);
      if (!t) return json(res, 404, { jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } });
      return await t.handleRequest(req, res, body);
    }
    if (req.method === 'POST' && body && isInitializeRequest(body)) {
      const transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: store,
        retryInterval: RETRY_MS,
        keepAliveMs: KEEPALIVE_MS,
        onsessioninitialized: id => transports.set(id, transport),
      });
      transport.onclose = () => { if (transport.sessionId) transports.delete(transport.sessionId); };
      await newServer().connect(transport);
      return await transport.handleRequest(req, res, body);
    }
    return json(res, 400, { jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Bad Request: No valid session ID provided' } });
  } catch (e) {
    console.error('request failed', e);
    if (!res.headersSent) json(res, 500, { jsonrpc: '2.0', id: null, error: { code: -32603, message: String(e) } });
  }
});

httpServer.listen(PORT, '127.0.0.1', () => console.log(`ts replica ${NAME} on 127.0.0.1:${PORT}`));
const stop = () => { httpServer.close(); for (const t of transports.values()) t.close().catch(() => {}); setTimeout(() => process.exit(0), 200).unref(); };
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
