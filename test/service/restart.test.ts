import { spawn, type ChildProcess } from "node:child_process";
import { rmSync } from "node:fs";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { ControllerClient, WorkerClient } from "../../sdk/client.ts";
import { tempDir } from "./harness.ts";

const fixture = "test/service/fixtures/controller-process.ts";
const children: ChildProcess[] = [];
const clients: ControllerClient[] = [];
const dirs: string[] = [];

afterEach(async () => {
  await Promise.all(clients.splice(0).map((c) => c.close()));
  for (const child of children.splice(0)) if (child.exitCode === null) child.kill("SIGKILL");
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

interface Running {
  readonly child: ChildProcess;
  readonly endpoint: string;
  readonly spawns: unknown[];
  kill(): Promise<void>;
}

/** Starts the controller process and waits for its endpoint. */
async function launch(dir: string, bind: string): Promise<Running> {
  const child = spawn(process.execPath, ["bin/run-ts.js", fixture, dir, bind], { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  const spawns: unknown[] = [];
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const endpoint = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`controller did not start: ${stderr}`)), 15_000);
    createInterface({ input: child.stdout! }).on("line", (line) => {
      if (line.startsWith("listening ")) {
        clearTimeout(timer);
        resolve(line.slice("listening ".length));
      } else if (line.startsWith("spawn ")) spawns.push(JSON.parse(line.slice("spawn ".length)));
    });
    child.on("exit", (code) => reject(new Error(`controller exited with ${code}: ${stderr}`)));
  });
  return {
    child,
    endpoint,
    spawns,
    kill: () =>
      new Promise((resolve) => {
        child.once("exit", () => resolve());
        child.kill("SIGKILL");
      }),
  };
}

const dp2 = { tp: 1, pp: 1, dp: 2 };

async function setup(dir: string) {
  const first = await launch(dir, "tcp://127.0.0.1:*");
  // Workers ride out the restart: their client resends until the new process answers.
  const client = new ControllerClient({ endpoint: first.endpoint, timeoutMs: 20_000, retryMs: 100 });
  clients.push(client);
  const make = (job: string, hosts: number[]) => hosts.map((host) => new WorkerClient(client, { job, group: 0, host }, dp2, { checkpointBytes: 64, barrierTimeoutMs: 20_000 }));
  const a = make("a", [0, 4]);
  const b = make("b", [1, 5]);
  await Promise.all([...a, ...b].map((w) => w.register(10_000)));
  const move = (await client.status()).migrations[0]!;
  const moving = move.job === "a" ? a : b;
  const source = moving.find((w) => w.worker.host === move.from)!;
  const stayer = moving.find((w) => w.worker.host !== move.from)!;
  return { first, client, move, source, stayer };
}

describe("controller restart", () => {
  it("rebuilds from the journal after SIGKILL and rolls back a move that had not committed", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const { first, client, move, source, stayer } = await setup(dir);
    const step = move.stopStep!;
    const held = stayer.barrier(step);
    expect((await source.barrier(step)).kind).toBe("migrate-out");
    expect((await client.status()).migrations[0]?.state).toBe("transferring");

    await first.kill();
    const second = await launch(dir, first.endpoint);
    // The stayer's held barrier is resent to the new controller, which knows nothing is held.
    expect(await held).toEqual({ kind: "continue" });
    const status = await client.status();
    expect(status.jobs.map((j) => [j.id, j.started])).toEqual([["a", true], ["b", true]]);
    expect(status.migrations[0]).toMatchObject({ id: move.id, state: "rolled-back", reason: "the controller restarted before the move committed" });
    expect(await source.barrier(step)).toEqual({ kind: "continue" });
    await second.kill();
  });

  it("finishes a committed move after SIGKILL: the replacement is asked for again and the job re-forms", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const { first, client, move, source, stayer } = await setup(dir);
    const step = move.stopStep!;
    const held = stayer.barrier(step);
    const out = await source.barrier(step);
    if (out.kind !== "migrate-out") throw new Error(`expected migrate-out, got ${out.kind}`);
    const verdict = source.barrier(step);
    await client.request({ type: "daemon.register", host: move.to, stagingBytes: 1 << 20, endpoint: "tcp://127.0.0.1:1" });
    await client.request({ type: "daemon.transfer-result", host: move.to, token: out.token, bytes: 64, outcome: "verified" });
    expect(await verdict).toMatchObject({ kind: "stop" });
    expect((await client.status()).migrations[0]?.state).toBe("committing");

    await first.kill();
    const second = await launch(dir, first.endpoint);
    await expect.poll(() => second.spawns.length, { timeout: 5_000 }).toBe(1);
    expect(second.spawns[0]).toEqual({ migration: move.id, job: move.job, group: 0, parallelism: dp2, replacement: null, host: move.to, token: out.token });

    const replacement = new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: out.token });
    const assignment = await replacement.register(10_000);
    expect(assignment).toMatchObject({ generation: 1, resumeStep: step });
    // The stayer's barrier, resent to the new controller, carries generation 0: it is reconfigured.
    const directive = await held;
    expect(directive).toMatchObject({ kind: "reconfigure", assignment: { generation: 1, ringOrder: assignment.ringOrder } });
    await expect.poll(async () => (await client.status()).migrations[0]?.state, { timeout: 5_000 }).toBe("done");
    expect((await client.status()).withinBounds).toBe(true);
    await second.kill();
  });
});
