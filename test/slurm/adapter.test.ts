import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { hostIndexOf, parseTopologyFile, type NamedTopology } from "../../controller/planner/model/named-topology.ts";
import { SlurmAdapter, SlurmStateError } from "../../controller/schedulers/slurm/adapter.ts";
import { holdName, Slurm } from "../../controller/schedulers/slurm/commands.ts";
import { topologyFromConf } from "../../controller/schedulers/slurm/topology-conf.ts";
import { createLogger } from "../../sdk/contract/log.ts";
import { StatusReportSchema } from "../../sdk/contract/protocol/status.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { runCli } from "../helpers/cli.ts";
import { INCARNATION, plannedMoves, startController } from "../service/harness.ts";
import { canRun, slurm } from "../helpers/prerequisites.ts";
import { startSlurm, type SlurmCluster } from "../helpers/slurm.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

// Against a real slurmctld and four slurmd (two racks of two nodes), as Debian packages them.
const runs = canRun("the Slurm adapter's tests", slurm());

// Each test waits on Slurm's daemons, some on a controller's process and its first plan too.
describe.runIf(runs)("the Slurm adapter against a real Slurm 22.05", { timeout: 3 * SAFETY_NET_MS }, () => {
  let cluster: SlurmCluster;
  let topology: NamedTopology;
  let adapter: SlurmAdapter;
  const managed = new Set<string>();
  const lines: string[] = [];

  beforeAll(async () => {
    cluster = await startSlurm({ nodes: 4, racks: 2 });
    topology = parseTopologyFile(topologyFromConf(readFileSync(join(cluster.dir, "topology.conf"), "utf8"), { uplinksPerRack: 1, gpusPerHost: 1 }));
    adapter = new SlurmAdapter({
      slurm: new Slurm({ conf: cluster.conf }),
      topology,
      managed: () => managed,
      log: createLogger("slurm", (line) => lines.push(line)),
    });
  }, 3 * SAFETY_NET_MS);
  afterAll(() => cluster?.stop());
  // The cluster is this suite's alone: a test that failed half-way leaves no job, drained node
  // or reservation (a hold) to the next.
  afterEach(async () => {
    if (!cluster) return;
    cluster.run("scancel", "--user", "root");
    for (const line of cluster.run("sinfo", "-h", "-N", "-o", "%N %t").trim().split("\n")) {
      const [node, nodeState] = line.split(" ");
      if (node && /^dr/.test(nodeState ?? "")) cluster.run("scontrol", "update", `NodeName=${node}`, "State=RESUME");
    }
    for (const name of cluster.run("scontrol", "show", "reservation", "-o").matchAll(/ReservationName=(\S+)/g))
      cluster.run("scontrol", "delete", `ReservationName=${name[1]}`);
    await cluster.until("no jobs left", () => cluster.run("squeue", "-h").trim() === "");
  });

  const state = (job: string) => cluster.run("squeue", "-h", "-j", job, "-o", "%T %R").trim();
  const nodeState = (node: string) => cluster.run("sinfo", "-h", "-n", node, "-N", "-o", "%t").trim();
  const unavailable = async () => new Map((await adapter.poll()).unavailable.map((u) => [u.host, u.why]));

  it("imports the cluster's topology.conf: two racks of two named nodes", () => {
    expect(topology.topology).toEqual({ racks: 2, hostsPerRack: 2, gpusPerHost: 1, uplinksPerRack: 1 });
    expect(topology.hostNames).toEqual(["n0", "n1", "n2", "n3"]);
  });

  it("sees every node available when idle, and a drained node unavailable until resumed", async () => {
    await cluster.until("backfill's plans cleared", async () => (await unavailable()).size === 0);
    cluster.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=maintenance");
    const drained = await unavailable();
    expect([...drained]).toEqual([[3, "drain (maintenance)"]]);
    cluster.run("scontrol", "update", "NodeName=n3", "State=RESUME");
    await cluster.until("n3 available again", async () => (await unavailable()).size === 0);
  });

  it("never plans onto a node another reservation holds, without waiting for Slurm to flag it", async () => {
    cluster.run("scontrol", "create", "reservation", "ReservationName=maint", "Nodes=n2", "Users=root", "StartTime=now", "Duration=60", "Flags=MAINT");
    expect([...(await unavailable())]).toEqual([[2, "reserved (maint)"]]);
    cluster.run("scontrol", "delete", "ReservationName=maint");
    await cluster.until("n2 available again", async () => (await unavailable()).size === 0);
  });

  it("counts a plain sbatch job as pinned on its nodes, with rings from its comment, until it ends", async () => {
    const job = cluster.sbatch("sleep 600", "-N2", "--nodelist=n1,n2", "--comment=monkeytree:rings=2");
    await cluster.until("the job running", () => state(job).startsWith("RUNNING"));
    // With 2 GPUs per host the job, one host on each rack, can carry the 2 rings its comment says.
    const twoGpus = parseTopologyFile(topologyFromConf(readFileSync(join(cluster.dir, "topology.conf"), "utf8"), { uplinksPerRack: 1, gpusPerHost: 2 }));
    const view = await new SlurmAdapter({
      slurm: new Slurm({ conf: cluster.conf }),
      topology: twoGpus,
      managed: () => managed,
      log: createLogger("slurm", (line) => lines.push(line)),
    }).poll();
    expect(view.pinned).toEqual([{ id: job, rings: 2, hosts: [1, 2] }]);
    expect(view.notes).toEqual([]);
    // With 1 GPU per host it can carry only 1 ring out of either rack: the comment counts up to that, and the view says so.
    const bounded = await adapter.poll();
    expect(bounded.pinned).toEqual([{ id: job, rings: 1, hosts: [1, 2] }]);
    expect(bounded.notes).toEqual([
      `Slurm job ${job}: monkeytree:rings=2 is more than its allocation carries (1 GPUs on the rack where it has fewest); counted as 1`,
    ]);
    expect(new Map(view.unavailable.map((u) => [u.host, u.why]))).toEqual(
      new Map([
        [1, `allocated to Slurm job ${job}`],
        [2, `allocated to Slurm job ${job}`],
      ]),
    );
    // Once its launchers register, the same job is MonkeyTree's to move: no longer pinned, and its nodes are swap destinations.
    managed.add(job);
    const mine = await adapter.poll();
    expect(mine.pinned).toEqual([]);
    expect(mine.unavailable).toEqual([]);
    managed.delete(job);
    cluster.run("scancel", job);
    await cluster.until("the job gone", async () => (await adapter.poll()).pinned.length === 0);
  });

  it("monkeytree slurm prints the cluster as Slurm holds it, and writes the snapshot the planner reads", async () => {
    const job = cluster.sbatch("sleep 600", "-N2", "--nodelist=n1,n2", "--comment=monkeytree:rings=2");
    await cluster.until("the job running", () => state(job).startsWith("RUNNING"));
    cluster.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=fan");
    const output = join(cluster.dir, "snapshot.json");
    // 2 GPUs per host, so the job (one host on each rack) carries the 2 rings its comment says.
    const conf = ["--topology", join(cluster.dir, "topology.conf"), "--uplinks-per-rack", "1", "--gpus-per-host", "2", "--slurm-conf", cluster.conf];
    const text = await runCli("slurm", ...conf, "--output", output);
    expect(text.stderr).toBe("");
    const why = `allocated to Slurm job ${job}`;
    expect(text.stdout).toBe(
      [
        "2 racks × 2 hosts, 1 uplinks per rack; 1 pinned jobs, 3 unavailable hosts, 0 holds",
        "",
        "pinned job  rings  hosts",
        `${job.padStart(10)}      2  n1 n2`,
        "",
        `unavailable  ${"why".padStart(why.length)}`,
        `         n1  ${why}`,
        `         n2  ${why}`,
        `         n3  ${"drain (fan)".padStart(why.length)}`,
        "",
      ].join("\n"),
    );
    const snapshot = JSON.parse(readFileSync(output, "utf8")) as unknown;
    expect(snapshot).toEqual({
      topology: { ...topology.topology, gpusPerHost: 2 },
      jobs: [{ id: job, rings: 2, hosts: [1, 2], movable: false }],
      unavailable: [1, 2, 3],
    });
    // `monkeytree plan` accepts it as a snapshot (exit 2 would be a refused input).
    const plan = await runCli("plan", "--snapshot", output, "--json");
    expect(plan.stderr).toBe("");
    expect(plan.code).not.toBe(2);
    cluster.run("scontrol", "update", "NodeName=n3", "State=RESUME");
    cluster.run("scancel", job);
    await cluster.until("the job gone", async () => (await adapter.poll()).pinned.length === 0);
  });

  it("monkeytree controller --scheduler slurm counts a job that did not register, never moves it, and shows what Slurm says", async () => {
    const journal = join(cluster.dir, "journal");
    const args = [
      "controller",
      "--scheduler",
      "slurm",
      "--slurm-conf",
      cluster.conf,
      "--scheduler-poll",
      "0.2",
      "--topology",
      join(cluster.dir, "topology.conf"),
      "--uplinks-per-rack",
      "1",
      "--gpus-per-host",
      "2",
      "--bind",
      "tcp://127.0.0.1:*",
      "--journal",
      journal,
    ];
    const child = spawn(process.execPath, ["bin/run-ts.js", "cli/monkeytree.ts", ...args], { stdio: ["ignore", "pipe", "pipe"] });
    const logs: string[] = [];
    createInterface({ input: child.stderr! }).on("line", (line) => logs.push(line));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      const endpoint = await new Promise<string>((resolve) =>
        createInterface({ input: child.stdout! }).on("line", (line) => {
          const match = /^controller listening on (\S+)$/.exec(line);
          if (match?.[1]) resolve(match[1]);
        }),
      );
      const status = async () => StatusReportSchema.parse(JSON.parse((await runCli("status", "--connect", endpoint, "--json")).stdout));
      const job = cluster.sbatch("sleep 600", "-N2", "--nodelist=n1,n2", "--comment=monkeytree:rings=2");
      await cluster.until("the controller counting the job", async () => (await status()).scheduler?.pinned.length === 1);
      const report = await status();
      expect(report.scheduler).toEqual({
        pinned: [{ id: job, rings: 2, hosts: [1, 2] }],
        unavailable: [
          { host: 1, why: `allocated to Slurm job ${job}` },
          { host: 2, why: `allocated to Slurm job ${job}` },
        ],
        holds: [],
      });
      // Its two rings (its 2-GPU hosts carry both) cross both racks' single uplinks; only moving it would help, which is not
      // MonkeyTree's to do: the planner, told it is pinned, plans no move.
      expect(report).toMatchObject({ fragmentation: [2, 2], withinBounds: false, migrations: [] });
      await cluster.until("the plan without moves logged", () => logs.some((line) => line.includes("fragmentation over λ 1: plan unchanged, 0 moves")));
      expect((await status()).migrations).toEqual([]);
      cluster.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=psu");
      await cluster.until("n3 unavailable", async () => (await status()).scheduler?.unavailable.some((u) => u.host === 3 && u.why === "drain (psu)"));
      cluster.run("scontrol", "update", "NodeName=n3", "State=RESUME");
      cluster.run("scancel", job);
      await cluster.until("the job gone", async () => (await status()).scheduler?.pinned.length === 0);
      expect((await status()).withinBounds).toBe(true);
    } finally {
      child.kill("SIGTERM");
    }
    expect(await exited).toBe(0);
  });

  it("holds a destination so Slurm starts nothing there, and releases it when the job ends", async () => {
    const job = cluster.sbatch("sleep 600", "-N1", "--nodelist=n0");
    await cluster.until("the job running", () => state(job).startsWith("RUNNING"));
    const hold = await adapter.hold(job, "p0/0", hostIndexOf(topology, "n2"));
    // The job runs as root, and no replacement does: the hold names no user for it.
    expect(hold).toEqual({ name: holdName(job, "p0/0"), job, node: "n2", host: 2, user: null });
    // Holding again (a restarted controller redoing its step) changes nothing.
    await adapter.hold(job, "p0/0", 2);
    const other = cluster.sbatch("sleep 600", "-N1", "--nodelist=n2");
    await cluster.until("the other job refused n2", () => state(other) === "PENDING (ReqNodeNotAvail, May be reserved for other job)");
    const view = await adapter.poll();
    expect(view.holds).toEqual([{ name: hold.name, job, node: "n2", host: 2 }]);
    // A node held for a moved worker is the job's own, not a foreign one.
    expect(view.unavailable.map((u) => u.host)).not.toContain(2);
    cluster.run("scancel", job);
    // The next poll after the job's end releases the hold, and Slurm starts the waiting job there.
    await cluster.until("the hold released", async () => (await adapter.poll()).holds.length === 0);
    await cluster.until("the other job on n2", () => state(other) === "RUNNING n2");
    cluster.run("scancel", other);
  });

  it("releases a rolled-back move's hold", async () => {
    const job = cluster.sbatch("sleep 600", "-N1", "--nodelist=n0");
    await cluster.until("the job running", () => state(job).startsWith("RUNNING"));
    await adapter.hold(job, "p1/0", 3);
    await cluster.until("n3 reserved", () => nodeState("n3") === "resv");
    await adapter.release(job, "p1/0");
    await adapter.release(job, "p1/0");
    expect((await adapter.poll()).holds).toEqual([]);
    await cluster.until("n3 idle", () => nodeState("n3") === "idle");
    cluster.run("scancel", job);
  });

  it("gives a vacated node back by shrinking the job, but never its batch host", async () => {
    const job = cluster.sbatch("sleep 600", "-N3", "--nodelist=n0,n1,n2");
    await cluster.until("the job running", () => state(job).startsWith("RUNNING"));
    const batchHost = /BatchHost=(\S+)/.exec(cluster.run("scontrol", "show", "job", job))?.[1];
    expect(batchHost).toBe("n0");
    await expect(adapter.giveBack(job, 0)).rejects.toThrow(SlurmStateError);
    await expect(adapter.giveBack(job, 3)).rejects.toThrow(/n3 is not allocated to Slurm job/);
    await adapter.giveBack(job, 2);
    await cluster.until("n2 idle", () => nodeState("n2") === "idle");
    expect(state(job)).toBe("RUNNING n[0-1]");
    // Without slurmdbd, Slurm 22.05 resizes a running job once: a second give-back is refused
    // with the reason, and the node stays the job's (never handed to another job while a worker may use it).
    await expect(adapter.giveBack(job, 1)).rejects.toThrow(/without slurmdbd, Slurm 22.05 accepts one resize of a running job/);
    expect(state(job)).toBe("RUNNING n[0-1]");
    expect(nodeState("n1")).toBe("alloc");
    cluster.run("scancel", job);
  });

  it("keeps Slurm's books around a controller's move: holds the destination, gives the source back, releases at the job's end", async () => {
    // Job a (two rings) spans both racks over their single uplinks; c fills the rest of rack 1,
    // so the one move that helps is a's worker from n2 to the idle n1.
    const a = cluster.sbatch("sleep 600", "-N2", "--nodelist=n0,n2");
    const c = cluster.sbatch("sleep 600", "-N1", "--nodelist=n3");
    await cluster.until("both jobs running", () => state(a).startsWith("RUNNING") && state(c).startsWith("RUNNING"));
    const scheduler = new SlurmAdapter({
      slurm: new Slurm({ conf: cluster.conf }),
      topology,
      managed: () => new Set([a, c]),
      log: createLogger("slurm", (line) => lines.push(line)),
    });
    const harness = await startController({
      topology: { racks: 2, hostsPerRack: 2, gpusPerHost: 8, uplinksPerRack: 1 },
      overrides: { scheduler, schedulerPollMs: 200 },
    });
    const client = new ControllerClient({ endpoint: harness.server.endpoint, timeoutMs: 5_000, retryMs: 200 });
    try {
      await cluster.until("the controller's first look at Slurm", async () => (await client.status()).scheduler !== undefined);
      // The stayer's barrier is held across several of Slurm's state changes: the controller's
      // answers to its reports keep the hold (no hold timeout ends it).
      const options = { checkpointBytes: 1 << 20 };
      await new WorkerClient(client, { job: c, group: 0, host: 3 }, { tp: 1, pp: 1, dp: 1 }, options).register(5_000);
      const tp2 = { tp: 2, pp: 1, dp: 2 };
      const workers = [0, 2].map((host) => new WorkerClient(client, { job: a, group: 0, host }, tp2, options));
      await Promise.all(workers.map((w) => w.register(5_000)));
      const move = (await plannedMoves(client))[0]!;
      expect(move).toMatchObject({ job: a, from: 2, to: 1 });
      const [stayer, source] = workers as [WorkerClient, WorkerClient];
      // The workers hold at the stop once they know of it.
      await cluster.until("the job's workers told of the stop", () => workers.every((w) => w.stop !== null));
      const step = stayer.stop!.step;
      expect(source.stop?.step).toBe(step);
      const stayerBarrier = stayer.barrier(step);
      expect((await source.barrier(step)).kind).toBe("migrate-out");
      // Held before staging: Slurm starts no other job on n1.
      const other = cluster.sbatch("sleep 600", "-N1", "--nodelist=n1");
      await cluster.until("the other job refused n1", () => state(other) === "PENDING (ReqNodeNotAvail, May be reserved for other job)");
      const verdict = source.barrier(step);
      await client.request({ type: "daemon.register", host: 1, incarnation: INCARNATION, stagingBytes: 1 << 30, endpoint: "tcp://127.0.0.1:1" });
      await client.request({ type: "daemon.transfer-result", host: 1, token: `token-${move.id}`, bytes: 1 << 20, outcome: "verified" });
      expect(await verdict).toMatchObject({ kind: "stop" });
      // Committed: the job no longer holds n2, which Slurm may use again; n1 stays held for the moved worker.
      await cluster.until("n2 given back", () => state(a) === "RUNNING n0" && nodeState("n2") === "idle");
      expect(state(other)).toBe("PENDING (ReqNodeNotAvail, May be reserved for other job)");
      // A hold slurmctld lost (as one made in the second before a crash) is made again on the
      // controller's next look: n1 lies outside job a's allocation and runs its worker.
      cluster.run("scancel", other);
      cluster.run("scontrol", "delete", `ReservationName=${holdName(a, move.id)}`);
      await cluster.until("n1 held again", () => cluster.run("scontrol", "show", "reservation", "-o").includes(`ReservationName=${holdName(a, "keep-1")} `));
      const waiting = cluster.sbatch("sleep 600", "-N1", "--nodelist=n1");
      await cluster.until("the waiting job refused n1", () => state(waiting) === "PENDING (ReqNodeNotAvail, May be reserved for other job)");
      const moved = new WorkerClient(client, { job: a, group: 0, host: 1 }, tp2, { ...options, token: `token-${move.id}` });
      await moved.register(5_000);
      expect(await stayerBarrier).toMatchObject({ kind: "reconfigure" });
      // The job ends: the controller's next look releases the hold, and Slurm starts the waiting
      // job there; the controller ends the job too, so the moved worker, which no Slurm step
      // reaches, is told to stop.
      cluster.run("scancel", a);
      await cluster.until("the waiting job on n1", () => state(waiting) === "RUNNING n1");
      await cluster.until("the controller ending job a", async () => !(await client.status()).jobs.some((j) => j.id === a));
      expect(await moved.barrier(step + 1)).toMatchObject({ kind: "stop" });
      cluster.run("scancel", c, waiting);
    } finally {
      await client.close();
      await harness.close();
    }
  });

  it("keeps holds across a slurmctld restart, and a new adapter releases those of jobs that ended meanwhile", async () => {
    const job = cluster.sbatch("sleep 600", "-N1", "--nodelist=n0");
    await cluster.until("the job running", () => state(job).startsWith("RUNNING"));
    await adapter.hold(job, "p2/0", 1);
    await cluster.restartController("SIGTERM");
    expect((await adapter.poll()).holds).toEqual([{ name: holdName(job, "p2/0"), job, node: "n1", host: 1 }]);
    cluster.run("scancel", job);
    await cluster.until("the job gone", () => !state(job).startsWith("RUNNING"));
    const restarted = new SlurmAdapter({ slurm: new Slurm({ conf: cluster.conf }), topology, managed: () => managed, log: createLogger("slurm", () => {}) });
    await cluster.until("the hold released", async () => (await restarted.poll()).holds.length === 0);
    expect(cluster.run("scontrol", "show", "reservation", "-o")).not.toContain(holdName(job, "p2/0"));
  });
});
