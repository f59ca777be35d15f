import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tempDir } from "../service/harness.ts";
import { EXAMPLE_JOBS, script } from "../../bench/example-jobs.ts";
import { pauseTraining, rollbackReason, startCluster, type Cluster } from "./cluster.ts";
import { createHosts, type Hosts } from "./netns.ts";
import { referenceRun, type TrainResult } from "./reference.ts";
import { canRun, networkNamespaces, torch } from "../helpers/prerequisites.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/**
 * Training never waits for the controller. The DDP example (two processes per host) trains on
 * emulated hosts while its controller is killed, stopped or cut off by the network, before and
 * after a move of one of its hosts commits. Each time the job trains on, the journal and the
 * hosts agree once the controller is back, a move then completes, and the job ends
 * bit-identical to a run that was never disturbed, leaving no process behind.
 */

const STEPS = 400;
const DDP = EXAMPLE_JOBS.find((job) => job.name === "ddp")!;
/** A namespace no job uses: where the controller runs when a test cuts it off. */
const CONTROLLER_HOST = 4;
/** Short, so that a held job lets go soon; the default is 20 s. */
const HOLD_TIMEOUT_S = 5;
const runs = canRun("test/e2e/controller-faults.test.ts", torch(), networkNamespaces());

/** The furthest barrier a launcher logged (at its first, and every 50th). */
function logged(c: Cluster, launcher: number): number {
  return Math.max(-1, ...[...c.log(c.launchers[launcher]!).matchAll(/barrier (\d+) reached/g)].map((m) => Number(m[1])));
}

/**
 * Processes of the job still running on the emulated hosts (launchers, torchrun and its
 * workers; not the daemons, whose --replacement names the script too), as `host: command line`.
 */
function leftovers(hosts: Hosts, hostCount: number): string[] {
  const found: string[] = [];
  for (let host = 0; host < hostCount; host++) {
    const inside = spawnSync("ip", ["netns", "pids", hosts.namespace(host)], { encoding: "utf8" }).stdout ?? "";
    for (const pid of inside.split(/\s+/).filter(Boolean).map(Number)) {
      try {
        const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8");
        if (argv.includes(script(DDP)) && !argv.includes("\0daemon\0")) found.push(`${host}: ${argv.replaceAll("\0", " ").slice(0, 200)}`);
      } catch {
        // Gone meanwhile.
      }
    }
  }
  return found;
}

/** The replacement launcher a destination's daemon started for the job (its `monkeytree launch`). */
function replacementLauncher(hosts: Hosts, host: number): number | undefined {
  const inside = spawnSync("ip", ["netns", "pids", hosts.namespace(host)], { encoding: "utf8" }).stdout ?? "";
  return inside
    .split(/\s+/)
    .filter(Boolean)
    .map(Number)
    .find((pid) => {
      try {
        const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
        return argv.includes("launch") && argv.includes(script(DDP));
      } catch {
        return false;
      }
    });
}

describe.skipIf(!runs)("training with the controller down", () => {
  let hosts: Hosts;
  let expected: TrainResult;
  const dirs: string[] = [];
  const hostCount = DDP.topology.racks * DDP.topology.hostsPerRack;

  beforeAll(async () => {
    hosts = createHosts(hostCount + 1);
    const dir = tempDir();
    dirs.push(dir);
    expected = await referenceRun(script(DDP), 4, ["--steps", String(STEPS)], dir);
  }, 3 * SAFETY_NET_MS);

  afterAll(() => {
    hosts?.remove();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  /** Holds training still until the controller has planned the job's move, as the migration tests do. */
  async function plannedWhilePaused(c: Cluster, planned: () => Promise<boolean>): Promise<void> {
    expect(pauseTraining(hosts, DDP, "SIGSTOP")).toBe(4);
    await expect.poll(planned, { ...patiently, interval: 200 }).toBe(true);
    pauseTraining(hosts, DDP, "SIGCONT");
  }

  async function endsBitIdentical(c: Cluster, generation: number): Promise<void> {
    await expect
      .poll(() => existsSync(c.out), { ...patiently, interval: 500 })
      .toBe(true)
      .catch((error: unknown) => {
        // Where the job got stuck is in the logs of the controller and the launchers.
        const logs = [c.controller(), ...c.launchers].map((m) => `==== ${m.name}\n${c.log(m).slice(-3000)}`);
        throw new Error(`${(error as Error).message}\n${logs.join("\n")}`);
      });
    expect(JSON.parse(readFileSync(c.out, "utf8"))).toEqual({ ...expected, generation });
    await expect.poll(() => leftovers(hosts, hostCount), patiently).toEqual([]);
  }

  it("killed before a move commits: the held job lets go and trains on; restarted, the journal rolls the move back and a new one completes", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const hold = join(dir, "hold");
    // The other job's checkpoint is held back, so the plan step cannot commit before the kill.
    const c = await startCluster(hosts, DDP, { steps: STEPS, hold, holdTimeoutS: HOLD_TIMEOUT_S, replanBackoffS: 1 });
    dirs.push(c.dir);
    try {
      await expect.poll(() => logged(c, 0), patiently).toBeGreaterThanOrEqual(1);
      writeFileSync(c.gate, "");
      const first = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name);
      await plannedWhilePaused(c, async () => (await first()) !== undefined);
      const move = (await expect.poll(async () => {
        const m = await first();
        return m && ["transferring", "verifying", "staged"].includes(m.state) ? m : undefined;
      }, { ...patiently, interval: 50 }).toBeDefined().then(first))!;
      const stop = move.stopStep!;
      c.group.kill(c.controller(), "SIGKILL");

      // Every host of the job lets go of the stop after its hold timeout, and trains on.
      for (const launcher of c.launchers) {
        await expect.poll(() => c.log(launcher), patiently).toMatch(new RegExp(`hold timeout ${HOLD_TIMEOUT_S * 1000} ms\\): letting go of stop \\S+ and training on`));
      }
      await expect.poll(() => Math.min(logged(c, 0), logged(c, 1)), patiently).toBeGreaterThanOrEqual(stop + 50);

      // Back with the same journal: the move that had not committed rolls back, as the hosts did,
      // and a plan after the backoff moves the job's host again (training held still meanwhile).
      writeFileSync(`${hold}.go`, "");
      expect(pauseTraining(hosts, DDP, "SIGSTOP")).toBe(4);
      const restarted = await c.restartController();
      await expect.poll(() => c.log(restarted), patiently).toMatch(new RegExp(`migration ${move.id} .*→ rolled-back on fail: the controller restarted before the move committed`));
      await expect.poll(async () => (await c.client.status()).migrations.some((m) => m.job === DDP.name && m.id !== move.id), { ...patiently, interval: 200 }).toBe(true);
      pauseTraining(hosts, DDP, "SIGCONT");
      // A later plan moves the job's host, and the job ends as if nothing had happened.
      await expect.poll(async () => (await c.client.status()).jobs.find((j) => j.id === DDP.name)?.generation, { ...patiently, interval: 200 }).toBe(1);
      await endsBitIdentical(c, 1);
    } finally {
      await c.teardown();
    }
  }, 6 * SAFETY_NET_MS);

  it("stopped before a move commits: the held job lets go and trains on; continued, the controller rolls the move back as the hosts did", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const hold = join(dir, "hold");
    const c = await startCluster(hosts, DDP, { steps: STEPS, hold, holdTimeoutS: HOLD_TIMEOUT_S, replanBackoffS: 1 });
    dirs.push(c.dir);
    try {
      await expect.poll(() => logged(c, 0), patiently).toBeGreaterThanOrEqual(1);
      writeFileSync(c.gate, "");
      const first = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name);
      await plannedWhilePaused(c, async () => (await first()) !== undefined);
      await expect.poll(async () => ["transferring", "verifying", "staged"].includes((await first())?.state ?? ""), { ...patiently, interval: 50 }).toBe(true);
      const move = (await first())!;
      c.group.kill(c.controller(), "SIGSTOP");
      for (const launcher of c.launchers) {
        await expect.poll(() => c.log(launcher), patiently).toMatch(/: letting go of stop \S+ and training on/);
      }
      await expect.poll(() => Math.min(logged(c, 0), logged(c, 1)), patiently).toBeGreaterThanOrEqual(move.stopStep! + 50);
      writeFileSync(`${hold}.go`, "");
      expect(pauseTraining(hosts, DDP, "SIGSTOP")).toBe(4);
      c.group.kill(c.controller(), "SIGCONT");
      expect(await rollbackReason(c, move.id)).toMatch(/let go of stop \S+ after its hold timeout without word from the controller/);
      await expect.poll(async () => (await c.client.status()).migrations.some((m) => m.job === DDP.name && m.id !== move.id), { ...patiently, interval: 200 }).toBe(true);
      pauseTraining(hosts, DDP, "SIGCONT");
      await expect.poll(async () => (await c.client.status()).jobs.find((j) => j.id === DDP.name)?.generation, { ...patiently, interval: 200 }).toBe(1);
      await endsBitIdentical(c, 1);
    } finally {
      await c.teardown();
    }
  }, 6 * SAFETY_NET_MS);

  it("stopped for 60 s while the job trains: the job trains on; continued, a move completes", async () => {
    const c = await startCluster(hosts, DDP, { steps: STEPS, holdTimeoutS: HOLD_TIMEOUT_S });
    dirs.push(c.dir);
    try {
      await expect.poll(() => logged(c, 0), patiently).toBeGreaterThanOrEqual(1);
      const before = logged(c, 0);
      const stoppedAt = Date.now();
      c.group.kill(c.controller(), "SIGSTOP");
      await expect.poll(() => c.log(c.launchers[0]!), patiently).toContain("the controller does not answer: training goes on");
      await expect.poll(() => Math.min(logged(c, 0), logged(c, 1)), patiently).toBeGreaterThanOrEqual(before + 100);
      // The job must not end while the controller is away: it waits, still, for the rest of the minute.
      expect(pauseTraining(hosts, DDP, "SIGSTOP")).toBe(4);
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, 60_000 - (Date.now() - stoppedAt))));
      c.group.kill(c.controller(), "SIGCONT");
      await expect.poll(() => c.log(c.launchers[0]!), patiently).toContain("the controller answers again");
      pauseTraining(hosts, DDP, "SIGCONT");
      writeFileSync(c.gate, "");
      await plannedWhilePaused(c, async () => (await c.client.status()).migrations.some((m) => m.job === DDP.name));
      await expect.poll(async () => (await c.client.status()).migrations.map((m) => m.state).join(","), { ...patiently, interval: 200 }).toMatch(/^done,done$/);
      await endsBitIdentical(c, 1);
    } finally {
      await c.teardown();
    }
  }, 6 * SAFETY_NET_MS);

  it("killed after a move commits: the sealed hosts wait; restarted, the journal finishes the move", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const hold = join(dir, "hold");
    const c = await startCluster(hosts, DDP, { steps: STEPS, hold, holdTimeoutS: HOLD_TIMEOUT_S, replanBackoffS: 1 });
    dirs.push(c.dir);
    try {
      await expect.poll(() => logged(c, 0), patiently).toBeGreaterThanOrEqual(1);
      writeFileSync(c.gate, "");
      const move = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name);
      await plannedWhilePaused(c, async () => (await move()) !== undefined);
      const { id, to } = (await move())!;
      // The replacement is held still as soon as it starts, before it can register: the move
      // commits and then waits in `committing` for it.
      const replacement = await expect.poll(() => replacementLauncher(hosts, to), { ...patiently, interval: 20 }).toBeDefined().then(() => replacementLauncher(hosts, to)!);
      process.kill(replacement, "SIGSTOP");
      writeFileSync(`${hold}.go`, "");
      await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === id)?.state, { ...patiently, interval: 50 }).toBe("committing");
      c.group.kill(c.controller(), "SIGKILL");
      // Sealed, the job's hosts do not let go, however long the controller is away.
      await new Promise((resolve) => setTimeout(resolve, 2 * HOLD_TIMEOUT_S * 1000));
      for (const launcher of c.launchers) expect(c.log(launcher)).not.toContain("letting go of stop");
      const restarted = await c.restartController();
      process.kill(replacement, "SIGCONT");
      await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === id)?.state, { ...patiently, interval: 200 }).toBe("done");
      expect(c.log(restarted)).toContain(`migration ${id}: committed before the restart; asking host ${to} for the replacement again`);
      await endsBitIdentical(c, 1);
    } finally {
      await c.teardown();
    }
  }, 6 * SAFETY_NET_MS);

  it("cut off by the network before a move commits: the held job lets go and trains on; back, the move rolls back as the hosts did", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const hold = join(dir, "hold");
    const c = await startCluster(hosts, DDP, { steps: STEPS, hold, holdTimeoutS: HOLD_TIMEOUT_S, replanBackoffS: 1, controllerHost: CONTROLLER_HOST });
    dirs.push(c.dir);
    try {
      await expect.poll(() => logged(c, 0), patiently).toBeGreaterThanOrEqual(1);
      writeFileSync(c.gate, "");
      const first = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name);
      await plannedWhilePaused(c, async () => (await first()) !== undefined);
      await expect.poll(async () => ["transferring", "verifying", "staged"].includes((await first())?.state ?? ""), { ...patiently, interval: 50 }).toBe(true);
      const move = (await first())!;
      hosts.link(CONTROLLER_HOST, "down");
      for (const launcher of c.launchers) {
        await expect.poll(() => c.log(launcher), patiently).toMatch(/: letting go of stop \S+ and training on/);
      }
      await expect.poll(() => Math.min(logged(c, 0), logged(c, 1)), patiently).toBeGreaterThanOrEqual(move.stopStep! + 50);
      writeFileSync(`${hold}.go`, "");
      expect(pauseTraining(hosts, DDP, "SIGSTOP")).toBe(4);
      hosts.link(CONTROLLER_HOST, "up");
      // The controller, which kept its clock, may also have found the job's workers silent first.
      expect(await rollbackReason(c, move.id)).toMatch(/let go of stop \S+ after its hold timeout without word from the controller|went silent while its job stopped/);
      await expect.poll(async () => (await c.client.status()).migrations.some((m) => m.job === DDP.name && m.id !== move.id), { ...patiently, interval: 200 }).toBe(true);
      pauseTraining(hosts, DDP, "SIGCONT");
      await expect.poll(async () => (await c.client.status()).jobs.find((j) => j.id === DDP.name)?.generation, { ...patiently, interval: 200 }).toBe(1);
      await endsBitIdentical(c, 1);
    } finally {
      hosts.link(CONTROLLER_HOST, "up");
      await c.teardown();
    }
  }, 6 * SAFETY_NET_MS);

  it("cut off by the network after a move commits: the job trains on re-formed; back, the move completes", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const hold = join(dir, "hold");
    // The other job's checkpoint is held back, so the plan step commits only when the test says.
    const c = await startCluster(hosts, DDP, { steps: STEPS, hold, holdTimeoutS: HOLD_TIMEOUT_S, controllerHost: CONTROLLER_HOST });
    dirs.push(c.dir);
    try {
      await expect.poll(() => logged(c, 0), patiently).toBeGreaterThanOrEqual(1);
      writeFileSync(c.gate, "");
      const move = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name);
      await plannedWhilePaused(c, async () => (await move()) !== undefined);
      const { id, to, from, stopStep } = (await move())!;
      // The replacement, up before the commit, registered and waits for it; it is then held still,
      // so the move stays committed but not done while the controller is cut off: it can report
      // its new generation only later.
      await expect.poll(() => c.log(c.controller()), patiently).toContain(`migration ${id}: the replacement on host ${to} is up before the commit`);
      const replacement = replacementLauncher(hosts, to)!;
      expect(replacement).toBeDefined();
      process.kill(replacement, "SIGSTOP");
      writeFileSync(`${hold}.go`, "");
      await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === id)?.state, { ...patiently, interval: 50 }).toBe("resuming");
      hosts.link(CONTROLLER_HOST, "down");
      process.kill(replacement, "SIGCONT");
      // The stayer and the replacement re-form and train on without the controller.
      const stayer = c.launchers[DDP.hosts[0]!.indexOf(DDP.hosts[0]!.find((h) => h !== from)!)]!;
      await expect.poll(() => c.log(stayer), patiently).toContain("training resumed");
      await expect.poll(() => Math.max(-1, ...[...c.log(stayer).matchAll(/barrier (\d+) reached/g)].map((m) => Number(m[1]))), patiently).toBeGreaterThanOrEqual(stopStep! + 50);
      hosts.link(CONTROLLER_HOST, "up");
      await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === id)?.state, { ...patiently, interval: 200 }).toBe("done");
      await endsBitIdentical(c, 1);
    } finally {
      hosts.link(CONTROLLER_HOST, "up");
      await c.teardown();
    }
  }, 6 * SAFETY_NET_MS);
});
