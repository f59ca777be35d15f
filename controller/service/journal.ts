import { closeSync, fsyncSync, ftruncateSync, mkdirSync, openSync, readFileSync, renameSync, writeSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { InvalidInputError } from "../../sdk/errors.ts";
import { applyRecord, initialState, RecordSchema, snapshotOf, StateError, type DurableState, type JournalRecord, type RecordBody } from "./state.ts";

/**
 * Append-only JSON-lines journal of every durable state change. Records are buffered by
 * `append` and written with one fsync by `flush`, which the controller calls before it acts
 * on any of them (sends a reply, asks a daemon), so a crash never loses a change that
 * something outside already saw.
 */

export const JOURNAL_FILE = "journal.jsonl";

/** A journal line that is not the last one fails to parse: the file was damaged, not torn. */
export class JournalCorruptError extends Error {
  override readonly name = "JournalCorruptError";
  readonly code = "journal_corrupt";
  constructor(readonly path: string, readonly line: number, detail: string) {
    super(`${path} line ${line}: ${detail}; restore the journal from a backup or start with an empty --journal directory`);
  }
}

/** The journal was written for another cluster than the one the controller was started with. */
export class JournalConfigError extends Error {
  override readonly name = "JournalConfigError";
  readonly code = "journal_config_mismatch";
}

export interface ReplayReport {
  /** Records read back, the config record included. */
  readonly records: number;
  /** A last line cut short by a crash during a write; it was dropped from the file. */
  readonly tornTail: { readonly line: number; readonly bytes: number } | null;
}

export interface OpenedJournal {
  readonly journal: Journal;
  readonly state: DurableState;
  readonly replay: ReplayReport;
}

type Config = Extract<RecordBody, { kind: "config" }>;

export class Journal {
  private pending: string[] = [];
  private closed = false;

  private constructor(
    private fd: number,
    readonly path: string,
    private seq: number,
    private readonly clock: () => number,
    private readonly config: Config,
  ) {}

  /**
   * Opens (or creates) the journal in `dir` and replays it. A new journal starts with
   * `config`; an existing one must have been written for the same config.
   */
  static open(dir: string, config: Config, clock: () => number = Date.now): OpenedJournal {
    mkdirSync(dir, { recursive: true });
    const path = join(dir, JOURNAL_FILE);
    const text = existsSync(path) ? readFileSync(path, "utf8") : "";
    const { records, goodBytes, tornTail } = parseJournal(text, path);
    const fd = openSync(path, "a+");
    if (tornTail) {
      ftruncateSync(fd, goodBytes);
      fsyncSync(fd);
    }
    const first = records[0];
    if (!first) {
      const journal = new Journal(fd, path, 0, clock, config);
      const record = journal.append(config);
      journal.flush();
      // The file's directory entry must be durable too, or a crash could lose the whole file.
      fsyncDirectory(dir);
      return { journal, state: initialState(record as Config), replay: { records: 0, tornTail } };
    }
    if (first.kind !== "config") {
      closeSync(fd);
      throw new JournalCorruptError(path, 1, "the first record must be the cluster config");
    }
    if (!sameConfig(first, config)) {
      closeSync(fd);
      throw new JournalConfigError(
        `${path} was written for another cluster (${describeConfig(first)}) than this one (${describeConfig(config)}); ` +
          "start with the same topology or with a new --journal directory",
      );
    }
    let state = initialState(first);
    for (const [index, record] of records.slice(1).entries()) {
      try {
        state = applyRecord(state, record);
      } catch (error) {
        closeSync(fd);
        if (error instanceof StateError) throw new JournalCorruptError(path, index + 2, error.message);
        throw error;
      }
    }
    return { journal: new Journal(fd, path, records.length, clock, config), state, replay: { records: records.length, tornTail } };
  }

  /** Numbers and stamps a record and buffers it; `flush` makes it durable. */
  append(body: RecordBody): JournalRecord {
    if (this.closed) throw new Error(`journal ${this.path} is closed`);
    const record = { seq: this.seq++, at: this.clock(), ...body } as JournalRecord;
    this.pending.push(`${JSON.stringify(record)}\n`);
    return record;
  }

  /** Writes buffered records and fsyncs; returns how many it wrote. */
  flush(): number {
    if (this.pending.length === 0) return 0;
    const data = this.pending.join("");
    const written = this.pending.length;
    this.pending = [];
    writeSync(this.fd, data);
    fsyncSync(this.fd);
    return written;
  }

  /**
   * Rewrites the journal as its config and one snapshot of `state` (the state its records
   * built), so replay stays short however long the controller runs. The new file is written
   * and fsync'd beside the old one and renamed over it: a crash leaves one or the other.
   */
  compact(state: DurableState): void {
    this.flush();
    const at = this.clock();
    const data = [{ seq: 0, at, ...this.config }, { seq: 1, at, ...snapshotOf(state) }].map((record) => `${JSON.stringify(record)}\n`).join("");
    const next = `${this.path}.compact`;
    const fd = openSync(next, "w");
    try {
      writeSync(fd, data);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(next, this.path);
    fsyncDirectory(dirname(this.path));
    closeSync(this.fd);
    this.fd = openSync(this.path, "a");
    this.seq = 2;
  }

  get records(): number {
    return this.seq;
  }

  /** Records appended but not yet durable. */
  get unflushed(): number {
    return this.pending.length;
  }

  close(): void {
    if (this.closed) return;
    this.flush();
    this.closed = true;
    closeSync(this.fd);
  }
}

/** Makes a file's creation or rename in `dir` durable. */
function fsyncDirectory(dir: string): void {
  const fd = openSync(dir, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** Parses journal text; only the last line may be damaged (a torn write), and is then dropped. */
export function parseJournal(text: string, path: string): { records: JournalRecord[]; goodBytes: number; tornTail: ReplayReport["tornTail"] } {
  const records: JournalRecord[] = [];
  let offset = 0;
  let line = 0;
  while (offset < text.length) {
    const end = text.indexOf("\n", offset);
    const raw = end === -1 ? text.slice(offset) : text.slice(offset, end);
    line++;
    // A line without its newline was cut short by a crash inside `flush`, before the fsync
    // returned, so nothing acted on it: dropping it loses nothing.
    if (end === -1) {
      return { records, goodBytes: Buffer.byteLength(text.slice(0, offset)), tornTail: { line, bytes: Buffer.byteLength(raw) } };
    }
    const parsed = parseLine(raw, records.length);
    if (!parsed.ok) {
      if (end === text.length - 1) {
        return { records, goodBytes: Buffer.byteLength(text.slice(0, offset)), tornTail: { line, bytes: Buffer.byteLength(raw) + 1 } };
      }
      throw new JournalCorruptError(path, line, parsed.detail);
    }
    records.push(parsed.record);
    offset = end + 1;
  }
  return { records, goodBytes: Buffer.byteLength(text), tornTail: null };
}

function parseLine(raw: string, expectedSeq: number): { ok: true; record: JournalRecord } | { ok: false; detail: string } {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (error) {
    return { ok: false, detail: `not JSON (${(error as Error).message})` };
  }
  const result = RecordSchema.safeParse(value);
  if (!result.success) return { ok: false, detail: InvalidInputError.fromZod("record", result.error).message };
  if (result.data.seq !== expectedSeq) return { ok: false, detail: `sequence number ${result.data.seq}, expected ${expectedSeq}` };
  return { ok: true, record: result.data };
}

function sameConfig(a: Config, b: Config): boolean {
  const t = a.topology;
  const u = b.topology;
  return (
    t.racks === u.racks &&
    t.hostsPerRack === u.hostsPerRack &&
    t.gpusPerHost === u.gpusPerHost &&
    t.uplinksPerRack === u.uplinksPerRack &&
    t.racksPerPod === u.racksPerPod &&
    a.lambda === b.lambda &&
    a.podLambda === b.podLambda
  );
}

const describeConfig = (c: Config): string => {
  const t = c.topology;
  return `${t.racks} racks × ${t.hostsPerRack} hosts, ${t.uplinksPerRack} uplinks, λ ${c.lambda}`;
};
