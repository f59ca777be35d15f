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
//
//   npm run bench:control -- --register 16384 --barrier 1024
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { performance } from "node:perf_hooks";
import { context } from "zeromq";
import { numberFlag, parseFlags, table, UsageError } from "../cli/io.ts";
import { CLI } from "../cli/paths.ts";
import { benchMain } from "./entry.ts";
import { ControllerClient, WorkerClient } from "../sdk/client.ts";

const JOB_HOSTS = 8;
const HOSTS_PER_RACK = 64;

const help = `usage: npm run bench:control -- [options]

options:
  --register N     workers to register (default 16384)
  --connections N  client connections the registering workers share (default 64)
  --offset N       shift every job by N hosts, so jobs straddle racks (default 4)
  --barrier N      registered workers for the barrier round trips (default 1024)
  --rounds N       barrier rounds per pattern (default 20)
  -h, --help       show this help`;

interface Controller {
  readonly child: ChildProcess;
  readonly endpoint: string;
  readonly dir: string;
  rssMiB(): number;
  stop(): Promise<void>;
}

async function startController(hosts: number): Promise<Controller> {
  const dir = mkdtempSync(join(tmpdir(), "monkeytree-bench-"));
  const racks = Math.ceil(hosts / HOSTS_PER_RACK);
  const snapshot = join(dir, "topology.json");
  writeFileSync(snapshot, JSON.stringify({ topology: { racks, hostsPerRack: HOSTS_PER_RACK, gpusPerHost: 8, uplinksPerRack: 32 }, jobs: [] }));
  const child = spawn(
    process.execPath,
    [...CLI, "controller", "--snapshot", snapshot, "--bind", "tcp://127.0.0.1:*", "--journal", join(dir, "journal")],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  // If the benchmark dies, the controller must not outlive it.
  const orphan = () => child.kill("SIGKILL");
  process.once("exit", orphan);
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const endpoint = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const match = /^controller listening on (\S+)/.exec(line);
      if (match?.[1]) resolve(match[1]);
    });
    child.on("exit", (code) => reject(new Error(`controller exited with ${code}: ${stderr}`)));
  });
  return {
    child,
    endpoint,
    dir,
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

async function barriers(workers: number, rounds: number, offset: number) {
  const controller = await startController(workers);
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

    const together: number[] = [];
    for (let r = 0; r < rounds; r++, step++) await Promise.all(all.map((w) => timed(w, step, together)));

    return { sequential, perJob, together, rss: controller.rssMiB() };
  } finally {
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
    help: { type: "boolean", short: "h", default: false },
  });
  const registerCount = numberFlag("register", flags.register, 16_384, JOB_HOSTS);
  const barrierCount = numberFlag("barrier", flags.barrier, 1_024, JOB_HOSTS);
  if (registerCount % JOB_HOSTS || barrierCount % JOB_HOSTS) throw new UsageError(`worker counts must be multiples of ${JOB_HOSTS} (the job size)`);
  return {
    help: flags.help,
    registerCount,
    barrierCount,
    connections: numberFlag("connections", flags.connections, 64, 1),
    rounds: numberFlag("rounds", flags.rounds, 20, 1),
    offset: numberFlag("offset", flags.offset, 4, 0),
  };
}

await benchMain("control", help, options, async ({ registerCount, barrierCount, connections, rounds, offset }) => {
  // ZeroMQ allows 1,023 sockets per context unless told before the first one opens; this
  // process plays every worker.
  context.maxSockets = Math.max(context.maxSockets, barrierCount + connections + 64);

  const reg = await registration(registerCount, connections, offset);
  process.stdout.write(
    `registration: ${registerCount} workers (${registerCount / JOB_HOSTS} jobs) over ${connections} connections in ${reg.seconds.toFixed(2)} s ` +
      `(${Math.round(registerCount / reg.seconds)} /s); ${reg.records} journal records; controller RSS ${reg.rssBefore.toFixed(0)} → ${reg.rssAfter.toFixed(0)} MiB\n\n`,
  );

  const bar = await barriers(barrierCount, rounds, offset);
  const row = (name: string, samples: number[]) => {
    const sorted = [...samples].sort((a, b) => a - b);
    return [name, sorted.length, quantile(sorted, 0.5).toFixed(3), quantile(sorted, 0.99).toFixed(3), (sorted.at(-1) ?? NaN).toFixed(3)];
  };
  process.stdout.write(
    `barrier round trips, ${barrierCount} registered workers, one connection each (ms; controller RSS ${bar.rss.toFixed(0)} MiB):\n` +
      table(["pattern", "samples", "p50", "p99", "max"], [row("sequential", bar.sequential), row(`per job (${JOB_HOSTS} together)`, bar.perJob), row(`all ${barrierCount} at once`, bar.together)]) +
      "\n",
  );
  return 0;
});
