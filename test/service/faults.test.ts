import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { CLI, ProcessGroup, RUN_TS, sharedFile, shellCommand, WORKER, type Managed } from "../../cli/demo/processes.ts";
import { TENANT, tenantDir } from "../helpers/tenant.ts";
import { readEvents } from "../../cli/demo/events.ts";
import { digest, initialState, seedOf, trainStep } from "../../cli/demo/model.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import type { StatusReport } from "../../sdk/contract/protocol/status.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";
import { tempDir } from "./harness.ts";

/**
 * Failures with every part in its own process: the controller, a daemon per host, and the
 * workers. Two racks of two hosts with one uplink each: jobs a (hosts 0, 2) and b (1, 3) both
 * cross it, so the controller must swap two workers, and each test breaks that swap.
 */

const FAULT_WORKER = "test/service/fixtures/fault-worker.ts";
type MigrationSummary = StatusReport["migrations"][number];
const TOPOLOGY = { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 };
/**
 * The demo workers' iterations, and the one before which the first of them wait for the swap.
 * The controller puts a stop past the step it projects its job's hosts reached (their last
 * report, plus the steps their step time says they trained since): for workers that paused, a
 * few steps past the pause, more when their reports come late on a loaded machine. The job
 * must still be training there.
 */
const [STEPS, PAUSE_AT] = [60, 10];
/** The iteration before which a test's workers wait for the jobs to re-form, past any stop step. */
const REFORMED_AT = 40;

interface Cluster {
  readonly dir: string;
  readonly group: ProcessGroup;
  readonly endpoint: string;
  readonly client: ControllerClient;
  controller: Managed;
  readonly daemons: Managed[];
  /** SIGKILLs the controller and starts a new one on the same address and journal. */
  restartController(): Promise<void>;
}

const teardown: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const step of teardown.splice(0).reverse()) await step();
});

/**
 * The controller and a daemon per host, whose replacements are these Node programs by name (by
 * default the fault worker, which the fault tests' jobs name). `heartbeatTimeoutS` is the
 * controller's `--heartbeat-timeout`, which also bounds how long a restarted one waits for the
 * daemons; it is long unless a test needs a daemon declared lost, so that no daemon a test
 * keeps running can miss it on a loaded machine.
 */
async function startCluster({
  heartbeatTimeoutS = 10,
  replacements = { fault: [RUN_TS, FAULT_WORKER] },
}: { heartbeatTimeoutS?: number; replacements?: Record<string, readonly string[]> } = {}): Promise<Cluster> {
  const dir = tempDir();
  const group = new ProcessGroup(dir);
  teardown.push(() => rmSync(dir, { recursive: true, force: true }));
  teardown.push(() => group.stopAll(1_000));
  const snapshot = join(dir, "topology.json");
  writeFileSync(snapshot, JSON.stringify({ topology: TOPOLOGY, jobs: [] }));
  const startController = async (bind: string) => {
    const controller = group.start("controller", [
      ...CLI,
      "controller",
      "--snapshot",
      snapshot,
      "--bind",
      bind,
      "--journal",
      join(dir, "journal"),
      "--heartbeat-timeout",
      String(heartbeatTimeoutS),
    ]);
    return { controller, endpoint: (await group.waitFor(controller, /controller listening on (tcp:\/\/\S+)/, SAFETY_NET_MS))[1]! };
  };
  const { controller, endpoint } = await startController("tcp://127.0.0.1:*");
  const client = new ControllerClient({ endpoint, timeoutMs: 10_000, retryMs: 200 });
  teardown.push(() => client.close());
  group.controller = endpoint;
  const replacementFlags = Object.entries(replacements).flatMap(([name, args]) => ["--replacement", `${name}=${shellCommand([process.execPath, ...args])}`]);
  const daemons = [0, 1, 2, 3].map((host) =>
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
      String(160 * 2 ** 20),
      "--heartbeat",
      "0.1",
      ...replacementFlags,
      ...(TENANT ? ["--run-as", TENANT.user] : []),
    ]),
  );
  await expect.poll(async () => (await client.status()).hosts.registered, patiently).toBe(4);
  const cluster: Cluster = {
    dir,
    group,
    endpoint,
    client,
    controller,
    daemons,
    async restartController() {
      group.kill(cluster.controller, "SIGKILL");
      await cluster.controller.exited;
      cluster.controller = (await startController(endpoint)).controller;
    },
  };
  return cluster;
}

const started = (cluster: Cluster, job: string) => async () => (await cluster.client.status()).jobs.some((j) => j.id === job && j.started);
const log = (managed: Managed) => readFileSync(managed.log, "utf8");

/** Starts jobs a and b with the fault worker; b's arrival makes the controller plan the swap. */
async function startFaultJobs(cluster: Cluster, fault: (host: number, job: string) => string[]): Promise<Map<number, Managed>> {
  const workers = new Map<number, Managed>();
  const start = (job: string, hosts: number[]) => {
    for (const host of hosts) {
      workers.set(
        host,
        cluster.group.start(`${job}-${host}`, [
          RUN_TS,
          FAULT_WORKER,
          "--controller",
          cluster.endpoint,
          "--job",
          job,
          "--host",
          String(host),
          "--dp",
          "2",
          "--replacement",
          "fault",
          ...fault(host, job),
        ]),
      );
    }
  };
  start("a", [0, 2]);
  await expect.poll(started(cluster, "a"), patiently).toBe(true);
  start("b", [1, 3]);
  return workers;
}

describe("faults with real processes", () => {
  it(
    "rolls back when the source dies mid-transfer: the destination reports it, the stayer continues",
    async () => {
      const cluster = await startCluster();
      // Only b's moving worker dies; 128 MiB on one stream are still on the wire when it does.
      const workers = await startFaultJobs(cluster, (_, job) => (job === "b" ? ["--fault", "die-mid-transfer", "--bytes", String(128 * 2 ** 20)] : []));
      const controllerLog = () => log(cluster.controller);
      await expect.poll(() => controllerLog().match(/→ rolled-back/g)?.length ?? 0, patiently).toBe(2);

      const [source, sourceWorker] = [...workers].find(([, w]) => w.name.startsWith("b") && /migrate-out/.test(log(w)))!;
      expect(await sourceWorker.exited).toBe("SIGKILL");
      // The source's bytes stopped arriving: the destination's daemon reported the failed transfer.
      const [, migration, destination, step] = /migrate-out (\S+) to (\d+) at (\d+)/.exec(log(sourceWorker))!;
      expect(controllerLog()).toContain(
        `migration ${migration} (${sourceWorker.name[0]}[0] ${source}→${destination}): transferring → rolled-back on fail: transfer to host ${destination} failed: peer_closed`,
      );
      expect(log(cluster.daemons[Number(destination)]!)).toMatch(new RegExp(`migration ${migration}: transfer failed \\(peer_closed`));
      // The job's other worker was held at the stop step and is released where it stopped.
      const stayer = [...workers].find(([host, w]) => host !== source && w.name[0] === sourceWorker.name[0])![1];
      await expect.poll(() => log(stayer), patiently).toMatch(new RegExp(`continue at ${step}`));
      expect(controllerLog()).not.toMatch(/lost: no heartbeat/);
    },
    3 * SAFETY_NET_MS,
  );

  it(
    "rolls back when the destination's daemon is killed before the checkpoint arrives: the source continues",
    async () => {
      // Short, since the killed daemon must be declared lost; the others beat ten times as often,
      // and time the controller itself is blocked counts toward no daemon's silence.
      const cluster = await startCluster({ heartbeatTimeoutS: 1 });
      const hold = (host: number) => join(cluster.dir, `hold-${host}`);
      const workers = await startFaultJobs(cluster, (host) => ["--fault", `hold:${hold(host)}`]);
      await expect.poll(() => readdirSync(cluster.dir).some((f) => f.endsWith(".ticket")), { ...patiently, interval: 50 }).toBe(true);
      const held = [0, 1, 2, 3].find((host) => existsSync(`${hold(host)}.ticket`))!;
      const destination = Number(readFileSync(`${hold(held)}.ticket`, "utf8"));
      cluster.group.kill(cluster.daemons[destination]!, "SIGKILL");
      await cluster.daemons[destination]!.exited;
      for (const host of [0, 1, 2, 3]) writeFileSync(`${hold(host)}.go`, "");

      const source = workers.get(held)!;
      await expect.poll(() => log(source), patiently).toMatch(/send failed: .*\n(continue|reconfigure) at \d+/);
      expect(log(source)).not.toMatch(/stop at/);
      expect(log(cluster.controller)).toMatch(new RegExp(`rolled-back on fail: the daemon on host ${destination} was lost`));
      expect(log(cluster.controller).match(/lost: no heartbeat/g)).toHaveLength(1);
      // Nothing of the rolled-back move stays behind: the source is still registered and answered.
      expect((await cluster.client.status()).jobs.map((j) => j.id).sort()).toEqual(["a", "b"]);
    },
    3 * SAFETY_NET_MS,
  );

  it(
    "rolls back a swap cut by a controller SIGKILL before it committed: the destinations release their staging and the sources continue",
    async () => {
      // Long enough for the daemons to register with the restarted controller; no daemon is lost here.
      const cluster = await startCluster();
      const hold = (host: number) => join(cluster.dir, `hold-${host}`);
      const workers = await startFaultJobs(cluster, (host) => ["--fault", `hold:${hold(host)}`]);
      // Both sources got migrate-out and hold their checkpoints: the swap cannot commit.
      await expect.poll(() => readdirSync(cluster.dir).filter((f) => f.endsWith(".ticket")).length, { ...patiently, interval: 50 }).toBe(2);
      const moves = (await cluster.client.status()).migrations;
      expect(moves.map((m) => m.state)).toEqual(["transferring", "transferring"]);

      await cluster.restartController();
      const restarted = "the controller restarted before the move committed";
      await expect
        .poll(async () => (await cluster.client.status()).migrations.map((m) => [m.id, m.state, m.reason]), patiently)
        .toEqual(moves.map((m) => [m.id, "rolled-back", restarted]));
      // Each destination's daemon releases its staging once it has registered with the new
      // controller (a replacement it started at prepare, refused and gone, does not free it).
      for (const m of moves) await expect.poll(() => log(cluster.daemons[m.to]!), patiently).toContain(`released the staging of migration ${m.id}`);
      for (const host of [0, 1, 2, 3]) writeFileSync(`${hold(host)}.go`, "");
      // Their tickets admit nothing any more: each source keeps its checkpoint and continues at its stop step.
      for (const m of moves) {
        await expect.poll(() => log(workers.get(m.from)!), patiently).toMatch(new RegExp(`send failed: .*\ncontinue at ${m.stopStep}\n`));
      }
      expect(log(cluster.controller)).not.toMatch(/releasing staging on host|lost: no heartbeat/);
    },
    3 * SAFETY_NET_MS,
  );

  it(
    "finishes a swap cut by a controller SIGKILL after it committed: the replacements resume and every job ends bit-identical",
    async () => {
      const events = tenantDir();
      teardown.push(() => rmSync(events, { recursive: true, force: true }));
      for (const job of ["a", "b"]) sharedFile(join(events, `${job}.jsonl`), TENANT);
      const pace = ["--steps", String(STEPS), "--step-ms", "80", "--report-ms", "100", "--events", events];
      // Every worker of the re-formed jobs waits before iteration REFORMED_AT until the restarted
      // controller has seen the jobs re-form: on a loaded machine the restart can outlast the
      // training left, and a job that ended while no controller ran is never seen re-forming.
      const reformed = join(events, "reformed");
      const gate = ["--pause-at", String(REFORMED_AT), "--resume-when-exists", reformed];
      const cluster = await startCluster({ replacements: { "demo-worker": [...WORKER, ...pace, ...gate] } });
      const stateBytes = 8 * 2 ** 20;
      // A job that reached its last barrier before its stop step never stops, and its move never
      // goes on. However long the first plan takes, the first workers wait before iteration
      // PAUSE_AT until both moves have their stop step, which their reports put shortly after it.
      const swapStarted = join(cluster.dir, "swap-started");
      for (const [job, hosts] of [
        ["a", [0, 2]],
        ["b", [1, 3]],
      ] as const) {
        for (const host of hosts) {
          cluster.group.start(`${job}-${host}`, [
            ...WORKER,
            "--controller",
            cluster.endpoint,
            "--job",
            job,
            "--host",
            String(host),
            "--tp",
            "1",
            "--dp",
            "2",
            "--state-bytes",
            String(stateBytes),
            "--replacement",
            "demo-worker",
            ...pace,
            "--pause-at",
            String(PAUSE_AT),
            "--resume-when-exists",
            swapStarted,
            ...gate,
          ]);
        }
      }
      const stopStepsSet = (moves: MigrationSummary[]) => moves.length > 0 && moves.every((m) => m.stopStep !== null);
      await expect.poll(async () => (await cluster.client.status()).migrations, patiently).toSatisfy(stopStepsSet);
      for (const m of (await cluster.client.status()).migrations) expect(m.stopStep).toBeLessThan(REFORMED_AT);
      writeFileSync(swapStarted, "");

      // The cut comes once every move of the swap is journaled as committed: from then on the
      // swap can only be finished, wherever it is when the controller dies.
      let cut: MigrationSummary[] = [];
      const committed = (moves: MigrationSummary[]) => moves.length > 0 && moves.every((m) => ["committing", "resuming", "done"].includes(m.state));
      await expect
        .poll(
          async () => {
            cut = (await cluster.client.status()).migrations;
            return cut;
          },
          { ...patiently, interval: 10 },
        )
        .toSatisfy(committed);
      await cluster.restartController();

      await expect
        .poll(async () => (await cluster.client.status()).migrations.map((m) => [m.id, m.state, m.reason]), patiently)
        .toEqual(cut.map((m) => [m.id, "done", null]));
      writeFileSync(reformed, "");
      const jobEvents = (job: string) => {
        const path = join(events, `${job}.jsonl`);
        return existsSync(path) ? readEvents(readFileSync(path, "utf8"), path) : [];
      };
      const finished = (job: string) => jobEvents(job).flatMap((e) => (e.event === "finished" ? [e] : []));
      await expect.poll(() => finished("a").length + finished("b").length, patiently).toBe(4);
      const placement = (await cluster.client.status()).jobs;
      for (const job of ["a", "b"]) {
        // Each moved worker's replacement loaded its checkpoint and finished the job on its new host.
        for (const m of cut.filter((x) => x.job === job))
          expect(jobEvents(job)).toContainEqual(expect.objectContaining({ event: "resumed", migration: m.id, host: m.to }));
        expect(
          finished(job)
            .map((e) => e.host)
            .sort(),
          `job ${job}`,
        ).toEqual(placement.find((j) => j.id === job)?.hosts);
        const reference = initialState(seedOf(job), stateBytes);
        for (let step = 0; step < STEPS; step++) trainStep(reference);
        expect(
          finished(job).map((e) => e.digest),
          `job ${job} after a cut in ${cut.map((m) => m.state).join(", ")}`,
        ).toEqual([digest(reference), digest(reference)]);
      }
      // The new controller took its jobs and the cut migration from the journal, not from scratch.
      expect(log(cluster.controller)).toMatch(/replayed \d+ records, 2 jobs/);
    },
    3 * SAFETY_NET_MS,
  );
});
