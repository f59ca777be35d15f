import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import type { Reply } from "../../sdk/contract/protocol/codec.ts";
import type { Logger } from "../../sdk/contract/log.ts";
import type { Journal } from "./journal.ts";
import type { ControllerObserver } from "./observer.ts";
import { applyRecord, type DurableState, type JournalRecord, type RecordBody } from "./state.ts";

/**
 * What the controller's parts share: the journal-backed durable state, the replies waiting to
 * be sent and the effects waiting to run on other hosts. A part changes the state only through
 * `record`; replies and effects wait in `drain` until the journal records before them are
 * durable, so nothing outside ever sees a change a crash could lose.
 */

/** Who to answer: the ROUTER peer a request came from and the request's id. */
export interface ReplyTarget {
  readonly peer: Uint8Array;
  readonly id: number;
}

export interface Outgoing {
  readonly peer: Uint8Array;
  readonly reply: Reply;
}

export interface ContextOptions {
  readonly journal: Journal;
  readonly state: DurableState;
  readonly clock: () => number;
  readonly log: Logger;
  readonly compactAfterRecords: number;
  /** Or once this many bytes of records follow the last snapshot, however few records that is. */
  readonly compactAfterBytes: number;
  /** Called whenever there is something to drain. */
  readonly wake: () => void;
  /** Called after each record is applied, with the state before it. */
  readonly applied: (before: DurableState, record: JournalRecord) => void;
  /** Metrics and the event log: told of every record and every reply. */
  readonly observer: ControllerObserver;
}

export class ControllerContext {
  private current: DurableState;
  private outbox: Outgoing[] = [];
  private effects: (() => void)[] = [];
  readonly clock: () => number;
  readonly log: Logger;
  readonly observer: ControllerObserver;

  constructor(private readonly options: ContextOptions) {
    this.current = options.state;
    this.clock = options.clock;
    this.log = options.log;
    this.observer = options.observer;
  }

  get state(): DurableState {
    return this.current;
  }

  get journalRecords(): number {
    return this.options.journal.records;
  }

  /** Journals a record and applies it to the state. */
  record(body: RecordBody): void {
    const record = this.options.journal.append(body);
    const before = this.current;
    this.current = applyRecord(before, record);
    this.options.applied(before, record);
    this.observer.applied(before, record);
    this.wake();
  }

  send(target: ReplyTarget, reply: Reply): void {
    this.outbox.push({ peer: target.peer, reply });
    this.wake();
  }

  ack(target: ReplyTarget): void {
    this.send(target, { v: PROTOCOL_VERSION, type: "ack", id: target.id });
  }

  /** Work on another host, started once the records queued so far are durable. */
  effect(run: () => void): void {
    this.effects.push(run);
    this.wake();
  }

  wake(): void {
    this.options.wake();
  }

  /** Makes the journal durable, then returns the replies to send and starts the effects. */
  drain(): Outgoing[] {
    const { journal, compactAfterRecords, compactAfterBytes } = this.options;
    journal.flush();
    // Compaction happens here, between bursts, so no record is ever half in an old journal.
    if (journal.records >= compactAfterRecords || journal.bytesSinceCompaction >= compactAfterBytes) {
      journal.compact(this.current);
      this.log.info(() => `journal ${journal.path}: compacted to a snapshot of ${this.current.jobs.size} jobs`);
    }
    const out = this.outbox;
    const effects = this.effects;
    this.outbox = [];
    this.effects = [];
    for (const effect of effects) effect();
    return out;
  }

  /** A bug in one decision is logged; it must not take the controller down with it. */
  safely(what: string, run: () => void): void {
    try {
      run();
    } catch (error) {
      this.log.error(() => `internal error while ${what}: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
    }
  }
}
