import { afterEach, describe, expect, it } from "vitest";
import { Dealer } from "zeromq";
import { ControllerClient, WorkerClient } from "../../sdk/client.ts";
import type { Directive } from "../../sdk/protocol/worker.ts";
import { INCARNATION, plannedMoves, startController, type Harness } from "./harness.ts";

let harness: Harness | undefined;
const clients: ControllerClient[] = [];

afterEach(async () => {
  await Promise.all(clients.splice(0).map((c) => c.close()));
  await harness?.close();
  harness = undefined;
});

function connect(h: Harness, timeoutMs = 5_000): ControllerClient {
  const client = new ControllerClient({ endpoint: h.server.endpoint, timeoutMs, retryMs: 200 });
  clients.push(client);
  return client;
}

const dp2 = { tp: 1, pp: 1, dp: 2 };

async function startJob(client: ControllerClient, job: string, hosts: number[]): Promise<WorkerClient[]> {
  const workers = hosts.map((host) => new WorkerClient(client, { job, group: 0, host }, dp2, { checkpointBytes: 1 << 20, barrierTimeoutMs: 10_000 }));
  await Promise.all(workers.map((w) => w.register(5_000)));
  return workers;
}

/** Jobs a (hosts 0, 4) and b (1, 5) both cross the racks' single uplinks: the plan moves one worker. */
async function plannedMove(client: ControllerClient) {
  const a = await startJob(client, "a", [0, 4]);
  const b = await startJob(client, "b", [1, 5]);
  const move = (await plannedMoves(client))[0]!;
  const moving = move.job === "a" ? a : b;
  return {
    move,
    moving,
    step: move.stopStep!,
    source: moving.find((w) => w.worker.host === move.from)!,
    stayer: moving.find((w) => w.worker.host !== move.from)!,
  };
}

/** The destination's daemon registers and reports the checkpoint's verdict. */
async function reportTransfer(client: ControllerClient, move: { id: string; to: number }, verdict: { outcome: "verified" } | { outcome: "checksum-mismatch"; detail: string }) {
  await client.request({ type: "daemon.register", host: move.to, incarnation: INCARNATION, stagingBytes: 1 << 30, endpoint: "tcp://127.0.0.1:1" });
  await client.request({ type: "daemon.transfer-result", host: move.to, token: `token-${move.id}`, bytes: 1 << 20, ...verdict });
}

describe("controller service: a job start that breaks the bound", () => {
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
    // The stop step is the first barrier no worker of the job has reported yet, plus the
    // lead: the job trains one more step while the destination's replacement starts.
    const moving = move.job === "a" ? a : b;
    const stopStep = move.job === "a" ? 2 : 1;
    expect(move.stopStep).toBe(stopStep);
    for (const w of moving) expect(await w.barrier(stopStep - 1)).toEqual({ kind: "continue" });

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
    expect(harness.hosts.prepared).toEqual([{ migration: move.id, host: move.to, bytes: 1 << 20, replacement: { job: move.job, group: 0, parallelism: dp2, replacement: null } }]);

    // The source has written its checkpoint and waits at the same barrier for the verdict.
    const sourceVerdict = source.barrier(stopStep);
    const daemon = new Dealer({ linger: 0 });
    daemon.connect(harness.server.endpoint);
    await daemon.send(JSON.stringify({ v: 1, type: "daemon.register", id: 1, host: move.to, incarnation: INCARNATION, stagingBytes: 1 << 30, endpoint: "tcp://127.0.0.1:1" }));
    await daemon.receive();
    await daemon.send(JSON.stringify({ v: 1, type: "daemon.transfer-result", id: 2, host: move.to, token: `token-${move.id}`, bytes: 1 << 20, outcome: "verified" }));
    const [ack] = await daemon.receive();
    expect(JSON.parse(ack!.toString())).toEqual({ v: 1, type: "ack", id: 2 });
    daemon.close();

    // Verified → committed: the source is told to stop and the destination spawns a replacement.
    expect(await sourceVerdict).toMatchObject({ kind: "stop" });
    await harness.hosts.until(() => harness!.hosts.spawned.length === 1);
    expect(harness.hosts.spawned[0]).toEqual({ migration: move.id, job: move.job, group: 0, parallelism: dp2, replacement: null, host: move.to, token: `token-${move.id}` });

    // The replacement registers with the token; the job re-forms with a new generation.
    const replacement = new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: `token-${move.id}` });
    const assignment = await replacement.register(5_000);
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
    // The old source is gone: its barrier is told to stop.
    expect(await client.barrier(source.worker, stopStep + 1, 0)).toMatchObject({ kind: "stop" });
  });

  it("holds a replacement that registers before its move commits, and admits it at the commit", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move, step, source, stayer } = await plannedMove(client);
    const stayerBarrier = stayer.barrier(step);
    expect((await source.barrier(step)).kind).toBe("migrate-out");
    // Started at prepare, the replacement calls in while the checkpoint is still on its way.
    let admitted = false;
    const replacement = new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: `token-${move.id}` });
    const registered = replacement.register(5_000).then((assignment) => ((admitted = true), assignment));
    // The controller has the registration and holds it: no answer until the commit.
    await expect.poll(() => harness!.logs.join("\n"), { timeout: 10_000 }).toContain(`migration ${move.id}: the replacement on host ${move.to} is up before the commit`);
    expect(admitted).toBe(false);
    const verdict = source.barrier(step);
    await reportTransfer(client, move, { outcome: "verified" });
    expect(await verdict).toMatchObject({ kind: "stop" });
    expect(await registered).toMatchObject({ generation: 1, resumeStep: step });
    expect(await stayerBarrier).toMatchObject({ kind: "reconfigure" });
    expect((await client.status()).migrations[0]?.state).toBe("done");
  });

  it("refuses a replacement that registered early once its move rolls back", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move, step, source, stayer } = await plannedMove(client);
    void stayer.barrier(step);
    expect((await source.barrier(step)).kind).toBe("migrate-out");
    const replacement = new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: `token-${move.id}` });
    const registered = replacement.register(5_000);
    registered.catch(() => undefined);
    await reportTransfer(client, move, { outcome: "checksum-mismatch", detail: "crc32c 0x1 != 0x2" });
    await expect(registered).rejects.toMatchObject({ code: "invalid_token", message: "the replacement is not needed: its migration rolled back" });
    expect(await source.barrier(step)).toEqual({ kind: "continue" });
  });

  it("rolls back when the checksum does not match: the source continues where it stopped", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move, step, source, stayer } = await plannedMove(client);
    const stayerBarrier = stayer.barrier(step);
    expect((await source.barrier(step)).kind).toBe("migrate-out");
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
    for (const host of [2, 3, 6, 7]) await client.request({ type: "daemon.register", host, incarnation: INCARNATION, stagingBytes: 1024, endpoint: `tcp://h${host}:1` });
    const { move, moving } = await plannedMove(client);
    // Staging is asked for when the move starts, so the job is not even held at its barrier.
    await expect.poll(async () => (await client.status()).migrations[0], { timeout: 10_000 }).toMatchObject({
      state: "rolled-back",
      reason: `host ${move.to} stages at most 1024 bytes; the checkpoint has ${1 << 20}`,
    });
    expect(await Promise.all(moving.map((w) => w.barrier(move.stopStep ?? 0)))).toEqual([{ kind: "continue" }, { kind: "continue" }]);
    expect(harness.hosts.prepared).toEqual([]);
  });
});
