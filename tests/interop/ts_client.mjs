// The real TypeScript MCP client (@modelcontextprotocol/sdk Client + StreamableHTTPClientTransport), driven by
// tests/e2e/test_interop_ts.py and test_revisions.py. One scenario per run; prints one JSON object.
//
//   node ts_client.mjs <scenario> --url http://127.0.0.1:10000/mcp [--version 2025-11-25] [--omit-version-header]
//
// Scenarios
//   resume       a tool call whose connection drops after --drop-after progress notifications; a second client
//                on the same session resumes it with `resumptionToken` (the last `onresumptiontoken` value)
//   poll         a tool call whose server closes the SSE stream every --close-every steps (2025-11-25): the
//                transport's automatic reconnection polls with Last-Event-ID until the result
//   cross        session A finishes a call; session B resumes with A's last token
//   resume-token resume --token T (on session --session S, or a fresh one) and report what the client does
//   delete       a call finishes, the client DELETEs the session, then resumes with its last token
//   call         one tool call (used for revisions), reports what it saw
//   refusal      a pending call whose resume the test refuses (--path auto|token, --hook URL, --cut N [--drain]):
//                does the call settle, how fast, with what error, does the session still work
//
// Every HTTP exchange is logged (method, Last-Event-ID sent, status, x-replica, mcp-resume, t_ms), every
// message the transport delivers, every onerror, and when the request settled.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const argv = process.argv.slice(2);
const scenario = argv[0];
const opt = {};
for (let i = 1; i < argv.length; i++) {
  if (!argv[i].startsWith('--')) continue;
  const k = argv[i].slice(2);
  const v = argv[i + 1] && !argv[i + 1].startsWith('--') ? argv[++i] : true;
  opt[k] = v;
}
const URL_ = new URL(opt.url ?? 'http://127.0.0.1:10000/mcp');
const VERSION = opt.version ?? '2025-11-25';
const OMIT_VERSION = !!opt['omit-version-header'];
const TIMEOUT = Number(opt.timeout ?? 8000);
const T0 = Date.now();
const t = () => Date.now() - T0;

const out = { scenario, version: VERSION, http: [], errors: [], messages: [], tokens: [] };
let hookFired = false;
let cutAfter = Number(opt.cut ?? 0);

function cutBody(body, n, drain) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  const enc = new TextEncoder();
  let buf = '';
  let seen = 0;
  return new ReadableStream({
    async pull(ctrl) {
      const { value, done } = await reader.read();
      if (done) { ctrl.close(); return; }
      buf += dec.decode(value, { stream: true });
      let chunk = '';
      let m;
      while ((m = /\r\n\r\n|\n\n|\r\r/.exec(buf))) {
        const ev = buf.slice(0, m.index + m[0].length);
        buf = buf.slice(m.index + m[0].length);
        chunk += ev;
        if (ev.includes('notifications/progress') && ++seen >= n) {
          ctrl.enqueue(enc.encode(chunk));
          if (drain) { while (!(await reader.read()).done) { /* relayed, never delivered */ } } else await reader.cancel().catch(() => {});
          out.cut_ms = t();
          ctrl.close();
          return;
        }
      }
      if (chunk) ctrl.enqueue(enc.encode(chunk));
    },
    cancel(r) { return reader.cancel(r).catch(() => {}); },
  });
}

// fetch wrapper: logs exchanges; rewrites initialize's protocolVersion to --version (older revisions with the
// real client) and drops MCP-Protocol-Version when the revision predates it.
function makeFetch(label) {
  return async (url, init = {}) => {
    const headers = new Headers(init.headers);
    let body = init.body;
    if (typeof body === 'string' && body.includes('"initialize"')) {
      const m = JSON.parse(body);
      if (m.method === 'initialize') { m.params.protocolVersion = VERSION; body = JSON.stringify(m); }
    }
    if (OMIT_VERSION) headers.delete('mcp-protocol-version');
    const rec = { client: label, method: init.method ?? 'GET', last_event_id: headers.get('last-event-id'),
      version_header: headers.get('mcp-protocol-version'), t_ms: t() };
    if (typeof body === 'string') { try { rec.rpc = JSON.parse(body).method ?? null; } catch { /* batch */ } }
    // --hook: before the first resume of the call's stream (a GET with one of its tokens), tell the test, and wait for it to
    // set up a refusal (mark the owner gone, stop the ownership service, …).
    if (opt.hook && !hookFired && rec.method === 'GET' && out.tokens.some(x => x.token === rec.last_event_id)) {
      hookFired = true;
      const h = await fetch(opt.hook, { method: 'POST', body: JSON.stringify({ session: headers.get('mcp-session-id'),
        last_event_id: rec.last_event_id, replica: out.http.find(x => x.rpc === 'tools/call')?.replica ?? null }) });
      out.hook = { status: h.status, t_ms: t() };
      await h.text();
      rec.t_ms = t();
    }
    try {
      const res = await fetch(url, { ...init, headers, body });
      Object.assign(rec, { status: res.status, replica: res.headers.get('x-replica'),
        mcp_resume: res.headers.get('mcp-resume'), content_type: res.headers.get('content-type'), t_resp_ms: t() });
      out.http.push(rec);
      if (cutAfter && rec.rpc === 'tools/call' && res.body) {
        // --cut N: the application's stream ends after N progress events (a broken connection as the
        // transport sees it); with --drain the connection is read to its end first, so the guard relays
        // and records events the application never got.
        const n = cutAfter;
        cutAfter = 0;
        return new Response(cutBody(res.body, n, !!opt.drain), { status: res.status, headers: res.headers });
      }
      return res;
    } catch (e) {
      rec.error = String(e?.name ?? e);
      out.http.push(rec);
      throw e;
    }
  };
}

async function connect(label, sessionId) {
  const transport = new StreamableHTTPClientTransport(URL_, {
    sessionId,
    fetch: makeFetch(label),
    reconnectionOptions: { initialReconnectionDelay: 100, maxReconnectionDelay: 1000,
      reconnectionDelayGrowFactor: 1.5, maxRetries: Number(opt['max-retries'] ?? 2) },
  });
  const client = new Client({ name: `interop-${label}`, version: '1.0.0' });
  client.onerror = e => out.errors.push({ client: label, t_ms: t(), error: String(e?.message ?? e),
    code: e?.code ?? null });
  await client.connect(transport);
  if (sessionId) transport.setProtocolVersion(VERSION);
  const orig = transport.onmessage;
  transport.onmessage = (m, extra) => {
    out.messages.push({ client: label, t_ms: t(), method: m.method ?? null, id: m.id ?? null,
      progress: m.params?.progress ?? null, progressToken: m.params?.progressToken ?? null,
      result: m.result?.content?.[0]?.text ?? null, error: m.error ?? null });
    orig?.(m, extra);
  };
  return { client, transport };
}

function callParams(tag, extra = {}) {
  return { name: 'progress_steps', arguments: { steps: Number(opt.steps ?? 5), step_ms: Number(opt['step-ms'] ?? 120), tag, ...extra } };
}

// A request settled or timed out: what, when.
async function settle(p) {
  try {
    const r = await p;
    return { outcome: 'result', text: r?.content?.[0]?.text ?? null, t_ms: t() };
  } catch (e) {
    return { outcome: /timed out|Request timed out/i.test(String(e?.message)) ? 'timeout' : 'error',
      error: String(e?.message ?? e), code: e?.code ?? null, data: e?.data ?? null, t_ms: t() };
  }
}

async function resumeWith(label, sessionId, token, tag) {
  const { client, transport } = await connect(label, sessionId);
  const progress = [];
  const ac = new AbortController();
  if (opt['abort-on-error']) {
    // The application-level fast fail: a refused resume reaches onerror; abort the pending request then.
    client.onerror = e => {
      out.errors.push({ client: label, t_ms: t(), error: String(e?.message ?? e), code: e?.code ?? null });
      if (e?.code >= 400 || /unknown message ID|Failed to open SSE stream|Maximum reconnection/.test(String(e?.message))) ac.abort(e);
    };
  }
  const started = t();
  const p = client.request({ method: 'tools/call', params: callParams(tag) }, CallToolResultSchema, {
    resumptionToken: token, timeout: TIMEOUT, signal: ac.signal,
    onresumptiontoken: tok => out.tokens.push({ client: label, token: tok }),
    onprogress: pr => progress.push(pr.progress),
  });
  const s = await settle(p);
  s.elapsed_ms = s.t_ms - started;
  const firstErr = out.errors.find(e => e.client === label && e.t_ms >= started);
  s.first_error_ms = firstErr ? firstErr.t_ms - started : null;
  await transport.close().catch(() => {});
  return { ...s, progress };
}

async function main() {
  if (scenario === 'resume') {
    const tag = opt.tag ?? `resume-${T0}`;
    const dropAfter = Number(opt['drop-after'] ?? 2);
    const a = await connect('a');
    const sessionId = a.transport.sessionId;
    const progressA = [];
    let lastToken;
    let drop;
    const dropped = new Promise(r => { drop = r; });
    const p = a.client.request({ method: 'tools/call', params: callParams(tag) }, CallToolResultSchema, {
      timeout: TIMEOUT,
      onresumptiontoken: tok => { lastToken = tok; out.tokens.push({ client: 'a', token: tok }); },
      onprogress: pr => { progressA.push(pr.progress); if (progressA.length >= dropAfter) drop(); },
    });
    p.catch(() => {});
    await Promise.race([dropped, new Promise(r => setTimeout(r, TIMEOUT))]);
    await a.transport.close(); // the connection drops; the call goes on on its replica
    out.session = sessionId;
    out.first = { progress: [...progressA], token: lastToken };
    await new Promise(r => setTimeout(r, Number(opt['wait-ms'] ?? 300)));
    out.second = await resumeWith('b', sessionId, lastToken, tag);
  } else if (scenario === 'poll') {
    const tag = opt.tag ?? `poll-${T0}`;
    const a = await connect('a');
    out.session = a.transport.sessionId;
    const progress = [];
    const p = a.client.request({ method: 'tools/call', params: callParams(tag, { close_every: Number(opt['close-every'] ?? 2) }) },
      CallToolResultSchema, { timeout: TIMEOUT, onprogress: pr => progress.push(pr.progress),
        onresumptiontoken: tok => out.tokens.push({ client: 'a', token: tok }) });
    out.call = { ...(await settle(p)), progress };
    await a.transport.close();
  } else if (scenario === 'cross') {
    const tagA = `cross-a-${T0}`;
    const a = await connect('a');
    let last; // A's first token (its priming event): everything A's call sent follows it
    const r = await settle(a.client.request({ method: 'tools/call', params: callParams(tagA) }, CallToolResultSchema,
      { timeout: TIMEOUT, onresumptiontoken: tok => { last ??= tok; } }));
    out.a = { session: a.transport.sessionId, result: r, token: last };
    // Session B, on A's replica when the test asks for it (no guard: only there does the shared store replay).
    let b;
    const home = out.http.find(h => h.client === 'a' && h.rpc === 'initialize')?.replica;
    for (let i = 0; i < 12; i++) {
      b = await connect(`b${i}`);
      const bInit = out.http.find(h => h.client === `b${i}` && h.rpc === 'initialize');
      if (!opt['same-replica'] || bInit?.replica === home) break;
      await b.transport.terminateSession().catch(() => {});
      await b.transport.close();
    }
    out.b_session = b.transport.sessionId;
    await b.transport.close();
    const label = out.http.filter(h => h.rpc === 'initialize').at(-1).client;
    out.b = await resumeWith(`${label}-resume`, out.b_session, last, `cross-b-${T0}`);
  } else if (scenario === 'resume-token') {
    let sessionId = opt.session;
    if (!sessionId) { const c = await connect('init'); sessionId = c.transport.sessionId; await c.transport.close(); }
    out.session = sessionId;
    out.resume = await resumeWith('r', sessionId, opt.token, `token-${T0}`);
  } else if (scenario === 'delete') {
    const a = await connect('a');
    let last;
    out.session = a.transport.sessionId;
    out.call = await settle(a.client.request({ method: 'tools/call', params: callParams(`del-${T0}`) }, CallToolResultSchema,
      { timeout: TIMEOUT, onresumptiontoken: tok => { last = tok; } }));
    out.token = last;
    await a.transport.terminateSession();
    await a.transport.close();
    // The guard records the DELETE asynchronously (batched); a resume sent in the same
    // millisecond could overtake it and reach the replica, which answers its own 404.
    await new Promise(r => setTimeout(r, 100));
    out.resume = await resumeWith('r', out.session, last, `del-${T0}`);
  } else if (scenario === 'call') {
    const a = await connect('a');
    out.session = a.transport.sessionId;
    out.negotiated = a.transport.protocolVersion ?? null;
    const progress = [];
    out.call = { ...(await settle(a.client.request({ method: 'tools/call', params: callParams(`call-${T0}`,
      opt['close-every'] ? { close_every: Number(opt['close-every']) } : {}) }, CallToolResultSchema,
    { timeout: TIMEOUT, onprogress: pr => progress.push(pr.progress),
      onresumptiontoken: tok => out.tokens.push({ client: 'a', token: tok }) }))), progress };
    await a.transport.close();
  } else if (scenario === 'refusal') {
    // The application's view of a refused resume. A pending tools/call's stream breaks after --cut (auto) or
    // --drop-after (token) progress events; the test refuses the resume (--hook); then: does the call settle,
    // when, with what, and does the session still work (a second call, a ping)?
    const tag = `refusal-${T0}`;
    const a = await connect('a');
    out.session = a.transport.sessionId;
    const progress = [];
    let app = a;
    if ((opt.path ?? 'auto') === 'auto') {
      // The transport's own reconnection (GET + Last-Event-ID) after the stream ended without a response.
      out.call = await settle(a.client.request({ method: 'tools/call', params: callParams(tag) }, CallToolResultSchema, {
        timeout: TIMEOUT, onprogress: pr => progress.push(pr.progress),
        onresumptiontoken: tok => out.tokens.push({ client: 'a', token: tok }) }));
    } else {
      // The application's own resume: connection a is gone after --drop-after progress events; a second
      // client on the same session resumes with a token it kept (--token-index, default the last).
      const dropAfter = Number(opt['drop-after'] ?? 2);
      let drop;
      const dropped = new Promise(r => { drop = r; });
      const p = a.client.request({ method: 'tools/call', params: callParams(tag) }, CallToolResultSchema, {
        timeout: TIMEOUT, onresumptiontoken: tok => out.tokens.push({ client: 'a', token: tok }),
        onprogress: pr => { progress.push(pr.progress); if (progress.length >= dropAfter) drop(); } });
      p.catch(() => {});
      await Promise.race([dropped, new Promise(r => setTimeout(r, TIMEOUT))]);
      await a.transport.close();
      out.cut_ms = t();
      const token = out.tokens.at(Number(opt['token-index'] ?? -1))?.token;
      app = await connect('b', out.session);
      out.call = await settle(app.client.request({ method: 'tools/call', params: callParams(tag) }, CallToolResultSchema, {
        resumptionToken: token, timeout: TIMEOUT }));
    }
    out.call.progress = progress;
    out.second = await settle(app.client.request({ method: 'tools/call',
      params: callParams(`${tag}-second`, { steps: 1, step_ms: 10 }) }, CallToolResultSchema, { timeout: 5000 }));
    try { await app.client.ping({ timeout: 3000 }); out.ping = 'ok'; } catch (e) { out.ping = String(e?.message ?? e); }
    await app.transport.close();
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
}

const hardStop = setTimeout(() => { out.fatal = 'hard timeout'; console.log(JSON.stringify(out)); process.exit(3); },
  Number(opt['hard-timeout'] ?? 30000));
main().then(() => { clearTimeout(hardStop); console.log(JSON.stringify(out)); process.exit(0); })
  .catch(e => { clearTimeout(hardStop); out.fatal = String(e?.stack ?? e); console.log(JSON.stringify(out)); process.exit(2); });
