// Control-plane benchmark: the controller (`monkeytree controller`, its own process, journal
// on local disk) against workers speaking the real protocol over loopback TCP.
//
//   registration  W workers register (jobs of 8 consecutive hosts, shifted by --offset so
//                 one job in 8 straddles two racks and gets the fragmentation check), spread
//                 over C client connections; timed from the first request to the last
//                 assignment.
//   barrier       B registered workers, one DEALER each. "sequential": one barrier at a time
//                 (the round trip alone); "per job": the 8 workers of a job barrier together,
//                 jobs one after another; "all at once": all B barrier at the same instant
//                 (every job ends its iteration together, the worst case).
//                 "all at once, bare DEALERs": the same, from B bare DEALER sockets that send
//                 the request frame and read the reply frame, so no client library's work
//                 is counted: the controller's own fan-in.
//   echo          B bare DEALERs against a bare ZeroMQ ROUTER that sends each frame back
//                 (bench/router-echo.ts), all at once: the floor the controller's "all at
//                 once" rows are compared with. Rounds of the three take turns, so all see
//                 the same load, in --repeats repeats: each repeat's p50 is divided by the
//                 echo's in that repeat, and the median of those ratios is the result, so
//                 one burst of load from outside does not decide it. The goal: the bare
//                 DEALERs row within 1.2× the echo.
//   during a plan B bare DEALERs all at once, idle and while the controller plans 8,192 GPUs
//                 (for B = 1,024), rounds taking turns with the echo's; the goal: p99 within
//                 2× of idle, each window's p99 taken over the echo's in that window.
//
//   npm run bench:control -- --register 2048 --barrier 1024 --rounds 20 --repeats 5
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { performance } from "node:perf_hooks";
import { context, Dealer } from "zeromq";
import { numberFlag, parseFlags, table, UsageError } from "../cli/io.ts";
import { CLI } from "../cli/paths.ts";
import { nodeArgs } from "../sdk/paths.ts";
import { encode } from "../sdk/protocol/codec.ts";
import { PROTOCOL_VERSION } from "../sdk/protocol/envelope.ts";
import { benchMain } from "./entry.ts";
import { parseSnapshot } from "../controller/model/cluster.ts";
import { Journal } from "../controller/service/journal.ts";
import { ControllerClient, WorkerClient } from "../sdk/client.ts";

const JOB_HOSTS = 8;
const HOSTS_PER_RACK = 64;

const help = `usage: npm run bench:control -- [options]

options:
  --register N     workers to register (default 2048, the most hosts a cluster may have)
  --connections N  client connections the registering workers share (default 64)
  --offset N       shift every job by N hosts, so jobs straddle racks (default 4)
  --barrier N      registered workers for the barrier round trips (default 1024)
  --rounds N       barrier rounds per pattern and repeat (default 20)
  --repeats N      repeats of the "all at once" rounds; their median ratio to the echo is reported (default 5)
  --plan-time-limit S  the controller's planner budget while barriers run beside a plan (default 10)
  -h, --help       show this help`;

interface Controller {
  readonly child: ChildProcess;
  readonly endpoint: string;
  readonly dir: string;
  rssMiB(): number;
  /** CPU time the process has used, user and system, in ms (10 ms resolution). */
  cpuMs(): number;
  /** What the process wrote to stderr so far: the controller's log. */
  log(): string;
  stop(): Promise<void>;
}

async function startController(hosts: number): Promise<Controller> {
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-bench-"));
  const racks = Math.ceil(hosts / HOSTS_PER_RACK);
  const snapshot = join(dir, "topology.json");
  writeFileSync(snapshot, JSON.stringify({ topology: { racks, hostsPerRack: HOSTS_PER_RACK, gpusPerHost: 8, uplinksPerRack: 32 }, jobs: [] }));
  return startProcess(dir, [...CLI, "controller", "--snapshot", snapshot, "--bind", "tcp://127.0.0.1:*", "--journal", join(dir, "journal")]);
}

/** Starts a process that prints `… listening on ENDPOINT` once it is ready; `dir` goes when it stops. */
async function startProcess(dir: string, args: readonly string[]): Promise<Controller> {
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
  // If the benchmark dies, the controller must not outlive it.
  const orphan = () => child.kill("SIGKILL");
  process.once("exit", orphan);
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const endpoint = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const match = /listening on (\S+)/.exec(line);
      if (match?.[1]) resolve(match[1]);
    });
    child.on("exit", (code) => reject(new Error(`controller exited with ${code}: ${stderr}`)));
  });
  return {
    child,
    endpoint,
    dir,
    log: () => stderr,
    cpuMs: () => {
      // utime and stime, fields 14 and 15 of /proc/PID/stat, in clock ticks of 10 ms; the
      // command name (field 2) is in parentheses and may hold spaces.
      const fields = readFileSync(`/proc/${child.pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
      return (Number(fields[11]) + Number(fields[12])) * 10;
    },
    rssMiB: () => {
      const status = readFileSync(`/proc/${child.pid}/status`, "utf8");
      const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? NaN);
      return kb / 1024;
    },
    stop: () =>
      new Promise((resolve) => {
        child.once("exit", () => {
          process.off("exit", orphan);
          rmSync(dir, { recursive: true, force: true });
          resolve();
        });
        child.kill("SIGTERM");
      }),
  };
}

const parallelism = { tp: 8, pp: 1, dp: JOB_HOSTS };

function makeWorkers(clients: readonly ControllerClient[], count: number, offset: number): WorkerClient[] {
  return Array.from({ length: count }, (_, i) => {
    const job = `job-${Math.floor(i / JOB_HOSTS)}`;
    const host = (i + offset) % count;
    return new WorkerClient(clients[i % clients.length]!, { job, group: 0, host }, parallelism, { checkpointBytes: 12e9, barrierTimeoutMs: 60_000 });
  });
}

function quantile(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN;
}

const p50 = (samples: readonly number[]) => quantile([...samples].sort((a, b) => a - b), 0.5);
const p99 = (samples: readonly number[]) => quantile([...samples].sort((a, b) => a - b), 0.99);
const median = p50;

/** A table's samples, p50, p99 and max cells. */
function latencyCells(samples: readonly number[]): (string | number)[] {
  const sorted = [...samples].sort((a, b) => a - b);
  return [sorted.length, quantile(sorted, 0.5).toFixed(3), quantile(sorted, 0.99).toFixed(3), (sorted.at(-1) ?? NaN).toFixed(3)];
}

async function registration(workers: number, connections: number, offset: number) {
  const controller = await startController(workers);
  const clients = Array.from({ length: connections }, () => new ControllerClient({ endpoint: controller.endpoint, timeoutMs: 120_000, retryMs: 30_000 }));
  try {
    await Promise.all(clients.map((c) => c.status()));
    const rssBefore = controller.rssMiB();
    const all = makeWorkers(clients, workers, offset);
    const start = performance.now();
    await Promise.all(all.map((w) => w.register(120_000)));
    const seconds = (performance.now() - start) / 1000;
    const status = await clients[0]!.status();
    if (status.jobs.length !== workers / JOB_HOSTS) throw new Error(`expected ${workers / JOB_HOSTS} jobs, the controller holds ${status.jobs.length}`);
    return { seconds, rssBefore, rssAfter: controller.rssMiB(), records: status.journalRecords };
  } finally {
    await Promise.all(clients.map((c) => c.close()));
    await controller.stop();
  }
}

/** One repeat's round trips of the three "all at once" patterns, in ms. */
interface AllAtOnce {
  /** 1,024 SDK clients (`WorkerClient`), each on its own connection, in this process. */
  readonly sdk: number[];
  /** The same requests from bare DEALERs: the controller's own fan-in. */
  readonly bare: number[];
  /** Bare DEALERs against the bare ROUTER echo: the floor. */
  readonly echo: number[];
}

async function barriers(workers: number, rounds: number, repeatCount: number, offset: number) {
  const controller = await startController(workers);
  const echo = await startEcho(workers);
  const bare = bareDealers(controller.endpoint, workers);
  // One connection per worker, as on a real cluster where each launcher has its own.
  const clients = Array.from({ length: workers }, () => new ControllerClient({ endpoint: controller.endpoint, timeoutMs: 60_000, retryMs: 30_000 }));
  try {
    const all = makeWorkers(clients, workers, offset);
    await Promise.all(all.map((w) => w.register(60_000)));
    const timed = async (w: WorkerClient, step: number, into: number[]) => {
      const start = performance.now();
      const directive = await w.barrier(step);
      into.push(performance.now() - start);
      if (directive.kind !== "continue") throw new Error(`expected continue, got ${directive.kind}`);
    };
    let step = 0;
    // Warm up every connection and the JIT.
    for (let i = 0; i < 3; i++, step++) await Promise.all(all.map((w) => w.barrier(step)));

    const sequential: number[] = [];
    for (let r = 0; r < rounds; r++, step++) for (const w of all) await timed(w, step, sequential);

    const perJob: number[] = [];
    for (let r = 0; r < rounds; r++, step++) {
      for (let j = 0; j < workers; j += JOB_HOSTS) await Promise.all(all.slice(j, j + JOB_HOSTS).map((w) => timed(w, step, perJob)));
    }

    const continued = (replies: readonly Buffer[]) => {
      const other = replies.map((r) => JSON.parse(r.toString()) as { directive?: { kind: string } }).find((r) => r.directive?.kind !== "continue");
      if (other) throw new Error(`expected continue, got ${JSON.stringify(other)}`);
    };
    for (let i = 0; i < 3; i++, step++) {
      await echo.sockets.round(step);
      continued((await bare.round(step)).replies);
    }
    // The three "all at once" patterns take turns round by round, each round starting with
    // the next of them, so load from outside falls on all three alike; the servers' CPU time
    // is summed over their bare rounds, per message answered.
    const repeat = (): AllAtOnce => ({ sdk: [], bare: [], echo: [] });
    const repeats: AllAtOnce[] = [];
    const cpu = { controller: 0, echo: 0, sdkClients: 0, bareClients: 0 };
    // This process's CPU time (its ZeroMQ I/O thread included) over a round, in ms: the clients' side.
    const clientMs = (since: NodeJS.CpuUsage) => {
      const used = process.cpuUsage(since);
      return (used.user + used.system) / 1000;
    };
    const patterns: Record<keyof AllAtOnce, (into: number[]) => Promise<void>> = {
      sdk: async (into) => {
        const before = process.cpuUsage();
        await Promise.all(all.map((w) => timed(w, step, into)));
        cpu.sdkClients += clientMs(before);
        step++;
      },
      bare: async (into) => {
        const before = controller.cpuMs();
        const clientBefore = process.cpuUsage();
        const round = await bare.round(step++);
        cpu.bareClients += clientMs(clientBefore);
        cpu.controller += controller.cpuMs() - before;
        continued(round.replies);
        into.push(...round.ms);
      },
      echo: async (into) => {
        const before = echo.cpuMs();
        into.push(...(await echo.sockets.round(step++)).ms);
        cpu.echo += echo.cpuMs() - before;
      },
    };
    const order = Object.keys(patterns) as (keyof AllAtOnce)[];
    for (let n = 0; n < repeatCount; n++) {
      const samples = repeat();
      for (let r = 0; r < rounds; r++) {
        for (let k = 0; k < order.length; k++) {
          const pattern = order[(r + k) % order.length]!;
          await patterns[pattern](samples[pattern]);
        }
      }
      repeats.push(samples);
    }
    const perMessageUs = (ms: number) => (ms * 1000) / (repeatCount * rounds * workers);
    return {
      sequential,
      perJob,
      repeats,
      rss: controller.rssMiB(),
      cpuUs: { controller: perMessageUs(cpu.controller), echo: perMessageUs(cpu.echo), sdkClients: perMessageUs(cpu.sdkClients), bareClients: perMessageUs(cpu.bareClients) },
    };
  } finally {
    bare.close();
    await Promise.all(clients.map((c) => c.close()));
    await Promise.all([controller.stop(), echo.stop()]);
  }
}

/**
 * B bare DEALERs, each speaking for worker i of `makeWorkers` (registered, generation 0): a
 * round sends every one's barrier request at once and times each until its reply frame.
 */
function bareDealers(endpoint: string, workers: number, offset = 4) {
  const sockets = Array.from({ length: workers }, () => {
    const socket = new Dealer({ linger: 0, reconnectInterval: 100, reconnectMaxInterval: 1_000 });
    socket.connect(endpoint);
    return socket;
  });
  const frame = (i: number, step: number) =>
    encode({ v: PROTOCOL_VERSION, type: "worker.barrier", id: step + 1, worker: { job: `job-${Math.floor(i / JOB_HOSTS)}`, group: 0, host: (i + offset) % workers }, step, generation: 0 });
  const roundTrip = async (socket: Dealer, i: number, step: number) => {
    const start = performance.now();
    await socket.send(frame(i, step));
    const [reply] = await socket.receive();
    return { ms: performance.now() - start, reply: reply ?? Buffer.alloc(0) };
  };
  return {
    round: async (step: number) => {
      const trips = await Promise.all(sockets.map((s, i) => roundTrip(s, i, step)));
      return { ms: trips.map((t) => t.ms), replies: trips.map((t) => t.reply) };
    },
    close: () => sockets.forEach((s) => s.close()),
  };
}

/**
 * The same round trips against a bare ROUTER that echoes every frame: B DEALERs, configured as
 * the workers' connections, each sending a barrier request of the size the workers send.
 */
async function startEcho(workers: number) {
  const echo = await startProcess(mkdtempSync(join(tmpdir(), "monkeytree-bench-")), nodeArgs(import.meta.url, "./router-echo"));
  const sockets = bareDealers(echo.endpoint, workers);
  return {
    sockets,
    cpuMs: echo.cpuMs,
    stop: async () => {
      sockets.close();
      await echo.stop();
    },
  };
}

/**
 * Barrier round trips while the controller plans a large cluster, against the same rounds
 * before, with no plan running. The cluster has twice B hosts of 4 GPUs (8,192 GPUs for
 * B = 1,024): the B measured workers fill the first half in jobs of 8 inside a rack, and the
 * controller's journal already holds B/8 jobs in the second half, each spread one host per
 * rack over 8 racks. Those racks carry 64 rings on 32 uplinks, which takes hundreds of moves
 * to repair: the planner works through its whole time limit. A restarted controller plans
 * one replan backoff (30 s) after it starts; the rounds "while planning" are those that began
 * after its "planning for" log line and ended before the plan's result.
 */
async function duringPlan(workers: number, rounds: number, planSeconds: number) {
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-bench-"));
  const hosts = 2 * workers;
  const racks = hosts / HOSTS_PER_RACK;
  const snapshotPath = join(dir, "topology.json");
  const snapshot = { topology: { racks, hostsPerRack: HOSTS_PER_RACK, gpusPerHost: 4, uplinksPerRack: 32 }, jobs: [] };
  writeFileSync(snapshotPath, JSON.stringify(snapshot));
  const cluster = parseSnapshot(snapshot);
  const journalDir = join(dir, "journal");
  const { journal } = Journal.open(journalDir, { kind: "config", topology: cluster.topology, lambda: cluster.lambda, podLambda: cluster.podLambda ?? null });
  const half = racks / 2;
  const used = new Array<number>(racks).fill(0);
  for (let j = 0; j < workers / JOB_HOSTS; j++) {
    const group = Array.from({ length: JOB_HOSTS }, (_, k) => {
      const rack = half + ((j % half) + 2 * k) % half;
      return rack * HOSTS_PER_RACK + used[rack]!++;
    });
    const checkpointBytes = Object.fromEntries(group.map((h) => [String(h), 1]));
    journal.append({ kind: "job-started", job: `spread-${j}`, rings: 1, parallelism: { tp: 1, pp: 1, dp: JOB_HOSTS }, groups: [group], checkpointBytes, replacement: null });
  }
  journal.close();
  const controller = await startProcess(dir, [...CLI, "controller", "--snapshot", snapshotPath, "--bind", "tcp://127.0.0.1:*", "--journal", journalDir, "--plan-time-limit", String(planSeconds)]);
  const clients = Array.from({ length: 64 }, () => new ControllerClient({ endpoint: controller.endpoint, timeoutMs: 120_000, retryMs: 30_000 }));
  const bare = bareDealers(controller.endpoint, workers, 0);
  // The echo's rounds take turns with the controller's, idle and while planning: the load from
  // elsewhere in each window, which the two windows need not share.
  const echo = await startEcho(workers);
  const started = () => controller.log().includes("planning for");
  const finished = () => /fragmentation over λ \d+: plan |planning failed/.test(controller.log());
  try {
    await Promise.all(makeWorkers(clients, workers, 0).map((w) => w.register(120_000)));
    let step = 0;
    for (let i = 0; i < 3; i++) await bare.round(step++);
    const idle: number[] = [];
    const idleEcho: number[] = [];
    for (let r = 0; r < rounds; r++) {
      idle.push(...(await bare.round(step++)).ms);
      idleEcho.push(...(await echo.sockets.round(step++)).ms);
    }
    if (started()) throw new Error("the controller started planning before the idle rounds ended; the measurement would mix both");
    while (!started()) await new Promise((resolve) => setTimeout(resolve, 50));
    const planning: number[] = [];
    const planningEcho: number[] = [];
    const planStart = performance.now();
    let overlapped = 0;
    while (!finished()) {
      const round = await bare.round(step++);
      if (finished()) break;
      planning.push(...round.ms);
      planningEcho.push(...(await echo.sockets.round(step++)).ms);
      overlapped++;
    }
    const result = /fragmentation over λ \d+: (plan [^\n]*)|(planning failed[^\n]*)/.exec(controller.log());
    return { gpus: hosts * 4, idle, idleEcho, planning, planningEcho, overlapped, planSeconds: (performance.now() - planStart) / 1000, result: result?.[1] ?? result?.[2] ?? "?" };
  } finally {
    bare.close();
    await echo.stop();
    await Promise.all(clients.map((c) => c.close()));
    await controller.stop();
  }
}

function options(argv: string[]) {
  const flags = parseFlags(argv, {
    register: { type: "string" },
    connections: { type: "string" },
    offset: { type: "string" },
    barrier: { type: "string" },
    rounds: { type: "string" },
    repeats: { type: "string" },
    "plan-time-limit": { type: "string" },
    help: { type: "boolean", short: "h", default: false },
  });
  const registerCount = numberFlag("register", flags.register, 2_048, JOB_HOSTS);
  const barrierCount = numberFlag("barrier", flags.barrier, 1_024, JOB_HOSTS);
  if (registerCount % JOB_HOSTS || barrierCount % JOB_HOSTS) throw new UsageError(`worker counts must be multiples of ${JOB_HOSTS} (the job size)`);
  return {
    help: flags.help,
    registerCount,
    barrierCount,
    connections: numberFlag("connections", flags.connections, 64, 1),
    rounds: numberFlag("rounds", flags.rounds, 20, 1),
    repeats: numberFlag("repeats", flags.repeats, 5, 1),
    offset: numberFlag("offset", flags.offset, 4, 0),
    planSeconds: numberFlag("plan-time-limit", flags["plan-time-limit"], 10, 1),
  };
}

await benchMain("control", help, options, async ({ registerCount, barrierCount, connections, rounds, repeats, offset, planSeconds }) => {
  // ZeroMQ allows 1,023 sockets per context unless told before the first one opens; this
  // process plays every worker.
  context.maxSockets = Math.max(context.maxSockets, 3 * barrierCount + connections + 64);

  const reg = await registration(registerCount, connections, offset);
  process.stdout.write(
    `registration: ${registerCount} workers (${registerCount / JOB_HOSTS} jobs) over ${connections} connections in ${reg.seconds.toFixed(2)} s ` +
      `(${Math.round(registerCount / reg.seconds)} /s); ${reg.records} journal records; controller RSS ${reg.rssBefore.toFixed(0)} → ${reg.rssAfter.toFixed(0)} MiB\n\n`,
  );

  const bar = await barriers(barrierCount, rounds, repeats, offset);
  const pooled = (pattern: keyof AllAtOnce) => bar.repeats.flatMap((r) => r[pattern]);
  // Each repeat's p50 against the echo's p50 in the same repeat; the median of those decides.
  const ratios = (pattern: keyof AllAtOnce) => bar.repeats.map((r) => p50(r[pattern]) / p50(r.echo));
  const row = (name: string, samples: readonly number[], ratio?: readonly number[], cpuUs?: number, clientUs?: number, goal = "") => {
    return [
      name,
      ...latencyCells(samples),
      ratio ? `${median(ratio).toFixed(2)}×` : "",
      ratio ? ratio.map((x) => x.toFixed(2)).join(" ") : "",
      cpuUs === undefined ? "" : cpuUs.toFixed(1),
      clientUs === undefined ? "" : clientUs.toFixed(1),
      goal,
    ];
  };
  const target = 1.2;
  const bareRatio = median(ratios("bare"));
  process.stdout.write(
    `barrier round trips, ${barrierCount} registered workers, one connection each (ms; controller RSS ${bar.rss.toFixed(0)} MiB); ` +
      `the "all at once" rows: ${repeats} repeats of ${rounds} rounds, taking turns round by round:\n` +
      table(
        ["pattern", "samples", "p50", "p99", "max", "p50 vs echo", "each repeat", "server CPU µs/msg", "client CPU µs/msg", "goal"],
        [
          row("sequential", bar.sequential),
          row(`per job (${JOB_HOSTS} together)`, bar.perJob),
          row(`all ${barrierCount} at once, SDK clients`, pooled("sdk"), ratios("sdk"), undefined, bar.cpuUs.sdkClients),
          row(`all ${barrierCount} at once, bare DEALERs`, pooled("bare"), ratios("bare"), bar.cpuUs.controller, bar.cpuUs.bareClients, `≤ ${target.toFixed(2)}× ${bareRatio <= target ? "met" : "NOT met"}`),
          row(`bare ROUTER echo, all ${barrierCount} at once`, pooled("echo"), ratios("echo"), bar.cpuUs.echo),
        ],
      ) +
      `\n"p50 vs echo": the median over the repeats of each repeat's p50 over the echo's p50 in that repeat. The goal is the ` +
      `controller's own fan-in (bare DEALERs); the SDK row adds the client library's work, done for all ${barrierCount} workers in this one process ` +
      `("client CPU": this process's CPU time per barrier, against the bare DEALERs' in the same rounds).\n`,
  );

  const plan = await duringPlan(barrierCount, rounds, planSeconds);
  // Each window's p99 over the echo's p99 in the same window, planning's over idle's: the
  // slowdown the plan causes, without the change in outside load between the two windows.
  const overEcho = { idle: p99(plan.idle) / p99(plan.idleEcho), planning: p99(plan.planning) / p99(plan.planningEcho) };
  const slowdown = overEcho.planning / overEcho.idle;
  const raw = p99(plan.planning) / p99(plan.idle);
  const verdict = (ratio: number) => (ratio <= 2 ? "met" : "NOT met");
  const planRow = (name: keyof typeof overEcho, samples: number[], echoSamples: number[], goal = "") => {
    return [
      name,
      ...latencyCells(samples),
      p99(echoSamples).toFixed(3),
      `${(p99(samples) / p99(plan.idle)).toFixed(2)}×`,
      `${(overEcho[name] / overEcho.idle).toFixed(2)}×`,
      goal,
    ];
  };
  process.stdout.write(
    `\nbarrier round trips, all ${barrierCount} at once from bare DEALERs, while the controller plans ${plan.gpus} GPUs ` +
      `(--plan-time-limit ${planSeconds}; ${plan.result}; ${plan.overlapped} rounds in its ${plan.planSeconds.toFixed(1)} s), ` +
      `rounds taking turns with the echo's (ms):\n` +
      table(
        ["controller", "samples", "p50", "p99", "max", "echo p99", "p99 vs idle", "over the echo, vs idle", "goal"],
        [planRow("idle", plan.idle, plan.idleEcho), planRow("planning", plan.planning, plan.planningEcho, `≤ 2.00×: raw ${verdict(raw)}, over the echo ${verdict(slowdown)}`)],
      ) +
      `\n"over the echo, vs idle": each window's p99 over the echo's p99 in the same window, planning's over idle's. The idle and planning ` +
      `windows are seconds apart, and load from elsewhere may change between them; the echo, taking turns with the controller, sees the same load ` +
      `(the planner's thread runs at a lower priority than both).\n`,
  );
  return 0;
});
