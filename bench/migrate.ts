// Migration downtime of a live torchrun DDP job (examples/ddp/train.py, gloo on CPU), split
// into phases. Everything runs on this machine over loopback: a controller, a daemon per host
// (two racks of two hosts, one uplink each), the DDP job under `monkeytree launch` on hosts 0
// and 2, and a second job that arrives on hosts 1 and 3 and makes the controller swap one of
// the DDP workers to the other rack.
//
//   npm run bench:migrate -- [--params 100e6] [--steps 30] [--keep]
//
// Phases come from the controller's journaled transitions (status history) and from the
// launchers' logs, which the benchmark watches and timestamps as lines appear (±20 ms). The
// engine's raw rate is measured in the same run: the same number of bytes, staging buffer to
// staging buffer over loopback with the same engine.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { numberFlag, parseFlags, table, UsageError } from "../cli/io.ts";
import { CLI, ProcessGroup, replacementUser, shellCommand, WORKER, type Managed } from "../cli/demo/processes.ts";
import { Listener, send, StagingBuffer } from "../native/index.ts";
import { ControllerClient } from "../sdk/client.ts";
import type { StatusReport } from "../sdk/protocol/status.ts";
import { benchMain } from "./entry.ts";

const PYTHON = "/usr/bin/python3";
const TOPOLOGY = { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 };

const help = `usage: npm run bench:migrate -- [options]

Downtime of one DDP worker's migration, by phase, beside the transfer engine's raw rate.

options:
  --params N   model parameters, about (default 100e6; the checkpoint holds them and SGD momentum)
  --steps N    training steps (default 30; the second job arrives after the first)
  --keep       keep the working directory (logs, journal)
  --json       print one JSON line instead of tables
  -h, --help   show this help`;

interface Options {
  readonly help: boolean;
  readonly params: number;
  readonly steps: number;
  readonly keep: boolean;
  readonly json: boolean;
}

function parse(argv: string[]): Options {
  const flags = parseFlags(argv, { help: { type: "boolean" }, params: { type: "string" }, steps: { type: "string" }, keep: { type: "boolean" }, json: { type: "boolean" } });
  const steps = numberFlag("steps", flags.steps, 30, 10);
  if (!Number.isInteger(steps)) throw new UsageError(`--steps must be a whole number, got "${flags.steps}"`);
  return { help: flags.help ?? false, params: numberFlag("params", flags.params, 100e6, 1e3), steps, keep: flags.keep ?? false, json: flags.json ?? false };
}

/**
 * Polls log files and remembers when each pattern first matched, on this process's clock;
 * `barriers` also timestamps every barrier line of the stayer as it appears.
 */
class LogWatch {
  readonly seen = new Map<string, { at: number; match: RegExpMatchArray }>();
  readonly barriers = new Map<number, number>();
  private readonly timer: NodeJS.Timeout;
  constructor(
    private readonly patterns: Record<string, { file: () => string | null; pattern: RegExp }>,
    private readonly stayerLog: string,
  ) {
    this.timer = setInterval(() => this.poll(), 20);
  }
  poll(): void {
    for (const [name, { file, pattern }] of Object.entries(this.patterns)) {
      const path = file();
      if (this.seen.has(name) || path === null) continue;
      const match = pattern.exec(readFileSync(path, "utf8"));
      if (match) this.seen.set(name, { at: Date.now(), match });
    }
    for (const [, step] of readFileSync(this.stayerLog, "utf8").matchAll(/→ holding: barrier (\d+)$/gm)) {
      if (!this.barriers.has(Number(step))) this.barriers.set(Number(step), Date.now());
    }
  }
  stop(): void {
    clearInterval(this.timer);
  }
}

async function until<T>(group: ProcessGroup, what: string, check: () => Promise<T | undefined> | T | undefined, timeoutMs: number): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (group.failure) throw new Error(`while waiting for ${what}: ${group.failure}`);
    if (performance.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The same engine, staging to staging over loopback, for `bytes`: seconds of the best of three. */
async function rawTransfer(bytes: number): Promise<number> {
  const source = StagingBuffer.create({ size: bytes, lock: false });
  const destination = StagingBuffer.create({ size: bytes, lock: false });
  const listener = Listener.open({});
  try {
    source.bytes().fill(7);
    let best = Infinity;
    for (let run = 0; run < 3; run++) {
      const grant = listener.grant(destination, { length: bytes });
      const started = performance.now();
      await send({ ticket: grant.ticket, buffer: source });
      await grant.completion;
      best = Math.min(best, (performance.now() - started) / 1000);
    }
    return best;
  } finally {
    listener.close();
    source.free();
    destination.free();
  }
}

async function run(options: Options): Promise<number> {
  if (spawnSync(PYTHON, ["-c", "import torch"]).status !== 0) {
    process.stderr.write(`bench:migrate needs torch for ${PYTHON} (Debian: apt-get install python3-torch)\n`);
    return 1;
  }
  const hidden = Math.max(1, Math.round(options.params / 21));
  // Parameters and momentum, float32, plus room for metadata.
  const checkpointBytes = Math.ceil((2 * 21 * hidden * 4 + (1 << 20)) / 4096) * 4096;
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-bench-migrate-"));
  const group = new ProcessGroup(dir);
  // The hook, for the launchers' Python processes and the replacements the daemons start.
  process.env.PYTHONPATH = [join(process.cwd(), "sdk/python"), process.env.PYTHONPATH].filter(Boolean).join(":");
  process.env.OMP_NUM_THREADS ??= "1";
  // Every barrier in the launchers' logs: the step times around the move come from them.
  process.env.MONKEYTREE_LOG = "debug";
  const progress = (line: string) => options.json || process.stderr.write(`${line}\n`);
  let client: ControllerClient | undefined;
  try {
    const snapshot = join(dir, "topology.json");
    writeFileSync(snapshot, JSON.stringify({ topology: TOPOLOGY, jobs: [] }));
    const controller = group.start("controller", [...CLI, "controller", "--snapshot", snapshot, "--bind", "tcp://127.0.0.1:*", "--journal", join(dir, "journal")]);
    const endpoint = (await group.waitFor(controller, /controller listening on (tcp:\/\/\S+)/, 20_000))[1]!;
    client = new ControllerClient({ endpoint, timeoutMs: 10_000 });
    const launch = [
      "--checkpoint-bytes", String(checkpointBytes), "--master-port", "29800",
      "--", PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "1", "examples/ddp/train.py", "--steps", String(options.steps), "--hidden", String(hidden),
    ];
    const other = [...WORKER, "--steps", "1000000", "--step-ms", "100"];
    // A daemon passes a replacement none of its own environment: the hook's path and the log level go in its command.
    const passed = ["PYTHONPATH", "OMP_NUM_THREADS", "MONKEYTREE_LOG"].map((name) => `${name}=${process.env[name]}`);
    const tenant = replacementUser();
    const daemons = [0, 1, 2, 3].map((host) =>
      group.start(`daemon-${host}`, [
        ...CLI, "daemon", "--host", String(host), "--connect", endpoint, "--listen", "127.0.0.1:0", "--staging-bytes", String(checkpointBytes + (1 << 20)),
        "--replacement", `ddp=${shellCommand(["env", ...passed, process.execPath, ...CLI, "launch", ...launch])}`,
        "--replacement", `other=${shellCommand([process.execPath, ...other])}`,
        ...(tenant ? ["--run-as", tenant.user] : []),
      ]),
    );
    await until(group, "the daemons", async () => ((await client!.status()).hosts.registered === 4 ? true : undefined), 30_000);
    progress(`bench:migrate: ${(21 * hidden / 1e6).toFixed(0)}M parameters, ${(checkpointBytes / 2 ** 20).toFixed(0)} MiB checkpoint; starting the DDP job`);
    const ddp = new Map<number, Managed>();
    for (const host of [0, 2]) {
      ddp.set(host, group.start(`ddp-${host}`, [...CLI, "launch", "--job", "ddp", "--host", String(host), "--dp", "2", "--connect", endpoint, "--replacement", "ddp", ...launch]));
    }
    const gate = join(dir, "other.admitted");
    for (const host of [1, 3]) {
      group.start(`other-${host}`, [...other, "--controller", endpoint, "--job", "other", "--host", String(host), "--tp", "1", "--dp", "2", "--state-bytes", String(1 << 20), "--replacement", "other", "--start-when-exists", gate]);
    }
    await until(group, "the DDP job to train", () => (/every local process at barrier \d+/.test(readFileSync(ddp.get(0)!.log, "utf8")) ? true : undefined), 300_000);
    writeFileSync(gate, "");
    const moves = await until(group, "a plan", async () => {
      const m = (await client!.status()).migrations;
      return m.length ? m : undefined;
    }, 60_000);
    const move = moves.find((m) => m.job === "ddp");
    if (!move) throw new Error("the plan moved no DDP worker");
    const stayer = ddp.get(move.from === 0 ? 2 : 0)!;
    const destinationLog = () => daemons[move.to]!.log;
    const watch = new LogWatch({
      written: { file: () => ddp.get(move.from)!.log, pattern: /checkpoint-write took (\d+) ms/ },
      sent: { file: () => ddp.get(move.from)!.log, pattern: /sent (\d+) bytes in ([\d.]+) s/ },
      loaded: { file: destinationLog, pattern: /load took (\d+) ms/ },
      reformed: { file: () => stayer.log, pattern: /reform took (\d+) ms/ },
      resumed: { file: () => stayer.log, pattern: /training resumed: every local process reached barrier (\d+), ([\d.]+) s .*a step took ([\d.]+) s before/ },
    }, stayer.log);
    progress(`bench:migrate: moving the DDP worker on host ${move.from} to host ${move.to}`);
    const done = await until(group, "the move", async () => {
      const m = (await client!.status()).migrations.find((x) => x.id === move.id)!;
      return m.state === "done" || m.state === "rolled-back" ? m : undefined;
    }, 300_000);
    // Three steps after the move, for the step time once the replacement is up.
    await until(group, "training to resume", () => {
      const resumed = Number(watch.seen.get("resumed")?.match[1] ?? NaN);
      return watch.seen.has("loaded") && watch.barriers.has(resumed + 3) ? true : undefined;
    }, 300_000);
    watch.poll();
    watch.stop();
    if (done.state !== "done") throw new Error(`the move rolled back: ${done.reason}`);
    // The baseline runs on a quiet machine too: the jobs stop first.
    await group.stopAll();
    const raw = await rawTransfer(checkpointBytes);
    return report(options, done, watch, raw, checkpointBytes, 21 * hidden);
  } finally {
    await client?.close();
    await group.stopAll();
    if (options.keep) process.stderr.write(`kept ${dir}\n`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

function report(options: Options, move: StatusReport["migrations"][number], watch: LogWatch, rawSeconds: number, bytes: number, params: number): number {
  const at = (state: string) => move.history.find((h) => h.state === state)?.at ?? NaN;
  const ms = (name: string, group = 1) => Number(watch.seen.get(name)?.match[group] ?? NaN);
  const sentSeconds = Number(watch.seen.get("sent")?.match[2] ?? NaN);
  // The job is down from the moment all its workers stopped at the barrier until the stayer
  // finished its first step with the replacement (its next barrier), less the time a step
  // takes once the replacement is up (the median of the next three).
  const stopped = move.history[move.history.findIndex((h) => h.state === "pausing") + 1]!.at;
  const resumedStep = Number(watch.seen.get("resumed")!.match[1]);
  const after = [1, 2, 3].map((k) => (watch.barriers.get(resumedStep + k)! - watch.barriers.get(resumedStep + k - 1)!) / 1000).sort((a, b) => a - b);
  const step = after[1]!;
  const downtime = (watch.barriers.get(resumedStep)! - stopped) / 1000 - step;
  const rows: [string, number][] = [
    ["barrier wait (pausing; the job still trains, the replacement starts)", (stopped - at("pausing")) / 1000],
    ["waiting for staging after the barrier (staging; skipped when granted earlier)", Number.isNaN(at("staging")) ? 0 : (at("transferring") - at("staging")) / 1000],
    ["checkpoint write (Python, DCP into shared memory)", ms("written") / 1000],
    ["transfer (engine)", sentSeconds],
    ["transferring, in all", (at("verifying") - at("transferring")) / 1000],
    ["verify + the step's other moves (verifying, staged)", (at("committing") - at("verifying")) / 1000],
    ["replacement launcher start and registration (committing)", (at("resuming") - at("committing")) / 1000],
    ["load (replacement, from the staging buffer)", ms("loaded") / 1000],
    ["process-group re-formation (stayer: waits for the replacement to attach)", ms("reformed") / 1000],
    ["reconfigure → first step done with the replacement (stayer)", Number(watch.seen.get("resumed")?.match[2] ?? NaN)],
    ["a training step after the move (median of three)", step],
    ["downtime: all stopped → first step after the move, less one step", downtime],
  ];
  const rawRate = bytes / rawSeconds;
  const migrationRate = bytes / sentSeconds;
  if (options.json) {
    process.stdout.write(`${JSON.stringify({ params, bytes, downtime, phases: Object.fromEntries(rows), rawSeconds, transferRatio: migrationRate / rawRate })}\n`);
    return 0;
  }
  process.stdout.write(`${table(["phase", "seconds"], rows.map(([name, s]) => [name, s.toFixed(3)]))}\n\n`);
  process.stdout.write(
    `${table(
      ["checkpoint", "migration transfer", "engine raw (same bytes, same run)", "ratio"],
      [[`${(bytes / 2 ** 20).toFixed(0)} MiB`, `${((migrationRate * 8) / 1e9).toFixed(2)} Gbit/s`, `${((rawRate * 8) / 1e9).toFixed(2)} Gbit/s`, (migrationRate / rawRate).toFixed(2)]],
    )}\n`,
  );
  return 0;
}

await benchMain("migrate", help, parse, run);
