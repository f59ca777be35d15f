import { closeSync, constants, existsSync, fstatSync, mkdirSync, openSync, readSync, statSync } from "node:fs";
import { dirname, resolve } from "node:path";
import type { z } from "zod";

/** One problem in an input document, located by its path. */
export interface InputIssue {
  /** Where, as `jobs[3].hosts[2]`; empty for the document itself. */
  readonly path: string;
  readonly message: string;
}

/**
 * The one place zod issues become text: `SOURCE at PATH: MESSAGE (and N more)`, naming the
 * first issue. Sites that throw their own error class (a protocol error, a channel reply)
 * take the text from here.
 */
export function formatZodError(source: string, error: z.ZodError): string {
  return render(source, error.issues.map(toIssue));
}

/** A document (snapshot, config, message) that does not match its schema. */
export class InvalidInputError extends Error {
  override readonly name = "InvalidInputError";
  readonly code = "invalid_input";
  constructor(
    /** What was being read, as `snapshot cluster.json`. */
    readonly source: string,
    readonly issues: readonly InputIssue[],
  ) {
    super(render(source, issues));
  }

  static fromZod(source: string, error: z.ZodError): InvalidInputError {
    return new InvalidInputError(source, error.issues.map(toIssue));
  }
}

/** One line: the first issue, and how many more there are. */
function render(source: string, issues: readonly InputIssue[]): string {
  const first = issues[0];
  if (!first) return `${source}: invalid`;
  const where = first.path ? `${source} at ${first.path}` : source;
  const more = issues.length > 1 ? ` (and ${issues.length - 1} more)` : "";
  return `${where}: ${first.message}${more}`;
}

/** Unknown keys named in one message; input can carry any number of them. */
const KEYS_SHOWN = 3;

function toIssue(issue: z.core.$ZodIssue): InputIssue {
  const path = formatPath(issue.path);
  if (issue.code === "unrecognized_keys") {
    const shown = issue.keys
      .slice(0, KEYS_SHOWN)
      .map((k) => quote(k))
      .join(", ");
    const keys = issue.keys.length > KEYS_SHOWN ? `${shown} and ${issue.keys.length - KEYS_SHOWN} more` : shown;
    return { path, message: `unknown field ${keys}; remove it or check its spelling` };
  }
  return { path, message: issue.message };
}

export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`;
    else out += out ? `.${String(key)}` : String(key);
  }
  return out;
}

/**
 * The controller's address cannot be bound (a port in use, an address of another host):
 * `reason` is what ZeroMQ said.
 */
export class BindError extends Error {
  override readonly name = "BindError";
  readonly code = "bind_failed";
  constructor(
    readonly address: string,
    readonly reason: string,
  ) {
    super(`cannot bind ${address}: ${reason}; pick another --bind address`);
  }
}

/** Read at a time by `readFileAtMost`, so memory grows with the file only up to its bound. */
const CHUNK_BYTES = 1 << 20;

/** Why `readFileAtMost` left a file unread; `shared` carries the file's permission bits. */
export type Unread = { unread: "too-large" | "not-regular" } | { unread: "shared"; mode: number };

/**
 * The text of `path` if it holds at most `max` bytes; `too-large` past them, read in chunks
 * since a device such as /dev/zero has no size and no end. With `regularOnly`, anything but a
 * regular file (a device, a FIFO) is `not-regular`, found without reading or waiting on it:
 * the file is opened non-blocking, so a FIFO nobody writes answers at once. With `ownerOnly`
 * (a secret), a file its group or others may read or write is `shared`, judged on the opened
 * file itself. A file that cannot be opened or read throws Node's error.
 */
export function readFileAtMost(path: string, max: number, regularOnly = false, ownerOnly = false): { text: string } | Unread {
  const fd = openSync(path, regularOnly ? constants.O_RDONLY | constants.O_NONBLOCK : constants.O_RDONLY);
  try {
    const stat = regularOnly || ownerOnly ? fstatSync(fd) : null;
    if (regularOnly && !stat?.isFile()) return { unread: "not-regular" };
    if (ownerOnly && stat && (stat.mode & 0o077) !== 0) return { unread: "shared", mode: stat.mode & 0o777 };
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const chunk = Buffer.alloc(CHUNK_BYTES);
      const bytesRead = readSync(fd, chunk);
      if (bytesRead === 0) return { text: Buffer.concat(chunks, total).toString("utf8") };
      total += bytesRead;
      if (total > max) return { unread: "too-large" };
      chunks.push(chunk.subarray(0, bytesRead));
    }
  } finally {
    closeSync(fd);
  }
}

/** `ENOENT: no such file or directory, open 'x'` as `no such file or directory`. */
export function errnoReason(error: unknown): string {
  const { code, message } = error as NodeJS.ErrnoException;
  return code === undefined ? String(message) : (message.split(", ")[0] ?? code).replace(`${code}: `, "");
}

/** Why a file could not be read, for a message that names it already: `no such file`, `permission denied`. */
export function readFailure(error: unknown): string {
  return (error as NodeJS.ErrnoException).code === "ENOENT" ? "no such file" : errnoReason(error);
}

/**
 * A directory `makeDirectory` could not make: `path` is the one that failed, `dir` or one of
 * its parents; `cause` is mkdir's error, absent when a file stands at `path`.
 */
export class MakeDirectoryError extends Error {
  override readonly name = "MakeDirectoryError";
  readonly code = "make_directory";
  constructor(
    readonly path: string,
    override readonly cause?: NodeJS.ErrnoException,
  ) {
    super(cause ? `cannot create ${path} (${errnoReason(cause)})` : `${path} is a file, not a directory`);
  }
}

/**
 * Makes `dir` and its missing parents (with `mode`), one level at a time: Node's own
 * `mkdir(…, { recursive: true })` spins forever where mkdir says ENOENT of a parent that
 * exists (anything under /proc), so a user's path must never go to it.
 *
 * @throws MakeDirectoryError naming the first path that is a file or cannot be created
 */
export function makeDirectory(dir: string, mode = 0o777): void {
  const missing: string[] = [];
  let path = resolve(dir);
  while (!existsSync(path)) {
    missing.unshift(path);
    path = dirname(path);
  }
  if (!statSync(path).isDirectory()) throw new MakeDirectoryError(path);
  for (const each of missing) {
    try {
      mkdirSync(each, { mode });
    } catch (error) {
      // Another process made it meanwhile: as good as made here.
      if ((error as NodeJS.ErrnoException).code === "EEXIST" && statSync(each).isDirectory()) continue;
      throw new MakeDirectoryError(each, error as NodeJS.ErrnoException);
    }
  }
}

/** The largest JSON file `readJsonFile` reads: far above a keyring listing every host of a large cluster. */
export const MAX_JSON_FILE_BYTES = 64 * 2 ** 20;

/** Why a JSON file was left unread, as the clause of its error. */
function unreadReason(path: string, read: Unread): string {
  switch (read.unread) {
    case "not-regular":
      return "it is not a regular file";
    case "too-large":
      return `it holds more than the ${MAX_JSON_FILE_BYTES} bytes it may have`;
    case "shared":
      return `it holds secret keys but its group or others may read it (mode ${read.mode.toString(8).padStart(4, "0")}); run \`chmod 600 ${path}\``;
  }
}

/**
 * A JSON file checked against `schema`; every failure is an `InvalidInputError` naming
 * `source`, and one that cannot be read says `hint` (how to make the file). Only a regular
 * file of at most `MAX_JSON_FILE_BYTES` is read: a device or a FIFO would never be done. A
 * `secret` file (a keyring, a credential) is refused unless only its owner may read it.
 */
export function readJsonFile<T>(path: string, source: string, schema: z.ZodType<T>, hint: string, secret = false): T {
  const fail = (message: string) => new InvalidInputError(source, [{ path: "", message: `${message}; ${hint}` }]);
  let read;
  try {
    read = readFileAtMost(path, MAX_JSON_FILE_BYTES, true, secret);
  } catch (error) {
    throw fail(`cannot read it (${readFailure(error)})`);
  }
  if ("unread" in read) {
    if (read.unread === "shared") throw new InvalidInputError(source, [{ path: "", message: unreadReason(path, read) }]);
    throw fail(unreadReason(path, read));
  }
  let value: unknown;
  try {
    value = JSON.parse(read.text);
  } catch (error) {
    throw fail(`cannot read it (${(error as Error).message})`);
  }
  const result = schema.safeParse(value);
  if (!result.success) throw InvalidInputError.fromZod(source, result.error);
  return result.data;
}

/**
 * Untrusted text as it may appear in a reply or a log line: at most `max` characters of it,
 * quoted with control characters escaped, and how long the whole was when it was cut.
 */
export function quote(value: string, max = 64): string {
  const shown = JSON.stringify(value.length > max ? value.slice(0, max) : value);
  return value.length > max ? `${shown}… (${value.length} characters)` : shown;
}
