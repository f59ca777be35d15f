import { appendFileSync, readFileSync, rmSync, truncateSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { Journal, JournalConfigError, JournalCorruptError, JOURNAL_FILE } from "../../controller/service/journal.ts";
import { transition } from "../../controller/service/migration.ts";
import { recoverMigrations } from "../../controller/service/recovery.ts";
import { applyRecord, type DurableState, type RecordBody } from "../../controller/service/state.ts";
import { SMALL, tempDir } from "./harness.ts";

const config: Extract<RecordBody, { kind: "config" }> = { kind: "config", topology: SMALL, lambda: 1, podLambda: null };
const dirs: string[] = [];
const fresh = () => {
  const dir = tempDir();
  dirs.push(dir);
  return dir;
};
afterEach(() => dirs.splice(0).forEach((d) => rmSync(d, { recursive: true, force: true })));

let clockNow = 5_000;
const clock = () => clockNow;

/** Journals records the way the controller does: append, apply, flush. */
function write(dir: string, bodies: RecordBody[]): DurableState {
  const opened = Journal.open(dir, config, clock);
  let state = opened.state;
  for (const body of bodies) state = applyRecord(state, opened.journal.append(body));
  opened.journal.close();
  return state;
}

const jobs: RecordBody[] = [
  { kind: "job-started", job: "a", rings: 1, parallelism: { tp: 1, pp: 1, dp: 2 }, groups: [[0, 4]], checkpointBytes: { "0": 10, "4": 20 }, launch: null },
  { kind: "job-started", job: "b", rings: 1, parallelism: { tp: 1, pp: 1, dp: 2 }, groups: [[1, 5]], checkpointBytes: { "1": 30, "5": 40 }, launch: null },
  { kind: "plan", plan: "p0", moves: [{ job: "a", group: 0, from: 4, to: 2, step: 0 }] },
];

describe("journal", () => {
  it("replays to the same state the writer held", () => {
    const dir = fresh();
    const written = write(dir, jobs);
    const { journal, state, replay } = Journal.open(dir, config, clock);
    journal.close();
    expect(replay).toEqual({ records: 4, tornTail: null });
    expect(state).toEqual(written);
    expect(state.migrations.get("p0/0")).toMatchObject({ state: "planned", bytes: 20, from: 4, to: 2 });
    const lines = readFileSync(join(dir, JOURNAL_FILE), "utf8").trim().split("\n").map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.seq, l.kind])).toEqual([[0, "config"], [1, "job-started"], [2, "job-started"], [3, "plan"]]);
  });

  it("applies a committed move to the placement, keeping the ring order", () => {
    const dir = fresh();
    let state = write(dir, jobs);
    const m = state.migrations.get("p0/0")!;
    const committed = { ...m, state: "committing" as const, stopStep: 9, token: "t" };
    state = write(dir, [{ kind: "migration", migration: committed }]);
    expect(state.jobs.get("a")).toMatchObject({ groups: [[0, 2]], checkpointBytes: { "0": 10, "2": 20 }, generation: 1, resumeStep: 9 });
  });

  it("compacts to the config and one snapshot that replays to the same state, and appends after it", () => {
    const dir = fresh();
    const m = write(dir, jobs).migrations.get("p0/0")!;
    write(dir, [{ kind: "migration", migration: { ...m, state: "committing", stopStep: 9, token: "t" } }, { kind: "job-finished", job: "b" }]);
    const opened = Journal.open(dir, config, clock);
    opened.journal.compact(opened.state);
    opened.journal.close();
    const lines = readFileSync(join(dir, JOURNAL_FILE), "utf8").trim().split("\n").map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.seq, l.kind])).toEqual([[0, "config"], [1, "snapshot"]]);
    const replayed = Journal.open(dir, config, clock);
    replayed.journal.close();
    const state = replayed.state;
    // Everything but the record count, which restarts with the compacted file.
    expect({ ...state, records: 0 }).toEqual({ ...opened.state, records: 0 });
    expect(state.jobs.get("a")).toMatchObject({ groups: [[0, 2]], generation: 1 });
    expect(state.finished).toEqual(["b"]);
    expect(state.plans).toBe(1);
    // Records after the snapshot apply on top of it.
    const after = write(dir, [{ kind: "job-finished", job: "a" }]);
    const again = Journal.open(dir, config, clock);
    again.journal.close();
    expect(again.state).toEqual(after);
    expect(again.state.jobs.size).toBe(0);
  });

  it("refuses a snapshot that is not right after the config", () => {
    const dir = fresh();
    write(dir, jobs);
    const opened = Journal.open(dir, config, clock);
    opened.journal.compact(opened.state);
    opened.journal.close();
    const [first, snapshot] = readFileSync(join(dir, JOURNAL_FILE), "utf8").trim().split("\n");
    const misplaced = { ...JSON.parse(snapshot!), seq: 2 };
    writeFileSync(join(dir, JOURNAL_FILE), `${first}\n${JSON.stringify({ seq: 1, at: 1, kind: "job-finished", job: "a" })}\n${JSON.stringify(misplaced)}\n${first}\n`);
    expect(() => Journal.open(dir, config, clock)).toThrow(JournalCorruptError);
    expect(() => Journal.open(dir, config, clock)).toThrow(/line 3: a snapshot record after others/);
  });

  it("tolerates a torn last line: reports it, drops it, and appends after it", () => {
    const dir = fresh();
    write(dir, jobs);
    const path = join(dir, JOURNAL_FILE);
    const whole = statSync(path).size;
    appendFileSync(path, '{"seq":4,"at":1,"kind":"job-fin');
    const { journal, state, replay } = Journal.open(dir, config, clock);
    expect(replay.tornTail).toEqual({ line: 5, bytes: 31 });
    expect(replay.records).toBe(4);
    expect(state.jobs.size).toBe(2);
    expect(statSync(path).size).toBe(whole);
    journal.append({ kind: "job-finished", job: "b" });
    journal.close();
    const again = Journal.open(dir, config, clock);
    again.journal.close();
    expect(again.replay).toEqual({ records: 5, tornTail: null });
    expect([...again.state.jobs.keys()]).toEqual(["a"]);
    // Replay remembers the finish, so a launcher's resent `job.finish` is still answered.
    expect(again.state.finished).toEqual(["b"]);
  });

  it("treats a complete but unterminated last record as torn: the write never finished its fsync", () => {
    const dir = fresh();
    write(dir, jobs);
    const path = join(dir, JOURNAL_FILE);
    truncateSync(path, statSync(path).size - 1);
    const { journal, replay, state } = Journal.open(dir, config, clock);
    journal.close();
    expect(replay.tornTail?.line).toBe(4);
    expect(state.activePlan).toBeNull();
  });

  it("refuses a journal damaged in the middle, naming the line", () => {
    const dir = fresh();
    write(dir, jobs);
    const path = join(dir, JOURNAL_FILE);
    const lines = readFileSync(path, "utf8").split("\n");
    lines[1] = lines[1]!.replace('"job-started"', '"job-begun"');
    writeFileSync(path, lines.join("\n"));
    expect(() => Journal.open(dir, config, clock)).toThrow(JournalCorruptError);
    expect(() => Journal.open(dir, config, clock)).toThrow(/line 2: /);
  });

  it("refuses a journal written for another cluster", () => {
    const dir = fresh();
    write(dir, []);
    expect(() => Journal.open(dir, { ...config, lambda: 2 }, clock)).toThrow(JournalConfigError);
  });
});

describe("recovery after a restart", () => {
  it("rolls back moves that had not committed and completes those that had", () => {
    const dir = fresh();
    let state = write(dir, [...jobs, { kind: "plan", plan: "p1", moves: [{ job: "b", group: 0, from: 5, to: 3, step: 0 }] }]);
    // p0/0 got as far as transferring; p1/0 had committed.
    const m0 = state.migrations.get("p0/0")!;
    const transferring = { ...m0, state: "transferring" as const, token: "t0", stopStep: 3 };
    const m1 = state.migrations.get("p1/0")!;
    const committing = { ...m1, state: "committing" as const, token: "t1", stopStep: 4 };
    state = write(dir, [{ kind: "migration", migration: transferring }, { kind: "migration", migration: committing }]);

    clockNow = 9_000;
    const recovery = recoverMigrations(state, clockNow);
    expect(recovery.migrations).toEqual([
      transition(transferring, { type: "fail", reason: "the controller restarted before the move committed" }, clockNow).migration,
    ]);
    expect(recovery.migrations[0]).toMatchObject({ state: "rolled-back", since: 9_000 });
    expect(recovery.actions).toEqual([
      { type: "release-staging", host: 2, token: "t0" },
      { type: "resume-job", job: "a" },
      { type: "spawn-replacement", migration: "p1/0", job: "b", group: 0, host: 3, token: "t1" },
    ]);
    expect(state.jobs.get("b")?.groups).toEqual([[1, 3]]);
    expect(state.jobs.get("a")?.groups).toEqual([[0, 4]]);
  });
});
