import { describe, expect, it } from "vitest";
import { Journal } from "../../controller/service/journal.ts";
import { WorkerClient } from "../../sdk/client.ts";
import type { Directive } from "../../sdk/protocol/worker.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";
import { closeControllersAfterEach, connect, INCARNATION, plannedMoves, SMALL, startController, tempDir, type Harness } from "./harness.ts";

let harness: Harness | undefined;
closeControllersAfterEach();

const dp2 = { tp: 1, pp: 1, dp: 2 };

// The test waits for its controller's first plan, and so for a planner thread to start.
describe("a plan step with several moves", { timeout: SAFETY_NET_MS }, () => {
  it("commits no move until every source of the step has staged, then commits them together", async () => {
    // Three jobs each spanning both racks (fragmentation 3 > λ 1), as a controller that
    // restarted would find them: it plans once its backoff passes.
    const dir = tempDir();
    const { journal } = Journal.open(dir, { kind: "config", topology: SMALL, lambda: 1, podLambda: null });
    for (const [job, hosts] of [["a", [0, 4]], ["b", [1, 5]], ["c", [2, 6]]] as const) {
      journal.append({ kind: "job-started", job, rings: 1, parallelism: dp2, groups: [[...hosts]], checkpointBytes: { [hosts[0]]: 32, [hosts[1]]: 32 }, replacement: null });
    }
    journal.close();
    harness = await startController({ dir, overrides: { replanBackoffMs: 100 } });
    const client = connect(harness, 10_000);
    // The hosts' daemons register again with the restarted controller, which waits for them.
    for (let host = 0; host < SMALL.racks * SMALL.hostsPerRack; host++) {
      await client.request({ type: "daemon.register", host, incarnation: INCARNATION, stagingBytes: 1 << 20, endpoint: `tcp://127.0.0.1:${9000 + host}` });
    }

    const workers = new Map<number, WorkerClient>();
    for (const [job, hosts] of [["a", [0, 4]], ["b", [1, 5]], ["c", [2, 6]]] as const) {
      for (const host of hosts) {
        const w = new WorkerClient(client, { job, group: 0, host }, dp2, { checkpointBytes: 32, barrierTimeoutMs: 10_000 });
        await w.register(5_000);
        workers.set(host, w);
      }
    }
    const moves = await plannedMoves(client);
    expect(moves.length).toBeGreaterThan(1);
    expect(new Set(moves.map((m) => m.planStep))).toEqual(new Set([0]));
    expect(moves.every((m) => m.state === "pausing")).toBe(true);

    // Every worker of a moving job meets its stop step; sources get migrate-out.
    const moving = new Set(moves.map((m) => m.job));
    const pending = new Map<number, Promise<Directive>>();
    for (const [host, w] of workers) {
      const job = w.worker.job;
      if (!moving.has(job)) continue;
      pending.set(host, w.barrier(moves.find((m) => m.job === job)!.stopStep!));
    }
    const tokens = new Map<string, string>();
    for (const m of moves) {
      const directive = await pending.get(m.from)!;
      if (directive.kind !== "migrate-out") throw new Error(`source ${m.from} got ${directive.kind}`);
      tokens.set(m.id, directive.token);
      pending.set(m.from, workers.get(m.from)!.barrier(m.stopStep!));
    }

    // The first move is verified: nothing commits while the second has not staged.
    const [first, ...rest] = moves;
    await client.request({ type: "daemon.transfer-result", host: first!.to, token: tokens.get(first!.id)!, bytes: 32, outcome: "verified" });
    let status = await client.status();
    expect(status.migrations.map((m) => m.state)).toEqual(["staged", ...rest.map(() => "transferring")]);
    expect(harness.hosts.spawned).toEqual([]);

    for (const m of rest) await client.request({ type: "daemon.transfer-result", host: m.to, token: tokens.get(m.id)!, bytes: 32, outcome: "verified" });
    status = await client.status();
    expect(status.migrations.every((m) => m.state === "committing")).toBe(true);
    for (const m of moves) expect(await pending.get(m.from)).toMatchObject({ kind: "stop" });
    await harness.hosts.until(() => harness!.hosts.spawned.length === moves.length);

    // Replacements register; every moving job re-forms and the cluster is within bounds.
    await Promise.all(moves.map((m) => new WorkerClient(client, { job: m.job, group: 0, host: m.to }, dp2, { token: tokens.get(m.id)! }).register(5_000)));
    for (const m of moves) {
      for (const [host, promise] of pending) {
        if (host !== m.from && workers.get(host)?.worker.job === m.job) expect(await promise).toMatchObject({ kind: "reconfigure", assignment: { generation: 1 } });
      }
    }
    status = await client.status();
    expect(status.migrations.every((m) => m.state === "done")).toBe(true);
    expect(status.withinBounds).toBe(true);
  });
});
