import { closeSync, constants, existsSync, openSync, rmSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { errnoReason, InvalidInputError, makeDirectory, MakeDirectoryError } from "../sdk/contract/errors.ts";

/**
 * Output paths (`--csv DIR`, `--output FILE`, ...) checked before a command does its work, so a
 * path it cannot write costs one line at once rather than a finished run's results.
 */

/** A path named by `--FLAG` that cannot be written, said as `--FLAG PATH: what and how to fix it`. */
const unwritable = (flag: string, path: string, what: string, want: string): InvalidInputError =>
  new InvalidInputError(`--${flag} ${path}`, [{ path: "", message: `${what}; give --${flag} ${want} this user can write` }]);

/**
 * Makes `--FLAG DIR` (with `mode`, its missing parents too) and proves it writable by creating
 * and removing a file in it; access(2) would say yes to root on a read-only /proc.
 */
export function outputDir(flag: string, dir: string, mode = 0o777): void {
  try {
    makeDirectory(dir, mode);
  } catch (error) {
    if (!(error instanceof MakeDirectoryError)) throw error;
    const what = !error.cause && error.path === resolve(dir) ? "it is a file, not a directory" : error.message;
    throw unwritable(flag, dir, what, "a directory");
  }
  const probe = join(dir, `.monkeytree-probe-${process.pid}`);
  try {
    closeSync(openSync(probe, "w"));
  } catch (error) {
    throw unwritable(flag, dir, `cannot write in it (${errnoReason(error)})`, "a directory");
  }
  rmSync(probe);
}

/**
 * Proves `--FLAG FILE` writable by opening it to append, which changes nothing in a file that
 * exists; one this made is removed again. Non-blocking, so a FIFO nobody reads fails at once.
 */
export function outputFile(flag: string, path: string): void {
  if (existsSync(path) && statSync(path).isDirectory()) throw unwritable(flag, path, "it is a directory, not a file", "a file path");
  const made = !existsSync(path);
  try {
    closeSync(openSync(path, constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_NONBLOCK, 0o666));
  } catch (error) {
    throw unwritable(flag, path, `cannot write it (${errnoReason(error)})`, "a file path");
  }
  if (made) rmSync(path);
}

/** `--FLAG FILE`'s path once `outputFile` proved it writable, for a flag table's `checked`. */
export function writableFile(path: string, flag: string): string {
  outputFile(flag, path);
  return path;
}

/** `--FLAG DIR`'s path once `outputDir` made it and proved it writable, for a flag table's `checked`. */
export function writableDir(path: string, flag: string): string {
  outputDir(flag, path);
  return path;
}
