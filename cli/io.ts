import { readFile, stat } from "node:fs/promises";
import { parseArgs, type ParseArgsConfig } from "node:util";
import { InvalidInputError } from "../sdk/errors.ts";
import { readCredential, type Credential } from "../sdk/protocol/auth.ts";
import { parseSnapshotText, type Cluster } from "../controller/model/cluster.ts";
import { MAX_SNAPSHOT_BYTES } from "../sdk/protocol/limits.ts";

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

type StrictConfig<T> = { args: string[]; options: T; allowPositionals: false; strict: true };

/** `parseArgs` with unknown flags and stray positionals reported as `UsageError`. */
// The return type is spelled out because the one inferred names @types/node types that a
// declaration file cannot import.
export function parseFlags<T extends NonNullable<ParseArgsConfig["options"]>>(argv: string[], options: T): ReturnType<typeof parseArgs<StrictConfig<T>>>["values"] {
  try {
    return parseArgs({ args: argv, options, allowPositionals: false, strict: true }).values;
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
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

/** A number flag such as `--time-limit 2.5`, checked against a minimum; whole numbers use `intFlag`. */
export function numberFlag(name: string, raw: string | undefined, fallback: number, min: number): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < min) {
    throw new UsageError(`--${name} must be a number ≥ ${min}, got "${raw}"`);
  }
  return value;
}

/** Reads and validates a snapshot file; every failure is an `InvalidInputError` naming the file. */
export async function readSnapshotFile(path: string): Promise<Cluster> {
  return parseSnapshotText(await readInputFile(path, "snapshot"), `snapshot ${path}`);
}

/**
 * Reads an input document of at most the largest snapshot's size; a missing, unreadable or
 * oversized file is an `InvalidInputError` naming it as `WHAT PATH`.
 */
export async function readInputFile(path: string, what: string): Promise<string> {
  try {
    const { size } = await stat(path);
    if (size > MAX_SNAPSHOT_BYTES) {
      throw new InvalidInputError(`${what} ${path}`, [{ path: "", message: `${size} bytes is larger than the ${MAX_SNAPSHOT_BYTES} a ${what} of the largest supported cluster needs` }]);
    }
    return await readFile(path, "utf8");
  } catch (error) {
    if (error instanceof InvalidInputError) throw error;
    const reason = (error as NodeJS.ErrnoException).code === "ENOENT" ? "no such file" : String((error as Error).message);
    throw new InvalidInputError(`${what} ${path}`, [{ path: "", message: `cannot read it (${reason})` }]);
  }
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

/** Whether a ZeroMQ address reaches this machine only: loopback TCP, ipc:// or inproc://. */
export const isLoopback = (endpoint: string): boolean => /^(ipc:\/\/|inproc:\/\/|tcp:\/\/(127\.[\d.]+|localhost|\[::1\]):)/.test(endpoint);
