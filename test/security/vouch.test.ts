import { connect } from "node:net";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import { VouchSocket } from "../../controller/daemon/vouch-socket.ts";
import { authorize } from "../../controller/service/authorization.ts";
import { DaemonHosts } from "../../controller/service/daemon-hosts.ts";
import { MAX_VOUCHES, VOUCH_TTL_MS, Vouches } from "../../controller/service/vouches.ts";
import { askToVouch, VouchError } from "../../sdk/client/launch/vouch.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import type { Logger } from "../../sdk/contract/log.ts";
import { startController, tempDir, type Harness } from "../service/harness.ts";

/**
 * A job credential alone cannot claim a host: with `--require-vouch` the controller takes a
 * job's new worker only on a host whose daemon vouched, on a launcher's local request, that a
 * launcher of that job runs there.
 */

const silent: Logger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };
const dp1 = { tp: 1, pp: 1, dp: 1 };
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A controller that needs vouches, with host 0's daemon listening on a local socket. */
async function vouchingCluster(): Promise<{ harness: Harness; client: ControllerClient; socket: string; vouchedFor: string[] }> {
  const daemons = new DaemonHosts(60_000);
  const harness = await startController({ overrides: { requireVouch: true, transport: daemons, launcher: daemons, daemons } });
  cleanups.push(() => harness.close());
  const daemon = HostDaemon.start({
    host: 0,
    controller: harness.server.endpoint,
    stagingBytes: 1 << 20,
    listen: { host: "127.0.0.1", port: 0 },
    heartbeatMs: 1_000,
    retryMs: 200,
  });
  cleanups.push(() => daemon.close());
  await daemon.ready();
  const dir = tempDir();
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  const vouchedFor: string[] = [];
  const vouching = await VouchSocket.open(join(dir, "daemon-0.sock"), (job) => daemon.vouch(job).then(() => void vouchedFor.push(job)), silent);
  cleanups.push(() => vouching.close());
  const client = new ControllerClient({ endpoint: harness.server.endpoint, retryMs: 200, timeoutMs: 10_000 });
  cleanups.push(() => client.close());
  return { harness, client, socket: vouching.path, vouchedFor };
}

const refusal = (promise: Promise<unknown>) =>
  promise.then(
    () => expect.fail("the request was answered"),
    (error: unknown) => error,
  );

/** One line to the socket, and what comes back before it closes. */
function exchange(path: string, line: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(path, () => socket.write(line));
    let reply = "";
    socket.on("data", (chunk: Buffer) => (reply += chunk.toString()));
    socket.once("close", () => resolve(reply));
    socket.once("error", reject);
  });
}

describe("a controller that needs its daemons' vouches", () => {
  it("refuses a new worker until its host's daemon vouched for a launcher of its job, and only for that job and host", async () => {
    const { client, socket } = await vouchingCluster();
    expect(await refusal(client.register({ job: "a", group: 0, host: 0 }, dp1))).toMatchObject({
      code: "forbidden",
      message: expect.stringContaining(`host 0's daemon has not vouched for a launcher of job "a"`),
    });
    await askToVouch(socket, "a");
    expect(await client.register({ job: "a", group: 0, host: 0 }, dp1)).toMatchObject({ nodes: 1 });
    // The vouch was for job a on host 0: neither another job there nor job a elsewhere.
    expect(await refusal(client.register({ job: "b", group: 0, host: 0 }, dp1))).toMatchObject({ code: "forbidden" });
    expect(await refusal(client.register({ job: "c", group: 0, host: 1 }, dp1))).toMatchObject({
      code: "forbidden",
      message: expect.stringContaining("host 1's daemon"),
    });
  });

  it("answers a malformed or oversized local request with why, vouching for nothing", async () => {
    const { socket, vouchedFor } = await vouchingCluster();
    expect(JSON.parse(await exchange(socket, "not json\n"))).toEqual({ error: 'a request is one JSON line, {"job": "ID"}' });
    expect(JSON.parse(await exchange(socket, `${JSON.stringify({ job: "a", host: 3 })}\n`))).toMatchObject({ error: expect.any(String) });
    expect(JSON.parse(await exchange(socket, `${"x".repeat(5_000)}\n`))).toEqual({ error: "a request is one line of at most 1024 bytes" });
    expect(vouchedFor).toEqual([]);
    await expect(askToVouch(join(tempDir(), "none.sock"), "a")).rejects.toMatchObject({ absent: true });
    await askToVouch(socket, "a");
    expect(vouchedFor).toEqual(["a"]);
  });

  it("gives up on a daemon that cannot vouch, since it is not the host's registered one", async () => {
    const { harness, socket } = await vouchingCluster();
    // A second daemon process for host 0 is not the one registered: it waits to be, and vouches for no one meanwhile.
    const impostor = HostDaemon.start({
      host: 0,
      controller: harness.server.endpoint,
      stagingBytes: 1 << 20,
      listen: { host: "127.0.0.1", port: 0 },
      retryMs: 200,
      vouchWaitMs: 1_000,
    });
    cleanups.push(() => impostor.close());
    const impostorSocket = await VouchSocket.open(`${socket}.2`, (job) => impostor.vouch(job), silent);
    cleanups.push(() => impostorSocket.close());
    // A launcher that waits less gives up first; the daemon answers why once its own wait is over.
    await expect(askToVouch(impostorSocket.path, "a", 200)).rejects.toThrow(new VouchError(`the daemon at ${impostorSocket.path} did not answer within 0.2 s`));
    await expect(askToVouch(impostorSocket.path, "a", SAFETY_NET_MS)).rejects.toThrow(
      new VouchError("the daemon on host 0 has not registered with the controller within 1 s"),
    );
  });
});

describe("vouches", () => {
  it("admit for a minute, then not", () => {
    const vouches = new Vouches();
    vouches.add("a", 0, 1_000);
    expect([vouches.holds("a", 0, 1_000 + VOUCH_TTL_MS - 1), vouches.holds("a", 0, 1_000 + VOUCH_TTL_MS), vouches.holds("a", 1, 1_000)]).toEqual([
      true,
      false,
      false,
    ]);
  });

  it("are bounded in number, forgetting the oldest", () => {
    const vouches = new Vouches();
    for (let i = 0; i <= MAX_VOUCHES; i++) vouches.add(`j${i}`, 0, 0);
    expect([vouches.holds("j0", 0, 0), vouches.holds("j1", 0, 0), vouches.holds(`j${MAX_VOUCHES}`, 0, 0)]).toEqual([false, true, true]);
  });

  it("come only from the host's own daemon credential", () => {
    const vouch = { v: PROTOCOL_VERSION, type: "daemon.vouch", id: 1, host: 0, incarnation: "0".repeat(32), job: "a" } as const;
    expect(authorize({ role: "daemon", host: 1 }, vouch)).toMatchObject({ rule: "daemon-credential-own-host" });
    expect(authorize({ role: "job", job: "a" }, vouch)).toMatchObject({ rule: "daemon-credential-own-host" });
    expect(authorize({ role: "daemon", host: 0 }, vouch)).toBeNull();
  });
});
