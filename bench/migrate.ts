// Migration downtime of each example job (bench/example-jobs.ts: DDP, FSDP2, TP, PP; gloo on CPU)
// at each checkpoint size per host, split into phases, beside the bytes' own floor. Everything
// runs on this machine over loopback: for every run a fresh cluster (bench/cluster.ts) — a
// controller, a daemon per host, the example under `monkeytree launch` on its hosts — where a
// second job arrives and makes the controller swap one of the example's hosts to the other rack.
//
//   npm run bench:migrate -- [--jobs ddp,fsdp,tp,pp] [--sizes 100MiB,1GiB] [--runs 5] [--layers 4] [--rows 4] [--no-pin] [--keep] [--json]
//
// The floor is measured in the same run, once a row's clusters are gone: the time to copy the
// host's checkpoint bytes (memcpy) and to send them over a plain socket on the same path
// (bench/socket-baseline.ts), whichever is slower. Overhead = downtime − floor.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import type { z } from "zod";
import { bool, checked, helpText, int, parseCommandFlags } from "../cli/flags.ts";
import { byteSize, intFlag, table, UsageError } from "../cli/io.ts";
import { killByEnvironment, replacementUser } from "../cli/demo/processes.ts";
import { MigrationBenchSchema } from "../cli/simulate/restart.ts";
import type { Tenant } from "../controller/daemon/replacements.ts";
import { StagingBuffer } from "../native/index.ts";
import { cpusPerHost, startLoopbackCluster, stopMarked, until, type LoopbackCluster } from "./cluster.ts";
import { EXAMPLE_JOBS, type ExampleJob } from "./example-jobs.ts";
import { complete, LogRecorder, measure, median, PHASES, type MoveLogs, type MoveMeasurement, type Phase } from "./migrate-phases.ts";
import { benchMain } from "./entry.ts";
import { baselineRun, LOOPBACK } from "./socket-baseline.ts";

const ROOT = new URL("../", import.meta.url).pathname;
/** The interpreter the tests use: $MONKEYTREE_PYTHON, else the checkout's .venv (`npm run setup:python`). */
const PYTHON = process.env.MONKEYTREE_PYTHON ?? join(ROOT, ".venv/bin/python");
/** Found in the environment of everything a run starts, to stop what outlives its parent. */
const MARKER = "MONKEYTREE_BENCH_MIGRATE";
/** Enough steps that no job ends before its move; each run stops its job once measured. */
const STEPS = 1_000_000;
/** How long any one wait may take on a loaded machine before the run counts as failed. */
const WAIT_MS = 300_000;
const MiB = 2 ** 20;
const PAGE = 4096;

const DEFAULT_JOBS = ["ddp", "fsdp", "tp", "pp"];
/** The pipeline example's microbatches (examples/pp/train.py), which split each replica's rows. */
const MICROBATCHES = 4;

const FLAGS = {
  jobs: checked("LIST", `example jobs, comma-separated, of ${EXAMPLE_JOBS.map((job) => job.name).join(", ")}`, exampleJobs, {
    default: DEFAULT_JOBS.join(","),
  }),
  sizes: checked(
    "LIST",
    "checkpoint bytes per host, comma-separated, e.g. 100MiB,1GiB: each row's model width is the one whose checkpoint comes closest",
    (raw, name) => raw.split(",").map((size) => byteSize(name, size)),
    { default: "100MiB,1GiB" },
  ),
  runs: int("N", "moves per job and size; the report gives medians and the downtime's range", { default: 5, min: 1 }),
  layers: int("N", "transformer blocks, passed to the examples; a multiple of the stages", { default: 4, min: 1 }),
  rows: checked(
    "N",
    `sequences per data-parallel replica per step, passed to the examples; a multiple of the pipeline's ${MICROBATCHES} microbatches. ` +
      "The default is half theirs: a step on these CPUs stays short beside a move, as a GPU's would",
    wholeMicrobatches,
    { default: "4" },
  ),
  "no-pin": bool(
    "leave every process free to run on any CPU. By default, where the machine has a CPU per training process of every host (and taskset), " +
      "each emulated host's daemon and launcher, and so its training processes and replacements, run on CPUs of their own, so that one " +
      "host's training does not compete with another's, as on a cluster; with fewer CPUs every process may run on any of them",
  ),
  keep: bool("keep each run's working directory (logs, journal)"),
  json: bool('print one JSON document instead of tables: `{"rows": [{"job", "bytesPerHost", "downtimeS", "floorS", "overheadS", "phases": {...}, ...}]}`'),
};

const help = helpText({
  command: "npm run bench:migrate --",
  table: FLAGS,
  about: `Downtime of one live move of each example job (under monkeytree launch, gloo on CPU, over
loopback) at each checkpoint size per host, by phase, beside the bytes' floor measured in the
same run: the slower of copying the host's checkpoint bytes (memcpy) and sending them over a
plain socket on loopback. Overhead = downtime − floor. Every run starts a fresh cluster.`,
  after: `Needs torch for $MONKEYTREE_PYTHON, else for .venv/bin/python (npm run setup:python). Run as
root, the daemons start replacements as nobody, who must be able to run that interpreter too.`,
});

interface Options {
  readonly jobs: readonly ExampleJob[];
  readonly sizes: readonly number[];
  readonly runs: number;
  readonly layers: number;
  readonly rows: number;
  readonly pin: boolean;
  readonly keep: boolean;
  readonly json: boolean;
}

function exampleJobs(raw: string): ExampleJob[] {
  return raw.split(",").map((name) => {
    const job = EXAMPLE_JOBS.find((j) => j.name === name.trim());
    if (!job) throw new UsageError(`--jobs: there is no example job "${name}" (there are ${EXAMPLE_JOBS.map((j) => j.name).join(", ")})`);
    return job;
  });
}

function wholeMicrobatches(raw: string, name: string): number {
  const rows = intFlag(name, raw, undefined, 1);
  if (rows % MICROBATCHES) throw new UsageError(`--${name} must be a multiple of ${MICROBATCHES} (the pipeline's microbatches), got ${rows}`);
  return rows;
}

function parse(argv: string[]): Options {
  const flags = parseCommandFlags(argv, FLAGS);
  const stages = Math.max(...flags.jobs.map((job) => job.parallelism.pp));
  if (flags.layers % stages) throw new UsageError(`--layers must be a multiple of ${stages} (the pipeline's stages), got ${flags.layers}`);
  return {
    jobs: flags.jobs,
    sizes: flags.sizes,
    runs: flags.runs,
    layers: flags.layers,
    rows: flags.rows,
    pin: !flags["no-pin"],
    keep: flags.keep,
    json: flags.json,
  };
}

/**
 * --checkpoint-bytes for `job`: each local process's share holds its parameters and AdamW's two
 * moments in float32, with room for the checkpoint's metadata. The model is
 * examples/common/gpt.py's GPT (vocabulary 64, context 16); a process holds its share of the
 * blocks, and everything outside them is counted whole, which is generous for FSDP.
 */
function checkpointBytes(job: ExampleJob, width: number, layers: number): number {
  const blocks = layers * (12 * width * width + 13 * width);
  const rest = 146 * width + 64;
  const shares: Record<string, number> = { fsdp: 1 / (job.hosts.flat().length * job.nproc), tp: 1 / job.parallelism.tp, pp: 1 / job.parallelism.pp };
  const share = shares[job.name] ?? 1;
  const perProcess = 3 * 4 * (blocks * share + rest) * 1.02 + MiB;
  return job.nproc * Math.ceil(perProcess / PAGE) * PAGE;
}

/** The even width (two attention heads) whose checkpoint per host comes closest to `target` bytes. */
function widthFor(job: ExampleJob, target: number, layers: number): number {
  let [low, high] = [4, 8192]; // halves of even widths: the first whose checkpoint reaches the target lies in (low, high]
  while (high - low > 1) {
    const middle = (low + high) >> 1;
    if (checkpointBytes(job, 2 * middle, layers) >= target) high = middle;
    else low = middle;
  }
  const miss = (half: number) => Math.abs(checkpointBytes(job, 2 * half, layers) - target);
  return 2 * (high > 4 && miss(high - 1) < miss(high) ? high - 1 : high);
}

/** The environment of every process a run starts; also set here, since the launchers inherit it. */
function trainingEnv(): Record<string, string> {
  const env = {
    PYTHONPATH: [join(ROOT, "sdk/python"), process.env.PYTHONPATH].filter(Boolean).join(":"),
    OMP_NUM_THREADS: process.env.OMP_NUM_THREADS ?? "1",
    // Every barrier in the launchers' logs: the step times around the move come from them.
    MONKEYTREE_LOG: "debug",
    // Everything on loopback, as the daemons are.
    GLOO_SOCKET_IFNAME: "lo",
    [MARKER]: String(process.pid),
  };
  Object.assign(process.env, env);
  return env;
}

type Progress = (line: string) => void;

/**
 * Why the daemons' replacements cannot run the examples, or null: when this runs as root they
 * run as nobody (no tenant's code runs as root), who must be able to run the interpreter too,
 * which one in a virtual environment under /root is not.
 */
function tenantCannotRun(): string | null {
  const tenant = replacementUser();
  if (!tenant || spawnSync(PYTHON, ["-c", "import torch"], { uid: tenant.uid, gid: tenant.gid }).status === 0) return null;
  return `the daemons run replacements as ${tenant.user} (this runs as root), who cannot import torch with ${PYTHON}; set MONKEYTREE_PYTHON to an interpreter with torch that ${tenant.user} can run`;
}

/** What every run shares: its processes' environment, and who replacements run as. */
interface Setup {
  readonly env: Record<string, string>;
  readonly tenant: Tenant | undefined;
}

/** Runs started so far: each gets master ports of its own, since a previous run's sockets may linger. */
let runsStarted = 0;

/** What one row runs: a job, with a model of this shape. */
interface RowSpec {
  readonly job: ExampleJob;
  readonly width: number;
  readonly layers: number;
  readonly rows: number;
  /** CPUs of its own for each host; null: none. */
  readonly pinned: number | null;
}

const bytesOf = (row: RowSpec): number => checkpointBytes(row.job, row.width, row.layers);

/** One move on a fresh cluster in a directory of its own, kept with --keep or when the run fails (its logs explain why). */
async function runOnce(row: RowSpec, options: Options, setup: Setup, progress: Progress): Promise<MoveMeasurement> {
  const dir = mkdtempSync(join(tmpdir(), `monkeytree-bench-migrate-${row.job.name}-`));
  let keep = true;
  try {
    const measured = await runIn(dir, row, setup, progress);
    keep = options.keep;
    return measured;
  } finally {
    if (keep) progress(`kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

async function runIn(dir: string, row: RowSpec, setup: Setup, progress: Progress): Promise<MoveMeasurement> {
  const { job } = row;
  const args = ["--steps", String(STEPS), "--width", String(row.width), "--layers", String(row.layers), "--rows", String(row.rows)];
  const training = { python: PYTHON, args, checkpointBytes: bytesOf(row), masterPort: 29800 + 16 * (runsStarted++ % 64) };
  progress("starting the cluster");
  const marker = `${MARKER}=${setup.env[MARKER]}`;
  const cluster = await startLoopbackCluster(job, { dir, training, env: setup.env, marker, tenant: setup.tenant, timeoutMs: WAIT_MS, pinned: row.pinned });
  const recorder = new LogRecorder([...cluster.launchers.values(), ...cluster.daemons].map((managed) => managed.log));
  try {
    return await move(job, cluster, recorder, progress);
  } finally {
    recorder.stop();
    await cluster.stop();
    const left = killByEnvironment(marker, 0);
    if (left.length) progress(`processes left behind after the cluster stopped: ${left.join(", ")}`);
  }
}

/** Lets the job train, opens the gate for the other job, and follows the move the controller plans. */
async function move(job: ExampleJob, cluster: LoopbackCluster, recorder: LogRecorder, progress: Progress): Promise<MoveMeasurement> {
  const { group, client, launchers, daemons } = cluster;
  const first = launchers.get(job.hosts[0]![0]!)!;
  progress("waiting for the job to train");
  await until(
    group,
    `${job.name} to train`,
    () => (recorder.lines(first.log).some((line) => /barrier \d+ reached/.test(line.text)) ? true : undefined),
    WAIT_MS,
  );
  writeFileSync(cluster.gate, "");
  const planned = await until(group, "a plan that moves the job", async () => (await client.status()).migrations.find((m) => m.job === job.name), WAIT_MS);
  progress(`moving host ${planned.from} → ${planned.to} …`);
  const done = await until(
    group,
    "the move",
    async () => {
      const m = (await client.status()).migrations.find((x) => x.id === planned.id);
      return m && (m.state === "done" || m.state === "rolled-back") ? m : undefined;
    },
    WAIT_MS,
  );
  if (done.state !== "done") throw new Error(`the move rolled back: ${done.reason}`);
  const logs = (): MoveLogs => ({
    source: recorder.lines(launchers.get(done.from)!.log),
    stayers: [...launchers].filter(([host]) => host !== done.from).map(([, launcher]) => recorder.lines(launcher.log)),
    destination: recorder.lines(daemons[done.to]!.log),
  });
  await until(group, "training to resume with the replacement", () => (complete(logs(), job.nproc) ? true : undefined), WAIT_MS);
  recorder.poll();
  return measure(done, logs());
}

/** The bytes' floor: seconds to copy `bytes` (memcpy) and to send them over a plain socket on loopback, best of three each. */
async function floor(bytes: number): Promise<{ memcpyS: number; socketS: number; floorS: number }> {
  const source = StagingBuffer.create({ size: bytes, lock: false });
  const destination = StagingBuffer.create({ size: bytes, lock: false });
  try {
    source.bytes().fill(7);
    destination.bytes().fill(0);
    let [memcpyS, socketS] = [Infinity, Infinity];
    for (let run = 0; run < 3; run++) {
      const started = performance.now();
      destination.bytes().set(source.bytes());
      memcpyS = Math.min(memcpyS, (performance.now() - started) / 1000);
      socketS = Math.min(socketS, await baselineRun(LOOPBACK, source, destination, bytes));
    }
    return { memcpyS, socketS, floorS: Math.max(memcpyS, socketS) };
  } finally {
    source.free();
    destination.free();
  }
}

/**
 * Seconds a daemon takes to allocate one grant's staging file of `bytes` (zero-filled and mapped
 * on a worker thread, as the daemon does when a move is prepared), best of three: part of a
 * move's lead, before its job pauses, not of its downtime.
 */
async function grantStaging(bytes: number): Promise<number> {
  let best = Infinity;
  for (let run = 0; run < 3; run++) {
    const started = performance.now();
    const buffer = await StagingBuffer.createAsync({ size: bytes, lock: false });
    best = Math.min(best, (performance.now() - started) / 1000);
    buffer.free();
  }
  return best;
}

/** One row of the report: a job at one checkpoint size, its runs' medians and its floor. */
interface Row {
  readonly job: string;
  readonly bytesPerHost: number;
  readonly width: number;
  /** CPUs of its own for each host; null: none. */
  readonly cpusPerHost: number | null;
  readonly runs: readonly MoveMeasurement[];
  readonly failures: readonly string[];
  readonly downtimeS: number;
  readonly downtimeRangeS: readonly [number, number];
  readonly memcpyS: number;
  readonly socketS: number;
  readonly floorS: number;
  readonly overheadS: number;
  /** A grant's staging file, allocated before the job pauses. */
  readonly grantS: number;
  readonly phases: Record<Phase, number>;
  /** Medians of what the source wrote and sent. */
  readonly bytesWritten: number;
  readonly bytesSent: number;
}

function summarize(
  spec: RowSpec,
  runs: readonly MoveMeasurement[],
  failures: readonly string[],
  bytesFloor: Awaited<ReturnType<typeof floor>>,
  grantS: number,
): Row {
  const of = (value: (run: MoveMeasurement) => number) => (runs.length ? median(runs.map(value)) : NaN);
  const downtimes = runs.map((run) => run.downtime);
  const downtimeS = of((run) => run.downtime);
  return {
    job: spec.job.name,
    bytesPerHost: bytesOf(spec),
    width: spec.width,
    cpusPerHost: spec.pinned,
    runs,
    failures,
    downtimeS,
    downtimeRangeS: [Math.min(...downtimes), Math.max(...downtimes)],
    ...bytesFloor,
    overheadS: downtimeS - bytesFloor.floorS,
    grantS,
    phases: Object.fromEntries(PHASES.map(([key]) => [key, of((run) => run.phases[key])])) as Record<Phase, number>,
    bytesWritten: of((run) => run.bytesWritten),
    bytesSent: of((run) => run.bytesSent),
  };
}

/** Every run of one row, then its floor; a failed run is reported and skipped. */
async function benchRow(spec: RowSpec, options: Options, setup: Setup, say: Progress): Promise<Row> {
  const name = `${spec.job.name} ${mib(bytesOf(spec))}/host`;
  const runs: MoveMeasurement[] = [];
  const failures: string[] = [];
  for (let run = 1; run <= options.runs; run++) {
    const progress = (line: string) => say(`${name} run ${run}/${options.runs}: ${line}`);
    try {
      const measured = await runOnce(spec, options, setup, progress);
      runs.push(measured);
      progress(`downtime ${measured.downtime.toFixed(3)} s`);
    } catch (error) {
      failures.push((error as Error).message);
      progress(`failed: ${(error as Error).message}`);
    }
  }
  say(`${name}: the floor (memcpy, plain socket) and a grant's staging`);
  return summarize(spec, runs, failures, await floor(bytesOf(spec)), await grantStaging(bytesOf(spec)));
}

const fixed = (value: number, digits = 3) => (Number.isFinite(value) ? value.toFixed(digits) : "-");
const mib = (bytes: number) => (Number.isFinite(bytes) ? `${(bytes / MiB).toFixed(1)} MiB` : "-");

function report(options: Options, rows: readonly Row[]): void {
  if (options.json) {
    // The document `monkeytree simulate --restart-from` reads.
    const document = { python: PYTHON, layers: options.layers, rowsPerStep: options.rows, runs: options.runs, rows };
    const read: z.input<typeof MigrationBenchSchema> = document;
    process.stdout.write(`${JSON.stringify(read)}\n`);
    return;
  }
  const summary = rows.map((r) => [
    r.job,
    mib(r.bytesPerHost),
    r.width,
    r.cpusPerHost ?? "shared",
    `${r.runs.length}/${options.runs}`,
    fixed(r.downtimeS),
    `${fixed(r.downtimeRangeS[0])}–${fixed(r.downtimeRangeS[1])}`,
    fixed(r.memcpyS),
    fixed(r.socketS),
    fixed(r.floorS),
    fixed(r.overheadS),
    fixed(r.grantS),
  ]);
  const header = [
    "job",
    "checkpoint/host",
    "width",
    "CPUs/host",
    "runs",
    "downtime s (median)",
    "min–max",
    "memcpy s",
    "socket s",
    "floor s",
    "overhead s",
    "grant staging s",
  ];
  process.stdout.write(
    `${options.layers} layers, ${options.rows} rows per replica per step; seconds; floor = the slower of memcpy and a plain socket on loopback for the host's bytes; ` +
      `grant staging = allocating the destination's staging file for the host's bytes, before the job pauses (in the lead, not the downtime)\n\n${table(header, summary)}\n\n`,
  );
  const columns = rows.map((r) => `${r.job} ${mib(r.bytesPerHost)}`);
  const phases = [
    ...PHASES.map(([key, label]) => [label, ...rows.map((r) => fixed(r.phases[key]))]),
    ["downtime: all stopped → first step after the move, less one step", ...rows.map((r) => fixed(r.downtimeS))],
  ];
  process.stdout.write(`${table(["phase (seconds, median of the runs)", ...columns], phases)}\n`);
  for (const r of rows.filter((row) => row.failures.length))
    process.stdout.write(`\n${r.job} ${mib(r.bytesPerHost)}: ${r.failures.length} run(s) failed: ${r.failures.join("; ")}\n`);
}

async function run(options: Options): Promise<number> {
  if (spawnSync(PYTHON, ["-c", "import torch"]).status !== 0) {
    process.stderr.write(
      `bench:migrate: ${PYTHON} cannot import torch; run \`npm run setup:python\` (or set MONKEYTREE_PYTHON to an interpreter with torch)\n`,
    );
    return 1;
  }
  const refused = tenantCannotRun();
  if (refused !== null) {
    process.stderr.write(`bench:migrate: ${refused}\n`);
    return 1;
  }
  const say: Progress = (line) => process.stderr.write(`bench:migrate: ${line}\n`);
  const env = trainingEnv();
  // The clusters' processes run in sessions of their own, out of a terminal's reach.
  const interrupted = () => void stopMarked(`${MARKER}=${env[MARKER]}`).then(() => process.exit(130));
  process.once("SIGINT", interrupted).once("SIGTERM", interrupted);
  const setup = { env, tenant: replacementUser() };
  const rows: Row[] = [];
  for (const job of options.jobs) {
    for (const size of options.sizes) {
      const cpus = options.pin ? cpusPerHost(job) : "--no-pin";
      if (typeof cpus === "string") say(`${job.name}: hosts share every CPU: ${cpus}`);
      const spec = {
        job,
        width: widthFor(job, size, options.layers),
        layers: options.layers,
        rows: options.rows,
        pinned: typeof cpus === "number" ? cpus : null,
      };
      say(`${job.name}: width ${spec.width}, ${mib(bytesOf(spec))} of checkpoint staging per host (asked for ${mib(size)})`);
      rows.push(await benchRow(spec, options, setup, say));
    }
  }
  report(options, rows);
  return rows.some((r) => r.failures.length) ? 1 : 0;
}

await benchMain("migrate", help, parse, run);
