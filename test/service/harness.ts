import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, expect } from "vitest";
import { ControllerClient } from "../../sdk/client/client.ts";
import { createLogger } from "../../sdk/contract/log.ts";
import type { StatusReport } from "../../sdk/contract/protocol/status.ts";
import { DEFAULT_TIMEOUTS } from "../../controller/service/migration.ts";
import { ControllerServer, type ServerOptions } from "../../controller/service/server.ts";
import type { Topology } from "../../controller/planner/model/snapshot.ts";
import { RecordingHosts } from "./doubles.ts";

/** Two racks of four hosts, one uplink each: a second cross-rack job breaks the bound. */
export const SMALL: Topology = { racks: 2, hostsPerRack: 4, gpusPerHost: 8, uplinksPerRack: 1 };

export interface Harness {
  readonly server: ControllerServer;
  readonly hosts: RecordingHosts;
  readonly dir: string;
  readonly logs: string[];
  restart(): Promise<Harness>;
  close(): Promise<void>;
}

/** The incarnation of the one daemon process a test stands in for. */
export const INCARNATION = "0123456789abcdef0123456789abcdef";

export function tempDir(): string {
  return mkdtempSync(join(tmpdir(), "monkeytree-service-"));
}

/** A maker of temporary directories that are removed after each test of the calling file. */
export function tempDirsPerTest(): () => string {
  const dirs: string[] = [];
  afterEach(() => {
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });
  return () => {
    const dir = tempDir();
    dirs.push(dir);
    return dir;
  };
}

export async function startController(options: { topology?: Topology; dir?: string; overrides?: Partial<ServerOptions> } = {}): Promise<Harness> {
  const dir = options.dir ?? tempDir();
  const topology = options.topology ?? SMALL;
  const hosts = new RecordingHosts();
  const logs: string[] = [];
  const server = await ControllerServer.start({
    bind: "tcp://127.0.0.1:*",
    journalDir: dir,
    config: { kind: "config", topology, lambda: topology.uplinksPerRack, podLambda: null },

    transport: hosts,
    launcher: hosts,
    logger: createLogger("controller", (line) => logs.push(line), "debug"),
    tickMs: 20,
    // These tests' replacements register after the commit, as a slow one would: the job pauses
    // as soon as staging is granted. Tests of the wait for a ready replacement set their own.
    timeouts: { ...DEFAULT_TIMEOUTS, starting: 0 },
    ...options.overrides,
  });
  const harness: Harness = {
    server,
    hosts,
    dir,
    logs,
    restart: async () => {
      started.delete(harness);
      await server.close();
      // libzmq closes the old listener on its I/O thread after close() returns: until it has,
      // binding the same port fails, so this waits for the port rather than for a fixed time.
      for (const deadline = Date.now() + 30_000; ;) {
        try {
          return await startController({ ...options, dir, overrides: { ...options.overrides, bind: server.endpoint } });
        } catch (error) {
          if (!/Address already in use/.test(String(error)) || Date.now() > deadline) throw error;
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      }
    },
    close: async () => {
      started.delete(harness);
      await server.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  started.add(harness);
  return harness;
}

const started = new Set<Harness>();
const clients = new Set<ControllerClient>();

/**
 * Closes, after each test of the calling file, the clients `connect` and `track` were given
 * and every controller `startController` started (a restart's too) that the test left open.
 */
export function closeControllersAfterEach(): void {
  afterEach(async () => {
    const open = [...clients];
    clients.clear();
    await Promise.all(open.map((client) => client.close()));
    for (const harness of [...started]) await harness.close();
  });
}

/** A client of `h`'s controller, closed after the test. */
export function connect(h: Harness, timeoutMs = 5_000): ControllerClient {
  return track(new ControllerClient({ endpoint: h.server.endpoint, timeoutMs, retryMs: 200 }));
}

/** Closes `client` after the test. */
export function track(client: ControllerClient): ControllerClient {
  clients.add(client);
  return client;
}

/**
 * The moves of the controller's first plan. Plans are computed on the planner's thread, so
 * they are journaled a little after the event that called for them: this waits for them. The
 * thread's first start can take minutes under emulation (`npm run test:rdma`), so the test's own
 * timeout, not this wait, is the safety net.
 */
export async function plannedMoves(client: ControllerClient, timeoutMs = 30 * 60_000): Promise<StatusReport["migrations"]> {
  await expect.poll(async () => (await client.status()).migrations.length, { timeout: timeoutMs, interval: 20 }).toBeGreaterThan(0);
  return (await client.status()).migrations;
}
