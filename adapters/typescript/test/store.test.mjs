// The wrapper's bookkeeping, against small inner stores (no HTTP).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ContiguityEventStore, REPLAY_METHOD, withContiguity } from '../index.js';

/** Keeps the last `limit` events per stream, forgets evicted ids (like the SDKs' example stores). */
class TrimmingStore {
  constructor(limit = Infinity) { this.limit = limit; this.n = 0; this.streams = new Map(); this.index = new Map(); }
  async storeEvent(streamId, message) {
    const id = `${streamId}_${++this.n}`;
    const q = this.streams.get(streamId) ?? [];
    this.streams.set(streamId, q);
    q.push(id);
    this.index.set(id, { streamId, message });
    while (q.length > this.limit) this.index.delete(q.shift());
    return id;
  }
  async replayEventsAfter(lastEventId, { send }) {
    const ev = this.index.get(lastEventId);
    if (!ev) return '';
    const q = this.streams.get(ev.streamId);
    for (const id of q.slice(q.indexOf(lastEventId) + 1)) {
      const { message } = this.index.get(id);
      if (Object.keys(message).length > 0) await send(id, message);
    }
    return ev.streamId;
  }
}

const note = n => ({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: { n } } });

async function replay(store, cursor) {
  const sent = [];
  const streamId = await store.replayEventsAfter(cursor, { send: async (id, m) => { sent.push([id, m]); } });
  return { streamId, sent, head: sent[0], rest: sent.slice(1) };
}

async function fill(store, streamId, n) {
  const ids = [];
  for (let i = 1; i <= n; i++) ids.push(await store.storeEvent(streamId, note(i)));
  return ids;
}

test('a complete replay starts with an assertion whose id is the cursor', async () => {
  const inner = new TrimmingStore();
  const store = withContiguity(inner);
  const ids = await fill(store, 's', 5);
  const r = await replay(store, ids[1]);
  assert.equal(r.streamId, 's');
  assert.equal(r.head[0], ids[1], 'event id = the cursor: a client resuming after it resumes correctly');
  assert.deepEqual(r.head[1], { jsonrpc: '2.0', method: REPLAY_METHOD,
    params: { v: 1, after: ids[1], complete: true, count: 3 } });
  assert.deepEqual(r.rest.map(([id]) => id), ids.slice(2), 'the inner replay follows, unchanged');
  // Nothing after the head: complete and empty.
  const end = await replay(store, ids[4]);
  assert.deepEqual(end.head[1].params, { v: 1, after: ids[4], complete: true, count: 0 });
});

test('an unknown cursor is "cannot" (unknown_cursor) and the inner answer is passed on', async () => {
  const store = withContiguity(new TrimmingStore());
  await fill(store, 's', 2);
  const r = await replay(store, 'never-issued');
  assert.equal(r.streamId, '');
  assert.deepEqual(r.head, ['never-issued', { jsonrpc: '2.0', method: REPLAY_METHOD,
    params: { v: 1, after: 'never-issued', complete: false, count: 0, reason: 'unknown_cursor' } }]);
  assert.equal(r.rest.length, 0);
});

test('a cursor the inner store evicted: the empty replay ends before the head (truncated)', async () => {
  const store = withContiguity(new TrimmingStore(3));
  const ids = await fill(store, 's', 10);
  const r = await replay(store, ids[2]);
  assert.equal(r.head[1].params.complete, false);
  assert.equal(r.head[1].params.reason, 'truncated');
});

test('a surviving tail that skips events is not contiguous', async () => {
  // An inner store that, like the naive replica, replays what survives after an evicted cursor.
  const inner = new TrimmingStore(3);
  const tail = { ...inner, storeEvent: inner.storeEvent.bind(inner),
    replayEventsAfter: async (last, { send }) => {
      for (const id of inner.streams.get('s')) await send(id, inner.index.get(id).message);
      return 's';
    } };
  const store = new ContiguityEventStore(tail);
  const ids = await fill(store, 's', 10);
  const r = await replay(store, ids[2]);
  assert.deepEqual([r.head[1].params.complete, r.head[1].params.reason], [false, 'not_contiguous']);
  assert.deepEqual(r.rest.map(([id]) => id), ids.slice(7), 'still forwarded: the wrapper never changes a replay');
});

test('events of another stream in a replay are not contiguous', async () => {
  const inner = new TrimmingStore();
  const store = withContiguity(inner);
  const a = await fill(store, 'a', 2);
  const b = await fill(store, 'b', 2);
  inner.replayEventsAfter = async (_last, { send }) => { await send(b[0], note(1)); await send(a[1], note(2)); return 'a'; };
  const r = await replay(store, a[0]);
  assert.equal(r.head[1].params.reason, 'not_contiguous');
});

test('priming events take no number; a priming cursor replays what follows it', async () => {
  const store = withContiguity(new TrimmingStore());
  const priming = await store.storeEvent('s', {});
  const ids = await fill(store, 's', 3);
  const p2 = await store.storeEvent('s', {});
  const r = await replay(store, priming);
  assert.deepEqual(r.head[1].params, { v: 1, after: priming, complete: true, count: 3 });
  const last = await replay(store, p2);
  assert.deepEqual(last.head[1].params, { v: 1, after: p2, complete: true, count: 0 });
  assert.deepEqual(r.rest.map(([id]) => id), ids);
});

test('a forgotten cursor (maxTrackedEvents) is never "complete"', async () => {
  const store = withContiguity(new TrimmingStore(), { maxTrackedEvents: 4 });
  const ids = await fill(store, 's', 6);
  const old = await replay(store, ids[0]);
  assert.equal(old.head[1].params.reason, 'unknown_cursor');
  const recent = await replay(store, ids[3]);
  assert.equal(recent.head[1].params.complete, true);
  assert.ok(store.tracked.size <= 4);
});

test('getStreamIdForEventId is offered only when the inner store has it, and knows tracked cursors', async () => {
  assert.equal(withContiguity(new TrimmingStore()).getStreamIdForEventId, undefined);
  const inner = new TrimmingStore(1);
  inner.getStreamIdForEventId = async id => inner.index.get(id)?.streamId;
  const store = withContiguity(inner);
  const ids = await fill(store, '_GET_stream', 3);
  assert.equal(await inner.getStreamIdForEventId(ids[0]), undefined, 'evicted by the inner store');
  assert.equal(await store.getStreamIdForEventId(ids[0]), '_GET_stream', 'so the replay can say "cannot"');
  assert.equal(await store.getStreamIdForEventId('x'), undefined);
});

test('bad arguments are named', () => {
  assert.throws(() => withContiguity({}), /inner must implement storeEvent and replayEventsAfter/);
  assert.throws(() => withContiguity(new TrimmingStore(), { maxTrackedEvents: 0 }), /maxTrackedEvents/);
});
