import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tempDir } from "../service/harness.ts";
import { EXAMPLE_JOBS, script, type ExampleJob } from "../../bench/example-jobs.ts";
import { movesDone, pauseTraining, startCluster } from "./cluster.ts";
import { createHosts, type Hosts } from "./netns.ts";
import { referenceRun, type TrainResult } from "./reference.ts";
import { canRun, networkNamespaces, pythonPackages, torch } from "../helpers/prerequisites.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/**
 * Each example job (DDP with two processes per host, FSDP2, TP, PP) trains on emulated hosts
 * (network namespaces on a bridge); a second job arrives, racks go over their bound, and the
 * controller swaps one of the example's hosts with one of the other job's. The moved host's
 * processes stop at one barrier, save, move and resume on the destination; the example must end
 * with parameters and optimizer state bit-identical to an unmigrated run's.
 */

const STEPS = 120;
const runs = canRun("test/e2e/examples-migration.test.ts", torch(), networkNamespaces());

describe.skipIf(!runs)("example jobs migrated live between network namespaces", () => {
  let hosts: Hosts;
  const dirs: string[] = [];

  beforeAll(() => {
    hosts = createHosts(6);
  });

  afterAll(() => {
    hosts?.remove();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  async function reference(job: ExampleJob): Promise<TrainResult> {
    const dir = tempDir();
    dirs.push(dir);
    const processes = job.hosts.flat().length * job.nproc;
    return referenceRun(script(job), processes, [...(job.args ?? []), "--steps", String(STEPS)], dir);
  }

  it.for(EXAMPLE_JOBS.map((job) => [job.name, job] as const))(
    "%s: one whole host moves mid-training; the job ends bit-identical to an unmigrated run",
    { timeout: 5 * SAFETY_NET_MS },
    async ([, job], { skip }) => {
      if (!canRun(`test/e2e/examples-migration.test.ts (${job.name})`, pythonPackages(job.python ?? []))) skip();
      const expected = await reference(job);
      const c = await startCluster(hosts, job, { steps: STEPS });
      dirs.push(c.dir);
      try {
        await expect.poll(() => c.log(c.launchers[0]!), patiently).toMatch(/barrier \d+ reached/);
        // Held still while the second job arrives, the controller plans and the move's replacement
        // starts (the job pauses only once it is ready), so training cannot end first.
        expect(pauseTraining(hosts, job, "SIGSTOP")).toBe(job.hosts.flat().length * job.nproc);
        writeFileSync(c.gate, "");
        await expect
          .poll(async () => (await c.client.status()).migrations.some((m) => m.job === job.name && m.stopStep !== null), { ...patiently, interval: 200 })
          .toBe(true);
        pauseTraining(hosts, job, "SIGCONT");
        await movesDone(c);
        const status = await c.client.status();
        const moved = status.migrations.find((m) => m.job === job.name)!;
        const rack = (host: number) => Math.floor(host / job.topology.hostsPerRack);
        expect(rack(moved.from)).not.toBe(rack(moved.to));
        expect(status.withinBounds).toBe(true);
        // The moved host keeps its stage, and every stage keeps its whole DP group.
        expect(job.hosts[moved.group]).toContain(moved.from);
        const placed = status.jobs.find((j) => j.id === job.name)!.hosts;
        expect([...placed].sort()).toEqual([...job.hosts.flat().filter((h) => h !== moved.from), moved.to].sort());
        await expect.poll(() => existsSync(c.out), { ...patiently, interval: 500 }).toBe(true);
        const result = JSON.parse(readFileSync(c.out, "utf8")) as TrainResult;
        expect(result).toEqual({ ...expected, generation: 1 });
        // The source's launcher stopped cleanly once its replacement took over; the others, and
        // the replacement (started by the destination's daemon), ran to the end and exited 0.
        const codes = await Promise.all(c.launchers.map((launcher) => launcher.exited));
        const failed = c.launchers.filter((_, i) => codes[i] !== 0).map((launcher) => `${launcher.name}:\n${c.log(launcher).slice(-4_000)}`);
        expect(codes, failed.join("\n")).toEqual(c.launchers.map(() => 0));
        await expect.poll(() => c.log(c.daemons[moved.to]!), patiently).toMatch(/replacement launcher exited \(code 0\)/);
      } finally {
        await c.teardown();
      }
    },
  );
});
