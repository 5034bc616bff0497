// Contiguity assertions for MCP event stores (TypeScript SDK), extension version 1.
// The wire form and its meaning are specified in docs/contiguity-extension.md of mcp-resume-guard.

/** JSON-RPC method of the assertion. MCP clients ignore notifications they do not know. */
export const REPLAY_METHOD = 'notifications/mcp-resume-guard/replay';
/** Extension version, `params.v`. */
export const VERSION = 1;

/** A priming event (the SDK stores `{}` for it) takes no sequence number: it is never replayed as data. */
function isPriming(message) {
  return message === null || message === undefined
    || (typeof message === 'object' && Object.keys(message).length === 0);
}

/** The assertion a replay of `after` starts with. */
export function assertion(after, complete, count, reason) {
  const params = { v: VERSION, after, complete, count };
  if (!complete && reason) params.reason = reason;
  return { jsonrpc: '2.0', method: REPLAY_METHOD, params };
}

/**
 * Wraps `inner` (any EventStore: storeEvent, replayEventsAfter, optionally getStreamIdForEventId) so that
 * every replay starts with an assertion whose event id is the cursor itself. Event ids, messages and the
 * stream id returned are the inner store's, unchanged.
 *
 * The wrapper numbers each stream's events itself (per process), so it can tell whether a replay is
 * complete: every event after the cursor, in order, up to the stream's head when the replay began.
 * It remembers at most `maxTrackedEvents` ids (oldest forgotten first); a cursor it forgot is
 * answered "cannot" (`unknown_cursor`), never "complete".
 */
export class ContiguityEventStore {
  constructor(inner, { maxTrackedEvents = 100_000 } = {}) {
    if (!inner || typeof inner.storeEvent !== 'function' || typeof inner.replayEventsAfter !== 'function') {
      throw new TypeError('ContiguityEventStore: inner must implement storeEvent and replayEventsAfter');
    }
    if (!Number.isInteger(maxTrackedEvents) || maxTrackedEvents < 1) {
      throw new RangeError('ContiguityEventStore: maxTrackedEvents must be a positive integer');
    }
    this.inner = inner;
    this.maxTrackedEvents = maxTrackedEvents;
    this.heads = new Map();   // streamId -> last sequence number issued
    this.tracked = new Map(); // eventId -> { streamId, seq, priming }, oldest first
    this.perStream = new Map(); // streamId -> ids still tracked
    if (typeof inner.getStreamIdForEventId === 'function') {
      // The transport answers 400 when this is undefined; a forgotten-by-inner but tracked cursor still
      // reaches replayEventsAfter, so its replay can say "cannot" instead.
      this.getStreamIdForEventId = async eventId =>
        this.tracked.get(eventId)?.streamId ?? inner.getStreamIdForEventId(eventId);
    }
  }

  async storeEvent(streamId, message) {
    // The number is taken before the inner store is awaited: call order is the stream's order.
    const priming = isPriming(message);
    const head = this.heads.get(streamId) ?? 0;
    const seq = priming ? head : head + 1;
    this.heads.set(streamId, seq);
    const eventId = await this.inner.storeEvent(streamId, message);
    this.track(eventId, { streamId, seq, priming });
    return eventId;
  }

  track(eventId, pos) {
    this.tracked.set(eventId, pos);
    this.perStream.set(pos.streamId, (this.perStream.get(pos.streamId) ?? 0) + 1);
    while (this.tracked.size > this.maxTrackedEvents) {
      const [oldId, old] = this.tracked.entries().next().value;
      this.tracked.delete(oldId);
      const left = (this.perStream.get(old.streamId) ?? 1) - 1;
      if (left > 0) {
        this.perStream.set(old.streamId, left);
      } else {
        // Nothing of the stream is known any more: its numbering may start again.
        this.perStream.delete(old.streamId);
        if (old.streamId !== pos.streamId) this.heads.delete(old.streamId);
      }
    }
  }

  /** Is `events` (what the inner store replayed after `at`) complete up to `head`? */
  judge(at, events, head) {
    if (!at) return { complete: false, reason: 'unknown_cursor' };
    let last = at.seq;
    for (const [id] of events) {
      const pos = this.tracked.get(id);
      if (!pos || pos.streamId !== at.streamId) return { complete: false, reason: 'not_contiguous' };
      if (pos.priming) continue;
      if (pos.seq !== last + 1) return { complete: false, reason: 'not_contiguous' };
      last = pos.seq;
    }
    if (last < head) return { complete: false, reason: 'truncated' };
    return { complete: true };
  }

  async replayEventsAfter(lastEventId, { send }) {
    const at = this.tracked.get(lastEventId);
    const head = at ? this.heads.get(at.streamId) ?? at.seq : 0;
    // Held back until the assertion, which must come first, is known.
    const events = [];
    const streamId = await this.inner.replayEventsAfter(lastEventId, {
      send: async (eventId, message) => { events.push([eventId, message]); },
    });
    const { complete, reason } = this.judge(at, events, head);
    await send(lastEventId, assertion(lastEventId, complete, events.length, reason));
    // Whatever the verdict, the replay itself is the inner store's: a client without a guard gets
    // exactly what it would have got without this wrapper.
    for (const [eventId, message] of events) await send(eventId, message);
    return streamId;
  }
}

/** `withContiguity(store)`: the same as `new ContiguityEventStore(store, options)`. */
export function withContiguity(inner, options) {
  return new ContiguityEventStore(inner, options);
}
