import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, ProcessGroup, shellCommand, type Managed } from "../../cli/demo/processes.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { tempDir } from "../service/harness.ts";
import { TRAIN_ENV } from "./cluster.ts";
import { createHosts, type Hosts } from "./netns.ts";
import { referenceRun } from "./reference.ts";
import { canRun, networkNamespaces, slurm, torch } from "../helpers/prerequisites.ts";
import { PYTHON } from "../helpers/python.ts";
import { startSlurm, type SlurmCluster } from "../helpers/slurm.ts";
import { TENANT, tenantDir } from "../helpers/tenant.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/**
 * The Slurm integration end to end: a real Slurm (slurmctld, one slurmd per node) over six
 * emulated hosts, n0–n2 under leaf switch r0 and n3–n5 under r1 (topology.conf), each host's
 * network a namespace. The controller runs with `--scheduler slurm`, a daemon in every host's
 * namespace. n5 is drained, and a torchrun DDP job submitted with sbatch runs one `srun …
 * monkeytree launch` step on each of n1 and n4. Well into its training a job that did not opt
 * in (a plain sleep) starts on n0 and n3. Both jobs then cross the racks, each of which has one
 * uplink, so the controller must move a DDP worker: the only move it may make is n4 → n2 (the
 * sleep job is pinned, n5 drained).
 */

const TRAIN = "examples/ddp/train.py";
const STEPS = 2000;
const NODES = 6;
const PINNED = ["n0", "n3"];
const DDP = ["n1", "n4"];
const DRAINED = "n5";
const SOURCE = "n4";
const DESTINATION = "n2";

const runs = canRun("test/e2e/slurm-migration.test.ts", slurm(), torch(), networkNamespaces());

const envWords = Object.entries(TRAIN_ENV).map(([k, v]) => `${k}=${v}`);
const index = (node: string) => Number(node.slice(1));

describe.runIf(runs)("a torchrun job under Slurm migrated off a rack that a job which did not opt in fragments", () => {
  let hosts: Hosts | undefined;
  let cluster: SlurmCluster | undefined;
  let group: ProcessGroup | undefined;
  let client: ControllerClient | undefined;
  let reference: string;
  const dirs: string[] = [];

  beforeAll(async () => {
    const dir = tempDir();
    dirs.push(dir);
    reference = (await referenceRun(TRAIN, 2, ["--steps", String(STEPS)], dir)).digest;
    hosts = createHosts(NODES);
    cluster = await startSlurm({ nodes: NODES, racks: 2 });
  }, 4 * SAFETY_NET_MS);

  afterAll(async () => {
    await client?.close();
    // Jobs first, while slurmd still runs: their steps' processes outside the namespaces (the sleep) end with them.
    if (cluster) {
      spawnSync("scancel", ["--user", "root"], { env: cluster.env });
      await cluster.until("no jobs left", () => cluster!.run("squeue", "-h").trim() === "", 30_000).catch(() => undefined);
    }
    await group?.stopAll(2_000);
    hosts?.remove();
    cluster?.stop();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  }, 120_000);

  it("moves the DDP worker n4 → n2 bit-identically; Slurm's books follow, the pinned job and the drained node are untouched, and nothing stays held", async () => {
    const h = hosts!;
    const slurmCluster = cluster!;
    const run = slurmCluster.run;
    const dir = tenantDir();
    dirs.push(dir);
    group = new ProcessGroup(dir);
    const topologyConf = join(slurmCluster.dir, "topology.conf");
    const controller = group.start("controller", [
      ...CLI,
      "controller",
      "--scheduler",
      "slurm",
      "--topology",
      topologyConf,
      "--uplinks-per-rack",
      "1",
      "--slurm-conf",
      slurmCluster.conf,
      "--scheduler-poll",
      "0.5",
      "--bind",
      `tcp://${h.bridgeAddress}:*`,
      "--insecure",
      "--journal",
      join(dir, "journal"),
    ]);
    group.controller = (await group.waitFor(controller, /controller listening on (tcp:\/\/\S+)/, SAFETY_NET_MS))[1]!;
    const endpoint = group.controller;
    client = new ControllerClient({ endpoint, timeoutMs: 10_000 });
    // The site configuration every `monkeytree` reads: where the controller is, and the names of the hosts.
    const config = join(dir, "config.json");
    writeFileSync(config, JSON.stringify({ controller: endpoint, topology: topologyConf, uplinksPerRack: 1 }));

    const out = join(dir, "ddp.json");
    const launch = [
      "--replacement",
      "ddp",
      "--checkpoint-bytes",
      String(8 * 2 ** 20),
      "--master-port",
      "29700",
      "--",
      PYTHON,
      "-m",
      "torch.distributed.run",
      "--nproc_per_node",
      "1",
      TRAIN,
      "--steps",
      String(STEPS),
      "--out",
      out,
    ];
    const replacement = shellCommand(["env", ...envWords, process.execPath, ...CLI, "launch", ...launch]);
    const daemons = new Map<string, Managed>();
    for (const node of slurmCluster.nodes) {
      const argv = [
        ...h.exec(index(node)).slice(1),
        "env",
        ...envWords,
        `MONKEYTREE_CONFIG=${config}`,
        process.execPath,
        ...CLI,
        "daemon",
        "--host",
        node,
        "--listen",
        `${h.address(index(node))}:0`,
        "--heartbeat",
        "0.1",
        "--staging-bytes",
        String(64 * 2 ** 20),
        "--replacement",
        `ddp=${replacement}`,
        ...(TENANT ? ["--run-as", TENANT.user] : []),
      ];
      // ProcessGroup starts Node programs; `ip netns exec` is started through node's own -e.
      daemons.set(
        node,
        group.start(`daemon-${node}`, [
          "-e",
          `require("child_process").spawn("ip", ${JSON.stringify(argv)}, { stdio: "inherit" }).on("exit", (c, s) => process.exit(c ?? 1))`,
        ]),
      );
    }
    // A safety net only: six daemons starting in six namespaces on a loaded machine are slow.
    await expect.poll(async () => (await client!.status()).hosts.registered, { timeout: 180_000, interval: 500 }).toBe(NODES);

    const squeue = (job: string) => run("squeue", "-h", "-j", job, "-o", "%T %N").trim();
    const nodeState = (node: string) => run("sinfo", "-h", "-N", "-n", node, "-o", "%t").trim();
    const holds = () =>
      [...run("scontrol", "show", "reservation", "-o").matchAll(/ReservationName=(monkeytree-\S+) .*?Nodes=(\S+)/g)].map(
        ([, name, nodes]) => `${name} ${nodes}`,
      );

    run("scontrol", "update", `NodeName=${DRAINED}`, "State=DRAIN", "Reason=fan");

    // One step per node, each entering its host's namespace; `launch` takes the job, host,
    // DP degree and controller from srun's environment and the site configuration.
    const steps = DDP.map(
      (node) =>
        `srun -N1 -n1 -w ${node} ${shellCommand([...h.exec(index(node)), "env", ...envWords, `MONKEYTREE_CONFIG=${config}`, process.execPath, ...CLI, "launch", ...launch])} &`,
    );
    const ddp = run(
      "sbatch",
      "--parsable",
      "-o",
      join(dir, "ddp-%j.out"),
      "-N2",
      `--nodelist=${DDP.join(",")}`,
      "--wrap",
      [...steps, "wait"].join("\n"),
    ).trim();
    await slurmCluster.until("the DDP job running", () => squeue(ddp) === "RUNNING n[1,4]");
    // Alone it crosses the racks within their uplinks; well into training, the job that did not opt in arrives.
    const furthest = () => Math.max(-1, ...[...readFileSync(join(dir, `ddp-${ddp}.out`), "utf8").matchAll(/barrier (\d+) reached/g)].map((m) => Number(m[1])));
    await expect.poll(furthest, { timeout: 120_000, interval: 200 }).toBeGreaterThanOrEqual(100);
    expect((await client.status()).migrations).toEqual([]);
    const pinned = slurmCluster.sbatch("sleep 100000", "-N2", `--nodelist=${PINNED.join(",")}`, "--comment=monkeytree:rings=1");
    await slurmCluster.until("the pinned job running", () => squeue(pinned) === "RUNNING n[0,3]");

    // The move: planned because both racks carry two rings over one uplink, done once the replacement trains on n2.
    const done = async () => {
      const status = await client!.status();
      return status.migrations.length > 0 && status.migrations.every((m) => m.state === "done") ? status : undefined;
    };
    await expect.poll(done, { timeout: 180_000, interval: 250 }).toBeDefined();
    const status = (await done())!;
    expect(status.migrations.map((m) => ({ job: m.job, from: m.from, to: m.to }))).toEqual([{ job: ddp, from: index(SOURCE), to: index(DESTINATION) }]);
    expect(status.withinBounds).toBe(true);
    expect(status.scheduler?.pinned).toEqual([{ id: pinned, rings: 1, hosts: PINNED.map(index) }]);

    // A job asking for the destination while the moved worker trains there waits.
    const probe = slurmCluster.sbatch("true", `--nodelist=${DESTINATION}`);
    // Slurm's books: the source given back (idle), the destination held for the DDP job, whose allocation kept only its batch host.
    await slurmCluster.until("the source given back", () => squeue(ddp) === "RUNNING n1" && nodeState(SOURCE) === "idle");
    expect(holds()).toEqual([expect.stringMatching(new RegExp(`^monkeytree-${ddp}-\\S+ ${DESTINATION}$`))]);
    await slurmCluster.until("the probe job pending on the hold", () =>
      /^PENDING .*(ReqNodeNotAvail|Reserved)/.test(run("squeue", "-h", "-j", probe, "-o", "%T %R").trim()),
    );
    expect(existsSync(out)).toBe(false);
    expect(squeue(pinned)).toBe("RUNNING n[0,3]");
    expect(nodeState(DRAINED)).toMatch(/^drain/);

    // Training ends on n1 and n2, bit-identical to the unmigrated run.
    await expect.poll(() => existsSync(out), { timeout: 240_000, interval: 500 }).toBe(true);
    const result = JSON.parse(readFileSync(out, "utf8")) as { step: number; worldSize: number; generation: number; digest: string };
    expect(result).toMatchObject({ step: STEPS, worldSize: 2, generation: 1 });
    expect(result.digest).toBe(reference);
    await expect.poll(() => readFileSync(daemons.get(DESTINATION)!.log, "utf8"), patiently).toMatch(/replacement launcher exited \(code 0\)/);

    // The job ended, so the controller releases its hold, and the probe job gets the destination.
    await slurmCluster.until("the DDP job gone", () => run("squeue", "-h", "-j", ddp, "-o", "%T").trim() === "");
    await slurmCluster.until("the hold released", () => holds().length === 0);
    await slurmCluster.until("the probe job run", () => run("squeue", "-h", "-j", probe).trim() === "");
    expect(squeue(pinned)).toBe("RUNNING n[0,3]");
    expect(nodeState(DRAINED)).toMatch(/^drain/);
    expect((await client!.status()).scheduler?.holds).toEqual([]);
  }, 900_000);
});
