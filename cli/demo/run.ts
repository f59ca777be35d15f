import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { ControllerClient } from "../../sdk/client.ts";
import type { StatusReport } from "../../sdk/protocol/status.ts";
import { readEvents, type WorkerEvent } from "./events.ts";
import { digest, initialState, seedOf, trainStep } from "./model.ts";
import { table } from "../io.ts";
import { parseSnapshot } from "../../controller/model/cluster.ts";
import { rackFragmentation, withinBounds } from "../../controller/model/fragmentation.ts";
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

export async function runDemo(options: DemoOptions): Promise<DemoResult> {
  const { dir, print } = options;
  const events = join(dir, "events");
  mkdirSync(events, { recursive: true });
  const tenant = replacementUser();
  if (tenant) {
    // Replacements append to the events their sources (run as root) started: they need a way
    // into the working directory and files of their own.
    chmodSync(dir, 0o711);
    for (const job of [...DEMO_RUNNING, DEMO_ARRIVING]) sharedFile(join(events, `${job.id}.jsonl`), tenant);
  }
  const group = new ProcessGroup(dir);
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
    const snapshot = join(dir, "topology.json");
    writeFileSync(snapshot, JSON.stringify({ topology: DEMO_TOPOLOGY, jobs: [] }));
    const metrics = options.metrics ? ["--metrics", "127.0.0.1:0"] : [];
    const controller = group.start("controller", [...CLI, "controller", "--snapshot", snapshot, "--bind", "tcp://127.0.0.1:*", "--journal", join(dir, "journal"), "--heartbeat-timeout", "5", ...metrics]);
    const endpoint = (await group.waitFor(controller, /controller listening on (tcp:\/\/\S+)/, options.timeoutMs))[1]!;
    group.controller = endpoint;
    client = new ControllerClient({ endpoint, timeoutMs: 10_000, retryMs: 500 });
    const status = client.status.bind(client);

    const hosts = DEMO_TOPOLOGY.racks * DEMO_TOPOLOGY.hostsPerRack;
    const pace = ["--steps", String(options.steps), "--step-ms", String(options.stepMs)];
    // Room for two checkpoints: a host may receive one while its own worker's is still staged.
    const stagingBytes = 2 * options.stateBytes + 4 * MiB;
    // Every daemon starts a replacement as this same worker program; job, host and state come from the move.
    const replacement = `${REPLACEMENT}=${shellCommand([process.execPath, ...WORKER, ...pace, "--events", events])}`;
    const daemons: Managed[] = [];
    for (let host = 0; host < hosts; host++) {
      daemons[host] = group.start(`daemon-${host}`, [
        ...CLI, "daemon", "--host", String(host), "--connect", endpoint, "--listen", "127.0.0.1:0", "--staging-bytes", String(stagingBytes),
        "--replacement", replacement, ...(tenant ? ["--run-as", tenant.user] : []), ...metrics,
      ]);
    }
    if (options.metrics) await writeTargets(group, controller, daemons, options.metrics.targets, options.timeoutMs);
    await until(group, async () => (await status()).hosts.registered === hosts, options.timeoutMs, "every host daemon to register");
    print(`${elapsed()}  controller on ${endpoint}; ${hosts} host daemons registered, each with ${mib(stagingBytes)} of staging`);

    const startJob = (job: DemoJob, gate: string[] = []): Managed[] =>
      job.hosts.map((host) =>
        group.start(`${job.id}-${host}`, [
          ...WORKER, "--controller", endpoint, "--job", job.id, "--host", String(host), "--tp", String(TP), "--dp", String(job.hosts.length),
          ...pace, "--state-bytes", String(options.stateBytes), "--events", events, "--replacement", REPLACEMENT, ...gate,
        ]),
      );
    // The running jobs, and the arriving one, train no further than a third of their
    // iterations before the arrival is planned (on the controller's planner thread, while they
    // train) and the moves' replacements are ready, so however slow this machine, the moves
    // find them training: their stop barrier is the next one they reach, and the moves hold
    // them there.
    const planned = join(dir, "planned");
    // The arriving job's processes start now and wait at a gate, so it arrives on cue however
    // long processes take to start on a busy machine.
    const admitted = join(dir, `${DEMO_ARRIVING.id}.admitted`);
    startJob(DEMO_ARRIVING, ["--start-when-exists", admitted, "--pause-at", String(Math.floor(options.steps / 3)), "--resume-when-exists", planned]);
    const jobStarted = (id: string) => async () => (await status()).jobs.some((j) => j.id === id && j.started);
    for (const job of DEMO_RUNNING) startJob(job, ["--pause-at", String(Math.floor(options.steps / 3)), "--resume-when-exists", planned]);
    for (const job of DEMO_RUNNING) await until(group, jobStarted(job.id), options.timeoutMs, `job ${job.id} to start`);
    print(`${elapsed()}  ${DEMO_RUNNING.map((j) => `${j.id} trains on hosts ${j.hosts.join(", ")}`).join("; ")}`);
    printRacks(print, await status());

    writeFileSync(admitted, "");
    await until(group, jobStarted(DEMO_ARRIVING.id), options.timeoutMs, `job ${DEMO_ARRIVING.id} to start`);
    print(`${elapsed()}  ${DEMO_ARRIVING.id} arrives; the cluster's scheduler places it on hosts ${DEMO_ARRIVING.hosts.join(", ")}`);
    const arrival = placed([...DEMO_RUNNING, DEMO_ARRIVING]);
    printRacks(print, arrival);
    await until(group, async () => (await status()).migrations.length > 0, options.timeoutMs, "a plan");
    const plan = (await status()).migrations;
    print(`${elapsed()}  plan: ${plan.length} move${plan.length === 1 ? "" : "s"} in one step (every source stages before any destination loads, so swaps need no free host)`);
    for (const m of plan) print(`           ${m.id}  ${m.job} worker on host ${m.from} (rack ${rackOf(m.from)}) → host ${m.to} (rack ${rackOf(m.to)})`);
    // A move stops its job only once its replacement is ready: the jobs wait until then.
    const told = async () => (await status()).migrations.every((m) => m.stopStep !== null || m.state === "rolled-back");
    await until(group, told, options.timeoutMs, "the moves' replacements to be ready");
    writeFileSync(planned, "");

    const expected = new Map([...DEMO_RUNNING, DEMO_ARRIVING].map((job) => [job.id, job.hosts.length]));
    const jobEvents = (job: string) => {
      const path = join(events, `${job}.jsonl`);
      return existsSync(path) ? readEvents(readFileSync(path, "utf8"), path) : [];
    };
    const finished = (job: string) => jobEvents(job).filter((e): e is Extract<WorkerEvent, { event: "finished" }> => e.event === "finished");
    const seen = new Map<string, number>();
    const done = new Set<string>();
    let moves = plan;
    let settled: StatusReport | undefined;
    await until(group, 
      async () => {
        const now = await status();
        moves = now.migrations;
        for (const m of moves) {
          for (const [index, entry] of m.history.entries()) {
            if (index < (seen.get(m.id) ?? 1)) continue;
            const took = entry.at - m.history[index - 1]!.at;
            print(`${elapsed()}  ${m.id} ${m.job} ${m.from}→${m.to}: ${m.history[index - 1]!.state} took ${took} ms → ${entry.state}${entry.state === "pausing" ? ` at barrier ${m.stopStep}` : ""}${entry.state === "rolled-back" ? `: ${m.reason}` : ""}`);
          }
          seen.set(m.id, m.history.length);
        }
        if (!settled && moves.every((m) => TERMINAL.has(m.state))) {
          settled = now;
          print(`${elapsed()}  every move finished; the jobs train on`);
          printRacks(print, now);
        }
        // A launcher reports its job's end; here the last worker to finish stands in for it.
        for (const [job, workers] of expected) {
          if (done.has(job) || finished(job).length < workers) continue;
          await client!.finish(job);
          done.add(job);
          print(`${elapsed()}  ${job} finished ${options.steps} iterations`);
        }
        return settled !== undefined && done.size === expected.size;
      },
      options.timeoutMs * 4,
      "every migration and every job to finish",
    );
    const final = settled!;

    print("");
    print("migration phases (ms; from the controller's journaled transitions):");
    print(phaseTable(moves));
    const transfers = [...expected.keys()].flatMap(jobEvents).filter((e) => e.event === "sent" || e.event === "resumed");
    if (transfers.length) {
      print("");
      print("the workers' side:");
      for (const e of transfers) {
        if (e.event === "sent") print(`  ${e.migration}  source on host ${e.host}: packed ${mib(e.bytes)} in ${ms(e.packSeconds)}, sent it over ${e.transport.toUpperCase()} in ${ms(e.sendSeconds)} (${gbps(e.bytes, e.sendSeconds)})`);
        if (e.event === "resumed") print(`  ${e.migration}  replacement on host ${e.host}: loaded the checkpoint in ${ms(e.loadSeconds)}, resumed at iteration ${e.step}`);
      }
    }

    print("");
    print(`checking every job against an unmigrated replay of the same seed (${options.steps} iterations):`);
    const jobs = [...expected.keys()].map((job): JobCheck => {
      const reference = initialState(seedOf(job), options.stateBytes);
      for (let step = 0; step < options.steps; step++) trainStep(reference);
      const digests = finished(job).map((e) => e.digest);
      const migratedIn = jobEvents(job).filter((e) => e.event === "resumed").length;
      const check = { job, digests, reference: digest(reference), migratedIn, identical: digests.length > 0 && digests.every((d) => d === digest(reference)) };
      print(`  ${job.padEnd(8)} replicas ${digests.join(" ")}  replay ${check.reference}  ${check.identical ? "bit-identical" : "DIFFERENT"}${migratedIn ? ` (${migratedIn} worker${migratedIn === 1 ? "" : "s"} migrated)` : ""}`);
      return check;
    });
    const ok = moves.every((m) => m.state === "done") && final.withinBounds && jobs.every((j) => j.identical);
    const sent = transfers.flatMap((e) => (e.event === "sent" ? [{ migration: e.migration, bytes: e.bytes, transport: e.transport }] : []));
    const result = { migrations: moves, arrival: arrival.fragmentation, final: (await status()).fragmentation, transfers: sent, jobs, withinBounds: final.withinBounds, ok };
    await options.metrics?.inspect?.(result);
    return result;
  } finally {
    await client?.close();
    await group.stopAll();
  }
}

const rackOf = (host: number) => Math.floor(host / DEMO_TOPOLOGY.hostsPerRack);
const mib = (bytes: number) => `${(bytes / MiB).toFixed(0)} MiB`;
const ms = (seconds: number) => `${(seconds * 1000).toFixed(0)} ms`;
const gbps = (bytes: number, seconds: number) => `${((bytes * 8) / seconds / 1e9).toFixed(1)} Gbit/s`;

type RackView = Pick<StatusReport, "fragmentation" | "lambda" | "withinBounds"> & { readonly jobs: readonly { readonly id: string; readonly hosts: readonly number[] }[] };

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
  print(`           rings      ${report.fragmentation.map((d) => `${d}${d > report.lambda ? "!" : ""}`.padStart(width)).join(" ")}   (bound ${report.lambda}${report.withinBounds ? ", all within" : "; ! = over"})`);
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
    return [m.id, m.job, `${m.from}→${m.to}`, String(m.stopStep ?? "-"), ...PHASES.map(time), String(total), m.state === "done" ? "done" : `${m.state}: ${m.reason ?? ""}`];
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
