import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { Dealer, Router } from "zeromq";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import { Launcher } from "../../sdk/client/launch/launcher.ts";
import { adaptTorchrun } from "../../sdk/client/launch/torchrun.ts";
import type { Logger } from "../../sdk/contract/log.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { runCli } from "../helpers/cli.ts";
import { startController, tempDir, type Harness } from "../service/harness.ts";

// What `monkeytree launch` refuses: torchrun flags it owns, a malformed replacement
// environment, a worker the controller refuses, and requests on its local channel that break
// the channel protocol (each answered with an error, the launcher training on).

const CHANNEL_SCRIPT = new URL("./fixtures/channel-script.mjs", import.meta.url).pathname;

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function controller(): Promise<Harness> {
  const harness = await startController();
  cleanups.push(() => harness.close());
  return harness;
}

/** Sets `env` in this process (the CLI runs in-process) until the test ends. */
function environment(env: Record<string, string>): void {
  Object.assign(process.env, env);
  cleanups.push(() => {
    for (const name of Object.keys(env)) delete process.env[name];
  });
}

describe("adaptTorchrun refusals", () => {
  it.each([
    [["torchrun", "--rdzv_endpoint=h:29400", "t.py"], "remove --rdzv-endpoint from the torchrun command"],
    [["torchrun", "--standalone", "t.py"], "remove --standalone from the torchrun command"],
    [["torchrun", "--max-restarts", "3", "t.py"], "remove --max-restarts from the torchrun command"],
    [["python3", "-m", "torch.distributed.run", "--node_rank", "1", "t.py"], "remove --node-rank from the torchrun command"],
    [
      ["torchrun", "--nproc-per-node=0", "t.py"],
      `--nproc-per-node must be a whole number of processes from 1 to 64 (monkeytree launch needs it explicit), got "0"`,
    ],
    [
      ["torchrun", "--nproc-per-node=65", "t.py"],
      `--nproc-per-node must be a whole number of processes from 1 to 64 (monkeytree launch needs it explicit), got "65"`,
    ],
    [
      ["torchrun", "--nproc_per_node"],
      `--nproc-per-node must be a whole number of processes from 1 to 64 (monkeytree launch needs it explicit), got "undefined"`,
    ],
  ])("refuses %j", (argv, message) => {
    expect(() => adaptTorchrun(argv)).toThrow(message);
  });
});

describe("monkeytree launch refusals", () => {
  const replacementEnv = {
    MONKEYTREE_CONTROLLER: "tcp://127.0.0.1:1",
    MONKEYTREE_HOST: "3",
    MONKEYTREE_JOB: "a",
    MONKEYTREE_GROUP: "0",
    MONKEYTREE_TP: "1",
    MONKEYTREE_PP: "1",
    MONKEYTREE_DP: "2",
    MONKEYTREE_NODE_RANK: "1",
    MONKEYTREE_NODES: "2",
    MONKEYTREE_MIGRATION: "p0/0",
    MONKEYTREE_TOKEN: "t",
    MONKEYTREE_STAGING_BUFFER: "b",
    MONKEYTREE_STAGING_OFFSET: "0",
    MONKEYTREE_STAGING_LENGTH: "65536",
  };

  it.each([
    ["a host that is not a number", { MONKEYTREE_HOST: "three" }, "replacement environment at MONKEYTREE_HOST: "],
    ["no staging buffer", { MONKEYTREE_STAGING_BUFFER: "" }, "replacement environment at MONKEYTREE_STAGING_BUFFER: "],
  ])("exits 2 naming the variable when a replacement's environment has %s", async (_, change, message) => {
    environment({ ...replacementEnv, ...change });
    const result = await runCli("launch", "--", "torchrun", "t.py");
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(message);
    expect(result.stderr).toContain("; a replacement gets these from the daemon that starts it");
  });

  it("exits 2 when the checkpoint staging leaves less than a page for each process", async () => {
    const result = await runCli(
      "launch",
      "--job",
      "a",
      "--host",
      "0",
      "--dp",
      "1",
      "--checkpoint-bytes",
      "4096",
      "--",
      "torchrun",
      "--nproc-per-node",
      "2",
      "t.py",
    );
    expect(result).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("\nmonkeytree launch: --checkpoint-bytes 4096 leaves less than a page for each of 2 processes\n"),
    });
  });

  it("exits 1 with the controller's reason when it refuses a worker's registration", async () => {
    const harness = await controller();
    environment({ CHANNEL_SCRIPT: "[]" });
    const result = await runCli(
      "launch",
      "--job",
      "a",
      "--host",
      "99",
      "--dp",
      "1",
      "--connect",
      harness.server.endpoint,
      "--",
      CHANNEL_SCRIPT,
      "--log",
      "/dev/null",
    );
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^monkeytree launch: .*host 99 is out of range: the cluster has hosts 0\.\.7/m);
  });

  it("exits 1 naming both versions when the controller speaks another protocol version", async () => {
    // A controller of the previous release answers every request in its version.
    const old = new Router({ linger: 0 });
    await old.bind("tcp://127.0.0.1:*");
    cleanups.push(() => old.close());
    void (async () => {
      for await (const [peer, frame] of old) {
        const { id } = JSON.parse(frame!.toString()) as { id: number };
        const message = "protocol version 2 is not supported: this side speaks version 1; upgrade the older side";
        await old.send([peer!, JSON.stringify({ v: 1, type: "error", id, code: "unsupported_version", message })]);
      }
    })().catch(() => undefined);
    environment({ CHANNEL_SCRIPT: "[]" });
    const result = await runCli("launch", "--job", "a", "--host", "0", "--dp", "1", "--connect", old.lastEndpoint!, "--", CHANNEL_SCRIPT, "--log", "/dev/null");
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(
      `monkeytree launch: the controller at ${old.lastEndpoint!} speaks another protocol version: protocol version 1 is not supported: this client speaks version 2`,
    );
  });

  it("is refused by name by a controller of another protocol version", async () => {
    const harness = await controller();
    const launcher = new Dealer({ linger: 0 });
    cleanups.push(() => launcher.close());
    launcher.connect(harness.server.endpoint);
    // What a launcher of the previous release sends at every step.
    await launcher.send(JSON.stringify({ v: 1, type: "worker.barrier", id: 4, worker: { job: "a", group: 0, host: 0 }, step: 7, generation: 0 }));
    const [reply] = await launcher.receive();
    expect(JSON.parse(reply!.toString())).toEqual({
      v: PROTOCOL_VERSION,
      type: "error",
      id: 4,
      code: "unsupported_version",
      message: `protocol version 1 is not supported: this controller speaks version ${PROTOCOL_VERSION}; run the same MonkeyTree release on the controller, the daemons and the launchers`,
    });
  });

  it("exits 2 when the job's master host runs no daemon, naming the command that starts one", async () => {
    const harness = await controller();
    environment({ CHANNEL_SCRIPT: "[]" });
    const result = await runCli(
      "launch",
      "--job",
      "a",
      "--host",
      "0",
      "--dp",
      "1",
      "--connect",
      harness.server.endpoint,
      "--",
      CHANNEL_SCRIPT,
      "--log",
      "/dev/null",
    );
    expect(result).toMatchObject({
      code: 2,
      stderr: expect.stringContaining(
        "monkeytree launch: the job's master, host 0, runs no monkeytree daemon, so its address is unknown; start `monkeytree daemon --host 0` there",
      ),
    });
  });
});

describe("the launcher's local channel", () => {
  it("answers each request that breaks the channel protocol with an error, and trains on", async () => {
    const harness = await controller();
    const daemon = HostDaemon.start({
      host: 0,
      controller: harness.server.endpoint,
      stagingBytes: 1 << 16,
      listen: { host: "127.0.0.1", port: 0 },
      heartbeatMs: 1_000,
    });
    cleanups.push(() => daemon.close());
    await daemon.ready();
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const log = join(dir, "channel.jsonl");
    const line = (message: Record<string, unknown>) => JSON.stringify({ v: 1, ...message });
    const script = [
      { conn: 0, line: "not json", await: true },
      { conn: 0, line: line({ type: "attach", localRank: 0 }), await: true },
      { conn: 0, line: JSON.stringify({ v: 2, type: "attach", localRank: 0, pid: 1 }), await: true },
      { conn: 0, line: line({ type: "attach", localRank: 2, pid: 1 }), await: true },
      { conn: 0, line: line({ type: "saved", localRank: 0, bytes: 1 }), await: true },
      { conn: 0, line: line({ type: "attach", localRank: 0, pid: 1 }), await: true },
      { conn: 0, line: line({ type: "barrier", localRank: 0, step: 3 }), await: true },
      { conn: 1, line: line({ type: "attach", localRank: 1, pid: 1 }), await: true },
      { conn: 1, line: line({ type: "barrier", localRank: 1, step: 3 }), await: true },
      { conn: 1, line: line({ type: "barrier", localRank: 1, step: 3 }), await: true },
    ];
    environment({ CHANNEL_SCRIPT: JSON.stringify(script) });
    const logs: string[] = [];
    const record = (make: () => string) => void logs.push(make());
    const logger: Logger = { debug: record, info: record, warn: record, error: record };
    const launcher = new Launcher({
      controller: harness.server.endpoint,
      worker: { job: "a", group: 0, host: 0 },
      parallelism: { tp: 1, pp: 1, dp: 1 },
      checkpointBytes: 2 * 4096,
      masterPortBase: 29700,
      torchrun: adaptTorchrun([CHANNEL_SCRIPT, "--nproc-per-node", "2", "--log", log]),
      replacement: null,
      log: logger,
    });
    expect(await launcher.run()).toBe(0);

    const replies = readFileSync(log, "utf8")
      .trim()
      .split("\n")
      .map((entry) => JSON.parse(entry) as { conn: number; reply: Record<string, unknown> });
    const errors = replies.filter(({ reply }) => reply.type === "error").map(({ conn, reply }) => [conn, reply.message]);
    expect(errors).toEqual([
      [0, "not JSON: not json"],
      [0, expect.stringMatching(/^channel request at pid: /)],
      [0, expect.stringMatching(/^channel request at v: /)],
      [0, "localRank 2 is not below --nproc-per-node 2"],
      [0, "local rank 0 saved a checkpoint nobody asked for (the host is running)"],
    ]);
    // With no stop to hold at, each barrier is answered on the host at once, a repeated one too.
    expect(replies.filter(({ reply }) => reply.type === "directive").map(({ conn, reply }) => [conn, reply.directive])).toEqual([
      [0, { kind: "continue" }],
      [1, { kind: "continue" }],
      [1, { kind: "continue" }],
    ]);
    expect(logs).toContain("barrier 3 reached");
  });
});
