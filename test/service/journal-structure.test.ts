import { closeSync, existsSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { Journal, JournalCorruptError, JOURNAL_FILE, journalLine, readJournal } from "../../controller/service/journal.ts";
import { applyRecord, type JournalRecord, type RecordBody } from "../../controller/service/state.ts";
import { SMALL, tempDirsPerTest } from "./harness.ts";

// The journal's order rules, each on records whose checksums are right: the config first and
// only once, sequence numbers counting up from 0 without gaps or repeats; and the states a
// crash during compaction can leave.

const config: Extract<RecordBody, { kind: "config" }> = { kind: "config", topology: SMALL, lambda: 1, podLambda: null };
const started: RecordBody = {
  kind: "job-started",
  job: "a",
  rings: 1,
  parallelism: { tp: 1, pp: 1, dp: 2 },
  groups: [[0, 4]],
  checkpointBytes: {},
  replacement: null,
};
const finished: RecordBody = { kind: "job-finished", job: "a" };

const fresh = tempDirsPerTest();

/** A journal directory whose file holds exactly `records`, each with a valid checksum. */
function journalOf(records: [seq: number, body: RecordBody][]): { dir: string; path: string } {
  const dir = fresh();
  const path = join(dir, JOURNAL_FILE);
  writeFileSync(path, Buffer.concat(records.map(([seq, body]) => journalLine({ seq, at: 1, ...body } as JournalRecord))));
  return { dir, path };
}

function refusal(dir: string): JournalCorruptError {
  try {
    Journal.open(dir, config).journal.close();
  } catch (error) {
    expect(error).toBeInstanceOf(JournalCorruptError);
    return error as JournalCorruptError;
  }
  throw new Error("the journal was accepted");
}

function recordsIn(path: string): JournalRecord[] {
  const fd = openSync(path, "r");
  try {
    return [...readJournal(fd, path)].map((r) => r.record);
  } finally {
    closeSync(fd);
  }
}

describe("the journal's first record", () => {
  it.each<[string, RecordBody]>([
    ["a job", started],
    ["a snapshot", { kind: "snapshot", state: { jobs: [], finished: [], migrations: [], activePlan: null, activeMoves: [], plans: 0 } }],
  ])("refuses a journal that starts with %s instead of the config", (_, first) => {
    const { dir, path } = journalOf([[0, first]]);
    const error = refusal(dir);
    expect(error.line).toBe(1);
    expect(error.message).toMatch(new RegExp(`^${path} line 1: the first record must be the cluster config; the journal is damaged`));
  });

  it("refuses a second config record", () => {
    const { dir, path } = journalOf([
      [0, config],
      [1, started],
      [2, config],
    ]);
    expect(refusal(dir).message).toMatch(new RegExp(`^${path} line 3: a second config record; a journal has exactly one, first;`));
  });

  it.each([
    ["empty (created, nothing written)", Buffer.alloc(0), null],
    ["holding a config record cut short", journalLine({ seq: 0, at: 1, ...config }).subarray(0, 40), { line: 1, bytes: 40 }],
  ])("starts afresh from a journal %s, writing the config first", (_, bytes, tornTail) => {
    const { dir, path } = journalOf([]);
    writeFileSync(path, bytes);
    const { journal, state, replay } = Journal.open(dir, config, () => 7);
    journal.close();
    expect(replay).toEqual({ records: 0, tornTail });
    expect(state.jobs.size).toBe(0);
    expect(recordsIn(path)).toEqual([{ seq: 0, at: 7, ...config }]);
  });
});

describe("the journal's sequence numbers", () => {
  it.each<[string, [number, RecordBody][], number, string]>([
    ["a config not numbered 0", [[1, config]], 1, "sequence number 1, expected 0"],
    [
      "a gap",
      [
        [0, config],
        [2, started],
      ],
      2,
      "sequence number 2, expected 1",
    ],
    [
      "a repeat",
      [
        [0, config],
        [1, started],
        [1, finished],
      ],
      3,
      "sequence number 1, expected 2",
    ],
    [
      "records out of order",
      [
        [0, config],
        [2, started],
        [1, finished],
      ],
      2,
      "sequence number 2, expected 1",
    ],
  ])("refuses %s, naming the line", (_, records, line, detail) => {
    const { dir, path } = journalOf(records);
    const error = refusal(dir);
    expect(error.line).toBe(line);
    expect(error.message.startsWith(`${path} line ${line}: ${detail}; `)).toBe(true);
  });

  it("numbers the records after a compaction on from its snapshot", () => {
    const { dir, path } = journalOf([
      [0, config],
      [1, started],
    ]);
    const opened = Journal.open(dir, config);
    opened.journal.compact(opened.state);
    opened.journal.append(finished);
    opened.journal.close();
    expect(recordsIn(path).map((r) => [r.seq, r.kind])).toEqual([
      [0, "config"],
      [1, "snapshot"],
      [2, "job-finished"],
    ]);
  });
});

describe("a crash during compaction", () => {
  // compact() writes and fsyncs the new file beside the journal, then renames it over the
  // journal. It never truncates the journal in place, so the only states a crash leaves are
  // the old journal with a new file beside it (here) or the new journal alone (which
  // journal.test.ts replays after a normal compaction).
  it("keeps the old journal when the new file was whole but not renamed, and compacts again later", () => {
    const { dir, path } = journalOf([
      [0, config],
      [1, started],
    ]);
    const before = readFileSync(path);
    const opened = Journal.open(dir, config);
    opened.journal.compact(opened.state);
    opened.journal.close();
    const compacted = readFileSync(path);
    // As if killed between the new file's fsync and its rename.
    writeFileSync(path, before);
    writeFileSync(`${path}.compact`, compacted);

    const reopened = Journal.open(dir, config);
    expect(reopened.replay).toEqual({ records: 2, tornTail: null });
    expect([...reopened.state.jobs.keys()]).toEqual(["a"]);
    expect(existsSync(`${path}.compact`)).toBe(false);
    reopened.journal.compact(applyRecord(reopened.state, reopened.journal.append(finished)));
    reopened.journal.close();
    expect(recordsIn(path).map((r) => r.kind)).toEqual(["config", "snapshot"]);
    const last = Journal.open(dir, config);
    last.journal.close();
    expect(last.state.jobs.size).toBe(0);
    expect(last.state.finished).toEqual(["a"]);
  });
});
