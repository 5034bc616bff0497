// A real TypeScript SDK client for the chaos soak (tests/chaos/chaos.py): for --seconds it makes side-effecting
// tool calls (ledger_append on the naive replicas) through one of --urls, letting the SDK's own transport
// reconnect with Last-Event-ID when faults break the stream. It checks what it can see itself (progress
// without gaps or repeats, a result only after every step) and prints one JSON line with its counts, the
// entries whose call was accepted (POST answered 200) or completed, and any violation.
//
//   node ts_chaos_client.mjs --urls http://127.0.0.1:10000/mcp,http://127.0.0.1:10010/mcp --seconds 60 --seed 7
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const argv = process.argv.slice(2);
const opt = {};
for (let i = 0; i < argv.length; i++) {
  if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[i + 1];
}
const urls = String(opt.urls).split(',');
const deadline = Date.now() + Number(opt.seconds ?? 60) * 1000;
let seed = Number(opt.seed ?? 1) >>> 0;
const rand = () => { seed = (seed * 1664525 + 1013904223) >>> 0; return seed / 2 ** 32; };
const out = { calls: 0, results: 0, errors: 0, accepted: [], completed: [], violations: [], error_kinds: {} };
const sleep = ms => new Promise(r => setTimeout(r, ms));

async function oneCall(n) {
  const entry = `chaos-ts-${opt.seed}-${n}`;
  const url = new URL(urls[Math.floor(rand() * urls.length)]);
  let accepted = false;
  const fetchLogged = async (u, init = {}) => {
    const res = await fetch(u, init);
    if ((init.method ?? 'GET') === 'POST' && typeof init.body === 'string' && init.body.includes(entry)
        && res.status === 200) accepted = true;
    return res;
  };
  const transport = new StreamableHTTPClientTransport(url, {
    fetch: fetchLogged,
    reconnectionOptions: { initialReconnectionDelay: 100, maxReconnectionDelay: 800, reconnectionDelayGrowFactor: 1.5,
      maxRetries: 3 },
  });
  const client = new Client({ name: 'chaos-ts', version: '1.0.0' });
  client.onerror = () => {};
  try {
    await client.connect(transport);
  } catch (e) {
    out.error_kinds.connect = (out.error_kinds.connect ?? 0) + 1;
    await transport.close().catch(() => {});
    return;
  }
  out.calls += 1;
  const progress = [];
  try {
    await client.request({ method: 'tools/call', params: { name: 'ledger_append',
      arguments: { entry, steps: 5, step_ms: 80 } } }, CallToolResultSchema, {
      timeout: 6000,
      onprogress: p => {
        const k = p.progress;
        if (progress.length && k !== progress.at(-1) + 1) out.violations.push({ kind: 'progress_gap_or_dup', entry, progress: [...progress], next: k });
        progress.push(k);
      },
    });
    out.results += 1;
    out.completed.push(entry);
    if (progress.length !== 5 || progress[0] !== 1) out.violations.push({ kind: 'result_without_every_step', entry, progress });
  } catch (e) {
    out.errors += 1;
    const kind = /timed out/i.test(String(e?.message)) ? 'timeout' : 'error';
    out.error_kinds[kind] = (out.error_kinds[kind] ?? 0) + 1;
  }
  if (accepted) out.accepted.push(entry);
  await transport.close().catch(() => {});
}

async function main() {
  let n = 0;
  while (Date.now() < deadline - 7000) {
    await oneCall(n++);
    await sleep(100 + rand() * 400);
  }
}

const hard = setTimeout(() => { out.fatal = 'hard timeout'; console.log(JSON.stringify(out)); process.exit(3); },
  Number(opt.seconds ?? 60) * 1000 + 20000);
main().then(() => { clearTimeout(hard); console.log(JSON.stringify(out)); process.exit(0); })
  .catch(e => { clearTimeout(hard); out.fatal = String(e?.stack ?? e); console.log(JSON.stringify(out)); process.exit(2); });
