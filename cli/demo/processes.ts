import { spawn, type ChildProcess } from "node:child_process";
import { chownSync, openSync, closeSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { resolveTenant, type Tenant } from "../../controller/daemon/replacements.ts";

export { CLI, WORKER } from "../paths.ts";
export { RUN_TS } from "../../sdk/contract/paths.ts";

/**
 * Starts and stops the demo's processes (controller, daemons, workers). Each gets its own
 * process group, so stopping a daemon also stops the replacement launchers it started, and
 * its stdout and stderr go to `<dir>/<name>.log`.
 */

export interface Managed {
  readonly name: string;
  readonly child: ChildProcess;
  readonly log: string;
  /** Settles with the exit code (or the signal's name) once the process ended. */
  readonly exited: Promise<number | string>;
}

/**
 * The user the daemons started here run replacements as (their --run-as): nobody when this
 * runs as root, since no tenant's code runs as root; otherwise none, and they run as this user.
 */
export function replacementUser(): Tenant | undefined {
  return process.getuid?.() === 0 ? resolveTenant("nobody") : undefined;
}

/** Creates `file` empty, owned by `tenant` if any: processes of this user and replacements run as the tenant both append to it. */
export function sharedFile(file: string, tenant: Tenant | undefined): void {
  writeFileSync(file, "");
  if (tenant) chownSync(file, tenant.uid, tenant.gid);
}

/** `argv` as one /bin/sh command line, each word quoted: how a daemon's --replacement takes a program. */
export function shellCommand(argv: readonly string[]): string {
  return argv.map((word) => `'${word.replaceAll("'", "'\\''")}'`).join(" ");
}

/** Lines a failure quotes from the failed process's log, so that its reason is seen where the failure is. */
const QUOTED_LINES = 8;
const QUOTED_CHARS = 2_000;

/** The end of `log`, indented under the failure that quotes it; empty when there is none. */
function lastLines(log: string): string {
  let text: string;
  try {
    text = readFileSync(log, "utf8");
  } catch {
    return "";
  }
  const lines = text.trimEnd().split("\n").slice(-QUOTED_LINES).join("\n").slice(-QUOTED_CHARS);
  return lines === "" ? "" : `; it ended with:\n${lines.replace(/^/gm, "    ")}`;
}

export class ProcessGroup {
  private readonly running = new Set<Managed>();
  private stopping = false;
  /** The first process that exited on its own with a failure, described with its log. */
  failure: string | null = null;

  constructor(private readonly dir: string) {}

  /** Starts a process; once stopping (an interrupted demo), starts none and throws. */
  start(name: string, args: readonly string[]): Managed {
    if (this.stopping) throw new Error(`not starting ${name}: the demo is stopping`);
    const log = join(this.dir, `${name}.log`);
    const fd = openSync(log, "a");
    const child = spawn(process.execPath, args, { stdio: ["ignore", fd, fd], detached: true });
    closeSync(fd);
    const exited = new Promise<number | string>((resolve) => {
      child.once("exit", (code, signal) => resolve(code ?? signal ?? "unknown"));
      child.once("error", (error) => resolve(error.message));
    });
    const managed: Managed = { name, child, log, exited };
    this.running.add(managed);
    void exited.then((outcome) => {
      this.running.delete(managed);
      if (outcome !== 0 && !this.stopping) this.failure ??= `${name} exited (${outcome}); see ${log}${lastLines(log)}`;
    });
    return managed;
  }

  /** Waits until the process's log holds a line matching `pattern`; fails if it exits first. */
  async waitFor(managed: Managed, pattern: RegExp, timeoutMs: number): Promise<RegExpMatchArray> {
    const deadline = Date.now() + timeoutMs;
    let ended = false;
    void managed.exited.then(() => (ended = true));
    for (;;) {
      const match = pattern.exec(readFileSync(managed.log, "utf8"));
      if (match) return match;
      if (ended) throw new Error(`${managed.name} exited (${await managed.exited}) before printing ${pattern}; see ${managed.log}${lastLines(managed.log)}`);
      if (Date.now() > deadline) throw new Error(`${managed.name} did not print ${pattern} within ${timeoutMs} ms; see ${managed.log}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Sends `signal` to the process's whole group. */
  kill(managed: Managed, signal: NodeJS.Signals): void {
    try {
      if (managed.child.pid !== undefined) process.kill(-managed.child.pid, signal);
    } catch {
      // The group is already gone.
    }
  }

  /**
   * The controller whose replacements `stopAll` ends too: daemons start them in process groups
   * of their own, which outlive the daemons (as they must on a real host, where they train on).
   */
  controller: string | null = null;

  /** SIGTERM to every group, SIGKILL to those still running after `graceMs`. */
  async stopAll(graceMs = 3_000): Promise<void> {
    this.stopping = true;
    if (this.controller !== null) killReplacements(this.controller);
    const all = [...this.running];
    for (const managed of all) this.kill(managed, "SIGTERM");
    const timer = setTimeout(() => {
      for (const managed of all) this.kill(managed, "SIGKILL");
    }, graceMs);
    await Promise.all(all.map((m) => m.exited));
    clearTimeout(timer);
  }
}

/**
 * SIGKILLs the replacements daemons started for the controller at `endpoint`, found by the
 * MONKEYTREE_CONTROLLER their environment carries.
 */
export function killReplacements(endpoint: string): void {
  killByEnvironment(`MONKEYTREE_CONTROLLER=${endpoint}`);
}

/**
 * Sends `signal` (SIGKILL unless given; 0 only looks) to every other process whose environment
 * holds `entry` (NAME=VALUE): what a daemon started outlives it in a process group, or a session,
 * of its own. Returns the ids of the processes signalled.
 */
export function killByEnvironment(entry: string, signal: NodeJS.Signals | 0 = "SIGKILL"): number[] {
  const signalled: number[] = [];
  const marker = `\0${entry}\0`;
  for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name) && Number(name) !== process.pid)) {
    let environ: string;
    try {
      environ = readFileSync(`/proc/${pid}/environ`, "latin1");
    } catch {
      continue; // gone, or not ours to read
    }
    if (!`\0${environ}\0`.includes(marker)) continue;
    try {
      process.kill(Number(pid), signal);
      signalled.push(Number(pid));
    } catch {
      // Already gone.
    }
  }
  return signalled;
}
