import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { tempDir } from "../service/harness.ts";
import { EXAMPLE_JOBS, script } from "../../bench/example-jobs.ts";
import {
  heardFromAll,
  hostsAndReference,
  movesDone,
  pauseTraining,
  rollbackReason,
  stagingLeft,
  startCluster,
  type Cluster,
  type ClusterOptions,
} from "./cluster.ts";
import type { StatusReport } from "../../sdk/contract/protocol/status.ts";
import type { Hosts } from "./netns.ts";
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

/** A way the controller goes away, and how it comes back. */
interface Outage {
  readonly name: string;
  /** A namespace of its own for the controller, whose link the outage cuts. */
  readonly controllerHost?: number;
  /** How long the controller stays away, at least, while the job trains. */
  readonly awayWhileTrainingS: number;
  begin(c: Cluster): void;
  /** Brings the controller back: a killed one restarts on its journal. */
  end(c: Cluster): Promise<void>;
  readonly restarts: boolean;
  /** Why a move that had not committed rolls back once the controller is back. */
  readonly rollback: RegExp;
}

type MigrationStatus = StatusReport["migrations"][number];

/**
 * When launcher `launcher` logged each progress line (every 50 steps), as seen by reading its
 * log every 20 ms: the job's own pace, which the controller does not see while it is away.
 */
function watchSteps(c: Cluster, launcher: number) {
  const marks: { step: number; at: number }[] = [];
  const timer = setInterval(() => {
    const step = logged(c, launcher);
    if (step > (marks.at(-1)?.step ?? -1)) marks.push({ step, at: performance.now() });
  }, 20);
  return {
    marks,
    /** Steps per second between the first and the last mark seen from `since` on. */
    rate(since: number): number {
      const seen = marks.filter((m) => m.at >= since);
      const [first, last] = [seen[0]!, seen.at(-1)!];
      return ((last.step - first.step) * 1000) / (last.at - first.at);
    },
    stop: () => clearInterval(timer),
  };
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
  const hostCount = DDP.topology.racks * DDP.topology.hostsPerRack;
  // One namespace more: where the controller runs when a test cuts it off.
  const env = hostsAndReference(DDP, hostCount + 1, STEPS);

  const LET_GO = /let go of stop \S+ after its hold timeout without word from the controller|went silent while its job stopped/;
  const OUTAGES: readonly Outage[] = [
    {
      name: "killed",
      awayWhileTrainingS: 0,
      begin: (c) => c.group.kill(c.controller(), "SIGKILL"),
      end: async (c) => void (await c.restartController()),
      restarts: true,
      rollback: /the controller restarted before the move committed/,
    },
    {
      name: "stopped",
      awayWhileTrainingS: 60,
      begin: (c) => c.group.kill(c.controller(), "SIGSTOP"),
      end: async (c) => c.group.kill(c.controller(), "SIGCONT"),
      restarts: false,
      rollback: LET_GO,
    },
    {
      name: "cut off by the network",
      controllerHost: CONTROLLER_HOST,
      awayWhileTrainingS: 30,
      begin: () => env.hosts.link(CONTROLLER_HOST, "down"),
      end: async () => env.hosts.link(CONTROLLER_HOST, "up"),
      restarts: false,
      // The cut hides the daemons too: the controller, which kept its clock, may find one lost first.
      rollback: new RegExp(`${LET_GO.source}|the daemon on host \\d+ was lost`),
    },
  ];

  /** Runs `body` on a cluster of its own, the other job's checkpoint held back by a file (`hold`), and tears it down. */
  async function withCluster(
    options: Omit<ClusterOptions, "steps" | "hold" | "holdTimeoutS">,
    body: (c: Cluster, hold: string) => Promise<void>,
  ): Promise<void> {
    const dir = tempDir();
    env.dirs.push(dir);
    const hold = join(dir, "hold");
    const c = await startCluster(env.hosts, DDP, { steps: STEPS, hold, holdTimeoutS: HOLD_TIMEOUT_S, ...options });
    env.dirs.push(c.dir);
    try {
      await expect.poll(() => logged(c, 0), patiently).toBeGreaterThanOrEqual(1);
      await body(c, hold).catch((error: unknown) => {
        // Where the cluster got stuck is in the logs of the controller, the launchers and the daemons.
        const logs = [c.controller(), ...c.launchers, ...c.daemons].map((m) => `==== ${m.name}\n${c.log(m).slice(-6000)}`);
        throw new Error(`${(error as Error).message}\n${logs.join("\n")}`, { cause: error });
      });
    } finally {
      env.hosts.link(CONTROLLER_HOST, "up");
      await c.teardown();
    }
  }

  /**
   * Holds training still until the controller has told the job to pause for its move (once the
   * move's replacement is ready), as the migration tests do.
   */
  async function plannedWhilePaused(planned: () => Promise<boolean>): Promise<void> {
    expect(pauseTraining(env.hosts, DDP, "SIGSTOP")).toBe(4);
    await expect.poll(planned, { ...patiently, interval: 200 }).toBe(true);
    pauseTraining(env.hosts, DDP, "SIGCONT");
  }

  /** Lets the other job arrive, and returns the job's move once its checkpoint is on its way. */
  async function moveUnderWay(c: Cluster): Promise<MigrationStatus> {
    writeFileSync(c.gate, "");
    const first = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name);
    await plannedWhilePaused(async () => (await first())?.stopStep != null);
    await expect.poll(async () => ["transferring", "verifying", "staged"].includes((await first())?.state ?? ""), { ...patiently, interval: 50 }).toBe(true);
    return (await first())!;
  }

  /** The job ends where an undisturbed run does, leaving no process and no staging behind. */
  async function endsBitIdentical(c: Cluster, generation: number): Promise<void> {
    await expect.poll(() => existsSync(c.out), { ...patiently, interval: 500 }).toBe(true);
    expect(JSON.parse(readFileSync(c.out, "utf8"))).toEqual({ ...env.expected, generation });
    await expect.poll(() => leftovers(env.hosts, hostCount), patiently).toEqual([]);
    await expect.poll(() => stagingLeft(c, DDP), patiently).toEqual([]);
  }

  describe.each(OUTAGES)("controller $name", (outage) => {
    it(
      "while the job trains: it trains on at the rate it had; back, a move completes",
      async ({ annotate }) => {
        await withCluster({ controllerHost: outage.controllerHost }, async (c, hold) => {
          const steps = watchSteps(c, 0);
          try {
            // The first mark includes the job's start-up; the rate is taken from the second on.
            await expect.poll(() => steps.marks.length, patiently).toBeGreaterThanOrEqual(4);
            const before = steps.rate(steps.marks[1]!.at);
            const away = performance.now();
            outage.begin(c);
            await expect.poll(() => c.log(c.launchers[0]!), patiently).toContain("the controller does not answer: training goes on");
            await expect.poll(() => steps.marks.filter((m) => m.at > away).length, patiently).toBeGreaterThanOrEqual(3);
            const during = steps.rate(away);
            // The job must not end while the controller is away: it waits, still, for the rest of the outage.
            expect(pauseTraining(env.hosts, DDP, "SIGSTOP")).toBe(4);
            await annotate(
              `controller ${outage.name}: ${during.toFixed(1)} steps/s against ${before.toFixed(1)} before, ${((during / before - 1) * 100).toFixed(1)}%`,
            );
            // The rate itself is noise on a shared machine; a job that waited on the controller would stall.
            expect(during / before).toBeGreaterThan(0.5);
            await new Promise((resolve) => setTimeout(resolve, Math.max(0, outage.awayWhileTrainingS * 1000 - (performance.now() - away))));
            await outage.end(c);
            await expect.poll(() => c.log(c.launchers[0]!), patiently).toContain("the controller answers again");
            await heardFromAll(c);
          } finally {
            steps.stop();
          }
          pauseTraining(env.hosts, DDP, "SIGCONT");
          // Nothing is held back this time: the other job arrives, and both moves run through.
          writeFileSync(`${hold}.go`, "");
          writeFileSync(c.gate, "");
          await plannedWhilePaused(async () => (await c.client.status()).migrations.some((m) => m.job === DDP.name && m.stopStep !== null));
          await movesDone(c);
          await endsBitIdentical(c, 1);
        });
      },
      6 * SAFETY_NET_MS,
    );

    it(
      "before a move commits: the held job lets go and trains on; back, the move rolls back as the hosts did and a new one completes",
      async () => {
        await withCluster({ controllerHost: outage.controllerHost, replanBackoffS: 1 }, async (c, hold) => {
          const move = await moveUnderWay(c);
          outage.begin(c);
          for (const launcher of c.launchers) {
            await expect
              .poll(() => c.log(launcher), patiently)
              .toMatch(new RegExp(`hold timeout ${HOLD_TIMEOUT_S * 1000} ms\\): letting go of stop \\S+ and training on`));
          }
          await expect.poll(() => Math.min(logged(c, 0), logged(c, 1)), patiently).toBeGreaterThanOrEqual(move.stopStep! + 50);
          // Back, the move that had not committed rolls back, as the hosts did, and a plan after
          // the backoff moves the job's host again (training held still meanwhile).
          writeFileSync(`${hold}.go`, "");
          expect(pauseTraining(env.hosts, DDP, "SIGSTOP")).toBe(4);
          await outage.end(c);
          expect(await rollbackReason(c, move.id)).toMatch(outage.rollback);
          // Two states, each waited for on its own: a new plan moves the job, then its replacement
          // is up (or waited for past --replacement-wait) and the job is told where to stop.
          const next = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name && m.id !== move.id);
          await expect.poll(async () => (await next()) !== undefined, { ...patiently, interval: 200 }).toBe(true);
          await expect.poll(async () => (await next())?.stopStep ?? null, { ...patiently, interval: 200 }).not.toBeNull();
          pauseTraining(env.hosts, DDP, "SIGCONT");
          await expect.poll(async () => (await c.client.status()).jobs.find((j) => j.id === DDP.name)?.generation, { ...patiently, interval: 200 }).toBe(1);
          await endsBitIdentical(c, 1);
        });
      },
      6 * SAFETY_NET_MS,
    );
  });

  it.each(OUTAGES.filter((o) => o.controllerHost === undefined))(
    "controller $name after a move commits: the sealed hosts wait; back, the move completes",
    async (outage) => {
      // The job pauses without waiting for its replacement, as it does for one slower to start
      // than --replacement-wait.
      await withCluster({ replanBackoffS: 1, replacementWaitS: 0 }, async (c, hold) => {
        writeFileSync(c.gate, "");
        const move = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name);
        await plannedWhilePaused(async () => (await move())?.stopStep != null);
        const { id, to } = (await move())!;
        // The replacement is held still as soon as it starts, before it can register: the move
        // commits and then waits in `committing` for it.
        const replacement = await expect
          .poll(() => replacementLauncher(env.hosts, to), { ...patiently, interval: 20 })
          .toBeDefined()
          .then(() => replacementLauncher(env.hosts, to)!);
        process.kill(replacement, "SIGSTOP");
        writeFileSync(`${hold}.go`, "");
        await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === id)?.state, { ...patiently, interval: 50 }).toBe("committing");
        outage.begin(c);
        // Sealed, the job's hosts do not let go, however long the controller is away.
        await new Promise((resolve) => setTimeout(resolve, 2 * HOLD_TIMEOUT_S * 1000));
        for (const launcher of c.launchers) expect(c.log(launcher)).not.toContain("letting go of stop");
        await outage.end(c);
        process.kill(replacement, "SIGCONT");
        await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === id)?.state, { ...patiently, interval: 200 }).toBe("done");
        if (outage.restarts)
          expect(c.log(c.controller())).toContain(`migration ${id}: committed before the restart; asking host ${to} for the replacement again`);
        await endsBitIdentical(c, 1);
      });
    },
    6 * SAFETY_NET_MS,
  );

  it(
    "controller cut off by the network after a move commits: the job trains on re-formed; back, the move completes",
    async () => {
      // The other job's checkpoint is held back, so the plan step commits only when the test says.
      await withCluster({ controllerHost: CONTROLLER_HOST }, async (c, hold) => {
        writeFileSync(c.gate, "");
        const move = async () => (await c.client.status()).migrations.find((m) => m.job === DDP.name);
        await plannedWhilePaused(async () => (await move())?.stopStep != null);
        const { id, to, from, stopStep } = (await move())!;
        // The replacement, up before the commit, registered and waits for it; it is then held still,
        // so the move stays committed but not done while the controller is cut off: it can report
        // its new generation only later.
        await expect.poll(() => c.log(c.controller()), patiently).toContain(`migration ${id}: the replacement on host ${to} is ready before the commit`);
        const replacement = replacementLauncher(env.hosts, to)!;
        expect(replacement).toBeDefined();
        process.kill(replacement, "SIGSTOP");
        writeFileSync(`${hold}.go`, "");
        await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === id)?.state, { ...patiently, interval: 50 }).toBe("resuming");
        env.hosts.link(CONTROLLER_HOST, "down");
        process.kill(replacement, "SIGCONT");
        // The stayer and the replacement re-form and train on without the controller.
        const stayer = c.launchers[DDP.hosts[0]!.indexOf(DDP.hosts[0]!.find((h) => h !== from)!)]!;
        await expect.poll(() => c.log(stayer), patiently).toContain("training resumed");
        await expect.poll(() => logged(c, c.launchers.indexOf(stayer)), patiently).toBeGreaterThanOrEqual(stopStep! + 50);
        env.hosts.link(CONTROLLER_HOST, "up");
        await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === id)?.state, { ...patiently, interval: 200 }).toBe("done");
        await endsBitIdentical(c, 1);
      });
    },
    6 * SAFETY_NET_MS,
  );
});
