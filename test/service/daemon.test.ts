import { randomFillSync } from "node:crypto";
import { existsSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DaemonHosts } from "../../controller/service/daemon-hosts.ts";
import { DEFAULT_PLAN_START_MS } from "../../controller/service/plan-thread.ts";
import { capabilities, send, StagingBuffer } from "../../native/index.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import type { Tenant } from "../../controller/daemon/replacements.ts";
import { shellCommand } from "../../cli/demo/processes.ts";
import { ticketFor } from "../../sdk/contract/protocol/endpoint.ts";
import type { Directive } from "../../sdk/contract/protocol/worker.ts";
import { canRun, root } from "../helpers/prerequisites.ts";
import { TENANT, tenantDir } from "../helpers/tenant.ts";
import { patiently, SAFETY_NET_MS } from "../helpers/wait.ts";
import { plannedMoves, startController, type Harness } from "./harness.ts";

const CHECKPOINT = 1 << 20;
const dp2 = { tp: 1, pp: 1, dp: 2 };

let harness: Harness | undefined;
/** The heartbeat timeout of the controller the test started; its daemons beat twenty times within it. */
let heartbeatTimeout = 0;
const cleanups: (() => Promise<void> | void)[] = [];

afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  await harness?.close();
  harness = undefined;
});

/**
 * A controller that commands daemons. Its deadlines for their answers and heartbeats are
 * generous unless a test is about them: on a slow host (the emulated RDMA guest of test:rdma)
 * a late answer rolls the move back, and the source then gets `continue`, not `migrate-out`.
 */
async function controllerWithDaemons(heartbeatTimeoutMs = 60_000, replanBackoffMs?: number): Promise<{ harness: Harness; client: ControllerClient }> {
  heartbeatTimeout = heartbeatTimeoutMs;
  const daemons = new DaemonHosts(60_000);
  harness = await startController({
    overrides: { transport: daemons, launcher: daemons, daemons, heartbeatTimeoutMs, ...(replanBackoffMs === undefined ? {} : { replanBackoffMs }) },
  });
  const client = new ControllerClient({ endpoint: harness.server.endpoint, retryMs: 200 });
  cleanups.push(() => client.close());
  return { harness, client };
}

/** A daemon on every host of the topology, registered, with these replacement commands by name. */
async function startDaemons(h: Harness, replacements: Record<string, string> = {}, runAs: Tenant | null = TENANT ?? null): Promise<HostDaemon[]> {
  const daemons = Array.from({ length: 8 }, (_, host) => startDaemon(h, host, replacements, runAs));
  await Promise.all(daemons.map((d) => d.ready()));
  return daemons;
}

function startDaemon(h: Harness, host: number, replacements: Record<string, string>, runAs: Tenant | null): HostDaemon {
  const daemon = HostDaemon.start({
    host,
    controller: h.server.endpoint,
    stagingBytes: 4 * CHECKPOINT,
    listen: { host: "127.0.0.1", port: 0 },
    // A few late beats never make a live daemon look lost. No oftener: in the emulated guest of
    // test:rdma, eight daemons beating every 100 ms against a 60 s timeout cost a quarter more
    // CPU while the controller's planner thread, at a low priority, was starting.
    heartbeatMs: heartbeatTimeout / 20,
    retryMs: 200,
    replacements: new Map(Object.entries(replacements)),
    ...(runAs === null ? {} : { runAs }),
  });
  cleanups.push(() => daemon.close());
  return daemon;
}

/**
 * Jobs a (hosts 0, 4) and b (hosts 1, 5) both cross the racks' single uplinks: one of them
 * must move. Their workers name `replacement` as the command that starts their replacements.
 * Registrations wait as long as a launcher's would (the controller holds them through a move,
 * which the emulated guest of test:rdma stretches to tens of seconds): the test's own timeout
 * is the bound.
 */
/** Two jobs that cross both racks, and the move of one of them that the controller plans. */
async function planMove(client: ControllerClient, replacement?: string) {
  const start = async (job: string, hosts: number[]) => {
    const options = { checkpointBytes: CHECKPOINT, ...(replacement === undefined ? {} : { replacement }) };
    const workers = hosts.map((host) => new WorkerClient(client, { job, group: 0, host }, dp2, options));
    await Promise.all(workers.map((w) => w.register()));
    return workers;
  };
  const a = await start("a", [0, 4]);
  for (const w of a) expect(await w.barrier(0)).toEqual({ kind: "continue" });
  const b = await start("b", [1, 5]);
  const [move, ...others] = await plannedMoves(client);
  if (!move || others.length) expect.fail(`expected one move once job b registered, got ${JSON.stringify([move, ...others])}`);
  const moving = move.job === "a" ? a : b;
  // The job's workers hold at the stop once they all know of it (a move that fails at once may
  // roll back before they do: their barriers then continue).
  const settled = async () => {
    const steps = new Set(moving.map((w) => w.stop?.step));
    return (steps.size === 1 && !steps.has(undefined)) || (await client.status()).migrations[0]?.state === "rolled-back";
  };
  await expect.poll(settled, patiently).toBe(true);
  // A move refused at prepare rolls back before the job was told to pause: it has no stop step.
  const stopStep = moving[0]!.stop?.step ?? (await client.status()).migrations[0]?.stopStep ?? null;
  return {
    move,
    step: stopStep,
    source: moving.find((w) => w.worker.host === move.from)!,
    stayer: moving.find((w) => w.worker.host !== move.from)!,
  };
}

/** `planMove`, for a move that pauses its job: its stop step. */
async function forceMigration(client: ControllerClient, replacement?: string) {
  const planned = await planMove(client, replacement);
  return { ...planned, step: planned.step ?? expect.fail(`move ${planned.move.id} has no stop step: ${JSON.stringify(planned.move)}`) };
}

/** A move refused at prepare never paused its job: it had no stop step, and the job trains on. */
async function expectNeverPaused(step: number | null, ...workers: WorkerClient[]) {
  expect(step).toBeNull();
  expect(await Promise.all(workers.map((w) => w.barrier(1)))).toEqual(workers.map(() => ({ kind: "continue" })));
}

/**
 * The source's directive at its stop barrier, which the controller holds until the destination
 * has granted staging. Anything but `migrate-out` means the move rolled back: say why.
 */
async function migrateOut(client: ControllerClient, source: WorkerClient, step: number): Promise<Extract<Directive, { kind: "migrate-out" }>> {
  const directive = await source.barrier(step);
  if (directive.kind === "migrate-out") return directive;
  return expect.fail(
    `the source got ${JSON.stringify(directive)} at barrier ${step}, not migrate-out; moves: ${JSON.stringify((await client.status()).migrations)}`,
  );
}

/**
 * The bound on the test that test:rdma runs in its emulated guest, where the planner thread's
 * first start (compiling the planner, loading HiGHS, at a low priority) takes minutes: as long
 * as the controller gives it, and the rest of the test.
 */
const FIRST_PLAN_MS = DEFAULT_PLAN_START_MS + SAFETY_NET_MS;

/**
 * A launcher that stays until its daemon stops it, as a real one waits for its move's commit:
 * one that exits before its workers register fails its move.
 */
const IDLE = { idle: "exec sleep 600" };

const checkpoint = (): StagingBuffer => {
  const buffer = StagingBuffer.create({ size: CHECKPOINT });
  randomFillSync(buffer.bytes());
  cleanups.push(() => buffer.free());
  return buffer;
};

describe("per-host daemon: a migration carried out by the destination's daemon", () => {
  it(
    "stages the source's bytes (by RDMA where the host has a device), reports them verified, and starts the named replacement as its user with only its environment",
    async () => {
      const { harness, client } = await controllerWithDaemons();
      const dir = tenantDir();
      const probeFile = join(dir, "probe.json");
      cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
      // Nothing of the daemon's environment beyond PATH, the locale and the identity reaches a replacement.
      process.env.MONKEYTREE_TEST_SECRET = "daemon-only";
      cleanups.push(() => void delete process.env.MONKEYTREE_TEST_SECRET);
      // Like a real launcher it stays until it is done with the staged checkpoint (here: until the
      // test removes its directory), since the daemon revokes the grant of a replacement that exits.
      const probe = [
        `const fs = require("node:fs"), file = process.argv[1];`,
        `fs.writeFileSync(file, JSON.stringify({ uid: process.getuid(), gid: process.getgid(), env: process.env }));`,
        `setInterval(() => fs.existsSync(file) || process.exit(0), 100);`,
      ].join(" ");
      const daemons = await startDaemons(harness, { probe: shellCommand([process.execPath, "-e", probe, probeFile]) });
      const { move, step, source, stayer } = await forceMigration(client, "probe");
      const daemon = daemons[move.to]!;

      const stayerBarrier = stayer.barrier(step);
      const out = await migrateOut(client, source, step);
      expect(out).toMatchObject({ migration: move.id, to: move.to, endpoint: daemon.endpoint, step });
      const { endpoint, token } = out;

      // The test plays the source worker: its checkpoint goes from its own buffer to the ticket, by
      // RDMA where this host has a device (the daemon's endpoint then offers it), else by TCP.
      const buffer = checkpoint();
      const transport = capabilities().rdma.available ? "rdma" : "tcp";
      expect(endpoint.endsWith("?rdma")).toBe(transport === "rdma");
      expect(await send({ ticket: ticketFor(endpoint, token, CHECKPOINT), buffer, offset: 0 })).toMatchObject({ bytes: CHECKPOINT, transport });
      expect(await source.barrier(step)).toMatchObject({ kind: "stop" });

      await expect.poll(() => readFileSync(probeFile, "utf8"), patiently).toContain("MONKEYTREE_TOKEN");
      const { uid, gid, env } = JSON.parse(readFileSync(probeFile, "utf8")) as { uid: number; gid: number; env: Record<string, string> };
      expect({ uid, gid }).toEqual(TENANT ? { uid: TENANT.uid, gid: TENANT.gid } : { uid: process.getuid!(), gid: process.getgid!() });
      // /bin/sh adds PWD.
      const passed = new Set(["PATH", "LANG", "LC_ALL", "TZ", "HOME", "USER", "LOGNAME", "PWD"]);
      expect(Object.keys(env).filter((name) => !name.startsWith("MONKEYTREE_") && !passed.has(name))).toEqual([]);
      if (TENANT) expect(env).toMatchObject({ HOME: TENANT.home, USER: TENANT.user });
      expect(env.MONKEYTREE_TEST_SECRET).toBeUndefined();
      expect(env).toMatchObject({
        MONKEYTREE_CONTROLLER: harness.server.endpoint,
        MONKEYTREE_HOST: String(move.to),
        MONKEYTREE_JOB: move.job,
        MONKEYTREE_GROUP: "0",
        MONKEYTREE_DP: "2",
        MONKEYTREE_MIGRATION: move.id,
        MONKEYTREE_TOKEN: token,
        MONKEYTREE_STAGING_BUFFER: expect.stringMatching(/^monkeytree-\d+-[0-9a-f]+$/),
        MONKEYTREE_STAGING_OFFSET: "0",
        MONKEYTREE_STAGING_LENGTH: String(CHECKPOINT),
      });
      // The grant's file of its own, the replacement's user's alone.
      const path = `/dev/shm/${env.MONKEYTREE_STAGING_BUFFER}`;
      expect(statSync(path)).toMatchObject({ uid, gid, mode: 0o100600 });
      const staged = StagingBuffer.open(env.MONKEYTREE_STAGING_BUFFER!, { lock: false });
      expect(Buffer.from(staged.bytes(0, CHECKPOINT)).equals(Buffer.from(buffer.bytes()))).toBe(true);
      staged.free();

      // The replacement registers with the token from its environment; the job re-forms.
      const replacement = new WorkerClient(client, { job: move.job, group: 0, host: move.to }, dp2, { token: env.MONKEYTREE_TOKEN! });
      const assignment = await replacement.register();
      expect(assignment).toMatchObject({ generation: 1, resumeStep: step });
      // Its place, foreseen when it started (before the job stopped), is the one it got.
      expect([env.MONKEYTREE_NODE_RANK, env.MONKEYTREE_NODES]).toEqual([String(assignment.nodeRank), String(assignment.nodes)]);
      expect(await stayerBarrier).toMatchObject({ kind: "reconfigure" });
      // Done once every worker reports running the new assignment.
      await expect.poll(async () => (await client.status()).migrations[0]?.state, patiently).toBe("done");
    },
    FIRST_PLAN_MS,
  );

  it(
    "rolls back when the replacement launcher exits before it registers, naming how it exited, and the job trains on",
    async () => {
      const { harness, client } = await controllerWithDaemons();
      await startDaemons(harness, { crash: "exit 3" });
      const { move, step, source, stayer } = await planMove(client, "crash");
      // No worker reaches a barrier until the controller has heard of the exit: a job already
      // held at its stop step may be told to save first, as this controller does not wait for
      // replacements (a race the test lost on a loaded machine).
      await expect.poll(async () => (await client.status()).migrations.find((m) => m.id === move.id)?.state, patiently).toBe("rolled-back");
      expect((await client.status()).migrations.find((m) => m.id === move.id)?.reason).toBe(
        `the replacement launcher on host ${move.to} exited (code 3) before its workers registered; its output is in the log of host ${move.to}'s daemon`,
      );
      // Whether the job was told to stop before the exit came or not, it trains on.
      expect(await Promise.all([source.barrier(step ?? 0), stayer.barrier(step ?? 0)])).toEqual([{ kind: "continue" }, { kind: "continue" }]);
    },
    SAFETY_NET_MS,
  );

  it(
    "raises the alert of a committed move at once when its replacement launcher exits before it registers",
    async () => {
      const { harness, client } = await controllerWithDaemons();
      const dir = tenantDir();
      cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
      const crash = join(dir, "crash");
      // It starts with the staging, and dies (by a signal) only once the test says so: after the commit.
      await startDaemons(harness, { late: `while [ ! -e ${crash} ]; do sleep 0.05; done; kill -KILL $$` });
      const { move, step, source, stayer } = await forceMigration(client, "late");
      // Held until the job re-forms, which it never does here.
      stayer.barrier(step).catch(() => undefined);
      const { endpoint, token } = await migrateOut(client, source, step);
      await send({ ticket: ticketFor(endpoint, token, CHECKPOINT), buffer: checkpoint(), offset: 0 });
      expect(await source.barrier(step)).toMatchObject({ kind: "stop" });
      expect((await client.status()).migrations[0]).toMatchObject({ state: "committing", reason: null });
      writeFileSync(crash, "");
      const reason = `the replacement launcher on host ${move.to} exited (SIGKILL) before its workers registered; its output is in the log of host ${move.to}'s daemon`;
      await expect.poll(async () => (await client.status()).migrations[0]?.reason, patiently).toBe(reason);
      // The move stands, for an operator, who the error in the log calls.
      expect((await client.status()).migrations[0]?.state).toBe("committing");
      expect(harness.logs.filter((line) => line.includes(`failure after commit: ${reason}`))).toHaveLength(1);
    },
    FIRST_PLAN_MS,
  );

  it(
    "rolls back when the destination's daemon dies before the transfer: the source continues",
    async () => {
      // The daemon is declared lost after this long without a heartbeat (it sends one every 100 ms).
      const { harness, client } = await controllerWithDaemons(2_000);
      const daemons = await startDaemons(harness, IDLE);
      const { move, step, source, stayer } = await forceMigration(client, "idle");
      const daemon = daemons[move.to]!;

      const stayerBarrier = stayer.barrier(step);
      const { endpoint, token } = await migrateOut(client, source, step);
      await daemon.close();
      await expect(send({ ticket: ticketFor(endpoint, token, CHECKPOINT), buffer: checkpoint(), offset: 0 })).rejects.toMatchObject({ name: "TransferError" });

      expect(await source.barrier(step)).toEqual({ kind: "continue" });
      expect(await stayerBarrier).toEqual({ kind: "continue" });
      expect((await client.status()).migrations[0]).toMatchObject({ state: "rolled-back", reason: `the daemon on host ${move.to} was lost` });
    },
    SAFETY_NET_MS,
  );

  it(
    "plans again after that rollback, moving no worker to the host whose daemon is lost",
    async () => {
      // Lost after 2 s without a heartbeat; the controller plans again a second after a rollback.
      const { harness, client } = await controllerWithDaemons(2_000, 1_000);
      const daemons = await startDaemons(harness, IDLE);
      const { move, step, source, stayer } = await forceMigration(client, "idle");
      const stayerBarrier = stayer.barrier(step);
      await migrateOut(client, source, step);
      await daemons[move.to]!.close();
      // Rolled back once the daemon is declared lost.
      expect(await Promise.all([source.barrier(step), stayerBarrier])).toEqual([{ kind: "continue" }, { kind: "continue" }]);
      // The racks are still over their bound: the next plan moves a worker, but not to the host
      // whose daemon is gone, which would only pause the job for another rollback.
      const replanned = async () => (await client.status()).migrations.filter((m) => m.id !== move.id);
      await expect.poll(async () => (await replanned()).length, patiently).toBeGreaterThan(0);
      expect((await replanned()).map((m) => m.to)).not.toContain(move.to);
    },
    SAFETY_NET_MS,
  );

  it(
    "rolls back a job naming a replacement the destination's daemon lacks, naming the flag that configures it",
    async () => {
      const { harness, client } = await controllerWithDaemons();
      await startDaemons(harness, { probe: "true" });
      const { move, step, source, stayer } = await planMove(client, "ghost");
      await expectNeverPaused(step, source, stayer);
      expect((await client.status()).migrations[0]).toMatchObject({
        state: "rolled-back",
        reason: `host ${move.to} could not stage: the daemon on host ${move.to} refused: the daemon on host ${move.to} has no replacement "ghost" (job ${move.job} names it); start the daemon with --replacement ghost=COMMAND`,
      });
    },
    SAFETY_NET_MS,
  );

  it.skipIf(!canRun("a root daemon without --run-as", root()))(
    "rolls back rather than start a replacement as root when the daemon runs as root without --run-as",
    async () => {
      const { harness, client } = await controllerWithDaemons();
      const dir = tenantDir();
      cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
      const started = join(dir, "started");
      await startDaemons(harness, { probe: `touch ${started}` }, null);
      const { move, step, source, stayer } = await planMove(client, "probe");
      await expectNeverPaused(step, source, stayer);
      expect((await client.status()).migrations[0]?.reason).toContain(
        `job ${move.job} has no user of its own and the daemon on host ${move.to} runs as root without --run-as, so it starts no replacement for it`,
      );
      expect(existsSync(started)).toBe(false);
    },
    SAFETY_NET_MS,
  );

  it(
    "rolls back when the destination has no daemon, naming the host",
    async () => {
      const { client } = await controllerWithDaemons();
      const { move, step, source, stayer } = await planMove(client);
      await expectNeverPaused(step, source, stayer);
      expect((await client.status()).migrations[0]).toMatchObject({
        state: "rolled-back",
        reason: expect.stringContaining(`no daemon is registered for host ${move.to}`),
      });
    },
    SAFETY_NET_MS,
  );
});
