import { afterEach, describe, expect, it } from "vitest";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ClientClosedError, ControllerClient, ControllerError, ControllerTimeoutError } from "../../sdk/client/client.ts";
import { startController, type Harness } from "../service/harness.ts";

let harness: Harness | undefined;
afterEach(async () => {
  await harness?.close();
  harness = undefined;
});

describe("sdk client", () => {
  it("turns error replies into ControllerError with the controller's code", async () => {
    harness = await startController();
    const client = new ControllerClient({ endpoint: harness.server.endpoint, timeoutMs: 2_000 });
    try {
      const error = await client
        .report({ worker: { job: "nope", group: 0, host: 0 }, generation: 0, step: 0, stepMs: null, hold: null })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ControllerError);
      expect(error).toMatchObject({ code: "unknown_job", message: 'job "nope" is not known to this controller; register its workers first' });
      await expect(client.finish("nope")).rejects.toMatchObject({ code: "unknown_job" });
    } finally {
      await client.close();
    }
  });

  it("refuses a barrier and a report before registration", async () => {
    harness = await startController();
    const client = new ControllerClient({ endpoint: harness.server.endpoint });
    const identity = { job: "a", group: 0, host: 0 };
    const worker = new WorkerClient(client, identity, { tp: 1, pp: 1, dp: 1 });
    const report = (host: number) => client.report({ worker: { ...identity, host }, generation: 0, step: null, stepMs: null, hold: null });
    try {
      await expect(worker.barrier(0)).rejects.toThrow("the worker is not registered yet: attach first");
      await expect(report(0)).rejects.toMatchObject({ code: "unknown_job" });
      expect((await worker.register()).nodes).toBe(1);
      expect(await worker.barrier(0)).toEqual({ kind: "continue" });
      expect(await report(0)).toEqual({ kind: "run" });
      await expect(report(1)).rejects.toMatchObject({ code: "unknown_worker", message: 'job "a" runs no worker of group 0 on host 1; register it first' });
    } finally {
      worker.close();
      await client.close();
    }
  });

  it("times out with a typed error when nobody answers, and rejects waiting requests on close", async () => {
    const client = new ControllerClient({ endpoint: "tcp://127.0.0.1:9", timeoutMs: 300, retryMs: 100 });
    const timedOut = await client.status().catch((e: unknown) => e);
    expect(timedOut).toBeInstanceOf(ControllerTimeoutError);
    expect(timedOut).toMatchObject({ code: "timeout", timeoutMs: 300, endpoint: "tcp://127.0.0.1:9" });
    const waiting = client.status(10_000);
    await client.close();
    await expect(waiting).rejects.toBeInstanceOf(ClientClosedError);
    await expect(client.status()).rejects.toBeInstanceOf(ClientClosedError);
  });
});
