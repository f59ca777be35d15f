import { spawn, type ChildProcess } from "node:child_process";
import { randomFillSync } from "node:crypto";
import { chownSync, existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import { send, StagingBuffer } from "../../native/index.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { createLogger } from "../../sdk/contract/log.ts";
import { ticketFor } from "../../sdk/contract/protocol/endpoint.ts";
import type { Directive } from "../../sdk/contract/protocol/worker.ts";
import { TENANT } from "../helpers/tenant.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";
import { plannedMoves, tempDir } from "./harness.ts";

/**
 * A controller killed with SIGKILL in the middle of a move, and started again on the same
 * journal and address, while the hosts' real daemons (in this process) live on and register
 * with the new one. The test plays the workers and the source's transfer.
 */

const fixture = "test/service/fixtures/controller-process.ts";
const CHECKPOINT = 1 << 20;
const HOSTS = 8;
const dp2 = { tp: 1, pp: 1, dp: 2 };

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

interface Running {
  readonly endpoint: string;
  /** The `spawn` commands the controller sent to daemons, as they ended: `done` or why not. */
  readonly spawns: { readonly request: Record<string, unknown>; readonly outcome: string }[];
  log(): string;
  kill(): Promise<void>;
}

/** Starts the controller process and waits for its endpoint. */
async function launch(dir: string, bind: string, heartbeatTimeoutMs: number): Promise<Running> {
  const child: ChildProcess = spawn(process.execPath, ["bin/run-ts.js", fixture, dir, bind, String(heartbeatTimeoutMs)], { stdio: ["ignore", "pipe", "pipe"] });
  const kill = () =>
    new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve();
      child.once("exit", () => resolve());
      child.kill("SIGKILL");
    });
  cleanups.push(kill);
  const spawns: Running["spawns"] = [];
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const endpoint = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`controller did not start: ${stderr}`)), SAFETY_NET_MS);
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const spawned = /^spawn (\{.*\}) -> (.*)$/.exec(line);
      if (line.startsWith("listening ")) {
        clearTimeout(timer);
        resolve(line.slice("listening ".length));
      } else if (spawned) spawns.push({ request: JSON.parse(spawned[1]!) as Record<string, unknown>, outcome: spawned[2]! });
    });
    child.on("exit", (code) => reject(new Error(`controller exited with ${code}: ${stderr}`)));
  });
  return { endpoint, spawns, log: () => stderr, kill };
}

interface Host {
  readonly daemon: HostDaemon;
  readonly lines: string[];
}

/**
 * A daemon on every host. Its replacement launcher writes `launched-HOST.json` (its pid and
 * token) and runs until the test ends, as a replacement waiting for its checkpoint would.
 */
function startDaemons(dir: string, controller: string): Host[] {
  // The launcher runs as the tenant and writes its file here.
  if (TENANT) chownSync(dir, TENANT.uid, TENANT.gid);
  const launcher = [
    "const fs = require('node:fs'), path = require('node:path'), dir = process.argv[1], env = process.env;",
    // Written aside and renamed, so the test never reads a file the launcher is still writing.
    "const file = path.join(dir, 'launched-' + env.MONKEYTREE_HOST + '.json');",
    "fs.writeFileSync(file + '.tmp', JSON.stringify({ pid: process.pid, token: env.MONKEYTREE_TOKEN })); fs.renameSync(file + '.tmp', file);",
    // It ends when the test's directory is removed: it holds this process's stdout, and vitest
    // waits for every holder of that before it exits.
    "setInterval(() => fs.existsSync(dir) || process.exit(0), 50);",
  ].join(" ");
  const hosts = Array.from({ length: HOSTS }, (_, host) => {
    const lines: string[] = [];
    const daemon = HostDaemon.start({
      host,
      controller,
      stagingBytes: 4 * CHECKPOINT,
      listen: { host: "127.0.0.1", port: 0 },
      replacements: new Map([["probe", `"${process.execPath}" -e "${launcher}" "${dir}"`]]),
      ...(TENANT ? { runAs: TENANT } : {}),
      heartbeatMs: 100,
      retryMs: 100,
      log: createLogger(`daemon ${host}`, (line) => lines.push(line), "debug"),
    });
    return { daemon, lines };
  });
  cleanups.push(() => Promise.all(hosts.map((h) => h.daemon.close())).then(() => {}));
  return hosts;
}

/** The replacement launcher the daemon on `host` started, once it runs. */
async function launchedOn(dir: string, host: number): Promise<{ pid: number; token: string }> {
  const path = join(dir, `launched-${host}.json`);
  await expect.poll(() => existsSync(path), { ...patiently, interval: 20 }).toBe(true);
  return JSON.parse(readFileSync(path, "utf8")) as { pid: number; token: string };
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function checkpoint(): StagingBuffer {
  const buffer = StagingBuffer.create({ size: CHECKPOINT });
  randomFillSync(buffer.bytes());
  cleanups.push(() => buffer.free());
  return buffer;
}

/**
 * Jobs a (hosts 0, 4) and b (1, 5) cross the racks' single uplinks, so one worker moves; its
 * source reaches the stop barrier and gets `migrate-out` once the destination's daemon staged.
 */
async function startMove(heartbeatTimeoutMs: number) {
  const dir = tempDir();
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  const first = await launch(dir, "tcp://127.0.0.1:*", heartbeatTimeoutMs);
  const hosts = startDaemons(dir, first.endpoint);
  await Promise.all(hosts.map((h) => h.daemon.ready()));
  // Workers ride out the restart: their client resends until the new process answers, which
  // starts under tsx as slowly as the machine is loaded.
  const client = new ControllerClient({ endpoint: first.endpoint, timeoutMs: SAFETY_NET_MS, retryMs: 100 });
  cleanups.push(() => client.close());
  // A held worker waits for the controller, not for its own hold timeout, however slowly the
  // new process starts.
  const make = (job: string, hosts: number[]) =>
    hosts.map(
      (host) => new WorkerClient(client, { job, group: 0, host }, dp2, { checkpointBytes: CHECKPOINT, replacement: "probe", holdTimeoutMs: 3 * SAFETY_NET_MS }),
    );
  const a = make("a", [0, 4]);
  const b = make("b", [1, 5]);
  await Promise.all([...a, ...b].map((w) => w.register(SAFETY_NET_MS)));
  const move = (await plannedMoves(client))[0] ?? expect.fail("no move was planned once jobs a and b registered");
  const moving = move.job === "a" ? a : b;
  // The job's workers hold at the stop once they know of it.
  await expect.poll(() => moving.every((w) => w.stop !== null), patiently).toBe(true);
  const step = (await client.status()).migrations[0]?.stopStep ?? expect.fail(`move ${move.id} has no stop step`);
  expect(moving.map((w) => w.stop?.step)).toEqual([step, step]);
  const source = moving.find((w) => w.worker.host === move.from)!;
  const stayer = moving.find((w) => w.worker.host !== move.from)!;
  const held = stayer.barrier(step);
  const out: Directive = await source.barrier(step);
  if (out.kind !== "migrate-out") expect.fail(`the source got ${JSON.stringify(out)}, not migrate-out`);
  return { dir, first, hosts, client, move, step, source, held, out };
}

/** The source's checkpoint reaches the destination's daemon, which verifies it: the move commits. */
async function commit({ client, source, step, out }: Awaited<ReturnType<typeof startMove>>): Promise<void> {
  const verdict = source.barrier(step);
  await send({ ticket: ticketFor(out.endpoint, out.token, CHECKPOINT), buffer: checkpoint(), offset: 0 });
  expect(await verdict).toMatchObject({ kind: "stop" });
  expect((await client.status()).migrations[0]).toMatchObject({ state: "committing", reason: null });
}

describe("controller restart with the hosts' daemons", () => {
  it(
    "rolls back a move that had not committed, and the destination's daemon releases its staging once it registers again",
    async () => {
      const run = await startMove(10_000);
      const { dir, first, hosts, client, source, step, held, out } = run;
      const replacement = await launchedOn(dir, run.move.to);
      expect(alive(replacement.pid)).toBe(true);

      await first.kill();
      const second = await launch(dir, first.endpoint, 10_000);
      // The stayer's hold is reported to the new controller, which knows of no stop: it is let go.
      expect(await held).toEqual({ kind: "continue" });
      const status = await client.status();
      expect(status.jobs.map((j) => [j.id, j.started])).toEqual([
        ["a", true],
        ["b", true],
      ]);
      expect(status.migrations[0]).toMatchObject({ id: run.move.id, state: "rolled-back", reason: "the controller restarted before the move committed" });
      expect(await source.barrier(step)).toEqual({ kind: "continue" });

      // The release waited for the daemon to register again: the grant is withdrawn and the
      // replacement launcher the daemon started for it is stopped.
      const daemonLog = () => hosts[run.move.to]!.lines.join("\n");
      await expect.poll(daemonLog, { ...patiently, interval: 50 }).toContain(`released the staging of migration ${run.move.id}`);
      await expect.poll(() => alive(replacement.pid), { ...patiently, interval: 50 }).toBe(false);
      await expect(send({ ticket: ticketFor(out.endpoint, out.token, CHECKPOINT), buffer: checkpoint(), offset: 0 })).rejects.toMatchObject({
        name: "TransferError",
      });
      expect(second.log()).not.toMatch(/releasing staging on host/);
    },
    3 * SAFETY_NET_MS,
  );

  it(
    "finishes a committed move: the replacement is asked for once its host's daemon registers again, and the job re-forms",
    async () => {
      const run = await startMove(10_000);
      const { dir, first, client, step, held, out } = run;
      await commit(run);
      const launched = await launchedOn(dir, run.move.to);
      expect(launched.token).toBe(out.token);

      await first.kill();
      const second = await launch(dir, first.endpoint, 10_000);
      await expect.poll(() => second.spawns.length, { ...patiently, interval: 20 }).toBe(1);
      expect(second.spawns[0]).toMatchObject({
        request: { migration: run.move.id, job: run.move.job, group: 0, host: run.move.to, token: out.token },
        outcome: "done",
      });

      const replacement = new WorkerClient(client, { job: run.move.job, group: 0, host: run.move.to }, dp2, { token: launched.token });
      const assignment = await replacement.register(SAFETY_NET_MS);
      expect(assignment).toMatchObject({ generation: 1, resumeStep: step });
      // The stayer, sealed, reports generation 0 to the new controller: it is reconfigured.
      expect(await held).toMatchObject({ kind: "reconfigure", assignment: { generation: 1, ringOrder: assignment.ringOrder } });
      await expect.poll(async () => (await client.status()).migrations[0]?.state, patiently).toBe("done");
      const status = await client.status();
      expect(status.migrations[0]?.reason).toBeNull();
      expect(status.withinBounds).toBe(true);
      expect(second.log()).not.toMatch(/failure after commit/);
    },
    3 * SAFETY_NET_MS,
  );

  it(
    "raises an alert for a committed move whose destination's daemon does not come back within the heartbeat timeout",
    async () => {
      const run = await startMove(10_000);
      const { first, hosts, client } = run;
      const to = run.move.to;
      await commit(run);
      await hosts[to]!.daemon.close();

      await first.kill();
      const second = await launch(run.dir, first.endpoint, 3_000);
      // The move stands (its source was told to stop), so an operator must act: the status and
      // the log say so once the heartbeat timeout from the restart has passed.
      const reason = `spawning the replacement on host ${to}: the daemon on host ${to} did not register within 3000 ms of the controller's restart`;
      await expect.poll(async () => (await client.status()).migrations[0], patiently).toMatchObject({ id: run.move.id, state: "committing", reason });
      // No command went to the host while it had no daemon.
      expect(second.spawns).toEqual([]);
      expect(second.log()).toContain(`migration ${run.move.id}: failure after commit: ${reason}`);
    },
    3 * SAFETY_NET_MS,
  );
});
