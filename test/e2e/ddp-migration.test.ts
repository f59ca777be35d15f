import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { tempDir } from "../service/harness.ts";
import { EXAMPLE_JOBS } from "../../bench/example-jobs.ts";
import { hostsAndReference, pauseTraining, rollbackReason, startCluster } from "./cluster.ts";
import type { TrainResult } from "./reference.ts";
import { canRun, networkNamespaces, torch } from "../helpers/prerequisites.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/**
 * A migration that fails half-way: the DDP example (two processes per host) trains on emulated
 * hosts, the second job's arrival makes the controller move one of its hosts, and the
 * destination's daemon dies while the move is staged. The controller rolls back; the job must
 * continue on its old hosts and end bit-identical to an unmigrated run.
 */

const STEPS = 120;
const DDP = EXAMPLE_JOBS.find((job) => job.name === "ddp")!;
const runs = canRun("test/e2e/ddp-migration.test.ts", torch(), networkNamespaces());

describe.skipIf(!runs)("a live DDP migration rolled back between network namespaces", () => {
  const env = hostsAndReference(DDP, 4, STEPS);

  it(
    "rolls back when the destination's daemon dies during the move; the job continues on its old hosts, bit-identical",
    async () => {
      const dir = tempDir();
      env.dirs.push(dir);
      const hold = join(dir, "hold");
      // The other job's checkpoint is held back, so the DDP move cannot commit; the daemon is
      // declared lost quickly, so the test does not wait long for the rollback.
      const c = await startCluster(env.hosts, DDP, { steps: STEPS, hold, heartbeatTimeoutS: 2 });
      env.dirs.push(c.dir);
      try {
        await expect.poll(() => c.log(c.launchers[0]!), patiently).toMatch(/barrier \d+ reached/);
        expect(pauseTraining(env.hosts, DDP, "SIGSTOP")).toBe(4);
        writeFileSync(c.gate, "");
        await expect
          .poll(async () => (await c.client.status()).migrations.some((m) => m.job === "ddp" && m.stopStep !== null), { ...patiently, interval: 200 })
          .toBe(true);
        pauseTraining(env.hosts, DDP, "SIGCONT");
        // Once the job stopped and its checkpoint is on its way to the destination, kill that host's daemon.
        const staging = async () => (await c.client.status()).migrations.find((m) => m.job === "ddp" && m.stopStep !== null && m.state !== "pausing");
        await expect.poll(staging, { ...patiently, interval: 20 }).toBeDefined();
        const move = (await staging())!;
        expect(["transferring", "verifying", "staged"]).toContain(move.state);
        c.group.kill(c.daemons[move.to]!, "SIGKILL");
        expect(await rollbackReason(c, move.id)).toMatch(/host \d+/);
        writeFileSync(`${hold}.go`, "");
        await expect.poll(() => existsSync(c.out), { ...patiently, interval: 500 }).toBe(true);
        const result = JSON.parse(readFileSync(c.out, "utf8")) as TrainResult;
        expect(result).toEqual({ ...env.expected, generation: 0 });
        expect(await Promise.all(c.launchers.map((launcher) => launcher.exited))).toEqual([0, 0]);
      } finally {
        await c.teardown();
      }
    },
    4 * SAFETY_NET_MS,
  );
});
