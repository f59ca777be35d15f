// The cluster an example job is migrated on, on this machine: a controller, a daemon per host, a
// `monkeytree launch` per host of the job, and the arriving job's workers, held back by a file.
// The command lines are built apart from where they run, so a harness that puts each host in a
// network namespace can run the same ones.
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { CLI, killByEnvironment, ProcessGroup, shellCommand, WORKER, type Managed } from "../cli/demo/processes.ts";
import type { Tenant } from "../controller/daemon/replacements.ts";
import { removeStaleStagingBuffers } from "../native/index.ts";
import { ControllerClient } from "../sdk/client/client.ts";
import { script, type ExampleJob } from "./example-jobs.ts";

/** The training program every host of the job runs under its launcher. */
export interface Training {
  readonly python: string;
  /** After the script and the job's own arguments: --steps, --width, ... */
  readonly args: readonly string[];
  readonly checkpointBytes: number;
  /** Generation g of the job's process group meets at this port + g. */
  readonly masterPort: number;
  /** The launchers' --hold-timeout, in seconds; their default without it. */
  readonly holdTimeoutS?: number;
}

/** What the arriving job's workers save: they stand in for a tenant, their state is not measured. */
export const OTHER_STATE_BYTES = 2 ** 20;

/** `monkeytree launch`'s arguments after the worker's identity, the same for a replacement. */
export function launchTail(job: ExampleJob, training: Training): string[] {
  return [
    "--checkpoint-bytes",
    String(training.checkpointBytes),
    "--master-port",
    String(training.masterPort),
    ...(training.holdTimeoutS === undefined ? [] : ["--hold-timeout", String(training.holdTimeoutS)]),
    "--",
    training.python,
    "-m",
    "torch.distributed.run",
    "--nproc_per_node",
    String(job.nproc),
    script(job),
    ...(job.args ?? []),
    ...training.args,
  ];
}

/** The launcher of `host`, in the job's group (pipeline stage) `group`. */
export function launcherArgs(job: ExampleJob, host: number, group: number, endpoint: string, tail: readonly string[]): string[] {
  const { dp, pp, tp } = job.parallelism;
  return [
    ...CLI,
    "launch",
    "--job",
    job.name,
    "--host",
    String(host),
    "--group",
    String(group),
    "--dp",
    String(dp),
    "--pp",
    String(pp),
    "--tp",
    String(tp),
    "--connect",
    endpoint,
    "--replacement",
    job.name,
    ...tail,
  ];
}

/** The arriving job's worker program (the demo's loop), without its identity: also its replacement. */
export function otherWorker(job: ExampleJob): string[] {
  return [...WORKER, "--tp", String(job.other.tp), "--state-bytes", String(OTHER_STATE_BYTES), "--step-ms", "50", "--steps", "100000"];
}

/** The arriving job's worker on `host` (the program `worker`), which starts once `gate` exists. */
export function otherArgs(job: ExampleJob, host: number, endpoint: string, gate: string, worker = otherWorker(job)): string[] {
  return [
    ...worker,
    "--controller",
    endpoint,
    "--job",
    "other",
    "--host",
    String(host),
    "--dp",
    String(job.other.hosts.length),
    "--replacement",
    "other",
    "--start-when-exists",
    gate,
  ];
}

/**
 * A daemon's --replacement flags for both jobs, run as `tenant` if any. A daemon passes a
 * replacement none of its own environment, so `env` (the hook's path and the like) goes in the command.
 */
export function replacementFlags(
  job: ExampleJob,
  env: Readonly<Record<string, string>>,
  tail: readonly string[],
  tenant: Tenant | undefined,
  other = otherWorker(job),
): string[] {
  const assignments = Object.entries(env).map(([name, value]) => `${name}=${value}`);
  return [
    "--replacement",
    `${job.name}=${shellCommand(["env", ...assignments, process.execPath, ...CLI, "launch", ...tail])}`,
    "--replacement",
    `other=${shellCommand(["env", ...assignments, process.execPath, ...other])}`,
    ...(tenant ? ["--run-as", tenant.user] : []),
  ];
}

/** Polls `check` every 50 ms until it gives a value; fails when a process of `group` failed or after `timeoutMs`. */
export async function until<T>(group: ProcessGroup, what: string, check: () => Promise<T | undefined> | T | undefined, timeoutMs: number): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (group.failure) throw new Error(`while waiting for ${what}: ${group.failure}`);
    if (performance.now() > deadline) throw new Error(`gave up waiting for ${what} after ${timeoutMs / 1000} s`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * Ends every process whose environment holds `marker` (NAME=VALUE): SIGTERM, SIGKILL to those
 * left after `graceMs` (a known gloo teardown hang keeps some), then removes the staging
 * buffers the killed ones left in /dev/shm.
 */
export async function stopMarked(marker: string, graceMs = 3_000): Promise<void> {
  const settled = async () => {
    const deadline = performance.now() + graceMs;
    while (killByEnvironment(marker, 0).length && performance.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100));
  };
  killByEnvironment(marker, "SIGTERM");
  await settled();
  killByEnvironment(marker);
  await settled();
  removeStaleStagingBuffers();
}

export interface LoopbackOptions {
  readonly dir: string;
  readonly training: Training;
  /**
   * The training processes' environment, replacements included. It must also be in this
   * process's environment (the launchers started here inherit it), and hold one entry unique
   * to this process (`marker`): what the launchers and daemons start outlives them in sessions
   * of their own, and `stop` finds it by that entry.
   */
  readonly env: Readonly<Record<string, string>>;
  readonly marker: string;
  /** Who the daemons run replacements as; undefined: as themselves. */
  readonly tenant: Tenant | undefined;
  readonly timeoutMs: number;
  /** CPUs of its own for each host (`cpusPerHost`); null: every process may run on any CPU. */
  readonly pinned: number | null;
}

/**
 * How many CPUs each host of `job`'s cluster can have to itself, one per training process, as
 * on a cluster, where one host's training never competes with another's; or why it cannot. With
 * fewer CPUs than that, pinning would only trade that competition for less CPU per host.
 */
export function cpusPerHost(job: ExampleJob): number | string {
  const hosts = job.topology.racks * job.topology.hostsPerRack;
  const cpus = availableParallelism();
  if (hosts * job.nproc > cpus) return `${cpus} CPUs are fewer than one per process of the ${hosts} hosts (${hosts * job.nproc})`;
  const probe = spawnSync("taskset", ["-p", String(process.pid)], { encoding: "utf8" });
  return probe.status === 0 ? job.nproc : "taskset (util-linux) is not available";
}

/**
 * Keeps host `host`'s processes on CPUs of its own: set on the daemon and the launcher before
 * they start anything, their replacements, torchrun and its workers inherit it.
 */
function pinHost(managed: Managed, host: number, perHost: number): void {
  const cpus = `${host * perHost}-${(host + 1) * perHost - 1}`;
  spawnSync("taskset", ["-a", "-p", "-c", cpus, String(managed.child.pid)], { stdio: "ignore" });
}

/** Starts the cluster for `job` on loopback (every daemon on 127.0.0.1, any free port); the arriving job waits for `gate`. */
export async function startLoopbackCluster(job: ExampleJob, options: LoopbackOptions) {
  const { dir, training, env } = options;
  const group = new ProcessGroup(dir);
  let client: ControllerClient | undefined;
  const stop = async () => {
    await client?.close();
    // Replacements and torchrun's workers run in sessions of their own, out of the group's reach.
    await Promise.all([group.stopAll(), stopMarked(options.marker)]);
  };
  try {
    const snapshot = join(dir, "topology.json");
    writeFileSync(snapshot, JSON.stringify({ topology: job.topology, jobs: [] }));
    const controller = group.start("controller", [
      ...CLI,
      "controller",
      "--snapshot",
      snapshot,
      "--bind",
      "tcp://127.0.0.1:*",
      "--journal",
      join(dir, "journal"),
    ]);
    const endpoint = (await group.waitFor(controller, /controller listening on (tcp:\/\/\S+)/, options.timeoutMs))[1]!;
    client = new ControllerClient({ endpoint, timeoutMs: 10_000 });
    const tail = launchTail(job, training);
    const hostCount = job.topology.racks * job.topology.hostsPerRack;
    // Room for the job's checkpoint or the other job's, whichever a host receives.
    const staging = Math.max(training.checkpointBytes, OTHER_STATE_BYTES) + 2 ** 20;
    const daemons = Array.from({ length: hostCount }, (_, host) =>
      group.start(`daemon-${host}`, [
        ...CLI,
        "daemon",
        "--host",
        String(host),
        "--connect",
        endpoint,
        "--listen",
        "127.0.0.1:0",
        "--staging-bytes",
        String(staging),
        ...replacementFlags(job, env, tail, options.tenant),
      ]),
    );
    const perHost = options.pinned;
    if (perHost !== null) daemons.forEach((daemon, host) => pinHost(daemon, host, perHost));
    const registered = client;
    await until(
      group,
      "the daemons to register",
      async () => ((await registered.status()).hosts.registered === hostCount ? true : undefined),
      options.timeoutMs,
    );
    const launchers = new Map<number, Managed>();
    job.hosts.forEach((stage, g) =>
      stage.forEach((host) => launchers.set(host, group.start(`${job.name}-${host}`, launcherArgs(job, host, g, endpoint, tail)))),
    );
    if (perHost !== null) launchers.forEach((launcher, host) => pinHost(launcher, host, perHost));
    const gate = join(dir, "other.admitted");
    for (const host of job.other.hosts) group.start(`other-${host}`, otherArgs(job, host, endpoint, gate));
    return { group, client: registered, daemons, launchers, gate, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

export type LoopbackCluster = Awaited<ReturnType<typeof startLoopbackCluster>>;
