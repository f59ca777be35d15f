import { mkdtempSync, rmSync } from "node:fs";
import { removeStaleStagingBuffers } from "../native/index.ts";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEMO_ARRIVING, DEMO_RUNNING, DEMO_TOPOLOGY, DemoError, runDemo } from "./demo/run.ts";
import { bool, checked, helpText, int, num, parseCommandFlags, seconds, type Flag } from "./flags.ts";
import { ExitCode, SHM, shmCapacity, UsageError, type Command } from "./io.ts";
import { writableFile } from "./output.ts";

const t = DEMO_TOPOLOGY;

const STATE_MB = num("N", "training state per worker in MiB; 8 workers in all", { default: 64, min: 1 });

/**
 * `--state-mb`, at most what fits /dev/shm: each host's daemon stages two checkpoints of
 * 4 MiB above the state, and its worker holds a third.
 */
const stateFlag: Flag<number> = {
  ...STATE_MB,
  parse: (raw, name) => {
    const stateMb = STATE_MB.parse(raw, name);
    const capacity = shmCapacity();
    const hosts = t.racks * t.hostsPerRack;
    const needed = hosts * (3 * stateMb + 4) * 2 ** 20;
    if (capacity !== null && needed > capacity) {
      const most = Math.floor((capacity / 2 ** 20 / hosts - 4) / 3);
      const fix = most >= 1 ? `give at most ${most}, or make ${SHM} larger` : `make ${SHM} larger`;
      const given = typeof raw === "string" ? raw : `${stateMb} (the default)`;
      throw new UsageError(`--${name} ${given} needs ${needed} bytes of ${SHM} (${hosts} hosts × 3 checkpoints), more than its ${capacity}: ${fix}`);
    }
    return stateMb;
  },
};

const FLAGS = {
  "state-mb": stateFlag,
  steps: int("N", "iterations every job runs", { default: 40, min: 2 }),
  "step-ms": int("N", "shortest iteration in ms, standing in for GPU time", { default: 100, min: 0 }),
  keep: bool("keep the working directory (journal, logs, worker events) afterwards"),
  timeout: seconds("S", "give up on any stage that takes longer than S seconds", { default: 60, min: 1 }),
  "metrics-targets": checked(
    "FILE",
    "the controller and every daemon serve Prometheus metrics on a free loopback port, listed in FILE for " +
      "Prometheus's file_sd_configs (labels role and host)",
    writableFile,
  ),
};

const help = helpText({
  command: "monkeytree demo",
  table: FLAGS,
  about: `Runs MonkeyTree end to end on this machine, with no configuration: a controller, a daemon per
emulated host (${t.racks} racks × ${t.hostsPerRack} hosts, ${t.uplinksPerRack} uplinks per rack) and three data-parallel jobs of the
example training loop (cli/demo/), every one a real process. ${DEMO_RUNNING.map((j) => j.id).join(" and ")} start
first; then ${DEMO_ARRIVING.id} arrives on the free hosts, which takes two racks over their bound. The
controller plans the fewest moves (swaps: no host is free), the moved workers' checkpoints
travel through the native transfer engine into the destinations' staging buffers,
replacements resume from them, and at the end every job's state is compared, bit for bit,
with an unmigrated replay of the same seed.`,
  after: `On SIGINT or SIGTERM (Ctrl-C) it stops every process it started, removes their staging
buffers from /dev/shm, says so and exits 130.

exit codes: 0 every move done and every job bit-identical, 1 otherwise, 2 bad usage,
3 internal error, 130 interrupted.`,
});

export const command: Command = {
  summary: "run controller, daemons and jobs on this machine, with real migrations",
  help,
  async run(argv, io) {
    const flags = parseCommandFlags(argv, FLAGS);
    const { "state-mb": stateMb, steps, "step-ms": stepMs, timeout: timeoutMs } = flags;
    const dir = mkdtempSync(join(tmpdir(), "monkeytree-demo-"));
    const print = (line: string) => io.out.write(`${line}\n`);
    const jobs = [...DEMO_RUNNING, DEMO_ARRIVING];
    print(
      `MonkeyTree demo: ${t.racks} racks × ${t.hostsPerRack} hosts × ${t.gpusPerHost} GPUs, ${t.uplinksPerRack} uplinks per rack; jobs ${jobs.map((j) => `${j.id} (TP 8, DP ${j.hosts.length})`).join(", ")}; ${stateMb} MiB of state per worker, ${steps} iterations`,
    );
    print(`working directory ${dir}`);
    let ok = false;
    const interrupt = new AbortController();
    const stop = (signal: NodeJS.Signals) => interrupt.abort(signal);
    process.once("SIGINT", stop).once("SIGTERM", stop);
    const interrupted = () => {
      // Every process the demo started has ended by now, so their staging buffers are stale.
      const freed = removeStaleStagingBuffers();
      io.err.write(
        `monkeytree demo: ${String(interrupt.signal.reason)}: stopped every process it started and removed ${freed.length} staging buffers from /dev/shm\n`,
      );
      return ExitCode.interrupted;
    };
    try {
      const metrics = flags["metrics-targets"] === undefined ? {} : { metrics: { targets: flags["metrics-targets"] } };
      const result = await runDemo({ dir, stateBytes: Math.round(stateMb * 2 ** 20), steps, stepMs, timeoutMs, print, signal: interrupt.signal, ...metrics });
      if (interrupt.signal.aborted) return interrupted();
      ok = result.ok;
      print("");
      print(ok ? "ok: every move committed, every rack is within its bound, and every job's state is bit-identical to its replay" : "FAILED: see above");
      return ok ? ExitCode.ok : ExitCode.findings;
    } catch (error) {
      if (interrupt.signal.aborted) return interrupted();
      if (!(error instanceof DemoError)) throw error;
      io.err.write(`monkeytree demo: ${error.message}\n`);
      return ExitCode.findings;
    } finally {
      process.off("SIGINT", stop).off("SIGTERM", stop);
      if (ok && !flags.keep) rmSync(dir, { recursive: true, force: true });
      else print(`logs, journal and worker events kept in ${dir}`);
    }
  },
};
