import { describe, expect, it } from "vitest";
import { Dealer } from "zeromq";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import type { Directive } from "../../sdk/contract/protocol/worker.ts";
import { runCli } from "../helpers/cli.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";
import { DEFAULT_TIMEOUTS } from "../../controller/service/migration.ts";
import { PlanThread, type PlanRunner } from "../../controller/service/plan-thread.ts";
import { Doubling, Gated, Heedless, RecordingScheduler, Watched } from "./doubles.ts";
import { closeControllersAfterEach, connect, INCARNATION, plannedMoves, startController, type Harness } from "./harness.ts";

let harness: Harness | undefined;
closeControllersAfterEach();

const dp2 = { tp: 1, pp: 1, dp: 2 };

async function startJob(client: ControllerClient, job: string, hosts: number[]): Promise<WorkerClient[]> {
  const workers = hosts.map((host) => new WorkerClient(client, { job, group: 0, host }, dp2, { checkpointBytes: 1 << 20, holdTimeoutMs: 10_000 }));
  await Promise.all(workers.map((w) => w.register(5_000)));
  return workers;
}

/**
 * Waits until every worker was told of the stop its job makes (or the move rolled back before
 * they could be), and returns the stop's step.
 */
async function stopKnown(workers: readonly WorkerClient[], client: ControllerClient): Promise<number> {
  const known = async () => workers.every((w) => w.stop !== null) || (await client.status()).migrations[0]?.state === "rolled-back";
  await expect.poll(known, { timeout: 10_000 }).toBe(true);
  return (await client.status()).migrations[0]!.stopStep!;
}

/** Jobs a (hosts 0, 4) and b (1, 5) both cross the racks' single uplinks: the plan moves one worker. */
async function plannedMove(client: ControllerClient) {
  const a = await startJob(client, "a", [0, 4]);
  const b = await startJob(client, "b", [1, 5]);
  const move = (await plannedMoves(client))[0]!;
  const moving = move.job === "a" ? a : b;
  const step = await stopKnown(moving, client);
  return {
    move,
    moving,
    step,
    source: moving.find((w) => w.worker.host === move.from)!,
    stayer: moving.find((w) => w.worker.host !== move.from)!,
  };
}

/** `plannedMove`, with both workers at its stop step: the stayer waiting there, the source told to migrate out. */
async function movedOut(client: ControllerClient) {
  const planned = await plannedMove(client);
  const stayerBarrier = planned.stayer.barrier(planned.step);
  expect((await planned.source.barrier(planned.step)).kind).toBe("migrate-out");
  return { ...planned, stayerBarrier };
}

/** The destination's daemon registers and reports the checkpoint's verdict. */
async function reportTransfer(
  client: ControllerClient,
  move: { id: string; to: number },
  verdict: { outcome: "verified" } | { outcome: "checksum-mismatch"; detail: string },
) {
  await client.request({ type: "daemon.register", host: move.to, incarnation: INCARNATION, stagingBytes: 1 << 30, endpoint: "tcp://127.0.0.1:1" });
  await client.request({ type: "daemon.transfer-result", host: move.to, token: `token-${move.id}`, bytes: 1 << 20, ...verdict });
}

// Each test waits for its controller's first plan, and so for a planner thread to start.
describe("controller service: a job start that breaks the bound", { timeout: SAFETY_NET_MS }, () => {
  it("pauses the job at one barrier, migrates a worker, and re-forms the job with the new ring order", async () => {
    harness = await startController({ overrides: { stopLeadSteps: 1 } });
    const client = connect(harness);

    // Job a spans racks 0 and 1 (hosts 0 and 4): each rack has fragmentation 1 = λ.
    const a = await startJob(client, "a", [0, 4]);
    expect(a.map((w) => w.assignment?.nodeRank).sort()).toEqual([0, 1]);
    expect(a[0]?.assignment).toMatchObject({ nodes: 2, masterHost: 0, ringOrder: [0, 4], generation: 0, resumeStep: null });
    for (const w of a) expect(await w.barrier(0)).toEqual({ kind: "continue" });

    // Job b also spans both racks: fragmentation 2 > λ = 1, so the controller plans a move.
    const b = await startJob(client, "b", [1, 5]);
    await plannedMoves(client);
    let status = await client.status();
    expect(status.withinBounds).toBe(false);
    // Two rings cross each rack over one uplink: routing cannot isolate them.
    expect(status.routes).toMatchObject({ isolated: false, maxFlowsPerLink: 2 });
    const moves = status.migrations;
    expect(moves).toHaveLength(1);
    const move = moves[0]!;
    expect(move.state).toBe("pausing");
    // The stop step is past the furthest barrier the job's workers reported, plus the lead:
    // the job trains one more step while the destination's replacement starts.
    const moving = move.job === "a" ? a : b;
    const stopStep = await stopKnown(moving, client);
    expect(moving.map((w) => w.stop?.step)).toEqual([stopStep, stopStep]);
    expect(stopStep).toBeGreaterThanOrEqual(1);
    for (const w of moving) for (let step = move.job === "a" ? 1 : 0; step < stopStep; step++) expect(await w.barrier(step)).toEqual({ kind: "continue" });

    // Barriers before the stop step continue; at the stop step the job is held, and the
    // source's held barrier is answered with migrate-out once the destination has staging.
    const source = moving.find((w) => w.worker.host === move.from)!;
    const stayer = moving.find((w) => w.worker.host !== move.from)!;
    const stayerBarrier = stayer.barrier(stopStep);
    const sourceDirective = await source.barrier(stopStep);
    expect(sourceDirective).toEqual({
      kind: "migrate-out",
      migration: move.id,
      to: move.to,
      endpoint: `inproc://staging-${move.to}`,
      token: `token-${move.id}`,
      step: stopStep,
    });
    expect(harness.hosts.prepared).toEqual([
      {
        migration: move.id,
        host: move.to,
        bytes: 1 << 20,
        replacement: { job: move.job, group: 0, parallelism: dp2, place: { nodeRank: expect.any(Number), nodes: 2 }, replacement: null, user: null },
      },
    ]);

    // The source has written its checkpoint and waits at the same barrier for the verdict.
    const sourceVerdict = source.barrier(stopStep);
    const daemon = new Dealer({ linger: 0 });
    daemon.connect(harness.server.endpoint);
    await daemon.send(
      JSON.stringify({
        v: PROTOCOL_VERSION,
        type: "daemon.register",
        id: 1,
        host: move.to,
        incarnation: INCARNATION,
        stagingBytes: 1 << 30,
        endpoint: "tcp://127.0.0.1:1",
      }),
    );
    await daemon.receive();
    await daemon.send(
      JSON.stringify({
        v: PROTOCOL_VERSION,
        type: "daemon.transfer-result",
        id: 2,
        host: move.to,
        token: `token-${move.id}`,
        bytes: 1 << 20,
        outcome: "verified",
      }),
    );
    const [ack] = await daemon.receive();
    expect(JSON.parse(ack!.toString())).toEqual({ v: PROTOCOL_VERSION, type: "ack", id: 2 });
    daemon.close();

    // Verified → committed: the source is told to stop and the destination spawns a replacement.
    expect(await sourceVerdict).toMatchObject({ kind: "stop" });
    await harness.hosts.until(() => harness!.hosts.spawned.length === 1);
    expect(harness.hosts.spawned[0]).toEqual({
      migration: move.id,
      job: move.job,
      group: 0,
      parallelism: dp2,
      place: { nodeRank: expect.any(Number), nodes: 2 },
      replacement: null,
      host: move.to,
      token: `token-${move.id}`,
    });

    // The replacement registers with the token; the job re-forms with a new generation.
    const replacement = new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: `token-${move.id}` });
    const assignment = await replacement.register(5_000);
    // Where it was told it would sit, at staging (before the job stopped) and at the spawn.
    const place = { nodeRank: assignment.nodeRank, nodes: assignment.nodes };
    expect([harness.hosts.prepared[0]!.replacement.place, harness.hosts.spawned[0]!.place]).toEqual([place, place]);
    const reconfigured = (await stayerBarrier) as Extract<Directive, { kind: "reconfigure" }>;
    expect(reconfigured.kind).toBe("reconfigure");
    expect(assignment.generation).toBe(1);
    expect(assignment.resumeStep).toBe(stopStep);
    expect(reconfigured.assignment.generation).toBe(1);
    expect(reconfigured.assignment.ringOrder).toEqual(assignment.ringOrder);
    expect([...assignment.ringOrder].sort()).toEqual([move.to, stayer.worker.host].sort());
    expect(new Set([assignment.nodeRank, reconfigured.assignment.nodeRank])).toEqual(new Set([0, 1]));

    status = await client.status();
    expect(status.migrations[0]?.state).toBe("done");
    expect(status.withinBounds).toBe(true);
    expect(status.routes).toMatchObject({ isolated: true, maxFlowsPerLink: 1 });
    expect(await replacement.barrier(stopStep + 1)).toEqual({ kind: "continue" });
    expect(await stayer.barrier(stopStep + 1)).toEqual({ kind: "continue" });
    // The old source is gone: its report is told to stop.
    expect(await client.report({ worker: source.worker, generation: 0, step: stopStep, stepMs: null, hold: null })).toMatchObject({ kind: "stop" });
  });

  it("pauses the job only once its replacement is ready, holds that registration, and admits it at the commit", async () => {
    harness = await startController({ overrides: { timeouts: { ...DEFAULT_TIMEOUTS, starting: 60_000 } } });
    const client = connect(harness);
    const a = await startJob(client, "a", [0, 4]);
    const b = await startJob(client, "b", [1, 5]);
    const move = (await plannedMoves(client))[0]!;
    const moving = move.job === "a" ? a : b;
    // Staged, the move waits for its replacement to start; the job trains on, told of no stop.
    await expect.poll(async () => (await client.status()).migrations[0]?.state, patiently).toBe("starting");
    for (const w of moving) expect(await w.barrier(1)).toEqual({ kind: "continue" });
    expect(moving.map((w) => w.stop)).toEqual([null, null]);
    // The replacement registers once its processes wait at attach: that is when the job pauses.
    let admitted = false;
    const replacement = new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: `token-${move.id}` });
    const registered = replacement.register(60_000).then((assignment) => ((admitted = true), assignment));
    const step = await stopKnown(moving, client);
    expect(step).toBeGreaterThan(1);
    expect(harness.logs.join("\n")).toContain(`migration ${move.id}: the replacement on host ${move.to} is ready before the commit`);
    const source = moving.find((w) => w.worker.host === move.from)!;
    const stayer = moving.find((w) => w.worker.host !== move.from)!;
    const stayerBarrier = stayer.barrier(step);
    expect((await source.barrier(step)).kind).toBe("migrate-out");
    // The controller holds the registration: no answer until the commit.
    expect(admitted).toBe(false);
    const verdict = source.barrier(step);
    await reportTransfer(client, move, { outcome: "verified" });
    expect(await verdict).toMatchObject({ kind: "stop" });
    expect(await registered).toMatchObject({ generation: 1, resumeStep: step });
    expect(await stayerBarrier).toMatchObject({ kind: "reconfigure" });
    const done = (await client.status()).migrations[0]!;
    expect(done.history.map((h) => h.state)).toEqual([
      "planned",
      "staging",
      "starting",
      "ready",
      "pausing",
      "transferring",
      "verifying",
      "staged",
      "committing",
      "resuming",
      "done",
    ]);
  });

  it("refuses a replacement that registered early once its move rolls back", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move, step, source } = await movedOut(client);
    const replacement = new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: `token-${move.id}` });
    const registered = replacement.register(5_000);
    registered.catch(() => undefined);
    await reportTransfer(client, move, { outcome: "checksum-mismatch", detail: "crc32c 0x1 != 0x2" });
    await expect(registered).rejects.toMatchObject({ code: "invalid_token", message: "the replacement is not needed: its migration rolled back" });
    expect(await source.barrier(step)).toEqual({ kind: "continue" });
  });

  it("sends a rolled-back move's release again once a daemon that did not answer it is heard from", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move } = await movedOut(client);
    harness.hosts.unanswered.add(move.to);
    await reportTransfer(client, move, { outcome: "checksum-mismatch", detail: "crc32c 0x1 != 0x2" });
    const release = { host: move.to, token: `token-${move.id}` };
    await harness.hosts.until(() => harness!.hosts.released.length === 1);
    await expect.poll(() => harness!.logs.join("\n"), patiently).toContain("sending it again once the daemon is heard from");
    expect(harness.hosts.released).toEqual([release]);
    await client.request({ type: "daemon.heartbeat", host: move.to, incarnation: INCARNATION });
    await harness.hosts.until(() => harness!.hosts.released.length === 2);
    expect(harness.hosts.released).toEqual([release, release]);
  });

  it("rolls back when the checksum does not match: the source continues where it stopped", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move, step, source, stayerBarrier } = await movedOut(client);
    const verdict = source.barrier(step);
    await reportTransfer(client, move, { outcome: "checksum-mismatch", detail: "crc32c 0x1 != 0x2" });
    expect(await verdict).toEqual({ kind: "continue" });
    expect(await stayerBarrier).toEqual({ kind: "continue" });
    expect(harness.hosts.released).toEqual([{ host: move.to, token: `token-${move.id}` }]);
    expect(harness.hosts.spawned).toEqual([]);
    const status = await client.status();
    expect(status.migrations[0]).toMatchObject({ state: "rolled-back", reason: expect.stringContaining("checksum mismatch") });
    expect(status.jobs.find((j) => j.id === move.job)?.generation).toBe(0);
    expect(await source.barrier(step + 1)).toEqual({ kind: "continue" });
  });

  it("rolls back when the destination cannot stage, and plans again after the backoff", async () => {
    // The controller's clock stands still unless the test moves it: the backoff ends when the test says.
    let now = Date.now();
    const backoffMs = 30_000;
    harness = await startController({ overrides: { replanBackoffMs: backoffMs, clock: () => now } });
    harness.hosts.refuse.add(2).add(3).add(6).add(7);
    const client = connect(harness);
    const { move, moving, step } = await plannedMove(client);
    const directives = await Promise.all(moving.map((w) => w.barrier(step)));
    expect(directives).toEqual([{ kind: "continue" }, { kind: "continue" }]);
    expect((await client.status()).migrations[0]).toMatchObject({ state: "rolled-back", reason: expect.stringContaining("could not stage") });
    harness.hosts.refuse.clear();
    expect(move.id).toBe("p0/0");
    const moves = async () => (await client.status()).migrations.map((m) => [m.id, m.state]);
    now += backoffMs - 1;
    harness.server.controller.tick();
    expect(await moves()).toEqual([["p0/0", "rolled-back"]]);
    now += 1;
    harness.server.controller.tick();
    await expect.poll(moves, { timeout: 10_000 }).toEqual([["p1/0", "pausing"]]);
  });

  it("rolls back as soon as the move starts when the destination's staging buffer is too small", async () => {
    harness = await startController();
    const client = connect(harness);
    for (const host of [2, 3, 6, 7])
      await client.request({ type: "daemon.register", host, incarnation: INCARNATION, stagingBytes: 1024, endpoint: `tcp://h${host}:1` });
    const { move, moving } = await plannedMove(client);
    // Staging is asked for when the move starts, so the job is not even held at its barrier.
    await expect
      .poll(async () => (await client.status()).migrations[0], { timeout: 10_000 })
      .toMatchObject({
        state: "rolled-back",
        reason: `host ${move.to} stages at most 1024 bytes; the checkpoint has ${1 << 20}`,
      });
    expect(await Promise.all(moving.map((w) => w.barrier(move.stopStep ?? 0)))).toEqual([{ kind: "continue" }, { kind: "continue" }]);
    expect(harness.hosts.prepared).toEqual([]);
  });
});

describe("controller service: keeping the scheduler's books", { timeout: SAFETY_NET_MS }, () => {
  /** A controller under a scheduler, once its first view arrived (before it, nothing is planned). */
  const withScheduler = async (planner?: PlanRunner) => {
    const scheduler = new RecordingScheduler();
    harness = await startController({ overrides: { scheduler, schedulerPollMs: 50, ...(planner ? { planner } : {}) } });
    const client = connect(harness);
    await expect.poll(async () => (await client.status()).scheduler, { timeout: 10_000 }).toBeDefined();
    return { scheduler, client };
  };

  it("holds the destination before staging, and gives the source back once the move commits", async () => {
    const { scheduler, client } = await withScheduler();
    const { move, step, source, stayerBarrier } = await movedOut(client);
    expect(scheduler.calls).toEqual([`hold ${move.job} ${move.id} host ${move.to}`]);
    const verdict = source.barrier(step);
    await reportTransfer(client, move, { outcome: "verified" });
    expect(await verdict).toMatchObject({ kind: "stop" });
    // The hold stays for the worker now on the destination; asked again, it changes nothing.
    await expect
      .poll(() => scheduler.calls, { timeout: 10_000 })
      .toEqual([`hold ${move.job} ${move.id} host ${move.to}`, `hold ${move.job} ${move.id} host ${move.to}`, `give back ${move.job} host ${move.from}`]);
    await new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: `token-${move.id}` }).register(5_000);
    expect(await stayerBarrier).toMatchObject({ kind: "reconfigure" });
  });

  it("releases the hold when the move rolls back", async () => {
    const { scheduler, client } = await withScheduler();
    const { move, step, source } = await movedOut(client);
    const verdict = source.barrier(step);
    await reportTransfer(client, move, { outcome: "checksum-mismatch", detail: "crc32c 0x1 != 0x2" });
    expect(await verdict).toEqual({ kind: "continue" });
    await expect.poll(() => scheduler.calls, { timeout: 10_000 }).toEqual([`hold ${move.job} ${move.id} host ${move.to}`, `release ${move.job} ${move.id}`]);
  });

  it("rolls back before any staging when the scheduler will not hold the destination", async () => {
    const { scheduler, client } = await withScheduler();
    for (const host of [2, 3, 6, 7]) scheduler.refuse.add(host);
    const { move, moving } = await plannedMove(client);
    await expect
      .poll(async () => (await client.status()).migrations[0], { timeout: 10_000 })
      .toMatchObject({
        state: "rolled-back",
        reason: `host ${move.to} could not stage: the scheduler would not hold it (host ${move.to} is reserved for maintenance)`,
      });
    expect(harness!.hosts.prepared).toEqual([]);
    expect(await Promise.all(moving.map((w) => w.barrier(move.stopStep ?? 0)))).toEqual([{ kind: "continue" }, { kind: "continue" }]);
    await expect.poll(() => scheduler.calls, { timeout: 10_000 }).toEqual([`hold ${move.job} ${move.id} host ${move.to}`, `release ${move.job} ${move.id}`]);
  });

  it("counts the scheduler's pinned jobs in fragmentation and shows them, its unavailable hosts and holds", async () => {
    const { scheduler, client } = await withScheduler();
    scheduler.current = {
      pinned: [{ id: "77", rings: 1, hosts: [0, 4] }],
      unavailable: [{ host: 3, why: "drain (fan)" }],
      holds: [{ name: "monkeytree-12-p0-0", job: "12", node: "n6", host: 6 }],
      live: [],
      allocations: [],
    };
    await expect
      .poll(async () => (await client.status()).scheduler, { timeout: 10_000 })
      .toEqual({
        pinned: [{ id: "77", rings: 1, hosts: [0, 4] }],
        unavailable: [{ host: 3, why: "drain (fan)" }],
        holds: [{ name: "monkeytree-12-p0-0", job: "12", node: "n6" }],
      });
    expect((await client.status()).fragmentation).toEqual([1, 1]);
    const text = await runCli("status", "--connect", harness!.server.endpoint);
    expect(text.stdout).toContain(
      [
        "scheduler: 1 pinned jobs, 1 unavailable hosts, 1 holds",
        "pinned job  rings  hosts",
        "        77      1    0 4",
        "unavailable          why",
        "          3  drain (fan)",
        "              hold  job  node",
        "monkeytree-12-p0-0   12    n6",
      ].join("\n"),
    );
  });

  it("plans around the scheduler's pinned jobs: only MonkeyTree's own job moves", async () => {
    const planner = new Gated(new PlanThread());
    const { scheduler, client } = await withScheduler(planner);
    scheduler.current = { ...scheduler.current, pinned: [{ id: "77", rings: 1, hosts: [0, 4] }] };
    await expect.poll(async () => (await client.status()).scheduler?.pinned, { timeout: 10_000 }).toHaveLength(1);
    // Job a crosses the racks beside pinned job 77: moving either of them would do.
    await startJob(client, "a", [1, 5]);
    await expect.poll(() => planner.asked.length, { timeout: 10_000 }).toBe(1);
    const { cluster } = planner.asked[0]!;
    expect(cluster.groups.map((g, i) => ({ job: g.job, movable: g.movable, hosts: cluster.placement[i] }))).toEqual([
      { job: "a", movable: true, hosts: [1, 5] },
      { job: "77", movable: false, hosts: [0, 4] },
    ]);
    planner.asked[0]!.release();
    const moves = await plannedMoves(client);
    expect(moves).toHaveLength(1);
    expect(moves[0]).toMatchObject({ job: "a" });
  });

  it("plans around the scheduler's unavailable hosts", async () => {
    const { scheduler, client } = await withScheduler();
    // Rack 1's free hosts are drained: the one free room left is rack 0's.
    scheduler.current = {
      ...scheduler.current,
      unavailable: [
        { host: 6, why: "drain" },
        { host: 7, why: "drain" },
      ],
    };
    await expect.poll(async () => (await client.status()).scheduler?.unavailable, { timeout: 10_000 }).toHaveLength(2);
    const { move } = await plannedMove(client);
    expect([2, 3]).toContain(move.to);
  });

  it("plans again, rather than apply, a plan computed on a scheduler view that changed meanwhile", async () => {
    const planner = new Gated(new PlanThread());
    const { scheduler, client } = await withScheduler(planner);
    await startJob(client, "a", [0, 4]);
    await startJob(client, "b", [1, 5]);
    await expect.poll(() => planner.asked.length, { timeout: 10_000 }).toBe(1);
    expect(planner.asked[0]!.cluster.unavailable).toEqual([]);
    // While the plan is computed, Slurm drains every free host but 7.
    scheduler.current = { ...scheduler.current, unavailable: [2, 3, 6].map((host) => ({ host, why: "drain" })) };
    await expect.poll(async () => (await client.status()).scheduler?.unavailable, { timeout: 10_000 }).toHaveLength(3);
    planner.asked[0]!.release();
    // The released plan comes once the planner thread has started and computed it.
    await expect.poll(() => harness!.logs.join("\n"), patiently).toContain("plan discarded: the placement changed while it was computed");
    await expect.poll(() => planner.asked.length, { timeout: 10_000 }).toBe(2);
    expect(planner.asked[1]!.cluster.unavailable).toEqual([2, 3, 6]);
    planner.asked[1]!.release();
    expect((await plannedMoves(client)).map((m) => m.to)).toEqual([7]);
  });

  it("never carries out a plan that moves a pinned job", async () => {
    const { scheduler, client } = await withScheduler(new Heedless(new PlanThread()));
    // Two jobs that did not register cross both racks' single uplinks: only moving one of them would help.
    scheduler.current = {
      pinned: [
        { id: "77", rings: 1, hosts: [0, 4] },
        { id: "78", rings: 1, hosts: [1, 5] },
      ],
      unavailable: [],
      holds: [],
      live: [],
      allocations: [],
    };
    await expect
      .poll(() => harness!.logs.join("\n"), patiently)
      .toMatch(/the plan is invalid \(step \d+, move 7[78]\[0\] .*: job "7[78]" is pinned \(movable: false\)\); it is not carried out/);
    const status = await client.status();
    expect(status).toMatchObject({ withinBounds: false, migrations: [] });
    expect(scheduler.calls).toEqual([]);
  });

  it("ends a job the scheduler ran and no longer runs, and stops its workers; never one it did not run", async () => {
    const { scheduler, client } = await withScheduler();
    scheduler.current = { ...scheduler.current, live: ["a"] };
    const a = await startJob(client, "a", [0, 4]);
    await startJob(client, "b", [1, 2]);
    const seen = scheduler.looks;
    // Two more looks: at least one whole look saw job a running.
    await expect.poll(() => scheduler.looks, { timeout: 10_000 }).toBeGreaterThan(seen + 1);
    scheduler.current = { ...scheduler.current, live: [] };
    await expect.poll(async () => (await client.status()).jobs.map((j) => j.id), { timeout: 10_000 }).toEqual(["b"]);
    expect(harness!.logs.join("\n")).toContain("the scheduler reports job a ended; hosts 0, 4 are free");
    expect(await a[0]!.barrier(0)).toMatchObject({ kind: "stop" });
  });

  it("ends a job the scheduler ran that ended while the controller was down", async () => {
    const { scheduler, client } = await withScheduler();
    scheduler.current = { ...scheduler.current, live: ["a"] };
    await startJob(client, "a", [0, 4]);
    await startJob(client, "b", [1, 2]);
    const seen = scheduler.looks;
    await expect.poll(() => scheduler.looks, { timeout: 10_000 }).toBeGreaterThan(seen + 1);
    await client.close();
    // Job a ends while no controller runs; b was never the scheduler's.
    scheduler.current = { ...scheduler.current, live: [] };
    harness = await harness!.restart();
    const after = connect(harness);
    await expect.poll(async () => (await after.status()).jobs.map((j) => j.id), { timeout: 10_000 }).toEqual(["b"]);
    expect(harness.logs.join("\n")).toContain("the scheduler reports job a ended; hosts 0, 4 are free");
  });

  it("holds again a host a committed move brought a running job to, once its hold is lost", async () => {
    const { scheduler, client } = await withScheduler();
    scheduler.current = { ...scheduler.current, live: ["a", "b"] };
    const { move, step, source } = await movedOut(client);
    const verdict = source.barrier(step);
    await reportTransfer(client, move, { outcome: "verified" });
    expect(await verdict).toMatchObject({ kind: "stop" });
    await expect.poll(() => scheduler.calls, { timeout: 10_000 }).toContain(`give back ${move.job} host ${move.from}`);
    // As after slurmctld lost the hold of the worker now on the destination.
    const calls = scheduler.calls.length;
    scheduler.current = { ...scheduler.current, holds: [] };
    await expect.poll(() => scheduler.calls.slice(calls), { timeout: 10_000 }).toEqual([`hold ${move.job} keep-${move.to} host ${move.to}`]);
  });

  it("refuses a registration outside the job's allocation, and holds nothing for a host its allocation lost otherwise", async () => {
    const { scheduler, client } = await withScheduler();
    scheduler.current = { ...scheduler.current, live: ["a"] };
    const outside = client.register({ job: "a", group: 0, host: 6 }, dp2);
    await expect(outside).rejects.toMatchObject({ code: "conflict", message: expect.stringContaining(`host 6 is not in job "a"'s allocation`) });
    await expect(client.register({ job: "a", group: 0, host: 0 }, { tp: 1, pp: 1, dp: 5 })).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining("needs 5 hosts"),
    });
    await expect(client.register({ job: "zz", group: 0, host: 3 }, dp2)).rejects.toMatchObject({
      code: "unknown_job",
      message: expect.stringContaining(`job "zz" is not a job the scheduler runs`),
    });
    await startJob(client, "a", [0, 4]);
    // Its user shrinks the job to host 0 (scontrol update): host 4 is not MonkeyTree's to hold.
    scheduler.current = { ...scheduler.current, allocations: [{ job: "a", hosts: [0] }] };
    const looks = scheduler.looks;
    await expect.poll(() => scheduler.looks, { timeout: 10_000 }).toBeGreaterThan(looks + 2);
    expect(scheduler.calls).toEqual([]);
  });

  it("never names another job, its hosts or its moves in a refusal", async () => {
    const { scheduler, client } = await withScheduler();
    scheduler.current = { ...scheduler.current, allocations: [...scheduler.current.allocations, { job: "c", hosts: [0, 1, 2, 3, 4, 5, 6, 7] }] };
    const { move } = await plannedMove(client);
    const taken = await client.register({ job: "c", group: 0, host: move.from }, dp2).catch((error: unknown) => error);
    expect(taken).toMatchObject({ code: "conflict", message: `host ${move.from} already runs a worker of another job; one worker per host` });
    const incoming = await client.register({ job: "c", group: 0, host: move.to }, dp2).catch((error: unknown) => error);
    expect(incoming).toMatchObject({ code: "conflict", message: `host ${move.to} is the destination of a migration in progress; place the job elsewhere` });
    // The operator's log keeps who.
    expect(harness!.logs.join("\n")).toContain(`(migration ${move.id} of job "${move.job}")`);
  });

  it("never moves a worker onto a host that takes none (an empty slot), even with no scheduler", async () => {
    harness = await startController({ overrides: { unavailable: [2, 3, 6, 7], planner: new Heedless(new PlanThread()) } });
    const client = connect(harness);
    // Every one-move repair needs a free host, and every free host is an empty slot.
    await startJob(client, "a", [0, 4]);
    await startJob(client, "b", [1, 5]);
    await expect
      .poll(() => harness!.logs.join("\n"), patiently)
      .toMatch(/the plan is invalid \(step \d+, move [ab]\[0\] \d→[2367]: the destination is unavailable\); it is not carried out/);
    expect((await client.status()).migrations).toEqual([]);
  });

  it("never carries out a plan that breaks the plan contract, and plans again", async () => {
    harness = await startController({ overrides: { planner: new Doubling(new PlanThread()), replanBackoffMs: 100 } });
    const client = connect(harness);
    await startJob(client, "a", [0, 4]);
    await startJob(client, "b", [1, 5]);
    await expect
      .poll(() => harness!.logs.join("\n"), patiently)
      .toMatch(/the plan is invalid \(step \d+, move [ab]\[0\] \d→\d: the source moves twice in one step\); it is not carried out/);
    // After the backoff the controller plans again (and, with this planner, refuses again).
    await expect.poll(() => harness!.logs.filter((line) => line.includes("it is not carried out")).length, { timeout: 10_000 }).toBeGreaterThan(1);
    expect((await client.status()).migrations).toEqual([]);
  });

  it("plans no move onto an empty slot", async () => {
    harness = await startController({ overrides: { unavailable: [6, 7] } });
    const client = connect(harness);
    const { move } = await plannedMove(client);
    expect([2, 3]).toContain(move.to);
  });

  it("plans nothing before the scheduler's first view", async () => {
    const scheduler = new RecordingScheduler();
    scheduler.silence();
    const planner = new Watched(new PlanThread());
    harness = await startController({ overrides: { scheduler, planner } });
    const client = connect(harness);
    const registering = [startJob(client, "a", [0, 4]), startJob(client, "b", [1, 5])];
    // Until a look says which hosts each job was allocated, registrations wait for it.
    await expect.poll(() => scheduler.looks, { timeout: 10_000 }).toBeGreaterThan(0);
    const status = await client.status();
    expect(status).toMatchObject({ jobs: [], migrations: [] });
    expect(status.scheduler).toBeUndefined();
    expect(planner.asked).toBe(0);
    scheduler.answer();
    await Promise.all(registering);
    expect(await plannedMoves(client)).toHaveLength(1);
  });

  it("asks again for the hold and the give-back of a move that committed before a restart", async () => {
    const { scheduler, client } = await withScheduler();
    const { move, step, source, stayerBarrier } = await movedOut(client);
    stayerBarrier.catch(() => undefined);
    const verdict = source.barrier(step);
    await reportTransfer(client, move, { outcome: "verified" });
    expect(await verdict).toMatchObject({ kind: "stop" });
    const committed = [`hold ${move.job} ${move.id} host ${move.to}`, `hold ${move.job} ${move.id} host ${move.to}`, `give back ${move.job} host ${move.from}`];
    await expect.poll(() => scheduler.calls, { timeout: 10_000 }).toEqual(committed);
    await client.close();
    harness = await harness!.restart();
    await expect
      .poll(() => scheduler.calls, { timeout: 10_000 })
      .toEqual([...committed, `hold ${move.job} ${move.id} host ${move.to}`, `give back ${move.job} host ${move.from}`]);
  });

  it("releases the hold of a move a restart rolled back", async () => {
    const { scheduler, client } = await withScheduler();
    const { move, stayerBarrier } = await movedOut(client);
    stayerBarrier.catch(() => undefined);
    await client.close();
    // The restarted controller gets the same scheduler (the harness keeps its overrides).
    harness = await harness!.restart();
    await expect.poll(() => scheduler.calls, { timeout: 10_000 }).toEqual([`hold ${move.job} ${move.id} host ${move.to}`, `release ${move.job} ${move.id}`]);
  });
});
