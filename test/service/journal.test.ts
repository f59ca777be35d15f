import { appendFileSync, chmodSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  Journal,
  JournalConfigError,
  JournalCorruptError,
  JournalPathError,
  JournalRecordTooLargeError,
  JOURNAL_FILE,
  journalLine,
  MAX_RECORD_BYTES,
  readJournal,
} from "../../controller/service/journal.ts";
import { transition } from "../../controller/service/migration.ts";
import { crc32c } from "../../native/index.ts";
import { recoverMigrations } from "../../controller/service/recovery.ts";
import { applyRecord, type DurableState, type JournalRecord, type RecordBody } from "../../controller/service/state.ts";
import { runIsolated } from "../helpers/isolated.ts";
import { canRun, type Prerequisite } from "../helpers/prerequisites.ts";
import { SMALL, tempDirsPerTest } from "./harness.ts";

const config: Extract<RecordBody, { kind: "config" }> = { kind: "config", topology: SMALL, lambda: 1, podLambda: null };
const fresh = tempDirsPerTest();

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

/** The records a journal file holds, read back as replay reads them. */
function recordsIn(dir: string): JournalRecord[] {
  const fd = openSync(join(dir, JOURNAL_FILE), "r");
  try {
    return [...readJournal(fd, join(dir, JOURNAL_FILE))].map((r) => r.record);
  } finally {
    closeSync(fd);
  }
}

/** Opening fails with a corrupt-journal error; returns its message. */
function refusal(dir: string): string {
  try {
    Journal.open(dir, config, clock).journal.close();
  } catch (error) {
    expect(error).toBeInstanceOf(JournalCorruptError);
    return (error as Error).message;
  }
  throw new Error("the journal was accepted");
}

const jobs: RecordBody[] = [
  { kind: "job-started", job: "a", rings: 1, parallelism: { tp: 1, pp: 1, dp: 2 }, groups: [[0, 4]], checkpointBytes: { "0": 10, "4": 20 }, replacement: null },
  { kind: "job-started", job: "b", rings: 1, parallelism: { tp: 1, pp: 1, dp: 2 }, groups: [[1, 5]], checkpointBytes: { "1": 30, "5": 40 }, replacement: null },
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
    expect(recordsIn(dir).map((r) => [r.seq, r.kind])).toEqual([
      [0, "config"],
      [1, "job-started"],
      [2, "job-started"],
      [3, "plan"],
    ]);
  });

  it("writes each record as its CRC-32C, its length and its JSON", () => {
    const dir = fresh();
    write(dir, []);
    const line = readFileSync(join(dir, JOURNAL_FILE), "latin1");
    const json = JSON.stringify({ seq: 0, at: clockNow, ...config });
    // The addon's CRC-32C (hardware or table) is the reference for the journal's TypeScript one.
    const crc = crc32c(Buffer.from(json)).toString(16).padStart(8, "0");
    expect(line).toBe(`${crc} ${json.length.toString(16).padStart(8, "0")} ${json}\n`);
  });

  it("creates the journal readable by its owner only: it holds migration tokens", () => {
    const dir = fresh();
    write(dir, []);
    expect(statSync(join(dir, JOURNAL_FILE)).mode & 0o777).toBe(0o600);
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
    write(dir, [
      { kind: "migration", migration: { ...m, state: "committing", stopStep: 9, token: "t" } },
      { kind: "job-finished", job: "b" },
    ]);
    const opened = Journal.open(dir, config, clock);
    expect(opened.journal.bytesSinceCompaction).toBe(statSync(join(dir, JOURNAL_FILE)).size - journalLine({ seq: 0, at: clockNow, ...config }).length);
    opened.journal.compact(opened.state);
    expect(opened.journal.bytesSinceCompaction).toBe(0);
    opened.journal.close();
    expect(recordsIn(dir).map((r) => [r.seq, r.kind])).toEqual([
      [0, "config"],
      [1, "snapshot"],
    ]);
    const replayed = Journal.open(dir, config, clock);
    replayed.journal.close();
    const state = replayed.state;
    // Everything but the record count, which restarts with the compacted file.
    expect({ ...state, records: 0 }).toEqual({ ...opened.state, records: 0 });
    expect(state.jobs.get("a")).toMatchObject({ groups: [[0, 2]], generation: 1 });
    expect(state.finished).toEqual(["b"]);
    expect(state.plans).toBe(1);
    expect(replayed.journal.bytesSinceCompaction).toBe(0);
    // Records after the snapshot apply on top of it, and count towards the next compaction.
    const after = write(dir, [{ kind: "job-finished", job: "a" }]);
    const again = Journal.open(dir, config, clock);
    again.journal.close();
    expect(again.state).toEqual(after);
    expect(again.state.jobs.size).toBe(0);
    expect(again.journal.bytesSinceCompaction).toBe(journalLine(recordsIn(dir)[2]!).length);
  });

  it("replays a journal compacted in the middle of a swap, and the swap's second commit after it", () => {
    const dir = fresh();
    let state = write(dir, [
      ...jobs.slice(0, 2),
      {
        kind: "plan",
        plan: "p0",
        moves: [
          { job: "a", group: 0, from: 4, to: 5, step: 0 },
          { job: "b", group: 0, from: 5, to: 4, step: 0 },
        ],
      },
    ]);
    const [ma, mb] = [state.migrations.get("p0/0")!, state.migrations.get("p0/1")!];
    const staged = { ...mb, state: "staged" as const, stopStep: 3, token: "tb" };
    state = write(dir, [
      { kind: "migration", migration: staged },
      { kind: "migration", migration: { ...ma, state: "committing", stopStep: 3, token: "ta" } },
    ]);
    // Host 5 holds a's new worker and b's old one until b's move commits.
    expect(state.jobs.get("a")?.groups).toEqual([[0, 5]]);
    expect(state.jobs.get("b")?.groups).toEqual([[1, 5]]);
    const opened = Journal.open(dir, config, clock);
    opened.journal.compact(opened.state);
    opened.journal.close();
    state = write(dir, [{ kind: "migration", migration: { ...staged, state: "committing" } }]);
    expect(state.jobs.get("b")?.groups).toEqual([[1, 4]]);
  });

  it("refuses a snapshot that is not right after the config", () => {
    const dir = fresh();
    write(dir, jobs);
    const opened = Journal.open(dir, config, clock);
    opened.journal.compact(opened.state);
    opened.journal.close();
    const [first, snapshot] = recordsIn(dir);
    const lines = [first!, { seq: 1, at: 1, kind: "job-finished", job: "a" }, { ...snapshot!, seq: 2 }] as JournalRecord[];
    writeFileSync(join(dir, JOURNAL_FILE), Buffer.concat(lines.map(journalLine)));
    expect(refusal(dir)).toMatch(/line 3: a snapshot record after others/);
  });

  it("refuses a journal written for another cluster", () => {
    const dir = fresh();
    write(dir, []);
    expect(() => Journal.open(dir, { ...config, lambda: 2 }, clock)).toThrow(JournalConfigError);
  });
});

describe("journal damage", () => {
  /** A journal of four records; returns its path and bytes. */
  function written(): { dir: string; path: string; bytes: Buffer } {
    const dir = fresh();
    write(dir, jobs);
    const path = join(dir, JOURNAL_FILE);
    return { dir, path, bytes: readFileSync(path) };
  }

  it("drops a last record cut short by a crash, says so, and appends after it", () => {
    const { dir, path, bytes } = written();
    const torn = journalLine({ seq: 4, at: 1, kind: "job-finished", job: "a" }).subarray(0, 31);
    appendFileSync(path, torn);
    const { journal, state, replay } = Journal.open(dir, config, clock);
    expect(replay).toEqual({ records: 4, tornTail: { line: 5, bytes: 31 } });
    expect(state.jobs.size).toBe(2);
    expect(statSync(path).size).toBe(bytes.length);
    journal.append({ kind: "job-finished", job: "b" });
    journal.close();
    const again = Journal.open(dir, config, clock);
    again.journal.close();
    expect(again.replay).toEqual({ records: 5, tornTail: null });
    expect([...again.state.jobs.keys()]).toEqual(["a"]);
    // Replay remembers the finish, so a launcher's resent `job.finish` is still answered.
    expect(again.state.finished).toEqual(["b"]);
  });

  it("drops a torn last record wherever the crash cut it, the header and the newline included", () => {
    const { dir, path, bytes } = written();
    const last = journalLine({ seq: 4, at: 1, kind: "job-finished", job: "a" });
    for (const cut of [1, 17, 18, 19, last.length - 1]) {
      writeFileSync(path, Buffer.concat([bytes, last.subarray(0, cut)]));
      const { journal, replay } = Journal.open(dir, config, clock);
      journal.close();
      expect(replay.tornTail, `cut at ${cut}`).toEqual({ line: 5, bytes: cut });
      expect(statSync(path).size).toBe(bytes.length);
    }
  });

  it("refuses a damaged last record that was complete (a durable job-finished is never dropped)", () => {
    const { dir, path, bytes } = written();
    const finished = journalLine({ seq: 4, at: 1, kind: "job-finished", job: "a" });
    const damaged = Buffer.from(finished);
    damaged[damaged.indexOf('"a"') + 1] = "c".charCodeAt(0);
    writeFileSync(path, Buffer.concat([bytes, damaged]));
    expect(refusal(dir)).toMatch(new RegExp(`^${path} line 5: checksum [0-9a-f]{8} does not match the stored [0-9a-f]{8}; .*mv ${path} ${path}\\.damaged`));
    // Nothing was cut off: the evidence stays for whoever restores it.
    expect(statSync(path).size).toBe(bytes.length + finished.length);
    const noNewline = Buffer.from(finished);
    noNewline[noNewline.length - 1] = 0x20;
    writeFileSync(path, Buffer.concat([bytes, noNewline]));
    expect(refusal(dir)).toMatch(/line 5: the line does not end after the \d+ bytes its header gives/);
    const longer = Buffer.from(finished);
    longer.write("f", 16, "latin1");
    writeFileSync(path, Buffer.concat([bytes, longer]));
    expect(refusal(dir)).toMatch(/line 5: the line is shorter than the \d+ bytes its header gives/);
  });

  it("refuses any flipped byte anywhere, naming the line it is on", () => {
    const { dir, path, bytes } = written();
    fc.assert(
      fc.property(fc.nat(bytes.length - 1), fc.integer({ min: 1, max: 255 }), (at, mask) => {
        const damaged = Buffer.from(bytes);
        damaged[at]! ^= mask;
        writeFileSync(path, damaged);
        const line = bytes.subarray(0, at).filter((b) => b === 0x0a).length + 1;
        expect(refusal(dir)).toContain(`${path} line ${line}: `);
      }),
      { numRuns: 300 },
    );
  });

  it("refuses a record over the size limit without reading it, and refuses to write one", () => {
    const { dir, path, bytes } = written();
    const header = `00000000 ${(MAX_RECORD_BYTES + 1).toString(16).padStart(8, "0")} `;
    writeFileSync(path, Buffer.concat([bytes, Buffer.from(header)]));
    // A sparse 3 GiB line: reading the journal whole, as a string, could not even start.
    truncateSync(path, 3 * 2 ** 30);
    expect(refusal(dir)).toMatch(new RegExp(`line 5: a record of ${MAX_RECORD_BYTES + 1} bytes, over the limit of ${MAX_RECORD_BYTES}`));
    truncateSync(path, bytes.length);
    const opened = Journal.open(dir, config, clock);
    const huge: RecordBody = { ...(jobs[0] as Extract<RecordBody, { kind: "job-started" }>), job: "x".repeat(MAX_RECORD_BYTES), groups: [[3]] };
    expect(() => opened.journal.append(huge)).toThrow(JournalRecordTooLargeError);
    opened.journal.append({ kind: "job-finished", job: "a" });
    opened.journal.close();
    expect(recordsIn(dir).map((r) => r.seq)).toEqual([0, 1, 2, 3, 4]);
  });

  it("replays a journal whose compaction was killed before its rename, and removes the leftover", () => {
    const { dir, path, bytes } = written();
    const opened = Journal.open(dir, config, clock);
    opened.journal.compact(opened.state);
    opened.journal.close();
    const snapshot = readFileSync(path);
    // As if killed mid-write: the old journal, and half the new one beside it.
    writeFileSync(path, bytes);
    writeFileSync(`${path}.compact`, snapshot.subarray(0, snapshot.length >> 1));
    const { journal, state, replay } = Journal.open(dir, config, clock);
    journal.close();
    expect(replay).toEqual({ records: 4, tornTail: null });
    expect([...state.jobs.keys()]).toEqual(["a", "b"]);
    expect(existsSync(`${path}.compact`)).toBe(false);
  });
});

describe("journal records that cannot be true", () => {
  /** Writes `records` after the journal's own, with valid checksums, and returns the refusal. */
  function refusalOf(records: RecordBody[], seq = 1): string {
    const dir = fresh();
    write(dir, []);
    appendFileSync(join(dir, JOURNAL_FILE), Buffer.concat(records.map((body, i) => journalLine({ seq: seq + i, at: 1, ...body } as JournalRecord))));
    return refusal(dir);
  }
  const a = jobs[0] as Extract<RecordBody, { kind: "job-started" }>;

  it("refuses a host outside the topology", () => {
    expect(refusalOf([{ ...a, groups: [[0, 8]] }])).toMatch(/line 2: job "a": host 8 is out of range: the cluster has hosts 0\.\.7/);
    expect(refusalOf([a, { kind: "plan", plan: "p0", moves: [{ job: "a", group: 0, from: 4, to: 9, step: 0 }] }])).toMatch(
      /line 3: plan p0: host 9 is out of range/,
    );
  });

  it("refuses a host that another job runs on, or a job listing one host twice", () => {
    expect(refusalOf([a, { ...a, job: "b", groups: [[1, 4]] }])).toMatch(/line 3: host 4 is already job "a"'s/);
    expect(refusalOf([{ ...a, groups: [[4, 4]] }])).toMatch(/line 2: job "a" lists host 4 twice/);
  });

  it("refuses a migration whose hosts differ from its plan's, and a commit onto a host another job keeps", () => {
    const dir = fresh();
    const state = write(dir, jobs);
    const m = state.migrations.get("p0/0")!;
    const damaged = refusalOf([...jobs, { kind: "migration", migration: { ...m, to: 1 } }]);
    expect(damaged).toMatch(/line 5: migration p0\/0 has to 1, but was planned with 2/);
    const onto = refusalOf([
      ...jobs.slice(0, 2),
      { kind: "plan", plan: "p0", moves: [{ job: "a", group: 0, from: 4, to: 5, step: 0 }] },
      { kind: "migration", migration: { ...m, to: 5, state: "committing" } },
    ]);
    expect(onto).toMatch(/line 5: host 5 is already job "b"'s/);
  });

  it("refuses a snapshot that puts two jobs on one host", () => {
    const dir = fresh();
    const state = write(dir, jobs.slice(0, 2));
    const opened = Journal.open(dir, config, clock);
    opened.journal.compact(state);
    opened.journal.close();
    const [, snapshot] = recordsIn(dir) as [JournalRecord, Extract<JournalRecord, { kind: "snapshot" }>];
    const shared = { ...snapshot.state, jobs: snapshot.state.jobs.map((job) => (job.id === "b" ? { ...job, groups: [[1, 4]] } : job)) };
    expect(refusalOf([{ kind: "snapshot", state: shared }])).toMatch(/line 2: host 4 is already job "b"'s/);
  });
});

describe("journal paths", () => {
  it("creates missing directories", () => {
    const dir = join(fresh(), "a", "b");
    write(dir, []);
    expect(recordsIn(dir).map((r) => r.kind)).toEqual(["config"]);
  });

  it("refuses a journal file that is a directory, and a --journal that is a file, naming the path and the fix", () => {
    const dir = fresh();
    mkdirSync(join(dir, JOURNAL_FILE));
    expect(() => Journal.open(dir, config, clock)).toThrow(JournalPathError);
    expect(() => Journal.open(dir, config, clock)).toThrow(`${join(dir, JOURNAL_FILE)} is a directory; the journal is a file in --journal DIR`);
    const file = join(fresh(), "file");
    writeFileSync(file, "");
    expect(() => Journal.open(file, config, clock)).toThrow(`${file} is (or is inside) a file, not a directory; give --journal a directory`);
    expect(() => Journal.open(join(file, "journal"), config, clock)).toThrow(`${join(file, "journal")} is (or is inside) a file, not a directory`);
  });

  // mkdir under /proc says ENOENT of /proc itself, on which Node's recursive mkdir spins
  // forever: in a child process, so a spin fails the test instead of hanging it.
  it("refuses a directory that cannot be created, such as one under /proc, at once", () => {
    const result = runIsolated(
      { Journal: "controller/service/journal.ts" },
      `try { Journal.open("/proc/x/y", ${JSON.stringify(config)}); } catch (e) { console.log(e.name + ": " + e.message); }`,
    );
    expect(result.signal, "Journal.open spun on /proc/x/y until killed").toBeNull();
    expect(result.stdout.trim()).toBe(
      "JournalPathError: /proc/x/y cannot be created (no such file or directory); give --journal a directory the controller may create and write",
    );
  });

  // Root reads and writes a file whatever its mode, so only another user meets the refusal.
  const notRoot: Prerequisite = {
    what: "a user other than root",
    missing: process.getuid?.() === 0 ? "root may read a file of any mode" : null,
    install: "run test/service/journal.test.ts as a user other than root",
    promisedBy: null,
  };
  it.skipIf(!canRun("the unreadable journal's refusal", notRoot))("refuses a journal it may not read, naming the path", () => {
    const dir = fresh();
    write(dir, []);
    const path = join(dir, JOURNAL_FILE);
    chmodSync(path, 0o200);
    expect(() => Journal.open(dir, config, clock)).toThrow(`${path} is not readable and writable by this user`);
  });

  it("refuses a format 1 journal (no checksums), naming it and how to start afresh", () => {
    const dir = fresh();
    writeFileSync(join(dir, "journal.jsonl"), `${JSON.stringify({ seq: 0, at: 1, ...config })}\n`);
    expect(() => Journal.open(dir, config, clock)).toThrow(JournalPathError);
    expect(() => Journal.open(dir, config, clock)).toThrow(
      /journal\.jsonl is a journal of format 1 \(MonkeyTree 0\.1, records without checksums\).*mv .*journal\.jsonl .*journal\.jsonl\.format1/,
    );
    expect(existsSync(join(dir, JOURNAL_FILE))).toBe(false);
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
    state = write(dir, [
      { kind: "migration", migration: transferring },
      { kind: "migration", migration: committing },
    ]);

    clockNow = 9_000;
    const recovery = recoverMigrations(state, clockNow);
    expect(recovery.migrations).toEqual([
      transition(transferring, { type: "fail", reason: "the controller restarted before the move committed" }, clockNow).migration,
    ]);
    expect(recovery.migrations[0]).toMatchObject({ state: "rolled-back", since: 9_000 });
    expect(recovery.actions).toEqual([
      { type: "release-staging", host: 2, token: "t0" },
      { type: "resume-job", job: "a" },
      // The committed move's job stays stopped, sealed, at its stop step until it re-forms.
      { type: "hold-job", job: "b", stop: "p1/step0", step: 4, sealed: true },
      { type: "spawn-replacement", migration: "p1/0", job: "b", group: 0, host: 3, token: "t1" },
    ]);
    expect(state.jobs.get("b")?.groups).toEqual([[1, 3]]);
    expect(state.jobs.get("a")?.groups).toEqual([[0, 4]]);
  });
});
