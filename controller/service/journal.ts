import { closeSync, existsSync, fsyncSync, ftruncateSync, openSync, readSync, renameSync, rmSync, writeSync } from "node:fs";
import { dirname, join } from "node:path";
import { InvalidInputError, makeDirectory, MakeDirectoryError } from "../../sdk/contract/errors.ts";
import { crc32 } from "../planner/route/ecmp.ts";
import { misfit } from "./replay-check.ts";
import { applyRecord, initialState, RecordSchema, snapshotOf, StateError, type DurableState, type JournalRecord, type RecordBody } from "./state.ts";

/**
 * Append-only journal of every durable state change. Records are buffered by `append` and
 * written with one fsync by `flush`, which the controller calls before it acts on any of
 * them (sends a reply, asks a daemon), so a crash never loses a change that something
 * outside already saw.
 *
 * Each record is one line, `CRC LENGTH JSON\n`: LENGTH is the JSON's size in bytes and CRC
 * its CRC-32C, both as 8 hex digits. CRC-32C catches every damaged run of up to 4 bytes (so
 * any flipped byte) and misses a random longer one with odds of 2⁻³²; a cryptographic hash
 * would add nothing, since whoever can write the file can recompute either, and the file's
 * permissions are what keep others out.
 *
 * The length and the newline are two independent marks of a complete record (JSON has no raw
 * newline). An append cut short by a crash ends the file before its length says, with no
 * newline, and is the one damage replay forgives: nothing acted on it, as its fsync never
 * returned. A damaged byte changes one mark, not both, so a record that was complete is
 * never taken for a torn one: its newline is still there, or it is as long as it says.
 */

/** Format 2: checksummed records. Format 1 (`journal.jsonl`, plain JSON lines) had none. */
export const JOURNAL_FILE = "journal.log";
const FORMAT_1_FILE = "journal.jsonl";
/** `CRC LENGTH ` */
const HEADER_BYTES = 18;
const HEADER = /^([0-9a-f]{8}) ([0-9a-f]{8}) $/;
const NEWLINE = 0x0a;
/**
 * The largest record's JSON: far above any the controller writes, far below what a V8 string
 * or the heap can hold, so replay's memory stays bounded whatever the file says.
 */
export const MAX_RECORD_BYTES = 64 * 2 ** 20;
/** Replay reads the file in pieces of this size, so its memory does not grow with the journal. */
const READ_BYTES = 2 ** 20;
/** The journal holds migration tokens: only the controller's user may read it. */
const FILE_MODE = 0o600;
/**
 * Beside the journal: how many whole records it held at its last fsync, written (and fsync'd)
 * after the journal's own fsync, so it never counts a record the journal does not hold durably.
 * A journal cut at a record boundary reads as whole, but holds fewer records than its mark: the
 * loss of changes already acted on, which `open` refuses to start from.
 */
export const MARK_FILE = "journal.mark";

/** Anything that keeps the controller from using its journal; the message says how to fix it. */
export abstract class JournalError extends Error {
  abstract readonly code: string;
}

/** A record is damaged or does not fit the state before it: the journal cannot be trusted. */
export class JournalCorruptError extends JournalError {
  override readonly name = "JournalCorruptError";
  readonly code = "journal_corrupt";
  constructor(
    readonly path: string,
    readonly line: number,
    detail: string,
  ) {
    super(
      `${path} line ${line}: ${detail}; the journal is damaged: restore it from a backup, or move it aside ` +
        `(mv ${path} ${path}.damaged) to start with an empty journal, which forgets the jobs it recorded`,
    );
  }
}

/** The journal was written for another cluster than the one the controller was started with. */
export class JournalConfigError extends JournalError {
  override readonly name = "JournalConfigError";
  readonly code = "journal_config_mismatch";
}

/** The journal holds fewer records than were written to it: some were lost since, with no damage to show. */
export class JournalTruncatedError extends JournalError {
  override readonly name = "JournalTruncatedError";
  readonly code = "journal_truncated";
  constructor(
    readonly path: string,
    readonly expected: number,
    readonly found: number,
  ) {
    super(
      `${path} holds ${found} records, but ${join(dirname(path), MARK_FILE)} says ${expected} were written: the last ${expected - found} ` +
        "were lost (the file was cut short or replaced by an older copy); restore it from a backup, or start once with " +
        `--accept-journal-loss to go on from the ${found} records it holds, forgetting the changes in the lost ones`,
    );
  }
}

/** The journal's directory or file cannot be created, read or written, or is of an older format. */
export class JournalPathError extends JournalError {
  override readonly name = "JournalPathError";
  readonly code = "journal_path";
}

/** A record larger than replay accepts; the journal refuses to write what it could not read back. */
export class JournalRecordTooLargeError extends JournalError {
  override readonly name = "JournalRecordTooLargeError";
  readonly code = "journal_record_too_large";
}

export interface ReplayReport {
  /** Records read back, the config record included. */
  readonly records: number;
  /** A last record cut short by a crash during a write; it was dropped from the file. */
  readonly tornTail: { readonly line: number; readonly bytes: number } | null;
  /** Whole records the mark said were written, when more than the journal held and `acceptLoss` let it start. */
  readonly lost?: { readonly expected: number; readonly found: number };
}

export interface OpenOptions {
  /** Start from a journal that holds fewer records than its mark says were written, instead of refusing it. */
  readonly acceptLoss?: boolean;
}

export interface OpenedJournal {
  readonly journal: Journal;
  readonly state: DurableState;
  readonly replay: ReplayReport;
}

type Config = Extract<RecordBody, { kind: "config" }>;

export class Journal {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private closed = false;

  private constructor(
    private fd: number,
    private readonly mark: Mark,
    readonly path: string,
    private seq: number,
    private bytes: number,
    private readonly clock: () => number,
    private readonly config: Config,
  ) {}

  /**
   * Opens (or creates) the journal in `dir` and replays it. A new journal starts with
   * `config`; an existing one must have been written for the same config. Replay checks
   * every record's checksum, and that it fits the state before it, before applying it.
   *
   * @throws JournalPathError when `dir` or the file cannot be used, or `dir` holds a format 1 journal
   * @throws JournalCorruptError naming the line of the first damaged or impossible record
   * @throws JournalConfigError when the journal was written for another cluster
   * @throws JournalTruncatedError when it holds fewer whole records than its mark says were written, unless `acceptLoss`
   */
  static open(dir: string, config: Config, clock: () => number = Date.now, options: OpenOptions = {}): OpenedJournal {
    const path = join(dir, JOURNAL_FILE);
    // A journal moved aside starts anew; one that is there but short is checked against the mark.
    const existed = existsSync(path);
    const fd = openJournalFile(dir, path);
    let mark: Mark | undefined;
    try {
      // A compaction that crashed before its rename left this; the journal beside it is whole.
      rmSync(compactionFile(path), { force: true });
      const { state, records, bytes, end } = replay(fd, path, config);
      const tornTail = end.tornTail;
      if (tornTail) {
        ftruncateSync(fd, end.goodBytes);
        fsyncSync(fd);
      }
      mark = Mark.open(join(dir, MARK_FILE));
      const lost = existed ? checkMark(mark, path, records, options) : {};
      if (state) {
        mark.write(records);
        return { journal: new Journal(fd, mark, path, records, bytes, clock, config), state, replay: { records, tornTail, ...lost } };
      }
      const journal = new Journal(fd, mark, path, 0, 0, clock, config);
      const record = journal.append(config);
      journal.flush();
      // The file's directory entry must be durable too, or a crash could lose the whole file.
      fsyncDirectory(dir);
      return { journal, state: initialState(record as Config), replay: { records: 0, tornTail, ...lost } };
    } catch (error) {
      closeSync(fd);
      mark?.close();
      throw error;
    }
  }

  /** Numbers and stamps a record and buffers it; `flush` makes it durable. */
  append(body: RecordBody): JournalRecord {
    if (this.closed) throw new Error(`journal ${this.path} is closed`);
    const record = { seq: this.seq, at: this.clock(), ...body } as JournalRecord;
    const line = journalLine(record);
    this.seq++;
    this.pending.push(line);
    this.pendingBytes += line.length;
    return record;
  }

  /** Writes buffered records and fsyncs; returns how many it wrote. */
  flush(): number {
    if (this.pending.length === 0) return 0;
    const data = Buffer.concat(this.pending);
    const written = this.pending.length;
    this.pending = [];
    this.pendingBytes = 0;
    writeAll(this.fd, data);
    fsyncSync(this.fd);
    this.mark.write(this.seq);
    this.bytes += data.length;
    return written;
  }

  /**
   * Rewrites the journal as its config and one snapshot of `state` (the state its records
   * built), so replay stays short however long the controller runs. The new file is written
   * and fsync'd beside the old one and renamed over it: a crash leaves one or the other,
   * and `open` removes a leftover new file.
   */
  compact(state: DurableState): void {
    this.flush();
    const at = this.clock();
    const data = Buffer.concat([journalLine({ seq: 0, at, ...this.config }), journalLine({ seq: 1, at, ...snapshotOf(state) })]);
    const next = compactionFile(this.path);
    const fd = openSync(next, "w", FILE_MODE);
    try {
      writeAll(fd, data);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    // The mark is a lower bound: lowered before the rename, it holds for the old file and the new.
    this.mark.write(2);
    renameSync(next, this.path);
    fsyncDirectory(dirname(this.path));
    closeSync(this.fd);
    this.fd = openSync(this.path, "a", FILE_MODE);
    this.seq = 2;
    this.bytes = 0;
  }

  /** Records in the journal, buffered ones included. */
  get records(): number {
    return this.seq;
  }

  /** Bytes of records after the config and snapshot, buffered ones included: what compaction would save. */
  get bytesSinceCompaction(): number {
    return this.bytes + this.pendingBytes;
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
    this.mark.close();
  }
}

/**
 * The journal's mark: `CRC COUNT\n`, COUNT the whole records the journal held at its last
 * fsync and CRC its CRC-32C, both as 8 hex digits, rewritten in place (one sector, so a crash
 * leaves the old line or the new) and fsync'd.
 */
class Mark {
  private constructor(
    private readonly fd: number,
    readonly path: string,
    /** The count it held when opened; null for a new, empty or unreadable mark. */
    readonly count: number | null,
  ) {}

  static open(path: string): Mark {
    const existed = existsSync(path);
    const fd = openSync(path, "a+", FILE_MODE);
    const line = Buffer.alloc(MARK_BYTES);
    const got = readSync(fd, line, 0, MARK_BYTES, 0);
    closeSync(fd);
    const mark = new Mark(openSync(path, "r+"), path, parseMark(line.subarray(0, got)));
    if (!existed) fsyncDirectory(dirname(path));
    return mark;
  }

  write(count: number): void {
    const hex = count.toString(16).padStart(8, "0");
    writeSync(this.fd, Buffer.from(`${checksum(Buffer.from(hex, "latin1"))} ${hex}\n`, "latin1"), 0, MARK_BYTES, 0);
    fsyncSync(this.fd);
  }

  close(): void {
    closeSync(this.fd);
  }
}

/** `CRC COUNT\n` */
const MARK_BYTES = 18;

function parseMark(line: Buffer): number | null {
  const match = /^([0-9a-f]{8}) ([0-9a-f]{8})\n$/.exec(line.toString("latin1"));
  if (!match || checksum(Buffer.from(match[2]!, "latin1")) !== match[1]) return null;
  return Number.parseInt(match[2]!, 16);
}

/** What the journal lost below its mark, when `acceptLoss` lets it start anyway. */
function checkMark(mark: Mark, path: string, found: number, options: OpenOptions): Pick<ReplayReport, "lost"> {
  if (mark.count === null || found >= mark.count) return {};
  if (!options.acceptLoss) throw new JournalTruncatedError(path, mark.count, found);
  return { lost: { expected: mark.count, found } };
}

const compactionFile = (path: string): string => `${path}.compact`;

/** Creates `dir` if needed and opens the journal in it for reading and appending. */
function openJournalFile(dir: string, path: string): number {
  const old = join(dir, FORMAT_1_FILE);
  if (existsSync(old)) {
    throw new JournalPathError(
      `${old} is a journal of format 1 (MonkeyTree 0.1, records without checksums), which this controller cannot verify; ` +
        `let its jobs finish under the controller that wrote it, or move it aside (mv ${old} ${old}.format1) to start with an empty journal`,
    );
  }
  try {
    makeDirectory(dir);
  } catch (error) {
    if (!(error instanceof MakeDirectoryError)) throw error;
    throw pathError(dir, error.cause ?? { code: "ENOTDIR" }, "give --journal a directory the controller may create and write");
  }
  try {
    return openSync(path, "a+", FILE_MODE);
  } catch (error) {
    throw pathError(path, error, "the journal is a file in --journal DIR: move whatever is at that path aside, or give another --journal directory");
  }
}

function pathError(path: string, error: unknown, fix: string): JournalPathError {
  const code = (error as NodeJS.ErrnoException).code;
  const what =
    code === "EISDIR"
      ? "is a directory"
      : code === "EEXIST" || code === "ENOTDIR"
        ? "is (or is inside) a file, not a directory"
        : code === "EACCES" || code === "EPERM"
          ? "is not readable and writable by this user"
          : code === "EROFS"
            ? "is on a read-only file system"
            : // mkdir under /proc, say, where no directory can be made.
              code === "ENOENT"
              ? "cannot be created (no such file or directory)"
              : `cannot be used (${(error as Error).message})`;
  return new JournalPathError(`${path} ${what}; ${fix}`);
}

/**
 * Applies the journal's records, each checked against the state before it; `state` is null
 * for a journal without a whole config record (new, or its first write was torn).
 */
function replay(fd: number, path: string, config: Config) {
  const lines = readJournal(fd, path);
  let state: DurableState | null = null;
  let records = 0;
  // Bytes of records after the config and snapshot: those compaction would fold away.
  let bytes = 0;
  let next = lines.next();
  for (; !next.done; next = lines.next()) {
    const { line, record, size } = next.value;
    records++;
    if (state === null) {
      if (record.kind !== "config") throw new JournalCorruptError(path, line, "the first record must be the cluster config");
      if (!sameConfig(record, config)) {
        throw new JournalConfigError(
          `${path} was written for another cluster (${describeConfig(record)}) than this one (${describeConfig(config)}); ` +
            "start with the same topology or with a new --journal directory",
        );
      }
      state = initialState(record);
      continue;
    }
    try {
      const after = applyRecord(state, record);
      const problem = misfit(state, record, after);
      if (problem) throw new StateError(problem);
      state = after;
    } catch (error) {
      if (error instanceof StateError) throw new JournalCorruptError(path, line, error.message);
      throw error;
    }
    if (record.kind !== "snapshot") bytes += size;
  }
  return { state, records, bytes, end: next.value };
}

interface ReadRecord {
  readonly line: number;
  readonly record: JournalRecord;
  /** Bytes of its line, newline included. */
  readonly size: number;
}

interface ReadEnd {
  /** Bytes of whole records: where a torn tail starts. */
  readonly goodBytes: number;
  readonly tornTail: ReplayReport["tornTail"];
}

/**
 * Reads the records of an open journal one at a time, checking each line's length, newline,
 * checksum, JSON, schema and sequence number; memory stays within one record. Returns where
 * the whole records end and the torn last record, if any.
 *
 * @throws JournalCorruptError naming the line of the first record that is damaged, or larger than `MAX_RECORD_BYTES`
 */
export function* readJournal(fd: number, path: string): Generator<ReadRecord, ReadEnd> {
  const reader = new FileReader(fd);
  let offset = 0;
  for (let line = 1; ; line++) {
    const corrupt = (detail: string) => new JournalCorruptError(path, line, detail);
    const header = reader.take(HEADER_BYTES);
    if (header.length === 0) return { goodBytes: offset, tornTail: null };
    if (header.length < HEADER_BYTES) {
      if (header.includes(NEWLINE)) throw corrupt("a line too short to be a record");
      return { goodBytes: offset, tornTail: { line, bytes: header.length } };
    }
    const match = HEADER.exec(header.toString("latin1"));
    if (!match) throw corrupt("no checksum and length at the start of the line");
    const [, crc = "", length = ""] = match;
    const bytes = Number.parseInt(length, 16);
    if (bytes > MAX_RECORD_BYTES) throw corrupt(`a record of ${bytes} bytes, over the limit of ${MAX_RECORD_BYTES}`);
    const rest = reader.take(bytes + 1);
    if (rest.length < bytes + 1) {
      // Only an append cut short ends the file early with no newline; a record that was
      // whole before its length was damaged still has its newline.
      if (rest.includes(NEWLINE)) throw corrupt(`the line is shorter than the ${bytes} bytes its header gives`);
      return { goodBytes: offset, tornTail: { line, bytes: header.length + rest.length } };
    }
    if (rest[bytes] !== NEWLINE) throw corrupt(`the line does not end after the ${bytes} bytes its header gives`);
    const actual = checksum(rest.subarray(0, bytes));
    if (actual !== crc) throw corrupt(`checksum ${actual} does not match the stored ${crc}`);
    const parsed = parseRecord(rest.toString("utf8", 0, bytes), line - 1);
    if (!parsed.ok) throw corrupt(parsed.detail);
    const size = HEADER_BYTES + bytes + 1;
    yield { line, record: parsed.record, size };
    offset += size;
  }
}

/** Sequential reads of a file through a fixed-size buffer. */
class FileReader {
  private buffer = Buffer.alloc(0);
  private start = 0;
  private position = 0;

  constructor(private readonly fd: number) {}

  /** The next `n` bytes, fewer only at the end of the file. */
  take(n: number): Buffer {
    while (this.buffer.length - this.start < n) {
      const held = this.buffer.subarray(this.start);
      const chunk = Buffer.allocUnsafe(Math.max(READ_BYTES, n - held.length));
      const got = readSync(this.fd, chunk, 0, chunk.length, this.position);
      if (got === 0) break;
      this.position += got;
      this.buffer = Buffer.concat([held, chunk.subarray(0, got)]);
      this.start = 0;
    }
    const out = this.buffer.subarray(this.start, this.start + n);
    this.start += out.length;
    return out;
  }
}

/** A record as its journal line: what `append` buffers and replay reads back. */
export function journalLine(record: JournalRecord): Buffer {
  const json = Buffer.from(JSON.stringify(record));
  if (json.length > MAX_RECORD_BYTES) {
    throw new JournalRecordTooLargeError(
      `a ${record.kind} record of ${json.length} bytes is over the journal's limit of ${MAX_RECORD_BYTES}; it was not written`,
    );
  }
  const header = `${checksum(json)} ${json.length.toString(16).padStart(8, "0")} `;
  return Buffer.concat([Buffer.from(header, "latin1"), json, Buffer.of(NEWLINE)]);
}

/** CRC-32C (the aggregation tier's polynomial in the ECMP model) as 8 hex digits. */
const checksum = (bytes: Uint8Array): string => crc32(bytes, "aggregation").toString(16).padStart(8, "0");

function parseRecord(json: string, expectedSeq: number): { ok: true; record: JournalRecord } | { ok: false; detail: string } {
  let value: unknown;
  try {
    value = JSON.parse(json);
  } catch (error) {
    return { ok: false, detail: `not JSON (${(error as Error).message})` };
  }
  const result = RecordSchema.safeParse(value);
  if (!result.success) return { ok: false, detail: InvalidInputError.fromZod("record", result.error).message };
  if (result.data.seq !== expectedSeq) return { ok: false, detail: `sequence number ${result.data.seq}, expected ${expectedSeq}` };
  return { ok: true, record: result.data };
}

function writeAll(fd: number, data: Buffer): void {
  for (let done = 0; done < data.length;) done += writeSync(fd, data, done);
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
