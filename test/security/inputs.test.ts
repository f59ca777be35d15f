import { afterEach, describe, expect, it } from "vitest";
import { Dealer } from "zeromq";
import { DaemonHosts } from "../../controller/service/daemon-hosts.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerError } from "../../sdk/client/client.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { MAX_GPUS_PER_HOST, MAX_REQUEST_BYTES, MAX_TEXT_LENGTH } from "../../sdk/contract/protocol/limits.ts";
import { closeControllersAfterEach, connect, INCARNATION, startController, type Harness } from "../service/harness.ts";

/**
 * Every field of a request is bounded, so one message can neither freeze the controller nor
 * make it buffer, echo or log without bound.
 */

let harness: Harness | undefined;
const sockets: Dealer[] = [];
closeControllersAfterEach();
// After-hooks run last-registered first: raw sockets close before the controller.
afterEach(() => {
  for (const s of sockets.splice(0)) s.close();
});

/** A raw DEALER: sends one frame, and reads the next reply or null when none comes in `waitMs`. */
function raw(h: Harness, waitMs = 2_000) {
  const socket = new Dealer({ linger: 0, receiveTimeout: waitMs });
  socket.connect(h.server.endpoint);
  sockets.push(socket);
  return {
    send: (frame: string) => socket.send(frame),
    next: async (): Promise<Record<string, unknown> | null> => {
      try {
        const [reply] = await socket.receive();
        return JSON.parse(reply!.toString()) as Record<string, unknown>;
      } catch (error) {
        if ((error as { code?: string }).code === "EAGAIN") return null;
        throw error;
      }
    },
  };
}

const register = (job: string, host: number, parallelism: Record<string, number>) =>
  JSON.stringify({ v: PROTOCOL_VERSION, type: "worker.register", id: 7, worker: { job, group: 0, host }, parallelism, checkpointBytes: 0 });

describe("bounded requests", () => {
  it("refuses tp beyond what a host can hold, and a job at the largest tp still leaves status quick", async () => {
    harness = await startController();
    const peer = raw(harness);
    await peer.send(register("wide", 0, { tp: 100_000, pp: 1, dp: 2 }));
    expect(await peer.next()).toMatchObject({
      type: "error",
      code: "malformed",
      message: `worker.register at parallelism.tp: parallelism.tp must be at most ${MAX_GPUS_PER_HOST}, the largest MonkeyTree supports`,
    });

    const client = connect(harness);
    const parallelism = { tp: MAX_GPUS_PER_HOST, pp: 1, dp: 2 };
    const workers = [0, 4].map((host) => new WorkerClient(client, { job: "wide", group: 0, host }, parallelism));
    try {
      await Promise.all(workers.map((w) => w.register(5_000)));
      const started = performance.now();
      const status = await client.status();
      expect(status.routes.dpFlows).toBe(2 * MAX_GPUS_PER_HOST);
      expect(performance.now() - started).toBeLessThan(1_000);
    } finally {
      for (const w of workers) w.close();
    }
  });

  it("answers a huge job id with a bounded error, and never reads a frame over the size limit", async () => {
    harness = await startController();
    const peer = raw(harness);
    const big = "x".repeat(MAX_REQUEST_BYTES / 2);
    await peer.send(JSON.stringify({ v: PROTOCOL_VERSION, type: "job.finish", id: 1, job: big }));
    const reply = await peer.next();
    expect(reply).toMatchObject({ type: "error", id: 1, code: "malformed" });
    expect(String(reply?.message).length).toBeLessThanOrEqual(MAX_TEXT_LENGTH);
    expect(Math.max(...harness.logs.map((line) => line.length))).toBeLessThan(2 * MAX_TEXT_LENGTH);

    // The same request padded past the limit would be answered too, if it were read at all.
    await peer.send(JSON.stringify({ v: PROTOCOL_VERSION, type: "job.finish", id: 2, job: "x".repeat(MAX_REQUEST_BYTES) }));
    expect(await peer.next()).toBeNull();
    expect((await connect(harness).status()).jobs).toEqual([]);
  });

  it("keeps ids to one line: a newline in an id is refused, and an echoed key is quoted", async () => {
    harness = await startController();
    const peer = raw(harness);
    await peer.send(JSON.stringify({ v: PROTOCOL_VERSION, type: "job.finish", id: 1, job: "a\n[controller] job b finished" }));
    expect(await peer.next()).toMatchObject({ code: "malformed", message: "job.finish at job: a job id may hold only letters, digits and . _ : @ + = / -" });
    await peer.send(JSON.stringify({ v: PROTOCOL_VERSION, type: "status", id: 2, "k\n[controller] forged": 1 }));
    expect(await peer.next()).toMatchObject({ code: "malformed", message: 'status: unknown field "k\\n[controller] forged"; remove it or check its spelling' });
    expect(harness.logs.filter((line) => line.includes("\n"))).toEqual([]);
  });

  it("records only the daemon registrations it accepts", async () => {
    const daemons = new DaemonHosts();
    harness = await startController({ overrides: { daemons } });
    const client = connect(harness);
    const endpoint = "tcp://127.0.0.1:7000";
    for (let host = 8; host < 208; host++) {
      await expect(client.request({ type: "daemon.register", host, incarnation: INCARNATION, stagingBytes: 1, endpoint })).rejects.toThrow(ControllerError);
    }
    expect(daemons.size).toBe(0);
    await client.request({ type: "daemon.register", host: 3, incarnation: INCARNATION, stagingBytes: 1, endpoint });
    expect(daemons.size).toBe(1);
  });

  it("drops a peer's requests past its rate, while other peers are served", async () => {
    harness = await startController({ overrides: { rateLimits: { perSecond: 0.001, burst: 3, clients: 10 } } });
    const flooder = raw(harness, 500);
    const status = (id: number) => JSON.stringify({ v: PROTOCOL_VERSION, type: "status", id });
    for (let id = 1; id <= 5; id++) await flooder.send(status(id));
    const answered: unknown[] = [];
    for (let reply = await flooder.next(); reply; reply = await flooder.next()) answered.push(reply.id);
    expect(answered).toEqual([1, 2, 3]);
    expect(harness.logs.filter((line) => line.includes("over its request rate"))).toHaveLength(1);
    expect((await connect(harness).status()).jobs).toEqual([]);
  });
});
