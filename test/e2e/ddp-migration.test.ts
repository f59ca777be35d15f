import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, ProcessGroup, RUN_TS, shellCommand, WORKER, type Managed } from "../../cli/demo/processes.ts";
import { ControllerClient } from "../../sdk/client.ts";
import { tempDir } from "../service/harness.ts";
import { createHosts, type Hosts } from "./netns.ts";
import { referenceDigest, TRAIN } from "./reference.ts";
import { canRun, networkNamespaces, torch } from "../helpers/prerequisites.ts";
import { PYTHON } from "../helpers/python.ts";
import { TENANT, tenantDir } from "../helpers/tenant.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/**
 * A real torchrun DDP job (gloo, CPU, Debian's torch) migrated between emulated hosts: four
 * network namespaces on a bridge, two racks of two hosts with one uplink each. The controller
 * runs beside the bridge, a daemon and a `monkeytree launch` in every host's namespace. The
 * DDP job trains on hosts 0 and 2; when it is well into training a second job arrives on hosts
 * 1 and 3, both racks go over their bound, and the controller swaps a DDP worker with one of
 * the other job's. The DDP job must end with parameters bit-identical to an unmigrated run.
 */

const FAULT_WORKER = "test/service/fixtures/fault-worker.ts";
const STEPS = 300;
const TOPOLOGY = { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 };

const runs = canRun("test/e2e/ddp-migration.test.ts", torch(), networkNamespaces());

const env = { PYTHONPATH: "sdk/python", GLOO_SOCKET_IFNAME: "eth0", OMP_NUM_THREADS: "1" };

describe.skipIf(!runs)("a live DDP job migrated between network namespaces", () => {
  let hosts: Hosts;
  let reference: string;
  const dirs: string[] = [];

  beforeAll(async () => {
    hosts = createHosts(4);
    const dir = tempDir();
    dirs.push(dir);
    reference = await referenceDigest(STEPS, dir);
  }, 3 * SAFETY_NET_MS);

  afterAll(() => {
    hosts?.remove();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  /**
   * Controller, a daemon per host, the DDP job on hosts 0 and 2, and the gated second job on 1
   * and 3: the example training loop, or with `hold` a worker whose checkpoint waits for
   * `<hold>.go` before it leaves, which keeps the plan step from committing until then.
   * `heartbeatTimeoutS` is short only where a test needs a daemon declared lost: torch keeps
   * this machine busy, and no daemon a test keeps running may miss it.
   */
  async function cluster({ hold, heartbeatTimeoutS = 10 }: { hold?: string; heartbeatTimeoutS?: number } = {}) {
    // Replacements, run as the tenant, write the DDP job's result here too.
    const dir = tenantDir();
    dirs.push(dir);
    const group = new ProcessGroup(dir);
    const snapshot = join(dir, "topology.json");
    writeFileSync(snapshot, JSON.stringify({ topology: TOPOLOGY, jobs: [] }));
    // The bridge joins only this test's namespaces, so the controller may listen there without keys.
    const controller = group.start("controller", [...CLI, "controller", "--snapshot", snapshot, "--bind", `tcp://${hosts.bridgeAddress}:*`, "--insecure", "--journal", join(dir, "journal"), "--heartbeat-timeout", String(heartbeatTimeoutS)]);
    const endpoint = (await group.waitFor(controller, /controller listening on (tcp:\/\/\S+)/, SAFETY_NET_MS))[1]!;
    const client = new ControllerClient({ endpoint, timeoutMs: 10_000 });
    const inHost = (host: number, args: string[]) => [...hosts.exec(host).slice(1), "env", ...Object.entries(env).map(([k, v]) => `${k}=${v}`), process.execPath, ...args];
    // ProcessGroup starts Node programs; `ip netns exec` is started through node's own -e.
    const startIn = (name: string, host: number, args: string[]): Managed =>
      group.start(name, ["-e", `require("child_process").spawn("ip", ${JSON.stringify(inHost(host, args))}, { stdio: "inherit" }).on("exit", (c, s) => process.exit(c ?? 1))`]);
    const out = join(dir, "ddp.json");
    const launch = [
      "--checkpoint-bytes", String(8 * 2 ** 20), "--master-port", "29700",
      "--", PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "1", TRAIN, "--steps", String(STEPS), "--out", out,
    ];
    const other = [...(hold === undefined ? [...WORKER, "--tp", "1", "--state-bytes", String(2 ** 20), "--step-ms", "50"] : [RUN_TS, FAULT_WORKER, "--fault", `hold:${hold}`]), "--steps", "100000"];
    // A daemon passes a replacement none of its own environment: the hook's path and gloo's interface go in its command.
    const replacements = [
      "--replacement", `ddp=${shellCommand(["env", ...Object.entries(env).map(([k, v]) => `${k}=${v}`), process.execPath, ...CLI, "launch", ...launch])}`,
      "--replacement", `other=${shellCommand([process.execPath, ...other])}`,
      ...(TENANT ? ["--run-as", TENANT.user] : []),
    ];
    const daemons = [0, 1, 2, 3].map((host) =>
      startIn(`daemon-${host}`, host, [...CLI, "daemon", "--host", String(host), "--connect", endpoint, "--listen", `${hosts.address(host)}:0`, "--heartbeat", "0.1", "--staging-bytes", String(64 * 2 ** 20), ...replacements]),
    );
    // A safety net only: four daemons compiling in four namespaces on a loaded machine are slow.
    await expect
      .poll(async () => (await client.status()).hosts.registered, { ...patiently, interval: 200 })
      .toBe(4)
      .catch(async (error: unknown) => {
        await client.close();
        await group.stopAll(2_000);
        throw error;
      });
    const ddp = [0, 2].map((host) => startIn(`ddp-${host}`, host, [...CLI, "launch", "--job", "ddp", "--host", String(host), "--dp", "2", "--connect", endpoint, "--replacement", "ddp", ...launch]));
    const gate = join(dir, "other.admitted");
    for (const host of [1, 3]) {
      startIn(`other-${host}`, host, [...other, "--controller", endpoint, "--job", "other", "--host", String(host), "--dp", "2", "--replacement", "other", "--start-when-exists", gate]);
    }
    const teardown = async () => {
      await client.close();
      await group.stopAll(2_000);
      hosts.killAll();
    };
    return { dir, group, client, controller, daemons, ddp, out, gate, teardown };
  }

  const log = (managed: Managed) => readFileSync(managed.log, "utf8");


  it("moves a DDP worker to the other rack mid-training; training resumes and ends bit-identical to an unmigrated run", async () => {
    const c = await cluster();
    try {
      await expect.poll(() => log(c.ddp[0]!), patiently).toMatch(/every local process at barrier 50\b/);
      writeFileSync(c.gate, "");
      await expect.poll(async () => (await c.client.status()).migrations.map((m) => m.state).join(","), { ...patiently, interval: 200 }).toMatch(/^done,done$/);
      const moves = (await c.client.status()).migrations;
      const moved = moves.find((m) => m.job === "ddp")!;
      expect(Math.floor(moved.from / 2)).not.toBe(Math.floor(moved.to / 2));
      expect((await c.client.status()).withinBounds).toBe(true);
      await expect.poll(() => existsSync(c.out), { ...patiently, interval: 500 }).toBe(true);
      const result = JSON.parse(readFileSync(c.out, "utf8")) as { step: number; worldSize: number; generation: number; digest: string };
      expect(result).toMatchObject({ step: STEPS, worldSize: 2, generation: 1 });
      expect(result.digest).toBe(reference);
      // The source's launcher stopped cleanly once its replacement took over; the stayer and the
      // replacement (started by the destination's daemon) ran to the end and exited 0.
      expect(await Promise.all(c.ddp.map((launcher) => launcher.exited))).toEqual([0, 0]);
      await expect.poll(() => log(c.daemons[moved.to]!), patiently).toMatch(/replacement launcher exited \(code 0\)/);
    } finally {
      await c.teardown();
    }
  }, 4 * SAFETY_NET_MS);

  it("rolls back when the destination's daemon dies during the move; the job continues on its old hosts, bit-identical", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const hold = join(dir, "hold");
    const c = await cluster({ hold, heartbeatTimeoutS: 2 });
    try {
      await expect.poll(() => log(c.ddp[0]!), patiently).toMatch(/every local process at barrier 50\b/);
      writeFileSync(c.gate, "");
      // The other job's checkpoint is held back, so the DDP move cannot commit; once the
      // destination's daemon has been asked to stage, kill it.
      const staging = async () => (await c.client.status()).migrations.find((m) => m.job === "ddp" && m.state !== "planned" && m.state !== "pausing");
      await expect.poll(staging, { ...patiently, interval: 20 }).toBeDefined();
      const move = (await staging())!;
      expect(["staging", "transferring", "verifying", "staged"]).toContain(move.state);
      c.group.kill(c.daemons[move.to]!, "SIGKILL");
      await expect.poll(async () => (await c.client.status()).migrations.find((m) => m.id === move.id)?.state, { ...patiently, interval: 200 }).toBe("rolled-back");
      writeFileSync(`${hold}.go`, "");
      await expect.poll(() => existsSync(c.out), { ...patiently, interval: 500 }).toBe(true);
      const result = JSON.parse(readFileSync(c.out, "utf8")) as { step: number; generation: number; digest: string };
      expect(result).toMatchObject({ step: STEPS, generation: 0 });
      expect(result.digest).toBe(reference);
      expect(await Promise.all(c.ddp.map((launcher) => launcher.exited))).toEqual([0, 0]);
    } finally {
      await c.teardown();
    }
  }, 4 * SAFETY_NET_MS);
});
