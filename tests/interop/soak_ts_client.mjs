// Real TypeScript SDK clients for `make soak-sdk` (tests/chaos/soak_sdk.py): --clients applications in one
// process, each calling a long-running tool again and again through one of --urls with the SDK's own
// automatic reconnection (its default options) and a --timeout-ms request timeout, until --seconds are up.
// Client i talks to pool --pools[i % n] (the header x-soak-pool routes it to that pool's replicas) and calls
// that pool's tool. Every call's outcome, as the APPLICATION sees it, is one JSON line on stdout:
//   {sdk, client, pool, start, end, outcome: completed|settled|error|hung, reason, code, message, break_at,
//    replica, progress, resumes, answers, violations, phase, stale_resume}
// phase: `initialize` when the call's application was still opening its session (a new one after an error).
// break_at: when a stream carrying the pending call ended or failed without its response (epoch ms), the first
// such end since the call's progress last flowed;
// replica: the session's replica (from the affinity envelope in Mcp-Session-Id). Violations seen here: a
// progress value repeated or skipped, a result before every step, a result that is not this call's, a
// response for an unknown request.
//
//   node soak_ts_client.mjs --urls http://127.0.0.1:10005/mcp,... --pools everything,py --clients 20 \
//     --seconds 150 --timeout-ms 30000 --seed 1
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const argv = process.argv.slice(2);
const opt = {};
for (let i = 0; i < argv.length; i++) if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[i + 1];
const urls = String(opt.urls).split(',');
const pools = String(opt.pools ?? 'everything').split(',');
const CLIENTS = Number(opt.clients ?? 1);
const TIMEOUT = Number(opt['timeout-ms'] ?? 30000);
const deadline = Date.now() + Number(opt.seconds ?? 60) * 1000;
let seed = Number(opt.seed ?? 1) >>> 0;
const rand = () => { seed = (seed * 1664525 + 1013904223) >>> 0; return seed / 2 ** 32; };
const sleep = ms => new Promise(r => setTimeout(r, ms));
const emit = rec => process.stdout.write(JSON.stringify(rec) + '\n');
const REASON = /not honoured \((\w+)\)/;

// The long-running tool of each pool: its name, arguments for this call, and the result text it must give.
const TOOLS = {
  everything: () => {
    const duration = [2.5, 3, 3.5][Math.floor(rand() * 3)];
    return { name: 'trigger-long-running-operation', args: { duration, steps: 6 }, steps: 6,
      expect: `Duration: ${duration} seconds, Steps: 6.` };
  },
  py: tag => ({ name: 'progress_steps', args: { steps: 6, step_ms: 500, tag }, steps: 6, expect: `done ${tag} 6 steps` }),
  rmcp: tag => ({ name: 'progress', args: { steps: 6, step_ms: 500, label: tag }, steps: 6, expect: `label=${tag} ` }),
};

// The session's replica, from the envelope stateful_session value `<base64 ip:port>;UV:<base64 id>`.
function replicaOf(session) {
  if (!session || !session.includes(';UV:')) return null;
  try { return Buffer.from(session.split(';UV:')[0], 'base64').toString(); } catch { return null; }
}

class App {
  constructor(i) {
    this.i = i;
    this.pool = pools[i % pools.length];
    this.url = new URL(urls[i % urls.length]);
    this.n = 0;
    this.call = null; // the pending call's record
    this.client = null;
    this.replica = null;
  }

  // fetch: notes the session's replica, the pending call's request id, every resume, and when a stream
  // carrying the call ends or fails without the call's response (the break).
  fetch = async (url, init = {}) => {
    const call = this.call;
    const method = init.method ?? 'GET';
    let callStream = false;
    if (call && method === 'POST' && typeof init.body === 'string' && init.body.includes('"tools/call"')) {
      try { call.rpc_id = JSON.parse(init.body).id; callStream = true; } catch { /* not one message */ }
    }
    const lastEventId = new Headers(init.headers).get('last-event-id');
    if (call && method === 'GET' && lastEventId) {
      call.resumes += 1;
      callStream = true;
      // A resume from an older cursor than the newest event the SDK was given for this call: whatever the
      // replay repeats, the SDK asked for it.
      if (call.last_id && lastEventId !== call.last_id) call.stale_resume = true;
    }
    const res = await fetch(url, init);
    const session = res.headers.get('mcp-session-id');
    if (session && !this.replica) this.replica = replicaOf(session);
    if (call && lastEventId) call.answers.push(`${res.status} ${res.headers.get('mcp-resume') ?? ''}`.trim());
    if (!callStream || !res.body || !(res.headers.get('content-type') ?? '').includes('text/event-stream')) return res;
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let text = '';
    let buf = '';
    // What this stream carried, kept for the report when the call shows a violation.
    const wire = { method, last_event_id: lastEventId?.slice(0, 16) ?? null, head: '' };
    call.wire.push(wire);
    const broke = () => {
      const answered = call.rpc_id !== undefined && new RegExp(`"id":\\s*${call.rpc_id}[,}]`).test(text);
      if (!answered && call.break_at === null && !call.done) call.break_at = Date.now();
    };
    const body = new ReadableStream({
      async pull(ctrl) {
        let r;
        try { r = await reader.read(); } catch (e) { broke(); ctrl.error(e); return; }
        if (r.done) { broke(); ctrl.close(); return; }
        const chunk = dec.decode(r.value, { stream: true });
        // Progress flows again: the break (if any) is over; the next one counts from its own start.
        if (chunk.includes('notifications/progress')) call.break_at = null;
        text = (text + chunk).slice(-65536);
        // The newest event id the client has received whole for this call.
        buf += chunk;
        const events = buf.split(/\r\n\r\n|\n\n|\r\r/);
        buf = events.pop();
        for (const ev of events) {
          const m = ev.match(/^id: ?(.*?)\r?$/m);
          if (m) call.last_id = m[1];
        }
        if (wire.head.length < 1500) wire.head = (wire.head + chunk).slice(0, 1500);
        ctrl.enqueue(r.value);
      },
      cancel(reason) { return reader.cancel(reason).catch(() => {}); },
    });
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };

  async connect() {
    const transport = new StreamableHTTPClientTransport(this.url, {
      fetch: this.fetch, requestInit: { headers: { 'x-soak-pool': this.pool } },
    });
    const client = new Client({ name: `soak-ts-${this.i}`, version: '1.0.0' });
    client.onerror = e => {
      const m = String(e?.message ?? e);
      if (/unknown message ID|unknown progress token/i.test(m) && this.call) this.call.violations.push(`misdelivered: ${m.slice(0, 160)}`);
    };
    this.replica = null;
    await client.connect(transport, { timeout: TIMEOUT });
    this.client = client;
  }

  async drop() {
    const c = this.client;
    this.client = null;
    if (c) await c.close().catch(() => {});
  }

  async once() {
    const tag = `ts${this.i}-${this.n++}`;
    const tool = TOOLS[this.pool](tag);
    const call = this.call = { sdk: 'typescript', client: `ts-${this.i}`, pool: this.pool, start: Date.now(), end: null,
      outcome: null, reason: null, code: null, message: null, break_at: null, replica: null, progress: [], resumes: 0,
      answers: [], violations: [], wire: [], phase: null, done: false };
    try {
      if (!this.client) {
        call.phase = 'initialize';
        await this.connect();
      }
      call.phase = 'call';
      call.replica = this.replica;
      const r = await this.client.request({ method: 'tools/call', params: { name: tool.name, arguments: tool.args } },
        CallToolResultSchema, {
          timeout: TIMEOUT,
          onprogress: p => {
            const k = p.progress;
            const prev = call.progress.at(-1) ?? 0;
            if (k <= prev) call.violations.push(`progress ${k} repeated after ${prev}`);
            else if (k !== prev + 1) call.violations.push(`progress ${k} after ${prev}: skipped without a signal`);
            call.progress.push(k);
          },
        });
      call.outcome = 'completed';
      const text = (r.content ?? []).map(c => c.text ?? '').join('\n');
      if (!text.includes(tool.expect)) call.violations.push(`result not this call's: ${text.slice(0, 160)}`);
      if (call.progress.length !== tool.steps) call.violations.push(`result after progress ${JSON.stringify(call.progress)}`);
    } catch (e) {
      const m = String(e?.message ?? e);
      call.code = e?.code ?? null;
      call.message = m.slice(0, 240);
      const reason = m.match(REASON)?.[1] ?? e?.data?.reason ?? null;
      if (call.code === -32010 || reason) { call.outcome = 'settled'; call.reason = reason; }
      else if (call.code === -32001 || /timed out/i.test(m)) call.outcome = 'hung';
      else call.outcome = 'error';
    }
    call.done = true;
    call.end = Date.now();
    this.call = null;
    delete call.done;
    delete call.rpc_id;
    delete call.last_id;
    if (!call.violations.length) delete call.wire;
    emit(call);
    // A settled call leaves the session usable; anything else starts a new session, as an application would.
    if (call.outcome !== 'completed' && call.outcome !== 'settled') await this.drop();
  }

  async run() {
    await sleep(rand() * 1000);
    while (Date.now() < deadline) {
      await this.once();
      await sleep(50 + rand() * 200);
    }
    await this.drop();
  }
}

// Calls start until --seconds are up; the last ends within its timeout.
const hard = setTimeout(() => { emit({ fatal: 'hard timeout' }); process.exit(3); },
  Number(opt.seconds ?? 60) * 1000 + TIMEOUT + 20000);
Promise.all(Array.from({ length: CLIENTS }, (_, i) => new App(i).run()))
  .then(() => { clearTimeout(hard); emit({ finished: CLIENTS }); process.exit(0); })
  .catch(e => { clearTimeout(hard); emit({ fatal: String(e?.stack ?? e) }); process.exit(2); });
