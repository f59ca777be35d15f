import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { CLI } from "../../cli/paths.ts";
import { describeEvent, renderStatus } from "../../cli/status.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import type { ControllerEvent } from "../../sdk/contract/protocol/events.ts";
import type { StatusReport } from "../../sdk/contract/protocol/status.ts";
import { runCli } from "../helpers/cli.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";
import { closeControllersAfterEach, tempDirsPerTest, track } from "../service/harness.ts";

/** `monkeytree status` as people read it, and the controller's worker liveness flags. */

const tempDir = tempDirsPerTest();
closeControllersAfterEach();
const teardown: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const step of teardown.splice(0).reverse()) await step();
});

const report = (jobs: StatusReport["jobs"]): StatusReport => ({
  v: PROTOCOL_VERSION,
  type: "status.report",
  id: 1,
  topology: { racks: 2, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 1 },
  lambda: 1,
  jobs,
  workers: jobs.reduce((sum, j) => sum + j.hosts.length, 0),
  hosts: { registered: 0, lost: [] },
  fragmentation: [0, 0],
  withinBounds: true,
  routes: { isolated: true, dpFlows: 0, maxFlowsPerLink: 0 },
  migrations: [],
  journalRecords: 3,
});

describe("monkeytree status, for people", () => {
  it("lists each job's lost workers by host, and counts them", () => {
    const text = renderStatus(
      report([
        { id: "a", hosts: [0, 1, 2], expected: 3, started: true, generation: 0, lost: [0, 2] },
        { id: "b", hosts: [4, 5], expected: 2, started: true, generation: 1 },
      ]),
    );
    expect(text).toContain("2 jobs, 5 workers (2 lost), 0 host daemons");
    expect(text).toContain(
      [
        "job  workers  expected  started  generation  hosts  lost",
        "  a        3         3      yes           0  0 1 2   0 2",
        "  b        2         2      yes           1    4 5     -",
      ].join("\n"),
    );
  });

  it("says when a worker is lost in the event stream", () => {
    const event: ControllerEvent = { seq: 7, at: Date.UTC(2025, 0, 1, 12, 0, 0, 5), event: "worker-lost", job: "a", host: 3, silentMs: 10_040 };
    expect(describeEvent(event)).toBe("12:00:00.005  worker of job a on host 3 lost: no word from its launcher for 10040 ms");
  });
});

describe("monkeytree controller --worker-heartbeat-timeout and --lost-job-grace", () => {
  const TIMEOUT_S = 4;
  const GRACE_S = 1;

  /** The controller as an operator starts it; resolves with its address once it listens. */
  async function controller(...flags: string[]): Promise<string> {
    const child = spawn(process.execPath, [...CLI, "controller", "--bind", "tcp://127.0.0.1:0", "--journal", tempDir(), ...flags], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    const exited = new Promise((resolve) => child.once("exit", resolve));
    teardown.push(() => {
      child.kill("SIGTERM");
      return exited;
    });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    return new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout }).on("line", (line) => {
        const match = /^controller listening on (\S+)$/.exec(line);
        if (match?.[1]) resolve(match[1]);
      });
      void exited.then(() => reject(new Error(`the controller exited: ${stderr}`)));
    });
  }

  it(
    "declare a silent worker lost after the timeout, show it in status, and end the job after the grace",
    async () => {
      const endpoint = await controller("--worker-heartbeat-timeout", String(TIMEOUT_S), "--lost-job-grace", String(GRACE_S));
      const client = track(new ControllerClient({ endpoint, timeoutMs: 5_000, retryMs: 200 }));
      const worker = (host: number) => ({ job: "a", group: 0, host });
      const workers = [0, 1].map((host) => new WorkerClient(client, worker(host), { tp: 1, pp: 1, dp: 2 }, { reportIntervalMs: 500 }));
      for (const w of workers) teardown.push(() => w.close());
      await Promise.all(workers.map((w) => w.register(5_000)));
      // Host 0's launcher reports once more and falls silent; host 1's reports on.
      workers[0]!.close();
      expect(await client.report({ worker: worker(0), generation: 0, step: 0, stepMs: null, hold: null })).toEqual({ kind: "run" });

      await expect.poll(async () => (await runCli("status", "--connect", endpoint)).stdout, patiently).toMatch(/^\s+a\s+2\s+2\s+yes\s+0\s+0 1\s+0$/m);
      workers[1]!.close();
      await expect.poll(async () => (await client.status()).jobs, patiently).toEqual([]);

      const { events } = await client.events(0);
      const lost = events.filter((e) => e.event === "worker-lost");
      expect(lost.map((e) => e.host)).toEqual([0, 1]);
      // On the controller's own clock: each lost once silent for the timeout, not the default
      // 10 s, and the job ended about the grace after the last, not the default 60 s.
      for (const e of lost) expect(e.silentMs).toBeGreaterThanOrEqual(TIMEOUT_S * 1000);
      expect(lost[0]!.silentMs).toBeLessThan(10_000);
      const finished = events.find((e) => e.event === "job-finished");
      expect(finished!.at - lost[1]!.at).toBeLessThan(60_000);
    },
    SAFETY_NET_MS,
  );

  it("refuse a worker timeout shorter than four of the launchers' reports, and a negative grace", async () => {
    expect(await runCli("controller", "--worker-heartbeat-timeout", "1")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining('--worker-heartbeat-timeout must be a number from 4 to 2147483, got "1"'),
    });
    expect(await runCli("controller", "--lost-job-grace=-1")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining('--lost-job-grace must be a number from 0 to 2147483, got "-1"'),
    });
  });
});
