import type { EventStore } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';

export declare const REPLAY_METHOD: 'notifications/mcp-resume-guard/replay';
export declare const VERSION: 1;

export type CannotReason = 'unknown_cursor' | 'not_contiguous' | 'truncated';

export interface ReplayAssertion {
  jsonrpc: '2.0';
  method: typeof REPLAY_METHOD;
  params: { v: 1; after: string; complete: boolean; count: number; reason?: CannotReason };
}

export declare function assertion(after: string, complete: boolean, count: number, reason?: CannotReason): ReplayAssertion;

export interface ContiguityOptions {
  /** Event ids remembered (oldest forgotten first); default 100000. */
  maxTrackedEvents?: number;
}

export declare class ContiguityEventStore implements EventStore {
  constructor(inner: EventStore, options?: ContiguityOptions);
  readonly inner: EventStore;
  storeEvent(streamId: string, message: JSONRPCMessage): Promise<string>;
  getStreamIdForEventId?(eventId: string): Promise<string | undefined>;
  replayEventsAfter(lastEventId: string, opts: { send: (eventId: string, message: JSONRPCMessage) => Promise<void> }): Promise<string>;
}

export declare function withContiguity(inner: EventStore, options?: ContiguityOptions): ContiguityEventStore;
