import { statfsSync } from "node:fs";
import { InvalidInputError, quote, readFailure, readFileAtMost } from "../sdk/contract/errors.ts";
import type { ControllerRefusedError } from "../sdk/client/connection.ts";
import { readCredential, type Credential } from "../sdk/contract/protocol/auth.ts";
import { parseSnapshotText, type Cluster } from "../controller/planner/model/cluster.ts";
import { MAX_SNAPSHOT_BYTES } from "../sdk/contract/protocol/limits.ts";

/** Exit codes shared by every command: 0 ok, 1 findings, 2 usage or bad input, 3 internal; 130 stopped by SIGINT or SIGTERM, as a shell reports Ctrl-C. */
export const ExitCode = { ok: 0, findings: 1, usage: 2, internal: 3, interrupted: 130 } as const;
export type ExitCode = (typeof ExitCode)[keyof typeof ExitCode];

/** Where a command writes; tests pass in-memory streams. */
export interface Io {
  readonly out: NodeJS.WritableStream;
  readonly err: NodeJS.WritableStream;
}

/** A usage mistake: printed as one line plus a pointer to `--help`, exit code 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

export interface Command {
  readonly summary: string;
  readonly help: string;
  run(argv: string[], io: Io): Promise<ExitCode>;
}

/**
 * A whole-number flag such as `--host 3`, checked against `min` and, when given, `max`.
 * Without a `fallback` the flag is required.
 */
export function intFlag(name: string, raw: string | undefined, fallback: number | undefined, min: number, max?: number): number {
  if (raw === undefined) {
    if (fallback === undefined) throw new UsageError(`--${name} is required`);
    return fallback;
  }
  const value = Number(raw);
  if (raw.trim() === "" || !Number.isInteger(value) || value < min || (max !== undefined && value > max)) {
    const range = max === undefined ? `≥ ${min}` : `from ${min} to ${max}`;
    throw new UsageError(`--${name} must be a whole number ${range}, got "${raw}"`);
  }
  return value;
}

/** A number flag such as `--ep-factor 2.5`, checked against `min` and, when given, `max`; whole numbers use `intFlag`. */
export function numberFlag(name: string, raw: string | undefined, fallback: number, min: number, max?: number): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (raw.trim() === "" || !Number.isFinite(value) || value < min || (max !== undefined && value > max)) {
    const range = max === undefined ? `≥ ${min}` : `from ${min} to ${max}`;
    throw new UsageError(`--${name} must be a number ${range}, got "${raw}"`);
  }
  return value;
}

/** The longest wait a Node timer holds, in seconds (24.8 days): a longer one fires at once. */
export const MAX_SECONDS = Math.floor((2 ** 31 - 1) / 1000);

/** A duration flag in seconds such as `--timeout 2.5`, returned in milliseconds; at most `MAX_SECONDS`. */
export function secondsFlag(name: string, raw: string | undefined, fallback: number, min: number): number {
  return numberFlag(name, raw, fallback, min, MAX_SECONDS) * 1000;
}

/** Where staging buffers live: POSIX shared memory. */
export const SHM = "/dev/shm";

/** What /dev/shm holds in all, in bytes; null where it cannot be measured, and the allocation itself will say what is wrong. */
export function shmCapacity(): number | null {
  try {
    const fs = statfsSync(SHM);
    return fs.blocks * fs.bsize;
  } catch {
    return null;
  }
}

const SIZE_UNITS: Readonly<Record<string, number>> = { b: 1, kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30 };

/** A size such as 4GiB, 512MiB or 1048576 (bytes), given to `--name`. */
export function byteSize(name: string, raw: string): number {
  const match = /^(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB)?$/i.exec(raw.trim());
  const unit = SIZE_UNITS[(match?.[2] ?? "b").toLowerCase()];
  const value = match && unit ? Math.round(Number(match[1]) * unit) : NaN;
  if (!Number.isSafeInteger(value) || value <= 0) throw new UsageError(`--${name} takes a size such as 4GiB or 1048576, got "${raw}"`);
  return value;
}

/**
 * A size of shared memory in bytes such as `--staging-bytes N`: a whole number from `min` to
 * what /dev/shm holds in all, since no buffer larger than that can ever be allocated.
 */
export function shmBytesFlag(name: string, raw: string | undefined, fallback: number, min: number): number {
  const bytes = intFlag(name, raw, fallback, min);
  const capacity = shmCapacity();
  if (capacity !== null && bytes > capacity) {
    const given = raw === undefined ? `${bytes} (the default)` : raw;
    throw new UsageError(`--${name} ${given} is more than ${SHM} holds (${capacity} bytes in all): give at most ${capacity}, or make ${SHM} larger`);
  }
  return bytes;
}

/** ZeroMQ addresses MonkeyTree's sockets use: TCP, a Unix socket, or in-process. */
const ZMQ_ADDRESS = /^(?:tcp:\/\/(?<host>[^\s/]+):(?<port>\d{1,5}|\*)|ipc:\/\/\S+|inproc:\/\/\S+)$/;
/** The TCP hosts libzmq's connect takes (its own check, before it resolves anything): no wildcard. */
const CONNECT_HOST = /^[A-Za-z0-9[:][A-Za-z0-9.\-:%;[\]_*]*$/;

/**
 * Whether ZeroMQ takes `address` to `use`: tcp://HOST:PORT (a port of 1 to 65535, or to bind,
 * 0 or * for any free one), ipc://PATH or inproc://NAME.
 */
export function isZmqAddress(address: string, use: "bind" | "connect"): boolean {
  const match = ZMQ_ADDRESS.exec(address);
  if (!match) return false;
  const { host, port } = match.groups ?? {};
  if (host === undefined || port === undefined) return true;
  if (use === "bind") return port === "*" || Number(port) <= 65535;
  return CONNECT_HOST.test(host) && Number(port) >= 1 && Number(port) <= 65535;
}

/** The form `isZmqAddress` takes, for messages. */
export const zmqAddressForm = (use: "bind" | "connect"): string =>
  `tcp://HOST:PORT${use === "bind" ? " (port 0 or * for any free one)" : ""}, ipc://PATH or inproc://NAME`;

/**
 * A ZeroMQ address from `source` (a flag such as `--connect`, or where else it came from),
 * checked before any socket is made: ZeroMQ's own answer to a malformed one is "Invalid argument".
 */
export function addressFlag(source: string, address: string, use: "bind" | "connect"): string {
  if (!isZmqAddress(address, use)) throw new UsageError(`${source} must be a ZeroMQ address (${zmqAddressForm(use)}), got ${quote(address)}`);
  return address;
}

/** Reads and validates a snapshot file; every failure is an `InvalidInputError` naming the file. */
export async function readSnapshotFile(path: string): Promise<Cluster> {
  return parseSnapshotText(await readInputFile(path, "snapshot"), `snapshot ${path}`);
}

/**
 * Reads an input document of at most `max` bytes (default: the largest snapshot's size); a
 * missing, unreadable or oversized file is an `InvalidInputError` naming it as `WHAT PATH`.
 * A pipe or a device is read too (`--snapshot <(…)`), up to the same bound.
 */
export async function readInputFile(path: string, what: string, max = MAX_SNAPSHOT_BYTES): Promise<string> {
  let read;
  try {
    read = readFileAtMost(path, max);
  } catch (error) {
    throw new InvalidInputError(`${what} ${path}`, [{ path: "", message: `cannot read it (${readFailure(error)})` }]);
  }
  if ("unread" in read) throw new InvalidInputError(`${what} ${path}`, [{ path: "", message: `it holds more than the ${max} bytes a ${what} may have` }]);
  return read.text;
}

/** Writes one JSON document and waits until it is flushed, so pipes never truncate it. */
export function writeJson(io: Io, value: unknown): Promise<void> {
  return new Promise((resolve, reject) => {
    io.out.write(`${JSON.stringify(value, null, 2)}\n`, (error) => (error ? reject(error) : resolve()));
  });
}

/** A small fixed-width text table for human output. */
export function table(header: readonly string[], rows: readonly (readonly (string | number)[])[]): string {
  const cells = [header, ...rows].map((row) => row.map(String));
  const widths = header.map((_, c) => cells.reduce((max, row) => Math.max(max, row[c]?.length ?? 0), 0));
  return cells.map((row) => row.map((cell, c) => cell.padStart(widths[c] ?? 0)).join("  ")).join("\n");
}

/** Where a client finds its credential file when `--credentials` is not given. */
export const CREDENTIALS_ENV = "MONKEYTREE_CREDENTIALS";

/**
 * The credential named by `--credentials FILE`, else by $MONKEYTREE_CREDENTIALS; none talks to
 * a controller without a keyring.
 */
export function credentialFlag(raw: string | undefined): { path: string; credential: Credential } | undefined {
  const path = raw ?? process.env[CREDENTIALS_ENV];
  if (path === undefined || path === "") return undefined;
  return { path, credential: readCredential(path) };
}

/**
 * What to do about a controller that refused a client's handshake, as one line: `path` is the
 * credential the client gave (undefined: none), `wanted` the one it needs, as "the
 * daemon-3.json that `monkeytree keys --daemon 3` wrote".
 */
export function refusalAdvice(error: ControllerRefusedError, path: string | undefined, wanted: string): string {
  switch (error.reason) {
    case "credential-required":
      return `${error.message}: give --credentials ${wanted}, or set $${CREDENTIALS_ENV} to it`;
    case "credential-unexpected":
      return `${error.message} (${path}): leave out --credentials and $${CREDENTIALS_ENV}, or start the controller with --keys DIR`;
    case "key-unknown":
      return `${error.message} (${path}): give --credentials ${wanted} into the controller's --keys DIR, or send the controller SIGHUP if that keyring gained the key since it started`;
  }
}

/** Whether a ZeroMQ address reaches this machine only: loopback TCP, ipc:// or inproc://. */
export const isLoopback = (endpoint: string): boolean => /^(ipc:\/\/|inproc:\/\/|tcp:\/\/(127\.[\d.]+|localhost|\[::1\]):)/.test(endpoint);
