import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { parseSnapshot, type Cluster } from "../../controller/planner/model/cluster.ts";
import { createPlanner } from "../../controller/planner/plan/planner.ts";
import { PlanThread, PlanThreadError, type PlanRunner } from "../../controller/service/plan-thread.ts";
import { JOURNAL_FILE } from "../../controller/service/journal.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { nodeArgs } from "../../sdk/contract/paths.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";
import { Gated, Watched } from "./doubles.ts";
import { plannedMoves, SMALL, startController, tempDir, type Harness } from "./harness.ts";

// Planning runs on a worker thread: the controller answers reports while a plan is
// computed, applies a plan only to the placement it was computed for, and outlives a planner
// thread that crashes or hangs.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const dp2 = { tp: 1, pp: 1, dp: 2 };

/** Two racks of four hosts with one uplink each; jobs a and b both cross them: one move fixes it. */
const OVER: Cluster = parseSnapshot({
  topology: SMALL,
  jobs: [
    { id: "a", hosts: [0, 4] },
    { id: "b", hosts: [1, 5] },
  ],
});

function thread(options: ConstructorParameters<typeof PlanThread>[0] = {}): PlanThread {
  const planner = new PlanThread(options);
  cleanups.push(() => planner.close());
  return planner;
}

async function harnessWith(
  planner: PlanRunner,
  overrides: Parameters<typeof startController>[0] = {},
): Promise<{ harness: Harness; client: ControllerClient }> {
  const harness = await startController({ ...overrides, overrides: { planner, ...overrides.overrides } });
  const client = new ControllerClient({ endpoint: harness.server.endpoint, timeoutMs: 10_000, retryMs: 200 });
  cleanups.push(
    () => harness.close(),
    () => client.close(),
  );
  return { harness, client };
}

async function startJob(client: ControllerClient, job: string, hosts: number[], reportIntervalMs?: number): Promise<WorkerClient[]> {
  const workers = hosts.map(
    (host) =>
      new WorkerClient(client, { job, group: 0, host }, dp2, {
        checkpointBytes: 1 << 20,
        holdTimeoutMs: 10_000,
        ...(reportIntervalMs === undefined ? {} : { reportIntervalMs }),
      }),
  );
  await Promise.all(workers.map((w) => w.register(10_000)));
  return workers;
}

const jobsOf = (cluster: Cluster) => [...new Set(cluster.groups.map((g) => g.job))].sort();

// Every test waits for a planner thread to start, which a loaded machine makes slow.
describe("the planner thread", { timeout: SAFETY_NET_MS }, () => {
  it("plans in its thread what the planner plans in process", async () => {
    const planned = await thread().plan(OVER, 2_000);
    const local = (await createPlanner()).plan(OVER, { timeLimitMs: 2_000 });
    expect(planned.status).toBe("optimal");
    expect({ moves: planned.moves, placement: planned.placement }).toEqual({ moves: local.moves, placement: local.placement });
  });

  it("takes one plan at a time", async () => {
    const planner = thread();
    const first = planner.plan(OVER, 2_000);
    await expect(planner.plan(OVER, 2_000)).rejects.toThrow(/still in flight; the planner takes one plan at a time/);
    expect((await first).moveCount).toBe(1);
  });

  it.each([
    ["crash", /the planner thread crashed: the planner thread failed on purpose/],
    ["exit", /the planner thread exited with code 3/],
    ["hang", /did not answer plan #1 within 5100 ms \(its time limit is 100 ms\); it was stopped/],
  ] as const)("fails a plan whose thread does not answer (%s), and plans the next one on a fresh thread", async (mode, error) => {
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const marker = join(dir, "faulted");
    const planner = thread({ entry: [...nodeArgs(import.meta.url, "./fixtures/plan-thread-faulty"), mode, marker], graceMs: 5_000 });
    const failed = planner.plan(OVER, 100);
    await expect(failed).rejects.toThrow(PlanThreadError);
    await expect(failed).rejects.toThrow(error);
    expect(existsSync(marker)).toBe(true);
    expect((await planner.plan(OVER, 2_000)).moveCount).toBe(1);
  });

  it("counts a thread's start apart from the plan's limit, and stops a thread that never loads its planner", async () => {
    const planner = thread({ entry: nodeArgs(import.meta.url, "./fixtures/plan-thread-silent"), startMs: 2_000 });
    await expect(planner.plan(OVER, 100)).rejects.toThrow(/the planner thread did not load the planner within 2000 ms; it was stopped/);
  });

  it("fails a plan in flight when it is closed", async () => {
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const planner = thread({ entry: [...nodeArgs(import.meta.url, "./fixtures/plan-thread-busy"), join(dir, "never")] });
    const refused = expect(planner.plan(OVER, 2_000)).rejects.toThrow(/the controller stopped while a plan was in flight/);
    await planner.close();
    await refused;
    await expect(planner.plan(OVER, 2_000)).rejects.toThrow(/the planner is closed/);
  });
});

describe("the controller while a plan is in flight", { timeout: SAFETY_NET_MS }, () => {
  it("answers another job's reports and status requests while the planner thread works", async () => {
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const release = join(dir, "release");
    // The planner thread keeps planning (real work, a busy thread) until `release` exists.
    const planner = new Watched(new PlanThread({ entry: [...nodeArgs(import.meta.url, "./fixtures/plan-thread-busy"), release], graceMs: 120_000 }));
    const { client } = await harnessWith(planner);
    // Job steady stays inside rack 0 and adds to no rack's fragmentation.
    const steady = await startJob(client, "steady", [2, 3], 50);
    await startJob(client, "a", [0, 4]);
    await startJob(client, "b", [1, 5]);
    await expect.poll(() => planner.inFlight, { timeout: 10_000, interval: 10 }).toBe(true);

    for (let step = 0; step < 5; step++) {
      expect(await Promise.all(steady.map((w) => w.barrier(step)))).toEqual([{ kind: "continue" }, { kind: "continue" }]);
    }
    // The controller hears the steady job's progress from its workers' reports...
    await expect.poll(async () => (await client.status()).jobs.find((j) => j.id === "steady")?.step, { timeout: 10_000 }).toBe(4);
    // ...and answers a report with the worker's order.
    expect(await client.report({ worker: { job: "steady", group: 0, host: 2 }, generation: 0, step: 4, stepMs: null, hold: null })).toEqual({ kind: "run" });
    const status = await client.status();
    expect(status.withinBounds).toBe(false);
    expect(status.migrations).toEqual([]);
    // All of that was answered while the plan was still being computed.
    expect(planner.inFlight).toBe(true);

    writeFileSync(release, "");
    const moves = await plannedMoves(client);
    expect(moves).toHaveLength(1);
    expect(["a", "b"]).toContain(moves[0]?.job);
    expect(planner.asked).toBe(1);
  });

  it("plans again, rather than apply a plan, when a job started or ended while it was computed", async () => {
    const planner = new Gated(thread());
    const { harness, client } = await harnessWith(planner);
    await startJob(client, "a", [0, 4]);
    await startJob(client, "b", [1, 5]);
    await expect.poll(() => planner.asked.length, { timeout: 10_000, interval: 10 }).toBe(1);
    expect(jobsOf(planner.asked[0]!.cluster)).toEqual(["a", "b"]);

    // Job c starts while the first plan is computed: that plan is for a placement gone by.
    await startJob(client, "c", [2, 6]);
    // The released plan comes once the planner thread has started and computed it.
    planner.asked[0]!.release();
    await expect.poll(() => planner.asked.length, { ...patiently, interval: 10 }).toBe(2);
    expect(jobsOf(planner.asked[1]!.cluster)).toEqual(["a", "b", "c"]);

    // Job c ends after the second plan was asked for and before it returns.
    await client.finish("c");
    planner.asked[1]!.release();
    await expect.poll(() => planner.asked.length, { timeout: 10_000, interval: 10 }).toBe(3);
    expect(jobsOf(planner.asked[2]!.cluster)).toEqual(["a", "b"]);
    expect((await client.status()).migrations).toEqual([]);

    planner.asked[2]!.release();
    const moves = await plannedMoves(client);
    expect(moves).toHaveLength(1);
    expect(["a", "b"]).toContain(moves[0]?.job);
    expect(harness.logs.filter((line) => line.includes("plan discarded: the placement changed while it was computed; planning again"))).toHaveLength(2);
    // Only the plan for the placement as it stands was journaled.
    const plans = readFileSync(join(harness.dir, JOURNAL_FILE), "utf8")
      .split("\n")
      .filter((line) => line.includes('"kind":"plan"'));
    expect(plans).toHaveLength(1);
  });

  it("logs a crashed planner thread, keeps answering, and plans on a fresh thread after the backoff", async () => {
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const planner = thread({ entry: [...nodeArgs(import.meta.url, "./fixtures/plan-thread-faulty"), "crash", join(dir, "faulted")] });
    const { harness, client } = await harnessWith(planner, { overrides: { replanBackoffMs: 200 } });
    await startJob(client, "a", [0, 4]);
    await startJob(client, "b", [1, 5]);
    const moves = await plannedMoves(client);
    expect(moves).toHaveLength(1);
    expect(
      harness.logs.some((line) => line.includes("planning failed, trying again later: the planner thread crashed: the planner thread failed on purpose")),
    ).toBe(true);
  });
});
