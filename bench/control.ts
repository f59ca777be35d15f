// Control-plane benchmark: the controller (`monkeytree controller`, its own process, journal
// on local disk) against workers speaking the real protocol over loopback TCP. Since protocol
// version 2 no training step waits for the controller: a host's launcher answers its local
// processes' barriers itself, reports progress off the critical path (`worker.report`, every
// second), and the controller pushes `stop-at` orders for a move.
//
//   registration  W workers register (jobs of 8 consecutive hosts, shifted by --offset so
//                 one job in 8 straddles two racks and gets the fragmentation check), spread
//                 over C client connections; timed from the first request to the last
//                 assignment.
//   steady state  For each N of --hosts: one job of N hosts (dp N, tp 8, one rack of 64 hosts
//                 after another, within the bound: no move is planned). N - 1 hosts are
//                 `WorkerClient`s in this process, each on its own connection, reporting at
//                 their real rate. The measured host is the real launcher, `monkeytree launch`
//                 in a process of its own, with bench/control-client.py in place of torchrun:
//                 one training process that attaches over the local channel (the Unix socket
//                 the Python hook speaks) and calls `job.barrier(step, state_fn)` (the hook's
//                 own when it imports, see --python) every --period-ms, on wall-clock
//                 boundaries. On the same boundaries the N - 1 simulated hosts call their
//                 barrier for the same step, all at once: every host of the job ends its
//                 iteration together. Each iteration is also timed without a launcher (the same
//                 call on an unmanaged job, which returns at once: a plain torchrun loop), and
//                 against a bare echo of the channel (bench/channel-echo.ts, taking turns with
//                 the launcher: the floor any local channel has on this machine). The row: p50
//                 and p99 of each in µs, the barrier's overhead over the plain loop at p99 (goal
//                 ≤ 50 µs, and no row above the 1-host row's by more than 25%), and the share of
//                 measured barriers that fell inside the simulated hosts' round.
//   plan to stop  A job of --stop-hosts hosts (dp, tp 1), `WorkerClient`s in this process,
//                 training in lockstep: step k + 1 starts --step-ms after every host's barrier k
//                 answered, as an all-reduce makes it. All but one of its hosts fill whole racks;
//                 the last one sits in the next rack, beside a second job of two hosts that
//                 crosses into the rack after it; λ = 1, and the only free host is in the big
//                 job's last full rack, so the plan is one move of the big job. Timed from the
//                 move's `pausing` entry in the controller's status (the plan's start) until
//                 every host's barrier for the same stop step is held; also the step the job
//                 stops at minus the step it was at then, and the hosts that had passed the
//                 first stop step before they heard of it, so that the job stopped later. The
//                 destination's daemon is simulated (it grants staging and does nothing else).
//                 Where in a step the plan comes is chance: --stop-runs runs (a fresh controller
//                 each), and the run with the median time is the result.
//
//   npm run bench:control -- --hosts 1,64,1024 --iterations 5000 --period-ms 10 --stop-hosts 1024 --step-ms 50 --stop-runs 3
import { spawn, type ChildProcess } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { context, Dealer } from "zeromq";
import { bool, checked, helpText, int, num, parseCommandFlags, str } from "../cli/flags.ts";
import { intFlag, table, UsageError } from "../cli/io.ts";
import { CLI } from "../cli/paths.ts";
import { nodeArgs } from "../sdk/contract/paths.ts";
import { PROTOCOL_VERSION } from "../sdk/contract/protocol/envelope.ts";
import { benchMain } from "./entry.ts";
import { WorkerClient } from "../sdk/client/agent.ts";
import { ControllerClient } from "../sdk/client/client.ts";
import { MAX_HOSTS } from "../sdk/contract/protocol/limits.ts";
import type { Directive } from "../sdk/contract/protocol/worker.ts";

const JOB_HOSTS = 8;
const HOSTS_PER_RACK = 64;
const ROOT = fileURLToPath(new URL("..", import.meta.url));
const CLIENT_SCRIPT = fileURLToPath(new URL("./control-client.py", import.meta.url));
const VENV_PYTHON = join(ROOT, ".venv", "bin", "python");
/** Goals of the steady-state rows: the barrier's p99 over the plain loop's, and how far a row may exceed the 1-host row. */
const OVERHEAD_GOAL_US = 50;
const GROWTH_GOAL = 1.25;

const FLAGS = {
  register: checked(
    "N",
    `workers to register, a multiple of ${JOB_HOSTS}; at most ${MAX_HOSTS}, the most hosts a cluster may have`,
    multipleOf(JOB_HOSTS, JOB_HOSTS, MAX_HOSTS, "the job size"),
    { default: "2048" },
  ),
  connections: int("N", "client connections the registering workers share", { default: 64, min: 1 }),
  offset: int("N", "shift every job by N hosts, so jobs straddle racks", { default: 4, min: 0 }),
  hosts: checked("LIST", "hosts of the steady-state job, one row each", hostList, { default: "1,64,1024" }),
  iterations: int("N", "measured barriers per steady-state row", { default: 5_000, min: 1 }),
  "period-ms": num(
    "MS",
    "the steady-state iteration: every host reaches its barrier this often, on wall-clock boundaries; 0: back to back, with no idle time in " +
      "which the launcher sleeps (the simulated hosts' rounds follow each other too)",
    { default: 10, min: 0 },
  ),
  python: str(
    "PATH",
    "the Python that runs bench/control-client.py; with torch it calls the hook's own barrier, else a stand-in that sends the same bytes " +
      "(default: .venv/bin/python when it exists, else python3)",
  ),
  "stop-hosts": checked(
    "N",
    `hosts of the job that the plan stops, a multiple of ${HOSTS_PER_RACK}`,
    multipleOf(HOSTS_PER_RACK, HOSTS_PER_RACK, MAX_HOSTS - 2 * HOSTS_PER_RACK, "whole racks"),
    { default: "1024" },
  ),
  "step-ms": num("MS", "that job's step: the time from every host's barrier answered to the next", { default: 50, min: 1 }),
  "stop-runs": int("N", "plans to stop that job, each with a controller of its own; the median is the result", { default: 3, min: 1 }),
  json: bool("print one JSON document with every row, and nothing else on stdout"),
};

const help = helpText({
  command: "npm run bench:control --",
  table: FLAGS,
  about: `Times the controller against workers speaking the real protocol over loopback TCP: registration,
the barrier in steady state beside a plain loop, and how long a plan takes to stop a job
(bench/control.ts's opening comment says how each is measured).`,
});

// ── processes and clocks ─────────────────────────────────────────────────────────────────

/** Milliseconds since the epoch with sub-millisecond resolution: comparable with the controller's `Date.now()` and Python's `time.time_ns()`. */
const epochMs = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));
const progress = (line: string) => process.stderr.write(`bench:control: ${line}\n`);

interface Server {
  readonly endpoint: string;
  rssMiB(): number;
  /** What the process wrote to stderr so far: the controller's log. */
  log(): string;
  stop(): Promise<void>;
}

interface Snapshot {
  readonly topology: { readonly racks: number; readonly hostsPerRack: number; readonly gpusPerHost: number; readonly uplinksPerRack: number };
  readonly unavailable?: readonly number[];
}

async function startController(snapshot: Snapshot): Promise<Server> {
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-bench-"));
  try {
    const path = join(dir, "topology.json");
    writeFileSync(path, JSON.stringify({ ...snapshot, jobs: [] }));
    // No replacement is started here (the daemon is simulated): the move pauses its job as
    // soon as staging is granted, which is what this bench times from.
    return await startProcess("controller", dir, [
      ...CLI,
      "controller",
      "--snapshot",
      path,
      "--bind",
      "tcp://127.0.0.1:*",
      "--journal",
      join(dir, "journal"),
      "--replacement-wait",
      "0",
    ]);
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
}

/** A process that prints `… listening on ENDPOINT` once it is ready; `dir` goes when it stops. */
async function startProcess(name: string, dir: string, args: readonly string[]): Promise<Server> {
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
  const stop = stopper(child, () => rmSync(dir, { recursive: true, force: true }));
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  try {
    const endpoint = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on("line", (line) => {
        const match = /listening on (\S+)/.exec(line);
        if (match?.[1]) resolve(match[1]);
      });
      child.on("exit", (code) => reject(new Error(`${name} exited with ${code}: ${stderr}`)));
    });
    return {
      endpoint,
      log: () => stderr,
      rssMiB: () => {
        const status = readFileSync(`/proc/${child.pid}/status`, "utf8");
        return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? NaN) / 1024;
      },
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}

/**
 * Ends `child` (SIGTERM, then SIGKILL after 10 s) and runs `cleanup` once it has exited. If the
 * benchmark itself exits first (an error, Ctrl-C), the child is killed and cleaned up after:
 * it must not outlive it.
 */
function stopper(child: ChildProcess, cleanup: () => void): () => Promise<void> {
  const orphan = () => {
    child.kill("SIGKILL");
    cleanup();
  };
  process.once("exit", orphan);
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once("exit", () => resolve());
  });
  return async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const kill = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(kill);
    }
    process.off("exit", orphan);
    cleanup();
  };
}

/**
 * A host's daemon as far as the controller needs one here: it registers (so the host has a
 * network address, which a launcher's master needs, and can be a move's destination),
 * heartbeats, and grants every staging request without staging anything.
 */
class FakeDaemon {
  private readonly socket = new Dealer({ linger: 0 });
  private readonly incarnation = "b".repeat(32);
  private nextId = 1;
  private readonly timer: NodeJS.Timeout;
  /** Requests of its own waiting for the controller's answer, by id. */
  private readonly answers = new Map<number, (type: string) => void>();

  constructor(
    endpoint: string,
    private readonly host: number,
  ) {
    this.socket.connect(endpoint);
    this.timer = setInterval(() => void this.send({ type: "daemon.heartbeat", host, incarnation: this.incarnation }), 2_000);
    void this.serve();
  }

  /** Registers the host; resolves once the controller accepted it. */
  async register(): Promise<void> {
    const type = await this.send({
      type: "daemon.register",
      host: this.host,
      incarnation: this.incarnation,
      stagingBytes: 1 << 30,
      endpoint: "tcp://127.0.0.1:1",
    });
    if (type !== "ack") throw new Error(`the controller answered the daemon's registration for host ${this.host} with ${type}`);
  }

  close(): void {
    clearInterval(this.timer);
    this.socket.close();
  }

  /** Sends a request; resolves with the type of its answer. */
  private send(body: Record<string, unknown>): Promise<string> {
    const id = this.nextId++;
    const answered = new Promise<string>((resolve) => this.answers.set(id, resolve));
    if (!this.socket.closed) void this.socket.send(JSON.stringify({ v: PROTOCOL_VERSION, id, ...body }));
    return answered;
  }

  /** Answers a command of the controller's. */
  private reply(body: Record<string, unknown>): void {
    if (!this.socket.closed) void this.socket.send(JSON.stringify({ v: PROTOCOL_VERSION, host: this.host, ...body }));
  }

  private async serve(): Promise<void> {
    try {
      for await (const [frame] of this.socket) {
        const message = JSON.parse(frame!.toString()) as { type: string; id: number };
        if (message.type === "daemon.prepare")
          this.reply({ type: "daemon.prepared", id: message.id, endpoint: "tcp://127.0.0.1:1", token: `bench-token-${message.id}` });
        else if (message.type === "daemon.release" || message.type === "daemon.spawn") this.reply({ type: "daemon.done", id: message.id });
        else {
          this.answers.get(message.id)?.(message.type);
          this.answers.delete(message.id);
        }
      }
    } catch {
      // The socket closed under the loop: the benchmark is done with it.
    }
  }
}

function quantile(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN;
}

const ascending = (samples: readonly number[]) => [...samples].sort((a, b) => a - b);
const p50 = (samples: readonly number[]) => quantile(ascending(samples), 0.5);
const p99 = (samples: readonly number[]) => quantile(ascending(samples), 0.99);
const round1 = (x: number) => Math.round(x * 10) / 10;

/** One connection per worker, as on a real cluster where each launcher has its own. */
function connections(endpoint: string, count: number): ControllerClient[] {
  return Array.from({ length: count }, () => new ControllerClient({ endpoint, timeoutMs: 120_000, retryMs: 30_000 }));
}

async function closeAll(workers: readonly WorkerClient[], clients: readonly ControllerClient[]): Promise<void> {
  for (const w of workers) w.close();
  await Promise.all(clients.map((c) => c.close()));
}

// ── registration ─────────────────────────────────────────────────────────────────────────

async function registration(workers: number, connectionCount: number, offset: number) {
  const racks = Math.ceil(workers / HOSTS_PER_RACK);
  const controller = await startController({ topology: { racks, hostsPerRack: HOSTS_PER_RACK, gpusPerHost: 8, uplinksPerRack: 32 } });
  const clients = Array.from({ length: connectionCount }, () => new ControllerClient({ endpoint: controller.endpoint, timeoutMs: 120_000, retryMs: 30_000 }));
  const all = Array.from({ length: workers }, (_, i) => {
    const job = `job-${Math.floor(i / JOB_HOSTS)}`;
    const host = (i + offset) % workers;
    return new WorkerClient(clients[i % clients.length]!, { job, group: 0, host }, { tp: 8, pp: 1, dp: JOB_HOSTS }, { checkpointBytes: 12e9 });
  });
  try {
    await Promise.all(clients.map((c) => c.status()));
    const rssBefore = controller.rssMiB();
    const start = performance.now();
    await Promise.all(all.map((w) => w.register(120_000)));
    const seconds = (performance.now() - start) / 1000;
    const status = await clients[0]!.status();
    if (status.jobs.length !== workers / JOB_HOSTS) throw new Error(`expected ${workers / JOB_HOSTS} jobs, the controller holds ${status.jobs.length}`);
    return {
      workers,
      jobs: workers / JOB_HOSTS,
      connections: connectionCount,
      seconds: Math.round(seconds * 1000) / 1000,
      perSecond: Math.round(workers / seconds),
      journalRecords: status.journalRecords,
      rssBeforeMiB: round1(rssBefore),
      rssAfterMiB: round1(controller.rssMiB()),
    };
  } finally {
    await closeAll(all, clients);
    await controller.stop();
  }
}

// ── steady state ─────────────────────────────────────────────────────────────────────────

interface SteadyRow {
  readonly hosts: number;
  readonly iterations: number;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly plainP50Us: number;
  readonly plainP99Us: number;
  /** The same round trip against a bare echo of the channel (bench/channel-echo.ts): the machine's floor. */
  readonly echoP50Us: number;
  readonly echoP99Us: number;
  /** The barrier's p99 over the plain loop's. */
  readonly overheadP99Us: number;
  readonly maxUs: number;
  /** Share of the measured barriers that began while the simulated hosts were at theirs; null with no simulated host. */
  readonly together: number | null;
  /** The simulated hosts' round (all N - 1 barriers of one step), p50 in ms. */
  readonly roundP50Ms: number | null;
  /** Whose `job.barrier` the client called: the hook's, or the stand-in. */
  readonly client: string;
  /** The machine's 1-minute load average as the row ended: other processes compete for its cores. */
  readonly load: number;
}

interface ClientStart {
  readonly start: number;
  readonly periodNs: number;
  readonly firstStep: number;
  readonly client: string;
}

interface ClientResult {
  readonly barrierNs: number[];
  readonly echoNs: number[];
  readonly plainNs: number[];
  readonly atNs: number[];
}

/**
 * The real launcher (`monkeytree launch`, its own process) for `host` of job `job`, with
 * bench/control-client.py as its torchrun: the measured host. Its lines on stdout are the
 * client's; the launcher's log is on stderr.
 */
function startLauncher(
  dir: string,
  endpoint: string,
  job: string,
  host: number,
  dp: number,
  run: { iterations: number; periodMs: number; python: string; echo: string },
) {
  // A torchrun stand-in: `monkeytree launch` runs it with torchrun's single-node flags, which the client ignores.
  const torchrun = join(dir, "torchrun");
  writeFileSync(torchrun, `#!/bin/sh\nexec ${JSON.stringify(run.python)} ${JSON.stringify(CLIENT_SCRIPT)} "$@"\n`);
  chmodSync(torchrun, 0o755);
  const args = [
    ...CLI,
    "launch",
    "--connect",
    endpoint,
    "--job",
    job,
    "--host",
    String(host),
    "--dp",
    String(dp),
    "--tp",
    "8",
    "--checkpoint-bytes",
    String(1 << 20),
  ];
  const child = spawn(
    process.execPath,
    [...args, "--", torchrun, "--iterations", String(run.iterations), "--period-ms", String(run.periodMs), "--echo", run.echo],
    {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, PYTHONUNBUFFERED: "1" },
    },
  );
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const lines: string[] = [];
  let wake: () => void = () => {};
  createInterface({ input: child.stdout! }).on("line", (line) => {
    lines.push(line);
    wake();
  });
  let running = true;
  const exited = new Promise<number>((resolve) =>
    child.once("exit", (code, signal) => {
      running = false;
      resolve(code ?? (signal ? 128 : 1));
    }),
  );
  const failed = exited.then((code) => {
    throw new Error(`the launcher exited with ${code} before the client's results:\n${stderr.slice(-4000)}`);
  });
  failed.catch(() => undefined);
  /** The client's next line, parsed. */
  const next = async <T>(timeoutMs: number): Promise<T> => {
    const deadline = performance.now() + timeoutMs;
    while (lines.length === 0) {
      const arrived = new Promise<void>((resolve) => (wake = resolve));
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`no word from the measured host's client in ${timeoutMs / 1000} s:\n${stderr.slice(-4000)}`);
      await Promise.race([arrived, failed, sleep(Math.min(left, 1_000))]);
    }
    return JSON.parse(lines.shift()!) as T;
  };
  return { next, exited, running: () => running, stop: stopper(child, () => rmSync(dir, { recursive: true, force: true })), log: () => stderr };
}

/** Whether `atMs` fell inside one of `rounds`, which follow each other in order. */
function inRound(rounds: readonly { start: number; end: number }[], atMs: number): boolean {
  // The last round that began by then.
  let lo = 0;
  for (let hi = rounds.length; hi - lo > 1;) {
    const mid = (lo + hi) >> 1;
    if (rounds[mid]!.start <= atMs) lo = mid;
    else hi = mid;
  }
  const r = rounds[lo];
  return r !== undefined && r.start <= atMs && atMs <= r.end;
}

async function steadyState(hosts: number, iterations: number, periodMs: number, python: string): Promise<SteadyRow> {
  const racks = Math.ceil(hosts / HOSTS_PER_RACK);
  const controller = await startController({ topology: { racks, hostsPerRack: HOSTS_PER_RACK, gpusPerHost: 8, uplinksPerRack: 32 } });
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-bench-"));
  const job = "steady";
  const measured = hosts - 1;
  // The job's master is its first host in ring order, host 0: the launcher forms its process
  // group's address from that host's daemon.
  const daemon = new FakeDaemon(controller.endpoint, 0);
  const clients = connections(controller.endpoint, hosts - 1);
  const simulated = clients.map((client, host) => new WorkerClient(client, { job, group: 0, host }, { tp: 8, pp: 1, dp: hosts }, { checkpointBytes: 1 << 20 }));
  let launcher: ReturnType<typeof startLauncher> | null = null;
  let echo: Server | null = null;
  try {
    await daemon.register();
    echo = await startProcess("the channel echo", mkdtempSync(join(tmpdir(), "monkeytree-bench-")), [
      ...nodeArgs(import.meta.url, "./channel-echo"),
      join(dir, "echo.sock"),
    ]);
    launcher = startLauncher(dir, controller.endpoint, job, measured, hosts, { iterations, periodMs, python, echo: join(dir, "echo.sock") });
    await Promise.all(simulated.map((w) => w.register(120_000)));
    const start = await launcher.next<ClientStart>(120_000);
    progress(`${hosts} hosts: registered; the client (${start.client}'s barrier) starts its ${iterations} iterations`);

    // The simulated hosts' rounds, on the client's boundaries. Each starts a little before its
    // boundary (half a typical round, plus the timer's lateness), so that the measured barrier
    // falls inside it; how many did is reported.
    const rounds: { start: number; end: number }[] = [];
    const roundMs: number[] = [];
    const lateMs: number[] = [];
    let lead = 0;
    for (let i = 0; i < iterations && simulated.length > 0 && launcher.running(); i++) {
      const boundary = start.start / 1e6 + i * periodMs;
      const wait = boundary - lead - epochMs();
      if (periodMs > 0 && wait < -periodMs / 2) continue;
      await sleep(wait);
      const begun = epochMs();
      lateMs.push(begun - (boundary - lead));
      const step = start.firstStep + i;
      const directives = await Promise.all(simulated.map((w) => w.barrier(step)));
      const end = epochMs();
      rounds.push({ start: begun, end });
      roundMs.push(end - begun);
      const other = directives.find((d) => d.kind !== "continue");
      // The measured host's launcher ends the job once its client is done: its hosts are told to stop.
      if (other?.kind === "stop") break;
      if (other) throw new Error(`a simulated host's barrier ${step} answered ${other.kind}, not continue`);
      if (i % 20 === 19) lead = Math.min(periodMs / 2, p50(lateMs.slice(-100)) + p50(roundMs.slice(-100)) / 2);
    }
    const result = await launcher.next<ClientResult>(iterations * periodMs + 120_000);
    const code = await launcher.exited;
    if (code !== 0) throw new Error(`the launcher exited with ${code}:\n${launcher.log().slice(-4000)}`);
    const together = simulated.length === 0 ? null : result.atNs.filter((at) => inRound(rounds, at / 1e6)).length / iterations;
    const us = (ns: readonly number[]) => ns.map((x) => x / 1000);
    const barrier = us(result.barrierNs);
    const plain = us(result.plainNs);
    const floor = us(result.echoNs);
    return {
      hosts,
      iterations,
      p50Us: round1(p50(barrier)),
      p99Us: round1(p99(barrier)),
      plainP50Us: round1(p50(plain)),
      plainP99Us: round1(p99(plain)),
      echoP50Us: round1(p50(floor)),
      echoP99Us: round1(p99(floor)),
      overheadP99Us: round1(p99(barrier) - p99(plain)),
      maxUs: round1(Math.max(...barrier)),
      together: together === null ? null : Math.round(together * 1000) / 1000,
      roundP50Ms: roundMs.length ? Math.round(p50(roundMs) * 100) / 100 : null,
      client: start.client,
      load: round1(loadavg()[0]!),
    };
  } finally {
    await launcher?.stop();
    await echo?.stop();
    daemon.close();
    await closeAll(simulated, clients);
    await controller.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

// ── plan to stop ─────────────────────────────────────────────────────────────────────────

interface PlanToStop {
  readonly hosts: number;
  readonly stepMs: number;
  /** From the move's `pausing` entry to every host held at the same step. */
  readonly ms: number;
  /** The step the job stopped at minus the step it was at when the plan came. */
  readonly stepsAhead: number;
  /** Hosts that had passed the first stop step before they heard of it. */
  readonly raised: number;
  readonly firstStopStep: number;
  readonly stopStep: number;
  /** From `pausing` until every host knew of the stop (polled every millisecond). */
  readonly knownMs: number;
  /** From `pausing` until the controller saw every host held (its next history entry). */
  readonly controllerMs: number | null;
  readonly load: number;
}

/**
 * The layout of the plan-to-stop cluster for a job of `hosts` (a multiple of 64): the big job
 * fills racks 0..R-1 but for their last host, and has one host at the start of rack R; job
 * "small" has the next host of rack R and the first of rack R + 1. Every other host of racks
 * R and R + 1 is unavailable, so with λ = 1 the one plan of one move takes the big job's host
 * in rack R to the free host of rack R - 1.
 */
function stopLayout(hosts: number) {
  const r = hosts / HOSTS_PER_RACK;
  const straddler = r * HOSTS_PER_RACK;
  const free = straddler - 1;
  const big = [...Array.from({ length: hosts - 1 }, (_, h) => h), straddler];
  const small = [straddler + 1, straddler + HOSTS_PER_RACK];
  const unavailable = Array.from({ length: 2 * HOSTS_PER_RACK }, (_, i) => straddler + i).filter((h) => !big.includes(h) && !small.includes(h));
  const snapshot: Snapshot = { topology: { racks: r + 2, hostsPerRack: HOSTS_PER_RACK, gpusPerHost: 8, uplinksPerRack: 1 }, unavailable };
  return { snapshot, big, small, from: straddler, to: free };
}

/** The big job training in lockstep (`trainInLockstep`). */
interface Lockstep {
  /** Per host: the barrier it waits at and since when, or null while it trains. */
  readonly pending: readonly ({ readonly step: number; readonly since: number } | null)[];
  /** When each step began. */
  readonly stepStarts: readonly number[];
  /** Rejects when a barrier answers anything but `continue` while training. */
  readonly trainer: Promise<void>;
  stop(): void;
}

/** Trains `workers` in lockstep: step k + 1 starts `stepMs` after every host's barrier k answered. */
function trainInLockstep(workers: readonly WorkerClient[], stepMs: number): Lockstep {
  const pending: ({ step: number; since: number } | null)[] = workers.map(() => null);
  const stepStarts: number[] = [];
  let training = true;
  const trainStep = async (w: WorkerClient, i: number, step: number): Promise<Directive> => {
    const barrier = w.barrier(step);
    // `barrier` takes the step after one turn of the event loop (setImmediate), in which
    // orders may arrive: this stamp follows it, so a host held is held since then.
    const entry = { step, since: NaN };
    pending[i] = entry;
    setImmediate(() => (entry.since = epochMs()));
    const directive = await barrier;
    pending[i] = null;
    return directive;
  };
  const trainer = (async () => {
    for (let step = 0; training; step++) {
      stepStarts[step] = epochMs();
      await sleep(stepMs);
      if (!training) return;
      const directives = await Promise.all(workers.map((w, i) => trainStep(w, i, step)));
      const other = directives.find((d) => d.kind !== "continue");
      if (other && training) throw new Error(`barrier ${step} answered ${other.kind} before every host held`);
    }
  })();
  trainer.catch(() => undefined);
  return {
    pending,
    stepStarts,
    trainer,
    stop: () => {
      training = false;
    },
  };
}

/** The moment every host of the job was held at the same stop step, and what each heard first. */
interface Held {
  readonly stopStep: number;
  /** When the last host's barrier for the stop step was held. */
  readonly heldAt: number;
  /** When every host knew of a stop (polled every millisecond). */
  readonly knownAt: number | null;
  /** Per host, the first stop step it heard of. */
  readonly firstStop: readonly (number | null)[];
}

async function waitUntilHeld(workers: readonly WorkerClient[], lockstep: Lockstep, controller: Server): Promise<Held> {
  const { pending } = lockstep;
  const firstStop: (number | null)[] = workers.map(() => null);
  const deadline = performance.now() + 120_000;
  let knownAt: number | null = null;
  let heldAt: number | null = null;
  while (heldAt === null) {
    if (performance.now() > deadline) throw new Error(`the job was not held within 120 s:\n${controller.log().slice(-4000)}`);
    await Promise.race([sleep(1), lockstep.trainer]);
    workers.forEach((w, i) => (firstStop[i] ??= w.stop?.step ?? null));
    if (knownAt === null && workers.every((w) => w.stop !== null)) knownAt = epochMs();
    const stop = workers[0]!.stop?.step;
    if (stop !== undefined && workers.every((w, i) => w.stop?.step === stop && pending[i]?.step === stop && !Number.isNaN(pending[i].since))) {
      heldAt = Math.max(...pending.map((p) => p!.since));
    }
  }
  return { stopStep: workers[0]!.stop!.step, heldAt, knownAt, firstStop };
}

/** The big job's move as the controller journaled it: when it paused (the plan's start) and when it saw every host held. */
async function pausedMove(controller: Server, status: ControllerClient): Promise<{ readonly pausing: number; readonly paused: number | null }> {
  // The controller hears of the holds from the hosts' reports: its view follows, and its log
  // says when (watched there, since asking for its status often would load it).
  for (const until = performance.now() + 30_000; !/: pausing → \S+ on paused/.test(controller.log()) && performance.now() < until;) await sleep(20);
  const move = (await status.status()).migrations.find((m) => m.job === "big");
  if (!move) throw new Error(`the controller planned no move of the big job:\n${controller.log().slice(-4000)}`);
  const pausing = move.history.find((h) => h.state === "pausing")?.at;
  if (pausing === undefined) throw new Error(`move ${move.id} never paused: ${JSON.stringify(move)}`);
  const paused = move.history.find((h) => h.at >= pausing && h.state !== "pausing" && h.state !== "ready")?.at ?? null;
  return { pausing, paused };
}

/** The stop step the controller ordered first, from its log; without that line, the earliest any host heard of. */
function firstStopStep(log: string, firstStop: readonly (number | null)[]): number {
  const first = /→ pausing on pause at barrier (\d+)/.exec(log)?.[1];
  return first === undefined ? Math.min(...firstStop.map((s) => s ?? Infinity)) : Number(first);
}

/** The step that was running at `at`: the last that began by then. */
function stepAt(stepStarts: readonly number[], at: number): number {
  let step = stepStarts.length - 1;
  while (step > 0 && stepStarts[step]! > at) step--;
  return step;
}

async function planToStop(hosts: number, stepMs: number): Promise<PlanToStop> {
  const layout = stopLayout(hosts);
  const controller = await startController(layout.snapshot);
  const daemon = new FakeDaemon(controller.endpoint, layout.to);
  const clients = connections(controller.endpoint, hosts + layout.small.length);
  const status = new ControllerClient({ endpoint: controller.endpoint, timeoutMs: 60_000 });
  const worker = (job: string, dp: number, i: number, host: number) =>
    new WorkerClient(clients[i]!, { job, group: 0, host }, { tp: 1, pp: 1, dp }, { checkpointBytes: 1 << 20, replacement: "bench" });
  const big = layout.big.map((host, i) => worker("big", hosts, i, host));
  const small = layout.small.map((host, i) => worker("small", layout.small.length, hosts + i, host));
  let lockstep: Lockstep | undefined;
  try {
    await daemon.register();
    await Promise.all(big.map((w) => w.register(120_000)));
    progress(`plan to stop: ${hosts} hosts registered; training in lockstep, ${stepMs} ms a step`);
    lockstep = trainInLockstep(big, stepMs);
    // Reports carry the step time once a host has a few: the controller projects the job's step from them.
    await sleep(Math.max(3_000, 40 * stepMs));

    // Job "small" starts across racks R and R + 1: rack R breaks λ, and the controller plans.
    await Promise.all(small.map((w) => w.register(120_000)));
    const held = await waitUntilHeld(big, lockstep, controller);
    lockstep.stop();
    const { pausing, paused } = await pausedMove(controller, status);
    const first = firstStopStep(controller.log(), held.firstStop);
    return {
      hosts,
      stepMs,
      ms: Math.round(held.heldAt - pausing),
      stepsAhead: held.stopStep - stepAt(lockstep.stepStarts, pausing),
      raised: held.firstStop.filter((s) => s !== null && s > first).length,
      firstStopStep: first,
      stopStep: held.stopStep,
      knownMs: Math.round((held.knownAt ?? NaN) - pausing),
      controllerMs: paused === null ? null : Math.round(paused - pausing),
      load: round1(loadavg()[0]!),
    };
  } finally {
    lockstep?.stop();
    daemon.close();
    await closeAll([...big, ...small], [...clients, status]);
    await controller.stop();
  }
}

// ── command line ─────────────────────────────────────────────────────────────────────────

function hostList(raw: string): number[] {
  const list = raw.split(",").map((x) => intFlag("hosts", x.trim(), undefined, 1, MAX_HOSTS));
  if (list.length === 0) throw new UsageError("--hosts needs at least one host count");
  return list;
}

/** A whole number from `min` to `max` that `step` divides; `why` says what `step` is. */
function multipleOf(step: number, min: number, max: number, why: string) {
  return (raw: string, name: string): number => {
    const value = intFlag(name, raw, undefined, min, max);
    if (value % step) throw new UsageError(`--${name} must be a multiple of ${step} (${why})`);
    return value;
  };
}

function options(argv: string[]) {
  const flags = parseCommandFlags(argv, FLAGS);
  return {
    json: flags.json,
    registerCount: flags.register,
    connections: flags.connections,
    offset: flags.offset,
    hosts: flags.hosts,
    iterations: flags.iterations,
    periodMs: flags["period-ms"],
    python: flags.python ?? (existsSync(VENV_PYTHON) ? VENV_PYTHON : "python3"),
    stopHosts: flags["stop-hosts"],
    stepMs: flags["step-ms"],
    stopRuns: flags["stop-runs"],
  };
}

/** The steady-state section: every row against the fewest hosts' row, and whether the goals were met. */
function steadyStateReport(steady: readonly SteadyRow[], periodMs: number): string {
  const hosts = steady.map((r) => r.hosts);
  const base = steady.find((r) => r.hosts === Math.min(...hosts))!;
  const overheadMet = steady.every((r) => r.overheadP99Us <= OVERHEAD_GOAL_US);
  const growthMet = steady.every((r) => r.p99Us <= base.p99Us * GROWTH_GOAL);
  return (
    `steady state: the barrier's round trip from the training process (${steady[0]?.client ?? "?"}'s job.barrier) through the real launcher, ` +
    `every ${periodMs} ms, all hosts at once (µs):\n` +
    table(
      [
        "hosts",
        "iterations",
        "barrier p50",
        "barrier p99",
        "max",
        "echo p50",
        "echo p99",
        "plain p50",
        "plain p99",
        "overhead p99",
        `p99 vs ${base.hosts} host${base.hosts === 1 ? "" : "s"}`,
        "together",
        "others' round p50 ms",
        "load",
      ],
      steady.map((r) => [
        r.hosts,
        r.iterations,
        r.p50Us.toFixed(1),
        r.p99Us.toFixed(1),
        r.maxUs.toFixed(1),
        r.echoP50Us.toFixed(1),
        r.echoP99Us.toFixed(1),
        r.plainP50Us.toFixed(1),
        r.plainP99Us.toFixed(1),
        r.overheadP99Us.toFixed(1),
        `${(r.p99Us / base.p99Us).toFixed(2)}×`,
        r.together === null ? "" : `${(r.together * 100).toFixed(0)}%`,
        r.roundP50Ms === null ? "" : r.roundP50Ms.toFixed(2),
        r.load.toFixed(1),
      ]),
    ) +
    `\n"plain": the same call on an unmanaged job (no launcher: a plain torchrun loop). "echo": the same client against a bare echo of the channel ` +
    `(bench/channel-echo.ts), in turns with the launcher in each iteration: what any local channel costs on this machine. "together": the share of measured barriers that began while ` +
    `the other hosts (in this process) were at the same step's barrier. "load": the machine's 1-minute load average as the row ended (${cpus().length} CPUs). Goals: overhead p99 ≤ ${OVERHEAD_GOAL_US} µs ${overheadMet ? "met" : "NOT met"}; ` +
    `no row's p99 above ${GROWTH_GOAL.toFixed(2)}× the ${base.hosts}-host row's ${growthMet ? "met" : "NOT met"}.\n\n`
  );
}

/** The plan-to-stop section: each run, the median marked. */
function planToStopReport(runs: readonly PlanToStop[], stop: PlanToStop, stopHosts: number, stepMs: number): string {
  const stopRuns = runs.length;
  return (
    `plan to stop: a ${stopHosts}-host job in lockstep (${stepMs} ms steps), one move planned, ${stopRuns} run${stopRuns === 1 ? "" : "s"}:\n` +
    table(
      [
        "run",
        "plan → all held ms",
        "plan → all knew ms",
        "plan → controller saw held ms",
        "first stop step",
        "stop step",
        "steps ahead",
        "hosts that raised it",
        "load",
      ],
      runs.map((r, i) => [
        `${i + 1}${r === stop ? " (median)" : ""}`,
        r.ms,
        r.knownMs,
        r.controllerMs ?? "",
        r.firstStopStep,
        r.stopStep,
        r.stepsAhead,
        r.raised,
        r.load.toFixed(1),
      ]),
    ) +
    `\nFrom the move's "pausing" entry (the controller's clock) until the last host's barrier for the stop step was held (this process's clock, the same machine's). ` +
    `"all knew": polled every millisecond from this busy process, so an upper bound. "steps ahead": the stop step minus the step the job was at when the plan came; ` +
    `"raised": hosts that had passed the first stop step when they heard of it. "controller saw held": from "pausing" to the move's next state, which it enters once every host reported it holds.\n`
  );
}

await benchMain(
  "control",
  help,
  options,
  async ({ json, registerCount, connections: connectionCount, offset, hosts, iterations, periodMs, python, stopHosts, stepMs, stopRuns }) => {
    // Interrupted, it exits through its "exit" handlers, which end its processes and remove their directories.
    for (const signal of ["SIGINT", "SIGTERM"] as const) process.once(signal, () => process.exit(130));
    // ZeroMQ allows 1,023 sockets per context unless told before the first one opens; this
    // process plays every simulated host.
    context.maxSockets = Math.max(context.maxSockets, Math.max(...hosts, stopHosts + 2, connectionCount) + 64);
    const out = (text: string) => json || process.stdout.write(text);

    progress(`registering ${registerCount} workers`);
    const reg = await registration(registerCount, connectionCount, offset);
    out(
      `registration: ${registerCount} workers (${reg.jobs} jobs) over ${connectionCount} connections in ${reg.seconds.toFixed(2)} s ` +
        `(${Math.round(reg.perSecond)} /s); ${reg.journalRecords} journal records; controller RSS ${reg.rssBeforeMiB.toFixed(0)} → ${reg.rssAfterMiB.toFixed(0)} MiB\n\n`,
    );

    const steady: SteadyRow[] = [];
    for (const n of hosts) {
      progress(`steady state, ${n} hosts`);
      steady.push(await steadyState(n, iterations, periodMs, python));
    }
    out(steadyStateReport(steady, periodMs));

    const runs: PlanToStop[] = [];
    for (let run = 1; run <= stopRuns; run++) {
      progress(`plan to stop, ${stopHosts} hosts, run ${run} of ${stopRuns}`);
      runs.push(await planToStop(stopHosts, stepMs));
    }
    const stop = [...runs].sort((x, y) => x.ms - y.ms)[Math.floor((runs.length - 1) / 2)]!;
    out(planToStopReport(runs, stop, stopHosts, stepMs));
    if (json) process.stdout.write(`${JSON.stringify({ steadyState: steady, planToStop: { ...stop, runs }, registration: reg }, null, 2)}\n`);
    return 0;
  },
);
