import { describe, expect, it } from "vitest";
import type { ControllerClient } from "../../sdk/client/client.ts";
import type { Hold, Order, WorkerIdentity } from "../../sdk/contract/protocol/worker.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";
import { closeControllersAfterEach, connect, INCARNATION, plannedMoves, startController, type Harness } from "./harness.ts";

/**
 * The controller's side of the stop-point agreement (sdk/contract/protocol/README.md), driven by hand:
 * each host is a raw `worker.report`, so every race is set up exactly.
 */

let harness: Harness | undefined;
closeControllersAfterEach();

const dp2 = { tp: 1, pp: 1, dp: 2 };
const worker = (job: string, host: number): WorkerIdentity => ({ job, group: 0, host });

/** Jobs a (hosts 0, 4) and b (1, 5) cross the racks' single uplinks: the plan moves one worker. */
async function plannedStop(client: ControllerClient) {
  await Promise.all([0, 4].map((host) => client.register(worker("a", host), dp2, { checkpointBytes: 1 << 20, timeoutMs: 5_000 })));
  await Promise.all([1, 5].map((host) => client.register(worker("b", host), dp2, { checkpointBytes: 1 << 20, timeoutMs: 5_000 })));
  const move = (await plannedMoves(client))[0]!;
  const hosts = move.job === "a" ? [0, 4] : [1, 5];
  const report = (host: number, step: number, hold: Hold | null, generation = 0): Promise<Order> =>
    client.report({ worker: worker(move.job, host), generation, step, stepMs: 100, hold });
  // This client listens to no pushes, so the stop the controller pushed is lost: the host
  // learns it from the answer to its next report, as one whose push was dropped does.
  const first = await report(hosts[0]!, 0, null);
  if (first.kind !== "stop-at") throw new Error(`expected stop-at, got ${JSON.stringify(first)}`);
  return { move, hosts, report, stop: first.stop, step: first.step, stayer: hosts.find((h) => h !== move.from)! };
}

const moveOf = async (client: ControllerClient, id: string) => (await client.status()).migrations.find((m) => m.id === id)!;

describe("the stop-point agreement, at the controller", { timeout: SAFETY_NET_MS }, () => {
  it("stops the job at the largest step a host holds at, when one had passed the chosen one", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move, hosts, report, stop, step } = await plannedStop(client);
    // One host had passed the stop step: it holds at the next barrier, and says so.
    const later = step + 3;
    expect(await report(hosts[1]!, later - 1, { stop, step: later, phase: "armed" })).toEqual({ kind: "stop-at", stop, step: later });
    expect((await moveOf(client, move.id)).stopStep).toBe(later);
    // The other host, held at the first step, is told to go on to the new one.
    expect(await report(hosts[0]!, step, { stop, step, phase: "held" })).toEqual({ kind: "stop-at", stop, step: later });
    expect((await moveOf(client, move.id)).state).toBe("pausing");
    // A stop never moves earlier.
    expect(await report(hosts[0]!, step, { stop, step: step + 1, phase: "armed" })).toEqual({ kind: "stop-at", stop, step: later });
    // Once every host holds at the agreed step, the move goes on.
    await report(hosts[0]!, later, { stop, step: later, phase: "held" });
    await report(hosts[1]!, later, { stop, step: later, phase: "held" });
    await expect.poll(async () => (await moveOf(client, move.id)).state).not.toBe("pausing");
  });

  it("rolls the move back when a host let go of the stop by itself, and tells the others to train on", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move, hosts, report, stop, step } = await plannedStop(client);
    await report(hosts[0]!, step, { stop, step, phase: "held" });
    expect(await report(hosts[1]!, step, { stop, step, phase: "released" })).toEqual({ kind: "run" });
    const rolled = await moveOf(client, move.id);
    expect(rolled).toMatchObject({ state: "rolled-back", reason: expect.stringContaining(`host ${hosts[1]} let go of stop ${stop} after its hold timeout`) });
    expect(await report(hosts[0]!, step, { stop, step, phase: "held" })).toEqual({ kind: "run" });
  });

  it("commits only once every host of the job sealed its hold", async () => {
    harness = await startController();
    const client = connect(harness);
    const { move, hosts, report, stop, step, stayer } = await plannedStop(client);
    for (const host of hosts) await report(host, step, { stop, step, phase: "held" });
    await client.request({ type: "daemon.register", host: move.to, incarnation: INCARNATION, stagingBytes: 1 << 30, endpoint: "tcp://127.0.0.1:1" });
    expect(await report(move.from, step, { stop, step, phase: "held" })).toMatchObject({ kind: "migrate-out", stop, migration: move.id, step });
    await report(move.from, step, { stop, step, phase: "saved" });
    await client.request({ type: "daemon.transfer-result", host: move.to, token: `token-${move.id}`, bytes: 1 << 20, outcome: "verified" });
    // Verified: every host is asked to seal, and nothing commits before all have.
    expect(await report(stayer, step, { stop, step, phase: "held" })).toEqual({ kind: "seal", stop });
    expect(await report(move.from, step, { stop, step, phase: "saved" })).toEqual({ kind: "seal", stop });
    expect(await report(stayer, step, { stop, step, phase: "sealed" })).toEqual({ kind: "seal", stop });
    expect((await moveOf(client, move.id)).state).toBe("staged");
    // The last seal commits (the answer to that report was decided just before), and the source is told to stop.
    await report(move.from, step, { stop, step, phase: "sealed" });
    expect((await moveOf(client, move.id)).state).toBe("committing");
    expect(await report(move.from, step, { stop, step, phase: "sealed" })).toMatchObject({ kind: "stop" });
    // A sealed stayer waits for the re-formation, not for a release.
    expect(await report(stayer, step, { stop, step, phase: "sealed" })).toEqual({ kind: "seal", stop });
  });

  it("rolls the move back when a host of the job goes silent while it stops", async () => {
    harness = await startController({ overrides: { workerHeartbeatTimeoutMs: 300 } });
    const client = connect(harness);
    const { move, hosts, report, stop, step } = await plannedStop(client);
    await report(hosts[1]!, step, { stop, step, phase: "held" });
    // Host hosts[0] says nothing more; the other keeps reporting while it holds.
    await expect
      .poll(async () => {
        await report(hosts[1]!, step, { stop, step, phase: "held" });
        return (await moveOf(client, move.id)).state;
      })
      .toBe("rolled-back");
    expect((await moveOf(client, move.id)).reason).toContain(`the worker on host ${hosts[0]} went silent while its job stopped`);
    expect(await report(hosts[1]!, step, { stop, step, phase: "held" })).toEqual({ kind: "run" });
  });
});
