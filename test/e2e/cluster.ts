import { spawnSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, expect } from "vitest";
import { CLI, ProcessGroup, RUN_TS, type Managed } from "../../cli/demo/processes.ts";
import { launcherArgs, launchTail, otherArgs, otherWorker, replacementFlags } from "../../bench/cluster.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import type { ExampleJob } from "../../bench/example-jobs.ts";
import { createHosts, type Hosts } from "./netns.ts";
import { referenceRun, type TrainResult } from "./reference.ts";
import { PYTHON } from "../helpers/python.ts";
import { tenantDir, TENANT } from "../helpers/tenant.ts";
import { tempDir } from "../service/harness.ts";
import { script } from "../../bench/example-jobs.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/**
 * A cluster of emulated hosts for the migration tests: the controller beside the bridge, a
 * daemon and one `monkeytree launch` per worker in every host's namespace. An example training
 * job trains on its hosts; a second job, gated by a file, arrives on others and pushes racks
 * over their bound, so the controller moves workers.
 */

const FAULT_WORKER = "test/service/fixtures/fault-worker.ts";
/** The environment every training process gets: the hook from the checkout, gloo on the namespace's interface. */
export const TRAIN_ENV = { PYTHONPATH: "sdk/python", GLOO_SOCKET_IFNAME: "eth0", OMP_NUM_THREADS: "1" };

export interface ClusterOptions {
  readonly steps: number;
  /** The other job's worker holds its checkpoint until `<hold>.go` exists (a rollback test). */
  readonly hold?: string;
  /** Short only where a test needs a daemon declared lost. */
  readonly heartbeatTimeoutS?: number;
  /** The launchers' --hold-timeout; their default without it. */
  readonly holdTimeoutS?: number;
  /** The controller's --replan-backoff; its default without it. */
  readonly replanBackoffS?: number;
  /**
   * The controller's --replacement-wait, 60 s without it: a replacement slower than that on a
   * loaded machine is waited for after the commit, so the job still pauses within the tests' polls.
   */
  readonly replacementWaitS?: number;
  /**
   * Runs the controller in this emulated host's namespace (one no job uses) instead of beside
   * the bridge, so that a test can cut it off (`hosts.link(controllerHost, "down")`).
   */
  readonly controllerHost?: number;
}

export async function startCluster(
  hosts: Hosts,
  job: ExampleJob,
  { steps, hold, heartbeatTimeoutS = 10, holdTimeoutS, replanBackoffS, replacementWaitS = 60, controllerHost }: ClusterOptions,
) {
  // Replacements, run as the tenant, write the job's result here too.
  const dir = tenantDir();
  const group = new ProcessGroup(dir);
  const snapshot = join(dir, "topology.json");
  writeFileSync(snapshot, JSON.stringify({ topology: job.topology, jobs: [] }));
  const env = Object.entries(TRAIN_ENV).map(([k, v]) => `${k}=${v}`);
  const inHost = (host: number, args: readonly string[]) => [...hosts.exec(host).slice(1), "env", ...env, process.execPath, ...args];
  // ProcessGroup starts Node programs; `ip netns exec` is started through node's own -e.
  const startIn = (name: string, host: number, args: readonly string[]): Managed =>
    group.start(name, [
      "-e",
      `require("child_process").spawn("ip", ${JSON.stringify(inHost(host, args))}, { stdio: "inherit" }).on("exit", (c, s) => process.exit(c ?? 1))`,
    ]);
  // The bridge joins only this test's namespaces, so the controller may listen there without keys.
  const startController = (bind: string, restarts: number): Managed => {
    const args = [
      ...CLI,
      "controller",
      "--snapshot",
      snapshot,
      "--bind",
      bind,
      "--insecure",
      "--journal",
      join(dir, "journal"),
      "--heartbeat-timeout",
      String(heartbeatTimeoutS),
      ...(replanBackoffS === undefined ? [] : ["--replan-backoff", String(replanBackoffS)]),
      "--replacement-wait",
      String(replacementWaitS),
    ];
    const name = restarts ? `controller-${restarts}` : "controller";
    return controllerHost === undefined ? group.start(name, args) : startIn(name, controllerHost, args);
  };
  let controller = startController(`tcp://${controllerHost === undefined ? hosts.bridgeAddress : hosts.address(controllerHost)}:*`, 0);
  const controllers = [controller];
  const endpoint = (await group.waitFor(controller, /controller listening on (tcp:\/\/\S+)/, SAFETY_NET_MS))[1]!;
  const client = new ControllerClient({ endpoint, timeoutMs: 10_000 });
  let restarts = 0;
  /** Starts the controller again on the same address and journal, as an operator would after a crash. */
  const restartController = async (): Promise<Managed> => {
    controller = startController(endpoint, ++restarts);
    controllers.push(controller);
    await group.waitFor(controller, /controller listening on/, SAFETY_NET_MS);
    return controller;
  };
  const out = join(dir, `${job.name}.json`);
  const tail = launchTail(job, {
    python: PYTHON,
    args: ["--steps", String(steps), "--out", out],
    checkpointBytes: job.checkpointBytes,
    masterPort: 29700,
    ...(holdTimeoutS === undefined ? {} : { holdTimeoutS }),
  });
  const other = hold === undefined ? otherWorker(job) : [RUN_TS, FAULT_WORKER, "--fault", `hold:${hold}`, "--steps", "100000"];
  const hostCount = job.topology.racks * job.topology.hostsPerRack;
  const daemons = Array.from({ length: hostCount }, (_, host) =>
    startIn(`daemon-${host}`, host, [
      ...CLI,
      "daemon",
      "--host",
      String(host),
      "--connect",
      endpoint,
      "--listen",
      `${hosts.address(host)}:0`,
      "--heartbeat",
      "0.1",
      "--staging-bytes",
      String(4 * job.checkpointBytes),
      ...replacementFlags(job, TRAIN_ENV, tail, TENANT, other),
    ]),
  );
  const teardown = async () => {
    await client.close();
    await group.stopAll(2_000);
    hosts.killAll();
  };
  // A safety net only: daemons compiling in several namespaces on a loaded machine are slow.
  await expect
    .poll(async () => (await client.status()).hosts.registered, { ...patiently, interval: 200 })
    .toBe(hostCount)
    .catch(async (error: unknown) => {
      await teardown();
      throw error;
    });
  const launchers = job.hosts.flatMap((stage, g) => stage.map((host) => startIn(`${job.name}-${host}`, host, launcherArgs(job, host, g, endpoint, tail))));
  const gate = join(dir, "other.admitted");
  for (const host of job.other.hosts) startIn(`other-${host}`, host, otherArgs(job, host, endpoint, gate, other));
  const log = (managed: Managed) => readFileSync(managed.log, "utf8");
  /** What every controller of the cluster logged, the first one's first. */
  const controllerLog = () => controllers.map(log).join("");
  return { dir, group, client, controller: () => controller, controllerLog, restartController, daemons, launchers, out, gate, teardown, log };
}

export type Cluster = Awaited<ReturnType<typeof startCluster>>;

/**
 * Stops (SIGSTOP) or continues (SIGCONT) every training process of `job` on the emulated hosts.
 * A test holds training still while the controller plans, so the job cannot end before its
 * move however long a loaded machine takes to plan; to the job it is one slow step.
 */
export function pauseTraining(hosts: Hosts, job: ExampleJob, signal: "SIGSTOP" | "SIGCONT"): number {
  let paused = 0;
  for (const host of job.hosts.flat()) {
    const pids = spawnSync("ip", ["netns", "pids", hosts.namespace(host)], { encoding: "utf8" }).stdout ?? "";
    for (const pid of pids.split(/\s+/).filter(Boolean).map(Number)) {
      let command = "";
      try {
        command = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      } catch {
        continue; // gone meanwhile
      }
      if (!command.includes(script(job)) || command.includes("torch.distributed.run")) continue;
      try {
        process.kill(pid, signal);
        paused++;
      } catch {
        // Gone meanwhile.
      }
    }
  }
  return paused;
}

/**
 * Why move `id` rolled back, from the controller's log once it says so. Status is no witness:
 * it shows only the current plan's moves, and the next plan may replace this one between polls.
 */
export async function rollbackReason(c: Cluster, id: string): Promise<string> {
  const line = new RegExp(`migration ${id.replace(/[^\w]/g, "\\$&")} \\(.*\\): \\S+ → rolled-back on \\S+: (.*)`);
  const reason = () => line.exec(c.controllerLog())?.[1];
  await expect.poll(reason, patiently).toBeDefined();
  return reason()!;
}

/**
 * The moves of `job` whose staging a daemon still holds, as `host h: migration id`, read from
 * the logs: a daemon frees a move's range when the controller releases it, its transfer fails,
 * or the replacement launcher that loaded it exits.
 */
export function stagingLeft(c: Cluster, job: ExampleJob): string[] {
  const ids = new Set([...c.controllerLog().matchAll(new RegExp(`migration (\\S+) \\(${job.name}\\[`, "g"))].map((m) => m[1]!));
  return c.daemons.flatMap((daemon, host) => {
    const log = c.log(daemon);
    const staged = [...log.matchAll(/migration (\S+): staging \d+ bytes/g)].map((m) => m[1]!).filter((id) => ids.has(id));
    const freed = new Set(
      [
        ...log.matchAll(
          /released the staging of migration (\S+)|migration (\S+): (?:transfer failed|replacement launcher exited \([^)]*\); its staging is free)/g,
        ),
      ].map((m) => m[1] ?? m[2]!),
    );
    // Each with what the daemon and the controller said of the move, to tell why.
    const said = (id: string) => [...log.split("\n"), ...c.controllerLog().split("\n")].filter((line) => line.includes(`migration ${id}`));
    return staged.filter((id) => !freed.has(id)).map((id) => [`host ${host}: migration ${id}`, ...said(id)].join("\n  "));
  });
}

/**
 * Waits for the current plan's two moves to be done. Should they end otherwise, the error says
 * why, from the controller's log: a rolled-back move's status is gone by the next plan.
 */
export async function movesDone(c: Cluster): Promise<void> {
  await expect
    .poll(async () => (await c.client.status()).migrations.map((m) => m.state).join(","), { ...patiently, interval: 200 })
    .toMatch(/^done,done$/)
    .catch((error: unknown) => {
      const ends = c
        .controllerLog()
        .split("\n")
        .filter((line) => /→ rolled-back|daemon on host \d+ was lost|registered/.test(line));
      throw new Error(`${(error as Error).message}\n${ends.join("\n")}`);
    });
}

/**
 * Waits until the controller hears every daemon and every registered worker again, as after an
 * outage: TCP's retransmission backoff brings some connections back seconds after others, and a
 * plan made meanwhile cannot use the hosts it has not heard from.
 */
export async function heardFromAll(c: Cluster): Promise<void> {
  const all = async () => {
    const status = await c.client.status();
    return status.hosts.registered === c.daemons.length && status.hosts.lost.length === 0 && status.jobs.every((job) => !job.lost?.length);
  };
  await expect.poll(all, { ...patiently, interval: 200 }).toBe(true);
}

/**
 * For the calling `describe`: `hostCount` emulated hosts and the result of an unmigrated run
 * of `job` for `steps` steps, made before its tests; the hosts and every folder in `dirs`
 * removed after them.
 */
export function hostsAndReference(job: ExampleJob, hostCount: number, steps: number) {
  let hosts: Hosts | undefined;
  let expected: TrainResult | undefined;
  const dirs: string[] = [];
  beforeAll(async () => {
    hosts = createHosts(hostCount);
    const dir = tempDir();
    dirs.push(dir);
    expected = await referenceRun(script(job), job.hosts.flat().length * job.nproc, [...(job.args ?? []), "--steps", String(steps)], dir);
  }, 3 * SAFETY_NET_MS);
  afterAll(() => {
    hosts?.remove();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });
  return {
    get hosts(): Hosts {
      return hosts!;
    },
    get expected(): TrainResult {
      return expected!;
    },
    dirs,
  };
}
