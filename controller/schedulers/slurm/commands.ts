import { execFile } from "node:child_process";
import { accessSync, constants, statSync } from "node:fs";
import { delimiter, join } from "node:path";
import { parseReservations, parseSinfo, parseSqueue, type SlurmJob, type SlurmNode, type SlurmReservation } from "./reports.ts";

/**
 * Slurm's client commands, as the adapter uses them (Slurm 22.05, verified against Debian's
 * slurm-wlm; see docs/slurm.md). Each runs with a deadline and a bounded output, and a
 * failure is a `SlurmCommandError` quoting what the command said.
 */

/** A Slurm command that failed, timed out or could not start. */
export class SlurmCommandError extends Error {
  override readonly name: string = "SlurmCommandError";
  readonly code = "slurm_command_failed";
  constructor(
    readonly command: string,
    readonly detail: string,
  ) {
    super(`${command}: ${detail}`);
  }
}

/** A Slurm command that is not installed here: no such file on PATH. */
export class SlurmNotInstalledError extends SlurmCommandError {
  override readonly name = "SlurmNotInstalledError";
  constructor(command: string) {
    super(
      command,
      `${command} is not installed here (not on PATH): install Slurm's client commands (Debian and Ubuntu: apt install slurm-client, or slurm-wlm with the daemons) or add their directory to PATH`,
    );
  }
}

/** The client commands this module runs. */
const COMMANDS = ["sinfo", "squeue", "scontrol"] as const;

export interface SlurmOptions {
  /** slurm.conf for the client commands (`SLURM_CONF`); default: the commands' own. */
  readonly conf?: string;
  /** Each command's deadline (default 10 s: slurmctld answers in milliseconds unless it is down). */
  readonly timeoutMs?: number;
}

/** Every reservation MonkeyTree creates is named so, which is how a restarted adapter finds its holds. */
export const HOLD_PREFIX = "monkeytree-";

/**
 * The reservation holding the destination of Slurm job `job`'s migration `migration`
 * (`monkeytree-12-p3-1` for job 12's move p3/1): the name alone says which job it serves, so a
 * restarted adapter releases the holds of jobs that ended meanwhile.
 */
export const holdName = (job: string, migration: string): string => `${HOLD_PREFIX}${job}-${migration.replace(/[^A-Za-z0-9_]/g, "-")}`;

/** The Slurm job a hold serves, or null for a reservation MonkeyTree did not create. */
export const holdJob = (name: string): string | null => /^monkeytree-(\d+)-/.exec(name)?.[1] ?? null;

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/** Larger than the reports of the largest cluster MonkeyTree supports, with all its jobs. */
const MAX_OUTPUT_BYTES = 64 * 2 ** 20;

export class Slurm {
  private readonly env: NodeJS.ProcessEnv;
  private readonly timeoutMs: number;

  constructor(options: SlurmOptions = {}) {
    this.env = options.conf === undefined ? process.env : { ...process.env, SLURM_CONF: options.conf };
    this.timeoutMs = options.timeoutMs ?? 10_000;
  }

  /** Throws `SlurmNotInstalledError` for the first of Slurm's commands not on PATH, before any is needed. */
  requireCommands(): void {
    const path = (this.env.PATH ?? "").split(delimiter).filter((dir) => dir !== "");
    const missing = COMMANDS.find((command) => !path.some((dir) => isExecutable(join(dir, command))));
    if (missing) throw new SlurmNotInstalledError(missing);
  }

  async nodes(): Promise<SlurmNode[]> {
    return parseSinfo(await this.run("sinfo", ["--json"]));
  }

  /** Every job of every partition, hidden ones included. */
  async jobs(): Promise<SlurmJob[]> {
    return parseSqueue(await this.run("squeue", ["--json", "--all"]));
  }

  async reservations(): Promise<SlurmReservation[]> {
    return parseReservations(await this.run("scontrol", ["show", "reservation", "-o"]));
  }

  /**
   * Holds `node` for `user` until released: a reservation with IGNORE_JOBS, which Slurm accepts
   * even while jobs run on the node, after which it starts no other user's job there. Holding
   * again under the same name is a no-op when that reservation holds the same node.
   */
  async hold(name: string, node: string, user: string): Promise<void> {
    try {
      await this.run("scontrol", [
        "create",
        "reservation",
        `ReservationName=${name}`,
        `Nodes=${node}`,
        `Users=${user}`,
        "StartTime=now",
        "Duration=infinite",
        "Flags=IGNORE_JOBS",
      ]);
    } catch (error) {
      const existing = (await this.reservations()).find((r) => r.name === name);
      if (existing && existing.nodes.length === 1 && existing.nodes[0] === node) return;
      throw error;
    }
  }

  /** Ends a hold; one that no longer exists is released already. */
  async release(name: string): Promise<void> {
    try {
      await this.run("scontrol", ["delete", `ReservationName=${name}`]);
    } catch (error) {
      if ((await this.reservations()).some((r) => r.name === name)) throw error;
    }
  }

  /**
   * Shrinks running job `job` to `keep`: the dropped nodes turn idle at once. Slurm refuses to
   * drop the batch host, and kills the tasks any step of the job has on a dropped node.
   */
  async shrink(job: string, keep: readonly string[]): Promise<void> {
    await this.run("scontrol", ["update", `JobId=${job}`, `NodeList=${keep.join(",")}`]);
  }

  private run(command: string, args: readonly string[]): Promise<string> {
    const line = [command, ...args].join(" ");
    return new Promise((resolve, reject) => {
      execFile(command, args, { env: this.env, timeout: this.timeoutMs, maxBuffer: MAX_OUTPUT_BYTES, encoding: "utf8" }, (error, stdout, stderr) => {
        if (!error) return resolve(stdout);
        if (error.code === "ENOENT") return reject(new SlurmNotInstalledError(command));
        const said = (stderr || stdout).trim().split("\n").slice(-3).join(" / ");
        const why = error.killed ? `no answer in ${this.timeoutMs} ms` : said || error.message;
        reject(new SlurmCommandError(line, why));
      });
    });
  }
}
