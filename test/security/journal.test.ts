import { appendFileSync, closeSync, mkdirSync, openSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseSnapshot } from "../../controller/planner/model/cluster.ts";
import { Journal, JOURNAL_FILE, journalLine, JournalTruncatedError, MARK_FILE, readJournal } from "../../controller/service/journal.ts";
import { applyRecord, type JournalRecord, type RecordBody } from "../../controller/service/state.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { runCli } from "../helpers/cli.ts";
import { closeControllersAfterEach, connect, SMALL, startController, tempDirsPerTest, type Harness } from "../service/harness.ts";

/**
 * A client must not be able to make the journal too large to replay, and a damaged or forged
 * journal must stop the controller, naming the line, instead of being believed.
 */

let harness: Harness | undefined;
closeControllersAfterEach();
const fresh = tempDirsPerTest();

const snapshot = { topology: SMALL, lambda: 1, jobs: [] };
const cluster = parseSnapshot(snapshot);
const config: Extract<RecordBody, { kind: "config" }> = {
  kind: "config",
  topology: cluster.topology,
  lambda: cluster.lambda,
  podLambda: cluster.podLambda ?? null,
};
const dp2 = { tp: 1, pp: 1, dp: 2 };
const started = (job: string, hosts: number[]): RecordBody => ({
  kind: "job-started",
  job,
  rings: 1,
  parallelism: dp2,
  groups: [hosts],
  checkpointBytes: {},
  replacement: null,
});

/** A journal in a new directory, as a controller that ran `bodies` left it. */
function journalOf(bodies: RecordBody[]): { dir: string; path: string } {
  const dir = fresh();
  const { journal, state } = Journal.open(join(dir, "journal"), config);
  bodies.reduce((s, body) => applyRecord(s, journal.append(body)), state);
  journal.close();
  return { dir, path: join(dir, "journal", JOURNAL_FILE) };
}

/** Starts `monkeytree controller` on the journal; it must refuse before it listens. */
async function startCli(dir: string) {
  const file = join(dir, "cluster.json");
  writeFileSync(file, JSON.stringify(snapshot));
  return runCli("controller", "--snapshot", file, "--journal", join(dir, "journal"), "--bind", "tcp://127.0.0.1:*");
}

describe("a journal that lies", () => {
  it("a damaged last record that was complete (a durable job-finished) stops the controller with exit 2, naming the line and the way out", async () => {
    const { dir, path } = journalOf([started("a", [0, 4]), { kind: "job-finished", job: "a" }]);
    const bytes = readFileSync(path);
    // One byte of the job id, inside the last line.
    bytes[bytes.lastIndexOf('"a"') + 1] = "b".charCodeAt(0);
    writeFileSync(path, bytes);
    const result = await startCli(dir);
    expect(result.code).toBe(2);
    expect(result.stdout).toBe("");
    expect(result.stderr).toMatch(
      new RegExp(`^monkeytree controller: journal: ${path} line 3: checksum [0-9a-f]{8} does not match the stored [0-9a-f]{8}; .*mv ${path} ${path}\\.damaged`),
    );
    expect(result.stderr).not.toMatch(/\n\s+at /);
  });

  it("a checksum-valid host outside the topology, or on another job's host, stops the controller with exit 2", async () => {
    for (const [hosts, message] of [
      [[0, 8], `line 3: job "b": host 8 is out of range: the cluster has hosts 0..7`],
      [[1, 4], `line 3: host 4 is already job "a"'s`],
    ] as const) {
      const { dir, path } = journalOf([started("a", [0, 4])]);
      appendFileSync(path, journalLine({ seq: 2, at: 1, ...started("b", [...hosts]) } as JournalRecord));
      const result = await startCli(dir);
      expect(result.code).toBe(2);
      expect(result.stderr).toContain(`monkeytree controller: journal: ${path} ${message}; the journal is damaged`);
    }
  });

  it("a journal path that is a directory stops the controller with exit 2, naming the path", async () => {
    const dir = fresh();
    mkdirSync(join(dir, "journal", JOURNAL_FILE), { recursive: true });
    const result = await startCli(dir);
    expect(result.code).toBe(2);
    expect(result.stderr).toBe(
      `monkeytree controller: journal: ${join(dir, "journal", JOURNAL_FILE)} is a directory; the journal is a file in --journal DIR: move whatever is at that path aside, or give another --journal directory\n`,
    );
  });
});

describe("a journal cut at a record boundary", () => {
  /** Cuts the journal after its first `keep` lines: every record left is whole and checksum-valid. */
  function keepLines(path: string, keep: number): void {
    const bytes = readFileSync(path);
    let end = 0;
    for (let line = 0; line < keep; line++) end = bytes.indexOf(0x0a, end) + 1;
    truncateSync(path, end);
  }

  it("stops the controller with exit 2, naming the journal, its mark, what each holds and the way out", async () => {
    const { dir, path } = journalOf([started("a", [0, 4]), { kind: "job-finished", job: "a" }]);
    keepLines(path, 2);
    const result = await startCli(dir);
    expect(result.code).toBe(2);
    expect(result.stdout).toBe("");
    expect(result.stderr).toBe(
      `monkeytree controller: journal: ${path} holds 2 records, but ${join(dir, "journal", MARK_FILE)} says 3 were written: the last 1 were lost ` +
        "(the file was cut short or replaced by an older copy); restore it from a backup, or start once with --accept-journal-loss " +
        "to go on from the 2 records it holds, forgetting the changes in the lost ones\n",
    );
  });

  it("an emptied journal is refused too, and accepting the loss starts from what is left, once", () => {
    const { dir, path } = journalOf([started("a", [0, 4])]);
    truncateSync(path, 0);
    expect(() => Journal.open(join(dir, "journal"), config)).toThrow(JournalTruncatedError);
    const accepted = Journal.open(join(dir, "journal"), config, Date.now, { acceptLoss: true });
    accepted.journal.close();
    expect(accepted.replay.lost).toEqual({ expected: 2, found: 0 });
    const again = Journal.open(join(dir, "journal"), config);
    again.journal.close();
    expect(again.replay.lost).toBeUndefined();
  });

  it("still forgives a torn last record, and accepts a compacted journal and one moved aside", () => {
    const { dir, path } = journalOf([started("a", [0, 4]), started("b", [1, 5])]);
    // A crash mid-append: half of a record that was never acknowledged.
    const next = journalLine({ seq: 3, at: 1, kind: "job-finished", job: "a" } as JournalRecord);
    appendFileSync(path, next.subarray(0, next.length >> 1));
    const torn = Journal.open(join(dir, "journal"), config);
    expect(torn.replay).toMatchObject({ records: 3, tornTail: { line: 4 } });
    torn.journal.compact(torn.state);
    torn.journal.close();
    const compacted = Journal.open(join(dir, "journal"), config);
    compacted.journal.close();
    expect([compacted.replay.records, [...compacted.state.jobs.keys()]]).toEqual([2, ["a", "b"]]);
    rmSync(path);
    const fresh = Journal.open(join(dir, "journal"), config);
    fresh.journal.close();
    expect(fresh.state.jobs.size).toBe(0);
  });
});

describe("a journal too large to replay", () => {
  /** Bytes of the records after the journal's config and snapshot: what replay applies one by one. */
  function bytesSinceSnapshot(path: string): number {
    const fd = openSync(path, "r");
    try {
      let bytes = 0;
      for (const { record, size } of readJournal(fd, path)) if (record.kind !== "config" && record.kind !== "snapshot") bytes += size;
      return bytes;
    } finally {
      closeSync(fd);
    }
  }

  it("register/finish cycles cannot grow the journal past its byte bound, and the controller restarts from it", async () => {
    const bound = 4 * 1024;
    harness = await startController({ overrides: { compactAfterBytes: bound } });
    const client = connect(harness);
    const path = join(harness.dir, JOURNAL_FILE);
    let compactions = 0;
    let records = 1;
    // Long ids make long records (about 430 bytes a cycle); far fewer than the 50,000 that compact by count.
    for (let cycle = 0; cycle < 60; cycle++) {
      const job = `${"j".repeat(120)}-${cycle}`;
      const workers = [0, 4].map((host) => new WorkerClient(client, { job, group: 0, host }, dp2));
      await Promise.all(workers.map((w) => w.register(5_000)));
      await client.finish(job);
      for (const w of workers) w.close();
      // Replies go out after the burst's compaction check, so the bound holds whenever one arrives.
      expect(bytesSinceSnapshot(path)).toBeLessThan(bound);
      const now = (await client.status()).journalRecords;
      if (now < records) compactions++;
      records = now;
    }
    expect(compactions).toBeGreaterThanOrEqual(4);
    harness = await harness.restart();
    const again = connect(harness);
    expect((await again.status()).jobs).toEqual([]);
  });
});
