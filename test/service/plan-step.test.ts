import { describe, expect, it } from "vitest";
import { Journal } from "../../controller/service/journal.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import type { Directive } from "../../sdk/contract/protocol/worker.ts";
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
    for (const [job, hosts] of [
      ["a", [0, 4]],
      ["b", [1, 5]],
      ["c", [2, 6]],
    ] as const) {
      journal.append({
        kind: "job-started",
        job,
        rings: 1,
        parallelism: dp2,
        groups: [[...hosts]],
        checkpointBytes: { [hosts[0]]: 32, [hosts[1]]: 32 },
        replacement: null,
      });
    }
    journal.close();
    harness = await startController({ dir, overrides: { replanBackoffMs: 100 } });
    const client = connect(harness, 10_000);
    // The hosts' daemons register again with the restarted controller, which waits for them.
    for (let host = 0; host < SMALL.racks * SMALL.hostsPerRack; host++) {
      await client.request({ type: "daemon.register", host, incarnation: INCARNATION, stagingBytes: 1 << 20, endpoint: `tcp://127.0.0.1:${9000 + host}` });
    }

    const workers = new Map<number, WorkerClient>();
    for (const [job, hosts] of [
      ["a", [0, 4]],
      ["b", [1, 5]],
      ["c", [2, 6]],
    ] as const) {
      for (const host of hosts) {
        const w = new WorkerClient(client, { job, group: 0, host }, dp2, { checkpointBytes: 32, holdTimeoutMs: 10_000 });
        await w.register(5_000);
        workers.set(host, w);
      }
    }
    const moves = await plannedMoves(client);
    expect(moves.length).toBeGreaterThan(1);
    expect(new Set(moves.map((m) => m.planStep))).toEqual(new Set([0]));
    expect(moves.every((m) => m.state === "pausing")).toBe(true);

    // Every worker of a moving job learns its job's stop, then meets it; sources get migrate-out.
    const moving = new Set(moves.map((m) => m.job));
    const movingWorkers = [...workers.values()].filter((w) => moving.has(w.worker.job));
    await expect.poll(() => movingWorkers.every((w) => w.stop !== null), { timeout: 10_000 }).toBe(true);
    const pending = new Map<number, Promise<Directive>>();
    for (const w of movingWorkers) pending.set(w.worker.host, w.barrier(w.stop!.step));
    const tokens = new Map<string, string>();
    for (const m of moves) {
      const directive = await pending.get(m.from)!;
      if (directive.kind !== "migrate-out") throw new Error(`source ${m.from} got ${directive.kind}`);
      expect(directive.step).toBe(workers.get(m.from)!.stop!.step);
      tokens.set(m.id, directive.token);
      // The checkpoint is sent: the source waits for the move's outcome.
      pending.set(m.from, workers.get(m.from)!.barrier(directive.step));
    }

    // The first move is verified: nothing commits while the second has not staged.
    const [first, ...rest] = moves;
    await client.request({ type: "daemon.transfer-result", host: first!.to, token: tokens.get(first!.id)!, bytes: 32, outcome: "verified" });
    let status = await client.status();
    expect(status.migrations.map((m) => m.state)).toEqual(["staged", ...rest.map(() => "transferring")]);
    expect(harness.hosts.spawned).toEqual([]);

    for (const m of rest) await client.request({ type: "daemon.transfer-result", host: m.to, token: tokens.get(m.id)!, bytes: 32, outcome: "verified" });
    // Every host of the moving jobs seals its hold; then the step's moves commit together.
    await expect.poll(async () => (await client.status()).migrations.map((m) => m.state), { timeout: 10_000 }).toEqual(moves.map(() => "committing"));
    for (const m of moves) expect(await pending.get(m.from)).toMatchObject({ kind: "stop" });
    await harness.hosts.until(() => harness!.hosts.spawned.length === moves.length);

    // Replacements register; every moving job re-forms and the cluster is within bounds.
    await Promise.all(moves.map((m) => new WorkerClient(client, { job: m.job, group: 0, host: m.to }, dp2, { token: tokens.get(m.id)! }).register(5_000)));
    for (const m of moves) {
      for (const [host, promise] of pending) {
        if (host !== m.from && workers.get(host)?.worker.job === m.job)
          expect(await promise).toMatchObject({ kind: "reconfigure", assignment: { generation: 1 } });
      }
    }
    // The moves are done once every worker reports running the new assignment.
    await expect.poll(async () => (await client.status()).migrations.map((m) => m.state), { timeout: 10_000 }).toEqual(moves.map(() => "done"));
    status = await client.status();
    expect(status.withinBounds).toBe(true);
  });
});
