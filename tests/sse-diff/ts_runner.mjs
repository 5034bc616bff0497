// What the TypeScript MCP SDK's client reads from an event stream: the exact pipeline of
// @modelcontextprotocol/sdk client/streamableHttp.js (_handleSseStream): bytes -> TextDecoderStream
// -> eventsource-parser's EventSourceParserStream. (The SDK then keeps `if (event.id) lastEventId = event.id`;
// core/tests/sse_differential.rs derives that from the ids printed here.)
// stdin: one case per line, {"b": base64 stream, "s": [split offsets, ascending]}.
// stdout: one line per case, {"events": [{"event", "data", "id"}], "retry": [ms]}: every event the parser
// yields, in order (`event`/`id` null when the parser leaves them undefined), and every reconnection time
// it reported (onRetry), in order.
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

// Resolved as the SDK resolves it, from tests/interop (its node_modules, `make interop-deps`).
const interop = join(dirname(fileURLToPath(import.meta.url)), '..', 'interop', 'package.json');
const parserPath = createRequire(interop).resolve('eventsource-parser/stream');
const { EventSourceParserStream } = await import(parserPath);

async function run(bytes, splits) {
  const chunks = [];
  let at = 0;
  for (const s of [...splits, bytes.length]) {
    chunks.push(bytes.subarray(at, s));
    at = s;
  }
  const source = new ReadableStream({
    start(controller) {
      for (const c of chunks) controller.enqueue(c);
      controller.close();
    },
  });
  const retry = [];
  const reader = source
    .pipeThrough(new TextDecoderStream())
    .pipeThrough(new EventSourceParserStream({ onRetry: (ms) => retry.push(ms) }))
    .getReader();
  const events = [];
  for (;;) {
    const { value: event, done } = await reader.read();
    if (done) break;
    events.push({ event: event.event ?? null, data: event.data, id: event.id ?? null });
  }
  return { events, retry };
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (!line) continue;
  const c = JSON.parse(line);
  const out = await run(Buffer.from(c.b, 'base64'), c.s);
  process.stdout.write(JSON.stringify(out) + '\n');
}
