import { appendFileSync, closeSync, fstatSync, openSync, readSync, renameSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "../../sdk/contract/log.ts";
import {
  ControllerEventSchema,
  MAX_EVENTS_PER_REPLY,
  type ControllerEvent,
  type ControllerEventBody,
  type EventsReply,
} from "../../sdk/contract/protocol/events.ts";
import { oneLine } from "../../sdk/contract/protocol/limits.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import type { DurableState, JournalRecord } from "./state.ts";
import type { ControllerObserver, PlanOutcome } from "./observer.ts";

/**
 * The controller's event log: every decision as one JSON line (`ControllerEventSchema`) in
 * `events.jsonl` beside the journal, and the latest in memory for `monkeytree status --follow`.
 * Bounded on disk: past `maxBytes` the file becomes `events.jsonl.1` (replacing the one before)
 * and a new one starts, so the log never holds more than twice that. Numbers go on across
 * rotations and restarts, so a follower can tell what it missed.
 */

export const EVENT_LOG_FILE = "events.jsonl";
/** Bytes per file before it rotates. */
export const DEFAULT_EVENT_LOG_BYTES = 16 * 2 ** 20;
/** Events kept in memory for followers. */
const KEPT = 4096;
/** Events a follower gets when it starts without a cursor, as `tail` starts. */
const TAIL = 10;
/** The longest line an event makes is well under this; read this much of the file's end to find the last number. */
const TAIL_BYTES = 64 * 1024;

export interface EventLogOptions {
  /** The journal's directory; null keeps the events in memory only. */
  readonly dir: string | null;
  readonly maxBytes?: number;
  readonly clock?: () => number;
  readonly log?: Logger;
}

export class EventLog implements ControllerObserver {
  private readonly file: string | null;
  private readonly maxBytes: number;
  private readonly clock: () => number;
  private bytes: number;
  private seq: number;
  private readonly recent: ControllerEvent[] = [];
  private failing = false;

  constructor(private readonly options: EventLogOptions) {
    this.file = options.dir === null ? null : join(options.dir, EVENT_LOG_FILE);
    this.maxBytes = options.maxBytes ?? DEFAULT_EVENT_LOG_BYTES;
    this.clock = options.clock ?? Date.now;
    // Right after a rotation the newest number is in the rotated file.
    const current = this.file === null ? { bytes: 0, last: 0 } : lastEvent(this.file);
    this.bytes = current.bytes;
    this.seq = current.last || (this.file === null ? 0 : lastEvent(`${this.file}.1`).last);
  }

  /** Numbers, stamps, writes and keeps one event. */
  append(body: ControllerEventBody, at = this.clock()): ControllerEvent {
    const event = ControllerEventSchema.parse({ seq: this.seq + 1, at, ...body });
    this.seq = event.seq;
    this.recent.push(event);
    if (this.recent.length > KEPT) this.recent.splice(0, this.recent.length - KEPT);
    this.write(`${JSON.stringify(event)}\n`);
    return event;
  }

  /** The `events` answer: what follows `after`, or the latest few without it. */
  batch(id: number, after: number | undefined): EventsReply {
    const first = this.recent[0]?.seq ?? this.seq + 1;
    const from = after === undefined ? Math.max(first, this.seq - TAIL + 1) : after + 1;
    const start = Math.max(0, from - first);
    const events = this.recent.slice(start, start + MAX_EVENTS_PER_REPLY);
    return { v: PROTOCOL_VERSION, type: "events.batch", id, events, last: this.seq, missed: Math.max(0, first - from) };
  }

  // ── what the controller tells it ──────────────────────────────────────────────────────

  applied(before: DurableState, record: JournalRecord): void {
    switch (record.kind) {
      case "job-started":
        this.append({ event: "job-started", job: record.job, hosts: record.groups.flat().sort((a, b) => a - b), rings: record.rings }, record.at);
        return;
      case "job-finished":
        this.append({ event: "job-finished", job: record.job }, record.at);
        return;
      case "migration": {
        const m = record.migration;
        const was = before.migrations.get(m.id);
        const ids = { migration: m.id, job: m.job };
        if (was && was.state !== m.state) {
          this.append({ event: "move", ...ids, source: m.from, destination: m.to, from: was.state, to: m.state }, record.at);
          if (m.state === "rolled-back") this.append({ event: "rollback", ...ids, reason: oneLine(m.reason ?? "no reason recorded") }, record.at);
        } else if (was && m.reason !== null && m.reason !== was.reason) {
          this.append({ event: "alert", ...ids, reason: oneLine(m.reason) }, record.at);
        }
        return;
      }
      case "config":
      case "snapshot":
      case "job-scheduled":
      case "plan":
        // A plan is told through `planned`, with the planner's verdict; the rest is bookkeeping.
        return;
    }
  }

  planned(outcome: PlanOutcome): void {
    const over = outcome.fragmentation.flatMap((d, rack) => (d > outcome.lambda ? [rack] : []));
    this.append({ event: "fragmentation", racks: [...outcome.fragmentation], lambda: outcome.lambda, over });
    this.append({ event: "plan", plan: outcome.plan, status: outcome.status, moves: outcome.moves, steps: outcome.steps, seconds: outcome.seconds });
  }

  planFailed(reason: string): void {
    this.append({ event: "plan-failed", reason: oneLine(reason) });
  }

  daemonLost(host: number, silentMs: number): void {
    this.append({ event: "daemon-lost", host, silentMs });
  }

  workerLost(job: string, host: number, silentMs: number): void {
    this.append({ event: "worker-lost", job, host, silentMs });
  }

  private write(line: string): void {
    if (this.file === null) return;
    try {
      if (this.bytes > 0 && this.bytes + Buffer.byteLength(line) > this.maxBytes) {
        renameSync(this.file, `${this.file}.1`);
        this.bytes = 0;
      }
      appendFileSync(this.file, line, { mode: 0o600 });
      this.bytes += Buffer.byteLength(line);
      this.failing = false;
    } catch (error) {
      // Decisions go on without their log line; the logger says so once per outage.
      if (!this.failing)
        this.options.log?.error(() => `event log ${this.file}: ${(error as Error).message}; events are kept in memory only until it can be written`);
      this.failing = true;
    }
  }
}

/** The file's size and the number of its last whole event (0 for none). */
function lastEvent(file: string): { bytes: number; last: number } {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch {
    return { bytes: 0, last: 0 };
  }
  try {
    const bytes = fstatSync(fd).size;
    const length = Math.min(bytes, TAIL_BYTES);
    const buffer = Buffer.alloc(length);
    readSync(fd, buffer, 0, length, bytes - length);
    const lines = buffer
      .toString("utf8")
      .split("\n")
      .slice(length < bytes ? 1 : 0);
    for (const line of lines.reverse()) {
      const parsed = safeJson(line);
      const event = ControllerEventSchema.safeParse(parsed);
      if (event.success) return { bytes, last: event.data.seq };
    }
    return { bytes, last: 0 };
  } finally {
    closeSync(fd);
  }
}

const safeJson = (line: string): unknown => {
  try {
    return JSON.parse(line);
  } catch {
    return null;
  }
};
