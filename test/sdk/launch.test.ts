import { spawn } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DaemonHosts } from "../../controller/service/daemon-hosts.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import { VouchSocket } from "../../controller/daemon/vouch-socket.ts";
import { adaptTorchrun } from "../../sdk/client/launch/torchrun.ts";
import { CLI, sharedFile, shellCommand } from "../../cli/demo/processes.ts";
import { TENANT, tenantDir } from "../helpers/tenant.ts";
import { startController, tempDir, type Harness } from "../service/harness.ts";
import { runCli } from "../helpers/cli.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";

/** One line of the fake torchrun's log. */
interface Entry {
  pid: number;
  localRank?: number;
  sent?: string;
  reply?: {
    type: string;
    rank: number;
    worldSize: number;
    generation: number;
    resume: { step: number; buffer: string; offset: number; length: number } | null;
    directive?: { kind: string; generation?: number; buffer?: string; offset?: number; length?: number };
  };
  resumeCheck?: boolean;
  length?: number;
  resuming?: string;
  expected?: [string | null, string | null];
  ranges?: { outbox: string; share: string; inbox?: string; inboxOffset?: string };
  done?: boolean;
}

const FAKE_TORCHRUN = new URL("./fixtures/fake-torchrun.mjs", import.meta.url).pathname;

describe("adaptTorchrun", () => {
  it("runs torchrun as a single-node job on a port the kernel picks and reads --nproc-per-node in either spelling", () => {
    const command = adaptTorchrun(["torchrun", "--nproc-per-node", "8", "train.py", "--lr", "3"]);
    expect(command.nprocPerNode).toBe(8);
    expect(command.local).toEqual([
      "torchrun",
      "--nnodes=1",
      "--node_rank=0",
      "--master_addr=127.0.0.1",
      "--master_port=0",
      "--nproc-per-node",
      "8",
      "train.py",
      "--lr",
      "3",
    ]);
    expect(adaptTorchrun(["torchrun", "--nproc_per_node=4", "train.py"]).nprocPerNode).toBe(4);
    expect(adaptTorchrun(["torchrun", "train.py", "--nnodes", "2"]).nprocPerNode).toBe(1);
    const module = adaptTorchrun(["python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py"]);
    expect(module.local.slice(0, 4)).toEqual(["python3", "-m", "torch.distributed.run", "--nnodes=1"]);
    expect(module.nprocPerNode).toBe(2);
  });

  it("refuses flags that would set up a rendezvous of its own, naming them", () => {
    expect(() => adaptTorchrun(["torchrun", "--nnodes=2", "train.py"])).toThrow(/remove --nnodes/);
    expect(() => adaptTorchrun(["torchrun", "--master_addr", "x", "train.py"])).toThrow(/remove --master-addr/);
    expect(() => adaptTorchrun(["torchrun", "--nproc-per-node", "gpu", "train.py"])).toThrow(/--nproc-per-node must be a whole number/);
    expect(() => adaptTorchrun([])).toThrow(/no command after `--`/);
  });
});

describe("monkeytree launch", () => {
  const cleanups: (() => Promise<void> | void)[] = [];
  let harness: Harness | undefined;
  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
    await harness?.close();
    harness = undefined;
  });

  it("prints its help, but leaves --help after `--` to the wrapped command", async () => {
    expect(await runCli("launch", "--help")).toMatchObject({ code: 0, stdout: expect.stringContaining("usage: monkeytree launch") });
    // The flags before `--` lack --job, so the launcher itself reports that instead of printing help.
    expect(await runCli("launch", "--host", "0", "--dp", "1", "--", "torchrun", "--help")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("--job is required"),
    });
  });

  it("rejects a missing torchrun command and bad flags with exit code 2", async () => {
    expect(await runCli("launch", "--job", "a", "--host", "0", "--dp", "2")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("give the torchrun command after `--`"),
    });
    expect(await runCli("launch", "--host", "0", "--dp", "2", "--", "torchrun", "t.py")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("--job is required"),
    });
    expect(await runCli("launch", "--job", "a", "--host", "0", "--", "torchrun", "--nnodes", "2", "t.py")).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("remove --nnodes"),
    });
  });

  it(
    "asks its host's daemon to vouch for it, without which a controller with --require-vouch refuses its worker",
    async () => {
      const daemons = new DaemonHosts();
      harness = await startController({ overrides: { requireVouch: true, transport: daemons, launcher: daemons, daemons } });
      const dir = tempDir();
      cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
      const daemon = HostDaemon.start({
        host: 0,
        controller: harness.server.endpoint,
        stagingBytes: 1 << 20,
        listen: { host: "127.0.0.1", port: 0 },
        retryMs: 200,
      });
      cleanups.push(() => daemon.close());
      await daemon.ready();
      const silent = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };
      const vouching = await VouchSocket.open(join(dir, "daemon-0.sock"), (job) => daemon.vouch(job), silent);
      cleanups.push(() => vouching.close());
      const launch = (socket: string) =>
        runCli(
          "launch",
          "--job",
          "a",
          "--host",
          "0",
          "--dp",
          "1",
          "--connect",
          harness!.server.endpoint,
          "--daemon-socket",
          socket,
          "--checkpoint-bytes",
          "65536",
          "--",
          FAKE_TORCHRUN,
          "--steps",
          "3",
          "--step-ms",
          "10",
          "--log",
          join(dir, "log.jsonl"),
        );
      expect(await launch(join(dir, "no-daemon.sock"))).toMatchObject({
        code: 1,
        stderr: expect.stringContaining(`host 0's daemon has not vouched for a launcher of job "a"`),
      });
      expect(await launch(vouching.path)).toMatchObject({ code: 0, stderr: expect.stringContaining("host 0's daemon vouched for this launcher") });
    },
    SAFETY_NET_MS,
  );

  it("exits 1 with the controller's reason when it refuses a replacement's token", async () => {
    harness = await startController();
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const env = {
      MONKEYTREE_CONTROLLER: harness.server.endpoint,
      MONKEYTREE_HOST: "3",
      MONKEYTREE_JOB: "ghost",
      MONKEYTREE_GROUP: "0",
      MONKEYTREE_TP: "1",
      MONKEYTREE_PP: "1",
      MONKEYTREE_DP: "2",
      MONKEYTREE_NODE_RANK: "1",
      MONKEYTREE_NODES: "2",
      MONKEYTREE_MIGRATION: "p9/0",
      MONKEYTREE_TOKEN: "no-such-token",
      MONKEYTREE_STAGING_BUFFER: "nothing",
      MONKEYTREE_STAGING_OFFSET: "0",
      MONKEYTREE_STAGING_LENGTH: "65536",
    };
    Object.assign(process.env, env);
    cleanups.push(() => {
      for (const name of Object.keys(env)) delete process.env[name];
    });
    const result = await runCli("launch", "--checkpoint-bytes", "65536", "--", FAKE_TORCHRUN, "--log", join(dir, "log.jsonl"));
    expect(result).toMatchObject({ code: 1, stderr: expect.stringMatching(/^monkeytree launch: token does not admit job "ghost" group 0 on host 3/m) });
  });

  it(
    "ranks local processes from the controller, migrates a worker with every local rank's checkpoint, and the replacement resumes from it",
    async () => {
      // Nothing here must time out: the daemons' command and heartbeat timeouts are the defaults.
      const daemons = new DaemonHosts();
      harness = await startController({ overrides: { transport: daemons, launcher: daemons, daemons } });
      const endpoint = harness.server.endpoint;
      const dir = tenantDir();
      cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
      const log = join(dir, "channel.jsonl");
      // Sources and replacements (run as the tenant) append to one log.
      sharedFile(log, TENANT);
      // No job trains past iteration 5 before its move chose its stop step, so the plan always
      // finds both jobs training, however long this machine takes to start the second one.
      const planned = join(dir, "planned");
      // Long enough that a stop projected past where the jobs waited (below) still comes before the end.
      const steps = 200;
      const torchrun = [
        FAKE_TORCHRUN,
        "--nproc-per-node",
        "2",
        "--steps",
        String(steps),
        "--step-ms",
        "40",
        "--log",
        log,
        "--pause-at",
        "5",
        "--resume-when-exists",
        planned,
      ];
      const shared = ["--checkpoint-bytes", String(1 << 16), "--master-port", "29600"];
      // The daemons' replacement re-creates the launcher's command; job, host and controller come from the move.
      const replacements = new Map([["fake", shellCommand([process.execPath, ...CLI, "launch", ...shared, "--", ...torchrun])]]);
      for (let host = 0; host < 8; host++) {
        const daemon = HostDaemon.start({
          host,
          controller: endpoint,
          stagingBytes: 1 << 20,
          listen: { host: "127.0.0.1", port: 0 },
          heartbeatMs: 100,
          retryMs: 200,
          replacements,
          ...(TENANT ? { runAs: TENANT } : {}),
        });
        cleanups.push(() => daemon.close());
        await daemon.ready();
      }
      const exits: Promise<number | null>[] = [];
      const start = (job: string, hosts: number[]) => {
        for (const host of hosts) {
          const child = spawn(
            process.execPath,
            [...CLI, "launch", "--job", job, "--host", String(host), "--dp", "2", "--connect", endpoint, "--replacement", "fake", ...shared, "--", ...torchrun],
            { stdio: "ignore" },
          );
          exits.push(new Promise((resolve) => child.once("exit", resolve)));
          cleanups.push(() => void child.kill("SIGKILL"));
        }
      };
      const client = new ControllerClient({ endpoint, timeoutMs: 5_000 });
      cleanups.push(() => client.close());
      // Whichever job completes its registration second takes both racks over their bound.
      start("a", [0, 4]);
      start("b", [1, 5]);
      // Released once the move chose its stop, which it does while both jobs wait at iteration 5.
      const stopping = async () => {
        const { migrations } = await client.status();
        return migrations.length > 0 && migrations.every((m) => m.stopStep !== null);
      };
      await expect.poll(stopping, patiently).toBe(true);
      writeFileSync(planned, "");
      const entries = () =>
        readFileSync(log, "utf8")
          .split("\n")
          .filter((line) => line !== "")
          .map((line) => JSON.parse(line) as Entry);
      // Every launcher that started exits 0: trained to the end, or moved away.
      expect(await Promise.all(exits)).toEqual([0, 0, 0, 0]);
      await expect.poll(() => entries().filter((e) => e.resumeCheck !== undefined).length, patiently).toBeGreaterThanOrEqual(2);

      // Replacements run on after their sources exited; the test ends when every torchrun has.
      const pids = (key: keyof Entry) =>
        new Set(
          entries()
            .filter((e) => e[key] !== undefined)
            .map((e) => e.pid),
        ).size;
      await expect.poll(() => pids("done") > 0 && pids("done") === pids("sent"), patiently).toBe(true);
      const moves = (await client.status()).migrations;
      expect(moves.every((m) => m.state === "done")).toBe(true);
      // Mid-training. Not necessarily at 5, where the jobs waited: the controller projects a job's
      // pace from its last reports, and a report late on a loaded machine projects it further.
      for (const m of moves) expect(m.stopStep).toBeLessThan(steps);
      const attached = entries().flatMap((e) => (e.sent === "attach" && e.reply ? [e.reply] : []));
      // Four launchers and at least one replacement, two local processes each; world = nodes × nproc.
      expect(attached.length).toBeGreaterThanOrEqual(10);
      for (const a of attached) expect(a).toMatchObject({ type: "attached", worldSize: 4, masterAddr: "127.0.0.1", masterPort: 29600 + a.generation });
      // Told before attach whether they resume: replacements, and only they.
      const attaches = entries().filter((e) => e.sent === "attach");
      expect(attaches.map((e) => e.resuming)).toEqual(attaches.map((e) => (e.reply?.resume ? "1" : "0")));
      // Replacements are also told the place they get (2 local processes per node); others nothing.
      const place = (e: Entry) => (e.reply?.resume ? [String((e.reply.rank - e.localRank!) / 2), String(e.reply.worldSize / 2)] : [null, null]);
      expect(attaches.map((e) => e.expected)).toEqual(attaches.map(place));
      // Each process was told its ranges before attach: the ones it was later given to save into and load from.
      const rangesOf = new Map(attaches.map((e) => [e.pid, e.ranges!]));
      const share = (e: Entry) => Number(rangesOf.get(e.pid)!.share);
      for (const e of attaches.filter((a) => a.reply?.resume)) {
        const { inbox, inboxOffset } = rangesOf.get(e.pid)!;
        expect(e.reply!.resume).toMatchObject({ buffer: inbox, offset: Number(inboxOffset) + e.localRank! * share(e), length: share(e) });
      }
      const outs = entries().filter((e) => e.reply?.directive?.kind === "migrate-out");
      expect(outs.length).toBe(2 * moves.length);
      for (const e of outs)
        expect(e.reply!.directive).toMatchObject({ buffer: rangesOf.get(e.pid)!.outbox, offset: e.localRank! * share(e), length: share(e) });
      const fresh = attached.filter((a) => a.resume === null && a.generation === 0);
      expect(fresh.map((a) => a.rank).sort()).toEqual([0, 0, 1, 1, 2, 2, 3, 3]);

      const saved = entries().filter((e) => e.sent === "saved");
      expect(saved.map((e) => e.localRank).sort()).toEqual(moves.flatMap(() => [0, 1]).sort());
      const resumed = entries().filter((e) => e.resumeCheck !== undefined);
      expect(resumed.map((e) => e.resumeCheck)).toEqual(resumed.map(() => true));
      expect(resumed.map((e) => e.length)).toEqual(resumed.map(() => 1 << 15));
      for (const a of attached) if (a.resume) expect(moves.map((m) => m.stopStep)).toContain(a.resume.step);
      // The job's other worker re-formed its group for the new generation.
      expect(entries().some((e) => e.reply?.directive?.kind === "reconfigure" && e.reply.directive.generation === 1)).toBe(true);
    },
    3 * SAFETY_NET_MS,
  );
});
