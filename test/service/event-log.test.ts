import { readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { EVENT_LOG_FILE, EventLog } from "../../controller/service/event-log.ts";
import { ControllerEventSchema, MAX_EVENTS_PER_REPLY } from "../../sdk/contract/protocol/events.ts";
import { tempDirsPerTest } from "./harness.ts";

const fresh = tempDirsPerTest();

const lost = (host: number) => ({ event: "daemon-lost", host, silentMs: 10_000 }) as const;
const linesOf = (file: string) =>
  readFileSync(file, "utf8")
    .trim()
    .split("\n")
    .map((line) => ControllerEventSchema.parse(JSON.parse(line)));

describe("the event log", () => {
  it("rotates past its size into events.jsonl.1, so the two files never hold more than twice the cap", () => {
    const dir = fresh();
    const log = new EventLog({ dir, maxBytes: 1_000, clock: () => 1 });
    for (let host = 0; host < 100; host++) log.append(lost(host));
    const file = join(dir, EVENT_LOG_FILE);
    expect(statSync(file).size).toBeLessThanOrEqual(1_000);
    expect(statSync(`${file}.1`).size).toBeLessThanOrEqual(1_000);
    const current = linesOf(file);
    const rotated = linesOf(`${file}.1`);
    // The newest event is last in the current file, and the rotated one holds those just before.
    expect(current.at(-1)).toMatchObject({ seq: 100, host: 99 });
    expect(rotated.at(-1)!.seq + 1).toBe(current[0]!.seq);
    expect([...rotated, ...current].map((e) => e.seq)).toEqual(
      Array.from({ length: rotated.length + current.length }, (_, i) => 101 - rotated.length - current.length + i),
    );
  });

  it("numbers on from the last event on disk, even right after a rotation", () => {
    const dir = fresh();
    const first = new EventLog({ dir, maxBytes: 1_000 });
    for (let host = 0; host < 7; host++) first.append(lost(host));
    expect(new EventLog({ dir }).append(lost(0)).seq).toBe(8);
    // A rotation leaves the current file empty: the number is in the rotated one.
    const file = join(dir, EVENT_LOG_FILE);
    writeFileSync(`${file}.1`, readFileSync(file));
    writeFileSync(file, "");
    expect(new EventLog({ dir }).append(lost(0)).seq).toBe(9);
    // A torn last line (a crash mid-append) is skipped.
    writeFileSync(file, `${readFileSync(file, "utf8")}{"seq":10,"at`);
    expect(new EventLog({ dir }).append(lost(0)).seq).toBe(10);
  });

  it("serves the latest few to a new follower, what follows a cursor, and how many it missed", () => {
    const log = new EventLog({ dir: null, clock: () => 5 });
    expect(log.batch(1, undefined)).toMatchObject({ events: [], last: 0, missed: 0 });
    for (let host = 0; host < 5_000; host++) log.append(lost(host % 2048));
    const tail = log.batch(1, undefined);
    expect(tail.events.map((e) => e.seq)).toEqual([4991, 4992, 4993, 4994, 4995, 4996, 4997, 4998, 4999, 5000]);
    expect(log.batch(2, 4998).events.map((e) => e.seq)).toEqual([4999, 5000]);
    expect(log.batch(3, 4000).events).toHaveLength(MAX_EVENTS_PER_REPLY);
    // Memory keeps the last 4,096; a cursor before them learns how many went by.
    const behind = log.batch(4, 10);
    expect(behind.missed).toBe(5_000 - 4_096 - 10);
    expect(behind.events[0]?.seq).toBe(5_000 - 4_096 + 1);
  });

  it("keeps deciding when the file cannot be written, and says so once", () => {
    const dir = fresh();
    const errors: string[] = [];
    const log = new EventLog({ dir: join(dir, "missing"), log: { debug: () => {}, info: () => {}, warn: () => {}, error: (line) => errors.push(line()) } });
    expect(log.append(lost(1)).seq).toBe(1);
    expect(log.append(lost(2)).seq).toBe(2);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toContain("events are kept in memory only");
    expect(log.batch(1, 0).events).toHaveLength(2);
  });

  it("records a lost worker with its job and host", () => {
    const dir = fresh();
    const log = new EventLog({ dir, clock: () => 5 });
    log.workerLost("a", 3, 10_040);
    expect(linesOf(join(dir, EVENT_LOG_FILE))).toEqual([{ seq: 1, at: 5, event: "worker-lost", job: "a", host: 3, silentMs: 10_040 }]);
  });

  it("refuses an event its schema does not allow", () => {
    const log = new EventLog({ dir: null });
    expect(() => log.append({ event: "daemon-lost", host: -1, silentMs: 0 })).toThrow();
    expect(() => log.append({ event: "worker-lost", job: "", host: 0, silentMs: 0 })).toThrow();
    expect(() => log.append({ event: "worker-lost", job: "a", host: 0, silentMs: -1 })).toThrow();
  });
});
