import { closeSync, openSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { JOURNAL_FILE, readJournal } from "../../controller/service/journal.ts";
import { BindError } from "../../sdk/contract/errors.ts";
import { Dealer } from "zeromq";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerError, type ControllerClient } from "../../sdk/client/client.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";
import { closeControllersAfterEach, connect, INCARNATION, plannedMoves, startController, type Harness } from "./harness.ts";

let harness: Harness | undefined;
const sockets: Dealer[] = [];
closeControllersAfterEach();
// After-hooks run last-registered first: raw sockets close before the controller.
afterEach(() => {
  for (const s of sockets.splice(0)) s.close();
});

/** A raw DEALER that sends frames as given and reads one reply. */
function raw(h: Harness): { ask(...frames: string[]): Promise<Record<string, unknown>> } {
  const socket = new Dealer({ linger: 0, receiveTimeout: 5_000 });
  socket.connect(h.server.endpoint);
  sockets.push(socket);
  return {
    ask: async (...frames) => {
      await socket.send(frames);
      const [reply] = await socket.receive();
      return JSON.parse(reply!.toString()) as Record<string, unknown>;
    },
  };
}

const dp2 = { tp: 1, pp: 1, dp: 2 };

/** Waits until every worker was told of the stop its job makes, and returns the stop's step. */
async function stopKnown(workers: readonly WorkerClient[], client: ControllerClient): Promise<number> {
  await expect.poll(() => workers.every((w) => w.stop !== null), { timeout: 10_000 }).toBe(true);
  return (await client.status()).migrations[0]!.stopStep!;
}

describe("controller service", () => {
  it("answers barriers with continue at once when nothing is pending", async () => {
    harness = await startController();
    const client = connect(harness);
    const workers = [0, 1].map((host) => new WorkerClient(client, { job: "a", group: 0, host }, dp2, { reportIntervalMs: 50 }));
    const assignments = await Promise.all(workers.map((w) => w.register(5_000)));
    expect(assignments.map((a) => a.nodeRank)).toEqual([0, 1]);
    for (let step = 0; step < 20; step++) {
      expect(await Promise.all(workers.map((w) => w.barrier(step)))).toEqual([{ kind: "continue" }, { kind: "continue" }]);
    }
    // The workers' reports, not their barriers, tell the controller how far the job got.
    await expect.poll(async () => (await client.status()).jobs[0]?.step, { timeout: 10_000 }).toBe(19);
    const status = await client.status();
    expect(status.jobs).toEqual([{ id: "a", hosts: [0, 1], expected: 2, started: true, generation: 0, step: 19, stepSeconds: expect.any(Number) }]);
    expect(status.migrations).toEqual([]);
    for (const w of workers) w.close();
  });

  it("rejects malformed messages with error replies and keeps serving", async () => {
    harness = await startController();
    const peer = raw(harness);
    expect(await peer.ask("{oops")).toMatchObject({ v: PROTOCOL_VERSION, type: "error", id: 0, code: "malformed" });
    expect(await peer.ask(JSON.stringify({ v: 7, type: "status", id: 11 }))).toMatchObject({
      type: "error",
      id: 11,
      code: "unsupported_version",
      message: expect.stringContaining(`protocol version 7 is not supported: this controller speaks version ${PROTOCOL_VERSION}`),
    });
    // A launcher of the previous release (version 1) is refused the same way.
    expect(
      await peer.ask(JSON.stringify({ v: 1, type: "worker.barrier", id: 15, worker: { job: "a", group: 0, host: 0 }, step: 0, generation: 0 })),
    ).toMatchObject({
      type: "error",
      id: 15,
      code: "unsupported_version",
    });
    expect(await peer.ask(JSON.stringify({ v: PROTOCOL_VERSION, type: "nonsense", id: 12 }))).toMatchObject({ type: "error", id: 12, code: "unknown_type" });
    expect(await peer.ask(JSON.stringify({ v: PROTOCOL_VERSION, type: "worker.report", id: 13, worker: { job: "a" } }))).toMatchObject({
      type: "error",
      id: 13,
      code: "malformed",
    });
    expect(await peer.ask("a", "b", "c")).toMatchObject({
      type: "error",
      code: "malformed",
      message: expect.stringContaining("at most an auth frame, got 3 frames"),
    });
    expect(
      await peer.ask(
        JSON.stringify({
          v: PROTOCOL_VERSION,
          type: "worker.report",
          id: 14,
          worker: { job: "ghost", group: 0, host: 0 },
          generation: 0,
          step: 0,
          stepMs: null,
          hold: null,
        }),
      ),
    ).toMatchObject({
      type: "error",
      id: 14,
      code: "unknown_job",
    });
    const status = await connect(harness).status();
    expect(status.journalRecords).toBe(1);
    expect(harness.logs.filter((l) => l.includes("rejected a message")).length).toBe(6);
  });

  it("refuses an address it cannot bind with a BindError naming the address and ZeroMQ's reason", async () => {
    harness = await startController();
    const taken = harness.server.endpoint;
    const dir = join(harness.dir, "second");
    const second = startController({ dir, overrides: { bind: taken } });
    await expect(second).rejects.toBeInstanceOf(BindError);
    await expect(second).rejects.toMatchObject({
      address: taken,
      reason: "Address already in use",
      message: `cannot bind ${taken}: Address already in use; pick another --bind address`,
    });
  });

  it("refuses conflicting registrations, naming the rule", async () => {
    harness = await startController();
    const client = connect(harness);
    const first = client.register({ job: "a", group: 0, host: 0 }, dp2);
    await expect(client.register({ job: "b", group: 0, host: 0 }, dp2)).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining("host 0 already runs a worker of another job"),
    });
    await expect(client.register({ job: "a", group: 0, host: 1 }, { tp: 2, pp: 1, dp: 2 })).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining("every worker of a job must agree"),
    });
    await expect(client.register({ job: "a", group: 1, host: 1 }, dp2)).rejects.toMatchObject({
      code: "malformed",
      message: expect.stringContaining("worker.group 1 is out of range"),
    });
    await expect(client.register({ job: "c", group: 0, host: 99 }, dp2)).rejects.toBeInstanceOf(ControllerError);
    await client.register({ job: "a", group: 0, host: 1 }, dp2);
    await first;
    await expect(client.register({ job: "a", group: 0, host: 2 }, dp2)).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining("takes new workers only through migrations"),
    });
  });

  it(
    "rolls a migration back when the destination's daemon goes silent",
    async () => {
      // The controller's clock moves only when the test moves it, and only the test ticks it, so
      // silence is exactly as long as the test says.
      let now = Date.now();
      harness = await startController({ overrides: { heartbeatTimeoutMs: 1_000, clock: () => now, tickMs: 3_600_000 } });
      const client = connect(harness);
      const a = [0, 4].map((host) => new WorkerClient(client, { job: "a", group: 0, host }, dp2));
      const b = [1, 5].map((host) => new WorkerClient(client, { job: "b", group: 0, host }, dp2));
      await Promise.all([...a, ...b].map((w) => w.register(5_000)));
      const move = (await plannedMoves(client))[0]!;
      const moving = move.job === "a" ? a : b;
      const source = moving.find((w) => w.worker.host === move.from)!;
      const stayer = moving.find((w) => w.worker.host !== move.from)!;

      const step = await stopKnown(moving, client);

      await client.request({ type: "daemon.register", host: move.to, incarnation: INCARNATION, stagingBytes: 1 << 30, endpoint: "tcp://127.0.0.1:1" });
      const held = stayer.barrier(step);
      const out = await source.barrier(step);
      expect(out.kind).toBe("migrate-out");

      // A heartbeat restarts the silence: 1998 ms after registering, 999 ms after its heartbeat, the daemon is live.
      now += 999;
      await client.request({ type: "daemon.heartbeat", host: move.to, incarnation: INCARNATION });
      now += 999;
      harness.server.controller.tick();
      expect(await client.status()).toMatchObject({ hosts: { lost: [] }, migrations: [{ state: "transferring" }] });
      // Time the controller could not listen (its event loop blocked) is no daemon's silence.
      now += 1;
      harness.server.controller.tick(1);
      expect(await client.status()).toMatchObject({ hosts: { lost: [] }, migrations: [{ state: "transferring" }] });
      // Then it falls silent for the whole timeout.
      now += 1;
      harness.server.controller.tick();

      // The stayer, held until the move resolves, continues; so does the source.
      expect(await held).toEqual({ kind: "continue" });
      const status = await client.status();
      expect(status.migrations[0]).toMatchObject({ state: "rolled-back", reason: `the daemon on host ${move.to} was lost` });
      expect(status.hosts.lost).toEqual([move.to]);
      expect(await source.barrier(step)).toEqual({ kind: "continue" });
      expect(harness.hosts.released).toEqual([{ host: move.to, token: `token-${move.id}` }]);
    },
    SAFETY_NET_MS,
  );
});

describe("journal compaction in a running controller", () => {
  it(
    "rewrites the journal as a snapshot once it is long, and a restarted controller picks up from it",
    async () => {
      harness = await startController({ overrides: { compactAfterRecords: 3 } });
      const client = connect(harness);
      for (const [job, hosts] of [
        ["a", [0, 4]],
        ["b", [1, 5]],
      ] as const) {
        await Promise.all(hosts.map((host) => new WorkerClient(client, { job, group: 0, host }, dp2).register(5_000)));
      }
      expect(await plannedMoves(client)).toHaveLength(1);
      const before = await client.status();
      const path = join(harness.dir, JOURNAL_FILE);
      const fd = openSync(path, "r");
      const lines = [...readJournal(fd, path)].map((line) => line.record);
      closeSync(fd);
      expect(lines[1]?.kind).toBe("snapshot");
      expect(lines.length).toBeLessThan(before.journalRecords + 1);
      harness = await harness.restart();
      const after = await connect(harness).status();
      expect(after.jobs).toEqual(before.jobs);
      expect(after.migrations.map((m) => m.id)).toEqual(before.migrations.map((m) => m.id));
    },
    SAFETY_NET_MS,
  );
});
