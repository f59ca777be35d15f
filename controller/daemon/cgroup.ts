import { randomBytes } from "node:crypto";
import { accessSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { processAlive } from "../../native/index.ts";

/**
 * A cgroup (v2) per replacement, so that whatever a job's replacement starts, even a process
 * that left its session and process group (`setsid`), is stopped with it: a cgroup cannot be
 * left from the inside without the right to write its parent's `cgroup.procs`.
 */

/** A `--cgroup` directory the daemon cannot use: not cgroup v2, or not writable. */
export class CgroupConfigError extends Error {
  override readonly name = "CgroupConfigError";
}

/** A daemon's own directory's name: stale ones (their daemon dead) are removed at start. */
const OWN_DIR = /^monkeytree-(\d+)-[0-9a-f]+$/;

/** The cgroup v2 this process runs in, when the host mounts cgroup v2 and lets this process make children there. */
export function ownCgroup(mountinfo = "/proc/self/mountinfo", membership = "/proc/self/cgroup"): string | null {
  const mount = readFileSync(mountinfo, "utf8")
    .split("\n")
    .map((line) => line.split(" - "))
    .find(([, fs]) => fs?.startsWith("cgroup2 "))?.[0]
    ?.split(" ")[4];
  const path = /^0::(\/.*)$/m.exec(readFileSync(membership, "utf8"))?.[1];
  if (mount === undefined || path === undefined) return null;
  const dir = join(mount, path);
  return writable(dir) ? dir : null;
}

function writable(dir: string): boolean {
  try {
    accessSync(dir, constants.W_OK);
    return existsSync(join(dir, "cgroup.procs"));
  } catch {
    return false;
  }
}

/**
 * Removes a cgroup and its children, deepest first; one still running something stays (EBUSY).
 * Daemons starting together sweep the same stale directories, so one already gone is no error.
 */
function removeTree(dir: string): void {
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw error;
  }
  for (const entry of entries) if (entry.isDirectory()) removeTree(join(dir, entry.name));
  try {
    rmdirSync(dir);
  } catch {
    // Still populated: a committed move's replacement that outlived its daemon trains on.
  }
}

export class ReplacementCgroups {
  private constructor(readonly dir: string) {}

  /**
   * Takes a directory of its own under `parent` (a cgroup v2 directory this process may write),
   * first removing what daemons no longer running left there.
   */
  static open(parent: string): ReplacementCgroups {
    if (!writable(parent))
      throw new CgroupConfigError(
        `--cgroup ${parent} is not a cgroup v2 directory this daemon can write; give a delegated cgroup v2 directory (e.g. under /sys/fs/cgroup) or run the daemon as root`,
      );
    for (const name of readdirSync(parent)) {
      const pid = Number(OWN_DIR.exec(name)?.[1]);
      if (pid && !processAlive(pid)) removeTree(join(parent, name));
    }
    const dir = join(parent, `monkeytree-${process.pid}-${randomBytes(4).toString("hex")}`);
    mkdirSync(dir);
    return new ReplacementCgroups(dir);
  }

  /** A new, empty cgroup for one replacement; its `cgroup.procs` is where the replacement enters. */
  create(): string {
    const dir = join(this.dir, randomBytes(8).toString("hex"));
    mkdirSync(dir);
    return dir;
  }

  /** Kills everything in `cgroup` and removes it once empty; resolves when it is gone or `timeoutMs` passed. */
  async stop(cgroup: string, timeoutMs = 5_000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      killAll(cgroup);
      try {
        rmdirSync(cgroup);
        return true;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return true;
        if (Date.now() > deadline) return false;
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  /** Removes this daemon's directory where nothing runs in it any more. */
  close(): void {
    removeTree(this.dir);
  }
}

/** `cgroup.kill` where the kernel has it (5.14+), else SIGKILL to each member; new members are caught by the next round. */
function killAll(cgroup: string): void {
  try {
    writeFileSync(join(cgroup, "cgroup.kill"), "1");
    return;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT" && !existsSync(cgroup)) return;
  }
  let members: string[];
  try {
    members = readFileSync(join(cgroup, "cgroup.procs"), "utf8").split("\n").filter(Boolean);
  } catch {
    return;
  }
  for (const pid of members) {
    try {
      process.kill(Number(pid), "SIGKILL");
    } catch {
      // Already gone.
    }
  }
}
