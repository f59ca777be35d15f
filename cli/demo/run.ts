import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { ControllerClient } from "../../sdk/client/client.ts";
import type { StatusReport } from "../../sdk/contract/protocol/status.ts";
import { readEvents, type WorkerEvent } from "./events.ts";
import { digest, initialState, seedOf, trainStep } from "./model.ts";
import { table } from "../io.ts";
import { parseSnapshot } from "../../controller/planner/model/cluster.ts";
import { rackFragmentation, withinBounds } from "../../controller/planner/model/fragmentation.ts";
import type { Tenant } from "../../controller/daemon/replacements.ts";
import { CLI, ProcessGroup, replacementUser, sharedFile, shellCommand, WORKER, type Managed } from "./processes.ts";

/**
 * The whole system on one machine: a controller, a daemon per emulated host and several jobs
 * of the example training loop, each a real process. A job arrives on hosts that push two
 * racks over their bound; the controller plans, the daemons stage the moved workers'
 * checkpoints through the native transfer engine, replacements resume from them, and at the
 * end every job's state is compared with an unmigrated replay of the same seed.
 */

export interface DemoJob {
  readonly id: string;
  /** Where the cluster's own scheduler places the job's workers (one DP group). */
  readonly hosts: readonly number[];
}

/** 4 racks of 2 hosts, 8 uplinks each; TP=8 jobs cross a rack boundary with 8 rings. */
export const DEMO_TOPOLOGY = { racks: 4, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 8 } as const;
/** TP degree of every demo job: a job crossing a rack boundary takes 8 rings there. */
const TP = 8;
/** Running before anything moves: llama spans racks 0 and 1 (8 rings each, at the bound), mixtral fills rack 2. */
export const DEMO_RUNNING: readonly DemoJob[] = [
  { id: "llama", hosts: [0, 2] },
  { id: "mixtral", hosts: [4, 5] },
];
/**
 * Then gpt arrives on the four free hosts: racks 0 and 1 would carry 16 rings on 8 uplinks.
 * No host is free, so every fix is a swap, and each swap moves one of llama's workers in the
 * middle of its training.
 */
export const DEMO_ARRIVING: DemoJob = { id: "gpt", hosts: [1, 3, 6, 7] };

export interface DemoOptions {
  /** Working directory: journal, logs, worker events. */
  readonly dir: string;
  /** Training state per worker (parameters and momentum). */
  readonly stateBytes: number;
  /** Iterations every job runs. */
  readonly steps: number;
  /** Shortest iteration, standing in for a GPU step. */
  readonly stepMs: number;
  /** Gives up on any stage that takes longer. */
  readonly timeoutMs: number;
  readonly print: (line: string) => void;
  /**
   * Aborting it (SIGINT, SIGTERM) stops every process at once and closes the controller
   * connection, so the run fails fast; it has stopped all its processes when it settles.
   */
  readonly signal?: AbortSignal;
  /**
   * Serve metrics: the controller and every daemon get `--metrics 127.0.0.1:0`, and `targets`
   * becomes a Prometheus file-based service discovery file naming them (`file_sd_configs`),
   * labelled `role` (controller, daemon) and, for daemons, `host`. `inspect` runs once the
   * demo has its result, before its processes stop, so a scraper can read the end state.
   */
  readonly metrics?: { readonly targets: string; readonly inspect?: (result: DemoResult) => Promise<void> };
}

export interface JobCheck {
  readonly job: string;
  readonly digests: readonly string[];
  readonly reference: string;
  readonly migratedIn: number;
  readonly identical: boolean;
}

export interface DemoResult {
  readonly migrations: StatusReport["migrations"];
  /** Each rack's rings when the arriving job is placed, before any move: what the plan fixes. */
  readonly arrival: readonly number[];
  /** Each rack's rings at the end, every job finished. */
  readonly final: readonly number[];
  /** What each moved worker's source sent. */
  readonly transfers: readonly { readonly migration: string; readonly bytes: number; readonly transport: "tcp" | "rdma" }[];
  readonly jobs: readonly JobCheck[];
  readonly withinBounds: boolean;
  /** Every move done, every rack within bounds, every job bit-identical to its replay. */
  readonly ok: boolean;
}

/** The daemons' --replacement that starts the demo worker's replacements. */
const REPLACEMENT = "demo-worker";

const TERMINAL = new Set(["done", "rolled-back"]);
const MiB = 2 ** 20;
const DEMO_HOSTS = DEMO_TOPOLOGY.racks * DEMO_TOPOLOGY.hostsPerRack;
const DEMO_JOBS: readonly DemoJob[] = [...DEMO_RUNNING, DEMO_ARRIVING];
/** Workers of each job, by id: the `finished` events that end it. */
const EXPECTED_WORKERS = new Map(DEMO_JOBS.map((job) => [job.id, job.hosts.length]));

/** What every stage of a run shares. */
interface DemoRun {
  readonly options: DemoOptions;
  readonly group: ProcessGroup;
  readonly client: ControllerClient;
  readonly endpoint: string;
  /** The folder of the workers' event files (`events.ts`). */
  readonly events: string;
  /** Time since the run began, the first column of its progress lines. */
  readonly elapsed: () => string;
}

/** Files whose creation lets gated workers go on. */
interface Gates {
  /** The arriving job starts. */
  readonly admitted: string;
  /** Every job trains on past its pause. */
  readonly planned: string;
}

/** Every move as it ended, and the status when the last of them finished. */
interface Settled {
  readonly moves: StatusReport["migrations"];
  readonly final: StatusReport;
}

export async function runDemo(options: DemoOptions): Promise<DemoResult> {
  const events = join(options.dir, "events");
  const tenant = prepareWorkingDirectory(options.dir, events);
  const group = new ProcessGroup(options.dir);
  let client: ControllerClient | undefined;
  options.signal?.addEventListener(
    "abort",
    () => {
      void client?.close();
      void group.stopAll();
    },
    { once: true },
  );
  const started = performance.now();
  const elapsed = () => `${((performance.now() - started) / 1000).toFixed(1).padStart(5)} s`;
  try {
    const controller = await startController(group, options);
    client = new ControllerClient({ endpoint: controller.endpoint, timeoutMs: 10_000, retryMs: 500 });
    const run: DemoRun = { options, group, client, endpoint: controller.endpoint, events, elapsed };
    await startDaemons(run, controller.process, tenant);
    const gates = await startJobs(run);
    const arrival = await arrive(run, gates.admitted);
    const plan = await awaitPlan(run, gates.planned);
    const result = await verify(run, await awaitCompletion(run, plan), arrival);
    await options.metrics?.inspect?.(result);
    return result;
  } finally {
    await client?.close();
    await group.stopAll();
  }
}

/** Creates the events' folder; returns the user replacements run as, if not this one. */
function prepareWorkingDirectory(dir: string, events: string): Tenant | undefined {
  mkdirSync(events, { recursive: true });
  const tenant = replacementUser();
  if (tenant) {
    // Replacements append to the events their sources (run as root) started: they need a way
    // into the working directory and files of their own.
    chmodSync(dir, 0o711);
    for (const job of DEMO_JOBS) sharedFile(join(events, `${job.id}.jsonl`), tenant);
  }
  return tenant;
}

const metricsFlags = (options: DemoOptions) => (options.metrics ? ["--metrics", "127.0.0.1:0"] : []);
const paceFlags = (options: DemoOptions) => ["--steps", String(options.steps), "--step-ms", String(options.stepMs)];

async function startController(group: ProcessGroup, options: DemoOptions): Promise<{ readonly process: Managed; readonly endpoint: string }> {
  const snapshot = join(options.dir, "topology.json");
  writeFileSync(snapshot, JSON.stringify({ topology: DEMO_TOPOLOGY, jobs: [] }));
  const controller = group.start("controller", [
    ...CLI,
    "controller",
    "--snapshot",
    snapshot,
    "--bind",
    "tcp://127.0.0.1:*",
    "--journal",
    join(options.dir, "journal"),
    "--heartbeat-timeout",
    "5",
    ...metricsFlags(options),
  ]);
  const endpoint = (await group.waitFor(controller, /controller listening on (tcp:\/\/\S+)/, options.timeoutMs))[1]!;
  group.controller = endpoint;
  return { process: controller, endpoint };
}

/** A daemon per host; resolves once every one has registered. */
async function startDaemons(run: DemoRun, controller: Managed, tenant: Tenant | undefined): Promise<void> {
  const { options, group } = run;
  // Room for two checkpoints: a host may receive one while its own worker's is still staged.
  const stagingBytes = 2 * options.stateBytes + 4 * MiB;
  // Every daemon starts a replacement as this same worker program; job, host and state come from the move.
  const replacement = `${REPLACEMENT}=${shellCommand([process.execPath, ...WORKER, ...paceFlags(options), "--events", run.events])}`;
  const daemons: Managed[] = [];
  for (let host = 0; host < DEMO_HOSTS; host++) {
    daemons[host] = group.start(`daemon-${host}`, [
      ...CLI,
      "daemon",
      "--host",
      String(host),
      "--connect",
      run.endpoint,
      "--listen",
      "127.0.0.1:0",
      "--staging-bytes",
      String(stagingBytes),
      "--replacement",
      replacement,
      ...(tenant ? ["--run-as", tenant.user] : []),
      ...metricsFlags(options),
    ]);
  }
  if (options.metrics) await writeTargets(group, controller, daemons, options.metrics.targets, options.timeoutMs);
  await until(group, async () => (await run.client.status()).hosts.registered === DEMO_HOSTS, options.timeoutMs, "every host daemon to register");
  options.print(`${run.elapsed()}  controller on ${run.endpoint}; ${DEMO_HOSTS} host daemons registered, each with ${mib(stagingBytes)} of staging`);
}

function startJob(run: DemoRun, job: DemoJob, gate: readonly string[]): void {
  const { options } = run;
  for (const host of job.hosts) {
    run.group.start(`${job.id}-${host}`, [
      ...WORKER,
      "--controller",
      run.endpoint,
      "--job",
      job.id,
      "--host",
      String(host),
      "--tp",
      String(TP),
      "--dp",
      String(job.hosts.length),
      ...paceFlags(options),
      "--state-bytes",
      String(options.stateBytes),
      "--events",
      run.events,
      "--replacement",
      REPLACEMENT,
      ...gate,
    ]);
  }
}

const jobStarted = (run: DemoRun, id: string) => async () => (await run.client.status()).jobs.some((j) => j.id === id && j.started);

/** Starts every job's workers; resolves once the running jobs train, the arriving one waiting at its gate. */
async function startJobs(run: DemoRun): Promise<Gates> {
  const { options } = run;
  // The running jobs, and the arriving one, train no further than a third of their
  // iterations before the arrival is planned (on the controller's planner thread, while they
  // train) and the moves' replacements are ready, so however slow this machine, the moves
  // find them training: their stop barrier is the next one they reach, and the moves hold
  // them there.
  const planned = join(options.dir, "planned");
  const pause = ["--pause-at", String(Math.floor(options.steps / 3)), "--resume-when-exists", planned];
  // The arriving job's processes start now and wait at a gate, so it arrives on cue however
  // long processes take to start on a busy machine.
  const admitted = join(options.dir, `${DEMO_ARRIVING.id}.admitted`);
  startJob(run, DEMO_ARRIVING, ["--start-when-exists", admitted, ...pause]);
  for (const job of DEMO_RUNNING) startJob(run, job, pause);
  for (const job of DEMO_RUNNING) await until(run.group, jobStarted(run, job.id), options.timeoutMs, `job ${job.id} to start`);
  options.print(`${run.elapsed()}  ${DEMO_RUNNING.map((j) => `${j.id} trains on hosts ${j.hosts.join(", ")}`).join("; ")}`);
  printRacks(options.print, await run.client.status());
  return { admitted, planned };
}

/** Opens the arriving job's gate; returns the racks as its placement leaves them, before any move. */
async function arrive(run: DemoRun, admitted: string): Promise<RackView> {
  const { print, timeoutMs } = run.options;
  writeFileSync(admitted, "");
  await until(run.group, jobStarted(run, DEMO_ARRIVING.id), timeoutMs, `job ${DEMO_ARRIVING.id} to start`);
  print(`${run.elapsed()}  ${DEMO_ARRIVING.id} arrives; the cluster's scheduler places it on hosts ${DEMO_ARRIVING.hosts.join(", ")}`);
  const arrival = placed(DEMO_JOBS);
  printRacks(print, arrival);
  return arrival;
}

/** Waits for the controller's plan and for its replacements to be ready, then lets the jobs train on. */
async function awaitPlan(run: DemoRun, planned: string): Promise<StatusReport["migrations"]> {
  const { print, timeoutMs } = run.options;
  const status = run.client.status.bind(run.client);
  await until(run.group, async () => (await status()).migrations.length > 0, timeoutMs, "a plan");
  const plan = (await status()).migrations;
  print(
    `${run.elapsed()}  plan: ${plan.length} move${plan.length === 1 ? "" : "s"} in one step (every source stages before any destination loads, so swaps need no free host)`,
  );
  for (const m of plan) print(`           ${m.id}  ${m.job} worker on host ${m.from} (rack ${rackOf(m.from)}) → host ${m.to} (rack ${rackOf(m.to)})`);
  // A move stops its job only once its replacement is ready: the jobs wait until then.
  const told = async () => (await status()).migrations.every((m) => m.stopStep !== null || m.state === "rolled-back");
  await until(run.group, told, timeoutMs, "the moves' replacements to be ready");
  writeFileSync(planned, "");
  return plan;
}

/** Follows the moves until every one and every job has finished, printing each step. */
async function awaitCompletion(run: DemoRun, plan: StatusReport["migrations"]): Promise<Settled> {
  const { print } = run.options;
  const seen = new Map<string, number>();
  const done = new Set<string>();
  let moves = plan;
  let settled: StatusReport | undefined;
  await until(
    run.group,
    async () => {
      const now = await run.client.status();
      moves = now.migrations;
      printTransitions(run, moves, seen);
      if (!settled && moves.every((m) => TERMINAL.has(m.state))) {
        settled = now;
        print(`${run.elapsed()}  every move finished; the jobs train on`);
        printRacks(print, now);
      }
      await finishJobs(run, done);
      return settled !== undefined && done.size === EXPECTED_WORKERS.size;
    },
    run.options.timeoutMs * 4,
    "every migration and every job to finish",
  );
  return { moves, final: settled! };
}

/** Prints the transitions of each move not printed yet; `seen` holds how many entries of each move's history were. */
function printTransitions(run: DemoRun, moves: StatusReport["migrations"], seen: Map<string, number>): void {
  for (const m of moves) {
    for (const [index, entry] of m.history.entries()) {
      if (index < (seen.get(m.id) ?? 1)) continue;
      const took = entry.at - m.history[index - 1]!.at;
      run.options.print(
        `${run.elapsed()}  ${m.id} ${m.job} ${m.from}→${m.to}: ${m.history[index - 1]!.state} took ${took} ms → ${entry.state}${entry.state === "pausing" ? ` at barrier ${m.stopStep}` : ""}${entry.state === "rolled-back" ? `: ${m.reason}` : ""}`,
      );
    }
    seen.set(m.id, m.history.length);
  }
}

/** A launcher reports its job's end; here the last worker to finish stands in for it. */
async function finishJobs(run: DemoRun, done: Set<string>): Promise<void> {
  for (const [job, workers] of EXPECTED_WORKERS) {
    if (done.has(job) || finished(run.events, job).length < workers) continue;
    await run.client.finish(job);
    done.add(job);
    run.options.print(`${run.elapsed()}  ${job} finished ${run.options.steps} iterations`);
  }
}

/** Prints how the moves went and checks every job; the run's result. */
async function verify(run: DemoRun, { moves, final }: Settled, arrival: RackView): Promise<DemoResult> {
  const { print } = run.options;
  print("");
  print("migration phases (ms; from the controller's journaled transitions):");
  print(phaseTable(moves));
  const transfers = [...EXPECTED_WORKERS.keys()].flatMap((job) => jobEvents(run.events, job)).filter((e) => e.event === "sent" || e.event === "resumed");
  printTransfers(print, transfers);
  print("");
  print(`checking every job against an unmigrated replay of the same seed (${run.options.steps} iterations):`);
  const jobs = [...EXPECTED_WORKERS.keys()].map((job) => checkJob(run, job));
  const ok = moves.every((m) => m.state === "done") && final.withinBounds && jobs.every((j) => j.identical);
  const sent = transfers.flatMap((e) => (e.event === "sent" ? [{ migration: e.migration, bytes: e.bytes, transport: e.transport }] : []));
  return {
    migrations: moves,
    arrival: arrival.fragmentation,
    final: (await run.client.status()).fragmentation,
    transfers: sent,
    jobs,
    withinBounds: final.withinBounds,
    ok,
  };
}

function printTransfers(print: (line: string) => void, transfers: readonly WorkerEvent[]): void {
  if (!transfers.length) return;
  print("");
  print("the workers' side:");
  for (const e of transfers) {
    if (e.event === "sent")
      print(
        `  ${e.migration}  source on host ${e.host}: packed ${mib(e.bytes)} in ${ms(e.packSeconds)}, sent it over ${e.transport.toUpperCase()} in ${ms(e.sendSeconds)} (${gbps(e.bytes, e.sendSeconds)})`,
      );
    if (e.event === "resumed")
      print(`  ${e.migration}  replacement on host ${e.host}: loaded the checkpoint in ${ms(e.loadSeconds)}, resumed at iteration ${e.step}`);
  }
}

/** Compares every replica's final state of `job` with a replay of its seed that never moved. */
function checkJob(run: DemoRun, job: string): JobCheck {
  const { options } = run;
  const replay = initialState(seedOf(job), options.stateBytes);
  for (let step = 0; step < options.steps; step++) trainStep(replay);
  const reference = digest(replay);
  const digests = finished(run.events, job).map((e) => e.digest);
  const migratedIn = jobEvents(run.events, job).filter((e) => e.event === "resumed").length;
  const check = { job, digests, reference, migratedIn, identical: digests.length > 0 && digests.every((d) => d === reference) };
  options.print(
    `  ${job.padEnd(8)} replicas ${digests.join(" ")}  replay ${check.reference}  ${check.identical ? "bit-identical" : "DIFFERENT"}${migratedIn ? ` (${migratedIn} worker${migratedIn === 1 ? "" : "s"} migrated)` : ""}`,
  );
  return check;
}

function jobEvents(events: string, job: string): WorkerEvent[] {
  const path = join(events, `${job}.jsonl`);
  return existsSync(path) ? readEvents(readFileSync(path, "utf8"), path) : [];
}

const finished = (events: string, job: string) =>
  jobEvents(events, job).filter((e): e is Extract<WorkerEvent, { event: "finished" }> => e.event === "finished");

const rackOf = (host: number) => Math.floor(host / DEMO_TOPOLOGY.hostsPerRack);
const mib = (bytes: number) => `${(bytes / MiB).toFixed(0)} MiB`;
const ms = (seconds: number) => `${(seconds * 1000).toFixed(0)} ms`;
const gbps = (bytes: number, seconds: number) => `${((bytes * 8) / seconds / 1e9).toFixed(1)} Gbit/s`;

type RackView = Pick<StatusReport, "fragmentation" | "lambda" | "withinBounds"> & {
  readonly jobs: readonly { readonly id: string; readonly hosts: readonly number[] }[];
};

/** Racks as a placement leaves them, computed the way the controller does. */
function placed(jobs: readonly DemoJob[]): RackView {
  const cluster = parseSnapshot({ topology: DEMO_TOPOLOGY, jobs: jobs.map((j) => ({ id: j.id, rings: TP, hosts: [...j.hosts] })) }, "demo placement");
  return { fragmentation: rackFragmentation(cluster), lambda: cluster.lambda, withinBounds: withinBounds(cluster), jobs };
}

function printRacks(print: (line: string) => void, report: RackView): void {
  const racks = report.fragmentation.map((_, rack) => rack);
  const jobsOn = (rack: number) =>
    report.jobs
      .filter((j) => j.hosts.some((h) => rackOf(h) === rack))
      .map((j) => j.id)
      .join(",") || "-";
  const width = Math.max(6, ...racks.map((r) => jobsOn(r).length));
  print(`           rack       ${racks.map((r) => String(r).padStart(width)).join(" ")}`);
  print(`           jobs       ${racks.map((r) => jobsOn(r).padStart(width)).join(" ")}`);
  print(
    `           rings      ${report.fragmentation.map((d) => `${d}${d > report.lambda ? "!" : ""}`.padStart(width)).join(" ")}   (bound ${report.lambda}${report.withinBounds ? ", all within" : "; ! = over"})`,
  );
}

const PHASES = ["staging", "starting", "ready", "pausing", "transferring", "verifying", "staged", "committing", "resuming"] as const;

function phaseTable(moves: StatusReport["migrations"]): string {
  const header = ["move", "job", "from→to", "barrier", ...PHASES, "total", "outcome"];
  const rows = moves.map((m) => {
    const time = (state: string) => {
      const index = m.history.findIndex((h) => h.state === state);
      const next = m.history[index + 1];
      return index < 0 || !next ? "-" : String(next.at - m.history[index]!.at);
    };
    // From the stop: before it, the job trained on.
    const first = m.history.find((h) => h.state === "pausing") ?? m.history[0]!;
    const total = m.history[m.history.length - 1]!.at - first.at;
    return [
      m.id,
      m.job,
      `${m.from}→${m.to}`,
      String(m.stopStep ?? "-"),
      ...PHASES.map(time),
      String(total),
      m.state === "done" ? "done" : `${m.state}: ${m.reason ?? ""}`,
    ];
  });
  return table(header, rows)
    .split("\n")
    .map((line) => `  ${line}`)
    .join("\n");
}

/** Writes the Prometheus file_sd targets once the controller and every daemon say where their metrics are. */
async function writeTargets(group: ProcessGroup, controller: Managed, daemons: readonly Managed[], file: string, timeoutMs: number): Promise<void> {
  const at = async (managed: Managed) => (await group.waitFor(managed, /metrics on http:\/\/(\S+)\/metrics/, timeoutMs))[1]!;
  const targets = [
    { targets: [await at(controller)], labels: { role: "controller" } },
    ...(await Promise.all(daemons.map(async (daemon, host) => ({ targets: [await at(daemon)], labels: { role: "daemon", host: String(host) } })))),
  ];
  // Renamed into place, so Prometheus never reads half a file.
  writeFileSync(`${file}.tmp`, JSON.stringify(targets, null, 2));
  renameSync(`${file}.tmp`, file);
}

async function until(group: ProcessGroup, check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await check())) {
    if (group.failure) throw new DemoError(`while waiting for ${what}: ${group.failure}`);
    if (performance.now() > deadline) throw new DemoError(`gave up waiting for ${what} after ${(timeoutMs / 1000).toFixed(0)} s`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** A stage of the demo did not happen in time, or a process failed; the logs in the working directory say why. */
export class DemoError extends Error {
  override readonly name = "DemoError";
}
