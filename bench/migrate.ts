// Migration downtime of each example job (bench/example-jobs.ts: DDP, FSDP2, TP, PP; gloo on CPU),
// split into phases, with the bytes moved. Everything runs on this machine over loopback: for
// every run a fresh cluster (bench/cluster.ts) — a controller, a daemon per host, the example
// under `monkeytree launch` on its hosts — where a second job arrives and makes the controller
// swap one of the example's hosts to the other rack. Each job type runs --runs times; the
// report gives the median of every row and the range of the downtime.
//
//   npm run bench:migrate -- [--jobs ddp,fsdp,tp,pp] [--runs 3] [--width 256] [--layers 4] [--keep] [--json]
//
// The transfer engine's raw rate is measured in the same run, once the job's clusters are gone:
// the same number of bytes, staging buffer to staging buffer over loopback.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { intFlag, parseFlags, table, UsageError } from "../cli/io.ts";
import { replacementUser } from "../cli/demo/processes.ts";
import type { Tenant } from "../controller/daemon/replacements.ts";
import { Listener, send, StagingBuffer } from "../native/index.ts";
import { startLoopbackCluster, stopMarked, until, type LoopbackCluster } from "./cluster.ts";
import { EXAMPLE_JOBS, type ExampleJob } from "./example-jobs.ts";
import { complete, LogRecorder, measure, median, PHASES, type MoveLogs, type MoveMeasurement, type Phase } from "./migrate-phases.ts";
import { benchMain } from "./entry.ts";

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

const help = `usage: npm run bench:migrate -- [options]

Downtime of one live move of each example job (DDP, FSDP2, TP, PP under monkeytree launch,
gloo on CPU, over loopback), by phase, with the bytes moved, beside the transfer engine's raw
rate for the same bytes. Every run starts a fresh cluster.

options:
  --jobs LIST   example jobs to run, comma-separated (default ${EXAMPLE_JOBS.map((job) => job.name).join(",")})
  --runs N      runs per job; the report gives medians and the downtime's range (default 3)
  --width N     model width, passed to the examples (default 256; even: two attention heads)
  --layers N    transformer blocks, passed to the examples (default 4; a multiple of the stages)
  --keep        keep each run's working directory (logs, journal)
  --json        print one JSON object instead of tables
  -h, --help    show this help

Needs torch for $MONKEYTREE_PYTHON, else for .venv/bin/python (npm run setup:python). Run as
root, the daemons start replacements as nobody, who must be able to run that interpreter too.`;

interface Options {
  readonly help: boolean;
  readonly jobs: readonly ExampleJob[];
  readonly runs: number;
  readonly width: number;
  readonly layers: number;
  readonly keep: boolean;
  readonly json: boolean;
}

function parse(argv: string[]): Options {
  const flags = parseFlags(argv, {
    help: { type: "boolean", short: "h" }, jobs: { type: "string" }, runs: { type: "string" }, width: { type: "string" },
    layers: { type: "string" }, keep: { type: "boolean" }, json: { type: "boolean" },
  });
  const jobs = (flags.jobs ?? EXAMPLE_JOBS.map((job) => job.name).join(",")).split(",").map((name) => {
    const job = EXAMPLE_JOBS.find((j) => j.name === name.trim());
    if (!job) throw new UsageError(`--jobs: there is no example job "${name}" (there are ${EXAMPLE_JOBS.map((j) => j.name).join(", ")})`);
    return job;
  });
  const width = intFlag("width", flags.width, 256, 8);
  if (width % 2) throw new UsageError(`--width must be even (the model has two attention heads), got ${width}`);
  const layers = intFlag("layers", flags.layers, 4, 1);
  const stages = Math.max(...jobs.map((job) => job.parallelism.pp));
  if (layers % stages) throw new UsageError(`--layers must be a multiple of ${stages} (the pipeline's stages), got ${layers}`);
  return { help: flags.help ?? false, jobs, runs: intFlag("runs", flags.runs, 3, 1), width, layers, keep: flags.keep ?? false, json: flags.json ?? false };
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

/** One move of `job` on a fresh cluster in a directory of its own, kept with --keep or when the run fails (its logs explain why). */
async function runOnce(job: ExampleJob, options: Options, setup: Setup, progress: Progress): Promise<MoveMeasurement> {
  const dir = mkdtempSync(join(tmpdir(), `monkeytree-bench-migrate-${job.name}-`));
  let keep = true;
  try {
    const measured = await runIn(dir, job, options, setup, progress);
    keep = options.keep;
    return measured;
  } finally {
    if (keep) progress(`kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

async function runIn(dir: string, job: ExampleJob, options: Options, setup: Setup, progress: Progress): Promise<MoveMeasurement> {
  const bytes = checkpointBytes(job, options.width, options.layers);
  const args = ["--steps", String(STEPS), "--width", String(options.width), "--layers", String(options.layers)];
  const training = { python: PYTHON, args, checkpointBytes: bytes, masterPort: 29800 + 16 * (runsStarted++ % 64) };
  progress("starting the cluster");
  const cluster = await startLoopbackCluster(job, { dir, training, env: setup.env, marker: `${MARKER}=${setup.env[MARKER]}`, tenant: setup.tenant, timeoutMs: WAIT_MS });
  const recorder = new LogRecorder([...cluster.launchers.values(), ...cluster.daemons].map((managed) => managed.log));
  try {
    return await move(job, cluster, recorder, progress);
  } finally {
    recorder.stop();
    await cluster.stop();
  }
}

/** Lets the job train, opens the gate for the other job, and follows the move the controller plans. */
async function move(job: ExampleJob, cluster: LoopbackCluster, recorder: LogRecorder, progress: Progress): Promise<MoveMeasurement> {
  const { group, client, launchers, daemons } = cluster;
  const first = launchers.get(job.hosts[0]![0]!)!;
  progress("waiting for the job to train");
  await until(group, `${job.name} to train`, () => (recorder.lines(first.log).some((line) => /barrier \d+ reached/.test(line.text)) ? true : undefined), WAIT_MS);
  writeFileSync(cluster.gate, "");
  const planned = await until(group, "a plan that moves the job", async () => (await client.status()).migrations.find((m) => m.job === job.name), WAIT_MS);
  progress(`moving host ${planned.from} → ${planned.to} …`);
  const done = await until(group, "the move", async () => {
    const m = (await client.status()).migrations.find((x) => x.id === planned.id);
    return m && (m.state === "done" || m.state === "rolled-back") ? m : undefined;
  }, WAIT_MS);
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

interface JobResult {
  readonly job: string;
  readonly checkpointBytes: number;
  readonly runs: readonly MoveMeasurement[];
  readonly failures: readonly string[];
  readonly median: { readonly downtime: number; readonly phases: Record<Phase, number>; readonly bytesSent: number; readonly bytesWritten: number };
  readonly downtimeRange: readonly [number, number];
  /** Bytes per second: the moves' transfers (median) and the engine's raw rate. */
  readonly transfer: { readonly migration: number; readonly raw: number; readonly rawSeconds: number; readonly ratio: number };
}

function summarize(job: ExampleJob, bytes: number, runs: readonly MoveMeasurement[], failures: readonly string[], rawSeconds: number): JobResult {
  const of = (value: (run: MoveMeasurement) => number) => (runs.length ? median(runs.map(value)) : NaN);
  const downtimes = runs.map((run) => run.downtime);
  const phases = Object.fromEntries(PHASES.map(([key]) => [key, of((run) => run.phases[key])])) as Record<Phase, number>;
  const migration = of((run) => run.bytesSent / run.phases.transfer);
  const raw = bytes / rawSeconds;
  return {
    job: job.name,
    checkpointBytes: bytes,
    runs,
    failures,
    median: { downtime: of((run) => run.downtime), phases, bytesSent: of((run) => run.bytesSent), bytesWritten: of((run) => run.bytesWritten) },
    downtimeRange: [Math.min(...downtimes), Math.max(...downtimes)],
    transfer: { migration, raw, rawSeconds, ratio: migration / raw },
  };
}

/** Every run of `job`, then the engine's raw rate for its bytes; a failed run is reported and skipped. */
async function benchJob(job: ExampleJob, options: Options, setup: Setup, say: Progress): Promise<JobResult> {
  const runs: MoveMeasurement[] = [];
  const failures: string[] = [];
  for (let run = 1; run <= options.runs; run++) {
    const progress = (line: string) => say(`${job.name} run ${run}/${options.runs}: ${line}`);
    try {
      const measured = await runOnce(job, options, setup, progress);
      runs.push(measured);
      progress(`downtime ${measured.downtime.toFixed(3)} s`);
    } catch (error) {
      failures.push((error as Error).message);
      progress(`failed: ${(error as Error).message}`);
    }
  }
  const bytes = checkpointBytes(job, options.width, options.layers);
  say(`${job.name}: the engine's raw rate for ${(bytes / MiB).toFixed(1)} MiB`);
  return summarize(job, bytes, runs, failures, await rawTransfer(bytes));
}

const fixed = (value: number, digits = 3) => (Number.isFinite(value) ? value.toFixed(digits) : "-");
const mib = (bytes: number) => (Number.isFinite(bytes) ? `${(bytes / MiB).toFixed(1)} MiB` : "-");
const gbits = (rate: number) => (Number.isFinite(rate) ? `${((rate * 8) / 1e9).toFixed(2)} Gbit/s` : "-");

function report(options: Options, results: readonly JobResult[]): void {
  if (options.json) {
    process.stdout.write(`${JSON.stringify({ python: PYTHON, width: options.width, layers: options.layers, runs: options.runs, jobs: results })}\n`);
    return;
  }
  const summary = results.map((r) => [
    r.job, `${r.runs.length}/${options.runs}`, fixed(r.median.downtime), `${fixed(r.downtimeRange[0])}–${fixed(r.downtimeRange[1])}`,
    mib(r.median.bytesWritten), mib(r.median.bytesSent), gbits(r.transfer.migration), gbits(r.transfer.raw), fixed(r.transfer.ratio, 2),
  ]);
  const header = ["job", "runs", "downtime s (median)", "min–max", "checkpoint written", "moved", "migration transfer", "engine raw (same bytes)", "ratio"];
  process.stdout.write(`model: width ${options.width}, ${options.layers} layers\n\n${table(header, summary)}\n\n`);
  const rows = [...PHASES.map(([key, label]) => [label, ...results.map((r) => fixed(r.median.phases[key]))]), ["downtime: all stopped → first step after the move, less one step", ...results.map((r) => fixed(r.median.downtime))]];
  process.stdout.write(`${table(["phase (seconds, median of the runs)", ...results.map((r) => r.job)], rows)}\n`);
  for (const r of results.filter((result) => result.failures.length)) process.stdout.write(`\n${r.job}: ${r.failures.length} run(s) failed: ${r.failures.join("; ")}\n`);
}

async function run(options: Options): Promise<number> {
  if (spawnSync(PYTHON, ["-c", "import torch"]).status !== 0) {
    process.stderr.write(`bench:migrate: ${PYTHON} cannot import torch; run \`npm run setup:python\` (or set MONKEYTREE_PYTHON to an interpreter with torch)\n`);
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
  const results: JobResult[] = [];
  for (const job of options.jobs) {
    say(`${job.name}: ${(checkpointBytes(job, options.width, options.layers) / MiB).toFixed(1)} MiB of checkpoint staging per host`);
    results.push(await benchJob(job, options, setup, say));
  }
  report(options, results);
  return results.some((r) => r.failures.length) ? 1 : 0;
}

await benchMain("migrate", help, parse, run);
